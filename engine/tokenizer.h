/* tokenizer: text <-> token ids from the vocabulary a GGUF file carries.
 *
 * Models: "gpt2" (byte-level BPE: merges ranked by index, pre-tokenizer regexes run through
 * PCRE2 and chosen by tokenizer.ggml.pre) and "llama" (SentencePiece BPE: scores, <0xNN> byte
 * fallback). Control and user-defined tokens are matched whole in the text before
 * pre-tokenization when parse_special is set. The tokenizer is immutable after load, so one
 * instance may be shared by many threads. */
#ifndef QUERN_TOKENIZER_H
#define QUERN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

struct tokenizer;

int tokenizer_load(const struct gguf_file *f, struct tokenizer **out, struct qerr *err);
void tokenizer_free(struct tokenizer *t);

int32_t tokenizer_vocab_size(const struct tokenizer *t);
int32_t tokenizer_bos(const struct tokenizer *t); /* -1 when the model has none */
int32_t tokenizer_eos(const struct tokenizer *t);
bool tokenizer_adds_bos(const struct tokenizer *t); /* tokenizer.ggml.add_bos_token */
/* End of generation: EOS, and control tokens such as <|im_end|> or <|eot_id|>. */
bool tokenizer_is_eog(const struct tokenizer *t, int32_t id);
const char *tokenizer_model_name(const struct tokenizer *t); /* "gpt2" or "llama" */
const char *tokenizer_pre_name(const struct tokenizer *t);
/* True when tokenizer.ggml.pre named a pre-tokenizer quern does not know, so the GPT-2 regex is
 * used instead (token ids may then differ from the reference; worth a warning at load). */
bool tokenizer_pre_is_fallback(const struct tokenizer *t);
/* The id of the vocabulary entry whose stored text is exactly text, or -1. */
int32_t tokenizer_find(const struct tokenizer *t, const char *text);

/* Encodes len bytes of text (which must be valid UTF-8: otherwise QERR_INVALID naming the byte
 * offset). add_bos prepends BOS when the model has one. parse_special matches control (and
 * unknown) token texts whole, longest first; user-defined tokens are matched whole always, as
 * llama.cpp does. On success *ids is malloc'd (caller frees) holding *n ids. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_bos,
                     bool parse_special, int32_t **ids, size_t *n, struct qerr *err);

/* A byte range [off, off + len) of a text being encoded. */
struct tokenizer_span {
    size_t off, len;
};

/* tokenizer_encode with parse_special, except that a control (or unknown) token is matched only
 * where its text lies wholly outside the n_plain ranges; text inside them is tokenized as without
 * parse_special. This is how a chat prompt keeps its template's markers as control tokens while
 * message content, which a client wrote, cannot forge one. Fragments are not cut at the ranges'
 * edges, so a text with no special-token spelling inside them encodes exactly as tokenizer_encode
 * with parse_special does. The ranges must be sorted, disjoint and within the text (otherwise
 * QERR_INVALID); plain may be NULL when n_plain is 0. */
int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len, bool add_bos,
                           const struct tokenizer_span *plain, size_t n_plain, int32_t **ids,
                           size_t *n, struct qerr *err);

/* The raw bytes token id stands for (byte-level mapping undone, SentencePiece's U+2581 turned
 * into a space, <0xNN> into its byte; control and user-defined tokens give their text, e.g.
 * "<|im_end|>"). Returns the byte count, which may exceed cap (then only cap bytes are
 * written), or -1 for an id out of range. */
int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char *buf, size_t cap);

/* The longest byte count any token decodes to (sizes detok buffers: 3 * this + 16 is enough). */
size_t tokenizer_max_token_bytes(const struct tokenizer *t);

/* The vocabulary entry as stored in the file (e.g. "Ġthe"), NUL-terminated, or NULL. */
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id);

/* Streaming decoder: holds back the bytes of an incomplete UTF-8 sequence until a later token
 * completes it, so every piece it emits is valid UTF-8. */
struct detok {
    unsigned char pending[8];
    int n_pending;
    bool skip_control; /* set after detok_init to drop control tokens, as llama.cpp does */
    /* ... except the tool-call markers (tokenizer_is_tool_marker), which a tool-call parser
     * reads (llama.cpp's preserved tokens) */
    bool keep_tool_markers;
};

void detok_init(struct detok *d);
/* Writes the text that token id completes to out (NUL-terminated, at most cap - 1 bytes); returns
 * the number of bytes written, or a negative QERR_* code: QERR_INVALID for a bad id or buffer,
 * QERR_FULL when the text does not fit (d is then unchanged, so the call can be repeated with a
 * bigger buffer; 3 * tokenizer_max_token_bytes + 16 always suffices). Invalid byte sequences are
 * emitted as U+FFFD (one per maximal subpart) rather than held forever. */
int detok_push(struct detok *d, const struct tokenizer *t, int32_t id, char *out, size_t cap);
/* Emits whatever is still held (as U+FFFD) at the end of a stream. */
int detok_flush(struct detok *d, char *out, size_t cap);

/* Whole-sequence decode into a malloc'd NUL-terminated string (caller frees); NULL on OOM. The
 * result is valid UTF-8 (as with detok); ids out of range are skipped. Nothing is stripped: a
 * SentencePiece model's add_space_prefix space stays at the front. */
char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n);
/* The same, but with skip_control the control tokens (<|im_end|>, <s>, ...) contribute nothing,
 * which is what llama.cpp's llama_detokenize gives without unparse_special. */
char *tokenizer_decode_opt(const struct tokenizer *t, const int32_t *ids, size_t n,
                           bool skip_control);
/* True for the control tokens that open tool calls in some chat formats (<|python_tag|>,
 * [TOOL_CALLS], [ARGS], [CALL_ID]): kept in the text of requests that offer tools, and
 * allowed by tool-call grammars, which spell them out. */
bool tokenizer_is_tool_marker(const struct tokenizer *t, int32_t id);
/* True for control tokens (token_type 3): markers such as <|im_start|> or </s>. */
bool tokenizer_is_control(const struct tokenizer *t, int32_t id);

#endif
