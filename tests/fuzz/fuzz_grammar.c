/* fuzz_grammar: a client's grammar (JSON Schema, JSON object, regex, choice, tool calls, GBNF)
 * compiled and then walked token by token, as the engine walks it while it samples and
 * speculates: grammar_matcher_mask, _forced, _allowed_run and _accept at every position.
 *
 * The first byte picks the grammar kind (its value mod 6) and, with bit 7, the real model's
 * vocabulary instead of a small made-up one (every single byte plus common JSON pieces, so
 * masks are cheap and every string has a spelling). The grammar's text runs to the first NUL;
 * the bytes after it steer the walk. Checked at each position:
 * - the end-of-generation token is allowed exactly when the output so far is whole, and alone
 *   when nothing can follow;
 * - every allowed token agrees with the forced bytes as far as both go, and nothing is forced
 *   where the output may end;
 * - allowed_run on a run of tokens (the first an allowed one, the rest the walk's guesses)
 *   counts exactly the tokens that accept then takes one after another, each of which the mask
 *   allowed, and neither allowed_run nor forced moves the position;
 * - the mask allows exactly what accept takes, also near the grammar's depth cap (where an
 *   accepted token may still lead to a dead end: the next rule's call no longer fits). */
#include <stdlib.h>
#include <string.h>

#include "../../engine/grammar.h"
#include "../../engine/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_STEPS = 48, MAX_RUN = 4, FORCED_CAP = 64 };

static const char *const pieces[] = {
    "{\"",
    "\":",
    "\":\"",
    "\",\"",
    "\"}",
    "\"},",
    "},{\"",
    "[{\"",
    " \"",
    ": ",
    ", ",
    "true",
    "false",
    "null",
    "name",
    "nam",
    "ame",
    "\"name\":\"",
    "12",
    "123",
    "-1",
    "0.5",
    "e+",
    "\\n",
    "\\u00",
    "abc",
    "  ",
    "\n",
    "apple",
    "ap",
    "ricot",
    "\"]",
    "]}",
    "\"x\":",
    "{\"x\":{\"y\":",
    "<tool_call>",
    "[TOOL_CALLS]",
    "\"arguments\":",
    "\"name\": \"",
    "1e5",
    "\xc3\xa9",
    "\xe2\x82",
};
enum { N_PIECES = sizeof pieces / sizeof pieces[0] };

struct vocab_view {
    struct grammar_vocab *v;
    const struct tokenizer *tok; /* NULL: the made-up vocabulary below */
    const char *bytes[256 + N_PIECES + 1];
    size_t len[256 + N_PIECES + 1];
    char singles[256];
    int n;
};

/* The made-up vocabulary (ids 0-255 the single bytes, then the pieces, then end of generation)
 * and the real model's, each built once (see fuzz_util.h on statics in harnesses). */
static const struct vocab_view *made_up(void)
{
    static struct vocab_view w;
    if (w.v) return &w;
    for (int b = 0; b < 256; b++) {
        w.singles[b] = (char)b;
        w.bytes[b] = &w.singles[b];
        w.len[b] = 1;
    }
    for (int i = 0; i < N_PIECES; i++) {
        w.bytes[256 + i] = pieces[i];
        w.len[256 + i] = strlen(pieces[i]);
    }
    w.n = 256 + N_PIECES + 1;
    struct qerr err = {0};
    if (grammar_vocab_create_raw(w.n, w.bytes, w.len, w.n - 1, &w.v, &err)) abort();
    return &w;
}

static const struct vocab_view *real(void)
{
    static struct vocab_view w;
    if (w.v) return &w;
    w.tok = fuzz_bpe();
    w.n = tokenizer_vocab_size(w.tok);
    struct qerr err = {0};
    if (grammar_vocab_create(w.tok, w.n, &w.v, &err)) abort();
    return &w;
}

static int token_bytes(const struct vocab_view *w, int32_t t, char *buf, int cap)
{
    if (!w->tok) {
        int n = (int)w->len[t] < cap ? (int)w->len[t] : cap;
        if (w->bytes[t]) memcpy(buf, w->bytes[t], (size_t)n);
        return w->bytes[t] ? (int)w->len[t] : 0;
    }
    return tokenizer_token_bytes(w->tok, t, buf, (size_t)cap);
}

static bool has(const uint64_t *mask, int32_t t)
{
    return mask[t / 64] >> (t % 64) & 1;
}

/* The k-th allowed token (k taken mod how many there are). */
static int32_t nth_allowed(const uint64_t *mask, int words, int n_allowed, unsigned k)
{
    k %= (unsigned)n_allowed;
    for (int wd = 0; wd < words; wd++)
        for (uint64_t x = mask[wd]; x; x &= x - 1)
            if (k-- == 0) return wd * 64 + __builtin_ctzll(x);
    __builtin_trap();
}

/* One position's checks; returns false when the walk must stop (a dead end, or out of
 * memory, which a harness cannot tell from a bug here). */
