/* oai_parse: request JSON -> struct oai_request, with every known field type- and
 * range-checked. The body must be valid UTF-8 (JSON's encoding) before cJSON sees it, so no
 * string the engine or tokenizer receives can carry invalid bytes; cJSON's nesting limit (1000)
 * bounds the recursion on hostile input. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/utf8.h"
#include "json_oom.h"
#include "oai.h"
#include "oai_json.h"

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
    const cJSON *v = oai_field(obj, key);
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
    const cJSON *v = oai_field(obj, key);
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
    const cJSON *v = oai_field(obj, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad(e, key, "'%s' must be a boolean, not %s", key, json_type(v));
    *out = cJSON_IsTrue(v);
    return 1;
}

static int get_str(const cJSON *obj, const char *key, const char **out, struct oai_error *e)
{
    const cJSON *v = oai_field(obj, key);
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
/* The prompts (completions' "prompt", embeddings' "input": name): a string, a list of strings,
 * a token-id list or a list of those, at most max. */
static int parse_prompt(const cJSON *root, const char *name, size_t max, struct oai_request *r,
                        struct oai_error *e)
{
    const cJSON *p = oai_field(root, name);
    if (!p) return bad(e, name, "'%s' is required", name);
    size_t cnt = 1;
    if (cJSON_IsArray(p) && !is_id_list(p)) {
        cnt = (size_t)cJSON_GetArraySize(p);
        if (cnt == 0) return bad(e, name, "'%s' is an empty list", name);
        if (cnt > max)
            return bad(e, name, "'%s' has %zu elements; at most %zu are allowed", name, cnt, max);
    } else if (!cJSON_IsString(p) && !cJSON_IsArray(p)) {
        return bad(e, name,
                   "'%s' must be a string, a list of strings, a list of token ids or a list "
                   "of token-id lists, not %s",
                   name, json_type(p));
    }
    r->prompts = calloc(cnt, sizeof *r->prompts);
    if (!r->prompts) return oom(e);
    r->n_prompts = cnt;
    if (cJSON_IsString(p)) {
        r->prompts[0].text = p->valuestring;
        r->prompts[0].text_len = strlen(p->valuestring);
        return 0;
    }
    if (is_id_list(p)) return parse_ids(p, name, &r->prompts[0].ids, &r->prompts[0].n_ids, e);
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, p)
    {
        struct oai_prompt *o = &r->prompts[i++];
        if (cJSON_IsString(x)) {
            o->text = x->valuestring;
            o->text_len = strlen(x->valuestring);
        } else if (cJSON_IsArray(x)) {
            int rc = parse_ids(x, name, &o->ids, &o->n_ids, e);
            if (rc) return rc;
            if (o->n_ids == 0) return bad(e, name, "'%s' element %zu is empty", name, i - 1);
        } else {
            return bad(e, name, "'%s' element %zu must be a string or a token-id list", name,
                       i - 1);
        }
    }
    return 0;
}

/* content (the field param): a string, null, or a list of {"type":"text","text":...} parts
 * (joined into *owned; with parts, each part's text also goes to parts[k], room for every item
 * of the list, and their count to *n_parts). */
static int parse_content(const cJSON *c, const char *param, const char **out, char **owned,
                         const char **parts, size_t *n_parts, struct oai_error *e)
{
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
        if (parts) parts[k] = text;
        k++;
    }
    if (n_parts) *n_parts = k;
    *owned = sbuf_take(&b);
    if (!*owned) return oom(e);
    *out = *owned;
    return 0;
}

/* An assistant message's reasoning handed back: reasoning_content as quern, vLLM and llama.cpp
 * answer it (or vLLM's newer "reasoning"); a template that writes it reads it (Qwen3's), the
 * others leave it out as their Jinja does. */
