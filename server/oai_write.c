/* oai_write: response bodies and SSE chunks in the shapes OpenAI's API (and vLLM, llama.cpp)
 * use. Everything is built as a cJSON tree and printed unformatted, so escaping is cJSON's job;
 * the texts put in are valid UTF-8 (the engine never emits a partial sequence, token texts go
 * through oai_token_text). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/utf8.h"
#include "json_oom.h"
#include "oai.h"

const char *oai_finish_name(enum finish_reason r)
{
    return r == FINISH_NONE ? NULL : finish_reason_name(r);
}

int oai_lp_push(struct oai_lp **lp, size_t *n, size_t *cap, const struct oai_lp *one)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        struct oai_lp *p = realloc(*lp, c * sizeof *p);
        if (!p) return QERR_NOMEM;
        *lp = p;
        *cap = c;
    }
    struct oai_lp *l = &(*lp)[(*n)++];
    *l = *one;
    l->n_top = one->n_top < 0 ? 0 : one->n_top > OAI_MAX_LOGPROBS ? OAI_MAX_LOGPROBS : one->n_top;
    return 0;
}

int oai_choice_add_lp(struct oai_choice *c, int32_t token, float logprob, size_t text_offset,
                      const struct token_logprob *top, int n_top)
{
    struct oai_lp one = {.token = token, .logprob = logprob, .text_offset = text_offset};
    one.n_top = n_top < 0 ? 0 : n_top > OAI_MAX_LOGPROBS ? OAI_MAX_LOGPROBS : n_top;
    if (one.n_top) memcpy(one.top, top, (size_t)one.n_top * sizeof *top);
    return oai_lp_push(&c->lp, &c->n_lp, &c->cap_lp, &one);
}

void oai_choice_free(struct oai_choice *c)
{
    sbuf_free(&c->text);
    free(c->lp);
    free(c->plp);
    *c = (struct oai_choice){0};
}

size_t oai_token_text(const struct oai_vocab *v, int32_t id, char *out, size_t cap)
{
    char raw[256];
    int n = v->token_bytes(v->ctx, id, raw, sizeof raw);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof raw) n = sizeof raw;
    size_t len = 0;
    if (utf8_check(raw, (size_t)n) == (size_t)n) {
        len = (size_t)n < cap - 1 ? (size_t)n : cap - 1;
        memcpy(out, raw, len);
    } else {
        len = (size_t)snprintf(out, cap, "bytes:");
        for (int i = 0; i < n && len + 5 < cap; i++)
            len += (size_t)snprintf(out + len, cap - len, "\\x%02x", (unsigned char)raw[i]);
    }
    out[len] = '\0';
    return len;
}

/* OpenAI never sends -inf: vLLM clamps to -9999. */
static double lp_value(float v)
{
    return isfinite(v) ? (double)v : -9999.0;
}

static char *print_free(cJSON *o)
{
    return json_print_free(o); /* NULL too when a part of o could not be allocated */
}

static char *sse(char *json)
{
    if (!json) return NULL;
    size_t n = strlen(json);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, json, n);
        memcpy(s + 6 + n, "\n\n", 3);
    }
    free(json);
    return s;
}

/* A string of len bytes (cJSON strings stop at a NUL; so do these). */
static cJSON *str_n(const char *s, size_t len)
{
    char small[256];
    char *tmp = len < sizeof small ? small : malloc(len + 1);
    if (!tmp) return NULL;
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    cJSON *o = cJSON_CreateString(tmp);
    if (tmp != small) free(tmp);
    return o;
}

/* Completions logprobs: {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static cJSON *completion_lp(const struct oai_meta *m, const struct oai_lp *lp, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    if (!toks || !lps || !tops || !offs) goto fail;
    char t[1100];
    for (size_t i = 0; i < n; i++) {
        oai_token_text(&m->vocab, lp[i].token, t, sizeof t);
        cJSON_AddItemToArray(toks, cJSON_CreateString(t));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)lp[i].text_offset));
        if (lp[i].null_lp) { /* the echoed prompt's first token, as OpenAI writes it */
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_value(lp[i].logprob)));
        cJSON *top = cJSON_CreateObject();
        /* the top alternatives, most likely first (a text seen twice keeps the first) */
        int want = m->logprobs;
        if (want > 0) {
            for (int k = 0; k < lp[i].n_top && cJSON_GetArraySize(top) < want; k++) {
                oai_token_text(&m->vocab, lp[i].top[k].token, t, sizeof t);
                if (!cJSON_GetObjectItemCaseSensitive(top, t))
                    cJSON_AddNumberToObject(top, t, lp_value(lp[i].top[k].logprob));
            }
        }
        cJSON_AddItemToArray(tops, top);
    }
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

