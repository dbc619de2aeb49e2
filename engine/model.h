/* model: a Llama-family decoder (RMSNorm, RoPE, GQA attention, SwiGLU, tied or separate output;
 * Qwen2's q/k/v biases, Qwen3's q/k norms, SmolLM3's layers without rope, Phi-3's fused matrices,
 * Gemma 2's and 3's scaled embeddings, post-norms, GELU, sliding-window layers and soft-capping;
 * Mixtral's, Qwen3-MoE's and Qwen2-MoE's mixtures of experts; Granite's scales)
 * loaded from GGUF and run through the backend interface.
 *
 * One call to model_forward runs one ragged batch: any mix of prefill chunks and decode tokens
 * from many sequences, each reading and writing its K/V through its own block table into the
 * paged KV storage the model owns. Weights stay quantized as the file stores them. */
#ifndef QUERN_MODEL_H
#define QUERN_MODEL_H

#include <stdint.h>

#include "../kernels/backend.h"
#include "gguf.h"

struct model_config {
    char arch[32];
    int n_layers, dim, ffn_dim, n_heads, n_kv_heads, head_dim, rot_dim;
    int vocab, ctx_len;
    float eps, rope_base;
    /* rope scaling (struct rope_spec): linear scale 1 / rope.scaling.factor; per-pair frequency
     * divisors (n_rope_factors 0: none) from Llama 3.1's tensor rope_freqs.weight and YaRN's
     * blend; YaRN's attention factor rope_mscale (1: none) */
    float rope_scale, rope_mscale;
    int n_rope_factors;
    float rope_factors[ROPE_MAX_PAIRS];
    bool tied_output;
    /* Qwen2 and Qwen3 files (as llama.cpp's converter writes them) rotate the pairs (x[i],
     * x[i + rot_dim / 2]) (GPT-NeoX's rope), where llama files pair adjacent dims: the loader
     * moves q's and k's rows within each head so the backend's rope sees adjacent pairs. q.k is
     * a sum over a head's dims, so the order they sit in changes nothing else. */
    bool rope_neox;
    /* q, k and v biases (attn_q.bias ...: Qwen2, and llama files that carry them) */
    bool qkv_bias;
    /* a per-head RMSNorm of q and k before the rope (attn_q_norm / attn_k_norm: Qwen3) */
    bool qk_norm;
    /* every no_rope_step-th layer (layer l with (l + 1) % no_rope_step == 0) attends without
     * the rope (SmolLM3's NoPE layers, 4 as llama.cpp fixes it); 0: every layer rotates */
    int no_rope_step;
    /* Phi-3's fused matrices: q, k and v as the row ranges of one attn_qkv, gate and up as the
     * first and second half of ffn_up's rows; the loader takes each part as a row window */
    bool fused_qkv, fused_gate_up;
    /* Gemma 3: token embeddings times embed_scale (sqrt(dim); 0: none); an RMSNorm of the
     * attention output and of the FFN output before each joins the residual
     * (post_attention_norm, post_ffw_norm); a GELU-gated FFN instead of SiLU's */
    float embed_scale;
    bool post_norms, gelu;
    /* q . k scale (1 / sqrt(head_dim), but Gemma 3 27B's 1 / sqrt(dim / n_heads)) */
    float attn_scale;
    /* sliding-window attention: layer l is local (model_layer_local) when swa_window > 0 and
     * l % swa_pattern < swa_pattern - 1 (llama.cpp's pattern: Gemma 3's five local layers to one
     * global, Gemma 2's one to one); a local layer's token at p sees p - swa_window + 1 .. p;
     * its rope turns with base rope_base_swa (0: the global layers' rope), unscaled (Gemma 3)
     * or, with swa_rope_scaled, with the global layers' scaling (Gemma 2) */
    int swa_window, swa_pattern;
    float rope_base_swa;
    bool swa_rope_scaled;
    /* > 0: logits = cap tanh(logits / cap) (final_logit_softcapping); attention scores the same
     * with attn_softcap (Gemma 2's attn_logit_softcapping) */
    float final_softcap, attn_softcap;
    /* mixture of experts (engine/model_moe.h; Mixtral: llama with expert_count, Qwen3-MoE,
     * Qwen2-MoE): each layer's FFN is n_experts SwiGLU experts of expert_ffn_dim channels,
     * n_experts_used of them run per token, their softmax weights renormalized over the chosen
     * (expert_weights_norm); plus, with expert_shared_ffn_dim > 0, a shared expert every token
     * runs, gated by sigmoid(x . ffn_gate_inp_shexp) (Qwen2-MoE); n_experts 0: a dense FFN */
    int n_experts, n_experts_used, expert_ffn_dim, expert_shared_ffn_dim;
    bool expert_weights_norm;
    /* IBM Granite: the attention's and the FFN's outputs times residual_scale before each joins
     * the residual, the logits divided by logit_scale (0: neither); its embedding_scale is
     * embed_scale, its attention.scale attn_scale */
    float residual_scale, logit_scale;
};

