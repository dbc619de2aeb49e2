/* quern-bench-kernels: CPU kernel and decode throughput next to this machine's ceiling.
 *
 *   quern bench --kernels [--threads N]   (or the quern-bench-kernels program, the same code)
 *   quern-bench-kernels [--threads N] [--isa scalar|avx2|avx512] [--precision f32|q8|both]
 *                       [--batches 1,8,64,512] [--model M.gguf [--pp 512] [--tg 64]]
 *
 * 1. Memory read bandwidth (a streaming read loop over 512 MiB, 1 thread and N threads) and
 *    memcpy bandwidth: the roofline every decode number is compared with; and the compute peak
 *    (fp32 FMA and int8 vpdpbusd chains on N threads), the roofline of large batches.
 * 2. The matmul of each matrix shape of the default model (SmolLM2-135M: Q4_1 layers, Q8_0 tied
 *    output) at each batch size, through the backend's matmul op (so it includes activation
 *    quantization and the pool): GB/s of weights and GFLOP/s. Batch-1 runs rotate over enough
 *    copies of the weight to miss the last-level cache, as a decode does.
 * 3. The other ops (RMSNorm, SiLU*up, RoPE, attention) at the model's sizes.
 * 4. With --model: prefill of a pp-token prompt and tg greedy decode steps (engine/generate.h),
 *    tokens/s, and the decode roofline (weight bytes per token / measured bandwidth). */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "generate.h"
#include "../kernels/cpu/backend_cpu.h"
#include "bench_kernels.h"
#include "bench_util.h"

/* ---- memory bandwidth ---- */

struct read_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

__attribute__((target("avx512f"))) static uint64_t read512(const uint64_t *p, size_t n)
{
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 8));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 16));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 24));
    }
    /* summed as unsigned: the intrinsic reduction adds signed 64-bit values, which overflow */
    uint64_t lanes[8], sum = 0;
    _mm512_storeu_si512(lanes,
                        _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}

static void *read_loop(void *arg)
{
    struct read_arg *a = arg;
    if (__builtin_cpu_supports("avx512f")) {
        a->sum = read512(a->p, a->n);
        return NULL;
    }
    /* 8 independent sums: the compiler vectorizes it, and it reads every cache line */
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= a->n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a->p[i + (size_t)k];
    a->sum = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

/* Best GB/s over 3 passes reading bytes with `threads` threads. */
static double read_bandwidth(const uint64_t *buf, size_t bytes, int threads)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[64];
        struct read_arg a[64];
        size_t per = bytes / 8 / (size_t)threads;
        double t0 = bench_now_s();
        for (int i = 0; i < threads; i++) {
            a[i] = (struct read_arg){buf + (size_t)i * per, per, 0};
            if (i) pthread_create(&th[i], NULL, read_loop, &a[i]);
        }
        read_loop(&a[0]);
        for (int i = 1; i < threads; i++) pthread_join(th[i], NULL);
        double dt = bench_now_s() - t0;
        uint64_t x = 0;
        for (int i = 0; i < threads; i++) x ^= a[i].sum;
        if (x == 42) printf(" "); /* keeps the sums alive */
        best = fmax(best, (double)(per * 8 * (size_t)threads) / dt / 1e9);
    }
    return best;
}

static double memcpy_bandwidth(uint8_t *buf, size_t bytes)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = bench_now_s();
        memcpy(buf + bytes / 2, buf, bytes / 2);
        double dt = bench_now_s() - t0;
        best = fmax(best, (double)(bytes / 2) / dt / 1e9); /* bytes read (as many written) */
    }
    return best;
}

/* ---- compute peak: independent chains of one instruction, no memory ---- */

#define TGT512      __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define PEAK_CHAINS 12 /* more than latency x throughput, so the chains never wait */

struct peak_arg {
    long iters;
    bool fma;
    float sink;
};

