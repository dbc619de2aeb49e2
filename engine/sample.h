/* sample: turns one row of logits into a token.
 *
 * Order of operations (as llama.cpp and vLLM apply them): penalties on the raw logits
 * (repetition divides positive / multiplies negative logits of seen tokens; presence and
 * frequency subtract), then temperature, then top-k, top-p and min-p on the softmax, then a draw
 * from the request's own RNG. Temperature 0 is greedy (ties go to the lowest id). Each request
 * owns its sampler, so its output depends only on its seed and its logits, never on the batch. */
#ifndef QUERN_SAMPLE_H
#define QUERN_SAMPLE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "../quant/qerr.h"

struct sample_params {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;
};

/* The two sets of defaults, decided here and nowhere else: the API's (OpenAI's: temperature 1,
 * every filter off), which the server and the engine use, and the interactive CLI's (quern
 * generate: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, as llama.cpp's CLI samples).
 * quern bench decodes greedily (temperature 0): it measures speed, not text. */
void sample_params_default(struct sample_params *p);
void sample_params_cli_default(struct sample_params *p);
/* QERR_INVALID naming the first parameter out of range. */
int sample_params_check(const struct sample_params *p, struct qerr *err);

struct sampler {
    struct sample_params p;
    uint64_t rng[4]; /* xoshiro256** state */
    int vocab;
    int32_t *idx;     /* [vocab] scratch */
    int32_t *tmp;     /* [vocab] scratch */
    float *prob;      /* [vocab] scratch */
    uint32_t *counts; /* [vocab] how often each token appeared in the history */
};

int sampler_init(struct sampler *s, const struct sample_params *p, int vocab, struct qerr *err);
void sampler_free(struct sampler *s);
/* Records a token of the context (prompt or output) for the penalties. */
void sampler_accept(struct sampler *s, int32_t token);
/* Applies the repetition, presence and frequency penalties to logits[vocab] in place (the
 * first stage of sampler_sample). */
void sampler_penalize(struct sampler *s, float *logits);
/* True when sampler_penalize changes logits (a penalty is set). */
bool sampler_penalizes(const struct sampler *s);
/* Chooses a token from logits[vocab] (modified in place). */
int32_t sampler_sample(struct sampler *s, float *logits);
/* sampler_sample after the penalties: chooses from logits[vocab] as they are, reading them only
 * (a caller with no edits to make samples the forward's row without copying it). */
int32_t sampler_pick(struct sampler *s, const float *logits);
/* Log-softmax of the unmodified logits at token: the log-probability a client sees. */
float sample_logprob(const float *logits, int vocab, int32_t token);
/* A row's log-softmax terms, so that many tokens' log-probabilities (top_logprobs) come out as
 * sample_logprob gives each, bit for bit: the largest logit and log(sum exp(logit - max)). */
struct log_softmax {
    float max;
    double log_sum;
};
struct log_softmax sample_log_softmax(const float *logits, int vocab);
/* The log-probability of a token whose logit is `logit` in the row of ls. */
float sample_log_softmax_at(struct log_softmax ls, float logit);
/* The lowest id of the largest of x[0..n) (NaNs never win; 0 when x[0] is NaN): greedy
 * decoding's choice, the same on every run. */
int32_t sample_argmax(const float *x, int n);
/* Uniform double in [0, 1) from the sampler's stream. */
double sampler_uniform(struct sampler *s);

#endif
