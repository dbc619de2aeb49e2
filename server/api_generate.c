/* api_generate: POST /v1/completions and /v1/chat/completions.
 *
 * DESIGN. The handler parses and validates the body, tokenizes each prompt (chat: the template's
 * markers as control tokens, message content as text; completions: user text never parsed for
 * specials), checks the context, and submits one engine request per choice (prompts x n; choice j
 * of a prompt gets seed + j, and the prefix cache shares the prompt between them). Then either
 *   - non-streamed: the handler waits on each request's events on its HTTP thread, polling the
 *     client socket between waits so a disconnect aborts the requests, and answers one JSON
 *     body; or
 *   - streamed: the handler returns a struct gen as the body's stream. Its read callback, run on
 *     the same HTTP thread whenever the socket can take more, blocks on the requests' events
 *     (round-robin over the live choices, with short timeouts) and turns each into one SSE
 *     chunk, then the optional usage chunk and [DONE]. The client going away shows as a failed
 *     write or as a hang-up seen while waiting; either way MHD frees the stream, which aborts
 *     whatever is still running, so its KV blocks are free by the engine's next step.
 * A struct gen is owned by the handler until it is handed to the HTTP layer as a stream. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../kernels/nvtx.h"
#include "api.h"
#include "api_structured.h"
#include "oai_resp.h"

/* every choice after a request's first may use the engine's room for them (joins_group) */
_Static_assert(OAI_MAX_CHOICES <= ENGINE_MAX_GROUP, "a request's choices must fit the queue");

struct choice {
    struct request *req; /* NULL once released */
    bool done;
    int prompt;             /* index of its prompt */
    size_t text_len;        /* bytes of text so far (echo included): logprobs text_offset */
    int logged_tokens;      /* of its tokens, those already counted in the request's log */
    size_t streamed;        /* streamed with tools: bytes of its text already sent as content */
    size_t prompt_off;      /* echo with logprobs: where the next prompt token's text begins */
    size_t lp_sent;         /* streamed: echoed prompt logprobs already sent */
    struct oai_think think; /* streamed with reasoning: what of its text went out */
    bool rs_closed;         /* streamed responses: the reasoning item's closing events sent */
    int reasoning_tokens;   /* with reasoning: its tokens up to the event that closed it; -1
                             * while it is open */
    struct oai_choice out;  /* non-streamed: the collected text and logprobs */
    char error[256];        /* FINISH_ERROR: the engine's message */
    bool request_fault;     /* FINISH_ERROR caused by the request's constraints (req_event) */
};

struct gen {
    struct serve *s;
    struct api_model am; /* what "model" named (responses carry am.name) */
    struct oai_meta meta;
    char id[48];
    bool stream, include_usage;
    bool tools;                     /* chat with tools: outputs are parsed for tool calls */
    enum chat_tool_format tool_fmt; /* ... written in the chat template's format */
    int fd;
    struct req_log *log;
    int n_choices, n_prompts, n_per; /* choices submitted; prompts; choices per prompt */
    struct choice *ch;               /* [n_prompts * n_per] */
    int32_t **ids;                   /* [n_prompts] token ids (owned) */
    size_t *n_ids;                   /* [n_prompts] */
    char **echo;                     /* [n_prompts] echoed text (owned) or NULL */
    bool echo_lp;                    /* echo with logprobs: the prompt's tokens lead logprobs */
    struct oai_usage usage;
    /* /v1/responses: the chat's one choice written as a response; events numbered by seq */
    struct oai_resp resp;
    char msg_id[48];
    char rs_id[48]; /* responses with reasoning: the reasoning item's id */
    char *instructions;
    cJSON *text_format; /* the request's text.format (a copy: the request's tree goes first) */
    int32_t *pred_ids;  /* the prediction's tokens (each choice's engine request copies them) */
    char *stop[ENGINE_MAX_STOPS]; /* the request's stop strings (owned): stop_reason's text */
    int n_stop;
    int32_t bad_ids[ENGINE_MAX_BAD_WORDS * ENGINE_MAX_BAD_LEN]; /* bad_words as token sequences */
    int32_t bad_lens[ENGINE_MAX_BAD_WORDS];
    int n_bad;
    int n_pred;
    int seq;
    int first_done;      /* choices finished so far (the first one fills the log) */
    struct sbuf pending; /* streamed bytes not yet handed to MHD */
    size_t off;
    bool eof;          /* [DONE] is in pending */
    bool failed;       /* the stream ended in its out-of-memory event */
    int rr;            /* next choice to block on */
    double checked_ms; /* when the client socket was last polled */
};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void gen_free(struct gen *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_choices; i++) {
        /* one the client gave up on: its final event would come a step later, so it is
         * counted here */
        if (g->ch[i].req && !g->ch[i].done) metrics_count_finish(&g->s->metrics, FINISH_ABORT);
        serve_release(g->s, g->ch[i].req, !g->ch[i].done);
        oai_choice_free(&g->ch[i].out);
    }
    /* a start that ran out of memory may lack either array */
    for (int i = 0; i < g->n_prompts; i++) {
        if (g->ids) free(g->ids[i]);
        if (g->echo) free(g->echo[i]);
    }
    free(g->ch);
    free(g->instructions);
    cJSON_Delete(g->text_format);
    free(g->pred_ids);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    oai_tool_calls_free((struct oai_tool_call *)g->resp.calls, g->resp.n_calls);
    free(g->ids);
    free(g->n_ids);
    free(g->echo);
    sbuf_free(&g->pending);
    free(g);
}

static int append_chunk(struct gen *g, char *chunk)
{
    if (!chunk) return QERR_NOMEM;
    int rc = sbuf_puts(&g->pending, chunk);
    free(chunk);
    return rc;
}