static cJSON *bytes_array(const struct oai_vocab *v, int32_t id)
{
    char raw[256];
    int n = v->token_bytes(v->ctx, id, raw, sizeof raw);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof raw) n = sizeof raw;
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n && a; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* Chat logprobs: {"content":[{"token","logprob","bytes","top_logprobs":[...]}]}. */
static cJSON *chat_lp(const struct oai_meta *m, const struct oai_lp *lp, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    if (!content) goto fail;
    char t[1100];
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        oai_token_text(&m->vocab, lp[i].token, t, sizeof t);
        cJSON_AddStringToObject(e, "token", t);
        cJSON_AddNumberToObject(e, "logprob", lp_value(lp[i].logprob));
        json_add(e, "bytes", bytes_array(&m->vocab, lp[i].token));
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < lp[i].n_top && k < m->logprobs; k++) {
            cJSON *a = cJSON_CreateObject();
            oai_token_text(&m->vocab, lp[i].top[k].token, t, sizeof t);
            cJSON_AddStringToObject(a, "token", t);
            cJSON_AddNumberToObject(a, "logprob", lp_value(lp[i].top[k].logprob));
            json_add(a, "bytes", bytes_array(&m->vocab, lp[i].top[k].token));
            cJSON_AddItemToArray(tops, a);
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

/* vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...],
 * each entry the prompt token then its top alternatives (ranked 1..N). */
static cJSON *prompt_lp(const struct oai_meta *m, const struct oai_lp *lp, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    char t[1100], key[16];
    for (size_t i = 0; i < n && a; i++) {
        if (lp[i].null_lp) {
            cJSON_AddItemToArray(a, cJSON_CreateNull());
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        for (int k = -1; k < lp[i].n_top && k < m->prompt_top; k++) {
            int32_t id = k < 0 ? lp[i].token : lp[i].top[k].token;
            snprintf(key, sizeof key, "%d", (int)id);
            if (cJSON_GetObjectItemCaseSensitive(o, key)) continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "logprob",
                                    lp_value(k < 0 ? lp[i].logprob : lp[i].top[k].logprob));
            cJSON_AddNumberToObject(e, "rank", k < 0 ? lp[i].rank : k + 1);
            oai_token_text(&m->vocab, id, t, sizeof t);
            cJSON_AddStringToObject(e, "decoded_token", t);
            json_add(o, key, e);
        }
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

static cJSON *logprobs_obj(const struct oai_meta *m, const struct oai_lp *lp, size_t n)
{
    if (m->logprobs < 0) return cJSON_CreateNull();
    return m->kind == OAI_CHAT ? chat_lp(m, lp, n) : completion_lp(m, lp, n);
}

static cJSON *usage_obj(const struct oai_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    /* OpenAI's names for a prediction's tokens that were and were not used: here, every
     * speculative draft's (a request's prediction, prompt lookup, a draft model) */
    d = cJSON_AddObjectToObject(o, "completion_tokens_details");
    if (d) {
        cJSON_AddNumberToObject(d, "accepted_prediction_tokens", u->accepted_tokens);
        cJSON_AddNumberToObject(d, "rejected_prediction_tokens", u->rejected_tokens);
        if (u->reasoning) cJSON_AddNumberToObject(d, "reasoning_tokens", u->reasoning_tokens);
    }
    return o;
}

static cJSON *head(const struct oai_meta *m, bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    const char *object = m->kind == OAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                             : "text_completion";
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)m->created);
    cJSON_AddStringToObject(o, "model", m->model);
    return o;
}

static cJSON *finish_obj(enum finish_reason f)
{
    const char *s = oai_finish_name(f);
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

static cJSON *stop_reason_obj(const struct oai_stop *s)
{
    if (s && s->text) return cJSON_CreateString(s->text);
    if (s && s->by_token) return cJSON_CreateNumber(s->token);
    return cJSON_CreateNull();
}

char *oai_write_response(const struct oai_meta *m, const struct oai_choice *c, size_t n,
                         const struct oai_usage *u)
{
    cJSON *o = head(m, false);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    if (!choices) goto fail;
    for (size_t i = 0; i < n; i++) {
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, ch);
        cJSON_AddNumberToObject(ch, "index", (double)i);
        const char *text = c[i].text.p ? c[i].text.p : "";
        if (m->kind == OAI_CHAT) {
            cJSON *msg = cJSON_AddObjectToObject(ch, "message");
            if (!msg) goto fail;
            cJSON_AddStringToObject(msg, "role", "assistant");
            struct oai_span r = {0, 0}, t = {0, c[i].text.len};
            bool optional = m->reasoning == OAI_REASONING_OPTIONAL;
            if (m->reasoning && !oai_think_split(text, c[i].text.len, optional, &r, &t)) {
                json_add(msg, "content", cJSON_CreateNull()); /* the reasoning never ended */
            } else {
                json_add(msg, "content", str_n(text + t.off, t.len));
            }
            /* a model that answered without thinking: null, as vLLM's qwen3 parser gives */
            if (m->reasoning)
                json_add(msg, "reasoning_content",
                         optional && !r.len ? cJSON_CreateNull() : str_n(text + r.off, r.len));
        } else {
            json_add(ch, "text", str_n(text, c[i].text.len));
        }
        json_add(ch, "logprobs", logprobs_obj(m, c[i].lp, c[i].n_lp));
        json_add(ch, "finish_reason", finish_obj(c[i].finish));
        json_add(ch, "stop_reason", stop_reason_obj(&c[i].stop));
        if (m->prompt_logprobs) json_add(ch, "prompt_logprobs", prompt_lp(m, c[i].plp, c[i].n_plp));
    }
    json_add(o, "usage", usage_obj(u));
    return print_free(o);
fail:
    cJSON_Delete(o);
    return NULL;
}

/* A chunk whose chat delta holds text under key (content or reasoning_content). */
static char *chunk(const struct oai_meta *m, int index, const char *key, const char *text,
                   size_t len, const char *role, enum finish_reason finish,
                   const struct oai_stop *stop, const struct oai_lp *lp, size_t n_lp,
                   bool usage_null)
{
    cJSON *o = head(m, true);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    if (!choices || !ch) {
        cJSON_Delete(ch);
        goto fail;
    }
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", index);
    if (m->kind == OAI_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
        if (!delta) goto fail;
        if (role) cJSON_AddStringToObject(delta, "role", role);
        if (len || (role && finish == FINISH_NONE))
            json_add(delta, key, str_n(text ? text : "", len));
    } else {
        json_add(ch, "text", str_n(text ? text : "", len));
    }
    json_add(ch, "logprobs", n_lp ? logprobs_obj(m, lp, n_lp) : cJSON_CreateNull());
    json_add(ch, "finish_reason", finish_obj(finish));
    if (finish != FINISH_NONE) json_add(ch, "stop_reason", stop_reason_obj(stop));
    if (usage_null) cJSON_AddNullToObject(o, "usage");
    return sse(print_free(o));
fail:
    cJSON_Delete(o);
    return NULL;
}

char *oai_write_chunk(const struct oai_meta *m, int index, const char *text, size_t len,
                      const char *role, enum finish_reason finish, const struct oai_stop *stop,
                      const struct oai_lp *lp, size_t n_lp, bool usage_null)
{
    return chunk(m, index, "content", text, len, role, finish, stop, lp, n_lp, usage_null);
}

char *oai_write_reasoning_chunk(const struct oai_meta *m, int index, const char *text, size_t len,
                                const struct oai_lp *lp, size_t n_lp, bool usage_null)
{
    return chunk(m, index, "reasoning_content", text, len, NULL, FINISH_NONE, NULL, lp, n_lp,
                 usage_null);
}

char *oai_write_usage_chunk(const struct oai_meta *m, const struct oai_usage *u)
{
    cJSON *o = head(m, true);
    cJSON_AddArrayToObject(o, "choices");
    json_add(o, "usage", usage_obj(u));
    return sse(print_free(o));
}

static cJSON *error_obj(const struct oai_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(o, "error");
    if (!err) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(err, "message", e->q.msg);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    return o;
}

char *oai_write_error(const struct oai_error *e)
{
    return print_free(error_obj(e));
}

char *oai_write_error_chunk(const struct oai_error *e)
{
    return sse(print_free(error_obj(e)));
}

/* RFC 4648 base64 of n bytes, NUL-terminated; NULL on OOM. */
static char *base64_of(const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) v |= p[i + 2];
        *o++ = tab[v >> 18 & 63];
        *o++ = tab[v >> 12 & 63];
        *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *o = 0;
    return out;
}

