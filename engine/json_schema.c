/* json_schema: JSON Schema (and any-JSON, and tool calls) -> the NFA builder.
 *
 * DESIGN. A schema is inlined into the automaton of its caller, so a schema without recursion
 * is one regular automaton whose token masks are cached per state; only what recurses (a $ref
 * to a schema being expanded, the generic JSON value) and array items repeated many times
 * become rules reached by call edges. Keywords beside $ref, const/enum and anyOf hold too
 * (merged as allOf parts: all_of_parts). A keyword of JSON Schema's vocabulary is either
 * compiled or refused with QERR_UNSUPPORTED naming it and where it is; annotations and
 * keywords outside the vocabulary are ignored, as the specification says. Two exceptions: an anyOf
 * branch it cannot compile is left out (every output still matches), and uniqueItems over other
 * items than a short list of values is not checked (an output may repeat an item, as it may repeat
 * a key of additionalProperties: neither is regular).
 *
 * Choices and limits (documented in README): whitespace as grammar.h says; properties in
 * schema order; a missing additionalProperties means none when properties are listed (OpenAI
 * strict mode's rule) and any when not; oneOf is compiled as anyOf; pattern is matched against
 * the whole string and its characters must not need JSON escapes; numbers have at most 15
 * integer and 15 fraction digits; bounds are exact, decimal ones included (json_number.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define JS_MAX_INLINE    48 /* nesting of inlined schemas */
#define JS_MAX_REFS      64
#define JS_INLINE_COPIES 8    /* array items repeated more often than this become a rule */
#define COUNT_MAX        1000 /* counts the automaton spells out (items, properties, characters) */
#define LENGTH_MAX       (1 << 24) /* a pattern's or format's own length may make a bound moot */
#define UNIQUE_MAX       8         /* uniqueItems is enforced over up to this many listed values */

struct js {
    struct gb *b;
    const cJSON *root; /* what "#" points to */
    int any_rule;      /* rule of the generic JSON value, -1 until needed */
    struct {
        const cJSON *node;
        int rule;
    } rules[JS_MAX_REFS];
    int n_rules;
    const cJSON *active[JS_MAX_INLINE]; /* $ref targets being inlined */
    int n_active;
    int depth;
    cJSON **owned; /* schemas made while compiling (merged allOf parts, copies) */
    int n_owned, cap_owned;
    char path[256];
    int free_max; /* characters a free string is written in at most (a longer maxLength is cut) */
    bool cut;     /* some string's maxLength is above JS_FREE_MIN: a smaller free_max cuts it */
};

static struct frag js_value(struct js *j, const cJSON *s);
static const cJSON *negate(struct js *j, const cJSON *s);

static struct frag js_fail(struct js *j, int code, const char *fmt, const char *arg)
{
    char msg[400];
    snprintf(msg, sizeof msg, fmt, arg);
    gb_fail(j->b, code, "%s (at %s)", msg, j->path[0] ? j->path : "/");
    return (struct frag){0, 0};
}

/* x, now owned by j (freed with it); NULL (and the builder failed) when x is NULL or no room. */
static cJSON *js_own(struct js *j, cJSON *x)
{
    if (x && j->n_owned == j->cap_owned) {
        int cap = j->cap_owned ? j->cap_owned * 2 : 16;
        cJSON **n = realloc(j->owned, (size_t)cap * sizeof *n);
        if (!n) {
            cJSON_Delete(x);
            x = NULL;
        } else {
            j->owned = n;
            j->cap_owned = cap;
        }
    }
    if (!x) {
        gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
        return NULL;
    }
    return j->owned[j->n_owned++] = x;
}

/* ---- keywords ---- */

/* Internal keywords "not" turns into (a leading space: no schema author writes one). */
#define KW_ABSENT   " absent"   /* keys an object must not have */
#define KW_EXCLUDED " excluded" /* strings a string must not be */

static const char *const supported[] = {"type",
                                        "properties",
                                        "required",
                                        "additionalProperties",
                                        "items",
                                        "prefixItems",
                                        "minItems",
                                        "maxItems",
                                        "enum",
                                        "const",
                                        "anyOf",
                                        "oneOf",
                                        "allOf",
                                        "$ref",
                                        "minLength",
                                        "maxLength",
                                        "pattern",
                                        "format",
                                        "minimum",
                                        "maximum",
                                        "exclusiveMinimum",
                                        "exclusiveMaximum",
                                        "nullable",
                                        "multipleOf",
                                        "minProperties",
                                        "maxProperties",
                                        "uniqueItems",
                                        "propertyNames",
                                        "patternProperties",
                                        "additionalItems",
                                        "not",
                                        KW_ABSENT,
                                        KW_EXCLUDED,
                                        NULL};
/* JSON Schema's own keywords (drafts 4 to 2020-12) that quern does not compile: a schema using
 * one is refused, naming it. A keyword outside the vocabulary (Kubernetes' x-kubernetes-...,
 * draft 4's id, example) is ignored, as the specification says of unknown keywords. */
static const char *const refused[] = {"if",
                                      "then",
                                      "else",
                                      "dependencies",
                                      "dependentRequired",
                                      "dependentSchemas",
                                      "contains",
                                      "minContains",
                                      "maxContains",
                                      "unevaluatedProperties",
                                      "unevaluatedItems",
                                      "$dynamicRef",
                                      "$recursiveRef",
                                      "extends",
                                      "disallow",
                                      "divisibleBy",
                                      NULL};

static bool listed(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

/* A keyword that constrains (compiled or refused), as against annotations and unknown ones. */
static bool says(const char *k)
{
    return listed(supported, k) || listed(refused, k);
}

/* Whether s has a constraining keyword other than those in but (NULL-terminated). */
static bool says_besides(const cJSON *s, const char *const *but)
{
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s) if (says(kw->string) && !listed(but, kw->string)) return true;
    return false;
}

/* A shallow copy of s without the keywords in drop, owned by j. */
static cJSON *copy_without(struct js *j, const cJSON *s, const char *const *drop)
{
    cJSON *c = js_own(j, cJSON_CreateObject());
    const cJSON *kw;
    if (c)
        cJSON_ArrayForEach(kw, s) if (!listed(drop, kw->string))
            cJSON_AddItemReferenceToObject(c, kw->string, (cJSON *)kw);
    return c;
}

/* Appends to s's list k the items of add (or add itself when it is not a list). */
static void append_to(cJSON *s, const char *k, const cJSON *add)
{
    cJSON *list = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!list) {
        list = cJSON_CreateArray();
        if (!list) return;
        cJSON_AddItemToObject(s, k, list);
    } else if (list->type & cJSON_IsReference) {
        /* a list shared with the user's schema: copied before it grows */
        cJSON *own = cJSON_Duplicate(list, true);
        cJSON_ReplaceItemInObjectCaseSensitive(s, k, own);
        list = own;
    }
    if (!cJSON_IsArray(add)) {
        cJSON_AddItemToArray(list, cJSON_Duplicate(add, true));
        return;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, add) cJSON_AddItemToArray(list, cJSON_Duplicate(x, true));
}

/* ---- primitives ---- */

static struct frag ws(struct gb *b)
{
    return gb_opt(b, gb_lits(b, " "));
}

static struct frag json_char(struct gb *b, const void *ctx)
{
    static const struct cp_range plain[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
    struct frag f = gb_alt_begin(b);
    gb_alt_add(b, f, gb_codepoints(b, plain, 3));
    if (ctx) return f; /* no escapes: a string's bytes are then its only spelling */
    struct frag esc = gb_lits(b, "\\");
    struct frag one = gb_alt_begin(b);
    static const char simple[] = "\"\\/bfnrt";
    for (const char *c = simple; *c; c++) gb_alt_add(b, one, gb_lit(b, c, 1));
    struct frag u = gb_lits(b, "u");
    for (int k = 0; k < 4; k++) {
        struct frag h = gb_alt_begin(b);
        gb_alt_add(b, h, gb_byte_range(b, '0', '9'));
        gb_alt_add(b, h, gb_byte_range(b, 'a', 'f'));
        gb_alt_add(b, h, gb_byte_range(b, 'A', 'F'));
        u = gb_seq(b, u, h);
    }
    gb_alt_add(b, one, u);
    gb_alt_add(b, f, gb_seq(b, esc, one));
    return f;
}

static struct frag json_string(struct gb *b, int min, int max)
{
    struct frag f = gb_lits(b, "\"");
    f = gb_seq(b, f, gb_repeat(b, json_char, NULL, min, max));
    return gb_seq(b, f, gb_lits(b, "\""));
}

/* The same without escapes (strings some of which are kept out byte by byte). */
static struct frag json_string_plain(struct gb *b, int min, int max)
{
    static const bool plain = true;
    struct frag f = gb_lits(b, "\"");
    f = gb_seq(b, f, gb_repeat(b, json_char, &plain, min, max));
    return gb_seq(b, f, gb_lits(b, "\""));
}

/* ---- helpers over the schema tree ---- */

static const cJSON *get(const cJSON *s, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(s, k);
}

static bool get_count(struct js *j, const cJSON *s, const char *k, int *out, int limit)
{
    const cJSON *v = get(s, k);
    if (!v) return false;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) {
        js_fail(j, QERR_INVALID, "'%s' must be a non-negative integer", k);
        return false;
    }
    if (v->valuedouble > limit) {
        char msg[80];
        snprintf(msg, sizeof msg, "'%s' above %d is not supported", k, limit);
        js_fail(j, QERR_UNSUPPORTED, "%s", msg);
        return false;
    }
    *out = (int)v->valuedouble;
    return true;
}

static void path_push(struct js *j, const char *seg, size_t *save)
{
    *save = strlen(j->path);
    snprintf(j->path + *save, sizeof j->path - *save, "/%s", seg);
}

static void path_pop(struct js *j, size_t save)
{
    j->path[save] = 0;
}

static struct frag literal_json(struct js *j, const cJSON *v)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
        return (struct frag){0, 0};
    }
    struct frag f = gb_lits(j->b, t);
    cJSON_free(t);
    return f;
}

/* "name": as written in an object, with the optional space after ':' */
static struct frag key_frag(struct js *j, const char *name)
{
    cJSON *s = cJSON_CreateString(name);
    if (!s) {
        gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
        return (struct frag){0, 0};
    }
    struct frag f = literal_json(j, s);
    cJSON_Delete(s);
    f = gb_seq(j->b, f, gb_lits(j->b, ":"));
    return gb_seq(j->b, f, ws(j->b));
}

static struct frag comma(struct gb *b)
{
    return gb_seq(b, gb_lits(b, ","), ws(b));
}

/* ---- the generic JSON value (a rule: it recurses) ---- */

static struct frag any_value(struct js *j);

static struct frag any_object_body(struct js *j, bool object)
{
    struct gb *b = j->b;
    /* '{' ( '}' | member (',' member)* '}' ), the member fragment shared by both entries */
    struct frag f = gb_lits(b, object ? "{" : "[");
    int more = gb_state(b), close = gb_state(b);
    struct frag m =
        object ? gb_seq(b, gb_seq(b, json_string(b, 0, -1), gb_lits(b, ":")), ws(b)) : gb_empty(b);
    m = gb_seq(b, m, any_value(j));
    gb_eps(b, f.e, m.s);
    gb_eps(b, f.e, close);
    gb_eps(b, m.e, more);
    struct frag c = comma(b);
    gb_eps(b, more, c.s);
    gb_eps(b, c.e, m.s);
    gb_eps(b, more, close);
    struct frag end = gb_lits(b, object ? "}" : "]");
    gb_eps(b, close, end.s);
    return (struct frag){f.s, end.e};
}

