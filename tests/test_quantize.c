/* Reference quantizers (quant/quantize.h): blocks worked out by hand down to the byte, the
 * rounding rules of ggml's quantize_row_*_ref (ties, clamps, the sign of the Q4_0 scale), error
 * bounds of quantize -> dequantize on random rows, the real model's Q4_1 blocks surviving
 * dequantize -> quantize unchanged, the searched scales never worse than the reference, and the
 * eval statistics (engine/eval.h). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/eval.h"
#include "../engine/gguf.h"
#include "../quant/quantize.h"
#include "testutil.h"

/* xorshift64*: the tests' own deterministic random numbers. */
static uint64_t rnd_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [-1, 1). */
static float rnd_unit(uint64_t *s)
{
    return (float)((double)(rnd_next(s) >> 11) * 0x1p-53 * 2.0 - 1.0);
}

/* Roughly normal (sum of four uniforms), scaled. */
static float rnd_normal(uint64_t *s, float scale)
{
    return scale * (rnd_unit(s) + rnd_unit(s) + rnd_unit(s) + rnd_unit(s)) * 0.866f;
}

START_TEST(q8_0_hand_block)
{
    /* amax 127 gives d = 1 exactly (fp16 0x3c00) and 1/d = 1: q = roundf(x), ties away from 0 */
    float x[QK] = {0};
    x[0] = 127.0f;
    x[1] = 2.5f;    /* tie: 3, not 2 (round-half-even would give 2) */
    x[2] = -2.5f;   /* -3 */
    x[3] = 0.49f;   /* 0 */
    x[4] = -0.5f;   /* -1 */
    x[5] = 126.5f;  /* 127 */
    x[6] = -127.0f; /* -127 */
    x[7] = 1.75f;   /* 2 */
    struct block_q8_0 b;
    quantize_row_q8_0(x, &b, QK);
    unsigned char bytes[34];
    memcpy(bytes, &b, sizeof bytes);
    const unsigned char want[34] = {0x00, 0x3c, 127, 3, 0xfd, 0, 0xff, 127, 0x81, 2};
    ck_assert_mem_eq(bytes, want, sizeof want);

    /* amax 63.5: d = 0.5 (0x3800), 1/d = 2 */
    for (int j = 0; j < QK; j++) x[j] = 0.25f * (float)(j - 16);
    x[31] = 63.5f;
    quantize_row_q8_0(x, &b, QK);
    ck_assert_uint_eq(b.d, 0x3800);
    for (int j = 0; j < 31; j++)
        ck_assert_int_eq(b.qs[j], (j - 16) / 2 + ((j - 16) % 2 ? (j < 16 ? -1 : 1) : 0));
    ck_assert_int_eq(b.qs[31], 127);
}
END_TEST

