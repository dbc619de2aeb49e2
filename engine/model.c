#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/comm.h"
#include "../kernels/nvtx.h"
#include "lora.h"
#include "model_moe.h"
#include "model_shard.h"
#include "model_tp.h"

struct layer {
    const float *attn_norm, *ffn_norm;           /* device copies, [dim] */
    const float *attn_post_norm, *ffn_post_norm; /* [dim] (post_norms) or NULL */
    struct bweight wq, wk, wv, wo, w_gate, w_up, w_down;
    /* device copies or NULL: this rank's q, k, v biases (qkv_bias), q and k norms [head_dim]
     * (qk_norm) */
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    struct moe_weights moe;  /* a mixture of experts' FFN (cfg.n_experts), w_gate.. unused */
    void *k_cache, *v_cache; /* [kv_blocks * block_size][kv_dim] of the backend's KV element */
    /* copies the file's bytes could not serve: this rank's column shards of wo and w_down
     * (tensor parallelism), q's and k's rows in the rope's order (rope_neox) */
    void *own[4];
};

/* Activation arena: sized once for max_batch_tokens so a forward allocates nothing. */
struct acts {
    float *x, *xn, *q, *k, *v, *att, *gate, *up, *sel, *logits; /* device */
    int32_t *tokens, *pos, *seq, *slot, *table, *logit_idx;     /* device */
    int32_t *hidden_idx;                                        /* device [T] */
    int table_cap;
    int32_t *wide_table; /* host: a batch's block table widened for replay */
    size_t wide_cap;
};

/* A replayed step's batch padded to a captured size (model_forward): host arrays. */
#define STEP_REPLAY_MAX_TOKENS 64
struct padded_batch {
    int n, n_logits, n_seqs;
    int32_t tokens[STEP_REPLAY_MAX_TOKENS], pos[STEP_REPLAY_MAX_TOKENS];
    int32_t seq[STEP_REPLAY_MAX_TOKENS], slot[STEP_REPLAY_MAX_TOKENS];
    int32_t logit_idx[STEP_REPLAY_MAX_TOKENS];
};

/* NaN/Inf found in the weights while loading: the first tensor holding any, in load order. */
struct nonfinite {
    const struct gguf_tensor *first;
    uint64_t first_count, total;
    int tensors;
};

struct model {
    struct model_config cfg;
    struct model_opts opts;
    struct backend *be;
    struct bweight tok_embd, output;
    float *output_norm;
    struct layer *layers;
    struct acts a;
    struct nonfinite bad;  /* only during model_load */
    struct model_shard sh; /* the heads and FFN channels this rank holds (all of them alone) */
    struct comm *comm;     /* tensor parallelism: this rank's handle, else NULL */
    struct tp_group *tp;   /* rank 0 of a split model: the other ranks (model_tp.c) */
    struct lora_run *lora; /* the LoRA adapters, or NULL */
    struct moe_run *moe;   /* the experts' scratch (cfg.n_experts), or NULL */
    bool lora_step;        /* some sequence of this step runs with an adapter */
};

static int get_u32_pos(const struct gguf_file *f, const char *arch, const char *suffix, int *out,
                       struct qerr *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = gguf_get_u32(f, key, &v, err);
    if (rc) return rc;
    if (v == 0 || v > (1u << 24))
        return qerr_set(err, QERR_FORMAT, "%s: metadata '%s' = %u is out of range", gguf_path(f),
                        key, v);
    *out = (int)v;
    return 0;
}

#define LAYER_TENSORS 9

/* An optional finite, non-negative f32 under "ARCH.SUFFIX": *v is left as it is when absent. */
static int read_f32_opt(const struct gguf_file *f, const char *arch, const char *suffix, float *v,
                        struct qerr *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(f, key, v, err);
    if (rc == QERR_NOTFOUND) return 0;
    if (!rc && (!isfinite(*v) || *v < 0))
        return qerr_set(err, QERR_FORMAT, "%s: metadata '%s' = %g is out of range", gguf_path(f),
                        key, *v);
    return rc;
}

/* The factor by which YaRN divides pair i's frequency: 1 / ((1 - mix) / factor + mix), mix
 * being 1 for fast pairs (kept) and 0 for slow ones (scaled), linear in between. */
static double yarn_divisor(int i, int rot_dim, float base, int n_ctx_orig, float factor,
                           float beta_fast, float beta_slow, float ext_factor)
{
    double lb = log((double)base);
    double lo = floor(rot_dim * log(n_ctx_orig / (beta_fast * 2 * M_PI)) / (2 * lb));
    double hi = ceil(rot_dim * log(n_ctx_orig / (beta_slow * 2 * M_PI)) / (2 * lb));
    if (lo < 0) lo = 0;
    if (hi > rot_dim - 1) hi = rot_dim - 1;
    double y = (i - lo) / fmax(0.001, hi - lo);
    double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * ext_factor;
    return 1.0 / ((1.0 - mix) / factor + mix);
}

/* Gemma 2's and 3's keys as llama.cpp's gemma2 and gemma3 read them (src/models/gemma2.cpp,
 * gemma3.cpp): Gemma 2 always has local layers (every other one, 4096 keys unless the file says)
 * and caps its attention scores (50) and logits (30) unless the file says; Gemma 3 has local
 * layers (five in six) where the file gives a window, and caps nothing unless it says. */
static int read_gemma(const struct gguf_file *f, struct model_config *cfg, struct qerr *err)
{
    const char *a = cfg->arch;
    bool g2 = strcmp(a, "gemma2") == 0;
    cfg->embed_scale = sqrtf((float)cfg->dim);
    cfg->post_norms = cfg->gelu = true;
    /* gemma_pytorch's query_pre_attn_scalar, which the file does not carry: the 27B models' is
     * dim / n_heads, the others' the head size (llama.cpp tells them by their layer count) */
    if (cfg->n_layers == (g2 ? 46 : 62))
        cfg->attn_scale = 1.0f / sqrtf((float)(cfg->dim / cfg->n_heads));
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    const struct gguf_kv *pat = gguf_kv_find(f, key);
    int rc = get_u32_pos(f, a, "attention.sliding_window", &cfg->swa_window, err);
    if (rc == QERR_NOTFOUND) {
        cfg->swa_window = g2 ? 4096 : 0;
        rc = 0;
    }
    if (rc) return rc;
    if (cfg->swa_window > 0) {
        cfg->swa_pattern = g2 ? 2 : 6;
        if (pat &&
            (rc = get_u32_pos(f, a, "attention.sliding_window_pattern", &cfg->swa_pattern, err)))
            return qerr_set(err, QERR_UNSUPPORTED,
                            "%s: %s: quern reads a layer count (a pattern of local layers, then "
                            "a global one), not a per-layer array",
                            gguf_path(f), key);
    }
    /* Gemma 2's local layers turn as its global ones (unless the file names a base) */
    cfg->rope_base_swa = g2 ? 0.0f : 10000.0f;
    cfg->swa_rope_scaled = g2;
    cfg->final_softcap = g2 ? 30.0f : 0.0f;
    cfg->attn_softcap = g2 ? 50.0f : 0.0f;
    if ((rc = read_f32_opt(f, a, "rope.freq_base_swa", &cfg->rope_base_swa, err)) ||
        (rc = read_f32_opt(f, a, "final_logit_softcapping", &cfg->final_softcap, err)) ||
        (g2 && (rc = read_f32_opt(f, a, "attn_logit_softcapping", &cfg->attn_softcap, err))))
        return rc;
    return 0;
}

/* Mixtral (llama or mistral with expert_count), Qwen3-MoE and Qwen2-MoE as llama.cpp reads
 * them: every layer a mixture (ffn_gate_inp, the router; ffn_{gate,up,down}_exps, the experts
 * stacked, or the first Mixtral files' ffn_{gate,up,down}.<e>, one tensor an expert), an expert
 * of expert_feed_forward_length channels or, where the file has none, feed_forward_length
 * (Mixtral's files give the expert's there), softmax routing with the chosen weights
 * renormalized (Qwen2-MoE: not), and Qwen2-MoE's shared expert (ffn_{gate,up,down}_shexp of
 * expert_shared_feed_forward_length channels, else feed_forward_length) gated by
 * ffn_gate_inp_shexp. Other archs' shared experts and per-layer counts are refused. */
