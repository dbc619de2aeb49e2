/* json_schema_combine: keywords that combine schemas. allOf's parts are merged into one schema
 * the rest of the compiler reads (objects' properties united, bounds met, types intersected);
 * not is turned into keywords of the schema beside it (a narrower type, keys kept out, strings
 * kept out); if/then/else is an anyOf of the branch where if holds and those where it fails. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "json_schema_impl.h"

/* ---- allOf ---- */

static const char *const object_kws[] = {"properties",    "required",      "additionalProperties",
                                         "minProperties", "maxProperties", "patternProperties",
                                         "propertyNames", KW_ABSENT,       NULL};

/* Only object keywords (and type "object") constrain s. */
static bool object_like(const cJSON *s)
{
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s)
    {
        if (!js_says(kw->string) || js_listed(object_kws, kw->string)) continue;
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
                    if (cJSON_IsString(r) && !js_in_required(req, r->valuestring))
                        cJSON_AddItemToArray(req, cJSON_CreateString(r->valuestring));
                }
            } else if (!strcmp(n, "additionalProperties")) {
                closed |= cJSON_IsFalse(kw);
            } else if (!strcmp(n, KW_ABSENT)) {
                js_append_to(m, KW_ABSENT, kw);
            } else if (js_says(n) && strcmp(n, "type")) {
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
            if (js_in_required(req, p->string))
                return js_nothing(j,
                                  "allOf: required property '%.60s' is excluded by another part's "
                                  "additionalProperties: false",
                                  p->string);
            cJSON_Delete(cJSON_DetachItemViaPointer(props, p));
        }
    }
    /* listed properties only (the policy for an object with properties) */
    cJSON_AddItemToObject(m, "additionalProperties", cJSON_CreateFalse());
    return js_object_value(j, m);
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
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b) && (js_listed(lower, k) || js_listed(upper, k))) {
        bool take_b =
            js_listed(lower, k) ? b->valuedouble > a->valuedouble : b->valuedouble < a->valuedouble;
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
struct frag js_all_of_parts(struct js *j, const cJSON *const *in, int n_in)
{
    const cJSON *parts[64];
    int np = 0;
    for (int i = 0; i < n_in; i++) {
        const cJSON *t = in[i];
        static const char *const ref_only[] = {"$ref", NULL};
        const cJSON *ref = cJSON_IsObject(t) ? get(t, "$ref") : NULL;
        if (ref && cJSON_IsString(ref) && !js_says_besides(t, ref_only)) {
            bool active = false; /* a reference being expanded stays a reference (recursion) */
            const cJSON *r = js_resolve_ref(j, ref->valuestring);
            if (!r) return (struct frag){0, 0};
            for (int k = 0; k < j->n_active; k++) active |= j->active[k] == r;
            if (!active) t = r;
        }
        if (cJSON_IsObject(t) && get(t, "not") && !(t = js_negate(j, t)))
            return (struct frag){0, 0};
        if (cJSON_IsFalse(t))
            return js_fail(j, QERR_UNSUPPORTED, "%s", "the schema 'false' allows nothing");
        if (cJSON_IsTrue(t) || (cJSON_IsObject(t) && !js_says_besides(t, (const char *[]){NULL})))
            continue;
        if (!cJSON_IsObject(t)) return js_fail(j, QERR_INVALID, "%s", "a schema must be an object");
        if (np == 64) return js_fail(j, QERR_UNSUPPORTED, "%s", "allOf with over 64 schemas");
        parts[np++] = t;
    }
    if (np == 0) return js_any_value(j);
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
            o |= js_listed(object_dep, kw->string);
            a |= js_listed(array_dep, kw->string);
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
            if (!js_says(kw->string)) continue;
            cJSON *have = cJSON_GetObjectItemCaseSensitive(m, kw->string);
            if (!have) {
                cJSON_AddItemReferenceToObject(m, kw->string, (cJSON *)kw);
                continue;
            }
            if (cJSON_Compare(have, kw, true)) continue;
            cJSON *both;
            int rc = meet(have, kw, &both);
            if (rc == QERR_INVALID)
                return js_nothing(j, "allOf: no value meets both parts' '%.60s'", kw->string);
            if (rc) return js_fail(j, rc, "parts of 'allOf' disagree on '%.60s'", kw->string);
            cJSON_ReplaceItemInObjectCaseSensitive(m, kw->string, both);
        }
    }
    return js_value(j, m);
}

/* allOf beside the schema's own keywords */
struct frag js_all_of(struct js *j, const cJSON *s, const cJSON *all)
{
    if (!cJSON_IsArray(all) || !all->child)
        return js_fail(j, QERR_INVALID, "%s", "'allOf' must be a non-empty list");
    const cJSON *parts[65];
    int np = 0;
    parts[np++] = js_copy_without(j, s, (const char *const[]){"allOf", NULL});
    if (!parts[0]) return (struct frag){0, 0};
    const cJSON *x;
    cJSON_ArrayForEach(x, all)
    {
        if (np == 65) return js_fail(j, QERR_UNSUPPORTED, "%s", "allOf with over 64 schemas");
        parts[np++] = x;
    }
    return js_all_of_parts(j, parts, np);
}

/* ---- not ---- */

/* Whether type t (a name or a list of names) names n. */
static bool has_type_name(const cJSON *t, const char *n)
{
    const cJSON *x;
    if (cJSON_IsString(t)) return !strcmp(t->valuestring, n);
    cJSON_ArrayForEach(x, t) if (cJSON_IsString(x) && !strcmp(x->valuestring, n)) return true;
    return false;
}

