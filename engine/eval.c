#include "eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int eval_stats_init(struct eval_stats *s, int vocab, bool has_ref, struct qerr *err)
{
    *s = (struct eval_stats){.vocab = vocab, .has_ref = has_ref};
    if (vocab < 1) return qerr_set(err, QERR_INVALID, "eval: vocabulary of %d tokens", vocab);
    s->lp = malloc((size_t)vocab * sizeof *s->lp);
    s->lp_ref = has_ref ? malloc((size_t)vocab * sizeof *s->lp_ref) : NULL;
    if (!s->lp || (has_ref && !s->lp_ref)) {
        eval_stats_free(s);
        return qerr_set(err, QERR_NOMEM, "eval: out of memory");
    }
    return 0;
}

void eval_stats_free(struct eval_stats *s)
{
    free(s->lp);
    free(s->lp_ref);
    free(s->kls);
    *s = (struct eval_stats){0};
}

/* lp[v] = logits[v] - log sum exp(logits); returns the argmax. */
static int log_softmax(const float *logits, int vocab, float *lp)
{
    int top = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[top]) top = v;
    double max = logits[top], sum = 0.0;
    for (int v = 0; v < vocab; v++) sum += exp((double)logits[v] - max);
    double lz = max + log(sum);
    for (int v = 0; v < vocab; v++) lp[v] = (float)((double)logits[v] - lz);
    return top;
}

static bool all_finite(const float *x, int n)
{
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

int eval_stats_add(struct eval_stats *s, const float *logits, const float *ref_logits, int32_t next,
                   struct qerr *err)
{
    if (next < 0 || next >= s->vocab)
        return qerr_set(err, QERR_INVALID, "eval: token %d outside the vocabulary of %d", next,
                        s->vocab);
    if (!all_finite(logits, s->vocab) || (s->has_ref && !all_finite(ref_logits, s->vocab)))
        return qerr_set(err, QERR_FORMAT, "eval: non-finite logits at scored position %llu",
                        (unsigned long long)s->n);
    int top = log_softmax(logits, s->vocab, s->lp);
    double nll = -(double)s->lp[next];
    s->nll += nll;
    s->nll2 += nll * nll;
    if (s->has_ref) {
        int top_ref = log_softmax(ref_logits, s->vocab, s->lp_ref);
        double nr = -(double)s->lp_ref[next];
        s->nll_ref += nr;
        s->nll_ref2 += nr * nr;
        double kl = 0.0;
        for (int v = 0; v < s->vocab; v++) {
            double lr = s->lp_ref[v];
            kl += exp(lr) * (lr - (double)s->lp[v]);
        }
        if (kl < 0) kl = 0; /* rounding when the two agree to the last bit */
        s->kl += kl;
        s->kl2 += kl * kl;
        if (top == top_ref) s->same_top++;
        double dp = exp(-nll) - exp(-nr);
        s->dp += dp;
        s->dp2 += dp * dp;
        if (s->n == s->kls_cap) {
            size_t cap = s->kls_cap ? s->kls_cap * 2 : 1024;
            float *p = realloc(s->kls, cap * sizeof *p);
            if (!p) return qerr_set(err, QERR_NOMEM, "eval: out of memory");
            s->kls = p;
            s->kls_cap = cap;
        }
        s->kls[s->n] = (float)kl;
    }
    s->n++;
    return 0;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Standard error of the mean of a sample with sum s and sum of squares s2. */
static double stderr_of(double s, double s2, uint64_t n)
{
    if (n < 2) return 0.0;
    double mean = s / (double)n, var = s2 / (double)n - mean * mean;
    return var > 0 ? sqrt(var / (double)(n - 1)) : 0.0;
}

static double quantile(const float *sorted, uint64_t n, double q)
{
    double at = q * (double)(n - 1);
    uint64_t i = (uint64_t)at;
    if (i + 1 >= n) return sorted[n - 1];
    double f = at - (double)i;
    return (1 - f) * sorted[i] + f * sorted[i + 1];
}

void eval_stats_summarize(struct eval_stats *s, struct eval_summary *o)
{
    *o = (struct eval_summary){.n = s->n};
    if (!s->n) return;
    double n = (double)s->n;
    /* ppl = exp(mean nll): its error by the delta method, as llama.cpp reports it */
    o->ppl = exp(s->nll / n);
    o->ppl_err = o->ppl * stderr_of(s->nll, s->nll2, s->n);
    if (!s->has_ref) return;
    o->ppl_ref = exp(s->nll_ref / n);
    o->ppl_ref_err = o->ppl_ref * stderr_of(s->nll_ref, s->nll_ref2, s->n);
    o->kl_mean = s->kl / n;
    o->kl_err = stderr_of(s->kl, s->kl2, s->n);
    qsort(s->kls, s->n, sizeof *s->kls, cmp_float);
    o->kl_median = quantile(s->kls, s->n, 0.5);
    o->kl_p99 = quantile(s->kls, s->n, 0.99);
    o->kl_max = s->kls[s->n - 1];
    o->top1 = (double)s->same_top / n;
    o->top1_err = sqrt(o->top1 * (1 - o->top1) / n);
    o->dp_mean = s->dp / n;
    o->dp_rms = sqrt(s->dp2 / n);
}
