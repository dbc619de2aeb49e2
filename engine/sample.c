#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sample_params_default(struct sample_params *p)
{
    *p = (struct sample_params){.temperature = 1.0f,
                                .top_k = 0,
                                .top_p = 1.0f,
                                .min_p = 0.0f,
                                .repetition_penalty = 1.0f,
                                .presence_penalty = 0.0f,
                                .frequency_penalty = 0.0f,
                                .seed = 0};
}

int sample_params_check(const struct sample_params *p, struct qerr *err)
{
    if (!(p->temperature >= 0 && p->temperature <= 100))
        return qerr_set(err, QERR_INVALID, "temperature %g not in [0, 100]", p->temperature);
    if (p->top_k < 0) return qerr_set(err, QERR_INVALID, "top_k %d is negative", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return qerr_set(err, QERR_INVALID, "top_p %g not in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return qerr_set(err, QERR_INVALID, "min_p %g not in [0, 1]", p->min_p);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 10))
        return qerr_set(err, QERR_INVALID, "repetition_penalty %g not in (0, 10]",
                        p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return qerr_set(err, QERR_INVALID, "presence_penalty %g not in [-2, 2]",
                        p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return qerr_set(err, QERR_INVALID, "frequency_penalty %g not in [-2, 2]",
                        p->frequency_penalty);
    return 0;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(uint64_t *s)
{
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double sampler_uniform(struct sampler *s)
{
    return (double)(next_u64(s->rng) >> 11) * 0x1p-53;
}

int sampler_init(struct sampler *s, const struct sample_params *p, int vocab, struct qerr *err)
{
    memset(s, 0, sizeof *s);
    int rc = sample_params_check(p, err);
    if (rc) return rc;
    s->p = *p;
    s->vocab = vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    s->tmp = malloc((size_t)vocab * sizeof *s->tmp);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    if (!s->idx || !s->tmp || !s->prob || !s->counts) {
        sampler_free(s);
        return qerr_set(err, QERR_NOMEM, "sampler: out of memory");
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->idx);
    free(s->prob);
    free(s->counts);
    free(s->tmp);
    s->tmp = NULL;
    s->idx = NULL;
    s->prob = NULL;
    s->counts = NULL;
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (token >= 0 && token < s->vocab) s->counts[token]++;
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void sampler_penalize(struct sampler *s, float *logits)
{
    const struct sample_params *p = &s->p;
    if (p->repetition_penalty == 1 && p->presence_penalty == 0 && p->frequency_penalty == 0) return;
    for (int i = 0; i < s->vocab; i++) {
        if (!s->counts[i]) continue;
        float l = logits[i];
        if (p->repetition_penalty != 1)
            l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)s->counts[i];
        logits[i] = l;
    }
}

/* Stable bottom-up merge sort of idx[0..n) by val descending, ties by lower id; tmp has n
 * entries. (qsort has no context argument, and the comparator must not read a global.) */
static void sort_desc(int32_t *idx, int32_t *tmp, int n, const float *val)
{
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                float a = val[idx[i]], b = val[idx[j]];
                tmp[k++] = (a > b || (a == b && idx[i] < idx[j])) ? idx[i++] : idx[j++];
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

int32_t sampler_sample(struct sampler *s, float *logits)
{
    const struct sample_params *p = &s->p;
    sampler_penalize(s, logits);
    if (p->temperature == 0 || p->top_k == 1) return argmax(logits, s->vocab);

    /* keep only candidates that can matter: top_k if set, else everything (pruned by top_p) */
    int n = s->vocab;
    for (int i = 0; i < n; i++) s->idx[i] = i;
    float maxl = logits[argmax(logits, n)];
    /* prefilter: tokens more than 30 nats below the max have p < 1e-13; drop them before
     * sorting so the sort sees a few hundred candidates instead of the vocabulary */
    float floor_l = maxl - 30.0f * p->temperature;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= floor_l) s->idx[m++] = i;
    sort_desc(s->idx, s->tmp, m, logits);
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;

    double sum = 0;
    for (int i = 0; i < m; i++) {
        s->prob[i] = expf((logits[s->idx[i]] - maxl) / p->temperature);
        sum += s->prob[i];
    }
    if (p->min_p > 0) {
        /* prob[0] is the largest: keep tokens with p >= min_p * p_max */
        float cut = p->min_p * s->prob[0];
        int k = 1;
        while (k < m && s->prob[k] >= cut) k++;
        for (int i = k; i < m; i++) sum -= s->prob[i];
        m = k;
    }
    if (p->top_p < 1) {
        double acc = 0;
        int k = 0;
        while (k < m) {
            acc += s->prob[k++];
            if (acc >= p->top_p * sum) break;
        }
        sum = acc;
        m = k;
    }
    double r = sampler_uniform(s) * sum, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->prob[i];
        if (r < acc) return s->idx[i];
    }
    return s->idx[m - 1];
}

float sample_logprob(const float *logits, int vocab, int32_t token)
{
    float maxl = logits[argmax(logits, vocab)];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)(logits[i] - maxl));
    return (float)((double)(logits[token] - maxl) - log(sum));
}
