/* oai_tools: tool calling. The request's tools, tool_choice and tool messages are parsed here;
 * the chat template writes them in its model's format (engine/chat_tools.c: Hermes/Qwen
 * <tool_call> blocks for ChatML, Llama 3.1/3.2 JSON, Mistral [TOOL_CALLS]). tool_choice
 * "required" and a named function are enforced by a grammar in that format
 * (engine/json_schema.c gb_tool_calls); "auto" lets the model choose, and once it opens a call
 * the grammar holds it to a well-formed one. The output is parsed for calls by the format's
 * markers (oai_parse_tool_calls). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/grammar.h"
#include "oai.h"
#include "oai_json.h"

static int bad(struct oai_error *e, const char *param, const char *fmt, const char *arg)
{
    return oai_error_set(e, 400, "invalid_request_error", "invalid_value", param, fmt, arg);
}

static int oom(struct oai_error *e)
{
    return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

static bool good_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.') return false;
    return true;
}

/* The tool-call grammar's source: {"tools":[{"name","parameters"}],"parallel":bool,
 * "format":...}. */
static int tool_constraint(struct oai_request *r, const char *only, const char *format,
                           struct oai_error *e)
{
    cJSON *root = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(root, "tools");
    if (!root || !list) {
        cJSON_Delete(root);
        return oom(e);
    }
    for (size_t i = 0; i < r->n_tools; i++) {
        if (only && strcmp(only, r->tools[i].name)) continue;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToArray(list, t);
        cJSON_AddStringToObject(t, "name", r->tools[i].name);
        const cJSON *p = oai_field(r->tools[i].function, "parameters");
        if (p) cJSON_AddItemReferenceToObject(t, "parameters", (cJSON *)p);
    }
    cJSON_AddBoolToObject(root, "parallel", !only && r->parallel_tool_calls);
    cJSON_AddStringToObject(root, "format", format);
    if (r->tool_choice == OAI_TOOLS_AUTO) cJSON_AddTrueToObject(root, "auto");
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return oom(e);
    free(r->constraint.text);
    r->constraint.kind = GRAMMAR_TOOL_CALLS;
    r->constraint.text = text;
    r->constraint.len = strlen(text);
    snprintf(r->constraint.param, sizeof r->constraint.param, "tools");
    return 0;
}

static int tool_grammar(struct oai_request *r, const char *format, struct oai_error *e);

int oai_parse_tools(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *tools = oai_field(root, "tools"), *choice = oai_field(root, "tool_choice"),
                *par = oai_field(root, "parallel_tool_calls");
    if (par) {
        if (!cJSON_IsBool(par))
            return bad(e, "parallel_tool_calls", "'%s' must be a boolean", "parallel_tool_calls");
        r->parallel_tool_calls = cJSON_IsTrue(par);
    }
    if (tools && !cJSON_IsArray(tools)) return bad(e, "tools", "'%s' must be a list", "tools");
    size_t n = tools ? (size_t)cJSON_GetArraySize(tools) : 0;
    if (n > 128) return bad(e, "tools", "'%s' has more than 128 tools", "tools");
    if (n) {
        r->tools = calloc(n, sizeof *r->tools);
        if (!r->tools) return oom(e);
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", r->n_tools);
        const cJSON *type = oai_field(t, "type"), *fn = oai_field(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return bad(e, param, "'%s' must be an object with type 'function'", param);
        const cJSON *name = oai_field(fn, "name"), *params = oai_field(fn, "parameters"),
                    *desc = oai_field(fn, "description");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !good_name(name->valuestring))
            return bad(e, param,
                       "'%s.function' must be an object with a 'name' of 1-64 letters, digits, "
                       "'_', '-' or '.'",
                       param);
        if (params && !cJSON_IsObject(params))
            return bad(e, param, "'%s.function.parameters' must be a JSON Schema object", param);
        if (desc && !cJSON_IsString(desc))
            return bad(e, param, "'%s.function.description' must be a string", param);
        for (size_t k = 0; k < r->n_tools; k++)
            if (!strcmp(r->tools[k].name, name->valuestring))
                return bad(e, param, "'%s' repeats a function name", param);
        r->tools[r->n_tools++] = (struct oai_tool){name->valuestring, fn};
    }
    if (!choice) {
        r->tool_choice = n ? OAI_TOOLS_AUTO : OAI_TOOLS_NONE;
        return n ? tool_grammar(r, "hermes", e) : 0;
    }
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (!strcmp(c, "none"))
            r->tool_choice = OAI_TOOLS_NONE;
        else if (!strcmp(c, "auto"))
            r->tool_choice = OAI_TOOLS_AUTO;
        else if (!strcmp(c, "required"))
            r->tool_choice = OAI_TOOLS_REQUIRED;
        else
            return bad(e, "tool_choice",
                       "'tool_choice' is '%.40s'; it must be none, auto, required or "
                       "{\"type\":\"function\",\"function\":{\"name\":...}}",
                       c);
    } else {
        const cJSON *fn = oai_field(choice, "function"), *name = oai_field(fn, "name");
        if (!cJSON_IsObject(choice) || !cJSON_IsString(name))
            return bad(e, "tool_choice", "'%s' must be a string or name a function", "tool_choice");
        r->tool_choice = OAI_TOOLS_NAMED;
        r->tool_choice_name = name->valuestring;
        bool found = false;
        for (size_t k = 0; k < r->n_tools; k++)
            found |= !strcmp(r->tools[k].name, name->valuestring);
        if (!found)
            return bad(e, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'",
                       name->valuestring);
    }
    if (r->tool_choice != OAI_TOOLS_NONE && !n)
        return bad(e, "tool_choice", "'%s' needs 'tools'", "tool_choice");
    return tool_grammar(r, "hermes", e);
}

