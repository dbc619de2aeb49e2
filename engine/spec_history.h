/* spec_history: the answers of earlier requests, for the n-gram drafter to draft from.
 *
 * Prompt lookup (spec.h) finds a draft only where a sequence's output repeats its own prompt or
 * output. A model also repeats itself across requests: the phrasing it opens an answer with, the
 * frames of its lists and questions, the keys of a JSON answer. The history keeps the output
 * tokens of the last requests that finished (a ring of `cap` tokens, each answer followed by a
 * separator) and an index from each n-gram of length SPEC_HISTORY_NMIN..SPEC_HISTORY_NMAX to the
 * place after its most recent occurrence. When a sequence's own context has no match, the
 * drafter proposes what followed the sequence's last n tokens in the history. llama.cpp calls
 * this its dynamic n-gram cache (lookup decoding), vLLM its suffix decoding's global tree.
 *
 * Drafts only change how fast a sequence decodes, never what it outputs: every drafted token is
 * verified (docs/speculation.md). But timing can tell a client that another request's answer
 * held the same words (as a prefix cache hit can); `--spec-history 0` turns it off.
 *
 * One thread (the engine's scheduler) adds and drafts; a history is not shared between
 * threads. */
#ifndef QUERN_SPEC_HISTORY_H
#define QUERN_SPEC_HISTORY_H

#include <stdint.h>

#include "../quant/qerr.h"

#define SPEC_HISTORY_NMIN 2
#define SPEC_HISTORY_NMAX 4

struct spec_history {
    int32_t *ring;  /* [cap]: token, or -1 between two answers */
    uint64_t cap;   /* a power of two */
    uint64_t head;  /* tokens ever written: the ring holds [head - cap, head) */
    uint64_t *slot; /* [n_slots]: 1 + the position after an n-gram, 0 empty; by the n-gram's hash */
    uint64_t n_slots;
};

/* A history of about `tokens` tokens (rounded up to a power of two, at least 1024); 0: none (the
 * struct is zeroed, every call on it a no-op). */
int spec_history_init(struct spec_history *h, long tokens, struct qerr *err);
void spec_history_free(struct spec_history *h);
/* Appends one answer (its output tokens) and indexes its n-grams. */
void spec_history_add(struct spec_history *h, const int32_t *tokens, int n);
/* Up to k tokens that followed ctx's last n-gram (longest first) at its most recent occurrence
 * in the history, stopping at the end of that answer; returns how many (0: no match). *match
 * gets how many of ctx's last tokens agree with the history before the draft (up to
 * SPEC_MATCH_MAX, spec.h). */
int spec_history_draft(const struct spec_history *h, const int32_t *ctx, int n, int k, int32_t *out,
                       int *match);

#endif