static struct frag any_value(struct js *j)
{
    struct gb *b = j->b;
    if (j->any_rule < 0) {
        j->any_rule = gb_rule_new(b);
        struct frag f = gb_alt_begin(b);
        gb_alt_add(b, f, json_string(b, 0, -1));
        gb_alt_add(b, f, jn_number(b, false));
        gb_alt_add(b, f, gb_lits(b, "true"));
        gb_alt_add(b, f, gb_lits(b, "false"));
        gb_alt_add(b, f, gb_lits(b, "null"));
        gb_alt_add(b, f, any_object_body(j, true));
        gb_alt_add(b, f, any_object_body(j, false));
        gb_rule_set(b, j->any_rule, f);
    }
    return gb_call_frag(b, j->any_rule);
}

struct frag gb_json_any_object(struct gb *b)
{
    struct js j = {.b = b, .any_rule = -1};
    int root = gb_rule_new(b);
    gb_rule_set(b, root, any_object_body(&j, true));
    return (struct frag){b->rules[root].start, b->rules[root].end};
}

/* ---- $ref ---- */

static const cJSON *resolve_ref(struct js *j, const char *ref)
{
    if (ref[0] != '#') {
        js_fail(j, QERR_UNSUPPORTED, "$ref '%.80s': only local references (#...) are supported",
                ref);
        return NULL;
    }
    const cJSON *n = j->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char seg[128];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '1') {
                seg[k++] = '/';
                p += 2;
            } else if (p[0] == '~' && p[1] == '0') {
                seg[k++] = '~';
                p += 2;
            } else {
                seg[k++] = *p++;
            }
        }
        seg[k] = 0;
        if (cJSON_IsArray(n)) {
            char *end;
            long idx = strtol(seg, &end, 10);
            n = *end ? NULL : cJSON_GetArrayItem(n, (int)idx);
        } else {
            n = cJSON_IsObject(n) ? get(n, seg) : NULL;
        }
        if (!n) break;
    }
    if (!n || *p) js_fail(j, QERR_INVALID, "$ref '%.80s' points to nothing", ref);
    return n;
}

/* The rule compiling schema node s (made once; calls to it may come before its body). */
static struct frag rule_for(struct js *j, const cJSON *s)
{
    for (int i = 0; i < j->n_rules; i++)
        if (j->rules[i].node == s) return gb_call_frag(j->b, j->rules[i].rule);
    if (j->n_rules == JS_MAX_REFS) return js_fail(j, QERR_UNSUPPORTED, "%s", "too many rules");
    int r = gb_rule_new(j->b);
    j->rules[j->n_rules].node = s;
    j->rules[j->n_rules++].rule = r;
    if (j->n_active == JS_MAX_INLINE) return js_fail(j, QERR_UNSUPPORTED, "%s", "nesting too deep");
    j->active[j->n_active++] = s;
    int depth = j->depth;
    j->depth = 0;
    struct frag body = js_value(j, s);
    j->depth = depth;
    j->n_active--;
    gb_rule_set(j->b, r, body);
    return gb_call_frag(j->b, r);
}

static struct frag ref_value(struct js *j, const char *ref)
{
    const cJSON *t = resolve_ref(j, ref);
    if (!t) return (struct frag){0, 0};
    for (int i = 0; i < j->n_active; i++)
        if (j->active[i] == t) return rule_for(j, t); /* recursion */
    if (j->n_active == JS_MAX_INLINE)
        return js_fail(j, QERR_UNSUPPORTED, "%s", "$ref nesting too deep");
    j->active[j->n_active++] = t;
    struct frag f = js_value(j, t);
    j->n_active--;
    return f;
}

/* ---- values listed once each (uniqueItems; keys from a list) ---- */

/* The values a schema allows when it is a short list of them (enum, const, boolean, null, a
 * $ref to one of those): their count, or -1 when it is not such a list. */
static int finite_values(struct js *j, const cJSON *s, const cJSON **out, int cap)
{
    for (int hops = 0; cJSON_IsObject(s) && hops < 8; hops++) {
        const cJSON *ref = get(s, "$ref");
        if (!ref) break;
        if (!cJSON_IsString(ref) || !(s = resolve_ref(j, ref->valuestring))) return -1;
    }
    if (!cJSON_IsObject(s)) return -1;
    const cJSON *x, *v, *t = get(s, "type");
    int n = 0;
    if ((x = get(s, "const"))) {
        out[n++] = x;
    } else if ((x = get(s, "enum")) && cJSON_IsArray(x)) {
        cJSON_ArrayForEach(v, x)
        {
            bool dup = false;
            for (int k = 0; k < n; k++) dup |= cJSON_Compare(out[k], v, true);
            if (dup) continue;
            if (n == cap) return -1;
            out[n++] = v;
        }
    } else if (cJSON_IsString(t) && !strcmp(t->valuestring, "boolean")) {
        static const cJSON yes = {.type = cJSON_True}, no = {.type = cJSON_False};
        out[n++] = &yes;
        out[n++] = &no;
    } else if (cJSON_IsString(t) && !strcmp(t->valuestring, "null")) {
        static const cJSON null = {.type = cJSON_NULL};
        out[n++] = &null;
    } else {
        return -1;
    }
    return n;
}

/* Items (or an object's keys) drawn from n listed values, each at most once: the list's state
 * is the set of values written so far (2^n of them), and a value may follow only where it is
 * not in the set; the count of items is the set's size, so min/max come free. An object's key
 * is followed by ':' and a value of schema `value` (NULL: any). */
static struct frag unique_list(struct js *j, const cJSON *const *vals, int n, int min, int max,
                               bool object, const cJSON *value)
{
    struct gb *b = j->b;
    if (max < 0 || max > n) max = n;
    if (min > max)
        return js_fail(j, QERR_INVALID, "%s",
                       object ? "minProperties cannot be met by the names propertyNames lists"
                              : "minItems cannot be met by unique items");
    struct frag open = gb_lits(b, object ? "{" : "["), close = gb_lits(b, object ? "}" : "]");
    int node[1 << UNIQUE_MAX] = {0};
    for (int set = 0; set < 1 << n; set++) node[set] = gb_state(b);
    gb_eps(b, open.e, node[0]);
    int copies = n << (n - 1);
    for (int set = 0; set < 1 << n && !b->rc; set++) {
        int size = __builtin_popcount((unsigned)set);
        if (size >= min && size <= max) gb_eps(b, node[set], close.s);
        if (size >= max) continue;
        for (int v = 0; v < n; v++) {
            if (set & 1 << v) continue;
            struct frag f = set ? comma(b) : gb_empty(b);
            f = gb_seq(b, f, literal_json(j, vals[v]));
            if (object) {
                f = gb_seq(b, f, gb_seq(b, gb_lits(b, ":"), ws(b)));
                size_t save;
                path_push(j, "additionalProperties", &save);
                struct frag x = !cJSON_IsObject(value)      ? any_value(j)
                                : copies > JS_INLINE_COPIES ? rule_for(j, value)
                                                            : js_value(j, value);
                path_pop(j, save);
                f = gb_seq(b, f, x);
            }
            gb_eps(b, node[set], f.s);
            gb_eps(b, f.e, node[set | 1 << v]);
        }
    }
    return (struct frag){open.s, close.e};
}

/* Where the builder stood, to drop what a branch built when that branch cannot be compiled. */
struct js_mark {
    int n_states, n_edges, n_rules, js_rules, any_rule;
};

static struct js_mark js_mark(const struct js *j)
{
    return (struct js_mark){j->b->n_states, j->b->n_edges, j->b->n_rules, j->n_rules, j->any_rule};
}

static void js_rollback(struct js *j, struct js_mark m)
{
    struct gb *b = j->b;
    b->rc = 0;
    if (b->err) *b->err = (struct qerr){0};
    b->n_states = m.n_states;
    b->n_edges = m.n_edges;
    b->n_rules = m.n_rules;
    j->n_rules = m.js_rules;
    j->any_rule = m.any_rule;
}

/* Whether schema s writes exactly the JSON text lit: s is built, walked and taken back. -1 when
 * that cannot be told (s recurses, or cannot be compiled). */
static int writes_text(struct js *j, const cJSON *s, const char *lit)
{
    struct js_mark m = js_mark(j);
    struct frag f = js_value(j, s);
    int r = gb_frag_takes(j->b, f, m.n_states, m.n_edges, lit, strlen(lit));
    js_rollback(j, m);
    return r;
}

/* Whether schema s writes exactly `key` as a JSON string. */
static int writes_key(struct js *j, const cJSON *s, const char *key)
{
    cJSON *k = cJSON_CreateString(key);
    char *lit = k ? cJSON_PrintUnformatted(k) : NULL;
    cJSON_Delete(k);
    int r = lit ? writes_text(j, s, lit) : -1;
    cJSON_free(lit);
    return r;
}

/* Whether `key` may match pattern `re` as JSON Schema matches a pattern (anywhere in the key,
 * unless anchored): 1, 0, or -1 when that cannot be told (the key holds characters the regex
 * subset never matches). A pattern quern cannot compile leaves its error in the builder. */
static int key_matches(struct js *j, const char *re, const char *key)
{
    struct gb *b = j->b;
    for (const char *c = key; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) return -1;
    size_t n = strlen(re), bs = 0;
    bool head = n && re[0] == '^';
    while (bs < n - (n > 0) && re[n - 2 - bs] == '\\') bs++;
    bool tail = n > (size_t)head && re[n - 1] == '$' && bs % 2 == 0;
    char *search = malloc(n + 16);
    if (!search) return -1;
    snprintf(search, n + 16, "%s(%.*s)%s", head ? "" : ".*", (int)(n - head - tail), re + head,
             tail ? "" : ".*");
    struct js_mark m = js_mark(j);
    struct frag f = gb_regex(b, search, strlen(search), true);
    free(search);
    if (b->rc) return -1;
    int r = gb_frag_takes(b, f, m.n_states, m.n_edges, key, strlen(key));
    js_rollback(j, m);
    return r;
}

/* ---- objects ---- */

static bool in_required(const cJSON *req, const char *name)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, req) if (cJSON_IsString(x) && !strcmp(x->valuestring, name)) return true;
    return false;
}

/* Whether schema s allows only strings (propertyNames: a key is a JSON string). */
static bool only_strings(struct js *j, const cJSON *s, int depth)
{
    const cJSON *x, *v;
    if (!cJSON_IsObject(s) || depth > 16) return false;
    if ((x = get(s, "$ref"))) {
        const cJSON *t = cJSON_IsString(x) ? resolve_ref(j, x->valuestring) : NULL;
        return t && only_strings(j, t, depth + 1);
    }
    if ((x = get(s, "const"))) return cJSON_IsString(x);
    if ((x = get(s, "enum"))) {
        cJSON_ArrayForEach(v, x) if (!cJSON_IsString(v)) return false;
        return cJSON_IsArray(x);
    }
    if ((x = get(s, "anyOf")) || (x = get(s, "oneOf"))) {
        cJSON_ArrayForEach(v, x) if (!only_strings(j, v, depth + 1)) return false;
        return cJSON_IsArray(x);
    }
    const cJSON *t = get(s, "type");
    if (t) return cJSON_IsString(t) && !strcmp(t->valuestring, "string");
    return get(s, "minLength") || get(s, "maxLength") || get(s, "pattern") || get(s, "format");
}

/* One additional member "key": value (with a leading comma when comma is set). */
struct member_gen {
    struct js *j;
    const cJSON *addl;   /* its schema when an object, else any value */
    const cJSON *names;  /* propertyNames: the key's schema, or NULL for any string */
    const cJSON *listed; /* the listed properties, whose names other keys must not take */
    const cJSON *absent; /* names "not" keeps out (a list, or NULL) */
    bool comma;
    const char *where; /* the value schema's place, for messages */
};

