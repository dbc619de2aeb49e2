/* oai_think: a reasoning model's output (the chat template opens a <think> block, DeepSeek-R1,
 * or the model may open one, Qwen3) split into its reasoning and its answer, as vLLM's
 * deepseek_r1 and qwen3 reasoning parsers and llama.cpp's deepseek reasoning format split it:
 * up to "</think>" is reasoning_content, what follows is content. A "<think>" the model writes
 * itself at the start is left out; where the block is optional and the text does not start
 * with one, all of it is content. */
#include <string.h>

#include "oai.h"

static const char think_open[] = "<think>", think_end[] = "</think>";

/* The longest end of text[0..len) that is a proper prefix of tag: bytes to hold back. */
static size_t partial_tag(const char *text, size_t len, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = len < t - 1 ? len : t - 1; k > 0; k--)
        if (!memcmp(text + len - k, tag, k)) return k;
    return 0;
}

void oai_think_next(struct oai_think *t, const char *text, size_t len, bool done,
                    struct oai_span *reasoning, struct oai_span *content)
{
    *reasoning = *content = (struct oai_span){0, 0};
    if (!t->started) {
        /* a "<think>" of the model's own: skipped once it is whole, held while it may be; an
         * optional block that the text does not open: no reasoning at all */
        size_t o = sizeof think_open - 1;
        if (len >= o && !memcmp(text, think_open, o)) {
            t->sent = o;
            t->started = true;
        } else if (len < o && !memcmp(text, think_open, len) && !done) {
            return;
        } else {
            t->started = true;
            t->ended = t->skipped = t->optional;
        }
    }
    if (!t->ended) {
        size_t from = t->sent, e = sizeof think_end - 1;
        const char *hit = len > from ? memmem(text + from, len - from, think_end, e) : NULL;
        if (hit) {
            *reasoning = (struct oai_span){from, (size_t)(hit - text) - from};
            t->ended = true;
            t->sent = (size_t)(hit - text) + e;
        } else {
            size_t keep = done ? 0 : partial_tag(text + from, len - from, think_end);
            *reasoning = (struct oai_span){from, len - from - keep};
            t->sent = len - keep;
            return;
        }
    }
    if (len > t->sent) *content = (struct oai_span){t->sent, len - t->sent};
    t->sent = len;
}

bool oai_think_split(const char *text, size_t len, bool optional, struct oai_span *reasoning,
                     struct oai_span *content)
{
    struct oai_think t = {.optional = optional};
    oai_think_next(&t, text, len, true, reasoning, content);
    return t.ended;
}