static int parse_reasoning(const cJSON *x, size_t i, struct chat_msg *m, struct oai_error *e)
{
    const char *key = "reasoning_content";
    const cJSON *v = oai_field(x, key);
    if (!v) v = oai_field(x, key = "reasoning");
    if (!v || cJSON_IsNull(v) || strcmp(m->role, "assistant")) return 0;
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].%s", i, key);
    if (!cJSON_IsString(v))
        return bad(e, param, "'%s' must be a string, not %s", param, json_type(v));
    m->reasoning = v->valuestring;
    return 0;
}

static int parse_messages(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *m = oai_field(root, "messages");
    if (!m) return bad(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(m))
        return bad(e, "messages", "'messages' must be a list, not %s", json_type(m));
    size_t cnt = (size_t)cJSON_GetArraySize(m);
    if (cnt == 0) return bad(e, "messages", "'messages' is an empty list");
    r->msgs = calloc(cnt, sizeof *r->msgs);
    r->owned = calloc(cnt, sizeof *r->owned);
    if (!r->msgs || !r->owned) return oom(e);
    r->n_msgs = cnt;
    size_t i = 0, used = 0, used_parts = 0, cap_parts = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, m)
    {
        r->n_calls += oai_count_tool_calls(x);
        const cJSON *c = cJSON_IsObject(x) ? oai_field(x, "content") : NULL;
        if (cJSON_IsArray(c)) cap_parts += (size_t)cJSON_GetArraySize(c);
    }
    if (r->n_calls && !(r->calls = calloc(r->n_calls, sizeof *r->calls))) return oom(e);
    /* the texts of content parts, kept apart for templates that write them so (Gemma 3's) */
    if (cap_parts && !(r->parts = calloc(cap_parts, sizeof *r->parts))) return oom(e);
    cJSON_ArrayForEach(x, m)
    {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!cJSON_IsObject(x)) return bad(e, param, "'%s' must be an object", param);
        /* no calls in the request: no array (NULL + 0 is undefined in C) */
        struct chat_call *calls = r->calls ? r->calls + used : NULL;
        int trc = oai_tool_message(x, i, &r->msgs[i], calls, e), rrc;
        if (trc < 0) return trc;
        if (trc) { /* a tool result, or an assistant's tool calls: the template writes them */
            if ((rrc = parse_reasoning(x, i, &r->msgs[i], e))) return rrc;
            used += r->msgs[i].n_calls;
            i++;
            continue;
        }
        snprintf(param, sizeof param, "messages[%zu].role", i);
        const cJSON *role = oai_field(x, "role");
        if (!role || !cJSON_IsString(role)) return bad(e, param, "'%s' must be a string", param);
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
            return bad(e, param, "'%s' is '%.40s'; it must be system, user or assistant", param,
                       role->valuestring);
        r->msgs[i].role = rs;
        snprintf(param, sizeof param, "messages[%zu].content", i);
        const char **parts = r->parts ? r->parts + used_parts : NULL;
        size_t n_parts = 0;
        int rc = parse_content(oai_field(x, "content"), param, &r->msgs[i].content, &r->owned[i],
                               parts, &n_parts, e);
        if (rc || (rc = parse_reasoning(x, i, &r->msgs[i], e))) return rc;
        if (n_parts) {
            r->msgs[i].parts = parts;
            r->msgs[i].n_parts = n_parts;
            used_parts += n_parts;
        }
        i++;
    }
    return 0;
}

static int parse_stop(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *s = oai_field(root, "stop");
    if (!s) return 0;
    if (cJSON_IsString(s)) {
        if (strlen(s->valuestring) > ENGINE_MAX_STOP_BYTES)
            return bad(e, "stop", "'stop' has %zu bytes; at most %d are allowed",
                       strlen(s->valuestring), ENGINE_MAX_STOP_BYTES);
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
        if (strlen(x->valuestring) > ENGINE_MAX_STOP_BYTES)
            return bad(e, "stop", "'stop' string %d has %zu bytes; at most %d are allowed",
                       r->n_stop, strlen(x->valuestring), ENGINE_MAX_STOP_BYTES);
        if (*x->valuestring) r->stop[r->n_stop++] = x->valuestring;
    }
    return 0;
}

