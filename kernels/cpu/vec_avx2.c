/* AVX2 row kernels: RMSNorm, add, SiLU*up, RoPE and attention (see vec_avx512.c; here the
 * attention chunks are 8 keys, the width of a register). */
#include <immintrin.h>
#include <math.h>

#include "kern.h"

#define TGT    __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* exp(x) to ~2 ulp (Cephes' expf polynomial); 2^n is built in the exponent field, so x is
 * clamped to where n stays in the normal range */
TGT INLINE __m256 exp256(__m256 x)
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
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

TGT INLINE float hsum8(__m256 v)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

TGT INLINE float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

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
        _mm256_storeu_ps(out + j,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), vs),
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

/* s[k] = sum of the 8 lanes of v[k], for 8 vectors at once */
TGT INLINE __m256 hsum8x8(const __m256 v[8])
{
    __m256 u[4];
    for (int i = 0; i < 4; i++)
        u[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    __m256 w0 = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 w1 = _mm256_add_ps(_mm256_shuffle_ps(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_permute2f128_ps(w0, w1, 0x20),
                         _mm256_permute2f128_ps(w0, w1, 0x31));
}

#define CHUNK 8

TGT INLINE void attn_head(float *out, const float *q, const float *k_cache,
                          const float *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t, int h, const int NV)
{
    const int hd = NV * 8, kv_dim = s->n_kv_heads * hd, bs = b->block_size;
    const int kvh = h / (s->n_heads / s->n_kv_heads);
    const float *qh = q + ((size_t)t * (size_t)s->n_heads + (size_t)h) * (size_t)hd;
    const int32_t *table = b->block_table + (size_t)b->seq[t] * (size_t)b->max_blocks;
    const int pos = b->pos[t];
    __m256 acc[16];
    for (int v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    float m = -INFINITY, l = 0;
    for (int j0 = 0; j0 <= pos; j0 += CHUNK) {
        int cnt = pos + 1 - j0 < CHUNK ? pos + 1 - j0 : CHUNK;
        const float *vp[CHUNK];
        __m256 part[CHUNK];
        for (int k = 0; k < CHUNK; k++) {
            part[k] = _mm256_setzero_ps();
            if (k >= cnt) continue;
            int j = j0 + k;
            size_t off = ((size_t)table[j / bs] * (size_t)bs + (size_t)(j % bs)) * (size_t)kv_dim +
                         (size_t)kvh * (size_t)hd;
            const float *kp = k_cache + off;
            vp[k] = v_cache + off;
            part[k] = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_loadu_ps(kp));
            for (int v = 1; v < NV; v++)
                part[k] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * v),
                                          _mm256_loadu_ps(kp + 8 * v), part[k]);
        }
        __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), lane));
        __m256 sc = _mm256_mul_ps(hsum8x8(part), _mm256_set1_ps(s->scale));
        sc = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, valid);
        float mc = hmax8(sc);
        float mnew = mc > m ? mc : m;
        float corr = _mm256_cvtss_f32(exp256(_mm256_set1_ps(m - mnew)));
        __m256 p = _mm256_and_ps(exp256(_mm256_sub_ps(sc, _mm256_set1_ps(mnew))), valid);
        l = l * corr + hsum8(p);
        float pk[CHUNK];
        _mm256_storeu_ps(pk, p);
        __m256 vc = _mm256_set1_ps(corr);
        for (int v = 0; v < NV; v++) acc[v] = _mm256_mul_ps(acc[v], vc);
        for (int k = 0; k < cnt; k++) {
            __m256 pv = _mm256_set1_ps(pk[k]);
            for (int v = 0; v < NV; v++)
                acc[v] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vp[k] + 8 * v), acc[v]);
        }
        m = mnew;
    }
    float *oh = out + ((size_t)t * (size_t)s->n_heads + (size_t)h) * (size_t)hd;
    __m256 vl = _mm256_set1_ps(l);
    for (int v = 0; v < NV; v++) _mm256_storeu_ps(oh + 8 * v, _mm256_div_ps(acc[v], vl));
}

TGT void avx2_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                        const struct attn_batch *b, const struct attn_shape *s, int t, int h)
{
    switch (s->head_dim) {
    case 64: attn_head(out, q, k_cache, v_cache, b, s, t, h, 8); break;
    case 128: attn_head(out, q, k_cache, v_cache, b, s, t, h, 16); break;
    default: ref_attention_one(out, q, k_cache, v_cache, b, s, t, h); break;
    }
}
