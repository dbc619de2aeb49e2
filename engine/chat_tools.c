/* chat_tools: tools, tool calls and tool results in a chat template's own format.
 *
 * DESIGN. Each format is written as its model's published Jinja template writes it, since a
 * model calls tools well only when the prompt looks like its training data:
 *   - Hermes/Qwen (ChatML, and any template with no tool format of its own): the tools go into
 *     the system turn inside <tools></tools>, calls are <tool_call> blocks in the assistant turn
 *     and results come back in a user turn inside <tool_response></tool_response>. These are
 *     plain messages, so the conversation is rewritten and formatted by the plain formatter.
 *   - Llama 3.1/3.2 (meta-llama/Llama-3.1-8B-Instruct's and Llama-3.2-3B-Instruct's templates
 *     with their defaults: tools_in_user_message, no builtin_tools): a system turn opening with
 *     "Environment: ipython" and the knowledge and today dates, the tools as JSON indented by 4
 *     ahead of the first user message, a call as {"name": f, "parameters": {...}} and a result
 *     as an "ipython" turn holding tojson(content). The date is the 3.1 template's fixed
 *     "26 Jul 2024" (3.2's strftime_now would change the prompt every day and defeat the prefix
 *     cache). The template refuses more than one call per message; they are written joined by
 *     "; " (what the output parser reads back) rather than refused.
 *   - Mistral (Mistral-7B-Instruct-v0.3, Nemo, Small 3.1): [AVAILABLE_TOOLS] [...] before the
 *     last user message, [TOOL_CALLS] [{"name", "arguments", "id"}]</s> for calls and
 *     [TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS] for results, ids cut to
 *     their last 9 characters as Small 3.1's template does. The system message goes with the
 *     last user message (v0.3) or in [SYSTEM_PROMPT] (v7) as mistral_common writes it (the v0.3
 *     Jinja drops it unless the last message is the user's). The [ARGS] spelling
 *     (Small 3.2, Devstral) writes a call as [TOOL_CALLS]f[ARGS]{...} and a result as
 *     [TOOL_RESULTS]content[/TOOL_RESULTS].
 * JSON that the Jinja prints with tojson is printed as Python's json.dumps does (", " and ": ",
 * or indent=4 with ","), keys in the order the request gave them; whatever comes from the
 * request (tool definitions, arguments, results) is written as message content, so it cannot
 * name a control token. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_impl.h"

/* ---- JSON as Python's json.dumps(ensure_ascii=False) writes it ---- */

