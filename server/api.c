/* api: the small endpoints (models, health, metrics, tokenize, detokenize) and the error answer
 * every handler shares. Generation lives in api_generate.c. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "api_structured.h"

static enum metrics_error error_reason(const struct oai_error *e)
{
    switch (e->status) {
    case 400:
        return e->code && !strcmp(e->code, "context_length_exceeded") ? METRICS_ERR_CONTEXT
                                                                      : METRICS_ERR_BAD_REQUEST;
    case 401:
        return METRICS_ERR_AUTH;
    case 404:
        return METRICS_ERR_NOT_FOUND;
    case 405:
        return METRICS_ERR_METHOD;
    case 413:
        return METRICS_ERR_TOO_LARGE;
    case 429:
        return METRICS_ERR_QUEUE_FULL;
    case 503:
        return METRICS_ERR_UNAVAILABLE;
    default:
        return e->status >= 500 ? METRICS_ERR_INTERNAL : METRICS_ERR_BAD_REQUEST;
    }
}

void api_error(const struct oai_error *e, struct req_log *log, struct http_resp *out)
{
    out->status = e->status;
    out->content_type = "application/json";
    out->body = oai_write_error(e);
    out->body_len = out->body ? strlen(out->body) : 0;
    if (e->status == 429) out->retry_after = 1;
    if (log) {
        log->has_error = true;
        log->error = error_reason(e);
    }
}

void api_chat_thinking(const struct serve *s, struct oai_request *r)
{
    bool on = r->enable_thinking >= 0 ? r->enable_thinking == 1 : !s->o->no_thinking;
    if (!on && r->chat_end == CHAT_END_GENERATE) r->chat_end = CHAT_END_GENERATE_NO_THINK;
}

int api_parse(enum oai_kind kind, const struct http_req *rq, struct oai_request *r,
              struct http_resp *out)
{
    struct oai_error e = {0};
    if (oai_parse(kind, rq->body, rq->body_len, r, &e)) {
        api_error(&e, rq->log, out);
        return -1;
    }
    if (rq->log) snprintf(rq->log->ignored, sizeof rq->log->ignored, "%s", r->ignored);
    return 0;
}

static void json_reply(struct http_resp *out, int status, char *body)
{
    if (!body) {
        struct oai_error e = {0};
        oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        api_error(&e, NULL, out);
        return;
    }
    out->status = status;
    out->content_type = "application/json";
    out->body = body;
    out->body_len = strlen(body);
}

static bool ready(struct serve *s, struct req_log *log, struct http_resp *out);

/* False (a 503 in out) while the model loads: the context length the model cards carry is read
 * only after the state, written after it, says it is there. Draining, the cards still answer. */
static bool loaded(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    return atomic_load(&s->state) != SERVE_LOADING || ready(s, rq->log, out);
}

void api_models(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (!loaded(s, rq, out)) return;
    struct serve_lora ls[ENGINE_MAX_LORAS];
    const char *loras[ENGINE_MAX_LORAS];
    int n = serve_lora_list(s, ls);
    for (int i = 0; i < n; i++) loras[i] = ls[i].name;
    json_reply(out, 200,
               oai_write_models(s->o->served_names, s->o->n_served_names, loras, n, s->started,
                                s->ctx_len));
}

/* The served name equal to model, or NULL. */
static const char *served_name_of(const struct serve *s, const char *model)
{
    for (int i = 0; i < s->o->n_served_names; i++)
        if (!strcmp(s->o->served_names[i], model)) return s->o->served_names[i];
    return NULL;
}

static int model_not_found(const char *model, struct oai_error *e)
{
    return oai_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model `%.200s` does not exist (see GET /v1/models)", model);
}

