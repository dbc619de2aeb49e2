/* backend: the contract every compute backend implements (kernels/cpu/backend_cpu.h and
 * kernels/cuda/backend_cuda.h create them; kernels/backend_select.h picks one).
 *
 * The model forward (engine/model.c) is written once against these ops. Buffers are opaque
 * device pointers from buf_alloc: host memory on the CPU, device memory on a GPU; the engine only
 * moves bytes in and out with buf_write/buf_read. All ops act on a ragged batch of n tokens
 * (prefill chunks and decodes of many sequences mixed) and are batch-invariant: the result for
 * a token never depends on which other tokens share the call, because every reduction runs in a
 * fixed order chosen by the shapes of the model, never by n.
 *
 * Shapes are noted [rows][cols], row-major, float32 unless said otherwise. */
#ifndef QUERN_BACKEND_H
#define QUERN_BACKEND_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "../quant/qerr.h"
#include "../quant/qtypes.h"

struct backend;

/* A model's rotary position embedding. The pair (x[2i], x[2i+1]) of a head's first rot_dim dims,
 * at position p, turns by theta = p * rope_inv_freq(rs, i) radians: base^(-2i/rot_dim), times
 * scale (linear scaling: 1 / rope.scaling.factor), divided by factors[i] (Llama 3.1's per-pair
 * rope_freqs, or YaRN's blend of scaled and unscaled frequencies; NULL: none), and is scaled by
 * mscale (YaRN's attention factor): cos(theta) * mscale and sin(theta) * mscale, each rounded
 * to float once, as llama.cpp's ggml_rope_ext computes. */
#define ROPE_MAX_PAIRS 256
struct rope_spec {
    int rot_dim; /* even, <= head_dim, <= 2 * ROPE_MAX_PAIRS */
    float base, scale;
    const float *factors; /* [rot_dim / 2] or NULL */
    float mscale;         /* 0: none (1) */
};

static inline double rope_mscale(const struct rope_spec *rs)
{
    return rs->mscale > 0 ? (double)rs->mscale : 1.0;
}

/* In double, so an angle keeps its phase at positions of 1e5; with scale 1 and no factors the
 * bits are pow's alone. */
static inline double rope_inv_freq(const struct rope_spec *rs, int i)
{
    double f = pow((double)rs->base, -(double)(2 * i) / rs->rot_dim) * (double)rs->scale;
    return rs->factors ? f / (double)rs->factors[i] : f;
}

/* A copy of a rope_spec (its factors included) that caches of rope_inv_freq are keyed by. */
struct rope_key {
    int rot_dim;
    float base, scale, mscale;
    bool has_factors;
    float factors[ROPE_MAX_PAIRS];
};

static inline bool rope_key_matches(const struct rope_key *k, const struct rope_spec *rs)
{
    if (k->rot_dim != rs->rot_dim || k->base != rs->base || k->scale != rs->scale ||
        k->mscale != rs->mscale || k->has_factors != (rs->factors != NULL))
        return false;
    for (int i = 0; rs->factors && i < rs->rot_dim / 2; i++)
        if (k->factors[i] != rs->factors[i]) return false;
    return true;
}

static inline void rope_key_set(struct rope_key *k, const struct rope_spec *rs)
{
    k->rot_dim = rs->rot_dim;
    k->base = rs->base;
    k->scale = rs->scale;
    k->mscale = rs->mscale;
    k->has_factors = rs->factors != NULL;
    for (int i = 0; rs->factors && i < rs->rot_dim / 2; i++) k->factors[i] = rs->factors[i];
}

/* A weight matrix W [rows][cols] as the file stores it (quant blocks run along cols). y = x W^T:
 * x has cols entries per token, y has rows. */
struct bweight {
    enum qtype type;
    int64_t rows, cols;
    const void *host; /* the file's bytes (mmap): rows * qtype_row_bytes(type, cols) */
    void *impl;       /* the backend's prepared copy (repacked/uploaded), or NULL */
};

/* Paged-attention description of one step's batch; the arrays are device buffers. */
struct attn_batch {
    int n_tokens;
    const int32_t *pos;  /* [n_tokens] position of each token within its sequence */
    const int32_t *seq;  /* [n_tokens] the token's sequence, an index < n_seqs */
    const int32_t *slot; /* [n_tokens] KV slot it writes: block * block_size + offset */
    int n_seqs;
    const int32_t *block_table; /* [n_seqs][max_blocks] KV block ids of each sequence */
    int max_blocks;
    int block_size; /* tokens per KV block */
    /* > 0: sliding-window attention, the token at position p sees only the keys at positions
     * p - window + 1 .. p (llama.cpp's LLAMA_SWA_TYPE_STANDARD, Gemma 3's local layers); 0: all
     * of 0 .. p */
    int window;
};

/* The first key a token at position pos sees (b->window). */
static inline int attn_first_key(const struct attn_batch *b, int pos)
{
    return b->window > 0 && pos >= b->window ? pos - b->window + 1 : 0;
}

