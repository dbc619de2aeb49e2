/* api_embed: POST /v1/embeddings.
 *
 * DESIGN. Every input is tokenized on the HTTP thread, then becomes one pooled engine request
 * (engine.h: max_tokens 0, pooling from --pooling): the engine prefills it in the same steps as
 * everyone's generation, pools its final hidden states and frees its KV blocks. The handler keeps
 * at most EMBED_WINDOW inputs in the engine at once and submits the next as each finishes, so a
 * request of 2048 inputs neither fills the engine's queue nor waits on HTTP round trips; a full
 * queue only means waiting for one of its own to finish (429 when none of its own is running).
 * The vectors are collected in input order and answered in one body. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

#define EMBED_WINDOW 64 /* inputs of one request in the engine at once */

struct embed_job {
    struct serve *s;
    const struct http_req *rq;
    size_t n;
    int32_t **ids; /* [n] token ids (owned) */
    size_t *n_ids; /* [n] */
    struct request **reqs;
    float **vecs; /* [n] owned copies */
    int dim;
    size_t next, done;   /* submitted; finished (in input order) */
    int priority;        /* the request's, for each input */
    struct api_model am; /* what "model" named: its LoRA adapter, the name to answer with */
};

static void job_free(struct embed_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        if (j->ids) free(j->ids[i]);
        if (j->vecs) free(j->vecs[i]);
        if (j->reqs && j->reqs[i]) serve_release(j->s, j->reqs[i], true);
    }
    free(j->ids);
    free(j->n_ids);
    free(j->reqs);
    free(j->vecs);
}

static int tokenize_inputs(struct embed_job *j, const struct oai_request *r, struct oai_error *e)
{
    struct serve *s = j->s;
    for (size_t i = 0; i < j->n; i++) {
        const struct oai_prompt *p = &r->prompts[i];
        struct qerr q = {0};
        if (p->text) {
            if (tokenizer_encode(s->tok, p->text, p->text_len, tokenizer_adds_bos(s->tok), false,
                                 &j->ids[i], &j->n_ids[i], &q))
                return oai_error_set(e, 400, "invalid_request_error", NULL, "input",
                                     "'input' element %zu: %s", i, q.msg);
        } else {
            for (size_t k = 0; k < p->n_ids; k++)
                if (p->ids[k] >= s->vocab)
                    return oai_error_set(e, 400, "invalid_request_error", "invalid_value", "input",
                                         "'input' element %zu: token %zu is %d; the vocabulary "
                                         "has %d tokens",
                                         i, k, p->ids[k], s->vocab);
            j->ids[i] = malloc((p->n_ids ? p->n_ids : 1) * sizeof(int32_t));
            if (!j->ids[i])
                return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            memcpy(j->ids[i], p->ids, p->n_ids * sizeof(int32_t));
            j->n_ids[i] = p->n_ids;
        }
        if (j->n_ids[i] == 0)
            return oai_error_set(e, 400, "invalid_request_error", "invalid_value", "input",
                                 "'input' element %zu has no tokens", i);
        j->n_ids[i] = api_truncate_prompt(s, r->truncate_prompt, j->ids[i], j->n_ids[i]);
        j->rq->log->prompt_tokens += (int)j->n_ids[i];
    }
    return 0;
}