void api_model(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (!loaded(s, rq, out)) return;
    const char *id = rq->path + strlen(API_MODELS_PREFIX);
    const char *name = served_name_of(s, id);
    struct serve_lora l;
    if (!name && serve_lora_find(s, id, &l)) {
        json_reply(out, 200,
                   oai_write_model(l.name, l.name, s->o->served_name, s->started, s->ctx_len));
        return;
    }
    if (!name) {
        struct oai_error e = {0};
        model_not_found(id, &e);
        api_error(&e, rq->log, out);
        return;
    }
    json_reply(out, 200, oai_write_model(name, s->o->served_name, NULL, s->started, s->ctx_len));
}

int api_model_check(struct serve *s, const char *model, struct api_model *out, struct oai_error *e)
{
    *out = (struct api_model){.name = s->o->served_name};
    if (!model) return 0;
    const char *found = served_name_of(s, model);
    struct serve_lora l;
    if (!found && serve_lora_find(s, model, &l)) {
        snprintf(out->lora_name, sizeof out->lora_name, "%s", l.name);
        out->name = found = out->lora_name;
        out->lora = l.lora;
        out->gen = l.gen;
        return 0;
    }
    if (!found) return model_not_found(model, e);
    out->name = found;
    return 0;
}

void api_health(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    (void)rq;
    int state = atomic_load(&s->state);
    struct engine_stats st;
    const char *status = "ok";
    char detail[128] = "";
    if (state == SERVE_LOADING) {
        status = "loading";
    } else if (state == SERVE_DRAINING) {
        status = "draining";
    } else if (!serve_stats(s, &st)) {
        status = "stopped";
    } else if (st.last_step_age_s > s->o->watchdog_s) {
        status = "stalled";
        snprintf(detail, sizeof detail, ",\"last_step_age_s\":%.1f", st.last_step_age_s);
    }
    char *body = malloc(256);
    if (body) snprintf(body, 256, "{\"status\":\"%s\"%s}", status, detail);
    json_reply(out, strcmp(status, "ok") ? 503 : 200, body);
    if (out->status == 503) out->retry_after = 5;
}

/* Liveness: the process and its engine work. Loading and draining are alive (an orchestrator
 * must not restart a replica for either); an engine that has work and has not finished a step
 * for --watchdog seconds, or has stopped, is not. */
void api_liveness(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    (void)rq;
    int state = atomic_load(&s->state);
    struct engine_stats st;
    const char *status = "ok";
    if (state == SERVE_READY && !serve_stats(s, &st))
        status = "stopped";
    else if (state == SERVE_READY && st.last_step_age_s > s->o->watchdog_s)
        status = "stalled";
    char *body = malloc(64);
    if (body) snprintf(body, 64, "{\"status\":\"%s\"}", status);
    json_reply(out, strcmp(status, "ok") ? 503 : 200, body);
}

/* Readiness: send it requests. The model is loaded, the server is not draining, and the
 * engine is live; /health is the same answer. */
void api_readiness(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    api_health(s, rq, out);
}

void api_metrics(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    (void)rq;
    struct engine_stats st;
    bool have = serve_stats(s, &st);
    struct sbuf b = {0};
    struct serve_lora ls[ENGINE_MAX_LORAS];
    const char *by_slot[ENGINE_MAX_LORAS] = {0};
    int n = serve_lora_list(s, ls);
    for (int i = 0; i < n; i++) by_slot[ls[i].lora - 1] = ls[i].name;
    if (metrics_render(&s->metrics, have ? &st : NULL, atomic_load(&s->state), &b) ||
        (have && n && metrics_render_lora(&st, by_slot, ENGINE_MAX_LORAS, &b))) {
        sbuf_free(&b);
        json_reply(out, 500, NULL);
        return;
    }
    out->status = 200;
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
    out->body_len = b.len;
    out->body = sbuf_take(&b);
}

/* 503 unless the model is loaded and the server is not draining. */
static bool ready(struct serve *s, struct req_log *log, struct http_resp *out)
{
    int state = atomic_load(&s->state);
    if (state == SERVE_READY) return true;
    struct oai_error e = {0};
    oai_error_set(&e, 503, "server_error", state == SERVE_LOADING ? "loading" : "draining", NULL,
                  state == SERVE_LOADING ? "the model is still loading" : "the server is draining");
    api_error(&e, log, out);
    return false;
}