/* The attention geometry of one model. */
struct attn_shape {
    int n_heads, n_kv_heads, head_dim;
    float scale; /* 1/sqrt(head_dim) */
    /* > 0: each score s = scale q.k becomes softcap tanh(s / softcap) before the softmax
     * (Gemma 2's attn_logit_softcapping); 0: none */
    float softcap;
};

enum matmul_precision {
    /* Activations stay float32; weights are dequantized inside the dot product. The reference
     * mode that matches an fp32 framework to ~1e-5. */
    MATMUL_F32 = 0,
    /* Activations are quantized per 32-element block to int8 (as llama.cpp does) so dot products
     * run on integer units; faster, within a small KL divergence of MATMUL_F32. */
    MATMUL_Q8 = 1,
    /* Only in a backend_request (backend_select.h): the CPU takes MATMUL_Q8, whose cost (mean KL
     * 0.003 on the default model) is a twentieth of what 4-bit weights already cost
     * (docs/quant.md), CUDA MATMUL_F32. Backends themselves never see it. */
    MATMUL_AUTO = 2,
};

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *be);

    void *(*buf_alloc)(struct backend *be, size_t bytes); /* zeroed; NULL when out of memory */
    void (*buf_free)(struct backend *be, void *buf);
    void (*buf_write)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*buf_read)(struct backend *be, void *dst, const void *src, size_t bytes);

    /* Repacks or uploads w->host into w->impl. Called once per weight at load. A backend that
     * sets w->impl reads only impl from then on (every op, embed included), so the caller may
     * free w->host; one that leaves impl NULL reads w->host at every step. */
    int (*weight_prepare)(struct backend *be, struct bweight *w, struct qerr *err);
    void (*weight_release)(struct backend *be, struct bweight *w);
    /* Bytes one pass over a prepared w reads: what the backend holds (the CPU packs a Q5_0
     * file's tensors, read as Q8_0, back into five bits). NULL: the type's rows
     * (backend_weight_bytes). */
    size_t (*weight_bytes)(const struct backend *be, const struct bweight *w);

    /* out[n][cols] = rows tokens[i] of table, dequantized. */
    void (*embed)(struct backend *be, const struct bweight *table, const int32_t *tokens, int n,
                  float *out);
    /* out[n][dim] = x / rms(x) * w; out may alias x. */
    void (*rmsnorm)(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                    float eps);
    /* x[n] += y[n] */
    void (*add)(struct backend *be, float *x, const float *y, size_t n);
    /* y[n][rows] = x[n][cols] W^T */
    void (*matmul)(struct backend *be, const struct bweight *w, const float *x, int n, float *y);
    /* Rotates the first rs->rot_dim dims of each head of x[n][n_heads][head_dim] in place as
     * struct rope_spec says, pairing adjacent dims (x[2i], x[2i+1]) as GGUF llama files
     * expect. */
    void (*rope)(struct backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                 const struct rope_spec *rs);
    /* Writes k[n][kv_dim], v[n][kv_dim] into the caches at b->slot; cache layout
     * [n_blocks * block_size] slots of kv_dim elements, backend_kv_bytes(be, kv_dim) bytes each
     * (fp32; fp16 rounded to nearest even; or, on the CPU, Q8_0 blocks). */
    void (*kv_write)(struct backend *be, void *k_cache, void *v_cache, const float *k,
                     const float *v, const struct attn_batch *b, int kv_dim);
    /* out[n][n_heads * head_dim]: causal attention of each token over positions 0..pos of its
     * sequence, reading K/V through the block table (GQA: head h uses kv head
     * h / (n_heads / n_kv_heads)). kv_write must have run for this step's tokens. */
    void (*attention)(struct backend *be, float *out, const float *q, const void *k_cache,
                      const void *v_cache, const struct attn_batch *b, const struct attn_shape *s);
    /* out[i][dim] = x[idx[i]][dim] for i < n: picks the rows that need logits. */
    void (*get_rows)(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                     int dim);
    /* g[n] = silu(g) * u */
    void (*silu_mul)(struct backend *be, float *g, const float *u, size_t n);
    /* Waits for queued work (no-op on the CPU). */
    void (*sync)(struct backend *be);

    /* Whole-step replay (CUDA graphs); NULL where a backend has none (the CPU). The caller
     * brackets the ops of one step with them; key names everything that shapes those ops (token,
     * sequence and logit counts, block-table width) while the buffers stay the same:
     *   step_begin(key)  true: a step of this key was captured before and has just been replayed
     *                    (the caller issues none of the ops); false: the caller issues them, and
     *                    the backend may be capturing them
     *   step_end()       after the ops when step_begin said false; false when a capture failed
     *                    (nothing ran, replay is now off for good): the caller issues the ops
     *                    again
     *   step_reset()     a buffer the steps use was replaced: forget every capture
     * The input arrays are written (buf_write) before step_begin and the outputs read after.
     * A backend with step_begin gets one KV block more than model_opts.kv_blocks: the slot the
     * model's padding tokens write (engine/model.c). */
    bool (*step_begin)(struct backend *be, uint64_t key);
    bool (*step_end)(struct backend *be);
    void (*step_reset)(struct backend *be);

    /* Bytes of one K or V element in this backend's cache: 4 (fp32), 2 (fp16) or 1 (Q8_0, whose
     * scales add 2 bytes per 32). NULL: 4. */
    size_t (*kv_elem_bytes)(const struct backend *be);
    /* The residual add and the next norm in one pass: x[n][dim] += y, then out = rmsnorm(x) * w,
     * with exactly the arithmetic of add then rmsnorm; out may alias y. NULL: the caller runs
     * add and rmsnorm. */
    void (*add_rmsnorm)(struct backend *be, float *out, float *x, const float *y, const float *w,
                        int n, int dim, float eps);
    /* The device's free and total memory, for out-of-memory messages. NULL: the backend's
     * buffers are host memory. */
    void (*mem_info)(struct backend *be, size_t *free_bytes, size_t *total_bytes);
    /* Host memory that buf_read fills fastest (CUDA: page-locked, so the copy is one DMA instead
     * of a staged one), for buffers read every step; NULL when out of memory. NULL ops: malloc
     * and free. */
    void *(*host_alloc)(struct backend *be, size_t bytes);
    void (*host_free)(struct backend *be, void *p);
    /* y[i] = x W[i]^T for i < n_w: weights that read the same input (q, k and v; gate and up),
     * which a backend may run as one job (the input prepared once, one wait). Exactly the values
     * of n_w matmul calls. NULL: the caller makes them (backend_matmul_shared). */
    void (*matmul_shared)(struct backend *be, const struct bweight *const *w, int n_w,
                          const float *x, int n, float *const *y);
    /* dst = src, bytes of this backend's buffers, in order with the ops queued before and after
     * (dst and src do not overlap). NULL: the backend has none, and callers compute what they
     * would have copied (the engine's reuse of a partly matching cached KV block). */
    void (*buf_copy)(struct backend *be, void *dst, const void *src, size_t bytes);
    /* Bytes of n consecutive elements of a slot (n a multiple of 32: a kv head's row, a slot).
     * NULL: n * kv_elem_bytes. */
    size_t (*kv_bytes)(const struct backend *be, size_t n);
    /* x[n][dim] += b[dim], each row (a bias). NULL: the caller adds b row by row (add). */
    void (*add_rows)(struct backend *be, float *x, const float *b, int n, int dim);
    /* Gemma's ops; NULL where a backend has none (the model then refuses such files).
     * g[n] = gelu(g) * u, gelu the tanh form: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
     * (PyTorch's gelu(approximate="tanh")). */
    void (*gelu_mul)(struct backend *be, float *g, const float *u, size_t n);
    /* x[n] *= s */
    void (*scale)(struct backend *be, float *x, float s, size_t n);
    /* x[n] = cap * tanh(x / cap) (logit soft-capping) */
    void (*softcap)(struct backend *be, float *x, float cap, size_t n);
    /* Mixture of experts: for t < n, out[t][dim] = the sum over j < k, in that order, of
     * w[t * k + j] * y[rows[t * k + j]][dim], each product rounded to float and added to a sum
     * that starts at 0 (transformers' index_add_ of the experts' weighted outputs, j in the
     * order the caller gives); rows and w are device arrays [n * k], y has every row rows names.
     * NULL: the model refuses mixture-of-experts files. */
    void (*moe_combine)(struct backend *be, float *out, const float *y, const int32_t *rows,
                        const float *w, int n, int k, int dim);
};

