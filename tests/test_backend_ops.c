/* Backend conformance: every op of the CUDA backend (kernels/cuda) against the CPU backend's
 * semantics, its scalar reference kernels (kernels/cpu/ref.c), on fresh random inputs at odd
 * shapes and batches 1 to 257. The whole model on the CUDA backend is the model suite's
 * (tests/test_model.c with $QUERN_TEST_DEVICE=cuda, and tests/test_model_cuda.c for the CUDA
 * paths the other backends lack); the emulation binary, which has no test_model of its own,
 * carries test_model_cuda.c's cases too (QUERN_TEST_MODEL_CASES).
 *
 * Without a usable GPU (no driver, no device: CI) it prints why and exits 77 (meson's "skipped")
 * before Check runs anything. With one, the suite runs without forking (CUDA must not be used
 * after a fork). Outputs are poisoned with NaN bytes before every op, so an unwritten element
 * fails.
 *
 * Tolerances, normalized as in tests/test_kernels.c (METHOD.md's bounds):
 *   matmul F32 and Q8     |y - ref| <= 1e-5 * sum |w x| per output (fp32 sums in another order;
 *                         the Q8 integer block sums are exact)
 *   matmul cuBLAS (fp16)  <= 4e-3 * sum |w x| (fp16 activations and weights)
 *   matmul MMA (fp16)     <= 1e-3 * sum |w x| (fp16 activations: 2^-11 each; exact weights),
 *   and the GEMV on fp16 activations (act_f16) too
 *   matmul MMA (int8)     bit for bit ref_matmul_q8_rows (the same block order and fmas), and
 *                         batch-invariant among batches that take it
 *   rmsnorm, silu         <= 1e-6 relative per element;  rope <= 1e-6 of the row's largest value
 *   gelu_mul, softcap     <= 1e-6 relative (gelu_mul: plus two ulps of its tanh near -1); scale:
 *                         bit for bit
 *   attention             <= 1e-5 of the largest |v| (fp16 cache: against the reference on
 *                         the fp16 values; kv_write rounds to nearest even, bit for bit), with
 *                         or without a sliding window; a window that excludes none of a token's
 *                         keys: bit for bit no window
 *   step replay           bit for bit the ops issued directly
 *   embed, get_rows, kv_write, add, moe_combine: bit for bit
 *   batch invariance      bit for bit: a token alone equals the same token inside any batch */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ref.h"
#include "../kernels/cuda/backend_cuda.h"
#include "testutil.h"
#ifdef QUERN_TEST_MODEL_CASES
#include "testmodel.h"
#endif

/* The matmul paths (backend_cuda_opts), each with the fp32 KV cache but gpu_kv16. */
enum { B_F32, B_Q8, B_CUBLAS, B_MMA, B_MMA_Q8, B_F16ACT, N_PATHS };
static struct backend *paths[N_PATHS];
static const char *const path_name[N_PATHS] = {"F32", "Q8", "cuBLAS", "MMA", "MMA-Q8", "F16-act"};
#define gpu    paths[B_F32] /* MATMUL_F32, batch-invariant: the GEMV for every n */
#define gpu_q8 paths[B_Q8]  /* MATMUL_Q8, batch-invariant */
/* paths[B_CUBLAS]: MATMUL_F32, cuBLAS for batches >= 16; B_MMA, B_MMA_Q8: gemm_mma from 16;
 * B_F16ACT: MATMUL_F32, batch-invariant, the GEMV on fp16 activations (act_f16) */
static struct backend *gpu_kv16; /* MATMUL_F32, the default fp16 KV cache and GEMM threshold */

static int make_backend(enum matmul_precision p, int gemm_min, enum cuda_gemm g,
                        struct backend **out);

/* ---- helpers ---- */

static void *dev_alloc(struct backend *be, size_t bytes)
{
    void *p = be->ops->buf_alloc(be, bytes);
    ck_assert_ptr_nonnull(p);
    return p;
}

static void *dev_upload(struct backend *be, const void *host, size_t bytes)
{
    void *p = dev_alloc(be, bytes);
    be->ops->buf_write(be, p, host, bytes);
    return p;
}

/* Fills a device buffer with NaN bytes. */
static void dev_poison(struct backend *be, void *dev, size_t bytes)
{
    void *h = malloc(bytes);
    memset(h, 0xff, bytes);
    be->ops->buf_write(be, dev, h, bytes);
    free(h);
}

static void dev_read(struct backend *be, void *host, const void *dev, size_t bytes)
{
    be->ops->buf_read(be, host, dev, bytes);
    struct qerr err = {0};
    ck_assert_msg(backend_cuda_status(be, &err) == 0, "%s", err.msg);
}

static void dev_free(struct backend *be, void *p)
{
    be->ops->buf_free(be, p);
}

static size_t count_nan(const float *x, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += isnan(x[i]) != 0;
    return k;
}

static void prepare(struct backend *be, struct bweight *w)
{
    struct qerr err = {0};
    ck_assert_msg(be->ops->weight_prepare(be, w, &err) == 0, "%s", err.msg);
}

/* y[n][rows] on the device, x given on the host. */
static void run_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y)
{
    size_t xb = (size_t)n * (size_t)w->cols * 4, yb = (size_t)n * (size_t)w->rows * 4;
    float *dx = dev_upload(be, x, xb), *dy = dev_alloc(be, yb);
    dev_poison(be, dy, yb);
    be->ops->matmul(be, w, dx, n, dy);
    dev_read(be, y, dy, yb);
    ck_assert_msg(count_nan(y, (size_t)n * (size_t)w->rows) == 0,
                  "%s %lld x %lld n %d: %zu outputs not written", qtype_name(w->type),
                  (long long)w->rows, (long long)w->cols, n,
                  count_nan(y, (size_t)n * (size_t)w->rows));
    dev_free(be, dx);
    dev_free(be, dy);
}

static void q8_reference(const struct bweight *w, const float *x, int n, float *y)
{
    struct q8act a;
    tu_q8_quantize(&a, x, n, w->cols);
    ref_matmul_q8_rows(w, &a, n, y, 0, w->rows);
    tu_q8_free(&a);
}

/* One weight against the references on every GPU matmul path, plus batch invariance: every
 * token computed alone gives the same bits as inside the batch (the batch-invariant paths), and
 * the last 16 tokens alone the same as in the whole batch (the MMA paths). The GEMM paths are
 * checked only for batches that take them (n >= 16). */
static void check_matmul(enum qtype t, int64_t rows, int64_t cols, int n, bool invariance,
                         double worst[N_PATHS])
{
    struct bweight w;
    tu_make_weight(&w, t, rows, cols);
    size_t ny = (size_t)n * (size_t)rows;
    float *x = malloc((size_t)n * (size_t)cols * 4);
    tu_fill(x, (size_t)n * (size_t)cols, 1.0f);
    float *yref = malloc(ny * 4), *yq8 = NULL, *y = malloc(ny * 4), *y1 = malloc(ny * 4);
    ref_matmul_rows(&w, x, n, yref, 0, rows);
    if (ref_q8_type(t)) {
        yq8 = malloc(ny * 4);
        q8_reference(&w, x, n, yq8);
    }
    for (int k = 0; k < N_PATHS; k++) {
        struct backend *be = paths[k];
        const bool gemm = k == B_CUBLAS || k == B_MMA || k == B_MMA_Q8;
        if (gemm && n < 16) continue; /* the GEMV, as B_F32 and B_Q8 */
        if ((k == B_MMA || k == B_MMA_Q8) && !ref_q8_type(t)) continue; /* float: the GEMV */
        bool q8 = (k == B_Q8 || k == B_MMA_Q8) && yq8;
        struct bweight wb = w;
        prepare(be, &wb);
        run_matmul(be, &wb, x, n, y);
        double e = tu_matmul_error(&w, x, n, y, q8 ? yq8 : yref);
        double tol = k == B_CUBLAS                 ? 4e-3
                     : k == B_MMA || k == B_F16ACT ? 1e-3
                     : k == B_MMA_Q8               ? 0.0
                                                   : 1e-5;
        if (e > worst[k]) worst[k] = e;
        ck_assert_msg(e <= tol, "%s %s %lld x %lld n %d: normalized error %.3g > %.1g",
                      path_name[k], qtype_name(t), (long long)rows, (long long)cols, n, e, tol);
        if (k == B_MMA_Q8) {
            size_t at;
            ck_assert_msg(!tu_bits_differ(y, yq8, ny, &at),
                          "MMA-Q8 %s %lld x %lld n %d: output %zu is %.9g, the reference %.9g",
                          qtype_name(t), (long long)rows, (long long)cols, n, at, y[at], yq8[at]);
        }
        if (invariance && (k == B_F32 || k == B_Q8 || k == B_F16ACT)) {
            for (int i = 0; i < n; i++) {
                run_matmul(be, &wb, x + (size_t)i * (size_t)cols, 1, y1);
                size_t at;
                ck_assert_msg(!tu_bits_differ(y1, y + (size_t)i * (size_t)rows, (size_t)rows, &at),
                              "%s %s %lld x %lld: token %d of %d alone differs at row %zu: %.9g "
                              "vs %.9g",
                              path_name[k], qtype_name(t), (long long)rows, (long long)cols, i, n,
                              at, y1[at], y[(size_t)i * (size_t)rows + at]);
            }
        }
        if (invariance && (k == B_MMA || k == B_MMA_Q8) && n >= 32) {
            run_matmul(be, &wb, x + (size_t)(n - 16) * (size_t)cols, 16, y1);
            size_t at;
            ck_assert_msg(!tu_bits_differ(y1, y + (size_t)(n - 16) * (size_t)rows,
                                          (size_t)16 * (size_t)rows, &at),
                          "%s %s %lld x %lld: the last 16 of %d tokens differ at %zu", path_name[k],
                          qtype_name(t), (long long)rows, (long long)cols, n, at);
        }
        be->ops->weight_release(be, &wb);
    }
    free(x);
    free(y);
    free(y1);
    free(yref);
    free(yq8);
    tu_free_weight(&w);
}