/* vLLM's allowed_token_ids (a non-empty list of ids; the engine checks them against the model)
 * and bad_words (strings of 1..200 bytes, each tokenized twice by the server: half as many as
 * the engine's sequences). */
static int parse_token_filters(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *ids = oai_field(root, "allowed_token_ids"), *x;
    if (ids && !cJSON_IsNull(ids)) {
        int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
        if (n < 1 || n > 1 << 20)
            return bad(e, "allowed_token_ids",
                       "'allowed_token_ids' must be a non-empty list of "
                       "token ids");
        if (!(r->allowed = malloc((size_t)n * sizeof *r->allowed))) return oom(e);
        cJSON_ArrayForEach(x, ids)
        {
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
                !(x->valuedouble >= 0 && x->valuedouble <= INT32_MAX))
                return bad(e, "allowed_token_ids", "'allowed_token_ids' must hold only token ids");
            r->allowed[r->n_allowed++] = (int32_t)x->valuedouble;
        }
    }
    const cJSON *bw = oai_field(root, "bad_words");
    if (!bw || cJSON_IsNull(bw)) return 0;
    if (!cJSON_IsArray(bw) || cJSON_GetArraySize(bw) > ENGINE_MAX_BAD_WORDS / 2)
        return bad(e, "bad_words", "'bad_words' must be a list of at most %d strings",
                   ENGINE_MAX_BAD_WORDS / 2);
    cJSON_ArrayForEach(x, bw)
    {
        if (!cJSON_IsString(x) || !*x->valuestring ||
            strlen(x->valuestring) > ENGINE_MAX_STOP_BYTES)
            return bad(e, "bad_words", "'bad_words' must hold strings of 1..%d bytes",
                       ENGINE_MAX_STOP_BYTES);
        r->bad_words[r->n_bad_words++] = x->valuestring;
    }
    return 0;
}

/* OpenAI's {"token id": bias from -100 to 100}; the engine checks the ids against the model. */
static int parse_logit_bias(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *lb = oai_field(root, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb))
        return bad(e, "logit_bias", "'logit_bias' must be an object, not %s", json_type(lb));
    int n = cJSON_GetArraySize(lb);
    if (n > ENGINE_MAX_LOGIT_BIAS)
        return bad(e, "logit_bias", "'logit_bias' may hold at most %d tokens, not %d",
                   ENGINE_MAX_LOGIT_BIAS, n);
    if (n == 0) return 0;
    if (!(r->logit_bias = malloc((size_t)n * sizeof *r->logit_bias))) return oom(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, lb)
    {
        const char *key = it->string;
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id > INT32_MAX || !(key[0] >= '0' && key[0] <= '9'))
            return bad(e, "logit_bias",
                       "'logit_bias' keys must be token ids (decimal integers), not '%.40s'", key);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return bad(e, "logit_bias",
                       "'logit_bias' values must be numbers from -100 to 100 (token %.40s)", key);
        r->logit_bias[r->n_logit_bias++] =
            (struct logit_bias){.token = (int32_t)id, .bias = (float)it->valuedouble};
    }
    return 0;
}

/* prediction: {"type": "content", "content": a string or a list of text parts}. */
static int parse_prediction(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *p = oai_field(root, "prediction");
    if (!p || cJSON_IsNull(p)) return 0;
    const cJSON *type = cJSON_IsObject(p) ? oai_field(p, "type") : NULL;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "content"))
        return bad(e, "prediction",
                   "'prediction' must be {\"type\": \"content\", \"content\": ...}");
    int rc = parse_content(oai_field(p, "content"), "prediction.content", &r->prediction,
                           &r->prediction_owned, NULL, NULL, e);
    if (!rc) r->prediction_len = strlen(r->prediction);
    return rc;
}

/* vLLM's priority (an integer, lower sooner: gen_request.priority) and truncate_prompt_tokens
 * (-1, or at least 1), read by generation and embeddings alike */