TGT512 static void *peak_loop(void *arg)
{
    struct peak_arg *a = arg;
    if (a->fma) {
        __m512 acc[PEAK_CHAINS], m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
        for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_set1_ps((float)k);
        for (long i = 0; i < a->iters; i++)
            for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
        __m512 t = acc[0];
        for (int k = 1; k < PEAK_CHAINS; k++) t = _mm512_add_ps(t, acc[k]);
        a->sink = _mm512_reduce_add_ps(t);
    } else {
        __m512i acc[PEAK_CHAINS], u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
        for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_set1_epi32(k);
        for (long i = 0; i < a->iters; i++)
            for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_dpbusd_epi32(acc[k], u, v);
        __m512i t = acc[0];
        for (int k = 1; k < PEAK_CHAINS; k++) t = _mm512_add_epi32(t, acc[k]);
        uint32_t lanes[16], sum = 0; /* unsigned: the chains wrap, as the hardware does */
        _mm512_storeu_si512(lanes, t);
        for (int i = 0; i < 16; i++) sum += lanes[i];
        a->sink = (float)sum;
    }
    return NULL;
}

/* Best G(FL)OP/s over 3 runs on `threads` threads: fp32 FMA (32 flops per instruction) or int8
 * vpdpbusd (64 multiply-adds = 128 ops per instruction, the unit the Q8 matmul's GFLOP/s counts).
 * 0 when the CPU lacks AVX-512 VNNI. */
static double compute_peak(bool fma, int threads)
{
    if (!__builtin_cpu_supports("avx512vnni") || threads > 64) return 0;
    const long iters = 4000000;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[64];
        struct peak_arg a[64];
        double t0 = bench_now_s();
        for (int i = 0; i < threads; i++) {
            a[i] = (struct peak_arg){.iters = iters, .fma = fma};
            if (i) pthread_create(&th[i], NULL, peak_loop, &a[i]);
        }
        peak_loop(&a[0]);
        for (int i = 1; i < threads; i++) pthread_join(th[i], NULL);
        double dt = bench_now_s() - t0;
        double ops = (double)iters * PEAK_CHAINS * (fma ? 32.0 : 128.0) * threads;
        best = fmax(best, ops / dt / 1e9);
    }
    return best;
}

/* ---- matmul ---- */

struct shape {
    const char *name;
    int64_t rows, cols;
    enum qtype type;
};

static const struct shape model_shapes[] = {
    {"attn_q/o 576x576", 576, 576, QTYPE_Q4_1},      {"attn_k/v 192x576", 192, 576, QTYPE_Q4_1},
    {"ffn_gate/up 1536x576", 1536, 576, QTYPE_Q4_1}, {"ffn_down 576x1536", 576, 1536, QTYPE_Q4_1},
    {"output 49152x576", 49152, 576, QTYPE_Q8_0},
};

/* Seconds per matmul call: the fastest of 5 windows of at least min_s / 5 each, each rotating
 * over `copies` prepared copies of the weight. The fastest window is the one least disturbed by
 * other processes on a shared machine. */
static double time_matmul(struct backend *be, struct bweight *ws, int copies, const float *x, int n,
                          float *y, double min_s)
{
    be->ops->matmul(be, &ws[0], x, n, y); /* warm the pool and the scratch */
    double best = 1e30;
    for (int win = 0; win < 5; win++) {
        int calls = 0;
        double t0 = bench_now_s(), dt;
        do {
            for (int c = 0; c < copies; c++) be->ops->matmul(be, &ws[c], x, n, y);
            calls += copies;
            dt = bench_now_s() - t0;
        } while (dt < min_s / 5);
        best = fmin(best, dt / calls);
    }
    return best;
}

