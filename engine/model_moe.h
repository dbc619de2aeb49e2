/* model_moe: a mixture-of-experts FFN (Mixtral, Qwen3-MoE) on the backend's ops.
 *
 * A router (a [n_experts][dim] matrix) scores each token; the softmax of its scores over all
 * experts picks the n_experts_used best, whose weights are renormalized to sum 1, as
 * transformers' Mixtral and Qwen3-MoE and llama.cpp's softmax routing do (Qwen2-MoE keeps the
 * probabilities as they are, and adds a shared expert every token runs, weighted by the sigmoid
 * of its own gate, after the routed ones). Each expert is a SwiGLU
 * FFN of expert_ffn_dim channels: down(silu(gate x) * up x). The routing runs on the host between
 * ops (the router's scores are read back), the experts on the tokens routed to them only (gathered
 * into one run per expert), and backend.h's moe_combine sums a token's weighted outputs in expert
 * order, as transformers' index_add_ does. A token's result depends on no other token of its batch:
 * each expert's matmul is batch-invariant, the routing is per token, and the sum's order is the
 * token's own. */
#ifndef QUERN_MODEL_MOE_H
#define QUERN_MODEL_MOE_H

#include "../kernels/backend.h"
#include "model.h"

/* One layer's experts: views of the file's [n_experts][rows][cols] tensors, one bweight each
 * (under tensor parallelism, this rank's channels of each expert, as the dense FFN's). */
struct moe_weights {
    struct bweight router;
    struct bweight *gate, *up, *down; /* [n_experts] each */
    void **own[3]; /* [n_experts] each: copies the file's bytes could not serve (down's columns) */
    /* Qwen2-MoE's shared expert (expert_shared_ffn_dim): its gate's weights as a [1][dim]
     * matrix, and its FFN (this rank's channels; sh_own: down's columns copied, or NULL) */
    struct bweight sh_gate_inp, sh_gate, sh_up, sh_down;
    void *sh_own;
};

struct moe_run;

/* Scratch for batches of up to max_tokens tokens (a forward's batch is run in chunks that fit
 * fixed buffers), experts of ff channels and a shared one of sff (this rank's shares of
 * c->expert_ffn_dim and c->expert_shared_ffn_dim; sff 0: none). */
int moe_run_create(struct backend *be, const struct model_config *c, int ff, int sff,
                   int max_tokens, struct moe_run **out, struct qerr *err);
void moe_run_free(struct moe_run *r);

/* out[n][dim] = the mixture of w's experts on x[n][dim]; out may alias x. */
void moe_run_ffn(struct moe_run *r, const struct moe_weights *w, const float *x, int n, float *out);

#endif
