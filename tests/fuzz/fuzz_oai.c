/* fuzz_oai: request bodies through the OpenAI parser and validator, as the daemon's handlers run
 * them before any model work: oai_parse for the endpoint (the first byte mod 5 picks completions,
 * chat, tokenize, detokenize or responses; the rest is the body), then what a parsed request leads
 * to without the engine: the conversation and its tools written by a ChatML, a Llama 3 and a
 * Mistral template and Qwen3's ChatML, the grammar its response_format / structured_outputs /
 * tool_choice compiles to (JSON Schema, regex, choice, GBNF, tool calls in each template's format),
 * and the error body of a refusal. The body is also read as a model's output for tool calls in
 * every format, whole and as a stream cut in two. Every refusal must be a 4xx naming a reason, or a
 * 500 for memory. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/grammar.h"
#include "../../server/oai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const enum oai_kind kinds[] = {OAI_COMPLETION, OAI_CHAT, OAI_TOKENIZE, OAI_DETOKENIZE,
                                          OAI_RESPONSES};
    enum oai_kind kind = kinds[data[0] % 5];
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
        static const char *const tmpls[] = {"<|im_start|>", "<|start_header_id|><|end_header_id|>",
                                            "[INST] [TOOL_CALLS]", "[INST][TOOL_CALLS][ARGS]",
                                            "<|im_start|> reasoning_content enable_thinking"};
        enum chat_end end = r.enable_thinking == 0 ? CHAT_END_GENERATE_NO_THINK : CHAT_END_GENERATE;
        char *tools = r.n_tools ? oai_tools_json(&r) : NULL;
        for (size_t t = 0; t < sizeof tmpls / sizeof tmpls[0]; t++) {
            struct chat_template ct;
            struct qerr q = {0};
            if (chat_template_parse(tmpls[t], strlen(tmpls[t]), &ct, &q)) __builtin_trap();
            char *text = NULL;
            if (r.n_msgs &&
                chat_format_tools(&ct, r.msgs, r.n_msgs, tools, end, &text, NULL, NULL, &q) &&
                !q.msg[0])
                __builtin_trap();
            free(text);
            if (oai_tools_format(&r, &ct, &e) == 0 && r.constraint.kind >= 0) {
                struct grammar *g = NULL;
                if (grammar_compile((enum grammar_kind)r.constraint.kind, r.constraint.text,
                                    r.constraint.len, &g, &q) == 0)
                    grammar_unref(g);
                else if (!q.msg[0])
                    __builtin_trap();
            }
            chat_template_free(&ct);
        }
        free(tools);
        oai_request_free(&r);
    }
    /* the body as a reasoning model's output, either way the block may open */
    for (int optional = 0; optional < 2; optional++) {
        struct oai_span rs, cs;
        if (oai_think_split(body, len, optional, &rs, &cs) && cs.off + cs.len > len)
            __builtin_trap();
        if (rs.off + rs.len > len) __builtin_trap();
    }
    static const struct oai_meta meta = {.kind = OAI_CHAT, .id = "c", .model = "m", .logprobs = -1};
    for (int fmt = CHAT_TOOLS_HERMES; fmt <= CHAT_TOOLS_MISTRAL_ARGS; fmt++) {
        struct oai_tool_call *calls = NULL;
        size_t content_len = 0;
        int n = oai_parse_tool_calls((enum chat_tool_format)fmt, body, len, &calls, &content_len);
        if (n > 0) {
            if (content_len > len) __builtin_trap();
            oai_tool_calls_free(calls, (size_t)n);
        }
        size_t sent = 0;
        free(oai_tools_chunks(&meta, (enum chat_tool_format)fmt, 0, body, len / 2, &sent,
                              FINISH_NONE, NULL, false));
        if (sent > len / 2) __builtin_trap();
        const struct oai_stop stop = {.by_token = true, .token = 2};
        free(oai_tools_chunks(&meta, (enum chat_tool_format)fmt, 0, body, len, &sent, FINISH_STOP,
                              &stop, false));
    }
    return 0;
}
