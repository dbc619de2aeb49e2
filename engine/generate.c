#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "trace.h"

struct one_seq {
    int32_t *table;
    int max_blocks;
    int32_t lora; /* model_batch.seq_lora's value for the sequence */
};

static int seq_setup(struct model *m, size_t total, struct one_seq *s, struct qerr *err)
{
    const struct model_config *c = model_get_config(m);
    const struct model_opts *o = model_get_opts(m);
    if (total > (size_t)c->ctx_len)
        return qerr_set(err, QERR_FULL, "%zu tokens exceed the model's context of %d tokens", total,
                        c->ctx_len);
    size_t blocks = (total + (size_t)o->kv_block_size - 1) / (size_t)o->kv_block_size;
    if (blocks > (size_t)o->kv_blocks)
        return qerr_set(err, QERR_FULL, "%zu tokens need %zu KV blocks, the pool has %d", total,
                        blocks, o->kv_blocks);
    s->max_blocks = (int)(blocks ? blocks : 1);
    s->table = malloc((size_t)s->max_blocks * sizeof *s->table);
    if (!s->table) return qerr_set(err, QERR_NOMEM, "generate: out of memory");
    for (int i = 0; i < s->max_blocks; i++) s->table[i] = i;
    return 0;
}

/* Runs tokens [from, from + n) of seq; logits of the last one (or of all, when all is set)
 * land in logits. */