/* The text length of a token as the prompt's echo holds it. */
static size_t token_len(const struct gen *g, int32_t id)
{
    char raw[8];
    int n = g->meta.vocab.token_bytes(g->meta.vocab.ctx, id, raw, sizeof raw);
    return n > 0 ? (size_t)n : 0;
}

/* A prompt token's logprob event: into the echo's logprobs and/or prompt_logprobs. */
static int on_prompt_event(struct gen *g, struct choice *c, const struct req_event *ev)
{
    struct oai_lp one = {.token = ev->token, .logprob = ev->logprob, .rank = ev->rank};
    one.n_top = ev->n_top < 0 ? 0 : ev->n_top > OAI_MAX_LOGPROBS ? OAI_MAX_LOGPROBS : ev->n_top;
    memcpy(one.top, ev->top, (size_t)one.n_top * sizeof one.top[0]);
    int rc = 0;
    if (g->meta.prompt_logprobs)
        rc = oai_lp_push(&c->out.plp, &c->out.n_plp, &c->out.cap_plp, &one);
    if (!rc && g->echo_lp) {
        one.text_offset = c->prompt_off;
        c->prompt_off += token_len(g, ev->token);
        rc = oai_lp_push(&c->out.lp, &c->out.n_lp, &c->out.cap_lp, &one);
    }
    return rc;
}

/* A streamed response's reasoning item closes (its whole text), and the message item and its
 * part open. */
static int resp_close_reasoning(struct gen *g, struct choice *c)
{
    int rc = 0;
    const char *text = c->out.text.p ? c->out.text.p : "";
    for (int ev = OAI_RESP_RS_TEXT_DONE; ev <= OAI_RESP_RS_ITEM_DONE && !rc; ev++)
        rc = append_chunk(
            g, oai_resp_event(&g->resp, ev, g->seq++, text, c->out.text.len, FINISH_NONE, NULL));
    for (int ev = OAI_RESP_ITEM_ADDED; ev <= OAI_RESP_PART_ADDED && !rc; ev++)
        rc = append_chunk(g, oai_resp_event(&g->resp, ev, g->seq++, "", 0, FINISH_NONE, NULL));
    c->rs_closed = true;
    return rc;
}