static int read_moe(const struct gguf_file *f, struct model_config *cfg, struct qerr *err)
{
    const char *a = cfg->arch;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_count", a);
    uint32_t n = 0;
    int rc = gguf_get_u32(f, key, &n, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    bool router = gguf_tensor_find(f, "blk.0.ffn_gate_inp.weight") != NULL;
    if (n == 0) {
        if (router || !strcmp(a, "qwen3moe") || !strcmp(a, "qwen2moe") || !strcmp(a, "granitemoe"))
            return qerr_set(err, QERR_FORMAT, "%s: %s without %s", gguf_path(f),
                            router ? "an expert router (blk.0.ffn_gate_inp.weight)" : a, key);
        return 0;
    }
    if (n > 4096)
        return qerr_set(err, QERR_FORMAT, "%s: metadata '%s' = %u is out of range", gguf_path(f),
                        key, n);
    bool q2 = !strcmp(a, "qwen2moe");
    if (strcmp(a, "llama") && strcmp(a, "mistral") && strcmp(a, "qwen3moe") && !q2 &&
        strncmp(a, "granite", 7))
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: experts in a %s model (quern runs Mixtral-style llama and mistral "
                        "files, qwen3moe, qwen2moe and granitemoe)",
                        gguf_path(f), a);
    bool shared = gguf_tensor_find(f, "blk.0.ffn_gate_shexp.weight") != NULL;
    if ((shared && !q2) || gguf_tensor_find(f, "blk.0.ffn_gate_up_exps.weight"))
        return qerr_set(err, QERR_UNSUPPORTED, "%s: %s are not supported", gguf_path(f),
                        shared ? "shared experts outside qwen2moe"
                               : "fused gate/up expert tensors");
    if (q2 && !shared)
        return qerr_set(err, QERR_FORMAT, "%s: missing tensor blk.0.ffn_gate_shexp.weight (%s)",
                        gguf_path(f), a);
    cfg->expert_weights_norm = !q2; /* llama.cpp's norm_w for these archs */
    if (shared) {
        cfg->expert_shared_ffn_dim = cfg->ffn_dim;
        rc = get_u32_pos(f, a, "expert_shared_feed_forward_length", &cfg->expert_shared_ffn_dim,
                         err);
        if (rc && rc != QERR_NOTFOUND) return rc;
    }
    cfg->n_experts = (int)n;
    if ((rc = get_u32_pos(f, a, "expert_used_count", &cfg->n_experts_used, err))) return rc;
    if (cfg->n_experts_used > cfg->n_experts || cfg->n_experts_used > MOE_MAX_USED)
        return qerr_set(err, QERR_FORMAT,
                        "%s: %s.expert_used_count %d of %d experts (quern runs at most %d)",
                        gguf_path(f), a, cfg->n_experts_used, cfg->n_experts, MOE_MAX_USED);
    cfg->expert_ffn_dim = cfg->ffn_dim;
    rc = get_u32_pos(f, a, "expert_feed_forward_length", &cfg->expert_ffn_dim, err);
    return rc == QERR_NOTFOUND ? 0 : rc;
}

/* IBM Granite's scales as llama.cpp's granite and granitemoe read them: logit_scale required,
 * embedding_scale, residual_scale and attention.scale where the file has them (0: none; the
 * q.k scale then stays 1 / sqrt(head_dim)). */
static int read_granite(const struct gguf_file *f, struct model_config *cfg, struct qerr *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.logit_scale", cfg->arch);
    int rc = gguf_get_f32(f, key, &cfg->logit_scale, err);
    if (rc) return rc;
    float attn = 0;
    if ((rc = read_f32_opt(f, cfg->arch, "embedding_scale", &cfg->embed_scale, err)) ||
        (rc = read_f32_opt(f, cfg->arch, "residual_scale", &cfg->residual_scale, err)) ||
        (rc = read_f32_opt(f, cfg->arch, "attention.scale", &attn, err)))
        return rc;
    if (!(cfg->logit_scale > 0) || !isfinite(cfg->logit_scale))
        return qerr_set(err, QERR_FORMAT, "%s: metadata '%s' = %g is out of range", gguf_path(f),
                        key, cfg->logit_scale);
    if (attn > 0) cfg->attn_scale = attn;
    return 0;
}

/* Rope scaling as llama.cpp reads it. A factor (rope.scaling.factor, or the older
 * rope.scale_linear) stretches every wavelength when the scaling type is linear or unset and is
 * ignored under "none". Llama 3.1 and later keep per-pair divisors in the tensor
 * rope_freqs.weight (rot_dim / 2 values, written by llama.cpp's converter from the rope_scaling
 * of the model's config). YaRN (ggml's rope_yarn) blends, pair by pair, the scaled frequency
 * (low frequencies) with the unscaled one (high), over a ramp between the pairs that turn
 * beta_fast and beta_slow times in the original context, and scales cos and sin by
 * attn_factor * (1 + 0.1 ln factor): the blend becomes divisors beside rope_freqs', the scale
 * rope_mscale. LongRoPE and others are refused rather than run wrong. */
static int read_rope_scaling(const struct gguf_file *f, struct model_config *cfg, struct qerr *err)
{
    const char *a = cfg->arch;
    char key[128];
    struct gguf_str type = {"linear", 6};
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    int rc = gguf_get_str(f, key, &type, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    bool yarn = gguf_str_eq(type, "yarn");
    if (!gguf_str_eq(type, "linear") && !gguf_str_eq(type, "none") && !yarn)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: rope scaling '%.*s' (quern runs none, linear, yarn and Llama 3's "
                        "rope_freqs)",
                        gguf_path(f), (int)(type.len > 40 ? 40 : type.len), type.ptr);
    float factor = 0;
    if ((rc = read_f32_opt(f, a, "rope.scaling.factor", &factor, err)) ||
        (factor == 0 && (rc = read_f32_opt(f, a, "rope.scale_linear", &factor, err))))
        return rc;
    cfg->rope_scale = factor != 0 && gguf_str_eq(type, "linear") ? 1.0f / factor : 1.0f;
    cfg->rope_mscale = 1.0f;

    int pairs = cfg->rot_dim / 2;
    for (int i = 0; i < pairs; i++) cfg->rope_factors[i] = 1.0f;
    const struct gguf_tensor *t = gguf_tensor_find(f, "rope_freqs.weight");
    if (t) {
        if (t->n_dims != 1 || t->ne[0] != (uint64_t)pairs ||
            (t->type != QTYPE_F32 && t->type != QTYPE_F16 && t->type != QTYPE_BF16))
            return qerr_set(err, QERR_FORMAT,
                            "%s: tensor 'rope_freqs.weight' is %s [%llu] x %u dims; the rope "
                            "needs F32 [%d]",
                            gguf_path(f), qtype_name(t->type), (unsigned long long)t->ne[0],
                            t->n_dims, pairs);
        qtype_dequantize_row(t->type, t->data, cfg->rope_factors, (size_t)pairs);
        for (int i = 0; i < pairs; i++)
            if (!(cfg->rope_factors[i] > 0) || isinf(cfg->rope_factors[i]))
                return qerr_set(err, QERR_FORMAT, "%s: rope_freqs.weight[%d] = %g (must be > 0)",
                                gguf_path(f), i, cfg->rope_factors[i]);
        cfg->n_rope_factors = pairs;
    }
    if (!yarn || factor <= 1) return 0; /* YaRN at a factor of 1 changes nothing */
    int n_ctx_orig = cfg->ctx_len;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", a);
    uint32_t orig;
    rc = gguf_get_u32(f, key, &orig, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    if (!rc) n_ctx_orig = (int)orig;
    float beta_fast = 32, beta_slow = 1, ext = 1, attn = 1;
    if ((rc = read_f32_opt(f, a, "rope.scaling.yarn_beta_fast", &beta_fast, err)) ||
        (rc = read_f32_opt(f, a, "rope.scaling.yarn_beta_slow", &beta_slow, err)) ||
        (rc = read_f32_opt(f, a, "rope.scaling.yarn_ext_factor", &ext, err)) ||
        (rc = read_f32_opt(f, a, "rope.scaling.attn_factor", &attn, err)))
        return rc;
    if (n_ctx_orig < 1 || !(beta_fast > 0) || !(beta_slow > 0))
        return qerr_set(err, QERR_FORMAT,
                        "%s: YaRN original context %d, beta_fast %g, beta_slow %g out of range",
                        gguf_path(f), n_ctx_orig, beta_fast, beta_slow);
    for (int i = 0; i < pairs; i++)
        cfg->rope_factors[i] *= (float)yarn_divisor(i, cfg->rot_dim, cfg->rope_base, n_ctx_orig,
                                                    factor, beta_fast, beta_slow, ext);
    cfg->n_rope_factors = pairs;
    if (ext != 0) cfg->rope_mscale = attn * (1.0f + 0.1f * logf(factor));
    return 0;
}

void model_config_override(struct model_config *cfg, const struct model_opts *opts)
{
    if (opts->rope_freq_base > 0) cfg->rope_base = opts->rope_freq_base;
    if (opts->rope_scale > 0) cfg->rope_scale = 1.0f / opts->rope_scale;
}

int model_ctx_limit(const struct model_config *cfg, const struct model_opts *opts)
{
    if (!(opts->rope_scale > 0)) return cfg->ctx_len;
    double extra = (double)opts->rope_scale * (double)cfg->rope_scale; /* new / file factor */
    double n = (double)cfg->ctx_len * (extra > 1 ? extra : 1);
    return n > (double)(1 << 24) ? 1 << 24 : (int)n;
}

struct rope_spec model_layer_rope(const struct model_config *cfg, int l)
{
    struct rope_spec rs = model_rope_spec(cfg);
    if (!model_layer_local(cfg, l) || !(cfg->rope_base_swa > 0)) return rs;
    rs.base = cfg->rope_base_swa;
    /* llama.cpp's freq_scale_train_swa: Gemma 3's local layers keep the trained frequencies */
    if (!cfg->swa_rope_scaled)
        rs = (struct rope_spec){.rot_dim = cfg->rot_dim, .base = rs.base, .scale = 1.0f};
    return rs;
}

struct rope_spec model_rope_spec(const struct model_config *cfg)
{
    return (struct rope_spec){.rot_dim = cfg->rot_dim,
                              .base = cfg->rope_base,
                              .scale = cfg->rope_scale,
                              .factors = cfg->n_rope_factors ? cfg->rope_factors : NULL,
                              .mscale = cfg->rope_mscale};
}

int model_config_read(const struct gguf_file *f, struct model_config *cfg, struct qerr *err)
{
    memset(cfg, 0, sizeof *cfg);
    struct gguf_str arch;
    int rc = gguf_get_str(f, "general.architecture", &arch, err);
    if (rc) return rc;
    /* Llama-family files use this layout; Qwen2 adds q/k/v biases, Qwen3 q/k norms, both the
     * NeoX rope; SmolLM3 leaves every fourth layer without rope; Phi-3 (Phi-3.5, Phi-4) fuses
     * q/k/v and gate/up, with the NeoX rope; Gemma 2 and 3 add post-norms, GELU, local layers
     * and soft-capping; others (gpt2, phi2, gemma) do not fit it */
    static const struct {
        const char *name;
        bool neox;
        int no_rope_step;
    } supported[] = {{"llama", false, 0},   {"mistral", false, 0}, {"qwen2", true, 0},
                     {"qwen3", true, 0},    {"smollm3", false, 4}, {"phi3", true, 0},
                     {"gemma2", true, 0},   {"gemma3", true, 0},   {"qwen3moe", true, 0},
                     {"qwen2moe", true, 0}, {"granite", false, 0}, {"granitemoe", false, 0}};
    bool ok = false;
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
        if (gguf_str_eq(arch, supported[i].name)) {
            ok = true;
            cfg->rope_neox = supported[i].neox;
            cfg->no_rope_step = supported[i].no_rope_step;
        }
    if (!ok || arch.len >= sizeof cfg->arch)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: unsupported architecture '%.*s' (quern runs llama, mistral, qwen2, "
                        "qwen3, qwen2moe, qwen3moe, smollm3, phi3, gemma2, gemma3, granite, "
                        "granitemoe)",
                        gguf_path(f), (int)(arch.len > 40 ? 40 : arch.len), arch.ptr);
    memcpy(cfg->arch, arch.ptr, arch.len);
    const char *a = cfg->arch;
    if ((rc = get_u32_pos(f, a, "block_count", &cfg->n_layers, err)) ||
        (rc = get_u32_pos(f, a, "embedding_length", &cfg->dim, err)) ||
        (rc = get_u32_pos(f, a, "feed_forward_length", &cfg->ffn_dim, err)) ||
        (rc = get_u32_pos(f, a, "attention.head_count", &cfg->n_heads, err)) ||
        (rc = get_u32_pos(f, a, "context_length", &cfg->ctx_len, err)))
        return rc;
    char key[128];
    cfg->n_kv_heads = cfg->n_heads;
    rc = get_u32_pos(f, a, "attention.head_count_kv", &cfg->n_kv_heads, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if ((rc = gguf_get_f32(f, key, &cfg->eps, err))) return rc;
    cfg->rope_base = 10000.0f;
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    rc = gguf_get_f32(f, key, &cfg->rope_base, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    /* attention.key_length: a head size other than embedding_length / head_count (Mistral Nemo
     * and Small: 5120 wide, 32 heads of 128); q then has head_count x key_length rows and the
     * output projection as many columns */
    int key_len = 0, value_len = 0;
    rc = get_u32_pos(f, a, "attention.key_length", &key_len, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    rc = get_u32_pos(f, a, "attention.value_length", &value_len, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    if ((!key_len && cfg->dim % cfg->n_heads) || cfg->n_heads % cfg->n_kv_heads)
        return qerr_set(err, QERR_FORMAT,
                        "%s: embedding_length %d, head_count %d, head_count_kv %d do not divide",
                        gguf_path(f), cfg->dim, cfg->n_heads, cfg->n_kv_heads);
    cfg->head_dim = key_len ? key_len : cfg->dim / cfg->n_heads;
    if (value_len && value_len != cfg->head_dim)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: attention.value_length %d differs from the key size %d (quern's "
                        "caches hold one size)",
                        gguf_path(f), value_len, cfg->head_dim);
    if (cfg->head_dim > 512 || cfg->head_dim % 2)
        return qerr_set(err, QERR_UNSUPPORTED, "%s: head dimension %d (quern handles even <= 512)",
                        gguf_path(f), cfg->head_dim);
    cfg->rot_dim = cfg->head_dim;
    rc = get_u32_pos(f, a, "rope.dimension_count", &cfg->rot_dim, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    if (cfg->rot_dim > cfg->head_dim || cfg->rot_dim % 2)
        return qerr_set(err, QERR_FORMAT, "%s: rope.dimension_count %d vs head dimension %d",
                        gguf_path(f), cfg->rot_dim, cfg->head_dim);
    if ((rc = read_rope_scaling(f, cfg, err))) return rc;
    const struct gguf_tensor *emb = gguf_tensor_find(f, "token_embd.weight");
    if (!emb)
        return qerr_set(err, QERR_FORMAT, "%s: missing tensor token_embd.weight", gguf_path(f));
    cfg->vocab = (int)emb->ne[1];
    cfg->tied_output = gguf_tensor_find(f, "output.weight") == NULL;
    /* the first layer says which optional tensors every layer has (the loader then requires
     * them in each); Qwen3 without its norms would run, wrongly */
    cfg->qkv_bias = gguf_tensor_find(f, "blk.0.attn_q.bias") != NULL;
    cfg->qk_norm = gguf_tensor_find(f, "blk.0.attn_q_norm.weight") != NULL;
    cfg->fused_qkv = gguf_tensor_find(f, "blk.0.attn_qkv.weight") != NULL;
    cfg->fused_gate_up = strcmp(a, "phi3") == 0; /* llama.cpp's phi3 always fuses them */
    /* Phi-3's 128k models (LongRoPE: per-pair factors for short and long contexts) */
    if (gguf_tensor_find(f, "rope_factors_long.weight"))
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: LongRoPE (rope_factors_long.weight, Phi-3's 128k context) is not "
                        "supported",
                        gguf_path(f));
    if (!cfg->qk_norm && (!strcmp(a, "qwen3") || !strcmp(a, "qwen3moe") || !strcmp(a, "gemma3")))
        return qerr_set(err, QERR_FORMAT, "%s: missing tensor blk.0.attn_q_norm.weight (%s)",
                        gguf_path(f), a);
    cfg->attn_scale = 1.0f / sqrtf((float)cfg->head_dim);
    if (!strncmp(a, "gemma", 5) && (rc = read_gemma(f, cfg, err))) return rc;
    if (!strncmp(a, "granite", 7) && (rc = read_granite(f, cfg, err))) return rc;
    if ((rc = read_moe(f, cfg, err))) return rc;
    if (cfg->eps <= 0 || !(cfg->rope_base > 0))
        return qerr_set(err, QERR_FORMAT, "%s: rms epsilon %g / rope base %g out of range",
                        gguf_path(f), cfg->eps, cfg->rope_base);
    /* each layer has nine tensors (two norms, q, k, v, o, gate, up, down), so a block_count the
     * file cannot hold is refused here, before the loader sizes its tables by it (a corrupt
     * count of 2^24 layers asked for 3.4 GB) */
    uint64_t per_layer = LAYER_TENSORS - (cfg->fused_qkv ? 2 : 0) - (cfg->fused_gate_up ? 1 : 0);
    uint64_t need = (uint64_t)cfg->n_layers * per_layer + 1;
    if (gguf_tensor_count(f) < need)
        return qerr_set(err, QERR_FORMAT,
                        "%s: block_count %d needs at least %llu tensors; the file has %llu",
                        gguf_path(f), cfg->n_layers, (unsigned long long)need,
                        (unsigned long long)gguf_tensor_count(f));
    return 0;
}

size_t model_kv_bytes_per_token(const struct model_config *cfg, size_t elem_bytes)
{
    return (size_t)cfg->n_layers * 2 * (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * elem_bytes;
}

/* Finds a tensor and checks its shape is [ne0, ne1] (ne1 = 1 for vectors). */
static int find_tensor(const struct gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                       const struct gguf_tensor **out, struct qerr *err)
{
    const struct gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t) return qerr_set(err, QERR_FORMAT, "%s: missing tensor %s", gguf_path(f), name);
    if ((int64_t)t->ne[0] != ne0 || (int64_t)t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return qerr_set(err, QERR_FORMAT,
                        "%s: tensor %s has shape [%llu, %llu, %llu, %llu], want [%lld, %lld]",
                        gguf_path(f), name, (unsigned long long)t->ne[0],
                        (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                        (unsigned long long)t->ne[3], (long long)ne0, (long long)ne1);
    *out = t;
    return 0;
}

static bool fp16_nonfinite(uint16_t h)
{
    return (h & 0x7c00) == 0x7c00; /* all-ones exponent: Inf or NaN */
}

/* NaN or Inf among the values a tensor stores as floats: each element of a float tensor, and the
 * fp16 scale (and Q4_1 minimum) of each quantized block, one of which spoils all 32 weights of
 * its block. The quants are integers, always finite. Each tensor is scanned just before the
 * backend packs it, so its bytes come from memory once for both: ~5 ms more load for the 135M
 * model's 4.2 M blocks. */
static uint64_t count_nonfinite(enum qtype type, const uint8_t *p, uint64_t n_elems)
{
    uint64_t bad = 0;
    if (type == QTYPE_F32) {
        for (uint64_t i = 0; i < n_elems; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, sizeof u);
            bad += (u & 0x7f800000u) == 0x7f800000u;
        }
        return bad;
    }
    if (type == QTYPE_F16 || type == QTYPE_BF16) {
        uint16_t exp = type == QTYPE_F16 ? 0x7c00 : 0x7f80;
        for (uint64_t i = 0; i < n_elems; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, sizeof h);
            bad += (h & exp) == exp;
        }
        return bad;
    }
    size_t bb = qtype_block_bytes(type);
    uint64_t nb = n_elems / QK;
    _Static_assert(offsetof(struct block_q8_0, d) == 0 && offsetof(struct block_q4_0, d) == 0 &&
                       offsetof(struct block_q4_1, d) == 0 && offsetof(struct block_q4_1, m) == 2,
                   "every block starts with its fp16 scale (Q4_1: then its minimum)");
    if (type == QTYPE_Q4_1) {
        for (uint64_t b = 0; b < nb; b++, p += bb) {
            uint16_t dm[2];
            memcpy(dm, p, sizeof dm);
            bad += fp16_nonfinite(dm[0]) + fp16_nonfinite(dm[1]);
        }
        return bad;
    }
    for (uint64_t b = 0; b < nb; b++, p += bb) {
        uint16_t d;
        memcpy(&d, p, sizeof d);
        bad += fp16_nonfinite(d);
    }
    return bad;
}

static void scan_tensor(struct model *m, const struct gguf_tensor *t, const void *bytes)
{
    uint64_t n = count_nonfinite(t->type, bytes, t->n_elems);
    if (!n) return;
    if (!m->bad.first) {
        m->bad.first = t;
        m->bad.first_count = n;
    }
    m->bad.total += n;
    m->bad.tensors++;
}

/* One line for the whole model: a NaN spreads through every later layer, so a line per tensor
 * would say nothing more. */
static int report_nonfinite(const struct model *m, const struct gguf_file *f, struct qerr *err)
{
    const struct nonfinite *b = &m->bad;
    if (!b->total) return 0;
    char more[96] = "";
    if (b->tensors > 1)
        snprintf(more, sizeof more, ", %d more tensor%s %llu more", b->tensors - 1,
                 b->tensors > 2 ? "s hold" : " holds",
                 (unsigned long long)(b->total - b->first_count));
    char msg[320];
    snprintf(msg, sizeof msg, "tensor '%.*s' holds %llu non-finite value%s (NaN/Inf)%s",
             (int)(b->first->name.len > 96 ? 96 : b->first->name.len), b->first->name.ptr,
             (unsigned long long)b->first_count, b->first_count > 1 ? "s" : "", more);
    if (m->opts.reject_nonfinite) return qerr_set(err, QERR_FORMAT, "%s: %s", gguf_path(f), msg);
    char line[400];
    snprintf(line, sizeof line, "model: %s; %s outputs will be garbage", msg,
             b->tensors > 1 ? "their" : "its");
    if (m->opts.warn)
        m->opts.warn(m->opts.warn_ctx, line);
    else
        fprintf(stderr, "quern: warning: %s\n", line);
    return 0;
}

/* Once the backend holds its own copy of a weight (impl), the file's pages behind it would only
 * double the resident size: let the kernel drop them from this process. gguf maps the file
 * read-only and private, so the bytes stay valid: they remain in the page cache and fault back
 * in if something still reads them (a backend without a packed copy of the embedding, the
 * scalar CPU kernels', reads one row a token there). */
static void drop_file_pages(const struct gguf_file *f, const struct bweight *w)
{
    if (w->impl && w->host)
        gguf_drop_pages(f, w->host, (size_t)w->rows * qtype_row_bytes(w->type, (size_t)w->cols));
}

/* After the backend made its own copy of a weight (impl), it reads only that (backend.h), so a
 * second copy goes: this rank's column shard, and a tensor converted at open once the last
 * rank has packed it (an 8B Q4_K_M file's converted copy is the model's size again); w->host
 * then is NULL. The file's own pages are dropped (drop_file_pages). */
static void release_host(struct model *m, const struct gguf_file *f, const struct gguf_tensor *t,
                         struct bweight *w, void **own)
{
    if (!w->impl) return; /* the backend reads w->host */
    if (own && *own) {
        free(*own);
        *own = NULL;
        w->host = NULL;
    }
    if (t->file_type != (uint32_t)t->type) {
        w->host = NULL;
        if (m->sh.rank == m->sh.n_ranks - 1) gguf_tensor_release(f, t);
    }
    drop_file_pages(f, w);
}

/* Each weight's pages go as soon as it is packed, so a load never holds two copies of the model,
 * and all of them once more at the end: a read maps the file pages around it too (the kernel's
 * fault-around), bringing back pieces of neighbours dropped before (~40 of the 135M model's 94
 * MiB). */
static void drop_all_file_pages(const struct gguf_file *f, const struct model *m)
{
    drop_file_pages(f, &m->tok_embd);
    if (!m->cfg.tied_output) drop_file_pages(f, &m->output);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer *ly = &m->layers[l];
        const struct bweight *ws[] = {&ly->wq,     &ly->wk,   &ly->wv,    &ly->wo,
                                      &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) drop_file_pages(f, ws[i]);
        for (int e = 0; ly->moe.gate && e < m->cfg.n_experts; e++) {
            drop_file_pages(f, &ly->moe.gate[e]);
            drop_file_pages(f, &ly->moe.up[e]);
            drop_file_pages(f, &ly->moe.down[e]);
        }
        const struct bweight *sh[] = {&ly->moe.sh_gate_inp, &ly->moe.sh_gate, &ly->moe.sh_up,
                                      &ly->moe.sh_down};
        for (int i = 0; i < 4; i++) drop_file_pages(f, sh[i]);
    }
}

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of the [rows][cols] tensor `name`: this rank's
 * shard. Rows are a window on the file; columns are copied into *own (freed with the model), and
 * so are the rows when neox_hd is a head size (rope_neox: each head's rows in model_neox_row's
 * order, r0 and nr whole heads). */
static int load_weight_part(struct model *m, const struct gguf_file *f, const char *name,
                            int64_t cols, int64_t rows, int64_t r0, int64_t nr, int64_t c0,
                            int64_t nc, int neox_hd, struct bweight *w, void **own,
                            struct qerr *err)
{
    const struct gguf_tensor *t = NULL;
    int rc = find_tensor(f, name, cols, rows, &t, err);
    if (rc) return rc;
    int64_t blk = (int64_t)qtype_block_elems(t->type);
    if (c0 % blk || nc % blk)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: --tp %d: %s's shard of columns [%lld, %lld) cuts a quant block",
                        gguf_path(f), m->sh.n_ranks, name, (long long)c0, (long long)(c0 + nc));
    const void *bytes;
    if ((rc = gguf_tensor_bytes(f, t, &bytes, err))) return rc;
    size_t row_bytes = qtype_row_bytes(t->type, (size_t)cols);
    w->type = t->type;
    w->rows = nr;
    w->cols = nc;
    w->host = (const uint8_t *)bytes + (size_t)r0 * row_bytes;
    if (nc != cols || neox_hd) {
        size_t part = qtype_row_bytes(t->type, (size_t)nc);
        size_t skip = qtype_row_bytes(t->type, (size_t)c0);
        uint8_t *p = malloc((size_t)nr * part);
        if (!p) return qerr_set(err, QERR_NOMEM, "%s: out of memory for %s", gguf_path(f), name);
        for (int64_t r = 0; r < nr; r++) {
            int64_t src = model_neox_at(r, neox_hd, m->cfg.rot_dim);
            memcpy(p + (size_t)r * part, (const uint8_t *)w->host + (size_t)src * row_bytes + skip,
                   part);
        }
        *own = p;
        w->host = p;
    }
    /* every rank reads the file, and a fused tensor is read once a part: one report */
    if (m->sh.rank == 0 && r0 == 0) scan_tensor(m, t, bytes);
    if ((rc = m->be->ops->weight_prepare(m->be, w, err))) return rc;
    release_host(m, f, t, w, own);
    return 0;
}

static int load_weight(struct model *m, const struct gguf_file *f, const char *name, int64_t cols,
                       int64_t rows, struct bweight *w, struct qerr *err)
{
    return load_weight_part(m, f, name, cols, rows, 0, rows, 0, cols, 0, w, NULL, err);
}

/* The experts of the [n_experts][rows][cols] tensor `name`, a bweight each over this rank's
 * shard of it (model_shard.h: rows [f0, f0 + nf) of gate and up, columns [f0, f0 + nf) of down,
 * `down` says which), in *out, owned by the layer with the column copies in own[e]. Rows are
 * windows on the file; a converted tensor's bytes go once the last rank packed every expert. */
static int load_experts(struct model *m, const struct gguf_file *f, const char *name, int64_t cols,
                        int64_t rows, bool down, struct bweight *ws, void **own, struct qerr *err)
{
    int E = m->cfg.n_experts;
    const struct gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t) return qerr_set(err, QERR_FORMAT, "%s: missing tensor %s", gguf_path(f), name);
    if ((int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows || (int64_t)t->ne[2] != E ||
        t->ne[3] != 1)
        return qerr_set(err, QERR_FORMAT,
                        "%s: tensor %s has shape [%llu, %llu, %llu, %llu], want [%lld, %lld, %d]",
                        gguf_path(f), name, (unsigned long long)t->ne[0],
                        (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                        (unsigned long long)t->ne[3], (long long)cols, (long long)rows, E);
    if (down &&
        (m->sh.f0 % (int)qtype_block_elems(t->type) || m->sh.nf % (int)qtype_block_elems(t->type)))
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: --tp %d: %s's shard of columns [%d, %d) cuts a quant block",
                        gguf_path(f), m->sh.n_ranks, name, m->sh.f0, m->sh.f0 + m->sh.nf);
    const void *bytes;
    int rc = gguf_tensor_bytes(f, t, &bytes, err);
    if (rc) return rc;
    if (m->sh.rank == 0) scan_tensor(m, t, bytes);
    size_t rb = qtype_row_bytes(t->type, (size_t)cols), expert_bytes = (size_t)rows * rb;
    bool all_packed = true;
    for (int e = 0; e < E; e++) {
        const uint8_t *at = (const uint8_t *)bytes + (size_t)e * expert_bytes;
        ws[e] = (struct bweight){.type = t->type,
                                 .rows = down ? rows : m->sh.nf,
                                 .cols = down ? m->sh.nf : cols,
                                 .host = down ? at : at + (size_t)m->sh.f0 * rb};
        if (down && m->sh.nf != cols) { /* this rank's columns of every row */
            size_t part = qtype_row_bytes(t->type, (size_t)m->sh.nf);
            size_t skip = qtype_row_bytes(t->type, (size_t)m->sh.f0);
            uint8_t *p = malloc((size_t)rows * part);
            if (!p)
                return qerr_set(err, QERR_NOMEM, "%s: out of memory for %s", gguf_path(f), name);
            for (int64_t r = 0; r < rows; r++)
                memcpy(p + (size_t)r * part, at + (size_t)r * rb + skip, part);
            own[e] = p;
            ws[e].host = p;
        }
        if ((rc = m->be->ops->weight_prepare(m->be, &ws[e], err))) return rc;
        all_packed = all_packed && ws[e].impl;
    }
    for (int e = 0; e < E; e++) {
        if (ws[e].impl && own[e]) {
            free(own[e]);
            own[e] = NULL;
            ws[e].host = NULL;
        }
        drop_file_pages(f, &ws[e]);
    }
    if (all_packed && t->file_type != (uint32_t)t->type) {
        for (int e = 0; e < E; e++) ws[e].host = NULL;
        if (m->sh.rank == m->sh.n_ranks - 1) gguf_tensor_release(f, t);
    }
    return 0;
}

/* Layer l's experts of one matrix (part: "gate", "up", "down"; this rank's shard of each): the
 * stacked tensor ffn_<part>_exps, or, in files of llama.cpp's first Mixtral converter, one
 * tensor an expert (ffn_<part>.<e>). */
static int load_expert_part(struct model *m, const struct gguf_file *f, int l, const char *part,
                            int64_t cols, int64_t rows, struct bweight **out, void ***own,
                            struct qerr *err)
{
    int E = m->cfg.n_experts;
    bool down = !strcmp(part, "down");
    struct bweight *ws = calloc((size_t)E, sizeof *ws);
    void **owns = calloc((size_t)E, sizeof *owns);
    *out = ws;
    *own = owns;
    if (!ws || !owns)
        return qerr_set(err, QERR_NOMEM, "%s: out of memory for layer %d's experts", gguf_path(f),
                        l);
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, part);
    if (gguf_tensor_find(f, name) || !gguf_tensor_find(f, "blk.0.ffn_gate.0.weight"))
        return load_experts(m, f, name, cols, rows, down, ws, owns, err);
    const struct model_shard *s = &m->sh;
    for (int e = 0; e < E; e++) {
        snprintf(name, sizeof name, "blk.%d.ffn_%s.%d.weight", l, part, e);
        int rc = down ? load_weight_part(m, f, name, cols, rows, 0, rows, s->f0, s->nf, 0, &ws[e],
                                         &owns[e], err)
                      : load_weight_part(m, f, name, cols, rows, s->f0, s->nf, 0, cols, 0, &ws[e],
                                         NULL, err);
        if (rc) return rc;
    }
    return 0;
}

/* Layer l's router (whole on every rank: each routes alike) and experts (read_moe). */
static int load_moe_layer(struct model *m, const struct gguf_file *f, int l, struct moe_weights *w,
                          struct qerr *err)
{
    const struct model_config *c = &m->cfg;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
    int rc = load_weight(m, f, name, c->dim, c->n_experts, &w->router, err);
    int64_t ff = c->expert_ffn_dim;
    if (!rc) rc = load_expert_part(m, f, l, "gate", c->dim, ff, &w->gate, &w->own[0], err);
    if (!rc) rc = load_expert_part(m, f, l, "up", c->dim, ff, &w->up, &w->own[1], err);
    if (!rc) rc = load_expert_part(m, f, l, "down", ff, c->dim, &w->down, &w->own[2], err);
    int64_t sff = c->expert_shared_ffn_dim;
    const struct model_shard *s = &m->sh;
    if (rc || !sff) return rc;
    /* the shared expert: its gate a [1][dim] matrix (the file's vector), its FFN sharded as the
     * dense one is */
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", l);
    rc = load_weight(m, f, name, c->dim, 1, &w->sh_gate_inp, err);
    snprintf(name, sizeof name, "blk.%d.ffn_gate_shexp.weight", l);
    if (!rc)
        rc = load_weight_part(m, f, name, c->dim, sff, s->s0, s->ns, 0, c->dim, 0, &w->sh_gate,
                              NULL, err);
    snprintf(name, sizeof name, "blk.%d.ffn_up_shexp.weight", l);
    if (!rc)
        rc = load_weight_part(m, f, name, c->dim, sff, s->s0, s->ns, 0, c->dim, 0, &w->sh_up, NULL,
                              err);
    snprintf(name, sizeof name, "blk.%d.ffn_down_shexp.weight", l);
    if (!rc)
        rc = load_weight_part(m, f, name, sff, c->dim, 0, c->dim, s->s0, s->ns, 0, &w->sh_down,
                              &w->sh_own, err);
    return rc;
}

static void free_moe_layer(struct backend *be, int n_experts, struct moe_weights *w)
{
    if (w->router.host || w->router.impl) be->ops->weight_release(be, &w->router);
    struct bweight *sets[] = {w->gate, w->up, w->down};
    for (int i = 0; i < 3; i++) {
        for (int e = 0; sets[i] && e < n_experts; e++)
            if (sets[i][e].host || sets[i][e].impl) be->ops->weight_release(be, &sets[i][e]);
        for (int e = 0; w->own[i] && e < n_experts; e++) free(w->own[i][e]);
        free(w->own[i]);
        free(sets[i]);
    }
    struct bweight *sh[] = {&w->sh_gate_inp, &w->sh_gate, &w->sh_up, &w->sh_down};
    for (int i = 0; i < 4; i++)
        if (sh[i]->host || sh[i]->impl) be->ops->weight_release(be, sh[i]);
    free(w->sh_own);
}

/* Elements [off, off + n) of the vector `name` of n_all elements, on the device (a rank's share
 * of a bias); with neox_hd each head's elements in model_neox_row's order, as load_weight_part's
 * rows. */
static int load_vector_part(struct model *m, const struct gguf_file *f, const char *name,
                            int64_t n_all, int64_t off, int64_t n, int neox_hd, const float **out,
                            struct qerr *err)
{
    const struct gguf_tensor *t = NULL;
    int rc = find_tensor(f, name, n_all, 1, &t, err);
    if (rc) return rc;
    const void *bytes;
    if ((rc = gguf_tensor_bytes(f, t, &bytes, err))) return rc;
    if (m->sh.rank == 0) scan_tensor(m, t, bytes);
    float *host = malloc((size_t)(n_all + n) * sizeof *host);
    float *dev = m->be->ops->buf_alloc(m->be, (size_t)n * sizeof *dev);
    if (!host || !dev) {
        free(host);
        if (dev) m->be->ops->buf_free(m->be, dev);
        return qerr_set(err, QERR_NOMEM, "%s: out of memory for %s", gguf_path(f), name);
    }
    qtype_dequantize_row(t->type, bytes, host, (size_t)n_all);
    float *part = host + n_all;
    for (int64_t i = 0; i < n; i++) part[i] = host[off + model_neox_at(i, neox_hd, m->cfg.rot_dim)];
    m->be->ops->buf_write(m->be, dev, part, (size_t)n * sizeof *dev);
    free(host);
    *out = dev;
    return 0;
}

static int load_vector(struct model *m, const struct gguf_file *f, const char *name, int64_t n,
                       const float **out, struct qerr *err)
{
    return load_vector_part(m, f, name, n, 0, n, 0, out, err);
}

/* An out-of-memory error naming what was asked for and, on a device, what is free. */
static int alloc_failed(const struct backend *be, struct qerr *err, const char *what, size_t bytes)
{
    size_t free_b = 0, total_b = 0;
    if (be->ops->mem_info) be->ops->mem_info((struct backend *)be, &free_b, &total_b);
    if (total_b)
        return qerr_set(err, QERR_NOMEM,
                        "model: cannot allocate %.1f MiB of %s on the %s device: %.1f MiB of "
                        "%.1f MiB free",
                        (double)bytes / 1048576.0, what, be->ops->name, (double)free_b / 1048576.0,
                        (double)total_b / 1048576.0);
    return qerr_set(err, QERR_NOMEM, "model: cannot allocate %.1f MiB of %s",
                    (double)bytes / 1048576.0, what);
}

static int alloc_acts(struct model *m, struct qerr *err)
{
    struct backend *be = m->be;
    const struct model_config *c = &m->cfg;
    size_t T = (size_t)m->opts.max_batch_tokens, L = (size_t)m->opts.max_logits;
    size_t kv = (size_t)m->sh.nkv * (size_t)c->head_dim;
    struct acts *a = &m->a;
    /* a rank's share of the heads and FFN channels; only rank 0 computes logits */
    size_t qd = (size_t)m->sh.nq * (size_t)c->head_dim, ffn = (size_t)m->sh.nf;
    if (c->n_experts) ffn = 0; /* the experts have scratch of their own (model_moe.c) */
    if (m->sh.rank != 0) L = 1;
    struct {
        void **p;
        size_t bytes;
    } plan[] = {
        {(void **)&a->x, T * (size_t)c->dim * 4},
        {(void **)&a->xn, T * (size_t)c->dim * 4},
        {(void **)&a->q, T * qd * 4},
        {(void **)&a->k, T * kv * 4},
        {(void **)&a->v, T * kv * 4},
        {(void **)&a->att, T * qd * 4},
        {(void **)&a->gate, T * ffn * 4},
        {(void **)&a->up, T * ffn * 4},
        {(void **)&a->sel, L * (size_t)c->dim * 4},
        {(void **)&a->logits, L * (size_t)c->vocab * 4},
        {(void **)&a->tokens, T * 4},
        {(void **)&a->pos, T * 4},
        {(void **)&a->seq, T * 4},
        {(void **)&a->slot, T * 4},
        {(void **)&a->logit_idx, L * 4},
        {(void **)&a->hidden_idx, T * 4},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        if (!plan[i].bytes) continue;
        *plan[i].p = be->ops->buf_alloc(be, plan[i].bytes);
        if (!*plan[i].p) return alloc_failed(be, err, "activations", plan[i].bytes);
    }
    return 0;
}

static void free_acts(struct model *m)
{
    struct backend *be = m->be;
    struct acts *a = &m->a;
    void *all[] = {a->x,    a->xn,   a->q,     a->k,         a->v,         a->att,
                   a->gate, a->up,   a->sel,   a->logits,    a->tokens,    a->pos,
                   a->seq,  a->slot, a->table, a->logit_idx, a->hidden_idx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) be->ops->buf_free(be, all[i]);
    free(a->wide_table);
}

static int reserve_table(struct model *m, struct qerr *err);

int model_load(const struct gguf_file *f, struct backend *be, const struct model_opts *opts,
               struct model **out, struct qerr *err)
{
    if (opts->tp > 1 && (opts->n_loras > 0 || opts->max_loras > 0))
        return qerr_set(err, QERR_UNSUPPORTED,
                        "model: LoRA adapters with tensor parallelism (--tp %d) are not supported",
                        opts->tp);
    if (opts->tp > 1) return model_tp_load(f, be, opts, out, err);
    return model_load_rank(f, be, opts, NULL, NULL, out, err);
}

int model_load_rank(const struct gguf_file *f, struct backend *be, const struct model_opts *opts,
                    const struct model_shard *sh, struct comm *comm, struct model **out,
                    struct qerr *err)
{
    *out = NULL;
    if (opts->max_batch_tokens < 1 || opts->max_logits < 1 || opts->kv_blocks < 1 ||
        opts->kv_block_size < 1)
        return qerr_set(err, QERR_INVALID, "model: batch %d, logits %d, kv blocks %d x %d",
                        opts->max_batch_tokens, opts->max_logits, opts->kv_blocks,
                        opts->kv_block_size);
    struct model *m = calloc(1, sizeof *m);
    if (!m) return qerr_set(err, QERR_NOMEM, "model: out of memory");
    m->be = be;
    m->opts = *opts;
    int rc = model_config_read(f, &m->cfg, err);
    if (rc) goto fail;
    model_config_override(&m->cfg, opts);
    const struct model_config *c = &m->cfg;
    const struct backend_ops *bo = be->ops;
    if ((c->gelu && !bo->gelu_mul) ||
        ((c->embed_scale > 0 || c->residual_scale > 0 || c->logit_scale > 0) && !bo->scale) ||
        (c->final_softcap > 0 && !bo->softcap)) {
        rc = qerr_set(err, QERR_UNSUPPORTED,
                      "model: the %s backend cannot run %s (its GELU, scale "
                      "or soft-capping op is missing)",
                      bo->name, c->arch);
        goto fail;
    }
    int lora_slots = opts->max_loras > opts->n_loras ? opts->max_loras : opts->n_loras;
    if (c->n_experts && !bo->moe_combine) {
        rc = qerr_set(err, QERR_UNSUPPORTED,
                      "model: the %s backend cannot run %s's experts (its moe_combine op is "
                      "missing)",
                      bo->name, c->arch);
        goto fail;
    }
    if (sh)
        m->sh = *sh;
    else
        model_shard_whole(c, &m->sh);
    m->comm = comm;
    const struct model_shard *s = &m->sh;
    int hd = c->head_dim, kv_dim = s->nkv * hd;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = qerr_set(err, QERR_NOMEM, "model: out of memory");
        goto fail;
    }
    if ((rc = load_weight(m, f, "token_embd.weight", c->dim, c->vocab, &m->tok_embd, err)))
        goto fail;
    if (c->tied_output)
        m->output = m->tok_embd; /* shares the prepared copy; released once, as tok_embd */
    else if ((rc = load_weight(m, f, "output.weight", c->dim, c->vocab, &m->output, err)))
        goto fail;
    if ((rc =
             load_vector(m, f, "output_norm.weight", c->dim, (const float **)&m->output_norm, err)))
        goto fail;
    /* a backend that replays steps gets one more block: the slot padding tokens write */
    size_t kv_slots =
        (size_t)(opts->kv_blocks + (be->ops->step_begin ? 1 : 0)) * (size_t)opts->kv_block_size;
    for (int l = 0; l < c->n_layers; l++) {
        struct layer *ly = &m->layers[l];
        char name[96];
        int full_kv = c->n_kv_heads * hd;
        /* this rank's shard (model_shard.h): rows r0.. of column-parallel weights, columns c0.. of
         * row-parallel ones */
#define LOADW(field, suffix, cols, rows, r0, nr, c0, nc, neox, own)                                \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);                                \
        if ((rc = load_weight_part(m, f, name, cols, rows, r0, nr, c0, nc, neox, &ly->field, own,  \
                                   err)))                                                          \
            goto fail;                                                                             \
    } while (0)
        int neox = c->rope_neox ? hd : 0;
        int q_all = c->n_heads * hd;
        if (c->fused_qkv) { /* rows: q's, then k's, then v's */
            int qkv = q_all + 2 * full_kv;
            LOADW(wq, "attn_qkv", c->dim, qkv, s->q0 * hd, s->nq * hd, 0, c->dim, neox,
                  &ly->own[2]);
            LOADW(wk, "attn_qkv", c->dim, qkv, q_all + s->kv0 * hd, kv_dim, 0, c->dim, neox,
                  &ly->own[3]);
            LOADW(wv, "attn_qkv", c->dim, qkv, q_all + full_kv + s->kv0 * hd, kv_dim, 0, c->dim, 0,
                  NULL);
        } else {
            LOADW(wq, "attn_q", c->dim, q_all, s->q0 * hd, s->nq * hd, 0, c->dim, neox,
                  &ly->own[2]);
            LOADW(wk, "attn_k", c->dim, full_kv, s->kv0 * hd, kv_dim, 0, c->dim, neox, &ly->own[3]);
            LOADW(wv, "attn_v", c->dim, full_kv, s->kv0 * hd, kv_dim, 0, c->dim, 0, NULL);
        }
        LOADW(wo, "attn_output", c->n_heads * hd, c->dim, 0, c->dim, s->q0 * hd, s->nq * hd, 0,
              &ly->own[0]);
        if (c->n_experts) {
            if ((rc = load_moe_layer(m, f, l, &ly->moe, err))) goto fail;
        } else if (c->fused_gate_up) { /* rows: gate's, then up's */
            LOADW(w_gate, "ffn_up", c->dim, 2 * c->ffn_dim, s->f0, s->nf, 0, c->dim, 0, NULL);
            LOADW(w_up, "ffn_up", c->dim, 2 * c->ffn_dim, c->ffn_dim + s->f0, s->nf, 0, c->dim, 0,
                  NULL);
        } else {
            LOADW(w_gate, "ffn_gate", c->dim, c->ffn_dim, s->f0, s->nf, 0, c->dim, 0, NULL);
            LOADW(w_up, "ffn_up", c->dim, c->ffn_dim, s->f0, s->nf, 0, c->dim, 0, NULL);
        }
        if (!c->n_experts)
            LOADW(w_down, "ffn_down", c->ffn_dim, c->dim, 0, c->dim, s->f0, s->nf, 0, &ly->own[1]);
#undef LOADW
#define LOADV(field, suffix, n_all, off, n, neox)                                                  \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                       \
        if ((rc = load_vector_part(m, f, name, n_all, off, n, neox, &ly->field, err))) goto fail;  \
    } while (0)
        if (c->qkv_bias) {
            LOADV(bq, "attn_q.bias", c->n_heads * hd, s->q0 * hd, s->nq * hd, neox);
            LOADV(bk, "attn_k.bias", full_kv, s->kv0 * hd, kv_dim, neox);
            LOADV(bv, "attn_v.bias", full_kv, s->kv0 * hd, kv_dim, 0);
        }
        if (c->qk_norm) {
            LOADV(q_norm, "attn_q_norm.weight", hd, 0, hd, neox);
            LOADV(k_norm, "attn_k_norm.weight", hd, 0, hd, neox);
        }
#undef LOADV
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((rc = load_vector(m, f, name, c->dim, &ly->attn_norm, err))) goto fail;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((rc = load_vector(m, f, name, c->dim, &ly->ffn_norm, err))) goto fail;
        if (c->post_norms) {
            snprintf(name, sizeof name, "blk.%d.post_attention_norm.weight", l);
            if ((rc = load_vector(m, f, name, c->dim, &ly->attn_post_norm, err))) goto fail;
            snprintf(name, sizeof name, "blk.%d.post_ffw_norm.weight", l);
            if ((rc = load_vector(m, f, name, c->dim, &ly->ffn_post_norm, err))) goto fail;
        }
        size_t kv_bytes = backend_kv_bytes(be, kv_slots * (size_t)kv_dim);
        ly->k_cache = be->ops->buf_alloc(be, kv_bytes);
        ly->v_cache = be->ops->buf_alloc(be, kv_bytes);
        if (!ly->k_cache || !ly->v_cache) {
            char what[96];
            snprintf(what, sizeof what, "KV cache (%zu tokens, layer %d of %d, K or V)", kv_slots,
                     l, c->n_layers);
            rc = alloc_failed(be, err, what, kv_bytes);
            goto fail;
        }
    }
    if ((rc = alloc_acts(m, err)) || (rc = reserve_table(m, err)) ||
        (rc = report_nonfinite(m, f, err)))
        goto fail;
    if (c->n_experts &&
        (rc = moe_run_create(be, c, m->sh.nf, m->sh.ns, opts->max_batch_tokens, &m->moe, err)))
        goto fail;
    if (lora_slots > 0 && (rc = lora_run_create(be, c, opts->loras, opts->n_loras, lora_slots,
                                                opts->max_batch_tokens, &m->lora, err)))
        goto fail;
    m->bad = (struct nonfinite){0}; /* it points into f, which may close before m is freed */
    drop_all_file_pages(f, m);
    *out = m;
    return 0;
fail:
    model_free(m);
    return rc;
}

void model_free(struct model *m)
{
    if (!m) return;
    if (m->tp) model_tp_free(m->tp); /* the other ranks; this is rank 0 */
    model_free_rank(m);
}

void model_free_rank(struct model *m)
{
    if (!m) return;
    struct backend *be = m->be;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            struct layer *ly = &m->layers[l];
            struct bweight *ws[] = {&ly->wq,     &ly->wk,   &ly->wv,    &ly->wo,
                                    &ly->w_gate, &ly->w_up, &ly->w_down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
                if (ws[i]->host || ws[i]->impl) be->ops->weight_release(be, ws[i]);
            const float *vecs[] = {ly->attn_norm,    ly->ffn_norm, ly->bq,     ly->bk,
                                   ly->bv,           ly->q_norm,   ly->k_norm, ly->attn_post_norm,
                                   ly->ffn_post_norm};
            for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
                if (vecs[i]) be->ops->buf_free(be, (void *)vecs[i]);
            if (ly->k_cache) be->ops->buf_free(be, ly->k_cache);
            if (ly->v_cache) be->ops->buf_free(be, ly->v_cache);
            for (size_t i = 0; i < sizeof ly->own / sizeof ly->own[0]; i++) free(ly->own[i]);
            free_moe_layer(be, m->cfg.n_experts, &ly->moe);
        }
        free(m->layers);
    }
    if (m->tok_embd.host || m->tok_embd.impl) be->ops->weight_release(be, &m->tok_embd);
    if ((m->output.host || m->output.impl) && !m->cfg.tied_output)
        be->ops->weight_release(be, &m->output);
    if (m->output_norm) be->ops->buf_free(be, m->output_norm);
    lora_run_free(m->lora);
    moe_run_free(m->moe);
    free_acts(m);
    free(m);
}

double model_weight_bytes(const struct model *m)
{
    const struct backend *be = m->be;
    const struct model_config *c = &m->cfg;
    bool logits = m->sh.rank == 0; /* the only rank that applies the output matrix */
    double b = (double)c->dim * sizeof(float);
    if (logits) b += (double)backend_weight_bytes(be, &m->output);
    if (!logits || !c->tied_output)
        b += (double)qtype_row_bytes(m->tok_embd.type, (size_t)m->tok_embd.cols);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer *ly = &m->layers[l];
        const struct bweight *ws[] = {&ly->wq,     &ly->wk,   &ly->wv,    &ly->wo,
                                      &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]->rows) b += (double)backend_weight_bytes(be, ws[i]);
        if (c->expert_shared_ffn_dim) /* the shared expert and its gate */
            b += (double)backend_weight_bytes(be, &ly->moe.sh_gate_inp) +
                 (double)backend_weight_bytes(be, &ly->moe.sh_gate) +
                 (double)backend_weight_bytes(be, &ly->moe.sh_up) +
                 (double)backend_weight_bytes(be, &ly->moe.sh_down);
        if (c->n_experts) /* the router, and the experts one token runs */
            b += (double)backend_weight_bytes(be, &ly->moe.router) +
                 (double)c->n_experts_used * (double)(backend_weight_bytes(be, &ly->moe.gate[0]) +
                                                      backend_weight_bytes(be, &ly->moe.up[0]) +
                                                      backend_weight_bytes(be, &ly->moe.down[0]));
        b += 2.0 * (double)c->dim * sizeof(float);
        if (c->qkv_bias) b += (double)(m->sh.nq + 2 * m->sh.nkv) * c->head_dim * sizeof(float);
        if (c->qk_norm) b += 2.0 * c->head_dim * sizeof(float);
    }
    return m->tp ? b + model_tp_weight_bytes(m->tp) : b;
}

