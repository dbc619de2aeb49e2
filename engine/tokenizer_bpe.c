/* tokenizer_bpe: byte-level BPE ("gpt2" vocabularies).
 *
 * DESIGN. A raw fragment is cut into pre-tokens by the regex list that tokenizer.ggml.pre names
 * (llama.cpp's llm_tokenizer_bpe table): each regex in turn splits every piece the previous one
 * produced, and the text between two matches is a piece of its own. Every pre-token's bytes
 * start as one symbol each (the token of the code point bytes_to_unicode maps the byte to);
 * then the adjacent pair with the lowest merge rank (leftmost on ties) is merged until none is
 * left, using a binary heap of candidate pairs and a (left id, right id) -> (rank, result) hash
 * table, so a pre-token of n bytes costs O(n log n).
 *
 * \s in PCRE2 (even with UCP) leaves out U+0085, which llama.cpp and Hugging Face both count as
 * whitespace, so the patterns spell whitespace as [\s\x{85}]. */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* ---- pre-tokenizer regex lists ---- */

#define WS "\\s\\x{85}"

#define RE_GPT2                                                                                    \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])"

#define RE_LLAMA3_HEAD                                                                             \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL                                                                             \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"

struct pre_def {
    const char *names; /* space-separated tokenizer.ggml.pre values */
    bool ignore_merges;
    const char *re[TOK_MAX_REGEX];
};

static const struct pre_def k_pre_defs[] = {
    {"default", false, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"gpt-2 gpt2 phi-2 mpt olmo jais roberta-bpe", false, {RE_GPT2}},
    {"smollm starcoder refact command-r codeshell exaone minerva-7b", false, {"\\p{N}", RE_GPT2}},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral",
     true,
     {RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL}},
    {"dbrx smaug-bpe", false, {RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL}},
    {"qwen2 stablelm2 deepseek-r1-qwen megrez", false, {RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL}},
};
enum { PRE_GPT2 = 1 };

static bool name_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && memcmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static int init_regex(struct tokenizer *t, struct qerr *err)
{
    const struct pre_def *d = NULL;
    for (size_t i = 0; i < sizeof k_pre_defs / sizeof k_pre_defs[0]; i++)
        if (name_in_list(k_pre_defs[i].names, t->pre_name)) d = &k_pre_defs[i];
    if (!d) {
        d = &k_pre_defs[PRE_GPT2];
        t->pre_fallback = true;
    }
    t->ignore_merges = d->ignore_merges;
    for (int i = 0; i < TOK_MAX_REGEX && d->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)d->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return qerr_set(err, QERR_FORMAT,
                            "tokenizer.ggml.pre \"%s\": regex %d does not compile at %zu: %s",
                            t->pre_name, i, (size_t)eo, (const char *)msg);
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
        t->re[t->n_re++] = re;
    }
    return 0;
}

/* ---- byte-level mapping ---- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
static void init_byte_map(struct tokenizer *t)
{
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        t->byte_cp[b] = (uint16_t)(keep ? b : next++);
    }
    for (int c = 0; c < TOK_BYTE_CP_LIMIT; c++) t->cp_byte[c] = -1;
    for (int b = 0; b < 256; b++) t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    for (int b = 0; b < 256; b++) {
        char u[4];
        int n = utf8_put(t->byte_cp[b], u);
        t->byte_tok[b] = tok_vocab_find(t, u, (size_t)n);
    }
}

size_t tok_bpe_unmap(const struct tokenizer *t, const char *s, size_t len, char *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, m = 0;
    while (i < len) {
        uint32_t cp;
        int r = utf8_next(u + i, len - i, &cp);
        if (r <= 0) { /* not UTF-8: keep the byte as it is */
            out[m++] = s[i++];
            continue;
        }
        if (cp < TOK_BYTE_CP_LIMIT && t->cp_byte[cp] >= 0) {
            out[m++] = (char)t->cp_byte[cp];
        } else { /* outside the mapping: keep the character */
            memcpy(out + m, s + i, (size_t)r);
            m += (size_t)r;
        }
        i += (size_t)r;
    }
    return m;
}

/* ---- merges ---- */

static uint32_t merge_hash(uint64_t key, uint32_t bits)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static const struct tok_merge_slot *merge_find(const struct tokenizer *t, int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t mask = (1u << t->merge_bits) - 1;
    for (uint32_t i = merge_hash(key, t->merge_bits);; i = (i + 1) & mask) {
        const struct tok_merge_slot *s = &t->merge[i];
        if (s->rank < 0) return NULL;
        if (s->key == key) return s;
    }
}

