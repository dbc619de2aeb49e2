/* grammar_regex: the regex subset, parsed into a small tree and written into the NFA builder.
 *
 * Supported: literals (UTF-8), '.', classes [...] with ranges and negation, the escapes \d \D \w
 * \W \s \S \n \r \t \f \v \xHH \uHHHH and escaped punctuation, groups (...) and (?:...),
 * alternation, the quantifiers * + ? {n} {n,} {n,m} (a lazy '?' after them changes nothing for
 * a whole-string match), and ^ / $ (the match is always of the whole output, so they are
 * accepted and ignored). Refused with a message: backreferences, lookaround, named groups, \b,
 * Unicode classes (\p), and counts above 1000. '.' matches any character but a newline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

enum { RX_SET, RX_CAT, RX_ALT, RX_REP, RX_EMPTY };

struct rx {
    int kind;
    int a, b;     /* CAT, ALT: children; REP: a */
    int min, max; /* REP */
    struct cp_range *set;
    int n_set;
};

struct rxp {
    const char *s;
    size_t n, i;
    struct rx *nodes;
    int n_nodes, cap_nodes;
    bool json_safe;
    struct gb *b;
};

#define RX_MAX_COUNT 1000

static int rx_node(struct rxp *p, int kind)
{
    if (p->b->rc) return -1;
    if (p->n_nodes == p->cap_nodes) {
        int cap = p->cap_nodes ? p->cap_nodes * 2 : 64;
        struct rx *n = realloc(p->nodes, (size_t)cap * sizeof *n);
        if (!n) {
            gb_fail(p->b, QERR_NOMEM, "out of memory compiling the regex");
            return -1;
        }
        p->nodes = n;
        p->cap_nodes = cap;
    }
    p->nodes[p->n_nodes] = (struct rx){.kind = kind, .a = -1, .b = -1};
    return p->n_nodes++;
}

static int rx_fail(struct rxp *p, const char *what)
{
    /* the text is p->n bytes, not a C string (fuzz_grammar read past it) */
    gb_fail(p->b, QERR_UNSUPPORTED, "regex '%.*s': %s at offset %zu", (int)(p->n < 80 ? p->n : 80),
            p->s, what, p->i);
    return -1;
}

/* ---- code point sets ---- */