/* The most experts a token may use (expert_used_count). */
#define MOE_MAX_USED 64

static inline bool model_layer_local(const struct model_config *cfg, int l)
{
    return cfg->swa_window > 0 && l % cfg->swa_pattern < cfg->swa_pattern - 1;
}

/* Which row of a NeoX-rope head (its first rot dims turned as pairs (i, i + rot / 2)) sits at
 * row r of the head the backend's rope turns (pairs (2i, 2i + 1)): the inverse of the row order
 * llama.cpp's converter gives llama's q and k. */
static inline int model_neox_row(int r, int rot)
{
    return r < rot ? (r % 2) * (rot / 2) + r / 2 : r;
}

/* Row i of a run of heads of hd rows, in model_neox_row's order within each head (hd 0: i). */
static inline int64_t model_neox_at(int64_t i, int hd, int rot)
{
    return hd ? i - i % hd + model_neox_row((int)(i % hd), rot) : i;
}

/* The model's rotary embedding for the backend's rope op; points into cfg. */
struct rope_spec model_rope_spec(const struct model_config *cfg);
/* The rope of layer l: model_rope_spec's, or a local layer's (model_layer_local). */
struct rope_spec model_layer_rope(const struct model_config *cfg, int l);

/* A LoRA adapter for model_load (engine/lora.h): its GGUF file, the name requests use (NULL: the
 * file's base name without .gguf), and the user's scale (llama.cpp's --lora-scaled; 1: as
 * trained). */
struct lora_spec {
    const char *path, *name;
    float scale;
};

struct model_opts {
    int max_batch_tokens; /* largest n_tokens a forward may be given */
    int max_logits;       /* largest number of rows of logits per forward */
    int kv_blocks;        /* blocks in the paged KV storage */
    int kv_block_size;    /* tokens per block */
    /* Weights holding NaN or Inf make every output they reach garbage. model_load reports them
     * in one line through warn (NULL: "quern: warning: <msg>" on stderr) and loads anyway, or,
     * with reject_nonfinite, fails with QERR_FORMAT. */
    void (*warn)(void *ctx, const char *msg);
    void *warn_ctx;
    bool reject_nonfinite;
    /* llama.cpp's --rope-freq-base and --rope-scale: > 0 replaces the file's rope.freq_base,
     * and its linear rope scaling factor (rope_freqs divisors stay); 0: the file's. */
    float rope_freq_base, rope_scale;
    /* Tensor parallelism (engine/model_tp.h): tp > 1 splits the model over tp ranks
     * (engine/model_shard.h), rank r on tp_backends[r] (tp_backends[0] is be) with its handle
     * tp_comms[r] on one communicator group (kernels/comm.h); they must outlive the model.
     * model_forward then runs every rank on its own thread and returns rank 0's logits. kv_blocks
     * counts blocks on every rank; each rank's block holds only its KV heads. 0 or 1: no split. */
    int tp;
    struct backend *const *tp_backends;
    struct comm *const *tp_comms;
    /* LoRA adapters loaded with the model (not with tp > 1); a batch picks one per sequence
     * (model_batch.seq_lora), by its index here, adapter i in slot i. max_loras: slots for
     * adapters loaded later too (model_lora_add; 0: n_loras). */
    const struct lora_spec *loras;
    int n_loras, max_loras;
};

