/* api_structured: what the generation handlers add for structured outputs and tool calling:
 * compiling the request's constraint through the engine's grammar cache, offering the tools in
 * the system turn, and turning <tool_call> blocks in the output into tool_calls (whole
 * responses and SSE chunks). */
#ifndef QUERN_API_STRUCTURED_H
#define QUERN_API_STRUCTURED_H

#include "api.h"

/* *out: NULL when r asks for no constraint, else a reference to pass in gen_request.grammar
 * (grammar_unref it). A schema the compiler refuses is a 400 naming the request field. */
int api_grammar(struct serve *s, const struct oai_request *r, struct grammar **out,
                struct oai_error *e);
/* When r offers tools (and tool_choice is not none): the tool list goes into the system message
 * (one is added, with the template's default text, when the conversation has none). */
int api_tools_prompt(struct serve *s, struct oai_request *r, struct oai_error *e);
/* True when outputs of r are parsed for tool calls. */
bool api_tools_active(const struct oai_request *r);
/* A chat response body with each choice's <tool_call> blocks turned into message.tool_calls
 * (finish_reason "tool_calls"); takes body (freed) and returns the new one (NULL: OOM). */
char *api_tools_rewrite(char *body, const char *id);
/* The SSE chunks for choice index of a streamed chat with tools, whose text so far is
 * text[0..len) and of which *sent bytes went out as content already: while it runs (finish
 * FINISH_NONE), the content that cannot be part of a <tool_call> (maybe none: "" is returned);
 * at its end, the rest of the content, its tool calls (id and name first, then the arguments)
 * and the finish chunk. Advances *sent. */
char *api_tools_chunks(const struct oai_meta *m, int index, const char *text, size_t len,
                       size_t *sent, enum finish_reason finish, bool usage_null);

#endif