/* Takes in one event of choice i. */
static int on_event(struct gen *g, int i, const struct req_event *ev)
{
    struct choice *c = &g->ch[i];
    if (ev->prompt) return on_prompt_event(g, c, ev);
    if (g->stream && g->echo_lp && c->lp_sent < c->out.n_lp) {
        /* the echoed prompt's logprobs, in one chunk before the first generated text */
        int rc = append_chunk(g, oai_write_chunk(&g->meta, i, "", 0, NULL, FINISH_NONE, NULL,
                                                 c->out.lp + c->lp_sent, c->out.n_lp - c->lp_sent,
                                                 g->include_usage));
        if (rc) return rc;
        c->lp_sent = c->out.n_lp;
    }
    bool lp = g->meta.logprobs >= 0 && !ev->done;
    struct oai_lp one;
    if (lp) {
        one =
            (struct oai_lp){.token = ev->token, .logprob = ev->logprob, .text_offset = c->text_len};
        one.n_top = ev->n_top < 0 ? 0 : ev->n_top > OAI_MAX_LOGPROBS ? OAI_MAX_LOGPROBS : ev->n_top;
        memcpy(one.top, ev->top, (size_t)one.n_top * sizeof one.top[0]);
    }
    size_t len = ev->text_len > 0 ? (size_t)ev->text_len : 0;
    if (len > sizeof ev->text - 1) len = sizeof ev->text - 1;
    enum finish_reason fin = ev->done ? ev->finish : FINISH_NONE;
    if (ev->done && fin == FINISH_NONE) fin = FINISH_ERROR;
    if (ev->done && fin == FINISH_STOP) /* vLLM's stop_reason */
        c->out.stop = (struct oai_stop){.text = ev->stop_string >= 0 && ev->stop_string < g->n_stop
                                                    ? g->stop[ev->stop_string]
                                                    : NULL,
                                        .token = ev->stop_token,
                                        .by_token = ev->stop_token >= 0};
    int rc = 0;
    if (g->stream && g->meta.kind == OAI_RESPONSES && g->resp.reasoning) {
        /* the reasoning item's text, then (once </think> is read) the message's */
        if (len) rc = sbuf_append(&c->out.text, ev->text, len);
        struct oai_span rs = {0, 0}, cs = {0, 0};
        if (!rc) oai_think_next(&c->think, c->out.text.p, c->out.text.len, ev->done, &rs, &cs);
        if (!rc && rs.len)
            rc = append_chunk(g, oai_resp_event(&g->resp, OAI_RESP_RS_DELTA, g->seq++,
                                                c->out.text.p + rs.off, rs.len, FINISH_NONE, NULL));
        if (!rc && c->think.ended && !c->rs_closed) rc = resp_close_reasoning(g, c);
        if (!rc && cs.len)
            rc = append_chunk(g, oai_resp_event(&g->resp, OAI_RESP_DELTA, g->seq++,
                                                c->out.text.p + cs.off, cs.len, FINISH_NONE, NULL));
    } else if (g->stream && g->meta.kind == OAI_RESPONSES) {
        /* the text is kept for the closing events (stream_read) */
        if (len) rc = sbuf_append(&c->out.text, ev->text, len);
        if (!rc && len && !g->tools) /* with tools the text may become calls: held */
            rc = append_chunk(g, oai_resp_event(&g->resp, OAI_RESP_DELTA, g->seq++, ev->text, len,
                                                FINISH_NONE, NULL));
    } else if (g->stream && g->meta.reasoning && !(ev->done && fin == FINISH_ERROR)) {
        /* the text is kept: a "</think>" may come split over events */
        if (len) rc = sbuf_append(&c->out.text, ev->text, len);
        struct oai_span rs = {0, 0}, cs = {0, 0};
        if (!rc) oai_think_next(&c->think, c->out.text.p, c->out.text.len, ev->done, &rs, &cs);
        bool lp_sent = false;
        if (!rc && rs.len) {
            rc = append_chunk(g, oai_write_reasoning_chunk(&g->meta, i, c->out.text.p + rs.off,
                                                           rs.len, lp ? &one : NULL, lp ? 1 : 0,
                                                           g->include_usage));
            lp_sent = lp;
        }
        if (!rc && (cs.len || ev->done || (lp && !lp_sent)))
            rc = append_chunk(g, oai_write_chunk(&g->meta, i, c->out.text.p + cs.off, cs.len, NULL,
                                                 fin, &c->out.stop, lp && !lp_sent ? &one : NULL,
                                                 lp && !lp_sent ? 1 : 0, g->include_usage));
    } else if (g->stream && g->tools && !(ev->done && fin == FINISH_ERROR)) {
        /* content is sent as it comes, up to where a call may begin; the calls when
         * the choice ends */
        if (len) rc = sbuf_append(&c->out.text, ev->text, len);
        /* the token's logprobs at once, in a chunk of their own (its text may be held back, as
         * the start of a call): the stream carries every token's, as the whole response does */
        if (!rc && lp)
            rc = append_chunk(g, oai_write_chunk(&g->meta, i, "", 0, NULL, FINISH_NONE, NULL, &one,
                                                 1, g->include_usage));
        if (!rc)
            rc = append_chunk(g, oai_tools_chunks(&g->meta, g->tool_fmt, i, c->out.text.p,
                                                  c->out.text.len, &c->streamed, fin, &c->out.stop,
                                                  g->include_usage));
    } else if (g->stream) {
        if (ev->done && fin == FINISH_ERROR) {
            struct oai_error e = {0};
            if (ev->request_fault)
                oai_error_set(&e, 400, "invalid_request_error", "invalid_value", NULL, "%s",
                              ev->error);
            else
                oai_error_set(&e, 500, "server_error", "engine_error", NULL, "%s",
                              ev->error[0] ? ev->error : "the engine failed this request");
            rc = append_chunk(g, oai_write_error_chunk(&e));
        }
        if (!rc && (len || lp || ev->done))
            rc =
                append_chunk(g, oai_write_chunk(&g->meta, i, ev->text, len, NULL, fin, &c->out.stop,
                                                lp ? &one : NULL, lp ? 1 : 0, g->include_usage));
    } else {
        if (len) rc = sbuf_append(&c->out.text, ev->text, len);
        if (!rc && lp)
            rc = oai_choice_add_lp(&c->out, one.token, one.logprob, one.text_offset, one.top,
                                   one.n_top);
        struct oai_span rs, cs; /* only where the reasoning ends, for its token count */
        if (!rc && g->meta.reasoning)
            oai_think_next(&c->think, c->out.text.p, c->out.text.len, ev->done, &rs, &cs);
    }
    c->text_len += len;
    if (g->meta.reasoning && c->reasoning_tokens < 0 && (c->think.ended || ev->done))
        c->reasoning_tokens = c->think.skipped ? 0 : ev->completion_tokens;
    /* counted as they come, so a request cut short logs what it streamed */
    if (g->log && ev->completion_tokens > c->logged_tokens) {
        g->log->completion_tokens += ev->completion_tokens - c->logged_tokens;
        c->logged_tokens = ev->completion_tokens;
    }
    if (ev->done) {
        c->done = true;
        c->out.finish = fin;
        if (fin == FINISH_ERROR) {
            snprintf(c->error, sizeof c->error, "%s", ev->error);
            c->request_fault = ev->request_fault;
        }
        g->usage.completion_tokens += ev->completion_tokens;
        g->usage.accepted_tokens += ev->accepted_tokens;
        g->usage.rejected_tokens += ev->rejected_tokens;
        if (g->meta.reasoning) g->usage.reasoning_tokens += c->reasoning_tokens;
        if (i % g->n_per == 0) g->usage.cached_tokens += ev->cached_tokens; /* once a prompt */
        metrics_observe_request(&g->s->metrics, ev);
        if (g->log) {
            g->log->cached_tokens += ev->cached_tokens;
            if (g->first_done == 0) {
                g->log->ttft_ms = ev->completion_tokens > 0 ? ev->ttft_ms : -1;
                g->log->finish = oai_finish_name(fin);
            }
            if (fin == FINISH_ERROR) {
                g->log->has_error = true;
                g->log->error = ev->request_fault ? METRICS_ERR_BAD_REQUEST : METRICS_ERR_INTERNAL;
                fprintf(stderr, "quern serve: request %s choice %d failed: %s\n", g->log->id, i,
                        ev->error);
            }
        }
        g->first_done++;
    }
    return rc;
}

static bool all_done(const struct gen *g)
{
    for (int i = 0; i < g->n_choices; i++)
        if (!g->ch[i].done) return false;
    return true;
}

/* Takes every event already waiting; returns how many, or a negative code. */
static int drain_ready(struct gen *g)
{
    int got = 0;
    struct req_event ev;
    for (int i = 0; i < g->n_choices; i++) {
        struct choice *c = &g->ch[i];
        while (!c->done && request_next(c->req, &ev, 0) == 0) {
            int rc = on_event(g, i, &ev);
            if (rc) return rc;
            got++;
        }
    }
    return got;
}