/* A vector as OpenAI's base64 encoding_format: the float32 array's little-endian bytes. */
static cJSON *embedding_base64(const float *v, int dim)
{
    unsigned char *b = malloc((size_t)dim * 4);
    if (!b) return NULL;
    for (int i = 0; i < dim; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(u >> (8 * k));
    }
    char *s = base64_of(b, (size_t)dim * 4);
    free(b);
    cJSON *o = s ? cJSON_CreateString(s) : NULL;
    free(s);
    return o;
}

char *oai_write_embeddings(const float *const *vecs, size_t n, int dim, bool base64,
                           const char *model, int prompt_tokens)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    if (!data) goto fail;
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e) goto fail;
        cJSON_AddItemToArray(data, e);
        cJSON_AddStringToObject(e, "object", "embedding");
        cJSON_AddNumberToObject(e, "index", (double)i);
        cJSON *v = base64 ? embedding_base64(vecs[i], dim) : cJSON_CreateFloatArray(vecs[i], dim);
        if (!v) goto fail;
        json_add(e, "embedding", v);
    }
    cJSON_AddStringToObject(o, "model", model);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    if (!u) goto fail;
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", prompt_tokens);
    return print_free(o);
fail:
    cJSON_Delete(o);
    return NULL;
}

/* One model card; "id" first (tools/loadtest.sh reads it with a regex). parent: the base model
 * of a LoRA adapter (vLLM's card), NULL for the model itself. */