const struct model_config *model_get_config(const struct model *m)
{
    return &m->cfg;
}

void model_set_tp_group(struct model *m, struct tp_group *g)
{
    m->tp = g;
}

int model_lora_count(const struct model *m)
{
    return lora_run_count(m->lora);
}

const char *model_lora_name(const struct model *m, int i)
{
    const struct lora_adapter *ad = lora_run_adapter(m->lora, i);
    return ad ? ad->name : NULL;
}

int model_lora_add(struct model *m, const struct lora_spec *spec, int *slot, struct qerr *err)
{
    *slot = -1;
    if (!m->lora || m->tp)
        return qerr_set(err, QERR_UNSUPPORTED, "%s: this model was loaded without LoRA slots",
                        spec->path);
    return lora_run_add(m->lora, spec, slot, err);
}

void model_lora_remove(struct model *m, int slot)
{
    lora_run_remove(m->lora, slot);
}

const struct model_opts *model_get_opts(const struct model *m)
{
    return &m->opts;
}

static int check_batch(const struct model *m, const struct model_batch *b, struct qerr *err)
{
    const struct model_opts *o = &m->opts;
    if (b->n_tokens < 1 || b->n_tokens > o->max_batch_tokens)
        return qerr_set(err, QERR_INVALID, "forward: %d tokens (max %d)", b->n_tokens,
                        o->max_batch_tokens);
    if (b->n_logits < 0 || b->n_logits > o->max_logits)
        return qerr_set(err, QERR_INVALID, "forward: %d logit rows (max %d)", b->n_logits,
                        o->max_logits);
    if (b->n_seqs < 1 || b->max_blocks < 1)
        return qerr_set(err, QERR_INVALID, "forward: %d sequences, %d blocks each", b->n_seqs,
                        b->max_blocks);
    int64_t slots = (int64_t)o->kv_blocks * o->kv_block_size;
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab)
            return qerr_set(err, QERR_INVALID, "forward: token id %d out of vocabulary (%d)",
                            b->tokens[i], m->cfg.vocab);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs || b->slot[i] < 0 || b->slot[i] >= slots ||
            b->pos[i] < 0 || b->pos[i] >= (int64_t)b->max_blocks * o->kv_block_size)
            return qerr_set(err, QERR_INVALID, "forward: token %d has seq %d pos %d slot %d", i,
                            b->seq[i], b->pos[i], b->slot[i]);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_idx[i] < 0 || b->logit_idx[i] >= b->n_tokens)
            return qerr_set(err, QERR_INVALID, "forward: logit index %d", b->logit_idx[i]);
    if (b->n_hidden < 0 || b->n_hidden > b->n_tokens || (b->n_hidden && !b->hidden))
        return qerr_set(err, QERR_INVALID, "forward: %d hidden rows of %d tokens", b->n_hidden,
                        b->n_tokens);
    for (int i = 0; i < b->n_hidden; i++)
        if (b->hidden_idx[i] < 0 || b->hidden_idx[i] >= b->n_tokens)
            return qerr_set(err, QERR_INVALID, "forward: hidden index %d", b->hidden_idx[i]);
    for (int64_t i = 0; i < (int64_t)b->n_seqs * b->max_blocks; i++)
        if (b->block_table[i] < -1 || b->block_table[i] >= o->kv_blocks)
            return qerr_set(err, QERR_INVALID, "forward: block id %d", b->block_table[i]);
    for (int i = 0; b->seq_lora && i < b->n_seqs; i++)
        if (b->seq_lora[i] < 0 || b->seq_lora[i] > lora_run_count(m->lora) ||
            (b->seq_lora[i] && !lora_run_adapter(m->lora, b->seq_lora[i] - 1)))
            return qerr_set(err, QERR_INVALID, "forward: sequence %d runs with LoRA %d of %d", i,
                            b->seq_lora[i] - 1, lora_run_count(m->lora));
    if (b->n_kv_copies < 0 || (b->n_kv_copies > 0 && !model_can_copy_kv(m)))
        return qerr_set(err, QERR_INVALID, "forward: %d KV copies on backend %s", b->n_kv_copies,
                        m->be->ops->name);
    for (int i = 0; i < b->n_kv_copies; i++) {
        const struct kv_block_copy *c = &b->kv_copies[i];
        if (c->src < 0 || c->src >= o->kv_blocks || c->dst < 0 || c->dst >= o->kv_blocks ||
            c->src == c->dst || c->n < 1 || c->n > o->kv_block_size)
            return qerr_set(err, QERR_INVALID,
                            "forward: KV copy of %d positions from block %d to %d", c->n, c->src,
                            c->dst);
    }
    return 0;
}