/* required / named: the calls are the output; auto: free text, or calls once one opens (unless
 * response_format already constrains the output) */
static int tool_grammar(struct oai_request *r, const char *format, struct oai_error *e)
{
    if (r->tool_choice == OAI_TOOLS_AUTO)
        return r->constraint.kind >= 0 ? 0 : tool_constraint(r, NULL, format, e);
    if (r->tool_choice == OAI_TOOLS_REQUIRED || r->tool_choice == OAI_TOOLS_NAMED) {
        if (r->constraint.kind >= 0)
            return bad(e, "tool_choice",
                       "'%s' required or named cannot be combined with a response format "
                       "(response_format, text.format) or structured_outputs",
                       "tool_choice");
        return tool_constraint(r, r->tool_choice == OAI_TOOLS_NAMED ? r->tool_choice_name : NULL,
                               format, e);
    }
    return 0;
}

int oai_tools_format(struct oai_request *r, const struct chat_template *t, struct oai_error *e)
{
    if (!t || r->constraint.kind != GRAMMAR_TOOL_CALLS || strcmp(r->constraint.param, "tools"))
        return 0;
    const char *f = "hermes";
    switch (t->tools) {
    case CHAT_TOOLS_HERMES:
        break;
    case CHAT_TOOLS_LLAMA3:
        f = "llama3";
        break;
    case CHAT_TOOLS_MISTRAL:
        f = t->variant == CHAT_VARIANT_MISTRAL_V3 || t->variant == CHAT_VARIANT_MISTRAL_V1
                ? "mistral"
                : "mistral-nospace";
        break;
    case CHAT_TOOLS_MISTRAL_ARGS:
        f = "mistral-args";
        break;
    }
    if (!strcmp(f, "hermes")) return 0; /* as oai_parse_tools made it */
    r->constraint.kind = -1;            /* so tool_grammar makes it again */
    return tool_grammar(r, f, e);
}

char *oai_tools_json(const struct oai_request *r)
{
    cJSON *list = cJSON_CreateArray();
    for (size_t i = 0; list && i < r->n_tools; i++)
        cJSON_AddItemReferenceToArray(list, (cJSON *)r->tools[i].function);
    char *s = list ? cJSON_PrintUnformatted(list) : NULL;
    cJSON_Delete(list);
    return s;
}

size_t oai_count_tool_calls(const cJSON *msg)
{
    const cJSON *r = oai_field(msg, "role"), *calls = oai_field(msg, "tool_calls");
    if (!cJSON_IsString(r) || strcmp(r->valuestring, "assistant") || !cJSON_IsArray(calls))
        return 0;
    return (size_t)cJSON_GetArraySize(calls);
}

