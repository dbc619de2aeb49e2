/* oai: the OpenAI-compatible request and response shapes, with no HTTP and no engine in them.
 *
 * oai_parse turns a request body into a struct oai_request, checking every field it knows: a
 * known field of the wrong type or out of range is an oai_error naming the field (param), with
 * the HTTP status the server answers. Unknown fields are ignored; JSON null means "not given".
 * Strings in the struct point into the parsed JSON tree the struct owns.
 *
 * The writers build response bodies and SSE chunks (each "data: {...}\n\n") as malloc'd
 * strings the caller frees; NULL means out of memory. Token texts for logprobs come through an
 * oai_vocab callback so the writers can be tested without a model. */
#ifndef QUERN_OAI_H
#define QUERN_OAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/chat.h"
#include "../engine/engine.h"
#include "../engine/sample.h"
#include "sbuf.h"

struct cJSON;

enum oai_kind {
    OAI_COMPLETION, /* POST /v1/completions */
    OAI_CHAT,       /* POST /v1/chat/completions */
    OAI_TOKENIZE,   /* POST /tokenize: prompt or messages */
    OAI_DETOKENIZE, /* POST /detokenize: tokens */
    OAI_EMBEDDING,  /* POST /v1/embeddings: input, encoding_format */
    OAI_RESPONSES,  /* POST /v1/responses: instructions + input as a chat (msgs) */
};

#define OAI_MAX_CHOICES  64 /* prompts x n in one request */
#define OAI_MAX_PROMPTS  64
#define OAI_MAX_INPUTS   2048 /* embeddings inputs in one request (OpenAI's limit) */
#define OAI_MAX_LOGPROBS 20   /* completions logprobs and chat top_logprobs */

struct oai_error {
    struct qerr q;    /* code and one-line message naming the field */
    int status;       /* the HTTP status to answer with */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code; /* NULL or a machine-readable code ("context_length_exceeded", ...) */
    char param[64];   /* the request field at fault, "" for none */
};

