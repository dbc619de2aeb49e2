/* grammar_impl: what the grammar's files share (not part of its contract).
 *
 * DESIGN. Every source compiles to a recursive transition network: rules, each an NFA over
 * bytes (Thompson fragments: byte-range, epsilon and call edges). Non-recursive structure is
 * inlined into one rule, so a typical JSON Schema is a single regular automaton; only real
 * recursion (any-JSON values, recursive $ref) becomes calls. grammar_dfa.c determinizes each
 * rule (calls are symbols of the alphabet), giving DFA states with a 256-entry next-state row,
 * a final flag and call edges (rule, return state). At run time a sequence's state is a small
 * set of stacks of DFA states (grammar_match.c). */
#ifndef QUERN_GRAMMAR_IMPL_H
#define QUERN_GRAMMAR_IMPL_H

#include <stdatomic.h>

#include "grammar.h"

/* ---- NFA builder ---- */

enum { GB_EPS, GB_BYTES, GB_CALL };

struct gb_edge {
    int32_t from, to;
    int32_t rule; /* GB_CALL */
    uint8_t kind, lo, hi;
};

struct gb {
    int n_states;
    struct gb_edge *edges;
    int n_edges, cap_edges;
    struct gb_rule {
        int start, end;
    } * rules;
    int n_rules, cap_rules;
    int max_states;
    int rc; /* first error; every builder call is a no-op once set */
    struct qerr *err;
};

struct frag {
    int s, e; /* start and end state */
};