/* f (just built from s0, e0 on, written without escapes) less the JSON texts of the keys of
 * object `keys` and of the string items of list `strs` (either may be NULL). */
static struct frag exclude_strings(struct js *j, struct frag f, int s0, int e0, const cJSON *keys,
                                   const cJSON *strs)
{
    struct gb *b = j->b;
    int n = cJSON_GetArraySize(keys) + cJSON_GetArraySize(strs), i = 0;
    char **lits = calloc((size_t)n + 1, sizeof *lits);
    size_t *lens = calloc((size_t)n + 1, sizeof *lens);
    const cJSON *p;
    for (int pass = 0; lits && lens && pass < 2; pass++) {
        const cJSON *from = pass ? strs : keys;
        cJSON_ArrayForEach(p, from)
        {
            if (pass && !cJSON_IsString(p)) continue;
            cJSON *str = cJSON_CreateString(pass ? p->valuestring : p->string);
            lits[i] = str ? cJSON_PrintUnformatted(str) : NULL;
            cJSON_Delete(str);
            if (!lits[i]) break;
            lens[i] = strlen(lits[i]);
            i++;
        }
    }
    if (lits && lens)
        f = gb_exclude(b, f, s0, e0, (const char *const *)lits, lens, i);
    else
        gb_fail(b, QERR_NOMEM, "out of memory compiling the schema");
    for (int k = 0; lits && k < i; k++) cJSON_free(lits[k]);
    free(lits);
    free(lens);
    return f;
}

/* key less the JSON texts of the listed names: another member named like a listed property
 * would escape that property's schema. */
static struct frag keep_apart(struct js *j, struct frag key, int s0, int e0, const cJSON *listed,
                              const cJSON *absent)
{
    struct gb *b = j->b;
    for (int k = e0; k < b->n_edges; k++)
        if (b->edges[k].kind == GB_BYTES && b->edges[k].lo <= '\\' && '\\' <= b->edges[k].hi)
            return js_fail(j, QERR_UNSUPPORTED, "%s",
                           "'propertyNames' that allows escapes beside listed properties");
    return exclude_strings(j, key, s0, e0, listed, absent);
}

static struct frag member(struct gb *b, const void *ctx)
{
    const struct member_gen *g = ctx;
    struct frag m = g->comma ? comma(b) : gb_empty(b);
    struct frag key;
    bool apart = (g->listed && g->listed->child) || (g->absent && g->absent->child);
    int s0 = b->n_states, e0 = b->n_edges;
    if (g->names) {
        size_t save;
        path_push(g->j, "propertyNames", &save);
        key = js_value(g->j, g->names);
        path_pop(g->j, save);
    } else {
        /* without escapes, a key's bytes are its only spelling: listed names are kept out byte by
         * byte */
        key = apart ? json_string_plain(b, 0, -1) : json_string(b, 0, -1);
    }
    if (apart) key = keep_apart(g->j, key, s0, e0, g->listed, g->absent);
    m = gb_seq(b, m, gb_seq(b, gb_seq(b, key, gb_lits(b, ":")), ws(b)));
    if (g->addl && cJSON_IsObject(g->addl)) {
        size_t save;
        path_push(g->j, g->where, &save);
        m = gb_seq(b, m, js_value(g->j, g->addl));
        path_pop(g->j, save);
        return m;
    }
    return gb_seq(b, m, any_value(g->j));
}

/* Whether a listed property may be written under propertyNames (names; NULL: any). A
 * required one it rules out makes the schema unsatisfiable (an error in the builder). */
static bool name_allowed(struct js *j, const cJSON *names, const char *name, bool required)
{
    if (!names) return true;
    int in = writes_key(j, names, name);
    if (in < 0)
        js_fail(j, QERR_UNSUPPORTED, "property '%.60s' could not be checked against propertyNames",
                name);
    else if (!in && required)
        js_fail(j, QERR_INVALID, "required property '%.60s' is not in propertyNames", name);
    return in == 1;
}

/* Whether listed property name may be written: not kept out by "not" (absent), and allowed
 * by propertyNames. */
static bool listed_ok(struct js *j, const cJSON *names, const cJSON *absent, const char *name,
                      bool required, const cJSON *schema)
{
    const cJSON *x, *n = cJSON_IsObject(schema) ? get(schema, "not") : NULL;
    /* false, or not {}: the property may not be there (its schema allows no value) */
    if (cJSON_IsFalse(schema) ||
        (n && (cJSON_IsTrue(n) ||
               (cJSON_IsObject(n) && !says_besides(n, (const char *const[]){NULL}))))) {
        if (required) js_fail(j, QERR_INVALID, "required property '%.60s' allows no value", name);
        return false;
    }
    cJSON_ArrayForEach(x, absent)
    {
        if (!cJSON_IsString(x) || strcmp(x->valuestring, name)) continue;
        if (required)
            js_fail(j, QERR_INVALID, "required property '%.60s' is ruled out by 'not'", name);
        return false;
    }
    return name_allowed(j, names, name, required);
}

/* What counted_object needs of an object schema. */
struct counted {
    const cJSON *props, *req, *names, *keys, *addl, *absent;
    const char *where;
    bool extra;
    int min, max; /* minProperties, maxProperties (-1: none) */
};

/* An object whose members are counted (minProperties/maxProperties beside listed properties,
 * or without other keys): the chain of properties runs in layers by the count of members
 * written so far, 0..top (without a maximum the top layer holds every count from top on), and
 * may close from the layers at or above the minimum. A property's value is a rule called from
 * every layer, so the layers do not copy it. */
static struct frag counted_object(struct js *j, const struct counted *c)
{
    struct gb *b = j->b;
    int top = c->max >= 0 ? c->max : c->min > 1 ? c->min : 1;
    if (top > 64)
        return js_fail(j, QERR_UNSUPPORTED, "%s",
                       "minProperties/maxProperties above 64 beside listed properties");
    int cur[65], nx[65];
    struct frag open = gb_lits(b, "{"), close = gb_lits(b, "}");
    for (int k = 0; k <= top; k++) cur[k] = gb_state(b);
    gb_eps(b, open.e, cur[0]);
    const cJSON *p;
    cJSON_ArrayForEach(p, c->props)
    {
        bool required = c->req && in_required(c->req, p->string);
        if (!listed_ok(j, c->names, c->absent, p->string, required, p)) {
            if (b->rc) return (struct frag){0, 0};
            continue;
        }
        size_t save, save2;
        path_push(j, "properties", &save);
        path_push(j, p->string, &save2);
        for (int k = 0; k <= top && !b->rc; k++) {
            nx[k] = gb_state(b);
            if (!required) gb_eps(b, cur[k], nx[k]);
        }
        for (int k = 0; k <= top && !b->rc; k++) {
            int to = k + 1;
            if (to > top) {
                if (c->max >= 0) continue; /* a member more than maxProperties */
                to = top;
            }
            struct frag f =
                k ? gb_seq(b, comma(b), key_frag(j, p->string)) : key_frag(j, p->string);
            f = gb_seq(b, f, top > 1 ? rule_for(j, p) : js_value(j, p));
            gb_eps(b, cur[k], f.s);
            gb_eps(b, f.e, nx[to]);
        }
        path_pop(j, save);
        memcpy(cur, nx, sizeof cur);
    }
    for (int k = 0; c->extra && k <= top && !b->rc; k++) {
        int to = k + 1;
        if (to > top) {
            if (c->max >= 0) continue;
            to = top;
        }
        struct member_gen g = {j, c->addl, c->keys, c->props, c->absent, k > 0, c->where};
        struct frag m = member(b, &g);
        gb_eps(b, cur[k], m.s);
        gb_eps(b, m.e, cur[to]);
    }
    for (int k = c->min < top ? c->min : top; k <= top; k++) gb_eps(b, cur[k], close.s);
    return (struct frag){open.s, close.e};
}