static int bench_matmuls(const struct backend_cpu_opts *bo, const int *batches, int n_batches,
                         double bw, double peak)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct backend *be;
    struct qerr err = {0};
    if (backend_cpu_create(bo, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int maxn = 0;
    for (int i = 0; i < n_batches; i++) maxn = batches[i] > maxn ? batches[i] : maxn;
    printf("\nmatmul, %s, %s, %d thread(s): GB/s of weights read, GFLOP/s (2 rows cols n / s)\n",
           cpu_isa_name(backend_cpu_isa(be)),
           bo->precision == MATMUL_Q8 ? "Q8 activations" : "F32 activations", bo->n_threads);
    printf("%-22s %5s", "shape", "type");
    for (int i = 0; i < n_batches; i++) printf("   n=%-4d GB/s GFLOP/s", batches[i]);
    printf("\n");
    float *x = malloc((size_t)maxn * 1536 * sizeof *x);
    float *y = malloc((size_t)maxn * 49152 * sizeof *y);
    for (size_t i = 0; i < (size_t)maxn * 1536; i++) x[i] = bench_rng_float(&rng);
    for (size_t s = 0; s < sizeof model_shapes / sizeof model_shapes[0]; s++) {
        const struct shape *sh = &model_shapes[s];
        size_t bytes = qtype_row_bytes(sh->type, (size_t)sh->cols) * (size_t)sh->rows;
        /* enough copies to stream ~128 MiB: four times the last-level cache here */
        int copies = (int)((128u << 20) / bytes) + 1;
        struct bweight *ws = calloc((size_t)copies, sizeof *ws);
        for (int c = 0; c < copies; c++) {
            ws[c] = (struct bweight){.type = sh->type, .rows = sh->rows, .cols = sh->cols};
            ws[c].host = bench_random_weights(&rng, sh->type, sh->rows, sh->cols, 0.02f, 0.1f);
            if (!ws[c].host || be->ops->weight_prepare(be, &ws[c], &err)) {
                fprintf(stderr, "cannot prepare weight: %s\n", err.msg);
                return 1;
            }
        }
        printf("%-22s %5s", sh->name, qtype_name(sh->type));
        for (int i = 0; i < n_batches; i++) {
            int n = batches[i];
            /* big batches are compute-bound: one copy (cached) is as good and far quicker */
            double sec = time_matmul(be, ws, n >= 64 ? 1 : copies, x, n, y, 0.25);
            double gbs = (double)bytes / sec / 1e9;
            double gflops = 2.0 * (double)sh->rows * (double)sh->cols * n / sec / 1e9;
            printf("   %6.1f %5.1f %7.1f", sec * 1e6, gbs, gflops);
        }
        printf("   (us GB/s GFLOP/s)\n");
        for (int c = 0; c < copies; c++) {
            be->ops->weight_release(be, &ws[c]);
            free((void *)ws[c].host);
        }
        free(ws);
    }
    printf("(memory read bandwidth at %d thread(s): %.1f GB/s; compute peak %.0f %s)\n",
           bo->n_threads, bw, peak,
           bo->precision == MATMUL_Q8 ? "GOP/s, int8 vpdpbusd" : "GFLOP/s, fp32 FMA");
    free(x);
    free(y);
    backend_destroy(be);
    return 0;
}

/* ---- other ops ---- */

static int bench_ops(const struct backend_cpu_opts *bo, const int *batches, int n_batches)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct backend *be;
    struct qerr err = {0};
    if (backend_cpu_create(bo, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int dim = 576, ffn = 1536, heads = 9, kvh = 3, hd = 64, ctx = 512;
    int maxn = 0;
    for (int i = 0; i < n_batches; i++) maxn = batches[i] > maxn ? batches[i] : maxn;
    float *x = malloc((size_t)maxn * ffn * 4), *u = malloc((size_t)maxn * ffn * 4);
    float *w = malloc(dim * 4), *o = calloc((size_t)maxn * ffn, 4);
    for (size_t i = 0; i < (size_t)maxn * ffn; i++) {
        x[i] = bench_rng_float(&rng);
        u[i] = bench_rng_float(&rng);
    }
    for (int i = 0; i < dim; i++) w[i] = bench_rng_float(&rng);
    /* one sequence of ctx positions, the batch being its last n tokens */
    size_t kv = (size_t)ctx * kvh * hd;
    float *kc = malloc(kv * 4), *vc = malloc(kv * 4);
    for (size_t i = 0; i < kv; i++) {
        kc[i] = bench_rng_float(&rng);
        vc[i] = bench_rng_float(&rng);
    }
    int32_t *pos = malloc((size_t)ctx * 4), *seq = calloc((size_t)ctx, 4),
            *slot = malloc((size_t)ctx * 4);
    int32_t table[32];
    for (int i = 0; i < 32; i++) table[i] = i;
    printf("\nother ops, %s, %d thread(s): microseconds per call, fastest of 5 windows (batch of n "
           "tokens; attention at context %d)\n",
           cpu_isa_name(backend_cpu_isa(be)), bo->n_threads, ctx);
    printf("%-26s", "op");
    for (int i = 0; i < n_batches; i++) printf("  n=%-7d", batches[i]);
    printf("\n");
    for (int op = 0; op < 4; op++) {
        static const char *names[] = {"rmsnorm 576", "silu_mul 1536", "rope 9 heads x 64",
                                      "attention 9/3 heads x 64"};
        printf("%-26s", names[op]);
        for (int bi = 0; bi < n_batches; bi++) {
            int n = batches[bi];
            for (int i = 0; i < n; i++) {
                pos[i] = ctx - n + i;
                slot[i] = pos[i];
            }
            struct attn_batch b = {n, pos, seq, slot, 1, table, 32, 16};
            struct attn_shape s = {heads, kvh, hd, 0.125f};
            double best = 1e30;
            for (int win = 0; win < 5; win++) {
                int calls = 0;
                double t0 = bench_now_s(), dt;
                do {
                    switch (op) {
                    case 0:
                        be->ops->rmsnorm(be, o, x, w, n, dim, 1e-5f);
                        break;
                    case 1:
                        memcpy(o, x, (size_t)n * ffn * 4);
                        be->ops->silu_mul(be, o, u, (size_t)n * ffn);
                        break;
                    case 2:
                        be->ops->rope(be, o, pos, n, heads, hd, hd, 10000.0f);
                        break;
                    case 3:
                        be->ops->attention(be, o, x, kc, vc, &b, &s);
                        break;
                    }
                    calls++;
                    dt = bench_now_s() - t0;
                } while (dt < 0.02);
                best = fmin(best, dt / calls);
            }
            printf("  %9.2f", best * 1e6);
        }
        printf("\n");
    }
    free(x);
    free(u);
    free(w);
    free(o);
    free(kc);
    free(vc);
    free(pos);
    free(seq);
    free(slot);
    backend_destroy(be);
    return 0;
}

/* ---- per-op profile: a backend that times the real one's ops ---- */

enum { P_MATMUL, P_ATTN, P_NORM, P_ROPE, P_SILU, P_ADD, P_OTHER, P_N };
static const char *const prof_names[P_N] = {"matmul",   "attention", "rmsnorm", "rope",
                                            "silu_mul", "add",       "other"};

struct prof {
    struct backend self;  /* what the model calls */
    struct backend *real; /* what does the work */
    struct backend_ops ops;
    double sec[P_N];
    long calls[P_N];
};

static struct prof *prof_of(struct backend *be)
{
    return be->ctx;
}

#define TIMED(k, call)                                                                             \
    do {                                                                                           \
        struct prof *p_ = prof_of(be);                                                             \
        struct backend *r = p_->real;                                                              \
        double t0_ = bench_now_s();                                                                \
        call;                                                                                      \
        p_->sec[k] += bench_now_s() - t0_;                                                         \
        p_->calls[k]++;                                                                            \
    } while (0)

static void *pf_alloc(struct backend *be, size_t n)
{
    struct backend *r = prof_of(be)->real;
    return r->ops->buf_alloc(r, n);
}
static void pf_free(struct backend *be, void *b)
{
    struct backend *r = prof_of(be)->real;
    r->ops->buf_free(r, b);
}
static void pf_write(struct backend *be, void *d, const void *s, size_t n)
{
    TIMED(P_OTHER, r->ops->buf_write(r, d, s, n));
}
static void pf_read(struct backend *be, void *d, const void *s, size_t n)
{
    TIMED(P_OTHER, r->ops->buf_read(r, d, s, n));
}
static int pf_prepare(struct backend *be, struct bweight *w, struct qerr *err)
{
    struct backend *r = prof_of(be)->real;
    return r->ops->weight_prepare(r, w, err);
}
static void pf_release(struct backend *be, struct bweight *w)
{
    struct backend *r = prof_of(be)->real;
    r->ops->weight_release(r, w);
}
static void pf_embed(struct backend *be, const struct bweight *t, const int32_t *tok, int n,
                     float *out)
{
    TIMED(P_OTHER, r->ops->embed(r, t, tok, n, out));
}
static void pf_rmsnorm(struct backend *be, float *o, const float *x, const float *w, int n, int dim,
                       float eps)
{
    TIMED(P_NORM, r->ops->rmsnorm(r, o, x, w, n, dim, eps));
}
static void pf_add(struct backend *be, float *x, const float *y, size_t n)
{
    TIMED(P_ADD, r->ops->add(r, x, y, n));
}
static void pf_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y)
{
    TIMED(P_MATMUL, r->ops->matmul(r, w, x, n, y));
}
static void pf_rope(struct backend *be, float *x, const int32_t *pos, int n, int nh, int hd, int rd,
                    float base)
{
    TIMED(P_ROPE, r->ops->rope(r, x, pos, n, nh, hd, rd, base));
}
static void pf_kv_write(struct backend *be, void *kc, void *vc, const float *k, const float *v,
                        const struct attn_batch *b, int kv_dim)
{
    TIMED(P_OTHER, r->ops->kv_write(r, kc, vc, k, v, b, kv_dim));
}
static void pf_attention(struct backend *be, float *out, const float *q, const void *kc,
                         const void *vc, const struct attn_batch *b, const struct attn_shape *s)
{
    TIMED(P_ATTN, r->ops->attention(r, out, q, kc, vc, b, s));
}
static void pf_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                        int dim)
{
    TIMED(P_OTHER, r->ops->get_rows(r, out, x, idx, n, dim));
}
static void pf_silu(struct backend *be, float *g, const float *u, size_t n)
{
    TIMED(P_SILU, r->ops->silu_mul(r, g, u, n));
}
static void pf_sync(struct backend *be)
{
    struct backend *r = prof_of(be)->real;
    r->ops->sync(r);
}

