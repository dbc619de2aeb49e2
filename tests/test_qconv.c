/* test_qconv: the GGML types converted when a file is read (quant/qconv.h). Each decoder against
 * blocks this test encodes from the layout with chosen scales and quants (the encoders here are
 * the inverse of the decoders, written from ggml-common.h's layout), and each conversion against
 * the decoder on random blocks: Q5_0 -> Q8_0 the same bits, Q4_K -> Q4_1 within the fp16
 * rounding of its scale and minimum, the requantized ones within half a Q8_0 step and that
 * step's fp16 rounding. gguf-py's decoders are the reference of the model-level check
 * (test_quantize_cli.sh). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/qconv.h"
#include "../quant/qtypes.h"

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* ggml's 12-byte scales of a Q4_K/Q5_K super-block from 8 six-bit scales and minimums. */
static void pack_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12])
{
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        out[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4);
    }
}

/* A Q4_K (five 0) or Q5_K super-block of quants q[256] (0..15 or 0..31) in 8 sub-blocks with
 * the given codes; returns its size. */
static size_t encode_k45(bool five, uint16_t d, uint16_t dmin, const uint8_t sc[8],
                         const uint8_t m[8], const uint8_t q[QK_K], uint8_t *out)
{
    memcpy(out, &d, 2);
    memcpy(out + 2, &dmin, 2);
    pack_k_scales(sc, m, out + 4);
    uint8_t *qh = out + 16, *qs = out + 16 + (five ? 32 : 0);
    if (five) memset(qh, 0, 32);
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++) {
            uint8_t v = q[32 * s + l];
            uint8_t *b = &qs[32 * (s / 2) + l];
            if (s % 2 == 0)
                *b = v & 0xF;
            else
                *b |= (uint8_t)((v & 0xF) << 4);
            if (five) qh[l] |= (uint8_t)(((v >> 4) & 1) << s);
        }
    return five ? 176 : 144;
}

START_TEST(k45_decode_known)
{
    for (int five = 0; five < 2; five++) {
        uint8_t sc[8], m[8], q[QK_K], blk[176];
        for (int s = 0; s < 8; s++) {
            sc[s] = (uint8_t)(63 - 7 * s); /* every bit of the 6-bit codes in use */
            m[s] = (uint8_t)(5 * s + 27);
        }
        for (int i = 0; i < QK_K; i++) q[i] = (uint8_t)((i * 7 + 3) % (five ? 32 : 16));
        const float d = 0.03125f, dmin = 0.0078125f; /* exact in fp16 */
        encode_k45(five, f32_to_fp16(d), f32_to_fp16(dmin), sc, m, q, blk);
        float y[QK_K];
        qconv_dequantize_row(five ? QCONV_Q5_K : QCONV_Q4_K, blk, y, QK_K);
        for (int i = 0; i < QK_K; i++) {
            int s = i / 32;
            float want = d * sc[s] * (float)q[i] - dmin * m[s];
            ck_assert_msg(y[i] == want, "%s element %d: %g, want %g", five ? "Q5_K" : "Q4_K", i,
                          y[i], want);
        }
    }
}
END_TEST

START_TEST(q6k_decode_known)
{
    uint8_t blk[210] = {0};
    int8_t sc[16];
    uint8_t q[QK_K];
    for (int s = 0; s < 16; s++) sc[s] = (int8_t)(s % 2 ? -9 * s - 1 : 8 * s + 3);
    for (int i = 0; i < QK_K; i++) q[i] = (uint8_t)((i * 11 + 5) % 64);
    /* half h of 128: element l + 32k (k = 0..3) in ql[64h + l + 32 (k % 2)]'s low (k < 2) or
     * high nibble, its top two bits in qh[32h + l] at bits 2k */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < 4; k++) {
                uint8_t v = q[128 * h + 32 * k + l];
                blk[64 * h + l + 32 * (k % 2)] |= (uint8_t)((v & 0xF) << (k < 2 ? 0 : 4));
                blk[128 + 32 * h + l] |= (uint8_t)((v >> 4) << (2 * k));
            }
    memcpy(blk + 192, sc, 16);
    const float d = 0.125f;
    uint16_t dh = f32_to_fp16(d);
    memcpy(blk + 208, &dh, 2);
    float y[QK_K];
    qconv_dequantize_row(QCONV_Q6_K, blk, y, QK_K);
    for (int i = 0; i < QK_K; i++) {
        float want = d * (float)sc[i / 16] * (float)(q[i] - 32);
        ck_assert_msg(y[i] == want, "Q6_K element %d: %g, want %g", i, y[i], want);
    }
}
END_TEST

START_TEST(q5_decode_known)
{
    for (int one = 0; one < 2; one++) {
        uint8_t blk[24] = {0};
        uint8_t q[QK];
        for (int j = 0; j < QK; j++) q[j] = (uint8_t)((j * 13 + 1) % 32);
        const float d = 0.25f, m = -1.5f;
        uint16_t dh = f32_to_fp16(d), mh = f32_to_fp16(m);
        memcpy(blk, &dh, 2);
        if (one) memcpy(blk + 2, &mh, 2);
        uint8_t *qh = blk + (one ? 4 : 2), *qs = qh + 4;
        uint32_t bits = 0;
        for (int j = 0; j < QK; j++) {
            bits |= (uint32_t)(q[j] >> 4) << j;
            qs[j % 16] |= (uint8_t)((q[j] & 0xF) << (j < 16 ? 0 : 4));
        }
        memcpy(qh, &bits, 4);
        float y[QK];
        qconv_dequantize_row(one ? QCONV_Q5_1 : QCONV_Q5_0, blk, y, QK);
        for (int j = 0; j < QK; j++) {
            float want = one ? (float)q[j] * d + m : (float)(q[j] - 16) * d;
            ck_assert_msg(y[j] == want, "Q5_%d element %d: %g, want %g", one, j, y[j], want);
        }
    }
}
END_TEST