int oai_tool_message(const cJSON *msg, size_t i, struct chat_msg *m, struct chat_call *calls,
                     struct oai_error *e)
{
    const cJSON *r = oai_field(msg, "role"), *content = oai_field(msg, "content"),
                *calls_in = oai_field(msg, "tool_calls"), *id = oai_field(msg, "tool_call_id");
    if (!cJSON_IsString(r)) return 0;
    char param[64];
    if (!strcmp(r->valuestring, "tool")) {
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (content && !cJSON_IsString(content))
            return bad(e, param, "'%s' of a tool message must be a string", param);
        snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
        if (id && !cJSON_IsString(id)) return bad(e, param, "'%s' must be a string", param);
        *m = (struct chat_msg){.role = "tool",
                               .content = content ? content->valuestring : "",
                               .call_id = id ? id->valuestring : NULL};
        return 1;
    }
    if (strcmp(r->valuestring, "assistant") || !calls_in) return 0;
    snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
    if (!cJSON_IsArray(calls_in)) return bad(e, param, "'%s' must be a list", param);
    if (content && !cJSON_IsString(content))
        return bad(e, param, "'%s' goes with a string or null content", param);
    size_t k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls_in)
    {
        const cJSON *fn = oai_field(c, "function"), *name = oai_field(fn, "name"),
                    *args = oai_field(fn, "arguments"), *cid = oai_field(c, "id");
        if (!cJSON_IsString(name) || (args && !cJSON_IsString(args)) ||
            (cid && !cJSON_IsString(cid)))
            return bad(e, param,
                       "'%s' must hold {\"id\":string,\"function\":{\"name\":string,"
                       "\"arguments\":string}}",
                       param);
        calls[k++] = (struct chat_call){.id = cid ? cid->valuestring : NULL,
                                        .name = name->valuestring,
                                        .arguments = args ? args->valuestring : "{}"};
    }
    *m = (struct chat_msg){.role = "assistant",
                           .content = content ? content->valuestring : NULL,
                           .calls = k ? calls : NULL,
                           .n_calls = k};
    if (!k && !content) m->content = "";
    return 1;
}

void oai_tool_calls_free(struct oai_tool_call *c, size_t n)
{
    if (!c) return;
    for (size_t i = 0; i < n; i++) {
        free(c[i].name);
        cJSON_free(c[i].arguments);
    }
    free(c);
}

struct found {
    struct oai_tool_call *v;
    size_t n, cap;
};

/* Adds a call named name[0..name_len) with args (an object, a JSON string, or NULL for {});
 * false when args is something else or on OOM. */
static bool push(struct found *f, const char *name, size_t name_len, const cJSON *args)
{
    if (name_len == 0 || (args && !cJSON_IsObject(args) && !cJSON_IsString(args))) return false;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 4;
        struct oai_tool_call *v = realloc(f->v, cap * sizeof *v);
        if (!v) return false;
        f->v = v;
        f->cap = cap;
    }
    char *a = NULL;
    if (cJSON_IsObject(args)) {
        a = cJSON_PrintUnformatted(args);
    } else {
        const char *src = args ? args->valuestring : "{}";
        if ((a = cJSON_malloc(strlen(src) + 1))) strcpy(a, src);
    }
    char *nm = strndup(name, name_len);
    if (!a || !nm) {
        cJSON_free(a);
        free(nm);
        return false;
    }
    f->v[f->n++] = (struct oai_tool_call){nm, a};
    return true;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && isspace((unsigned char)*p)) p++;
    return p;
}

static bool starts(const char *p, const char *end, const char *s)
{
    size_t n = strlen(s);
    return (size_t)(end - p) >= n && !memcmp(p, s, n);
}

/* One JSON object {"name": string, key: object} at p; *next past it. */
static bool call_object(struct found *f, const char *p, const char *end, const char *key,
                        const char *alt_key, const char **next)
{
    const char *json_end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &json_end, 0);
    const cJSON *name = oai_field(obj, "name"), *args = oai_field(obj, key);
    if (!args && alt_key) args = oai_field(obj, alt_key);
    bool ok = cJSON_IsObject(obj) && cJSON_IsString(name) &&
              push(f, name->valuestring, strlen(name->valuestring), args);
    cJSON_Delete(obj);
    *next = json_end;
    return ok;
}

