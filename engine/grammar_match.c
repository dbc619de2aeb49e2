/* grammar_match: one sequence's position in a grammar, and its allowed-token mask.
 *
 * DESIGN. The position is a set of stacks of DFA states (the top is the current state, those
 * below are where called rules return), closed under calls and returns, so every stack's top
 * has byte transitions; `accept` says some stack has finished the root rule. The mask is the
 * union over stacks of what each top allows, in two parts (XGrammar's adaptive token-mask
 * cache, computed by a walk of the vocabulary trie as llguidance does):
 *   - accepted: tokens whose every byte moves within the top's own rule. This depends on the
 *     top state only, so it is computed once per state and cached in the grammar;
 *   - uncertain: tokens that fail within the rule after passing a state where the rule may
 *     return or call, so whether they fit depends on the stack. Few, and checked one by one
 *     against the real stack at each step.
 * A schema without recursion is one rule with no calls: its masks are pure cache lookups. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

struct gstack {
    int32_t n;
    int32_t s[GRAMMAR_MAX_DEPTH];
};

struct gset {
    int n;
    bool accept;
    struct gstack st[GRAMMAR_MAX_STACKS];
};

struct gmask_entry {
    int n_acc;      /* accepted tokens */
    int32_t *acc;   /* as a list when short, else NULL */
    uint64_t *bits; /* as a bitmask when long, else NULL */
    int n_unc;
    int32_t *unc;
};

struct grammar_matcher {
    struct grammar *g;
    const struct grammar_vocab *v;
    struct gset cur, tmp, a, b;
    struct gset probe; /* grammar_matcher_allowed_run's position between tokens */
    struct gstack work[4 * GRAMMAR_MAX_STACKS];
    int32_t *scratch_st; /* [max_len + 1] trie walk */
    uint8_t *scratch_ex;
    uint64_t *scratch_bits; /* [words] */
    int32_t *scratch_unc;   /* [vocab] */
};

static bool stack_eq(const struct gstack *x, const struct gstack *y)
{
    return x->n == y->n && !memcmp(x->s, y->s, (size_t)x->n * sizeof x->s[0]);
}

/* Closes raw[0..n) under calls and returns into out. -1 when it holds too many stacks. */
static int close_set(struct grammar_matcher *m, const struct gstack *raw, int n, struct gset *out)
{
    const struct grammar *g = m->g;
    struct gstack *w = m->work;
    int nw = 0, cap = (int)(sizeof m->work / sizeof m->work[0]);
    out->n = 0;
    out->accept = false;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int k = 0; k < nw && !seen; k++) seen = stack_eq(&w[k], &raw[i]);
        if (!seen) w[nw++] = raw[i];
    }
    for (int i = 0; i < nw; i++) {
        struct gstack x = w[i];
        int32_t top = x.s[x.n - 1];
        uint8_t f = g->flags[top];
        if (f & GS_BYTES) {
            if (out->n == GRAMMAR_MAX_STACKS) return -1;
            out->st[out->n++] = x;
        }
        struct gstack y[64];
        int ny = 0;
        if (f & GS_FINAL) {
            if (x.n == 1) {
                out->accept = true;
            } else {
                y[ny] = x;
                y[ny++].n--;
            }
        }
        if (f & GS_CALLS && x.n < GRAMMAR_MAX_DEPTH)
            for (int c = g->call_off[top]; c < g->call_off[top + 1] && ny < 64; c++) {
                if (g->calls[c].ret < 0) continue; /* pruned: the call cannot lead to an end */
                y[ny] = x;
                y[ny].s[x.n - 1] = g->calls[c].ret;
                y[ny].s[x.n] = g->rule_start[g->calls[c].rule];
                y[ny++].n = x.n + 1;
            }
        for (int k = 0; k < ny; k++) {
            bool seen = false;
            for (int q = 0; q < nw && !seen; q++) seen = stack_eq(&w[q], &y[k]);
            if (seen) continue;
            if (nw == cap) return -1;
            w[nw++] = y[k];
        }
    }
    return 0;
}

/* in --byte c--> out (closed). Returns out->n, or -1 on overflow. */
static int step_byte(struct grammar_matcher *m, const struct gset *in, uint8_t c, struct gset *out)
{
    const struct grammar *g = m->g;
    int n = 0;
    for (int i = 0; i < in->n; i++) {
        const struct gstack *x = &in->st[i];
        int32_t nt = g->next[(size_t)x->s[x->n - 1] * 256 + c];
        if (nt < 0) continue;
        m->tmp.st[n] = *x;
        m->tmp.st[n].s[x->n - 1] = nt;
        n++;
    }
    if (close_set(m, m->tmp.st, n, out)) return -1;
    return out->n + (out->accept ? 1 : 0) > 0 ? out->n : 0;
}

