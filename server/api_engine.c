/* api_engine: GET /v1/engine/state, the engine's live picture (engine/engine_state.h) as JSON
 * for the web page's engine view. The picture is copied from what the engine thread last
 * published: a scrape never waits on, or stops, a step.
 *
 * {"object": "engine.state", "version", "age_s" (since publication), "running", "waiting",
 *  "requests": [{"id", "state": waiting|prefill|decode|preempted, "paused", "prompt_tokens",
 *               "computed_tokens", "generated_tokens", "max_tokens", "cached_tokens",
 *               "blocks", "priority", "age_s"}], running first (each list in the engine's
 *               order: priority, then age), at most ENGINE_STATE_MAX_REQS
 *  "kv": {"blocks", "block_size", "used", "cached_free", "peak", "blocks_per_cell",
 *         "cells": "0120..." (a digit per cell: 0 free, 1 cached prefix, 2 in use)},
 *  "steps": [{"step", "prefill", "decode", "seqs", "ms"}],   oldest first
 *  "history": {"seconds", "generated": [tokens/s], "prompt": [tokens/s],
 *              "ttft_ms": [mean or null]},   oldest first, the last one is the current second
 *  "prefix_cache": {"lookup_tokens", "hit_tokens", "hit_rate"}, "preemptions", "steps_total",
 *  "generation_tokens", "prompt_tokens", "finished": {reason: count},
 *  "cost": {"steps", "step_ns_avg", "step_ns_max", "publish_ns_max"}} */
#include <math.h>
#include <stdlib.h>

#include "../engine/engine_state.h"
#include "api.h"

static int write_requests(struct sbuf *b, const struct engine_state *st)
{
    int rc = sbuf_puts(b, "\"requests\":[");
    for (int i = 0; i < st->n_reqs && !rc; i++) {
        const struct engine_req_view *r = &st->reqs[i];
        rc = sbuf_printf(b,
                         "%s{\"id\":%llu,\"state\":\"%s\",\"paused\":%s,\"prompt_tokens\":%d,"
                         "\"computed_tokens\":%d,\"generated_tokens\":%d,\"max_tokens\":%d,"
                         "\"cached_tokens\":%d,\"blocks\":%d,\"priority\":%d,\"age_s\":%.2f}",
                         i ? "," : "", (unsigned long long)r->id,
                         engine_req_phase_name((enum engine_req_phase)r->phase),
                         r->paused ? "true" : "false", r->prompt_tokens, r->computed_tokens,
                         r->generated_tokens, r->max_tokens, r->cached_tokens, r->blocks,
                         r->priority, (double)r->age_s);
    }
    return rc ? rc : sbuf_puts(b, "],");
}

static int write_kv(struct sbuf *b, const struct engine_state *st)
{
    int rc = sbuf_printf(b,
                         "\"kv\":{\"blocks\":%d,\"block_size\":%d,\"used\":%d,\"cached_free\":%d,"
                         "\"peak\":%d,\"blocks_per_cell\":%d,\"cells\":\"",
                         st->kv_blocks, st->stats.kv_block_size, st->kv_used, st->kv_cached_free,
                         st->stats.kv_blocks_peak, st->blocks_per_cell);
    char cells[ENGINE_STATE_MAX_CELLS];
    for (int c = 0; c < st->n_cells; c++) cells[c] = (char)('0' + st->cells[c]);
    if (!rc) rc = sbuf_append(b, cells, (size_t)st->n_cells);
    return rc ? rc : sbuf_puts(b, "\"},");
}

static int write_steps(struct sbuf *b, const struct engine_state *st)
{
    int rc = sbuf_puts(b, "\"steps\":[");
    for (int i = 0; i < st->n_steps && !rc; i++) {
        const struct engine_step_view *s = &st->steps[i];
        rc =
            sbuf_printf(b, "%s{\"step\":%llu,\"prefill\":%d,\"decode\":%d,\"seqs\":%d,\"ms\":%.3f}",
                        i ? "," : "", (unsigned long long)s->step, s->prefill_tokens,
                        s->decode_tokens, s->seqs, (double)s->ms);
    }
    return rc ? rc : sbuf_puts(b, "],");
}

/* The history as of the reader's second: slots not written in the last ENGINE_STATE_HISTORY
 * seconds (the engine was idle then) are zeros. */