static int parse_priority_and_truncation(const cJSON *root, struct oai_request *r,
                                         struct oai_error *e)
{
    long long l = 0;
    int rc = get_int(root, "priority", -2147483648.0, 2147483647.0, &l, e);
    if (rc < 0) return rc;
    if (rc > 0) r->priority = (int)l;
    if ((rc = get_int(root, "truncate_prompt_tokens", -1, 2147483647.0, &l, e)) < 0) return rc;
    if (rc > 0 && l == 0)
        return bad(e, "truncate_prompt_tokens",
                   "'truncate_prompt_tokens' must be -1 (the context's length) or at least 1");
    if (rc > 0) r->truncate_prompt = (int)l;
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
    const char *mt =
        oai_field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((rc = get_int(root, mt, r->kind == OAI_CHAT ? 1 : 0, 1e9, &l, e)) < 0) return rc;
    if (rc) r->max_tokens = (int)l;
    if ((rc = get_bool(root, "ignore_eos", &r->ignore_eos, e)) < 0) return rc;
    if ((rc = get_bool(root, "include_stop_str_in_output", &r->include_stop_str, e)) < 0) return rc;
    if ((rc = parse_priority_and_truncation(root, r, e))) return rc;
    bool spec = true;
    if ((rc = get_bool(root, "speculative", &spec, e)) < 0) return rc;
    r->no_spec = !spec;
    if ((rc = parse_prediction(root, r, e))) return rc;
    if ((rc = get_bool(root, "stream", &r->stream, e)) < 0) return rc;
    const cJSON *so = oai_field(root, "stream_options");
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
    long long plp;
    if ((rc = get_int(root, "prompt_logprobs", 0, OAI_MAX_LOGPROBS, &plp, e)) < 0) return rc;
    if (rc) r->prompt_logprobs = (int)plp;
    if (rc && r->stream)
        return bad(e, "prompt_logprobs", "'prompt_logprobs' is not supported with 'stream'");
    if ((rc = parse_stop(root, r, e))) return rc;
    /* vLLM's: the engine checks min_tokens against max_tokens and the ids against the model */
    long long mn;
    if ((rc = get_int(root, "min_tokens", 0, 1e9, &mn, e)) < 0) return rc;
    if (rc) r->min_tokens = (int)mn;
    const cJSON *ids = oai_field(root, "stop_token_ids"), *x;
    if (ids && !cJSON_IsNull(ids)) {
        if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) > ENGINE_MAX_STOPS)
            return bad(e, "stop_token_ids",
                       "'stop_token_ids' must be a list of at most %d token ids", ENGINE_MAX_STOPS);
        cJSON_ArrayForEach(x, ids)
        {
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
                !(x->valuedouble >= 0 && x->valuedouble <= INT32_MAX))
                return bad(e, "stop_token_ids", "'stop_token_ids' must hold only token ids");
            r->stop_ids[r->n_stop_ids++] = (int32_t)x->valuedouble;
        }
    }
    if ((rc = parse_token_filters(root, r, e))) return rc;
    return parse_logit_bias(root, r, e);
}

static int parse_completion(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    int rc;
    long long l;
    if ((rc = parse_prompt(root, "prompt", OAI_MAX_PROMPTS, r, e))) return rc;
    if ((rc = parse_generation(root, r, e))) return rc;
    if ((rc = get_bool(root, "echo", &r->echo, e)) < 0) return rc;
    if ((rc = get_int(root, "logprobs", 0, OAI_MAX_LOGPROBS, &l, e)) < 0) return rc;
    if (rc) r->logprobs = (int)l;
    const cJSON *suffix = oai_field(root, "suffix");
    if (suffix && !(cJSON_IsString(suffix) && !*suffix->valuestring))
        return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter", "suffix",
                             "'suffix' (fill-in-the-middle) is not supported by this server");
    if ((size_t)r->n * r->n_prompts > OAI_MAX_CHOICES)
        return bad(e, "n", "%zu prompts x n=%d is more than %d choices", r->n_prompts, r->n,
                   OAI_MAX_CHOICES);
    return oai_parse_structured(root, r, e);
}

/* Where the chat's prompt ends: add_generation_prompt, or vLLM's continue_final_message (the
 * last message, an assistant's, is continued: llama.cpp's assistant prefill). */
