/* oai_resp: the Responses API's response object and stream events (see oai_resp.h). Field
 * names and order follow OpenAI's responses; the SDK assembles a streamed response from the
 * events' item and part payloads, so each carries the ids it belongs to. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_oom.h"
#include "oai_resp.h"

static cJSON *str_n(const char *s, size_t len)
{
    char *t = malloc(len + 1);
    if (!t) return NULL;
    if (len) memcpy(t, s, len);
    t[len] = '\0';
    cJSON *o = cJSON_CreateString(t);
    free(t);
    return o;
}

static char *print_free(cJSON *o)
{
    return json_print_free(o); /* NULL too when a part of o could not be allocated */
}

/* {"type":"output_text","text":...,"annotations":[],"logprobs":[]} */
static cJSON *text_part(const char *text, size_t len)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    json_add(p, "text", str_n(text, len));
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

/* With reasoning: the output's reasoning (*rs) and the message's text (*msg); without, all of
 * it is the message's. */
static void parts(const struct oai_resp *r, const char *text, size_t len, struct oai_span *rs,
                  struct oai_span *msg)
{
    *rs = (struct oai_span){0, 0};
    *msg = (struct oai_span){0, len};
    if (r->reasoning &&
        !oai_think_split(text, len, r->reasoning == OAI_REASONING_OPTIONAL, rs, msg))
        *msg = (struct oai_span){len, 0};
}

/* {"type":"reasoning_text","text":...} */
static cJSON *reasoning_part(const char *text, size_t len)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    json_add(p, "text", str_n(text, len));
    return p;
}

/* The reasoning item: empty and in progress, or done with its text. */
static cJSON *reasoning_item(const struct oai_resp *r, bool done, const char *text, size_t len)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", r->rs_id);
    cJSON_AddStringToObject(m, "type", "reasoning");
    cJSON_AddArrayToObject(m, "summary");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (done && content) cJSON_AddItemToArray(content, reasoning_part(text, len));
    cJSON_AddStringToObject(m, "status", done ? "completed" : "in_progress");
    return m;
}

/* The assistant message item: empty and in progress, or done with its text (incomplete when
 * max_output_tokens cut it). */
static cJSON *message_item(const struct oai_resp *r, bool done, const char *text, size_t len,
                           enum finish_reason finish)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", r->msg_id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "status",
                            !done                     ? "in_progress"
                            : finish == FINISH_LENGTH ? "incomplete"
                                                      : "completed");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (done && content) cJSON_AddItemToArray(content, text_part(text, len));
    return m;
}

/* The response's own part of the message id, which call ids share. */
static const char *id_tail(const struct oai_resp *r)
{
    return strncmp(r->msg_id, "msg_", 4) ? r->msg_id : r->msg_id + 4;
}

bool oai_resp_has_message(const struct oai_resp *r, size_t len)
{
    return r->n_calls == 0 || len > 0;
}

/* Call k's function_call item; done: with its arguments and completed. */
static cJSON *call_item(const struct oai_resp *r, size_t k, bool done)
{
    char id[80];
    cJSON *c = cJSON_CreateObject();
    snprintf(id, sizeof id, "fc_%s_%zu", id_tail(r), k);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function_call");
    cJSON_AddStringToObject(c, "status", done ? "completed" : "in_progress");
    snprintf(id, sizeof id, "call_%s_%zu", id_tail(r), k);
    cJSON_AddStringToObject(c, "call_id", id);
    cJSON_AddStringToObject(c, "name", r->calls[k].name);
    cJSON_AddStringToObject(c, "arguments", done ? r->calls[k].arguments : "");
    return c;
}

