/* api_structured: what the generation handlers add for structured outputs and tool calling:
 * compiling the request's constraint through the engine's grammar cache, and the tool-call
 * grammar in the format of the model's chat template (the calls in the output become
 * tool_calls in server/oai_tool_out.c). */
#ifndef QUERN_API_STRUCTURED_H
#define QUERN_API_STRUCTURED_H

#include "api.h"

/* *out: NULL when r asks for no constraint, else a reference to pass in gen_request.grammar
 * (grammar_unref it); after_think: the constraint holds once the model's reasoning block ends
 * (GRAMMAR_AFTER_THINK). A schema the compiler refuses is a 400 naming the request field. */
int api_grammar(struct serve *s, const struct oai_request *r, bool after_think,
                struct grammar **out, struct oai_error *e);
/* Whether r's chat (or responses) output is a reasoning block and an answer (oai_think): the
 * template opens one, the request generates a new assistant turn and the server splits them. */
enum oai_reasoning api_reasoning(const struct serve *s, const struct oai_request *r);
/* When r offers tools (and tool_choice is not none): its tool-call grammar in the format of the
 * model's chat template (the template itself writes the tools into the prompt: api_chat_tokens). */
int api_tools_prepare(struct serve *s, struct oai_request *r, struct oai_error *e);
/* The tool-call format of the served model's chat template (Hermes without one). */
enum chat_tool_format api_tools_format(const struct serve *s);
/* True when r's tools go into its prompt and its outputs are parsed for tool calls: a chat or a
 * response (or a tokenize of messages, which only counts the prompt) offering tools, with
 * tool_choice other than none. */
bool api_tools_active(const struct oai_request *r);
#endif