static int parse_chat_end(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    bool gen = true, cont = false;
    int given = get_bool(root, "add_generation_prompt", &gen, e), rc;
    if (given < 0) return given;
    if ((rc = get_bool(root, "continue_final_message", &cont, e)) < 0) return rc;
    if (cont && gen && given)
        return bad(e, "continue_final_message",
                   "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    r->chat_end = cont ? CHAT_END_CONTINUE : gen ? CHAT_END_GENERATE : CHAT_END_CLOSED;
    /* vLLM's and llama.cpp's chat_template_kwargs: enable_thinking is the one quern's formats
     * read (Qwen3's); other keys name variables of templates quern does not run, left alone */
    const cJSON *kw = oai_field(root, "chat_template_kwargs");
    if (!kw || cJSON_IsNull(kw)) return 0;
    if (!cJSON_IsObject(kw))
        return bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object, not %s",
                   json_type(kw));
    const cJSON *think = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
    if (think && !cJSON_IsBool(think))
        return bad(e, "chat_template_kwargs.enable_thinking",
                   "'chat_template_kwargs.enable_thinking' must be a boolean, not %s",
                   json_type(think));
    if (think) r->enable_thinking = cJSON_IsTrue(think);
    return 0;
}

static int parse_chat(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    int rc;
    long long l;
    bool lp = false;
    if ((rc = parse_messages(root, r, e))) return rc;
    if ((rc = parse_chat_end(root, r, e))) return rc;
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
    if ((rc = parse_chat_end(root, r, e))) return rc;
    if ((rc = get_bool(root, "add_special_tokens", &r->add_special, e)) < 0) return rc;
    /* with the tools a chat offers, rendered by the template as chat renders them: the count
     * is the chat request's prompt_tokens (vLLM's /tokenize takes them too) */
    if (oai_field(root, "messages"))
        return (rc = parse_messages(root, r, e)) ? rc : oai_parse_tools(root, r, e);
    const cJSON *p = oai_field(root, "prompt");
    if (!p || !cJSON_IsString(p))
        return bad(e, "prompt", "'prompt' (a string) or 'messages' is required");
    r->prompts = calloc(1, sizeof *r->prompts);
    if (!r->prompts) return oom(e);
    r->n_prompts = 1;
    r->prompts[0].text = p->valuestring;
    r->prompts[0].text_len = strlen(p->valuestring);
    return 0;
}

static int parse_embedding(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    int rc;
    if ((rc = parse_prompt(root, "input", OAI_MAX_INPUTS, r, e))) return rc;
    if ((rc = get_str(root, "model", &r->model, e)) < 0) return rc;
    const char *user, *fmt = NULL;
    if ((rc = get_str(root, "user", &user, e)) < 0) return rc;
    if ((rc = get_str(root, "encoding_format", &fmt, e)) < 0) return rc;
    if (fmt && strcmp(fmt, "float") && strcmp(fmt, "base64"))
        return bad(e, "encoding_format",
                   "'encoding_format' must be \"float\" or \"base64\", not "
                   "\"%.40s\"",
                   fmt);
    r->base64 = fmt && !strcmp(fmt, "base64");
    if ((rc = parse_priority_and_truncation(root, r, e))) return rc;
    if (oai_field(root, "dimensions"))
        return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter", "dimensions",
                             "'dimensions' is not supported: this model's embeddings have a fixed "
                             "size (its hidden size); leave it out");
    return 0;
}

/* One Responses input item's content as a chat message's: a string, or input_text/output_text
 * parts (joined by parse_content). */
