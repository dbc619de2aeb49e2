/* oai_tools: tool calling in the Hermes/Qwen ChatML format, the one ChatML models are trained on:
 * the tools are offered in the system turn inside <tools></tools>, the model answers
 * <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, and results come back in a user
 * turn inside <tool_response></tool_response>. tool_choice "required" and a named function are
 * enforced by a grammar (engine/json_schema.c gb_tool_calls); "auto" lets the model choose and
 * the output is parsed for calls afterwards. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/grammar.h"
#include "oai.h"

static const cJSON *field(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

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

/* The tool-call grammar's source: {"tools":[{"name","parameters"}],"parallel":bool}. */
static int tool_constraint(struct oai_request *r, const char *only, struct oai_error *e)
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
        const cJSON *p = field(r->tools[i].function, "parameters");
        if (p) cJSON_AddItemReferenceToObject(t, "parameters", (cJSON *)p);
    }
    cJSON_AddBoolToObject(root, "parallel", !only && r->parallel_tool_calls);
    if (r->tool_choice == OAI_TOOLS_AUTO) cJSON_AddTrueToObject(root, "auto");
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return oom(e);
    r->constraint.kind = GRAMMAR_TOOL_CALLS;
    r->constraint.text = text;
    r->constraint.len = strlen(text);
    snprintf(r->constraint.param, sizeof r->constraint.param, "tools");
    return 0;
}

static int tool_grammar(struct oai_request *r, struct oai_error *e);