static void print_worst(const char *what, const double worst[N_PATHS])
{
    printf("%s: worst normalized error", what);
    for (int k = 0; k < N_PATHS; k++) printf(" %s %.2e", path_name[k], worst[k]);
    printf("\n");
}

/* ---- matmul ---- */

START_TEST(matmul_quant_odd_shapes)
{
    tu_seed(0x5eed + (uint64_t)_i);
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q8_0};
    const int64_t rows[] = {1, 7, 17, 33, 100, 257};
    const int64_t cols[] = {32, 96, 576, 1536};
    const int ns[] = {1, 2, 3, 5, 8, 9, 13, 16, 37, 64, 257};
    double worst[N_PATHS] = {0};
    int k = 0;
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++, k++) {
                int n = ns[(size_t)(k + _i) % (sizeof ns / sizeof ns[0])];
                check_matmul(types[ti], rows[ri], cols[ci], n, k % 4 == 0, worst);
            }
    char what[64];
    snprintf(what, sizeof what, "matmul quant (%d shapes)", k);
    print_worst(what, worst);
}
END_TEST

START_TEST(matmul_float_weights)
{
    tu_seed(0xf10a7);
    const enum qtype types[] = {QTYPE_F32, QTYPE_F16, QTYPE_BF16};
    const int shapes[][3] = {{37, 100, 5}, {19, 64, 9}, {5, 7, 3}, {64, 576, 13}, {3, 1000, 1}};
    double worst[N_PATHS] = {0};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            if (types[ti] != QTYPE_F32 && shapes[si][1] % 2) continue;
            check_matmul(types[ti], shapes[si][0], shapes[si][1], shapes[si][2], true, worst);
        }
    print_worst("matmul float weights", worst);
}
END_TEST

/* The default model's shapes (SmolLM2-135M: dim 576, kv 192, ffn 1536, vocab 49152), and rows
 * as wide as Llama's (130 blocks: lanes that loop three times, a last step with one block). */
START_TEST(matmul_model_shapes)
{
    tu_seed(0x135);
    const struct {
        int64_t rows, cols;
        enum qtype t;
    } shapes[] = {{576, 576, QTYPE_Q4_1},  {192, 576, QTYPE_Q4_1},   {1536, 576, QTYPE_Q4_1},
                  {576, 1536, QTYPE_Q4_1}, {49152, 576, QTYPE_Q8_0}, {37, 4160, QTYPE_Q4_0},
                  {37, 4160, QTYPE_Q8_0}};
    const int ns[] = {1, 3, 16, 64, 257};
    double worst[N_PATHS] = {0};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            int n = ns[ni];
            if (shapes[si].rows > 10000 && n > 8) n = 17; /* keep the scalar reference quick */
            if (shapes[si].rows > 10000 && (ni == 1 || ni > 2)) continue;
            /* 257 tokens (the GEMM paths): not on two of the Q4_1 shapes, the emulation's
             * slowest cases, whose K (576, 1536) the others cover */
            if (n == 257 && (si == 1 || si == 3)) continue;
            /* token-alone invariance at 3, 16 and 64 tokens (257 alone would be slow here) */
            check_matmul(shapes[si].t, shapes[si].rows, shapes[si].cols, n,
                         ni >= 1 && ni <= 3 && shapes[si].rows < 10000, worst);
        }
    print_worst("matmul model shapes", worst);
}
END_TEST

/* n beyond one matmul pass (max_tokens of the backend under test) and beyond a tile: same bits
 * as in smaller batches. */
START_TEST(matmul_batch_prefixes_invariant)
{
    tu_seed(0xba7c4);
    const int n = 45;
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q8_0, QTYPE_F16};
    for (size_t ti = 0; ti < 4; ti++) {
        struct bweight w;
        tu_make_weight(&w, types[ti], 45, 576);
        float *x = malloc((size_t)n * 576 * 4);
        tu_fill(x, (size_t)n * 576, 1.0f);
        float *yb = malloc((size_t)n * 45 * 4), *yp = malloc((size_t)n * 45 * 4);
        struct backend *bes[2] = {gpu, gpu_q8};
        for (int k = 0; k < 2; k++) {
            struct bweight wb = w;
            prepare(bes[k], &wb);
            run_matmul(bes[k], &wb, x, n, yb);
            const int prefixes[] = {1, 3, 7, 8, 11, 16, 17, 33};
            for (size_t pi = 0; pi < sizeof prefixes / sizeof prefixes[0]; pi++) {
                int m = prefixes[pi];
                /* the last m tokens: other tiles, other offsets, same values */
                run_matmul(bes[k], &wb, x + (size_t)(n - m) * 576, m, yp);
                size_t at;
                ck_assert_msg(!tu_bits_differ(yp, yb + (size_t)(n - m) * 45, (size_t)m * 45, &at),
                              "%s precision %d: the last %d tokens differ at %zu",
                              qtype_name(w.type), k, m, at);
            }
            bes[k]->ops->weight_release(bes[k], &wb);
        }
        free(x);
        free(yb);
        free(yp);
        tu_free_weight(&w);
    }
}
END_TEST

/* ---- row ops ---- */

START_TEST(rmsnorm_add_silu_match_reference)
{
    tu_seed(0x70);
    const int dims[] = {8, 64, 100, 576, 1536, 4096};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int dim = dims[di], n = 1 + (int)(tu_rnd() % 64);
        size_t len = (size_t)n * (size_t)dim, bytes = len * 4;
        float *x = malloc(bytes), *w = malloc((size_t)dim * 4), *o = malloc(bytes);
        float *r = malloc(bytes), *y = malloc(bytes);
        tu_fill(x, len, 3.0f);
        tu_fill(w, (size_t)dim, 1.0f);
        tu_fill(y, len, 3.0f);
        float *dx = dev_upload(gpu, x, bytes), *dw = dev_upload(gpu, w, (size_t)dim * 4);
        float *dy = dev_upload(gpu, y, bytes), *dout = dev_alloc(gpu, bytes);
        /* rmsnorm, out of place and in place */
        dev_poison(gpu, dout, bytes);
        gpu->ops->rmsnorm(gpu, dout, dx, dw, n, dim, 1e-5f);
        dev_read(gpu, o, dout, bytes);
        ref_rmsnorm(r, x, w, n, dim, 1e-5f);
        for (size_t k = 0; k < len; k++)
            ck_assert_msg(fabs(o[k] - r[k]) <= 1e-6 * fabs(r[k]) + 1e-30,
                          "rmsnorm dim %d [%zu]: %.9g vs %.9g", dim, k, o[k], r[k]);
        gpu->ops->rmsnorm(gpu, dx, dx, dw, n, dim, 1e-5f);
        float *o2 = malloc(bytes);
        dev_read(gpu, o2, dx, bytes);
        size_t at;
        ck_assert_msg(!tu_bits_differ(o2, o, len, &at), "rmsnorm in place differs at %zu", at);
        free(o2);
        /* add: exact */
        gpu->ops->buf_write(gpu, dx, x, bytes);
        gpu->ops->add(gpu, dx, dy, len);
        dev_read(gpu, o, dx, bytes);
        for (size_t k = 0; k < len; k++) ck_assert_float_eq(o[k], x[k] + y[k]);
        /* add_rows (a bias on each row): exact */
        float *db = dev_upload(gpu, x, bytes);
        ck_assert_ptr_nonnull(gpu->ops->add_rows);
        gpu->ops->add_rows(gpu, db, dw, n, dim);
        dev_read(gpu, o, db, bytes);
        for (size_t k = 0; k < len; k++) ck_assert_float_eq(o[k], x[k] + w[k % (size_t)dim]);
        dev_free(gpu, db);
        /* add_rmsnorm: bit for bit add then rmsnorm, with out aliasing y as the model uses it */
        gpu->ops->rmsnorm(gpu, dout, dx, dw, n, dim, 1e-5f);
        float *want = malloc(bytes), *sum = malloc(bytes), *fx = malloc(bytes);
        dev_read(gpu, want, dout, bytes);
        dev_read(gpu, sum, dx, bytes);
        float *dx2 = dev_upload(gpu, x, bytes), *dy2 = dev_upload(gpu, y, bytes);
        ck_assert_ptr_nonnull(gpu->ops->add_rmsnorm);
        gpu->ops->add_rmsnorm(gpu, dy2, dx2, dy2, dw, n, dim, 1e-5f);
        dev_read(gpu, fx, dx2, bytes);
        ck_assert_msg(!tu_bits_differ(fx, sum, len, &at), "add_rmsnorm: the sum differs at %zu",
                      at);
        dev_read(gpu, fx, dy2, bytes);
        ck_assert_msg(!tu_bits_differ(fx, want, len, &at), "add_rmsnorm: the norm differs at %zu",
                      at);
        dev_free(gpu, dx2);
        dev_free(gpu, dy2);
        free(want);
        free(sum);
        free(fx);
        /* silu_mul */
        for (size_t k = 0; k < len; k++) x[k] = tu_frand(-30.0f, 30.0f);
        memcpy(r, x, bytes);
        gpu->ops->buf_write(gpu, dx, x, bytes);
        gpu->ops->silu_mul(gpu, dx, dy, len);
        dev_read(gpu, o, dx, bytes);
        ref_silu_mul(r, y, len);
        size_t exact = 0;
        for (size_t k = 0; k < len; k++) {
            exact += memcmp(&o[k], &r[k], 4) == 0;
            ck_assert_msg(fabs(o[k] - r[k]) <= 1e-6 * fabs(r[k]) + 1e-30,
                          "silu [%zu]: %.9g vs %.9g", k, o[k], r[k]);
        }
        if (di == 0) printf("silu: %zu of %zu bit-exact\n", exact, len);
        dev_free(gpu, dx);
        dev_free(gpu, dw);
        dev_free(gpu, dy);
        dev_free(gpu, dout);
        free(x);
        free(w);
        free(o);
        free(r);
        free(y);
    }
}
END_TEST

