/* api_lora: the LoRA adapters a request may name as its model. --lora's are there from the
 * start (slot i + 1, generation 1, as engine_create loads them); with --lora-runtime, vLLM's
 * POST /v1/load_lora_adapter {"lora_name", "lora_path"} adds one (the engine loads it between
 * steps) and POST /v1/unload_lora_adapter {"lora_name"} removes one no request is using. The
 * registry maps each name to its engine slot and generation, so a request that looked a name up
 * just before an unload is refused by the engine (404) rather than run with whatever the slot
 * holds next. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api.h"

void serve_lora_init(struct serve *s)
{
    pthread_mutex_init(&s->lora_mu, NULL);
    pthread_mutex_init(&s->lora_admin, NULL);
    s->n_loras = 0;
    for (int i = 0; i < s->o->lora.n && i < ENGINE_MAX_LORAS; i++) {
        struct serve_lora *l = &s->loras[s->n_loras++];
        snprintf(l->name, sizeof l->name, "%s", s->o->lora.names[i]);
        l->lora = i + 1;
        l->gen = 1;
    }
}

void serve_lora_destroy(struct serve *s)
{
    pthread_mutex_destroy(&s->lora_mu);
    pthread_mutex_destroy(&s->lora_admin);
}

bool serve_lora_find(struct serve *s, const char *name, struct serve_lora *out)
{
    bool found = false;
    pthread_mutex_lock(&s->lora_mu);
    for (int i = 0; i < s->n_loras && !found; i++)
        if (!strcmp(s->loras[i].name, name)) {
            *out = s->loras[i];
            found = true;
        }
    pthread_mutex_unlock(&s->lora_mu);
    return found;
}

int serve_lora_list(struct serve *s, struct serve_lora *out)
{
    pthread_mutex_lock(&s->lora_mu);
    int n = s->n_loras;
    memcpy(out, s->loras, (size_t)n * sizeof *out);
    pthread_mutex_unlock(&s->lora_mu);
    return n;
}

static void text_reply(struct http_resp *out, int status, const char *fmt, const char *name)
{
    char *body = malloc(256);
    if (body) snprintf(body, 256, fmt, name);
    out->status = body ? status : 500;
    out->content_type = "text/plain; charset=utf-8";
    out->body = body;
    out->body_len = body ? strlen(body) : 0;
}

static void lora_error(struct http_resp *out, struct req_log *log, int status, const char *code,
                       const char *param, const char *fmt, const char *a, const char *b)
{
    struct oai_error e = {0};
    oai_error_set(&e, status, status == 404 ? "not_found_error" : "invalid_request_error", code,
                  param, fmt, a, b);
    api_error(&e, log, out);
}

/* The request's JSON object with a string lora_name (and lora_path when want_path), or an
 * error already in out. */
static cJSON *lora_body(const struct http_req *rq, bool want_path, const char **name,
                        const char **path, struct http_resp *out)
{
    cJSON *j = cJSON_ParseWithLength(rq->body ? rq->body : "", rq->body_len);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "lora_name");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "lora_path");
    const char *bad = !cJSON_IsObject(j)                ? "the body must be a JSON object"
                      : !cJSON_IsString(n)              ? "lora_name must be a string"
                      : want_path && !cJSON_IsString(p) ? "lora_path must be a string"
                                                        : NULL;
    if (bad) {
        lora_error(out, rq->log, 400, NULL, NULL, "%s%s", bad, "");
        cJSON_Delete(j);
        return NULL;
    }
    *name = n->valuestring;
    if (want_path) *path = p->valuestring;
    return j;
}

static bool runtime_on(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (s->o->lora_runtime) return true;
    lora_error(out, rq->log, 404, NULL, NULL, "%s%s",
               "loading and unloading LoRA adapters while serving is off (serve --lora-runtime)",
               "");
    return false;
}

void api_load_lora(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (!runtime_on(s, rq, out) || !api_ready(s, rq->log, out)) return;
    const char *name = NULL, *path = NULL;
    cJSON *j = lora_body(rq, true, &name, &path, out);
    if (!j) return;
    size_t len = strlen(name);
    bool ok = len > 0 && len < LORA_NAME_MAX;
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)name[i]) || strchr("._-", name[i]);
    for (int i = 0; ok && i < s->o->n_served_names; i++) ok = strcmp(name, s->o->served_names[i]);
    if (!ok) {
        lora_error(out, rq->log, 400, "invalid_value", "lora_name",
                   "lora_name '%.80s' must be 1..63 letters, digits, '.', '_' or '-', and not the "
                   "model's name%s",
                   name, "");
        cJSON_Delete(j);
        return;
    }
    pthread_mutex_lock(&s->lora_admin);
    struct serve_lora had;
    if (serve_lora_find(s, name, &had)) {
        lora_error(out, rq->log, 400, NULL, "lora_name",
                   "The lora adapter '%s' has already been loaded.%s", name, "");
    } else {
        struct lora_spec spec = {.path = path, .name = name, .scale = 1.0f};
        struct qerr err = {0};
        int lora = 0;
        uint32_t gen = 0;
        pthread_rwlock_rdlock(&s->lock);
        int rc = s->engine ? engine_lora_load(s->engine, &spec, &lora, &gen, &err)
                           : qerr_set(&err, QERR_FULL, "the server is draining");
        pthread_rwlock_unlock(&s->lock);
        if (rc) {
            lora_error(out, rq->log, rc == QERR_NOMEM ? 500 : 400, NULL, "lora_path", "%s%s",
                       err.msg, "");
        } else {
            pthread_mutex_lock(&s->lora_mu);
            struct serve_lora *l = &s->loras[s->n_loras++];
            snprintf(l->name, sizeof l->name, "%s", name);
            l->lora = lora;
            l->gen = gen;
            pthread_mutex_unlock(&s->lora_mu);
            text_reply(out, 200, "Success: LoRA adapter '%s' added successfully.", name);
        }
    }
    pthread_mutex_unlock(&s->lora_admin);
    cJSON_Delete(j);
}

void api_unload_lora(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (!runtime_on(s, rq, out) || !api_ready(s, rq->log, out)) return;
    const char *name = NULL;
    cJSON *j = lora_body(rq, false, &name, NULL, out);
    if (!j) return;
    pthread_mutex_lock(&s->lora_admin);
    struct serve_lora l;
    if (!serve_lora_find(s, name, &l)) {
        lora_error(out, rq->log, 404, "model_not_found", "lora_name",
                   "The lora adapter '%.80s' cannot be found.%s", name, "");
    } else {
        struct qerr err = {0};
        pthread_rwlock_rdlock(&s->lock);
        int rc = s->engine ? engine_lora_unload(s->engine, l.lora, &err)
                           : qerr_set(&err, QERR_NOTFOUND, "the server is draining");
        pthread_rwlock_unlock(&s->lock);
        if (rc) {
            lora_error(out, rq->log, rc == QERR_FULL ? 409 : 400, NULL, "lora_name",
                       "LoRA adapter '%s': %s", name, err.msg);
        } else {
            pthread_mutex_lock(&s->lora_mu);
            for (int i = 0; i < s->n_loras; i++)
                if (!strcmp(s->loras[i].name, name)) {
                    s->loras[i] = s->loras[--s->n_loras];
                    break;
                }
            pthread_mutex_unlock(&s->lora_mu);
            text_reply(out, 200, "Success: LoRA adapter '%s' removed successfully.", name);
        }
    }
    pthread_mutex_unlock(&s->lora_admin);
    cJSON_Delete(j);
}
