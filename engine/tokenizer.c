/* tokenizer: loading the vocabulary from GGUF, special-token partitioning and the encode driver.
 *
 * DESIGN. The behaviour follows llama.cpp's src/llama-vocab.cpp, since its token ids are the
 * reference the tests compare against:
 *  - Special tokens are found first: every control, user-defined and unknown token, longest
 *    text first, splits the raw fragments that still remain (llama.cpp's tokenizer_st_partition).
 *    User-defined tokens are always matched; control and unknown ones only with parse_special,
 *    and never across a caller's plain range (tokenizer_encode_spans: chat message content). A
 *    refused match leaves its bytes inside the surrounding raw fragment (never a cut there), so
 *    plain ranges free of special spellings change no id.
 *  - Each remaining raw fragment goes to the model: byte-level BPE (tokenizer_bpe.c) or
 *    SentencePiece (tokenizer_spm.c), which gets a leading space when the fragment follows a
 *    special token or the start of the text and add_space_prefix is set.
 *  - End-of-generation ids are EOS, EOT, EOM and every token whose text is one of llama.cpp's
 *    known end markers (<|im_end|>, <|eot_id|>, <|endoftext|>, ...).
 * Decoding and the streaming decoder live in tokenizer_decode.c. */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* ---- small helpers shared with the model files ---- */

int tok_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return QERR_NOMEM;
    *p = q;
    *cap = n;
    return 0;
}

int tok_ids_push(struct tok_ids *o, int32_t id)
{
    if (o->n == o->cap && tok_grow((void **)&o->v, &o->cap, o->n + 1, sizeof *o->v))
        return QERR_NOMEM;
    o->v[o->n++] = id;
    return 0;
}

static uint64_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

int32_t tok_vocab_find(const struct tokenizer *t, const char *s, size_t len)
{
    uint32_t i = (uint32_t)hash_bytes(s, len) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab_slot[i];
        if (id < 0) return -1;
        if (tok_text_len(t, id) == len && memcmp(tok_text(t, id), s, len) == 0) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

/* ---- loading ---- */

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t p = 16;
    while (p < n) p *= 2;
    return p;
}

/* Element i of an integer array of any width, widened. */
static int64_t arr_int_at(const struct gguf_kv *kv, uint64_t i)
{
    const unsigned char *p = kv->value;
    switch (kv->arr_type) {
    case GGUF_I8:
        return (int8_t)p[i];
    case GGUF_U8:
        return p[i];
    case GGUF_I16: {
        int16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case GGUF_U16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case GGUF_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case GGUF_U32: {
        uint32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    default: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    }
}

static bool vtype_is_int(enum gguf_vtype v)
{
    return v == GGUF_I8 || v == GGUF_U8 || v == GGUF_I16 || v == GGUF_U16 || v == GGUF_I32 ||
           v == GGUF_U32 || v == GGUF_I64 || v == GGUF_U64;
}

static int load_texts(struct tokenizer *t, const struct gguf_file *f, struct qerr *err)
{
    const struct gguf_kv *kv;
    int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &kv, err);
    if (rc) return rc;
    if (kv->arr_len == 0 || kv->arr_len > (1u << 30))
        return qerr_set(err, QERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens is out of range",
                        (unsigned long long)kv->arr_len);
    t->n_vocab = (int32_t)kv->arr_len;
    uint64_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) total += kv->strs[i].len + 1;
    if (total > UINT32_MAX)
        return qerr_set(err, QERR_FORMAT, "tokenizer.ggml.tokens: %llu bytes of text is too much",
                        (unsigned long long)total);
    t->text = malloc(total);
    t->text_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->text_off);
    t->vocab_mask = pow2_at_least(2 * (uint64_t)t->n_vocab) - 1;
    t->vocab_slot = malloc(((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slot);
    if (!t->text || !t->text_off || !t->vocab_slot)
        return qerr_set(err, QERR_NOMEM, "tokenizer.ggml.tokens: out of memory");
    memset(t->vocab_slot, 0xff, ((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slot);
    uint32_t off = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const struct gguf_str *s = &kv->strs[i];
        t->text_off[i] = off;
        memcpy(t->text + off, s->ptr, s->len);
        t->text[off + s->len] = '\0';
        off += (uint32_t)s->len + 1;
    }
    t->text_off[t->n_vocab] = off;
    /* Later duplicates win, as in llama.cpp's token_to_id map. */
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len = tok_text_len(t, id);
        uint32_t i = (uint32_t)hash_bytes(tok_text(t, id), len) & t->vocab_mask;
        for (;;) {
            int32_t o = t->vocab_slot[i];
            if (o < 0) break;
            if (tok_text_len(t, o) == len && memcmp(tok_text(t, o), tok_text(t, id), len) == 0)
                break;
            i = (i + 1) & t->vocab_mask;
        }
        t->vocab_slot[i] = id;
    }
    return 0;
}

static int load_types_scores(struct tokenizer *t, const struct gguf_file *f, struct qerr *err)
{
    size_t n = (size_t)t->n_vocab;
    t->type = malloc(n);
    t->score = calloc(n, sizeof *t->score);
    t->eog = calloc(n, 1);
    if (!t->type || !t->score || !t->eog)
        return qerr_set(err, QERR_NOMEM, "tokenizer.ggml.token_type: out of memory");
    memset(t->type, TOK_TYPE_NORMAL, n);

    const struct gguf_kv *kv = gguf_kv_find(f, "tokenizer.ggml.token_type");
    if (kv) {
        if (kv->type != GGUF_ARRAY || !vtype_is_int(kv->arr_type) || kv->arr_len != n)
            return qerr_set(err, QERR_FORMAT,
                            "tokenizer.ggml.token_type: want an integer array of %zu entries", n);
        for (size_t i = 0; i < n; i++) {
            int64_t v = arr_int_at(kv, i);
            if (v < TOK_TYPE_UNDEFINED || v > TOK_TYPE_BYTE)
                return qerr_set(err, QERR_FORMAT,
                                "tokenizer.ggml.token_type[%zu]: unknown type %lld", i,
                                (long long)v);
            t->type[i] = (uint8_t)v;
        }
    }
    kv = gguf_kv_find(f, "tokenizer.ggml.scores");
    if (kv) {
        if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_F32 || kv->arr_len != n)
            return qerr_set(err, QERR_FORMAT,
                            "tokenizer.ggml.scores: want an f32 array of %zu entries", n);
        memcpy(t->score, kv->value, n * sizeof *t->score);
    }
    return 0;
}

