/* grammar_gbnf: the GBNF subset (llama.cpp's grammar format) for structured_outputs.grammar.
 *
 * Supported: rules `name ::= alternatives` (a rule ends where the next `name ::=` begins; `#`
 * comments), the start rule `root`, sequences, `|`, groups `( )`, string literals "..." with
 * \n \r \t \\ \" \xHH \uHHHH escapes, character classes [...] (ranges, negation `^`, the same
 * escapes; as grammar_regex.c reads them), `.` (any character), rule references, and the
 * postfix operators * + ? {m} {m,} {m,n}. A reference to a rule being expanded becomes a call
 * (recursion); every other reference is inlined, so a grammar without recursion is one
 * automaton. Not supported: llama.cpp's token references (<[id]>, !<...>). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

enum { GN_TERM, GN_ANY, GN_REF, GN_SEQ, GN_ALT, GN_REP, GN_EMPTY };

struct gnode {
    int kind;
    int a, b;       /* SEQ, ALT: children; REP: a; REF: rule index */
    int min, max;   /* REP */
    const char *re; /* TERM: regex text of a literal or class (owned by the parser) */
    size_t re_len;
};

struct gp {
    const char *s;
    size_t n, i;
    struct gb *b;
    struct gnode *nodes;
    int n_nodes, cap_nodes;
    struct {
        const char *name;
        size_t len;
        int body; /* node, -1 until defined */
        int rule; /* gb rule when called, -1 */
        bool active;
    } rules[256];
    int n_rules;
    char **owned; /* regex texts */
    int n_owned, cap_owned;
    int depth;
};

static int gp_fail(struct gp *p, const char *what)
{
    size_t line = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++) line += p->s[k] == '\n';
    gb_fail(p->b, QERR_INVALID, "grammar: %s (line %zu)", what, line);
    return -1;
}

static int node(struct gp *p, int kind)
{
    if (p->b->rc) return -1;
    if (p->n_nodes == p->cap_nodes) {
        int cap = p->cap_nodes ? p->cap_nodes * 2 : 64;
        struct gnode *n = realloc(p->nodes, (size_t)cap * sizeof *n);
        if (!n) return gb_fail(p->b, QERR_NOMEM, "out of memory compiling the grammar"), -1;
        p->nodes = n;
        p->cap_nodes = cap;
    }
    p->nodes[p->n_nodes] = (struct gnode){.kind = kind, .a = -1, .b = -1};
    return p->n_nodes++;
}

static void skip_space(struct gp *p, bool newlines)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            p->i++;
        } else {
            break;
        }
    }
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static int rule_index(struct gp *p, const char *name, size_t len)
{
    for (int k = 0; k < p->n_rules; k++)
        if (p->rules[k].len == len && !memcmp(p->rules[k].name, name, len)) return k;
    if (p->n_rules == 256) return gp_fail(p, "more than 256 rules");
    p->rules[p->n_rules].name = name;
    p->rules[p->n_rules].len = len;
    p->rules[p->n_rules].body = -1;
    p->rules[p->n_rules].rule = -1;
    p->rules[p->n_rules].active = false;
    return p->n_rules++;
}

/* Is a rule definition `name ::=` at p->i? */
static bool at_definition(const struct gp *p)
{
    size_t k = p->i;
    while (k < p->n && name_char(p->s[k])) k++;
    if (k == p->i) return false;
    while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t')) k++;
    return k + 3 <= p->n && !memcmp(p->s + k, "::=", 3);
}

/* A literal "..." as regex text: every character escaped as \uHHHH or a plain letter. */
static int literal(struct gp *p)
{
    p->i++; /* '"' */
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] != '"') p->i += p->s[p->i] == '\\' ? 2 : 1;
    if (p->i >= p->n) return gp_fail(p, "unclosed string");
    size_t len = p->i - start;
    p->i++;
    /* the literal's own escapes are regex escapes too; other punctuation gets a backslash */
    char *re = malloc(len * 2 + 1);
    if (!re) return gb_fail(p->b, QERR_NOMEM, "out of memory compiling the grammar"), -1;
    size_t o = 0;
    for (size_t k = start; k < start + len; k++) {
        char c = p->s[k];
        if (c == '\\') {
            re[o++] = c;
            re[o++] = p->s[++k];
            continue;
        }
        if (strchr(".[]{}()*+?|^$", c)) re[o++] = '\\';
        re[o++] = c;
    }
    re[o] = 0;
    if (p->n_owned == p->cap_owned) {
        int cap = p->cap_owned ? p->cap_owned * 2 : 16;
        char **n = realloc(p->owned, (size_t)cap * sizeof *n);
        if (!n) {
            free(re);
            return gb_fail(p->b, QERR_NOMEM, "out of memory compiling the grammar"), -1;
        }
        p->owned = n;
        p->cap_owned = cap;
    }
    p->owned[p->n_owned++] = re;
    int k = node(p, GN_TERM);
    if (k >= 0) {
        p->nodes[k].re = re;
        p->nodes[k].re_len = o;
    }
    return len ? k : node(p, GN_EMPTY);
}

