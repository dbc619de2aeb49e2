/* Backend conformance: every op of the CUDA backend (kernels/cuda) against the CPU backend's
 * semantics, its scalar reference kernels (kernels/cpu/ref.c), on fresh random inputs at odd
 * shapes and batches 1 to 257, then the whole model against the golden logits.
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
 *   attention             <= 1e-5 of the largest |v| (fp16 cache: against the reference on
 *                         the fp16 values; kv_write rounds to nearest even, bit for bit)
 *   step replay           bit for bit the ops issued directly
 *   embed, get_rows, kv_write, add: bit for bit
 *   batch invariance      bit for bit: a token alone equals the same token inside any batch
 *   model                 golden top logits within 1e-3 relative (as tests/test_model.c;
 *                         2e-3 with the fp16 KV cache),
 *                         batch-invariant logits bit for bit */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/generate.h"
#include "../kernels/cpu/ref.h"
#include "../kernels/cuda/backend_cuda.h"
#include "testutil.h"

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

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd() >> 40) * 0x1p-24f;
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = frand(-scale, scale);
    for (size_t i = 0; i < n / 97; i++) x[rnd() % n] *= 8.0f; /* outliers */
}

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

static int bits_differ(const float *a, const float *b, size_t n, size_t *at)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            *at = i;
            return 1;
        }
    return 0;
}

/* A random weight: host bytes malloc'd into w->host. */
static void make_weight(struct bweight *w, enum qtype t, int64_t rows, int64_t cols)
{
    *w = (struct bweight){.type = t, .rows = rows, .cols = cols};
    size_t rb = qtype_row_bytes(t, (size_t)cols), bytes = rb * (size_t)rows;
    uint8_t *p = malloc(bytes);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rnd();
    size_t bb = qtype_block_bytes(t);
    switch (t) {
    case QTYPE_F32:
        for (size_t i = 0; i < bytes / 4; i++) ((float *)p)[i] = frand(-0.1f, 0.1f);
        break;
    case QTYPE_F16:
        for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)p)[i] = f32_to_fp16(frand(-0.1f, 0.1f));
        break;
    case QTYPE_BF16:
        for (size_t i = 0; i < bytes / 2; i++) {
            float f = frand(-0.1f, 0.1f);
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        }
        break;
    default:
        for (size_t off = 0; off < bytes; off += bb) {
            uint16_t d = f32_to_fp16(frand(-0.02f, 0.02f)), m = f32_to_fp16(frand(-0.1f, 0.1f));
            memcpy(p + off, &d, 2);
            if (t == QTYPE_Q4_1) memcpy(p + off + 2, &m, 2);
        }
    }
    w->host = p;
}

