/* grammar_tools: the grammar of a chat turn that calls tools, in the template's format
 * (Hermes' <tool_call> blocks, Llama 3's JSON, Mistral's [TOOL_CALLS]); each call's arguments
 * under the function's parameter schema (json_schema.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "json_schema_impl.h"

/* How the tool list asks calls to be written ("format"; Hermes when absent). */
enum tool_fmt { TF_HERMES, TF_LLAMA3, TF_MISTRAL, TF_MISTRAL_NOSP, TF_MISTRAL_ARGS };

static int tool_fmt(struct gb *b, const cJSON *f)
{
    static const char *const names[] = {"hermes", "llama3", "mistral", "mistral-nospace",
                                        "mistral-args"};
    if (!f) return TF_HERMES;
    for (int k = 0; cJSON_IsString(f) && k < (int)(sizeof names / sizeof names[0]); k++)
        if (!strcmp(f->valuestring, names[k])) return k;
    gb_fail(b, QERR_INVALID, "tool list: unknown format");
    return TF_HERMES;
}

/* One call of function t in format fmt, from its first byte (after any opening tag). */
static struct frag tool_call_one(struct js *j, const cJSON *t, int fmt)
{
    struct gb *b = j->b;
    const cJSON *name = get(t, "name"), *params = get(t, "parameters");
    if (!cJSON_IsString(name)) {
        gb_fail(b, QERR_INVALID, "a tool has no name");
        return gb_empty(b);
    }
    cJSON *ns = cJSON_CreateString(name->valuestring);
    char *quoted = ns ? cJSON_PrintUnformatted(ns) : NULL;
    cJSON_Delete(ns);
    if (!quoted) {
        gb_fail(b, QERR_NOMEM, "out of memory compiling the tools");
        return gb_empty(b);
    }
    struct frag f;
    switch (fmt) {
    case TF_LLAMA3: /* {"name": "f", "parameters": {...}} */
        f = gb_seq(b, gb_lits(b, "{\"name\": "), gb_lits(b, quoted));
        f = gb_seq(b, f, gb_lits(b, ", \"parameters\": "));
        break;
    case TF_MISTRAL_ARGS: /* f[ARGS]{...} */
        f = gb_seq(b, gb_lits(b, name->valuestring), gb_lits(b, "[ARGS]"));
        break;
    case TF_MISTRAL:
    case TF_MISTRAL_NOSP: /* {"name": "f", "arguments": {...}} */
        f = gb_seq(b, gb_lits(b, "{\"name\": "), gb_lits(b, quoted));
        f = gb_seq(b, f, gb_lits(b, ", \"arguments\": "));
        break;
    default: /* \n{"name": "f", "arguments": {...}}\n</tool_call> */
        f = gb_seq(b, gb_lits(b, "\n{\"name\": "), gb_lits(b, quoted));
        f = gb_seq(b, f, gb_lits(b, ", \"arguments\": "));
        break;
    }
    cJSON_free(quoted);
    j->root = params;
    snprintf(j->path, sizeof j->path, "/tools/%.60s/parameters", name->valuestring);
    if (params && cJSON_IsObject(params) && params->child)
        f = gb_seq(b, f, js_value(j, params));
    else
        f = gb_seq(b, f, gb_lits(b, "{}"));
    if (fmt == TF_HERMES) f = gb_seq(b, f, gb_lits(b, "}\n</tool_call>"));
    if (fmt == TF_LLAMA3 || fmt == TF_MISTRAL || fmt == TF_MISTRAL_NOSP)
        f = gb_seq(b, f, gb_lits(b, "}"));
    return f;
}

/* Free text whose first byte is not '{' (Llama 3's calls are the whole output, opened by '{'),
 * or nothing. */
static struct frag text_not_json(struct gb *b)
{
    int s = gb_state(b), rest = gb_state(b), end = gb_state(b);
    gb_range(b, s, rest, 0, '{' - 1);
    gb_range(b, s, rest, '{' + 1, 255);
    gb_range(b, rest, rest, 0, 255);
    gb_eps(b, s, end);
    gb_eps(b, rest, end);
    return (struct frag){s, end};
}

struct frag gb_tool_calls(struct gb *b, const char *text, size_t len)
{
    cJSON *root = js_parse_text(b, text, len, "tool list");
    if (!root) return (struct frag){0, 0};
    struct js j = {.b = b, .any_rule = -1, .free_max = JS_FREE_MAX};
    int r = gb_rule_new(b);
    int fmt = tool_fmt(b, get(root, "format"));
    const cJSON *tools = get(root, "tools"), *t;
    /* one call, any of the functions */
    struct frag one = gb_alt_begin(b);
    cJSON_ArrayForEach(t, tools) gb_alt_add(b, one, tool_call_one(&j, t, fmt));
    /* what goes between two calls, and around them all */
    static const char *const sep[] = {"\n<tool_call>", "; ", ", ", ", ", "[TOOL_CALLS]"};
    static const char *const open[] = {"<tool_call>", "", "[TOOL_CALLS] [", "[TOOL_CALLS][",
                                       "[TOOL_CALLS]"};
    static const char *const close[] = {"", "", "]", "]", ""};
    struct frag calls = one;
    if (cJSON_IsTrue(get(root, "parallel"))) {
        /* later calls are copies: one rule, called */
        int call = gb_rule_new(b);
        gb_rule_set(b, call, one);
        struct frag more = gb_seq(b, gb_lits(b, sep[fmt]), gb_call_frag(b, call));
        calls = gb_seq(b, gb_call_frag(b, call), gb_star(b, more));
    }
    calls = gb_seq(b, calls, gb_lits(b, close[fmt]));
    /* models end a turn with a newline after the last call as often as not: allow it, so the
     * end of the turn can come after it */
    if (fmt == TF_HERMES) calls = gb_seq(b, calls, gb_opt(b, gb_lits(b, "\n")));
    struct frag all;
    if (cJSON_IsTrue(get(root, "auto")) && fmt == TF_LLAMA3) {
        /* tool_choice auto: text, or a call from the first byte on */
        all = gb_alt_begin(b);
        gb_alt_add(b, all, text_not_json(b));
        gb_alt_add(b, all, calls);
    } else if (cJSON_IsTrue(get(root, "auto"))) {
        /* tool_choice auto: free text, or text up to an opening tag and then well-formed calls
         * (the text may not contain the tag otherwise) */
        const char *tag = fmt == TF_HERMES ? "<tool_call>" : "[TOOL_CALLS]";
        struct frag body = gb_seq(b, gb_lits(b, open[fmt] + strlen(tag)), calls);
        struct frag txt = gb_text_until(b, tag, body.s);
        all = gb_alt_begin(b);
        gb_eps(b, all.s, txt.s);
        gb_eps(b, txt.e, all.e);
        gb_eps(b, body.e, all.e);
    } else {
        all = gb_seq(b, gb_lits(b, open[fmt]), calls);
    }
    gb_rule_set(b, r, all);
    js_free(&j);
    cJSON_Delete(root);
    return all;
}