/* The default fp16 KV cache: kv_write stores each element rounded to nearest even (as
 * f32_to_fp16 does) and leaves the rest of the cache alone; attention over an fp16 cache equals
 * the reference run on the fp16 values widened to fp32, within the fp32 tolerance, split path
 * included. */
START_TEST(kv_f16_cache)
{
    tu_seed(0xf16);
    ck_assert_uint_eq(backend_kv_elem_bytes(gpu_kv16), 2);
    ck_assert_uint_eq(backend_kv_elem_bytes(gpu), 4);
    enum { HEADS = 8, KVH = 2, HD = 64, KV_DIM = KVH * HD, N_SEQS = 2, MAX_BLOCKS = 24, BS = 16 };
    enum { N_BLOCKS = N_SEQS * MAX_BLOCKS, SLOTS = N_BLOCKS * BS, N = 7 };
    size_t kv = (size_t)SLOTS * KV_DIM;
    /* a cache of fp16 values, and its fp32 widening for the reference */
    uint16_t *kh = malloc(kv * 2), *vh = malloc(kv * 2), *got = malloc(kv * 2);
    float *kf = malloc(kv * 4), *vf = malloc(kv * 4);
    for (size_t i = 0; i < kv; i++) {
        kh[i] = f32_to_fp16(tu_frand(-2.0f, 2.0f));
        vh[i] = f32_to_fp16(tu_frand(-1.0f, 1.0f));
        kf[i] = fp16_to_f32(kh[i]);
        vf[i] = fp16_to_f32(vh[i]);
    }
    int32_t table[N_BLOCKS], pos[N], seq[N], slot[N];
    for (int i = 0; i < N_BLOCKS; i++) table[i] = (i * 7) % N_BLOCKS;
    for (int t = 0; t < N; t++) {
        seq[t] = t % N_SEQS;
        pos[t] = t == 0 ? 3 : (int32_t)(tu_rnd() % (uint64_t)(MAX_BLOCKS * BS));
        slot[t] = table[seq[t] * MAX_BLOCKS + pos[t] / BS] * BS + pos[t] % BS;
    }
    float k[N * KV_DIM], v[N * KV_DIM];
    tu_fill(k, (size_t)N * KV_DIM, 3.0f);
    tu_fill(v, (size_t)N * KV_DIM, 3.0f);
    struct backend *be = gpu_kv16;
    void *dkc = dev_upload(be, kh, kv * 2), *dvc = dev_upload(be, vh, kv * 2);
    float *dk = dev_upload(be, k, sizeof k), *dv = dev_upload(be, v, sizeof v);
    int32_t *dpos = dev_upload(be, pos, sizeof pos), *dseq = dev_upload(be, seq, sizeof seq);
    int32_t *dslot = dev_upload(be, slot, sizeof slot), *dtab = dev_upload(be, table, sizeof table);
    struct attn_batch b = {N, dpos, dseq, dslot, N_SEQS, dtab, MAX_BLOCKS, BS, 0};
    be->ops->kv_write(be, dkc, dvc, dk, dv, &b, KV_DIM);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < KV_DIM; j++) {
            size_t at = (size_t)slot[t] * KV_DIM + (size_t)j;
            kh[at] = f32_to_fp16(k[t * KV_DIM + j]);
            vh[at] = f32_to_fp16(v[t * KV_DIM + j]);
            kf[at] = fp16_to_f32(kh[at]);
            vf[at] = fp16_to_f32(vh[at]);
        }
    dev_read(be, got, dkc, kv * 2);
    ck_assert_msg(memcmp(got, kh, kv * 2) == 0, "fp16 k cache differs from the rounded rows");
    dev_read(be, got, dvc, kv * 2);
    ck_assert_msg(memcmp(got, vh, kv * 2) == 0, "fp16 v cache differs from the rounded rows");

    struct attn_shape sh = {HEADS, KVH, HD, 1.0f / sqrtf((float)HD), 0};
    size_t qn = (size_t)N * HEADS * HD;
    float *q = malloc(qn * 4), *o = malloc(qn * 4), *ref = malloc(qn * 4);
    tu_fill(q, qn, 2.0f);
    struct attn_batch hb = {N, pos, seq, slot, N_SEQS, table, MAX_BLOCKS, BS, 0};
    for (int t = 0; t < N; t++)
        for (int h = 0; h < HEADS; h++) ref_attention_one(ref, q, kf, vf, &hb, &sh, t, h);
    double vmax = 0;
    for (size_t i = 0; i < kv; i++) vmax = fmax(vmax, fabs(vf[i]));
    float *dq = dev_upload(be, q, qn * 4), *dout = dev_alloc(be, qn * 4);
    dev_poison(be, dout, qn * 4);
    be->ops->attention(be, dout, dq, dkc, dvc, &b, &sh);
    dev_read(be, o, dout, qn * 4);
    for (size_t i = 0; i < qn; i++)
        ck_assert_msg(fabs(o[i] - ref[i]) <= 1e-5 * vmax,
                      "fp16-cache attention [%zu]: %.8g vs %.8g", i, o[i], ref[i]);
    void *bufs[] = {dkc, dvc, dk, dv, dpos, dseq, dslot, dtab, dq, dout};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(be, bufs[i]);
    free(kh);
    free(vh);
    free(got);
    free(kf);
    free(vf);
    free(q);
    free(o);
    free(ref);
}
END_TEST

/* Whole-step replay (graphs.cu): a step of rmsnorm, matmul, rope and add issued between
 * step_begin and step_end gives bit for bit what the same ops give issued directly, for fresh
 * inputs every time; the first sight of a key runs directly, the second captures, later ones
 * replay; a new shape is a new key; step_reset and a freed buffer forget the captures. */
static void replay_step(struct backend *be, const struct bweight *w, float *dx, float *dxn,
                        float *dy, const float *dnorm, const int32_t *dpos, int n, bool bracket,
                        uint64_t key, bool *replayed)
{
    *replayed = false;
    if (bracket && be->ops->step_begin(be, key)) {
        *replayed = true;
        return;
    }
    be->ops->rmsnorm(be, dxn, dx, dnorm, n, (int)w->cols, 1e-5f);
    be->ops->matmul(be, w, dxn, n, dy);
    const struct rope_spec rs = {.rot_dim = 64, .base = 10000.0f, .scale = 1.0f};
    be->ops->rope(be, dy, dpos, n, (int)w->rows / 64, 64, &rs);
    be->ops->add(be, dy, dy, (size_t)n * (size_t)w->rows);
    if (bracket) ck_assert(be->ops->step_end(be));
}

START_TEST(step_replay_equals_direct)
{
    tu_seed(0x6a7);
    struct backend *bes[] = {gpu, gpu_q8};
    for (int bi = 0; bi < 2; bi++) {
        struct backend *be = bes[bi];
        ck_assert_ptr_nonnull(be->ops->step_begin);
        struct bweight w;
        tu_make_weight(&w, QTYPE_Q4_1, 128, 96);
        prepare(be, &w);
        const int nmax = 5;
        float *dx = dev_alloc(be, (size_t)nmax * 96 * 4),
              *dxn = dev_alloc(be, (size_t)nmax * 96 * 4);
        float *dy = dev_alloc(be, (size_t)nmax * 128 * 4);
        float norm[96];
        tu_fill(norm, 96, 1.0f);
        float *dnorm = dev_upload(be, norm, sizeof norm);
        int32_t *dpos = dev_alloc(be, (size_t)nmax * 4);
        int replays = 0;
        for (int it = 0; it < 8; it++) {
            int n = it < 5 ? 3 : 5; /* a second key from step 5 on */
            float x[5 * 96], want[5 * 128], got[5 * 128];
            int32_t pos[5];
            tu_fill(x, (size_t)n * 96, 2.0f);
            for (int t = 0; t < n; t++) pos[t] = (int32_t)(tu_rnd() % 4000);
            bool rep;
            for (int pass = 0; pass < 2; pass++) { /* 0: direct, 1: bracketed */
                be->ops->buf_write(be, dx, x, (size_t)n * 96 * 4);
                be->ops->buf_write(be, dpos, pos, (size_t)n * 4);
                dev_poison(be, dy, (size_t)n * 128 * 4);
                replay_step(be, &w, dx, dxn, dy, dnorm, dpos, n, pass == 1, (uint64_t)n, &rep);
                dev_read(be, pass ? got : want, dy, (size_t)n * 128 * 4);
            }
            size_t at;
            ck_assert_msg(!tu_bits_differ(got, want, (size_t)n * 128, &at),
                          "backend %d step %d (n %d, %s): differs at %zu: %.9g vs %.9g", bi, it, n,
                          rep ? "replayed" : "direct", at, got[at], want[at]);
            /* key 3: steps 0 (direct), 1 (captured), 2-4 replayed; key 5: 5, 6, then 7 */
            bool want_rep = (it >= 2 && it <= 4) || it == 7;
            ck_assert_msg(rep == want_rep, "backend %d step %d: replayed %d", bi, it, rep);
            replays += rep;
        }
        ck_assert_int_eq(replays, 4);
        /* after a reset a known key runs directly again */
        be->ops->step_reset(be);
        bool rep;
        replay_step(be, &w, dx, dxn, dy, dnorm, dpos, 3, true, 3, &rep);
        ck_assert(!rep);
        dev_free(be, dx);
        dev_free(be, dxn);
        dev_free(be, dy);
        dev_free(be, dnorm);
        dev_free(be, dpos);
        be->ops->weight_release(be, &w);
        tu_free_weight(&w);
    }
}
END_TEST