/* Waits up to timeout_ms on the next live choice (round robin); 1 when an event came. */
static int wait_one(struct gen *g, int timeout_ms)
{
    for (int k = 0; k < g->n_choices; k++) {
        int i = (g->rr + k) % g->n_choices;
        if (g->ch[i].done) continue;
        g->rr = (i + 1) % g->n_choices;
        struct req_event ev;
        int rc = request_next(g->ch[i].req, &ev, timeout_ms);
        if (rc == 0) {
            rc = on_event(g, i, &ev);
            return rc ? rc : 1;
        }
        return 0;
    }
    return 0;
}

/* Waits for more events; QERR_IO when the client went away. */
static int wait_more(struct gen *g)
{
    int live = 0;
    for (int i = 0; i < g->n_choices; i++) live += !g->ch[i].done;
    int rc = drain_ready(g);
    if (rc) return rc < 0 ? rc : 0;
    rc = wait_one(g, live == 1 ? 200 : 10);
    if (rc < 0) return rc;
    /* tokens may keep coming for a client that left: poll its socket every 200 ms */
    double now = now_ms();
    if (now - g->checked_ms >= 200) {
        g->checked_ms = now;
        if (api_client_gone(g->fd)) return QERR_IO;
    }
    return 0;
}

/* With tools, what the chat's one choice wrote as tool calls become the response's
 * function calls (g->resp.calls); returns the length of the message text before them. */
static size_t resp_take_calls(struct gen *g)
{
    const struct choice *c = &g->ch[0];
    size_t keep = c->out.text.len;
    /* cut by max_output_tokens too: the whole blocks before the cut are calls */
    if (!g->tools || c->out.finish == FINISH_ERROR || !c->out.text.p) return keep;
    struct oai_tool_call *calls = NULL;
    oai_tool_calls_free((struct oai_tool_call *)g->resp.calls, g->resp.n_calls);
    int n = oai_parse_tool_calls(g->tool_fmt, c->out.text.p, c->out.text.len, &calls, &keep);
    g->resp.calls = calls;
    g->resp.n_calls = n > 0 ? (size_t)n : 0;
    return n > 0 ? keep : c->out.text.len;
}

/* The closing events of a streamed response. Without tools the message's item and part were
 * announced at the start and its text streamed; with tools the text was held (it may hold
 * <tool_call> blocks), so the message comes whole here, then each call. */
static int resp_stream_end(struct gen *g)
{
    const struct choice *c = &g->ch[0];
    const char *text = c->out.text.p ? c->out.text.p : "";
    size_t len = resp_take_calls(g);
    enum finish_reason fin = c->out.finish;
    int rc = 0;
    if (g->resp.reasoning && !c->rs_closed) rc = resp_close_reasoning(g, &g->ch[0]);
    bool msg = oai_resp_has_message(&g->resp, len);
    for (int ev = OAI_RESP_ITEM_ADDED; g->tools && msg && ev <= OAI_RESP_PART_ADDED && !rc; ev++)
        rc = append_chunk(g, oai_resp_event(&g->resp, ev, g->seq++, "", 0, FINISH_NONE, NULL));
    if (!rc && g->tools && msg && len)
        rc = append_chunk(
            g, oai_resp_event(&g->resp, OAI_RESP_DELTA, g->seq++, text, len, FINISH_NONE, NULL));
    for (int ev = OAI_RESP_TEXT_DONE; msg && ev <= OAI_RESP_ITEM_DONE && !rc; ev++)
        rc = append_chunk(g, oai_resp_event(&g->resp, ev, g->seq++, text, len, fin, &g->usage));
    for (size_t k = 0; k < g->resp.n_calls && !rc; k++)
        for (int ev = OAI_RESP_CALL_ADDED; ev <= OAI_RESP_CALL_DONE && !rc; ev++)
            rc = append_chunk(g, oai_resp_call_event(&g->resp, ev, g->seq++, k, len));
    if (!rc)
        rc = append_chunk(
            g, oai_resp_event(&g->resp, OAI_RESP_DONE, g->seq++, text, len, fin, &g->usage));
    return rc;
}

static long stream_read(void *ctx, char *buf, size_t max)
{
    struct gen *g = ctx;
    while (g->off == g->pending.len) {
        sbuf_reset(&g->pending);
        g->off = 0;
        if (g->eof) return 0;
        int rc = 0;
        if (all_done(g) && g->meta.kind == OAI_RESPONSES) {
            rc = resp_stream_end(g);
            g->eof = true;
        } else if (all_done(g)) {
            if (g->include_usage) rc = append_chunk(g, oai_write_usage_chunk(&g->meta, &g->usage));
            if (!rc) rc = sbuf_puts(&g->pending, OAI_SSE_DONE);
            g->eof = true;
        } else {
            rc = wait_more(g);
        }
        if (rc == QERR_IO) {
            if (g->log) g->log->disconnected = true;
            return -1;
        }
        if (rc) {
            /* out of memory mid-stream: the client is told so in a fixed event that needs no
             * allocation, then the stream ends (stream_free aborts what is still running) */
            static const char oom[] =
                "data: {\"error\":{\"message\":\"out of memory\",\"type\":"
                "\"server_error\",\"param\":null,\"code\":null}}\n\n" OAI_SSE_DONE;
            if (g->failed || max < sizeof oom - 1) return -1;
            g->failed = true;
            sbuf_reset(&g->pending);
            g->off = 0;
            g->eof = true;
            if (g->log) {
                g->log->has_error = true;
                g->log->error = METRICS_ERR_INTERNAL;
            }
            memcpy(buf, oom, sizeof oom - 1);
            return (long)(sizeof oom - 1);
        }
    }
    size_t n = g->pending.len - g->off;
    if (n > max) n = max;
    memcpy(buf, g->pending.p + g->off, n);
    g->off += n;
    return (long)n;
}

