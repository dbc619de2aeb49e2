/* fuzz_detok: the streaming detokenizer and the stop-string hold-back, as the engine runs them
 * per generated token (engine/engine.c seq_advance, with engine/stop_match.c).
 *
 * Input: byte 0: bit 0 the tokenizer (the real model's BPE or the SentencePiece one), bit 1
 * skip_control, bits 2-4 the number of stop strings; then each stop string as a length byte
 * (1..16) and its bytes; the rest, two bytes per token, the ids (modulo the vocabulary).
 * Checked against a plain reference over the whole text: every piece detok_push gives is valid
 * UTF-8, and so is every piece the hold-back lets out; what is let out is exactly the text up
 * to the earliest stop string in the text at the first token that completes one (all of it,
 * flushed, when none does); detok_flush's tail completes tokenizer_decode_opt's text. As in the
 * engine, the flushed tail (U+FFFD for a cut sequence) is not searched for stop strings. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/stop_match.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct buf {
    char *p;
    int n, cap;
};

static void put(struct buf *b, const char *s, int n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, (size_t)b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    b->p[b->n] = 0;
}

/* The hold-back of one sequence after a token: the engine's find_stop / stop_prefix_suffix. */
static bool hold_step(struct buf *hold, struct buf *out, char *const *stops, int n_stops)
{
    int cut = n_stops ? stop_find(hold->p, hold->n, stops, n_stops) : -1;
    if (cut >= 0) hold->n = cut;
    int keep = cut < 0 && n_stops ? stop_partial_suffix(hold->p, hold->n, stops, n_stops) : 0;
    int emit = hold->n - keep;
    if (emit < 0 || keep < 0) __builtin_trap();
    if (!fuzz_utf8_valid(hold->p, (size_t)emit)) __builtin_trap();
    put(out, hold->p, emit);
    memmove(hold->p, hold->p + emit, (size_t)keep);
    hold->n = keep;
    return cut >= 0;
}

/* The reference: the earliest start of any stop string in text[0..n), or -1. */
static int first_stop(const char *text, int n, char *const *stops, int n_stops)
{
    int best = -1;
    for (int k = 0; k < n_stops; k++)
        for (int i = 0; i + (int)strlen(stops[k]) <= n; i++)
            if (!memcmp(text + i, stops[k], strlen(stops[k]))) {
                if (best < 0 || i < best) best = i;
                break;
            }
    return best;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const struct tokenizer *t = data[0] & 1 ? fuzz_spm() : fuzz_bpe();
    bool skip_control = data[0] & 2;
    int want_stops = (data[0] >> 2) & 7;
    size_t at = 1;
    char *stops[8];
    int n_stops = 0;
    while (n_stops < want_stops && at < size) {
        size_t len = data[at] % 16 + 1;
        if (at + 1 + len > size) break;
        /* the API takes stop strings from JSON: non-empty valid UTF-8 without NUL */
        if (!fuzz_utf8_valid((const char *)data + at + 1, len) || memchr(data + at + 1, 0, len))
            break;
        stops[n_stops] = strndup((const char *)data + at + 1, len);
        if (!stops[n_stops]) abort();
        n_stops++;
        at += 1 + len;
    }
    size_t n_ids = (size - at) / 2;
    int32_t *ids = malloc((n_ids + 1) * sizeof *ids);
    if (!ids) abort();
    int32_t vocab = tokenizer_vocab_size(t);
    for (size_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)((data[at + 2 * i] | data[at + 2 * i + 1] << 8) % vocab);

    struct detok d;
    detok_init(&d);
    d.skip_control = skip_control;
    struct buf full = {0}, hold = {0}, out = {0};
    put(&full, "", 0);
    put(&hold, "", 0);
    put(&out, "", 0);
    char piece[2048]; /* the engine's buffer */
    if (3 * tokenizer_max_token_bytes(t) + 16 > sizeof piece) __builtin_trap();
    bool stopped = false;
    int expect_cut = -1;
    for (size_t i = 0; i < n_ids && !stopped; i++) {
        int n = detok_push(&d, t, ids[i], piece, sizeof piece);
        if (n < 0 || (size_t)n >= sizeof piece || piece[n] != 0) __builtin_trap();
        if (!fuzz_utf8_valid(piece, (size_t)n)) __builtin_trap();
        put(&full, piece, n);
        put(&hold, piece, n);
        stopped = hold_step(&hold, &out, stops, n_stops);
        expect_cut = first_stop(full.p, full.n, stops, n_stops);
        if (stopped != (expect_cut >= 0)) __builtin_trap();
    }
    if (!stopped) {
        char tail[16];
        int n = detok_flush(&d, tail, sizeof tail);
        if (n < 0 || !fuzz_utf8_valid(tail, (size_t)n)) __builtin_trap();
        /* the end of the stream (seq_finish): what is held goes out with the flushed tail */
        put(&full, tail, n);
        put(&out, hold.p, hold.n);
        put(&out, tail, n);
        expect_cut = -1;
        /* the whole decode, when nothing stopped it early */
        char *whole = tokenizer_decode_opt(t, ids, n_ids, skip_control);
        if (!whole) abort();
        if (!memchr(full.p, 0, (size_t)full.n) && strcmp(whole, full.p) != 0) __builtin_trap();
        free(whole);
    }
    int want = expect_cut >= 0 ? expect_cut : full.n;
    if (out.n != want || memcmp(out.p, full.p, (size_t)want) != 0) __builtin_trap();
    for (int k = 0; k < n_stops; k++) free(stops[k]);
    free(full.p);
    free(hold.p);
    free(out.p);
    free(ids);
    return 0;
}
