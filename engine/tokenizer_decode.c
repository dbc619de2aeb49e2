/* tokenizer_decode: token ids back to text, whole or streamed.
 *
 * Every token's bytes were computed at load (tokenizer.c, build_bytes), so decoding is copying.
 * The streaming decoder keeps at most 3 bytes: the valid prefix of a UTF-8 sequence that the
 * next token may finish. Anything that cannot become valid is replaced by one U+FFFD per
 * maximal subpart, so every piece it returns is valid UTF-8 on its own. */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "utf8.h"

static const char k_fffd[] = "\xef\xbf\xbd";

int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_vocab) return -1;
    size_t n = t->bytes_off[id + 1] - t->bytes_off[id];
    memcpy(buf, t->bytes + t->bytes_off[id], n < cap ? n : cap);
    return (int)n;
}

size_t tokenizer_max_token_bytes(const struct tokenizer *t)
{
    return t->max_token_bytes;
}

void detok_init(struct detok *d)
{
    memset(d, 0, sizeof *d);
}

struct sink {
    char *out;
    size_t cap, n; /* cap excludes the terminating NUL */
    bool full;
};

static void sink_put(struct sink *s, const void *p, size_t n)
{
    if (s->full || s->n + n > s->cap) {
        s->full = true;
        return;
    }
    memcpy(s->out + s->n, p, n);
    s->n += n;
}

/* Emits what the pending bytes already decide: complete sequences and invalid subparts. */
static void settle(struct detok *d, struct sink *s)
{
    while (d->n_pending > 0) {
        uint32_t cp;
        int r = utf8_next(d->pending, (size_t)d->n_pending, &cp);
        if (r == 0) return; /* a valid prefix: wait for more */
        int k = r > 0 ? r : -r;
        if (r > 0)
            sink_put(s, d->pending, (size_t)r);
        else
            sink_put(s, k_fffd, 3);
        memmove(d->pending, d->pending + k, (size_t)(d->n_pending - k));
        d->n_pending -= k;
    }
}

static int finish(struct sink *s, struct detok *d, const struct detok *saved)
{
    if (s->full) {
        *d = *saved;
        s->out[0] = '\0';
        return QERR_FULL;
    }
    s->out[s->n] = '\0';
    return (int)s->n;
}

int detok_push(struct detok *d, const struct tokenizer *t, int32_t id, char *out, size_t cap)
{
    if (!out || cap == 0 || cap > INT32_MAX) return QERR_INVALID;
    out[0] = '\0';
    if (id < 0 || id >= t->n_vocab) return QERR_INVALID;
    if (d->skip_control && t->type[id] == TOK_TYPE_CONTROL &&
        !(d->keep_tool_markers && tokenizer_is_tool_marker(t, id)))
        return 0;
    struct detok saved = *d;
    struct sink s = {out, cap - 1, 0, false};
    const unsigned char *p = (const unsigned char *)t->bytes + t->bytes_off[id];
    size_t n = t->bytes_off[id + 1] - t->bytes_off[id];
    for (size_t i = 0; i < n && !s.full; i++) {
        if (d->n_pending == 0) { /* copy the run of whole sequences at once */
            size_t j = i + utf8_check((const char *)p + i, n - i);
            if (j > i) {
                sink_put(&s, p + i, j - i);
                i = j - 1;
                continue;
            }
        }
        d->pending[d->n_pending++] = p[i];
        settle(d, &s);
    }
    return finish(&s, d, &saved);
}

int detok_flush(struct detok *d, char *out, size_t cap)
{
    if (!out || cap == 0 || cap > INT32_MAX) return QERR_INVALID;
    struct detok saved = *d;
    struct sink s = {out, cap - 1, 0, false};
    while (d->n_pending > 0) {
        uint32_t cp;
        int r = utf8_next(d->pending, (size_t)d->n_pending, &cp);
        int k = r == 0 ? d->n_pending : (r > 0 ? r : -r);
        if (r > 0)
            sink_put(&s, d->pending, (size_t)k);
        else
            sink_put(&s, k_fffd, 3);
        memmove(d->pending, d->pending + k, (size_t)(d->n_pending - k));
        d->n_pending -= k;
    }
    return finish(&s, d, &saved);
}

bool tokenizer_is_control(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->type[id] == TOK_TYPE_CONTROL;
}

char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n)
{
    return tokenizer_decode_opt(t, ids, n, false);
}

char *tokenizer_decode_opt(const struct tokenizer *t, const int32_t *ids, size_t n,
                           bool skip_control)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_vocab)
            total += t->bytes_off[ids[i] + 1] - t->bytes_off[ids[i]];
    /* each byte becomes at most one U+FFFD, plus one for what the end leaves pending */
    size_t cap = 3 * total + 4;
    char *out = malloc(cap);
    if (!out) return NULL;
    struct detok d;
    detok_init(&d);
    struct sink s = {out, cap - 1, 0, false};
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) continue; /* not a token: nothing to show */
        if (skip_control && t->type[ids[i]] == TOK_TYPE_CONTROL) continue;
        const unsigned char *p = (const unsigned char *)t->bytes + t->bytes_off[ids[i]];
        size_t m = t->bytes_off[ids[i] + 1] - t->bytes_off[ids[i]];
        for (size_t j = 0; j < m; j++) {
            d.pending[d.n_pending++] = p[j];
            settle(&d, &s);
        }
    }
    int r = detok_flush(&d, out + s.n, cap - s.n);
    if (r < 0) { /* cannot happen: cap is the worst case */
        free(out);
        return NULL;
    }
    return out;
}