static int class(struct gp *p)
{
    size_t start = p->i++;
    if (p->i < p->n && p->s[p->i] == '^') p->i++;
    if (p->i < p->n && p->s[p->i] == ']') p->i++; /* a leading ']' is a member */
    while (p->i < p->n && p->s[p->i] != ']') p->i += p->s[p->i] == '\\' ? 2 : 1;
    if (p->i >= p->n) return gp_fail(p, "unclosed '['");
    p->i++;
    int k = node(p, GN_TERM);
    if (k >= 0) {
        p->nodes[k].re = p->s + start;
        p->nodes[k].re_len = p->i - start;
    }
    return k;
}

static int alternatives(struct gp *p, bool nested);

static int count(struct gp *p, int *out)
{
    long v = 0;
    size_t s = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && v <= 1000)
        v = v * 10 + (p->s[p->i++] - '0');
    if (p->i == s) return gp_fail(p, "a number was expected in {m,n}");
    if (v > 1000) return gp_fail(p, "a count above 1000");
    *out = (int)v;
    return 0;
}

static int term(struct gp *p, bool nested)
{
    int k;
    char c = p->s[p->i];
    if (c == '"') {
        k = literal(p);
    } else if (c == '[') {
        k = class(p);
    } else if (c == '.') {
        p->i++;
        k = node(p, GN_ANY);
    } else if (c == '(') {
        p->i++;
        if (++p->depth > 100) return gp_fail(p, "groups nested too deep");
        k = alternatives(p, true);
        p->depth--;
        skip_space(p, true);
        if (k < 0) return -1;
        if (p->i >= p->n || p->s[p->i] != ')') return gp_fail(p, "unclosed '('");
        p->i++;
    } else if (name_char(c)) {
        size_t s = p->i;
        while (p->i < p->n && name_char(p->s[p->i])) p->i++;
        int r = rule_index(p, p->s + s, p->i - s);
        if (r < 0) return -1;
        k = node(p, GN_REF);
        if (k >= 0) p->nodes[k].a = r;
    } else if (c == '<') {
        return gp_fail(p, "token references (<...>) are not supported");
    } else {
        return gp_fail(p, "unexpected character");
    }
    (void)nested;
    /* postfix operators */
    while (k >= 0 && p->i < p->n) {
        int min, max;
        c = p->s[p->i];
        if (c == '*')
            min = 0, max = -1, p->i++;
        else if (c == '+')
            min = 1, max = -1, p->i++;
        else if (c == '?')
            min = 0, max = 1, p->i++;
        else if (c == '{') {
            p->i++;
            skip_space(p, false);
            if (count(p, &min)) return -1;
            skip_space(p, false);
            max = min;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                skip_space(p, false);
                max = -1;
                if (p->i < p->n && p->s[p->i] != '}' && count(p, &max)) return -1;
                skip_space(p, false);
            }
            if (p->i >= p->n || p->s[p->i] != '}') return gp_fail(p, "unclosed '{'");
            p->i++;
            if (max >= 0 && max < min) return gp_fail(p, "{m,n} with n < m");
        } else
            break;
        int r = node(p, GN_REP);
        if (r < 0) return -1;
        p->nodes[r].a = k;
        p->nodes[r].min = min;
        p->nodes[r].max = max;
        k = r;
    }
    return k;
}

/* A sequence: terms until '|', ')', the end, or (outside groups) the next definition. */
static int sequence(struct gp *p, bool nested)
{
    int k = node(p, GN_EMPTY);
    for (;;) {
        skip_space(p, true);
        if (k < 0 || p->i >= p->n || p->s[p->i] == '|' || p->s[p->i] == ')') return k;
        if (!nested && at_definition(p)) return k;
        int t = term(p, nested);
        if (t < 0) return -1;
        int s = node(p, GN_SEQ);
        if (s < 0) return -1;
        p->nodes[s].a = k;
        p->nodes[s].b = t;
        k = s;
    }
}