static int run_chunk(struct model *m, const struct one_seq *s, const int32_t *tokens, int from,
                     int n, bool all, float *logits, struct qerr *err)
{
    int bs = model_get_opts(m)->kv_block_size;
    int32_t *buf = malloc((size_t)n * 4 * sizeof *buf);
    if (!buf) return qerr_set(err, QERR_NOMEM, "generate: out of memory");
    int32_t *pos = buf, *seq = buf + n, *slot = buf + 2 * n, *lidx = buf + 3 * n;
    for (int i = 0; i < n; i++) {
        int p = from + i;
        pos[i] = p;
        seq[i] = 0;
        slot[i] = s->table[p / bs] * bs + p % bs;
        lidx[i] = i;
    }
    struct model_batch b = {.n_tokens = n,
                            .tokens = tokens,
                            .pos = pos,
                            .seq = seq,
                            .slot = slot,
                            .n_seqs = 1,
                            .max_blocks = s->max_blocks,
                            .block_table = s->table,
                            .n_logits = all ? n : 1,
                            .logit_idx = all ? lidx : lidx + n - 1,
                            .seq_lora = &s->lora};
    int rc = model_forward(m, &b, logits, err);
    free(buf);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --trace: a forward that began at t0 has run; trace_step_end records it once its logits are
 * sampled (or at once, when they are not). */
static void trace_forward(struct trace_step *ts, double t0, int n_tokens, int n_prompt_tokens,
                          bool decode)
{
    *ts = (struct trace_step){.t_begin = t0,
                              .t_forward = t0,
                              .t_sample = now_s(),
                              .n_seqs = 1,
                              .prefill_tokens = decode ? 0 : n_tokens,
                              .decode_tokens = decode ? n_tokens : 0,
                              .prompt_tokens = n_prompt_tokens};
}

static void trace_step_end(struct trace *t, struct trace_step *ts, bool sampled)
{
    ts->t_end = sampled ? now_s() : ts->t_sample;
    ts->sampler_s = ts->t_end - ts->t_sample; /* generate_run's step ends at the sample */
    ts->sampled = sampled;
    trace_add_step(t, ts);
}

/* Decoding with drafts (spec.h), after the prefill left the next token's logits in row 0: each
 * forward computes the last sampled token and a draft after it, with logits at every position;
 * row r is then the distribution after the draft's first r tokens, which is the one plain
 * decoding samples from as long as every token sampled so far equalled the draft. So tokens are
 * sampled row by row with the one sampler (its RNG draws in plain decoding's order) until one
 * differs from the draft; that one is kept and fed to the next forward. */
static int decode_spec(struct model *m, const struct one_seq *s, const int32_t *prompt,
                       size_t n_prompt, const struct gen_opts *o, struct sampler *sm, float *logits,
                       gen_token_fn on_token, void *ctx, struct qerr *err)
{
    const struct model_opts *mo = model_get_opts(m);
    int vocab = model_get_config(m)->vocab;
    int kmax = o->spec_k < SPEC_K_MAX ? o->spec_k : SPEC_K_MAX;
    if (kmax > mo->max_logits - 1) kmax = mo->max_logits - 1;
    if (kmax > mo->max_batch_tokens - 1) kmax = mo->max_batch_tokens - 1;
    size_t cap = n_prompt + (size_t)o->n_predict;
    if (o->spec == SPEC_DRAFT && !o->draft)
        return qerr_set(err, QERR_INVALID, "generate: --spec draft needs a draft model");
    int32_t *seq = malloc(cap * sizeof *seq);
    float *row = malloc((size_t)vocab * sizeof *row);
    /* the draft model's K/V go to the same block numbers as the target's, in its own storage */
    int *blocks = malloc((size_t)s->max_blocks * sizeof *blocks);
    if (!seq || !row || !blocks) {
        free(seq);
        free(row);
        free(blocks);
        return qerr_set(err, QERR_NOMEM, "generate: out of memory");
    }
    for (int i = 0; i < s->max_blocks; i++) blocks[i] = s->table[i];
    int dcomp = 0; /* positions with the draft model's K/V */
    memcpy(seq, prompt, n_prompt * sizeof *seq);
    int n = (int)n_prompt, produced = 0, r = 0, nd = 0, acc = 0, rc = 0;
    int32_t chunk[1 + SPEC_K_MAX]; /* the last sampled token, then the draft */
    const int32_t *draft = chunk + 1;
    struct spec_drafter d;
    spec_drafter_init(&d, o->spec);
    struct spec_state st;
    spec_state_init(&st, kmax > 0 ? kmax : 1);
    /* the cost policy's measurements: this run's forwards of n tokens, the draft model's */
    bool by_cost = o->spec_policy == SPEC_POLICY_COST;
    struct spec_cost tcost, dcost;
    struct spec_rate rate[SPEC_MATCH_CLASSES];
    int cls = 0; /* the class of the draft being verified */
    spec_cost_init(&tcost);
    spec_cost_init(&dcost);
    spec_rates_init(rate);
    if (by_cost && o->draft) spec_model_time_into(o->draft, &dcost);
    while (produced < o->n_predict) {
        const float *l = logits + (size_t)r * (size_t)vocab;
        memcpy(row, l, (size_t)vocab * sizeof *row);
        int32_t t = sampler_sample(sm, row);
        sampler_accept(sm, t);
        produced++;
        seq[n++] = t;
        bool kept = r < nd && t == draft[r];
        acc += kept;
        /* a miss, or the row after a wholly kept draft: the draft is settled */
        bool settled = nd > 0 && !kept;
        bool stop = (on_token && on_token(ctx, t, l)) || produced == o->n_predict;
        if (settled || (stop && nd > 0)) {
            if (by_cost)
                spec_rate_update(&rate[cls], nd, acc);
            else
                spec_state_update(&st, nd, acc, kmax);
            if (o->spec_stats) {
                o->spec_stats->drafts++;
                o->spec_stats->drafted += nd;
                o->spec_stats->accepted += acc;
            }
        }
        if (stop) break;
        if (kept) {
            r++;
            continue;
        }
        /* t is new to the model: compute it, and a fresh draft after it */
        int k = kmax > 0 && !by_cost ? spec_state_next_k(&st) : 0;
        int cap = kmax < o->n_predict - produced - 1 ? kmax : o->n_predict - produced - 1;
        int found = 0, match = 0;
        /* as the engine's scheduler: a one-token forward not timed for a while is timed again */
        if (by_cost && cap > 0 && !spec_cost_stale(&tcost, 1)) {
            struct spec_costs sc = {.target = &tcost,
                                    .draft = o->draft ? &dcost : NULL,
                                    .draft_prior = o->draft_prior,
                                    .behind = n - 1 - dcomp,
                                    .horizon = o->n_predict - produced};
            struct spec_step one = {.n_tokens = 1, .out_tokens = 1};
            /* as the engine's scheduler: the n-gram draft first, its class, then k */
            if (!o->draft) found = spec_draft(&d, seq, n, cap, chunk + 1, &match);
            cls = spec_match_class(match);
            if (o->draft || found > 0)
                k = spec_policy_next_k(&rate[cls], &sc, &one, o->draft ? cap : found);
        }
        if (k > cap) k = cap;
        if (k > 0 && o->draft) {
            struct spec_model_seq q = {.tokens = seq,
                                       .n_tokens = n,
                                       .computed = &dcomp,
                                       .blocks = blocks,
                                       .n_blocks = s->max_blocks,
                                       .ext_block = -1,
                                       .k = k,
                                       .out = chunk + 1};
            if ((rc = spec_model_draft(o->draft, &q, 1, err))) break;
            nd = k;
        } else {
            nd = k;
            if (k > 0 && !by_cost) {
                nd = spec_draft(&d, seq, n, k, chunk + 1, &match);
                cls = spec_match_class(match);
            }
        }
        chunk[0] = t;
        r = acc = 0;
        double t_fwd = now_s();
        if ((rc = run_chunk(m, s, chunk, n - 1, nd + 1, true, logits, err))) break;
        spec_cost_record_step(&tcost, nd + 1, now_s() - t_fwd);
    }
    if (by_cost && o->draft) spec_model_time_into(o->draft, NULL);
    free(seq);
    free(row);
    free(blocks);
    return rc;
}

int generate_run(struct model *m, const int32_t *prompt, size_t n_prompt, const struct gen_opts *o,
                 gen_token_fn on_token, void *ctx, struct qerr *err)
{
    struct trace *tr = o->trace;
    struct trace_step ts;
    struct trace_request treq = {.id = 1, .t_submit = now_s(), .prompt_tokens = (int)n_prompt};
    treq.t_admit = treq.t_submit;
    if (n_prompt == 0) return qerr_set(err, QERR_INVALID, "generate: the prompt is empty");
    if (o->n_predict < 0) return qerr_set(err, QERR_INVALID, "n_predict %d", o->n_predict);
    const struct model_config *c = model_get_config(m);
    int chunk = o->prefill_chunk;
    int maxb = model_get_opts(m)->max_batch_tokens;
    if (chunk <= 0 || chunk > maxb) chunk = maxb;
    struct one_seq s = {.lora = o->lora};
    int rc = seq_setup(m, n_prompt + (size_t)o->n_predict, &s, err);
    if (rc) return rc;
    struct sampler sm;
    int rows = o->spec != SPEC_OFF ? 1 + SPEC_K_MAX : 1;
    float *logits = malloc((size_t)rows * (size_t)c->vocab * sizeof *logits);
    float *work = malloc((size_t)c->vocab * sizeof *work);
    if (!logits || !work) {
        rc = qerr_set(err, QERR_NOMEM, "generate: out of memory");
        goto out_nosampler;
    }
    if ((rc = sampler_init(&sm, &o->sample, c->vocab, err))) goto out_nosampler;
    for (size_t i = 0; i < n_prompt; i++) sampler_accept(&sm, prompt[i]);
    bool stopped = false;
    for (size_t at = 0; at < n_prompt && !rc; at += (size_t)chunk) {
        int n = (int)(n_prompt - at < (size_t)chunk ? n_prompt - at : (size_t)chunk);
        if (tr) trace_step_begin(tr);
        double t0 = now_s();
        rc = run_chunk(m, &s, prompt + at, (int)at, n, false, logits, err);
        if (tr) trace_forward(&ts, t0, n, n, false);
        /* the last chunk's step ends with the first token's sampling, below */
        if (tr && !rc && (at + (size_t)n < n_prompt || o->n_predict == 0))
            trace_step_end(tr, &ts, false);
    }
    if (o->spec != SPEC_OFF && !rc)
        rc = decode_spec(m, &s, prompt, n_prompt, o, &sm, logits, on_token, ctx, err);
    for (int k = 0; o->spec == SPEC_OFF && k < o->n_predict && !rc; k++) {
        memcpy(work, logits, (size_t)c->vocab * sizeof *work);
        int32_t tok = sampler_sample(&sm, work);
        sampler_accept(&sm, tok);
        treq.completion_tokens++;
        if (tr) {
            if (k == 0) treq.t_first = now_s();
            trace_step_end(tr, &ts, true);
        }
        if (on_token && on_token(ctx, tok, logits)) {
            stopped = true;
            break;
        }
        if (k + 1 < o->n_predict) {
            if (tr) trace_step_begin(tr);
            double t0 = now_s();
            rc = run_chunk(m, &s, &tok, (int)n_prompt + k, 1, false, logits, err);
            if (tr) trace_forward(&ts, t0, 1, 0, true);
        }
    }
    if (tr) {
        treq.t_end = now_s();
        treq.finish = rc ? FINISH_ERROR : stopped ? FINISH_STOP : FINISH_LENGTH;
        trace_add_request(tr, &treq);
    }
    sampler_free(&sm);
out_nosampler:
    free(logits);
    free(work);
    free(s.table);
    return rc;
}

int generate_all_logits(struct model *m, const int32_t *seq, size_t n, int chunk, float **out,
                        struct qerr *err)
{
    return generate_all_logits_lora(m, seq, n, chunk, 0, out, err);
}

int generate_all_logits_lora(struct model *m, const int32_t *seq, size_t n, int chunk, int lora,
                             float **out, struct qerr *err)
{
    *out = NULL;
    const struct model_config *c = model_get_config(m);
    int maxb = model_get_opts(m)->max_batch_tokens, maxl = model_get_opts(m)->max_logits;
    if (chunk <= 0 || chunk > maxb) chunk = maxb;
    if (chunk > maxl) chunk = maxl;
    struct one_seq s = {.lora = lora};
    int rc = seq_setup(m, n, &s, err);
    if (rc) return rc;
    float *logits = malloc(n * (size_t)c->vocab * sizeof *logits);
    if (!logits) rc = qerr_set(err, QERR_NOMEM, "generate: out of memory for %zu logits", n);
    for (size_t at = 0; at < n && !rc; at += (size_t)chunk) {
        int k = (int)(n - at < (size_t)chunk ? n - at : (size_t)chunk);
        rc = run_chunk(m, &s, seq + at, (int)at, k, true, logits + at * (size_t)c->vocab, err);
    }
    free(s.table);
    if (rc) {
        free(logits);
        return rc;
    }
    *out = logits;
    return 0;
}
