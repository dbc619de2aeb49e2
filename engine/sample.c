#include "sample.h"

#include <math.h>
#include <stdbool.h>
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

void sample_params_cli_default(struct sample_params *p)
{
    sample_params_default(p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
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

/* Lanes of the running maxima: independent selects the compiler turns into vector max-blends,
 * where one running best is a dependent compare per logit (greedy sampling of a batch of 16
 * spent ~2 % of a decode step's CPU time there, with the other threads idle). */
#define ARGMAX_LANES 16

int32_t sample_argmax(const float *x, int n)
{
    if (n <= 0) return 0;
    float m[ARGMAX_LANES];
    for (int j = 0; j < ARGMAX_LANES; j++) m[j] = x[0];
    int i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int j = 0; j < ARGMAX_LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float top = m[0];
    for (int j = 1; j < ARGMAX_LANES; j++) top = m[j] > top ? m[j] : top;
    for (; i < n; i++) top = x[i] > top ? x[i] : top;
    /* a NaN first logit is never beaten by a comparison: 0, as the one-pass loop gives */
    if (top != top) return 0;
    /* the first logit equal to the maximum: the lowest id, as "x[i] > best" keeps it */
    for (i = 0; i < n; i++)
        if (x[i] == top) return i;
    return 0;
}

bool sampler_penalizes(const struct sampler *s)
{
    const struct sample_params *p = &s->p;
    return p->repetition_penalty != 1 || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

void sampler_penalize(struct sampler *s, float *logits)
{
    const struct sample_params *p = &s->p;
    if (!sampler_penalizes(s)) return;
    for (int i = 0; i < s->vocab; i++) {
        if (!s->counts[i]) continue;
        float l = logits[i];
        if (p->repetition_penalty != 1)
            l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)s->counts[i];
        logits[i] = l;
    }
}

#define SWAP_I32(a, b)                                                                             \
    do {                                                                                           \
        int32_t t_ = (a);                                                                          \
        (a) = (b);                                                                                 \
        (b) = t_;                                                                                  \
    } while (0)

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

/* True when token a ranks before token b: higher value, ties to the lower id. */
static bool ranks_before(const float *val, int32_t a, int32_t b)
{
    return val[a] > val[b] || (val[a] == val[b] && a < b);
}

/* Moves the k best-ranked of idx[0..n) into idx[0..k), in no particular order (quickselect,
 * median-of-three pivots: expected O(n)). */
static void select_top(int32_t *idx, int n, int k, const float *val)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        /* median of three into idx[mid] */
        if (ranks_before(val, idx[mid], idx[lo])) SWAP_I32(idx[mid], idx[lo]);
        if (ranks_before(val, idx[hi], idx[lo])) SWAP_I32(idx[hi], idx[lo]);
        if (ranks_before(val, idx[hi], idx[mid])) SWAP_I32(idx[hi], idx[mid]);
        int32_t pivot = idx[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (ranks_before(val, idx[i], pivot)) i++;
            while (ranks_before(val, pivot, idx[j])) j--;
            if (i <= j) {
                SWAP_I32(idx[i], idx[j]);
                i++;
                j--;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

/* Draws from candidates idx[0..m) with weights prob[0..m) (their sum is `sum`). */
static int32_t draw(struct sampler *s, int m, double sum)
{
    double r = sampler_uniform(s) * sum, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->prob[i];
        if (r < acc) return s->idx[i];
    }
    return s->idx[m - 1];
}

/* Only the filters need an order, and only top-p needs a sorted one: top-k is a selection,
 * min-p a threshold against the top probability, and a plain draw any fixed order. Sorting the
 * vocabulary for every token (a small model at temperature 0.8 keeps most of it above the
 * prefilter) cost ~5 ms per token, more than the forward of a 16-sequence batch. */
int32_t sampler_sample(struct sampler *s, float *logits)
{
    sampler_penalize(s, logits);
    return sampler_pick(s, logits);
}

int32_t sampler_pick(struct sampler *s, const float *logits)
{
    const struct sample_params *p = &s->p;
    if (p->temperature == 0 || p->top_k == 1) return sample_argmax(logits, s->vocab);

    int n = s->vocab;
    float maxl = logits[sample_argmax(logits, n)];
    /* prefilter: tokens more than 30 nats below the max have p < 1e-13 */
    float floor_l = maxl - 30.0f * p->temperature;
    /* min-p keeps p >= min_p * p_max, that is logit >= maxl + T ln(min_p) */
    if (p->min_p > 0) {
        float cut = maxl + p->temperature * logf(p->min_p);
        if (cut > floor_l) floor_l = cut;
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= floor_l) s->idx[m++] = i;
    if (p->top_k > 0 && p->top_k < m) {
        select_top(s->idx, m, p->top_k, logits);
        m = p->top_k;
    }
    if (p->top_p < 1) {
        /* the sorted prefix that holds top_p of the mass: sort a top slice, widen if short */
        double total = 0;
        for (int i = 0; i < m; i++) total += expf((logits[s->idx[i]] - maxl) / p->temperature);
        int k = m < 256 ? m : 256;
        for (;;) {
            if (k < m) select_top(s->idx, m, k, logits);
            sort_desc(s->idx, s->tmp, k, logits);
            double acc = 0;
            int j = 0;
            while (j < k) {
                s->prob[j] = expf((logits[s->idx[j]] - maxl) / p->temperature);
                acc += s->prob[j++];
                if (acc >= p->top_p * total) return draw(s, j, acc);
            }
            if (k == m) return draw(s, j, acc);
            k = k * 4 < m ? k * 4 : m;
        }
    }
    double sum = 0;
    for (int i = 0; i < m; i++) {
        s->prob[i] = expf((logits[s->idx[i]] - maxl) / p->temperature);
        sum += s->prob[i];
    }
    return draw(s, m, sum);
}

struct log_softmax sample_log_softmax(const float *logits, int vocab)
{
    float maxl = logits[sample_argmax(logits, vocab)];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)(logits[i] - maxl));
    return (struct log_softmax){maxl, log(sum)};
}

float sample_log_softmax_at(struct log_softmax ls, float logit)
{
    return (float)((double)(logit - ls.max) - ls.log_sum);
}

float sample_logprob(const float *logits, int vocab, int32_t token)
{
    return sample_log_softmax_at(sample_log_softmax(logits, vocab), logits[token]);
}
