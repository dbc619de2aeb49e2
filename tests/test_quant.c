/* Reference dequantization against blocks worked out by hand, and fp16 conversions. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/qtypes.h"

START_TEST(fp16_known_values)
{
    ck_assert_float_eq(fp16_to_f32(0x3c00), 1.0f);
    ck_assert_float_eq(fp16_to_f32(0xc000), -2.0f);
    ck_assert_float_eq(fp16_to_f32(0x3555), 0.333251953125f);
    ck_assert_float_eq(fp16_to_f32(0x0001), 0x1p-24f); /* smallest subnormal */
    ck_assert_float_eq(fp16_to_f32(0x7bff), 65504.0f);
    ck_assert(isinf(fp16_to_f32(0x7c00)));
    ck_assert(isnan(fp16_to_f32(0x7e00)));
    ck_assert_uint_eq(f32_to_fp16(1.0f), 0x3c00);
    ck_assert_uint_eq(f32_to_fp16(-2.0f), 0xc000);
    ck_assert_uint_eq(f32_to_fp16(65504.0f), 0x7bff);
    ck_assert_uint_eq(f32_to_fp16(1e6f), 0x7c00);
    ck_assert_uint_eq(f32_to_fp16(0x1p-24f), 0x0001);
    /* 1 + 2^-11 is exactly between 1 and the next fp16: ties to even (1.0) */
    ck_assert_uint_eq(f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    ck_assert_uint_eq(f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
}
END_TEST

START_TEST(fp16_roundtrip_all)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
        ck_assert_uint_eq(f32_to_fp16(fp16_to_f32((uint16_t)h)), h);
    }
}
END_TEST

START_TEST(bf16_known)
{
    ck_assert_float_eq(bf16_to_f32(0x3f80), 1.0f);
    ck_assert_float_eq(bf16_to_f32(0xc0a0), -5.0f);
    uint16_t row[3] = {0x3f80, 0x4000, 0xbf00};
    float out[3];
    qtype_dequantize_row(QTYPE_BF16, row, out, 3);
    ck_assert_float_eq(out[1], 2.0f);
    ck_assert_float_eq(out[2], -0.5f);
}
END_TEST

START_TEST(q8_0_block)
{
    struct block_q8_0 b;
    b.d = 0x3800; /* 0.5 */
    for (int i = 0; i < QK; i++) b.qs[i] = (int8_t)(i - 16);
    float out[QK];
    qtype_dequantize_row(QTYPE_Q8_0, &b, out, QK);
    for (int i = 0; i < QK; i++) ck_assert_float_eq(out[i], 0.5f * (float)(i - 16));
}
END_TEST

START_TEST(q4_0_block)
{
    struct block_q4_0 b;
    b.d = 0x4000; /* 2.0 */
    /* byte j: low nibble = element j, high nibble = element j + 16 */
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float out[QK];
    qtype_dequantize_row(QTYPE_Q4_0, &b, out, QK);
    for (int j = 0; j < 16; j++) {
        ck_assert_float_eq(out[j], 2.0f * (float)(j - 8));
        ck_assert_float_eq(out[j + 16], 2.0f * (float)(15 - j - 8));
    }
    ck_assert_float_eq(out[0], -16.0f); /* nibble 0 -> -8 * d */
    ck_assert_float_eq(out[16], 14.0f); /* nibble 15 -> 7 * d */
}
END_TEST

START_TEST(q4_1_block)
{
    struct block_q4_1 b[2];
    b[0].d = 0x3400; /* 0.25 */
    b[0].m = 0xbc00; /* -1.0 */
    b[1].d = 0x3c00; /* 1.0 */
    b[1].m = 0x4200; /* 3.0 */
    for (int j = 0; j < 16; j++) {
        b[0].qs[j] = (uint8_t)(j | (j << 4));
        b[1].qs[j] = 0xf0; /* low 0, high 15 */
    }
    float out[2 * QK];
    qtype_dequantize_row(QTYPE_Q4_1, b, out, 2 * QK);
    for (int j = 0; j < 16; j++) {
        ck_assert_float_eq(out[j], 0.25f * (float)j - 1.0f);
        ck_assert_float_eq(out[j + 16], 0.25f * (float)j - 1.0f);
        ck_assert_float_eq(out[QK + j], 3.0f);
        ck_assert_float_eq(out[QK + j + 16], 18.0f);
    }
}
END_TEST

START_TEST(f16_f32_rows)
{
    uint16_t h[4] = {0x3c00, 0xbc00, 0x0000, 0x4400};
    float out[4];
    qtype_dequantize_row(QTYPE_F16, h, out, 4);
    ck_assert_float_eq(out[0], 1.0f);
    ck_assert_float_eq(out[1], -1.0f);
    ck_assert_float_eq(out[2], 0.0f);
    ck_assert_float_eq(out[3], 4.0f);
    float f[3] = {1.5f, -2.25f, 3.0f}, g[3];
    qtype_dequantize_row(QTYPE_F32, f, g, 3);
    ck_assert_mem_eq(f, g, sizeof f);
}
END_TEST

START_TEST(sizes_and_names)
{
    ck_assert_uint_eq(qtype_row_bytes(QTYPE_Q4_1, 576), 18 * 20);
    ck_assert_uint_eq(qtype_row_bytes(QTYPE_Q8_0, 64), 68);
    ck_assert_uint_eq(qtype_row_bytes(QTYPE_F16, 10), 20);
    ck_assert_str_eq(qtype_name(QTYPE_Q4_1), "Q4_1");
    ck_assert_int_eq(qtype_from_name("q8_0"), QTYPE_Q8_0);
    ck_assert_int_eq(qtype_from_name("q5_k"), -1);
    ck_assert(!qtype_supported(12)); /* Q4_K */
    ck_assert(qtype_supported(QTYPE_BF16));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("dequantize");
    tcase_add_test(tc, fp16_known_values);
    tcase_add_test(tc, fp16_roundtrip_all);
    tcase_add_test(tc, bf16_known);
    tcase_add_test(tc, q8_0_block);
    tcase_add_test(tc, q4_0_block);
    tcase_add_test(tc, q4_1_block);
    tcase_add_test(tc, f16_f32_rows);
    tcase_add_test(tc, sizes_and_names);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