static void prof_wrap(struct prof *p, struct backend *real)
{
    *p = (struct prof){.real = real};
    p->ops = (struct backend_ops){.name = "profile",
                                  .destroy = NULL,
                                  .buf_alloc = pf_alloc,
                                  .buf_free = pf_free,
                                  .buf_write = pf_write,
                                  .buf_read = pf_read,
                                  .weight_prepare = pf_prepare,
                                  .weight_release = pf_release,
                                  .embed = pf_embed,
                                  .rmsnorm = pf_rmsnorm,
                                  .add = pf_add,
                                  .matmul = pf_matmul,
                                  .rope = pf_rope,
                                  .kv_write = pf_kv_write,
                                  .attention = pf_attention,
                                  .get_rows = pf_get_rows,
                                  .silu_mul = pf_silu,
                                  .sync = pf_sync};
    p->self = (struct backend){.ops = &p->ops, .ctx = p};
}

static void prof_print(const struct prof *p, double total, int tokens)
{
    (void)0;
    double covered = 0;
    for (int k = 0; k < P_N; k++) {
        printf(" %s %.0f us (%ld calls)", prof_names[k], p->sec[k] / tokens * 1e6,
               p->calls[k] / tokens);
        covered += p->sec[k];
    }
    printf(", outside the backend %.0f us\n", (total - covered) / tokens * 1e6);
}

