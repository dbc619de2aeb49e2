/* grammar_dfa: subset construction of each rule's NFA into DFA states. A DFA state is a set of
 * NFA states closed under epsilon edges; its byte transitions are computed per interval between
 * the edges' range boundaries (not per byte), and its call edges are grouped by rule, the
 * return state being the closure of the calls' targets. */
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define DFA_MAX_STATES 20000

struct dfa_build {
    struct gb *b;
    int32_t *adj_off, *adj; /* CSR: edge indices by from-state */
    int32_t *mark;
    int32_t gen;
    /* states with a byte or call edge, or that end a rule: a DFA state is the set of these in
     * a closure (states with only epsilon edges add nothing but would split equal sets, e.g.
     * one per branch of a character alternation) */
    uint8_t *important;
    int32_t *stack;
    /* the sets: pool of sorted NFA state lists */
    int32_t *pool;
    size_t n_pool, cap_pool;
    size_t *set_off; /* [n_dfa + 1] */
    int n_dfa, cap_dfa;
    int32_t *table; /* open-addressing hash: DFA ids, -1 empty */
    size_t cap_table;
    struct grammar *g;
    int cap_calls;
    int n_calls;
    struct qerr *err;
};

static int cmp_i32(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

static uint64_t hash_set(const int32_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)s[i]) * 1099511628211ull;
    return h;
}

/* Epsilon closure of in[0..n) into d->stack-based list; returns its sorted size in out. */
static size_t closure(struct dfa_build *d, const int32_t *in, size_t n, int32_t *out)
{
    d->gen++;
    size_t m = 0, sp = 0;
    for (size_t i = 0; i < n; i++)
        if (d->mark[in[i]] != d->gen) {
            d->mark[in[i]] = d->gen;
            d->stack[sp++] = in[i];
        }
    while (sp) {
        int32_t s = d->stack[--sp];
        if (d->important[s]) out[m++] = s;
        for (int32_t k = d->adj_off[s]; k < d->adj_off[s + 1]; k++) {
            const struct gb_edge *e = &d->b->edges[d->adj[k]];
            if (e->kind == GB_EPS && d->mark[e->to] != d->gen) {
                d->mark[e->to] = d->gen;
                d->stack[sp++] = e->to;
            }
        }
    }
    qsort(out, m, sizeof *out, cmp_i32);
    return m;
}

static int grow_table(struct dfa_build *d);

/* The DFA id of the sorted set s[0..n), created (for rule) if new; -1 on failure. */
static int32_t intern(struct dfa_build *d, const int32_t *s, size_t n, int rule)
{
    if (n == 0) return -1;
    if ((size_t)d->n_dfa * 2 >= d->cap_table && grow_table(d)) return -2;
    size_t mask = d->cap_table - 1;
    for (size_t h = hash_set(s, n) & mask;; h = (h + 1) & mask) {
        int32_t id = d->table[h];
        if (id < 0) {
            if (d->n_dfa >= DFA_MAX_STATES) {
                qerr_set(d->err, QERR_FULL, "the grammar is too large (over %d DFA states)",
                         DFA_MAX_STATES);
                return -2;
            }
            if (d->n_pool + n > d->cap_pool) {
                size_t cap = (d->n_pool + n) * 2;
                int32_t *p = realloc(d->pool, cap * sizeof *p);
                if (!p) return -2;
                d->pool = p;
                d->cap_pool = cap;
            }
            if (d->n_dfa + 1 >= d->cap_dfa) {
                int cap = d->cap_dfa ? d->cap_dfa * 2 : 256;
                struct grammar *g = d->g;
                size_t *so = realloc(d->set_off, (size_t)(cap + 1) * sizeof *so);
                if (so) d->set_off = so;
                int32_t *nx = realloc(g->next, (size_t)cap * 256 * sizeof *nx);
                if (nx) g->next = nx;
                uint8_t *fl = realloc(g->flags, (size_t)cap);
                if (fl) g->flags = fl;
                int32_t *co = realloc(g->call_off, (size_t)(cap + 1) * sizeof *co);
                if (co) g->call_off = co;
                int32_t *ro = realloc(g->rule_of, (size_t)cap * sizeof *ro);
                if (ro) g->rule_of = ro;
                if (!so || !nx || !fl || !co || !ro) return -2;
                d->cap_dfa = cap;
            }
            memcpy(d->pool + d->n_pool, s, n * sizeof *s);
            id = d->n_dfa++;
            d->set_off[id] = d->n_pool;
            d->n_pool += n;
            d->set_off[id + 1] = d->n_pool;
            d->g->rule_of[id] = rule;
            d->table[h] = id;
            return id;
        }
        size_t o = d->set_off[id], len = d->set_off[id + 1] - o;
        if (len == n && memcmp(d->pool + o, s, n * sizeof *s) == 0) return id;
    }
}