/* An optional token id key: -1 when absent. */
static int load_id(const struct tokenizer *t, const struct gguf_file *f, const char *key,
                   int32_t *out, struct qerr *err)
{
    *out = -1;
    int32_t v;
    int rc = gguf_get_i32(f, key, &v, err);
    if (rc == QERR_NOTFOUND) return 0;
    if (rc) return rc;
    if (v < 0 || v >= t->n_vocab)
        return qerr_set(err, QERR_FORMAT, "%s: id %d is outside the vocabulary of %d", key, v,
                        t->n_vocab);
    *out = v;
    return 0;
}

static int load_bool(const struct gguf_file *f, const char *key, bool *out, struct qerr *err)
{
    int rc = gguf_get_bool(f, key, out, err);
    return rc == QERR_NOTFOUND ? 0 : rc;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, or -1. */
static int parse_byte_token(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Bytes every token stands for (see tokenizer_token_bytes). */
static int build_bytes(struct tokenizer *t, struct qerr *err)
{
    size_t n = (size_t)t->n_vocab;
    /* Unmapping never grows a text: each code point yields at most its own UTF-8 length. */
    t->bytes = malloc(t->text_off[n] ? t->text_off[n] : 1);
    t->bytes_off = malloc((n + 1) * sizeof *t->bytes_off);
    if (!t->bytes || !t->bytes_off)
        return qerr_set(err, QERR_NOMEM, "tokenizer: out of memory for decoded tokens");
    uint32_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = tok_text(t, id);
        size_t len = tok_text_len(t, id), m;
        char *dst = t->bytes + off;
        int byte = t->type[id] == TOK_TYPE_BYTE ? parse_byte_token(s, len) : -1;
        if (byte >= 0) {
            dst[0] = (char)byte;
            m = 1;
        } else if (t->type[id] == TOK_TYPE_CONTROL || t->type[id] == TOK_TYPE_USER_DEFINED ||
                   t->type[id] == TOK_TYPE_UNKNOWN) {
            memcpy(dst, s, len);
            m = len;
        } else if (t->kind == TOK_KIND_BPE) {
            m = tok_bpe_unmap(t, s, len, dst);
        } else {
            m = tok_spm_unescape(s, len, dst);
        }
        t->bytes_off[id] = off;
        off += (uint32_t)m;
        if (m > t->max_token_bytes) t->max_token_bytes = m;
    }
    t->bytes_off[n] = off;
    return 0;
}

/* The texts llama.cpp treats as end of generation wherever they appear in a vocabulary. */
static const char *const k_eog_texts[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>",
};

/* Control tokens that tool-call formats write in the output: Llama 3.1's <|python_tag|>,
 * Mistral's [TOOL_CALLS] and its newer [ARGS] / [CALL_ID]. */
static const char *const k_tool_marker_texts[] = {"<|python_tag|>", "[TOOL_CALLS]", "[ARGS]",
                                                  "[CALL_ID]"};

static int special_cmp(const void *a, const void *b, void *ctx)
{
    const struct tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = tok_text_len(t, x), ly = tok_text_len(t, y);
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int build_specials(struct tokenizer *t, struct qerr *err)
{
    size_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->type[id];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            tok_text_len(t, id) > 0)
            n++;
    }
    t->special = malloc((n ? n : 1) * sizeof *t->special);
    if (!t->special) return qerr_set(err, QERR_NOMEM, "tokenizer: out of memory for specials");
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->type[id];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            tok_text_len(t, id) > 0)
            t->special[t->n_special++] = id;
    }
    qsort_r(t->special, t->n_special, sizeof *t->special, special_cmp, t);

    for (size_t i = 0; i < sizeof k_eog_texts / sizeof k_eog_texts[0]; i++) {
        int32_t id = tok_vocab_find(t, k_eog_texts[i], strlen(k_eog_texts[i]));
        if (id >= 0) t->eog[id] = 1;
    }
    for (size_t i = 0; i < sizeof k_tool_marker_texts / sizeof k_tool_marker_texts[0]; i++) {
        int32_t id = tok_vocab_find(t, k_tool_marker_texts[i], strlen(k_tool_marker_texts[i]));
        if (id >= 0 && t->type[id] == TOK_TYPE_CONTROL) t->tool_marker[t->n_tool_markers++] = id;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    return 0;
}

