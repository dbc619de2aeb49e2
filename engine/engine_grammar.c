/* engine_grammar: structured outputs inside the engine step. A constrained sequence's token
 * mask is applied to its copy of the logits row just before its sampling, so unconstrained
 * sequences in the same step are untouched and sampling stays exact (the sampler sees -inf for
 * what the grammar forbids, and nothing else changes). The vocabulary trie is built at the
 * first constrained step.
 *
 * DESIGN (overlap). The mask of a sequence's next sampled position depends only on the tokens
 * it has accepted, all known before the step's forward, so it is computed while the forward
 * runs (grammar_step_begin lists the step's constrained sequences): on the engine thread once
 * the forward's work is issued (model_batch.while_running: a GPU is busy then; on the CPU the
 * work is done by then, so this costs what computing it before the sampling did), or on a
 * helper thread that runs beside the forward (ENGINE_MASK_THREAD). The helper and the engine
 * thread never touch a matcher or a grammar's mask cache at once: the engine thread waits for
 * the helper before it samples. Later positions of a speculative step, and any mask not ready
 * for another reason, are computed just before their sampling, as before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

/* The vocabulary trie, built by whichever thread needs it first. */
static int gvocab(struct engine *e, struct grammar_vocab **out, struct qerr *err)
{
    pthread_mutex_lock(&e->gvocab_mu);
    int rc = e->gvocab ? 0 : grammar_vocab_create(e->tok, e->vocab, &e->gvocab, err);
    *out = e->gvocab;
    pthread_mutex_unlock(&e->gvocab_mu);
    return rc;
}

int engine_grammar(struct engine *e, enum grammar_kind kind, const char *text, size_t len,
                   struct grammar **out, struct qerr *err)
{
    /* compiled, and its masks precomputed, on the caller's thread: not in the engine's step */
    struct grammar_vocab *v;
    int rc = gvocab(e, &v, err);
    if (rc) return rc;
    return grammar_cache_get(e->grammars, kind, text, len, v, out, err);
}

int seq_constrain(struct engine *e, struct seq *s, float *row)
{
    double t0 = engine_now();
    struct qerr q = {0};
    if (!e->gmask) {
        struct grammar_vocab *v;
        if (gvocab(e, &v, &q)) goto fail;
        if (!(e->gmask = malloc((size_t)grammar_mask_words(v) * sizeof *e->gmask))) {
            qerr_set(&q, QERR_NOMEM, "out of memory for the token mask");
            goto fail;
        }
    }
    if (!s->gm && grammar_matcher_create(s->grammar, e->gvocab, &s->gm, &q)) goto fail;
    const uint64_t *mask = e->gmask;
    int n;
    if (s->mask_ready) { /* computed while the forward ran */
        s->mask_ready = false;
        mask = s->premask;
        n = s->premask_n;
    } else {
        n = grammar_matcher_mask(s->gm, e->gmask);
    }
    if (n < 0) {
        qerr_set(&q, QERR_NOMEM, "out of memory computing the token mask");
        goto fail;
    }
    if (n == 0) {
        s->request_fault = true; /* the request's grammar: no token continues it */
        qerr_set(&q, QERR_INVALID,
                 "structured output: no token can continue the output after %d tokens (the "
                 "grammar reached a dead end)",
                 s->n_generated);
        goto fail;
    }
    grammar_mask_apply(mask, row, e->vocab);
    e->local.grammar_masks++;
    e->local.grammar_mask_s += engine_now() - t0;
    return 0;
fail:
    snprintf(s->error, sizeof s->error, "%.190s", q.msg);
    return -1;
}

int seq_constrain_accept(struct engine *e, struct seq *s, int32_t t)
{
    (void)e;
    struct qerr q = {0};
    if (!grammar_matcher_accept(s->gm, t, &q)) return 0;
    snprintf(s->error, sizeof s->error, "structured output: %.170s", q.msg);
    return -1;
}

/* The longest prefix of s[0..n) that does not end inside a UTF-8 character. */
static int utf8_whole(const char *s, int n)
{
    int i = n;
    while (i > 0 && i > n - 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) i--;
    if (i == 0) return 0;
    unsigned char lead = (unsigned char)s[i - 1];
    int want = lead < 0x80 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 0;
    return n - (i - 1) >= want ? n : i - 1;
}

int seq_grammar_draft(struct engine *e, struct seq *s, int32_t *draft, int n, int cap, int *cls)
{
    struct qerr q = {0};
    struct grammar_vocab *v;
    if (!s->gm && (gvocab(e, &v, &q) || grammar_matcher_create(s->grammar, v, &s->gm, &q)))
        return n; /* verification meets the same error and reports it */
    if (n > cap) n = cap;
    n = grammar_matcher_allowed_run(s->gm, draft, n);
    /* a JSON Schema's property names, its '":', an enum value once it is told apart: the
     * model cannot write anything else there, so the tokens that spell them are kept unless
     * it splits the bytes otherwise */
    char forced[96];
    int nb = utf8_whole(forced, grammar_matcher_forced(s->gm, forced, (int)sizeof forced));
    if (nb <= 0 || cap <= 0) return n;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tokenizer_encode(e->tok, forced, (size_t)nb, false, false, &ids, &n_ids, &q)) return n;
    int nf = n_ids < (size_t)cap ? (int)n_ids : cap;
    nf = grammar_matcher_allowed_run(s->gm, ids, nf);
    bool ngram_has_them = n >= nf && !memcmp(draft, ids, (size_t)nf * sizeof *ids);
    if (nf > 0 && !ngram_has_them) {
        memcpy(draft, ids, (size_t)nf * sizeof *ids);
        n = nf;
        *cls = SPEC_CLASS_GRAMMAR;
    }
    free(ids);
    return n;
}

