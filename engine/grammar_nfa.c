/* grammar_nfa: the NFA builder every grammar source writes through (Thompson fragments), and
 * Unicode code point ranges as UTF-8 byte-range sequences. Errors are sticky: after the first
 * failure (a size limit, out of memory) every builder call is a no-op, so compilers check once
 * at the end. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define GB_MAX_STATES 400000

void gb_init(struct gb *b, struct qerr *err)
{
    memset(b, 0, sizeof *b);
    b->err = err;
    b->max_states = GB_MAX_STATES;
}

void gb_free(struct gb *b)
{
    free(b->edges);
    free(b->rules);
    memset(b, 0, sizeof *b);
}

int gb_fail(struct gb *b, int code, const char *fmt, ...)
{
    if (b->rc) return b->rc;
    b->rc = code;
    if (b->err) {
        va_list ap;
        va_start(ap, fmt);
        b->err->code = code;
        vsnprintf(b->err->msg, sizeof b->err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int gb_state(struct gb *b)
{
    if (b->rc) return 0;
    if (b->n_states >= b->max_states) {
        gb_fail(b, QERR_FULL, "the grammar is too large (over %d automaton states)", b->max_states);
        return 0;
    }
    return b->n_states++;
}

static void add_edge(struct gb *b, struct gb_edge e)
{
    if (b->rc) return;
    if (b->n_edges == b->cap_edges) {
        int cap = b->cap_edges ? b->cap_edges * 2 : 1024;
        struct gb_edge *n = realloc(b->edges, (size_t)cap * sizeof *n);
        if (!n) {
            gb_fail(b, QERR_NOMEM, "out of memory compiling the grammar");
            return;
        }
        b->edges = n;
        b->cap_edges = cap;
    }
    b->edges[b->n_edges++] = e;
}

void gb_eps(struct gb *b, int from, int to)
{
    add_edge(b, (struct gb_edge){.from = from, .to = to, .kind = GB_EPS});
}

void gb_range(struct gb *b, int from, int to, uint8_t lo, uint8_t hi)
{
    add_edge(b, (struct gb_edge){.from = from, .to = to, .kind = GB_BYTES, .lo = lo, .hi = hi});
}

void gb_call(struct gb *b, int from, int to, int rule)
{
    add_edge(b, (struct gb_edge){.from = from, .to = to, .kind = GB_CALL, .rule = rule});
}

struct frag gb_empty(struct gb *b)
{
    int s = gb_state(b);
    return (struct frag){s, s};
}

struct frag gb_lit(struct gb *b, const char *s, size_t n)
{
    int start = gb_state(b), cur = start;
    for (size_t i = 0; i < n; i++) {
        int nx = gb_state(b);
        gb_range(b, cur, nx, (uint8_t)s[i], (uint8_t)s[i]);
        cur = nx;
    }
    return (struct frag){start, cur};
}

struct frag gb_lits(struct gb *b, const char *s)
{
    return gb_lit(b, s, strlen(s));
}

struct frag gb_byte_range(struct gb *b, uint8_t lo, uint8_t hi)
{
    int s = gb_state(b), e = gb_state(b);
    gb_range(b, s, e, lo, hi);
    return (struct frag){s, e};
}

struct frag gb_seq(struct gb *b, struct frag x, struct frag y)
{
    gb_eps(b, x.e, y.s);
    return (struct frag){x.s, y.e};
}

struct frag gb_alt_begin(struct gb *b)
{
    int s = gb_state(b), e = gb_state(b);
    return (struct frag){s, e};
}

void gb_alt_add(struct gb *b, struct frag alt, struct frag branch)
{
    gb_eps(b, alt.s, branch.s);
    gb_eps(b, branch.e, alt.e);
}

struct frag gb_opt(struct gb *b, struct frag x)
{
    struct frag a = gb_alt_begin(b);
    gb_alt_add(b, a, x);
    gb_eps(b, a.s, a.e);
    return a;
}

struct frag gb_star(struct gb *b, struct frag x)
{
    int s = gb_state(b);
    gb_eps(b, s, x.s);
    gb_eps(b, x.e, s);
    return (struct frag){s, s};
}

int gb_rule_new(struct gb *b)
{
    if (b->rc) return 0;
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 8;
        struct gb_rule *n = realloc(b->rules, (size_t)cap * sizeof *n);
        if (!n) {
            gb_fail(b, QERR_NOMEM, "out of memory compiling the grammar");
            return 0;
        }
        b->rules = n;
        b->cap_rules = cap;
    }
    b->rules[b->n_rules] = (struct gb_rule){-1, -1};
    return b->n_rules++;
}

void gb_rule_set(struct gb *b, int rule, struct frag body)
{
    if (b->rc) return;
    b->rules[rule] = (struct gb_rule){body.s, body.e};
}

struct frag gb_call_frag(struct gb *b, int rule)
{
    int s = gb_state(b), e = gb_state(b);
    gb_call(b, s, e, rule);
    return (struct frag){s, e};
}

struct frag gb_repeat(struct gb *b, gb_gen_fn gen, const void *ctx, int min, int max)
{
    struct frag f = gb_empty(b);
    for (int i = 0; i < min && !b->rc; i++) f = gb_seq(b, f, gen(b, ctx));
    if (max < 0) return gb_seq(b, f, gb_star(b, gen(b, ctx)));
    /* x{0,k} as (x(x(x)?)?)? : each optional copy nests, so the automaton stays linear */
    int k = max - min;
    if (k <= 0) return f;
    int end = gb_state(b);
    int cur = f.e;
    for (int i = 0; i < k && !b->rc; i++) {
        gb_eps(b, cur, end);
        struct frag x = gen(b, ctx);
        gb_eps(b, cur, x.s);
        cur = x.e;
    }
    gb_eps(b, cur, end);
    return (struct frag){f.s, end};
}

