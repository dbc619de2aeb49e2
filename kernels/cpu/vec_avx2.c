/* AVX2 row kernels: RMSNorm, add, SiLU*up, GELU*up, soft-capping and RoPE (attention is in
 * attn_avx2.c). */
#include <math.h>

#include "kern.h"
#include "simd256.h"

#define TGT    TGT256
#define INLINE INLINE256

TGT void avx2_rmsnorm(float *out, const float *x, const float *w, int dim, float eps)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int j = 0;
    for (; j + 8 <= dim; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; j < dim; j++) ss += (double)x[j] * x[j];
    float scale = (float)(1.0 / sqrt(ss / dim + eps));
    __m256 vs = _mm256_set1_ps(scale);
    for (j = 0; j + 8 <= dim; j += 8)
        _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), vs),
                                                _mm256_loadu_ps(w + j)));
    for (; j < dim; j++) out[j] = x[j] * scale * w[j];
}

TGT void avx2_add(float *x, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) x[i] += y[i];
}

TGT void avx2_silu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 r = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
    }
    if (i < n) ref_silu_mul(g + i, u + i, n - i);
}

/* gelu(g) * u, gelu's tanh form as a sigmoid: 0.5 (1 + tanh(z)) = 1 / (1 + e^(-2z)), which has
 * no cancellation where tanh(z) nears -1 (the reference's 1 + tanh(z) loses digits there). */
TGT INLINE __m256 gelu_mul8(__m256 g, __m256 u)
{
    const __m256 c2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
    __m256 z = _mm256_mul_ps(c2, _mm256_fmadd_ps(_mm256_mul_ps(k, g), _mm256_mul_ps(g, g), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(z))), u);
}

/* A tail of fewer than 8 runs through the same arithmetic in a padded register, so an element's
 * value never depends on where a call's span ends. */
TGT void avx2_gelu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, gelu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        _Alignas(32) float gt[8] = {0}, ut[8] = {0};
        for (size_t j = i; j < n; j++) {
            gt[j - i] = g[j];
            ut[j - i] = u[j];
        }
        _mm256_store_ps(gt, gelu_mul8(_mm256_load_ps(gt), _mm256_load_ps(ut)));
        for (size_t j = i; j < n; j++) g[j] = gt[j - i];
    }
}

TGT void avx2_softcap(float *x, float cap, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, softcap256(_mm256_loadu_ps(x + i), cap));
    if (i < n) {
        _Alignas(32) float t[8] = {0};
        for (size_t j = i; j < n; j++) t[j - i] = x[j];
        _mm256_store_ps(t, softcap256(_mm256_load_ps(t), cap));
        for (size_t j = i; j < n; j++) x[j] = t[j - i];
    }
}

TGT void avx2_rope(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
                   const float *cs_sin)
{
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * (size_t)head_dim;
        int d = 0;
        for (; d + 8 <= rot_dim; d += 8) {
            __m256 a = _mm256_loadu_ps(v + d);
            __m256 sw = _mm256_permute_ps(a, 0xb1); /* (x[2i+1], x[2i]) */
            __m256 r = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(cs_cos + d)),
                                     _mm256_mul_ps(sw, _mm256_loadu_ps(cs_sin + d)));
            _mm256_storeu_ps(v + d, r);
        }
        for (; d < rot_dim; d += 2) {
            float a = v[d], b = v[d + 1];
            v[d] = a * cs_cos[d] + b * cs_sin[d];
            v[d + 1] = b * cs_cos[d + 1] + a * cs_sin[d + 1];
        }
    }
}

TGT void avx2_to_fp16(const float *x, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(
            (__m128i *)(out + i),
            _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) out[i] = f32_to_fp16(x[i]);
}

/* roundf(v), half away from zero, for |v| < 2^23 (round_away16 in vec_avx512.c) */
TGT INLINE __m256 round_away8(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f),
                              _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

TGT void avx2_quantize_kv_q8(const float *x, struct block_q8_0 *y, size_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / 32; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float d = _mm_cvtss_f32(h) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvttps_epi32(round_away8(_mm256_mul_ps(v[i], vid)));
        /* packs work within 128-bit lanes: the 32 bytes come out in dword order 0 2 4 6 1 3 5 7 */
        __m256i w =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, w);
    }
}