/* ---- masks computed while the forward runs ---- */

/* The listed sequences' masks (whichever thread: only one at a time). */
static void run_jobs(struct engine *e)
{
    double t0 = engine_now();
    for (int i = 0; i < e->n_mask_jobs; i++) {
        struct seq *s = e->mask_jobs[i];
        s->premask_n = grammar_matcher_mask(s->gm, s->premask);
        s->mask_ready = s->premask_n >= 0;
    }
    e->jobs_mask_s += engine_now() - t0;
}

static void launched(void *ctx)
{
    run_jobs(ctx);
}

static void *mask_main(void *arg)
{
    struct engine *e = arg;
    pthread_mutex_lock(&e->mask_mu);
    for (;;) {
        while (!e->mask_quit && e->mask_done == e->mask_posted)
            pthread_cond_wait(&e->mask_cv, &e->mask_mu);
        if (e->mask_quit) break;
        unsigned step = e->mask_posted;
        pthread_mutex_unlock(&e->mask_mu);
        run_jobs(e);
        pthread_mutex_lock(&e->mask_mu);
        e->mask_done = step;
        pthread_cond_broadcast(&e->mask_cv);
    }
    pthread_mutex_unlock(&e->mask_mu);
    return NULL;
}

int grammar_overlap_start(struct engine *e, struct qerr *err)
{
    e->mask_jobs = calloc((size_t)e->o.max_seqs, sizeof *e->mask_jobs);
    if (!e->mask_jobs) return qerr_set(err, QERR_NOMEM, "engine: out of memory");
    if (e->o.mask_mode != ENGINE_MASK_THREAD) return 0;
    pthread_mutex_init(&e->mask_mu, NULL);
    pthread_cond_init(&e->mask_cv, NULL);
    if (pthread_create(&e->mask_thread, NULL, mask_main, e) != 0) {
        pthread_mutex_destroy(&e->mask_mu);
        pthread_cond_destroy(&e->mask_cv);
        return qerr_set(err, QERR_IO, "engine: cannot start the token-mask thread");
    }
    e->mask_thread_on = true;
    return 0;
}

void grammar_overlap_stop(struct engine *e)
{
    if (e->mask_thread_on) {
        pthread_mutex_lock(&e->mask_mu);
        e->mask_quit = true;
        pthread_cond_broadcast(&e->mask_cv);
        pthread_mutex_unlock(&e->mask_mu);
        pthread_join(e->mask_thread, NULL);
        pthread_mutex_destroy(&e->mask_mu);
        pthread_cond_destroy(&e->mask_cv);
        e->mask_thread_on = false;
    }
    free(e->mask_jobs);
    e->mask_jobs = NULL;
}

void grammar_step_begin(struct engine *e, struct model_batch *b)
{
    e->n_mask_jobs = 0;
    if (e->o.mask_mode == ENGINE_MASK_AFTER) return;
    const struct step_plan *p = &e->plan;
    for (int i = 0; i < p->n_seqs; i++) {
        struct seq *s = p->seqs[i];
        s->mask_ready = false;
        /* sequences that sample from this step: the mask of their first sampled position */
        if (!s->grammar || !p->wants_logits[i] || s->max_tokens == 0 ||
            s->pooling != ENGINE_POOL_NONE)
            continue;
        struct qerr q = {0};
        struct grammar_vocab *v;
        if (gvocab(e, &v, &q) || (!s->gm && grammar_matcher_create(s->grammar, v, &s->gm, &q)))
            continue; /* seq_constrain meets the same error and reports it */
        if (!s->premask && !(s->premask = malloc((size_t)grammar_mask_words(v) * sizeof(uint64_t))))
            continue;
        e->mask_jobs[e->n_mask_jobs++] = s;
    }
    if (!e->n_mask_jobs) return;
    if (e->mask_thread_on) {
        pthread_mutex_lock(&e->mask_mu);
        e->mask_posted++;
        pthread_cond_broadcast(&e->mask_cv);
        pthread_mutex_unlock(&e->mask_mu);
    } else {
        b->while_running = launched;
        b->while_ctx = e;
    }
}

void grammar_step_end(struct engine *e)
{
    if (e->mask_thread_on && e->n_mask_jobs) {
        double t0 = engine_now();
        pthread_mutex_lock(&e->mask_mu);
        while (e->mask_done != e->mask_posted) pthread_cond_wait(&e->mask_cv, &e->mask_mu);
        pthread_mutex_unlock(&e->mask_mu);
        e->local.grammar_mask_wait_s += engine_now() - t0;
    }
    /* the time the masks took, counted where seq_constrain counts the others */
    e->local.grammar_mask_s += e->jobs_mask_s;
    e->local.grammar_mask_ahead_s += e->jobs_mask_s;
    e->jobs_mask_s = 0;
}