void gb_init(struct gb *b, struct qerr *err);
void gb_free(struct gb *b);
int gb_fail(struct gb *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int gb_state(struct gb *b);
void gb_eps(struct gb *b, int from, int to);
void gb_range(struct gb *b, int from, int to, uint8_t lo, uint8_t hi);
void gb_call(struct gb *b, int from, int to, int rule);
struct frag gb_empty(struct gb *b);
struct frag gb_lit(struct gb *b, const char *s, size_t n);
struct frag gb_lits(struct gb *b, const char *s); /* NUL-terminated */
struct frag gb_byte_range(struct gb *b, uint8_t lo, uint8_t hi);
struct frag gb_seq(struct gb *b, struct frag x, struct frag y);
/* Alternation: starts with an empty fragment (gb_alt_begin) and adds branches. */
struct frag gb_alt_begin(struct gb *b);
void gb_alt_add(struct gb *b, struct frag alt, struct frag branch);
struct frag gb_opt(struct gb *b, struct frag x);
struct frag gb_star(struct gb *b, struct frag x);
/* A rule whose body is given later (gb_rule_set): calls to it can be made before. */
int gb_rule_new(struct gb *b);
void gb_rule_set(struct gb *b, int rule, struct frag body);
struct frag gb_call_frag(struct gb *b, int rule);

/* x{min,max} (max < 0: unbounded): gen makes a fresh copy of x each time it is called. */
typedef struct frag (*gb_gen_fn)(struct gb *b, const void *ctx);
struct frag gb_repeat(struct gb *b, gb_gen_fn gen, const void *ctx, int min, int max);

/* A set of Unicode code point ranges [lo, hi] as UTF-8 (surrogates excluded). */
struct cp_range {
    uint32_t lo, hi;
};
struct frag gb_codepoints(struct gb *b, const struct cp_range *r, int n);

/* grammar_frag.c, over x: a byte NFA without calls whose states and edges are the builder's
 * from s0 and e0 on (just built). gb_length: x's strings of min to max characters (max < 0: no
 * upper bound), or x itself when its strings already have such lengths. gb_frag_takes: 1 when
 * x takes the whole of str, 0 when not, -1 when x has calls (or memory ran out). */
struct frag gb_length(struct gb *b, struct frag x, int s0, int e0, int min, int max);
int gb_frag_takes(struct gb *b, struct frag x, int s0, int e0, const char *str, size_t len);
/* x's strings other than strs[0..n) (a product of x with their trie). */
/* Free text (any bytes) that never contains `tag` (up to 31 bytes), whose end (e) may finish
 * the rule, and a path that leaves it at `tag`'s last byte to state `after` (a KMP automaton
 * over bytes). */
struct frag gb_text_until(struct gb *b, const char *tag, int after);
struct frag gb_exclude(struct gb *b, struct frag x, int s0, int e0, const char *const *strs,
                       const size_t *lens, int n);

/* grammar_regex.c: the regex subset. json_safe: match only characters a JSON string holds
 * unescaped (no '"', '\\' or control characters), for JSON Schema's pattern and formats. */
struct frag gb_regex(struct gb *b, const char *re, size_t len, bool json_safe);

/* json_number.c: JSON numbers of at most JN_DIGITS integer and JN_DIGITS fraction digits.
 * jn_number: any (an exponent too, unless integer); jn_int_range: the integers in [lo, hi]
 * (|lo|, |hi| <= JN_MAX); jn_decimal_range: exactly the numbers between lo and hi (each
 * exclusive where it says; none has an exponent or is written "-0") written with at most
 * max_frac fraction digits, or an error code with *why (bounds of more digits:
 * QERR_UNSUPPORTED; nothing between them: QERR_INVALID); jn_int_multiples: the multiples of
 * k >= 2 in [l, h], listed when fewer than JN_LIST_MAX, else for a power of ten only;
 * jn_power_of_ten: m where d = 10^m exactly (m in [-JN_DIGITS, JN_DIGITS)), else INT32_MIN. */
#define JN_DIGITS   15
#define JN_MAX      999999999999999ull /* JN_DIGITS nines */
#define JN_LIST_MAX 4096
struct frag jn_number(struct gb *b, bool integer);
struct frag jn_int_range(struct gb *b, int64_t lo, int64_t hi);
int jn_decimal_range(struct gb *b, double lo, bool lo_ex, double hi, bool hi_ex, int max_frac,
                     struct frag *out, const char **why);
int jn_int_multiples(struct gb *b, int64_t l, int64_t h, int64_t k, struct frag *out,
                     const char **why);
int jn_power_of_ten(double d);
/* The multiples of d (a decimal of up to 6 fraction digits) between lo and hi, listed when
 * fewer than JN_LIST_MAX, each in its shortest writing; else QERR_UNSUPPORTED. */
int jn_decimal_multiples(struct gb *b, double lo, bool lo_ex, double hi, bool hi_ex, double d,
                         struct frag *out, const char **why);

/* json_schema.c (and json_schema_*.c: json_schema_impl.h) */
/* free_max: the characters a string is written in at most, whatever larger maxLength it has
 * (JS_FREE_MAX at first; a schema too large for the automaton is tried again with it halved,
 * down to JS_FREE_MIN); *cut says whether some string's maxLength is above JS_FREE_MIN, so
 * that a smaller free_max would cut it. */
#define JS_FREE_MAX 500
#define JS_FREE_MIN 32
struct frag gb_json_schema(struct gb *b, const char *text, size_t len, int free_max, bool *cut);
struct frag gb_json_any_object(struct gb *b);
/* grammar_tools.c */
struct frag gb_tool_calls(struct gb *b, const char *text, size_t len);
/* grammar_gbnf.c: makes rule 0 (the root) and what it calls */
struct frag gb_gbnf(struct gb *b, const char *text, size_t len);

/* ---- the compiled grammar ---- */

enum {
    GS_FINAL = 1, /* the rule may end here */
    GS_BYTES = 2, /* some byte moves on */
    GS_CALLS = 4, /* some call edge leaves */
};

struct gcall {
    int32_t rule, ret;
};

struct gmask_entry; /* grammar_match.c */

struct grammar {
    atomic_int refs;
    int n_states;
    int32_t *next; /* [n_states][256]: next state, -1 dead */
    uint8_t *flags;
    int32_t *call_off; /* [n_states + 1] into calls */
    struct gcall *calls;
    int32_t *rule_of; /* [n_states] */
    int n_rules;
    int32_t *rule_start; /* [n_rules] DFA start state; rule 0 is the root */
    /* the token-mask cache: per state, filled lazily by the engine thread */
    struct gmask_entry **cache; /* [n_states] */
    const struct grammar_vocab *cache_vocab;
    bool tool_markers; /* a tool-call grammar: the vocabulary's markers may spell its bytes */
};

/* grammar_dfa.c: determinizes every rule of b into g (b must have no error). */
int grammar_from_nfa(struct gb *b, struct grammar *g, struct qerr *err);
void grammar_masks_clear(struct grammar *g);

/* ---- the vocabulary trie (grammar_vocab.c) ---- */

struct gv_node {
    int32_t end;   /* preorder index past this node's subtree */
    int32_t first; /* index in sorted[] of the first token in this subtree */
    uint16_t depth;
    uint8_t byte;
    uint8_t n_exact; /* tokens (from first) whose bytes end exactly here */
};

struct grammar_vocab {
    int vocab, words;
    int n_nodes;
    struct gv_node *nodes; /* preorder; nodes[n_nodes].first == n_sorted */
    /* the same split by field, for the walk's inner loop */
    uint8_t *n_byte, *n_depth;
    int32_t *n_end;
    int32_t *sorted; /* token ids by their bytes */
    int n_sorted;
    int max_len;
    char **bytes; /* [vocab] raw bytes of each token, NULL for excluded ones */
    uint16_t *len;
    uint64_t *eog; /* [words] end-of-generation tokens */
    /* [words] tool-call markers: control tokens in the trie by their text ("[TOOL_CALLS]"),
     * allowed only by grammars with tool_markers set */
    uint64_t *marker;
    int n_marker;
};

#endif
