/* json_schema: JSON Schema (and any JSON value) -> the NFA builder: the walk over a schema.
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
 * integer and 15 fraction digits; bounds are exact, decimal ones included (json_number.c).
 *
 * This file walks the schema and dispatches each keyword; json_schema_impl.h lists the files
 * that compile objects, arrays, strings and numbers, and allOf/not. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema_impl.h"

struct frag js_fail(struct js *j, int code, const char *fmt, const char *arg)
{
    char msg[400];
    snprintf(msg, sizeof msg, fmt, arg);
    gb_fail(j->b, code, "%s (at %s)", msg, j->path[0] ? j->path : "/");
    return (struct frag){0, 0};
}

struct frag js_nothing(struct js *j, const char *fmt, const char *arg)
{
    if (!j->b->rc) j->nothing = true;
    return js_fail(j, QERR_INVALID, fmt, arg);
}

/* x, now owned by j (freed with it); NULL (and the builder failed) when x is NULL or no room. */
cJSON *js_own(struct js *j, cJSON *x)
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
                                        "dependencies",
                                        "dependentRequired",
                                        "dependentSchemas",
                                        "if",
                                        "then",
                                        "else",
                                        KW_ABSENT,
                                        KW_EXCLUDED,
                                        NULL};
/* JSON Schema's own keywords (drafts 4 to 2020-12) that quern does not compile: a schema using
 * one is refused, naming it. A keyword outside the vocabulary (Kubernetes' x-kubernetes-...,
 * draft 4's id, example) is ignored, as the specification says of unknown keywords. */