static cJSON *model_card(const char *name, const char *root, const char *parent, long long created,
                         int ctx_len)
{
    cJSON *mo = cJSON_CreateObject();
    if (!mo) return NULL;
    cJSON_AddStringToObject(mo, "id", name);
    cJSON_AddStringToObject(mo, "object", "model");
    cJSON_AddNumberToObject(mo, "created", (double)created);
    cJSON_AddStringToObject(mo, "owned_by", "quern");
    cJSON_AddStringToObject(mo, "root", root);
    if (parent)
        cJSON_AddStringToObject(mo, "parent", parent);
    else
        cJSON_AddNullToObject(mo, "parent");
    cJSON_AddNumberToObject(mo, "max_model_len", ctx_len);
    /* the name llama.cpp and LM Studio clients read */
    cJSON_AddNumberToObject(mo, "context_length", ctx_len);
    return mo;
}

char *oai_write_models(const char *const *names, int n, const char *const *loras, int n_loras,
                       long long created, int ctx_len)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    if (!data) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < n + n_loras; i++) {
        cJSON *mo = i < n ? model_card(names[i], names[0], NULL, created, ctx_len)
                          : model_card(loras[i - n], loras[i - n], names[0], created, ctx_len);
        if (!mo) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToArray(data, mo);
    }
    return print_free(o);
}

char *oai_write_model(const char *name, const char *root, const char *parent, long long created,
                      int ctx_len)
{
    return print_free(model_card(name, root, parent, created, ctx_len));
}

char *oai_write_tokens(const int32_t *ids, size_t n, int ctx_len)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < n && a; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "count", (double)n);
    cJSON_AddNumberToObject(o, "max_model_len", ctx_len);
    return print_free(o);
}

char *oai_write_detokenized(const char *text, size_t len)
{
    cJSON *o = cJSON_CreateObject();
    json_add(o, "prompt", str_n(text, len));
    return print_free(o);
}
