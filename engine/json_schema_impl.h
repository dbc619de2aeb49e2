/* json_schema_impl.h: what the JSON Schema compiler's files share (json_schema.c and the
 * json_schema_*.c beside it; grammar_tools.c). The public entry points are in grammar_impl.h.
 *
 * The compiler walks a schema (a cJSON tree) and builds its automaton into a struct gb. Each
 * file compiles one part of the vocabulary:
 *   json_schema.c          the walk: keyword dispatch, $ref, anyOf/oneOf, const/enum, the
 *                          generic JSON value, the helpers below
 *   json_schema_object.c   objects: properties, required, additionalProperties,
 *                          patternProperties, propertyNames, min/maxProperties, dependencies
 *   json_schema_array.c    arrays: items, prefixItems, min/maxItems, uniqueItems
 *   json_schema_scalar.c   strings (length, pattern, format) and numbers (bounds, multipleOf)
 *   json_schema_combine.c  allOf (parts merged into one schema), not (turned into what the
 *                          others compile) and if/then/else (branches)
 * A function that cannot compile what it is given calls js_fail (the builder keeps the first
 * error) and returns the empty fragment; callers check j->b->rc where they go on. */
#ifndef QUERN_JSON_SCHEMA_IMPL_H
#define QUERN_JSON_SCHEMA_IMPL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "grammar_impl.h"

#define JS_MAX_INLINE    48 /* nesting of inlined schemas */
#define JS_MAX_REFS      64
#define JS_INLINE_COPIES 8    /* array items repeated more often than this become a rule */
#define COUNT_MAX        1000 /* counts the automaton spells out (items, properties, characters) */
#define LENGTH_MAX       (1 << 24) /* a pattern's or format's own length may make a bound moot */
#define UNIQUE_MAX       8         /* uniqueItems is enforced over up to this many listed values */
#define DEP_MAX          6         /* properties with dependencies: 2^DEP_MAX branches at most */

/* Internal keywords "not" turns into (a leading space: no schema author writes one). */
#define KW_ABSENT   " absent"   /* keys an object must not have */
#define KW_EXCLUDED " excluded" /* strings a string must not be */

/* One compilation: the builder, the schema's root, and what the walk keeps. */
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
    bool nothing; /* the builder's error says the schema allows no value (js_nothing) */
};

static inline const cJSON *get(const cJSON *s, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(s, k);
}

/* the optional space after ',' and ':' */
static inline struct frag ws(struct gb *b)
{
    return gb_opt(b, gb_lits(b, " "));
}

static inline struct frag comma(struct gb *b)
{
    return gb_seq(b, gb_lits(b, ","), ws(b));
}

/* ---- json_schema.c: the walk ---- */

/* The fragment of schema s (any JSON value; an object, true or false). */
struct frag js_value(struct js *j, const cJSON *s);
/* The generic JSON value (a rule: it recurses). */
struct frag js_any_value(struct js *j);
/* A call to the rule compiling s (made once; calls may come before its body). */
struct frag js_rule_for(struct js *j, const cJSON *s);
/* The schema a local $ref names: a JSON pointer ("#/$defs/a", %-escapes decoded), or an
 * anchor ("#a": $anchor "a", or draft 4-7's id/$id "#a"). NULL (the builder failed) if none. */
const cJSON *js_resolve_ref(struct js *j, const char *ref);
/* anyOf/oneOf (kw) over the schemas of list; branches quern refuses, or that allow nothing,
 * are left out while one is left. */
struct frag js_alternatives(struct js *j, const cJSON *list, const char *kw);
/* Fails the builder with fmt (one %s: arg) and where in the schema; the empty fragment. */
struct frag js_fail(struct js *j, int code, const char *fmt, const char *arg);
/* The same for a schema that allows no value (QERR_INVALID, and j->nothing set when it is the
 * builder's first error): an optional property or an anyOf branch that allows nothing is left
 * out where it stands, which changes nothing the schema allows. */
struct frag js_nothing(struct js *j, const char *fmt, const char *arg);
/* x, now owned by j (freed with it); NULL (and the builder failed) when x is NULL or no room. */
cJSON *js_own(struct js *j, cJSON *x);
void js_free(struct js *j);
cJSON *js_parse_text(struct gb *b, const char *text, size_t len, const char *what);

