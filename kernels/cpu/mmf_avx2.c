/* AVX2 matmul for float weights (F32, F16, BF16): the design of mmf_avx512.c with 8-lane
 * accumulators and 2 x 4 tiles (16 registers). */
#include <string.h>

#include "kern.h"
#include "simd256.h"

#define TGT    TGT256
#define INLINE INLINE256

/* 8 weights from k (all 8 exist) */
TGT INLINE __m256 load_w(const void *row, enum qtype type, int64_t k)
{
    switch (type) {
    case QTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
    case QTYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k))),
            16));
    default:
        return _mm256_loadu_ps((const float *)row + k);
    }
}

TGT INLINE float w_at(const void *row, enum qtype type, int64_t k)
{
    switch (type) {
    case QTYPE_F16:
        return fp16_to_f32(((const uint16_t *)row)[k]);
    case QTYPE_BF16:
        return bf16_to_f32(((const uint16_t *)row)[k]);
    default:
        return ((const float *)row)[k];
    }
}

TGT INLINE void float_tile(const struct bweight *w, const float *x, int64_t r0, const int RB,
                           int t0, const int TB, float *y, const enum qtype type)
{
    const int64_t cols = w->cols, full = cols / 8 * 8;
    const size_t rb = qtype_row_bytes(type, (size_t)cols);
    const uint8_t *rows[2];
    for (int i = 0; i < RB; i++) rows[i] = (const uint8_t *)w->host + (size_t)(r0 + i) * rb;
    __m256 acc[2][4];
    for (int i = 0; i < RB; i++)
        for (int t = 0; t < TB; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < full; k += 8) {
        __m256 xv[4];
        for (int t = 0; t < TB; t++)
            xv[t] = _mm256_loadu_ps(x + (size_t)(t0 + t) * (size_t)cols + k);
        for (int i = 0; i < RB; i++) {
            __m256 wv = load_w(rows[i], type, k);
            for (int t = 0; t < TB; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    for (int i = 0; i < RB; i++)
        for (int t = 0; t < TB; t++) {
            const float *xt = x + (size_t)(t0 + t) * (size_t)cols;
            float sum = hsum8(acc[i][t]);
            for (int64_t k = full; k < cols; k++) sum += w_at(rows[i], type, k) * xt[k];
            y[(size_t)(t0 + t) * (size_t)w->rows + (size_t)(r0 + i)] = sum;
        }
}

TGT INLINE void float_rows(const struct bweight *w, const float *x, int64_t r0, int64_t r1, int t0,
                           int t1, float *y, const enum qtype type)
{
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
        int t = t0;
        for (; t + 4 <= t1; t += 4) float_tile(w, x, r, 2, t, 4, y, type);
        for (; t < t1; t++) float_tile(w, x, r, 2, t, 1, y, type);
    }
    for (; r < r1; r++) {
        int t = t0;
        for (; t + 4 <= t1; t += 4) float_tile(w, x, r, 1, t, 4, y, type);
        for (; t < t1; t++) float_tile(w, x, r, 1, t, 1, y, type);
    }
}

TGT void avx2_matmul_float(const struct bweight *w, const float *x, int64_t r0, int64_t r1, int t0,
                           int t1, float *y)
{
    switch (w->type) {
    case QTYPE_F32:
        float_rows(w, x, r0, r1, t0, t1, y, QTYPE_F32);
        break;
    case QTYPE_F16:
        float_rows(w, x, r0, r1, t0, t1, y, QTYPE_F16);
        break;
    case QTYPE_BF16:
        float_rows(w, x, r0, r1, t0, t1, y, QTYPE_BF16);
        break;
    default:
        ref_matmul_rows(w, x + (size_t)t0 * (size_t)w->cols, t1 - t0,
                        y + (size_t)t0 * (size_t)w->rows, r0, r1);
    }
}