static void free_weight(struct bweight *w)
{
    free((void *)w->host);
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

/* Max over outputs of |y - yref| / (sum |w x| + 1e-30). */
static double norm_error(const struct bweight *w, const float *x, int n, const float *y,
                         const float *yref)
{
    double worst = 0;
    float *row = malloc((size_t)w->cols * sizeof *row);
    size_t rb = qtype_row_bytes(w->type, (size_t)w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        qtype_dequantize_row(w->type, (const uint8_t *)w->host + (size_t)r * rb, row,
                             (size_t)w->cols);
        for (int i = 0; i < n; i++) {
            double mag = 0;
            for (int64_t k = 0; k < w->cols; k++)
                mag += fabs((double)row[k] * x[(size_t)i * (size_t)w->cols + (size_t)k]);
            size_t o = (size_t)i * (size_t)w->rows + (size_t)r;
            double e = fabs((double)y[o] - yref[o]) / (mag + 1e-30);
            if (!(e <= worst)) worst = e; /* NaN wins */
        }
    }
    free(row);
    return worst;
}

static void q8_reference(const struct bweight *w, const float *x, int n, float *y)
{
    struct q8act a = {.cols = w->cols, .nb = w->cols / QK};
    a.q = malloc((size_t)n * (size_t)w->cols);
    a.d = malloc((size_t)n * (size_t)a.nb * sizeof(float));
    a.s = malloc((size_t)n * (size_t)a.nb * sizeof(float));
    a.sum = malloc((size_t)n * (size_t)a.nb * sizeof(int32_t));
    for (int t = 0; t < n; t++)
        ref_quantize_q8(x + (size_t)t * (size_t)w->cols, w->cols, a.q + (size_t)t * (size_t)w->cols,
                        a.d + (size_t)t * (size_t)a.nb, a.s + (size_t)t * (size_t)a.nb,
                        a.sum + (size_t)t * (size_t)a.nb);
    ref_matmul_q8_rows(w, &a, n, y, 0, w->rows);
    free(a.q);
    free(a.d);
    free(a.s);
    free(a.sum);
}

/* One weight against the references on every GPU matmul path, plus batch invariance: every
 * token computed alone gives the same bits as inside the batch (the batch-invariant paths), and
 * the last 16 tokens alone the same as in the whole batch (the MMA paths). The GEMM paths are
 * checked only for batches that take them (n >= 16). */
static void check_matmul(enum qtype t, int64_t rows, int64_t cols, int n, bool invariance,
                         double worst[N_PATHS])
{
    struct bweight w;
    make_weight(&w, t, rows, cols);
    size_t ny = (size_t)n * (size_t)rows;
    float *x = malloc((size_t)n * (size_t)cols * 4);
    fill(x, (size_t)n * (size_t)cols, 1.0f);
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
        double e = norm_error(&w, x, n, y, q8 ? yq8 : yref);
        double tol = k == B_CUBLAS                 ? 4e-3
                     : k == B_MMA || k == B_F16ACT ? 1e-3
                     : k == B_MMA_Q8               ? 0.0
                                                   : 1e-5;
        if (e > worst[k]) worst[k] = e;
        ck_assert_msg(e <= tol, "%s %s %lld x %lld n %d: normalized error %.3g > %.1g",
                      path_name[k], qtype_name(t), (long long)rows, (long long)cols, n, e, tol);
        if (k == B_MMA_Q8) {
            size_t at;
            ck_assert_msg(!bits_differ(y, yq8, ny, &at),
                          "MMA-Q8 %s %lld x %lld n %d: output %zu is %.9g, the reference %.9g",
                          qtype_name(t), (long long)rows, (long long)cols, n, at, y[at], yq8[at]);
        }
        if (invariance && (k == B_F32 || k == B_Q8 || k == B_F16ACT)) {
            for (int i = 0; i < n; i++) {
                run_matmul(be, &wb, x + (size_t)i * (size_t)cols, 1, y1);
                size_t at;
                ck_assert_msg(!bits_differ(y1, y + (size_t)i * (size_t)rows, (size_t)rows, &at),
                              "%s %s %lld x %lld: token %d of %d alone differs at row %zu: %.9g "
                              "vs %.9g",
                              path_name[k], qtype_name(t), (long long)rows, (long long)cols, i, n,
                              at, y1[at], y[(size_t)i * (size_t)rows + at]);
            }
        }
        if (invariance && (k == B_MMA || k == B_MMA_Q8) && n >= 32) {
            run_matmul(be, &wb, x + (size_t)(n - 16) * (size_t)cols, 16, y1);
            size_t at;
            ck_assert_msg(!bits_differ(y1, y + (size_t)(n - 16) * (size_t)rows,
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
    free_weight(&w);
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
    rng_state = 0x5eed + (uint64_t)_i;
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
    rng_state = 0xf10a7;
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
    rng_state = 0x135;
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
            if (shapes[si].rows > 10000 && ni > 2) continue;
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
    rng_state = 0xba7c4;
    const int n = 45;
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q8_0, QTYPE_F16};
    for (size_t ti = 0; ti < 4; ti++) {
        struct bweight w;
        make_weight(&w, types[ti], 45, 576);
        float *x = malloc((size_t)n * 576 * 4);
        fill(x, (size_t)n * 576, 1.0f);
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
                ck_assert_msg(!bits_differ(yp, yb + (size_t)(n - m) * 45, (size_t)m * 45, &at),
                              "%s precision %d: the last %d tokens differ at %zu",
                              qtype_name(w.type), k, m, at);
            }
            bes[k]->ops->weight_release(bes[k], &wb);
        }
        free(x);
        free(yb);
        free(yp);
        free_weight(&w);
    }
}
END_TEST

/* ---- row ops ---- */

START_TEST(rmsnorm_add_silu_match_reference)
{
    rng_state = 0x70;
    const int dims[] = {8, 64, 100, 576, 1536, 4096};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int dim = dims[di], n = 1 + (int)(rnd() % 64);
        size_t len = (size_t)n * (size_t)dim, bytes = len * 4;
        float *x = malloc(bytes), *w = malloc((size_t)dim * 4), *o = malloc(bytes);
        float *r = malloc(bytes), *y = malloc(bytes);
        fill(x, len, 3.0f);
        fill(w, (size_t)dim, 1.0f);
        fill(y, len, 3.0f);
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
        ck_assert_msg(!bits_differ(o2, o, len, &at), "rmsnorm in place differs at %zu", at);
        free(o2);
        /* add: exact */
        gpu->ops->buf_write(gpu, dx, x, bytes);
        gpu->ops->add(gpu, dx, dy, len);
        dev_read(gpu, o, dx, bytes);
        for (size_t k = 0; k < len; k++) ck_assert_float_eq(o[k], x[k] + y[k]);
        /* add_rmsnorm: bit for bit add then rmsnorm, with out aliasing y as the model uses it */
        gpu->ops->rmsnorm(gpu, dout, dx, dw, n, dim, 1e-5f);
        float *want = malloc(bytes), *sum = malloc(bytes), *fx = malloc(bytes);
        dev_read(gpu, want, dout, bytes);
        dev_read(gpu, sum, dx, bytes);
        float *dx2 = dev_upload(gpu, x, bytes), *dy2 = dev_upload(gpu, y, bytes);
        ck_assert_ptr_nonnull(gpu->ops->add_rmsnorm);
        gpu->ops->add_rmsnorm(gpu, dy2, dx2, dy2, dw, n, dim, 1e-5f);
        dev_read(gpu, fx, dx2, bytes);
        ck_assert_msg(!bits_differ(fx, sum, len, &at), "add_rmsnorm: the sum differs at %zu", at);
        dev_read(gpu, fx, dy2, bytes);
        ck_assert_msg(!bits_differ(fx, want, len, &at), "add_rmsnorm: the norm differs at %zu", at);
        dev_free(gpu, dx2);
        dev_free(gpu, dy2);
        free(want);
        free(sum);
        free(fx);
        /* silu_mul */
        for (size_t k = 0; k < len; k++) x[k] = frand(-30.0f, 30.0f);
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
    rng_state = 0xf16;
    ck_assert_uint_eq(backend_kv_elem_bytes(gpu_kv16), 2);
    ck_assert_uint_eq(backend_kv_elem_bytes(gpu), 4);
    enum { HEADS = 8, KVH = 2, HD = 64, KV_DIM = KVH * HD, N_SEQS = 2, MAX_BLOCKS = 24, BS = 16 };
    enum { N_BLOCKS = N_SEQS * MAX_BLOCKS, SLOTS = N_BLOCKS * BS, N = 7 };
    size_t kv = (size_t)SLOTS * KV_DIM;
    /* a cache of fp16 values, and its fp32 widening for the reference */
    uint16_t *kh = malloc(kv * 2), *vh = malloc(kv * 2), *got = malloc(kv * 2);
    float *kf = malloc(kv * 4), *vf = malloc(kv * 4);
    for (size_t i = 0; i < kv; i++) {
        kh[i] = f32_to_fp16(frand(-2.0f, 2.0f));
        vh[i] = f32_to_fp16(frand(-1.0f, 1.0f));
        kf[i] = fp16_to_f32(kh[i]);
        vf[i] = fp16_to_f32(vh[i]);
    }
    int32_t table[N_BLOCKS], pos[N], seq[N], slot[N];
    for (int i = 0; i < N_BLOCKS; i++) table[i] = (i * 7) % N_BLOCKS;
    for (int t = 0; t < N; t++) {
        seq[t] = t % N_SEQS;
        pos[t] = t == 0 ? 3 : (int32_t)(rnd() % (uint64_t)(MAX_BLOCKS * BS));
        slot[t] = table[seq[t] * MAX_BLOCKS + pos[t] / BS] * BS + pos[t] % BS;
    }
    float k[N * KV_DIM], v[N * KV_DIM];
    fill(k, (size_t)N * KV_DIM, 3.0f);
    fill(v, (size_t)N * KV_DIM, 3.0f);
    struct backend *be = gpu_kv16;
    void *dkc = dev_upload(be, kh, kv * 2), *dvc = dev_upload(be, vh, kv * 2);
    float *dk = dev_upload(be, k, sizeof k), *dv = dev_upload(be, v, sizeof v);
    int32_t *dpos = dev_upload(be, pos, sizeof pos), *dseq = dev_upload(be, seq, sizeof seq);
    int32_t *dslot = dev_upload(be, slot, sizeof slot), *dtab = dev_upload(be, table, sizeof table);
    struct attn_batch b = {N, dpos, dseq, dslot, N_SEQS, dtab, MAX_BLOCKS, BS};
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

    struct attn_shape sh = {HEADS, KVH, HD, 1.0f / sqrtf((float)HD)};
    size_t qn = (size_t)N * HEADS * HD;
    float *q = malloc(qn * 4), *o = malloc(qn * 4), *ref = malloc(qn * 4);
    fill(q, qn, 2.0f);
    struct attn_batch hb = {N, pos, seq, slot, N_SEQS, table, MAX_BLOCKS, BS};
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
    be->ops->rope(be, dy, dpos, n, (int)w->rows / 64, 64, 64, 10000.0f);
    be->ops->add(be, dy, dy, (size_t)n * (size_t)w->rows);
    if (bracket) ck_assert(be->ops->step_end(be));
}

START_TEST(step_replay_equals_direct)
{
    rng_state = 0x6a7;
    struct backend *bes[] = {gpu, gpu_q8};
    for (int bi = 0; bi < 2; bi++) {
        struct backend *be = bes[bi];
        ck_assert_ptr_nonnull(be->ops->step_begin);
        struct bweight w;
        make_weight(&w, QTYPE_Q4_1, 128, 96);
        prepare(be, &w);
        const int nmax = 5;
        float *dx = dev_alloc(be, (size_t)nmax * 96 * 4),
              *dxn = dev_alloc(be, (size_t)nmax * 96 * 4);
        float *dy = dev_alloc(be, (size_t)nmax * 128 * 4);
        float norm[96];
        fill(norm, 96, 1.0f);
        float *dnorm = dev_upload(be, norm, sizeof norm);
        int32_t *dpos = dev_alloc(be, (size_t)nmax * 4);
        int replays = 0;
        for (int it = 0; it < 8; it++) {
            int n = it < 5 ? 3 : 5; /* a second key from step 5 on */
            float x[5 * 96], want[5 * 128], got[5 * 128];
            int32_t pos[5];
            fill(x, (size_t)n * 96, 2.0f);
            for (int t = 0; t < n; t++) pos[t] = (int32_t)(rnd() % 4000);
            bool rep;
            for (int pass = 0; pass < 2; pass++) { /* 0: direct, 1: bracketed */
                be->ops->buf_write(be, dx, x, (size_t)n * 96 * 4);
                be->ops->buf_write(be, dpos, pos, (size_t)n * 4);
                dev_poison(be, dy, (size_t)n * 128 * 4);
                replay_step(be, &w, dx, dxn, dy, dnorm, dpos, n, pass == 1, (uint64_t)n, &rep);
                dev_read(be, pass ? got : want, dy, (size_t)n * 128 * 4);
            }
            size_t at;
            ck_assert_msg(!bits_differ(got, want, (size_t)n * 128, &at),
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
        free_weight(&w);
    }
}
END_TEST

START_TEST(rope_matches_reference)
{
    rng_state = 0x20be;
    const int cfg[][3] = {{64, 64, 9}, {64, 32, 3}, {128, 128, 32}, {48, 16, 1}, {20, 10, 2}};
    size_t exact = 0, total = 0;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int hd = cfg[c][0], rot = cfg[c][1], heads = cfg[c][2], n = 1 + (int)(rnd() % 64);
        size_t len = (size_t)n * (size_t)heads * (size_t)hd;
        float *x = malloc(len * 4), *r = malloc(len * 4), *o = malloc(len * 4);
        int32_t *pos = malloc((size_t)n * 4);
        for (int t = 0; t < n; t++) pos[t] = (int32_t)(rnd() % 100000);
        fill(x, len, 2.0f);
        memcpy(r, x, len * 4);
        float base = c % 2 ? 10000.0f : 500000.0f;
        float *dx = dev_upload(gpu, x, len * 4);
        int32_t *dpos = dev_upload(gpu, pos, (size_t)n * 4);
        gpu->ops->rope(gpu, dx, dpos, n, heads, hd, rot, base);
        dev_read(gpu, o, dx, len * 4);
        ref_rope(r, pos, n, heads, hd, rot, base);
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
    rng_state = 0xe4bed;
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q8_0,
                                QTYPE_F16,  QTYPE_BF16, QTYPE_F32};
    const int n = 19, rows = 301, cols = 576;
    int32_t tok[19];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(rnd() % rows);
    tok[0] = rows - 1;
    int32_t *dtok = dev_upload(gpu, tok, sizeof tok);
    float *ref = malloc((size_t)n * cols * 4), *o = malloc((size_t)n * cols * 4);
    float *dout = dev_alloc(gpu, (size_t)n * cols * 4);
    for (size_t ti = 0; ti < 6; ti++) {
        struct bweight w;
        make_weight(&w, types[ti], rows, cols);
        prepare(gpu, &w);
        dev_poison(gpu, dout, (size_t)n * cols * 4);
        gpu->ops->embed(gpu, &w, dtok, n, dout);
        dev_read(gpu, o, dout, (size_t)n * cols * 4);
        ref_embed(&w, tok, n, ref);
        size_t at;
        ck_assert_msg(!bits_differ(o, ref, (size_t)n * cols, &at), "embed %s differs at %zu",
                      qtype_name(w.type), at);
        gpu->ops->weight_release(gpu, &w);
        free_weight(&w);
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
    fill(k, (size_t)n * kv_dim, 1.0f);
    fill(v, (size_t)n * kv_dim, 1.0f);
    float *kc = malloc((size_t)slots * kv_dim * 4), *vc = malloc((size_t)slots * kv_dim * 4);
    fill(kc, (size_t)slots * kv_dim, 1.0f);
    fill(vc, (size_t)slots * kv_dim, 1.0f);
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
    ck_assert_msg(!bits_differ(got, kc, (size_t)slots * kv_dim, &at), "k cache differs at %zu", at);
    dev_read(gpu, got, dvc, (size_t)slots * kv_dim * 4);
    ck_assert_msg(!bits_differ(got, vc, (size_t)slots * kv_dim, &at), "v cache differs at %zu", at);
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
 * tokens of random sequences (decode), or consecutive positions of one sequence (prefill). */
START_TEST(attention_matches_reference)
{
    rng_state = 0xa77e;
    /* a split scratch of 64 KiB holds 1 to 9 tokens' partials of these shapes: passes */
    struct backend *small = NULL, *tiny = NULL;
    struct qerr err = {0};
    struct backend_cuda_opts so = {
        .device = 0, .batch_invariant = true, .kv_f32 = true, .attn_scratch_bytes = 64 << 10};
    ck_assert_msg(backend_cuda_create(&so, &small, &err) == 0, "%s", err.msg);
    so.attn_scratch_bytes = 4 << 10; /* not one token of the 32-head shape */
    ck_assert_msg(backend_cuda_create(&so, &tiny, &err) == 0, "%s", err.msg);
    /* heads, kv heads, head dim, prefill, blocks per sequence (x 16 positions): contexts past
     * 256 positions take the split path, 3200 positions up to 13 splits */
    const int cfg[][5] = {{9, 3, 64, 0, 40},  {9, 3, 64, 1, 40},  {32, 8, 128, 0, 40},
                          {8, 2, 128, 1, 40}, {6, 2, 32, 0, 40},  {2, 1, 64, 1, 40},
                          {16, 1, 64, 1, 40}, {4, 4, 256, 0, 40}, {2, 2, 10, 0, 40},
                          {3, 1, 512, 1, 40}, {4, 2, 128, 0, 200}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        const int heads = cfg[ci][0], kvh = cfg[ci][1], hd = cfg[ci][2];
        const bool prefill = cfg[ci][3];
        const int max_blocks = cfg[ci][4], bs = 16, n_seqs = 3;
        /* prefill batches of 32..64 tokens take the tiled launch (ATT_TILE_MIN_TOKENS) */
        const int n = max_blocks > 40 ? 1 + (int)(rnd() % 8)
                      : prefill       ? 32 + (int)(rnd() % 33)
                                      : 1 + (int)(rnd() % 64);
        const int n_blocks = n_seqs * max_blocks;
        struct attn_shape s = {heads, kvh, hd, 1.0f / sqrtf((float)hd)};
        int32_t *pos = malloc((size_t)n * 4), *seq = malloc((size_t)n * 4);
        int32_t *slot = malloc((size_t)n * 4), *table = malloc((size_t)n_blocks * 4);
        for (int i = 0; i < n_blocks; i++) table[i] = i;
        for (int i = n_blocks - 1; i > 0; i--) {
            int j = (int)(rnd() % (uint64_t)(i + 1)), tmp = table[i];
            table[i] = table[j];
            table[j] = tmp;
        }
        int base = (int)(rnd() % (uint64_t)(max_blocks * bs - n));
        for (int t = 0; t < n; t++) {
            seq[t] = (int32_t)(rnd() % n_seqs);
            pos[t] = (int32_t)(rnd() % (max_blocks * bs));
            if (t % 5 == 0) pos[t] = t % 3;
            if (prefill) {
                seq[t] = 1;
                pos[t] = base + t;
            }
            slot[t] = table[seq[t] * max_blocks + pos[t] / bs] * bs + pos[t] % bs;
        }
        size_t kv = (size_t)n_blocks * bs * (size_t)kvh * (size_t)hd;
        float *kc = malloc(kv * 4), *vc = malloc(kv * 4);
        fill(kc, kv, 2.0f);
        fill(vc, kv, 1.0f);
        size_t qn = (size_t)n * (size_t)heads * (size_t)hd, row = (size_t)heads * (size_t)hd;
        float *q = malloc(qn * 4), *ref = malloc(qn * 4), *o = malloc(qn * 4);
        float *one = malloc(row * 4);
        fill(q, qn, 2.0f);
        struct attn_batch hb = {n, pos, seq, slot, n_seqs, table, max_blocks, bs};
        for (int t = 0; t < n; t++)
            for (int h = 0; h < heads; h++) ref_attention_one(ref, q, kc, vc, &hb, &s, t, h);
        double vmax = 0;
        for (size_t k = 0; k < kv; k++) vmax = fmax(vmax, fabs(vc[k]));
        int32_t *dpos = dev_upload(gpu, pos, (size_t)n * 4);
        int32_t *dseq = dev_upload(gpu, seq, (size_t)n * 4);
        int32_t *dslot = dev_upload(gpu, slot, (size_t)n * 4);
        int32_t *dtab = dev_upload(gpu, table, (size_t)n_blocks * 4);
        float *dkc = dev_upload(gpu, kc, kv * 4), *dvc = dev_upload(gpu, vc, kv * 4);
        float *dq = dev_upload(gpu, q, qn * 4), *dout = dev_alloc(gpu, qn * 4);
        struct attn_batch b = {n, dpos, dseq, dslot, n_seqs, dtab, max_blocks, bs};
        dev_poison(gpu, dout, qn * 4);
        gpu->ops->attention(gpu, dout, dq, dkc, dvc, &b, &s);
        dev_read(gpu, o, dout, qn * 4);
        for (size_t k = 0; k < qn; k++)
            ck_assert_msg(fabs(o[k] - ref[k]) <= 1e-5 * vmax,
                          "attention heads %d/%d hd %d%s: [%zu] %.8g vs %.8g", heads, kvh, hd,
                          prefill ? " prefill" : "", k, o[k], ref[k]);
        /* each token alone: the same bits */
        for (int t = 0; t < n; t++) {
            struct attn_batch b1 = b;
            b1.n_tokens = 1;
            b1.pos = dpos + t;
            b1.seq = dseq + t;
            b1.slot = dslot + t;
            dev_poison(gpu, dout, row * 4);
            gpu->ops->attention(gpu, dout, dq + (size_t)t * row, dkc, dvc, &b1, &s);
            dev_read(gpu, one, dout, row * 4);
            size_t at;
            ck_assert_msg(!bits_differ(one, o + (size_t)t * row, row, &at),
                          "attention hd %d: token %d alone differs at %zu", hd, t, at);
        }
        /* the whole batch in passes of the tokens whose partials fit: the same bits */
        dev_poison(gpu, dout, qn * 4);
        small->ops->attention(small, dout, dq, dkc, dvc, &b, &s);
        dev_read(small, ref, dout, qn * 4);
        size_t at;
        ck_assert_msg(!bits_differ(ref, o, qn, &at),
                      "attention heads %d hd %d: in scratch-sized passes differs at %zu", heads, hd,
                      at);
        if (heads == 32) { /* one token's partials do not fit: a clear error, no write */
            tiny->ops->attention(tiny, dout, dq, dkc, dvc, &b, &s);
            ck_assert_int_eq(backend_cuda_status(tiny, &err), QERR_UNSUPPORTED);
            ck_assert_msg(strstr(err.msg, "scratch") != NULL, "%s", err.msg);
        }
        void *bufs[] = {dpos, dseq, dslot, dtab, dkc, dvc, dq, dout};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(gpu, bufs[i]);
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
    }
    backend_destroy(small);
    backend_destroy(tiny);
}
END_TEST

/* ---- the whole model (tests/test_model.c on the CUDA backend) ---- */

static cJSON *golden;
static struct gguf_file *file;
static struct model *model;

/* The real model (file) on backend be, with room for the batch tests. */
static struct model *load_model_on(struct backend *be)
{
    struct qerr err = {0};
    struct model_opts mo = {
        .max_batch_tokens = 1024, .max_logits = 64, .kv_blocks = 33 * 8, .kv_block_size = 16};
    struct model *m = NULL;
    ck_assert_msg(model_load(file, be, &mo, &m, &err) == 0, "%s", err.msg);
    return m;
}

static void model_setup(void)
{
    struct qerr err = {0};
    ck_assert_msg(gguf_open(getenv("QUERN_MODEL"), &file, &err) == 0, "%s", err.msg);
    model = load_model_on(gpu);
}

static void model_teardown(void)
{
    model_free(model);
    model = NULL;
    gguf_close(file);
    file = NULL;
}

static int32_t *json_ids(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) ids[i++] = (int32_t)v->valueint;
    return ids;
}

static const cJSON *gen_case(int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(golden, "generate"), i);
}

/* Logits of golden case i's prompt + greedy text from model m, chunks of 37 tokens (malloc'd
 * [n][vocab]). */
static float *case_logits(struct model *m, int i, size_t *n)
{
    const cJSON *c = gen_case(i);
    size_t np, ng;
    int32_t *p = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
    int32_t *g = json_ids(cJSON_GetObjectItemCaseSensitive(c, "greedy_ids"), &ng);
    int32_t *seq = malloc((np + ng) * sizeof *seq);
    memcpy(seq, p, np * sizeof *seq);
    memcpy(seq + np, g, ng * sizeof *seq);
    float *logits = NULL;
    struct qerr err = {0};
    ck_assert_msg(generate_all_logits(m, seq, np + ng, 37, &logits, &err) == 0, "%s", err.msg);
    *n = np + ng;
    free(seq);
    free(p);
    free(g);
    return logits;
}

/* The golden case i's top logits from model m (on backend be) within tol, relative. */
static void check_golden_logits(struct model *m, struct backend *be, int i, double tol,
                                const char *label)
{
    const cJSON *c = gen_case(i);
    size_t np;
    float *logits = case_logits(m, i, &np);
    struct qerr err = {0};
    ck_assert_msg(backend_cuda_status(be, &err) == 0, "%s", err.msg);
    int vocab = model_get_config(m)->vocab;
    double worst = 0;
    const cJSON *pl;
    cJSON_ArrayForEach(pl, cJSON_GetObjectItemCaseSensitive(c, "logits"))
    {
        int pos = cJSON_GetObjectItemCaseSensitive(pl, "pos")->valueint;
        ck_assert_int_lt(pos, (int)np);
        const float *row = logits + (size_t)pos * (size_t)vocab;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(pl, "top_ids");
        const cJSON *vals = cJSON_GetObjectItemCaseSensitive(pl, "top_logits");
        for (int k = 0; k < cJSON_GetArraySize(ids); k++) {
            int id = cJSON_GetArrayItem(ids, k)->valueint;
            double ref = cJSON_GetArrayItem(vals, k)->valuedouble;
            double rel = fabs(row[id] - ref) / fmax(fabs(ref), 1.0);
            if (!(rel <= worst)) worst = rel;
            ck_assert_msg(rel <= tol, "%s %s pos %d token %d: cuda %.6f, reference %.6f", label,
                          cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, pos, id,
                          row[id], ref);
        }
    }
    printf("%s %s: worst relative logit error %.2e\n", label,
           cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, worst);
    free(logits);
}

START_TEST(model_logits_match_golden)
{
    check_golden_logits(model, gpu, _i, 1e-3, "cuda");
}
END_TEST

/* The default fp16 KV cache on the real model: the top logits within 2e-3 relative (fp16
 * rounding of K and V; the emulation measured 2.2e-4 worst on the first two prompts, the
 * fp32-cache test above holds 1e-3). */
START_TEST(model_kv16_logits_near_golden)
{
    struct model *m = load_model_on(gpu_kv16);
    check_golden_logits(m, gpu_kv16, _i, 2e-3, "cuda fp16 KV");
    model_free(m);
}
END_TEST

/* The tensor-core GEMM through the whole model: chunks of 37 tokens take gemm_mma from 16
 * tokens. MMA fp16 (f32 precision: fp16-rounded activations) within 5e-3 relative of the golden
 * logits. MMA int8 (q8 precision) to test_model.c's bar for the CPU's q8 mode: the golden top-5
 * logits within 1.5, the top-1 kept where its margin exceeds 1. (Against the CPU's q8 run it is
 * no closer: a 1e-7 difference anywhere flips some activation's int8 rounding, and 30 layers
 * amplify it; the emulation measured 0.05-0.4 logits. The per-op check is bit for bit.) */
START_TEST(model_mma_logits_near_golden)
{
    struct qerr err = {0};
    struct model *m = load_model_on(paths[B_MMA]);
    check_golden_logits(m, paths[B_MMA], _i, 5e-3, "cuda MMA fp16");
    model_free(m);

    m = load_model_on(paths[B_MMA_Q8]);
    size_t n;
    float *lg = case_logits(m, _i, &n);
    ck_assert_msg(backend_cuda_status(paths[B_MMA_Q8], &err) == 0, "%s", err.msg);
    const int vocab = model_get_config(m)->vocab;
    double worst = 0;
    const cJSON *pl;
    cJSON_ArrayForEach(pl, cJSON_GetObjectItemCaseSensitive(gen_case(_i), "logits"))
    {
        const int pos = cJSON_GetObjectItemCaseSensitive(pl, "pos")->valueint;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(pl, "top_ids");
        const cJSON *vals = cJSON_GetObjectItemCaseSensitive(pl, "top_logits");
        const float *row = lg + (size_t)pos * (size_t)vocab;
        for (int k = 0; k < cJSON_GetArraySize(ids); k++) {
            const int id = cJSON_GetArrayItem(ids, k)->valueint;
            const double d = fabs(row[id] - cJSON_GetArrayItem(vals, k)->valuedouble);
            if (!(d <= worst)) worst = d;
            ck_assert_msg(d < 1.5, "MMA int8 pos %d token %d: %.3f, reference %.3f", pos, id,
                          row[id], cJSON_GetArrayItem(vals, k)->valuedouble);
        }
        const double margin =
            cJSON_GetArrayItem(vals, 0)->valuedouble - cJSON_GetArrayItem(vals, 1)->valuedouble;
        int best = 0;
        for (int i = 1; i < vocab; i++)
            if (row[i] > row[best]) best = i;
        if (margin > 1.0) ck_assert_int_eq(best, cJSON_GetArrayItem(ids, 0)->valueint);
    }
    printf("cuda MMA int8 %s: worst top-5 logit difference %.3f (bar 1.5)\n",
           cJSON_GetObjectItemCaseSensitive(gen_case(_i), "name")->valuestring, worst);
    free(lg);
    model_free(m);
}
END_TEST

/* Sequence 0 is x (tokens [from, n) now, [0, from) already cached), sequences 1.. are prefill
 * chunks of other text; returns sequence 0's last logits (as tests/test_model.c). */
static void batched_forward(struct backend *be, const int32_t *x, int n, int from, int n_seqs,
                            const int32_t *other, int n_other, float *out)
{
    enum { PER_SEQ = 8, BS = 16, MAXT = 1024 };
    static int32_t tokens[MAXT], pos[MAXT], seq[MAXT], slot[MAXT], table[64 * PER_SEQ], lidx[64];
    int t = 0, nl = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int j = 0; j < PER_SEQ; j++) table[s * PER_SEQ + j] = s * PER_SEQ + j;
        int len = s == 0 ? n : 3 + (s * 7) % 29;
        int start = s == 0 ? from : 0;
        for (int p = start; p < len; p++, t++) {
            ck_assert_int_lt(t, MAXT);
            tokens[t] = s == 0 ? x[p] : other[(s * 13 + p) % n_other];
            pos[t] = p;
            seq[t] = s;
            slot[t] = table[s * PER_SEQ + p / BS] * BS + p % BS;
        }
        lidx[nl++] = t - 1;
    }
    struct model_batch b = {.n_tokens = t,
                            .tokens = tokens,
                            .pos = pos,
                            .seq = seq,
                            .slot = slot,
                            .n_seqs = n_seqs,
                            .max_blocks = PER_SEQ,
                            .block_table = table,
                            .n_logits = nl,
                            .logit_idx = lidx};
    int vocab = model_get_config(model)->vocab;
    float *logits = malloc((size_t)nl * (size_t)vocab * sizeof *logits);
    struct qerr err = {0};
    ck_assert_msg(model_forward(model, &b, logits, &err) == 0, "%s", err.msg);
    ck_assert_msg(backend_cuda_status(be, &err) == 0, "%s", err.msg);
    memcpy(out, logits, (size_t)vocab * sizeof *out);
    free(logits);
}