static int load_all(struct tokenizer *t, const struct gguf_file *f, struct qerr *err)
{
    struct gguf_str s;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &s, err);
    if (rc) return rc;
    if (gguf_str_eq(s, "gpt2")) {
        t->kind = TOK_KIND_BPE;
    } else if (gguf_str_eq(s, "llama")) {
        t->kind = TOK_KIND_SPM;
    } else {
        return qerr_set(err, QERR_UNSUPPORTED,
                        "tokenizer.ggml.model: \"%.*s\" is not supported (want gpt2 or llama)",
                        (int)(s.len > 64 ? 64 : s.len), s.ptr);
    }
    rc = gguf_get_str(f, "tokenizer.ggml.pre", &s, err);
    if (rc && rc != QERR_NOTFOUND) return rc;
    if (rc == QERR_NOTFOUND) s = (struct gguf_str){"default", 7};
    t->pre_name = strndup(s.ptr, s.len);
    if (!t->pre_name) return qerr_set(err, QERR_NOMEM, "tokenizer.ggml.pre: out of memory");

    if ((rc = load_texts(t, f, err)) || (rc = load_types_scores(t, f, err))) return rc;
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    if (t->kind == TOK_KIND_BPE) {
        if ((rc = tok_bpe_init(t, f, err))) return rc;
    } else {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_tok[b] = tok_vocab_find(t, name, 6);
        }
        t->add_space_prefix = true;
        t->add_bos = true;
    }
    if ((rc = load_id(t, f, "tokenizer.ggml.bos_token_id", &t->bos, err)) ||
        (rc = load_id(t, f, "tokenizer.ggml.eos_token_id", &t->eos, err)) ||
        (rc = load_id(t, f, "tokenizer.ggml.eot_token_id", &t->eot, err)) ||
        (rc = load_id(t, f, "tokenizer.ggml.eom_token_id", &t->eom, err)) ||
        (rc = load_id(t, f, "tokenizer.ggml.unknown_token_id", &t->unk, err)) ||
        (rc = load_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) ||
        (rc = load_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err)))
        return rc;
    if (t->add_bos && t->bos < 0) t->add_bos = false;
    if ((rc = build_bytes(t, err)) || (rc = build_specials(t, err))) return rc;
    return 0;
}