START_TEST(rope_matches_reference)
{
    tu_seed(0x20be);
    const int cfg[][3] = {{64, 64, 9}, {64, 32, 3}, {128, 128, 32}, {48, 16, 1}, {20, 10, 2}};
    float factors[64];
    for (int i = 0; i < 64; i++) factors[i] = 1.0f + (float)(tu_rnd() % 3100) / 100.0f;
    size_t exact = 0, total = 0;
    /* each shape twice, with and without linear scaling, per-pair factors and YaRN's attention
     * factor, so frequencies kept from the last call under another spec would show */
    for (size_t c = 0; c < 2 * sizeof cfg / sizeof cfg[0]; c++) {
        const int *g = cfg[c % (sizeof cfg / sizeof cfg[0])];
        int hd = g[0], rot = g[1], heads = g[2], n = 1 + (int)(tu_rnd() % 64);
        size_t len = (size_t)n * (size_t)heads * (size_t)hd;
        float *x = malloc(len * 4), *r = malloc(len * 4), *o = malloc(len * 4);
        int32_t *pos = malloc((size_t)n * 4);
        for (int t = 0; t < n; t++) pos[t] = (int32_t)(tu_rnd() % 100000);
        tu_fill(x, len, 2.0f);
        memcpy(r, x, len * 4);
        struct rope_spec rs = {.rot_dim = rot,
                               .base = c % 2 ? 10000.0f : 500000.0f,
                               .scale = c % 3 == 1 ? 0.125f : 1.0f,
                               .factors = c % 3 == 2 ? factors : NULL,
                               .mscale = c % 4 == 3 ? 1.1386294f : 0};
        float *dx = dev_upload(gpu, x, len * 4);
        int32_t *dpos = dev_upload(gpu, pos, (size_t)n * 4);
        gpu->ops->rope(gpu, dx, dpos, n, heads, hd, &rs);
        dev_read(gpu, o, dx, len * 4);
        ref_rope(r, pos, n, heads, hd, &rs);
        for (size_t k = 0; k < len; k++) {
            exact += memcmp(&o[k], &r[k], 4) == 0;
            ck_assert_msg(fabs(o[k] - r[k]) <= 1e-6 * 16.0, "rope hd %d rot %d [%zu]: %.9g vs %.9g",
                          hd, rot, k, o[k], r[k]);
        }
        total += len;
        dev_free(gpu, dx);
        dev_free(gpu, dpos);
        free(x);
        free(r);
        free(o);
        free(pos);
    }
    printf("rope: %zu of %zu bit-exact\n", exact, total);
}
END_TEST

START_TEST(embed_get_rows_kv_write_exact)
{
    tu_seed(0xe4bed);
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q8_0,
                                QTYPE_F16,  QTYPE_BF16, QTYPE_F32};
    const int n = 19, rows = 301, cols = 576;
    int32_t tok[19];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(tu_rnd() % rows);
    tok[0] = rows - 1;
    int32_t *dtok = dev_upload(gpu, tok, sizeof tok);
    float *ref = malloc((size_t)n * cols * 4), *o = malloc((size_t)n * cols * 4);
    float *dout = dev_alloc(gpu, (size_t)n * cols * 4);
    for (size_t ti = 0; ti < 6; ti++) {
        struct bweight w;
        tu_make_weight(&w, types[ti], rows, cols);
        prepare(gpu, &w);
        dev_poison(gpu, dout, (size_t)n * cols * 4);
        gpu->ops->embed(gpu, &w, dtok, n, dout);
        dev_read(gpu, o, dout, (size_t)n * cols * 4);
        ref_embed(&w, tok, n, ref);
        size_t at;
        ck_assert_msg(!tu_bits_differ(o, ref, (size_t)n * cols, &at), "embed %s differs at %zu",
                      qtype_name(w.type), at);
        gpu->ops->weight_release(gpu, &w);
        tu_free_weight(&w);
    }
    /* get_rows: rows of o picked by idx */
    int32_t idx[5] = {18, 0, 7, 7, 3};
    int32_t *didx = dev_upload(gpu, idx, sizeof idx);
    float *dsel = dev_alloc(gpu, 5 * cols * 4), *sel = malloc(5 * cols * 4);
    dev_poison(gpu, dsel, 5 * cols * 4);
    gpu->ops->get_rows(gpu, dsel, dout, didx, 5, cols);
    dev_read(gpu, sel, dsel, 5 * cols * 4);
    for (int i = 0; i < 5; i++)
        ck_assert(!memcmp(sel + (size_t)i * cols, o + (size_t)idx[i] * cols, (size_t)cols * 4));
    /* kv_write: token i's rows land at slot[i], the rest of the cache untouched */
    const int kv_dim = 192, slots = 64;
    int32_t slot[19];
    for (int i = 0; i < n; i++) slot[i] = (int32_t)((i * 37 + 5) % slots);
    float *k = malloc((size_t)n * kv_dim * 4), *v = malloc((size_t)n * kv_dim * 4);
    tu_fill(k, (size_t)n * kv_dim, 1.0f);
    tu_fill(v, (size_t)n * kv_dim, 1.0f);
    float *kc = malloc((size_t)slots * kv_dim * 4), *vc = malloc((size_t)slots * kv_dim * 4);
    tu_fill(kc, (size_t)slots * kv_dim, 1.0f);
    tu_fill(vc, (size_t)slots * kv_dim, 1.0f);
    float *dk = dev_upload(gpu, k, (size_t)n * kv_dim * 4);
    float *dv = dev_upload(gpu, v, (size_t)n * kv_dim * 4);
    float *dkc = dev_upload(gpu, kc, (size_t)slots * kv_dim * 4);
    float *dvc = dev_upload(gpu, vc, (size_t)slots * kv_dim * 4);
    int32_t *dslot = dev_upload(gpu, slot, sizeof slot);
    struct attn_batch b = {.n_tokens = n, .slot = dslot};
    struct attn_batch hb = {.n_tokens = n, .slot = slot};
    gpu->ops->kv_write(gpu, dkc, dvc, dk, dv, &b, kv_dim);
    ref_kv_write(kc, vc, k, v, &hb, kv_dim);
    float *got = malloc((size_t)slots * kv_dim * 4);
    size_t at;
    dev_read(gpu, got, dkc, (size_t)slots * kv_dim * 4);
    ck_assert_msg(!tu_bits_differ(got, kc, (size_t)slots * kv_dim, &at), "k cache differs at %zu",
                  at);
    dev_read(gpu, got, dvc, (size_t)slots * kv_dim * 4);
    ck_assert_msg(!tu_bits_differ(got, vc, (size_t)slots * kv_dim, &at), "v cache differs at %zu",
                  at);
    void *bufs[] = {dtok, dout, didx, dsel, dk, dv, dkc, dvc, dslot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(gpu, bufs[i]);
    free(ref);
    free(o);
    free(sel);
    free(k);
    free(v);
    free(kc);
    free(vc);
    free(got);
}
END_TEST

/* ---- attention ---- */

/* n tokens over 3 sequences of up to 40 blocks of 16 positions, a shuffled block table; random
 * tokens of random sequences (decode), or consecutive positions of one sequence (prefill 1) or of
 * two, one after the other (prefill 2: tiles that span both). Over an fp32 cache, then over the
 * default fp16 cache (_i 1: its values widened for the reference; head dims that are multiples
 * of 8 up to 128 take the staged kernel). */