/* ---- UTF-8 ranges (the split of Rust's utf8-ranges / RE2's UTF-8 compiler) ---- */

static int utf8_len(uint32_t c)
{
    return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

static int utf8_put(uint32_t c, uint8_t *o)
{
    switch (utf8_len(c)) {
    case 1:
        o[0] = (uint8_t)c;
        return 1;
    case 2:
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    case 3:
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    default:
        o[0] = (uint8_t)(0xF0 | (c >> 18));
        o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
        o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[3] = (uint8_t)(0x80 | (c & 0x3F));
        return 4;
    }
}

/* [lo, hi] of one encoded length whose byte ranges form one sequence: one path s -> e. */
static void utf8_emit(struct gb *b, struct frag f, uint32_t lo, uint32_t hi)
{
    uint8_t a[4], z[4];
    int n = utf8_put(lo, a);
    utf8_put(hi, z);
    int cur = f.s;
    for (int i = 0; i < n; i++) {
        int nx = i == n - 1 ? f.e : gb_state(b);
        gb_range(b, cur, nx, a[i], z[i]);
        cur = nx;
    }
}

static void utf8_split(struct gb *b, struct frag f, uint32_t lo, uint32_t hi)
{
    if (b->rc || lo > hi) return;
    /* one encoded length at a time */
    static const uint32_t max_of_len[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= max_of_len[i] && hi > max_of_len[i]) {
            utf8_split(b, f, lo, max_of_len[i]);
            utf8_split(b, f, max_of_len[i] + 1, hi);
            return;
        }
    if (hi < 0x80) {
        utf8_emit(b, f, lo, hi);
        return;
    }
    int n = utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(b, f, lo, lo | m);
                utf8_split(b, f, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(b, f, lo, (hi & ~m) - 1);
                utf8_split(b, f, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_emit(b, f, lo, hi);
}

struct frag gb_codepoints(struct gb *b, const struct cp_range *r, int n)
{
    struct frag f = gb_alt_begin(b);
    for (int i = 0; i < n; i++) {
        uint32_t lo = r[i].lo, hi = r[i].hi > 0x10FFFF ? 0x10FFFF : r[i].hi;
        if (lo > hi) continue;
        /* surrogates are not characters */
        if (lo < 0xD800 && hi >= 0xD800) {
            utf8_split(b, f, lo, 0xD7FF);
            lo = 0xE000;
            if (hi < lo) continue;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            lo = 0xE000;
            if (hi < lo) continue;
        }
        utf8_split(b, f, lo, hi);
    }
    return f;
}
