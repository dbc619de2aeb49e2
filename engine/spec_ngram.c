/* The n-gram (prompt lookup) drafter and the adaptive draft length (spec.h). */
#include "spec.h"

#include <string.h>

#include "spec_history.h"

int spec_mode_parse(const char *text, enum spec_mode *out, struct qerr *err)
{
    if (strcmp(text, "off") == 0)
        *out = SPEC_OFF;
    else if (strcmp(text, "ngram") == 0)
        *out = SPEC_NGRAM;
    else if (strcmp(text, "draft") == 0)
        *out = SPEC_DRAFT;
    else
        return qerr_set(err, QERR_INVALID, "spec: '%s' is not one of off, ngram, draft", text);
    return 0;
}

const char *spec_mode_name(enum spec_mode m)
{
    switch (m) {
    case SPEC_OFF:
        return "off";
    case SPEC_NGRAM:
        return "ngram";
    case SPEC_DRAFT:
        return "draft";
    }
    return "unknown";
}

void spec_drafter_init(struct spec_drafter *d, enum spec_mode mode)
{
    /* 1-grams match nearly anywhere in real text and mostly guess wrong; past 4 tokens a
     * longer match rarely changes the continuation found */
    *d = (struct spec_drafter){.mode = mode, .ngram_min = 2, .ngram_max = 4};
}

/* The start of the most recent earlier occurrence of ctx's last n tokens that has at least one
 * token after it, or -1. */
static int find_ngram(const int32_t *ctx, int len, int n)
{
    const int32_t *tail = ctx + len - n;
    for (int i = len - n - 1; i >= 0; i--)
        if (ctx[i] == tail[0] && memcmp(ctx + i, tail, (size_t)n * sizeof *ctx) == 0) return i;
    return -1;
}

int spec_match_class(int match)
{
    return match <= 0 ? 0 : match <= 3 ? match : match < 8 ? 4 : 5;
}

int spec_draft(const struct spec_drafter *d, const int32_t *ctx, int n, int k, int32_t *out,
               int *match)
{
    if (match) *match = 0;
    if (d->mode != SPEC_NGRAM || k <= 0) return 0;
    if (k > SPEC_K_MAX) k = SPEC_K_MAX;
    for (int g = d->ngram_max; g >= d->ngram_min; g--) {
        if (g >= n) continue;
        int at = find_ngram(ctx, n, g);
        if (at < 0) continue;
        int from = at + g, m = n - from < k ? n - from : k;
        memcpy(out, ctx + from, (size_t)m * sizeof *out);
        /* the match may reach further back than the g tokens searched for */
        int len = g;
        while (len < SPEC_MATCH_MAX && at - (len - g) > 0 &&
               ctx[at - (len - g) - 1] == ctx[n - len - 1])
            len++;
        if (match) *match = len;
        return m;
    }
    return 0;
}

int spec_draft_prediction(const struct spec_drafter *d, const int32_t *pred, int n_pred,
                          const int32_t *out, int n_out, int k, int32_t *dst, int *match)
{
    *match = 0;
    if (k <= 0 || n_pred <= 0) return 0;
    if (k > SPEC_K_MAX) k = SPEC_K_MAX;
    int at = -1, len = 0;
    if (n_out == 0) {
        at = 0; /* nothing out yet: the prediction's start */
        len = SPEC_MATCH_MAX;
    }
    for (int g = d->ngram_max; at < 0 && g >= d->ngram_min; g--) {
        if (g > n_out) continue;
        const int32_t *tail = out + n_out - g;
        /* of the places the output's last g tokens occur (with a token after them), the one
         * nearest where an unedited copy would be: the output's own length */
        int best = -1, best_dist = 0;
        for (int j = 0; j + g < n_pred; j++) {
            if (pred[j] != tail[0] || memcmp(pred + j, tail, (size_t)g * sizeof *pred)) continue;
            int dist = j + g > n_out ? j + g - n_out : n_out - (j + g);
            if (best < 0 || dist < best_dist) best = j + g, best_dist = dist;
        }
        if (best >= 0) at = best, len = g;
    }
    if (at < 0) return 0;
    int m = n_pred - at < k ? n_pred - at : k;
    memcpy(dst, pred + at, (size_t)m * sizeof *dst);
    *match = len;
    return m;
}

int spec_draft_classed(const struct spec_drafter *d, const int32_t *ctx, int n, int k, int32_t *out,
                       int *cls)
{
    int match = 0, m = spec_draft(d, ctx, n, k, out, &match);
    *cls = spec_match_class(match);
    if (m > 0 || !d->history || d->mode != SPEC_NGRAM || k <= 0) return m;
    m = spec_history_draft(d->history, ctx, n, k < SPEC_K_MAX ? k : SPEC_K_MAX, out, NULL);
    if (m > 0) *cls = SPEC_CLASS_HISTORY;
    return m;
}

void spec_state_init(struct spec_state *st, int k_max)
{
    *st = (struct spec_state){.k = k_max > 0 ? k_max : 1};
}

int spec_state_next_k(struct spec_state *st)
{
    if (st->cooldown > 0) {
        st->cooldown--;
        return 0;
    }
    return st->k;
}

void spec_state_update(struct spec_state *st, int drafted, int accepted, int k_max)
{
    if (drafted <= 0) return;
    if (accepted == drafted) {
        st->k = st->k * 2 < k_max ? st->k * 2 : k_max;
        st->misses = 0;
        return;
    }
    st->k = accepted + 1 < k_max ? accepted + 1 : k_max;
    if (accepted > 0) {
        st->misses = 0;
        return;
    }
    st->misses++;
    st->cooldown = st->misses < 5 ? 1 << (st->misses - 1) : 16;
}