static int grow_table(struct dfa_build *d)
{
    size_t cap = d->cap_table ? d->cap_table * 2 : 1024;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t) return -1;
    memset(t, 0xff, cap * sizeof *t);
    for (int id = 0; id < d->n_dfa; id++) {
        size_t o = d->set_off[id], n = d->set_off[id + 1] - o;
        size_t h = hash_set(d->pool + o, n) & (cap - 1);
        while (t[h] >= 0) h = (h + 1) & (cap - 1);
        t[h] = id;
    }
    free(d->table);
    d->table = t;
    d->cap_table = cap;
    return 0;
}

static int add_call(struct dfa_build *d, int32_t rule, int32_t ret)
{
    if (d->n_calls == d->cap_calls) {
        int cap = d->cap_calls ? d->cap_calls * 2 : 64;
        struct gcall *c = realloc(d->g->calls, (size_t)cap * sizeof *c);
        if (!c) return -1;
        d->g->calls = c;
        d->cap_calls = cap;
    }
    d->g->calls[d->n_calls++] = (struct gcall){rule, ret};
    return 0;
}

/* Drops every transition and call into a state from which its rule can never end, so a mask
 * never offers a token that leads nowhere: the only dead ends left at run time are calls past
 * GRAMMAR_MAX_DEPTH. Liveness is a backward search from the final states over byte edges and
 * over call edges whose callee can end, repeated until no callee changes. */
static int prune_dead(struct grammar *g, struct qerr *err)
{
    int n = g->n_states, rc = 0;
    uint8_t *live = calloc((size_t)(n > 0 ? n : 1), 1);
    int32_t *rev_off = calloc((size_t)n + 1, sizeof *rev_off), *rev = NULL, *queue = NULL;
    if (!live || !rev_off) goto oom;
    /* reverse byte edges, one per (state, distinct target): rev[rev_off[t]..rev_off[t+1]) */
    for (int s = 0; s < n; s++) {
        const int32_t *row = g->next + (size_t)s * 256;
        for (int c = 0; c < 256; c++)
            if (row[c] >= 0 && (c == 0 || row[c - 1] != row[c])) rev_off[row[c] + 1]++;
    }
    for (int s = 0; s < n; s++) rev_off[s + 1] += rev_off[s];
    rev = malloc(((size_t)rev_off[n] + 1) * sizeof *rev);
    queue = malloc(((size_t)n + 1) * sizeof *queue);
    int32_t *fill = calloc((size_t)n + 1, sizeof *fill);
    if (!rev || !queue || !fill) {
        free(fill);
        goto oom;
    }
    for (int s = 0; s < n; s++) {
        const int32_t *row = g->next + (size_t)s * 256;
        for (int c = 0; c < 256; c++)
            if (row[c] >= 0 && (c == 0 || row[c - 1] != row[c]))
                rev[rev_off[row[c]] + fill[row[c]]++] = s;
    }
    free(fill);
    for (bool changed = true; changed;) {
        changed = false;
        int qh = 0, qt = 0;
        for (int s = 0; s < n; s++) {
            bool l = live[s] || (g->flags[s] & GS_FINAL);
            for (int c = g->call_off[s]; !l && c < g->call_off[s + 1]; c++)
                l = live[g->calls[c].ret] && live[g->rule_start[g->calls[c].rule]];
            if (l && !live[s]) {
                live[s] = 1;
                changed = true;
            }
            if (live[s]) queue[qt++] = s;
        }
        while (qh < qt) {
            int32_t t = queue[qh++];
            for (int32_t k = rev_off[t]; k < rev_off[t + 1]; k++)
                if (!live[rev[k]]) {
                    live[rev[k]] = 1;
                    queue[qt++] = rev[k];
                    changed = true;
                }
        }
    }
    if (!live[g->rule_start[0]]) {
        rc = qerr_set(err, QERR_INVALID, "the grammar matches no output at all");
        goto out;
    }
    for (int s = 0; s < n; s++) {
        int32_t *row = g->next + (size_t)s * 256;
        uint8_t f = g->flags[s] & GS_FINAL;
        for (int c = 0; c < 256; c++) {
            if (row[c] >= 0 && !live[row[c]]) row[c] = -1;
            if (row[c] >= 0) f |= GS_BYTES;
        }
        for (int c = g->call_off[s]; c < g->call_off[s + 1]; c++) {
            struct gcall *x = &g->calls[c];
            if (!live[x->ret] || !live[g->rule_start[x->rule]])
                x->ret = -1; /* skipped by the matcher */
            else
                f |= GS_CALLS;
        }
        g->flags[s] = f;
    }
    goto out;
oom:
    rc = qerr_set(err, QERR_NOMEM, "out of memory compiling the grammar");
out:
    free(live);
    free(rev_off);
    free(rev);
    free(queue);
    return rc;
}

