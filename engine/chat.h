/* chat: applies a model's chat template to a list of messages.
 *
 * Templates are Jinja strings in tokenizer.chat_template; rather than run Jinja, quern
 * recognizes the common families by their markers and formats them in C. An unrecognized
 * template is an error, never a silently wrong prompt. */
#ifndef QUERN_CHAT_H
#define QUERN_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "../quant/qerr.h"
#include "tokenizer.h"

enum chat_kind {
    CHAT_CHATML, /* <|im_start|>role\ncontent<|im_end|>\n */
    CHAT_LLAMA3, /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    CHAT_LLAMA2, /* <s>[INST] <<SYS>>..<</SYS>> user [/INST] assistant</s> (also Mistral) */
    /* system<｜User｜>user<｜Assistant｜>assistant<｜end▁of▁sentence｜> (DeepSeek-V3, and the
     * R1 distills of Llama, whose generation prompt opens a <think> block) */
    CHAT_DEEPSEEK3,
    /* <|system|>\nsystem</s>\n<|user|>\nuser</s>\n<|assistant|>\n (Zephyr, TinyLlama-Chat) */
    CHAT_ZEPHYR,
    /* <|system|>\nsystem<|end|>\n<|user|>\nuser<|end|>\n<|assistant|>\n (Phi-3.5; a closed
     * conversation ends with the tokenizer's <|endoftext|>) */
    CHAT_PHI3,
    /* <start_of_turn>user\nuser<end_of_turn>\n<start_of_turn>model\n (Gemma 2 and 3: no system
     * turn, its text opens the next user turn) */
    CHAT_GEMMA,
    /* <|start_of_role|>role<|end_of_role|>content<|end_of_text|>\n, then
     * <|start_of_role|>assistant<|end_of_role|> (IBM Granite 3.x; no default system turn) */
    CHAT_GRANITE,
};

/* Spellings within CHAT_LLAMA2, as llama.cpp tells them apart (src/llama-chat.cpp). */
enum chat_variant {
    CHAT_VARIANT_NONE = 0,
    CHAT_VARIANT_LLAMA2,            /* no system support: system text prefixes the first turn */
    CHAT_VARIANT_LLAMA2_SYS,        /* <<SYS>>\n...\n<</SYS>>\n\n */
    CHAT_VARIANT_LLAMA2_SYS_BOS,    /* ... and <s> before each later [INST] */
    CHAT_VARIANT_LLAMA2_SYS_STRIP,  /* ... and contents stripped */
    CHAT_VARIANT_MISTRAL_V1,        /* " [INST] user [/INST] answer</s>" */
    CHAT_VARIANT_MISTRAL_V3,        /* "[INST] user[/INST] answer</s>" */
    CHAT_VARIANT_MISTRAL_V3_TEKKEN, /* "[INST]user[/INST]answer</s>" */
    CHAT_VARIANT_MISTRAL_V7,        /* [SYSTEM_PROMPT] ..[/SYSTEM_PROMPT][INST] ..[/INST] */
};

/* How the template's model calls tools (engine/chat_tools.c), chosen by the template's markers:
 * [TOOL_CALLS] means Mistral's format ([ARGS] its newer spelling), a Llama-3 template the JSON
 * format of Llama 3.1/3.2, anything else (ChatML first) Hermes/Qwen's <tool_call> blocks. */
enum chat_tool_format {
    CHAT_TOOLS_HERMES,       /* <tool_call>\n{"name": f, "arguments": {..}}\n</tool_call> */
    CHAT_TOOLS_LLAMA3,       /* {"name": f, "parameters": {..}} (maybe after <|python_tag|>) */
    CHAT_TOOLS_MISTRAL,      /* [TOOL_CALLS] [{"name": f, "arguments": {..}}, ...] */
    CHAT_TOOLS_MISTRAL_ARGS, /* [TOOL_CALLS]f[ARGS]{..} per call */
};

struct chat_template {
    enum chat_kind kind;
    enum chat_tool_format tools;
    enum chat_variant variant; /* CHAT_VARIANT_NONE unless kind is CHAT_LLAMA2 */
    /* System prompt the template inserts when the conversation has none (e.g. SmolLM2's
     * "You are a helpful AI assistant named SmolLM, trained by Hugging Face"); NULL if none.
     * Owned by the struct. */
    char *default_system;
    /* The generation prompt opens the model's reasoning (DeepSeek-R1's "<think>\n"): the answer
     * starts inside a <think> block and its text after "</think>" is the reply. */
    bool think;
    /* The model opens a <think> block of its own when it reasons (Qwen3's ChatML): an answer's
     * reasoning is kept only inside the tool loop after the last question (its reasoning_content,
     * or the block at the start of its text), and CHAT_END_GENERATE_NO_THINK closes an empty
     * block after the generation prompt (enable_thinking false). */
    bool think_model;
    /* CHAT_PHI3: a system message with empty content is left out (Phi-3.5's template) */
    bool skip_empty_system;
    /* CHAT_GEMMA: Gemma 3's system rule (its template's first_user_prefix): a first system
     * message's text as it is and "\n\n" open the first user turn, and text parts are trimmed
     * one by one. Otherwise llama.cpp's rule for Gemma 2, whose own template refuses a system
     * message: every system text trimmed, joined, and "\n\n" open the next user turn. */
    bool first_user_prefix;
};