/* ---- the model ---- */

struct timing {
    double first;
    int tokens;
};

static bool on_token(void *ctx, int32_t token, const float *logits)
{
    (void)token;
    (void)logits;
    struct timing *t = ctx;
    if (t->tokens++ == 0) t->first = bench_now_s();
    return false;
}

static int bench_model(const char *path, const struct backend_cpu_opts *bo, int pp, int tg,
                       double bw, bool profile)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct qerr err = {0};
    struct gguf_file *f = NULL;
    struct backend *be = NULL, *run;
    struct model *m = NULL;
    static struct prof prof;
    int rc = gguf_open(path, &f, &err);
    if (!rc) rc = backend_cpu_create(bo, &be, &err);
    run = be;
    if (!rc && profile) {
        prof_wrap(&prof, be);
        run = &prof.self;
    }
    int total = pp + tg + 16;
    struct model_opts mo = {.max_batch_tokens = pp > 64 ? pp : 64,
                            .max_logits = 1,
                            .kv_blocks = (total + 15) / 16 + 1,
                            .kv_block_size = 16};
    if (!rc) rc = model_load(f, run, &mo, &m, &err);
    if (rc) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    /* bytes a decode step reads: every matrix once (the tied embedding as the output matrix) */
    double wbytes = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++)
        wbytes += (double)gguf_tensor_at(f, i)->nbytes;
    const struct model_config *c = model_get_config(m);
    int32_t *prompt = malloc((size_t)pp * sizeof *prompt);
    for (int i = 0; i < pp; i++) prompt[i] = (int32_t)(bench_rng_next(&rng) % (uint64_t)c->vocab);
    struct gen_opts o = {.n_predict = 1, .prefill_chunk = pp};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    /* prefill: pp tokens in one batch, best of 3 */
    double best_pp = 0;
    for (int rep = 0; rep < 3 && !rc; rep++) {
        struct timing t = {0};
        double t0 = bench_now_s();
        rc = generate_run(m, prompt, (size_t)pp, &o, on_token, &t, &err);
        best_pp = fmax(best_pp, pp / (t.first - t0));
    }
    /* decode: a 16-token prompt, then tg greedy steps, best of 3 */
    double best_tg = 0;
    o.n_predict = tg + 1;
    for (int rep = 0; rep < 3 && !rc; rep++) {
        struct timing t = {0};
        rc = generate_run(m, prompt, 16, &o, on_token, &t, &err);
        best_tg = fmax(best_tg, (t.tokens - 1) / (bench_now_s() - t.first));
    }
    if (profile && !rc) {
        /* one more prefill and one more decode run, each profiled */
        struct gen_opts o1 = o;
        o1.n_predict = 1;
        struct timing t = {0};
        memset(prof.sec, 0, sizeof prof.sec);
        memset(prof.calls, 0, sizeof prof.calls);
        double t0 = bench_now_s();
        rc = generate_run(m, prompt, (size_t)pp, &o1, on_token, &t, &err);
        printf("  prefill of %d tokens:", pp);
        prof_print(&prof, bench_now_s() - t0, 1);
        memset(prof.sec, 0, sizeof prof.sec);
        memset(prof.calls, 0, sizeof prof.calls);
        t = (struct timing){0};
        t0 = bench_now_s();
        if (!rc) rc = generate_run(m, prompt, 16, &o, on_token, &t, &err);
        printf("  decode, per step of %d:", tg + 1);
        prof_print(&prof, bench_now_s() - t0, tg + 1);
    }
    free(prompt);
    if (rc) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    double roof = bw * 1e9 / wbytes;
    printf("\nmodel %s, %s, %s, %d thread(s)\n", path, cpu_isa_name(backend_cpu_isa(be)),
           bo->precision == MATMUL_Q8 ? "Q8 activations" : "F32 activations", bo->n_threads);
    printf("  prefill %d tokens: %8.1f tokens/s\n", pp, best_pp);
    printf("  decode %d steps:   %8.1f tokens/s = %.1f GB/s of weights (%.1f MB/token); "
           "roofline %.1f tokens/s at %.1f GB/s: %.0f%%\n",
           tg, best_tg, best_tg * wbytes / 1e9, wbytes / 1e6, roof, bw, 100.0 * best_tg / roof);
