/* oai_resp: the Responses API's shapes (POST /v1/responses), written from one chat choice: the
 * response object (a body, and inside response.* events) and the streamed events, each as
 * "event: TYPE\ndata: {...}\n\n". Stateless: store is always false. No HTTP, no engine.
 *
 * A streamed response is, in order: response.created, response.in_progress,
 * response.output_item.added, response.content_part.added, response.output_text.delta per piece
 * of text, response.output_text.done, response.content_part.done, response.output_item.done and
 * response.completed (response.incomplete when max_output_tokens cut it), each with its
 * sequence_number; the stream then ends (no [DONE]). With tool calls (the chat's <tool_call>
 * blocks, parsed by the caller into calls), the output is the message (only when it has text, or
 * there are no calls) followed by one function_call item per call, each streamed as
 * output_item.added, function_call_arguments.delta and .done, output_item.done. A reasoning
 * model's output (reasoning set: the template opens a <think> block) begins with a reasoning
 * item (rs_..., its text up to "</think>" as a reasoning_text part, split by oai_think), streamed
 * as output_item.added, content_part.added, reasoning_text.delta per piece, reasoning_text.done,
 * content_part.done and output_item.done before the message's events; the message then holds
 * the text after "</think>". Every writer returns a malloc'd string, NULL on OOM. */
#ifndef QUERN_OAI_RESP_H
#define QUERN_OAI_RESP_H

#include "oai.h"

struct oai_resp {
    const char *id;     /* "resp_..." */
    const char *msg_id; /* "msg_..." */
    const char *model;
    long long created;
    const char *instructions; /* NULL: null */
    int max_output_tokens;    /* -1: null */
    double temperature, top_p;
    const struct cJSON *text_format;   /* text.format to echo, NULL: {"type": "text"} */
    const struct oai_tool_call *calls; /* the function calls after the message's text */
    size_t n_calls;
    /* not NONE: a reasoning item comes first (output index 0), the message after it */
    enum oai_reasoning reasoning;
    const char *rs_id; /* "rs_..." */
};

/* The response object: status "in_progress" (no output yet), or finished with text[0..len) and
 * finish (length: "incomplete" with reason max_output_tokens). u NULL: usage null. */
char *oai_resp_write(const struct oai_resp *r, const char *text, size_t len,
                     enum finish_reason finish, const struct oai_usage *u);

enum oai_resp_event {
    OAI_RESP_CREATED,     /* response (in progress) */
    OAI_RESP_IN_PROGRESS, /* response (in progress) */
    OAI_RESP_ITEM_ADDED,  /* the message item, empty */
    OAI_RESP_PART_ADDED,  /* the output_text part, empty */
    OAI_RESP_DELTA,       /* delta: text */
    OAI_RESP_TEXT_DONE,   /* text: the whole text */
    OAI_RESP_PART_DONE,   /* the part with the whole text */
    OAI_RESP_ITEM_DONE,   /* the item with the whole text */
    OAI_RESP_DONE,        /* response.completed or .incomplete: the whole response */
    /* the reasoning item's, before the message's ITEM_ADDED (text: the whole output, whose
     * reasoning they carry; RS_DELTA's text is the delta) */
    OAI_RESP_RS_ITEM_ADDED,
    OAI_RESP_RS_PART_ADDED,
    OAI_RESP_RS_DELTA,
    OAI_RESP_RS_TEXT_DONE,
    OAI_RESP_RS_PART_DONE,
    OAI_RESP_RS_ITEM_DONE,
};

/* text[0..len): the delta (DELTA, RS_DELTA), else the whole output (with reasoning, each event
 * takes its part of it). */
char *oai_resp_event(const struct oai_resp *r, enum oai_resp_event ev, int seq, const char *text,
                     size_t len, enum finish_reason finish, const struct oai_usage *u);

/* True when the output has a message item (index 0): text, or no calls. */
bool oai_resp_has_message(const struct oai_resp *r, size_t len);

enum oai_resp_call_event {
    OAI_RESP_CALL_ADDED,      /* output_item.added: the call, arguments "" */
    OAI_RESP_CALL_ARGS_DELTA, /* function_call_arguments.delta: all of them */
    OAI_RESP_CALL_ARGS_DONE,  /* function_call_arguments.done */
    OAI_RESP_CALL_DONE,       /* output_item.done: the whole call */
};

/* An event of call k, whose output index follows the message's (len: the message's text). */
char *oai_resp_call_event(const struct oai_resp *r, enum oai_resp_call_event ev, int seq, size_t k,
                          size_t len);

#endif