bool model_can_copy_kv(const struct model *m)
{
    return m->be->ops->buf_copy != NULL;
}

/* The batch's KV copies on this rank's layers (its KV heads), before the step writes any. */
static void copy_kv_blocks(struct model *m, const struct model_batch *b)
{
    struct backend *be = m->be;
    size_t row = backend_kv_bytes(be, (size_t)m->sh.nkv * (size_t)m->cfg.head_dim);
    size_t block = row * (size_t)m->opts.kv_block_size;
    for (int i = 0; i < b->n_kv_copies; i++) {
        const struct kv_block_copy *c = &b->kv_copies[i];
        for (int l = 0; l < m->cfg.n_layers; l++) {
            struct layer *ly = &m->layers[l];
            be->ops->buf_copy(be, (char *)ly->k_cache + (size_t)c->dst * block,
                              (char *)ly->k_cache + (size_t)c->src * block, (size_t)c->n * row);
            be->ops->buf_copy(be, (char *)ly->v_cache + (size_t)c->dst * block,
                              (char *)ly->v_cache + (size_t)c->src * block, (size_t)c->n * row);
        }
    }
}

/* x += y, out = rmsnorm(x) * w: one op where the backend fuses them. */
static void add_norm(struct backend *be, float *out, float *x, const float *y, const float *w,
                     int n, int dim, float eps)
{
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, out, x, y, w, n, dim, eps);
        return;
    }
    be->ops->add(be, x, y, (size_t)n * (size_t)dim);
    be->ops->rmsnorm(be, out, x, w, n, dim, eps);
}