START_TEST(q4_0_hand_block)
{
    /* the element of largest magnitude is -8: d = -8 / -8 = 1 (0x3c00), q = trunc(x + 8.5) */
    float x[QK] = {0};
    x[0] = -8.0f;  /* 0.5 -> nibble 0 */
    x[1] = 7.0f;   /* 15.5 -> 15 */
    x[2] = 7.4f;   /* 15.9 -> 15 */
    x[3] = 0.5f;   /* 9.0 -> 9: halves round up */
    x[4] = -0.5f;  /* 8.0 -> 8 */
    x[5] = -0.6f;  /* 7.9 -> 7 */
    x[16] = 3.0f;  /* high nibble of byte 0: 11.5 -> 11 */
    x[17] = -3.0f; /* 5.5 -> 5 */
    struct block_q4_0 b;
    quantize_row_q4_0(x, &b, QK);
    unsigned char bytes[18];
    memcpy(bytes, &b, sizeof bytes);
    const unsigned char want[18] = {0x00, 0x3c, 0xb0, 0x5f, 0x8f, 0x89, 0x88, 0x87, 0x88,
                                    0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
    ck_assert_mem_eq(bytes, want, sizeof want);
}
END_TEST

START_TEST(q4_0_sign_and_ties)
{
    /* the extreme is +8: d = -1 (0xbc00); +8 -> nibble 0, -8 would need 16 and clamps to 15 */
    float x[QK] = {0};
    x[0] = 8.0f;
    x[1] = -8.0f;
    struct block_q4_0 b;
    quantize_row_q4_0(x, &b, QK);
    ck_assert_uint_eq(b.d, 0xbc00);
    ck_assert_uint_eq(b.qs[0] & 0xf, 0);
    ck_assert_uint_eq(b.qs[1] & 0xf, 15);
    float y[QK];
    qtype_dequantize_row(QTYPE_Q4_0, &b, y, QK);
    ck_assert_float_eq(y[0], 8.0f);
    ck_assert_float_eq(y[1], -7.0f); /* the clamp: the far side of the range loses one step */

    /* equal magnitudes: the first one wins, so the sign of d follows x[0] */
    memset(x, 0, sizeof x);
    x[0] = 4.0f;
    x[1] = -4.0f;
    quantize_row_q4_0(x, &b, QK);
    ck_assert_uint_eq(b.d, 0xb800); /* -0.5 */
    x[0] = -4.0f;
    x[1] = 4.0f;
    quantize_row_q4_0(x, &b, QK);
    ck_assert_uint_eq(b.d, 0x3800); /* 0.5 */
}
END_TEST

START_TEST(q4_1_hand_block)
{
    /* min -1, max 14: d = 1 (0x3c00), m = -1 (0xbc00), q = trunc(x + 1 + 0.5) */
    float x[QK];
    for (int j = 0; j < QK; j++) x[j] = 0.0f; /* 1.5 -> 1 */
    x[0] = -1.0f;                             /* 0 */
    x[1] = 14.0f;                             /* 15 */
    x[2] = 0.4f;                              /* 1.9 -> 1 */
    x[3] = 0.5f;                              /* 2.0 -> 2 */
    x[16] = 13.6f;                            /* 15.1 -> 15 */
    x[17] = 6.0f;                             /* 7.5 -> 7 */
    struct block_q4_1 b;
    quantize_row_q4_1(x, &b, QK);
    unsigned char bytes[20];
    memcpy(bytes, &b, sizeof bytes);
    const unsigned char want[20] = {0x00, 0x3c, 0x00, 0xbc, 0xf0, 0x7f, 0x11, 0x12, 0x11, 0x11,
                                    0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11};
    ck_assert_mem_eq(bytes, want, sizeof want);
}
END_TEST

START_TEST(zero_and_constant_blocks)
{
    float x[QK] = {0}, y[QK];
    struct block_q8_0 b8;
    struct block_q4_0 b40;
    struct block_q4_1 b41;
    quantize_row_q8_0(x, &b8, QK);
    ck_assert_uint_eq(b8.d, 0);
    for (int j = 0; j < QK; j++) ck_assert_int_eq(b8.qs[j], 0);
    quantize_row_q4_0(x, &b40, QK);
    ck_assert_uint_eq(b40.d, 0x8000); /* 0 / -8 is -0: ggml stores the fp16 -0 too */
    for (int j = 0; j < QK / 2; j++) ck_assert_uint_eq(b40.qs[j], 0x88); /* 8 decodes to 0 */
    quantize_row_q4_1(x, &b41, QK);
    ck_assert_uint_eq(b41.d, 0);
    ck_assert_uint_eq(b41.m, 0);
    for (int j = 0; j < QK / 2; j++) ck_assert_uint_eq(b41.qs[j], 0);

    for (int j = 0; j < QK; j++) x[j] = 3.0f; /* constant: Q4_1 keeps it exactly in m */
    quantize_row_q4_1(x, &b41, QK);
    qtype_dequantize_row(QTYPE_Q4_1, &b41, y, QK);
    for (int j = 0; j < QK; j++) ck_assert_float_eq(y[j], 3.0f);
    quantize_row_q8_0(x, &b8, QK);
    qtype_dequantize_row(QTYPE_Q8_0, &b8, y, QK);
    for (int j = 0; j < QK; j++) ck_assert_float_eq_tol(y[j], 3.0f, 3.0f / 1024);
}
END_TEST

/* quantize -> dequantize on random rows: every element within the format's bound, and the RMS
 * error small relative to the data. Bounds: half a step, plus the fp16 rounding of d (and m) on
 * up to 127 (15) steps; Q4_0 loses a whole step on the far side of its asymmetric range. */
static void check_roundtrip(enum qtype t, float half_steps, double max_rel_rms)
{
    enum { ROWS = 200, N = 8 * QK };
    uint64_t seed = 0x1234567 + (uint64_t)t;
    float x[N], y[N];
    unsigned char q[N * 2];
    double se = 0, ss = 0;
    for (int r = 0; r < ROWS; r++) {
        float scale = r % 3 == 0 ? 0.02f : r % 3 == 1 ? 1.0f : 200.0f;
        for (int i = 0; i < N; i++) x[i] = rnd_normal(&seed, scale);
        if (r % 7 == 0) x[r % N] *= 30.0f; /* an outlier */
        struct qerr err = {0};
        ck_assert_int_eq(qtype_quantize_row(t, QROUND_REF, x, q, N, &err), 0);
        qtype_dequantize_row(t, q, y, N);
        for (int b = 0; b < N / QK; b++) {
            float mn = x[b * QK], mx = x[b * QK], amax = 0;
            for (int j = 0; j < QK; j++) {
                float v = x[b * QK + j];
                mn = fminf(mn, v);
                mx = fmaxf(mx, v);
                amax = fmaxf(amax, fabsf(v));
            }
            float step = t == QTYPE_Q8_0 ? amax / 127 : t == QTYPE_Q4_0 ? amax / 8 : (mx - mn) / 15;
            float bound = half_steps * step + (amax + 16 * step) * 0x1p-10f;
            for (int j = 0; j < QK; j++) {
                float e = fabsf(y[b * QK + j] - x[b * QK + j]);
                ck_assert_msg(e <= bound, "%s row %d elem %d: |%g - %g| = %g > %g", qtype_name(t),
                              r, b * QK + j, (double)y[b * QK + j], (double)x[b * QK + j],
                              (double)e, (double)bound);
                se += (double)e * e / ((double)step * step + 1e-30);
                ss += 1;
            }
        }
    }
    /* RMS error in steps: uniform rounding error has RMS 1/sqrt(12) = 0.29 of a step */
    double rms_steps = sqrt(se / ss);
    ck_assert_msg(rms_steps < max_rel_rms, "%s: RMS error %.3f steps", qtype_name(t), rms_steps);
}

START_TEST(roundtrip_bounds)
{
    check_roundtrip(QTYPE_Q8_0, 0.5f, 0.32);
    check_roundtrip(QTYPE_Q4_0, 1.0f, 0.40);
    check_roundtrip(QTYPE_Q4_1, 0.5f, 0.32);
}
END_TEST

/* Quantizing what a block decodes to gives the block back when it spans its full range (q = 0
 * and q = 15 / +-127 both present): quantize is a left inverse of dequantize there. */
START_TEST(requantize_is_stable)
{
    uint64_t seed = 99;
    for (int it = 0; it < 20000; it++) {
        struct block_q4_1 a, b;
        a.d = f32_to_fp16(0.001f + 0.1f * fabsf(rnd_unit(&seed)));
        a.m = f32_to_fp16(-0.5f * fabsf(rnd_unit(&seed)));
        for (int j = 0; j < QK / 2; j++) a.qs[j] = (uint8_t)(rnd_next(&seed) & 0xff);
        a.qs[3] = (uint8_t)((a.qs[3] & 0xf0) | 0x0);
        a.qs[9] = (uint8_t)((a.qs[9] & 0x0f) | 0xf0);
        float y[QK];
        qtype_dequantize_row(QTYPE_Q4_1, &a, y, QK);
        quantize_row_q4_1(y, &b, QK);
        ck_assert_mem_eq(&a, &b, sizeof a);

        struct block_q8_0 c, d;
        c.d = f32_to_fp16(0.0001f + 0.01f * fabsf(rnd_unit(&seed)));
        for (int j = 0; j < QK; j++) c.qs[j] = (int8_t)((int)(rnd_next(&seed) % 255) - 127);
        c.qs[5] = (it & 1) ? 127 : -127;
        qtype_dequantize_row(QTYPE_Q8_0, &c, y, QK);
        quantize_row_q8_0(y, &d, QK);
        ck_assert_mem_eq(&c, &d, sizeof c);
    }
}
END_TEST

/* The default model's Q4_1 weights, dequantized and quantized again, come back byte for byte
 * (3.3 M blocks); skipped when the model is not there. */
START_TEST(real_model_q4_1_stable)
{
    const char *path = getenv("QUERN_MODEL");
    struct gguf_file *f = NULL;
    struct qerr err = {0};
    if (!path || gguf_open(path, &f, &err) != 0) {
        fprintf(stderr, "real_model_q4_1_stable: no model, skipped\n");
        return;
    }
    uint64_t blocks = 0, differ = 0;
    float *row = NULL;
    struct block_q4_1 *q = NULL;
    size_t cap = 0;
    int stride = tu_sanitized() ? 7 : 1; /* a sanitizer build checks every 7th tensor */
    for (uint64_t i = 0; i < gguf_tensor_count(f); i += (uint64_t)stride) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->type != QTYPE_Q4_1) continue;
        size_t ne0 = (size_t)t->ne[0], rows = (size_t)(t->n_elems / t->ne[0]);
        if (ne0 > cap) {
            cap = ne0;
            row = realloc(row, cap * sizeof *row);
            q = realloc(q, cap / QK * sizeof *q);
            ck_assert(row && q);
        }
        const struct block_q4_1 *src = t->data;
        for (size_t r = 0; r < rows; r++) {
            qtype_dequantize_row(QTYPE_Q4_1, src + r * ne0 / QK, row, ne0);
            quantize_row_q4_1(row, q, ne0);
            for (size_t b = 0; b < ne0 / QK; b++)
                differ += memcmp(&q[b], &src[r * ne0 / QK + b], sizeof *q) != 0;
            blocks += ne0 / QK;
        }
    }
    free(row);
    free(q);
    gguf_close(f);
    ck_assert_uint_gt(blocks, 0);
    ck_assert_msg(differ == 0, "%llu of %llu blocks changed", (unsigned long long)differ,
                  (unsigned long long)blocks);
}
END_TEST