static struct frag object_value(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    const cJSON *props = get(s, "properties"), *req = get(s, "required"),
                *addl = get(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return js_fail(j, QERR_INVALID, "%s", "'properties' must be an object");
    if (req && !cJSON_IsArray(req))
        return js_fail(j, QERR_INVALID, "%s", "'required' must be a list");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return js_fail(j, QERR_INVALID, "%s",
                       "'additionalProperties' must be a boolean or a schema");
    const cJSON *names = get(s, "propertyNames"), *pats = get(s, "patternProperties");
    const cJSON *absent = get(s, KW_ABSENT);
    /* other keys: any when neither properties nor additionalProperties say (OpenAI's strict
     * rule: none when properties are listed) */
    bool open_keys = addl ? !cJSON_IsFalse(addl) : !props || !props->child;
    if (req) {
        const cJSON *x;
        cJSON *merged = NULL;
        cJSON_ArrayForEach(x, req)
        {
            if (!cJSON_IsString(x))
                return js_fail(j, QERR_INVALID, "%s", "'required' must hold strings");
            if (props && get(props, x->valuestring)) continue;
            /* a required key the properties do not list: written as one of them, its value
             * under additionalProperties */
            if (pats)
                return js_fail(j, QERR_UNSUPPORTED,
                               "required property '%.60s' is not in 'properties'", x->valuestring);
            if (addl && cJSON_IsFalse(addl))
                return js_fail(j, QERR_INVALID,
                               "required property '%.60s' is ruled out by additionalProperties: "
                               "false",
                               x->valuestring);
            if (!merged) {
                if (!(merged = js_own(j, cJSON_CreateObject()))) return (struct frag){0, 0};
                const cJSON *p;
                cJSON_ArrayForEach(p, props)
                    cJSON_AddItemReferenceToObject(merged, p->string, (cJSON *)p);
            }
            if (cJSON_IsObject(addl))
                cJSON_AddItemReferenceToObject(merged, x->valuestring, (cJSON *)addl);
            else
                cJSON_AddItemToObject(merged, x->valuestring, cJSON_CreateTrue());
        }
        if (merged) props = merged;
    }
    if (pats && !cJSON_IsObject(pats))
        return js_fail(j, QERR_INVALID, "%s", "'patternProperties' must be an object");
    const cJSON *keys = NULL; /* the other members' keys: the pattern's, or propertyNames */
    if (pats && pats->child) {
        /* the only other members written are the pattern's: keys that match it whole, values
         * of its schema (any object without other keys satisfies additionalProperties) */
        if (pats->child->next || names)
            return js_fail(j, QERR_UNSUPPORTED, "%s",
                           "'patternProperties' is supported with one pattern, without "
                           "'propertyNames'");
        /* a listed property the pattern also matches would need both schemas */
        const cJSON *p;
        bool free_value =
            cJSON_IsTrue(pats->child) || (cJSON_IsObject(pats->child) && !pats->child->child);
        cJSON_ArrayForEach(p, props)
        {
            int hit = key_matches(j, pats->child->string, p->string);
            if (b->rc) return (struct frag){0, 0};
            if (hit != 0 && !free_value)
                return js_fail(j, QERR_UNSUPPORTED,
                               "property '%.60s' also matches the patternProperties pattern",
                               p->string);
        }
        cJSON *key = js_own(j, cJSON_CreateObject());
        if (!key || !cJSON_AddStringToObject(key, "pattern", pats->child->string)) {
            gb_fail(b, QERR_NOMEM, "out of memory compiling the schema");
            return (struct frag){0, 0};
        }
        keys = key;
        addl = pats->child;
        if (!cJSON_IsObject(addl) && !cJSON_IsTrue(addl))
            return js_fail(j, QERR_UNSUPPORTED, "%s", "a pattern's schema must be an object");
    }
    if (names) {
        if (!cJSON_IsTrue(names) && !only_strings(j, names, 0))
            return js_fail(j, QERR_UNSUPPORTED, "%s",
                           "'propertyNames' must be a string schema (type string, an enum or "
                           "const of strings, a pattern or format)");
        if (cJSON_IsTrue(names)) names = NULL;
    }
    const char *where = pats && pats->child ? "patternProperties" : "additionalProperties";
    bool extra = (pats && pats->child) || open_keys;
    int min_p = 0, max_p = -1;
    bool has_min = get_count(j, s, "minProperties", &min_p, COUNT_MAX),
         has_max = get_count(j, s, "maxProperties", &max_p, COUNT_MAX);
    if (b->rc) return (struct frag){0, 0};
    if (has_max && min_p > max_p)
        return js_fail(j, QERR_INVALID, "%s", "minProperties > maxProperties");
    if (!keys) keys = names;
    if ((has_min || has_max) && ((props && props->child) || !extra)) {
        struct counted c = {props,  req,   names, keys,  addl,
                            absent, where, extra, min_p, has_max ? max_p : -1};
        return counted_object(j, &c);
    }
    if (keys && extra && !(props && props->child)) {
        /* keys from a short list (a dict keyed by an enum): each written at most once */
        const cJSON *vals[UNIQUE_MAX];
        int n = finite_values(j, keys, vals, UNIQUE_MAX), kept = 0;
        if (b->rc) return (struct frag){0, 0};
        for (int i = 0; i < n; i++) {
            bool out = false;
            const cJSON *x;
            cJSON_ArrayForEach(x, absent) out |= cJSON_Compare(x, vals[i], true);
            if (!out) vals[kept++] = vals[i];
        }
        if (n > 0) return unique_list(j, vals, kept, min_p, has_max ? max_p : -1, true, addl);
    }
    struct frag open = gb_lits(b, "{");
    /* t0: nothing written yet; t1: some member written (the next needs a comma) */
    int t0 = open.e, t1 = gb_state(b);
    size_t save;
    const cJSON *p;
    cJSON_ArrayForEach(p, props)
    {
        bool required = req && in_required(req, p->string);
        if (!listed_ok(j, names, absent, p->string, required, p)) {
            if (b->rc) return (struct frag){0, 0};
            continue; /* an optional property its name rules out */
        }
        int n0 = gb_state(b), n1 = gb_state(b), mid = gb_state(b);
        struct frag k0 = key_frag(j, p->string);
        struct frag k1 = gb_seq(b, comma(b), key_frag(j, p->string));
        gb_eps(b, t0, k0.s);
        gb_eps(b, k0.e, mid);
        gb_eps(b, t1, k1.s);
        gb_eps(b, k1.e, mid);
        path_push(j, "properties", &save);
        size_t save2;
        path_push(j, p->string, &save2);
        struct frag v = js_value(j, p);
        path_pop(j, save);
        gb_eps(b, mid, v.s);
        gb_eps(b, v.e, n1);
        if (!required) {
            gb_eps(b, t0, n0);
            gb_eps(b, t1, n1);
        }
        /* the next property is reached from n0 (still nothing) or n1 (something) */
        t0 = n0;
        t1 = n1;
    }
    struct frag close = gb_lits(b, "}");
    if (extra && (has_min || has_max)) {
        /* counted members: the first without a comma, the rest with one */
        struct member_gen g0 = {j, addl, keys, props, absent, false, where},
                          g1 = {j, addl, keys, props, absent, true, where};
        if (min_p == 0) gb_eps(b, t0, close.s);
        if (max_p != 0) {
            struct frag first = member(b, &g0);
            struct frag rest =
                gb_repeat(b, member, &g1, min_p > 0 ? min_p - 1 : 0, max_p < 0 ? -1 : max_p - 1);
            gb_eps(b, t0, first.s);
            gb_eps(b, first.e, rest.s);
            gb_eps(b, rest.e, close.s);
        }
        return (struct frag){open.s, close.e};
    }
    if (extra) {
        struct member_gen g0 = {j, addl, keys, props, absent, false, where};
        struct frag m = member(b, &g0);
        struct frag c = comma(b);
        gb_eps(b, t0, m.s);
        gb_eps(b, t1, c.s);
        gb_eps(b, c.e, m.s);
        gb_eps(b, m.e, t1);
    }
    gb_eps(b, t0, close.s);
    gb_eps(b, t1, close.s);
    return (struct frag){open.s, close.e};
}

/* ---- allOf: one schema from several ---- */

static const char *const object_kws[] = {"properties",    "required",      "additionalProperties",
                                         "minProperties", "maxProperties", "patternProperties",
                                         "propertyNames", KW_ABSENT,       NULL};

/* Only object keywords (and type "object") constrain s. */
static bool object_like(const cJSON *s)
{
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s)
    {
        if (!says(kw->string) || listed(object_kws, kw->string)) continue;
        if (!strcmp(kw->string, "type") && cJSON_IsString(kw) && !strcmp(kw->valuestring, "object"))
            continue;
        return false;
    }
    return true;
}

/* Object parts: one object with the union of their properties and requirements; a property
 * several parts list is held to all their schemas (an allOf of them). */
static struct frag merge_objects(struct js *j, const cJSON *const *parts, int np)
{
    cJSON *m = js_own(j, cJSON_CreateObject());
    cJSON *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    if (!m || !props || !req) {
        cJSON_Delete(props);
        cJSON_Delete(req);
        gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
        return (struct frag){0, 0};
    }
    cJSON_AddItemToObject(m, "type", cJSON_CreateString("object"));
    cJSON_AddItemToObject(m, "properties", props);
    cJSON_AddItemToObject(m, "required", req);
    bool closed = false;
    for (int k = 0; k < np; k++) {
        const cJSON *t = parts[k], *kw;
        cJSON_ArrayForEach(kw, t)
        {
            const char *n = kw->string;
            if (!strcmp(n, "properties") && cJSON_IsObject(kw)) {
                const cJSON *p;
                cJSON_ArrayForEach(p, kw)
                {
                    cJSON *have = cJSON_GetObjectItemCaseSensitive(props, p->string);
                    if (!have) {
                        cJSON_AddItemReferenceToObject(props, p->string, (cJSON *)p);
                        continue;
                    }
                    /* listed again: both schemas hold */
                    cJSON *both = cJSON_CreateObject(), *list = cJSON_CreateArray();
                    if (!both || !list) {
                        cJSON_Delete(both);
                        cJSON_Delete(list);
                        gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
                        return (struct frag){0, 0};
                    }
                    /* a reference node reads as what it refers to; our own merge is extended */
                    const cJSON *prev = have->type & cJSON_IsReference ? NULL : get(have, "allOf");
                    if (!prev) {
                        cJSON_AddItemReferenceToArray(list, have);
                    } else {
                        const cJSON *e;
                        cJSON_ArrayForEach(e, prev) cJSON_AddItemReferenceToArray(list, (cJSON *)e);
                    }
                    cJSON_AddItemReferenceToArray(list, (cJSON *)p);
                    cJSON_AddItemToObject(both, "allOf", list);
                    cJSON_ReplaceItemInObjectCaseSensitive(props, p->string, both);
                }
            } else if (!strcmp(n, "required") && cJSON_IsArray(kw)) {
                const cJSON *r;
                cJSON_ArrayForEach(r, kw)
                {
                    if (cJSON_IsString(r) && !in_required(req, r->valuestring))
                        cJSON_AddItemToArray(req, cJSON_CreateString(r->valuestring));
                }
            } else if (!strcmp(n, "additionalProperties")) {
                closed |= cJSON_IsFalse(kw);
            } else if (!strcmp(n, KW_ABSENT)) {
                append_to(m, KW_ABSENT, kw);
            } else if (says(n) && strcmp(n, "type")) {
                return js_fail(j, QERR_UNSUPPORTED,
                               "keyword '%.60s' in an object part of 'allOf' is not supported", n);
            }
        }
    }
    /* a part with additionalProperties false allows only its own properties: the merged
     * object keeps the properties every such part lists */
    if (closed) {
        for (cJSON *p = props->child, *nx; p; p = nx) {
            nx = p->next;
            bool everywhere = true;
            for (int k = 0; k < np; k++) {
                const cJSON *ap = get(parts[k], "additionalProperties");
                const cJSON *pp = get(parts[k], "properties");
                if (ap && cJSON_IsFalse(ap) && !(pp && get(pp, p->string))) everywhere = false;
            }
            if (everywhere) continue;
            if (in_required(req, p->string))
                return js_fail(j, QERR_INVALID,
                               "allOf: required property '%.60s' is excluded by another part's "
                               "additionalProperties: false",
                               p->string);
            cJSON_Delete(cJSON_DetachItemViaPointer(props, p));
        }
    }
    /* listed properties only (the policy for an object with properties) */
    cJSON_AddItemToObject(m, "additionalProperties", cJSON_CreateFalse());
    return object_value(j, m);
}

/* The types both a and b allow ("integer" within "number"), as a new item; NULL if none. */
static cJSON *type_meet(const cJSON *a, const cJSON *b)
{
    cJSON *out = cJSON_CreateArray();
    const cJSON *x, *y;
    const cJSON *la = cJSON_IsArray(a) ? a->child : a, *lb = cJSON_IsArray(b) ? b->child : b;
    for (x = la; x; x = cJSON_IsArray(a) ? x->next : NULL)
        for (y = lb; y; y = cJSON_IsArray(b) ? y->next : NULL) {
            if (!cJSON_IsString(x) || !cJSON_IsString(y)) continue;
            const char *t = NULL;
            if (!strcmp(x->valuestring, y->valuestring))
                t = x->valuestring;
            else if (!strcmp(x->valuestring, "integer") && !strcmp(y->valuestring, "number"))
                t = "integer";
            else if (!strcmp(x->valuestring, "number") && !strcmp(y->valuestring, "integer"))
                t = "integer";
            if (t) cJSON_AddItemToArray(out, cJSON_CreateString(t));
        }
    if (!out || !out->child) {
        cJSON_Delete(out);
        return NULL;
    }
    if (!out->child->next) {
        cJSON *one = cJSON_CreateString(out->child->valuestring);
        cJSON_Delete(out);
        return one;
    }
    return out;
}

/* The keywords whose meaning depends on the others in their part (additionalProperties on its
 * part's properties, items on prefixItems): two parts with them cannot be put side by side. */
static const char *const object_dep[] = {"properties", "additionalProperties", "patternProperties",
                                         NULL};
static const char *const array_dep[] = {"items", "prefixItems", "additionalItems", NULL};

/* *out: one value of keyword b->string that says what a and b (the same keyword, unequal
 * values) say together: types intersected, requirements and lower bounds gathered, upper bounds
 * the least, enum values in both. Returns 0, QERR_INVALID when nothing meets both, or
 * QERR_UNSUPPORTED when quern cannot say both in one value (two patterns). */