static int init_merges(struct tokenizer *t, const struct gguf_file *f, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_STRING, &kv, err);
    if (rc) return rc;
    if (kv->arr_len > (1u << 28))
        return qerr_set(err, QERR_FORMAT, "tokenizer.ggml.merges: %llu merges is too many",
                        (unsigned long long)kv->arr_len);
    t->merge_bits = 4;
    while ((1ull << t->merge_bits) < 2 * kv->arr_len) t->merge_bits++;
    size_t slots = (size_t)1 << t->merge_bits;
    t->merge = malloc(slots * sizeof *t->merge);
    char *cat = malloc(t->text_off[t->n_vocab] + 1);
    if (!t->merge || !cat) {
        free(cat);
        return qerr_set(err, QERR_NOMEM, "tokenizer.ggml.merges: out of memory");
    }
    for (size_t i = 0; i < slots; i++) t->merge[i].rank = -1;

    for (uint64_t i = 0; i < kv->arr_len; i++) {
        const struct gguf_str *s = &kv->strs[i];
        /* "left right"; the search starts at 1 so that a left part " " still works */
        const char *sp = s->len > 1 ? memchr(s->ptr + 1, ' ', s->len - 1) : NULL;
        if (!sp) {
            free(cat);
            return qerr_set(err, QERR_FORMAT, "tokenizer.ggml.merges[%llu]: no space in \"%.*s\"",
                            (unsigned long long)i, (int)(s->len > 64 ? 64 : s->len), s->ptr);
        }
        size_t ll = (size_t)(sp - s->ptr), rl = s->len - ll - 1;
        int32_t l = tok_vocab_find(t, s->ptr, ll), r = tok_vocab_find(t, sp + 1, rl);
        memcpy(cat, s->ptr, ll);
        memcpy(cat + ll, sp + 1, rl);
        int32_t res = tok_vocab_find(t, cat, ll + rl);
        /* A merge whose parts or result are not tokens can never produce a token id; a sound
         * vocabulary has none, and skipping them keeps the merge loop on ids alone. */
        if (l < 0 || r < 0 || res < 0) continue;
        uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
        uint32_t mask = (uint32_t)slots - 1;
        for (uint32_t h = merge_hash(key, t->merge_bits);; h = (h + 1) & mask) {
            struct tok_merge_slot *m = &t->merge[h];
            if (m->rank >= 0 && m->key == key) break; /* the first (best) rank wins */
            if (m->rank < 0) {
                *m = (struct tok_merge_slot){key, (int32_t)i, res};
                t->n_merges++;
                break;
            }
        }
    }
    free(cat);
    return 0;
}

int tok_bpe_init(struct tokenizer *t, const struct gguf_file *f, struct qerr *err)
{
    int rc;
    init_byte_map(t);
    if ((rc = init_merges(t, f, err))) return rc;
    if ((rc = init_regex(t, err))) return rc;
    if (t->ignore_merges) t->add_bos = true; /* llama.cpp's default for the llama3 family */
    return 0;
}

void tok_bpe_free(struct tokenizer *t)
{
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    t->n_re = 0;
    free(t->merge);
    t->merge = NULL;
}

/* ---- pre-tokenization ---- */

static int span_push(struct tok_span **v, size_t *cap, size_t *n, size_t off, size_t len)
{
    if (tok_grow((void **)v, cap, *n + 1, sizeof **v)) return QERR_NOMEM;
    (*v)[(*n)++] = (struct tok_span){(uint32_t)off, (uint32_t)len};
    return 0;
}

/* Splits every piece of w->pa by re into w->pb. */
static int split_pieces(const pcre2_code *re, struct tok_work *w, const char *s, size_t na,
                        size_t *nb, struct qerr *err)
{
    *nb = 0;
    for (size_t k = 0; k < na; k++) {
        size_t base = w->pa[k].off, plen = w->pa[k].len, gap = 0, pos = 0;
        const PCRE2_SPTR subj = (PCRE2_SPTR)(s + base);
        while (pos < plen) {
            int rc = pcre2_match(re, subj, plen, pos, PCRE2_NO_UTF_CHECK, w->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return qerr_set(err, QERR_INVALID,
                                "tokenizer_encode: pre-tokenizer failed at byte %zu: %s",
                                base + pos, (const char *)msg);
            }
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) { /* an empty match claims nothing: step over one character */
                uint32_t cp;
                int r = utf8_next((const unsigned char *)subj + ms, plen - ms, &cp);
                pos = ms + (size_t)(r > 0 ? r : 1);
                continue;
            }
            if (ms > gap && span_push(&w->pb, &w->cap_pb, nb, base + gap, ms - gap))
                return QERR_NOMEM;
            if (span_push(&w->pb, &w->cap_pb, nb, base + ms, me - ms)) return QERR_NOMEM;
            gap = pos = me;
        }
        if (gap < plen && span_push(&w->pb, &w->cap_pb, nb, base + gap, plen - gap))
            return QERR_NOMEM;
    }
    return 0;
}

