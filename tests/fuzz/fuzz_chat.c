/* fuzz_chat: chat templates and conversations through the renderer: chat_template_parse on the
 * template text, chat_format / chat_format_spans on the messages, and chat_encode with a real
 * tokenizer, as a chat request runs them.
 *
 * Input: byte 0: bit 0 add_generation_prompt, bit 1 the tokenizer (the real model's BPE or the
 * SentencePiece one), bit 2 content_special, bit 3 add_bos, bit 4 also CHAT_END_CONTINUE, bit 5
 * also CHAT_END_GENERATE_NO_THINK; then
 * the template text up to a NUL;
 * then messages separated by NULs, each a role byte (system, user, assistant, tool, or an
 * unknown role) and its content. Checked: both formatters give the same text; the content
 * ranges are sorted, disjoint, inside the text, and hold only message text; with valid UTF-8
 * content a formatted conversation always encodes, to ids in the vocabulary; a continued one is
 * a prefix of the closed text, made exactly when the last message is an assistant's. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/chat.h"
#include <cjson/cJSON.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_MSGS = 16 };

static bool inside_some_message(const char *s, size_t n, const struct chat_msg *m, size_t n_msgs);

/* p..e is results of a row joined by join (lj bytes): some cut at join occurrences leaves only
 * pieces inside messages (a result may hold the join's text itself, so every cut is tried) */
static bool joined_results(const char *p, const char *e, const char *join, size_t lj,
                           const struct chat_msg *m, size_t n_msgs)
{
    if (p == e || inside_some_message(p, (size_t)(e - p), m, n_msgs)) return true;
    for (const char *q = p; (q = memmem(q, (size_t)(e - q), join, lj)); q++)
        if ((q == p || inside_some_message(p, (size_t)(q - p), m, n_msgs)) &&
            joined_results(q + lj, e, join, lj, m, n_msgs))
            return true;
    return false;
}

static bool inside_some_message(const char *s, size_t n, const struct chat_msg *m, size_t n_msgs)
{
    for (size_t i = 0; i < n_msgs; i++)
        if (memmem(m[i].content, strlen(m[i].content), s, n)) return true;
    /* a tool result as its format writes it: in Hermes's <tool_response> wrapper (a rewritten
     * user message, results in a row joined by "\n" in one), or as a JSON string (Llama 3's
     * tojson) */
    static const char open[] = "<tool_response>\n", close[] = "\n</tool_response>",
                      join[] = "\n</tool_response>\n<tool_response>\n";
    size_t lo = sizeof open - 1, lc = sizeof close - 1, lj = sizeof join - 1;
    if (n >= lo + lc && !memcmp(s, open, lo) && !memcmp(s + n - lc, close, lc)) {
        return joined_results(s + lo, s + n - lc, join, lj, m, n_msgs);
    }
    cJSON *j = n && s[0] == '"' ? cJSON_ParseWithLength(s, n) : NULL;
    bool in = cJSON_IsString(j) &&
              (!*j->valuestring ||
               inside_some_message(j->valuestring, strlen(j->valuestring), m, n_msgs));
    cJSON_Delete(j);
    return in;
}

/* CHAT_END_GENERATE_NO_THINK: the generating text, then an empty <think> block where the
 * template's model thinks of its own accord (Qwen3's), nothing more elsewhere. */
static void check_no_think(const struct chat_template *ct, const struct chat_msg *msgs, size_t n)
{
    struct qerr err = {0};
    char *gen = NULL, *off = NULL;
    int rc = chat_format(ct, msgs, n, true, &gen, &err);
    int rc2 =
        chat_format_tools(ct, msgs, n, NULL, CHAT_END_GENERATE_NO_THINK, &off, NULL, NULL, &err);
    if (rc != rc2) __builtin_trap();
    if (rc == 0) {
        static const char block[] = "<think>\n\n</think>\n\n";
        size_t len = strlen(gen), extra = ct->think_model ? sizeof block - 1 : 0;
        if (strlen(off) != len + extra || strncmp(gen, off, len) ||
            strcmp(off + len, block + sizeof block - 1 - extra))
            __builtin_trap();
    }
    free(gen);
    free(off);
}