static void py_string(struct sb *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"':
            sb_put(b, "\\\"", 2);
            break;
        case '\\':
            sb_put(b, "\\\\", 2);
            break;
        case '\n':
            sb_put(b, "\\n", 2);
            break;
        case '\r':
            sb_put(b, "\\r", 2);
            break;
        case '\t':
            sb_put(b, "\\t", 2);
            break;
        case '\b':
            sb_put(b, "\\b", 2);
            break;
        case '\f':
            sb_put(b, "\\f", 2);
            break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                sb_str(b, esc);
            } else {
                sb_put(b, (const char *)p, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

static void py_number(struct sb *b, double x)
{
    char buf[40];
    if (!isfinite(x)) {
        sb_str(b, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (x == floor(x) && fabs(x) < 1e16) {
        snprintf(buf, sizeof buf, "%.0f", x);
    } else { /* the shortest text that reads back as x, as Python's repr */
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, x);
            if (strtod(buf, NULL) == x) break;
        }
    }
    sb_str(b, buf);
}

static void py_indent(struct sb *b, int indent, int level)
{
    sb_put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++) sb_put(b, " ", 1);
}

/* indent 0: one line with ", " and ": "; else one item a line, "," and ": " */
static void py_dump(struct sb *b, const cJSON *v, int indent, int level)
{
    if (cJSON_IsString(v)) {
        py_string(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        py_number(b, v->valuedouble);
    } else if (cJSON_IsTrue(v)) {
        sb_str(b, "true");
    } else if (cJSON_IsFalse(v)) {
        sb_str(b, "false");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        sb_str(b, obj ? "{" : "[");
        const cJSON *c;
        bool first = true;
        cJSON_ArrayForEach(c, v)
        {
            if (!first) sb_str(b, indent ? "," : ", ");
            first = false;
            if (indent) py_indent(b, indent, level + 1);
            if (obj) {
                py_string(b, c->string);
                sb_str(b, ": ");
            }
            py_dump(b, c, indent, level + 1);
        }
        if (indent && !first) py_indent(b, indent, level);
        sb_str(b, obj ? "}" : "]");
    } else {
        sb_str(b, "null");
    }
}

/* v dumped as content (it came from the request) */
static void content_json(struct sb *b, const cJSON *v, int indent)
{
    struct sb t = {0};
    py_dump(&t, v, indent, 0);
    if (t.oom) b->oom = true;
    if (t.p) sb_content(b, t.p, t.n);
    free(t.p);
}

/* A call's arguments parsed (NULL or "" is {}); NULL with err set when not a JSON object. */
static cJSON *call_args(const struct chat_call *c, size_t msg, struct qerr *err)
{
    const char *a = c->arguments && *c->arguments ? c->arguments : "{}";
    cJSON *v = cJSON_Parse(a);
    if (!cJSON_IsObject(v)) {
        cJSON_Delete(v);
        qerr_set(err, QERR_INVALID,
                 "chat_format: message %zu: the arguments of call '%.64s' are not a JSON object",
                 msg, c->name ? c->name : "");
        return NULL;
    }
    return v;
}

static bool check_calls(const struct chat_msg *m, size_t i, struct qerr *err)
{
    for (size_t k = 0; k < m->n_calls; k++)
        if (!m->calls[k].name || !*m->calls[k].name) {
            qerr_set(err, QERR_INVALID, "chat_format: message %zu: tool call %zu has no name", i,
                     k);
            return false;
        }
    return true;
}

/* ---- Hermes: a rewrite into plain messages ---- */

static char *hermes_system(const char *base, const cJSON *tools)
{
    struct sb t = {0};
    if (base) {
        sb_str(&t, base);
        sb_str(&t, "\n\n");
    }
    sb_str(&t, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n"
               "<tools>");
    const cJSON *fn;
    cJSON_ArrayForEach(fn, tools)
    {
        /* as the template's `tool | tojson` writes the request's tool: json.dumps' spacing */
        cJSON *w = cJSON_CreateObject();
        cJSON_AddStringToObject(w, "type", "function");
        cJSON_AddItemReferenceToObject(w, "function", (cJSON *)fn);
        if (!w) t.oom = true;
        sb_str(&t, "\n");
        if (w) py_dump(&t, w, 0, 0);
        cJSON_Delete(w);
    }
    sb_str(&t, "\n</tools>\n\nFor each function call, return a json object with function name and "
               "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
               "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
    if (t.oom) {
        free(t.p);
        return NULL;
    }
    return t.p;
}

/* An assistant message's text (text_len bytes) and calls as Qwen2.5's template writes them:
 * the name as it is, the arguments (parsed) through tojson. NULL with err set for arguments
 * that are not an object, or on OOM (err untouched). */
static char *hermes_calls(const struct chat_msg *m, const char *text, size_t text_len, size_t msg,
                          struct qerr *err)
{
    struct sb t = {0};
    sb_put(&t, "", 0);
    sb_put(&t, text, text_len);
    for (size_t k = 0; k < m->n_calls; k++) {
        cJSON *args = call_args(&m->calls[k], msg, err);
        if (!args) {
            free(t.p);
            return NULL;
        }
        if (t.n) sb_str(&t, "\n");
        sb_str(&t, "<tool_call>\n{\"name\": \"");
        sb_str(&t, m->calls[k].name);
        sb_str(&t, "\", \"arguments\": ");
        py_dump(&t, args, 0, 0);
        sb_str(&t, "}\n</tool_call>");
        cJSON_Delete(args);
    }
    if (t.oom) {
        free(t.p);
        return NULL;
    }
    return t.p;
}

static int fmt_hermes(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                      size_t n, const cJSON *tools, bool gen, struct sb *b, struct qerr *err)
{
    bool add_sys = tools && cJSON_GetArraySize(tools) > 0;
    size_t cap = n + 1;
    struct chat_msg *mm = calloc(cap, sizeof *mm);
    enum role *rr = calloc(cap, sizeof *rr);
    char **own = calloc(2 * cap, sizeof *own); /* [cap, 2 cap): reasoning split off a text */
    int rc = 0;
    if (!mm || !rr || !own) {
        rc = qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
        goto out;
    }
    size_t k = 0, i = 0;
    if (add_sys) {
        bool has_sys = n > 0 && r[0] == ROLE_SYSTEM;
        const char *base = has_sys ? m[0].content : t->default_system;
        own[k] = hermes_system(base, tools);
        mm[k] = (struct chat_msg){.role = "system", .content = own[k]};
        rr[k] = ROLE_SYSTEM;
        if (!own[k++]) rc = qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
        if (has_sys) i = 1;
    }
    for (; i < n && !rc; i++, k++) {
        mm[k] = (struct chat_msg){.role = m[i].role,
                                  .content = m[i].content,
                                  .reasoning = m[i].reasoning,
                                  .parts = m[i].parts,
                                  .n_parts = m[i].n_parts};
        rr[k] = r[i];
        if (r[i] == ROLE_TOOL) {
            /* results in a row share one user turn, as Qwen2.5's template writes them */
            struct sb t = {0};
            for (; i < n && r[i] == ROLE_TOOL; i++) {
                sb_str(&t, t.n ? "\n<tool_response>\n" : "<tool_response>\n");
                sb_str(&t, m[i].content ? m[i].content : "");
                sb_str(&t, "\n</tool_response>");
            }
            i--;
            if (t.oom) {
                free(t.p);
                t.p = NULL;
            }
            own[k] = t.p;
            mm[k] = (struct chat_msg){.role = "user", .content = own[k]};
            rr[k] = ROLE_USER;
        } else if (r[i] == ROLE_ASSISTANT && m[i].n_calls) {
            if (!check_calls(&m[i], i, err)) {
                rc = QERR_INVALID;
                break;
            }
            /* a reasoning template reads the reasoning off the text before the calls follow it
             * (the call's arguments are not searched for "</think>") */
            const char *c = m[i].content ? m[i].content : "";
            struct chat_think th = {.text = c, .text_len = strlen(c)};
            if (t->think_model) {
                chat_split_think(&m[i], &th);
                mm[k].reasoning = own[cap + k] = strndup(th.reasoning, th.reasoning_len);
                if (!own[cap + k]) {
                    rc = qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
                    break;
                }
            }
            struct qerr aerr = {0};
            mm[k].parts = NULL; /* the text is rewritten with the calls: parts no longer fit it */
            mm[k].n_parts = 0;
            mm[k].content = own[k] = hermes_calls(&m[i], th.text, th.text_len, i, &aerr);
            if (!own[k] && aerr.code) {
                rc = qerr_set(err, aerr.code, "%s", aerr.msg);
                break;
            }
        } else {
            continue;
        }
        if (!own[k]) rc = qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
    }
    if (!rc) chat_fmt_plain(t, mm, rr, k, gen, b);
out:
    if (own)
        for (size_t j = 0; j < 2 * cap; j++) free(own[j]);
    free(own);
    free(mm);
    free(rr);
    return rc;
}

/* ---- Llama 3.1 / 3.2 JSON tool calling ---- */

static int llama3_call(struct sb *b, const struct chat_call *c, size_t i, struct qerr *err)
{
    cJSON *args = call_args(c, i, err);
    if (!args) return QERR_INVALID;
    sb_str(b, "{\"name\": \"");
    sb_msg(b, c->name);
    sb_str(b, "\", \"parameters\": ");
    content_json(b, args, 0);
    sb_str(b, "}");
    cJSON_Delete(args);
    return 0;
}

static int fmt_llama3_tools(const struct chat_msg *m, const enum role *r, size_t n,
                            const cJSON *tools, bool gen, struct sb *b, struct qerr *err)
{
    size_t i = 0;
    if (tools) {
        sb_str(b, "<|start_header_id|>system<|end_header_id|>\n\n"
                  "Environment: ipython\nCutting Knowledge Date: December 2023\n"
                  "Today Date: 26 Jul 2024\n\n");
        if (n > 0 && r[0] == ROLE_SYSTEM) sb_trimmed(b, m[i++].content);
        sb_str(b, "<|eot_id|>");
        /* the tools ride in the first message after the system's */
        if (i >= n)
            return qerr_set(err, QERR_INVALID,
                            "chat_format: the Llama 3 tool format puts the tools in the first "
                            "user message, and there is none");
        sb_str(b, "<|start_header_id|>user<|end_header_id|>\n\n"
                  "Given the following functions, please respond with a JSON for a function "
                  "call with its proper arguments that best answers the given prompt.\n\n"
                  "Respond in the format {\"name\": function name, \"parameters\": dictionary "
                  "of argument name and its value}.Do not use variables.\n\n");
        const cJSON *fn;
        cJSON_ArrayForEach(fn, tools)
        {
            cJSON *w = cJSON_CreateObject();
            if (!w) return qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
            cJSON_AddStringToObject(w, "type", "function");
            cJSON_AddItemReferenceToObject(w, "function", (cJSON *)fn);
            content_json(b, w, 4);
            cJSON_Delete(w);
            sb_str(b, "\n\n");
        }
        sb_trimmed(b, m[i].content ? m[i].content : "");
        sb_str(b, "<|eot_id|>");
        i++;
    }
    for (; i < n; i++) {
        if (r[i] == ROLE_ASSISTANT && m[i].n_calls) {
            if (!check_calls(&m[i], i, err)) return QERR_INVALID;
            sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            for (size_t k = 0; k < m[i].n_calls; k++) {
                if (k) sb_str(b, "; ");
                int rc = llama3_call(b, &m[i].calls[k], i, err);
                if (rc) return rc;
            }
            sb_str(b, "<|eot_id|>");
        } else if (r[i] == ROLE_TOOL) {
            /* Jinja's "is iterable" holds for strings: the result is written as tojson */
            sb_str(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            cJSON *s = cJSON_CreateString(m[i].content ? m[i].content : "");
            if (!s) return qerr_set(err, QERR_NOMEM, "chat_format: out of memory");
            content_json(b, s, 0);
            cJSON_Delete(s);
            sb_str(b, "<|eot_id|>");
        } else {
            sb_str(b, "<|start_header_id|>");
            sb_str(b, m[i].role);
            sb_str(b, "<|end_header_id|>\n\n");
            sb_trimmed(b, m[i].content ? m[i].content : "");
            sb_str(b, "<|eot_id|>");
        }
    }
    if (gen) sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

/* ---- Mistral ---- */

/* A call id as the template writes it: its last 9 characters. */
static void mistral_id(struct sb *b, const char *id)
{
    if (!id) id = "";
    size_t n = strlen(id);
    sb_msg(b, n > 9 ? id + n - 9 : id);
}

/* One offered function as the template writes it: string values raw between quotes, others as
 * tojson, "return" left out. */
static void mistral_tool(struct sb *b, const cJSON *fn)
{
    sb_str(b, "{\"type\": \"function\", \"function\": {");
    const cJSON *kv;
    bool first = true;
    cJSON_ArrayForEach(kv, fn)
    {
        if (!strcmp(kv->string, "return")) continue;
        if (!first) sb_str(b, ", ");
        first = false;
        sb_str(b, "\"");
        sb_msg(b, kv->string);
        sb_str(b, "\": ");
        if (cJSON_IsString(kv)) {
            sb_str(b, "\"");
            sb_msg(b, kv->valuestring);
            sb_str(b, "\"");
        } else {
            content_json(b, kv, 0);
        }
    }
    sb_str(b, "}}");
}

static int mistral_calls(const struct chat_template *t, struct sb *b, const struct chat_msg *m,
                         size_t i, const char *sp, struct qerr *err)
{
    if (!check_calls(m, i, err)) return QERR_INVALID;
    if (t->tools == CHAT_TOOLS_MISTRAL_ARGS) {
        for (size_t k = 0; k < m->n_calls; k++) {
            cJSON *args = call_args(&m->calls[k], i, err);
            if (!args) return QERR_INVALID;
            sb_str(b, "[TOOL_CALLS]");
            sb_msg(b, m->calls[k].name);
            sb_str(b, "[ARGS]");
            content_json(b, args, 0);
            cJSON_Delete(args);
        }
        sb_str(b, "</s>");
        return 0;
    }
    sb_str(b, "[TOOL_CALLS]");
    sb_str(b, sp);
    sb_str(b, "[");
    for (size_t k = 0; k < m->n_calls; k++) {
        cJSON *args = call_args(&m->calls[k], i, err);
        if (!args) return QERR_INVALID;
        if (k) sb_str(b, ", ");
        sb_str(b, "{\"name\": ");
        cJSON *nm = cJSON_CreateString(m->calls[k].name);
        if (nm) content_json(b, nm, 0);
        cJSON_Delete(nm);
        sb_str(b, ", \"arguments\": ");
        content_json(b, args, 0);
        cJSON_Delete(args);
        sb_str(b, ", \"id\": \"");
        mistral_id(b, m->calls[k].id);
        sb_str(b, "\"}");
    }
    sb_str(b, "]</s>");
    return 0;
}

static int fmt_mistral_tools(const struct chat_template *t, const struct chat_msg *m,
                             const enum role *r, size_t n, const cJSON *tools, struct sb *b,
                             struct qerr *err)
{
    bool v7 = t->variant == CHAT_VARIANT_MISTRAL_V7;
    /* v0.3 writes "[INST] x", Nemo "[INST]x"; the [TOOL_CALLS] / [TOOL_RESULTS] JSON likewise */
    const char *sp =
        t->variant == CHAT_VARIANT_MISTRAL_V3 || t->variant == CHAT_VARIANT_MISTRAL_V1 ? " " : "";
    size_t i = 0, last_user = n;
    const char *sys = NULL;
    if (n > 0 && r[0] == ROLE_SYSTEM) sys = m[i++].content;
    for (size_t k = i; k < n; k++)
        if (r[k] == ROLE_USER) last_user = k;
    if (v7 && sys) {
        sb_str(b, "[SYSTEM_PROMPT]");
        sb_msg(b, sys);
        sb_str(b, "[/SYSTEM_PROMPT]");
    }
    for (; i < n; i++) {
        int rc = 0;
        switch (r[i]) {
        case ROLE_SYSTEM: /* a later system message: its text as a turn of its own */
        case ROLE_USER:
            if (tools && i == last_user && cJSON_GetArraySize(tools) > 0) {
                sb_str(b, "[AVAILABLE_TOOLS]");
                sb_str(b, sp);
                sb_str(b, "[");
                const cJSON *fn;
                bool first = true;
                cJSON_ArrayForEach(fn, tools)
                {
                    if (!first) sb_str(b, ", ");
                    first = false;
                    mistral_tool(b, fn);
                }
                sb_str(b, "][/AVAILABLE_TOOLS]");
            }
            sb_str(b, "[INST]");
            sb_str(b, sp);
            if (!v7 && sys && i == last_user) {
                sb_msg(b, sys);
                sb_str(b, "\n\n");
            }
            sb_msg(b, m[i].content);
            sb_str(b, "[/INST]");
            break;
        case ROLE_ASSISTANT:
            if (m[i].n_calls) {
                rc = mistral_calls(t, b, &m[i], i, sp, err);
            } else {
                sb_str(b, sp);
                if (*sp)
                    sb_trimmed(b, m[i].content);
                else
                    sb_msg(b, m[i].content);
                sb_str(b, "</s>");
            }
            break;
        case ROLE_TOOL:
            if (t->tools == CHAT_TOOLS_MISTRAL_ARGS) {
                sb_str(b, "[TOOL_RESULTS]");
                sb_msg(b, m[i].content ? m[i].content : "");
                sb_str(b, "[/TOOL_RESULTS]");
                break;
            }
            sb_str(b, "[TOOL_RESULTS]");
            sb_str(b, sp);
            sb_str(b, "{\"content\": ");
            sb_msg(b, m[i].content ? m[i].content : ""); /* content|string: as it is */
            sb_str(b, ", \"call_id\": \"");
            mistral_id(b, m[i].call_id);
            sb_str(b, "\"}[/TOOL_RESULTS]");
            break;
        }
        if (rc) return rc;
    }
    return 0;
}

int chat_fmt_tools(const struct chat_template *t, const struct chat_msg *m, const enum role *r,
                   size_t n, const cJSON *tools, bool gen, struct sb *b, struct qerr *err)
{
    if (tools && cJSON_GetArraySize(tools) == 0) tools = NULL;
    const cJSON *fn;
    int k = 0;
    cJSON_ArrayForEach(fn, tools)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name))
            return qerr_set(err, QERR_INVALID,
                            "chat_format: tool %d is not a function object with a name", k);
        k++;
    }
    switch (t->tools) {
    case CHAT_TOOLS_LLAMA3:
        if (t->kind == CHAT_LLAMA3) return fmt_llama3_tools(m, r, n, tools, gen, b, err);
        break;
    case CHAT_TOOLS_MISTRAL:
    case CHAT_TOOLS_MISTRAL_ARGS:
        if (t->kind == CHAT_LLAMA2) return fmt_mistral_tools(t, m, r, n, tools, b, err);
        break;
    case CHAT_TOOLS_HERMES:
        break;
    }
    return fmt_hermes(t, m, r, n, tools, gen, b, err);
}
