/* backend_select: `--device auto|cpu|cuda[:N]` (backend_select.h). */
#include "backend_select.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_nvtx.h"
#include "cpu/backend_cpu.h"

#ifdef QUERN_HAVE_CUDA
#include "cuda/backend_cuda.h"
#include "cuda/comm_nccl.h"
#endif

int backend_device_parse(const char *device, enum backend_kind *kind, int *index, struct qerr *err)
{
    *kind = BACKEND_KIND_AUTO;
    *index = 0;
    if (!device || !*device || strcmp(device, "auto") == 0) return 0;
    if (strcmp(device, "cpu") == 0) {
        *kind = BACKEND_KIND_CPU;
        return 0;
    }
    if (strncmp(device, "cuda", 4) == 0) {
        const char *rest = device + 4;
        *kind = BACKEND_KIND_CUDA;
        if (!*rest) return 0;
        if (*rest == ':' && rest[1] >= '0' && rest[1] <= '9') {
            char *end;
            errno = 0;
            long v = strtol(rest + 1, &end, 10);
            if (!*end && errno == 0 && v <= 1024) {
                *index = (int)v;
                return 0;
            }
        }
    }
    return qerr_set(err, QERR_INVALID, "--device '%s': want auto, cpu, cuda or cuda:N", device);
}