/* On the F32 and the Q8 backend (_i): a sequence's logits are bit-identical alone and in batches
 * of 2, 7 and 33 sequences mixed with prefill chunks, when it is prefilled and when it decodes. */
START_TEST(model_logits_batch_invariant)
{
    struct backend *be = _i ? gpu_q8 : gpu;
    struct qerr err = {0};
    ck_assert_msg(gguf_open(getenv("QUERN_MODEL"), &file, &err) == 0, "%s", err.msg);
    struct model_opts mo = {
        .max_batch_tokens = 1024, .max_logits = 64, .kv_blocks = 33 * 8, .kv_block_size = 16};
    ck_assert_msg(model_load(file, be, &mo, &model, &err) == 0, "%s", err.msg);
    size_t nx, no;
    int32_t *x = json_ids(cJSON_GetObjectItemCaseSensitive(gen_case(4), "prompt_ids"), &nx);
    int32_t *other = json_ids(cJSON_GetObjectItemCaseSensitive(gen_case(1), "prompt_ids"), &no);
    ck_assert_uint_le(nx, 120);
    int vocab = model_get_config(model)->vocab;
    float *alone = malloc((size_t)vocab * sizeof *alone);
    float *got = malloc((size_t)vocab * sizeof *got);
    batched_forward(be, x, (int)nx, 0, 1, other, (int)no, alone);
    const int sizes[] = {2, 7, 33};
    for (int k = 0; k < 3; k++) {
        batched_forward(be, x, (int)nx, 0, sizes[k], other, (int)no, got);
        ck_assert_msg(memcmp(alone, got, (size_t)vocab * sizeof *got) == 0,
                      "%s: prefill logits differ in a batch of %d", _i ? "Q8" : "F32", sizes[k]);
        batched_forward(be, x, (int)nx - 1, 0, 1, other, (int)no, got);
        batched_forward(be, x, (int)nx, (int)nx - 1, sizes[k], other, (int)no, got);
        ck_assert_msg(memcmp(alone, got, (size_t)vocab * sizeof *got) == 0,
                      "%s: decode logits differ in a batch of %d", _i ? "Q8" : "F32", sizes[k]);
    }
    free(alone);
    free(got);
    free(x);
    free(other);
    model_teardown();
}
END_TEST