/* finish FINISH_NONE: in progress, no output. */
static cJSON *response_obj(const struct oai_resp *r, const char *text, size_t len,
                           enum finish_reason finish, const struct oai_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)r->created);
    const char *status = finish == FINISH_NONE     ? "in_progress"
                         : finish == FINISH_LENGTH ? "incomplete"
                         : finish == FINISH_STOP   ? "completed"
                                                   : "failed";
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddNullToObject(o, "error");
    if (finish == FINISH_LENGTH) {
        cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
        if (d) cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(o, "incomplete_details");
    }
    if (r->instructions)
        cJSON_AddStringToObject(o, "instructions", r->instructions);
    else
        cJSON_AddNullToObject(o, "instructions");
    if (r->max_output_tokens >= 0)
        cJSON_AddNumberToObject(o, "max_output_tokens", r->max_output_tokens);
    else
        cJSON_AddNullToObject(o, "max_output_tokens");
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON *out = cJSON_AddArrayToObject(o, "output");
    if (out && finish != FINISH_NONE) {
        struct oai_span rs, msg;
        parts(r, text, len, &rs, &msg);
        if (r->reasoning) cJSON_AddItemToArray(out, reasoning_item(r, true, text + rs.off, rs.len));
        if (oai_resp_has_message(r, len))
            cJSON_AddItemToArray(out, message_item(r, true, text + msg.off, msg.len, finish));
        for (size_t k = 0; k < r->n_calls; k++) cJSON_AddItemToArray(out, call_item(r, k, true));
    }
    cJSON_AddBoolToObject(o, "parallel_tool_calls", true); /* as sent is not kept: the default */
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON *re = cJSON_AddObjectToObject(o, "reasoning");
    if (re) {
        cJSON_AddNullToObject(re, "effort");
        cJSON_AddNullToObject(re, "summary");
    }
    cJSON_AddBoolToObject(o, "store", false);
    cJSON_AddNumberToObject(o, "temperature", r->temperature);
    cJSON *tx = cJSON_AddObjectToObject(o, "text");
    cJSON *fmt = r->text_format ? cJSON_Duplicate(r->text_format, true) : NULL;
    if (tx && fmt)
        cJSON_AddItemToObject(tx, "format", fmt);
    else if (tx && (fmt = cJSON_AddObjectToObject(tx, "format")))
        cJSON_AddStringToObject(fmt, "type", "text");
    cJSON_AddStringToObject(o, "tool_choice", "auto");
    cJSON_AddArrayToObject(o, "tools");
    cJSON_AddNumberToObject(o, "top_p", r->top_p);
    cJSON_AddStringToObject(o, "truncation", "disabled");
    if (u) {
        cJSON *us = cJSON_AddObjectToObject(o, "usage");
        if (us) {
            cJSON_AddNumberToObject(us, "input_tokens", u->prompt_tokens);
            cJSON *d = cJSON_AddObjectToObject(us, "input_tokens_details");
            if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
            cJSON_AddNumberToObject(us, "output_tokens", u->completion_tokens);
            d = cJSON_AddObjectToObject(us, "output_tokens_details");
            if (d) cJSON_AddNumberToObject(d, "reasoning_tokens", u->reasoning_tokens);
            cJSON_AddNumberToObject(us, "total_tokens", u->prompt_tokens + u->completion_tokens);
        }
    } else {
        cJSON_AddNullToObject(o, "usage");
    }
    cJSON_AddNullToObject(o, "user");
    cJSON_AddObjectToObject(o, "metadata");
    return o;
}

char *oai_resp_write(const struct oai_resp *r, const char *text, size_t len,
                     enum finish_reason finish, const struct oai_usage *u)
{
    return print_free(response_obj(r, text, len, finish, u));
}

static char *sse_event(const char *type, cJSON *o);

static const char *const event_names[] = {
    [OAI_RESP_CREATED] = "response.created",
    [OAI_RESP_IN_PROGRESS] = "response.in_progress",
    [OAI_RESP_ITEM_ADDED] = "response.output_item.added",
    [OAI_RESP_PART_ADDED] = "response.content_part.added",
    [OAI_RESP_DELTA] = "response.output_text.delta",
    [OAI_RESP_TEXT_DONE] = "response.output_text.done",
    [OAI_RESP_PART_DONE] = "response.content_part.done",
    [OAI_RESP_ITEM_DONE] = "response.output_item.done",
    [OAI_RESP_DONE] = "response.completed",
    [OAI_RESP_RS_ITEM_ADDED] = "response.output_item.added",
    [OAI_RESP_RS_PART_ADDED] = "response.content_part.added",
    [OAI_RESP_RS_DELTA] = "response.reasoning_text.delta",
    [OAI_RESP_RS_TEXT_DONE] = "response.reasoning_text.done",
    [OAI_RESP_RS_PART_DONE] = "response.content_part.done",
    [OAI_RESP_RS_ITEM_DONE] = "response.output_item.done",
};

