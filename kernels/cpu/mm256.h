/* mm256: helpers of the 256-bit matmul kernels over the qpack layout (mm_avx2.c, mm_avxvnni.c),
 * which hold a 16-row group as two 8-row halves (a register holds one 4-byte slice of 8 rows).
 * static inline, compiled with each caller's target attribute. */
#ifndef QUERN_MM256_H
#define QUERN_MM256_H

#include <immintrin.h>
#include <string.h>

#include "qpack.h"

#define MM256_TGT    __attribute__((target("avx2,fma,f16c")))
#define MM256_INLINE static inline __attribute__((always_inline))
#define MM256_HALF   8 /* rows per register */

/* The 4 activation bytes at p in every dword. */
MM256_TGT MM256_INLINE __m256i mm256_bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* The constant the unsigned weights carry: w = stored - offset. */
MM256_INLINE int32_t mm256_type_offset(enum qpack_layout type)
{
    return type == QPACK_Q8_0 ? 128 : type == QPACK_Q4_0 ? 8 : type == QPACK_Q5_0 ? 16 : 0;
}

/* 16 in each byte of half h of a QPACK_Q5_0 block's operand register k whose fifth bit is set,
 * 0 in the others (qpack.h: bits 32h..32h+31 of word k): each byte picks its bit's byte of the
 * 32, ORs in every other bit, and compares with all ones. */
MM256_TGT MM256_INLINE __m256i mm256_fifth_bits(const uint8_t *qs, int k, int h)
{
    int32_t bits;
    memcpy(&bits, qs + QPACK_Q5_BITS_OFFSET + 8 * k + 4 * h, sizeof bits);
    const __m256i pick =
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i others = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    __m256i v = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(bits), pick), others);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(-1)), _mm256_set1_epi8(16));
}

/* Rows of half h of group g that exist (0..8). */
MM256_INLINE int mm256_half_rows(const struct qpack *w, int64_t g, int h)
{
    int64_t left = w->rows - (g * QPACK_ROWS + h * MM256_HALF);
    return left <= 0 ? 0 : left >= MM256_HALF ? MM256_HALF : (int)left;
}

/* yt[r0 .. r0 + valid) = the first `valid` lanes of v. */
MM256_TGT MM256_INLINE void mm256_store_half(float *yt, int64_t r0, int valid, __m256 v)
{
    if (valid == MM256_HALF) {
        _mm256_storeu_ps(yt + r0, v);
        return;
    }
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(yt + r0, _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lane), v);
}

#endif
