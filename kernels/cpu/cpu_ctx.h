/* cpu_ctx: the CPU backend's state, shared by the files that implement its ops
 * (backend_cpu.c: buffers, weights, create; cpu_matmul.c; cpu_ops.c: the other ops). */
#ifndef QUERN_CPU_CTX_H
#define QUERN_CPU_CTX_H

#include <stdatomic.h>

#include "kern.h"
#include "page_arena.h"
#include "threadpool.h"

/* cos / sin of every rotated pair at every position seen so far, laid out as the rope kernels
 * read them: row p holds cos[rot_dim] = (c0, c0, c1, c1, ...) and sin[rot_dim] =
 * (-s0, s0, -s1, s1, ...), each angle computed exactly as ref_rope computes it. */
struct rope_table {
    struct rope_key key; /* the rope_spec the rows were computed for */
    int n_pos;           /* rows filled */
    int cap;             /* rows allocated */
    float *cos, *sin;    /* [cap][rot_dim] */
};

/* A thread's run of row groups in a matmul job of up to 64 tokens (cpu_matmul.c): the next group
 * its owner reads (front) and the end (back), front | back << 32, on a line of its own. */
struct mm_span {
    _Alignas(64) _Atomic uint64_t fb;
};

struct cpu_ctx {
    struct threadpool *pool;
    int n_threads;
    struct mm_span *spans; /* [n_threads]: the running job's, one job at a time */
    enum matmul_precision precision;
    enum cpu_isa isa;
    enum kv_kind kv; /* the KV cache's element (ref.h): kv_write rounds or quantizes, attention
                        widens or dequantizes */
    const struct cpu_kernels *k;
    struct page_arena weights; /* the packed weights' memory */
    /* activation scratch of one matmul (quantized tokens or block sums); grows on demand */
    void *scratch;
    size_t scratch_bytes;
    /* two ropes' tables: Gemma 3's local and global layers alternate theirs within a step */
    struct rope_table rope[2];
    int rope_last; /* the one used last */
};

/* Grows the scratch to at least bytes; 0, or -1 (the old scratch stays) when memory is short. */
int cpu_scratch_reserve(struct cpu_ctx *c, size_t bytes);
/* Scratch bytes one token of a matmul with this weight needs (0 when none). */
size_t cpu_matmul_token_bytes(const struct cpu_ctx *c, const struct bweight *w);

void cpu_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y);
void cpu_matmul_shared(struct backend *be, const struct bweight *const *w, int n_w, const float *x,
                       int n, float *const *y);

void cpu_embed(struct backend *be, const struct bweight *table, const int32_t *tokens, int n,
               float *out);
void cpu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                 float eps);
void cpu_add(struct backend *be, float *x, const float *y, size_t n);
void cpu_add_rows(struct backend *be, float *x, const float *b, int n, int dim);
void cpu_rope(struct backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
              const struct rope_spec *rs);
void cpu_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *k, const float *v,
                  const struct attn_batch *b, int kv_dim);
void cpu_attention(struct backend *be, float *out, const float *q, const void *k_cache,
                   const void *v_cache, const struct attn_batch *b, const struct attn_shape *s);
void cpu_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                  int dim);
void cpu_silu_mul(struct backend *be, float *g, const float *u, size_t n);
void cpu_gelu_mul(struct backend *be, float *g, const float *u, size_t n);
void cpu_scale(struct backend *be, float *x, float s, size_t n);
void cpu_softcap(struct backend *be, float *x, float cap, size_t n);
void cpu_moe_combine(struct backend *be, float *out, const float *y, const int32_t *rows,
                     const float *w, int n, int k, int dim);
void cpu_rope_table_free(struct rope_table *rt);

#endif
