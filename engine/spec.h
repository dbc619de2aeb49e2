/* spec: speculative decoding's drafters and the per-sequence draft-length policy.
 *
 * A drafter guesses the next tokens of a sequence cheaply; the model then computes the last
 * token and the guesses in one step and the sampler decides, position by position, exactly as
 * plain decoding would (engine.c, generate.c): a guess is kept while the sampled token equals
 * it, and the first sampled token that differs is emitted instead. Because the kernels are
 * batch-invariant, the logits of a position verified inside a k+1-token step are the ones it
 * would have had alone, so the output is byte-identical to decoding without speculation
 * (docs/speculation.md has the argument).
 *
 * The n-gram (prompt lookup) drafter needs no model: it finds the most recent earlier place
 * where the last n tokens (n from ngram_max down to ngram_min) occurred in the prompt or the
 * output and proposes what followed there. It pays off where the output copies its input
 * (edits, extraction, code, summaries quoting the text). The draft-model drafter
 * (spec_model.h) needs K/V of its own and runs batched over the step's sequences, so it has its
 * own interface; the verification, the draft length and the rollback are the same. */
#ifndef QUERN_SPEC_H
#define QUERN_SPEC_H

#include <stdint.h>

#include "../quant/qerr.h"

struct spec_history;

enum spec_mode {
    SPEC_OFF = 0,
    SPEC_NGRAM,
    SPEC_DRAFT, /* a draft model proposes (spec_model.h); spec_draft here proposes nothing */
};

/* The longest draft a step verifies; also what the drafted-length histogram spans. */
#define SPEC_K_MAX 16

/* "off", "ngram" or "draft" (as --spec spells them); QERR_INVALID naming the text otherwise. */
int spec_mode_parse(const char *text, enum spec_mode *out, struct qerr *err);
const char *spec_mode_name(enum spec_mode m);

struct spec_drafter {
    enum spec_mode mode;
    int ngram_min, ngram_max; /* n-gram lengths tried, longest first */
    /* earlier requests' answers, drafted from where ctx itself has no match (NULL: none) */
    const struct spec_history *history;
};

/* A drafter for mode (SPEC_OFF: one that never proposes). */
void spec_drafter_init(struct spec_drafter *d, enum spec_mode mode);
/* Up to k (<= SPEC_K_MAX) tokens likely to follow ctx[0..n), written to out; returns how many
 * (0: no guess). *match (may be NULL) gets how many tokens before the guess agree with ctx's
 * last ones, counted up to SPEC_MATCH_MAX (0 with no guess): how much the guess rests on.
 * Reads only ctx: the same context always gives the same draft. */
int spec_draft(const struct spec_drafter *d, const int32_t *ctx, int n, int k, int32_t *out,
               int *match);

/* spec_draft, then (no draft found, SPEC_NGRAM) the drafter's history (spec_history.h): the
 * draft's length, *cls its class (spec_match_class, or SPEC_CLASS_HISTORY). */
int spec_draft_classed(const struct spec_drafter *d, const int32_t *ctx, int n, int k, int32_t *out,
                       int *cls);

/* A draft from a request's predicted output (OpenAI's Predicted Outputs), in every mode (with
 * SPEC_OFF the prediction is the only source, with SPEC_DRAFT it comes before the draft model):
 * with nothing generated yet (n_out 0) the prediction's first k tokens (*match SPEC_MATCH_MAX);
 * otherwise, for g from ngram_max down to ngram_min, the output's last g tokens found in pred,
 * the occurrence ending nearest the output's own length (where an unedited copy would be),
 * and up to k tokens that follow it (*match g). Returns the draft's length (0: none). */
int spec_draft_prediction(const struct spec_drafter *d, const int32_t *pred, int n_pred,
                          const int32_t *out, int n_out, int k, int32_t *dst, int *match);

/* The agreement spec_draft counts at most. */
#define SPEC_MATCH_MAX 16
/* Drafts are told apart by what they rest on, since how often their tokens are kept differs
 * by that far more than by sequence (the default model on grounded prompts: the first token
 * of a draft found by a 1-token match is kept about a quarter of the time, by a match of 8 or
 * more nineteen times in twenty). Class 0: a draft model's guesses; 1, 2, 3: n-gram drafts
 * resting on that many tokens; 4: 4 to 7; 5: 8 or more; 6 and 7 below. */
#define SPEC_MATCH_CLASSES 8
/* Class 6: the tokens that spell the bytes a grammar forces next (engine_grammar.c): kept
 * unless the model splits those bytes into other tokens. */
#define SPEC_CLASS_GRAMMAR 6
/* Class 7: a draft from earlier requests' answers (spec_history.h). */
#define SPEC_CLASS_HISTORY 7
/* The class of a draft resting on match tokens (0 for a draft model's: match 0). */
int spec_match_class(int match);

/* Draft length per sequence, from its recent acceptance: doubled after a fully accepted draft,
 * cut to one more than what was accepted otherwise; after drafts that were wholly rejected the
 * sequence drafts nothing for a few steps (1, 2, 4, .. 16 after consecutive misses), so text
 * the drafter cannot guess costs little more than plain decoding. */
struct spec_state {
    int k;        /* next draft length, 1..k_max */
    int misses;   /* drafts in a row with nothing accepted */
    int cooldown; /* steps left without drafting */
};

void spec_state_init(struct spec_state *st, int k_max);
/* The draft length for this step (0: do not draft now); counts down a cooldown. */
int spec_state_next_k(struct spec_state *st);
/* Records a verified draft of `drafted` tokens of which `accepted` were kept. */
void spec_state_update(struct spec_state *st, int drafted, int accepted, int k_max);

#endif