/* Submits input j->next; 1 when the queue is full and one of ours is still running. */
static int submit_next(struct embed_job *j, struct oai_error *e)
{
    struct serve *s = j->s;
    size_t i = j->next;
    struct gen_request gr = {.prompt = j->ids[i],
                             .n_prompt = j->n_ids[i],
                             .max_tokens = 0,
                             .top_logprobs = -1,
                             .pooling = s->o->pooling,
                             .priority = j->priority,
                             .lora = j->am.lora,
                             .lora_gen = j->am.gen};
    sample_params_default(&gr.sample);
    struct qerr q = {0};
    if (serve_submit(s, &gr, &j->reqs[i], &q) == 0) {
        j->next++;
        return 0;
    }
    if (q.code == QERR_FULL && j->next > j->done && atomic_load(&s->state) == SERVE_READY &&
        !strstr(q.msg, "drain"))
        return 1;
    if (q.code == QERR_TOO_LONG)
        return oai_error_set(e, 400, "invalid_request_error", "context_length_exceeded", "input",
                             "'input' element %zu has %zu tokens; this model's maximum context "
                             "length is %d tokens",
                             i, j->n_ids[i], s->ctx_len);
    if (q.code == QERR_INVALID)
        return oai_error_set(e, 400, "invalid_request_error", NULL, "input",
                             "'input' element %zu: %s", i, q.msg);
    return api_submit_error(s, &q, e);
}

/* Waits for input j->done to finish and keeps its vector; QERR_IO when the client left. */
static int wait_done(struct embed_job *j, struct oai_error *e)
{
    size_t i = j->done;
    struct req_event ev;
    while (request_next(j->reqs[i], &ev, 200) != 0 || !ev.done)
        if (api_client_gone(j->rq->fd)) return QERR_IO;
    metrics_observe_request(&j->s->metrics, &ev);
    int dim = 0;
    const float *v = ev.finish == FINISH_STOP ? request_embedding(j->reqs[i], &dim) : NULL;
    if (!v)
        return oai_error_set(e, 500, "server_error", "engine_error", NULL,
                             "'input' element %zu was not embedded: %s", i,
                             ev.error[0] ? ev.error : finish_reason_name(ev.finish));
    if (!(j->vecs[i] = malloc((size_t)dim * sizeof(float))))
        return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(j->vecs[i], v, (size_t)dim * sizeof(float));
    j->dim = dim;
    serve_release(j->s, j->reqs[i], false);
    j->reqs[i] = NULL;
    j->done++;
    return 0;
}

static int run(struct embed_job *j, const struct oai_request *r, const char *model,
               struct http_resp *out, struct oai_error *e)
{
    const char *nomem = "out of memory";
    j->ids = calloc(j->n, sizeof *j->ids);
    j->n_ids = calloc(j->n, sizeof *j->n_ids);
    j->reqs = calloc(j->n, sizeof *j->reqs);
    j->vecs = calloc(j->n, sizeof *j->vecs);
    if (!j->ids || !j->n_ids || !j->reqs || !j->vecs)
        return oai_error_set(e, 500, "server_error", NULL, NULL, "%s", nomem);
    int rc = tokenize_inputs(j, r, e);
    while (!rc && j->done < j->n) {
        while (!rc && j->next < j->n && j->next - j->done < EMBED_WINDOW) {
            rc = submit_next(j, e);
            if (rc == 1) { /* queue full: wait for one of ours */
                rc = 0;
                break;
            }
        }
        if (!rc) rc = wait_done(j, e);
    }
    if (rc) return rc;
    char *body = oai_write_embeddings((const float *const *)j->vecs, j->n, j->dim, r->base64, model,
                                      j->rq->log->prompt_tokens);
    if (!body) return oai_error_set(e, 500, "server_error", NULL, NULL, "%s", nomem);
    out->status = 200;
    out->content_type = "application/json";
    out->body = body;
    out->body_len = strlen(body);
    return 0;
}

void api_embeddings(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    if (!api_ready(s, rq->log, out)) return;
    struct oai_request r;
    struct oai_error e = {0};
    if (api_parse(OAI_EMBEDDING, rq, &r, out)) return;
    struct embed_job j = {.s = s, .rq = rq, .n = r.n_prompts, .priority = r.priority};
    int rc = api_model_check(s, r.model, &j.am, &e);
    if (!rc) rc = run(&j, &r, j.am.name, out, &e);
    if (rc == QERR_IO) {
        rq->log->disconnected = true;
        out->status = 0;
    } else if (rc) {
        api_error(&e, rq->log, out);
    }
    job_free(&j);
    oai_request_free(&r);
}