/* Random blocks of type t (n elements): random bytes with finite, moderate fp16 scales. */
static void random_blocks(uint32_t t, uint8_t *buf, size_t n)
{
    size_t nb = n / qconv_block_elems(t), bb = qconv_block_bytes(t);
    for (size_t i = 0; i < nb * bb; i++) buf[i] = (uint8_t)rnd();
    for (size_t i = 0; i < nb; i++) {
        uint8_t *b = buf + i * bb;
        uint16_t d = f32_to_fp16((float)(rnd() % 1000 + 1) * 1e-5f);
        uint16_t m = f32_to_fp16((float)((int)(rnd() % 2001) - 1000) * 1e-4f);
        if (t == QCONV_Q6_K) {
            memcpy(b + 208, &d, 2);
            continue;
        }
        memcpy(b, &d, 2);
        if (t != QCONV_Q5_0) memcpy(b + 2, t == QCONV_Q5_1 ? &m : &d, 2); /* K: dmin */
    }
}

START_TEST(conversions_bound)
{
    static const uint32_t types[] = {QCONV_Q5_0, QCONV_Q5_1, QCONV_Q4_K, QCONV_Q5_K, QCONV_Q6_K};
    enum { N = 4 * QK_K };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        enum qtype to = qconv_target(t);
        for (int rep = 0; rep < 50; rep++) {
            uint8_t src[N / 32 * 24 + N / QK_K * 210], dst[N / 32 * 34];
            float want[N], got[N];
            random_blocks(t, src, N);
            qconv_dequantize_row(t, src, want, N);
            qconv_row(t, src, dst, N);
            qtype_dequantize_row(to, dst, got, N);
            for (int b = 0; b < N / QK; b++) {
                float amax = 0, span = 0;
                for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(want[QK * b + j]));
                if (to == QTYPE_Q4_1) { /* the converted block's scale and minimum */
                    const struct block_q4_1 *q = (const struct block_q4_1 *)dst + b;
                    span = 15 * fabsf(fp16_to_f32(q->d)) + fabsf(fp16_to_f32(q->m));
                }
                for (int j = 0; j < QK; j++) {
                    int i = QK * b + j;
                    float err = fabsf(got[i] - want[i]), bound;
                    if (t == QCONV_Q5_0)
                        bound = 0; /* the same d and the same integer */
                    else if (t == QCONV_Q4_K)
                        /* fp16 d and m: 2^-11 relative each, 2^-25 below fp16's normals */
                        bound = 0x1p-10f * span + 0x1p-20f;
                    else
                        /* half a Q8_0 step, and 127 times the fp16 rounding of its scale */
                        bound = amax * (1.0f / 254 + 0x1p-11f) * 1.0001f + 1e-30f;
                    ck_assert_msg(err <= bound, "%s -> %s element %d: %.9g, want %.9g (bound %g)",
                                  qconv_name(t), qtype_name(to), i, got[i], want[i], bound);
                }
            }
        }
    }
}
END_TEST

/* A file's NaN or infinite scale: the requantized block is all NaN (the load's scan reports
 * it), where quantize_row_q8_0 would convert a NaN to int8. */
START_TEST(nonfinite_scale)
{
    static const uint32_t types[] = {QCONV_Q5_1, QCONV_Q5_K, QCONV_Q6_K};
    static const uint16_t bad[] = {0x7c00, 0xfc00, 0x7e00}; /* +Inf, -Inf, NaN */
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t bi = 0; bi < 3; bi++) {
            uint32_t t = types[ti];
            uint8_t src[QK_K / 32 * 24 + 210], dst[QK_K / 32 * 34];
            float got[QK_K];
            random_blocks(t, src, QK_K);
            memcpy(src + (t == QCONV_Q6_K ? 208 : 0), &bad[bi], 2);
            qconv_row(t, src, dst, QK_K);
            qtype_dequantize_row(QTYPE_Q8_0, dst, got, QK_K);
            for (int j = 0; j < QK; j++)
                ck_assert_msg(isnan(got[j]), "%s, scale 0x%04x: element %d is %g", qconv_name(t),
                              bad[bi], j, got[j]);
        }
}
END_TEST

START_TEST(names_and_sizes)
{
    ck_assert(qconv_type(QCONV_Q4_K) && qconv_type(QCONV_Q5_0) && !qconv_type(QTYPE_Q4_1));
    ck_assert(!qconv_type(15)); /* Q8_K: never in a file */
    ck_assert_str_eq(qconv_name(QCONV_Q6_K), "Q6_K");
    ck_assert_uint_eq(qconv_block_bytes(QCONV_Q4_K), 144);
    ck_assert_uint_eq(qconv_block_elems(QCONV_Q5_1), 32);
    ck_assert_int_eq(qconv_target(QCONV_Q4_K), QTYPE_Q4_1);
    ck_assert_int_eq(qconv_target(QCONV_Q6_K), QTYPE_Q8_0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("qconv");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, k45_decode_known);
    tcase_add_test(tc, q6k_decode_known);
    tcase_add_test(tc, q5_decode_known);
    tcase_add_test(tc, conversions_bound);
    tcase_add_test(tc, nonfinite_scale);
    tcase_add_test(tc, names_and_sizes);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
