/* lora: low-rank adapters (LoRA) read from GGUF files as llama.cpp's convert_lora_to_gguf.py
 * writes them (general.type "adapter", adapter.type "lora", adapter.lora.alpha; tensors
 * "blk.N.attn_q.weight.lora_a" [rank][in] and ".lora_b" [out][rank]).
 *
 * An adapted matmul computes y = x W^T + scale * (x A^T) B^T with scale = user_scale * alpha /
 * rank (user_scale alone when alpha is 0), as llama.cpp's build_lora_mm does. The loader keeps A
 * and B as float32 (whatever type the file holds) and folds scale into B, so the model runs two
 * plain matmuls per adapted weight; it also moves B's rows of q and k as the model moves W's
 * (rope_neox). Adapters of the token embedding or the output matrix are refused; norm vectors
 * are skipped, as llama.cpp skips them. */
#ifndef QUERN_LORA_H
#define QUERN_LORA_H

#include "../kernels/backend.h"
#include "model.h"

/* The matrices of a layer an adapter may change, in the model's order. */
enum lora_target {
    LORA_Q = 0,
    LORA_K,
    LORA_V,
    LORA_O,
    LORA_GATE,
    LORA_UP,
    LORA_DOWN,
    LORA_N_TARGETS,
};

/* "attn_q", "attn_k", ... as GGUF names the target's weight */
const char *lora_target_name(enum lora_target t);

/* One adapted matrix: a [rank][in] and b [out][rank] (scale folded in), float32 bweights whose
 * host arrays the adapter owns. rank 0: the adapter leaves this matrix alone. */
struct lora_pair {
    int rank;
    struct bweight a, b;
};

#define LORA_NAME_MAX 64

struct lora_adapter {
    char name[LORA_NAME_MAX];
    float alpha, user_scale; /* a pair's B holds user_scale * alpha / its rank (alpha 0: 1) */
    int n_layers, n_pairs;
    struct lora_pair *pairs; /* [n_layers][LORA_N_TARGETS] */
};

static inline struct lora_pair *lora_pair_at(const struct lora_adapter *ad, int layer,
                                             enum lora_target t)
{
    return &ad->pairs[(size_t)layer * LORA_N_TARGETS + (size_t)t];
}

/* Reads the adapter at path for a model of configuration cfg (the architecture and every shape
 * must match it). name: what requests call it (NULL: the file's base name without ".gguf"). The
 * bweights are left unprepared (model_load prepares them on its backend). */
int lora_load(const char *path, const char *name, float user_scale, const struct model_config *cfg,
              struct lora_adapter **out, struct qerr *err);
/* The same from an open file (the caller closes it; the adapter keeps nothing of it). */
int lora_load_file(const struct gguf_file *f, const char *name, float user_scale,
                   const struct model_config *cfg, struct lora_adapter **out, struct qerr *err);
void lora_free(struct lora_adapter *ad);

/* The adapters a model runs with, on its backend (engine/lora_run.c): their matrices prepared
 * and the scratch a step needs, allocated once for max_tokens tokens. Each sequence of a batch
 * runs with one adapter or none; an adapter runs on its own tokens only (gathered into a compact
 * batch when others share the step), and a token whose sequence runs without adapter j gets
 * exact zeros from j, so its result is the bits it has without any adapter loaded, whatever
 * shares the batch. */
struct lora_run;

/* cap slots (>= n_specs, >= 1), specs[i] loaded into slot i. */
int lora_run_create(struct backend *be, const struct model_config *cfg,
                    const struct lora_spec *specs, int n_specs, int cap, int max_tokens,
                    struct lora_run **out, struct qerr *err);
void lora_run_free(struct lora_run *r);
/* Loads spec into the lowest free slot (*slot); QERR_FULL when none is free; a name already
 * loaded is QERR_INVALID. Between steps only. */
int lora_run_add(struct lora_run *r, const struct lora_spec *spec, int *slot, struct qerr *err);
/* Unloads the adapter in slot (no sequence may run with it any more). Between steps only. */
void lora_run_remove(struct lora_run *r, int slot);
/* The slots (loaded or free), and slot i's adapter (NULL: free). */
int lora_run_count(const struct lora_run *r);
const struct lora_adapter *lora_run_adapter(const struct lora_run *r, int i);
/* Readies a step of n tokens whose token i belongs to sequence seq[i] (host arrays) and
 * sequence s runs with adapter seq_lora[s] - 1 (0: none; seq_lora NULL: no sequence has one).
 * Returns whether any token of the step runs with an adapter. */
bool lora_run_begin(struct lora_run *r, int n, const int32_t *seq, const int32_t *seq_lora);
/* y[n][out] += each adapter's share of the step's matmul of target t of layer: after the base
 * matmul y = x W^T of lora_run_begin's n tokens. */
void lora_run_apply(struct lora_run *r, int layer, enum lora_target t, const float *x, int n,
                    float *y);

#endif