/* Sum of squared errors of x under its quantized copy q (n elements of type t). */
static double sq_error(enum qtype t, const float *x, const void *q, size_t n)
{
    float y[8 * QK];
    ck_assert_uint_le(n, 8 * QK);
    qtype_dequantize_row(t, q, y, n);
    double e = 0;
    for (size_t i = 0; i < n; i++) e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
    return e;
}

/* Searched Q8_0 scales (quantize_search.c): per block never a larger squared error than the
 * reference rounding, on random rows with outliers; on values already on a Q4_1 grid (what the
 * default model holds) several times less; Q4_0 ignores the search. */
START_TEST(search_never_worse)
{
    enum { N = 8 * QK };
    uint64_t seed = 4242;
    double ref_grid = 0, search_grid = 0;
    for (int r = 0; r < 600; r++) {
        float x[N];
        bool grid = r % 2 == 1;
        if (grid) { /* Q4_1 values: d * nibble + m per block */
            for (int b = 0; b < N / QK; b++) {
                float d = fp16_to_f32(f32_to_fp16(0.001f + 0.05f * fabsf(rnd_unit(&seed))));
                float m = fp16_to_f32(f32_to_fp16(-8.0f * d * (0.5f + fabsf(rnd_unit(&seed)))));
                for (int j = 0; j < QK; j++) x[b * QK + j] = d * (float)(rnd_next(&seed) % 16) + m;
            }
        } else {
            float scale = r % 3 == 0 ? 0.02f : 3.0f;
            for (int i = 0; i < N; i++) x[i] = rnd_normal(&seed, scale);
            if (r % 5 == 0) x[r % N] *= 25.0f;
        }
        const enum qtype t = QTYPE_Q8_0;
        unsigned char a[N * 2], b[N * 2], c[N * 2], d[N * 2];
        struct qerr err = {0};
        ck_assert_int_eq(qtype_quantize_row(t, QROUND_REF, x, a, N, &err), 0);
        ck_assert_int_eq(qtype_quantize_row(t, QROUND_SEARCH, x, b, N, &err), 0);
        size_t bb = qtype_block_bytes(t);
        for (int blk = 0; blk < N / QK; blk++) {
            double ea = sq_error(t, x + blk * QK, a + blk * bb, QK);
            double eb = sq_error(t, x + blk * QK, b + blk * bb, QK);
            ck_assert_msg(eb <= ea * (1 + 1e-9) + 1e-30, "row %d block %d: %g > %g", r, blk, eb,
                          ea);
            if (grid) {
                ref_grid += ea;
                search_grid += eb;
            }
        }
        ck_assert_int_eq(qtype_quantize_row(QTYPE_Q4_0, QROUND_REF, x, c, N, &err), 0);
        ck_assert_int_eq(qtype_quantize_row(QTYPE_Q4_0, QROUND_SEARCH, x, d, N, &err), 0);
        ck_assert_mem_eq(c, d, qtype_row_bytes(QTYPE_Q4_0, N));
    }
    ck_assert_msg(search_grid * 3 < ref_grid, "Q8_0 on Q4_1 grids: search %g vs ref %g",
                  search_grid, ref_grid);
}
END_TEST

