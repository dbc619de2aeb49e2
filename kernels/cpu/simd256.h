/* simd256: AVX2 helpers shared by the AVX2 kernel files (static inline, compiled with each
 * caller's target attribute). */
#ifndef QUERN_SIMD256_H
#define QUERN_SIMD256_H

#include <immintrin.h>

#include "simd_fold.h"

#define TGT256    __attribute__((target("avx2,fma,f16c")))
#define INLINE256 static inline __attribute__((always_inline))

/* exp(x) to ~2 ulp (Cephes' expf polynomial); 2^n is built in the exponent field, so x is
 * clamped to where n stays in the normal range */
TGT256 INLINE256 __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

TGT256 INLINE256 float hsum8(__m256 v)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

TGT256 INLINE256 float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

TGT256 INLINE256 __m256 fold256(__m256 a, __m256 b, const enum simd_fold op)
{
    if (op == SIMD_FOLD_MAX) return _mm256_max_ps(a, b);
    if (op == SIMD_FOLD_ADD_I32)
        return _mm256_castsi256_ps(
            _mm256_add_epi32(_mm256_castps_si256(a), _mm256_castps_si256(b)));
    return _mm256_add_ps(a, b);
}

/* Lane k of the result: the 8 lanes of v[k] folded by op, for 8 vectors at once, by one fixed
 * tree (neighbours, then pairs within 128-bit lanes, then across them): the order a float sum
 * takes, the same for every k. */
TGT256 INLINE256 __m256 fold8x8(const __m256 v[8], const enum simd_fold op)
{
    __m256 u[4];
    for (int i = 0; i < 4; i++)
        u[i] = fold256(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                       _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]), op);
    __m256 w0 = fold256(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)), op);
    __m256 w1 = fold256(_mm256_shuffle_ps(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm256_shuffle_ps(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)), op);
    return fold256(_mm256_permute2f128_ps(w0, w1, 0x20), _mm256_permute2f128_ps(w0, w1, 0x31), op);
}

/* s[k] = sum of the 8 lanes of v[k], for 8 vectors at once */
TGT256 INLINE256 __m256 hsum8x8(const __m256 v[8])
{
    return fold8x8(v, SIMD_FOLD_ADD);
}

TGT256 INLINE256 int32_t hsum8i(__m256i v)
{
    __m128i m = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return _mm_cvtsi128_si32(m);
}

/* cap tanh(x / cap), as simd512.h's softcap512 */
TGT256 INLINE256 __m256 softcap256(__m256 x, float cap)
{
    __m256 e = exp256(_mm256_mul_ps(x, _mm256_set1_ps(2.0f / cap)));
    __m256 t =
        _mm256_sub_ps(_mm256_set1_ps(1.0f),
                      _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    return _mm256_mul_ps(t, _mm256_set1_ps(cap));
}

#endif
