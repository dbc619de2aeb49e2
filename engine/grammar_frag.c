/* grammar_frag: operations on a fragment just built (a plain byte NFA, no calls): its strings
 * cut to a length range in characters (JSON Schema's minLength/maxLength beside a pattern or
 * format), and whether it takes a given string (a key against propertyNames or a pattern).
 *
 * DESIGN. The fragment's states and edges are the builder's last ones, so it is read in place.
 * A character is counted at its UTF-8 lead byte (continuation bytes 0x80-0xBF are not), so the
 * product of the fragment with a counter is the fragment copied once per count: a lead-byte
 * edge moves to the next copy, every other edge stays in its own. When the fragment's own
 * shortest and longest strings already lie within the bounds (a format of at most 117
 * characters under a maxLength of 2083), it is returned as it is. The copies it leaves behind
 * are unreachable and cost the DFA nothing. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define LEN_MAX_STATES 200000 /* copies of the fragment, all counts together */

static bool is_lead(uint8_t c)
{
    return c < 0x80 || c > 0xBF;
}

/* the fragment's edges by source state: [off[s], off[s+1]) in idx */
struct sub {
    int s0, n, e0, ne;
    int *off, *idx;
};

static int sub_init(struct sub *g, const struct gb *b, int s0, int e0)
{
    g->s0 = s0;
    g->n = b->n_states - s0;
    g->e0 = e0;
    g->ne = b->n_edges - e0;
    g->off = calloc((size_t)g->n + 1, sizeof *g->off);
    g->idx = malloc(((size_t)g->ne + 1) * sizeof *g->idx);
    if (!g->off || !g->idx) return -1;
    for (int k = 0; k < g->ne; k++) {
        const struct gb_edge *e = &b->edges[e0 + k];
        bool cont = e->lo >= 0x80 && e->hi <= 0xBF, touches = e->lo <= 0xBF && e->hi >= 0x80;
        if (e->kind == GB_CALL || (e->kind == GB_BYTES && touches && !cont))
            return 1; /* not a plain UTF-8 byte NFA */
        g->off[e->from - s0 + 1]++;
    }
    for (int s = 0; s < g->n; s++) g->off[s + 1] += g->off[s];
    int *fill = malloc(((size_t)g->n + 1) * sizeof *fill);
    if (!fill) return -1;
    for (int s = 0; s <= g->n; s++) fill[s] = g->off[s];
    for (int k = 0; k < g->ne; k++) g->idx[fill[b->edges[e0 + k].from - s0]++] = e0 + k;
    free(fill);
    return 0;
}

/* Characters counted on an edge: 1 for a lead byte (the fragment's ranges never mix lead and
 * continuation bytes: gb_codepoints splits them), else 0. */
static int weight(const struct gb_edge *e)
{
    return e->kind == GB_BYTES && is_lead(e->lo) ? 1 : 0;
}

/* Shortest string in characters from start to end (a queue of states whose distance fell;
 * the weights are 0 and 1, so this settles quickly). */
static int shortest(const struct gb *b, const struct sub *g, int start, int end)
{
    int n = g->n, best = INT_MAX;
    int *dist = malloc((size_t)n * sizeof *dist), *q = malloc((size_t)n * sizeof *q);
    char *queued = calloc((size_t)n, 1);
    if (!dist || !q || !queued) goto out;
    for (int s = 0; s < n; s++) dist[s] = INT_MAX;
    int head = 0, count = 0;
    dist[start] = 0;
    q[0] = start;
    queued[start] = 1;
    count = 1;
    while (count) {
        int s = q[head];
        head = (head + 1) % n;
        count--;
        queued[s] = 0;
        for (int k = g->off[s]; k < g->off[s + 1]; k++) {
            const struct gb_edge *e = &b->edges[g->idx[k]];
            int t = e->to - g->s0, w = weight(e);
            if (dist[s] + w >= dist[t]) continue;
            dist[t] = dist[s] + w;
            if (!queued[t]) {
                q[(head + count++) % n] = t;
                queued[t] = 1;
            }
        }
    }
    best = dist[end];
out:
    free(dist);
    free(q);
    free(queued);
    return best;
}