/* Hermes: <tool_call>{...}</tool_call> blocks; returns where the first one begins. */
static const char *parse_hermes(struct found *f, const char *text, const char *end)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *first = memmem(text, (size_t)(end - text), open, sizeof open - 1);
    for (const char *p = first; p;) {
        const char *q;
        if (!call_object(f, skip_ws(p + sizeof open - 1, end), end, "arguments", NULL, &q))
            return NULL;
        q = skip_ws(q, end);
        if (!starts(q, end, close)) return NULL;
        q += sizeof close - 1;
        p = memmem(q, (size_t)(end - q), open, sizeof open - 1);
    }
    return first;
}

/* Llama 3.x: the whole output is {"name": f, "parameters": {...}} (calls joined by ';'), or
 * text then <|python_tag|> and the calls. */
static const char *parse_llama3(struct found *f, const char *text, const char *end)
{
    static const char tag[] = "<|python_tag|>";
    const char *hit = memmem(text, (size_t)(end - text), tag, sizeof tag - 1);
    const char *p = hit ? hit + sizeof tag - 1 : skip_ws(text, end);
    if (!hit && (p == end || *p != '{')) return NULL;
    for (;;) {
        const char *q;
        if (!call_object(f, skip_ws(p, end), end, "parameters", "arguments", &q)) return NULL;
        q = skip_ws(q, end);
        if (q == end) break;
        if (*q != ';') return NULL;
        p = q + 1;
    }
    return hit ? hit : text;
}

/* Mistral: [TOOL_CALLS] [{"name": f, "arguments": {...}}, ...], or the newer
 * [TOOL_CALLS]f[ARGS]{...} (with [CALL_ID]id before [ARGS] in some), repeated. */
static const char *parse_mistral(struct found *f, const char *text, const char *end)
{
    static const char tag[] = "[TOOL_CALLS]", args[] = "[ARGS]", call_id[] = "[CALL_ID]";
    const char *first = memmem(text, (size_t)(end - text), tag, sizeof tag - 1);
    if (!first) return NULL;
    const char *p = skip_ws(first + sizeof tag - 1, end);
    if (p < end && *p == '[') { /* the JSON list */
        const char *json_end = NULL;
        cJSON *list = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &json_end, 0);
        const cJSON *c;
        bool ok = cJSON_IsArray(list) && list->child;
        cJSON_ArrayForEach(c, list)
        {
            const cJSON *name = oai_field(c, "name"), *a = oai_field(c, "arguments");
            ok = ok && cJSON_IsString(name) &&
                 push(f, name->valuestring, strlen(name->valuestring), a);
        }
        cJSON_Delete(list);
        return ok && skip_ws(json_end, end) == end ? first : NULL;
    }
    for (;;) {
        const char *a = memmem(p, (size_t)(end - p), args, sizeof args - 1);
        if (!a) return NULL;
        const char *name_end = memmem(p, (size_t)(a - p), call_id, sizeof call_id - 1);
        if (!name_end) name_end = a;
        for (const char *c = p; c < name_end; c++)
            if (isspace((unsigned char)*c) || *c == '[' || *c == '{') return NULL;
        const char *q = a + sizeof args - 1, *json_end = NULL;
        cJSON *obj = cJSON_ParseWithLengthOpts(q, (size_t)(end - q), &json_end, 0);
        bool ok = cJSON_IsObject(obj) && push(f, p, (size_t)(name_end - p), obj);
        cJSON_Delete(obj);
        if (!ok) return NULL;
        q = skip_ws(json_end, end);
        if (q == end) return first;
        if (!starts(q, end, tag)) return NULL;
        p = q + sizeof tag - 1;
    }
}

int oai_parse_tool_calls(enum chat_tool_format fmt, const char *text, size_t len,
                         struct oai_tool_call **calls, size_t *content_len)
{
    *calls = NULL;
    *content_len = len;
    const char *end = text + len, *first;
    struct found f = {0};
    switch (fmt) {
    case CHAT_TOOLS_LLAMA3:
        first = parse_llama3(&f, text, end);
        break;
    case CHAT_TOOLS_MISTRAL:
    case CHAT_TOOLS_MISTRAL_ARGS:
        first = parse_mistral(&f, text, end);
        break;
    default:
        first = parse_hermes(&f, text, end);
        break;
    }
    if (!first || !f.n) { /* not well-formed calls: the text is content */
        oai_tool_calls_free(f.v, f.n);
        return 0;
    }
    size_t keep = (size_t)(first - text);
    while (keep > 0 && isspace((unsigned char)text[keep - 1])) keep--;
    *content_len = keep;
    *calls = f.v;
    return (int)f.n;
}
