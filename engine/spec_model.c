/* The draft-model drafter (spec_model.h). */
#include "spec_model.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sample.h"
#include "spec.h"
#include "spec_policy.h"

struct spec_model {
    struct model *model;
    int max_tokens, max_rows, bs, vocab;
    int32_t *tokens, *pos, *seq, *slot, *lidx; /* [max_tokens] one forward's batch */
    int *row_of;                               /* [max_rows] the call's sequence of each row */
    int *batch_seq; /* [max_rows] the call's sequence of each batch seq */
    int32_t *table; /* [max_rows][table_cols] */
    int table_cols;
    float *logits;          /* [max_rows][vocab] */
    struct spec_cost *cost; /* its forwards are timed here (spec_model_time_into), or NULL */
};

void spec_model_time_into(struct spec_model *m, struct spec_cost *c)
{
    m->cost = c;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int spec_model_check_vocab(const struct gguf_file *draft_file, const struct tokenizer *target_tok,
                           struct qerr *err)
{
    struct tokenizer *dt = NULL;
    int rc = tokenizer_load(draft_file, &dt, err);
    if (rc) return qerr_wrap(err, "draft model");
    int32_t nd = tokenizer_vocab_size(dt), nt = tokenizer_vocab_size(target_tok);
    if (nd != nt) {
        rc = qerr_set(err, QERR_INVALID,
                      "draft model: its vocabulary has %d tokens, the target's %d: a draft model "
                      "needs the target's tokenizer",
                      (int)nd, (int)nt);
    }
    for (int32_t i = 0; !rc && i < nt; i++) {
        const char *a = tokenizer_token_text(dt, i), *b = tokenizer_token_text(target_tok, i);
        if (!a || !b || strcmp(a, b) != 0)
            rc = qerr_set(err, QERR_INVALID,
                          "draft model: token %d is '%.40s', the target's '%.40s': a draft model "
                          "needs the target's tokenizer",
                          (int)i, a ? a : "", b ? b : "");
    }
    tokenizer_free(dt);
    return rc;
}

void spec_model_free(struct spec_model *m)
{
    if (!m) return;
    model_free(m->model);
    free(m->tokens);
    free(m->pos);
    free(m->seq);
    free(m->slot);
    free(m->lidx);
    free(m->row_of);
    free(m->batch_seq);
    free(m->table);
    free(m->logits);
    free(m);
}

int spec_model_create(const struct gguf_file *draft_file, const struct tokenizer *target_tok,
                      struct backend *be, const struct model_opts *opts, struct spec_model **out,
                      struct qerr *err)
{
    *out = NULL;
    int rc = spec_model_check_vocab(draft_file, target_tok, err);
    if (rc) return rc;
    struct model_config cfg;
    if ((rc = model_config_read(draft_file, &cfg, err))) return qerr_wrap(err, "draft model");
    if (cfg.vocab != tokenizer_vocab_size(target_tok))
        return qerr_set(err, QERR_INVALID,
                        "draft model: its output has %d logits, the vocabulary %d tokens",
                        cfg.vocab, (int)tokenizer_vocab_size(target_tok));
    if (opts->max_batch_tokens < 1 || opts->max_logits < 1 || opts->kv_block_size < 1)
        return qerr_set(err, QERR_INVALID, "draft model: batch %d, rows %d, block %d",
                        opts->max_batch_tokens, opts->max_logits, opts->kv_block_size);
    struct spec_model *m = calloc(1, sizeof *m);
    if (!m) return qerr_set(err, QERR_NOMEM, "draft model: out of memory");
    m->max_tokens = opts->max_batch_tokens;
    m->max_rows = opts->max_logits;
    m->bs = opts->kv_block_size;
    m->vocab = cfg.vocab;
    size_t T = (size_t)m->max_tokens, R = (size_t)m->max_rows;
    m->tokens = malloc(T * sizeof *m->tokens);
    m->pos = malloc(T * sizeof *m->pos);
    m->seq = malloc(T * sizeof *m->seq);
    m->slot = malloc(T * sizeof *m->slot);
    m->lidx = malloc(T * sizeof *m->lidx);
    m->row_of = malloc(R * sizeof *m->row_of);
    m->batch_seq = malloc(R * sizeof *m->batch_seq);
    m->logits = malloc(R * (size_t)m->vocab * sizeof *m->logits);
    if (!m->tokens || !m->pos || !m->seq || !m->slot || !m->lidx || !m->row_of || !m->batch_seq ||
        !m->logits) {
        spec_model_free(m);
        return qerr_set(err, QERR_NOMEM, "draft model: out of memory");
    }
    struct model_opts mo = *opts;
    mo.tp = 1; /* the draft runs on one device (the engine refuses it with tensor parallelism) */
    mo.tp_backends = NULL;
    mo.tp_comms = NULL;
    if ((rc = model_load(draft_file, be, &mo, &m->model, err))) {
        spec_model_free(m);
        return qerr_wrap(err, "draft model");
    }
    *out = m;
    return 0;
}

/* Adds sequence i of the call to the forward being built (as batch sequence nb) if it is not
 * there yet; returns its batch index, or -1 when no row is left for it. */
static int batch_seq_of(struct spec_model *m, int i, int *nb)
{
    for (int j = 0; j < *nb; j++)
        if (m->batch_seq[j] == i) return j;
    if (*nb == m->max_rows) return -1;
    m->batch_seq[*nb] = i;
    return (*nb)++;
}

/* Runs the forward built: nt tokens of nb sequences, nr rows of logits. */
static int run_batch(struct spec_model *m, const struct spec_model_seq *seqs, int nt, int nb,
                     int nr, struct qerr *err)
{
    int cols = 1;
    for (int j = 0; j < nb; j++) {
        const struct spec_model_seq *s = &seqs[m->batch_seq[j]];
        int c = s->n_blocks + (s->ext_block >= 0);
        if (c > cols) cols = c;
    }
    if ((size_t)nb * (size_t)cols > (size_t)m->max_rows * (size_t)m->table_cols) {
        int32_t *t = realloc(m->table, (size_t)m->max_rows * (size_t)cols * sizeof *t);
        if (!t) return qerr_set(err, QERR_NOMEM, "draft model: out of memory");
        m->table = t;
        m->table_cols = cols;
    }
    for (int j = 0; j < nb; j++) {
        const struct spec_model_seq *s = &seqs[m->batch_seq[j]];
        int32_t *row = m->table + (size_t)j * (size_t)cols;
        for (int c = 0; c < cols; c++)
            row[c] = c < s->n_blocks ? s->blocks[c] : c == s->n_blocks ? s->ext_block : -1;
    }
    struct model_batch b = {.n_tokens = nt,
                            .tokens = m->tokens,
                            .pos = m->pos,
                            .seq = m->seq,
                            .slot = m->slot,
                            .n_seqs = nb,
                            .max_blocks = cols,
                            .block_table = m->table,
                            .n_logits = nr,
                            .logit_idx = m->lidx};
    double t0 = m->cost ? now_s() : 0;
    int rc = model_forward(m->model, &b, m->logits, err);
    if (!rc && m->cost) spec_cost_record_step(m->cost, nt, now_s() - t0);
    return rc;
}

/* Appends token t at position p of call sequence i (batch sequence j) to the forward. */
static int add_token(struct spec_model *m, const struct spec_model_seq *s, int j, int nt, int32_t t,
                     int p, struct qerr *err)
{
    int blk = p / m->bs;
    int b = blk < s->n_blocks ? s->blocks[blk] : blk == s->n_blocks ? s->ext_block : -1;
    if (b < 0)
        return qerr_set(err, QERR_INVALID,
                        "draft model: position %d is past the sequence's %d blocks of %d", p,
                        s->n_blocks, m->bs);
    m->tokens[nt] = t;
    m->pos[nt] = p;
    m->seq[nt] = j;
    m->slot[nt] = b * m->bs + p % m->bs;
    return 0;
}

int spec_model_draft(struct spec_model *m, struct spec_model_seq *seqs, int n, struct qerr *err)
{
    int kmax = 0;
    for (int i = 0; i < n; i++) {
        struct spec_model_seq *s = &seqs[i];
        if (s->k < 1 || s->n_tokens < 1)
            return qerr_set(err, QERR_INVALID, "draft model: sequence %d: k %d, %d tokens", i, s->k,
                            s->n_tokens);
        /* the last token is always fed: its row gives the first guess */
        if (*s->computed > s->n_tokens - 1) *s->computed = s->n_tokens - 1;
        if (*s->computed < 0) *s->computed = 0;
        if (s->k > kmax) kmax = s->k;
    }
    /* round 0 catches every sequence up to its last token (in as many forwards as the token
     * budget needs); round r feeds guess r - 1 back in, one token for each sequence wanting more */
    for (int round = 0; round < kmax; round++) {
        int i = 0;
        while (i < n) {
            int nt = 0, nb = 0, nr = 0, rc;
            for (; i < n; i++) {
                struct spec_model_seq *s = &seqs[i];
                if (round >= s->k) continue;
                int from = round == 0 ? *s->computed : s->n_tokens + round - 1;
                int todo = round == 0 ? s->n_tokens - from : 1;
                int take = todo < m->max_tokens - nt ? todo : m->max_tokens - nt;
                /* a sequence that completes here needs a row; one that does not, a batch slot */
                if (take == 0 || (take == todo && nr == m->max_rows)) break;
                int j = batch_seq_of(m, i, &nb);
                if (j < 0) break;
                for (int q = 0; q < take; q++) {
                    int32_t t = round == 0 ? s->tokens[from + q] : s->out[round - 1];
                    if ((rc = add_token(m, s, j, nt++, t, from + q, err))) return rc;
                }
                *s->computed = from + take;
                if (take < todo) break; /* the batch is full: this sequence goes on next */
                m->lidx[nr] = nt - 1;
                m->row_of[nr++] = i;
            }
            if (nt == 0) break;
            if ((rc = run_batch(m, seqs, nt, nb, nr, err))) return rc;
            for (int r = 0; r < nr; r++)
                seqs[m->row_of[r]].out[round] =
                    sample_argmax(m->logits + (size_t)r * (size_t)m->vocab, m->vocab);
        }
    }
    return 0;
}

double spec_model_cost_prior(const struct gguf_file *draft_file, const struct gguf_file *target)
{
    return (double)gguf_file_size(draft_file) / (double)gguf_file_size(target);
}