START_TEST(attention_matches_reference)
{
    const bool kv16 = _i == 1;
    tu_seed(kv16 ? 0xa77f : 0xa77e);
    struct backend *gpu_kv = kv16 ? gpu_kv16 : gpu;
    /* a split scratch of 64 KiB holds 1 to 9 tokens' partials of these shapes: passes */
    struct backend *small = NULL, *tiny = NULL;
    struct qerr err = {0};
    struct backend_cuda_opts so = {
        .device = 0, .batch_invariant = true, .kv_f32 = !kv16, .attn_scratch_bytes = 64 << 10};
    ck_assert_msg(backend_cuda_create(&so, &small, &err) == 0, "%s", err.msg);
    so.attn_scratch_bytes = 4 << 10; /* not one token of the 32-head shape */
    ck_assert_msg(backend_cuda_create(&so, &tiny, &err) == 0, "%s", err.msg);
    /* heads, kv heads, head dim, prefill, blocks per sequence (x 16 positions): contexts past
     * 256 positions take the split path, 3200 positions up to 13 splits */
    const int cfg[][5] = {{9, 3, 64, 0, 40},  {9, 3, 64, 1, 40},   {32, 8, 128, 0, 40},
                          {8, 2, 128, 1, 40}, {6, 2, 32, 0, 40},   {2, 1, 64, 1, 40},
                          {16, 1, 64, 1, 40}, {4, 4, 256, 0, 40},  {2, 2, 10, 0, 40},
                          {3, 1, 512, 1, 40}, {4, 2, 128, 0, 200}, {8, 2, 128, 2, 40},
                          {9, 3, 64, 2, 40},  {16, 4, 64, 0, 200}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        const int heads = cfg[ci][0], kvh = cfg[ci][1], hd = cfg[ci][2];
        const bool prefill = cfg[ci][3];
        const int max_blocks = cfg[ci][4], bs = 16, n_seqs = 3;
        /* prefill batches of 32..64 tokens take the tiled launch (ATT_TILE_MIN_TOKENS) */
        /* 12 tokens of 16 heads take 192 blocks, so the launch has fewer than 13 blocks per
         * (token, head) and a block computes several splits */
        const int n = heads == 16 && max_blocks > 40 ? 12
                      : max_blocks > 40              ? 1 + (int)(tu_rnd() % 8)
                      : prefill                      ? 32 + (int)(tu_rnd() % 33)
                                                     : 1 + (int)(tu_rnd() % 64);
        const int n_blocks = n_seqs * max_blocks;
        struct attn_shape s = {heads, kvh, hd, 1.0f / sqrtf((float)hd), 0};
        int32_t *pos = malloc((size_t)n * 4), *seq = malloc((size_t)n * 4);
        int32_t *slot = malloc((size_t)n * 4), *table = malloc((size_t)n_blocks * 4);
        for (int i = 0; i < n_blocks; i++) table[i] = i;
        for (int i = n_blocks - 1; i > 0; i--) {
            int j = (int)(tu_rnd() % (uint64_t)(i + 1)), tmp = table[i];
            table[i] = table[j];
            table[j] = tmp;
        }
        int base = (int)(tu_rnd() % (uint64_t)(max_blocks * bs - n));
        for (int t = 0; t < n; t++) {
            seq[t] = (int32_t)(tu_rnd() % n_seqs);
            pos[t] = (int32_t)(tu_rnd() % (max_blocks * bs));
            if (t % 5 == 0) pos[t] = t % 3;
            if (prefill) {
                const bool second = cfg[ci][3] == 2 && t >= n / 2;
                seq[t] = second ? 2 : 1;
                pos[t] = base + (second ? t - n / 2 : t);
            }
            slot[t] = table[seq[t] * max_blocks + pos[t] / bs] * bs + pos[t] % bs;
        }
        size_t kv = (size_t)n_blocks * bs * (size_t)kvh * (size_t)hd;
        float *kc = malloc(kv * 4), *vc = malloc(kv * 4);
        tu_fill(kc, kv, 2.0f);
        tu_fill(vc, kv, 1.0f);
        uint16_t *kh = NULL, *vh = NULL;
        if (kv16) { /* the cache as fp16, the reference on its values */
            kh = malloc(kv * 2);
            vh = malloc(kv * 2);
            for (size_t i = 0; i < kv; i++) {
                kh[i] = f32_to_fp16(kc[i]);
                vh[i] = f32_to_fp16(vc[i]);
                kc[i] = fp16_to_f32(kh[i]);
                vc[i] = fp16_to_f32(vh[i]);
            }
        }
        size_t qn = (size_t)n * (size_t)heads * (size_t)hd, row = (size_t)heads * (size_t)hd;
        float *q = malloc(qn * 4), *ref = malloc(qn * 4), *o = malloc(qn * 4);
        float *one = malloc(row * 4);
        tu_fill(q, qn, 2.0f);
        struct attn_batch hb = {n, pos, seq, slot, n_seqs, table, max_blocks, bs, 0};
        for (int t = 0; t < n; t++)
            for (int h = 0; h < heads; h++) ref_attention_one(ref, q, kc, vc, &hb, &s, t, h);
        double vmax = 0;
        for (size_t k = 0; k < kv; k++) vmax = fmax(vmax, fabs(vc[k]));
        int32_t *dpos = dev_upload(gpu_kv, pos, (size_t)n * 4);
        int32_t *dseq = dev_upload(gpu_kv, seq, (size_t)n * 4);
        int32_t *dslot = dev_upload(gpu_kv, slot, (size_t)n * 4);
        int32_t *dtab = dev_upload(gpu_kv, table, (size_t)n_blocks * 4);
        void *dkc = kv16 ? dev_upload(gpu_kv, kh, kv * 2) : dev_upload(gpu_kv, kc, kv * 4);
        void *dvc = kv16 ? dev_upload(gpu_kv, vh, kv * 2) : dev_upload(gpu_kv, vc, kv * 4);
        float *dq = dev_upload(gpu_kv, q, qn * 4), *dout = dev_alloc(gpu_kv, qn * 4);
        struct attn_batch b = {n, dpos, dseq, dslot, n_seqs, dtab, max_blocks, bs, 0};
        dev_poison(gpu_kv, dout, qn * 4);
        gpu_kv->ops->attention(gpu_kv, dout, dq, dkc, dvc, &b, &s);
        dev_read(gpu_kv, o, dout, qn * 4);
        for (size_t k = 0; k < qn; k++)
            ck_assert_msg(fabs(o[k] - ref[k]) <= 1e-5 * vmax,
                          "attention heads %d/%d hd %d%s%s: [%zu] %.8g vs %.8g", heads, kvh, hd,
                          prefill ? " prefill" : "", kv16 ? " fp16 cache" : "", k, o[k], ref[k]);
        /* each token alone: the same bits */
        for (int t = 0; t < n; t++) {
            struct attn_batch b1 = tu_attn_token(&b, t);
            dev_poison(gpu_kv, dout, row * 4);
            gpu_kv->ops->attention(gpu_kv, dout, dq + (size_t)t * row, dkc, dvc, &b1, &s);
            dev_read(gpu_kv, one, dout, row * 4);
            size_t at;
            ck_assert_msg(!tu_bits_differ(one, o + (size_t)t * row, row, &at),
                          "attention hd %d%s: token %d alone differs at %zu", hd,
                          kv16 ? " fp16 cache" : "", t, at);
        }
        /* the whole batch in passes of the tokens whose partials fit: the same bits */
        dev_poison(gpu_kv, dout, qn * 4);
        small->ops->attention(small, dout, dq, dkc, dvc, &b, &s);
        dev_read(small, ref, dout, qn * 4);
        size_t at;
        ck_assert_msg(!tu_bits_differ(ref, o, qn, &at),
                      "attention heads %d hd %d: in scratch-sized passes differs at %zu", heads, hd,
                      at);
        if (heads == 32) { /* one token's partials do not fit: a clear error, no write */
            tiny->ops->attention(tiny, dout, dq, dkc, dvc, &b, &s);
            ck_assert_int_eq(backend_cuda_status(tiny, &err), QERR_UNSUPPORTED);
            ck_assert_msg(strstr(err.msg, "scratch") != NULL, "%s", err.msg);
        }
        void *bufs[] = {dpos, dseq, dslot, dtab, dkc, dvc, dq, dout};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(gpu_kv, bufs[i]);
        free(pos);
        free(seq);
        free(slot);
        free(table);
        free(kc);
        free(vc);
        free(q);
        free(ref);
        free(o);
        free(one);
        free(kh);
        free(vh);
    }
    backend_destroy(small);
    backend_destroy(tiny);
}
END_TEST

/* ---- Gemma's ops: gelu_mul, scale, softcap ---- */

/* Inputs up to +-30 (and +-300 for softcap, whose caps are 30 and 50) at lengths with odd tails.
 * scale: bit for bit. softcap: within 1e-6 relative of the reference. gelu_mul: the same, plus
 * two ulps of tanh near -1 (0.5 |g u| 2^-23): there 1 + tanhf holds only multiples of 2^-24, so
 * glibc's tanhf (not correctly rounded) and the kernel's may differ by all of a small result. */
START_TEST(gelu_scale_softcap_match_reference)
{
    tu_seed(0x6e1u);
    ck_assert_ptr_nonnull(gpu->ops->gelu_mul);
    ck_assert_ptr_nonnull(gpu->ops->scale);
    ck_assert_ptr_nonnull(gpu->ops->softcap);
    const size_t lens[] = {1, 3, 31, 256, 257, 1000, 4099, 70001};
    const float special[] = {0.0f,    -0.0f, 30.0f, -30.0f, 1e-20f,
                             -1e-20f, 5.0f,  -5.0f, -3.5f,  88.0f};
    const float scales[] = {0.0625f, -3.0f, 48.0f};
    const float caps[] = {30.0f, 50.0f};
    size_t exact_g = 0, exact_c = 0, total = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const size_t n = lens[li], bytes = n * 4;
        float *g = malloc(bytes), *u = malloc(bytes), *r = malloc(bytes), *o = malloc(bytes);
        /* every other element small, where gelu and tanh bend */
        for (size_t k = 0; k < n; k++) {
            g[k] = k % 2 ? tu_frand(-30.0f, 30.0f) : tu_frand(-4.0f, 4.0f);
            u[k] = tu_frand(-3.0f, 3.0f);
        }
        for (size_t k = 0; k < n && k < sizeof special / sizeof special[0]; k++)
            g[(k * 7) % n] = special[k];
        float *dg = dev_upload(gpu, g, bytes), *du = dev_upload(gpu, u, bytes);
        gpu->ops->gelu_mul(gpu, dg, du, n);
        dev_read(gpu, o, dg, bytes);
        memcpy(r, g, bytes);
        ref_gelu_mul(r, u, n);
        for (size_t k = 0; k < n; k++) {
            exact_g += memcmp(&o[k], &r[k], 4) == 0;
            double tol = 1e-6 * fabs(r[k]) + 0.5 * fabs((double)g[k] * u[k]) * 0x1p-23 + 1e-30;
            ck_assert_msg(fabs(o[k] - r[k]) <= tol,
                          "gelu_mul n %zu [%zu] g %.9g u %.9g: %.9g vs %.9g", n, k, g[k], u[k],
                          o[k], r[k]);
        }
        dev_read(gpu, o, du, bytes);
        size_t at;
        ck_assert_msg(!tu_bits_differ(o, u, n, &at), "gelu_mul n %zu: u changed at %zu", n, at);
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            gpu->ops->buf_write(gpu, dg, g, bytes);
            gpu->ops->scale(gpu, dg, scales[si], n);
            dev_read(gpu, o, dg, bytes);
            memcpy(r, g, bytes);
            ref_scale(r, scales[si], n);
            ck_assert_msg(!tu_bits_differ(o, r, n, &at), "scale %g n %zu: [%zu] %.9g vs %.9g",
                          scales[si], n, at, o[at], r[at]);
        }
        /* from far inside a cap, where tanh is x, to ten caps out, where it is 1 */
        for (size_t k = 0; k < n; k++) g[k] *= k % 3 == 0 ? 10.0f : k % 3 == 1 ? 0.01f : 1.0f;
        for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
            gpu->ops->buf_write(gpu, dg, g, bytes);
            gpu->ops->softcap(gpu, dg, caps[ci], n);
            dev_read(gpu, o, dg, bytes);
            memcpy(r, g, bytes);
            ref_softcap(r, caps[ci], n);
            for (size_t k = 0; k < n; k++) {
                exact_c += memcmp(&o[k], &r[k], 4) == 0;
                ck_assert_msg(fabs(o[k] - r[k]) <= 1e-6 * fabs(r[k]) + 1e-30,
                              "softcap %g n %zu [%zu] x %.9g: %.9g vs %.9g", caps[ci], n, k, g[k],
                              o[k], r[k]);
            }
        }
        total += n;
        dev_free(gpu, dg);
        dev_free(gpu, du);
        free(g);
        free(u);
        free(r);
        free(o);
    }
    printf("gelu_mul: %zu of %zu bit-exact; softcap: %zu of %zu\n", exact_g, total, exact_c,
           2 * total);
}
END_TEST