/* Follows bytes from `in`; true when some stack survives all of them (or accepts at the end).
 * The result is left in *res (m->a or m->b). */
static bool walk_bytes(struct grammar_matcher *m, const struct gset *in, const char *s, size_t n,
                       struct gset **res)
{
    const struct gset *cur = in;
    struct gset *bufs[2] = {&m->a, &m->b};
    int which = 0;
    for (size_t i = 0; i < n; i++) {
        struct gset *out = bufs[which];
        which ^= 1;
        if (step_byte(m, cur, (uint8_t)s[i], out) < 0) return false;
        if (out->n == 0 && !(out->accept && i + 1 == n)) return false;
        cur = out;
    }
    *res = (struct gset *)cur;
    return true;
}

/* ---- the per-state cache ---- */

void grammar_masks_clear(struct grammar *g)
{
    if (!g->cache) return;
    for (int i = 0; i < g->n_states; i++) {
        struct gmask_entry *e = g->cache[i];
        if (!e) continue;
        free(e->acc);
        free(e->bits);
        free(e->unc);
        free(e);
        g->cache[i] = NULL;
    }
}

static struct gmask_entry *entry_build(struct grammar_matcher *m, int32_t S)
{
    const struct grammar *g = m->g;
    const struct grammar_vocab *v = m->v;
    uint64_t *bits = m->scratch_bits;
    memset(bits, 0, (size_t)v->words * sizeof *bits);
    int32_t *st = m->scratch_st;
    uint8_t *ex = m->scratch_ex;
    int n_acc = 0, n_unc = 0;
    st[0] = S;
    ex[0] = 0;
    const struct gv_node *nodes = v->nodes;
    const uint8_t *nbyte = v->n_byte, *ndepth = v->n_depth;
    const int32_t *nend = v->n_end;
    const int32_t *next = g->next;
    const uint8_t *flags = g->flags;
    int i = 0, n = v->n_nodes;
    while (i < n) {
        int d = ndepth[i];
        int32_t ns = next[(size_t)st[d - 1] * 256 + nbyte[i]];
        if (ns < 0) {
            if (ex[d - 1])
                for (int k = nodes[i].first; k < nodes[nend[i]].first; k++)
                    m->scratch_unc[n_unc++] = v->sorted[k];
            i = nend[i];
            continue;
        }
        st[d] = ns;
        ex[d] = ex[d - 1] | (flags[ns] & (GS_FINAL | GS_CALLS));
        const struct gv_node *nd = &nodes[i];
        for (int k = 0; k < nd->n_exact; k++) {
            int32_t t = v->sorted[nd->first + k];
            bits[t / 64] |= 1ull << (t % 64);
            n_acc++;
        }
        i++;
    }
    struct gmask_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->n_acc = n_acc;
    if ((size_t)n_acc * sizeof(int32_t) < (size_t)v->words * sizeof(uint64_t)) {
        e->acc = malloc((size_t)(n_acc ? n_acc : 1) * sizeof *e->acc);
        if (e->acc) {
            int k = 0;
            for (int w = 0; w < v->words; w++)
                for (uint64_t x = bits[w]; x; x &= x - 1) e->acc[k++] = w * 64 + __builtin_ctzll(x);
        }
    } else if ((e->bits = malloc((size_t)v->words * sizeof *e->bits))) {
        memcpy(e->bits, bits, (size_t)v->words * sizeof *bits);
    }
    e->n_unc = n_unc;
    e->unc = malloc((size_t)(n_unc ? n_unc : 1) * sizeof *e->unc);
    if ((!e->acc && !e->bits) || !e->unc) {
        free(e->acc);
        free(e->bits);
        free(e->unc);
        free(e);
        return NULL;
    }
    memcpy(e->unc, m->scratch_unc, (size_t)n_unc * sizeof *e->unc);
    return e;
}

static struct gmask_entry *entry(struct grammar_matcher *m, int32_t S)
{
    struct grammar *g = m->g;
    if (g->cache_vocab != m->v) { /* another vocabulary: the cached sets do not apply */
        grammar_masks_clear(g);
        g->cache_vocab = m->v;
    }
    if (!g->cache[S]) g->cache[S] = entry_build(m, S);
    return g->cache[S];
}