int tokenizer_load(const struct gguf_file *f, struct tokenizer **out, struct qerr *err)
{
    *out = NULL;
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) return qerr_set(err, QERR_NOMEM, "tokenizer: out of memory");
    int rc = load_all(t, f, err);
    if (rc) {
        /* gguf's own errors already start with the path */
        const char *path = gguf_path(f);
        if (err && strncmp(err->msg, path, strlen(path)) != 0) qerr_wrap(err, "%s", path);
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t) return;
    tok_bpe_free(t);
    free(t->pre_name);
    free(t->text);
    free(t->text_off);
    free(t->bytes);
    free(t->bytes_off);
    free(t->type);
    free(t->score);
    free(t->eog);
    free(t->vocab_slot);
    free(t->special);
    free(t);
}

/* ---- accessors ---- */

int32_t tokenizer_vocab_size(const struct tokenizer *t)
{
    return t->n_vocab;
}

int32_t tokenizer_bos(const struct tokenizer *t)
{
    return t->bos;
}

int32_t tokenizer_eos(const struct tokenizer *t)
{
    return t->eos;
}

bool tokenizer_adds_bos(const struct tokenizer *t)
{
    return t->add_bos;
}

bool tokenizer_is_tool_marker(const struct tokenizer *t, int32_t id)
{
    for (int i = 0; i < t->n_tool_markers; i++)
        if (t->tool_marker[i] == id) return true;
    return false;
}

bool tokenizer_is_eog(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

const char *tokenizer_model_name(const struct tokenizer *t)
{
    return t->kind == TOK_KIND_BPE ? "gpt2" : "llama";
}

const char *tokenizer_pre_name(const struct tokenizer *t)
{
    return t->pre_name;
}

bool tokenizer_pre_is_fallback(const struct tokenizer *t)
{
    return t->pre_fallback;
}

const char *tokenizer_token_text(const struct tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) return NULL;
    return tok_text(t, id);
}

int32_t tokenizer_find(const struct tokenizer *t, const char *text)
{
    return tok_vocab_find(t, text, strlen(text));
}

/* ---- encoding ---- */

struct frag {
    size_t off, len;
    int32_t id; /* >= 0: a special token; -1: raw text */
};

struct frags {
    struct frag *v;
    size_t n, cap;
};

static int frags_push(struct frags *f, size_t off, size_t len, int32_t id)
{
    if (f->n == f->cap && tok_grow((void **)&f->v, &f->cap, f->n + 1, sizeof *f->v))
        return QERR_NOMEM;
    f->v[f->n++] = (struct frag){off, len, id};
    return 0;
}

/* True when [h, h + tl) overlaps one of the sorted, disjoint ranges (an empty range counts when
 * it lies strictly inside, since the token would then straddle a content boundary). */
static bool overlaps_plain(const struct tokenizer_span *plain, size_t n_plain, size_t h, size_t tl)
{
    /* the first range ending after h; ends never decrease, so binary search finds it */
    size_t lo = 0, hi = n_plain;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (plain[mid].off + plain[mid].len > h)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < n_plain && plain[lo].off < h + tl;
}

/* Splits text into raw fragments and special tokens, longest special first. Control and unknown
 * tokens count only with parse_special, and never where they overlap a plain range. */
static int partition(const struct tokenizer *t, const char *s, size_t len, bool parse_special,
                     const struct tokenizer_span *plain, size_t n_plain, struct frags *cur,
                     struct frags *next)
{
    cur->n = 0;
    if (len && frags_push(cur, 0, len, -1)) return QERR_NOMEM;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        bool user = t->type[id] == TOK_TYPE_USER_DEFINED;
        if (!parse_special && !user) continue;
        bool guarded = !user && n_plain > 0;
        const char *tx = tok_text(t, id);
        size_t tl = tok_text_len(t, id);
        if (tl > len || !memmem(s, len, tx, tl)) continue;
        next->n = 0;
        for (size_t i = 0; i < cur->n; i++) {
            struct frag fr = cur->v[i];
            if (fr.id >= 0) {
                if (frags_push(next, fr.off, fr.len, fr.id)) return QERR_NOMEM;
                continue;
            }
            /* p: start of the raw text not yet pushed; q: where the search resumes, which moves
             * past a refused hit without cutting the fragment there */
            size_t p = fr.off, q = fr.off, end = fr.off + fr.len;
            const char *hit;
            while (end - q >= tl && (hit = memmem(s + q, end - q, tx, tl))) {
                size_t h = (size_t)(hit - s);
                if (guarded && overlaps_plain(plain, n_plain, h, tl)) {
                    q = h + 1;
                    continue;
                }
                if (h > p && frags_push(next, p, h - p, -1)) return QERR_NOMEM;
                if (frags_push(next, h, tl, id)) return QERR_NOMEM;
                p = q = h + tl;
            }
            if (p < end && frags_push(next, p, end - p, -1)) return QERR_NOMEM;
        }
        struct frags tmp = *cur;
        *cur = *next;
        *next = tmp;
    }
    return 0;
}

