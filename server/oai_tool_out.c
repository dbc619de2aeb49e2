/* oai_tool_out: the tool calls in a chat output turned into the OpenAI shapes: message.tool_calls
 * in a whole response, delta.tool_calls in a stream (id, type and name first, then the
 * arguments), with the content before the calls streamed as it comes (see oai.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oai.h"

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

char *oai_tools_rewrite(char *body, const char *id, enum chat_tool_format fmt)
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
        int n = oai_parse_tool_calls(fmt, text, strlen(text), &calls, &keep);
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

/* One chat.completion.chunk for choice index with delta (taken) and finish (NULL: null); a
 * finishing chunk carries vLLM's stop_reason (stop: the stop string or token, or null). */
static int chunk(struct sbuf *b, const struct oai_meta *m, int index, cJSON *delta,
                 const char *finish, const struct oai_stop *stop, bool usage_null)
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
    if (finish) {
        cJSON_AddStringToObject(ch, "finish_reason", finish);
        if (stop && stop->text)
            cJSON_AddStringToObject(ch, "stop_reason", stop->text);
        else if (stop && stop->by_token)
            cJSON_AddNumberToObject(ch, "stop_reason", stop->token);
        else
            cJSON_AddNullToObject(ch, "stop_reason");
    } else {
        cJSON_AddNullToObject(ch, "finish_reason");
    }
    if (usage_null) cJSON_AddNullToObject(root, "usage");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    int rc = !s || sbuf_puts(b, "data: ") || sbuf_puts(b, s) || sbuf_puts(b, "\n\n");
    cJSON_free(s);
    return rc ? -1 : 0;
}

/* How much of text can go out as content now: up to the format's opening tag, or short of a
 * tail that may begin one; with Llama 3's format, nothing while the output (past leading
 * whitespace) is empty or opens with '{', which makes it calls. The cut always falls before
 * an ASCII byte, so never inside a character. */
static size_t safe_len(enum chat_tool_format fmt, const char *text, size_t len)
{
    const char *tag = fmt == CHAT_TOOLS_LLAMA3   ? "<|python_tag|>"
                      : fmt == CHAT_TOOLS_HERMES ? "<tool_call>"
                                                 : "[TOOL_CALLS]";
    size_t n = strlen(tag);
    if (fmt == CHAT_TOOLS_LLAMA3) {
        size_t k = 0;
        while (k < len && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r' || text[k] == '\n'))
            k++;
        if (k == len || text[k] == '{') return 0;
    }
    const char *hit = memmem(text, len, tag, n);
    if (hit) return (size_t)(hit - text);
    for (size_t k = len > n - 1 ? len - (n - 1) : 0; k < len; k++)
        if (text[k] == tag[0] && !memcmp(text + k, tag, len - k)) return k;
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
    return chunk(b, m, index, d, NULL, NULL, usage_null);
}

char *oai_tools_chunks(const struct oai_meta *m, enum chat_tool_format fmt, int index,
                       const char *text, size_t len, size_t *sent, enum finish_reason finish,
                       const struct oai_stop *stop, bool usage_null)
{
    struct sbuf b = {0};
    int rc = 0;
    if (finish == FINISH_NONE) {
        size_t safe = safe_len(fmt, text, len);
        /* whitespace right before a call is not content (oai_parse_tool_calls trims it) */
        while (safe > *sent && (text[safe - 1] == ' ' || text[safe - 1] == '\n' ||
                                text[safe - 1] == '\t' || text[safe - 1] == '\r'))
            safe--;
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
    /* as oai_tools_rewrite reads a whole response: the calls of any output, a cut one's too
     * (the whole calls before the cut), only a stop's finish becoming "tool_calls" */
    int n = oai_parse_tool_calls(fmt, text, len, &calls, &keep);
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
        rc |= chunk(&b, m, index, d, NULL, NULL, usage_null);
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
        rc |= chunk(&b, m, index, d2, NULL, NULL, usage_null);
    }
    const char *fin = n > 0 && finish == FINISH_STOP ? "tool_calls" : oai_finish_name(finish);
    rc |= chunk(&b, m, index, cJSON_CreateObject(), fin, stop, usage_null);
    oai_tool_calls_free(calls, n > 0 ? (size_t)n : 0);
    if (rc) {
        sbuf_free(&b);
        return NULL;
    }
    return sbuf_take(&b);
}
