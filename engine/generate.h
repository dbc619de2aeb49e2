/* generate: runs one sequence alone through the model (chunked prefill, then one token per
 * step), for the CLI and for tests that need the one-at-a-time result. It uses KV blocks
 * 0..k-1 of the model's storage as a contiguous block table. */
#ifndef QUERN_GENERATE_H
#define QUERN_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sample.h"
#include "spec.h"
#include "spec_model.h"
#include "spec_policy.h"

struct gen_spec_stats {
    int drafts, drafted, accepted; /* drafts verified, tokens in them, tokens kept */
};

struct trace;

struct gen_opts {
    int n_predict;     /* tokens to generate */
    int prefill_chunk; /* prompt tokens per forward; <= the model's max_batch_tokens */
    struct sample_params sample;
    /* engine/trace.h: each forward as a step (its sampling inside it) and the run as one
     * request; NULL: none */
    struct trace *trace;
    /* speculative decoding (spec.h): drafts of up to spec_k tokens (also bounded by the
     * model's max_logits - 1) verified in one forward each; the tokens are those of SPEC_OFF */
    enum spec_mode spec;
    int spec_k;
    struct gen_spec_stats *spec_stats; /* filled when not NULL */
    /* SPEC_DRAFT: the draft model (spec_model.h), loaded with at least this run's KV blocks */
    struct spec_model *draft;
    /* how long each draft is (spec_policy.h): SPEC_POLICY_COST (0) weighs the forwards' measured
     * times against the acceptance, as the engine does; SPEC_POLICY_ACCEPTANCE uses acceptance
     * alone (spec.h's spec_state) */
    enum spec_policy spec_policy;
    /* SPEC_POLICY_COST: a draft forward's cost relative to the target's until it is timed
     * (spec_model_cost_prior; 0: free) */
    double draft_prior;
    /* 1 + the index of the LoRA adapter (model_opts.loras) to run with; 0: none */
    int lora;
};

/* Called for every generated token with the logits it was sampled from (before sampling
 * changed them); return true to stop early. */
typedef bool (*gen_token_fn)(void *ctx, int32_t token, const float *logits);

/* QERR_FULL when prompt + n_predict exceeds the context length or the KV storage. */
int generate_run(struct model *m, const int32_t *prompt, size_t n_prompt, const struct gen_opts *o,
                 gen_token_fn on_token, void *ctx, struct qerr *err);

/* Logits after every token of seq (n x vocab, malloc'd into *out), computed in prefill chunks:
 * what a reference framework's single forward over the whole sequence returns. */
int generate_all_logits(struct model *m, const int32_t *seq, size_t n, int chunk, float **out,
                        struct qerr *err);
/* The same with LoRA adapter lora - 1 (model_opts.loras; 0: none). */
int generate_all_logits_lora(struct model *m, const int32_t *seq, size_t n, int chunk, int lora,
                             float **out, struct qerr *err);

#endif