static cJSON *resp_content(const cJSON *c, const char *param, struct oai_error *e)
{
    if (!c) return cJSON_CreateString("");
    if (cJSON_IsString(c)) return cJSON_Duplicate(c, true);
    if (!cJSON_IsArray(c)) {
        bad(e, param, "'%s' must be a string or a list of parts, not %s", param, json_type(c));
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    const cJSON *x;
    int k = 0;
    cJSON_ArrayForEach(x, c)
    {
        const char *type = NULL, *text = NULL;
        if (!cJSON_IsObject(x) || get_str(x, "type", &type, e) < 0 || !type ||
            get_str(x, "text", &text, e) < 0) {
            cJSON_Delete(parts);
            bad(e, param, "'%s' part %d must be an object with a string 'type'", param, k);
            return NULL;
        }
        if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text")) {
            cJSON_Delete(parts);
            oai_error_set(e, 400, "invalid_request_error", "unsupported_content", param,
                          "'%s' part %d has type '%.40s'; only input_text and output_text are "
                          "supported",
                          param, k, type);
            return NULL;
        }
        if (!text) {
            cJSON_Delete(parts);
            bad(e, param, "'%s' part %d has no string 'text'", param, k);
            return NULL;
        }
        cJSON *part = cJSON_CreateObject();
        cJSON_AddItemToArray(parts, part);
        if (!cJSON_AddStringToObject(part, "type", "text") ||
            !cJSON_AddStringToObject(part, "text", text)) {
            cJSON_Delete(parts);
            oom(e);
            return NULL;
        }
        k++;
    }
    return parts;
}

/* A function_call input item as the chat form of an assistant's tool call; consecutive calls
 * join one assistant message (parallel calls). */
static int resp_function_call(const cJSON *x, cJSON *msgs, const char *param, struct oai_error *e)
{
    const char *name = NULL, *args = NULL, *call_id = NULL;
    if (get_str(x, "name", &name, e) < 0 || get_str(x, "arguments", &args, e) < 0 ||
        get_str(x, "call_id", &call_id, e) < 0 || !name)
        return bad(e, param, "'%s' (a function_call) needs a string 'name' and 'arguments'", param);
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    cJSON *calls = last ? cJSON_GetObjectItemCaseSensitive(last, "tool_calls") : NULL;
    if (!calls) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        if (!cJSON_AddStringToObject(m, "role", "assistant") ||
            !(calls = cJSON_AddArrayToObject(m, "tool_calls")))
            return oom(e);
    }
    cJSON *c = cJSON_CreateObject(), *fn;
    cJSON_AddItemToArray(calls, c);
    if (!cJSON_AddStringToObject(c, "id", call_id ? call_id : "") ||
        !cJSON_AddStringToObject(c, "type", "function") ||
        !(fn = cJSON_AddObjectToObject(c, "function")) ||
        !cJSON_AddStringToObject(fn, "name", name) ||
        !cJSON_AddStringToObject(fn, "arguments", args ? args : "{}"))
        return oom(e);
    return 0;
}

/* A function_call_output input item as a chat tool message. */
static int resp_function_output(const cJSON *x, cJSON *msgs, const char *param, struct oai_error *e)
{
    const char *out = NULL, *call_id = NULL;
    if (get_str(x, "output", &out, e) < 0 || get_str(x, "call_id", &call_id, e) < 0 || !out)
        return bad(e, param, "'%s' (a function_call_output) needs a string 'output'", param);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(msgs, m);
    if (!cJSON_AddStringToObject(m, "role", "tool") ||
        !cJSON_AddStringToObject(m, "tool_call_id", call_id ? call_id : "") ||
        !cJSON_AddStringToObject(m, "content", out))
        return oom(e);
    return 0;
}

/* The Responses API's flat function tools ({"type":"function","name",...}) and tool_choice
 * ({"type":"function","name"}) rewritten in the tree in the chat form oai_parse_tools reads. */
