/* backend_select: `--device auto|cpu|cuda[:N]` (backend_select.h). */
#include "backend_select.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static bool force_cpu(void)
{
    const char *v = getenv("QUERN_FORCE_CPU");
    return v && *v && strcmp(v, "0") != 0;
}

static int create_cpu(int threads, enum matmul_precision precision, const char *why,
                      struct backend **out, struct qerr *err)
{
    struct backend_cpu_opts o = {.n_threads = threads, .precision = precision, .isa = CPU_ISA_AUTO};
    int rc = backend_cpu_create(&o, out, err);
    if (rc) return rc;
    err->code = 0;
    snprintf(err->msg, sizeof err->msg, "cpu%s%.480s%s", why ? " (" : "", why ? why : "",
             why ? ")" : "");
    return 0;
}

#ifdef QUERN_HAVE_CUDA
/* The GEMM choices of $QUERN_CUDA_GEMM_MIN_TOKENS and $QUERN_CUDA_GEMM (backend_select.h). */
static int cuda_gemm_env(struct backend_cuda_opts *co, struct qerr *err)
{
    const char *gm = getenv("QUERN_CUDA_GEMM_MIN_TOKENS");
    if (gm && *gm) {
        char *end;
        long v = strtol(gm, &end, 10);
        if (*end || v < 0 || v > 1 << 20)
            return qerr_set(err, QERR_INVALID,
                            "QUERN_CUDA_GEMM_MIN_TOKENS '%s': want a token count (0: never)", gm);
        if (v == 0) co->batch_invariant = true;
        co->gemm_min_tokens = (int)v;
    }
    const char *kind = getenv("QUERN_CUDA_GEMM");
    if (kind && *kind) {
        if (strcmp(kind, "mma") == 0)
            co->gemm = CUDA_GEMM_MMA;
        else if (strcmp(kind, "cublas") == 0)
            co->gemm = CUDA_GEMM_CUBLAS;
        else
            return qerr_set(err, QERR_INVALID, "QUERN_CUDA_GEMM '%s': want mma or cublas", kind);
    }
    return 0;
}
#endif

int backend_create_auto(const struct backend_request *r, struct backend **out, struct qerr *err)
{
    struct qerr local = {0};
    if (!err) err = &local;
    *out = NULL;
    enum backend_kind kind;
    int index;
    int rc = backend_device_parse(r->device, &kind, &index, err);
    if (rc) return rc;
    if (force_cpu())
        return create_cpu(r->threads, r->precision, "QUERN_FORCE_CPU is set", out, err);
    if (kind == BACKEND_KIND_CPU) return create_cpu(r->threads, r->precision, NULL, out, err);
#ifdef QUERN_HAVE_CUDA
    struct backend_cuda_opts co = {
        .device = index, .precision = r->precision, .batch_invariant = r->batch_invariant};
    if ((rc = cuda_gemm_env(&co, err))) return rc;
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
    return create_cpu(r->threads, r->precision, why, out, err);
#else
    if (kind == BACKEND_KIND_CUDA)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "--device %s: this build has no CUDA backend (nvcc was not found, or "
                        "-Dcuda=disabled)",
                        r->device);
    return create_cpu(r->threads, r->precision, "auto: built without CUDA", out, err);
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
static int backend_group_create_cuda(const struct backend_request *r, int index, int n,
                                     struct backend_group *g, struct qerr *err)
{
    struct qerr perr = {0};
    for (int k = 0; k < n; k++)
        if (backend_cuda_probe(index + k, NULL, 0, &perr))
            return qerr_set(err, QERR_INVALID, "--tp %d from cuda:%d: device %d: %s", n, index,
                            index + k, perr.msg);
    int rc;
    for (int k = 0; k < n; k++) {
        struct backend_cuda_opts co = {
            .device = index + k, .precision = r->precision, .batch_invariant = r->batch_invariant};
        if ((rc = cuda_gemm_env(&co, err)) || (rc = backend_cuda_create(&co, &g->be[k], err))) {
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

int backend_group_create(const struct backend_request *r, int n, struct backend_group *g,
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
    const char *why = force_cpu() ? " (QUERN_FORCE_CPU is set)" : "";
#ifdef QUERN_HAVE_CUDA
    if (!force_cpu() && kind != BACKEND_KIND_CPU) {
        struct qerr cerr = {0};
        int usable = backend_cuda_probe(index, NULL, 0, &cerr) == 0;
        if (usable || kind == BACKEND_KIND_CUDA)
            return backend_group_create_cuda(r, index, n, g, err);
        why = " (auto: cuda: no usable device)";
    }
#else
    if (!force_cpu() && kind == BACKEND_KIND_CUDA)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "--device %s --tp %d: this build has no CUDA backend", r->device, n);
    if (kind == BACKEND_KIND_AUTO && !force_cpu()) why = " (auto: built without CUDA)";
#endif
    int total = r->threads > 0 ? r->threads : online_cpus();
    int each = total / n > 0 ? total / n : 1;
    struct backend_cpu_opts o = {.n_threads = each, .precision = r->precision, .isa = CPU_ISA_AUTO};
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
             "cpu%s, --tp %d: %d ranks of %d thread%s over the %s communicator", why, n, n, each,
             each > 1 ? "s" : "", g->comm[0]->ops->name);
    return 0;
}