/* The JSON Schema type of value v ("integer" for a whole number). */
const char *js_type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsNumber(v)) return v->valuedouble == floor(v->valuedouble) ? "integer" : "number";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsObject(v)) return "object";
    if (cJSON_IsArray(v)) return "array";
    return "null";
}

/* Whether value v has type t (a name or a list of names): a whole number is a number too. */
bool js_has_type(const cJSON *v, const cJSON *t)
{
    const char *n = js_type_name(v);
    return has_type_name(t, n) || (!strcmp(n, "integer") && has_type_name(t, "number"));
}

/* The one key of {"required": [k]}, or NULL. */
static const cJSON *single_required(const cJSON *n)
{
    const cJSON *r = cJSON_IsObject(n) ? get(n, "required") : NULL;
    static const char *const only[] = {"required", NULL};
    if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 1 || !cJSON_IsString(r->child) ||
        js_says_besides(n, only))
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
        js_nothing(j, "%s", "'not' rules out every type the schema allows");
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
const cJSON *js_negate(struct js *j, const cJSON *s)
{
    const cJSON *n = get(s, "not");
    static const char *const ref_only[] = {"$ref", NULL};
    for (int hops = 0;
         hops < 8 && cJSON_IsObject(n) && get(n, "$ref") && !js_says_besides(n, ref_only); hops++)
        if (!cJSON_IsString(get(n, "$ref")) ||
            !(n = js_resolve_ref(j, get(n, "$ref")->valuestring)))
            return NULL;
    static const char *const none[] = {NULL};
    if (cJSON_IsTrue(n) || (cJSON_IsObject(n) && !js_says_besides(n, none))) {
        js_nothing(j, "%s", "'not' of a schema that allows everything allows nothing");
        return NULL;
    }
    cJSON *c = js_copy_without(j, s, (const char *const[]){"not", NULL});
    if (!c) return NULL;
    static const char *const types_only[] = {"type", NULL};
    static const char *const values_only[] = {"enum", "const", "type", NULL};
    const cJSON *t = get(n, "type"), *alts = get(n, "anyOf"), *x;
    if (cJSON_IsFalse(n)) return c;
    if (t && !js_says_besides(n, types_only)) {
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
    if (!keys && cJSON_IsArray(alts) && !js_says_besides(n, (const char *const[]){"anyOf", NULL})) {
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
            js_append_to(c, KW_ABSENT, single_required(n));
        else
            cJSON_ArrayForEach(x, alts) js_append_to(c, KW_ABSENT, single_required(x));
        return c;
    }
    if ((get(n, "enum") || get(n, "const")) && !js_says_besides(n, values_only) &&
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
        js_append_to(c, KW_EXCLUDED, vals);
        return c;
    }
refuse:
    js_fail(j, QERR_UNSUPPORTED, "%s",
            "'not' is supported over {}, a type, required keys, and enum/const of strings");
    return NULL;
}

/* ---- if/then/else ---- */

/* {"allOf": [a, b, c]} (a NULL b or c: true), owned by j. */
static cJSON *all3(struct js *j, const cJSON *a, const cJSON *b, const cJSON *c)
{
    return js_all_of_list(j, (const cJSON *const[]){a, b, c}, 3);
}

struct frag js_if_then_else(struct js *j, const cJSON *s)
{
    static const char *const kws[] = {"if", "then", "else", NULL};
    const cJSON *c = get(s, "if"), *then = get(s, "then"), *els = get(s, "else");
    if (!cJSON_IsObject(c) && !cJSON_IsBool(c))
        return js_fail(j, QERR_INVALID, "%s", "'if' must be a schema");
    cJSON *base = js_copy_without(j, s, kws), *branches = js_own(j, cJSON_CreateArray());
    if (!base || !branches) return (struct frag){0, 0};
    if (cJSON_IsBool(c)) /* always or never: then or else alone */
        return js_value(j, all3(j, base, cJSON_IsTrue(c) ? then : els, NULL));
    cJSON_AddItemReferenceToArray(branches, all3(j, base, c, then));
    /* the reasons `if` fails */
    static const char *const simple[] = {"properties", "required", "type", NULL};
    const cJSON *props = get(c, "properties"), *req = get(c, "required"), *x;
    cJSON *reasons = cJSON_CreateArray();
    if (!reasons) return js_fail(j, QERR_NOMEM, "%s", "out of memory");
    if (!js_says_besides(c, simple) && !get(c, "type")) {
        cJSON_ArrayForEach(x, props)
        {
            /* present, with a value its schema rules out */
            cJSON *r = cJSON_CreateObject(), *p = cJSON_AddObjectToObject(r, "properties");
            cJSON *n = cJSON_AddObjectToObject(p, x->string);
            if (n) cJSON_AddItemReferenceToObject(n, "not", (cJSON *)x);
            cJSON *rq = cJSON_AddArrayToObject(r, "required");
            if (rq) cJSON_AddItemToArray(rq, cJSON_CreateString(x->string));
            cJSON_AddItemToArray(reasons, r);
        }
        cJSON_ArrayForEach(x, req)
        {
            if (!cJSON_IsString(x)) continue;
            cJSON *r = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(r, KW_ABSENT);
            if (a) cJSON_AddItemToArray(a, cJSON_CreateString(x->valuestring));
            cJSON_AddItemToArray(reasons, r);
        }
    } else {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(r, "not", (cJSON *)c);
        cJSON_AddItemToArray(reasons, r);
    }
    if (!js_own(j, reasons)) return (struct frag){0, 0};
    cJSON_ArrayForEach(x, reasons) cJSON_AddItemReferenceToArray(branches, all3(j, base, x, els));
    return js_alternatives(j, branches, "if");
}