struct backend {
    const struct backend_ops *ops;
    void *ctx; /* the implementation's state */
};

static inline void backend_destroy(struct backend *be)
{
    if (be) be->ops->destroy(be);
}

static inline void *backend_host_alloc(struct backend *be, size_t bytes)
{
    return be->ops->host_alloc ? be->ops->host_alloc(be, bytes) : malloc(bytes);
}

static inline void backend_host_free(struct backend *be, void *p)
{
    if (be->ops->host_free)
        be->ops->host_free(be, p);
    else
        free(p);
}

static inline void backend_matmul_shared(struct backend *be, const struct bweight *const *w,
                                         int n_w, const float *x, int n, float *const *y)
{
    if (be->ops->matmul_shared) {
        be->ops->matmul_shared(be, w, n_w, x, n, y);
        return;
    }
    for (int i = 0; i < n_w; i++) be->ops->matmul(be, w[i], x, n, y[i]);
}

static inline size_t backend_weight_bytes(const struct backend *be, const struct bweight *w)
{
    if (be->ops->weight_bytes) return be->ops->weight_bytes(be, w);
    return (size_t)w->rows * qtype_row_bytes(w->type, (size_t)w->cols);
}

static inline size_t backend_kv_elem_bytes(const struct backend *be)
{
    return be->ops->kv_elem_bytes ? be->ops->kv_elem_bytes(be) : sizeof(float);
}

static inline size_t backend_kv_bytes(const struct backend *be, size_t n)
{
    return be->ops->kv_bytes ? be->ops->kv_bytes(be, n) : n * backend_kv_elem_bytes(be);
}

#endif
