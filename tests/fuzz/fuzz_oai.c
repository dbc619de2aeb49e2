/* fuzz_oai: request bodies through the OpenAI parser and validator, as the daemon's handlers run
 * them before any model work: oai_parse for the endpoint (the first byte picks completions, chat,
 * tokenize or detokenize; the rest is the body), then what a parsed request leads to without
 * the engine: the tools' system text, the grammar its response_format / structured_outputs /
 * tool_choice compiles to (JSON Schema, regex, choice, GBNF), and the error body of a refusal.
 * The body is also read as a model's output for <tool_call> blocks. Every refusal must be a 4xx
 * naming a reason, or a 500 for memory. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/grammar.h"
#include "../../server/oai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const enum oai_kind kinds[] = {OAI_COMPLETION, OAI_CHAT, OAI_TOKENIZE, OAI_DETOKENIZE};
    enum oai_kind kind = kinds[data[0] & 3];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    struct oai_request r;
    struct oai_error e = {0};
    if (oai_parse(kind, body, len, &r, &e)) {
        if (e.status < 400 || e.status > 599 || !e.q.msg[0]) __builtin_trap();
        free(oai_write_error(&e));
        free(oai_write_error_chunk(&e));
    } else {
        if (r.kind != kind || r.n < 1) __builtin_trap();
        if (r.n_tools) free(oai_tools_system(&r, r.n_msgs ? r.msgs[0].content : NULL));
        if (r.constraint.kind >= 0) {
            struct grammar *g = NULL;
            struct qerr q = {0};
            if (grammar_compile((enum grammar_kind)r.constraint.kind, r.constraint.text,
                                r.constraint.len, &g, &q) == 0)
                grammar_unref(g);
            else if (!q.msg[0])
                __builtin_trap();
        }
        oai_request_free(&r);
    }
    struct oai_tool_call *calls = NULL;
    size_t content_len = 0;
    int n = oai_parse_tool_calls(body, len, &calls, &content_len);
    if (n > 0) {
        if (content_len > len) __builtin_trap();
        oai_tool_calls_free(calls, (size_t)n);
    }
    return 0;
}
