/* spec_model: the draft-model drafter (--spec draft, docs/speculation.md).
 *
 * A second, smaller GGUF with the target's tokenizer (or a lower-precision copy of the target)
 * run by the same backend. Its K/V live in its own storage but are addressed by the target's
 * blocks: block b of the KV pool holds the target's K/V for its tokens *and* the draft's, so a
 * sequence's block table, the spare blocks that hold draft positions and the rollback of
 * rejected drafts serve both models, and no second pool has to be sized or kept consistent.
 *
 * Per sequence the caller keeps `computed`: how many leading positions have the draft's K/V in
 * the sequence's blocks. A draft call first catches the draft model up on the positions it has
 * not seen (the prompt at first, then the tokens accepted since), taking the next token
 * greedily from the last row, then feeds each guess back one position at a time, batched over
 * every sequence of the call, until each has its k tokens. After verification the caller cuts
 * `computed` to what it kept: K/V of rejected guesses sit past it and are overwritten later. */
#ifndef QUERN_SPEC_MODEL_H
#define QUERN_SPEC_MODEL_H

#include <stdint.h>

#include "model.h"
#include "tokenizer.h"

struct spec_model;

struct spec_model_seq {
    const int32_t *tokens; /* the sequence: the last one is being computed by the target now */
    int n_tokens;
    int *computed;     /* in/out: leading positions whose draft K/V are in the blocks */
    const int *blocks; /* position p's K/V at blocks[p / block_size] * block_size + p % .. */
    int n_blocks;
    int ext_block; /* >= 0: block n_blocks (a spare holding draft positions); -1: none */
    int k;         /* tokens to propose, >= 1: positions n_tokens .. n_tokens + k - 2 are fed */
    int32_t *out;  /* [k]: the proposed tokens */
};

/* Loads the draft model of draft_file with opts (kv_blocks and kv_block_size those of the
 * target's pool; max_logits bounds the sequences of one draft round, max_batch_tokens its
 * tokens). QERR_INVALID when its vocabulary is not target_tok's (size or any token's text). */
int spec_model_create(const struct gguf_file *draft_file, const struct tokenizer *target_tok,
                      struct backend *be, const struct model_opts *opts, struct spec_model **out,
                      struct qerr *err);
void spec_model_free(struct spec_model *m);
/* Proposes seqs[i].k tokens for each of the n sequences (greedy: the draft's argmax, lowest id
 * on ties), leaving *computed = n_tokens + k - 1. Errors: a position outside the sequence's
 * blocks (QERR_INVALID), or the draft model's forward's. */
int spec_model_draft(struct spec_model *m, struct spec_model_seq *seqs, int n, struct qerr *err);

struct spec_cost;
/* From now on each of its forwards is timed into c (spec_policy.h; NULL: none). */
void spec_model_time_into(struct spec_model *m, struct spec_cost *c);

/* The cost policy's guess at a draft forward's cost relative to the target's until the draft
 * model is timed (spec_costs.draft_prior): a decode reads every weight once, so the ratio of
 * their files. */
double spec_model_cost_prior(const struct gguf_file *draft_file, const struct gguf_file *target);

/* QERR_INVALID unless draft_file's tokenizer has target_tok's vocabulary, token for token. */
int spec_model_check_vocab(const struct gguf_file *draft_file, const struct tokenizer *target_tok,
                           struct qerr *err);

#endif
