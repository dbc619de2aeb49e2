/* oai_parse: request JSON -> struct oai_request, with every known field type- and
 * range-checked. The body must be valid UTF-8 (JSON's encoding) before cJSON sees it, so no
 * string the engine or tokenizer receives can carry invalid bytes; cJSON's nesting limit (1000)
 * bounds the recursion on hostile input. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/utf8.h"
#include "oai.h"

int oai_error_set(struct oai_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->q.msg, sizeof e->q.msg, fmt, ap);
    va_end(ap);
    e->q.code = status >= 500 ? QERR_NOMEM : QERR_INVALID;
    return e->q.code;
}

static int bad(struct oai_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A 400 naming param. */
static int bad(struct oai_error *e, const char *param, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return oai_error_set(e, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
}

static int oom(struct oai_error *e)
{
    return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* The member named key, or NULL when absent or null. */
static const cJSON *field(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static const char *json_type(const cJSON *v)
{
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

/* A number in [lo, hi] (an open end when lo_open / hi_open). 1 when present, 0 absent. */
static int get_num(const cJSON *obj, const char *key, double lo, bool lo_open, double hi,
                   bool hi_open, double *out, struct oai_error *e)
{
    const cJSON *v = field(obj, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad(e, key, "'%s' must be a number, not %s", key, json_type(v));
    double d = v->valuedouble;
    if (!isfinite(d) || (lo_open ? d <= lo : d < lo) || (hi_open ? d >= hi : d > hi))
        return bad(e, key, "'%s' is %g; it must be in %c%g, %g%c", key, d, lo_open ? '(' : '[', lo,
                   hi, hi_open ? ')' : ']');
    *out = d;
    return 1;
}

static int get_int(const cJSON *obj, const char *key, double lo, double hi, long long *out,
                   struct oai_error *e)
{
    const cJSON *v = field(obj, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return bad(e, key, "'%s' must be an integer, not %s", key,
                   cJSON_IsNumber(v) ? "a fraction" : json_type(v));
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi))
        return bad(e, key, "'%s' is %.0f; it must be in [%.0f, %.0f]", key, d, lo, hi);
    *out = (long long)d;
    return 1;
}

static int get_bool(const cJSON *obj, const char *key, bool *out, struct oai_error *e)
{
    const cJSON *v = field(obj, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad(e, key, "'%s' must be a boolean, not %s", key, json_type(v));
    *out = cJSON_IsTrue(v);
    return 1;
}

static int get_str(const cJSON *obj, const char *key, const char **out, struct oai_error *e)
{
    const cJSON *v = field(obj, key);
    if (!v) return 0;
    if (!cJSON_IsString(v)) return bad(e, key, "'%s' must be a string, not %s", key, json_type(v));
    *out = v->valuestring;
    return 1;
}

/* A token id list: every element an integer in [0, 2^31). */
static int parse_ids(const cJSON *arr, const char *param, int32_t **ids, size_t *n,
                     struct oai_error *e)
{
    size_t cnt = (size_t)cJSON_GetArraySize(arr);
    int32_t *v = malloc((cnt ? cnt : 1) * sizeof *v);
    if (!v) return oom(e);
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
            !(x->valuedouble >= 0 && x->valuedouble <= INT32_MAX)) {
            free(v);
            return bad(e, param, "'%s' element %zu is not a token id (a non-negative integer)",
                       param, i);
        }
        v[i++] = (int32_t)x->valuedouble;
    }
    *ids = v;
    *n = i;
    return 0;
}

static bool is_id_list(const cJSON *arr)
{
    const cJSON *x = arr->child;
    return x && cJSON_IsNumber(x);
}

/* prompt: a string, a list of strings, a list of token ids, or a list of such lists. */
static int parse_prompt(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *p = field(root, "prompt");
    if (!p) return bad(e, "prompt", "'prompt' is required");
    size_t cnt = 1;
    if (cJSON_IsArray(p) && !is_id_list(p)) {
        cnt = (size_t)cJSON_GetArraySize(p);
        if (cnt == 0) return bad(e, "prompt", "'prompt' is an empty list");
        if (cnt > OAI_MAX_PROMPTS)
            return bad(e, "prompt", "'prompt' has %zu prompts; at most %d are allowed", cnt,
                       OAI_MAX_PROMPTS);
    } else if (!cJSON_IsString(p) && !cJSON_IsArray(p)) {
        return bad(e, "prompt",
                   "'prompt' must be a string, a list of strings, a list of token ids or a list "
                   "of token-id lists, not %s",
                   json_type(p));
    }
    r->prompts = calloc(cnt, sizeof *r->prompts);
    if (!r->prompts) return oom(e);
    r->n_prompts = cnt;
    if (cJSON_IsString(p)) {
        r->prompts[0].text = p->valuestring;
        r->prompts[0].text_len = strlen(p->valuestring);
        return 0;
    }
    if (is_id_list(p)) return parse_ids(p, "prompt", &r->prompts[0].ids, &r->prompts[0].n_ids, e);
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, p)
    {
        struct oai_prompt *o = &r->prompts[i++];
        if (cJSON_IsString(x)) {
            o->text = x->valuestring;
            o->text_len = strlen(x->valuestring);
        } else if (cJSON_IsArray(x)) {
            int rc = parse_ids(x, "prompt", &o->ids, &o->n_ids, e);
            if (rc) return rc;
            if (o->n_ids == 0) return bad(e, "prompt", "'prompt' element %zu is empty", i - 1);
        } else {
            return bad(e, "prompt", "'prompt' element %zu must be a string or a token-id list",
                       i - 1);
        }
    }
    return 0;
}

/* content: a string, null, or a list of {"type":"text","text":...} parts (joined). */
static int parse_content(const cJSON *c, size_t i, const char **out, char **owned,
                         struct oai_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (!c) {
        *out = "";
        return 0;
    }
    if (cJSON_IsString(c)) {
        *out = c->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(c))
        return bad(e, param, "'%s' must be a string or a list of parts, not %s", param,
                   json_type(c));
    struct sbuf b = {0};
    const cJSON *part;
    size_t k = 0;
    cJSON_ArrayForEach(part, c)
    {
        const char *type = NULL, *text = NULL;
        if (!cJSON_IsObject(part) || get_str(part, "type", &type, e) < 0 ||
            get_str(part, "text", &text, e) < 0 || !type) {
            sbuf_free(&b);
            return bad(e, param, "'%s' part %zu must be an object with a string 'type'", param, k);
        }
        if (strcmp(type, "text") != 0) {
            sbuf_free(&b);
            return oai_error_set(e, 400, "invalid_request_error", "unsupported_content", param,
                                 "'%s' part %zu has type '%.40s'; only 'text' is supported", param,
                                 k, type);
        }
        if (!text) {
            sbuf_free(&b);
            return bad(e, param, "'%s' part %zu has no string 'text'", param, k);
        }
        if (sbuf_puts(&b, text)) {
            sbuf_free(&b);
            return oom(e);
        }
        k++;
    }
    *owned = sbuf_take(&b);
    if (!*owned) return oom(e);
    *out = *owned;
    return 0;
}

static int parse_messages(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *m = field(root, "messages");
    if (!m) return bad(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(m))
        return bad(e, "messages", "'messages' must be a list, not %s", json_type(m));
    size_t cnt = (size_t)cJSON_GetArraySize(m);
    if (cnt == 0) return bad(e, "messages", "'messages' is an empty list");
    r->msgs = calloc(cnt, sizeof *r->msgs);
    r->owned = calloc(cnt, sizeof *r->owned);
    if (!r->msgs || !r->owned) return oom(e);
    r->n_msgs = cnt;
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, m)
    {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!cJSON_IsObject(x)) return bad(e, param, "'%s' must be an object", param);
        const char *trole = NULL;
        char *tcontent = NULL;
        int trc = oai_tool_message(x, i, &trole, &tcontent, e);
        if (trc) return trc;
        if (tcontent) { /* a tool result, or an assistant's tool calls, as the model saw them */
            r->msgs[i].role = trole;
            r->msgs[i].content = r->owned[i] = tcontent;
            i++;
            continue;
        }
        snprintf(param, sizeof param, "messages[%zu].role", i);
        const cJSON *role = field(x, "role");
        if (!role || !cJSON_IsString(role)) return bad(e, param, "'%s' must be a string", param);
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            return bad(e, param, "'%s' is '%.40s'; it must be system, user or assistant", param,
                       role->valuestring);
        r->msgs[i].role = rs;
        int rc = parse_content(field(x, "content"), i, &r->msgs[i].content, &r->owned[i], e);
        if (rc) return rc;
        i++;
    }
    return 0;
}