/* ---- mixture of experts ---- */

/* moe_combine bit for bit ref_moe_combine: k products per element, each rounded, summed in the
 * caller's order. Weights in (0, 1) and outputs of mixed magnitude, so that dropping w, another
 * order of j or an fma changes bits. y has either one row per (token, expert) in a shuffled order,
 * or only k + 3 rows that every token picks k distinct ones of (rows repeated across tokens). */
START_TEST(moe_combine_matches_reference)
{
    tu_seed(0x30e);
    ck_assert_ptr_nonnull(gpu->ops->moe_combine);
    static const int shapes[][3] = {/* n, k, dim */
                                    {1, 1, 576},   {1, 8, 2048}, {7, 2, 64},   {7, 8, 576},
                                    {64, 8, 2048}, {64, 1, 64},  {64, 2, 576}, {3, 4, 1000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n = shapes[si][0], k = shapes[si][1], dim = shapes[si][2], nk = n * k;
        const int n_rows = si % 2 ? nk : k + 3;
        const size_t yb = (size_t)n_rows * (size_t)dim * 4, ob = (size_t)n * (size_t)dim * 4;
        float *y = malloc(yb), *w = malloc((size_t)nk * 4), *o = malloc(ob), *r = malloc(ob);
        int32_t *rows = malloc((size_t)nk * 4), *pick = malloc((size_t)n_rows * 4);
        for (size_t i = 0; i < (size_t)n_rows * (size_t)dim; i++)
            y[i] = tu_frand(-4.0f, 4.0f) * (i % 5 == 0 ? 64.0f : i % 5 == 1 ? 0.01f : 1.0f);
        for (int i = 0; i < nk; i++) w[i] = tu_frand(0.001f, 0.999f);
        if (n_rows == nk) { /* one shuffle of all the rows */
            for (int i = 0; i < nk; i++) rows[i] = i;
            for (int i = nk - 1; i > 0; i--) {
                int j = (int)(tu_rnd() % (uint64_t)(i + 1)), v = rows[i];
                rows[i] = rows[j];
                rows[j] = v;
            }
        } else { /* each token: the first k of a fresh partial shuffle of the k + 3 rows */
            for (int t = 0; t < n; t++) {
                for (int i = 0; i < n_rows; i++) pick[i] = i;
                for (int j = 0; j < k; j++) {
                    int i = j + (int)(tu_rnd() % (uint64_t)(n_rows - j)), v = pick[j];
                    pick[j] = pick[i];
                    pick[i] = v;
                    rows[t * k + j] = pick[j];
                }
            }
        }
        float *dy = dev_upload(gpu, y, yb), *dw = dev_upload(gpu, w, (size_t)nk * 4);
        int32_t *drows = dev_upload(gpu, rows, (size_t)nk * 4);
        float *dout = dev_alloc(gpu, ob);
        dev_poison(gpu, dout, ob);
        gpu->ops->moe_combine(gpu, dout, dy, drows, dw, n, k, dim);
        dev_read(gpu, o, dout, ob);
        ref_moe_combine(r, y, rows, w, n, k, dim);
        size_t at;
        ck_assert_msg(!tu_bits_differ(o, r, (size_t)n * (size_t)dim, &at),
                      "moe_combine n %d k %d dim %d: [%zu] %.9g vs %.9g", n, k, dim, at, o[at],
                      r[at]);
        dev_free(gpu, dy);
        dev_free(gpu, dw);
        dev_free(gpu, drows);
        dev_free(gpu, dout);
        free(y);
        free(w);
        free(o);
        free(r);
        free(rows);
        free(pick);
    }
}
END_TEST

/* ---- sliding-window attention ---- */

/* Four sequences of 80 blocks of 16 positions (a shuffled block table), every slot filled, so
 * keys outside a window hold real values that would change the result. */
enum { WIN_BS = 16, WIN_MAX_BLOCKS = 80, WIN_SEQS = 4, WIN_MAX_N = 64 };
enum { WIN_BLOCKS = WIN_SEQS * WIN_MAX_BLOCKS, WIN_CTX = WIN_MAX_BLOCKS * WIN_BS };

struct win_case {
    int n;
    int32_t pos[WIN_MAX_N], seq[WIN_MAX_N], slot[WIN_MAX_N], table[WIN_BLOCKS];
};

/* Appends count tokens of sequence sq at positions from, from + 1, ... */
static void win_add(struct win_case *c, int sq, int from, int count)
{
    for (int p = from; p < from + count; p++) {
        c->seq[c->n] = sq;
        c->pos[c->n++] = p;
    }
}

/* Batch kind k: 0 decode tokens at positions around the block, split (256) and CPU partition
 * (512) boundaries; 1 a prefill chunk past position 600, decodes and a prompt's first chunk mixed
 * (tiled: 5 tiles of the chunk alone, one of three sequences); 2 the same kinds under 32 tokens,
 * a chunk across 512 (one token per block). */
static void win_case_make(struct win_case *c, int k)
{
    for (int i = 0; i < WIN_BLOCKS; i++) c->table[i] = i;
    for (int i = WIN_BLOCKS - 1; i > 0; i--) {
        int j = (int)(tu_rnd() % (uint64_t)(i + 1)), tmp = c->table[i];
        c->table[i] = c->table[j];
        c->table[j] = tmp;
    }
    c->n = 0;
    if (k == 0) {
        const int at[] = {0, 1, 15, 16, 255, 256, 511, 512, 513, 600, 613, 700, 1000, WIN_CTX - 1};
        for (int i = 0; i < (int)(sizeof at / sizeof at[0]); i++)
            win_add(c, i % WIN_SEQS, at[i], 1);
    } else if (k == 1) {
        win_add(c, 0, 600, 40);
        win_add(c, 1, 1100, 1);
        win_add(c, 2, 7, 1);
        win_add(c, 3, 0, 10);
    } else {
        win_add(c, 1, 500, 20);
        win_add(c, 0, 900, 1);
        win_add(c, 2, 3, 1);
        win_add(c, 3, WIN_CTX - 1, 1);
    }
    for (int t = 0; t < c->n; t++)
        c->slot[t] =
            c->table[c->seq[t] * WIN_MAX_BLOCKS + c->pos[t] / WIN_BS] * WIN_BS + c->pos[t] % WIN_BS;
}

/* attn_batch.window against the reference (which sees only keys pos - window + 1 .. pos), over
 * an fp32 cache and the default fp16 one (_i 1), on the direct, staged and tiled kernels: windows
 * of 1, a few keys, under a KV block, across blocks, across the split (256) and the CPU's
 * partition (512) boundaries from positions past 600 (100, 550), and larger than every position.
 * Within the tolerance of attention_matches_reference; bit for bit, each token alone, the batch
 * in scratch-sized passes, and, for a token the window excludes nothing of, window 0. */
START_TEST(attention_window_matches_reference)
{
    const bool kv16 = _i == 1;
    tu_seed(kv16 ? 0x5a16 : 0x5a32);
    struct backend *gpu_kv = kv16 ? gpu_kv16 : gpu, *small = NULL;
    struct qerr err = {0};
    struct backend_cuda_opts so = {
        .device = 0, .batch_invariant = true, .kv_f32 = !kv16, .attn_scratch_bytes = 64 << 10};
    ck_assert_msg(backend_cuda_create(&so, &small, &err) == 0, "%s", err.msg);
    /* heads, kv heads, head dim: vectorized and staged (64, 128), scalar (10), wide (256) */
    const int shapes[][3] = {{9, 3, 64}, {4, 2, 128}, {2, 1, 10}, {4, 4, 256}};
    const int windows[] = {0, 1, 12, 300, 550, WIN_CTX};
    const int n_win = (int)(sizeof windows / sizeof windows[0]);
    size_t kv_max = (size_t)WIN_BLOCKS * WIN_BS * 4 * 256;
    float *kc = malloc(kv_max * 4), *vc = malloc(kv_max * 4);
    uint16_t *kh = malloc(kv_max * 2), *vh = malloc(kv_max * 2);
    int runs = 0;
    for (int shi = 0; shi < 4; shi++)
        for (int kind = 0; kind < 3; kind++) {
            const int heads = shapes[shi][0], kvh = shapes[shi][1], hd = shapes[shi][2];
            struct attn_shape s = {heads, kvh, hd, 1.0f / sqrtf((float)hd), 0};
            struct win_case c;
            win_case_make(&c, kind);
            const int n = c.n;
            size_t kv = (size_t)WIN_BLOCKS * WIN_BS * (size_t)kvh * (size_t)hd;
            tu_fill(kc, kv, 2.0f);
            tu_fill(vc, kv, 1.0f);
            for (size_t i = 0; kv16 && i < kv; i++) {
                kh[i] = f32_to_fp16(kc[i]);
                vh[i] = f32_to_fp16(vc[i]);
                kc[i] = fp16_to_f32(kh[i]);
                vc[i] = fp16_to_f32(vh[i]);
            }
            double vmax = 0;
            for (size_t k = 0; k < kv; k++) vmax = fmax(vmax, fabs(vc[k]));
            size_t row = (size_t)heads * (size_t)hd, qn = (size_t)n * row;
            float *q = malloc(qn * 4), *ref = malloc(qn * 4), *o = malloc(qn * 4);
            float *o0 = malloc(qn * 4), *one = malloc(row * 4);
            tu_fill(q, qn, 2.0f);
            int32_t *dpos = dev_upload(gpu_kv, c.pos, (size_t)n * 4);
            int32_t *dseq = dev_upload(gpu_kv, c.seq, (size_t)n * 4);
            int32_t *dslot = dev_upload(gpu_kv, c.slot, (size_t)n * 4);
            int32_t *dtab = dev_upload(gpu_kv, c.table, sizeof c.table);
            void *dkc = kv16 ? dev_upload(gpu_kv, kh, kv * 2) : dev_upload(gpu_kv, kc, kv * 4);
            void *dvc = kv16 ? dev_upload(gpu_kv, vh, kv * 2) : dev_upload(gpu_kv, vc, kv * 4);
            float *dq = dev_upload(gpu_kv, q, qn * 4), *dout = dev_alloc(gpu_kv, qn * 4);
            for (int wi = 0; wi < n_win; wi++, runs++) {
                const int w = windows[wi];
                struct attn_batch hb = {n,       c.pos,          c.seq,  c.slot, WIN_SEQS,
                                        c.table, WIN_MAX_BLOCKS, WIN_BS, w};
                struct attn_batch b = {n,    dpos,           dseq,   dslot, WIN_SEQS,
                                       dtab, WIN_MAX_BLOCKS, WIN_BS, w};
                for (int t = 0; t < n; t++)
                    for (int h = 0; h < heads; h++)
                        ref_attention_one(ref, q, kc, vc, &hb, &s, t, h);
                dev_poison(gpu_kv, dout, qn * 4);
                gpu_kv->ops->attention(gpu_kv, dout, dq, dkc, dvc, &b, &s);
                dev_read(gpu_kv, o, dout, qn * 4);
                for (size_t k = 0; k < qn; k++)
                    ck_assert_msg(fabs(o[k] - ref[k]) <= 1e-5 * vmax,
                                  "window %d, heads %d/%d hd %d, batch %d%s: token %zu (pos %d) "
                                  "[%zu] %.8g vs %.8g",
                                  w, heads, kvh, hd, kind, kv16 ? " fp16 cache" : "", k / row,
                                  c.pos[k / row], k % row, o[k], ref[k]);
                if (w == 0) memcpy(o0, o, qn * 4);
                size_t at;
                for (int t = 0; t < n; t++)
                    ck_assert_msg(c.pos[t] >= w || !tu_bits_differ(o + (size_t)t * row,
                                                                   o0 + (size_t)t * row, row, &at),
                                  "window %d hd %d batch %d%s: token %d at %d sees every key but "
                                  "differs from window 0 at %zu",
                                  w, hd, kind, kv16 ? " fp16 cache" : "", t, c.pos[t], at);
                /* each token alone, and the batch in passes: a few windows per batch */
                if ((wi + shi + kind) % 3 == 0) {
                    for (int t = 0; t < n; t++) {
                        struct attn_batch b1 = tu_attn_token(&b, t);
                        dev_poison(gpu_kv, dout, row * 4);
                        gpu_kv->ops->attention(gpu_kv, dout, dq + (size_t)t * row, dkc, dvc, &b1,
                                               &s);
                        dev_read(gpu_kv, one, dout, row * 4);
                        ck_assert_msg(!tu_bits_differ(one, o + (size_t)t * row, row, &at),
                                      "window %d hd %d batch %d%s: token %d (pos %d) alone "
                                      "differs at %zu",
                                      w, hd, kind, kv16 ? " fp16 cache" : "", t, c.pos[t], at);
                    }
                    dev_poison(gpu_kv, dout, qn * 4);
                    small->ops->attention(small, dout, dq, dkc, dvc, &b, &s);
                    dev_read(small, ref, dout, qn * 4);
                    ck_assert_msg(!tu_bits_differ(ref, o, qn, &at),
                                  "window %d hd %d batch %d: in scratch-sized passes differs at "
                                  "%zu",
                                  w, hd, kind, at);
                }
            }
            void *bufs[] = {dpos, dseq, dslot, dtab, dkc, dvc, dq, dout};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(gpu_kv, bufs[i]);
            free(q);
            free(ref);
            free(o);
            free(o0);
            free(one);
        }
    printf("attention window%s: %d batches\n", kv16 ? " (fp16 cache)" : "", runs);
    free(kc);
    free(vc);
    free(kh);
    free(vh);
    backend_destroy(small);
}
END_TEST

/* attn_shape.softcap against the reference (score s -> cap tanh(s / cap) before the softmax), on
 * the batches of attention_window_matches_reference, over an fp32 cache and the fp16 one (_i 1):
 * eight runs each (emu time), a table that gives every head dim (direct, staged, tiled, scalar,
 * wide) both caps and each cap the windows 0 (splits and their reduce), 12 and 550 (splits from
 * past 512), the fp16 cache the other cap of each run. Gemma 2's cap 50 over queries of +-6 (the
 * larger scores past 10, which it bends by a few percent; over +-2 it would change too little to
 * tell from rounding), 2 over +-2 (it halves the larger scores). Within the tolerance of
 * attention_matches_reference; each token alone, the batch's bits, in half of the runs. So that
 * an ignored cap fails: in every run at least three tokens in four lie further than twice the
 * tolerance from the uncapped reference (only tokens with a key or two do not). */
START_TEST(attention_softcap_matches_reference)
{
    const bool kv16 = _i == 1;
    tu_seed(kv16 ? 0x5c16 : 0x5c32);
    struct backend *gpu_kv = kv16 ? gpu_kv16 : gpu;
    /* heads, kv heads, head dim, batch kind (win_case_make), cap (fp32 cache), window */
    const int runs[][6] = {{9, 3, 64, 0, 2, 0},   {9, 3, 64, 1, 50, 550}, {4, 2, 128, 1, 2, 12},
                           {4, 2, 128, 2, 50, 0}, {4, 4, 256, 0, 50, 12}, {4, 4, 256, 2, 2, 550},
                           {2, 1, 10, 1, 2, 0},   {2, 1, 10, 2, 50, 12}};
    const int n_runs = (int)(sizeof runs / sizeof runs[0]);
    size_t kv_max = (size_t)WIN_BLOCKS * WIN_BS * 4 * 256;
    float *kc = malloc(kv_max * 4), *vc = malloc(kv_max * 4);
    uint16_t *kh = malloc(kv_max * 2), *vh = malloc(kv_max * 2);
    double worst = 0;
    for (int ri = 0; ri < n_runs; ri++) {
        const int heads = runs[ri][0], kvh = runs[ri][1], hd = runs[ri][2], kind = runs[ri][3];
        const int w = runs[ri][5];
        const float cap = (float)(kv16 ? 52 - runs[ri][4] : runs[ri][4]);
        struct attn_shape s = {heads, kvh, hd, 1.0f / sqrtf((float)hd), cap};
        struct attn_shape s0 = s;
        s0.softcap = 0;
        struct win_case c;
        win_case_make(&c, kind);
        const int n = c.n;
        size_t kv = (size_t)WIN_BLOCKS * WIN_BS * (size_t)kvh * (size_t)hd;
        tu_fill(kc, kv, 2.0f);
        tu_fill(vc, kv, 1.0f);
        for (size_t i = 0; kv16 && i < kv; i++) {
            kh[i] = f32_to_fp16(kc[i]);
            vh[i] = f32_to_fp16(vc[i]);
            kc[i] = fp16_to_f32(kh[i]);
            vc[i] = fp16_to_f32(vh[i]);
        }
        double vmax = 0;
        for (size_t k = 0; k < kv; k++) vmax = fmax(vmax, fabs(vc[k]));
        const double tol = 1e-5 * vmax;
        size_t row = (size_t)heads * (size_t)hd, qn = (size_t)n * row;
        float *q = malloc(qn * 4), *ref = malloc(qn * 4), *ref0 = malloc(qn * 4);
        float *o = malloc(qn * 4), *one = malloc(row * 4);
        tu_fill(q, qn, cap > 10 ? 6.0f : 2.0f);
        struct attn_batch hb = {n,       c.pos,          c.seq,  c.slot, WIN_SEQS,
                                c.table, WIN_MAX_BLOCKS, WIN_BS, w};
        for (int t = 0; t < n; t++)
            for (int h = 0; h < heads; h++) {
                ref_attention_one(ref, q, kc, vc, &hb, &s, t, h);
                ref_attention_one(ref0, q, kc, vc, &hb, &s0, t, h);
            }
        int32_t *dpos = dev_upload(gpu_kv, c.pos, (size_t)n * 4);
        int32_t *dseq = dev_upload(gpu_kv, c.seq, (size_t)n * 4);
        int32_t *dslot = dev_upload(gpu_kv, c.slot, (size_t)n * 4);
        int32_t *dtab = dev_upload(gpu_kv, c.table, sizeof c.table);
        void *dkc = kv16 ? dev_upload(gpu_kv, kh, kv * 2) : dev_upload(gpu_kv, kc, kv * 4);
        void *dvc = kv16 ? dev_upload(gpu_kv, vh, kv * 2) : dev_upload(gpu_kv, vc, kv * 4);
        float *dq = dev_upload(gpu_kv, q, qn * 4), *dout = dev_alloc(gpu_kv, qn * 4);
        struct attn_batch b = {n, dpos, dseq, dslot, WIN_SEQS, dtab, WIN_MAX_BLOCKS, WIN_BS, w};
        dev_poison(gpu_kv, dout, qn * 4);
        gpu_kv->ops->attention(gpu_kv, dout, dq, dkc, dvc, &b, &s);
        dev_read(gpu_kv, o, dout, qn * 4);
        int capped = 0;
        for (int t = 0; t < n; t++) {
            double d0 = 0;
            for (size_t k = (size_t)t * row; k < (size_t)(t + 1) * row; k++) {
                const double e = fabs(o[k] - ref[k]);
                ck_assert_msg(e <= tol,
                              "softcap %g window %d, heads %d/%d hd %d, batch %d%s: token %d "
                              "(pos %d) [%zu] %.8g vs %.8g",
                              cap, w, heads, kvh, hd, kind, kv16 ? " fp16 cache" : "", t, c.pos[t],
                              k % row, o[k], ref[k]);
                worst = fmax(worst, e / tol);
                d0 = fmax(d0, fabs(o[k] - ref0[k]));
            }
            capped += d0 > 2 * tol;
        }
        ck_assert_msg(4 * capped >= 3 * n,
                      "softcap %g window %d hd %d batch %d%s: only %d of %d tokens differ from "
                      "softcap 0 by more than twice the tolerance",
                      cap, w, hd, kind, kv16 ? " fp16 cache" : "", capped, n);
        if (ri % 2 == (int)kv16)
            for (int t = 0; t < n; t++) {
                struct attn_batch b1 = tu_attn_token(&b, t);
                dev_poison(gpu_kv, dout, row * 4);
                gpu_kv->ops->attention(gpu_kv, dout, dq + (size_t)t * row, dkc, dvc, &b1, &s);
                dev_read(gpu_kv, one, dout, row * 4);
                size_t at;
                ck_assert_msg(!tu_bits_differ(one, o + (size_t)t * row, row, &at),
                              "softcap %g window %d hd %d batch %d%s: token %d (pos %d) alone "
                              "differs at %zu",
                              cap, w, hd, kind, kv16 ? " fp16 cache" : "", t, c.pos[t], at);
            }
        void *bufs[] = {dpos, dseq, dslot, dtab, dkc, dvc, dq, dout};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(gpu_kv, bufs[i]);
        free(q);
        free(ref);
        free(ref0);
        free(o);
        free(one);
    }
    printf("attention softcap%s: %d runs, worst error %.2f of the tolerance\n",
           kv16 ? " (fp16 cache)" : "", n_runs, worst);
    free(kc);
    free(vc);
    free(kh);
    free(vh);
}
END_TEST

/* A replayed step keeps each attention launch's own window and softcap: a step of three
 * attention calls over one batch (window 40, 0, 300 into three outputs, as a model's local and
 * global layers alternate; softcap 2, 0, 50) gives, replayed with fresh queries and positions, the
 * bits of the same calls issued directly. */
START_TEST(step_replay_attention_windows)
{
    tu_seed(0x5a7e);
    struct backend *be = gpu_kv16;
    ck_assert_ptr_nonnull(be->ops->step_begin);
    enum { N = 6, HEADS = 4, KVH = 2, HD = 64, ROW = HEADS * HD };
    const int windows[3] = {40, 0, 300};
    const float caps[3] = {2.0f, 0, 50.0f};
    struct win_case c;
    win_case_make(&c, 0);
    size_t kv = (size_t)WIN_BLOCKS * WIN_BS * KVH * HD;
    uint16_t *kh = malloc(kv * 2), *vh = malloc(kv * 2);
    for (size_t i = 0; i < kv; i++) {
        kh[i] = f32_to_fp16(tu_frand(-2.0f, 2.0f));
        vh[i] = f32_to_fp16(tu_frand(-1.0f, 1.0f));
    }
    void *dkc = dev_upload(be, kh, kv * 2), *dvc = dev_upload(be, vh, kv * 2);
    int32_t *dpos = dev_alloc(be, N * 4), *dseq = dev_alloc(be, N * 4);
    int32_t *dslot = dev_alloc(be, N * 4), *dtab = dev_upload(be, c.table, sizeof c.table);
    float *dq = dev_alloc(be, N * ROW * 4), *dout[3];
    for (int k = 0; k < 3; k++) dout[k] = dev_alloc(be, N * ROW * 4);
    int replays = 0;
    for (int it = 0; it < 5; it++) {
        float q[N * ROW], want[3][N * ROW], got[3][N * ROW];
        int32_t pos[N], seq[N], slot[N];
        tu_fill(q, N * ROW, 2.0f);
        for (int t = 0; t < N; t++) {
            seq[t] = t % WIN_SEQS;
            pos[t] = 200 + (int32_t)(tu_rnd() % (WIN_CTX - 200));
            slot[t] = c.table[seq[t] * WIN_MAX_BLOCKS + pos[t] / WIN_BS] * WIN_BS + pos[t] % WIN_BS;
        }
        bool rep = false;
        for (int pass = 0; pass < 2; pass++) { /* 0: direct, 1: bracketed */
            be->ops->buf_write(be, dq, q, sizeof q);
            be->ops->buf_write(be, dpos, pos, sizeof pos);
            be->ops->buf_write(be, dseq, seq, sizeof seq);
            be->ops->buf_write(be, dslot, slot, sizeof slot);
            for (int k = 0; k < 3; k++) dev_poison(be, dout[k], N * ROW * 4);
            if (pass == 1 && be->ops->step_begin(be, 77)) {
                rep = true;
            } else {
                for (int k = 0; k < 3; k++) {
                    struct attn_batch b = {N,    dpos,           dseq,   dslot,     WIN_SEQS,
                                           dtab, WIN_MAX_BLOCKS, WIN_BS, windows[k]};
                    const struct attn_shape s = {HEADS, KVH, HD, 0.125f, caps[k]};
                    be->ops->attention(be, dout[k], dq, dkc, dvc, &b, &s);
                }
                if (pass == 1) ck_assert(be->ops->step_end(be));
            }
            for (int k = 0; k < 3; k++) dev_read(be, pass ? got[k] : want[k], dout[k], sizeof q);
        }
        for (int k = 0; k < 3; k++) {
            size_t at;
            ck_assert_msg(!tu_bits_differ(got[k], want[k], N * ROW, &at),
                          "step %d (%s), window %d softcap %g: differs at %zu: %.9g vs %.9g", it,
                          rep ? "replayed" : "direct", windows[k], caps[k], at, got[k][at],
                          want[k][at]);
        }
        /* step 0 direct, 1 captured, 2.. replayed */
        ck_assert_msg(rep == (it >= 2), "step %d: replayed %d", it, rep);
        replays += rep;
    }
    ck_assert_int_eq(replays, 3);
    be->ops->step_reset(be);
    void *bufs[] = {dkc, dvc, dpos, dseq, dslot, dtab, dq, dout[0], dout[1], dout[2]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(be, bufs[i]);
    free(kh);
    free(vh);
}
END_TEST

/* gemm_min 0: batch-invariant (the GEMV for every n); -1: that, with fp16 GEMV activations */
static int make_backend(enum matmul_precision p, int gemm_min, enum cuda_gemm g,
                        struct backend **out)
{
    struct qerr err = {0};
    struct backend_cuda_opts o = {.device = 0,
                                  .precision = p,
                                  .max_tokens = 40,
                                  .gemm_min_tokens = gemm_min > 0 ? gemm_min : 0,
                                  .gemm = g,
                                  .batch_invariant = gemm_min <= 0,
                                  .act_f16 = gemm_min < 0,
                                  .kv_f32 = true};
    int rc = backend_cuda_create(&o, out, &err);
    if (rc) fprintf(stderr, "cuda backend: %s\n", err.msg);
    return rc;
}

int main(void)
{
    char desc[160];
    struct qerr err = {0};
    if (backend_cuda_probe(0, desc, sizeof desc, &err) != 0) {
        printf("skipping: %s\n", err.msg);
        return 77;
    }
    printf("device: %s\n", desc);
    /* max_tokens 40: batches of 45 and 64 tokens run as two passes */
    struct backend_cuda_opts o16 = {.device = 0, .precision = MATMUL_F32, .max_tokens = 40};
    if (make_backend(MATMUL_F32, 0, CUDA_GEMM_MMA, &gpu) ||
        make_backend(MATMUL_Q8, 0, CUDA_GEMM_MMA, &gpu_q8) ||
        make_backend(MATMUL_F32, 16, CUDA_GEMM_CUBLAS, &paths[B_CUBLAS]) ||
        make_backend(MATMUL_F32, 16, CUDA_GEMM_MMA, &paths[B_MMA]) ||
        make_backend(MATMUL_Q8, 16, CUDA_GEMM_MMA, &paths[B_MMA_Q8]) ||
        make_backend(MATMUL_F32, -1, CUDA_GEMM_MMA, &paths[B_F16ACT]) ||
        backend_cuda_create(&o16, &gpu_kv16, &err))
        return EXIT_FAILURE;

    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, matmul_quant_odd_shapes, 0, 2);
    tcase_add_test(tc, matmul_float_weights);
    tcase_add_test(tc, matmul_model_shapes);
    tcase_add_test(tc, matmul_batch_prefixes_invariant);
    tcase_add_test(tc, rmsnorm_add_silu_match_reference);
    tcase_add_test(tc, rope_matches_reference);
    tcase_add_test(tc, embed_get_rows_kv_write_exact);
    tcase_add_loop_test(tc, attention_matches_reference, 0, 2);
    tcase_add_test(tc, step_replay_equals_direct);
    tcase_add_test(tc, kv_f16_cache);
    suite_add_tcase(s, tc);
    /* Gemma's ops and sliding-window attention (CK_RUN_CASE=gemma runs them alone) */
    TCase *tg = tcase_create("gemma");
    tcase_set_timeout(tg, 600);
    tcase_add_test(tg, gelu_scale_softcap_match_reference);
    tcase_add_loop_test(tg, attention_window_matches_reference, 0, 2);
    tcase_add_loop_test(tg, attention_softcap_matches_reference, 0, 2);
    tcase_add_test(tg, step_replay_attention_windows);
    suite_add_tcase(s, tg);
    /* mixture of experts (CK_RUN_CASE=moe) */
    TCase *tm = tcase_create("moe");
    tcase_set_timeout(tm, 600);
    tcase_add_test(tm, moe_combine_matches_reference);
    suite_add_tcase(s, tm);
#ifdef QUERN_TEST_MODEL_CASES
    /* the emulation has no test_model of its own: the model suite's CUDA cases ride along */
    if (tm_golden_load())
        model_cuda_add(s, 0, true);
    else
        printf("model tests skipped\n");
#endif
    SRunner *r = srunner_create(s);
    srunner_set_fork_status(r, CK_NOFORK);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    for (int k = 0; k < N_PATHS; k++) backend_destroy(paths[k]);
    backend_destroy(gpu_kv16);
#ifdef QUERN_TEST_MODEL_CASES
    tm_golden_free();
#endif
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