static bool check_position(const struct vocab_view *w, struct grammar_matcher *m, uint64_t *mask,
                           int *n_allowed)
{
    int words = grammar_mask_words(w->v);
    int n = grammar_matcher_mask(m, mask);
    *n_allowed = n;
    if (n <= 0) return false;
    for (int t = w->n; t < words * 64; t++)
        if (has(mask, t)) __builtin_trap(); /* past the vocabulary */
    bool whole = grammar_matcher_accepting(m), eog = false;
    for (int wd = 0; wd < words; wd++)
        for (uint64_t x = mask[wd]; x; x &= x - 1)
            eog |= grammar_vocab_is_eog(w->v, wd * 64 + __builtin_ctzll(x));
    if (eog != whole) __builtin_trap();
    if (grammar_matcher_done(m) && (!whole || (!w->tok && n != 1))) __builtin_trap();

    char forced[FORCED_CAP], again[FORCED_CAP], tb[256];
    int nf = grammar_matcher_forced(m, forced, FORCED_CAP);
    if (nf < 0 || nf > FORCED_CAP || (nf > 0 && whole)) __builtin_trap();
    for (int wd = 0; wd < words && nf > 0; wd++)
        for (uint64_t x = mask[wd]; x; x &= x - 1) {
            int32_t t = wd * 64 + __builtin_ctzll(x);
            int tl = token_bytes(w, t, tb, (int)sizeof tb);
            int common = tl < nf ? tl : nf;
            if (common > (int)sizeof tb) common = (int)sizeof tb;
            if (memcmp(tb, forced, (size_t)common)) __builtin_trap();
        }
    if (grammar_matcher_forced(m, again, FORCED_CAP) != nf || memcmp(again, forced, (size_t)nf))
        __builtin_trap();
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const enum grammar_kind kinds[] = {GRAMMAR_JSON_SCHEMA, GRAMMAR_JSON_OBJECT,
                                              GRAMMAR_REGEX,       GRAMMAR_CHOICE,
                                              GRAMMAR_TOOL_CALLS,  GRAMMAR_GBNF};
    enum grammar_kind kind = kinds[(data[0] & 0x7f) % 6];
    const struct vocab_view *w = data[0] & 0x80 ? real() : made_up();
    const char *text = (const char *)data + 1;
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t len = nul ? (size_t)(nul - (data + 1)) : size - 1;
    const uint8_t *walk = nul ? nul + 1 : data + size, *end = data + size;

    struct grammar *g = NULL;
    struct qerr err = {0};
    if (grammar_compile(kind, text, len, &g, &err)) {
        if (!err.msg[0]) __builtin_trap(); /* a refusal names its reason */
        return 0;
    }
    struct grammar_matcher *m;
    if (grammar_matcher_create(g, w->v, &m, &err)) {
        grammar_unref(g);
        return 0;
    }
    int words = grammar_mask_words(w->v);
    uint64_t *mask = malloc((size_t)words * sizeof *mask);
    if (!mask) abort();
    bool ended = false;
    for (int step = 0; step < MAX_STEPS && walk + 2 <= end && !ended; step++) {
        int n_allowed;
        if (!check_position(w, m, mask, &n_allowed)) {
            break; /* a dead end; below 0: out of memory, or more stacks than it holds */
        }
        /* a run: an allowed token first, then the walk's guesses (allowed ones or any id) */
        int32_t run[MAX_RUN];
        int r = 1 + walk[0] % MAX_RUN;
        run[0] = nth_allowed(mask, words, n_allowed, walk[1]);
        walk += 2;
        for (int i = 1; i < r; i++) {
            if (walk + 2 > end) {
                r = i;
                break;
            }
            run[i] = walk[0] & 1
                         ? (int32_t)((walk[0] >> 1 | (unsigned)walk[1] << 7) % (unsigned)w->n)
                         : run[0] + (int32_t)(walk[1] % 3) - 1;
            if (run[i] < 0 || run[i] >= w->n) run[i] = run[0];
            walk += 2;
        }
        char before[FORCED_CAP], after[FORCED_CAP];
        int nb = grammar_matcher_forced(m, before, FORCED_CAP);
        int ar = grammar_matcher_allowed_run(m, run, r);
        if (ar < 1 || ar > r) __builtin_trap(); /* run[0] was allowed */
        if (grammar_matcher_forced(m, after, FORCED_CAP) != nb || memcmp(after, before, (size_t)nb))
            __builtin_trap(); /* allowed_run moved the position */
        for (int i = 0; i < r; i++) {
            if (i > 0 && !check_position(w, m, mask, &n_allowed)) {
                if (n_allowed == 0 && i < ar) __builtin_trap();
                break;
            }
            bool allowed = has(mask, run[i]), eog = grammar_vocab_is_eog(w->v, run[i]);
            struct qerr aerr = {0};
            int rc = grammar_matcher_accept(m, run[i], &aerr);
            if ((rc == 0) != allowed || (rc == 0) != (i < ar)) __builtin_trap();
            if (rc) {
                if (!aerr.msg[0]) __builtin_trap();
                break;
            }
            if (eog) {
                ended = true;
                break;
            }
        }
    }
    free(mask);
    grammar_matcher_free(m);
    grammar_unref(g);
    return 0;
}