static int meet(const cJSON *a, const cJSON *b, cJSON **out)
{
    static const char *const lower[] = {"minItems", "minLength",        "minProperties",
                                        "minimum",  "exclusiveMinimum", NULL};
    static const char *const upper[] = {"maxItems", "maxLength",        "maxProperties",
                                        "maximum",  "exclusiveMaximum", NULL};
    const char *k = b->string;
    *out = NULL;
    if (!strcmp(k, "type")) {
        *out = type_meet(a, b);
        return *out ? 0 : QERR_INVALID;
    }
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b) && (listed(lower, k) || listed(upper, k))) {
        bool take_b =
            listed(lower, k) ? b->valuedouble > a->valuedouble : b->valuedouble < a->valuedouble;
        *out = cJSON_CreateNumber(take_b ? b->valuedouble : a->valuedouble);
        return *out ? 0 : QERR_NOMEM;
    }
    if (!strcmp(k, "uniqueItems") && cJSON_IsBool(a) && cJSON_IsBool(b)) {
        *out = cJSON_CreateBool(cJSON_IsTrue(a) || cJSON_IsTrue(b));
        return *out ? 0 : QERR_NOMEM;
    }
    bool all = !strcmp(k, "required") || !strcmp(k, KW_ABSENT) || !strcmp(k, KW_EXCLUDED);
    if ((!all && strcmp(k, "enum")) || !cJSON_IsArray(a) || !cJSON_IsArray(b))
        return QERR_UNSUPPORTED;
    /* required and the internal lists: every item; enum: the values in both */
    cJSON *list = cJSON_CreateArray();
    if (!list) return QERR_NOMEM;
    const cJSON *x, *y;
    cJSON_ArrayForEach(x, a)
    {
        bool in_b = false;
        cJSON_ArrayForEach(y, b) in_b |= cJSON_Compare(x, y, true);
        if (all || in_b) cJSON_AddItemToArray(list, cJSON_Duplicate(x, true));
    }
    cJSON_ArrayForEach(y, b)
    {
        bool in_a = false;
        cJSON_ArrayForEach(x, a) in_a |= cJSON_Compare(x, y, true);
        if (all && !in_a) cJSON_AddItemToArray(list, cJSON_Duplicate(y, true));
    }
    if (!list->child) {
        cJSON_Delete(list);
        return QERR_INVALID;
    }
    *out = list;
    return 0;
}

/* Several schemas that must all hold. Parts that say nothing drop out; one left is compiled as
 * it is; object parts merge (merge_objects); otherwise the parts' keywords are put side by side,
 * which is their meet when no two parts constrain the same thing: two parts giving one keyword
 * different values are refused (types meet), and so are object or array keywords in two parts
 * (additionalProperties depends on its part's properties). */
static struct frag all_of_parts(struct js *j, const cJSON *const *in, int n_in)
{
    const cJSON *parts[64];
    int np = 0;
    for (int i = 0; i < n_in; i++) {
        const cJSON *t = in[i];
        static const char *const ref_only[] = {"$ref", NULL};
        const cJSON *ref = cJSON_IsObject(t) ? get(t, "$ref") : NULL;
        if (ref && cJSON_IsString(ref) && !says_besides(t, ref_only)) {
            bool active = false; /* a reference being expanded stays a reference (recursion) */
            const cJSON *r = resolve_ref(j, ref->valuestring);
            if (!r) return (struct frag){0, 0};
            for (int k = 0; k < j->n_active; k++) active |= j->active[k] == r;
            if (!active) t = r;
        }
        if (cJSON_IsObject(t) && get(t, "not") && !(t = negate(j, t))) return (struct frag){0, 0};
        if (cJSON_IsFalse(t))
            return js_fail(j, QERR_UNSUPPORTED, "%s", "the schema 'false' allows nothing");
        if (cJSON_IsTrue(t) || (cJSON_IsObject(t) && !says_besides(t, (const char *[]){NULL})))
            continue;
        if (!cJSON_IsObject(t)) return js_fail(j, QERR_INVALID, "%s", "a schema must be an object");
        if (np == 64) return js_fail(j, QERR_UNSUPPORTED, "%s", "allOf with over 64 schemas");
        parts[np++] = t;
    }
    if (np == 0) return any_value(j);
    if (np == 1) return js_value(j, parts[0]);
    bool objects = true;
    for (int i = 0; i < np; i++) objects &= object_like(parts[i]);
    if (objects) return merge_objects(j, parts, np);
    cJSON *m = js_own(j, cJSON_CreateObject());
    if (!m) return (struct frag){0, 0};
    int with_object = 0, with_array = 0;
    for (int i = 0; i < np; i++) {
        bool o = false, a = false;
        const cJSON *kw;
        cJSON_ArrayForEach(kw, parts[i])
        {
            o |= listed(object_dep, kw->string);
            a |= listed(array_dep, kw->string);
        }
        with_object += o;
        with_array += a;
    }
    if (with_object > 1 || with_array > 1)
        return js_fail(j, QERR_UNSUPPORTED, "%s",
                       "'allOf' whose parts list properties or items beside other keywords");
    for (int i = 0; i < np; i++) {
        const cJSON *kw;
        cJSON_ArrayForEach(kw, parts[i])
        {
            if (!says(kw->string)) continue;
            cJSON *have = cJSON_GetObjectItemCaseSensitive(m, kw->string);
            if (!have) {
                cJSON_AddItemReferenceToObject(m, kw->string, (cJSON *)kw);
                continue;
            }
            if (cJSON_Compare(have, kw, true)) continue;
            cJSON *both;
            int rc = meet(have, kw, &both);
            if (rc == QERR_INVALID)
                return js_fail(j, QERR_INVALID, "allOf: no value meets both parts' '%.60s'",
                               kw->string);
            if (rc) return js_fail(j, rc, "parts of 'allOf' disagree on '%.60s'", kw->string);
            cJSON_ReplaceItemInObjectCaseSensitive(m, kw->string, both);
        }
    }
    return js_value(j, m);
}

/* allOf beside the schema's own keywords */
static struct frag all_of(struct js *j, const cJSON *s, const cJSON *all)
{
    if (!cJSON_IsArray(all) || !all->child)
        return js_fail(j, QERR_INVALID, "%s", "'allOf' must be a non-empty list");
    const cJSON *parts[65];
    int np = 0;
    parts[np++] = copy_without(j, s, (const char *const[]){"allOf", NULL});
    if (!parts[0]) return (struct frag){0, 0};
    const cJSON *x;
    cJSON_ArrayForEach(x, all)
    {
        if (np == 65) return js_fail(j, QERR_UNSUPPORTED, "%s", "allOf with over 64 schemas");
        parts[np++] = x;
    }
    return all_of_parts(j, parts, np);
}

/* ---- arrays ---- */

struct item_gen {
    struct js *j;
    const cJSON *schema; /* NULL: any value */
    bool comma;
};

static struct frag item(struct gb *b, const void *ctx)
{
    const struct item_gen *g = ctx;
    struct frag f = g->comma ? comma(b) : gb_empty(b);
    if (!g->schema) return gb_seq(b, f, any_value(g->j));
    size_t save;
    path_push(g->j, "items", &save);
    struct frag v = js_value(g->j, g->schema);
    path_pop(g->j, save);
    return gb_seq(b, f, v);
}

static struct frag item_call(struct gb *b, const void *ctx)
{
    const struct item_gen *g = ctx;
    struct frag f = g->comma ? comma(b) : gb_empty(b);
    return gb_seq(b, f, rule_for(g->j, g->schema));
}

static struct frag array_value(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    const cJSON *prefix = get(s, "prefixItems"), *items = get(s, "items");
    const cJSON *unique = get(s, "uniqueItems");
    if (unique && !cJSON_IsBool(unique))
        return js_fail(j, QERR_INVALID, "%s", "'uniqueItems' must be a boolean");
    int min = 0, max = -1;
    get_count(j, s, "minItems", &min, COUNT_MAX);
    get_count(j, s, "maxItems", &max, COUNT_MAX);
    if (b->rc) return (struct frag){0, 0};
    if (prefix && !cJSON_IsArray(prefix))
        return js_fail(j, QERR_INVALID, "%s", "'prefixItems' must be a list");
    if (cJSON_IsArray(items) && !prefix) {
        /* drafts 4 to 2019-09: a list of items is 2020-12's prefixItems, additionalItems its
         * items (any when absent) */
        prefix = items;
        items = get(s, "additionalItems");
    }
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return js_fail(j, QERR_UNSUPPORTED, "%s", "'items' must be a schema");
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    if (items && cJSON_IsFalse(items)) max = max < 0 || max > k ? k : max;
    if (max >= 0 && min > max)
        return js_fail(j, QERR_INVALID, "%s", "minItems is greater than maxItems");
    const cJSON *tail = items && cJSON_IsObject(items) ? items : NULL;
    if (cJSON_IsTrue(unique) && tail && !prefix) {
        const cJSON *vals[UNIQUE_MAX];
        size_t save;
        path_push(j, "items", &save);
        int n = finite_values(j, tail, vals, UNIQUE_MAX);
        path_pop(j, save);
        if (b->rc) return (struct frag){0, 0};
        if (n > 0) return unique_list(j, vals, n, min, max, false, NULL);
    }
    struct frag open = gb_lits(b, "[");
    int end = gb_state(b);
    int cur = open.e;
    int count = 0;
    /* prefix items, each optional once min is met */
    const cJSON *p = prefix ? prefix->child : NULL;
    for (; p && (max < 0 || count < max); p = p->next, count++) {
        if (count >= min) gb_eps(b, cur, end);
        struct item_gen g = {j, p, count > 0};
        struct frag f = item(b, &g);
        gb_eps(b, cur, f.s);
        cur = f.e;
    }
    int left_min = min > count ? min - count : 0;
    int left_max = max < 0 ? -1 : max - count;
    if (left_max != 0 && !(items && cJSON_IsFalse(items))) {
        bool first = count == 0;
        struct item_gen g0 = {j, tail, false}, g1 = {j, tail, true};
        int copies = left_max < 0 ? left_min + 1 : left_max;
        gb_gen_fn gen = tail && copies > JS_INLINE_COPIES ? item_call : item;
        if (!tail && copies > JS_INLINE_COPIES) gen = item;
        if (first) {
            /* the first tail item has no comma */
            if (left_min == 0) gb_eps(b, cur, end);
            struct frag f = gen(b, &g0);
            gb_eps(b, cur, f.s);
            cur = f.e;
            left_min = left_min > 0 ? left_min - 1 : 0;
            left_max = left_max < 0 ? -1 : left_max - 1;
        }
        struct frag rest = gb_repeat(b, gen, &g1, left_min, left_max);
        gb_eps(b, cur, rest.s);
        cur = rest.e;
    } else if (count < min) {
        return js_fail(j, QERR_INVALID, "%s", "minItems cannot be met with these items");
    }
    gb_eps(b, cur, end);
    struct frag close = gb_lits(b, "]");
    gb_eps(b, end, close.s);
    return (struct frag){open.s, close.e};
}

/* ---- strings, numbers ---- */

struct format {
    const char *name, *re;
};

/* calendar dates only (no February 30th; the 29th in leap years), years 0001-9999 as Python's
 * date takes them */
#define RE_YEAR "([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
#define RE_LEAP "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
#define RE_DATE                                                                                    \
    "(" RE_YEAR "-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"   \
    "02-(0[1-9]|1[0-9]|2[0-8]))|" RE_LEAP "-02-29)"
#define RE_TIME                                                                                    \
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]" \
    ")"
#define RE_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
/* RFC 4291's text forms, "::" included (no zone, no embedded IPv4) */
#define RE_H16 "[0-9a-fA-F]{1,4}"
#define RE_IPV6                                                                                    \
    "((" RE_H16 ":){7}" RE_H16 "|(" RE_H16 ":){1,7}:|(" RE_H16 ":){1,6}:" RE_H16 "|(" RE_H16       \
    ":){1,5}(:" RE_H16 "){1,2}|(" RE_H16 ":){1,4}(:" RE_H16 "){1,3}|(" RE_H16 ":){1,3}(:" RE_H16   \
    "){1,4}|(" RE_H16 ":){1,2}(:" RE_H16 "){1,5}|" RE_H16 ":(:" RE_H16 "){1,6}|:((:" RE_H16        \
    "){1,7}|:))"
/* RFC 1123 labels of up to 32 characters, up to 6 of them (within the 253 a name may have) */
#define RE_LABEL "[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?"
/* RFC 3339 appendix A's duration, numbers of up to 9 digits */
#define RE_DUR_N "[0-9]{1,9}"
#define RE_DUR_TIME                                                                                \
    "T(" RE_DUR_N "H(" RE_DUR_N "M(" RE_DUR_N "S)?)?|" RE_DUR_N "M(" RE_DUR_N "S)?|" RE_DUR_N "S)"