static int write_history(struct sbuf *b, const struct engine_state *st)
{
    int64_t now = (int64_t)floor(st->read_now);
    const int n = ENGINE_STATE_HISTORY;
    int rc = sbuf_printf(b, "\"history\":{\"seconds\":%d", n);
    static const char *const names[3] = {"generated", "prompt", "ttft_ms"};
    for (int k = 0; k < 3 && !rc; k++) {
        rc = sbuf_printf(b, ",\"%s\":[", names[k]);
        for (int i = 0; i < n && !rc; i++) {
            int64_t t = now - (n - 1) + i;
            const struct engine_second *h = &st->history[((t % n) + n) % n];
            bool fresh = h->t == t;
            const char *sep = i ? "," : "";
            if (k == 0)
                rc = sbuf_printf(b, "%s%u", sep, fresh ? h->generated : 0);
            else if (k == 1)
                rc = sbuf_printf(b, "%s%u", sep, fresh ? h->prompt : 0);
            else if (fresh && h->ttft_n)
                rc = sbuf_printf(b, "%s%.1f", sep, (double)h->ttft_sum_ms / h->ttft_n);
            else
                rc = sbuf_printf(b, "%snull", sep);
        }
        if (!rc) rc = sbuf_puts(b, "]");
    }
    return rc ? rc : sbuf_puts(b, "},");
}

static int write_counters(struct sbuf *b, const struct engine_state *st)
{
    const struct engine_stats *s = &st->stats;
    double rate = s->prefix_lookups ? (double)s->prefix_hit_tokens / (double)s->prefix_lookups : 0;
    int rc = sbuf_printf(
        b,
        "\"prefix_cache\":{\"lookup_tokens\":%llu,\"hit_tokens\":%llu,\"hit_rate\":%.4f},"
        "\"preemptions\":%llu,\"steps_total\":%llu,\"generation_tokens\":%llu,"
        "\"prompt_tokens\":%llu,\"finished\":{",
        (unsigned long long)s->prefix_lookups, (unsigned long long)s->prefix_hit_tokens, rate,
        (unsigned long long)s->preemptions, (unsigned long long)s->steps,
        (unsigned long long)s->generation_tokens, (unsigned long long)s->prompt_tokens);
    for (int i = 1; i < 5 && !rc; i++)
        rc = sbuf_printf(b, "%s\"%s\":%llu", i > 1 ? "," : "",
                         finish_reason_name((enum finish_reason)i),
                         (unsigned long long)s->finished[i]);
    if (!rc)
        rc = sbuf_printf(b,
                         "},\"cost\":{\"steps\":%llu,\"step_ns_avg\":%.0f,\"step_ns_max\":%.0f,"
                         "\"publish_ns_max\":%.0f}}",
                         (unsigned long long)st->cost_steps, st->step_cost_ns_avg,
                         st->step_cost_ns_max, st->publish_ns_max);
    return rc;
}

void api_engine_state(struct serve *s, const struct http_req *rq, struct http_resp *out)
{
    struct oai_error e = {0};
    struct engine_state *st = malloc(sizeof *st);
    if (!st) {
        oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        api_error(&e, rq->log, out);
        return;
    }
    if (!serve_engine_state(s, st)) {
        free(st);
        oai_error_set(&e, 503, "server_error", "not_ready", NULL,
                      "the engine is not running (loading or stopped)");
        api_error(&e, rq->log, out);
        return;
    }
    struct sbuf b = {0};
    int rc = sbuf_printf(&b,
                         "{\"object\":\"engine.state\",\"version\":%llu,\"age_s\":%.3f,"
                         "\"running\":%d,\"waiting\":%d,",
                         (unsigned long long)st->version, st->read_now - st->now, st->n_running,
                         st->n_waiting);
    if (!rc) rc = write_requests(&b, st);
    if (!rc) rc = write_kv(&b, st);
    if (!rc) rc = write_steps(&b, st);
    if (!rc) rc = write_history(&b, st);
    if (!rc) rc = write_counters(&b, st);
    free(st);
    if (rc) {
        sbuf_free(&b);
        oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        api_error(&e, rq->log, out);
        return;
    }
    out->status = 200;
    out->content_type = "application/json";
    out->body_len = b.len;
    out->body = sbuf_take(&b);
}
