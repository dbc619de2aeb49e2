/* AVX-512 row kernels: RMSNorm, add, SiLU*up, RoPE and attention.
 *
 * Attention (one token, one head) runs the online softmax over chunks of 16 keys whose bounds
 * are fixed by position (0..15, 16..31, ...): 16 dot products are reduced together by a
 * transpose-and-add tree, one vector exp gives the 16 weights, and the running maximum, sum and
 * output are rescaled once per chunk. The order is fixed by the token's position and the head
 * size alone; it differs from ref_attention_one (key by key) only by rounding. */
#include <immintrin.h>
#include <math.h>

#include "kern.h"

#define TGT    __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* exp(x) to ~2 ulp: Cephes' expf polynomial after x = n ln2 + r, scaled by 2^n (vscalefps) */
TGT INLINE __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)),
                      _mm512_set1_ps(-103.0f));
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

TGT void avx512_rmsnorm(float *out, const float *x, const float *w, int dim, float eps)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int j = 0;
    for (; j + 16 <= dim; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; j < dim; j++) ss += (double)x[j] * x[j];
    float scale = (float)(1.0 / sqrt(ss / dim + eps));
    __m512 vs = _mm512_set1_ps(scale);
    for (j = 0; j + 16 <= dim; j += 16)
        _mm512_storeu_ps(out + j,
                         _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + j), vs),
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
        _mm512_mask_storeu_ps(x + i, m,
                              _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i),
                                            _mm512_maskz_loadu_ps(m, y + i)));
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
        _mm512_mask_storeu_ps(g + i, m,
                              silu_mul16(_mm512_maskz_loadu_ps(m, g + i),
                                         _mm512_maskz_loadu_ps(m, u + i)));
    }
}

TGT void avx512_rope(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
                     const float *cs_sin)
{
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * (size_t)head_dim;
        for (int d = 0; d < rot_dim; d += 16) {
            __mmask16 m = rot_dim - d >= 16 ? (__mmask16)0xffff
                                            : (__mmask16)((1u << (rot_dim - d)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m, v + d);
            __m512 sw = _mm512_permute_ps(a, 0xb1); /* (x[2i+1], x[2i]) */
            /* a*cos + swapped*sin, both products rounded first: ref_rope's arithmetic */
            __m512 r = _mm512_add_ps(_mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, cs_cos + d)),
                                     _mm512_mul_ps(sw, _mm512_maskz_loadu_ps(m, cs_sin + d)));
            _mm512_mask_storeu_ps(v + d, m, r);
        }
    }
}

/* s[k] = sum of the 16 lanes of v[k], for 16 vectors at once */
TGT INLINE __m512 hsum16x16(const __m512 v[16])
{
    __m512 u[8], w[4];
    for (int i = 0; i < 8; i++)
        u[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
}

#define CHUNK 16

TGT INLINE void attn_head(float *out, const float *q, const float *k_cache,
                          const float *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t, int h, const int NV)
{
    const int hd = NV * 16, kv_dim = s->n_kv_heads * hd, bs = b->block_size;
    const int kvh = h / (s->n_heads / s->n_kv_heads);
    const float *qh = q + ((size_t)t * (size_t)s->n_heads + (size_t)h) * (size_t)hd;
    const int32_t *table = b->block_table + (size_t)b->seq[t] * (size_t)b->max_blocks;
    const int pos = b->pos[t];
    __m512 qv[8], acc[8];
    for (int v = 0; v < NV; v++) {
        qv[v] = _mm512_loadu_ps(qh + 16 * v);
        acc[v] = _mm512_setzero_ps();
    }
    float m = -INFINITY, l = 0;
    for (int j0 = 0; j0 <= pos; j0 += CHUNK) {
        int cnt = pos + 1 - j0 < CHUNK ? pos + 1 - j0 : CHUNK;
        const float *kp[CHUNK], *vp[CHUNK];
        __m512 part[CHUNK];
        for (int k = 0; k < CHUNK; k++) {
            part[k] = _mm512_setzero_ps();
            if (k >= cnt) continue;
            int j = j0 + k;
            size_t off = ((size_t)table[j / bs] * (size_t)bs + (size_t)(j % bs)) * (size_t)kv_dim +
                         (size_t)kvh * (size_t)hd;
            kp[k] = k_cache + off;
            vp[k] = v_cache + off;
            part[k] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kp[k]));
            for (int v = 1; v < NV; v++)
                part[k] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kp[k] + 16 * v), part[k]);
        }
        __mmask16 valid = (__mmask16)((1u << cnt) - 1);
        __m512 sc = _mm512_mul_ps(hsum16x16(part), _mm512_set1_ps(s->scale));
        sc = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, sc);
        float mc = _mm512_reduce_max_ps(sc);
        float mnew = mc > m ? mc : m;
        __m512 e = exp512(_mm512_sub_ps(_mm512_mask_mov_ps(sc, 1, _mm512_set1_ps(m)),
                                        _mm512_set1_ps(mnew)));
        float corr = _mm512_cvtss_f32(e); /* exp(m - mnew): lane 0 carried m */
        __m512 p = exp512(_mm512_sub_ps(sc, _mm512_set1_ps(mnew)));
        p = _mm512_maskz_mov_ps(valid, p);
        l = l * corr + _mm512_reduce_add_ps(p);
        float pk[CHUNK];
        _mm512_storeu_ps(pk, p);
        __m512 vc = _mm512_set1_ps(corr);
        for (int v = 0; v < NV; v++) acc[v] = _mm512_mul_ps(acc[v], vc);
        for (int k = 0; k < cnt; k++) {
            __m512 pv = _mm512_set1_ps(pk[k]);
            for (int v = 0; v < NV; v++)
                acc[v] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vp[k] + 16 * v), acc[v]);
        }
        m = mnew;
    }
    float *oh = out + ((size_t)t * (size_t)s->n_heads + (size_t)h) * (size_t)hd;
    __m512 vl = _mm512_set1_ps(l);
    for (int v = 0; v < NV; v++) _mm512_storeu_ps(oh + 16 * v, _mm512_div_ps(acc[v], vl));
}

TGT void avx512_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const struct attn_batch *b, const struct attn_shape *s, int t, int h)
{
    switch (s->head_dim) {
    case 64: attn_head(out, q, k_cache, v_cache, b, s, t, h, 4); break;
    case 128: attn_head(out, q, k_cache, v_cache, b, s, t, h, 8); break;
    default: ref_attention_one(out, q, k_cache, v_cache, b, s, t, h); break;
    }
}
