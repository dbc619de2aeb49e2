/* engine_grammar: structured outputs inside the engine step. A constrained sequence's token
 * mask is computed on the engine thread just before its sampling, from its own matcher, and
 * applied to its copy of the logits row, so unconstrained sequences in the same step are
 * untouched and sampling stays exact (the sampler sees -inf for what the grammar forbids, and
 * nothing else changes). The vocabulary trie is built at the first constrained step. */
#include <stdio.h>
#include <stdlib.h>

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
    int n = grammar_matcher_mask(s->gm, e->gmask);
    if (n < 0) {
        qerr_set(&q, QERR_NOMEM, "out of memory computing the token mask");
        goto fail;
    }
    if (n == 0) {
        qerr_set(&q, QERR_INVALID,
                 "structured output: no token can continue the output after %d tokens (the "
                 "grammar reached a dead end)",
                 s->n_generated);
        goto fail;
    }
    grammar_mask_apply(e->gmask, row, e->vocab);
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