/* x[n][dim] += b, row by row: one op where the backend has it. */
static void add_rows(struct backend *be, float *x, const float *b, int n, int dim)
{
    if (be->ops->add_rows) {
        be->ops->add_rows(be, x, b, n, dim);
        return;
    }
    for (int i = 0; i < n; i++) be->ops->add(be, x + (size_t)i * (size_t)dim, b, (size_t)dim);
}

/* Tensor parallelism: the row-parallel matmul left each rank a partial sum of x[n][dim]; the sum
 * over ranks, in rank order, replaces it on every rank. */
static int reduce_partial(struct model *m, float *x, int n, struct qerr *err)
{
    if (!m->comm) return 0;
    return comm_all_reduce(m->comm, x, (size_t)n * (size_t)m->cfg.dim, COMM_F32, err);
}

/* xn[n][dim] = the layer's FFN of xn (this rank's channels of it). */
static void dense_ffn(struct model *m, struct layer *ly, int l, int n)
{
    struct backend *be = m->be;
    const struct backend_ops *ops = be->ops;
    struct acts *a = &m->a;
    const struct bweight *gate_up[2] = {&ly->w_gate, &ly->w_up};
    float *gate_up_out[2] = {a->gate, a->up};
    backend_matmul_shared(be, gate_up, 2, a->xn, n, gate_up_out);
    if (m->lora_step) {
        lora_run_apply(m->lora, l, LORA_GATE, a->xn, n, a->gate);
        lora_run_apply(m->lora, l, LORA_UP, a->xn, n, a->up);
    }
    if (m->cfg.gelu)
        ops->gelu_mul(be, a->gate, a->up, (size_t)n * (size_t)m->sh.nf);
    else
        ops->silu_mul(be, a->gate, a->up, (size_t)n * (size_t)m->sh.nf);
    ops->matmul(be, &ly->w_down, a->gate, n, a->xn);
    if (m->lora_step) lora_run_apply(m->lora, l, LORA_DOWN, a->gate, n, a->xn);
}

