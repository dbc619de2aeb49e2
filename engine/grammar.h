/* grammar: constrained decoding. A compiled grammar says which byte strings an output may be;
 * a matcher follows one sequence through it and gives, before each sampling step, the set of
 * tokens that keep the output inside the grammar.
 *
 * Sources (grammar_compile): a JSON Schema (engine/json_schema.c), "any JSON object", a regex
 * (the subset in engine/grammar_regex.c), a choice among literal strings, tool calls (a ChatML
 * <tool_call> block per call, arguments by each function's schema), and GBNF (the subset in
 * engine/grammar_gbnf.c).
 *
 * Whitespace policy of the JSON grammars: no whitespace anywhere except one optional space after
 * each ',' and ':' (so both {"a":1} and {"a": 1, "b": 2} are accepted, never newlines).
 * Object properties come in the order the schema lists them; optional ones may be left out.
 *
 * A compiled grammar is immutable except for its token-mask cache, which only the thread that
 * computes masks (the engine thread) touches; it is reference-counted so one compilation serves
 * many requests (grammar_cache.h). */
#ifndef QUERN_GRAMMAR_H
#define QUERN_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../quant/qerr.h"
#include "tokenizer.h"

enum grammar_kind {
    GRAMMAR_JSON_SCHEMA, /* text: a JSON Schema document */
    GRAMMAR_JSON_OBJECT, /* text ignored: any JSON object */
    GRAMMAR_REGEX,       /* text: a regex matched against the whole output */
    GRAMMAR_CHOICE,      /* text: a JSON list of strings; the output is one of them */
    GRAMMAR_TOOL_CALLS,  /* text: {"tools":[{"name","parameters"}...],"parallel":bool} */
    GRAMMAR_GBNF,        /* text: rules in the GBNF subset of engine/grammar_gbnf.c */
    /* OR'ed into a kind: the output first reasons freely up to "</think>" (a reasoning model's
     * block, which its prompt opened), then, after any spaces and newlines, holds to the
     * grammar (vLLM's structured outputs after the reasoning ends) */
    GRAMMAR_AFTER_THINK = 0x100,
};

/* Limits: a call stack deeper than this (JSON nested in recursive rules) is not followed. */
#define GRAMMAR_MAX_DEPTH  32
#define GRAMMAR_MAX_STACKS 64

struct grammar;
struct grammar_vocab;
struct grammar_matcher;

/* Compiles text[0..len). QERR_UNSUPPORTED names an unsupported keyword or construct,
 * QERR_INVALID a malformed source (the message names where), QERR_FULL a grammar too big. */
int grammar_compile(enum grammar_kind kind, const char *text, size_t len, struct grammar **out,
                    struct qerr *err);
void grammar_ref(struct grammar *g);
void grammar_unref(struct grammar *g);       /* frees at zero; NULL is fine */
int grammar_states(const struct grammar *g); /* automaton size, for logs and tests */

/* The vocabulary as a byte trie (control tokens excluded; end-of-generation tokens allowed
 * only where the grammar accepts). n_logits: the model's logits row (ids past the tokenizer's
 * vocabulary are never allowed). Built once per tokenizer; immutable, shareable. */
int grammar_vocab_create(const struct tokenizer *tok, int n_logits, struct grammar_vocab **out,
                         struct qerr *err);
/* The same from raw token bytes (benchmarks with made-up vocabularies): token eog ends
 * generation; tokens with no bytes are never allowed. */
int grammar_vocab_create_raw(int vocab, const char *const *bytes, const size_t *len, int32_t eog,
                             struct grammar_vocab **out, struct qerr *err);
void grammar_vocab_free(struct grammar_vocab *v);
int grammar_vocab_size(const struct grammar_vocab *v);
/* Words of the allowed-token bitmask: (vocab + 63) / 64. */
int grammar_mask_words(const struct grammar_vocab *v);

/* A matcher holds its own reference to g. */
int grammar_matcher_create(struct grammar *g, const struct grammar_vocab *v,
                           struct grammar_matcher **out, struct qerr *err);
void grammar_matcher_free(struct grammar_matcher *m);
/* Fills mask[grammar_mask_words] with the tokens allowed next (bit t of word t/64); returns how
 * many are allowed (0: a dead end). Exact: a token is set iff its bytes keep the output a
 * prefix of some string of the grammar (end-of-generation tokens iff the output so far is a
 * whole string of it). */
int grammar_matcher_mask(struct grammar_matcher *m, uint64_t *mask);
/* Advances past token t; QERR_INVALID (state unchanged) when t is not allowed. */
int grammar_matcher_accept(struct grammar_matcher *m, int32_t t, struct qerr *err);
/* Advances past raw bytes (tests; a forced prefix). */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n,
                                 struct qerr *err);
/* The output so far is a whole string of the grammar. */
bool grammar_matcher_accepting(const struct grammar_matcher *m);
/* Accepting, and no byte can follow: only end-of-generation remains. */
bool grammar_matcher_done(const struct grammar_matcher *m);
bool grammar_vocab_is_eog(const struct grammar_vocab *v, int32_t t);
/* The bytes every continuation of the output must begin with, at most cap of them: while the
 * output is not a whole string of the grammar and exactly one byte can follow, that byte (a
 * JSON Schema's property name and its '":', an enum value once it is told apart). Returns how
 * many were written (0: the next byte is free, or the output may end here). The position is
 * unchanged. Speculation drafts the tokens that spell them. */
int grammar_matcher_forced(struct grammar_matcher *m, char *out, int cap);
/* How many of toks[0..n) the grammar allows one after another from the matcher's position, as
 * grammar_matcher_accept would take them (an end-of-generation token ends the run); the
 * position is unchanged. */
int grammar_matcher_allowed_run(struct grammar_matcher *m, const int32_t *toks, int n);

/* Fills g's token-mask cache for every state (a trie walk each), so masks are lookups from the
 * first step on; skipped (0) when g has more than max_states states. Only while no other thread
 * uses g: right after grammar_compile (grammar_cache_get does it before publishing). */
int grammar_precompute(struct grammar *g, const struct grammar_vocab *v, int max_states,
                       struct qerr *err);

/* Sets logits of tokens not in mask to -INFINITY. */
void grammar_mask_apply(const uint64_t *mask, float *logits, int vocab);

#endif
