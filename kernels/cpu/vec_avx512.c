/* AVX-512 row kernels: RMSNorm, add, SiLU*up, GELU*up, soft-capping and RoPE (attention is in
 * attn_avx512.c). */
#include <math.h>

#include "kern.h"
#include "simd512.h"

#define TGT    TGT512
#define INLINE INLINE512

TGT void avx512_rmsnorm(float *out, const float *x, const float *w, int dim, float eps)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int j = 0;
    for (; j + 16 <= dim; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; j < dim; j++) ss += (double)x[j] * x[j];
    float scale = (float)(1.0 / sqrt(ss / dim + eps));
    __m512 vs = _mm512_set1_ps(scale);
    for (j = 0; j + 16 <= dim; j += 16)
        _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + j), vs),
                                                _mm512_loadu_ps(w + j)));
    for (; j < dim; j++) out[j] = x[j] * scale * w[j];
}

TGT void avx512_add(float *x, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(
            x + i, m,
            _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

TGT INLINE __m512 silu_mul16(__m512 g, __m512 u)
{
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

TGT void avx512_silu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(g + i, silu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(
            g + i, m, silu_mul16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* gelu(g) * u as vec_avx2.c's gelu_mul8 */
TGT INLINE __m512 gelu_mul16(__m512 g, __m512 u)
{
    const __m512 c2 = _mm512_set1_ps(-2.0f * 0.7978845608028654f), k = _mm512_set1_ps(0.044715f);
    __m512 z = _mm512_mul_ps(c2, _mm512_fmadd_ps(_mm512_mul_ps(k, g), _mm512_mul_ps(g, g), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(z))), u);
}

TGT void avx512_gelu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(g + i, gelu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(
            g + i, m, gelu_mul16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

TGT void avx512_softcap(float *x, float cap, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, softcap512(_mm512_loadu_ps(x + i), cap));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, softcap512(_mm512_maskz_loadu_ps(m, x + i), cap));
    }
}

TGT void avx512_rope(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
                     const float *cs_sin)
{
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * (size_t)head_dim;
        for (int d = 0; d < rot_dim; d += 16) {
            __mmask16 m =
                rot_dim - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (rot_dim - d)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m, v + d);
            __m512 sw = _mm512_permute_ps(a, 0xb1); /* (x[2i+1], x[2i]) */
            /* a*cos + swapped*sin, both products rounded first: ref_rope's arithmetic */
            __m512 r = _mm512_add_ps(_mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, cs_cos + d)),
                                     _mm512_mul_ps(sw, _mm512_maskz_loadu_ps(m, cs_sin + d)));
            _mm512_mask_storeu_ps(v + d, m, r);
        }
    }
}

TGT void avx512_to_fp16(const float *x, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(
            (__m256i *)(out + i),
            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) out[i] = f32_to_fp16(x[i]);
}

/* roundf(v), half away from zero, for |v| < 2^23: v - trunc(v) is exact, so comparing it with
 * one half decides as roundf does */
TGT INLINE __m512 round_away16(__m512 v)
{
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up =
        _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
    __m512 one = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x3f800000)));
    return _mm512_mask_add_ps(t, up, t, one);
}

TGT void avx512_quantize_kv_q8(const float *x, struct block_q8_0 *y, size_t n)
{
    for (size_t b = 0; b < n / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 vid = _mm512_set1_ps(id);
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(
                                                 round_away16(_mm512_mul_ps(v0, vid)))));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(
                                                        round_away16(_mm512_mul_ps(v1, vid)))));
    }
}