static int parse_stop(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    if (cJSON_IsString(s)) {
        if (*s->valuestring) r->stop[r->n_stop++] = s->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(s))
        return bad(e, "stop", "'stop' must be a string or a list of strings, not %s", json_type(s));
    if (cJSON_GetArraySize(s) > ENGINE_MAX_STOPS)
        return bad(e, "stop", "'stop' has %d strings; at most %d are allowed",
                   cJSON_GetArraySize(s), ENGINE_MAX_STOPS);
    const cJSON *x;
    cJSON_ArrayForEach(x, s)
    {
        if (!cJSON_IsString(x)) return bad(e, "stop", "'stop' must hold only strings");
        if (*x->valuestring) r->stop[r->n_stop++] = x->valuestring;
    }
    return 0;
}

/* The sampling and generation fields common to completions and chat. */
static int parse_generation(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    struct sample_params *sp = &r->sample;
    double d = 0;
    long long l;
    int rc;
#define NUM(key, lo, lo_open, hi, hi_open, dst)                                                    \
    do {                                                                                           \
        if ((rc = get_num(root, key, lo, lo_open, hi, hi_open, &d, e)) < 0) return rc;             \
        if (rc) dst = (float)d;                                                                    \
    } while (0)
    NUM("temperature", 0, false, 2, false, sp->temperature);
    NUM("top_p", 0, true, 1, false, sp->top_p);
    NUM("min_p", 0, false, 1, false, sp->min_p);
    NUM("presence_penalty", -2, false, 2, false, sp->presence_penalty);
    NUM("frequency_penalty", -2, false, 2, false, sp->frequency_penalty);
    NUM("repetition_penalty", 0, true, 10, false, sp->repetition_penalty);
#undef NUM
    if ((rc = get_int(root, "top_k", -1, 1e9, &l, e)) < 0) return rc;
    if (rc) sp->top_k = l < 0 ? 0 : (int)l; /* -1 is vLLM's "off" */
    if ((rc = get_int(root, "seed", -9.2e18, 9.2e18, &l, e)) < 0) return rc;
    if (rc) {
        sp->seed = (uint64_t)l;
        r->has_seed = true;
    }
    if ((rc = get_int(root, "n", 1, OAI_MAX_CHOICES, &l, e)) < 0) return rc;
    if (rc) r->n = (int)l;
    /* max_completion_tokens (the newer name) wins over max_tokens when both are given */
    const char *mt = field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((rc = get_int(root, mt, r->kind == OAI_CHAT ? 1 : 0, 1e9, &l, e)) < 0) return rc;
    if (rc) r->max_tokens = (int)l;
    if ((rc = get_bool(root, "ignore_eos", &r->ignore_eos, e)) < 0) return rc;
    bool spec = true;
    if ((rc = get_bool(root, "speculative", &spec, e)) < 0) return rc;
    r->no_spec = !spec;
    if ((rc = get_bool(root, "stream", &r->stream, e)) < 0) return rc;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return bad(e, "stream_options", "'stream_options' must be an object, not %s",
                       json_type(so));
        if (get_bool(so, "include_usage", &r->include_usage, e) < 0)
            return bad(e, "stream_options.include_usage",
                       "'stream_options.include_usage' must be a boolean");
    }
    const char *user;
    if ((rc = get_str(root, "user", &user, e)) < 0) return rc;
    if ((rc = get_str(root, "model", &r->model, e)) < 0) return rc;
    if ((rc = parse_stop(root, r, e))) return rc;
    const cJSON *lb = field(root, "logit_bias");
    if (lb && !(cJSON_IsObject(lb) && !lb->child))
        return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter", "logit_bias",
                             "'logit_bias' is not supported");
    return 0;
}