int oai_parse_tools(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice"),
                *par = field(root, "parallel_tool_calls");
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
        const cJSON *type = field(t, "type"), *fn = field(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return bad(e, param, "'%s' must be an object with type 'function'", param);
        const cJSON *name = field(fn, "name"), *params = field(fn, "parameters"),
                    *desc = field(fn, "description");
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
        return n ? tool_grammar(r, e) : 0;
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
        const cJSON *fn = field(choice, "function"), *name = field(fn, "name");
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
    return tool_grammar(r, e);
}

/* required / named: the calls are the output; auto: free text, or calls once one opens (unless
 * response_format already constrains the output) */
static int tool_grammar(struct oai_request *r, struct oai_error *e)
{
    if (r->tool_choice == OAI_TOOLS_AUTO)
        return r->constraint.kind >= 0 ? 0 : tool_constraint(r, NULL, e);
    if (r->tool_choice == OAI_TOOLS_REQUIRED || r->tool_choice == OAI_TOOLS_NAMED) {
        if (r->constraint.kind >= 0)
            return bad(e, "tool_choice",
                       "'%s' required or named cannot be combined with response_format or "
                       "structured_outputs",
                       "tool_choice");
        return tool_constraint(r, r->tool_choice == OAI_TOOLS_NAMED ? r->tool_choice_name : NULL,
                               e);
    }
    return 0;
}

/* One call as the model writes it; arguments as given (JSON text). */
static int put_call(struct sbuf *b, const char *name, const char *args)
{
    cJSON *n = cJSON_CreateString(name);
    char *q = n ? cJSON_PrintUnformatted(n) : NULL;
    cJSON_Delete(n);
    if (!q) return -1;
    int rc = sbuf_puts(b, "<tool_call>\n{\"name\": ") || sbuf_puts(b, q) ||
             sbuf_puts(b, ", \"arguments\": ") || sbuf_puts(b, args && *args ? args : "{}") ||
             sbuf_puts(b, "}\n</tool_call>");
    cJSON_free(q);
    return rc;
}

int oai_tool_message(const cJSON *msg, size_t i, const char **role, char **out, struct oai_error *e)
{
    *out = NULL;
    const cJSON *r = field(msg, "role"), *content = field(msg, "content"),
                *calls = field(msg, "tool_calls");
    if (!cJSON_IsString(r)) return 0;
    char param[64];
    struct sbuf b = {0};
    if (!strcmp(r->valuestring, "tool")) {
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (content && !cJSON_IsString(content))
            return bad(e, param, "'%s' of a tool message must be a string", param);
        if (sbuf_puts(&b, "<tool_response>\n") ||
            sbuf_puts(&b, content ? content->valuestring : "") ||
            sbuf_puts(&b, "\n</tool_response>")) {
            sbuf_free(&b);
            return oom(e);
        }
        *role = "user";
    } else if (!strcmp(r->valuestring, "assistant") && calls) {
        snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
        if (!cJSON_IsArray(calls)) return bad(e, param, "'%s' must be a list", param);
        if (content && !cJSON_IsString(content))
            return bad(e, param, "'%s' goes with a string or null content", param);
        if (content && *content->valuestring && sbuf_puts(&b, content->valuestring)) return oom(e);
        const cJSON *c;
        cJSON_ArrayForEach(c, calls)
        {
            const cJSON *fn = field(c, "function"), *name = field(fn, "name"),
                        *args = field(fn, "arguments");
            if (!cJSON_IsString(name) || (args && !cJSON_IsString(args))) {
                sbuf_free(&b);
                return bad(e, param,
                           "'%s' must hold {\"function\":{\"name\":string,\"arguments\":string}}",
                           param);
            }
            if ((b.len && sbuf_puts(&b, "\n")) ||
                put_call(&b, name->valuestring, args ? args->valuestring : "{}")) {
                sbuf_free(&b);
                return oom(e);
            }
        }
        *role = "assistant";
    } else {
        return 0;
    }
    *out = sbuf_take(&b);
    return *out ? 0 : oom(e);
}

char *oai_tools_system(const struct oai_request *r, const char *base)
{
    struct sbuf b = {0};
    int rc = 0;
    if (base && *base) rc |= sbuf_puts(&b, base) || sbuf_puts(&b, "\n\n");
    rc |=
        sbuf_puts(&b, "# Tools\n\nYou may call one or more functions to assist with the user "
                      "query.\n\nYou are provided with function signatures within <tools></tools> "
                      "XML tags:\n<tools>");
    for (size_t i = 0; i < r->n_tools && !rc; i++) {
        cJSON *t = cJSON_CreateObject();
        if (!t) {
            rc = 1;
            break;
        }
        cJSON_AddStringToObject(t, "type", "function");
        cJSON_AddItemReferenceToObject(t, "function", (cJSON *)r->tools[i].function);
        char *s = cJSON_PrintUnformatted(t);
        cJSON_Delete(t);
        rc |= !s || sbuf_puts(&b, "\n") || sbuf_puts(&b, s);
        cJSON_free(s);
    }
    rc |= sbuf_puts(&b, "\n</tools>\n\nFor each function call, return a json object with function "
                        "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                        "</tool_call>");
    if (rc) {
        sbuf_free(&b);
        return NULL;
    }
    return sbuf_take(&b);
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

int oai_parse_tool_calls(const char *text, size_t len, struct oai_tool_call **calls,
                         size_t *content_len)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    *calls = NULL;
    *content_len = len;
    const char *end = text + len;
    const char *p = memmem(text, len, open, sizeof open - 1);
    if (!p) return 0;
    size_t first = (size_t)(p - text), cap = 0;
    for (const char *c = p; c; c = memmem(c + 1, (size_t)(end - c - 1), open, sizeof open - 1))
        cap++;
    struct oai_tool_call *out = calloc(cap, sizeof *out);
    if (!out) return -1;
    size_t n = 0;
    while (p) {
        p += sizeof open - 1;
        const char *json_end = NULL;
        cJSON *obj = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &json_end, 0);
        const cJSON *name = field(obj, "name"), *args = field(obj, "arguments");
        const char *q = json_end;
        while (q && q < end && isspace((unsigned char)*q)) q++;
        if (!obj || !cJSON_IsString(name) || !q || (size_t)(end - q) < sizeof close - 1 ||
            memcmp(q, close, sizeof close - 1)) {
            cJSON_Delete(obj);
            oai_tool_calls_free(out, n);
            return 0; /* not a well-formed call: the text is content */
        }
        char *a = NULL;
        if (args && !cJSON_IsString(args)) {
            a = cJSON_PrintUnformatted(args);
        } else {
            const char *src = args ? args->valuestring : "{}";
            if ((a = cJSON_malloc(strlen(src) + 1))) strcpy(a, src);
        }
        char *nm = strdup(name->valuestring);
        cJSON_Delete(obj);
        if (!a || !nm) {
            cJSON_free(a);
            free(nm);
            oai_tool_calls_free(out, n);
            return -1;
        }
        out[n++] = (struct oai_tool_call){nm, a};
        q += sizeof close - 1;
        p = memmem(q, (size_t)(end - q), open, sizeof open - 1);
    }
    while (first > 0 && isspace((unsigned char)text[first - 1])) first--;
    *content_len = first;
    *calls = out;
    return (int)n;
}