/* The ops of one step, from the embedding to the logits, on the inputs already on the device.
 * Under tensor parallelism each rank runs them on its heads and FFN channels (m->sh), with an
 * all-reduce after attention's output matmul and after down; only rank 0 computes logits. */
static int forward_ops(struct model *m, int n, int n_logits, int n_hidden,
                       const struct attn_batch *ab, float *logits_out, struct qerr *err)
{
    struct backend *be = m->be;
    const struct backend_ops *ops = be->ops;
    const struct model_config *c = &m->cfg;
    struct acts *a = &m->a;
    int dim = c->dim, kv_dim = m->sh.nkv * c->head_dim, nq = m->sh.nq, nkv = m->sh.nkv, rc;
    struct attn_shape shape = {.n_heads = nq,
                               .n_kv_heads = nkv,
                               .head_dim = c->head_dim,
                               .scale = c->attn_scale,
                               .softcap = c->attn_softcap};
    const struct rope_spec rope = model_rope_spec(c);
    /* local layers (sliding window): their own window and rope */
    struct attn_batch ab_local = *ab;
    ab_local.window = c->swa_window;

    ops->embed(be, &m->tok_embd, a->tokens, n, a->x);
    if (c->embed_scale > 0) ops->scale(be, a->x, c->embed_scale, (size_t)n * (size_t)dim);
    ops->rmsnorm(be, a->xn, a->x, m->layers[0].attn_norm, n, dim, c->eps);
    for (int l = 0; l < c->n_layers; l++) {
        struct layer *ly = &m->layers[l];
        nvtx_push_i64("layer", l);
        const struct bweight *qkv[3] = {&ly->wq, &ly->wk, &ly->wv};
        float *qkv_out[3] = {a->q, a->k, a->v};
        backend_matmul_shared(be, qkv, 3, a->xn, n, qkv_out);
        if (m->lora_step)
            for (int t = LORA_Q; t <= LORA_V; t++)
                lora_run_apply(m->lora, l, (enum lora_target)t, a->xn, n, qkv_out[t]);
        if (ly->bq) {
            add_rows(be, a->q, ly->bq, n, nq * c->head_dim);
            add_rows(be, a->k, ly->bk, n, kv_dim);
            add_rows(be, a->v, ly->bv, n, kv_dim);
        }
        if (ly->q_norm) { /* each head's vector of q and k is a row of its own */
            ops->rmsnorm(be, a->q, a->q, ly->q_norm, n * nq, c->head_dim, c->eps);
            ops->rmsnorm(be, a->k, a->k, ly->k_norm, n * nkv, c->head_dim, c->eps);
        }
        bool local = model_layer_local(c, l);
        const struct rope_spec rs = local ? model_layer_rope(c, l) : rope;
        if (!c->no_rope_step || (l + 1) % c->no_rope_step) {
            ops->rope(be, a->q, a->pos, n, nq, c->head_dim, &rs);
            ops->rope(be, a->k, a->pos, n, nkv, c->head_dim, &rs);
        }
        ops->kv_write(be, ly->k_cache, ly->v_cache, a->k, a->v, ab, kv_dim);
        ops->attention(be, a->att, a->q, ly->k_cache, ly->v_cache, local ? &ab_local : ab, &shape);
        ops->matmul(be, &ly->wo, a->att, n, a->xn);
        if (m->lora_step) lora_run_apply(m->lora, l, LORA_O, a->att, n, a->xn);
        if ((rc = reduce_partial(m, a->xn, n, err))) {
            nvtx_pop();
            return rc;
        }
        if (ly->attn_post_norm) ops->rmsnorm(be, a->xn, a->xn, ly->attn_post_norm, n, dim, c->eps);
        if (c->residual_scale > 0)
            ops->scale(be, a->xn, c->residual_scale, (size_t)n * (size_t)dim);
        add_norm(be, a->xn, a->x, a->xn, ly->ffn_norm, n, dim, c->eps);

        if (m->moe)
            moe_run_ffn(m->moe, &ly->moe, a->xn, n, a->xn);
        else
            dense_ffn(m, ly, l, n);
        rc = reduce_partial(m, a->xn, n, err);
        if (!rc && ly->ffn_post_norm)
            ops->rmsnorm(be, a->xn, a->xn, ly->ffn_post_norm, n, dim, c->eps);
        if (!rc && c->residual_scale > 0)
            ops->scale(be, a->xn, c->residual_scale, (size_t)n * (size_t)dim);
        if (!rc && l + 1 < c->n_layers) /* the residual, and the next layer's first norm */
            add_norm(be, a->xn, a->x, a->xn, m->layers[l + 1].attn_norm, n, dim, c->eps);
        else if (!rc)
            ops->add(be, a->x, a->xn, (size_t)n * (size_t)dim);
        nvtx_pop();
        if (rc) return rc;
    }
    if (m->sh.rank != 0) return 0;
    if (n_hidden > 0) { /* xn is free after the last layer */
        ops->get_rows(be, a->xn, a->x, a->hidden_idx, n_hidden, dim);
        ops->rmsnorm(be, a->xn, a->xn, m->output_norm, n_hidden, dim, c->eps);
    }
    if (n_logits == 0) return 0;
    /* only the rows whose logits are wanted pay for the final norm and the vocab matmul */
    ops->get_rows(be, a->sel, a->x, a->logit_idx, n_logits, dim);
    ops->rmsnorm(be, a->sel, a->sel, m->output_norm, n_logits, dim, c->eps);
    ops->matmul(be, &m->output, a->sel, n_logits, logits_out);
    if (c->logit_scale > 0) /* as llama.cpp: times the reciprocal */
        ops->scale(be, logits_out, 1.0f / c->logit_scale, (size_t)n_logits * (size_t)c->vocab);
    if (c->final_softcap > 0)
        ops->softcap(be, logits_out, c->final_softcap, (size_t)n_logits * (size_t)c->vocab);
    return 0;
}

