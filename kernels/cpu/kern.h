/* kern: the table of CPU kernels for one instruction set. The backend picks a table once, at
 * create, from the ISA it resolved (cpu_isa.h); every op then calls through it. One table per ISA
 * and one file per ISA and job (mm_avx512.c, vec_avx512.c, ...), instead of #ifdef forks.
 *
 * Semantics (what the tests hold each table to):
 *   quantize_q8   bit-identical to ref_quantize_q8 on every ISA
 *   matmul_q8     bit-identical to ref_matmul_q8_rows on every ISA
 *   matmul_f32    within ~1e-5 (relative to sum |w x|) of ref_matmul_rows; its own fixed order
 *   matmul_float  the same, for float weights
 *   rope          bit-identical to ref_rope (it reads a cos/sin table built as ref_rope does)
 *   the rest      within ~1e-5 of their ref_* function, in an order fixed by the shapes
 * and every kernel computes a token's output from that token's inputs alone, the same way
 * whatever tile, chunk or thread it runs in: batch- and thread-count invariance follow. */
#ifndef QUERN_KERN_H
#define QUERN_KERN_H

#include "attn_part.h"
#include "cpu_isa.h"
#include "qpack.h"
#include "ref.h"

/* From this many tokens a matmul_q8 call takes row groups two at a time where its ISA can (the
 * AVX-512 tile, mm_avx512.c): cpu_matmul hands such calls whole pairs. */
#define KERN_PAIR_MIN_TOKENS 8

struct cpu_kernels {
    enum cpu_isa isa;
    /* One token row of cols (a multiple of 32) into q[cols], d/s/sum[cols / 32]. */
    void (*quantize_q8)(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum);
    /* Sums of each 32-block of one token row (the float path's Q4_1 minimum term). */
    void (*block_sums)(const float *x, int64_t cols, float *xs);
    /* y[t][r] (row stride w->rows) for the rows of groups [g0, g1) and tokens [t0, t1). The
     * weight prefetch (pf_walk.h) runs on to group gp (>= g1), where the caller reads next, so a
     * run of calls over consecutive groups streams as one call would. NULL in the scalar table,
     * which runs the reference on the file's layout instead. */
    void (*matmul_q8)(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                      int64_t gp, int t0, int t1, float *y);
    /* The float path on the packed layout: x[n][cols], xs[n][nb] from block_sums (Q4_1); gp as
     * matmul_q8's. */
    void (*matmul_f32)(const struct qpack *w, const float *x, const float *xs, int64_t g0,
                       int64_t g1, int64_t gp, int t0, int t1, float *y);
    /* Float weights (F32/F16/BF16, the file's rows): y for rows [r0, r1) and tokens [t0, t1).
     * NULL in the scalar table (ref_matmul_rows). */
    void (*matmul_float)(const struct bweight *w, const float *x, int64_t r0, int64_t r1, int t0,
                         int t1, float *y);
    /* One row: out[dim] = x / rms(x) * w (out may alias x). */
    void (*rmsnorm)(float *out, const float *x, const float *w, int dim, float eps);
    void (*add)(float *x, const float *y, size_t n);
    void (*silu_mul)(float *g, const float *u, size_t n);
    /* backend.h's gelu_mul and softcap on a span of elements, each element's value whatever the
     * span (a SIMD tail runs the same arithmetic) */
    void (*gelu_mul)(float *g, const float *u, size_t n);
    void (*softcap)(float *x, float cap, size_t n);
    /* One token: rotates n_heads heads of x by the table row cs (cos, -sin / sin pairs, see
     * rope_table in cpu_ops.c): x[2i] = x[2i] c - x[2i+1] s, x[2i+1] = x[2i+1] c + x[2i] s. */
    void (*rope)(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
                 const float *cs_sin);
    /* Tokens [t0, t1) of the batch x query heads [h0, h1) (all of them: the tokens' KV slots
     * read whole, once; else kv head by kv head), each as ref_attention_one; a row's result is
     * the same bits whichever range the call names. */
    void (*attention)(float *out, const float *q, const float *k_cache, const float *v_cache,
                      const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                      int h0, int h1);
    /* The same over an fp16 cache: each element read is widened to float (exactly), then the
     * arithmetic of attention: bit-identical to attention on a float cache of those values. */
    void (*attention_f16)(float *out, const float *q, const uint16_t *k_cache,
                          const uint16_t *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t0, int t1, int h0, int h1);
    /* The same over a Q8_0 cache (ref.h, enum kv_kind): each element read is dequantized (d * q,
     * exact in float): bit-identical to attention on a float cache of the dequantized values. */
    void (*attention_q8)(float *out, const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                         int h0, int h1);
    /* attention, attention_f16 and attention_q8 for partitions [pp->p0, pp->p1) of each row
     * (attn_part.h): each partition's record written to pp->buf, nothing to out; a row of more than
     * ATTN_PART keys gets the bits attention gives it once attn_parts_combine folds every record.
     * NULL in the scalar table (the reference runs rows whole). */
    void (*attention_part)(float *out, const float *q, const float *k_cache, const float *v_cache,
                           const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                           int h0, int h1, const struct attn_parts *pp);
    void (*attention_f16_part)(float *out, const float *q, const uint16_t *k_cache,
                               const uint16_t *v_cache, const struct attn_batch *b,
                               const struct attn_shape *s, int t0, int t1, int h0, int h1,
                               const struct attn_parts *pp);
    void (*attention_q8_part)(float *out, const float *q, const uint8_t *k_cache,
                              const uint8_t *v_cache, const struct attn_batch *b,
                              const struct attn_shape *s, int t0, int t1, int h0, int h1,
                              const struct attn_parts *pp);
    /* out[i] = x[i] rounded to fp16, nearest even (as f32_to_fp16; the fp16 KV cache's write). */
    void (*to_fp16)(const float *x, uint16_t *out, size_t n);
    /* n (a multiple of 32) values into Q8_0 blocks, bit-identical to quantize_row_q8_0
     * (quant/quantize.h; the Q8_0 KV cache's write) where every block's 1/d is finite (else the
     * reference's float-to-int8 conversion is undefined). */
    void (*quantize_kv_q8)(const float *x, struct block_q8_0 *y, size_t n);
};

