/* AVX-512 row kernels: RMSNorm, add, SiLU*up and RoPE (attention is in attn_avx512.c). */
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