bool backend_have_cuda(void)
{
#ifdef QUERN_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

/* Every knob a backend takes (backend_select.h): the request's, then the environment's. */
struct knobs {
    bool force_cpu;
    enum cpu_isa isa;
    enum cpu_prefetch prefetch;
    int kv_bits;      /* --kv-type: 0 (the backend's own), 16, 32; 8 (q8, the CPU's only) */
    int cuda_kv_bits; /* what a CUDA backend gets: kv_bits, else $QUERN_CUDA_KV's */
    int gemm;         /* 0: mma, 1: cublas */
    int gemm_min;     /* 0: the backend's default */
    bool invariant;   /* every batch on the batch-invariant kernels */
    bool act_f16, no_graphs, sync_launch;
    bool nvtx; /* an NVTX tool is attached ($NVTX_INJECTION64_PATH) or $QUERN_NVTX=1 */
};

static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static const char *env_str(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int read_knobs(const struct backend_request *r, struct knobs *k, struct qerr *err)
{
    *k = (struct knobs){.force_cpu = env_on("QUERN_FORCE_CPU"),
                        .isa = CPU_ISA_AUTO,
                        .gemm_min = r->gemm_min_tokens,
                        .invariant = r->batch_invariant,
                        .no_graphs = getenv("QUERN_CUDA_GRAPHS") && !env_on("QUERN_CUDA_GRAPHS"),
                        .sync_launch = env_on("QUERN_SYNC_LAUNCH"),
                        .nvtx = env_str("NVTX_INJECTION64_PATH") || env_on("QUERN_NVTX")};
    const char *isa = env_str("QUERN_CPU_ISA");
    if (isa) {
        int p = cpu_isa_parse(isa);
        if (p < 0)
            return qerr_set(err, QERR_INVALID,
                            "QUERN_CPU_ISA=%s: want scalar, avx2, avxvnni, avx512, amx or auto",
                            isa);
        k->isa = (enum cpu_isa)p;
    }
    const char *pf = env_str("QUERN_CPU_PREFETCH");
    if (pf) {
        int p = cpu_prefetch_parse(pf);
        if (p < 0)
            return qerr_set(err, QERR_INVALID, "QUERN_CPU_PREFETCH=%s: want l1, l2 or auto", pf);
        k->prefetch = (enum cpu_prefetch)p;
    }
    const char *kv_names[2] = {r->kv_type, env_str("QUERN_CUDA_KV")};
    for (int i = 0; i < 2; i++) {
        const char *kv = kv_names[i];
        if (!kv) continue;
        if (i == 0 && !strcmp(kv, "q8")) {
            k->kv_bits = 8;
            continue;
        }
        if (strcmp(kv, "f16") && strcmp(kv, "f32"))
            return qerr_set(err, QERR_INVALID, "%s '%s': want %s",
                            i == 0 ? "--kv-type" : "QUERN_CUDA_KV", kv,
                            i == 0 ? "f16, f32 or q8" : "f16 or f32");
        if (i == 0) k->kv_bits = kv[1] == '1' ? 16 : 32;
    }
    k->cuda_kv_bits = k->kv_bits ? k->kv_bits : kv_names[1] ? (kv_names[1][1] == '1' ? 16 : 32) : 0;
    const char *gemm = r->gemm ? r->gemm : env_str("QUERN_CUDA_GEMM");
    if (gemm) {
        if (strcmp(gemm, "mma") && strcmp(gemm, "cublas"))
            return qerr_set(err, QERR_INVALID, "%s '%s': want mma or cublas",
                            r->gemm ? "--gemm" : "QUERN_CUDA_GEMM", gemm);
        k->gemm = !strcmp(gemm, "cublas");
    }
    const char *gm = env_str("QUERN_CUDA_GEMM_MIN_TOKENS");
    if (gm && !r->gemm_min_tokens) {
        char *end;
        long v = strtol(gm, &end, 10);
        if (*end || v < 0 || v > 1 << 20)
            return qerr_set(err, QERR_INVALID,
                            "QUERN_CUDA_GEMM_MIN_TOKENS '%s': want a token count (0: never)", gm);
        if (v == 0) k->invariant = true;
        k->gemm_min = (int)v;
    }
    const char *act = env_str("QUERN_CUDA_ACT");
    k->act_f16 = act && !strcmp(act, "f16");
    return 0;
}

static enum matmul_precision cpu_precision(enum matmul_precision p)
{
    return p == MATMUL_AUTO ? MATMUL_Q8 : p;
}

/* The CPU's KV element: --kv-type's, else fp16 with q8 activations (the serving default: half
 * the K/V bytes a batched decode reads, perplexity unchanged within its error, as llama.cpp's
 * default cache) and fp32 with f32 activations (the reference mode: bit for bit). q8 (Q8_0
 * blocks, as llama.cpp's -ctk/-ctv q8_0) only when asked: docs/quant.md has its cost. */
static bool cpu_kv_f16(int kv_bits, enum matmul_precision precision)
{
    return kv_bits ? kv_bits == 16 : precision == MATMUL_Q8;
}

static const char *cpu_kv_name(const struct backend_cpu_opts *o)
{
    return o->kv_q8 ? "q8" : o->kv_f16 ? "f16" : "f32";
}

static const char *precision_name(enum matmul_precision p)
{
    return p == MATMUL_Q8 ? "q8" : "f32";
}

static int create_cpu(int threads, enum matmul_precision precision, const struct knobs *k,
                      const char *why, struct backend **out, struct qerr *err)
{
    precision = cpu_precision(precision);
    struct backend_cpu_opts o = {.n_threads = threads,
                                 .precision = precision,
                                 .isa = k->isa,
                                 .prefetch = k->prefetch,
                                 .kv_f16 = cpu_kv_f16(k->kv_bits, precision),
                                 .kv_q8 = k->kv_bits == 8};
    int rc = backend_cpu_create(&o, out, err);
    if (rc) return rc;
    err->code = 0;
    snprintf(err->msg, sizeof err->msg, "cpu%s%.440s%s, %s kernels, %s activations, %s KV",
             why ? " (" : "", why ? why : "", why ? ")" : "", cpu_isa_name(backend_cpu_isa(*out)),
             precision_name(precision), cpu_kv_name(&o));
    return 0;
}

#ifdef QUERN_HAVE_CUDA
static struct backend_cuda_opts cuda_opts(const struct knobs *k, int device,
                                          enum matmul_precision precision)
{
    return (struct backend_cuda_opts){.device = device,
                                      .precision =
                                          precision == MATMUL_AUTO ? MATMUL_F32 : precision,
                                      .gemm_min_tokens = k->gemm_min,
                                      .gemm = k->gemm ? CUDA_GEMM_CUBLAS : CUDA_GEMM_MMA,
                                      .batch_invariant = k->invariant,
                                      .kv_f32 = k->cuda_kv_bits == 32,
                                      .act_f16 = k->act_f16,
                                      .no_graphs = k->no_graphs,
                                      .sync_launch = k->sync_launch};
}
#endif

/* With an NVTX tool attached, every op of *be runs in a range named after it
 * (kernels/backend_nvtx.h); err->msg, the line saying which backend runs, says so too. */
static int add_nvtx(const struct knobs *k, struct backend **be, struct qerr *err)
{
#ifdef QUERN_HAVE_NVTX
    if (!k->nvtx) return 0;
    char line[sizeof err->msg];
    snprintf(line, sizeof line, "%s", err->msg);
    struct backend *w;
    int rc = backend_nvtx_wrap(*be, &w, err);
    if (rc) return rc;
    *be = w;
    err->code = 0;
    snprintf(err->msg, sizeof err->msg, "%.480s; NVTX ranges per op", line);
#else
    (void)k, (void)be, (void)err;
#endif
    return 0;
}

static int create_one(const struct backend_request *r, const struct knobs *kn, struct backend **out,
                      struct qerr *err);

int backend_create_auto(const struct backend_request *r, struct backend **out, struct qerr *err)
{
    struct qerr local = {0};
    if (!err) err = &local;
    *out = NULL;
    struct knobs k;
    int rc = read_knobs(r, &k, err);
    if (!rc) rc = create_one(r, &k, out, err);
    if (!rc && (rc = add_nvtx(&k, out, err))) {
        backend_destroy(*out);
        *out = NULL;
    }
    return rc;
}

static int create_one(const struct backend_request *r, const struct knobs *kn, struct backend **out,
                      struct qerr *err)
{
    enum backend_kind kind;
    int index;
    int rc = backend_device_parse(r->device, &kind, &index, err);
    if (rc) return rc;
    struct knobs k = *kn;
    if (k.force_cpu)
        return create_cpu(r->threads, r->precision, &k, "QUERN_FORCE_CPU is set", out, err);
    if (kind == BACKEND_KIND_CPU) return create_cpu(r->threads, r->precision, &k, NULL, out, err);
    if (k.kv_bits == 8) {
        if (kind == BACKEND_KIND_CUDA)
            return qerr_set(err, QERR_UNSUPPORTED,
                            "--device %s --kv-type q8: the CUDA backend's KV cache is f16 or f32",
                            r->device);
        return create_cpu(r->threads, r->precision, &k, "auto: --kv-type q8 is the CPU's", out,
                          err);
    }
#ifdef QUERN_HAVE_CUDA
    struct backend_cuda_opts co = cuda_opts(&k, index, r->precision);
    struct qerr cerr = {0};
    rc = backend_cuda_create(&co, out, &cerr);
    if (rc == 0) {
        err->code = 0;
        snprintf(err->msg, sizeof err->msg, "%s", backend_cuda_describe(*out));
        return 0;
    }
    if (kind == BACKEND_KIND_CUDA) return qerr_set(err, rc, "%s", cerr.msg);
    char why[sizeof cerr.msg];
    snprintf(why, sizeof why, "auto: %.490s", cerr.msg);
    return create_cpu(r->threads, r->precision, &k, why, out, err);
#else
    if (kind == BACKEND_KIND_CUDA)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "--device %s: this build has no CUDA backend (nvcc was not found, or "
                        "-Dcuda=disabled)",
                        r->device);
    return create_cpu(r->threads, r->precision, &k, "auto: built without CUDA", out, err);
#endif
}

void backend_group_free(struct backend_group *g)
{
    for (int r = 0; r < g->n; r++) {
        comm_destroy(g->comm[r]);
        backend_destroy(g->be[r]);
        g->comm[r] = NULL;
        g->be[r] = NULL;
    }
    g->n = 0;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#ifdef QUERN_HAVE_CUDA
/* Ranks on devices index .. index + n - 1, one CUDA backend each, over NCCL. */
static int backend_group_create_cuda(const struct backend_request *r, const struct knobs *kn,
                                     int index, int n, struct backend_group *g, struct qerr *err)
{
    struct qerr perr = {0};
    for (int k = 0; k < n; k++)
        if (backend_cuda_probe(index + k, NULL, 0, &perr))
            return qerr_set(err, QERR_INVALID, "--tp %d from cuda:%d: device %d: %s", n, index,
                            index + k, perr.msg);
    int rc;
    for (int k = 0; k < n; k++) {
        struct backend_cuda_opts co = cuda_opts(kn, index + k, r->precision);
        if ((rc = backend_cuda_create(&co, &g->be[k], err))) {
            backend_group_free(g);
            return qerr_wrap(err, "--tp %d rank %d", n, k);
        }
        g->n = k + 1;
    }
    if ((rc = comm_nccl_create(g->be, n, g->comm, err))) {
        backend_group_free(g);
        return qerr_wrap(err, "--tp %d", n);
    }
    err->code = 0;
    snprintf(err->msg, sizeof err->msg, "%s, --tp %d: cuda:%d..cuda:%d over NCCL",
             backend_cuda_describe(g->be[0]), n, index, index + n - 1);
    return 0;
}
#endif

static int group_create(const struct backend_request *r, int n, struct backend_group *g,
                        struct qerr *err)
{
    memset(g, 0, sizeof *g);
    if (n < 1 || n > COMM_MAX_RANKS)
        return qerr_set(err, QERR_INVALID, "--tp %d: want 1..%d ranks", n, COMM_MAX_RANKS);
    if (n == 1) {
        g->n = 1;
        return backend_create_auto(r, &g->be[0], err);
    }
    enum backend_kind kind;
    int index;
    int rc = backend_device_parse(r->device, &kind, &index, err);
    if (rc) return rc;
    struct knobs kn;
    if ((rc = read_knobs(r, &kn, err))) return rc;
    const char *why = kn.force_cpu ? " (QUERN_FORCE_CPU is set)" : "";
    if (!kn.force_cpu && kn.kv_bits == 8 && kind != BACKEND_KIND_CPU) {
        if (kind == BACKEND_KIND_CUDA)
            return qerr_set(err, QERR_UNSUPPORTED,
                            "--device %s --tp %d --kv-type q8: the CUDA backend's KV cache is f16 "
                            "or f32",
                            r->device, n);
        why = " (auto: --kv-type q8 is the CPU's)";
        kind = BACKEND_KIND_CPU;
    }
#ifdef QUERN_HAVE_CUDA
    if (!kn.force_cpu && kind != BACKEND_KIND_CPU) {
        struct qerr cerr = {0};
        int usable = backend_cuda_probe(index, NULL, 0, &cerr) == 0;
        if (usable || kind == BACKEND_KIND_CUDA)
            return backend_group_create_cuda(r, &kn, index, n, g, err);
        why = " (auto: cuda: no usable device)";
    }
#else
    if (!kn.force_cpu && kind == BACKEND_KIND_CUDA)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "--device %s --tp %d: this build has no CUDA backend", r->device, n);
    if (kind == BACKEND_KIND_AUTO && !kn.force_cpu) why = " (auto: built without CUDA)";
#endif
    int total = r->threads > 0 ? r->threads : online_cpus();
    int each = total / n > 0 ? total / n : 1;
    struct backend_cpu_opts o = {.n_threads = each,
                                 .precision = cpu_precision(r->precision),
                                 .isa = kn.isa,
                                 .prefetch = kn.prefetch,
                                 .kv_f16 = cpu_kv_f16(kn.kv_bits, cpu_precision(r->precision)),
                                 .kv_q8 = kn.kv_bits == 8};
    for (int k = 0; k < n; k++) {
        if ((rc = backend_cpu_create(&o, &g->be[k], err))) {
            g->n = k;
            backend_group_free(g);
            return qerr_wrap(err, "--tp %d rank %d", n, k);
        }
        g->n = k + 1;
    }
    struct comm *c[COMM_MAX_RANKS];
    if ((rc = comm_cpu_create(n, NULL, c, err))) {
        backend_group_free(g);
        return rc;
    }
    memcpy(g->comm, c, (size_t)n * sizeof *c);
    err->code = 0;
    snprintf(err->msg, sizeof err->msg,
             "cpu%s, --tp %d: %d ranks of %d thread%s over the %s communicator, %s activations, "
             "%s KV",
             why, n, n, each, each > 1 ? "s" : "", g->comm[0]->ops->name,
             precision_name(o.precision), cpu_kv_name(&o));
    return 0;
}

int backend_group_create(const struct backend_request *r, int n, struct backend_group *g,
                         struct qerr *err)
{
    int rc = group_create(r, n, g, err);
    if (rc || n == 1) return rc; /* one rank: backend_create_auto added the ranges */
#ifdef QUERN_HAVE_NVTX
    struct knobs k;
    if ((rc = read_knobs(r, &k, err)) == 0 && k.nvtx) {
        char line[sizeof err->msg];
        snprintf(line, sizeof line, "%s", err->msg);
        /* the communicators keep the ranks' own backends: the wrappers own them */
        for (int i = 0; i < g->n && !rc; i++) {
            struct backend *w;
            if ((rc = backend_nvtx_wrap(g->be[i], &w, err)) == 0) g->be[i] = w;
        }
        if (!rc) snprintf(err->msg, sizeof err->msg, "%.480s; NVTX ranges per op", line);
    }
    if (rc) backend_group_free(g);
#endif
    return rc;
}