static int parse_completion(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    int rc;
    long long l;
    if ((rc = parse_prompt(root, r, e))) return rc;
    if ((rc = parse_generation(root, r, e))) return rc;
    if ((rc = get_bool(root, "echo", &r->echo, e)) < 0) return rc;
    if ((rc = get_int(root, "logprobs", 0, OAI_MAX_LOGPROBS, &l, e)) < 0) return rc;
    if (rc) r->logprobs = (int)l;
    const cJSON *suffix = field(root, "suffix");
    if (suffix && !(cJSON_IsString(suffix) && !*suffix->valuestring))
        return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter", "suffix",
                             "'suffix' (fill-in-the-middle) is not supported by this server");
    if ((size_t)r->n * r->n_prompts > OAI_MAX_CHOICES)
        return bad(e, "n", "%zu prompts x n=%d is more than %d choices", r->n_prompts, r->n,
                   OAI_MAX_CHOICES);
    return oai_parse_structured(root, r, e);
}

static int parse_chat(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    int rc;
    long long l;
    bool lp = false;
    if ((rc = parse_messages(root, r, e))) return rc;
    if ((rc = parse_generation(root, r, e))) return rc;
    if ((rc = get_bool(root, "logprobs", &lp, e)) < 0) return rc;
    if ((rc = get_int(root, "top_logprobs", 0, OAI_MAX_LOGPROBS, &l, e)) < 0) return rc;
    if (rc && !lp) return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
    if (lp) r->logprobs = rc ? (int)l : 0;
    if ((rc = oai_parse_structured(root, r, e))) return rc;
    return oai_parse_tools(root, r, e);
}

