/* api_structured: structured outputs and tool calling in the generation handlers (see
 * api_structured.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_structured.h"

int api_grammar(struct serve *s, const struct oai_request *r, struct grammar **out,
                struct oai_error *e)
{
    *out = NULL;
    if (r->constraint.kind < 0) return 0;
    struct qerr q = {0};
    int rc;
    pthread_rwlock_rdlock(&s->lock);
    if (!s->engine)
        rc = qerr_set(&q, QERR_FULL, "draining");
    else
        rc = engine_grammar(s->engine, (enum grammar_kind)r->constraint.kind, r->constraint.text,
                            r->constraint.len, out, &q);
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
    return (r->kind == OAI_CHAT || r->kind == OAI_RESPONSES) && r->n_tools > 0 &&
           r->tool_choice != OAI_TOOLS_NONE;
}

int api_tools_prompt(struct serve *s, struct oai_request *r, struct oai_error *e)
{
    if (!api_tools_active(r)) return 0;
    bool has_system = r->n_msgs > 0 && !strcmp(r->msgs[0].role, "system");
    const char *base = has_system ? r->msgs[0].content : s->chat ? s->chat->default_system : NULL;
    char *text = oai_tools_system(r, base);
    if (!text) return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (has_system) {
        free(r->owned[0]);
        r->owned[0] = text;
        r->msgs[0].content = text;
        return 0;
    }
    struct chat_msg *m = realloc(r->msgs, (r->n_msgs + 1) * sizeof *m);
    if (m) r->msgs = m;
    char **o = m ? realloc(r->owned, (r->n_msgs + 1) * sizeof *o) : NULL;
    if (o) r->owned = o;
    if (!m || !o) {
        free(text);
        return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    memmove(r->msgs + 1, r->msgs, r->n_msgs * sizeof *r->msgs);
    memmove(r->owned + 1, r->owned, r->n_msgs * sizeof *r->owned);
    r->msgs[0] = (struct chat_msg){"system", text};
    r->owned[0] = text;
    r->n_msgs++;
    return 0;
}

/* tool_calls[] for calls; ids "call_<id>_<choice>_<k>". */
static cJSON *calls_json(const struct oai_tool_call *c, size_t n, const char *id, int choice,
                         bool stream_head)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t k = 0; arr && k < n; k++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, t);
        if (stream_head) cJSON_AddNumberToObject(t, "index", (double)k);
        char cid[96];
        snprintf(cid, sizeof cid, "call_%.60s_%d_%zu", id, choice, k);
        cJSON_AddStringToObject(t, "id", cid);
        cJSON_AddStringToObject(t, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(f, "name", c[k].name);
        cJSON_AddStringToObject(f, "arguments", stream_head ? "" : c[k].arguments);
    }
    return arr;
}

char *api_tools_rewrite(char *body, const char *id)
{
    cJSON *root = cJSON_Parse(body);
    if (!root) return body;
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices"), *ch;
    int i = 0;
    cJSON_ArrayForEach(ch, choices)
    {
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!cJSON_IsString(content)) {
            i++;
            continue;
        }
        struct oai_tool_call *calls;
        size_t keep;
        const char *text = content->valuestring;
        int n = oai_parse_tool_calls(text, strlen(text), &calls, &keep);
        if (n > 0) {
            cJSON *nc = keep ? cJSON_CreateString("") : cJSON_CreateNull();
            if (keep && nc) {
                char *pre = strndup(text, keep);
                cJSON_Delete(nc);
                nc = pre ? cJSON_CreateString(pre) : NULL;
                free(pre);
            }
            if (nc) cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", nc);
            cJSON_AddItemToObject(msg, "tool_calls", calls_json(calls, (size_t)n, id, i, false));
            cJSON *fin = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
            if (cJSON_IsString(fin) && !strcmp(fin->valuestring, "stop"))
                cJSON_ReplaceItemInObjectCaseSensitive(ch, "finish_reason",
                                                       cJSON_CreateString("tool_calls"));
            oai_tool_calls_free(calls, (size_t)n);
        }
        i++;
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!out) return body;
    free(body);
    /* cJSON's allocator is malloc; the caller frees with free */
    return out;
}

