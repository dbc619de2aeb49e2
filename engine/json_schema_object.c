/* json_schema_object: objects. Properties are written in schema order, each required one
 * once; other members (additionalProperties, patternProperties' one pattern, keys under
 * propertyNames) come after them and never take a listed property's name; min/maxProperties
 * count the members; dependencies are branches by the set of triggers present. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema_impl.h"

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

bool js_in_required(const cJSON *req, const char *name)
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
        const cJSON *t = cJSON_IsString(x) ? js_resolve_ref(j, x->valuestring) : NULL;
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
struct frag js_exclude_strings(struct js *j, struct frag f, int s0, int e0, const cJSON *keys,
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
    return js_exclude_strings(j, key, s0, e0, listed, absent);
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
        js_path_push(g->j, "propertyNames", &save);
        key = js_value(g->j, g->names);
        js_path_pop(g->j, save);
    } else {
        /* without escapes, a key's bytes are its only spelling: listed names are kept out byte by
         * byte */
        key = apart ? js_string_plain(b, 0, -1) : js_string(b, 0, -1);
    }
    if (apart) key = keep_apart(g->j, key, s0, e0, g->listed, g->absent);
    m = gb_seq(b, m, gb_seq(b, gb_seq(b, key, gb_lits(b, ":")), ws(b)));
    if (g->addl && cJSON_IsObject(g->addl)) {
        size_t save;
        js_path_push(g->j, g->where, &save);
        m = gb_seq(b, m, js_value(g->j, g->addl));
        js_path_pop(g->j, save);
        return m;
    }
    return gb_seq(b, m, js_any_value(g->j));
}

/* Whether a listed property may be written under propertyNames (names; NULL: any). A
 * required one it rules out makes the schema unsatisfiable (an error in the builder). */
static bool name_allowed(struct js *j, const cJSON *names, const char *name, bool required)
{
    if (!names) return true;
    int in = js_writes_key(j, names, name);
    if (in < 0)
        js_fail(j, QERR_UNSUPPORTED, "property '%.60s' could not be checked against propertyNames",
                name);
    else if (!in && required)
        js_nothing(j, "required property '%.60s' is not in propertyNames", name);
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
               (cJSON_IsObject(n) && !js_says_besides(n, (const char *const[]){NULL}))))) {
        if (required) js_nothing(j, "required property '%.60s' allows no value", name);
        return false;
    }
    cJSON_ArrayForEach(x, absent)
    {
        if (!cJSON_IsString(x) || strcmp(x->valuestring, name)) continue;
        if (required) js_nothing(j, "required property '%.60s' is ruled out by 'not'", name);
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
        bool required = c->req && js_in_required(c->req, p->string);
        if (!listed_ok(j, c->names, c->absent, p->string, required, p)) {
            if (b->rc) return (struct frag){0, 0};
            continue;
        }
        size_t save, save2;
        js_path_push(j, "properties", &save);
        js_path_push(j, p->string, &save2);
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
                k ? gb_seq(b, comma(b), js_key_frag(j, p->string)) : js_key_frag(j, p->string);
            f = gb_seq(b, f, top > 1 ? js_rule_for(j, p) : js_value(j, p));
            gb_eps(b, cur[k], f.s);
            gb_eps(b, f.e, nx[to]);
        }
        js_path_pop(j, save);
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

