/* api: the endpoint handlers. Each runs on an HTTP thread, reads the request and fills a
 * struct http_resp (and the req_log); none runs model code: generation goes through
 * serve_submit and waits on the request's events. */
#ifndef QUERN_API_H
#define QUERN_API_H

#include "http.h"
#include "oai.h"

typedef void (*api_handler)(struct serve *s, const struct http_req *rq, struct http_resp *out);

void api_completions(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_chat(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_models(struct serve *s, const struct http_req *rq, struct http_resp *out);
/* GET /v1/models/{id}: the path after API_MODELS_PREFIX is the id (it may hold '/'). */
#define API_MODELS_PREFIX "/v1/models/"
void api_model(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_health(struct serve *s, const struct http_req *rq, struct http_resp *out);
/* /health/live: 503 only when the engine has stopped or stalled (not while loading or
 * draining); /health/ready: /health's answer (loaded, not draining, not stalled). */
void api_liveness(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_readiness(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_metrics(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_tokenize(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_detokenize(struct serve *s, const struct http_req *rq, struct http_resp *out);

void api_embeddings(struct serve *s, const struct http_req *rq, struct http_resp *out);
/* POST /v1/responses: a chat request (api_generate.c) answered in the Responses API's shape. */
void api_responses(struct serve *s, const struct http_req *rq, struct http_resp *out);

/* GET /v1/engine/state (api_engine.c): the engine's live picture as JSON. */
void api_engine_state(struct serve *s, const struct http_req *rq, struct http_resp *out);
/* GET / and GET /webui/NAME (api_webui.c): the built-in page (server/webui.h). */
#define API_WEBUI_PREFIX "/webui/"
void api_webui(struct serve *s, const struct http_req *rq, struct http_resp *out);

/* Where chat_template_kwargs' enable_thinking (the request's, else --chat-template-kwargs')
 * is false, a generating chat prompt ends with the reasoning closed
 * (CHAT_END_GENERATE_NO_THINK). */
void api_chat_thinking(const struct serve *s, struct oai_request *r);
/* Fills out with the error's JSON body and status, and the log's error reason. */
void api_error(const struct oai_error *e, struct req_log *log, struct http_resp *out);
/* oai_parse of rq's body as kind: 0, with the members the endpoint ignores noted in rq's log;
 * else the error response is in out (api_error) and r holds nothing. */
int api_parse(enum oai_kind kind, const struct http_req *rq, struct oai_request *r,
              struct http_resp *out);

/* Shared by api.c and api_generate.c. */
/* What a request's "model" names: a served name (name points at it; lora 0), or a LoRA adapter
 * (name points at lora_name, a copy, since an adapter may be unloaded while the request runs;
 * lora and gen for gen_request.lora and lora_gen). A copy of the struct must repoint name. */
struct api_model {
    const char *name;
    char lora_name[LORA_NAME_MAX];
    int lora;
    uint32_t gen;
};
/* A request's "model" (NULL: not given: the first served name) against the served names and the
 * LoRA adapters (server/api_lora.c); another name is a 404 model_not_found, as OpenAI and vLLM
 * answer. */
int api_model_check(struct serve *s, const char *model, struct api_model *out, struct oai_error *e);

/* server/api_lora.c: vLLM's load/unload endpoints (serve --lora-runtime) */
void api_load_lora(struct serve *s, const struct http_req *rq, struct http_resp *out);
void api_unload_lora(struct serve *s, const struct http_req *rq, struct http_resp *out);
/* False (with a 503 in out) unless the model is loaded and the server is not draining. */
bool api_ready(struct serve *s, struct req_log *log, struct http_resp *out);
/* True when the client has hung up (or its socket failed): a handler waiting on the engine
 * polls it to abort work nobody will read. */
bool api_client_gone(int fd);
/* serve_submit's refusal as an answer: 503 draining, 429 queue full, 400, or 500. */
int api_submit_error(struct serve *s, const struct qerr *q, struct oai_error *e);
/* vLLM's truncate_prompt_tokens (oai_request.truncate_prompt): keeps the last tokens of
 * ids[0..n), moved to its front; returns how many are left. */
size_t api_truncate_prompt(const struct serve *s, int keep, int32_t *ids, size_t n);
/* The model's token texts for the response writers. */
struct oai_vocab api_vocab(const struct serve *s);
/* The conversation in r formatted by the model's chat template and tokenized (*ids malloc'd):
 * message content is plain text unless the server runs with --chat-parse-special. */
int api_chat_tokens(struct serve *s, const struct oai_request *r, enum chat_end end, bool add_bos,
                    int32_t **ids, size_t *n, struct oai_error *e);

#endif
