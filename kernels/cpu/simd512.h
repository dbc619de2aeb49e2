/* simd512: AVX-512 helpers shared by the AVX-512 kernel files (static inline, compiled with
 * each caller's target attribute). */
#ifndef QUERN_SIMD512_H
#define QUERN_SIMD512_H

#include <immintrin.h>

#include "simd_fold.h"

#define TGT512    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE512 static inline __attribute__((always_inline))

/* exp(x) to ~2 ulp: Cephes' expf polynomial after x = n ln2 + r, scaled by 2^n (vscalefps).
 * x is clamped below at -87, whose result (1.6e-38) is the smallest normal float it returns:
 * a subnormal result costs a microcode assist on Intel cores (~150 cycles), and attention
 * takes exp(-inf) for every row's first rescale and for the lanes past its last key, which
 * are zeroed after. With a clamp at -103 (results down to 1e-45) those assists were ~13 % of a
 * 512-token prefill's attention samples (perf, Sapphire Rapids). */
TGT512 INLINE512 __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

TGT512 INLINE512 __m512 fold512(__m512 a, __m512 b, const enum simd_fold op)
{
    if (op == SIMD_FOLD_MAX) return _mm512_max_ps(a, b);
    if (op == SIMD_FOLD_ADD_I32)
        return _mm512_castsi512_ps(
            _mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
    return _mm512_add_ps(a, b);
}

/* Lane k of the result: the 16 lanes of v[k] folded by op, for 16 vectors at once, by one fixed
 * tree (neighbours, then pairs within 128-bit lanes, then across them): the order a float sum
 * takes (attention's scores: attn_avx512_body.h), the same for every k. */
TGT512 INLINE512 __m512 fold16x16(const __m512 v[16], const enum simd_fold op)
{
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++)
        t[i] = fold512(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                       _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]), op);
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = fold512(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)), op);
    }
    for (int i = 0; i < 2; i++)
        w[i] = fold512(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                       _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xdd), op);
    return fold512(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd),
                   op);
}

/* cap tanh(x / cap) as cap (1 - 2 / (e^(2x / cap) + 1)): soft-capping (Gemma's logits and
 * attention scores) */
TGT512 INLINE512 __m512 softcap512(__m512 x, float cap)
{
    __m512 e = exp512(_mm512_mul_ps(x, _mm512_set1_ps(2.0f / cap)));
    __m512 t =
        _mm512_sub_ps(_mm512_set1_ps(1.0f),
                      _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    return _mm512_mul_ps(t, _mm512_set1_ps(cap));
}

#endif
