/* AVX-512 matmul for float weights (F32, F16, BF16 rows as the file stores them), used by both
 * precisions: float models are references, and their activations stay float.
 *
 * A tile is 4 rows x 4 tokens: each weight vector serves 4 tokens and each activation vector 4
 * rows. Every (row, token) pair has its own 16-lane accumulator, summed over the columns in
 * order (a masked load for a tail) and then reduced with a fixed tree, so its value does not
 * depend on the tile it falls in. */
#include <string.h>

#include "kern.h"
#include "simd512.h"

#define TGT    TGT512
#define INLINE INLINE512

TGT INLINE __m512 load_w(const void *row, enum qtype type, int64_t k, __mmask16 m)
{
    switch (type) {
    case QTYPE_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
    case QTYPE_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k)), 16));
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    }
}

TGT INLINE void float_tile(const struct bweight *w, const float *x, int64_t r0, const int RB,
                           int t0, const int TB, float *y, const enum qtype type)
{
    const int64_t cols = w->cols;
    const size_t rb = qtype_row_bytes(type, (size_t)cols);
    const uint8_t *rows[4];
    for (int i = 0; i < RB; i++) rows[i] = (const uint8_t *)w->host + (size_t)(r0 + i) * rb;
    __m512 acc[4][4];
    for (int i = 0; i < RB; i++)
        for (int t = 0; t < TB; t++) acc[i][t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < cols; k += 16) {
        __mmask16 m = cols - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - k)) - 1);
        __m512 xv[4];
        for (int t = 0; t < TB; t++)
            xv[t] = _mm512_maskz_loadu_ps(m, x + (size_t)(t0 + t) * (size_t)cols + k);
        for (int i = 0; i < RB; i++) {
            __m512 wv = load_w(rows[i], type, k, m);
            for (int t = 0; t < TB; t++) acc[i][t] = _mm512_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    for (int i = 0; i < RB; i++)
        for (int t = 0; t < TB; t++)
            y[(size_t)(t0 + t) * (size_t)w->rows + (size_t)(r0 + i)] =
                _mm512_reduce_add_ps(acc[i][t]);
}

TGT INLINE void float_rows(const struct bweight *w, const float *x, int64_t r0, int64_t r1, int t0,
                           int t1, float *y, const enum qtype type)
{
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int t = t0;
        for (; t + 4 <= t1; t += 4) float_tile(w, x, r, 4, t, 4, y, type);
        for (; t < t1; t++) float_tile(w, x, r, 4, t, 1, y, type);
    }
    for (; r < r1; r++) {
        int t = t0;
        for (; t + 4 <= t1; t += 4) float_tile(w, x, r, 1, t, 4, y, type);
        for (; t < t1; t++) float_tile(w, x, r, 1, t, 1, y, type);
    }
}

TGT void avx512_matmul_float(const struct bweight *w, const float *x, int64_t r0, int64_t r1,
                             int t0, int t1, float *y)
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