static int vocab_bytes(const void *ctx, int32_t id, char *buf, size_t cap)
{
    return tokenizer_token_bytes(ctx, id, buf, cap);
}

struct oai_vocab api_vocab(const struct serve *s)
{
    return (struct oai_vocab){.token_bytes = vocab_bytes, .ctx = s->tok};
}

size_t api_truncate_prompt(const struct serve *s, int keep, int32_t *ids, size_t n)
{
    size_t k = keep < 0 ? (size_t)s->ctx_len : (size_t)keep;
    if (keep == 0 || n <= k) return n;
    memmove(ids, ids + (n - k), k * sizeof *ids);
    return k;
}

int api_chat_tokens(struct serve *s, const struct oai_request *r, enum chat_end end, bool add_bos,
                    int32_t **ids, size_t *n, struct oai_error *e)
{
    *ids = NULL;
    *n = 0;
    if (!s->chat)
        return oai_error_set(e, 400, "invalid_request_error", "no_chat_template", "messages",
                             "this model has no chat template quern supports (%s); use "
                             "/v1/completions",
                             s->chat_error);
    struct qerr q = {0};
    char *tools = NULL; /* the template writes the offered tools where its model expects them */
    if (api_tools_active(r) && !(tools = oai_tools_json(r)))
        return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc = chat_encode_tools(s->chat, s->tok, r->msgs, r->n_msgs, tools, end, add_bos,
                               s->o->chat_parse_special, ids, n, &q);
    free(tools);
    if (rc)
        return oai_error_set(e, q.code == QERR_NOMEM ? 500 : 400,
                             q.code == QERR_NOMEM ? "server_error" : "invalid_request_error", NULL,
                             "messages", "messages: %s", q.msg);
    return 0;
}

void api_tokenize(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (!ready(s, rq->log, out)) return;
    struct oai_request r;
    struct oai_error e = {0};
    if (api_parse(OAI_TOKENIZE, rq, &r, out)) return;
    api_chat_thinking(s, &r);
    int32_t *ids = NULL;
    size_t n = 0;
    struct qerr q = {0};
    bool bos = r.add_special && tokenizer_adds_bos(s->tok);
    if (r.n_msgs) {
        if (api_chat_tokens(s, &r, r.chat_end, bos, &ids, &n, &e)) goto fail;
    } else if (tokenizer_encode(s->tok, r.prompts[0].text, r.prompts[0].text_len, bos, false, &ids,
                                &n, &q)) {
        oai_error_set(&e, 400, "invalid_request_error", NULL, "prompt", "%s", q.msg);
        goto fail;
    }
    json_reply(out, 200, oai_write_tokens(ids, n, s->ctx_len));
    goto done;
fail:
    api_error(&e, rq->log, out);
done:
    free(ids);
    oai_request_free(&r);
}

void api_detokenize(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (!ready(s, rq->log, out)) return;
    struct oai_request r;
    struct oai_error e = {0};
    if (api_parse(OAI_DETOKENIZE, rq, &r, out)) return;
    for (size_t i = 0; i < r.n_tokens; i++) {
        if (r.tokens[i] >= s->vocab) {
            oai_error_set(&e, 400, "invalid_request_error", "invalid_value", "tokens",
                          "'tokens' element %zu is %d; the vocabulary has %d tokens", i,
                          r.tokens[i], s->vocab);
            api_error(&e, rq->log, out);
            oai_request_free(&r);
            return;
        }
    }
    char *text = tokenizer_decode(s->tok, r.tokens, r.n_tokens);
    json_reply(out, 200, text ? oai_write_detokenized(text, strlen(text)) : NULL);
    free(text);
    oai_request_free(&r);
}

bool api_ready(struct serve *s, struct req_log *log, struct http_resp *out)
{
    return ready(s, log, out);
}

bool api_client_gone(int fd)
{
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}
