/* api_webui: GET / and GET /webui/NAME, the built-in page's files (server/webui.h), copied
 * from the binary. http.c leaves these routes out under --no-webui (then / is a 404). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "webui.h"

/* The page runs only its own script and style and talks only to this server: model output
 * that slipped into the DOM as markup could not run a script or load anything. */
#define WEBUI_CSP                                                                                  \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "                \
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* What the page needs before its first API call: whether to ask for the key (so it never
 * provokes a 401 just to find out) and the model's name. */
static char *config_json(const struct serve *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char *text = NULL;
    if (cJSON_AddBoolToObject(o, "auth", s->o->api_key != NULL) &&
        cJSON_AddStringToObject(o, "model", s->o->served_name ? s->o->served_name : "") &&
        cJSON_AddNumberToObject(o, "ctx_len", s->ctx_len))
        text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

void api_webui(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    struct oai_error e = {0};
    if (!strcmp(rq->path, API_WEBUI_PREFIX "config.json")) {
        out->body = config_json(s);
        if (!out->body) {
            oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
            api_error(&e, rq->log, out);
            return;
        }
        out->status = 200;
        out->content_type = "application/json";
        out->body_len = strlen(out->body);
        return;
    }
    for (int i = 0; i < webui_n_files; i++) {
        const struct webui_file *f = &webui_files[i];
        if (strcmp(rq->path, f->path) != 0) continue;
        out->body = malloc(f->len + 1);
        if (!out->body) {
            oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
            api_error(&e, rq->log, out);
            return;
        }
        memcpy(out->body, f->data, f->len + 1);
        out->body_len = f->len;
        out->status = 200;
        out->content_type = f->content_type;
        out->csp = WEBUI_CSP;
        return;
    }
    oai_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "no page file %.100s",
                  rq->path);
    api_error(&e, rq->log, out);
}
