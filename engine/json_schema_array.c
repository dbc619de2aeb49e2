/* json_schema_array: arrays (items, prefixItems, draft 4's items lists and additionalItems,
 * min/maxItems, uniqueItems), and lists of values each written at most once (uniqueItems over
 * listed values; an object's keys from a list). */
#include <cjson/cJSON.h>
#include <string.h>

#include "json_schema_impl.h"

/* ---- values listed once each (uniqueItems; keys from a list) ---- */

/* The values a schema allows when it is a short list of them (enum, const, boolean, null, a
 * $ref to one of those): their count, or -1 when it is not such a list. */
int js_finite_values(struct js *j, const cJSON *s, const cJSON **out, int cap)
{
    for (int hops = 0; cJSON_IsObject(s) && hops < 8; hops++) {
        const cJSON *ref = get(s, "$ref");
        if (!ref) break;
        if (!cJSON_IsString(ref) || !(s = js_resolve_ref(j, ref->valuestring))) return -1;
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
struct frag js_unique_list(struct js *j, const cJSON *const *vals, int n, int min, int max,
                           bool object, const cJSON *value)
{
    struct gb *b = j->b;
    if (max < 0 || max > n) max = n;
    if (min > max)
        return js_nothing(j, "%s",
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
            f = gb_seq(b, f, js_literal_json(j, vals[v]));
            if (object) {
                f = gb_seq(b, f, gb_seq(b, gb_lits(b, ":"), ws(b)));
                size_t save;
                js_path_push(j, "additionalProperties", &save);
                struct frag x = !cJSON_IsObject(value)      ? js_any_value(j)
                                : copies > JS_INLINE_COPIES ? js_rule_for(j, value)
                                                            : js_value(j, value);
                js_path_pop(j, save);
                f = gb_seq(b, f, x);
            }
            gb_eps(b, node[set], f.s);
            gb_eps(b, f.e, node[set | 1 << v]);
        }
    }
    return (struct frag){open.s, close.e};
}

struct item_gen {
    struct js *j;
    const cJSON *schema; /* NULL: any value */
    bool comma;
};

static struct frag item(struct gb *b, const void *ctx)
{
    const struct item_gen *g = ctx;
    struct frag f = g->comma ? comma(b) : gb_empty(b);
    if (!g->schema) return gb_seq(b, f, js_any_value(g->j));
    size_t save;
    js_path_push(g->j, "items", &save);
    struct frag v = js_value(g->j, g->schema);
    js_path_pop(g->j, save);
    return gb_seq(b, f, v);
}

static struct frag item_call(struct gb *b, const void *ctx)
{
    const struct item_gen *g = ctx;
    struct frag f = g->comma ? comma(b) : gb_empty(b);
    return gb_seq(b, f, js_rule_for(g->j, g->schema));
}

struct frag js_array_value(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    const cJSON *prefix = get(s, "prefixItems"), *items = get(s, "items");
    const cJSON *unique = get(s, "uniqueItems");
    if (unique && !cJSON_IsBool(unique))
        return js_fail(j, QERR_INVALID, "%s", "'uniqueItems' must be a boolean");
    int min = 0, max = -1;
    js_get_count(j, s, "minItems", &min, COUNT_MAX);
    js_get_count(j, s, "maxItems", &max, COUNT_MAX);
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
    if (max >= 0 && min > max) return js_nothing(j, "%s", "minItems is greater than maxItems");
    const cJSON *tail = items && cJSON_IsObject(items) ? items : NULL;
    if (cJSON_IsTrue(unique) && tail && !prefix) {
        const cJSON *vals[UNIQUE_MAX];
        size_t save;
        js_path_push(j, "items", &save);
        int n = js_finite_values(j, tail, vals, UNIQUE_MAX);
        js_path_pop(j, save);
        if (b->rc) return (struct frag){0, 0};
        if (n > 0) return js_unique_list(j, vals, n, min, max, false, NULL);
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
        return js_nothing(j, "%s", "minItems cannot be met with these items");
    }
    gb_eps(b, cur, end);
    struct frag close = gb_lits(b, "]");
    gb_eps(b, end, close.s);
    return (struct frag){open.s, close.e};
}
