/* The cost-aware draft length (spec_policy.h). */
#include "spec_policy.h"

#include <string.h>

/* Weight of a new measurement in the moving averages: about the last 5 count, so a change in
 * the machine's load is followed within a few steps. */
#define COST_EMA 0.2
/* Per draft, older acceptance counts keep this weight: a sequence's text changes from copying
 * to composing within a few drafts. */
#define RATE_DECAY 0.75
/* Untried step sizes beyond the measured ones cost this fraction of a one-token step per
 * token (optimistic: a few more tokens ride on the same weight read), until measured. */
#define PRIOR_SLOPE 0.1

int spec_policy_parse(const char *text, enum spec_policy *out, struct qerr *err)
{
    if (strcmp(text, "cost") == 0)
        *out = SPEC_POLICY_COST;
    else if (strcmp(text, "acceptance") == 0)
        *out = SPEC_POLICY_ACCEPTANCE;
    else
        return qerr_set(err, QERR_INVALID, "spec policy: '%s' is not one of cost, acceptance",
                        text);
    return 0;
}

const char *spec_policy_name(enum spec_policy p)
{
    return p == SPEC_POLICY_COST ? "cost" : p == SPEC_POLICY_ACCEPTANCE ? "acceptance" : "unknown";
}

void spec_cost_init(struct spec_cost *c)
{
    memset(c, 0, sizeof *c);
}

void spec_cost_record_step(struct spec_cost *c, int n_tokens, double seconds)
{
    c->steps++;
    if (n_tokens < 1 || n_tokens > SPEC_COST_N || !(seconds > 0)) return;
    double *s = &c->step_s[n_tokens];
    *s = *s > 0 ? *s + COST_EMA * (seconds - *s) : seconds;
    c->step_at[n_tokens] = c->steps;
}

bool spec_cost_stale(const struct spec_cost *c, int n)
{
    if (n < 1 || n > SPEC_COST_N) return false; /* never timed: nothing to refresh */
    return !(c->step_s[n] > 0) || c->steps - c->step_at[n] > SPEC_COST_REFRESH;
}

double spec_cost_step(const struct spec_cost *c, int n)
{
    if (n < 1) n = 1;
    if (n <= SPEC_COST_N && c->step_s[n] > 0) return c->step_s[n];
    int lo = 0, hi = 0, first = 0;
    for (int m = 1; m <= SPEC_COST_N; m++) {
        if (!(c->step_s[m] > 0)) continue;
        if (!first) first = m;
        if (m < n) lo = m;
        if (m > n && !hi) hi = m;
    }
    if (lo && hi)
        return c->step_s[lo] + (c->step_s[hi] - c->step_s[lo]) * (n - lo) / (double)(hi - lo);
    /* smaller than any measured step: it costs no more than the smallest */
    if (hi) return c->step_s[hi];
    if (!lo) return 0;
    double slope = lo > first ? (c->step_s[lo] - c->step_s[first]) / (lo - first)
                              : PRIOR_SLOPE * c->step_s[first] / first;
    if (slope < 0) slope = 0;
    return c->step_s[lo] + slope * (n - lo);
}

void spec_rate_init(struct spec_rate *r)
{
    spec_rate_init_class(r, 0); /* one kept and one missed token: a = 0.5 */
}

void spec_rate_init_class(struct spec_rate *r, int cls)
{
    /* kept : missed, by class (spec.h): a 1-token match guesses right about a quarter of the
     * time on grounded prompts, a match of 8 or more nineteen times in twenty; the tokens
     * spelling what a grammar forces miss only where the model splits the bytes otherwise;
     * another request's answer is a guess at even odds until this one's drafts say more */
    static const double hits[SPEC_MATCH_CLASSES] = {1, 1, 1, 2, 3, 4, 8, 1};
    static const double misses[SPEC_MATCH_CLASSES] = {1, 3, 1, 1, 1, 1, 1, 1};
    if (cls < 0 || cls >= SPEC_MATCH_CLASSES) cls = 0;
    *r = (struct spec_rate){.hits = hits[cls], .misses = misses[cls]};
}

void spec_rates_init(struct spec_rate *rates)
{
    for (int c = 0; c < SPEC_MATCH_CLASSES; c++) spec_rate_init_class(&rates[c], c);
}

