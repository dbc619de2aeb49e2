/* grammar_vocab: the vocabulary as a byte trie in preorder (llguidance's TokTrie layout): each
 * node knows where its subtree ends, so a walk that meets a dead byte skips the whole subtree
 * in one step, and the tokens of any subtree are one contiguous run of the sorted ids. */
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

static int cmp_tok(const void *x, const void *y, void *ctx)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    const struct grammar_vocab *v = ctx;
    size_t la = v->len[a], lb = v->len[b];
    int c = memcmp(v->bytes[a], v->bytes[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return (a > b) - (a < b);
}

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v) return;
    if (v->bytes)
        for (int i = 0; i < v->vocab; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->nodes);
    free(v->n_byte);
    free(v->n_depth);
    free(v->n_end);
    free(v->sorted);
    free(v->eog);
    free(v->marker);
    free(v);
}

/* The trie over v->bytes/len (set for every token to include; v->eog filled). */
static int build_trie(struct grammar_vocab *v, struct qerr *err)
{
    size_t total = 0;
    for (int32_t id = 0; id < v->vocab; id++) {
        if (!v->bytes[id] || !v->len[id]) continue;
        v->sorted[v->n_sorted++] = id;
        total += v->len[id];
        if (v->len[id] > v->max_len) v->max_len = v->len[id];
    }
    qsort_r(v->sorted, (size_t)v->n_sorted, sizeof *v->sorted, cmp_tok, v);
    /* at most one node per byte of every token, plus the sentinel */
    v->nodes = malloc((total + 1) * sizeof *v->nodes);
    int32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path);
    if (!v->nodes || !path) {
        free(path);
        return qerr_set(err, QERR_NOMEM, "out of memory for the vocabulary trie");
    }
    int depth = 0;
    const char *prev = NULL;
    int prev_len = 0;
    for (int k = 0; k < v->n_sorted; k++) {
        int32_t id = v->sorted[k];
        const char *s = v->bytes[id];
        int len = v->len[id];
        int lcp = 0;
        while (lcp < prev_len && lcp < len && prev[lcp] == s[lcp]) lcp++;
        if (lcp == len && len == prev_len) { /* the same bytes as the previous token */
            v->nodes[path[len]].n_exact++;
            continue;
        }
        for (; depth > lcp; depth--) v->nodes[path[depth]].end = v->n_nodes;
        for (int d = lcp + 1; d <= len; d++) {
            struct gv_node *nd = &v->nodes[v->n_nodes];
            *nd = (struct gv_node){.first = k, .depth = (uint16_t)d, .byte = (uint8_t)s[d - 1]};
            path[d] = v->n_nodes++;
        }
        depth = len;
        v->nodes[path[len]].n_exact = 1;
        prev = s;
        prev_len = len;
    }
    for (; depth > 0; depth--) v->nodes[path[depth]].end = v->n_nodes;
    v->nodes[v->n_nodes] = (struct gv_node){.end = v->n_nodes + 1, .first = v->n_sorted};
    free(path);
    if (v->max_len > 255) return qerr_set(err, QERR_UNSUPPORTED, "a token of %d bytes", v->max_len);
    v->n_byte = malloc((size_t)v->n_nodes + 1);
    v->n_depth = malloc((size_t)v->n_nodes + 1);
    v->n_end = malloc(((size_t)v->n_nodes + 1) * sizeof *v->n_end);
    if (!v->n_byte || !v->n_depth || !v->n_end)
        return qerr_set(err, QERR_NOMEM, "out of memory for the vocabulary trie");
    for (int i = 0; i < v->n_nodes; i++) {
        v->n_byte[i] = v->nodes[i].byte;
        v->n_depth[i] = (uint8_t)v->nodes[i].depth;
        v->n_end[i] = v->nodes[i].end;
    }
    return 0;
}

static struct grammar_vocab *vocab_alloc(int vocab)
{
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->vocab = vocab;
    v->words = (vocab + 63) / 64;
    v->bytes = calloc((size_t)vocab, sizeof *v->bytes);
    v->len = calloc((size_t)vocab, sizeof *v->len);
    v->sorted = malloc((size_t)vocab * sizeof *v->sorted);
    v->eog = calloc((size_t)v->words, sizeof *v->eog);
    v->marker = calloc((size_t)v->words, sizeof *v->marker);
    if (!v->bytes || !v->len || !v->sorted || !v->eog || !v->marker) {
        grammar_vocab_free(v);
        return NULL;
    }
    return v;
}

int grammar_vocab_create(const struct tokenizer *tok, int n_logits, struct grammar_vocab **out,
                         struct qerr *err)
{
    *out = NULL;
    int nt = tokenizer_vocab_size(tok);
    struct grammar_vocab *v = vocab_alloc(n_logits > nt ? n_logits : nt);
    if (!v) return qerr_set(err, QERR_NOMEM, "out of memory for the vocabulary trie");
    char buf[1024];
    for (int32_t id = 0; id < nt; id++) {
        if (tokenizer_is_eog(tok, id)) v->eog[id / 64] |= 1ull << (id % 64);
        if (tokenizer_is_tool_marker(tok, id)) { /* by its text, for tool-call grammars only */
            v->marker[id / 64] |= 1ull << (id % 64);
            v->n_marker++;
        } else if (tokenizer_is_control(tok, id)) {
            continue;
        }
        int n = tokenizer_token_bytes(tok, id, buf, sizeof buf);
        if (n <= 0 || n > (int)sizeof buf) continue;
        if (!(v->bytes[id] = malloc((size_t)n))) {
            grammar_vocab_free(v);
            return qerr_set(err, QERR_NOMEM, "out of memory for the vocabulary trie");
        }
        memcpy(v->bytes[id], buf, (size_t)n);
        v->len[id] = (uint16_t)n;
    }
    int rc = build_trie(v, err);
    if (rc) {
        grammar_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

int grammar_vocab_create_raw(int vocab, const char *const *bytes, const size_t *len, int32_t eog,
                             struct grammar_vocab **out, struct qerr *err)
{
    *out = NULL;
    struct grammar_vocab *v = vocab_alloc(vocab);
    if (!v) return qerr_set(err, QERR_NOMEM, "out of memory for the vocabulary trie");
    if (eog >= 0 && eog < vocab) v->eog[eog / 64] |= 1ull << (eog % 64);
    for (int id = 0; id < vocab; id++) {
        if (id == eog || !bytes[id] || !len[id] || len[id] > 1024) continue;
        if (!(v->bytes[id] = malloc(len[id]))) {
            grammar_vocab_free(v);
            return qerr_set(err, QERR_NOMEM, "out of memory for the vocabulary trie");
        }
        memcpy(v->bytes[id], bytes[id], len[id]);
        v->len[id] = (uint16_t)len[id];
    }
    int rc = build_trie(v, err);
    if (rc) {
        grammar_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

int grammar_vocab_size(const struct grammar_vocab *v)
{
    return v->vocab;
}

int grammar_mask_words(const struct grammar_vocab *v)
{
    return v->words;
}

bool grammar_vocab_is_eog(const struct grammar_vocab *v, int32_t t)
{
    return t >= 0 && t < v->vocab && (v->eog[t / 64] >> (t % 64) & 1);
}
