/* tokenizer_spm: SentencePiece BPE ("llama" vocabularies), after llama.cpp's
 * llm_tokenizer_spm_session.
 *
 * DESIGN. Spaces become U+2581 (and a fragment may get one in front, see tokenizer.c); the text
 * starts as one symbol per character, and the adjacent pair whose concatenation is the
 * vocabulary entry with the highest score (leftmost on ties) is merged until no pair forms a
 * token. A symbol that is not a token at the end (an unmergeable character) falls back to its
 * <0xNN> byte tokens, or to the unknown token when the vocabulary has no byte tokens. */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "utf8.h"

static const char k_space[] = "\xe2\x96\x81"; /* U+2581 LOWER ONE EIGHTH BLOCK */

size_t tok_spm_unescape(const char *s, size_t len, char *out)
{
    size_t m = 0;
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && memcmp(s + i, k_space, 3) == 0) {
            out[m++] = ' ';
            i += 3;
        } else {
            out[m++] = s[i++];
        }
    }
    return m;
}

struct spm_sym {
    uint32_t start, n; /* bytes in w->buf; n == 0 once merged away */
    int32_t prev, next;
};

struct spm_cand {
    float score;
    int32_t left, right;
    uint32_t size;
};

static bool cand_before(const struct spm_cand *a, const struct spm_cand *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct spm_cand *h, size_t *n, struct spm_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_before(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct spm_cand heap_pop(struct spm_cand *h, size_t *n)
{
    struct spm_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&h[c + 1], &h[c])) c++;
        if (!cand_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const struct tokenizer *t, const char *buf, const struct spm_sym *sym,
                     int32_t l, int32_t r, struct spm_cand *h, size_t *nh)
{
    if (l < 0 || r < 0) return;
    uint32_t size = sym[l].n + sym[r].n;
    int32_t id = tok_vocab_find(t, buf + sym[l].start, size);
    if (id < 0) return;
    heap_push(h, nh, (struct spm_cand){t->score[id], l, r, size});
}

int tok_spm_encode(const struct tokenizer *t, struct tok_work *w, const char *s, size_t len,
                   bool space_prefix, struct tok_ids *out, struct qerr *err)
{
    /* escaped text: every byte grows to at most 3 */
    size_t cap = 3 * (len + 1);
    if (tok_grow((void **)&w->buf, &w->cap_buf, cap, 1)) goto nomem;
    char *buf = w->buf;
    size_t m = 0;
    if (space_prefix) {
        memcpy(buf, k_space, 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(buf + m, k_space, 3);
            m += 3;
        } else {
            buf[m++] = s[i];
        }
    }
    if (m == 0) return 0;

    if (tok_grow(&w->sym, &w->cap_sym, m, sizeof(struct spm_sym)) ||
        tok_grow(&w->heap, &w->cap_heap, 3 * m, sizeof(struct spm_cand)))
        goto nomem;
    struct spm_sym *sym = w->sym;
    struct spm_cand *h = w->heap;
    int32_t ns = 0;
    for (size_t i = 0; i < m;) {
        uint32_t cp;
        int r = utf8_next((const unsigned char *)buf + i, m - i, &cp);
        size_t n = r > 0 ? (size_t)r : 1; /* the input was validated: r > 0 */
        sym[ns] = (struct spm_sym){(uint32_t)i, (uint32_t)n, ns - 1, -1};
        if (ns > 0) sym[ns - 1].next = ns;
        ns++;
        i += n;
    }
    size_t nh = 0;
    for (int32_t i = 1; i < ns; i++) try_pair(t, buf, sym, i - 1, i, h, &nh);

    while (nh) {
        struct spm_cand c = heap_pop(h, &nh);
        struct spm_sym *l = &sym[c.left], *r = &sym[c.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != c.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = c.left;
        try_pair(t, buf, sym, l->prev, c.left, h, &nh);
        try_pair(t, buf, sym, c.left, l->next, h, &nh);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        int32_t id = tok_vocab_find(t, buf + sym[i].start, sym[i].n);
        if (id >= 0) {
            if (tok_ids_push(out, id)) goto nomem;
            continue;
        }
        for (uint32_t j = 0; j < sym[i].n; j++) {
            int32_t b = t->byte_tok[(unsigned char)buf[sym[i].start + j]];
            if (b < 0) b = t->unk;
            if (b >= 0 && tok_ids_push(out, b)) goto nomem;
        }
    }
    return 0;
nomem:
    return qerr_set(err, QERR_NOMEM, "tokenizer_encode: out of memory");
}