out:
    model_free(m);
    backend_destroy(be);
    gguf_close(f);
    return rc ? 1 : 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: quern-bench-kernels [--threads N] [--isa scalar|avx2|avx512]\n"
                    "         [--precision f32|q8|both] [--batches 1,8,64,512] [--no-kernels]\n"
                    "         [--model M.gguf [--pp 512] [--tg 64] [--profile]]\n");
}

int bench_kernels_main(int argc, char **argv)
{
    struct backend_cpu_opts bo = {.n_threads = 0, .precision = MATMUL_F32, .isa = CPU_ISA_AUTO};
    const char *model = NULL;
    int pp = 512, tg = 64, both = 1, kernels = 1, profile = 0;
    int batches[16] = {1, 8, 64, 512}, n_batches = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads") && v) {
            bo.n_threads = atoi(v);
            i++;
        } else if (!strcmp(a, "--isa") && v) {
            int isa = cpu_isa_parse(v);
            if (isa < 0) return usage(), 2;
            bo.isa = (enum cpu_isa)isa;
            i++;
        } else if (!strcmp(a, "--precision") && v) {
            both = !strcmp(v, "both");
            bo.precision = !strcmp(v, "q8") ? MATMUL_Q8 : MATMUL_F32;
            i++;
        } else if (!strcmp(a, "--batches") && v) {
            n_batches = 0;
            for (char *s = (char *)v; *s && n_batches < 16;) {
                batches[n_batches++] = (int)strtol(s, &s, 10);
                if (*s == ',')
                    s++;
                else
                    break;
            }
            i++;
        } else if (!strcmp(a, "--model") && v) {
            model = v;
            i++;
        } else if (!strcmp(a, "--pp") && v) {
            pp = atoi(v);
            i++;
        } else if (!strcmp(a, "--tg") && v) {
            tg = atoi(v);
            i++;
        } else if (!strcmp(a, "--no-kernels")) {
            kernels = 0;
        } else if (!strcmp(a, "--profile")) {
            profile = 1;
        } else {
            usage();
            return 2;
        }
    }
    if (bo.n_threads <= 0) bo.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (pp < 16 || tg < 2 || n_batches < 1) return usage(), 2;

    size_t bytes = 512u << 20;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 1;
    memset(buf, 1, bytes);
    double bw1 = read_bandwidth(buf, bytes, 1), bwn = read_bandwidth(buf, bytes, bo.n_threads);
    double cp = memcpy_bandwidth((uint8_t *)buf, bytes);
    free(buf);
    printf("memory: read %.1f GB/s (1 thread), %.1f GB/s (%d threads); memcpy %.1f GB/s "
           "(1 thread)\n",
           bw1, bwn, bo.n_threads, cp);
    double peak_fp32 = compute_peak(true, bo.n_threads),
           peak_int8 = compute_peak(false, bo.n_threads);
    printf("compute peak (%d threads): fp32 FMA %.0f GFLOP/s, int8 vpdpbusd %.0f GOP/s%s\n",
           bo.n_threads, peak_fp32, peak_int8,
           peak_int8 > 0 ? "" : " (no AVX-512 VNNI: not measured)");

    int rc = 0;
    enum matmul_precision precs[2] = {bo.precision, MATMUL_Q8};
    int n_prec = both ? 2 : 1;
    if (both) precs[0] = MATMUL_F32;
    for (int p = 0; p < n_prec && !rc && kernels; p++) {
        struct backend_cpu_opts o = bo;
        o.precision = precs[p];
        rc = bench_matmuls(&o, batches, n_batches, bwn,
                           o.precision == MATMUL_Q8 ? peak_int8 : peak_fp32);
    }
    if (!rc && kernels) rc = bench_ops(&bo, batches, n_batches);
    for (int p = 0; p < n_prec && !rc && model; p++) {
        struct backend_cpu_opts o = bo;
        o.precision = precs[p];
        rc = bench_model(model, &o, pp, tg, bwn, profile);
    }
    return rc;
}