/* Whether k is in the NULL-terminated list l. */
bool js_listed(const char *const *l, const char *k);
/* A keyword that constrains (compiled or refused), as against annotations and unknown ones. */
bool js_says(const char *k);
/* Whether s has a constraining keyword other than those in but (NULL-terminated). */
bool js_says_besides(const cJSON *s, const char *const *but);
/* A shallow copy of s without the keywords in drop, owned by j. */
cJSON *js_copy_without(struct js *j, const cJSON *s, const char *const *drop);
/* {"allOf": parts[0..n)} (NULL parts left out), owned by j; NULL (the builder failed) on OOM. */
cJSON *js_all_of_list(struct js *j, const cJSON *const *parts, int n);
/* Appends to s's list k the items of add (or add itself when it is not a list). */
void js_append_to(cJSON *s, const char *k, const cJSON *add);
/* Keyword k of s as a count in *out: false when absent or wrong (the builder failed then). */
bool js_get_count(struct js *j, const cJSON *s, const char *k, int *out, int limit);
void js_path_push(struct js *j, const char *seg, size_t *save);
void js_path_pop(struct js *j, size_t save);

/* JSON strings of min to max characters (max < 0: any); _plain without escapes, so a string's
 * bytes are its only spelling. */
struct frag js_string(struct gb *b, int min, int max);
struct frag js_string_plain(struct gb *b, int min, int max);
/* v's JSON text, as a literal. */
struct frag js_literal_json(struct js *j, const cJSON *v);
/* "name": as written in an object, with the optional space after ':' */
struct frag js_key_frag(struct js *j, const char *name);

/* Where the builder stood, to drop what a branch built when that branch cannot be compiled. */
struct js_mark {
    int n_states, n_edges, n_rules, js_rules, any_rule;
};
struct js_mark js_mark(const struct js *j);
void js_rollback(struct js *j, struct js_mark m);
/* Whether schema s writes exactly `key` as a JSON string: 1, 0, or -1 when that cannot be told
 * (s recurses, or cannot be compiled). */
int js_writes_key(struct js *j, const cJSON *s, const char *key);

/* ---- json_schema_object.c ---- */

struct frag js_object_value(struct js *j, const cJSON *s);
bool js_in_required(const cJSON *req, const char *name);
/* f (just built from s0, e0 on, written without escapes) less the JSON texts of the keys of
 * object `keys` and of the string items of list `strs` (either may be NULL). */
struct frag js_exclude_strings(struct js *j, struct frag f, int s0, int e0, const cJSON *keys,
                               const cJSON *strs);

/* dependencies (drafts 4-7), dependentRequired and dependentSchemas (2019-09 on): where the
 * object has property A it has the names listed for A too, or meets the schema given for A.
 * Compiled as one anyOf branch per set of the triggers present (at most 2^DEP_MAX): the branch
 * requires its triggers and the names they list, keeps the other triggers out (KW_ABSENT),
 * and meets its triggers' schemas (allOf); a branch that allows nothing is left out. (Requiring
 * the triggers only makes the branches disjoint: their union is the same without it.) */
struct frag js_dependencies(struct js *j, const cJSON *s);

/* ---- json_schema_array.c ---- */

struct frag js_array_value(struct js *j, const cJSON *s);
/* The values a schema allows when it is a short list of them (enum, const, boolean, null, a
 * $ref to one of those): their count, or -1 when it is not such a list. */
int js_finite_values(struct js *j, const cJSON *s, const cJSON **out, int cap);
/* Items (or an object's keys, each followed by a value of schema `value`) drawn from n listed
 * values, each at most once, min to max of them. */
struct frag js_unique_list(struct js *j, const cJSON *const *vals, int n, int min, int max,
                           bool object, const cJSON *value);

/* ---- json_schema_scalar.c ---- */

struct frag js_string_value(struct js *j, const cJSON *s);
struct frag js_number_value(struct js *j, const cJSON *s, bool integer);

/* ---- json_schema_combine.c ---- */

/* allOf beside s's own keywords; and the allOf of n schemas. */
struct frag js_all_of(struct js *j, const cJSON *s, const cJSON *all);
struct frag js_all_of_parts(struct js *j, const cJSON *const *in, int n_in);
/* s with its "not" turned into keywords the others compile (a copy owned by j); NULL (the
 * builder failed) for a form quern does not compile. */
const cJSON *js_negate(struct js *j, const cJSON *s);
/* if/then/else: anyOf the branch where `if` holds (allOf the schema, if, then) and the branches
 * where it fails (allOf the schema, a reason it fails, else): for an `if` of properties and
 * required keys, one reason per property (present with a value its schema rules out: `not`,
 * as js_negate compiles it) and per required key (absent); for another `if`, not of all of it.
 * A reason quern cannot compile is left out, so `else` is then reached less often than the
 * schema allows, never wrongly. then/else without if say nothing. */
struct frag js_if_then_else(struct js *j, const cJSON *s);
/* The JSON Schema type of value v ("integer" for a whole number); whether v has type t (a
 * name or a list of names). */
const char *js_type_name(const cJSON *v);
bool js_has_type(const cJSON *v, const cJSON *t);

#endif