/* Steps of at most STEP_REPLAY_MAX_TOKENS tokens are replayed where the backend can (decode
 * steps: launch overhead is theirs; a prefill chunk amortizes it). */

/* The smallest power of two >= n: what a replayed step rounds its counts and block-table width
 * up to, so a growing context is a new step shape only when its table doubles (the kernels read
 * only the blocks a token's position reaches, so wider rows change no result). */
static int next_pow2(int n)
{
    int w = 1;
    while (w < n) w *= 2;
    return w;
}

/* The block table's device copy is sized at load for the widest table a step can have: max_logits
 * sequences (the engine runs at most that many) plus replay's padding row, each as wide as the
 * model's context (in blocks, as a replayed step rounds it), so no step allocates. A caller that
 * passes a wider table still gets one, allocated in that forward. */
static int reserve_table(struct model *m, struct qerr *err)
{
    const int bs = m->opts.kv_block_size;
    int blocks = (m->cfg.ctx_len + bs - 1) / bs;
    if (blocks > m->opts.kv_blocks) blocks = m->opts.kv_blocks;
    if (blocks < 1) blocks = 1;
    size_t n = (size_t)(m->opts.max_logits + 1) * (size_t)next_pow2(blocks);
    if (n > (size_t)INT32_MAX / sizeof(int32_t)) n = (size_t)INT32_MAX / sizeof(int32_t);
    m->a.table = m->be->ops->buf_alloc(m->be, n * sizeof(int32_t));
    if (!m->a.table) return alloc_failed(m->be, err, "block table", n * sizeof(int32_t));
    m->a.table_cap = (int)n;
    return 0;
}