struct collect {
    int32_t *out;
    int n, cap;
};

struct logit_log {
    float *logits; /* [steps][49152] */
    int32_t *tokens;
    int n;
};

static bool keep_logits(void *ctx, int32_t token, const float *logits)
{
    struct logit_log *l = ctx;
    memcpy(l->logits + (size_t)l->n * 49152, logits, 49152 * sizeof(float));
    l->tokens[l->n++] = token;
    return false;
}

static bool collect_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    struct collect *c = ctx;
    if (c->n < c->cap) c->out[c->n++] = token;
    return false;
}

/* Greedy decoding follows the reference token for token (a near-tie may break either way). */
START_TEST(model_greedy_matches_golden)
{
    const cJSON *c = gen_case(_i);
    size_t np, ng;
    int32_t *p = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
    int32_t *g = json_ids(cJSON_GetObjectItemCaseSensitive(c, "greedy_ids"), &ng);
    const cJSON *gaps = cJSON_GetObjectItemCaseSensitive(c, "top2_gap");
    int32_t *out = calloc(ng, sizeof *out);
    struct gen_opts o = {.n_predict = (int)ng, .prefill_chunk = 29};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    struct qerr err = {0};
    struct collect col = {out, 0, (int)ng};
    ck_assert_msg(generate_run(model, p, np, &o, collect_token, &col, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(col.n, (int)ng);
    for (size_t i = 0; i < ng; i++) {
        if (out[i] == g[i]) continue;
        double gap = cJSON_GetArrayItem(gaps, (int)i)->valuedouble;
        ck_assert_msg(gap < 1e-3, "step %zu: cuda %d, reference %d (top-2 gap %.4f)", i, out[i],
                      g[i], gap);
        break;
    }
    free(out);
    free(p);
    free(g);
}
END_TEST

/* The real model's decode through captured steps equals the same decode issued op by op: the
 * same tokens and the same logits bit for bit, with most steps replayed. */
static void greedy_logits(struct backend *be, const int32_t *p, size_t np, int steps, float *logits,
                          int32_t *tokens)
{
    struct qerr err = {0};
    struct model_opts mo = {
        .max_batch_tokens = 64, .max_logits = 1, .kv_blocks = 8, .kv_block_size = 16};
    struct model *m = NULL;
    ck_assert_msg(model_load(file, be, &mo, &m, &err) == 0, "%s", err.msg);
    struct gen_opts o = {.n_predict = steps, .prefill_chunk = 64};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    struct logit_log log = {logits, tokens, 0};
    ck_assert_msg(generate_run(m, p, np, &o, keep_logits, &log, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(log.n, steps);
    model_free(m);
}

START_TEST(model_graphs_equal_direct)
{
    const cJSON *c = gen_case(0);
    size_t np;
    int32_t *p = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
    const int steps = 12, vocab = 49152;
    float *a = malloc((size_t)steps * vocab * 4), *b = malloc((size_t)steps * vocab * 4);
    int32_t ta[12], tb[12];
    setenv("QUERN_CUDA_GRAPHS", "0", 1);
    struct backend *direct = NULL;
    ck_assert_int_eq(make_backend(MATMUL_Q8, 0, CUDA_GEMM_MMA, &direct), 0);
    unsetenv("QUERN_CUDA_GRAPHS");
    struct backend *graphs = NULL;
    ck_assert_int_eq(make_backend(MATMUL_Q8, 0, CUDA_GEMM_MMA, &graphs), 0);
    greedy_logits(direct, p, np, steps, a, ta);
    greedy_logits(graphs, p, np, steps, b, tb);
    uint64_t cap, rep, cap0, rep0;
    backend_cuda_graph_counts(graphs, &cap, &rep);
    backend_cuda_graph_counts(direct, &cap0, &rep0);
    printf("graphs: %llu captures, %llu replays in %d decode steps\n", (unsigned long long)cap,
           (unsigned long long)rep, steps);
    ck_assert_uint_eq(cap0 + rep0, 0);
    ck_assert_uint_ge(cap, 1);
    ck_assert_uint_ge(rep, (uint64_t)steps / 2);
    for (int s = 0; s < steps; s++) {
        ck_assert_int_eq(ta[s], tb[s]);
        size_t at;
        ck_assert_msg(
            !bits_differ(b + (size_t)s * vocab, a + (size_t)s * vocab, (size_t)vocab, &at),
            "step %d: logit %zu %.9g (graphs) vs %.9g", s, at, b[(size_t)s * vocab + at],
            a[(size_t)s * vocab + at]);
    }
    backend_destroy(direct);
    backend_destroy(graphs);
    free(a);
    free(b);
    free(p);
}
END_TEST

static cJSON *load_golden(void)
{
    const char *mp = getenv("QUERN_MODEL");
    if (!mp || access(mp, R_OK) != 0) {
        printf("model tests skipped: model file %s not found\n", mp ? mp : "($QUERN_MODEL unset)");
        return NULL;
    }
    const char *gp = tu_golden_path();
    char *text = gp ? tu_read_file(gp, NULL) : NULL;
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!j) printf("model tests skipped: no golden file ($QUERN_GOLDEN)\n");
    return j;
}

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
    golden = load_golden();

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
    tcase_add_test(tc, attention_matches_reference);
    tcase_add_test(tc, step_replay_equals_direct);
    tcase_add_test(tc, kv_f16_cache);
    suite_add_tcase(s, tc);
    if (golden) {
        int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(golden, "generate"));
        TCase *tm = tcase_create("model");
        tcase_set_timeout(tm, 600);
        tcase_add_checked_fixture(tm, model_setup, model_teardown);
        tcase_add_loop_test(tm, model_logits_match_golden, 0, n);
        tcase_add_loop_test(tm, model_greedy_matches_golden, 0, n);
        suite_add_tcase(s, tm);
        /* its own case, so CK_RUN_CASE=model_invariance runs it alone (the CPU emulation) */
        TCase *ti = tcase_create("model_invariance");
        tcase_set_timeout(ti, 600);
        tcase_add_loop_test(ti, model_logits_batch_invariant, 0, 2);
        suite_add_tcase(s, ti);
        TCase *tk = tcase_create("model_kv16");
        tcase_set_timeout(tk, 900);
        tcase_add_checked_fixture(tk, model_setup, model_teardown);
        tcase_add_loop_test(tk, model_kv16_logits_near_golden, 0, n);
        suite_add_tcase(s, tk);
        /* CK_RUN_CASE=model_mma: the tensor-core GEMM on the first prompts */
        TCase *tmm = tcase_create("model_mma");
        tcase_set_timeout(tmm, 900);
        tcase_add_checked_fixture(tmm, model_setup, model_teardown);
        tcase_add_loop_test(tmm, model_mma_logits_near_golden, 0, n < 2 ? n : 2);
        suite_add_tcase(s, tmm);
        /* CK_RUN_CASE=model_graphs alone under the CPU emulation: ~30 forwards */
        TCase *tg = tcase_create("model_graphs");
        tcase_set_timeout(tg, 900);
        tcase_add_checked_fixture(tg, model_setup, model_teardown);
        tcase_add_test(tg, model_graphs_equal_direct);
        suite_add_tcase(s, tg);
    }
    SRunner *r = srunner_create(s);
    srunner_set_fork_status(r, CK_NOFORK);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    for (int k = 0; k < N_PATHS; k++) backend_destroy(paths[k]);
    backend_destroy(gpu_kv16);
    cJSON_Delete(golden);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