/* The table for isa with the weight prefetch this core prefers (cpu_prefetch_best); _with names
 * the prefetch (AUTO: the preferred one). Only the AVX-512 GEMV's prefetch differs. */
const struct cpu_kernels *cpu_kernels_for(enum cpu_isa isa);
const struct cpu_kernels *cpu_kernels_with(enum cpu_isa isa, enum cpu_prefetch pf);

/* The kernels the tables in kern.c point at; each ISA's live in its own files
 * (scalar: kern_scalar.c; avx2: mm_avx2.c, mmf_avx2.c, vec_avx2.c, attn_avx2.c; avxvnni:
 * mm_avxvnni.c and the avx2 files; avx512:
 * mm_avx512.c, mmf_avx512.c, vec_avx512.c, attn_avx512.c, attn_avx512_q8.c). */

/* scalar (matmul_q8 / matmul_f32 are absent: the reference runs on the file's layout) */
void scalar_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum);
void scalar_block_sums(const float *x, int64_t cols, float *xs);
void scalar_rmsnorm(float *out, const float *x, const float *w, int dim, float eps);
void scalar_add(float *x, const float *y, size_t n);
void scalar_silu_mul(float *g, const float *u, size_t n);
void scalar_gelu_mul(float *g, const float *u, size_t n);
void scalar_softcap(float *x, float cap, size_t n);
void scalar_rope(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
                 const float *cs_sin);
void scalar_to_fp16(const float *x, uint16_t *out, size_t n);
void scalar_attention_f16(float *out, const float *q, const uint16_t *k_cache,
                          const uint16_t *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t0, int t1, int h0, int h1);
void scalar_attention_q8(float *out, const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                         int h0, int h1);
void scalar_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                      const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                      int h0, int h1);

/* AVX2 + FMA + F16C */
void avx2_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum);
void avx2_block_sums(const float *x, int64_t cols, float *xs);
void avx2_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                    int64_t gp, int t0, int t1, float *y);
void avx2_matmul_f32(const struct qpack *w, const float *x, const float *xs, int64_t g0, int64_t g1,
                     int64_t gp, int t0, int t1, float *y);
void avx2_matmul_float(const struct bweight *w, const float *x, int64_t r0, int64_t r1, int t0,
                       int t1, float *y);
void avx2_rmsnorm(float *out, const float *x, const float *w, int dim, float eps);
void avx2_add(float *x, const float *y, size_t n);
void avx2_silu_mul(float *g, const float *u, size_t n);
void avx2_gelu_mul(float *g, const float *u, size_t n);
void avx2_softcap(float *x, float cap, size_t n);
void avx2_rope(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
               const float *cs_sin);
void avx2_to_fp16(const float *x, uint16_t *out, size_t n);
void avx2_quantize_kv_q8(const float *x, struct block_q8_0 *y, size_t n);
void avx2_attention_f16(float *out, const float *q, const uint16_t *k_cache,
                        const uint16_t *v_cache, const struct attn_batch *b,
                        const struct attn_shape *s, int t0, int t1, int h0, int h1);
void avx2_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                    const struct attn_batch *b, const struct attn_shape *s, int t0, int t1, int h0,
                    int h1);

void avx2_attention_q8(float *out, const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                       const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                       int h0, int h1);
void avx2_attention_part(float *out, const float *q, const float *k_cache, const float *v_cache,
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                         int h0, int h1, const struct attn_parts *pp);
void avx2_attention_f16_part(float *out, const float *q, const uint16_t *k_cache,
                             const uint16_t *v_cache, const struct attn_batch *b,
                             const struct attn_shape *s, int t0, int t1, int h0, int h1,
                             const struct attn_parts *pp);