/* Longest string in characters, INT_MAX where a cycle lies on some path from start to end. */
static int longest(const struct gb *b, const struct sub *g, int start, int end)
{
    int n = g->n, result = INT_MAX;
    char *useful = calloc((size_t)n, 1), *color = calloc((size_t)n, 1);
    int *memo = malloc((size_t)n * sizeof *memo), *stack = malloc((size_t)n * sizeof *stack),
        *pos = malloc((size_t)n * sizeof *pos);
    if (!useful || !color || !memo || !stack || !pos) goto out;
    /* useful: reaches end (fixed point over the edges; the fragments are small) */
    useful[end] = 1;
    for (bool changed = true; changed;) {
        changed = false;
        for (int k = 0; k < g->ne; k++) {
            const struct gb_edge *e = &b->edges[g->e0 + k];
            if (useful[e->to - g->s0] && !useful[e->from - g->s0])
                useful[e->from - g->s0] = changed = 1;
        }
    }
    if (!useful[start]) goto out;
    /* iterative depth-first search over useful states: grey on the stack, black when done */
    int sp = 0;
    stack[sp] = start;
    pos[sp++] = g->off[start];
    color[start] = 1;
    memo[start] = 0;
    while (sp) {
        int s = stack[sp - 1];
        if (pos[sp - 1] == g->off[s + 1]) {
            color[s] = 2;
            sp--;
            if (sp) {
                int p = stack[sp - 1];
                const struct gb_edge *e = &b->edges[g->idx[pos[sp - 1] - 1]];
                int v = memo[s] + weight(e);
                if (v > memo[p]) memo[p] = v;
            }
            continue;
        }
        const struct gb_edge *e = &b->edges[g->idx[pos[sp - 1]++]];
        int t = e->to - g->s0;
        if (!useful[t]) continue;
        if (color[t] == 1) goto out; /* a cycle on a path to the end */
        if (color[t] == 2) {
            int v = memo[t] + weight(e);
            if (v > memo[s]) memo[s] = v;
            continue;
        }
        color[t] = 1;
        memo[t] = 0;
        stack[sp] = t;
        pos[sp++] = g->off[t];
    }
    result = memo[start];
out:
    free(useful);
    free(color);
    free(memo);
    free(stack);
    free(pos);
    return result;
}

struct frag gb_length(struct gb *b, struct frag x, int s0, int e0, int min, int max)
{
    if (b->rc) return x;
    struct sub g = {0};
    struct frag out = x;
    int rc = sub_init(&g, b, s0, e0);
    if (rc) {
        if (rc < 0)
            gb_fail(b, QERR_NOMEM, "out of memory compiling the grammar");
        else
            gb_fail(b, QERR_UNSUPPORTED, "length bounds on a fragment with calls");
        goto done;
    }
    int start = x.s - s0, end = x.e - s0;
    int lo = shortest(b, &g, start, end), hi = longest(b, &g, start, end);
    if (lo == INT_MAX) goto done;                /* matches nothing: nothing to cut */
    int upper = max >= 0 && max < hi ? max : -1; /* the copy past which nothing goes */
    int lower = min > lo ? min : 0;
    if (upper < 0 && lower == 0) goto done;
    if (upper >= 0 && lower > upper) {
        gb_fail(b, QERR_INVALID, "no string of %d to %d characters matches", min, max);
        goto done;
    }
    /* copies 0..last; without an upper bound the last one loops (any count >= lower) */
    int last = upper >= 0 ? upper : lower;
    if ((long)g.n * (last + 1) > LEN_MAX_STATES) {
        gb_fail(b, QERR_UNSUPPORTED, "length bounds up to %d make too large an automaton", last);
        goto done;
    }
    int base = b->n_states;
    for (long k = 0; k < (long)g.n * (last + 1) && !b->rc; k++) gb_state(b);
    int fin = gb_state(b);
    if (b->rc) goto done;
    for (int c = 0; c <= last; c++) {
        for (int k = 0; k < g.ne; k++) {
            struct gb_edge e = b->edges[e0 + k]; /* a copy: adding edges may move the array */
            int from = base + c * g.n + (e.from - s0);
            int tc = c + weight(&e);
            if (tc > last) {
                if (upper >= 0) continue; /* one character too many */
                tc = last;
            }
            int to = base + tc * g.n + (e.to - s0);
            if (e.kind == GB_BYTES)
                gb_range(b, from, to, e.lo, e.hi);
            else
                gb_eps(b, from, to);
        }
        if (c >= lower) gb_eps(b, base + c * g.n + end, fin);
    }
    out = (struct frag){base + start, fin};
done:
    free(g.off);
    free(g.idx);
    return out;
}