static const char *const refused[] = {"contains",
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

bool js_listed(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

/* A keyword that constrains (compiled or refused), as against annotations and unknown ones. */
bool js_says(const char *k)
{
    return js_listed(supported, k) || js_listed(refused, k);
}

/* Whether s has a constraining keyword other than those in but (NULL-terminated). */
bool js_says_besides(const cJSON *s, const char *const *but)
{
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s) if (js_says(kw->string) && !js_listed(but, kw->string)) return true;
    return false;
}

/* A shallow copy of s without the keywords in drop, owned by j. */
cJSON *js_copy_without(struct js *j, const cJSON *s, const char *const *drop)
{
    cJSON *c = js_own(j, cJSON_CreateObject());
    const cJSON *kw;
    if (c)
        cJSON_ArrayForEach(kw, s) if (!js_listed(drop, kw->string))
            cJSON_AddItemReferenceToObject(c, kw->string, (cJSON *)kw);
    return c;
}

cJSON *js_all_of_list(struct js *j, const cJSON *const *parts, int n)
{
    cJSON *o = js_own(j, cJSON_CreateObject()), *l = o ? cJSON_AddArrayToObject(o, "allOf") : NULL;
    bool ok = l != NULL;
    for (int k = 0; ok && k < n; k++)
        if (parts[k]) ok = cJSON_AddItemReferenceToArray(l, (cJSON *)parts[k]);
    if (o && !ok) gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
    return ok ? o : NULL;
}

/* Appends to s's list k the items of add (or add itself when it is not a list). */
void js_append_to(cJSON *s, const char *k, const cJSON *add)
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

struct frag js_string(struct gb *b, int min, int max)
{
    struct frag f = gb_lits(b, "\"");
    f = gb_seq(b, f, gb_repeat(b, json_char, NULL, min, max));
    return gb_seq(b, f, gb_lits(b, "\""));
}

/* The same without escapes (strings some of which are kept out byte by byte). */
struct frag js_string_plain(struct gb *b, int min, int max)
{
    static const bool plain = true;
    struct frag f = gb_lits(b, "\"");
    f = gb_seq(b, f, gb_repeat(b, json_char, &plain, min, max));
    return gb_seq(b, f, gb_lits(b, "\""));
}

/* ---- helpers over the schema tree ---- */

bool js_get_count(struct js *j, const cJSON *s, const char *k, int *out, int limit)
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

void js_path_push(struct js *j, const char *seg, size_t *save)
{
    *save = strlen(j->path);
    snprintf(j->path + *save, sizeof j->path - *save, "/%s", seg);
}

void js_path_pop(struct js *j, size_t save)
{
    j->path[save] = 0;
}

struct frag js_literal_json(struct js *j, const cJSON *v)
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
struct frag js_key_frag(struct js *j, const char *name)
{
    cJSON *s = cJSON_CreateString(name);
    if (!s) {
        gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
        return (struct frag){0, 0};
    }
    struct frag f = js_literal_json(j, s);
    cJSON_Delete(s);
    f = gb_seq(j->b, f, gb_lits(j->b, ":"));
    return gb_seq(j->b, f, ws(j->b));
}

/* ---- the generic JSON value (a rule: it recurses) ---- */

static struct frag any_object_body(struct js *j, bool object)
{
    struct gb *b = j->b;
    /* '{' ( '}' | member (',' member)* '}' ), the member fragment shared by both entries */
    struct frag f = gb_lits(b, object ? "{" : "[");
    int more = gb_state(b), close = gb_state(b);
    struct frag m =
        object ? gb_seq(b, gb_seq(b, js_string(b, 0, -1), gb_lits(b, ":")), ws(b)) : gb_empty(b);
    m = gb_seq(b, m, js_any_value(j));
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

struct frag js_any_value(struct js *j)
{
    struct gb *b = j->b;
    if (j->any_rule < 0) {
        j->any_rule = gb_rule_new(b);
        struct frag f = gb_alt_begin(b);
        gb_alt_add(b, f, js_string(b, 0, -1));
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

/* The schema under n whose $anchor is name, or whose id/$id (drafts 4-7) is "#name". */
static const cJSON *find_anchor(const cJSON *n, const char *name, int depth)
{
    if (depth > 64 || !(cJSON_IsObject(n) || cJSON_IsArray(n))) return NULL;
    if (cJSON_IsObject(n)) {
        static const char *const ids[] = {"$anchor", "$id", "id"};
        for (int k = 0; k < 3; k++) {
            const cJSON *id = get(n, ids[k]);
            const char *v = cJSON_IsString(id) ? id->valuestring : NULL;
            if (v && k > 0) v = v[0] == '#' ? v + 1 : NULL;
            if (v && !strcmp(v, name)) return n;
        }
    }
    const cJSON *c, *hit;
    cJSON_ArrayForEach(c, n) if ((hit = find_anchor(c, name, depth + 1))) return hit;
    return NULL;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

const cJSON *js_resolve_ref(struct js *j, const char *ref)
{
    if (ref[0] != '#') {
        js_fail(j, QERR_UNSUPPORTED, "$ref '%.80s': only local references (#...) are supported",
                ref);
        return NULL;
    }
    /* a URI fragment: %-escapes decoded first, then the JSON pointer's ~ escapes (RFC 6901) */
    char frag[512];
    size_t m = 0;
    const char *q = ref + 1;
    for (; *q && m + 1 < sizeof frag; m++) {
        int hi = q[0] == '%' ? hex_digit(q[1]) : -1, lo = hi >= 0 ? hex_digit(q[2]) : -1;
        if (hi == 0 && lo == 0) lo = -1; /* %00 is no name's byte: left as it is */
        frag[m] = lo >= 0 ? (char)(hi * 16 + lo) : *q;
        q += lo >= 0 ? 3 : 1;
    }
    frag[m] = 0;
    if (*q) {
        js_fail(j, QERR_UNSUPPORTED, "$ref '%.80s' is too long", ref);
        return NULL;
    }
    const cJSON *n = j->root;
    const char *p = frag;
    if (*p && *p != '/') {
        n = find_anchor(j->root, p, 0);
        if (!n) js_fail(j, QERR_INVALID, "$ref '%.80s' points to nothing", ref);
        return n;
    }
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
struct frag js_rule_for(struct js *j, const cJSON *s)
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
    const cJSON *t = js_resolve_ref(j, ref);
    if (!t) return (struct frag){0, 0};
    for (int i = 0; i < j->n_active; i++)
        if (j->active[i] == t) return js_rule_for(j, t); /* recursion */
    if (j->n_active == JS_MAX_INLINE)
        return js_fail(j, QERR_UNSUPPORTED, "%s", "$ref nesting too deep");
    j->active[j->n_active++] = t;
    struct frag f = js_value(j, t);
    j->n_active--;
    return f;
}

struct js_mark js_mark(const struct js *j)
{
    return (struct js_mark){j->b->n_states, j->b->n_edges, j->b->n_rules, j->n_rules, j->any_rule};
}

void js_rollback(struct js *j, struct js_mark m)
{
    struct gb *b = j->b;
    b->rc = 0;
    if (b->err) *b->err = (struct qerr){0};
    b->n_states = m.n_states;
    b->n_edges = m.n_edges;
    b->n_rules = m.n_rules;
    j->n_rules = m.js_rules;
    j->any_rule = m.any_rule;
    j->nothing = false;
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
int js_writes_key(struct js *j, const cJSON *s, const char *key)
{
    cJSON *k = cJSON_CreateString(key);
    char *lit = k ? cJSON_PrintUnformatted(k) : NULL;
    cJSON_Delete(k);
    int r = lit ? writes_text(j, s, lit) : -1;
    cJSON_free(lit);
    return r;
}

/* ---- dispatch ---- */

static struct frag typed_value(struct js *j, const cJSON *s, const char *type)
{
    if (!strcmp(type, "object")) return js_object_value(j, s);
    if (!strcmp(type, "array")) return js_array_value(j, s);
    if (!strcmp(type, "string")) return js_string_value(j, s);
    if (!strcmp(type, "integer")) return js_number_value(j, s, true);
    if (!strcmp(type, "number")) return js_number_value(j, s, false);
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
 * Decimal is a number or a string whose pattern has a lookahead). So is a branch that allows
 * nothing (js_nothing), which changes nothing. Other errors in the schema itself (QERR_INVALID)
 * are not forgiven. */
struct frag js_alternatives(struct js *j, const cJSON *list, const char *kw)
{
    if (!cJSON_IsArray(list) || !list->child)
        return js_fail(j, QERR_INVALID, "'%s' must be a non-empty list", kw);
    struct gb *b = j->b;
    struct frag f = gb_alt_begin(b);
    struct qerr first = {0}, empty = {0}; /* the first branch refused, the first allowing nothing */
    int i = 0, kept = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, list)
    {
        char seg[48];
        snprintf(seg, sizeof seg, "%s/%d", kw, i++);
        size_t save;
        js_path_push(j, seg, &save);
        struct js_mark m = js_mark(j);
        struct frag v = js_value(j, x);
        js_path_pop(j, save);
        bool nothing = b->rc == QERR_INVALID && j->nothing;
        if (b->rc == QERR_UNSUPPORTED || nothing) {
            struct qerr *keep = nothing ? &empty : &first;
            if (!keep->code) *keep = b->err ? *b->err : (struct qerr){b->rc, ""};
            js_rollback(j, m);
            continue;
        }
        gb_alt_add(b, f, v);
        kept++;
    }
    /* none left: what quern refuses says more than what allows nothing */
    if (!kept && first.code) gb_fail(b, first.code, "%s", first.msg);
    if (!kept && !first.code && empty.code) {
        gb_fail(b, empty.code, "%s", empty.msg);
        j->nothing = true;
    }
    return f;
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
    cJSON *rest = js_says_besides(s, typed) ? js_copy_without(j, s, own_kws) : NULL;
    struct frag f = gb_alt_begin(b);
    int kept = 0;
    for (v = c ? c : e->child; v; v = c ? NULL : v->next) {
        if (c && e) {
            bool in = false;
            const cJSON *w;
            cJSON_ArrayForEach(w, e) in |= cJSON_Compare(v, w, true);
            if (!in) continue;
        }
        if (type && !js_has_type(v, type)) continue;
        if (rest) {
            /* without a type of its own, the rest is read for the value's type: another type's
             * keywords (required, for a number) say nothing of it */
            cJSON *typed_rest = type ? rest : js_copy_without(j, rest, (const char *const[]){NULL});
            if (typed_rest && !type) cJSON_AddStringToObject(typed_rest, "type", js_type_name(v));
            char *lit = cJSON_PrintUnformatted(v);
            int ok = lit && typed_rest ? writes_text(j, typed_rest, lit) : -1;
            cJSON_free(lit);
            if (b->rc) return f;
            if (ok != 1) continue;
        }
        gb_alt_add(b, f, js_literal_json(j, v));
        kept++;
    }
    if (!kept)
        return js_nothing(j, "%s", "no value of 'const'/'enum' meets the schema's other keywords");
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
    cJSON *rest = js_copy_without(j, s, mine), *branches = js_own(j, cJSON_CreateArray());
    if (!rest || !branches) return (struct frag){0, 0};
    const cJSON *x;
    cJSON_ArrayForEach(x, list)
    {
        cJSON *both = js_all_of_list(j, (const cJSON *const[]){rest, x}, 2);
        if (!both) return (struct frag){0, 0};
        cJSON_AddItemReferenceToArray(branches, both);
    }
    return js_alternatives(j, branches, kw);
}

struct frag js_value(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    if (b->rc) return (struct frag){0, 0};
    if (cJSON_IsTrue(s)) return js_any_value(j);
    if (cJSON_IsFalse(s))
        return js_fail(j, QERR_UNSUPPORTED, "%s", "the schema 'false' allows nothing");
    if (!cJSON_IsObject(s)) return js_fail(j, QERR_INVALID, "%s", "a schema must be an object");
    if (++j->depth > JS_MAX_INLINE) return js_fail(j, QERR_UNSUPPORTED, "%s", "nesting too deep");
    struct frag f;
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s)
    {
        if (js_listed(refused, kw->string)) {
            f = js_fail(j, QERR_UNSUPPORTED, "JSON Schema keyword '%.60s' is not supported",
                        kw->string);
            goto out;
        }
    }
    if (get(s, "not")) {
        const cJSON *c = js_negate(j, s);
        f = c ? js_value(j, c) : (struct frag){0, 0};
        goto out;
    }
    if (get(s, "dependencies") || get(s, "dependentRequired") || get(s, "dependentSchemas")) {
        f = js_dependencies(j, s);
        goto out;
    }
    if (get(s, "if")) {
        f = js_if_then_else(j, s);
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
        if (js_says_besides(s, ref_kws)) {
            /* keywords beside $ref hold too (2019-09 on; earlier drafts ignore them: holding
             * them keeps every output valid under either) */
            cJSON *rest = js_copy_without(j, s, ref_kws), *r = js_own(j, cJSON_CreateObject());
            if (r) cJSON_AddStringToObject(r, "$ref", x->valuestring);
            f = rest && r ? js_all_of_parts(j, (const cJSON *const[]){rest, r}, 2)
                          : (struct frag){0, 0};
        } else {
            f = ref_value(j, x->valuestring);
        }
    } else if (get(s, "const") || get(s, "enum")) {
        f = listed_values(j, s);
    } else if ((x = get(s, "anyOf")) || (x = get(s, "oneOf"))) {
        const char *kw_name = get(s, "anyOf") ? "anyOf" : "oneOf";
        const char *const mine[] = {kw_name, "nullable", NULL};
        f = js_says_besides(s, mine) ? alternatives_beside(j, s, x, kw_name)
                                     : js_alternatives(j, x, kw_name);
    } else if ((x = get(s, "allOf"))) {
        f = js_all_of(j, s, x);
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
        f = t ? typed_value(j, s, t) : js_any_value(j);
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

void js_free(struct js *j)
{
    for (int i = 0; i < j->n_owned; i++) cJSON_Delete(j->owned[i]);
    free(j->owned);
}

cJSON *js_parse_text(struct gb *b, const char *text, size_t len, const char *what)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) gb_fail(b, QERR_INVALID, "the %s is not valid JSON", what);
    return root;
}

struct frag gb_json_schema(struct gb *b, const char *text, size_t len, int free_max, bool *cut)
{
    *cut = false;
    cJSON *root = js_parse_text(b, text, len, "schema");
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