/* One chat.completion.chunk for choice index with delta (taken) and finish (NULL: null). */
static int chunk(struct sbuf *b, const struct oai_meta *m, int index, cJSON *delta,
                 const char *finish, bool usage_null)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) {
        cJSON_Delete(delta);
        return -1;
    }
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", "chat.completion.chunk");
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", index);
    cJSON_AddItemToObject(ch, "delta", delta);
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    if (usage_null) cJSON_AddNullToObject(root, "usage");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    int rc = !s || sbuf_puts(b, "data: ") || sbuf_puts(b, s) || sbuf_puts(b, "\n\n");
    cJSON_free(s);
    return rc ? -1 : 0;
}

/* How much of text can go out as content now: up to the first "<tool_call>", or short of a
 * tail that may begin one. The cut always falls before a '<', so never inside a character. */
static size_t safe_len(const char *text, size_t len)
{
    static const char tag[] = "<tool_call>";
    const char *hit = memmem(text, len, tag, sizeof tag - 1);
    if (hit) return (size_t)(hit - text);
    for (size_t k = len > sizeof tag - 2 ? len - (sizeof tag - 2) : 0; k < len; k++)
        if (text[k] == '<' && !memcmp(text + k, tag, len - k)) return k;
    return len;
}

static int content_chunk(struct sbuf *b, const struct oai_meta *m, int index, const char *text,
                         size_t from, size_t to, bool usage_null)
{
    if (to <= from) return 0;
    char *part = strndup(text + from, to - from);
    cJSON *d = cJSON_CreateObject();
    if (part && d) cJSON_AddStringToObject(d, "content", part);
    free(part);
    return chunk(b, m, index, d, NULL, usage_null);
}

char *api_tools_chunks(const struct oai_meta *m, int index, const char *text, size_t len,
                       size_t *sent, enum finish_reason finish, bool usage_null)
{
    struct sbuf b = {0};
    int rc = 0;
    if (finish == FINISH_NONE) {
        size_t safe = safe_len(text, len);
        rc = content_chunk(&b, m, index, text, *sent, safe, usage_null);
        if (safe > *sent) *sent = safe;
        if (rc) {
            sbuf_free(&b);
            return NULL;
        }
        char *out = sbuf_take(&b);
        return out ? out : strdup("");
    }
    struct oai_tool_call *calls = NULL;
    size_t keep = len;
    int n = finish == FINISH_STOP ? oai_parse_tool_calls(text, len, &calls, &keep) : 0;
    if (n < 0) return NULL;
    if (n == 0) keep = len;
    rc |= content_chunk(&b, m, index, text, *sent, keep, usage_null);
    if (keep > *sent) *sent = keep;
    for (int k = 0; k < n && !rc; k++) {
        /* id, type and name first, then the arguments */
        cJSON *d = cJSON_CreateObject();
        cJSON *one = calls_json(calls + k, 1, m->id, index, true);
        cJSON *first = one ? cJSON_GetArrayItem(one, 0) : NULL;
        if (first) cJSON_ReplaceItemInObjectCaseSensitive(first, "index", cJSON_CreateNumber(k));
        if (d && one) cJSON_AddItemToObject(d, "tool_calls", one);
        rc |= chunk(&b, m, index, d, NULL, usage_null);
        cJSON *d2 = cJSON_CreateObject(), *arr = cJSON_CreateArray(), *t = cJSON_CreateObject();
        if (d2 && arr && t) {
            cJSON_AddNumberToObject(t, "index", k);
            cJSON *f = cJSON_AddObjectToObject(t, "function");
            cJSON_AddStringToObject(f, "arguments", calls[k].arguments);
            cJSON_AddItemToArray(arr, t);
            cJSON_AddItemToObject(d2, "tool_calls", arr);
        } else {
            cJSON_Delete(arr);
            cJSON_Delete(t);
        }
        rc |= chunk(&b, m, index, d2, NULL, usage_null);
    }
    const char *fin = n > 0 ? "tool_calls" : oai_finish_name(finish);
    rc |= chunk(&b, m, index, cJSON_CreateObject(), fin, usage_null);
    oai_tool_calls_free(calls, n > 0 ? (size_t)n : 0);
    if (rc) {
        sbuf_free(&b);
        return NULL;
    }
    return sbuf_take(&b);
}