char *oai_resp_event(const struct oai_resp *r, enum oai_resp_event ev, int seq, const char *text,
                     size_t len, enum finish_reason finish, const struct oai_usage *u)
{
    const char *type = event_names[ev];
    if (ev == OAI_RESP_DONE && finish == FINISH_LENGTH) type = "response.incomplete";
    if (ev == OAI_RESP_DONE && finish != FINISH_LENGTH && finish != FINISH_STOP)
        type = "response.failed";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", seq);
    int msg_index = r->reasoning ? 1 : 0;
    struct oai_span rs = {0, len}, msg = {0, len};
    if (ev != OAI_RESP_DELTA && ev != OAI_RESP_RS_DELTA && ev != OAI_RESP_DONE)
        parts(r, text, len, &rs, &msg);
    switch (ev) {
    case OAI_RESP_CREATED:
    case OAI_RESP_IN_PROGRESS:
        json_add(o, "response", response_obj(r, "", 0, FINISH_NONE, NULL));
        break;
    case OAI_RESP_DONE:
        json_add(o, "response", response_obj(r, text, len, finish, u));
        break;
    case OAI_RESP_ITEM_ADDED:
    case OAI_RESP_ITEM_DONE:
        cJSON_AddNumberToObject(o, "output_index", msg_index);
        json_add(o, "item",
                 message_item(r, ev == OAI_RESP_ITEM_DONE, text + msg.off, msg.len, finish));
        break;
    case OAI_RESP_PART_ADDED:
    case OAI_RESP_PART_DONE:
    case OAI_RESP_DELTA:
    case OAI_RESP_TEXT_DONE:
        cJSON_AddStringToObject(o, "item_id", r->msg_id);
        cJSON_AddNumberToObject(o, "output_index", msg_index);
        cJSON_AddNumberToObject(o, "content_index", 0);
        if (ev == OAI_RESP_PART_ADDED || ev == OAI_RESP_PART_DONE)
            json_add(o, "part", text_part(text + msg.off, ev == OAI_RESP_PART_DONE ? msg.len : 0));
        else
            json_add(o, ev == OAI_RESP_DELTA ? "delta" : "text", str_n(text + msg.off, msg.len));
        if (ev == OAI_RESP_DELTA || ev == OAI_RESP_TEXT_DONE) cJSON_AddArrayToObject(o, "logprobs");
        break;
    case OAI_RESP_RS_ITEM_ADDED:
    case OAI_RESP_RS_ITEM_DONE:
        cJSON_AddNumberToObject(o, "output_index", 0);
        json_add(o, "item", reasoning_item(r, ev == OAI_RESP_RS_ITEM_DONE, text + rs.off, rs.len));
        break;
    case OAI_RESP_RS_PART_ADDED:
    case OAI_RESP_RS_PART_DONE:
    case OAI_RESP_RS_DELTA:
    case OAI_RESP_RS_TEXT_DONE:
        cJSON_AddStringToObject(o, "item_id", r->rs_id);
        cJSON_AddNumberToObject(o, "output_index", 0);
        cJSON_AddNumberToObject(o, "content_index", 0);
        if (ev == OAI_RESP_RS_PART_ADDED || ev == OAI_RESP_RS_PART_DONE)
            json_add(o, "part",
                     reasoning_part(text + rs.off, ev == OAI_RESP_RS_PART_DONE ? rs.len : 0));
        else
            json_add(o, ev == OAI_RESP_RS_DELTA ? "delta" : "text", str_n(text + rs.off, rs.len));
        break;
    }
    return sse_event(type, o);
}

/* "event: TYPE\ndata: JSON\n\n" (o is freed). */
static char *sse_event(const char *type, cJSON *o)
{
    char *json = print_free(o);
    if (!json) return NULL;
    size_t n = strlen(type) + strlen(json) + 20;
    char *sse = malloc(n);
    if (sse) snprintf(sse, n, "event: %s\ndata: %s\n\n", type, json);
    free(json);
    return sse;
}

char *oai_resp_call_event(const struct oai_resp *r, enum oai_resp_call_event ev, int seq, size_t k,
                          size_t len)
{
    static const char *const names[] = {
        [OAI_RESP_CALL_ADDED] = "response.output_item.added",
        [OAI_RESP_CALL_ARGS_DELTA] = "response.function_call_arguments.delta",
        [OAI_RESP_CALL_ARGS_DONE] = "response.function_call_arguments.done",
        [OAI_RESP_CALL_DONE] = "response.output_item.done",
    };
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", names[ev]);
    cJSON_AddNumberToObject(o, "sequence_number", seq);
    cJSON_AddNumberToObject(
        o, "output_index",
        (double)(k + (r->reasoning ? 1 : 0) + (oai_resp_has_message(r, len) ? 1 : 0)));
    if (ev == OAI_RESP_CALL_ADDED || ev == OAI_RESP_CALL_DONE) {
        json_add(o, "item", call_item(r, k, ev == OAI_RESP_CALL_DONE));
    } else {
        char id[80];
        snprintf(id, sizeof id, "fc_%s_%zu", id_tail(r), k);
        cJSON_AddStringToObject(o, "item_id", id);
        cJSON_AddStringToObject(o, ev == OAI_RESP_CALL_ARGS_DELTA ? "delta" : "arguments",
                                r->calls[k].arguments);
        if (ev == OAI_RESP_CALL_ARGS_DONE) cJSON_AddStringToObject(o, "name", r->calls[k].name);
    }
    return sse_event(names[ev], o);
}