START_TEST(quantize_row_dispatch)
{
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i * 0.25f - 8.0f;
    unsigned char out[256];
    struct qerr err = {0};
    ck_assert_int_eq(qtype_quantize_row(QTYPE_Q4_0, QROUND_REF, x, out, 40, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "40"));
    ck_assert_int_eq(qtype_quantize_row(QTYPE_BF16, QROUND_REF, x, out, 64, &err),
                     QERR_UNSUPPORTED);
    ck_assert_int_eq(qtype_quantize_row(QTYPE_F16, QROUND_REF, x, out, 3, &err), 0);
    uint16_t h[3];
    memcpy(h, out, sizeof h);
    ck_assert_uint_eq(h[0], 0xc800); /* -8 */
    ck_assert_int_eq(qtype_quantize_row(QTYPE_F32, QROUND_REF, x, out, 5, &err), 0);
    ck_assert_mem_eq(out, x, 5 * sizeof(float));
    ck_assert(qtype_can_quantize(QTYPE_Q4_1));
    ck_assert(!qtype_can_quantize(QTYPE_BF16));
    /* the dispatcher and the direct call agree */
    struct block_q4_1 a[2], b[2];
    ck_assert_int_eq(qtype_quantize_row(QTYPE_Q4_1, QROUND_REF, x, a, 64, &err), 0);
    quantize_row_q4_1(x, b, 64);
    ck_assert_mem_eq(a, b, sizeof a);
}
END_TEST