/* ---- the matcher ---- */

void grammar_matcher_free(struct grammar_matcher *m)
{
    if (!m) return;
    grammar_unref(m->g);
    free(m->scratch_st);
    free(m->scratch_ex);
    free(m->scratch_bits);
    free(m->scratch_unc);
    free(m);
}

int grammar_matcher_create(struct grammar *g, const struct grammar_vocab *v,
                           struct grammar_matcher **out, struct qerr *err)
{
    *out = NULL;
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return qerr_set(err, QERR_NOMEM, "out of memory for a grammar matcher");
    grammar_ref(g);
    m->g = g;
    m->v = v;
    m->scratch_st = malloc(((size_t)v->max_len + 1) * sizeof *m->scratch_st);
    m->scratch_ex = malloc((size_t)v->max_len + 1);
    m->scratch_bits = malloc((size_t)v->words * sizeof *m->scratch_bits);
    m->scratch_unc = malloc((size_t)v->vocab * sizeof *m->scratch_unc);
    if (!m->scratch_st || !m->scratch_ex || !m->scratch_bits || !m->scratch_unc) {
        grammar_matcher_free(m);
        return qerr_set(err, QERR_NOMEM, "out of memory for a grammar matcher");
    }
    struct gstack root = {.n = 1, .s = {g->rule_start[0]}};
    if (close_set(m, &root, 1, &m->cur)) {
        grammar_matcher_free(m);
        return qerr_set(err, QERR_FULL, "the grammar is too ambiguous at its start");
    }
    *out = m;
    return 0;
}

bool grammar_matcher_accepting(const struct grammar_matcher *m)
{
    return m->cur.accept;
}

bool grammar_matcher_done(const struct grammar_matcher *m)
{
    return m->cur.accept && m->cur.n == 0;
}

/* Sets token t in mask when the stack set x (one stack) can take its bytes. */
static void allow_if_walks(struct grammar_matcher *m, const struct gset *x, int32_t t,
                           uint64_t *mask)
{
    if (mask[t / 64] >> (t % 64) & 1) return;
    struct gset *res;
    if (walk_bytes(m, x, m->v->bytes[t], m->v->len[t], &res)) mask[t / 64] |= 1ull << (t % 64);
}

int grammar_matcher_mask(struct grammar_matcher *m, uint64_t *mask)
{
    const struct grammar_vocab *v = m->v;
    memset(mask, 0, (size_t)v->words * sizeof *mask);
    int32_t done_tops[GRAMMAR_MAX_STACKS];
    int n_done = 0;
    for (int i = 0; i < m->cur.n; i++) {
        const struct gstack *x = &m->cur.st[i];
        int32_t top = x->s[x->n - 1];
        struct gmask_entry *e = entry(m, top);
        if (!e) return -1;
        struct gset single; /* {x} alone: its alternatives are the other stacks */
        single.n = 1;
        single.accept = false;
        single.st[0] = *x;
        if (x->n > GRAMMAR_MAX_DEPTH / 2) {
            /* the state's cached set was made with room for every call a token makes; near
             * the depth cap some no longer fit (fuzz_grammar: a space after 14 nested objects
             * was allowed, then refused), so each candidate is walked from this stack */
            for (int w = 0; e->bits && w < v->words; w++)
                for (uint64_t y = e->bits[w]; y; y &= y - 1)
                    allow_if_walks(m, &single, w * 64 + __builtin_ctzll(y), mask);
            for (int k = 0; !e->bits && k < e->n_acc; k++)
                allow_if_walks(m, &single, e->acc[k], mask);
            for (int k = 0; k < e->n_unc; k++) allow_if_walks(m, &single, e->unc[k], mask);
            continue;
        }
        bool again = false;
        for (int k = 0; k < n_done && !again; k++) again = done_tops[k] == top;
        if (!again) {
            done_tops[n_done++] = top;
            if (e->bits)
                for (int w = 0; w < v->words; w++) mask[w] |= e->bits[w];
            else
                for (int k = 0; k < e->n_acc; k++) mask[e->acc[k] / 64] |= 1ull << (e->acc[k] % 64);
        }
        for (int k = 0; k < e->n_unc; k++) allow_if_walks(m, &single, e->unc[k], mask);
    }
    if (v->n_marker && !m->g->tool_markers)
        for (int w = 0; w < v->words; w++) mask[w] &= ~v->marker[w];
    if (m->cur.accept)
        for (int w = 0; w < v->words; w++) mask[w] |= v->eog[w];
    int count = 0;
    for (int w = 0; w < v->words; w++) count += __builtin_popcountll(mask[w]);
    return count;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n,
                                 struct qerr *err)
{
    struct gset *res;
    if (!walk_bytes(m, &m->cur, s, n, &res))
        return qerr_set(err, QERR_INVALID, "the grammar does not allow '%.*s' here",
                        (int)(n > 40 ? 40 : n), s);
    if (res != &m->cur) m->cur = *res;
    return 0;
}