static int cmp_range(const void *x, const void *y)
{
    const struct cp_range *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

static int set_add(struct rxp *p, struct cp_range **set, int *n, uint32_t lo, uint32_t hi)
{
    struct cp_range *r = realloc(*set, (size_t)(*n + 1) * sizeof *r);
    if (!r) return gb_fail(p->b, QERR_NOMEM, "out of memory compiling the regex");
    r[(*n)++] = (struct cp_range){lo, hi};
    *set = r;
    return 0;
}

static void set_normalize(struct cp_range *set, int *n)
{
    if (*n == 0) return;
    qsort(set, (size_t)*n, sizeof *set, cmp_range);
    int k = 0;
    for (int i = 1; i < *n; i++) {
        if (set[i].lo <= set[k].hi + 1) {
            if (set[i].hi > set[k].hi) set[k].hi = set[i].hi;
        } else {
            set[++k] = set[i];
        }
    }
    *n = k + 1;
}

/* Complement within [0, 0x10FFFF]; set must be normalized. */
static int set_negate(struct rxp *p, struct cp_range **set, int *n)
{
    struct cp_range *out = NULL;
    int m = 0;
    uint32_t next = 0;
    for (int i = 0; i < *n; i++) {
        if ((*set)[i].lo > next && set_add(p, &out, &m, next, (*set)[i].lo - 1)) return -1;
        next = (*set)[i].hi + 1;
    }
    if (next <= 0x10FFFF && set_add(p, &out, &m, next, 0x10FFFF)) return -1;
    free(*set);
    *set = out;
    *n = m;
    return 0;
}

/* Removes what a JSON string cannot hold unescaped. */
static int set_json_safe(struct rxp *p, struct cp_range **set, int *n)
{
    struct cp_range *out = NULL;
    int m = 0;
    static const struct cp_range unsafe[] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    for (int i = 0; i < *n; i++) {
        uint32_t lo = (*set)[i].lo, hi = (*set)[i].hi;
        for (int k = 0; k < 3 && lo <= hi; k++) {
            if (unsafe[k].hi < lo || unsafe[k].lo > hi) continue;
            if (unsafe[k].lo > lo && set_add(p, &out, &m, lo, unsafe[k].lo - 1)) return -1;
            lo = unsafe[k].hi + 1;
        }
        if (lo <= hi && set_add(p, &out, &m, lo, hi)) return -1;
    }
    free(*set);
    *set = out;
    *n = m;
    return 0;
}

static int class_escape(struct rxp *p, char c, struct cp_range **set, int *n)
{
    switch (c) {
    case 'd':
    case 'D':
        if (set_add(p, set, n, '0', '9')) return -1;
        break;
    case 'w':
    case 'W':
        if (set_add(p, set, n, '0', '9') || set_add(p, set, n, 'A', 'Z') ||
            set_add(p, set, n, 'a', 'z') || set_add(p, set, n, '_', '_'))
            return -1;
        break;
    case 's':
    case 'S':
        if (set_add(p, set, n, '\t', '\r') || set_add(p, set, n, ' ', ' ')) return -1;
        break;
    default:
        return 1; /* not a class escape */
    }
    if (c >= 'A' && c <= 'Z') {
        set_normalize(*set, n);
        if (set_negate(p, set, n)) return -1;
    }
    return 0;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One literal character (after a backslash when esc): its code point, or -1 (failed). */
static int64_t rx_char(struct rxp *p, bool esc)
{
    if (p->i >= p->n) return rx_fail(p, "unexpected end");
    unsigned char c = (unsigned char)p->s[p->i];
    if (esc) {
        p->i++;
        switch (c) {
        case 'n':
            return '\n';
        case 'r':
            return '\r';
        case 't':
            return '\t';
        case 'f':
            return '\f';
        case 'v':
            return '\v';
        case '0':
            return 0;
        case 'x':
        case 'u': {
            int digits = c == 'x' ? 2 : 4;
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
                if (h < 0) return rx_fail(p, "bad hex escape");
                v = v * 16 + (uint32_t)h;
                p->i++;
            }
            return v;
        }
        case 'b':
        case 'B':
            return rx_fail(p, "word boundaries (\\b) are not supported");
        case 'p':
        case 'P':
            return rx_fail(p, "Unicode classes (\\p) are not supported");
        default:
            if ((c >= '1' && c <= '9') || c == 'k')
                return rx_fail(p, "backreferences are not supported");
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                return rx_fail(p, "unknown escape");
            if (c >= 0x80) break; /* an escaped multibyte character: decode below */
            return c;
        }
        p->i--; /* fall through to decoding the character itself */
    }
    /* decode UTF-8 (the input was checked by whoever parsed the JSON around it) */
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (p->i + (size_t)len > p->n) return rx_fail(p, "truncated UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < len; k++) v = (v << 6) | ((unsigned char)p->s[p->i + (size_t)k] & 0x3Fu);
    p->i += (size_t)len;
    return v;
}

static int rx_set_node(struct rxp *p, struct cp_range *set, int n)
{
    set_normalize(set, &n);
    if (p->json_safe && set_json_safe(p, &set, &n)) {
        free(set);
        return -1;
    }
    int k = rx_node(p, RX_SET);
    if (k < 0) {
        free(set);
        return -1;
    }
    p->nodes[k].set = set;
    p->nodes[k].n_set = n;
    return k;
}

static int rx_class(struct rxp *p)
{
    p->i++; /* '[' */
    bool neg = p->i < p->n && p->s[p->i] == '^';
    if (neg) p->i++;
    struct cp_range *set = NULL;
    int n = 0;
    bool first = true;
    while (p->i < p->n && (p->s[p->i] != ']' || first)) {
        first = false;
        if (p->s[p->i] == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':') {
            free(set);
            return rx_fail(p, "POSIX classes are not supported");
        }
        bool esc = p->s[p->i] == '\\';
        if (esc) {
            p->i++;
            if (p->i < p->n) {
                int rc = class_escape(p, p->s[p->i], &set, &n);
                if (rc < 0) {
                    free(set);
                    return -1;
                }
                if (rc == 0) {
                    p->i++;
                    continue;
                }
            }
        }
        int64_t lo = rx_char(p, esc);
        if (lo < 0) {
            free(set);
            return -1;
        }
        int64_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            bool e2 = p->s[p->i] == '\\';
            if (e2) p->i++;
            hi = rx_char(p, e2);
            if (hi < 0) {
                free(set);
                return -1;
            }
            if (hi < lo) {
                free(set);
                return rx_fail(p, "a class range goes backwards");
            }
        }
        if (set_add(p, &set, &n, (uint32_t)lo, (uint32_t)hi)) {
            free(set);
            return -1;
        }
    }
    if (p->i >= p->n) {
        free(set);
        return rx_fail(p, "unclosed '['");
    }
    p->i++; /* ']' */
    set_normalize(set, &n);
    if (neg && set_negate(p, &set, &n)) {
        free(set);
        return -1;
    }
    return rx_set_node(p, set, n);
}

static int rx_alt(struct rxp *p);

static int rx_atom(struct rxp *p)
{
    char c = p->s[p->i];
    struct cp_range *set = NULL;
    int n = 0;
    switch (c) {
    case '(': {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':')
                p->i += 2;
            else
                return rx_fail(p, "lookaround and named groups are not supported");
        }
        int k = rx_alt(p);
        if (k < 0) return -1;
        if (p->i >= p->n || p->s[p->i] != ')') return rx_fail(p, "unclosed '('");
        p->i++;
        return k;
    }
    case '[':
        return rx_class(p);
    case '.':
        p->i++;
        if (set_add(p, &set, &n, 0, '\n' - 1) || set_add(p, &set, &n, '\n' + 1, 0x10FFFF)) {
            free(set);
            return -1;
        }
        return rx_set_node(p, set, n);
    case '^':
    case '$':
        p->i++;
        return rx_node(p, RX_EMPTY);
    case '\\': {
        p->i++;
        if (p->i < p->n) {
            int rc = class_escape(p, p->s[p->i], &set, &n);
            if (rc < 0) {
                free(set);
                return -1;
            }
            if (rc == 0) {
                p->i++;
                return rx_set_node(p, set, n);
            }
        }
        int64_t v = rx_char(p, true);
        if (v < 0) return -1;
        if (set_add(p, &set, &n, (uint32_t)v, (uint32_t)v)) return -1;
        return rx_set_node(p, set, n);
    }
    case '*':
    case '+':
    case '?':
    case '{':
        return rx_fail(p, "a quantifier follows nothing");
    default: {
        int64_t v = rx_char(p, false);
        if (v < 0) return -1;
        if (set_add(p, &set, &n, (uint32_t)v, (uint32_t)v)) return -1;
        return rx_set_node(p, set, n);
    }
    }
}

