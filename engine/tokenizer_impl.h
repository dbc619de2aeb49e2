/* tokenizer_impl: the tokenizer's private state, shared by tokenizer.c (load, special tokens,
 * decoding), tokenizer_bpe.c (byte-level BPE with PCRE2 pre-tokenization) and tokenizer_spm.c
 * (SentencePiece BPE). Nothing outside engine/tokenizer*.c includes this.
 *
 * Layout: every token text is copied into one arena (NUL-terminated, so tokenizer_token_text
 * can hand it out), and the bytes each token decodes to into a second arena, both indexed by
 * offset tables of n_vocab + 1 entries. Text -> id and (left id, right id) -> merge are open-
 * addressing hash tables sized to a power of two at least twice their entry count. */
#ifndef QUERN_TOKENIZER_IMPL_H
#define QUERN_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

enum tok_kind {
    TOK_KIND_BPE, /* "gpt2" */
    TOK_KIND_SPM, /* "llama" */
};

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

#define TOK_MAX_REGEX     4
#define TOK_BYTE_CP_LIMIT 324 /* bytes_to_unicode maps into [0, 324) */

struct tok_merge_slot {
    uint64_t key;   /* (uint64_t)left_id << 32 | right_id */
    int32_t rank;   /* -1: empty slot */
    int32_t result; /* id of left text + right text */
};

struct tokenizer {
    enum tok_kind kind;
    char *pre_name;    /* tokenizer.ggml.pre as stored ("default" when absent); owned */
    bool pre_fallback; /* pre_name unknown: the GPT-2 regex is used instead */
    int32_t n_vocab;

    char *text;          /* token texts, each NUL-terminated */
    uint32_t *text_off;  /* [n_vocab + 1] */
    char *bytes;         /* decoded bytes of every token, back to back */
    uint32_t *bytes_off; /* [n_vocab + 1] */
    size_t max_token_bytes;
    uint8_t *type;          /* [n_vocab] enum tok_type */
    float *score;           /* [n_vocab] SentencePiece scores (zeros when absent) */
    uint8_t *eog;           /* [n_vocab] 1 for end-of-generation tokens */
    int32_t tool_marker[4]; /* control tokens that open tool calls (tokenizer_is_tool_marker) */
    int n_tool_markers;

    int32_t *vocab_slot; /* [vocab_mask + 1] token id or -1 */
    uint32_t vocab_mask;

    struct tok_merge_slot *merge; /* [merge_mask + 1]; BPE only */
    uint32_t merge_bits;
    int32_t n_merges;

    int32_t *special; /* control, user-defined and unknown ids, longest text first */
    size_t n_special;

    /* BPE: the token for the code point byte b maps to. SPM: the <0xNN> token. -1 if none. */
    int32_t byte_tok[256];
    uint16_t byte_cp[256];              /* GPT-2 bytes_to_unicode */
    int16_t cp_byte[TOK_BYTE_CP_LIMIT]; /* its inverse, -1 where none */

    pcre2_code *re[TOK_MAX_REGEX]; /* pre-tokenizer, applied in order; BPE only */
    int n_re;
    bool ignore_merges; /* llama3: a pre-token that is a whole vocabulary entry skips merging */

    int32_t bos, eos, eot, eom, unk; /* -1 when absent */
    bool add_bos, add_space_prefix;
};

/* Growable id list that tokenizer_encode hands to the caller. */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};

/* Per-call scratch: the tokenizer itself is immutable, so every encode brings its own. */
struct tok_span {
    uint32_t off, len;
};

struct tok_work {
    pcre2_match_data *md;
    struct tok_span *pa, *pb;
    size_t cap_pa, cap_pb;
    void *sym; /* model-specific symbol array */
    size_t cap_sym;
    void *heap; /* model-specific candidate heap */
    size_t cap_heap;
    char *buf;
    size_t cap_buf;
};

static inline const char *tok_text(const struct tokenizer *t, int32_t id)
{
    return t->text + t->text_off[id];
}

static inline size_t tok_text_len(const struct tokenizer *t, int32_t id)
{
    return t->text_off[id + 1] - t->text_off[id] - 1;
}

/* tokenizer.c */
int32_t tok_vocab_find(const struct tokenizer *t, const char *s, size_t len); /* -1 if absent */
int tok_ids_push(struct tok_ids *o, int32_t id);
/* Ensures *p holds at least need elements of size elem; 0 or QERR_NOMEM. */
int tok_grow(void **p, size_t *cap, size_t need, size_t elem);

/* tokenizer_bpe.c */
int tok_bpe_init(struct tokenizer *t, const struct gguf_file *f, struct qerr *err);
void tok_bpe_free(struct tokenizer *t);
/* Appends the bytes token text s (len bytes) stands for under the byte-level mapping. */
size_t tok_bpe_unmap(const struct tokenizer *t, const char *s, size_t len, char *out);
int tok_bpe_encode(const struct tokenizer *t, struct tok_work *w, const char *s, size_t len,
                   struct tok_ids *out, struct qerr *err);

/* tokenizer_spm.c */
int tok_spm_encode(const struct tokenizer *t, struct tok_work *w, const char *s, size_t len,
                   bool space_prefix, struct tok_ids *out, struct qerr *err);
/* Decoded bytes of a normal SentencePiece token: U+2581 becomes a space. */
size_t tok_spm_unescape(const char *s, size_t len, char *out);

#endif