int grammar_matcher_accept(struct grammar_matcher *m, int32_t t, struct qerr *err)
{
    const struct grammar_vocab *v = m->v;
    if (t < 0 || t >= v->vocab)
        return qerr_set(err, QERR_INVALID, "token %d is out of the vocabulary", t);
    if (grammar_vocab_is_eog(v, t)) {
        if (!m->cur.accept)
            return qerr_set(err, QERR_INVALID, "end of generation before the grammar is complete");
        m->cur.n = 0; /* finished: nothing may follow */
        return 0;
    }
    if (!v->bytes[t]) return qerr_set(err, QERR_INVALID, "token %d has no text", t);
    return grammar_matcher_accept_bytes(m, v->bytes[t], v->len[t], err);
}

int grammar_matcher_forced(struct grammar_matcher *m, char *out, int cap)
{
    const struct grammar *g = m->g;
    const struct gset *cur = &m->cur;
    struct gset *bufs[2] = {&m->a, &m->b};
    int n = 0;
    while (n < cap && !cur->accept && cur->n > 0) {
        int only = -1;
        for (int c = 0; c < 256; c++) {
            bool live = false;
            for (int i = 0; i < cur->n && !live; i++) {
                const struct gstack *x = &cur->st[i];
                live = g->next[(size_t)x->s[x->n - 1] * 256 + c] >= 0;
            }
            if (!live) continue;
            if (only >= 0) return n; /* a second byte: the output is free here */
            only = c;
        }
        if (only < 0) break;
        struct gset *nx = bufs[n & 1];
        if (step_byte(m, cur, (uint8_t)only, nx) < 0 || (nx->n == 0 && !nx->accept)) break;
        out[n++] = (char)only;
        cur = nx;
    }
    return n;
}

int grammar_matcher_allowed_run(struct grammar_matcher *m, const int32_t *toks, int n)
{
    const struct grammar_vocab *v = m->v;
    const struct gset *cur = &m->cur;
    for (int i = 0; i < n; i++) {
        int32_t t = toks[i];
        if (t < 0 || t >= v->vocab) return i;
        if (grammar_vocab_is_eog(v, t)) return cur->accept ? i + 1 : i; /* nothing follows it */
        if (!v->bytes[t] ||
            (v->n_marker && !m->g->tool_markers && ((v->marker[t / 64] >> (t % 64)) & 1)))
            return i;
        struct gset *res;
        if (!walk_bytes(m, cur, v->bytes[t], v->len[t], &res)) return i;
        m->probe = *res;
        cur = &m->probe;
    }
    return n;
}

int grammar_precompute(struct grammar *g, const struct grammar_vocab *v, int max_states,
                       struct qerr *err)
{
    if (g->n_states > max_states) return 0;
    struct grammar_matcher *m;
    int rc = grammar_matcher_create(g, v, &m, err);
    if (rc) return rc;
    for (int s = 0; s < g->n_states && !rc; s++)
        if ((g->flags[s] & GS_BYTES) && !entry(m, s))
            rc = qerr_set(err, QERR_NOMEM, "out of memory precomputing token masks");
    grammar_matcher_free(m);
    return rc;
}

void grammar_mask_apply(const uint64_t *mask, float *logits, int vocab)
{
    for (int w = 0; w * 64 < vocab; w++) {
        uint64_t x = mask[w];
        if (x == ~0ull) continue;
        int base = w * 64, end = base + 64 < vocab ? base + 64 : vocab;
        if (x == 0) {
            for (int i = base; i < end; i++) logits[i] = -INFINITY;
            continue;
        }
        /* only the disallowed ones, lowest first */
        for (uint64_t y = ~x; y; y &= y - 1) {
            int i = base + __builtin_ctzll(y);
            if (i < end) logits[i] = -INFINITY;
        }
    }
}