static int rx_number(struct rxp *p, int *out)
{
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return -1;
    long v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (p->s[p->i++] - '0');
        if (v > RX_MAX_COUNT) return rx_fail(p, "a count above 1000");
    }
    *out = (int)v;
    return 0;
}

static int rx_rep(struct rxp *p)
{
    int k = rx_atom(p);
    while (k >= 0 && p->i < p->n) {
        char c = p->s[p->i];
        int min, max;
        if (c == '*') {
            min = 0, max = -1;
            p->i++;
        } else if (c == '+') {
            min = 1, max = -1;
            p->i++;
        } else if (c == '?') {
            min = 0, max = 1;
            p->i++;
        } else if (c == '{') {
            size_t save = p->i++;
            if (rx_number(p, &min)) {
                if (p->b->rc) return -1;
                p->i = save; /* a literal '{' */
                break;
            }
            max = min;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                max = -1;
                if (p->i < p->n && p->s[p->i] != '}' && rx_number(p, &max))
                    return p->b->rc ? -1 : rx_fail(p, "bad {n,m}");
            }
            if (p->i >= p->n || p->s[p->i] != '}') return rx_fail(p, "bad {n,m}");
            p->i++;
            if (max >= 0 && max < min) return rx_fail(p, "{n,m} with m < n");
        } else {
            break;
        }
        if (p->i < p->n && (p->s[p->i] == '?' || p->s[p->i] == '+')) p->i++; /* lazy */
        int r = rx_node(p, RX_REP);
        if (r < 0) return -1;
        p->nodes[r].a = k;
        p->nodes[r].min = min;
        p->nodes[r].max = max;
        k = r;
    }
    return k;
}

static int rx_cat(struct rxp *p)
{
    int k = rx_node(p, RX_EMPTY);
    while (k >= 0 && p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        int x = rx_rep(p);
        if (x < 0) return -1;
        int c = rx_node(p, RX_CAT);
        if (c < 0) return -1;
        p->nodes[c].a = k;
        p->nodes[c].b = x;
        k = c;
    }
    return k;
}

static int rx_alt(struct rxp *p)
{
    int k = rx_cat(p);
    while (k >= 0 && p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        int x = rx_cat(p);
        if (x < 0) return -1;
        int a = rx_node(p, RX_ALT);
        if (a < 0) return -1;
        p->nodes[a].a = k;
        p->nodes[a].b = x;
        k = a;
    }
    return k;
}

struct rx_ctx {
    const struct rxp *p;
    int node;
};

static struct frag rx_emit(struct gb *b, const void *ctx)
{
    const struct rx_ctx *c = ctx;
    const struct rx *x = &c->p->nodes[c->node];
    switch (x->kind) {
    case RX_SET:
        return gb_codepoints(b, x->set, x->n_set);
    case RX_CAT: {
        struct rx_ctx l = {c->p, x->a}, r = {c->p, x->b};
        struct frag f = rx_emit(b, &l);
        return gb_seq(b, f, rx_emit(b, &r));
    }
    case RX_ALT: {
        struct rx_ctx l = {c->p, x->a}, r = {c->p, x->b};
        struct frag f = gb_alt_begin(b);
        gb_alt_add(b, f, rx_emit(b, &l));
        gb_alt_add(b, f, rx_emit(b, &r));
        return f;
    }
    case RX_REP: {
        struct rx_ctx sub = {c->p, x->a};
        return gb_repeat(b, rx_emit, &sub, x->min, x->max);
    }
    default:
        return gb_empty(b);
    }
}

struct frag gb_regex(struct gb *b, const char *re, size_t len, bool json_safe)
{
    struct rxp p = {.s = re, .n = len, .json_safe = json_safe, .b = b};
    struct frag f = {0, 0};
    int root = rx_alt(&p);
    if (root >= 0 && p.i < p.n) root = rx_fail(&p, "unbalanced ')'");
    if (root < 0 && !b->rc) rx_fail(&p, "cannot parse");
    if (root >= 0) {
        struct rx_ctx c = {&p, root};
        f = rx_emit(b, &c);
    }
    for (int i = 0; i < p.n_nodes; i++) free(p.nodes[i].set);
    free(p.nodes);
    return f;
}
