/* fuzz_tokenizer: arbitrary bytes encoded and decoded by both tokenizer families, the real
 * model's byte-level BPE (SmolLM2, PCRE2 pre-tokenizer) and a SentencePiece vocabulary with byte
 * fallback (tests/fuzz/corpus/gguf/tiny-spm.gguf).
 *
 * The first byte picks: bit 0 the tokenizer, bit 1 add_bos, bit 2 parse_special, bit 3 a plain
 * range (tokenizer_encode_spans, its bounds from the next two bytes); the rest is the text.
 * Checked: invalid UTF-8 is refused and valid UTF-8 encodes; every id is in the vocabulary;
 * the decode is valid UTF-8; byte-level BPE gives the text back exactly (with BOS skipped),
 * since control tokens decode to their own text, except for the bytes the vocabulary has no
 * token for, which are dropped (SmolLM2 lacks 0x04 0x06 0x13 0x14 0x16 0x1d; Hugging Face's
 * tokenizers drop them too, llama.cpp aborts). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest for U+0100 on. */
static int byte_char(int b, char *out)
{
    int cp = b, n = 0;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        for (int x = 0; x < b; x++)
            n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
    return 2;
}

/* Which bytes the BPE vocabulary has a token for (computed once; see fuzz_util.h). */
static const bool *bpe_has_byte(void)
{
    static bool has[256], done;
    for (int b = 0; b < 256 && !done; b++) {
        char s[3];
        byte_char(b, s);
        has[b] = tokenizer_find(fuzz_bpe(), s) >= 0;
    }
    done = true;
    return has;
}

/* text without the bytes that have no token; false when one of them is not ASCII (a UTF-8
 * sequence missing a byte would decode to U+FFFD: no exact expectation then) */
static bool bpe_expected(const char *text, size_t len, char *out, size_t *out_len)
{
    const bool *has = bpe_has_byte();
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (has[c])
            out[m++] = (char)c;
        else if (c >= 0x80)
            return false;
    }
    *out_len = m;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    uint8_t flags = data[0];
    const struct tokenizer *t = flags & 1 ? fuzz_spm() : fuzz_bpe();
    bool add_bos = flags & 2, special = flags & 4, spans = flags & 8;
    const char *text = (const char *)data + 3;
    size_t len = size - 3;
    struct tokenizer_span plain = {data[1] % (len + 1), 0};
    plain.len = data[2] % (len - plain.off + 1);

    int32_t *ids = NULL;
    size_t n = 0;
    struct qerr err = {0};
    int rc = spans ? tokenizer_encode_spans(t, text, len, add_bos, &plain, 1, &ids, &n, &err)
                   : tokenizer_encode(t, text, len, add_bos, special, &ids, &n, &err);
    bool valid = fuzz_utf8_valid(text, len);
    if (rc != 0) {
        if (valid && rc != QERR_NOMEM) __builtin_trap(); /* valid text always encodes */
        return 0;
    }
    if (!valid) __builtin_trap(); /* invalid UTF-8 must be refused */
    int32_t vocab = tokenizer_vocab_size(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) __builtin_trap();
    size_t skip = add_bos && n > 0 && ids[0] == tokenizer_bos(t) && tokenizer_bos(t) >= 0;
    char *d = tokenizer_decode(t, ids + skip, n - skip);
    if (!d) abort();
    size_t dlen = strlen(d);
    if (!fuzz_utf8_valid(d, dlen)) __builtin_trap();
    /* byte-level BPE is lossless but for the dropped bytes (a NUL decodes short: C strings) */
    if (!(flags & 1) && !memchr(text, 0, len)) {
        char *want = malloc(len + 1);
        size_t wlen = 0;
        if (!want) abort();
        if (bpe_expected(text, len, want, &wlen) && (dlen != wlen || memcmp(d, want, wlen) != 0))
            __builtin_trap();
        free(want);
    }
    char *quiet = tokenizer_decode_opt(t, ids, n, true);
    if (!quiet || !fuzz_utf8_valid(quiet, strlen(quiet))) __builtin_trap();
    free(quiet);
    free(d);
    free(ids);
    return 0;
}
