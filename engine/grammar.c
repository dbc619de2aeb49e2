/* grammar: compiles a source into the automaton (grammar_nfa.c builds, grammar_dfa.c
 * determinizes) and owns its reference count. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

static struct frag choice(struct gb *b, const char *text, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(text, len);
    struct frag f = gb_alt_begin(b);
    if (!cJSON_IsArray(root) || !root->child) {
        gb_fail(b, QERR_INVALID, "choice: must be a non-empty list of strings");
    } else {
        const cJSON *x;
        cJSON_ArrayForEach(x, root)
        {
            if (!cJSON_IsString(x) || !*x->valuestring) {
                gb_fail(b, QERR_INVALID, "choice: must hold only non-empty strings");
                break;
            }
            gb_alt_add(b, f, gb_lits(b, x->valuestring));
        }
    }
    cJSON_Delete(root);
    return f;
}

static void grammar_free(struct grammar *g)
{
    grammar_masks_clear(g);
    free(g->cache);
    free(g->next);
    free(g->flags);
    free(g->call_off);
    free(g->calls);
    free(g->rule_of);
    free(g->rule_start);
    free(g);
}

/* One compile; free_max and *cut as gb_json_schema says (JSON Schema only). */
/* Rule 0 (the root) preceded by reasoning: any text without "</think>", then "</think>" and
 * spaces or newlines. The reasoning may not end the output: the grammar's own text must come. */
static void after_think(struct gb *b)
{
    if (b->rc || b->n_rules == 0) return;
    struct frag body = {b->rules[0].start, b->rules[0].end};
    int after = gb_state(b);
    struct frag think = gb_text_until(b, "</think>", after);
    struct frag space = gb_alt_begin(b);
    gb_alt_add(b, space, gb_lits(b, " "));
    gb_alt_add(b, space, gb_lits(b, "\n"));
    struct frag rest = gb_seq(b, gb_star(b, space), body);
    gb_eps(b, after, rest.s);
    gb_rule_set(b, 0, (struct frag){think.s, rest.e});
}

static int compile_once(enum grammar_kind kind, const char *text, size_t len, int free_max,
                        bool *cut, struct grammar **out, struct qerr *err)
{
    *out = NULL;
    *cut = false;
    struct gb b;
    gb_init(&b, err);
    int r;
    bool think = kind & GRAMMAR_AFTER_THINK;
    kind &= ~GRAMMAR_AFTER_THINK;
    switch (kind) {
    case GRAMMAR_JSON_SCHEMA:
        gb_json_schema(&b, text, len, free_max, cut);
        break;
    case GRAMMAR_JSON_OBJECT:
        gb_json_any_object(&b);
        break;
    case GRAMMAR_REGEX:
        r = gb_rule_new(&b);
        gb_rule_set(&b, r, gb_regex(&b, text, len, false));
        break;
    case GRAMMAR_CHOICE:
        r = gb_rule_new(&b);
        gb_rule_set(&b, r, choice(&b, text, len));
        break;
    case GRAMMAR_TOOL_CALLS:
        gb_tool_calls(&b, text, len);
        break;
    case GRAMMAR_GBNF:
        gb_gbnf(&b, text, len);
        break;
    default:
        gb_fail(&b, QERR_INVALID, "unknown grammar kind %d", (int)kind);
    }
    if (think) after_think(&b);
    /* a compiler that returned without a fragment must have said why; if not, refuse here
     * rather than determinize nothing */
    for (int i = 0; !b.rc && i < b.n_rules; i++)
        if (b.rules[i].start < 0 || b.rules[i].start >= b.n_states || b.rules[i].end < 0 ||
            b.rules[i].end >= b.n_states)
            gb_fail(&b, QERR_INVALID, "grammar rule %d has no body", i);
    if (!b.rc && b.n_rules == 0) gb_fail(&b, QERR_INVALID, "empty grammar");
    if (b.rc) {
        int rc = b.rc;
        gb_free(&b);
        return rc;
    }
    struct grammar *g = calloc(1, sizeof *g);
    if (!g) {
        gb_free(&b);
        return qerr_set(err, QERR_NOMEM, "out of memory compiling the grammar");
    }
    atomic_init(&g->refs, 1);
    g->tool_markers = kind == GRAMMAR_TOOL_CALLS;
    int rc = grammar_from_nfa(&b, g, err);
    gb_free(&b);
    if (!rc && !(g->cache = calloc((size_t)g->n_states, sizeof *g->cache)))
        rc = qerr_set(err, QERR_NOMEM, "out of memory compiling the grammar");
    if (rc) {
        grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int grammar_compile(enum grammar_kind kind, const char *text, size_t len, struct grammar **out,
                    struct qerr *err)
{
    /* A schema too large for the automaton whose strings have long maxLengths is tried again
     * with them cut shorter (every output still fits the schema); the first error stands when
     * no retry compiles. */
    bool cut;
    int rc = compile_once(kind, text, len, JS_FREE_MAX, &cut, out, err);
    for (int free_max = JS_FREE_MAX / 2; rc == QERR_FULL && cut && free_max >= JS_FREE_MIN;
         free_max /= 2) {
        struct qerr again = {0};
        if (!compile_once(kind, text, len, free_max, &cut, out, &again)) {
            if (err) *err = (struct qerr){0};
            return 0;
        }
        cut &= again.code == QERR_FULL;
    }
    return rc;
}

void grammar_ref(struct grammar *g)
{
    atomic_fetch_add(&g->refs, 1);
}

void grammar_unref(struct grammar *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) grammar_free(g);
}

int grammar_states(const struct grammar *g)
{
    return g->n_states;
}