void avx2_attention_q8_part(float *out, const float *q, const uint8_t *k_cache,
                            const uint8_t *v_cache, const struct attn_batch *b,
                            const struct attn_shape *s, int t0, int t1, int h0, int h1,
                            const struct attn_parts *pp);

/* AVX2 + FMA + F16C + AVX-VNNI: the AVX2 kernels but this one */
void avxvnni_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                       int64_t gp, int t0, int t1, float *y);

/* AVX-512 F/BW/VL/VNNI */
void avx512_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum);
void avx512_block_sums(const float *x, int64_t cols, float *xs);
void avx512_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                      int64_t gp, int t0, int t1, float *y);
void avx512_matmul_q8_l1(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                         int64_t gp, int t0, int t1, float *y); /* its weight prefetch into L1 */
void avx512_matmul_f32(const struct qpack *w, const float *x, const float *xs, int64_t g0,
                       int64_t g1, int64_t gp, int t0, int t1, float *y);
void avx512_matmul_float(const struct bweight *w, const float *x, int64_t r0, int64_t r1, int t0,
                         int t1, float *y);
void avx512_rmsnorm(float *out, const float *x, const float *w, int dim, float eps);
void avx512_add(float *x, const float *y, size_t n);
void avx512_silu_mul(float *g, const float *u, size_t n);
void avx512_gelu_mul(float *g, const float *u, size_t n);
void avx512_softcap(float *x, float cap, size_t n);
void avx512_rope(float *x, int n_heads, int head_dim, int rot_dim, const float *cs_cos,
                 const float *cs_sin);
void avx512_to_fp16(const float *x, uint16_t *out, size_t n);
void avx512_quantize_kv_q8(const float *x, struct block_q8_0 *y, size_t n);
void avx512_attention_f16(float *out, const float *q, const uint16_t *k_cache,
                          const uint16_t *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t0, int t1, int h0, int h1);
void avx512_attention_l1(float *out, const float *q, const float *k_cache, const float *v_cache,
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                         int h0, int h1);
void avx512_attention_f16_l1(float *out, const float *q, const uint16_t *k_cache,
                             const uint16_t *v_cache, const struct attn_batch *b,
                             const struct attn_shape *s, int t0, int t1, int h0, int h1);
void avx512_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                      const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                      int h0, int h1);

/* AVX-512 + AMX-TILE/AMX-INT8: the AVX-512 kernels but the q8 matmul's sets of 16 tokens
 * (mm_amx.c; fewer tokens run on avx512_matmul_q8) */
void amx_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1, int64_t gp,
                   int t0, int t1, float *y);
void amx_matmul_q8_l1(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                      int64_t gp, int t0, int t1, float *y);

/* over a Q8_0 cache (attn_avx512_q8.c) */
void avx512_attention_q8(float *out, const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                         int h0, int h1);
void avx512_attention_q8_l1(float *out, const float *q, const uint8_t *k_cache,
                            const uint8_t *v_cache, const struct attn_batch *b,
                            const struct attn_shape *s, int t0, int t1, int h0, int h1);

/* the _part forms of the six above (attn_part.h) */
void avx512_attention_part(float *out, const float *q, const float *k_cache, const float *v_cache,
                           const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                           int h0, int h1, const struct attn_parts *pp);
void avx512_attention_l1_part(float *out, const float *q, const float *k_cache,
                              const float *v_cache, const struct attn_batch *b,
                              const struct attn_shape *s, int t0, int t1, int h0, int h1,
                              const struct attn_parts *pp);
void avx512_attention_f16_part(float *out, const float *q, const uint16_t *k_cache,
                               const uint16_t *v_cache, const struct attn_batch *b,
                               const struct attn_shape *s, int t0, int t1, int h0, int h1,
                               const struct attn_parts *pp);
void avx512_attention_f16_l1_part(float *out, const float *q, const uint16_t *k_cache,
                                  const uint16_t *v_cache, const struct attn_batch *b,
                                  const struct attn_shape *s, int t0, int t1, int h0, int h1,
                                  const struct attn_parts *pp);
void avx512_attention_q8_part(float *out, const float *q, const uint8_t *k_cache,
                              const uint8_t *v_cache, const struct attn_batch *b,
                              const struct attn_shape *s, int t0, int t1, int h0, int h1,
                              const struct attn_parts *pp);
void avx512_attention_q8_l1_part(float *out, const float *q, const uint8_t *k_cache,
                                 const uint8_t *v_cache, const struct attn_batch *b,
                                 const struct attn_shape *s, int t0, int t1, int h0, int h1,
                                 const struct attn_parts *pp);

#endif
