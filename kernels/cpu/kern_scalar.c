/* The scalar table: the reference kernels, plus the few row-level helpers the backend's drivers
 * need in a form the SIMD files also provide. */
#include "attn_rows.h"
#include "kern.h"

void scalar_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum)
{
    ref_quantize_q8(x, cols, q, d, s, sum);
}

void scalar_block_sums(const float *x, int64_t cols, float *xs)
{
    for (int64_t b = 0; b < cols / QK; b++) {
        float acc = 0;
        for (int j = 0; j < QK; j++) acc += x[b * QK + j];
        xs[b] = acc;
    }
}

void scalar_rmsnorm(float *out, const float *x, const float *w, int dim, float eps)
{
    ref_rmsnorm(out, x, w, 1, dim, eps);
}

void scalar_add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void scalar_silu_mul(float *g, const float *u, size_t n)
{
    ref_silu_mul(g, u, n);
}

void scalar_gelu_mul(float *g, const float *u, size_t n)
{
    ref_gelu_mul(g, u, n);
}

void scalar_softcap(float *x, float cap, size_t n)
{
    ref_softcap(x, cap, n);
}

void scalar_rope(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
                 const float *cs_sin)
{
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * (size_t)head_dim;
        for (int d = 0; d < rot_dim; d += 2) {
            float a = v[d], b = v[d + 1];
            v[d] = a * cs_cos[d] + b * cs_sin[d];
            v[d + 1] = b * cs_cos[d + 1] + a * cs_sin[d + 1];
        }
    }
}

void scalar_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                      const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                      int h0, int h1)
{
    attn_ref_heads(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, KV_F32);
}

void scalar_attention_f16(float *out, const float *q, const uint16_t *k_cache,
                          const uint16_t *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t0, int t1, int h0, int h1)
{
    attn_ref_heads(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, KV_F16);
}

void scalar_attention_q8(float *out, const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                         int h0, int h1)
{
    attn_ref_heads(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, KV_Q8);
}

void scalar_to_fp16(const float *x, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = f32_to_fp16(x[i]);
}