static void work_free(struct tok_work *w)
{
    if (w->md) pcre2_match_data_free(w->md);
    free(w->pa);
    free(w->pb);
    free(w->sym);
    free(w->heap);
    free(w->buf);
}

static int encode(const struct tokenizer *t, const char *text, size_t len, bool add_bos,
                  bool parse_special, const struct tokenizer_span *plain, size_t n_plain,
                  int32_t **ids, size_t *n, struct qerr *err)
{
    *ids = NULL;
    *n = 0;
    if (!text && len) return qerr_set(err, QERR_INVALID, "tokenizer_encode: text is NULL");
    if (n_plain && !plain)
        return qerr_set(err, QERR_INVALID, "tokenizer_encode: %zu plain ranges but no array",
                        n_plain);
    for (size_t i = 0, prev_end = 0; i < n_plain; i++) {
        if (plain[i].off < prev_end || plain[i].off > len || plain[i].len > len - plain[i].off)
            return qerr_set(err, QERR_INVALID,
                            "tokenizer_encode: plain range %zu [%zu, +%zu) is out of order or "
                            "outside the %zu bytes of text",
                            i, plain[i].off, plain[i].len, len);
        prev_end = plain[i].off + plain[i].len;
    }
    if (len > UINT32_MAX / 4)
        return qerr_set(err, QERR_INVALID, "tokenizer_encode: text of %zu bytes is too long", len);
    size_t bad = utf8_check(text, len);
    if (bad < len)
        return qerr_set(err, QERR_INVALID,
                        "tokenizer_encode: text is not valid UTF-8 at byte offset %zu (0x%02x)",
                        bad, (unsigned char)text[bad]);

    struct tok_ids out = {0};
    struct frags fa = {0}, fb = {0};
    struct tok_work w = {0};
    int rc = 0;
    if (add_bos && t->bos >= 0 && (rc = tok_ids_push(&out, t->bos))) goto nomem;
    if ((rc = partition(t, text, len, parse_special, plain, n_plain, &fa, &fb))) goto nomem;

    bool prev_special = true; /* SentencePiece: a raw fragment at the start gets a space */
    for (size_t i = 0; i < fa.n; i++) {
        const struct frag *fr = &fa.v[i];
        if (fr->id >= 0) {
            if ((rc = tok_ids_push(&out, fr->id))) goto nomem;
            prev_special = true;
            continue;
        }
        if (t->kind == TOK_KIND_BPE)
            rc = tok_bpe_encode(t, &w, text + fr->off, fr->len, &out, err);
        else
            rc = tok_spm_encode(t, &w, text + fr->off, fr->len, t->add_space_prefix && prev_special,
                                &out, err);
        if (rc) goto fail;
        prev_special = false;
    }
    free(fa.v);
    free(fb.v);
    work_free(&w);
    if (!out.v && !(out.v = malloc(sizeof *out.v))) {
        rc = QERR_NOMEM;
        goto nomem;
    }
    *ids = out.v;
    *n = out.n;
    return 0;

nomem:
    rc = qerr_set(err, QERR_NOMEM, "tokenizer_encode: out of memory for %zu bytes of text", len);
fail:
    free(out.v);
    free(fa.v);
    free(fb.v);
    work_free(&w);
    return rc;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_bos,
                     bool parse_special, int32_t **ids, size_t *n, struct qerr *err)
{
    return encode(t, text, len, add_bos, parse_special, NULL, 0, ids, n, err);
}

int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len, bool add_bos,
                           const struct tokenizer_span *plain, size_t n_plain, int32_t **ids,
                           size_t *n, struct qerr *err)
{
    return encode(t, text, len, add_bos, true, plain, n_plain, ids, n, err);
}