/* One tool call an assistant message made (as the request sent it back). */
struct chat_call {
    const char *id;        /* may be NULL (Mistral's formats need one: "" is written) */
    const char *name;      /* the function */
    const char *arguments; /* JSON text of an object; NULL or "" mean {} */
};

struct chat_msg {
    const char *role;              /* "system", "user", "assistant" or "tool" */
    const char *content;           /* may be NULL only for an assistant message with calls */
    const struct chat_call *calls; /* assistant: the tool calls it made, n_calls of them */
    size_t n_calls;
    const char *call_id; /* tool: the id of the call this result answers (NULL: none) */
    /* assistant: its reasoning as the request sent it back (reasoning_content), NULL if none;
     * only templates that write it (think_model) read it */
    const char *reasoning;
    /* content sent as a list of text parts: each part's text (content is their concatenation),
     * for a template that writes them apart (Gemma 3's trims each); NULL and 0 otherwise */
    const char *const *parts;
    size_t n_parts;
};

/* Recognizes the template text (len bytes); QERR_UNSUPPORTED naming the template otherwise. */
int chat_template_parse(const char *tmpl, size_t len, struct chat_template *out, struct qerr *err);
void chat_template_free(struct chat_template *t);
/* The format named as chat_template_name names it ("chatml", "llama3", "mistral-v7",
 * "deepseek-r1", ...), as llama.cpp's --chat-template NAME; QERR_UNSUPPORTED listing the names
 * otherwise. */
int chat_template_by_name(const char *name, struct chat_template *out, struct qerr *err);
const char *chat_kind_name(enum chat_kind k);
/* The precise format, e.g. "chatml", "llama3", "llama2-sys", "mistral-v7". */
const char *chat_template_name(const struct chat_template *t);

/* Where a formatted conversation ends. */
enum chat_end {
    CHAT_END_CLOSED,   /* after the last message's end of turn (add_generation_prompt false) */
    CHAT_END_GENERATE, /* then the start of an assistant turn (add_generation_prompt) */
    /* inside the last message, an assistant's text, right after its content: the model goes on
     * writing it (vLLM's and transformers' continue_final_message, llama.cpp's assistant
     * prefill). The text is the closed one cut there, as transformers cuts it. */
    CHAT_END_CONTINUE,
    /* CHAT_END_GENERATE with the model's reasoning switched off (chat_template_kwargs
     * enable_thinking false): a think_model template closes an empty <think> block after the
     * generation prompt, as Qwen3's writes "<think>\n\n</think>\n\n"; others generate as usual */
    CHAT_END_GENERATE_NO_THINK,
};

/* Formats the messages as the template would with add_generation_prompt; *out is malloc'd and
 * NUL-terminated (caller frees). An unknown role is QERR_INVALID naming it. The text never
 * starts with BOS (<s>, <|begin_of_text|>): the caller adds it per tokenizer_adds_bos. Do not
 * encode it with parse_special as a whole: message content would then name control tokens
 * (chat_encode keeps them apart). */
int chat_format(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                bool add_generation_prompt, char **out, struct qerr *err);

/* chat_format, also reporting where message content landed in *out: *content (malloc'd, caller
 * frees; NULL when *n_content is 0) holds the byte ranges, in order, of every non-empty content
 * as written (trimmed where the template trims). Everything outside them is the template's. */
int chat_format_spans(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                      bool add_generation_prompt, char **out, struct tokenizer_span **content,
                      size_t *n_content, struct qerr *err);

/* Formats the messages and encodes the text: the template's markers become control tokens and
 * message content is plain text (tokenizer_encode_spans), so a message cannot forge a turn;
 * with content_special the content may name control tokens too (llama.cpp's and vLLM's
 * behaviour, an operator's opt-in). add_bos prepends BOS when the model has one. *ids is
 * malloc'd (caller frees). Errors are chat_format's and tokenizer_encode's. */
int chat_encode(const struct chat_template *t, const struct tokenizer *tok,
                const struct chat_msg *msgs, size_t n, bool add_generation_prompt, bool add_bos,
                bool content_special, int32_t **ids, size_t *n_ids, struct qerr *err);

/* chat_format_spans and chat_encode with the tools offered: tools is the JSON text of a list of
 * function objects ({"name","description","parameters"}), or NULL for none. Each template's
 * format writes them where its Jinja does (tools, calls and results: engine/chat_tools.c);
 * a malformed list or arguments text is QERR_INVALID naming it, and so is CHAT_END_CONTINUE
 * after a last message that is not an assistant's text. */
int chat_format_tools(const struct chat_template *t, const struct chat_msg *msgs, size_t n,
                      const char *tools, enum chat_end end, char **out,
                      struct tokenizer_span **content, size_t *n_content, struct qerr *err);
int chat_encode_tools(const struct chat_template *t, const struct tokenizer *tok,
                      const struct chat_msg *msgs, size_t n, const char *tools, enum chat_end end,
                      bool add_bos, bool content_special, int32_t **ids, size_t *n_ids,
                      struct qerr *err);
const char *chat_tool_format_name(enum chat_tool_format f);

#endif