/* Fills e and returns QERR_INVALID (status 4xx) or QERR_NOMEM/other codes as given. */
int oai_error_set(struct oai_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

struct oai_prompt {
    const char *text; /* a text prompt (in the JSON tree; UTF-8, may hold NULs up to text_len) */
    size_t text_len;
    int32_t *ids; /* a token-id prompt (owned; ids >= 0, not yet checked against the vocab) */
    size_t n_ids;
};

/* Structured outputs (server/oai_structured.c): the grammar a request asks for, from
 * response_format, vLLM's structured_outputs, or tool_choice required / a named function. */
struct oai_constraint {
    int kind;   /* -1: none; else an enum grammar_kind */
    char *text; /* owned: a schema printed compactly, a regex, a JSON choice list, a tool list */
    size_t len;
    char param[64]; /* the field it came from, named in compile errors */
};

/* Tool calling (server/oai_tools.c). */
enum oai_tool_choice { OAI_TOOLS_AUTO, OAI_TOOLS_NONE, OAI_TOOLS_REQUIRED, OAI_TOOLS_NAMED };

struct oai_tool {
    const char *name;             /* in the JSON tree */
    const struct cJSON *function; /* the "function" object as sent (rendered into the prompt) */
};

#define OAI_IGNORED_MAX 128

struct oai_request {
    enum oai_kind kind;
    struct cJSON *root; /* owned */
    const char *model;  /* NULL when not given */
    /* The top-level members the endpoint does not read (accepted, with no effect), comma
     * separated in request order for the log: names of [A-Za-z0-9_.-] up to 40 characters,
     * others counted ("+2"), "..." when the list does not fit. "" when none. */
    char ignored[OAI_IGNORED_MAX];

    /* completions, tokenize, embeddings ("input"): one or more prompts */
    struct oai_prompt *prompts; /* owned */
    size_t n_prompts;
    /* chat, tokenize: the conversation; content strings are in the tree or in owned[] */
    struct chat_msg *msgs; /* owned */
    char **owned;          /* [n_msgs] content joined from parts, or NULL */
    const char **parts;    /* owned: the parts' texts (in the tree), msgs[i].parts point in */
    size_t n_msgs;
    struct chat_call *calls; /* owned: the assistant messages' tool calls (msgs point in) */
    size_t n_calls;
    /* detokenize */
    int32_t *tokens; /* owned */
    size_t n_tokens;

    int n;               /* choices per prompt (1..) */
    int max_tokens;      /* -1: not given (completions default 16, chat: the rest of ctx) */
    bool echo;           /* completions: prepend the prompt to the text */
    int logprobs;        /* -1: none; else how many top alternatives per token (0..20) */
    int prompt_logprobs; /* vLLM's prompt_logprobs: -1 none; else top-N of each prompt token */
    bool stream, include_usage;
    struct sample_params sample;
    bool has_seed;
    bool ignore_eos;
    bool no_spec; /* "speculative": false: no speculative decoding for this request */
    int priority; /* vLLM's: lower is admitted sooner (gen_request.priority), default 0 */
    /* vLLM's truncate_prompt_tokens: 0 none, k > 0 keep each prompt's last k tokens, -1 the
     * context's length */
    int truncate_prompt;
    int n_stop;
    const char *stop[ENGINE_MAX_STOPS];
    bool include_stop_str;         /* vLLM's include_stop_str_in_output */
    struct logit_bias *logit_bias; /* owned; [n_logit_bias] */
    int n_logit_bias;
    int32_t *allowed; /* vLLM's allowed_token_ids (owned; [n_allowed]) */
    int n_allowed;
    const char *bad_words[ENGINE_MAX_BAD_WORDS / 2]; /* vLLM's bad_words (in the tree) */
    int n_bad_words;
    int min_tokens; /* vLLM's: no end of generation or stop id before this many tokens */
    int n_stop_ids; /* vLLM's stop_token_ids */
    int32_t stop_ids[ENGINE_MAX_STOPS];
    bool base64;              /* embeddings: encoding_format "base64" */
    const char *instructions; /* responses: the system text (in the tree), or NULL */
    bool add_special;         /* tokenize: add BOS (add_special_tokens, default true) */
    /* chat, and tokenize with messages: add_generation_prompt (default true) and vLLM's
     * continue_final_message (default false) */
    enum chat_end chat_end;
    /* chat_template_kwargs.enable_thinking: -1 not given (the server's default), 0 or 1 */
    int enable_thinking;
    struct oai_constraint constraint;
    const struct cJSON *text_format; /* responses: a text.format other than text (in the tree) */
    /* OpenAI's Predicted Outputs: prediction.content (in the tree, or joined parts owned by
     * prediction_owned), or NULL */
    const char *prediction;
    size_t prediction_len;
    char *prediction_owned;
    struct oai_tool *tools; /* owned array; chat only */
    size_t n_tools;
    enum oai_tool_choice tool_choice;
    const char *tool_choice_name; /* OAI_TOOLS_NAMED */
    bool parallel_tool_calls;     /* default true */
};

/* Fills r->constraint from response_format / structured_outputs (400 naming the field). */
int oai_parse_structured(const struct cJSON *root, struct oai_request *r, struct oai_error *e);
/* The same from the Responses API's text.format ({"type": "json_schema", "name", "schema",
 * "strict"} or {"type": "json_object"}), keeping it in r->text_format for the response's echo. */
int oai_parse_text_format(const struct cJSON *root, struct oai_request *r, struct oai_error *e);
/* Fills r->tools, tool_choice, parallel_tool_calls and, for required or a named function, the
 * tool-call constraint. */
int oai_parse_tools(const struct cJSON *root, struct oai_request *r, struct oai_error *e);
/* How many tool calls the message (a JSON object) carries: room for oai_tool_message. */
size_t oai_count_tool_calls(const struct cJSON *msg);
/* A message of role "tool" (content and tool_call_id), or an assistant message with tool_calls
 * (each call's id, name and arguments into calls[], which must have oai_count_tool_calls
 * entries), into *m: 1 when it was one of those, 0 for other messages (m untouched), or an
 * error naming the field. Strings stay in the JSON tree. */
int oai_tool_message(const struct cJSON *msg, size_t i, struct chat_msg *m, struct chat_call *calls,
                     struct oai_error *e);
/* Makes the tool-call constraint again in the format of template t (the grammar oai_parse_tools
 * made is Hermes's), when the constraint came from the tools. */
int oai_tools_format(struct oai_request *r, const struct chat_template *t, struct oai_error *e);
/* The offered functions as a JSON list (chat_format_tools's tools): malloc'd, NULL on OOM. */
char *oai_tools_json(const struct oai_request *r);

/* Tool calls found in a finished chat output. */
struct oai_tool_call {
    char *name, *arguments; /* owned; arguments compact JSON */
};
/* Parses text for the calls of format fmt, by its markers: Hermes <tool_call>{"name",
 * "arguments"}</tool_call> blocks; Llama 3 {"name", "parameters"} objects (joined by ';') making
 * up the whole output or following <|python_tag|>; Mistral [TOOL_CALLS] with a JSON list of
 * {"name", "arguments"} or f[ARGS]{...} calls. Returns the count (0: none or not well-formed,
 * the text is content), with *calls malloc'd and *content_len the length of the text before
 * the first call (the content that goes with the calls). */
int oai_parse_tool_calls(enum chat_tool_format fmt, const char *text, size_t len,
                         struct oai_tool_call **calls, size_t *content_len);
void oai_tool_calls_free(struct oai_tool_call *c, size_t n);

/* Parses and validates body[0..len) for the endpoint kind. On failure *out is left empty (no
 * free needed) and e says why; on success free *out with oai_request_free. */
int oai_parse(enum oai_kind kind, const char *body, size_t len, struct oai_request *out,
              struct oai_error *e);
void oai_request_free(struct oai_request *r);

/* --- responses --- */

/* A token's raw bytes (as tokenizer_token_bytes): byte count, possibly > cap, or -1. */
struct oai_vocab {
    int (*token_bytes)(const void *ctx, int32_t id, char *buf, size_t cap);
    const void *ctx;
};

/* One generated token's log-probabilities. */
struct oai_lp {
    int32_t token;
    float logprob;
    bool null_lp;       /* the first prompt token: nothing precedes it, its logprob is null */
    int rank;           /* prompt tokens: 1 + the tokens more likely (vLLM's prompt_logprobs) */
    size_t text_offset; /* where the token's text begins in its choice's text */
    int n_top;
    struct token_logprob top[OAI_MAX_LOGPROBS];
};

/* vLLM's stop_reason of a finished choice: the stop string matched, else the stop id sampled,
 * else null (end of generation, the length, ...). */
struct oai_stop {
    const char *text; /* NULL: no stop string */
    int32_t token;
    bool by_token; /* token is meaningful */
};

/* A choice being collected for a non-streamed response. */
struct oai_choice {
    struct sbuf text;
    enum finish_reason finish;
    struct oai_stop stop;
    struct oai_lp *lp; /* owned */
    size_t n_lp, cap_lp;
    struct oai_lp *plp; /* owned: prompt_logprobs entries, the first one null */
    size_t n_plp, cap_plp;
};

/* Appends a token's logprobs (copying at most OAI_MAX_LOGPROBS alternatives). */
int oai_choice_add_lp(struct oai_choice *c, int32_t token, float logprob, size_t text_offset,
                      const struct token_logprob *top, int n_top);
/* Appends a copy of one to the list (*lp, *n, *cap). */
int oai_lp_push(struct oai_lp **lp, size_t *n, size_t *cap, const struct oai_lp *one);
void oai_choice_free(struct oai_choice *c);

/* How a chat answer's text splits into reasoning and content (oai_think): not at all, after
 * a <think> block the prompt opened, or after one the model may open itself. */
enum oai_reasoning {
    OAI_REASONING_NONE = 0,
    OAI_REASONING_OPEN,     /* chat_template.think (DeepSeek-R1) */
    OAI_REASONING_OPTIONAL, /* chat_template.think_model (Qwen3) */
};

struct oai_meta {
    enum oai_kind kind; /* OAI_COMPLETION or OAI_CHAT */
    const char *id;     /* "cmpl-..." / "chatcmpl-..." */
    const char *model;
    long long created;    /* unix seconds */
    int logprobs;         /* -1: none; else top-N */
    bool prompt_logprobs; /* each choice has "prompt_logprobs" (vLLM's), with prompt_top */
    int prompt_top;       /* alternatives per prompt token (0..20) */
    struct oai_vocab vocab;
    enum oai_reasoning reasoning; /* chat: the output splits into reasoning_content and content */
};

/* Reasoning models (server/oai_think.c): where the chat template opens a <think> block
 * (chat_template.think), the output up to "</think>" is the message's reasoning_content and
 * what follows its content (vLLM's deepseek_r1 parser, llama.cpp's deepseek format); a
 * "<think>" the model writes first is left out. Where the model opens the block itself
 * (chat_template.think_model, Qwen3: optional), the output splits so only when it starts with
 * "<think>", and is all content otherwise (vLLM's qwen3 parser, llama.cpp's deepseek format). */
struct oai_span {
    size_t off, len;
};
struct oai_think {
    bool optional; /* set by the caller: the model may answer without a <think> block */
    bool started, ended;
    bool skipped; /* optional: the text opened no block (no reasoning at all) */
    size_t sent;  /* bytes of the output already given out (as reasoning, content or skipped) */
};
/* The next pieces of a streamed output whose text so far is text[0..len) (the same bytes as
 * before, grown; done: the output is whole): the reasoning and the content not yet given out,
 * either maybe empty. Holds back what may be the start of "</think>" (or of a first
 * "<think>") until the next bytes tell. */
void oai_think_next(struct oai_think *t, const char *text, size_t len, bool done,
                    struct oai_span *reasoning, struct oai_span *content);
/* A whole output: its reasoning and content; false when the reasoning never ended (cut by
 * max_tokens: all of it is reasoning, and content is null). optional: as oai_think's. */
bool oai_think_split(const char *text, size_t len, bool optional, struct oai_span *reasoning,
                     struct oai_span *content);

struct oai_usage {
    int prompt_tokens, completion_tokens, cached_tokens;
    bool reasoning;       /* a reasoning template's answers: reasoning_tokens is reported */
    int reasoning_tokens; /* of the completion tokens, the reasoning's (oai_think) */
    int accepted_tokens;  /* completion tokens a speculative draft had guessed */
    int rejected_tokens;  /* drafted tokens that were not kept */
};

const char *oai_finish_name(enum finish_reason r); /* NULL for FINISH_NONE */

char *oai_write_response(const struct oai_meta *m, const struct oai_choice *c, size_t n,
                         const struct oai_usage *u);
/* One streamed chunk for choice index: text[0..len) (chat: the delta content, with the role when
 * role is non-NULL), finish (FINISH_NONE: null) with its stop_reason (stop, NULL: null; only
 * when finish is not FINISH_NONE), logprobs lp[0..n_lp) (ignored unless m->logprobs >= 0)
 * and, with usage_null, "usage":null (stream_options.include_usage). */
char *oai_write_chunk(const struct oai_meta *m, int index, const char *text, size_t len,
                      const char *role, enum finish_reason finish, const struct oai_stop *stop,
                      const struct oai_lp *lp, size_t n_lp, bool usage_null);
/* A streamed chat chunk of reasoning: delta.reasoning_content, with logprobs lp[0..n_lp). */
char *oai_write_reasoning_chunk(const struct oai_meta *m, int index, const char *text, size_t len,
                                const struct oai_lp *lp, size_t n_lp, bool usage_null);
/* The final usage chunk: empty choices, usage filled. */
char *oai_write_usage_chunk(const struct oai_meta *m, const struct oai_usage *u);
#define OAI_SSE_DONE "data: [DONE]\n\n"

/* {"error":{"message","type","param","code"}} */
char *oai_write_error(const struct oai_error *e);
/* The same as an SSE event, for an error after the stream began. */
char *oai_write_error_chunk(const struct oai_error *e);

/* GET /v1/models: one card per served name (names[0] is every card's "root"); GET
 * /v1/models/{id}: the card of name. Cards carry created, owned_by and the context length (as
 * vLLM's max_model_len and as context_length). */
/* POST /v1/embeddings: vecs[n][dim] as float lists or base64 of little-endian float32. */
char *oai_write_embeddings(const float *const *vecs, size_t n, int dim, bool base64,
                           const char *model, int prompt_tokens);

/* GET /v1/models: the served names, then the LoRA adapters (their "parent" the first name). */
char *oai_write_models(const char *const *names, int n, const char *const *loras, int n_loras,
                       long long created, int ctx_len);
char *oai_write_model(const char *name, const char *root, const char *parent, long long created,
                      int ctx_len);
char *oai_write_tokens(const int32_t *ids, size_t n, int ctx_len);
char *oai_write_detokenized(const char *text, size_t len);

/* A token's text as a client sees it: valid UTF-8 as is, otherwise "bytes:\xNN..." (as vLLM
 * writes it). Writes at most cap - 1 bytes plus a NUL; returns the length. */
size_t oai_token_text(const struct oai_vocab *v, int32_t id, char *out, size_t cap);

/* A chat response body with each choice's tool calls (in format fmt) turned into
 * message.tool_calls (finish_reason "stop" becomes "tool_calls"; an output cut by max_tokens
 * keeps "length", with the whole calls before the cut); takes body (freed) and returns the new
 * one. oai_tools_chunks streams the same calls. */
char *oai_tools_rewrite(char *body, const char *id, enum chat_tool_format fmt);
/* The SSE chunks for choice index of a streamed chat with tools, whose text so far is
 * text[0..len) and of which *sent bytes went out as content already: while it runs (finish
 * FINISH_NONE), the content that cannot be part of a call (maybe none: "" is returned);
 * at its end, the rest of the content, its tool calls (id and name first, then the arguments)
 * and the finish chunk (with stop_reason from stop, NULL: null). Advances *sent. */
char *oai_tools_chunks(const struct oai_meta *m, enum chat_tool_format fmt, int index,
                       const char *text, size_t len, size_t *sent, enum finish_reason finish,
                       const struct oai_stop *stop, bool usage_null);

#endif