static int resp_tools(cJSON *root, struct oai_error *e)
{
    const cJSON *tools = oai_field(root, "tools");
    if (tools && cJSON_IsArray(tools)) {
        cJSON *chat = cJSON_CreateArray();
        const cJSON *t;
        int i = 0;
        cJSON_ArrayForEach(t, tools)
        {
            char param[48];
            snprintf(param, sizeof param, "tools[%d]", i++);
            const char *type = NULL;
            if (!cJSON_IsObject(t) || get_str(t, "type", &type, e) < 0 || !type ||
                strcmp(type, "function")) {
                cJSON_Delete(chat);
                return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter",
                                     param, "'%s' must be a function tool (type 'function')",
                                     param);
            }
            cJSON *fn = cJSON_Duplicate(t, true), *c = cJSON_CreateObject();
            cJSON_AddItemToArray(chat, c);
            cJSON_DeleteItemFromObjectCaseSensitive(fn, "type");
            cJSON_DeleteItemFromObjectCaseSensitive(fn, "strict");
            if (!fn || !cJSON_AddStringToObject(c, "type", "function")) {
                cJSON_Delete(fn);
                cJSON_Delete(chat);
                return oom(e);
            }
            cJSON_AddItemToObject(c, "function", fn);
        }
        cJSON_ReplaceItemInObjectCaseSensitive(root, "tools", chat);
    }
    const cJSON *choice = oai_field(root, "tool_choice");
    const char *name = NULL;
    if (choice && cJSON_IsObject(choice) && !oai_field(choice, "function")) {
        if (get_str(choice, "name", &name, e) < 0 || !name)
            return bad(e, "tool_choice", "'tool_choice' must be a string or name a function");
        cJSON *c = cJSON_CreateObject(), *fn;
        if (!c || !cJSON_AddStringToObject(c, "type", "function") ||
            !(fn = cJSON_AddObjectToObject(c, "function")) ||
            !cJSON_AddStringToObject(fn, "name", name)) {
            cJSON_Delete(c);
            return oom(e);
        }
        cJSON_ReplaceItemInObjectCaseSensitive(root, "tool_choice", c);
    }
    return 0;
}

/* POST /v1/responses: instructions and input become a chat conversation ("messages", added to
 * the tree), then the chat fields are parsed as for /v1/chat/completions. */
static int parse_responses(cJSON *root, struct oai_request *r, struct oai_error *e)
{
    int rc;
    const char *prev = NULL, *instructions = NULL;
    bool store = false;
    if ((rc = get_str(root, "previous_response_id", &prev, e)) < 0) return rc;
    if (prev)
        return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter",
                             "previous_response_id",
                             "'previous_response_id' is not supported: this server stores no "
                             "responses; send the whole conversation in 'input'");
    if ((rc = get_bool(root, "store", &store, e)) < 0) return rc;
    if ((rc = get_str(root, "instructions", &instructions, e)) < 0) return rc;
    r->instructions = instructions;
    if (oai_field(root, "messages"))
        return bad(e, "messages", "'messages' is not a Responses field; use 'input'");
    const cJSON *in = oai_field(root, "input");
    if (!in || !(cJSON_IsString(in) || cJSON_IsArray(in)))
        return bad(e, "input", "'input' (a string or a list of messages) is required");
    cJSON *msgs = cJSON_AddArrayToObject(root, "messages");
    if (!msgs) return oom(e);
    if (instructions) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        if (!cJSON_AddStringToObject(m, "role", "system") ||
            !cJSON_AddStringToObject(m, "content", instructions))
            return oom(e);
    }
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        if (!cJSON_AddStringToObject(m, "role", "user") ||
            !cJSON_AddStringToObject(m, "content", in->valuestring))
            return oom(e);
    } else {
        const cJSON *x;
        int i = 0;
        cJSON_ArrayForEach(x, in)
        {
            char param[64];
            snprintf(param, sizeof param, "input[%d]", i);
            const char *type = NULL, *role = NULL;
            if (!cJSON_IsObject(x) || get_str(x, "type", &type, e) < 0 ||
                get_str(x, "role", &role, e) < 0)
                return bad(e, param, "'%s' must be a message object", param);
            if (type && !strcmp(type, "function_call")) {
                if ((rc = resp_function_call(x, msgs, param, e))) return rc;
                i++;
                continue;
            }
            if (type && !strcmp(type, "function_call_output")) {
                if ((rc = resp_function_output(x, msgs, param, e))) return rc;
                i++;
                continue;
            }
            if (type && strcmp(type, "message"))
                return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter",
                                     param,
                                     "'%s' has type '%.40s'; only message, function_call and "
                                     "function_call_output items are supported",
                                     param, type);
            if (!role) return bad(e, param, "'%s' has no string 'role'", param);
            snprintf(param, sizeof param, "input[%d].content", i);
            cJSON *content = resp_content(oai_field(x, "content"), param, e);
            if (!content) return e->q.code ? e->q.code : oom(e);
            cJSON *m = cJSON_CreateObject();
            cJSON_AddItemToArray(msgs, m);
            cJSON_AddItemToObject(m, "content", content);
            if (!cJSON_AddStringToObject(m, "role", role)) return oom(e);
            i++;
        }
    }
    if ((rc = parse_messages(root, r, e))) return rc;
    if ((rc = parse_generation(root, r, e))) return rc;
    long long l;
    if ((rc = get_int(root, "max_output_tokens", 1, 1 << 30, &l, e)) < 0) return rc;
    if (rc) r->max_tokens = (int)l;
    /* the format first, as chat reads response_format before its tools */
    if ((rc = oai_parse_text_format(root, r, e))) return rc;
    return (rc = resp_tools(root, e)) ? rc : oai_parse_tools(root, r, e);
}

