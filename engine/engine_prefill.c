/* engine_prefill: what prompt positions produce for the sequences that ask for it, on the
 * engine thread.
 *
 * Prompt logprobs: the scheduler gives such a sequence one logits row per prompt position
 * whose next token's logprob is still unsent (and cuts its chunks to fit the step's rows);
 * after the forward each row becomes one event. plp_next remembers what was sent, so a
 * preempted sequence that recomputes its prompt sends nothing twice.
 *
 * Pooling: the scheduler asks the model for the final-normed hidden states of the positions a
 * pooled sequence needs (all of them for mean, one for last or cls); they are summed into the
 * sequence in position order, in double, whatever the chunking, so the vector does not depend
 * on what shared the steps (the kernels being batch-invariant). A preempted pooled sequence
 * starts its sum again with its prompt. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

bool seq_needs_prompt(const struct seq *s)
{
    return s->pooling != ENGINE_POOL_NONE || (s->prompt_logprobs && s->plp_next < s->n_prompt);
}

int seq_plp_rows(const struct seq *s, int start, int n, int *lo)
{
    *lo = start;
    if (!s->prompt_logprobs) return 0;
    /* position p's logits score prompt token p + 1 */
    int a = start > s->plp_next - 1 ? start : s->plp_next - 1;
    int b = start + n < s->n_prompt - 1 ? start + n : s->n_prompt - 1;
    *lo = a;
    return b > a ? b - a : 0;
}

int seq_hidden_rows(const struct seq *s, int start, int n, int first, int32_t *rows)
{
    int lo, hi; /* prompt positions [lo, hi) to read */
    switch (s->pooling) {
    case ENGINE_POOL_MEAN:
        lo = 0;
        hi = s->n_prompt;
        break;
    case ENGINE_POOL_LAST:
        lo = s->n_prompt - 1;
        hi = s->n_prompt;
        break;
    case ENGINE_POOL_CLS:
        lo = 0;
        hi = 1;
        break;
    default:
        return 0;
    }
    if (lo < start) lo = start;
    if (hi > start + n) hi = start + n;
    if (hi <= lo) return 0;
    if (rows)
        for (int pos = lo; pos < hi; pos++) rows[pos - lo] = first + pos - start;
    return hi - lo;
}

/* 1 + the number of tokens whose logit is above token's: its rank (vLLM's). */
static int token_rank(const float *row, int vocab, int32_t token)
{
    int rank = 1;
    for (int i = 0; i < vocab; i++) rank += row[i] > row[token];
    return rank;
}

int seq_prefill_outputs(struct engine *e, int i)
{
    const struct step_plan *p = &e->plan;
    struct seq *s = p->seqs[i];
    if (p->n_plp[i] > 0) {
        int lo;
        seq_plp_rows(s, p->start[i], p->chunk[i], &lo);
        for (int k = 0; k < p->n_plp[i]; k++) {
            const float *row = e->logits + (size_t)(p->logit_row[i] + k) * (size_t)e->vocab;
            int32_t t = s->tokens[lo + k + 1];
            struct req_event ev = {0};
            ev.prompt = true;
            ev.token = t;
            ev.logprob = sample_logprob(row, e->vocab, t);
            ev.rank = token_rank(row, e->vocab, t);
            if (s->prompt_top > 0) engine_top_logprobs(row, e->vocab, s->prompt_top, &ev);
            if (!engine_request_push(s->req, &ev)) {
                snprintf(s->error, sizeof s->error, "out of memory for prompt logprobs");
                return QERR_NOMEM;
            }
        }
        s->plp_next = lo + p->n_plp[i] + 1;
    }
    if (p->n_hid[i] > 0) {
        int dim = engine_model_config(e)->dim;
        if (!s->pool_sum && !(s->pool_sum = malloc((size_t)dim * sizeof *s->pool_sum))) {
            snprintf(s->error, sizeof s->error, "out of memory for a %d-float embedding", dim);
            return QERR_NOMEM;
        }
        if (p->start[i] == 0 || s->pool_n == 0) {
            memset(s->pool_sum, 0, (size_t)dim * sizeof *s->pool_sum);
            s->pool_n = 0;
        }
        for (int k = 0; k < p->n_hid[i]; k++) {
            const float *h = e->hidden + (size_t)(p->hidden_row[i] + k) * (size_t)dim;
            for (int d = 0; d < dim; d++) s->pool_sum[d] += (double)h[d];
            s->pool_n++;
        }
    }
    return 0;
}

int seq_pool_finish(struct engine *e, struct seq *s)
{
    int dim = engine_model_config(e)->dim;
    float *v = malloc((size_t)dim * sizeof *v);
    if (!v || !s->pool_sum || s->pool_n < 1) {
        free(v);
        snprintf(s->error, sizeof s->error, "no hidden states were pooled for this input");
        return QERR_NOMEM;
    }
    double norm = 0;
    for (int d = 0; d < dim; d++) {
        double m = s->pool_sum[d] / s->pool_n;
        norm += m * m;
    }
    norm = sqrt(norm);
    /* an all-zero state stays zero rather than becoming NaN */
    double inv = norm > 0 ? 1.0 / (norm * s->pool_n) : 0;
    for (int d = 0; d < dim; d++) v[d] = (float)(s->pool_sum[d] * inv);
    struct request *r = s->req;
    pthread_mutex_lock(&r->mu);
    free(r->embedding);
    r->embedding = v;
    r->n_embedding = dim;
    pthread_mutex_unlock(&r->mu);
    return 0;
}