START_TEST(eval_stats_values)
{
    struct eval_stats s;
    struct qerr err = {0};
    /* uniform logits over 4 tokens: perplexity 4; identical models: KL 0, top-1 100 % */
    ck_assert_int_eq(eval_stats_init(&s, 4, true, &err), 0);
    float u[4] = {1, 1, 1, 1};
    for (int i = 0; i < 10; i++) ck_assert_int_eq(eval_stats_add(&s, u, u, i % 4, &err), 0);
    struct eval_summary o;
    eval_stats_summarize(&s, &o);
    ck_assert_uint_eq(o.n, 10);
    ck_assert_double_eq_tol(o.ppl, 4.0, 1e-5);
    ck_assert_double_eq_tol(o.ppl_ref, 4.0, 1e-5);
    ck_assert_double_eq_tol(o.kl_mean, 0.0, 1e-7);
    ck_assert_double_eq_tol(o.top1, 1.0, 1e-12);
    ck_assert_int_eq(eval_stats_add(&s, u, u, 4, &err), QERR_INVALID);
    eval_stats_free(&s);

    /* two tokens: ref (1/2, 1/2), model (3/4, 1/4): KL = 0.5 ln(4/3); the model's top token is
     * 0 and the ref's (a tie) is also 0 (the first); next = 1: nll = ln 4, ref nll = ln 2 */
    ck_assert_int_eq(eval_stats_init(&s, 2, true, &err), 0);
    float ref[2] = {0, 0}, mod[2] = {logf(3.0f), 0};
    ck_assert_int_eq(eval_stats_add(&s, mod, ref, 1, &err), 0);
    eval_stats_summarize(&s, &o);
    ck_assert_double_eq_tol(o.kl_mean, 0.5 * log(4.0 / 3.0), 1e-6);
    ck_assert_double_eq_tol(o.kl_max, 0.5 * log(4.0 / 3.0), 1e-6);
    ck_assert_double_eq_tol(o.ppl, 4.0, 1e-5);
    ck_assert_double_eq_tol(o.ppl_ref, 2.0, 1e-5);
    ck_assert_double_eq_tol(o.dp_mean, 0.25 - 0.5, 1e-6);
    ck_assert_double_eq_tol(o.top1, 1.0, 1e-12);
    float mod2[2] = {0, 1};
    ck_assert_int_eq(eval_stats_add(&s, mod2, ref, 0, &err), 0);
    eval_stats_summarize(&s, &o);
    ck_assert_double_eq_tol(o.top1, 0.5, 1e-12);
    float bad[2] = {NAN, 0};
    ck_assert_int_eq(eval_stats_add(&s, bad, ref, 0, &err), QERR_FORMAT);
    eval_stats_free(&s);

    /* no reference: perplexity only */
    ck_assert_int_eq(eval_stats_init(&s, 3, false, &err), 0);
    float l[3] = {0, logf(2.0f), 0}; /* p = 1/4, 1/2, 1/4 */
    ck_assert_int_eq(eval_stats_add(&s, l, NULL, 1, &err), 0);
    ck_assert_int_eq(eval_stats_add(&s, l, NULL, 0, &err), 0);
    eval_stats_summarize(&s, &o);
    ck_assert_double_eq_tol(o.ppl, sqrt(8.0), 1e-5); /* exp((ln 2 + ln 4) / 2) */
    eval_stats_free(&s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("quantize");
    TCase *tc = tcase_create("quantize");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, q8_0_hand_block);
    tcase_add_test(tc, q4_0_hand_block);
    tcase_add_test(tc, q4_0_sign_and_ties);
    tcase_add_test(tc, q4_1_hand_block);
    tcase_add_test(tc, zero_and_constant_blocks);
    tcase_add_test(tc, roundtrip_bounds);
    tcase_add_test(tc, requantize_is_stable);
    tcase_add_test(tc, real_model_q4_1_stable);
    tcase_add_test(tc, search_never_worse);
    tcase_add_test(tc, quantize_row_dispatch);
    tcase_add_test(tc, eval_stats_values);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