/* ---- merging ---- */

struct bpe_sym {
    int32_t id; /* token id; DEAD once merged into its left neighbour, -1 if no token */
    int32_t prev, next;
};
#define DEAD INT32_MIN

struct bpe_cand {
    int32_t rank, left, lid, rid;
};

static bool cand_less(const struct bpe_cand *a, const struct bpe_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(struct bpe_cand *h, size_t *n, struct bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct bpe_cand heap_pop(struct bpe_cand *h, size_t *n)
{
    struct bpe_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const struct tokenizer *t, const struct bpe_sym *sym, int32_t l, int32_t r,
                     struct bpe_cand *h, size_t *nh)
{
    if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
    const struct tok_merge_slot *m = merge_find(t, sym[l].id, sym[r].id);
    if (m) heap_push(h, nh, (struct bpe_cand){m->rank, l, sym[l].id, sym[r].id});
}

static int bpe_word(const struct tokenizer *t, struct tok_work *w, const unsigned char *p, size_t n,
                    struct tok_ids *out)
{
    if (t->ignore_merges) {
        if (tok_grow((void **)&w->buf, &w->cap_buf, 2 * n, 1)) return QERR_NOMEM;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += (size_t)utf8_put(t->byte_cp[p[i]], w->buf + m);
        int32_t id = tok_vocab_find(t, w->buf, m);
        if (id >= 0) return tok_ids_push(out, id);
    }
    if (n == 1) return t->byte_tok[p[0]] >= 0 ? tok_ids_push(out, t->byte_tok[p[0]]) : 0;

    /* Each merge adds at most two candidates to the n - 1 initial ones. */
    if (tok_grow(&w->sym, &w->cap_sym, n, sizeof(struct bpe_sym)) ||
        tok_grow(&w->heap, &w->cap_heap, 3 * n, sizeof(struct bpe_cand)))
        return QERR_NOMEM;
    struct bpe_sym *sym = w->sym;
    struct bpe_cand *h = w->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++)
        sym[i] =
            (struct bpe_sym){t->byte_tok[p[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, sym, (int32_t)i, (int32_t)i + 1, h, &nh);

    while (nh) {
        struct bpe_cand c = heap_pop(h, &nh);
        struct bpe_sym *l = &sym[c.left];
        if (l->id != c.lid || l->next < 0) continue;
        struct bpe_sym *r = &sym[l->next];
        if (r->id != c.rid) continue; /* stale: one side has changed since */
        const struct tok_merge_slot *m = merge_find(t, c.lid, c.rid);
        l->id = m->result;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = c.left;
        r->id = DEAD;
        try_pair(t, sym, l->prev, c.left, h, &nh);
        try_pair(t, sym, c.left, l->next, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if (sym[i].id >= 0 && tok_ids_push(out, sym[i].id)) return QERR_NOMEM;
    return 0;
}

int tok_bpe_encode(const struct tokenizer *t, struct tok_work *w, const char *s, size_t len,
                   struct tok_ids *out, struct qerr *err)
{
    if (len == 0) return 0;
    if (!w->md && !(w->md = pcre2_match_data_create(1, NULL))) goto nomem;
    size_t na = 0, nb;
    if (span_push(&w->pa, &w->cap_pa, &na, 0, len)) goto nomem;
    for (int i = 0; i < t->n_re; i++) {
        int rc = split_pieces(t->re[i], w, s, na, &nb, err);
        if (rc == QERR_NOMEM) goto nomem;
        if (rc) return rc;
        struct tok_span *tp = w->pa;
        size_t tc = w->cap_pa;
        w->pa = w->pb;
        w->cap_pa = w->cap_pb;
        w->pb = tp;
        w->cap_pb = tc;
        na = nb;
    }
    for (size_t k = 0; k < na; k++)
        if (bpe_word(t, w, (const unsigned char *)s + w->pa[k].off, w->pa[k].len, out)) goto nomem;
    return 0;
nomem:
    return qerr_set(err, QERR_NOMEM, "tokenizer_encode: out of memory");
}