/* b's block table, rows widened to `width` (zero-filled), then `extra` rows of the padding
 * block, in the model's host scratch. */
static const int32_t *widen_table(struct model *m, const struct model_batch *b, int width,
                                  int extra, struct qerr *err)
{
    struct acts *a = &m->a;
    size_t need = (size_t)(b->n_seqs + extra) * (size_t)width;
    if (need > a->wide_cap) {
        int32_t *t = realloc(a->wide_table, need * sizeof *t);
        if (!t) {
            qerr_set(err, QERR_NOMEM, "forward: block table of %zu", need);
            return NULL;
        }
        a->wide_table = t;
        a->wide_cap = need;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t *row = a->wide_table + (size_t)s * (size_t)width;
        memcpy(row, b->block_table + (size_t)s * (size_t)b->max_blocks,
               (size_t)b->max_blocks * sizeof *row);
        memset(row + b->max_blocks, 0, (size_t)(width - b->max_blocks) * sizeof *row);
    }
    int32_t *pad = a->wide_table + (size_t)b->n_seqs * (size_t)width;
    for (size_t i = 0; i < (size_t)extra * (size_t)width; i++) pad[i] = m->opts.kv_blocks;
    return a->wide_table;
}

/* A replayed step's token and logit counts round up to powers of two, so the steps of a
 * changing number of running sequences share a few captured shapes. The padding tokens are token
 * 0 at position 0 of one extra sequence whose table row holds only the padding block (the block
 * after the pool's last, which only they write); the padding logit rows repeat the first. Every
 * real token's result is its own (the ops are batch-invariant), and only the real logit rows are
 * read back. Returns false when padding does not fit the model's buffers. */
static bool pad_batch(const struct model *m, const struct model_batch *b, struct padded_batch *p)
{
    int n = next_pow2(b->n_tokens), nl = b->n_logits ? next_pow2(b->n_logits) : 0;
    if (n > m->opts.max_batch_tokens || nl > m->opts.max_logits || nl > n) return false;
    p->n = n;
    p->n_logits = nl;
    p->n_seqs = b->n_seqs + (n > b->n_tokens ? 1 : 0);
    int pad_slot = m->opts.kv_blocks * m->opts.kv_block_size;
    for (int i = 0; i < n; i++) {
        bool real = i < b->n_tokens;
        p->tokens[i] = real ? b->tokens[i] : 0;
        p->pos[i] = real ? b->pos[i] : 0;
        p->seq[i] = real ? b->seq[i] : b->n_seqs;
        p->slot[i] = real ? b->slot[i] : pad_slot;
    }
    for (int i = 0; i < nl; i++)
        p->logit_idx[i] = i < b->n_logits ? b->logit_idx[i] : b->logit_idx[0];
    return true;
}

int model_forward(struct model *m, const struct model_batch *b, float *logits, struct qerr *err)
{
    int rc = check_batch(m, b, err);
    if (rc) return rc;
    if (m->tp) {
        rc = model_tp_forward(m->tp, b, logits, err);
        if (!rc && b->while_running) b->while_running(b->while_ctx); /* no overlap across ranks */
        return rc;
    }
    return model_forward_rank(m, b, logits, err);
}

int model_forward_rank(struct model *m, const struct model_batch *b, float *logits,
                       struct qerr *err)
{
    int rc = 0;
    struct backend *be = m->be;
    const struct backend_ops *ops = be->ops;
    struct acts *a = &m->a;
    /* which adapters run differs from step to step: such steps are not replayed */
    m->lora_step = m->lora && lora_run_begin(m->lora, b->n_tokens, b->seq, b->seq_lora);
    /* no replay across ranks yet: a captured step would have to hold the collectives too; nor
     * with experts, routed on the host between ops */
    bool replay = ops->step_begin && !m->comm && b->n_tokens <= STEP_REPLAY_MAX_TOKENS &&
                  b->max_blocks <= 0x8000 && b->n_hidden == 0 && !m->lora_step && !m->moe;
    struct padded_batch pb;
    replay = replay && pad_batch(m, b, &pb);
    int n = replay ? pb.n : b->n_tokens, n_logits = replay ? pb.n_logits : b->n_logits;
    int n_seqs = replay ? pb.n_seqs : b->n_seqs;
    int width = replay ? next_pow2(b->max_blocks) : b->max_blocks;
    const int32_t *table = b->block_table;
    if (replay && !(table = widen_table(m, b, width, n_seqs - b->n_seqs, err))) return QERR_NOMEM;
    size_t table_n = (size_t)n_seqs * (size_t)width;
    if ((int)table_n > a->table_cap) {
        if (a->table) ops->buf_free(be, a->table);
        a->table = ops->buf_alloc(be, table_n * sizeof(int32_t));
        a->table_cap = a->table ? (int)table_n : 0;
        if (ops->step_reset) ops->step_reset(be); /* captured steps read the old table */
        if (!a->table) return qerr_set(err, QERR_NOMEM, "forward: block table of %zu", table_n);
    }
    copy_kv_blocks(m, b);
    ops->buf_write(be, a->tokens, replay ? pb.tokens : b->tokens, (size_t)n * 4);
    ops->buf_write(be, a->pos, replay ? pb.pos : b->pos, (size_t)n * 4);
    ops->buf_write(be, a->seq, replay ? pb.seq : b->seq, (size_t)n * 4);
    ops->buf_write(be, a->slot, replay ? pb.slot : b->slot, (size_t)n * 4);
    ops->buf_write(be, a->table, table, table_n * 4);
    if (n_logits > 0 && m->sh.rank == 0)
        ops->buf_write(be, a->logit_idx, replay ? pb.logit_idx : b->logit_idx,
                       (size_t)n_logits * 4);
    if (b->n_hidden > 0 && m->sh.rank == 0)
        ops->buf_write(be, a->hidden_idx, b->hidden_idx, (size_t)b->n_hidden * 4);
    struct attn_batch ab = {.n_tokens = n,
                            .pos = a->pos,
                            .seq = a->seq,
                            .slot = a->slot,
                            .n_seqs = n_seqs,
                            .block_table = a->table,
                            .max_blocks = width,
                            .block_size = m->opts.kv_block_size};
    /* what shapes the launches: the counts and the table width (buffers stay put) */
    uint64_t key = (uint64_t)n | (uint64_t)n_logits << 16 | (uint64_t)(uint32_t)width << 48;
    nvtx_pushf("forward: %d tokens, %d sequences, %d logits", b->n_tokens, b->n_seqs, b->n_logits);
    /* Where the backend's buffers are host memory, the vocab matmul writes the caller's logits
     * itself: copying them after was 2.6 % of a 16-sequence decode step (3 MiB, from beyond the
     * L2). */
    float *out = logits && !ops->mem_info && !replay ? logits : a->logits;
    if (!replay || !ops->step_begin(be, key)) {
        rc = forward_ops(m, n, n_logits, b->n_hidden, &ab, out, err);
        if (!rc && replay && !ops->step_end(be)) rc = forward_ops(m, n, n_logits, 0, &ab, out, err);
    }
    nvtx_pop();
    if (rc) return rc;
    if (m->sh.rank != 0) return 0;
    if (b->while_running && !m->tp) b->while_running(b->while_ctx);
    if (b->n_hidden > 0)
        ops->buf_read(be, b->hidden, a->xn, (size_t)b->n_hidden * (size_t)m->cfg.dim * 4);
    if (b->n_logits == 0 || out == logits) return 0;
    ops->buf_read(be, logits, a->logits,
                  (size_t)b->n_logits * (size_t)m->cfg.vocab * sizeof(float));
    return 0;
}