struct frag js_object_value(struct js *j, const cJSON *s)
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
                return js_nothing(j,
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
    bool has_min = js_get_count(j, s, "minProperties", &min_p, COUNT_MAX),
         has_max = js_get_count(j, s, "maxProperties", &max_p, COUNT_MAX);
    if (b->rc) return (struct frag){0, 0};
    if (has_max && min_p > max_p) return js_nothing(j, "%s", "minProperties > maxProperties");
    if (!keys) keys = names;
    if ((has_min || has_max) && ((props && props->child) || !extra)) {
        struct counted c = {props,  req,   names, keys,  addl,
                            absent, where, extra, min_p, has_max ? max_p : -1};
        return counted_object(j, &c);
    }
    if (keys && extra && !(props && props->child)) {
        /* keys from a short list (a dict keyed by an enum): each written at most once */
        const cJSON *vals[UNIQUE_MAX];
        int n = js_finite_values(j, keys, vals, UNIQUE_MAX), kept = 0;
        if (b->rc) return (struct frag){0, 0};
        for (int i = 0; i < n; i++) {
            bool out = false;
            const cJSON *x;
            cJSON_ArrayForEach(x, absent) out |= cJSON_Compare(x, vals[i], true);
            if (!out) vals[kept++] = vals[i];
        }
        if (n > 0) return js_unique_list(j, vals, kept, min_p, has_max ? max_p : -1, true, addl);
    }
    struct frag open = gb_lits(b, "{");
    /* t0: nothing written yet; t1: some member written (the next needs a comma) */
    int t0 = open.e, t1 = gb_state(b);
    size_t save;
    const cJSON *p;
    cJSON_ArrayForEach(p, props)
    {
        bool required = req && js_in_required(req, p->string);
        if (!listed_ok(j, names, absent, p->string, required, p)) {
            if (b->rc) return (struct frag){0, 0};
            continue; /* an optional property its name rules out */
        }
        bool clean = !b->rc;
        struct js_mark m = js_mark(j);
        int n0 = gb_state(b), n1 = gb_state(b), mid = gb_state(b);
        struct frag k0 = js_key_frag(j, p->string);
        struct frag k1 = gb_seq(b, comma(b), js_key_frag(j, p->string));
        gb_eps(b, t0, k0.s);
        gb_eps(b, k0.e, mid);
        gb_eps(b, t1, k1.s);
        gb_eps(b, k1.e, mid);
        js_path_push(j, "properties", &save);
        size_t save2;
        js_path_push(j, p->string, &save2);
        struct frag v = js_value(j, p);
        js_path_pop(j, save);
        if (clean && !required && b->rc == QERR_INVALID && j->nothing) {
            js_rollback(j, m); /* an optional property that allows no value is never written */
            continue;
        }
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

/* Appends the name to s's list k. */
static bool append_name(cJSON *s, const char *k, const char *name)
{
    cJSON *n = cJSON_CreateString(name);
    if (!n) return false;
    js_append_to(s, k, n);
    cJSON_Delete(n);
    return true;
}

struct frag js_dependencies(struct js *j, const cJSON *s)
{
    static const char *const kws[] = {"dependencies", "dependentRequired", "dependentSchemas",
                                      NULL};
    const cJSON *trig[DEP_MAX + 1]; /* each trigger's entry: its name, and what it asks */
    int n = 0;
    for (int k = 0; kws[k]; k++) {
        const cJSON *x = get(s, kws[k]), *d, *v;
        if (!x) continue;
        if (!cJSON_IsObject(x)) return js_fail(j, QERR_INVALID, "'%s' must be an object", kws[k]);
        cJSON_ArrayForEach(d, x)
        {
            /* names (a list; draft 3's one string), or a schema */
            bool names = k != 2 && (cJSON_IsArray(d) || (k == 0 && cJSON_IsString(d)));
            bool schema = k != 1 && (cJSON_IsObject(d) || cJSON_IsBool(d));
            if (cJSON_IsArray(d)) cJSON_ArrayForEach(v, d) names &= cJSON_IsString(v);
            if (!names && !schema)
                return js_fail(j, QERR_INVALID, "'%s' must map names to lists of names or schemas",
                               kws[k]);
            if (n == DEP_MAX) {
                char msg[80];
                snprintf(msg, sizeof msg, "dependencies on more than %d properties", DEP_MAX);
                return js_fail(j, QERR_UNSUPPORTED, "%s", msg);
            }
            trig[n++] = d;
        }
    }
    cJSON *base = js_copy_without(j, s, kws), *branches = js_own(j, cJSON_CreateArray());
    if (!base || !branches) return (struct frag){0, 0};
    for (int set = 0; set < 1 << n; set++) {
        cJSON *br = js_copy_without(j, base, (const char *const[]){NULL});
        if (!br) return (struct frag){0, 0};
        const cJSON *parts[DEP_MAX + 1] = {br}; /* br, then its triggers' schemas */
        int np = 1;
        bool ok = true;
        for (int i = 0; i < n && ok; i++) {
            const cJSON *d = trig[i];
            if (!(set & 1 << i)) {
                ok = append_name(br, KW_ABSENT, d->string);
                continue;
            }
            ok = append_name(br, "required", d->string);
            if (cJSON_IsArray(d) || cJSON_IsString(d)) {
                js_append_to(br, "required", d);
                continue;
            }
            parts[np++] = d;
        }
        if (ok && np > 1 && !(br = js_all_of_list(j, parts, np))) return (struct frag){0, 0};
        if (!ok || !cJSON_AddItemReferenceToArray(branches, br)) {
            gb_fail(j->b, QERR_NOMEM, "out of memory compiling the schema");
            return (struct frag){0, 0};
        }
    }
    return js_alternatives(j, branches, "dependencies");
}