static int parse_tokenize(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    int rc;
    const char *model;
    if ((rc = get_str(root, "model", &model, e)) < 0) return rc;
    if ((rc = get_bool(root, "add_generation_prompt", &r->add_generation_prompt, e)) < 0) return rc;
    if ((rc = get_bool(root, "add_special_tokens", &r->add_special, e)) < 0) return rc;
    if (field(root, "messages")) return parse_messages(root, r, e);
    const cJSON *p = field(root, "prompt");
    if (!p || !cJSON_IsString(p))
        return bad(e, "prompt", "'prompt' (a string) or 'messages' is required");
    r->prompts = calloc(1, sizeof *r->prompts);
    if (!r->prompts) return oom(e);
    r->n_prompts = 1;
    r->prompts[0].text = p->valuestring;
    r->prompts[0].text_len = strlen(p->valuestring);
    return 0;
}

static int parse_detokenize(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *t = field(root, "tokens");
    if (!t || !cJSON_IsArray(t))
        return bad(e, "tokens", "'tokens' (a list of token ids) is required");
    return parse_ids(t, "tokens", &r->tokens, &r->n_tokens, e);
}

int oai_parse(enum oai_kind kind, const char *body, size_t len, struct oai_request *out,
              struct oai_error *e)
{
    *out = (struct oai_request){.kind = kind,
                                .n = 1,
                                .max_tokens = -1,
                                .logprobs = -1,
                                .add_special = true,
                                .add_generation_prompt = true,
                                .constraint = {.kind = -1},
                                .parallel_tool_calls = true};
    sample_params_default(&out->sample);
    size_t bad_at = utf8_check(body, len);
    if (bad_at != len)
        return oai_error_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                             "the request body is not valid UTF-8 (byte %zu)", bad_at);
    const char *nul = memchr(body, '\0', len);
    if (nul)
        return oai_error_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                             "the request body has a NUL byte (byte %zu)", (size_t)(nul - body));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    size_t at = end && end >= body ? (size_t)(end - body) : 0;
    while (root && at < len && strchr(" \t\r\n", body[at]) && body[at]) at++;
    if (!root || at < len) {
        cJSON_Delete(root);
        return oai_error_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                             "the request body is not valid JSON (%s byte %zu of %zu)",
                             root ? "trailing data at" : "near", at, len);
    }
    out->root = root;
    int rc;
    if (!cJSON_IsObject(root)) {
        rc = oai_error_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                           "the request body must be a JSON object, not %s", json_type(root));
    } else {
        switch (kind) {
        case OAI_COMPLETION:
            rc = parse_completion(root, out, e);
            break;
        case OAI_CHAT:
            rc = parse_chat(root, out, e);
            break;
        case OAI_TOKENIZE:
            rc = parse_tokenize(root, out, e);
            break;
        case OAI_DETOKENIZE:
            rc = parse_detokenize(root, out, e);
            break;
        default:
            rc = oai_error_set(e, 500, "server_error", NULL, NULL, "bad endpoint kind");
        }
    }
    if (rc) oai_request_free(out);
    return rc;
}

void oai_request_free(struct oai_request *r)
{
    if (r->prompts)
        for (size_t i = 0; i < r->n_prompts; i++) free(r->prompts[i].ids);
    free(r->prompts);
    if (r->owned)
        for (size_t i = 0; i < r->n_msgs; i++) free(r->owned[i]);
    free(r->owned);
    free(r->msgs);
    free(r->tokens);
    free(r->constraint.text);
    free(r->tools);
    cJSON_Delete(r->root);
    *r = (struct oai_request){.kind = r->kind, .constraint = {.kind = -1}};
}