/* CHAT_END_CONTINUE: the closed text cut inside it, its content ranges within the cut. */
static void check_continue(const struct chat_template *ct, const struct chat_msg *msgs, size_t n)
{
    struct qerr err = {0};
    char *closed = NULL, *cont = NULL;
    struct tokenizer_span *spans = NULL;
    size_t n_spans = 0;
    int rc_closed = chat_format(ct, msgs, n, false, &closed, &err);
    int rc = chat_format_tools(ct, msgs, n, NULL, CHAT_END_CONTINUE, &cont, &spans, &n_spans, &err);
    bool assistant_last = n > 0 && !strcmp(msgs[n - 1].role, "assistant");
    if (rc == 0) {
        size_t len = strlen(cont);
        if (rc_closed || !assistant_last || strncmp(closed, cont, len)) __builtin_trap();
        for (size_t i = 0; i < n_spans; i++)
            if (spans[i].off + spans[i].len > len) __builtin_trap();
    } else if ((rc_closed == 0 && assistant_last && rc != QERR_NOMEM) || !err.msg[0]) {
        __builtin_trap();
    }
    free(closed);
    free(cont);
    free(spans);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool gen = data[0] & 1, content_special = data[0] & 4, add_bos = data[0] & 8;
    const struct tokenizer *tok = data[0] & 2 ? fuzz_spm() : fuzz_bpe();
    /* a NUL-terminated copy to cut into fields */
    char *buf = malloc(size);
    if (!buf) abort();
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    char *end = buf + size - 1;
    const char *tmpl = buf;
    size_t tmpl_len = strlen(buf);
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    struct chat_msg msgs[MAX_MSGS] = {0};
    size_t n_msgs = 0;
    bool valid = true;
    for (char *p = buf + tmpl_len + 1; p < end && n_msgs < MAX_MSGS; p += strlen(p) + 1) {
        msgs[n_msgs].role = roles[(unsigned char)*p % 5];
        msgs[n_msgs].content = *p ? p + 1 : p;
        valid &= fuzz_utf8_valid(msgs[n_msgs].content, strlen(msgs[n_msgs].content)) &&
                 (unsigned char)*p % 5 != 4;
        n_msgs++;
    }

    struct chat_template ct;
    struct qerr err = {0};
    if (chat_template_parse(tmpl, tmpl_len, &ct, &err)) {
        if (!err.msg[0]) __builtin_trap();
        free(buf);
        return 0;
    }
    char *text = NULL, *text2 = NULL;
    struct tokenizer_span *spans = NULL;
    size_t n_spans = 0;
    int rc = chat_format(&ct, msgs, n_msgs, gen, &text, &err);
    int rc2 = chat_format_spans(&ct, msgs, n_msgs, gen, &text2, &spans, &n_spans, &err);
    if (rc != rc2) __builtin_trap();
    if (rc == 0) {
        size_t len = strlen(text);
        if (strcmp(text, text2) != 0) __builtin_trap();
        for (size_t i = 0; i < n_spans; i++) {
            if (spans[i].off + spans[i].len > len) __builtin_trap();
            if (i && spans[i].off < spans[i - 1].off + spans[i - 1].len) __builtin_trap();
            if (!inside_some_message(text + spans[i].off, spans[i].len, msgs, n_msgs))
                __builtin_trap();
        }
        int32_t *ids = NULL;
        size_t n_ids = 0;
        rc = chat_encode(&ct, tok, msgs, n_msgs, gen, add_bos, content_special, &ids, &n_ids, &err);
        /* the template's default system prompt is text from the file, checked here too */
        valid &= fuzz_utf8_valid(text, len);
        if (rc && valid && rc != QERR_NOMEM) __builtin_trap();
        for (size_t i = 0; rc == 0 && i < n_ids; i++)
            if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(tok)) __builtin_trap();
        free(ids);
    } else if (!err.msg[0]) {
        __builtin_trap();
    }
    if (data[0] & 16) check_continue(&ct, msgs, n_msgs);
    if (data[0] & 32) check_no_think(&ct, msgs, n_msgs);
    free(text);
    free(text2);
    free(spans);
    chat_template_free(&ct);
    free(buf);
    return 0;
}