static void stream_free(void *ctx)
{
    gen_free(ctx);
}

static const struct http_stream_ops gen_stream_ops = {.read = stream_read, .free = stream_free};

static uint64_t random_seed(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        v = (uint64_t)t.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)t.tv_sec;
    }
    return v;
}

/* Tokenizes prompt p of r into g->ids[p] (and its echo text). */
static int tokenize_prompt(struct serve *s, const struct oai_request *r, struct gen *g, int p,
                           struct oai_error *e)
{
    struct qerr q = {0};
    const char *param = r->kind == OAI_RESPONSES ? "input"
                        : r->kind == OAI_CHAT    ? "messages"
                                                 : "prompt";
    if (r->kind != OAI_COMPLETION) {
        int rc = api_chat_tokens(s, r, r->chat_end, tokenizer_adds_bos(s->tok), &g->ids[p],
                                 &g->n_ids[p], e);
        if (rc) return rc;
    } else if (r->prompts[p].text) {
        const struct oai_prompt *op = &r->prompts[p];
        if (tokenizer_encode(s->tok, op->text, op->text_len, tokenizer_adds_bos(s->tok), false,
                             &g->ids[p], &g->n_ids[p], &q))
            return oai_error_set(e, 400, "invalid_request_error", NULL, param, "%s", q.msg);
        if (r->echo && !(g->echo[p] = strndup(op->text, op->text_len)))
            return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    } else {
        const struct oai_prompt *op = &r->prompts[p];
        for (size_t i = 0; i < op->n_ids; i++)
            if (op->ids[i] >= s->vocab)
                return oai_error_set(e, 400, "invalid_request_error", "invalid_value", param,
                                     "'prompt' token %zu is %d; the vocabulary has %d tokens", i,
                                     op->ids[i], s->vocab);
        g->ids[p] = malloc((op->n_ids ? op->n_ids : 1) * sizeof(int32_t));
        if (!g->ids[p]) return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(g->ids[p], op->ids, op->n_ids * sizeof(int32_t));
        g->n_ids[p] = op->n_ids;
        if (r->echo && !(g->echo[p] = tokenizer_decode(s->tok, op->ids, op->n_ids)))
            return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (g->n_ids[p] == 0)
        return oai_error_set(e, 400, "invalid_request_error", "invalid_value", param,
                             "the %s has no tokens", param);
    size_t n = g->n_ids[p];
    g->n_ids[p] = api_truncate_prompt(s, r->truncate_prompt, g->ids[p], n);
    if (g->n_ids[p] < n && g->echo[p]) {
        /* the echo is what the model read */
        free(g->echo[p]);
        if (!(g->echo[p] = tokenizer_decode(s->tok, g->ids[p], g->n_ids[p])))
            return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* vLLM's bad_words as the engine bans them: each word (its leading blanks dropped) as tokens, and
 * again after a space where that gives as many tokens with another first one (the word inside
 * a text rather than at its start), as vLLM tokenizes them. */
static int tokenize_bad_words(struct serve *s, const struct oai_request *r, struct gen *g,
                              struct oai_error *e)
{
    int used = 0;
    for (int i = 0; i < r->n_bad_words; i++) {
        const char *w = r->bad_words[i];
        while (*w == ' ' || *w == '\t' || *w == '\n' || *w == '\r') w++;
        char spaced[ENGINE_MAX_STOP_BYTES + 2];
        snprintf(spaced, sizeof spaced, " %s", w);
        int first_len = 0;
        for (int variant = 0; variant < 2 && *w; variant++) {
            const char *text = variant ? spaced : w;
            int32_t *ids = NULL;
            size_t n = 0;
            struct qerr q = {0};
            if (tokenizer_encode(s->tok, text, strlen(text), false, false, &ids, &n, &q))
                return oai_error_set(e, q.code == QERR_NOMEM ? 500 : 400,
                                     q.code == QERR_NOMEM ? "server_error"
                                                          : "invalid_request_error",
                                     NULL, "bad_words", "bad_words: %s", q.msg);
            bool keep = n > 0 && (variant == 0 ||
                                  ((int)n == first_len && ids[0] != g->bad_ids[used - first_len]));
            if (keep && n > ENGINE_MAX_BAD_LEN) {
                free(ids);
                return oai_error_set(e, 400, "invalid_request_error", "invalid_value", "bad_words",
                                     "'bad_words' %d is %zu tokens; at most %d", i, n,
                                     ENGINE_MAX_BAD_LEN);
            }
            if (keep) {
                memcpy(g->bad_ids + used, ids, n * sizeof *ids);
                used += (int)n;
                g->bad_lens[g->n_bad++] = (int32_t)n;
                if (variant == 0) first_len = (int)n;
            }
            free(ids);
            if (variant == 0 && !keep) break;
        }
    }
    return 0;
}

/* The request field an engine check names at the head of its message ("min_tokens: 9 is not
 * in ...", "top_p 2 not in ..."), copied into field; false for none. */
static bool engine_error_field(const char *msg, char field[64])
{
    static const char fields[] = " prompt max_tokens min_tokens stop_token_ids stop logit_bias "
                                 "top_logprobs prompt_logprobs temperature top_k top_p min_p "
                                 "repetition_penalty presence_penalty frequency_penalty "
                                 "allowed_token_ids bad_words ";
    size_t n = strcspn(msg, ": ");
    /* "prompt (84 tokens) + max_tokens ..." names no one field */
    if (n == 0 || n > 32 || msg[n] == '\0' || (msg[n] == ' ' && msg[n + 1] == '(')) return false;
    char key[36];
    snprintf(key, sizeof key, " %.*s ", (int)n, msg);
    if (!strstr(fields, key)) return false;
    snprintf(field, 64, "%.*s", (int)n, msg);
    return true;
}

int api_submit_error(struct serve *s, const struct qerr *q, struct oai_error *e)
{
    if (q->code == QERR_FULL && (atomic_load(&s->state) != SERVE_READY || strstr(q->msg, "drain")))
        return oai_error_set(e, 503, "server_error", "draining", NULL, "the server is draining");
    if (q->code == QERR_FULL)
        return oai_error_set(e, 429, "rate_limit_error", "queue_full", NULL,
                             "the request queue is full (%s); retry later", q->msg);
    if (q->code == QERR_NOTFOUND) /* its LoRA adapter was unloaded after the name was looked up */
        return oai_error_set(e, 404, "invalid_request_error", "model_not_found", "model", "%s",
                             q->msg);
    if (q->code == QERR_INVALID) {
        char field[64];
        bool named = engine_error_field(q->msg, field);
        return oai_error_set(e, 400, "invalid_request_error", named ? "invalid_value" : NULL,
                             named ? field : NULL, "%s", q->msg);
    }
    return oai_error_set(e, 500, "server_error", NULL, NULL, "%s", q->msg);
}

/* The engine's verdict that prompt + max_tokens exceed the context (QERR_TOO_LONG), in
 * OpenAI's words. */
static int context_error(struct serve *s, const struct oai_request *r, size_t n_prompt, int mt,
                         struct oai_error *e)
{
    const char *what = r->kind == OAI_RESPONSES ? "input"
                       : r->kind == OAI_CHAT    ? "messages"
                                                : "prompt";
    return oai_error_set(e, 400, "invalid_request_error", "context_length_exceeded", what,
                         "This model's maximum context length is %d tokens. However, you "
                         "requested %zu tokens (%zu in the %s, %d for the completion). Please "
                         "reduce the length of the %s or the completion.",
                         s->ctx_len, n_prompt + (size_t)mt, n_prompt, what, mt, what);
}

/* max_tokens when the request gives none: what the context leaves for chat and responses (as
 * OpenAI's chat API does), but no more than the KV pool can hold beside the prompt (the engine
 * refuses a request that could never fit), 16 for completions (OpenAI's completions default).
 * The one place it is decided. */
static int max_tokens_for(const struct serve *s, const struct oai_request *r, size_t n_prompt)
{
    if (r->max_tokens >= 0) return r->max_tokens;
    if (r->kind == OAI_COMPLETION) return 16;
    int room = s->pool_tokens > 0 && s->pool_tokens < s->ctx_len ? s->pool_tokens : s->ctx_len;
    return n_prompt < (size_t)room ? room - (int)n_prompt : 0;
}

/* Builds g from the parsed request and submits every choice. */
static int gen_start(struct serve *s, const struct http_req *rq, const struct oai_request *r,
                     struct gen **out, struct oai_error *e)
{
    const char *nomem = "out of memory";
    struct api_model am;
    int rc = api_model_check(s, r->model, &am, e);
    if (rc) return rc;
    int n_prompts = r->kind == OAI_COMPLETION ? (int)r->n_prompts : 1;
    struct gen *g = calloc(1, sizeof *g);
    if (!g) return oai_error_set(e, 500, "server_error", NULL, NULL, "%s", nomem);
    g->s = s;
    g->am = am;
    if (am.lora) g->am.name = g->am.lora_name; /* the copy's own */
    const char *model = g->am.name;
    g->fd = rq->fd;
    g->log = rq->log;
    g->stream = r->stream;
    g->include_usage = r->stream && r->include_usage;
    g->tools = api_tools_active(r);
    g->tool_fmt = api_tools_format(s);
    g->n_prompts = n_prompts;
    g->n_per = r->n;
    g->ids = calloc((size_t)n_prompts, sizeof *g->ids);
    g->n_ids = calloc((size_t)n_prompts, sizeof *g->n_ids);
    g->echo = calloc((size_t)n_prompts, sizeof *g->echo);
    g->ch = calloc((size_t)n_prompts * (size_t)r->n, sizeof *g->ch);
    struct grammar *grammar = NULL;
    if (!g->ids || !g->n_ids || !g->echo || !g->ch) {
        rc = oai_error_set(e, 500, "server_error", NULL, NULL, "%s", nomem);
        goto fail;
    }
    enum oai_reasoning reasoning = api_reasoning(s, r);
    for (int i = 0; i < n_prompts * r->n; i++) {
        g->ch[i].reasoning_tokens = -1;
        g->ch[i].think.optional = reasoning == OAI_REASONING_OPTIONAL;
    }
    if ((rc = api_grammar(s, r, reasoning != OAI_REASONING_NONE, &grammar, e))) goto fail;
    const char *prefix = r->kind == OAI_RESPONSES ? "resp_"
                         : r->kind == OAI_CHAT    ? "chatcmpl-"
                                                  : "cmpl-";
    snprintf(g->id, sizeof g->id, "%s%s", prefix, rq->log->id);
    snprintf(g->msg_id, sizeof g->msg_id, "msg_%s", rq->log->id);
    snprintf(g->rs_id, sizeof g->rs_id, "rs_%s", rq->log->id);
    if ((r->instructions && !(g->instructions = strdup(r->instructions))) ||
        (r->text_format && !(g->text_format = cJSON_Duplicate(r->text_format, true)))) {
        rc = oai_error_set(e, 500, "server_error", NULL, NULL, "%s", nomem);
        goto fail;
    }
    g->resp = (struct oai_resp){.id = g->id,
                                .msg_id = g->msg_id,
                                .model = model,
                                .created = (long long)time(NULL),
                                .instructions = g->instructions,
                                .text_format = g->text_format,
                                .max_output_tokens = r->max_tokens,
                                .temperature = r->sample.temperature,
                                .top_p = r->sample.top_p,
                                .reasoning = reasoning,
                                .rs_id = g->rs_id};
    g->meta = (struct oai_meta){.kind = r->kind,
                                .id = g->id,
                                .model = model,
                                .created = (long long)time(NULL),
                                .logprobs = r->logprobs,
                                .prompt_logprobs = r->prompt_logprobs >= 0,
                                .prompt_top = r->prompt_logprobs,
                                .vocab = api_vocab(s),
                                .reasoning = reasoning};
    g->usage.reasoning = reasoning != OAI_REASONING_NONE;
    g->echo_lp = r->kind == OAI_COMPLETION && r->echo && r->logprobs >= 0;
    int prompt_top = g->echo_lp ? r->logprobs : -1;
    if (r->prompt_logprobs > prompt_top) prompt_top = r->prompt_logprobs;
    for (int p = 0; p < n_prompts; p++) {
        if ((rc = tokenize_prompt(s, r, g, p, e))) goto fail;
        g->usage.prompt_tokens += (int)g->n_ids[p];
    }
    rq->log->prompt_tokens = g->usage.prompt_tokens;
    if ((rc = tokenize_bad_words(s, r, g, e))) goto fail;
    /* the stop strings outlive the request's tree, for the stop_reason they may end with */
    for (; g->n_stop < r->n_stop; g->n_stop++)
        if (!(g->stop[g->n_stop] = strdup(r->stop[g->n_stop]))) {
            rc = oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
    /* the prediction as the output's tokens would be (no BOS); the engine drafts from it */
    if (r->prediction && r->prediction_len) {
        struct qerr q = {0};
        size_t np = 0;
        if (tokenizer_encode(s->tok, r->prediction, r->prediction_len, false, false, &g->pred_ids,
                             &np, &q)) {
            rc = oai_error_set(e, q.code == QERR_NOMEM ? 500 : 400,
                               q.code == QERR_NOMEM ? "server_error" : "invalid_request_error",
                               NULL, "prediction", "prediction: %s", q.msg);
            goto fail;
        }
        /* longer than the context cannot all be the output: its start is what can */
        g->n_pred = np > (size_t)s->ctx_len ? s->ctx_len : (int)np;
    }
    uint64_t seed = r->has_seed ? r->sample.seed : random_seed();
    for (int p = 0; p < n_prompts; p++) {
        /* the engine alone judges the context (engine_submit: QERR_TOO_LONG) */
        int mt = max_tokens_for(s, r, g->n_ids[p]);
        for (int j = 0; j < r->n; j++) {
            int i = p * r->n + j;
            struct gen_request gr = {.prompt = g->ids[p],
                                     .n_prompt = g->n_ids[p],
                                     .sample = r->sample,
                                     .max_tokens = mt,
                                     .ignore_eos = r->ignore_eos,
                                     .include_stop_str = r->include_stop_str,
                                     .no_spec = r->no_spec,
                                     .priority = r->priority,
                                     .lora = g->am.lora,
                                     .lora_gen = g->am.gen,
                                     .allowed = r->allowed,
                                     .n_allowed = r->n_allowed,
                                     .bad_ids = g->bad_ids,
                                     .bad_lens = g->bad_lens,
                                     .n_bad = g->n_bad,
                                     .prediction = g->pred_ids,
                                     .n_prediction = g->n_pred,
                                     /* one place in the queue for the whole request */
                                     .joins_group = i > 0,
                                     .n_stop_strings = r->n_stop,
                                     .top_logprobs = r->logprobs,
                                     .min_tokens = r->min_tokens,
                                     .n_stop_ids = r->n_stop_ids,
                                     .logit_bias = r->logit_bias,
                                     .n_logit_bias = r->n_logit_bias,
                                     .grammar = grammar,
                                     .keep_tool_markers = g->tools,
                                     .prompt_logprobs = prompt_top >= 0,
                                     .prompt_top_logprobs = prompt_top > 0 ? prompt_top : 0};
            gr.sample.seed = seed + (uint64_t)j;
            for (int k = 0; k < r->n_stop; k++) gr.stop_strings[k] = r->stop[k];
            memcpy(gr.stop_ids, r->stop_ids, sizeof gr.stop_ids);
            struct qerr q = {0};
            g->ch[i].prompt = p;
            if (serve_submit(s, &gr, &g->ch[i].req, &q)) {
                rc = q.code == QERR_TOO_LONG ? context_error(s, r, g->n_ids[p], mt, e)
                                             : api_submit_error(s, &q, e);
                goto fail;
            }
            g->n_choices = i + 1;
            /* nothing precedes the first prompt token: its entry is null */
            struct oai_lp first = {.token = g->ids[p][0], .null_lp = true};
            struct oai_choice *oc = &g->ch[i].out;
            if ((r->prompt_logprobs >= 0 &&
                 oai_lp_push(&oc->plp, &oc->n_plp, &oc->cap_plp, &first)) ||
                (g->echo_lp && oai_lp_push(&oc->lp, &oc->n_lp, &oc->cap_lp, &first))) {
                rc = oai_error_set(e, 500, "server_error", NULL, NULL, "%s", nomem);
                goto fail;
            }
            g->ch[i].prompt_off = token_len(g, g->ids[p][0]);
            if (g->echo[p]) {
                size_t el = strlen(g->echo[p]);
                if (!g->stream && sbuf_append(&g->ch[i].out.text, g->echo[p], el)) {
                    rc = oai_error_set(e, 500, "server_error", NULL, NULL, "%s", nomem);
                    goto fail;
                }
                g->ch[i].text_len = el;
            }
        }
    }
    grammar_unref(grammar); /* each request holds its own reference */
    *out = g;
    return 0;
fail:
    grammar_unref(grammar);
    gen_free(g); /* releases (and aborts) only the choices already submitted */
    return rc;
}

/* The first bytes of a stream: the assistant role (chat) or the echoed prompt (completions). */
static int stream_begin(struct gen *g)
{
    int rc = 0;
    if (g->meta.kind == OAI_RESPONSES) {
        int last = g->tools ? OAI_RESP_IN_PROGRESS : OAI_RESP_PART_ADDED;
        if (g->resp.reasoning) last = OAI_RESP_IN_PROGRESS; /* the reasoning item comes first */
        for (int ev = OAI_RESP_CREATED; ev <= last && !rc; ev++)
            rc = append_chunk(g, oai_resp_event(&g->resp, ev, g->seq++, "", 0, FINISH_NONE, NULL));
        for (int ev = OAI_RESP_RS_ITEM_ADDED;
             g->resp.reasoning && ev <= OAI_RESP_RS_PART_ADDED && !rc; ev++)
            rc = append_chunk(g, oai_resp_event(&g->resp, ev, g->seq++, "", 0, FINISH_NONE, NULL));
        return rc;
    }
    for (int i = 0; i < g->n_choices && !rc; i++) {
        if (g->meta.kind == OAI_CHAT) {
            rc = append_chunk(g, oai_write_chunk(&g->meta, i, "", 0, "assistant", FINISH_NONE, NULL,
                                                 NULL, 0, g->include_usage));
        } else if (g->echo[g->ch[i].prompt]) {
            const char *t = g->echo[g->ch[i].prompt];
            rc = append_chunk(g, oai_write_chunk(&g->meta, i, t, strlen(t), NULL, FINISH_NONE, NULL,
                                                 NULL, 0, g->include_usage));
        }
    }
    return rc;
}

/* Waits for every choice (non-streamed); QERR_IO when the client went away. */
static int wait_all(struct gen *g)
{
    while (!all_done(g)) {
        int rc = wait_more(g);
        if (rc) return rc;
    }
    return 0;
}

static void generate(struct serve *s, const struct http_req *rq, struct http_resp *out,
                     enum oai_kind kind)
{
    if (!api_ready(s, rq->log, out)) return;
    struct oai_request r;
    struct oai_error e = {0};
    nvtx_push("http: parse");
    int parsed = api_parse(kind, rq, &r, out);
    nvtx_pop();
    if (parsed) return;
    api_chat_thinking(s, &r);
    struct gen *g = NULL;
    nvtx_push("http: tokenize and submit");
    int start_failed = api_tools_prepare(s, &r, &e) || gen_start(s, rq, &r, &g, &e);
    nvtx_pop();
    if (start_failed) {
        oai_request_free(&r);
        api_error(&e, rq->log, out);
        return;
    }
    oai_request_free(&r); /* g copied what it needs; stop strings were copied by the engine */
    if (g->stream) {
        if (stream_begin(g)) {
            gen_free(g);
            oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
            api_error(&e, rq->log, out);
            return;
        }
        out->status = 200;
        out->content_type = "text/event-stream";
        out->stream = &gen_stream_ops;
        out->stream_ctx = g;
        return;
    }
    nvtx_push("http: wait for the engine");
    int rc = wait_all(g);
    nvtx_pop();
    if (rc == QERR_IO) {
        rq->log->disconnected = true;
        out->status = 0;
    } else if (rc) {
        oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        api_error(&e, rq->log, out);
    } else {
        const struct choice *failed = NULL;
        for (int i = 0; i < g->n_choices && !failed; i++)
            if (g->ch[i].out.finish == FINISH_ERROR) failed = &g->ch[i];
        if (failed && failed->request_fault) {
            oai_error_set(&e, 400, "invalid_request_error", "invalid_value", NULL, "%s",
                          failed->error);
            api_error(&e, rq->log, out);
        } else if (failed) {
            oai_error_set(&e, 500, "server_error", "engine_error", NULL, "%s",
                          *failed->error ? failed->error
                                         : "the engine failed this request (see the server log)");
            api_error(&e, rq->log, out);
        } else {
            struct oai_choice *cs = malloc((size_t)g->n_choices * sizeof *cs);
            if (cs)
                for (int i = 0; i < g->n_choices; i++) cs[i] = g->ch[i].out;
            char *body = NULL;
            if (g->meta.kind == OAI_RESPONSES)
                body = oai_resp_write(&g->resp, g->ch[0].out.text.p, resp_take_calls(g),
                                      g->ch[0].out.finish, &g->usage);
            else if (cs)
                body = oai_write_response(&g->meta, cs, (size_t)g->n_choices, &g->usage);
            free(cs);
            if (body && g->tools && g->meta.kind == OAI_CHAT)
                body = oai_tools_rewrite(body, g->id, g->tool_fmt);
            if (!body) {
                oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
                api_error(&e, rq->log, out);
            } else {
                out->status = 200;
                out->content_type = "application/json";
                out->body = body;
                out->body_len = strlen(body);
            }
        }
    }
    gen_free(g);
}

void api_completions(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    generate(s, rq, out, OAI_COMPLETION);
}

void api_chat(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    generate(s, rq, out, OAI_CHAT);
}

void api_responses(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    generate(s, rq, out, OAI_RESPONSES);
}