/* the states reachable from those marked in `on` by epsilon edges, marked too */
static void closure(const struct gb *b, const struct sub *g, char *on, int *stack)
{
    int sp = 0;
    for (int s = 0; s < g->n; s++)
        if (on[s]) stack[sp++] = s;
    while (sp) {
        int s = stack[--sp];
        for (int k = g->off[s]; k < g->off[s + 1]; k++) {
            const struct gb_edge *e = &b->edges[g->idx[k]];
            int t = e->to - g->s0;
            if (e->kind == GB_EPS && !on[t]) {
                on[t] = 1;
                stack[sp++] = t;
            }
        }
    }
}

int gb_frag_takes(struct gb *b, struct frag x, int s0, int e0, const char *str, size_t len)
{
    if (b->rc) return -1;
    struct sub g = {0};
    int out = -1;
    char *on = NULL, *next = NULL;
    int *stack = NULL;
    if (sub_init(&g, b, s0, e0)) goto done;
    on = calloc((size_t)g.n, 1);
    next = calloc((size_t)g.n, 1);
    stack = malloc((size_t)g.n * sizeof *stack);
    if (!on || !next || !stack) goto done;
    on[x.s - s0] = 1;
    closure(b, &g, on, stack);
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)str[i];
        bool any = false;
        memset(next, 0, (size_t)g.n);
        for (int s = 0; s < g.n; s++) {
            if (!on[s]) continue;
            for (int k = g.off[s]; k < g.off[s + 1]; k++) {
                const struct gb_edge *e = &b->edges[g.idx[k]];
                if (e->kind == GB_BYTES && e->lo <= c && c <= e->hi) {
                    next[e->to - s0] = 1;
                    any = true;
                }
            }
        }
        if (!any) {
            out = 0;
            goto done;
        }
        closure(b, &g, next, stack);
        char *t = on;
        on = next;
        next = t;
    }
    out = on[x.e - s0];
done:
    free(g.off);
    free(g.idx);
    free(on);
    free(next);
    free(stack);
    return out;
}

/* ---- a fragment less a few strings ---- */

/* The listed strings as a trie: node 0 the root; child lists sorted by nothing (they are short). */
struct trie {
    int n, cap;
    struct trie_node {
        int first, next; /* first child, next sibling (-1: none) */
        uint8_t byte;
        bool terminal; /* a listed string ends here */
    } * nodes;
};

static int trie_add(struct trie *t, const char *s, size_t len)
{
    int cur = 0;
    for (size_t i = 0; i < len; i++) {
        int c = t->nodes[cur].first;
        while (c >= 0 && t->nodes[c].byte != (uint8_t)s[i]) c = t->nodes[c].next;
        if (c < 0) {
            if (t->n == t->cap) {
                int cap = t->cap * 2;
                struct trie_node *nn = realloc(t->nodes, (size_t)cap * sizeof *nn);
                if (!nn) return -1;
                t->nodes = nn;
                t->cap = cap;
            }
            c = t->n++;
            t->nodes[c] = (struct trie_node){-1, t->nodes[cur].first, (uint8_t)s[i], false};
            t->nodes[cur].first = c;
        }
        cur = c;
    }
    t->nodes[cur].terminal = true;
    return 0;
}

