/* ref: scalar reference kernels. They define the semantics every fast kernel (CPU SIMD or CUDA)
 * is tested against, and they are what the CPU backend runs where no faster kernel exists.
 * Each works on a slice (rows, tokens or heads) so the backend can split it across threads. */
#ifndef QUERN_REF_H
#define QUERN_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../backend.h"

/* A KV cache's element: fp32, fp16, or Q8_0 blocks (quant/qtypes.h: an fp16 scale d then 32
 * int8 q, 34 bytes for 32 elements; x = d * q, exact in float). A cache is addressed in units:
 * elements, or for KV_Q8 bytes; a kv head's row (head_dim a multiple of 32) is whole blocks. */
enum kv_kind { KV_F32 = 0, KV_F16 = 1, KV_Q8 = 2 };

/* Units of n consecutive elements (n a multiple of 32 for KV_Q8). */
static inline size_t kv_units(enum kv_kind k, size_t n)
{
    return k == KV_Q8 ? n / 32 * 34 : n;
}

/* Element e's place in the Q8_0 row at byte offset row: its int8 (the next ones of its block
 * follow it) and, in *d, its block's fp16 scale; the element is fp16_to_f32(*d) * q. */
static inline const int8_t *kv_q8_at(const void *cache, size_t row, int e, uint16_t *d)
{
    const uint8_t *blk = (const uint8_t *)cache + row + (size_t)(e / 32) * 34;
    memcpy(d, blk, sizeof *d);
    return (const int8_t *)blk + 2 + e % 32;
}

/* Bytes of one unit. */
static inline size_t kv_unit_bytes(enum kv_kind k)
{
    return k == KV_F32 ? 4 : k == KV_F16 ? 2 : 1;
}

/* Dot product of a quantized row (cols elements of type t) with float x, in a fixed order:
 * 16 interleaved partial sums, summed pairwise at the end. */
float ref_dot_row(enum qtype t, const void *row, const float *x, int64_t cols);

/* y[i][r] = dot(row r of w, x[i]) for rows [r0, r1) and all n tokens. */
void ref_matmul_rows(const struct bweight *w, const float *x, int n, float *y, int64_t r0,
                     int64_t r1);

void ref_embed(const struct bweight *table, const int32_t *tokens, int n, float *out);
void ref_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);
void ref_rope(float *x, const int32_t *pos, int n, int n_heads, int head_dim,
              const struct rope_spec *rs);
void ref_kv_write(float *k_cache, float *v_cache, const float *k, const float *v,
                  const struct attn_batch *b, int kv_dim);
/* The same into an fp16 cache (f32_to_fp16: nearest even). */
void ref_kv_write_f16(uint16_t *k_cache, uint16_t *v_cache, const float *k, const float *v,
                      const struct attn_batch *b, int kv_dim);
/* The same into a Q8_0 cache: each token's kv_dim elements (a multiple of 32) as
 * quantize_row_q8_0 makes them (quant/quantize.h). */
void ref_kv_write_q8(uint8_t *k_cache, uint8_t *v_cache, const float *k, const float *v,
                     const struct attn_batch *b, int kv_dim);
/* Attention for token t, head h only. */
void ref_attention_one(float *out, const float *q, const float *k_cache, const float *v_cache,
                       const struct attn_batch *b, const struct attn_shape *s, int t, int h);
/* The same over an fp16 cache, each element widened to float as it is read. */
void ref_attention_one_f16(float *out, const float *q, const uint16_t *k_cache,
                           const uint16_t *v_cache, const struct attn_batch *b,
                           const struct attn_shape *s, int t, int h);
/* The same over a Q8_0 cache, each element dequantized (exactly) as it is read. */
void ref_attention_one_q8(float *out, const float *q, const uint8_t *k_cache,
                          const uint8_t *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t, int h);
void ref_silu_mul(float *g, const float *u, size_t n);
/* backend.h's gelu_mul, scale and softcap, element by element with libm's tanhf. */
void ref_gelu_mul(float *g, const float *u, size_t n);
void ref_scale(float *x, float s, size_t n);
void ref_softcap(float *x, float cap, size_t n);
/* backend.h's moe_combine. */
void ref_moe_combine(float *out, const float *y, const int32_t *rows, const float *w, int n, int k,
                     int dim);

/* MATMUL_Q8: activations quantized per 32-element block, as llama.cpp's q8_1 does but with fp32
 * scales. For a block x[32]: d = max|x| / 127, q = round-half-even(x / d) (x * (1/d) when d > 0,
 * else 0), sum = the sum of q, s = d * sum. Token i's row starts at q + i * cols and at
 * d, s, sum + i * nb. */
struct q8act {
    int64_t cols, nb; /* elements and 32-blocks per token */
    int8_t *q;        /* [n][cols] */
    float *d;         /* [n][nb] */
    float *s;         /* [n][nb] d * sum (Q4_1's minimum term) */
    int32_t *sum;     /* [n][nb] */
};

void ref_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum);

/* The Q8 dot product of a quantized row (Q8_0, Q4_0 or Q4_1, the file's layout) with one
 * quantized token. Every 32-block contributes an exact integer dot product, folded into one float
 * accumulator block by block in order (fma = one rounding):
 *   Q8_0: acc = fma(dw * dx, (float)sum(w * q), acc)
 *   Q4_0: acc = fma(dw * dx, (float)sum((nib - 8) * q), acc)
 *   Q4_1: acc = fma(dw * dx, (float)sum(nib * q), acc); acc = fma(mw, s, acc)
 * The SIMD kernels reproduce this bit for bit, so every ISA gives the same Q8 result. */
float ref_dot_q8(enum qtype t, const void *row, const struct q8act *a, int token);
/* y[i][r] = ref_dot_q8(row r, token i) for rows [r0, r1) and all n tokens. */
void ref_matmul_q8_rows(const struct bweight *w, const struct q8act *a, int n, float *y, int64_t r0,
                        int64_t r1);
/* True for the weight types the Q8 path handles (the rest run the float path). */
bool ref_q8_type(enum qtype t);

#endif