static int parse_detokenize(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *t = oai_field(root, "tokens");
    if (!t || !cJSON_IsArray(t))
        return bad(e, "tokens", "'tokens' (a list of token ids) is required");
    return parse_ids(t, "tokens", &r->tokens, &r->n_tokens, e);
}

/* out->ignored from the members of root that no parse step read (oai_json.h). */
static void note_ignored(const cJSON *root, struct oai_request *out)
{
    size_t at = 0;
    int others = 0;
    bool full = false;
    out->ignored[0] = '\0';
    for (const cJSON *m = root->child; m; m = m->next) {
        if (m->type & OAI_JSON_READ) continue;
        const char *k = m->string ? m->string : "";
        size_t n = strlen(k);
        bool plain = n > 0 && n <= 40 &&
                     strspn(k, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               "0123456789_.-") == n;
        if (!plain) {
            others++;
            continue;
        }
        if (full) continue;
        /* room for this name, its comma, and a closing ",+N" or ",..." */
        if (at + n + 1 + 8 >= sizeof out->ignored) {
            full = true;
            continue;
        }
        at +=
            (size_t)snprintf(out->ignored + at, sizeof out->ignored - at, "%s%s", at ? "," : "", k);
    }
    if (full)
        snprintf(out->ignored + at, sizeof out->ignored - at, "%s...", at ? "," : "");
    else if (others)
        snprintf(out->ignored + at, sizeof out->ignored - at, "%s+%d", at ? "," : "", others);
}

int oai_parse(enum oai_kind kind, const char *body, size_t len, struct oai_request *out,
              struct oai_error *e)
{
    *out = (struct oai_request){.kind = kind,
                                .n = 1,
                                .max_tokens = -1,
                                .logprobs = -1,
                                .prompt_logprobs = -1,
                                .add_special = true,
                                .chat_end = CHAT_END_GENERATE,
                                .enable_thinking = -1,
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
    json_oom_take();
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root && json_oom_take())
        return oai_error_set(e, 500, "server_error", NULL, NULL,
                             "out of memory while parsing the request body");
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
        case OAI_EMBEDDING:
            rc = parse_embedding(root, out, e);
            break;
        case OAI_RESPONSES:
            rc = parse_responses(root, out, e);
            break;
        default:
            rc = oai_error_set(e, 500, "server_error", NULL, NULL, "bad endpoint kind");
        }
    }
    if (rc)
        oai_request_free(out);
    else
        note_ignored(root, out);
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
    free(r->parts);
    free(r->msgs);
    free(r->calls);
    free(r->tokens);
    free(r->constraint.text);
    free(r->tools);
    free(r->logit_bias);
    free(r->allowed);
    free(r->prediction_owned);
    cJSON_Delete(r->root);
    *r = (struct oai_request){.kind = r->kind, .constraint = {.kind = -1}};
}