struct frag gb_exclude(struct gb *b, struct frag x, int s0, int e0, const char *const *strs,
                       const size_t *lens, int n)
{
    if (b->rc || n == 0) return x;
    struct sub g = {0};
    struct trie t = {1, 64, malloc(64 * sizeof(struct trie_node))};
    int *id = NULL, *queue = NULL;
    struct frag out = x;
    int rc = sub_init(&g, b, s0, e0);
    if (rc || !t.nodes) {
        gb_fail(b, rc > 0 ? QERR_UNSUPPORTED : QERR_NOMEM, "cannot exclude strings here");
        goto done;
    }
    t.nodes[0] = (struct trie_node){-1, -1, 0, false};
    for (int i = 0; i < n; i++)
        if (trie_add(&t, strs[i], lens[i])) {
            gb_fail(b, QERR_NOMEM, "out of memory compiling the grammar");
            goto done;
        }
    /* product states (fragment state, trie node or FREE = t.n: off the trie) */
    int width = t.n + 1, FREE = t.n;
    if ((long)g.n * width > LEN_MAX_STATES * 8L) {
        gb_fail(b, QERR_UNSUPPORTED, "too many listed properties to keep other keys apart");
        goto done;
    }
    id = malloc((size_t)g.n * width * sizeof *id);
    queue = malloc((size_t)g.n * width * sizeof *queue);
    if (!id || !queue) {
        gb_fail(b, QERR_NOMEM, "out of memory compiling the grammar");
        goto done;
    }
    for (long k = 0; k < (long)g.n * width; k++) id[k] = -1;
    int head = 0, tail = 0, fin = gb_state(b);
#define VISIT(s, tn)                                                                               \
    (id[(s)*width + (tn)] >= 0                                                                     \
         ? id[(s)*width + (tn)]                                                                    \
         : (queue[tail++] = (s)*width + (tn), id[(s)*width + (tn)] = gb_state(b)))
    int start = VISIT(x.s - s0, 0);
    while (head < tail && !b->rc) {
        int key = queue[head++], s = key / width, tn = key % width, from = id[key];
        if (s == x.e - s0 && (tn == FREE || !t.nodes[tn].terminal)) gb_eps(b, from, fin);
        for (int k = g.off[s]; k < g.off[s + 1]; k++) {
            struct gb_edge e = b->edges[g.idx[k]]; /* a copy: adding edges may move the array */
            int to = e.to - s0;
            if (e.kind == GB_EPS) {
                gb_eps(b, from, VISIT(to, tn));
                continue;
            }
            if (tn == FREE) {
                gb_range(b, from, VISIT(to, FREE), e.lo, e.hi);
                continue;
            }
            /* the bytes the trie goes on with lead to their child, the rest leave it */
            int lo = e.lo;
            for (int c = e.lo; c <= e.hi + 1; c++) {
                int child = -1;
                if (c <= e.hi)
                    for (int ch = t.nodes[tn].first; ch >= 0; ch = t.nodes[ch].next)
                        if (t.nodes[ch].byte == c) child = ch;
                if (c <= e.hi && child < 0) continue;
                if (c > lo) gb_range(b, from, VISIT(to, FREE), (uint8_t)lo, (uint8_t)(c - 1));
                if (child >= 0) gb_range(b, from, VISIT(to, child), (uint8_t)c, (uint8_t)c);
                lo = c + 1;
            }
        }
    }
#undef VISIT
    if (!b->rc) out = (struct frag){start, fin};
done:
    free(g.off);
    free(g.idx);
    free(t.nodes);
    free(id);
    free(queue);
    return out;
}

struct frag gb_text_until(struct gb *b, const char *tag, int after)
{
    int L = (int)strlen(tag), fail[32] = {0}, st[32];
    for (int k = 0; k < L; k++) st[k] = gb_state(b);
    int end = gb_state(b);
    for (int k = 1, m = 0; k < L; k++) { /* KMP failure function */
        while (m && tag[k] != tag[m]) m = fail[m - 1];
        if (tag[k] == tag[m]) m++;
        fail[k] = m;
    }
    for (int k = 0; k < L; k++) {
        gb_eps(b, st[k], end);
        int lo = 0, prev = -2;
        for (int c = 0; c <= 256; c++) {
            int to = -1;
            if (c < 256) {
                int m = k;
                while (m && (unsigned char)tag[m] != c) m = fail[m - 1];
                if ((unsigned char)tag[m] == c) m++;
                to = m == L ? after : st[m];
            }
            if (c == 256 || to != prev) {
                if (prev >= -1 && c > lo) gb_range(b, st[k], prev, (uint8_t)lo, (uint8_t)(c - 1));
                lo = c;
                prev = to;
            }
        }
    }
    return (struct frag){st[0], end};
}