#define RE_DUR_DATE                                                                                \
    "(" RE_DUR_N "D|" RE_DUR_N "M(" RE_DUR_N "D)?|" RE_DUR_N "Y(" RE_DUR_N "M(" RE_DUR_N "D)?)?)"

#define RE_UUIDV(v)                                                                                \
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-" v "[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}"
/* RFC 3986's characters: unreserved, reserved but '#', '[' and ']', and %-escapes */
#define RE_URI_CH   "([A-Za-z0-9._~:/?@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})"
#define RE_URI_FRAG "(#" RE_URI_CH "{0,50})?"
#define RE_URI      "[a-zA-Z][a-zA-Z0-9+.-]{0,15}:" RE_URI_CH "{1,100}" RE_URI_FRAG
/* a relative reference: no scheme, so no ':' in its first segment (none at all, here) */
#define RE_RELREF  "([A-Za-z0-9._~/?@!$&'()*+,;=-]|%[0-9A-Fa-f]{2}){0,100}" RE_URI_FRAG
#define RE_BASE64  "([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
#define RE_PREFIX4 "(3[0-2]|[12]?[0-9])"
#define RE_PREFIX6 "(12[0-8]|1[01][0-9]|[1-9]?[0-9])"
#define RE_NET4                                                                                    \
    "(" RE_OCTET "\\.0\\.0\\.0/8|(" RE_OCTET "\\.){2}0\\.0/16|(" RE_OCTET "\\.){3}0/24|(" RE_OCTET \
    "\\.){3}" RE_OCTET "(/32)?|0\\.0\\.0\\.0/0)"
#define RE_NET6                                                                                    \
    "((" RE_H16 ":):/16|(" RE_H16 ":){2}:/32|(" RE_H16 ":){3}:/48|(" RE_H16 ":){4}:/64|(" RE_H16   \
    ":){5}:/80|(" RE_H16 ":){6}:/96|(" RE_H16 ":){7}:/112|(" RE_IPV6 ")(/128)?|::/0)"

static const struct format formats[] = {
    {"date", RE_DATE},
    {"time", RE_TIME},
    {"date-time", RE_DATE "T" RE_TIME},
    {"email", "[a-zA-Z0-9_%+-]{1,32}(\\.[a-zA-Z0-9_%+-]{1,32}){0,3}@[a-zA-Z0-9-]{1,32}"
              "(\\.[a-zA-Z0-9-]{1,32}){0,3}\\.[a-zA-Z]{2,8}"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"uri", RE_URI},
    {"ipv4", "(" RE_OCTET "\\.){3}" RE_OCTET},
    {"ipv6", RE_IPV6},
    {"hostname", RE_LABEL "(\\." RE_LABEL "){0,5}"},
    {"duration", "P(" RE_DUR_DATE "(" RE_DUR_TIME ")?|" RE_DUR_TIME "|" RE_DUR_N "W)"},
    /* Pydantic's UUID1..UUID8: the version digit, and RFC 4122's variant (else there is none) */
    {"uuid1", RE_UUIDV("1")},
    {"uuid2", RE_UUIDV("2")},
    {"uuid3", RE_UUIDV("3")},
    {"uuid4", RE_UUIDV("4")},
    {"uuid5", RE_UUIDV("5")},
    {"uuid6", RE_UUIDV("6")},
    {"uuid7", RE_UUIDV("7")},
    {"uuid8", RE_UUIDV("8")},
    /* Pydantic's network types: an interface is any address with any prefix; a network's host
     * bits must be zero, so it is written on whole bytes (IPv4) or groups (IPv6) ending in zeros */
    {"ipv4interface", "(" RE_OCTET "\\.){3}" RE_OCTET "/" RE_PREFIX4},
    {"ipv6interface", RE_IPV6 "/" RE_PREFIX6},
    {"ipv4network", RE_NET4},
    {"ipv6network", RE_NET6},
    {"ipvanyaddress", "(" RE_OCTET "\\.){3}" RE_OCTET "|" RE_IPV6},
    {"ipvanyinterface", "(" RE_OCTET "\\.){3}" RE_OCTET "/" RE_PREFIX4 "|" RE_IPV6 "/" RE_PREFIX6},
    {"ipvanynetwork", RE_NET4 "|" RE_NET6},
    /* RFC 4648 base64 with its padding (OpenAPI calls it byte) */
    {"base64", RE_BASE64},
    {"byte", RE_BASE64},
    /* RFC 3986: a URI, or a relative reference of its characters (no spaces) */
    {"uri-reference", RE_URI "|" RE_RELREF},
    {"url", RE_URI},
    /* formats that say what a string is for, not how it is written: any string */
    {"binary", NULL},
    {"password", NULL},
    {"path", NULL},
};

static const char *const format_names =
    "date, time, date-time, duration, email, hostname, uuid, uuid1-uuid8, uri, ipv4, ipv6, "
    "ipv4interface, "
    "ipv6interface, ipv4network, ipv6network, ipvanyaddress, ipvanyinterface, ipvanynetwork, "
    "base64, byte, uri-reference, url, binary, password, path";

/* A string other than the listed ones (what "not" of an enum leaves): written without escapes,
 * so each listed string has one spelling to keep out. */
static struct frag string_less(struct js *j, int min, int max, const char *re,
                               const cJSON *excluded)
{
    struct gb *b = j->b;
    int s0 = b->n_states, e0 = b->n_edges;
    struct frag f;
    if (re) {
        f = gb_lits(b, "\"");
        int r0 = b->n_states, re0 = b->n_edges;
        struct frag r = gb_regex(b, re, strlen(re), true);
        if (min > 0 || max >= 0) r = gb_length(b, r, r0, re0, min, max);
        f = gb_seq(b, gb_seq(b, f, r), gb_lits(b, "\""));
    } else {
        if (max > j->free_max) max = j->free_max > min ? j->free_max : min;
        f = json_string_plain(b, min, max);
    }
    return exclude_strings(j, f, s0, e0, NULL, excluded);
}

static struct frag string_value(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    int min = 0, max = -1;
    bool has_min = get_count(j, s, "minLength", &min, LENGTH_MAX);
    bool has_max = get_count(j, s, "maxLength", &max, LENGTH_MAX);
    if (b->rc) return (struct frag){0, 0};
    if (has_max && min > max) return js_fail(j, QERR_INVALID, "%s", "minLength > maxLength");
    const cJSON *pat = get(s, "pattern"), *fmt = get(s, "format");
    if (pat && fmt) return js_fail(j, QERR_UNSUPPORTED, "%s", "'pattern' with 'format'");
    const char *re = NULL;
    if (pat) {
        if (!cJSON_IsString(pat))
            return js_fail(j, QERR_INVALID, "%s", "'pattern' must be a string");
        re = pat->valuestring;
    } else if (fmt) {
        if (!cJSON_IsString(fmt))
            return js_fail(j, QERR_INVALID, "%s", "'format' must be a string");
        size_t k = 0;
        while (k < sizeof formats / sizeof formats[0] && strcmp(fmt->valuestring, formats[k].name))
            k++;
        if (k == sizeof formats / sizeof formats[0]) {
            char msg[320];
            snprintf(msg, sizeof msg, "format '%.40s' is not supported (%s are)", fmt->valuestring,
                     format_names);
            return js_fail(j, QERR_UNSUPPORTED, "%s", msg);
        }
        re = formats[k].re;
    }
    const cJSON *excluded = get(s, KW_EXCLUDED);
    if (excluded) return string_less(j, min, max, re, excluded);
    if (!re) {
        /* a free string's automaton spells out each count (~22 DFA states a character): a
         * longer maxLength is cut to free_max (every output still fits it), a minLength cannot
         * be */
        if (min > JS_FREE_MAX) {
            char msg[80];
            snprintf(msg, sizeof msg, "'minLength' above %d is not supported", JS_FREE_MAX);
            return js_fail(j, QERR_UNSUPPORTED, "%s", msg);
        }
        j->cut |= max > JS_FREE_MIN;
        if (max > j->free_max) max = j->free_max > min ? j->free_max : min;
        return json_string(b, min, max);
    }
    struct frag f = gb_lits(b, "\"");
    int s0 = b->n_states, e0 = b->n_edges;
    struct frag r = gb_regex(b, re, strlen(re), true);
    if (has_max && max > JS_FREE_MIN) {
        /* cut like a free string's (a retry may cut below the format's own shortest string:
         * then the schema is too large after all) */
        j->cut = true;
        if (max > j->free_max) max = j->free_max > min ? j->free_max : min;
    }
    if (has_min || has_max) r = gb_length(b, r, s0, e0, min, max);
    f = gb_seq(b, f, r);
    return gb_seq(b, f, gb_lits(b, "\""));
}