static int alternatives(struct gp *p, bool nested)
{
    int k = sequence(p, nested);
    while (k >= 0 && p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        int x = sequence(p, nested);
        if (x < 0) return -1;
        int a = node(p, GN_ALT);
        if (a < 0) return -1;
        p->nodes[a].a = k;
        p->nodes[a].b = x;
        k = a;
    }
    return k;
}

struct gn_ctx {
    struct gp *p;
    int node;
};

static struct frag emit(struct gb *b, const void *ctx);

static struct frag emit_node(struct gp *p, int k)
{
    struct gn_ctx c = {p, k};
    return emit(p->b, &c);
}

static struct frag emit(struct gb *b, const void *ctx)
{
    const struct gn_ctx *c = ctx;
    struct gp *p = c->p;
    if (b->rc) return (struct frag){0, 0};
    const struct gnode *x = &p->nodes[c->node];
    switch (x->kind) {
    case GN_TERM:
        return gb_regex(b, x->re, x->re_len, false);
    case GN_ANY: {
        static const struct cp_range all = {0, 0x10FFFF};
        return gb_codepoints(b, &all, 1);
    }
    case GN_SEQ: {
        struct frag f = emit_node(p, x->a);
        return gb_seq(b, f, emit_node(p, x->b));
    }
    case GN_ALT: {
        struct frag f = gb_alt_begin(b);
        gb_alt_add(b, f, emit_node(p, x->a));
        gb_alt_add(b, f, emit_node(p, x->b));
        return f;
    }
    case GN_REP: {
        struct gn_ctx sub = {p, x->a};
        return gb_repeat(b, emit, &sub, x->min, x->max);
    }
    case GN_REF: {
        int r = x->a;
        if (p->rules[r].body < 0) {
            char msg[120];
            snprintf(msg, sizeof msg, "rule '%.*s' is used but not defined",
                     (int)(p->rules[r].len > 60 ? 60 : p->rules[r].len), p->rules[r].name);
            gb_fail(b, QERR_INVALID, "grammar: %s", msg);
            return (struct frag){0, 0};
        }
        if (!p->rules[r].active) { /* not recursive here: inline it */
            if (++p->depth > 200) {
                gb_fail(b, QERR_UNSUPPORTED, "grammar: rules nested too deep");
                return (struct frag){0, 0};
            }
            p->rules[r].active = true;
            struct frag f = emit_node(p, p->rules[r].body);
            p->rules[r].active = false;
            p->depth--;
            return f;
        }
        if (p->rules[r].rule < 0) {
            /* recursion: the rule's own automaton, reached by calls */
            int g = gb_rule_new(b);
            p->rules[r].rule = g;
            gb_rule_set(b, g, emit_node(p, p->rules[r].body));
        }
        return gb_call_frag(b, p->rules[r].rule);
    }
    default:
        return gb_empty(b);
    }
}

struct frag gb_gbnf(struct gb *b, const char *text, size_t len)
{
    struct gp p = {.s = text, .n = len, .b = b};
    int root = -1;
    for (;;) {
        skip_space(&p, true);
        if (p.i >= p.n || b->rc) break;
        if (!at_definition(&p)) {
            gp_fail(&p, "a rule definition 'name ::= ...' was expected");
            break;
        }
        size_t s = p.i;
        while (p.i < p.n && name_char(p.s[p.i])) p.i++;
        int r = rule_index(&p, p.s + s, p.i - s);
        if (r < 0) break;
        if (p.rules[r].body >= 0) {
            gp_fail(&p, "a rule is defined twice");
            break;
        }
        skip_space(&p, false);
        p.i += 3; /* ::= */
        int body = alternatives(&p, false);
        if (body < 0) break;
        if (p.i < p.n && p.s[p.i] == ')') {
            gp_fail(&p, "unbalanced ')'");
            break;
        }
        p.rules[r].body = body;
        if (p.rules[r].len == 4 && !memcmp(p.rules[r].name, "root", 4)) root = r;
    }
    struct frag f = {0, 0};
    if (!b->rc && root < 0) gb_fail(b, QERR_INVALID, "grammar: no 'root' rule");
    if (!b->rc) {
        int top = gb_rule_new(b);
        /* the root may recurse into itself: it is active while it is expanded */
        p.rules[root].active = true;
        f = emit_node(&p, p.rules[root].body);
        gb_rule_set(b, top, f);
        if (b->rc == 0 && top != 0) gb_fail(b, QERR_INVALID, "grammar: internal rule order");
    }
    for (int k = 0; k < p.n_owned; k++) free(p.owned[k]);
    free(p.owned);
    free(p.nodes);
    return f;
}
