/* The answers of earlier requests as an n-gram drafter's source (spec_history.h). */
#include "spec_history.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "spec.h"

#define SEPARATOR (-1)
/* index slots per ring token: three n-gram lengths per position, at a load that leaves most of
 * the recent ones in place (a collision overwrites an older entry; lookups check the tokens) */
#define SLOTS_PER_TOKEN 4

int spec_history_init(struct spec_history *h, long tokens, struct qerr *err)
{
    *h = (struct spec_history){0};
    if (tokens <= 0) return 0;
    if (tokens > (1L << 26))
        return qerr_set(err, QERR_INVALID, "spec-history: %ld tokens is more than %ld", tokens,
                        1L << 26);
    uint64_t cap = 1024;
    while (cap < (uint64_t)tokens) cap <<= 1;
    h->ring = malloc(cap * sizeof *h->ring);
    h->slot = calloc(cap * SLOTS_PER_TOKEN, sizeof *h->slot);
    if (!h->ring || !h->slot) {
        spec_history_free(h);
        return qerr_set(err, QERR_NOMEM, "spec-history: out of memory for %llu tokens",
                        (unsigned long long)cap);
    }
    h->cap = cap;
    h->n_slots = cap * SLOTS_PER_TOKEN;
    return 0;
}

void spec_history_free(struct spec_history *h)
{
    free(h->ring);
    free(h->slot);
    *h = (struct spec_history){0};
}

static uint64_t *slot_of(const struct spec_history *h, const int32_t *gram, int g)
{
    return &h->slot[XXH64(gram, (size_t)g * sizeof *gram, (uint64_t)g) & (h->n_slots - 1)];
}

static int32_t at(const struct spec_history *h, uint64_t pos)
{
    return h->ring[pos & (h->cap - 1)];
}

/* Whether position pos is still in the ring. */
static bool held(const struct spec_history *h, uint64_t pos)
{
    return pos < h->head && h->head - pos <= h->cap;
}

void spec_history_add(struct spec_history *h, const int32_t *tokens, int n)
{
    if (!h->cap || n <= 0) return;
    /* an answer longer than the ring keeps its end */
    if ((uint64_t)n >= h->cap) {
        tokens += (uint64_t)n - (h->cap - 1);
        n = (int)(h->cap - 1);
    }
    uint64_t p0 = h->head;
    for (int i = 0; i < n; i++) h->ring[(p0 + (uint64_t)i) & (h->cap - 1)] = tokens[i];
    h->ring[(p0 + (uint64_t)n) & (h->cap - 1)] = SEPARATOR;
    h->head = p0 + (uint64_t)n + 1;
    /* every n-gram of the answer with a token after it: later ones overwrite earlier ones, so
     * a slot keeps the most recent occurrence */
    for (int end = 1; end < n; end++)
        for (int g = SPEC_HISTORY_NMIN; g <= SPEC_HISTORY_NMAX && g <= end; g++)
            *slot_of(h, tokens + end - g, g) = p0 + (uint64_t)end + 1;
}

int spec_history_draft(const struct spec_history *h, const int32_t *ctx, int n, int k, int32_t *out,
                       int *match)
{
    if (match) *match = 0;
    if (!h->cap || k <= 0) return 0;
    for (int g = SPEC_HISTORY_NMAX; g >= SPEC_HISTORY_NMIN; g--) {
        if (g > n) continue;
        const int32_t *tail = ctx + n - g;
        uint64_t s = *slot_of(h, tail, g);
        if (!s) continue;
        uint64_t after = s - 1;
        /* the slot may be another n-gram's (a collision) or point at overwritten tokens */
        if (after < (uint64_t)g || !held(h, after - (uint64_t)g) || !held(h, after)) continue;
        bool same = true;
        for (int i = 0; i < g && same; i++) same = at(h, after - (uint64_t)(g - i)) == tail[i];
        if (!same || at(h, after) == SEPARATOR) continue;
        int m = 0;
        for (uint64_t p = after; m < k && held(h, p) && at(h, p) != SEPARATOR; p++)
            out[m++] = at(h, p);
        if (match) {
            int len = g;
            while (len < SPEC_MATCH_MAX && len < n && after > (uint64_t)len &&
                   held(h, after - (uint64_t)len - 1) &&
                   at(h, after - (uint64_t)len - 1) == ctx[n - len - 1])
                len++;
            *match = len;
        }
        return m;
    }
    return 0;
}