/* A bound keyword as a double; false when absent. */
static bool bound(struct js *j, const cJSON *s, const char *k, double *out)
{
    const cJSON *v = get(s, k);
    if (!v) return false;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        js_fail(j, QERR_INVALID, "'%s' must be a number", k);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

/* multipleOf: an integer k (the multiples of k, written as integers), a power of ten below 1 (a
 * number then writes at most that many fraction digits; an integer is always one), or another
 * decimal (a number's multiples listed, when the bounds leave few). */
static struct frag number_value(struct js *j, const cJSON *s, bool integer)
{
    struct gb *b = j->b;
    double lo = -(double)JN_MAX, hi = (double)JN_MAX, v, mult = 0;
    bool lo_ex = false, hi_ex = false, has = false;
    if (bound(j, s, "minimum", &v)) lo = v, has = true;
    if (bound(j, s, "maximum", &v)) hi = v, has = true;
    if (bound(j, s, "exclusiveMinimum", &v) && v >= lo) lo = v, lo_ex = true, has = true;
    if (bound(j, s, "exclusiveMaximum", &v) && v <= hi) hi = v, hi_ex = true, has = true;
    if (bound(j, s, "multipleOf", &mult) && !(mult > 0))
        return js_fail(j, QERR_INVALID, "%s", "'multipleOf' must be above 0");
    if (b->rc) return (struct frag){0, 0};
    if (fabs(lo) > (double)JN_MAX || fabs(hi) > (double)JN_MAX)
        return js_fail(j, QERR_UNSUPPORTED, "%s", "bounds beyond 15 digits");
    int64_t k = 1;
    int max_frac = JN_DIGITS;
    if (mult > 0) {
        int p10 = jn_power_of_ten(mult);
        if (p10 != INT32_MIN && p10 <= 0) {
            if (!integer && p10 == 0) integer = true;
            if (!integer) max_frac = -p10;
        } else if (mult == floor(mult) && mult <= (double)JN_MAX) {
            k = (int64_t)mult;
            integer = true;
        } else if (!integer) {
            struct frag f;
            const char *why;
            int rc = jn_decimal_multiples(b, lo, lo_ex, hi, hi_ex, mult, &f, &why);
            return rc ? js_fail(j, rc, "%s", why) : f;
        } else {
            return js_fail(j, QERR_UNSUPPORTED, "%s",
                           "an integer's 'multipleOf' must be an integer or a power of ten");
        }
    }
    if (!has && k == 1 && max_frac == JN_DIGITS) return jn_number(b, integer);
    struct frag f;
    const char *why = NULL;
    int rc;
    if (integer) {
        double l = lo_ex ? floor(lo) + 1 : ceil(lo), h = hi_ex ? ceil(hi) - 1 : floor(hi);
        if (l > h) return js_fail(j, QERR_INVALID, "%s", "no integer lies within the bounds");
        if (k == 1) return jn_int_range(b, (int64_t)l, (int64_t)h);
        rc = jn_int_multiples(b, (int64_t)l, (int64_t)h, k, &f, &why);
    } else {
        rc = jn_decimal_range(b, lo, lo_ex, hi, hi_ex, max_frac, &f, &why);
    }
    return rc ? js_fail(j, rc, "%s", why) : f;
}

/* ---- dispatch ---- */

static struct frag typed_value(struct js *j, const cJSON *s, const char *type)
{
    if (!strcmp(type, "object")) return object_value(j, s);
    if (!strcmp(type, "array")) return array_value(j, s);
    if (!strcmp(type, "string")) return string_value(j, s);
    if (!strcmp(type, "integer")) return number_value(j, s, true);
    if (!strcmp(type, "number")) return number_value(j, s, false);
    if (!strcmp(type, "boolean")) {
        struct frag f = gb_alt_begin(j->b);
        gb_alt_add(j->b, f, gb_lits(j->b, "true"));
        gb_alt_add(j->b, f, gb_lits(j->b, "false"));
        return f;
    }
    if (!strcmp(type, "null")) return gb_lits(j->b, "null");
    return js_fail(j, QERR_UNSUPPORTED, "type '%.40s' is not a JSON Schema type", type);
}

static const char *infer_type(const cJSON *s)
{
    if (get(s, "properties") || get(s, "additionalProperties") || get(s, "required") ||
        get(s, "minProperties") || get(s, "maxProperties") || get(s, "propertyNames") ||
        get(s, "patternProperties"))
        return "object";
    if (get(s, "items") || get(s, "prefixItems") || get(s, "minItems") || get(s, "maxItems") ||
        get(s, "uniqueItems"))
        return "array";
    if (get(s, "minLength") || get(s, "maxLength") || get(s, "pattern") || get(s, "format"))
        return "string";
    if (get(s, "minimum") || get(s, "maximum") || get(s, "exclusiveMinimum") ||
        get(s, "exclusiveMaximum") || get(s, "multipleOf"))
        return "number";
    return NULL;
}

/* anyOf/oneOf. A branch that uses what quern cannot compile is left out when another branch
 * compiles: every output still matches the schema, it just never takes that branch (Pydantic's
 * Decimal is a number or a string whose pattern has a lookahead). Errors in the schema itself
 * (QERR_INVALID) are not forgiven. */
static struct frag alternatives(struct js *j, const cJSON *list, const char *kw)
{
    if (!cJSON_IsArray(list) || !list->child)
        return js_fail(j, QERR_INVALID, "'%s' must be a non-empty list", kw);
    struct gb *b = j->b;
    struct frag f = gb_alt_begin(b);
    struct qerr first = {0};
    int i = 0, kept = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, list)
    {
        char seg[48];
        snprintf(seg, sizeof seg, "%s/%d", kw, i++);
        size_t save;
        path_push(j, seg, &save);
        struct js_mark m = js_mark(j);
        struct frag v = js_value(j, x);
        path_pop(j, save);
        if (b->rc == QERR_UNSUPPORTED) {
            if (!first.code) first = b->err ? *b->err : (struct qerr){QERR_UNSUPPORTED, ""};
            js_rollback(j, m);
            continue;
        }
        gb_alt_add(b, f, v);
        kept++;
    }
    if (!kept && first.code) gb_fail(b, first.code, "%s", first.msg);
    return f;
}

/* Whether type t (a name or a list of names) names n. */
static bool has_type_name(const cJSON *t, const char *n)
{
    const cJSON *x;
    if (cJSON_IsString(t)) return !strcmp(t->valuestring, n);
    cJSON_ArrayForEach(x, t) if (cJSON_IsString(x) && !strcmp(x->valuestring, n)) return true;
    return false;
}

/* The JSON Schema type of value v ("integer" for a whole number). */
static const char *type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsNumber(v)) return v->valuedouble == floor(v->valuedouble) ? "integer" : "number";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsObject(v)) return "object";
    if (cJSON_IsArray(v)) return "array";
    return "null";
}

/* Whether value v has type t (a name or a list of names): a whole number is a number too. */
static bool has_type(const cJSON *v, const cJSON *t)
{
    const char *n = type_name(v);
    return has_type_name(t, n) || (!strcmp(n, "integer") && has_type_name(t, "number"));
}

/* The one key of {"required": [k]}, or NULL. */
static const cJSON *single_required(const cJSON *n)
{
    const cJSON *r = cJSON_IsObject(n) ? get(n, "required") : NULL;
    static const char *const only[] = {"required", NULL};
    if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 1 || !cJSON_IsString(r->child) ||
        says_besides(n, only))
        return NULL;
    return r->child;
}

/* c's type narrowed to those of t too (c's own copy); false (the builder failed) when none is
 * left. */
static bool narrow_type(struct js *j, cJSON *c, const cJSON *t)
{
    const cJSON *have = get(c, "type");
    cJSON *meet_t = have ? type_meet(have, t) : cJSON_Duplicate(t, true);
    if (!meet_t) {
        js_fail(j, QERR_INVALID, "%s", "'not' rules out every type the schema allows");
        return false;
    }
    if (have)
        cJSON_ReplaceItemInObjectCaseSensitive(c, "type", meet_t);
    else
        cJSON_AddItemToObject(c, "type", meet_t);
    return true;
}

/* s with its "not" turned into what quern compiles (a copy without it): not {type} narrows
 * the type; not {required: [k]}, or not an anyOf of such, keeps the keys out of the object;
 * not {enum}/{const} of strings keeps those strings out of a string. Other forms are refused;
 * not {} allows nothing. */
static const cJSON *negate(struct js *j, const cJSON *s)
{
    const cJSON *n = get(s, "not");
    static const char *const ref_only[] = {"$ref", NULL};
    for (int hops = 0;
         hops < 8 && cJSON_IsObject(n) && get(n, "$ref") && !says_besides(n, ref_only); hops++)
        if (!cJSON_IsString(get(n, "$ref")) || !(n = resolve_ref(j, get(n, "$ref")->valuestring)))
            return NULL;
    static const char *const none[] = {NULL};
    if (cJSON_IsTrue(n) || (cJSON_IsObject(n) && !says_besides(n, none))) {
        js_fail(j, QERR_INVALID, "%s", "'not' of a schema that allows everything allows nothing");
        return NULL;
    }
    cJSON *c = copy_without(j, s, (const char *const[]){"not", NULL});
    if (!c) return NULL;
    static const char *const types_only[] = {"type", NULL};
    static const char *const values_only[] = {"enum", "const", "type", NULL};
    const cJSON *t = get(n, "type"), *alts = get(n, "anyOf"), *x;
    if (cJSON_IsFalse(n)) return c;
    if (t && !says_besides(n, types_only)) {
        static const char *const all[] = {"string", "number", "boolean", "null", "object", "array"};
        cJSON *left = cJSON_CreateArray();
        bool num_out = false, int_out = false;
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            cJSON *one = cJSON_CreateString(all[i]);
            if (has_type_name(t, all[i]))
                num_out |= !strcmp(all[i], "number");
            else
                cJSON_AddItemToArray(left, cJSON_Duplicate(one, true));
            cJSON_Delete(one);
        }
        int_out = has_type_name(t, "integer");
        if (int_out && !num_out) {
            cJSON_Delete(left);
            js_fail(j, QERR_UNSUPPORTED, "%s", "'not' of type integer (a number not whole)");
            return NULL;
        }
        bool ok = narrow_type(j, c, left);
        cJSON_Delete(left);
        return ok ? c : NULL;
    }
    bool keys = single_required(n) != NULL;
    if (!keys && cJSON_IsArray(alts) && !says_besides(n, (const char *const[]){"anyOf", NULL})) {
        keys = true;
        cJSON_ArrayForEach(x, alts) keys &= single_required(x) != NULL;
    }
    if (keys) {
        /* required says nothing of other types, so its negation holds only of objects */
        cJSON *obj = cJSON_CreateString("object");
        bool ok = obj && narrow_type(j, c, obj);
        cJSON_Delete(obj);
        if (!ok) return NULL;
        if (single_required(n))
            append_to(c, KW_ABSENT, single_required(n));
        else
            cJSON_ArrayForEach(x, alts) append_to(c, KW_ABSENT, single_required(x));
        return c;
    }
    if ((get(n, "enum") || get(n, "const")) && !says_besides(n, values_only) &&
        (!t || (cJSON_IsString(t) && !strcmp(t->valuestring, "string")))) {
        const cJSON *vals = get(n, "enum") ? get(n, "enum") : get(n, "const");
        if (cJSON_IsArray(vals)) {
            cJSON_ArrayForEach(x, vals) if (!cJSON_IsString(x)) goto refuse;
        } else if (!cJSON_IsString(vals)) {
            goto refuse;
        }
        /* what is not one of these strings: quern writes a string that is not */
        const cJSON *have = get(c, "type");
        if (have && !has_type_name(have, "string")) return c; /* no string to keep out */
        if (!have) cJSON_AddStringToObject(c, "type", "string");
        append_to(c, KW_EXCLUDED, vals);
        return c;
    }
refuse:
    js_fail(j, QERR_UNSUPPORTED, "%s",
            "'not' is supported over {}, a type, required keys, and enum/const of strings");
    return NULL;
}

/* const/enum: the values the schema's other keywords allow too. A type is checked directly;
 * other keywords by compiling them without const/enum and walking each value's JSON text (a
 * value that walk cannot tell about is left out). */
static struct frag listed_values(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    const cJSON *c = get(s, "const"), *e = get(s, "enum"), *v;
    if (e && (!cJSON_IsArray(e) || !e->child))
        return js_fail(j, QERR_INVALID, "%s", "'enum' must be a non-empty list");
    static const char *const own_kws[] = {"const", "enum", "nullable", NULL};
    static const char *const typed[] = {"const", "enum", "nullable", "type", NULL};
    const cJSON *type = get(s, "type");
    cJSON *rest = says_besides(s, typed) ? copy_without(j, s, own_kws) : NULL;
    struct frag f = gb_alt_begin(b);
    int kept = 0;
    for (v = c ? c : e->child; v; v = c ? NULL : v->next) {
        if (c && e) {
            bool in = false;
            const cJSON *w;
            cJSON_ArrayForEach(w, e) in |= cJSON_Compare(v, w, true);
            if (!in) continue;
        }
        if (type && !has_type(v, type)) continue;
        if (rest) {
            /* without a type of its own, the rest is read for the value's type: another type's
             * keywords (required, for a number) say nothing of it */
            cJSON *typed_rest = type ? rest : copy_without(j, rest, (const char *const[]){NULL});
            if (typed_rest && !type) cJSON_AddStringToObject(typed_rest, "type", type_name(v));
            char *lit = cJSON_PrintUnformatted(v);
            int ok = lit && typed_rest ? writes_text(j, typed_rest, lit) : -1;
            cJSON_free(lit);
            if (b->rc) return f;
            if (ok != 1) continue;
        }
        gb_alt_add(b, f, literal_json(j, v));
        kept++;
    }
    if (!kept)
        return js_fail(j, QERR_INVALID, "%s",
                       "no value of 'const'/'enum' meets the schema's other keywords");
    return f;
}

/* anyOf/oneOf beside other keywords: those hold in every branch (each branch compiled as the
 * allOf of them and itself). */
static struct frag alternatives_beside(struct js *j, const cJSON *s, const cJSON *list,
                                       const char *kw)
{
    if (!cJSON_IsArray(list) || !list->child)
        return js_fail(j, QERR_INVALID, "'%s' must be a non-empty list", kw);
    const char *const mine[] = {kw, "nullable", NULL};
    cJSON *rest = copy_without(j, s, mine), *branches = js_own(j, cJSON_CreateArray());
    if (!rest || !branches) return (struct frag){0, 0};
    const cJSON *x;
    cJSON_ArrayForEach(x, list)
    {
        cJSON *both = cJSON_CreateObject(), *parts = cJSON_CreateArray();
        if (!both || !parts) {
            cJSON_Delete(both);
            cJSON_Delete(parts);
            gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
            return (struct frag){0, 0};
        }
        cJSON_AddItemReferenceToArray(parts, rest);
        cJSON_AddItemReferenceToArray(parts, (cJSON *)x);
        cJSON_AddItemToObject(both, "allOf", parts);
        cJSON_AddItemToArray(branches, both);
    }
    return alternatives(j, branches, kw);
}

