#include "generate.h"

#include <stdlib.h>
#include <string.h>

struct one_seq {
    int32_t *table;
    int max_blocks;
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
                            .logit_idx = all ? lidx : lidx + n - 1};
    int rc = model_forward(m, &b, logits, err);
    free(buf);
    return rc;
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
    int32_t *seq = malloc(cap * sizeof *seq);
    float *row = malloc((size_t)vocab * sizeof *row);
    if (!seq || !row) {
        free(seq);
        free(row);
        return qerr_set(err, QERR_NOMEM, "generate: out of memory");
    }
    memcpy(seq, prompt, n_prompt * sizeof *seq);
    int n = (int)n_prompt, produced = 0, r = 0, nd = 0, acc = 0, rc = 0;
    int32_t chunk[1 + SPEC_K_MAX]; /* the last sampled token, then the draft */
    const int32_t *draft = chunk + 1;
    struct spec_drafter d;
    spec_drafter_init(&d, o->spec);
    struct spec_state st;
    spec_state_init(&st, kmax > 0 ? kmax : 1);
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
        int k = kmax > 0 ? spec_state_next_k(&st) : 0;
        if (k > o->n_predict - produced - 1) k = o->n_predict - produced - 1;
        if (k > kmax) k = kmax;
        nd = k > 0 ? spec_draft(&d, seq, n, k, chunk + 1) : 0;
        chunk[0] = t;
        r = acc = 0;
        if ((rc = run_chunk(m, s, chunk, n - 1, nd + 1, true, logits, err))) break;
    }
    free(seq);
    free(row);
    return rc;
}

int generate_run(struct model *m, const int32_t *prompt, size_t n_prompt, const struct gen_opts *o,
                 gen_token_fn on_token, void *ctx, struct qerr *err)
{
    if (n_prompt == 0) return qerr_set(err, QERR_INVALID, "generate: the prompt is empty");
    if (o->n_predict < 0) return qerr_set(err, QERR_INVALID, "n_predict %d", o->n_predict);
    const struct model_config *c = model_get_config(m);
    int chunk = o->prefill_chunk;
    int maxb = model_get_opts(m)->max_batch_tokens;
    if (chunk <= 0 || chunk > maxb) chunk = maxb;
    struct one_seq s = {0};
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
    for (size_t at = 0; at < n_prompt && !rc; at += (size_t)chunk) {
        int n = (int)(n_prompt - at < (size_t)chunk ? n_prompt - at : (size_t)chunk);
        rc = run_chunk(m, &s, prompt + at, (int)at, n, false, logits, err);
    }
    if (o->spec != SPEC_OFF && !rc)
        rc = decode_spec(m, &s, prompt, n_prompt, o, &sm, logits, on_token, ctx, err);
    for (int k = 0; o->spec == SPEC_OFF && k < o->n_predict && !rc; k++) {
        memcpy(work, logits, (size_t)c->vocab * sizeof *work);
        int32_t tok = sampler_sample(&sm, work);
        sampler_accept(&sm, tok);
        if (on_token && on_token(ctx, tok, logits)) break;
        if (k + 1 < o->n_predict)
            rc = run_chunk(m, &s, &tok, (int)n_prompt + k, 1, false, logits, err);
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
    *out = NULL;
    const struct model_config *c = model_get_config(m);
    int maxb = model_get_opts(m)->max_batch_tokens, maxl = model_get_opts(m)->max_logits;
    if (chunk <= 0 || chunk > maxb) chunk = maxb;
    if (chunk > maxl) chunk = maxl;
    struct one_seq s = {0};
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
