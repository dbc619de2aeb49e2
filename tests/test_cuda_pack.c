/* The CUDA backend's weight layout (kernels/cuda/cuda_pack.h), on the host: no GPU needed, so CI
 * runs it wherever the CUDA backend is built. Every row of every type round-trips through the
 * packed copy, the parts are 256-byte aligned with 16-byte aligned blocks and rows, and shapes the
 * kernels cannot take are refused. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda/cuda_pack.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

START_TEST(pack_roundtrip_every_type)
{
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q8_0,
                                QTYPE_F16,  QTYPE_BF16, QTYPE_F32};
    const int64_t rows[] = {1, 3, 17, 100};
    const int64_t cols[] = {32, 96, 576, 7, 100};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
                enum qtype t = types[ti];
                struct cuda_pack_layout L;
                struct qerr err = {0};
                int rc = cuda_pack_plan(t, rows[ri], cols[ci], &L, &err);
                if (cuda_pack_is_quant(t) && cols[ci] % QK) {
                    ck_assert_int_eq(rc, QERR_INVALID);
                    continue;
                }
                ck_assert_msg(rc == 0, "%s", err.msg);
                ck_assert_int_eq(L.qs_off % 256, 0);
                ck_assert_int_eq(L.sc_off % 256, 0);
                ck_assert_int_eq(L.total % 256, 0);
                ck_assert_uint_ge(L.sc_off, L.qs_off + L.qs_bytes);
                ck_assert_uint_ge(L.total, L.sc_off + L.sc_bytes);
                if (cuda_pack_is_quant(t)) {
                    ck_assert_int_eq(L.nb * QK, cols[ci]);
                    ck_assert_int_eq(L.qs_block % 16, 0);
                } else {
                    ck_assert_int_eq(L.row_elems % 8, 0);
                    ck_assert_int_eq(L.row_elems * (int64_t)qtype_block_bytes(t) % 16, 0);
                }
                size_t rb = qtype_row_bytes(t, (size_t)cols[ci]), bytes = rb * (size_t)rows[ri];
                uint8_t *src = malloc(bytes), *packed = malloc(L.total), *row = malloc(rb);
                for (size_t i = 0; i < bytes; i++) src[i] = (uint8_t)rnd();
                memset(packed, 0xa5, L.total);
                cuda_pack_weight(&L, src, packed);
                for (int64_t r = 0; r < rows[ri]; r++) {
                    cuda_pack_unpack_row(&L, packed, r, row);
                    ck_assert_msg(!memcmp(row, src + (size_t)r * rb, rb),
                                  "%s %lld x %lld: row %lld does not round-trip", qtype_name(t),
                                  (long long)rows[ri], (long long)cols[ci], (long long)r);
                }
                /* float rows are zero-padded: the GEMV reads whole 8-element chunks */
                if (!cuda_pack_is_quant(t)) {
                    size_t eb = qtype_block_bytes(t);
                    for (int64_t r = 0; r < rows[ri]; r++)
                        for (int64_t j = cols[ci]; j < L.row_elems; j++)
                            for (size_t k = 0; k < eb; k++)
                                ck_assert_int_eq(
                                    packed[((size_t)r * (size_t)L.row_elems + (size_t)j) * eb + k],
                                    0);
                }
                free(src);
                free(packed);
                free(row);
            }
}
END_TEST

START_TEST(pack_layout_of_q4_1)
{
    /* one row of two blocks: quants contiguous, (d, m) packed as d | m << 16 */
    struct block_q4_1 b[2];
    for (int i = 0; i < 2; i++) {
        b[i].d = (uint16_t)(0x1000 + i);
        b[i].m = (uint16_t)(0x2000 + i);
        for (int j = 0; j < QK / 2; j++) b[i].qs[j] = (uint8_t)(16 * i + j);
    }
    struct cuda_pack_layout L;
    struct qerr err = {0};
    ck_assert_int_eq(cuda_pack_plan(QTYPE_Q4_1, 1, 64, &L, &err), 0);
    uint8_t *p = malloc(L.total);
    cuda_pack_weight(&L, b, p);
    for (int j = 0; j < QK; j++) ck_assert_int_eq(p[L.qs_off + (size_t)j], j);
    uint32_t dm[2];
    memcpy(dm, p + L.sc_off, sizeof dm);
    ck_assert_uint_eq(dm[0], 0x20001000u);
    ck_assert_uint_eq(dm[1], 0x20011001u);
    free(p);
}
END_TEST

START_TEST(pack_refuses_bad_weights)
{
    struct cuda_pack_layout L;
    struct qerr err = {0};
    ck_assert_int_eq(cuda_pack_plan((enum qtype)13, 4, 64, &L, &err), QERR_UNSUPPORTED);
    ck_assert_int_eq(cuda_pack_plan(QTYPE_Q8_0, 4, 48, &L, &err), QERR_INVALID);
    ck_assert_int_eq(cuda_pack_plan(QTYPE_F32, 0, 64, &L, &err), QERR_INVALID);
    ck_assert_int_eq(cuda_pack_plan(QTYPE_F16, 4, 0, &L, &err), QERR_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda_pack");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, pack_roundtrip_every_type);
    tcase_add_test(tc, pack_layout_of_q4_1);
    tcase_add_test(tc, pack_refuses_bad_weights);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