/* n leading positions of KV block src copied into block dst, on every layer (and every rank). */
struct kv_block_copy {
    int32_t src, dst, n;
};

/* One step's batch, host arrays. Token i of sequence seq[i] sits at position pos[i] and writes
 * its K/V at slot[i] = block * kv_block_size + offset; block_table[s * max_blocks + j] is the
 * j-th block of sequence s. Logits are produced for the tokens listed in logit_idx. */
struct model_batch {
    int n_tokens;
    const int32_t *tokens, *pos, *seq, *slot;
    int n_seqs, max_blocks;
    const int32_t *block_table;
    int n_logits;
    const int32_t *logit_idx;
    /* Final hidden states (after the final norm) of the tokens listed in hidden_idx are written
     * to hidden, host [n_hidden][dim] (pooled embeddings). n_hidden 0: none. */
    int n_hidden;
    const int32_t *hidden_idx;
    float *hidden;
    /* NULL, or called once the step's work is issued and before its outputs are read: on a
     * backend that queues work (CUDA) it runs while the device computes, on the CPU after the
     * work. Not called when the forward fails before that point. */
    void (*while_running)(void *ctx);
    void *while_ctx;
    /* K/V copies made before any of the step's ops, in order (model_can_copy_kv): a prompt that
     * shares the first tokens of a cached block takes them from it (engine/sched.c). A source
     * block may be written by this step, but only after every copy. */
    int n_kv_copies;
    const struct kv_block_copy *kv_copies;
    /* NULL, or [n_seqs]: 1 + the index in model_opts.loras of the adapter sequence s runs with,
     * 0: none. A token's K/V and logits are the same bits in any batch, with any adapters. */
    const int32_t *seq_lora;
};

struct model;
struct comm;

/* Reads the configuration from GGUF metadata, checking every required key and tensor shape. */
int model_config_read(const struct gguf_file *f, struct model_config *cfg, struct qerr *err);
/* Applies model_opts' rope overrides to a config read from the file. */
void model_config_override(struct model_config *cfg, const struct model_opts *opts);
/* The longest context a model read with opts' overrides supports: the trained length of cfg (as
 * read from the file), times the factor opts->rope_scale adds to the file's own scaling. */
int model_ctx_limit(const struct model_config *cfg, const struct model_opts *opts);

int model_load(const struct gguf_file *f, struct backend *be, const struct model_opts *opts,
               struct model **out, struct qerr *err);
void model_free(struct model *m);
const struct model_config *model_get_config(const struct model *m);
const struct model_opts *model_get_opts(const struct model *m);
/* Bytes of K/V one token needs across all layers, for elements of elem_bytes (1: the element
 * count, a multiple of 32, which backend_kv_bytes turns into a backend's bytes). */
size_t model_kv_bytes_per_token(const struct model_config *cfg, size_t elem_bytes);

/* Bytes of weights one decode step reads, every rank's together: each layer's matrices and the
 * output matrix as the backend holds them (backend_weight_bytes: the CPU's five-bit Q5_0, say),
 * the norms' floats, one embedding row (the whole table when it is the output matrix). */
double model_weight_bytes(const struct model *m);

/* Whether batches may carry kv_copies (the backend copies between its buffers). */
bool model_can_copy_kv(const struct model *m);

/* The LoRA slots (model_opts.max_loras, or n_loras), and slot i's adapter's name (what requests
 * use; NULL: a free slot). */
int model_lora_count(const struct model *m);
const char *model_lora_name(const struct model *m, int i);
/* Loads an adapter into a free slot (*slot), between forwards; QERR_FULL when none is free,
 * QERR_UNSUPPORTED for a model without slots or split over ranks. */
int model_lora_add(struct model *m, const struct lora_spec *spec, int *slot, struct qerr *err);
/* Frees slot (no batch may name it any more), between forwards. */
void model_lora_remove(struct model *m, int slot);

/* logits: host array [b->n_logits][vocab]. Validates the batch (sizes, token ids, slots) first. */
int model_forward(struct model *m, const struct model_batch *b, float *logits, struct qerr *err);

#endif