static struct frag js_value(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    if (b->rc) return (struct frag){0, 0};
    if (cJSON_IsTrue(s)) return any_value(j);
    if (cJSON_IsFalse(s))
        return js_fail(j, QERR_UNSUPPORTED, "%s", "the schema 'false' allows nothing");
    if (!cJSON_IsObject(s)) return js_fail(j, QERR_INVALID, "%s", "a schema must be an object");
    if (++j->depth > JS_MAX_INLINE) return js_fail(j, QERR_UNSUPPORTED, "%s", "nesting too deep");
    struct frag f;
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s)
    {
        if (listed(refused, kw->string)) {
            f = js_fail(j, QERR_UNSUPPORTED, "JSON Schema keyword '%.60s' is not supported",
                        kw->string);
            goto out;
        }
    }
    if (get(s, "not")) {
        const cJSON *c = negate(j, s);
        f = c ? js_value(j, c) : (struct frag){0, 0};
        goto out;
    }
    const cJSON *nullable = get(s, "nullable"), *type = get(s, "type"), *x;
    bool add_null = nullable && cJSON_IsTrue(nullable);
    if ((x = get(s, "$ref"))) {
        if (!cJSON_IsString(x)) {
            f = js_fail(j, QERR_INVALID, "%s", "'$ref' must be a string");
            goto out;
        }
        static const char *const ref_kws[] = {"$ref", "nullable", NULL};
        if (says_besides(s, ref_kws)) {
            /* keywords beside $ref hold too (2019-09 on; earlier drafts ignore them: holding
             * them keeps every output valid under either) */
            cJSON *rest = copy_without(j, s, ref_kws), *r = js_own(j, cJSON_CreateObject());
            if (r) cJSON_AddStringToObject(r, "$ref", x->valuestring);
            f = rest && r ? all_of_parts(j, (const cJSON *const[]){rest, r}, 2)
                          : (struct frag){0, 0};
        } else {
            f = ref_value(j, x->valuestring);
        }
    } else if (get(s, "const") || get(s, "enum")) {
        f = listed_values(j, s);
    } else if ((x = get(s, "anyOf")) || (x = get(s, "oneOf"))) {
        const char *kw_name = get(s, "anyOf") ? "anyOf" : "oneOf";
        const char *const mine[] = {kw_name, "nullable", NULL};
        f = says_besides(s, mine) ? alternatives_beside(j, s, x, kw_name)
                                  : alternatives(j, x, kw_name);
    } else if ((x = get(s, "allOf"))) {
        f = all_of(j, s, x);
    } else if (cJSON_IsArray(type)) {
        f = gb_alt_begin(b);
        const cJSON *t;
        cJSON_ArrayForEach(t, type)
        {
            if (!cJSON_IsString(t)) {
                f = js_fail(j, QERR_INVALID, "%s", "'type' must hold strings");
                goto out;
            }
            gb_alt_add(b, f, typed_value(j, s, t->valuestring));
        }
    } else if (type) {
        if (!cJSON_IsString(type)) {
            f = js_fail(j, QERR_INVALID, "%s", "'type' must be a string or a list of strings");
            goto out;
        }
        f = typed_value(j, s, type->valuestring);
    } else {
        const char *t = infer_type(s);
        f = t ? typed_value(j, s, t) : any_value(j);
    }
    if (add_null) {
        struct frag a = gb_alt_begin(b);
        gb_alt_add(b, a, f);
        gb_alt_add(b, a, gb_lits(b, "null"));
        f = a;
    }
out:
    j->depth--;
    return f;
}

static void js_free(struct js *j)
{
    for (int i = 0; i < j->n_owned; i++) cJSON_Delete(j->owned[i]);
    free(j->owned);
}

static cJSON *parse_text(struct gb *b, const char *text, size_t len, const char *what)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) gb_fail(b, QERR_INVALID, "the %s is not valid JSON", what);
    return root;
}

struct frag gb_json_schema(struct gb *b, const char *text, size_t len, int free_max, bool *cut)
{
    *cut = false;
    cJSON *root = parse_text(b, text, len, "schema");
    if (!root) return (struct frag){0, 0};
    struct js j = {.b = b, .root = root, .any_rule = -1, .free_max = free_max};
    int r = gb_rule_new(b);
    struct frag f = js_value(&j, root);
    gb_rule_set(b, r, f);
    *cut = j.cut;
    js_free(&j);
    cJSON_Delete(root);
    return f;
}

/* Free text that never contains `tag`, whose end (e) may finish the rule, and a path that
 * leaves it at `tag`'s last byte to `after` (a KMP automaton over bytes). */
static struct frag text_until(struct gb *b, const char *tag, int after)
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

/* How the tool list asks calls to be written ("format"; Hermes when absent). */
enum tool_fmt { TF_HERMES, TF_LLAMA3, TF_MISTRAL, TF_MISTRAL_NOSP, TF_MISTRAL_ARGS };

static int tool_fmt(struct gb *b, const cJSON *f)
{
    static const char *const names[] = {"hermes", "llama3", "mistral", "mistral-nospace",
                                        "mistral-args"};
    if (!f) return TF_HERMES;
    for (int k = 0; cJSON_IsString(f) && k < (int)(sizeof names / sizeof names[0]); k++)
        if (!strcmp(f->valuestring, names[k])) return k;
    gb_fail(b, QERR_INVALID, "tool list: unknown format");
    return TF_HERMES;
}

/* One call of function t in format fmt, from its first byte (after any opening tag). */
static struct frag tool_call_one(struct js *j, const cJSON *t, int fmt)
{
    struct gb *b = j->b;
    const cJSON *name = get(t, "name"), *params = get(t, "parameters");
    if (!cJSON_IsString(name)) {
        gb_fail(b, QERR_INVALID, "a tool has no name");
        return gb_empty(b);
    }
    cJSON *ns = cJSON_CreateString(name->valuestring);
    char *quoted = ns ? cJSON_PrintUnformatted(ns) : NULL;
    cJSON_Delete(ns);
    if (!quoted) {
        gb_fail(b, QERR_NOMEM, "out of memory compiling the tools");
        return gb_empty(b);
    }
    struct frag f;
    switch (fmt) {
    case TF_LLAMA3: /* {"name": "f", "parameters": {...}} */
        f = gb_seq(b, gb_lits(b, "{\"name\": "), gb_lits(b, quoted));
        f = gb_seq(b, f, gb_lits(b, ", \"parameters\": "));
        break;
    case TF_MISTRAL_ARGS: /* f[ARGS]{...} */
        f = gb_seq(b, gb_lits(b, name->valuestring), gb_lits(b, "[ARGS]"));
        break;
    case TF_MISTRAL:
    case TF_MISTRAL_NOSP: /* {"name": "f", "arguments": {...}} */
        f = gb_seq(b, gb_lits(b, "{\"name\": "), gb_lits(b, quoted));
        f = gb_seq(b, f, gb_lits(b, ", \"arguments\": "));
        break;
    default: /* \n{"name": "f", "arguments": {...}}\n</tool_call> */
        f = gb_seq(b, gb_lits(b, "\n{\"name\": "), gb_lits(b, quoted));
        f = gb_seq(b, f, gb_lits(b, ", \"arguments\": "));
        break;
    }
    cJSON_free(quoted);
    j->root = params;
    snprintf(j->path, sizeof j->path, "/tools/%.60s/parameters", name->valuestring);
    if (params && cJSON_IsObject(params) && params->child)
        f = gb_seq(b, f, js_value(j, params));
    else
        f = gb_seq(b, f, gb_lits(b, "{}"));
    if (fmt == TF_HERMES) f = gb_seq(b, f, gb_lits(b, "}\n</tool_call>"));
    if (fmt == TF_LLAMA3 || fmt == TF_MISTRAL || fmt == TF_MISTRAL_NOSP)
        f = gb_seq(b, f, gb_lits(b, "}"));
    return f;
}

/* Free text whose first byte is not '{' (Llama 3's calls are the whole output, opened by '{'),
 * or nothing. */
static struct frag text_not_json(struct gb *b)
{
    int s = gb_state(b), rest = gb_state(b), end = gb_state(b);
    gb_range(b, s, rest, 0, '{' - 1);
    gb_range(b, s, rest, '{' + 1, 255);
    gb_range(b, rest, rest, 0, 255);
    gb_eps(b, s, end);
    gb_eps(b, rest, end);
    return (struct frag){s, end};
}

struct frag gb_tool_calls(struct gb *b, const char *text, size_t len)
{
    cJSON *root = parse_text(b, text, len, "tool list");
    if (!root) return (struct frag){0, 0};
    struct js j = {.b = b, .any_rule = -1, .free_max = JS_FREE_MAX};
    int r = gb_rule_new(b);
    int fmt = tool_fmt(b, get(root, "format"));
    const cJSON *tools = get(root, "tools"), *t;
    /* one call, any of the functions */
    struct frag one = gb_alt_begin(b);
    cJSON_ArrayForEach(t, tools) gb_alt_add(b, one, tool_call_one(&j, t, fmt));
    /* what goes between two calls, and around them all */
    static const char *const sep[] = {"\n<tool_call>", "; ", ", ", ", ", "[TOOL_CALLS]"};
    static const char *const open[] = {"<tool_call>", "", "[TOOL_CALLS] [", "[TOOL_CALLS][",
                                       "[TOOL_CALLS]"};
    static const char *const close[] = {"", "", "]", "]", ""};
    struct frag calls = one;
    if (cJSON_IsTrue(get(root, "parallel"))) {
        /* later calls are copies: one rule, called */
        int call = gb_rule_new(b);
        gb_rule_set(b, call, one);
        struct frag more = gb_seq(b, gb_lits(b, sep[fmt]), gb_call_frag(b, call));
        calls = gb_seq(b, gb_call_frag(b, call), gb_star(b, more));
    }
    calls = gb_seq(b, calls, gb_lits(b, close[fmt]));
    /* models end a turn with a newline after the last call as often as not: allow it, so the
     * end of the turn can come after it */
    if (fmt == TF_HERMES) calls = gb_seq(b, calls, gb_opt(b, gb_lits(b, "\n")));
    struct frag all;
    if (cJSON_IsTrue(get(root, "auto")) && fmt == TF_LLAMA3) {
        /* tool_choice auto: text, or a call from the first byte on */
        all = gb_alt_begin(b);
        gb_alt_add(b, all, text_not_json(b));
        gb_alt_add(b, all, calls);
    } else if (cJSON_IsTrue(get(root, "auto"))) {
        /* tool_choice auto: free text, or text up to an opening tag and then well-formed calls
         * (the text may not contain the tag otherwise) */
        const char *tag = fmt == TF_HERMES ? "<tool_call>" : "[TOOL_CALLS]";
        struct frag body = gb_seq(b, gb_lits(b, open[fmt] + strlen(tag)), calls);
        struct frag txt = text_until(b, tag, body.s);
        all = gb_alt_begin(b);
        gb_eps(b, all.s, txt.s);
        gb_eps(b, txt.e, all.e);
        gb_eps(b, body.e, all.e);
    } else {
        all = gb_seq(b, gb_lits(b, open[fmt]), calls);
    }
    gb_rule_set(b, r, all);
    js_free(&j);
    cJSON_Delete(root);
    return all;
}