double spec_rate_accept(const struct spec_rate *r)
{
    double n = r->hits + r->misses;
    return n > 0 ? r->hits / n : 0;
}

void spec_rate_update(struct spec_rate *r, int drafted, int accepted)
{
    if (drafted <= 0) return;
    r->hits = RATE_DECAY * r->hits + accepted;
    r->misses = RATE_DECAY * r->misses + (accepted < drafted);
    r->idle = 0;
    if (accepted == drafted)
        r->backoff = 0;
    else if (r->probing && r->backoff < 3)
        r->backoff++;
    r->probing = false;
}

double spec_expected_tokens(double a, int k)
{
    double e = 1, p = 1;
    for (int j = 1; j <= k; j++) {
        p *= a;
        e += p;
    }
    return e;
}

/* The catch-up cost of a draft (its forward beyond a one-token one), spread over the steps it
 * is expected to serve. */
static double catchup_share(const struct spec_costs *c)
{
    if (!c->draft || c->behind <= 0) return 0;
    struct spec_costs one = *c;
    one.behind = 0;
    double extra = spec_draft_seconds(c, 1) - spec_draft_seconds(&one, 1);
    int h = c->horizon < SPEC_CATCHUP_STEPS ? c->horizon : SPEC_CATCHUP_STEPS;
    return extra > 0 ? extra / (h > 1 ? h : 1) : 0;
}

/* A draft forward of n tokens: timed, or the prior share of the target's. */
static double draft_forward(const struct spec_costs *c, int n)
{
    double t = spec_cost_step(c->draft, n);
    return t > 0 ? t : c->draft_prior * spec_cost_step(c->target, n);
}

double spec_draft_seconds(const struct spec_costs *c, int k)
{
    if (!c->draft || k <= 0) return 0;
    return draft_forward(c, c->behind + 1) + (k - 1) * draft_forward(c, 1);
}

int spec_policy_best(const struct spec_costs *c, double a, const struct spec_step *st, int k_max,
                     double *gain)
{
    *gain = 1;
    double base = spec_cost_step(c->target, st->n_tokens);
    if (!(base > 0)) return 0;
    struct spec_costs steady = *c;
    steady.behind = 0;
    double out = st->out_tokens > 1 ? st->out_tokens : 1, catchup = catchup_share(c);
    double base_rate = out / (base + st->draft_s), best_rate = base_rate;
    int best = 0;
    for (int k = 1; k <= k_max; k++) {
        double t = spec_cost_step(c->target, st->n_tokens + k) + st->draft_s +
                   spec_draft_seconds(&steady, k) + catchup;
        double rate = (out + spec_expected_tokens(a, k) - 1) / t;
        if (rate > best_rate) {
            best_rate = rate;
            best = k;
        }
    }
    *gain = best_rate / base_rate;
    return best;
}

int spec_policy_next_k(struct spec_rate *r, const struct spec_costs *c, const struct spec_step *st,
                       int k_max)
{
    if (k_max <= 0) return 0;
    double gain;
    int k = spec_policy_best(c, spec_rate_accept(r), st, k_max, &gain);
    if (k > 0 && gain >= SPEC_POLICY_MIN_GAIN) return k;
    double base = spec_cost_step(c->target, st->n_tokens);
    if (!(base > 0)) return 0; /* nothing timed yet */
    /* not worth it now: draft anyway once in a while, to see whether it has become so, if that
     * costs little next to the steps since the last draft */
    if (++r->idle < SPEC_PROBE_EVERY << r->backoff) return 0;
    if (k < 1) k = 1;
    double cost = spec_cost_step(c->target, st->n_tokens + k) - base + spec_draft_seconds(c, k);
    if (cost > SPEC_PROBE_SHARE * r->idle * base) return 0;
    r->probing = true;
    return k;
}

void spec_step_add(struct spec_step *st, const struct spec_costs *c, double a, int k)
{
    if (k <= 0) return;
    struct spec_costs steady = *c;
    steady.behind = 0;
    st->n_tokens += k;
    st->out_tokens += spec_expected_tokens(a, k) - 1;
    st->draft_s += spec_draft_seconds(&steady, k) + catchup_share(c);
}
