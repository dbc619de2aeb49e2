/* api_structured: structured outputs and tool calling in the generation handlers (see
 * api_structured.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_structured.h"

enum oai_reasoning api_reasoning(const struct serve *s, const struct oai_request *r)
{
    /* enable_thinking false (CHAT_END_GENERATE_NO_THINK) closed the block in the prompt */
    if ((r->kind != OAI_CHAT && r->kind != OAI_RESPONSES) || !s->chat ||
        r->chat_end != CHAT_END_GENERATE || s->o->no_reasoning_split)
        return OAI_REASONING_NONE;
    /* Qwen3 with tools offered: its reasoning stays in the content, where the calls are read
     * (one parser over the text, streamed or not); not split off */
    return s->chat->think                                 ? OAI_REASONING_OPEN
           : s->chat->think_model && !api_tools_active(r) ? OAI_REASONING_OPTIONAL
                                                          : OAI_REASONING_NONE;
}

int api_grammar(struct serve *s, const struct oai_request *r, bool after_think,
                struct grammar **out, struct oai_error *e)
{
    *out = NULL;
    if (r->constraint.kind < 0) return 0;
    struct qerr q = {0};
    int rc;
    pthread_rwlock_rdlock(&s->lock);
    if (!s->engine)
        rc = qerr_set(&q, QERR_FULL, "draining");
    else
        rc = engine_grammar(
            s->engine,
            (enum grammar_kind)(r->constraint.kind | (after_think ? GRAMMAR_AFTER_THINK : 0)),
            r->constraint.text, r->constraint.len, out, &q);
    pthread_rwlock_unlock(&s->lock);
    if (!rc) return 0;
    if (rc == QERR_FULL && !strcmp(q.msg, "draining"))
        return oai_error_set(e, 503, "server_error", "draining", NULL, "the server is draining");
    if (rc == QERR_NOMEM) return oai_error_set(e, 500, "server_error", NULL, NULL, "%s", q.msg);
    return oai_error_set(e, 400, "invalid_request_error",
                         rc == QERR_UNSUPPORTED ? "unsupported_schema" : "invalid_schema",
                         r->constraint.param, "'%s': %s", r->constraint.param, q.msg);
}

bool api_tools_active(const struct oai_request *r)
{
    return (r->kind == OAI_CHAT || r->kind == OAI_RESPONSES || r->kind == OAI_TOKENIZE) &&
           r->n_tools > 0 && r->tool_choice != OAI_TOOLS_NONE;
}

int api_tools_prepare(struct serve *s, struct oai_request *r, struct oai_error *e)
{
    return api_tools_active(r) ? oai_tools_format(r, s->chat, e) : 0;
}

enum chat_tool_format api_tools_format(const struct serve *s)
{
    return s->chat ? s->chat->tools : CHAT_TOOLS_HERMES;
}