int grammar_from_nfa(struct gb *b, struct grammar *g, struct qerr *err)
{
    struct dfa_build d = {.b = b, .g = g, .err = err};
    int n = b->n_states, rc = QERR_NOMEM;
    d.adj_off = calloc((size_t)n + 1, sizeof *d.adj_off);
    d.adj = malloc(((size_t)b->n_edges + 1) * sizeof *d.adj);
    d.mark = calloc((size_t)n + 1, sizeof *d.mark);
    d.stack = malloc(((size_t)n + 1) * sizeof *d.stack);
    d.important = calloc((size_t)n + 1, 1);
    int32_t *set = malloc(((size_t)n + 1) * sizeof *set);
    int32_t *tmp = malloc(((size_t)(n > b->n_edges ? n : b->n_edges) + 1) * sizeof *tmp);
    int32_t *cuts = malloc(((size_t)b->n_edges * 2 + 2) * sizeof *cuts);
    g->rule_start = malloc((size_t)(b->n_rules ? b->n_rules : 1) * sizeof *g->rule_start);
    if (!d.adj_off || !d.adj || !d.mark || !d.stack || !set || !tmp || !cuts || !g->rule_start ||
        !d.important)
        goto out;
    for (int i = 0; i < b->n_edges; i++)
        if (b->edges[i].kind != GB_EPS) d.important[b->edges[i].from] = 1;
    for (int r = 0; r < b->n_rules; r++) d.important[b->rules[r].end] = 1;
    for (int i = 0; i < b->n_edges; i++) d.adj_off[b->edges[i].from + 1]++;
    for (int i = 0; i < n; i++) d.adj_off[i + 1] += d.adj_off[i];
    {
        int32_t *fill = calloc((size_t)n + 1, sizeof *fill);
        if (!fill) goto out;
        for (int i = 0; i < b->n_edges; i++) {
            int f = b->edges[i].from;
            d.adj[d.adj_off[f] + fill[f]++] = i;
        }
        free(fill);
    }
    g->n_rules = b->n_rules;
    for (int r = 0; r < b->n_rules; r++) {
        int32_t st = b->rules[r].start;
        size_t m = closure(&d, &st, 1, set);
        if (m == 0) set[m++] = st; /* a rule that can do nothing: pruned as dead later */
        int32_t id = intern(&d, set, m, r);
        if (id < 0) goto out;
        g->rule_start[r] = id;
    }
    for (int id = 0; id < d.n_dfa; id++) {
        int rule = g->rule_of[id];
        int32_t *row = g->next + (size_t)id * 256;
        for (int k = 0; k < 256; k++) row[k] = -1;
        /* copy the set: intern may move the pool */
        size_t o = d.set_off[id], m = d.set_off[id + 1] - o;
        int32_t *cur = malloc((m ? m : 1) * sizeof *cur);
        if (!cur) goto out;
        memcpy(cur, d.pool + o, m * sizeof *cur);
        uint8_t flags = 0;
        size_t nc = 0;
        cuts[nc++] = 0;
        cuts[nc++] = 256;
        for (size_t i = 0; i < m; i++) {
            if (cur[i] == b->rules[rule].end) flags |= GS_FINAL;
            for (int32_t k = d.adj_off[cur[i]]; k < d.adj_off[cur[i] + 1]; k++) {
                const struct gb_edge *e = &b->edges[d.adj[k]];
                if (e->kind != GB_BYTES) continue;
                cuts[nc++] = e->lo;
                cuts[nc++] = e->hi + 1;
            }
        }
        qsort(cuts, nc, sizeof *cuts, cmp_i32);
        for (size_t c = 0; c + 1 < nc; c++) {
            int lo = cuts[c], hi = cuts[c + 1] - 1;
            if (hi < lo) continue;
            size_t t = 0;
            for (size_t i = 0; i < m; i++)
                for (int32_t k = d.adj_off[cur[i]]; k < d.adj_off[cur[i] + 1]; k++) {
                    const struct gb_edge *e = &b->edges[d.adj[k]];
                    if (e->kind == GB_BYTES && e->lo <= lo && e->hi >= hi) tmp[t++] = e->to;
                }
            if (!t) continue;
            size_t sm = closure(&d, tmp, t, set);
            if (!sm) continue; /* leads nowhere */
            int32_t to = intern(&d, set, sm, rule);
            if (to < 0) {
                free(cur);
                goto out;
            }
            row = g->next + (size_t)id * 256; /* intern may have moved next */
            for (int k = lo; k <= hi; k++) row[k] = to;
            flags |= GS_BYTES;
        }
        g->call_off[id] = d.n_calls;
        /* calls grouped by rule */
        for (size_t i = 0; i < m; i++)
            for (int32_t k = d.adj_off[cur[i]]; k < d.adj_off[cur[i] + 1]; k++) {
                const struct gb_edge *e = &b->edges[d.adj[k]];
                if (e->kind != GB_CALL) continue;
                bool seen = false;
                for (int c = g->call_off[id]; c < d.n_calls; c++)
                    seen |= g->calls[c].rule == e->rule;
                if (seen) continue;
                size_t t = 0;
                for (size_t i2 = 0; i2 < m; i2++)
                    for (int32_t k2 = d.adj_off[cur[i2]]; k2 < d.adj_off[cur[i2] + 1]; k2++) {
                        const struct gb_edge *e2 = &b->edges[d.adj[k2]];
                        if (e2->kind == GB_CALL && e2->rule == e->rule) tmp[t++] = e2->to;
                    }
                size_t sm = closure(&d, tmp, t, set);
                if (!sm) continue; /* returns to nothing */
                int32_t ret = intern(&d, set, sm, rule);
                if (ret < 0 || add_call(&d, e->rule, ret)) {
                    free(cur);
                    goto out;
                }
                flags |= GS_CALLS;
            }
        g->flags[id] = flags;
        free(cur);
    }
    g->call_off[d.n_dfa] = d.n_calls;
    g->n_states = d.n_dfa;
    rc = prune_dead(g, err);
out:
    if (rc && err && !err->msg[0]) qerr_set(err, QERR_NOMEM, "out of memory compiling the grammar");
    if (rc && err && err->code == 0) err->code = rc;
    if (rc && err && err->code == QERR_FULL) rc = QERR_FULL;
    g->n_states = d.n_dfa;
    free(d.adj_off);
    free(d.adj);
    free(d.mark);
    free(d.stack);
    free(d.important);
    free(d.pool);
    free(d.set_off);
    free(d.table);
    free(set);
    free(tmp);
    free(cuts);
    return rc;
}
