/* spec_policy: the cost-aware draft length (engine_opts.spec_policy = SPEC_POLICY_COST).
 *
 * A draft pays only if the tokens it adds are worth what they cost: verifying k more tokens
 * in a step makes the step dearer (on a CPU a step's time grows with its tokens past a few),
 * and a draft model costs a forward per guessed token. The engine therefore measures, as
 * moving averages, the forward time of a step of n tokens (`spec_cost_record_step`), the same
 * for the draft model's forwards (a second `spec_cost`; the n-gram drafter's scan takes
 * microseconds and counts as free), and keeps per sequence the rate at which its draft
 * tokens are accepted (`spec_rate`). A draft model first catches up on the positions it has
 * not computed (the prompt, the first time): that cost is spread over the next
 * SPEC_CATCHUP_STEPS steps it buys drafts for. If each draft token is kept with probability a
 * (until the first miss), a draft of k tokens yields on average
 *     E(k) = 1 + a + a^2 + .. + a^k = (1 - a^(k+1)) / (1 - a)
 * output tokens from the step, and the policy picks the k that maximizes output tokens per
 * second of the step; if no k is expected to beat not drafting by SPEC_POLICY_MIN_GAIN, it
 * drafts nothing, and now and then drafts anyway (a probe) so that a sequence whose text turns
 * predictable, or a machine whose load changed, can come back.
 *
 * The policy chooses only how many tokens are drafted, never which tokens come out: the
 * output is byte-identical whatever it decides (spec.h), so the wall-clock time it reads
 * changes the speed of a run, not its text. Everything here is arithmetic on the numbers
 * given: the unit test feeds it synthetic costs. */
#ifndef QUERN_SPEC_POLICY_H
#define QUERN_SPEC_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "../quant/qerr.h"
#include "spec.h"

enum spec_policy {
    SPEC_POLICY_COST = 0,   /* k from measured costs and acceptance (default) */
    SPEC_POLICY_ACCEPTANCE, /* k from acceptance alone (spec_state in spec.h): timing-free */
};

/* "cost" or "acceptance"; QERR_INVALID naming the text otherwise. */
int spec_policy_parse(const char *text, enum spec_policy *out, struct qerr *err);
const char *spec_policy_name(enum spec_policy p);

/* Steps of up to this many tokens are timed; larger ones are extrapolated. */
#define SPEC_COST_N 64
/* spec_cost_stale: a step size last timed this many steps ago is timed again. */
#define SPEC_COST_REFRESH 64
/* A draft must be expected to make the step this much faster per output token: smaller gains
 * are within the error of the estimates. */
#define SPEC_POLICY_MIN_GAIN 1.03
/* Steps without a draft before a probe: this, doubled after each probe that was not wholly
 * accepted, up to 8x. */
#define SPEC_PROBE_EVERY 16

/* A probe may cost at most this share of the time since the sequence last drafted. */
#define SPEC_PROBE_SHARE 0.05
/* A draft model's catch-up is charged to this many steps (fewer if the request ends first). */
#define SPEC_CATCHUP_STEPS 32

struct spec_cost {
    double step_s[SPEC_COST_N + 1];    /* [n]: forward seconds of an n-token step; 0: unseen */
    uint64_t step_at[SPEC_COST_N + 1]; /* [n]: `steps` when step_s[n] was last measured */
    uint64_t steps;                    /* steps recorded */
};

void spec_cost_init(struct spec_cost *c);
/* A forward of n_tokens took seconds (steps of more than SPEC_COST_N tokens are counted, not
 * timed). */
void spec_cost_record_step(struct spec_cost *c, int n_tokens, double seconds);
/* The estimated seconds of an n-token step: measured, else interpolated between the nearest
 * measured sizes, else extrapolated from the largest smaller one (with the slope measured
 * below it, or 10 % of a one-token step per token when there is none: an optimistic guess,
 * so an untried size gets tried and measured); 0 when nothing is measured yet. */
double spec_cost_step(const struct spec_cost *c, int n);
/* True when an n-token step has not been timed for SPEC_COST_REFRESH steps (or ever): the
 * engine then drafts nothing this step, which times it (the baseline every draft is compared
 * with; load on a shared machine moves it). */
bool spec_cost_stale(const struct spec_cost *c, int n);

/* A sequence's draft acceptance: hits and misses are decayed counts (each draft is a run of
 * kept tokens ended by at most one miss, so a = hits / (hits + misses) estimates the chance a
 * draft token is kept); idle counts the steps the policy drafted nothing, for the probes. */
struct spec_rate {
    double hits, misses;
    int idle, backoff;
    bool probing; /* the pending draft is a probe */
};

void spec_rate_init(struct spec_rate *r);
/* spec_rate_init with the prior of drafts of class cls (spec_match_class): a draft model's
 * (0) and a 2-token match's are even, a 1-token match's 1 in 4, longer ones' 2 in 3 up to
 * 4 in 5; a sequence's own drafts take over within a few. */
void spec_rate_init_class(struct spec_rate *r, int cls);
/* spec_rate_init_class for every class of rates[SPEC_MATCH_CLASSES]. */
void spec_rates_init(struct spec_rate *rates);
double spec_rate_accept(const struct spec_rate *r);
/* Records a verified draft of `drafted` tokens of which `accepted` were kept. */
void spec_rate_update(struct spec_rate *r, int drafted, int accepted);

/* E(k) above: the expected output tokens of a step that verifies a k-token draft. */
double spec_expected_tokens(double a, int k);

/* What the costs are for one sequence's draft this step. */
struct spec_costs {
    const struct spec_cost *target;
    /* the draft model's forwards; NULL: drafting is free (the n-gram drafter) */
    const struct spec_cost *draft;
    /* until the draft model has been timed, its forward costs this times the target's (the
     * ratio of their weight bytes: a decode reads every weight once) */
    double draft_prior;
    int behind;  /* positions the draft model has to catch up on before the last token */
    int horizon; /* output tokens the sequence may still produce */
};

/* Seconds a draft model takes to propose k tokens `behind` positions behind: a forward of
 * behind + 1 tokens, then k - 1 of one; 0 without a draft model. */
double spec_draft_seconds(const struct spec_costs *c, int k);

/* The step as built so far: its tokens, the output tokens expected of it, and the drafting
 * seconds already spent on it. */
struct spec_step {
    int n_tokens;
    double out_tokens;
    double draft_s;
};

/* The k in 0..k_max with the most expected output tokens per second for a sequence with
 * acceptance a joining step st, and its speed relative to k = 0 (*gain, 1 for k = 0), with a
 * draft model's catch-up spread over min(horizon, SPEC_CATCHUP_STEPS) steps. Returns 0
 * (gain 1) when the costs are not known. */
int spec_policy_best(const struct spec_costs *c, double a, const struct spec_step *st, int k_max,
                     double *gain);
/* The draft length for a sequence this step: spec_policy_best's k when its gain reaches
 * SPEC_POLICY_MIN_GAIN; else 0, or a probe (the best k, at least 1) after enough idle steps,
 * if what it costs in all (catch-up included) is at most SPEC_PROBE_SHARE of the time those
 * steps took. */
int spec_policy_next_k(struct spec_rate *r, const struct spec_costs *c, const struct spec_step *st,
                       int k_max);
/* Adds a draft of k tokens by a sequence with acceptance a to st. */
void spec_step_add(struct spec_step *st, const struct spec_costs *c, double a, int k);

#endif
