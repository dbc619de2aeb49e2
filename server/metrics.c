#include "metrics.h"

#include <stdio.h>
#include <string.h>

/* Latency buckets (seconds), close to vLLM's so dashboards carry over. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
                                     0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
static const double tpot_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                     0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
static const double e2e_bounds[] = {0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,  1.5,  2.0,  2.5,
                                    5.0,  10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0};
static const double queue_bounds[] = {0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                      0.5,    1.0,   2.5,   5.0,  10.0,  20.0, 40.0, 60.0};

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))
_Static_assert(COUNT(ttft_bounds) <= METRICS_MAX_BUCKETS, "ttft buckets");
_Static_assert(COUNT(tpot_bounds) <= METRICS_MAX_BUCKETS, "tpot buckets");
_Static_assert(COUNT(e2e_bounds) <= METRICS_MAX_BUCKETS, "e2e buckets");
_Static_assert(COUNT(queue_bounds) <= METRICS_MAX_BUCKETS, "queue buckets");

static const int status_codes[METRICS_N_STATUS] = {200, 400, 401, 404, 405, 408,
                                                   413, 429, 500, 503, 499};

static const char *const error_names[METRICS_ERR_COUNT] = {
    [METRICS_ERR_BAD_REQUEST] = "bad_request",   [METRICS_ERR_CONTEXT] = "context_length",
    [METRICS_ERR_AUTH] = "unauthorized",         [METRICS_ERR_NOT_FOUND] = "not_found",
    [METRICS_ERR_METHOD] = "method_not_allowed", [METRICS_ERR_TOO_LARGE] = "body_too_large",
    [METRICS_ERR_QUEUE_FULL] = "queue_full",     [METRICS_ERR_UNAVAILABLE] = "unavailable",
    [METRICS_ERR_INTERNAL] = "internal",         [METRICS_ERR_DISCONNECT] = "client_disconnect",
    [METRICS_ERR_TIMEOUT] = "request_timeout",
};

const char *metrics_error_name(enum metrics_error r)
{
    return (unsigned)r < METRICS_ERR_COUNT ? error_names[r] : "unknown";
}

int metrics_init(struct metrics *m)
{
    *m = (struct metrics){0};
    if (pthread_mutex_init(&m->mu, NULL)) return QERR_NOMEM;
    m->ttft = (struct histogram){.bounds = ttft_bounds, .n_bounds = COUNT(ttft_bounds)};
    m->tpot = (struct histogram){.bounds = tpot_bounds, .n_bounds = COUNT(tpot_bounds)};
    m->e2e = (struct histogram){.bounds = e2e_bounds, .n_bounds = COUNT(e2e_bounds)};
    m->queue = (struct histogram){.bounds = queue_bounds, .n_bounds = COUNT(queue_bounds)};
    return 0;
}

void metrics_free(struct metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void histogram_observe(struct histogram *h, double v)
{
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void metrics_observe_request(struct metrics *m, const struct req_event *f)
{
    pthread_mutex_lock(&m->mu);
    if ((unsigned)f->finish < 5) m->finished[f->finish]++;
    m->prompt_tokens += (uint64_t)(f->prompt_tokens > 0 ? f->prompt_tokens : 0);
    m->completion_tokens += (uint64_t)(f->completion_tokens > 0 ? f->completion_tokens : 0);
    m->cached_tokens += (uint64_t)(f->cached_tokens > 0 ? f->cached_tokens : 0);
    if (f->completion_tokens > 0) histogram_observe(&m->ttft, f->ttft_ms / 1000.0);
    if (f->completion_tokens > 1)
        histogram_observe(&m->tpot,
                          (f->total_ms - f->ttft_ms) / 1000.0 / (f->completion_tokens - 1));
    histogram_observe(&m->e2e, f->total_ms / 1000.0);
    histogram_observe(&m->queue, f->queue_ms / 1000.0);
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_finish(struct metrics *m, enum finish_reason f)
{
    if ((unsigned)f >= 5) return;
    pthread_mutex_lock(&m->mu);
    m->finished[f]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_error(struct metrics *m, enum metrics_error r)
{
    if ((unsigned)r >= METRICS_ERR_COUNT) return;
    pthread_mutex_lock(&m->mu);
    m->errors[r]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_status(struct metrics *m, int status)
{
    int i = 0;
    while (i < METRICS_N_STATUS && status_codes[i] != status) i++;
    pthread_mutex_lock(&m->mu);
    m->status[i]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_conn_close(struct metrics *m, enum metrics_conn_close why)
{
    if ((unsigned)why >= METRICS_CONN_COUNT) return;
    pthread_mutex_lock(&m->mu);
    m->conns_closed[why]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_set_conns_open(struct metrics *m, int open)
{
    pthread_mutex_lock(&m->mu);
    m->conns_open = open;
    pthread_mutex_unlock(&m->mu);
}

static const char *const conn_close_names[METRICS_CONN_COUNT] = {
    [METRICS_CONN_REFUSED] = "refused",
    [METRICS_CONN_EVICTED] = "evicted_idle",
    [METRICS_CONN_TIMED_OUT] = "request_timeout",
    [METRICS_CONN_MALFORMED] = "malformed",
};

static int head(struct sbuf *o, const char *name, const char *type, const char *help)
{
    return sbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static int gauge(struct sbuf *o, const char *name, const char *help, double v)
{
    int rc = head(o, name, "gauge", help);
    return rc ? rc : sbuf_printf(o, "%s %.17g\n", name, v);
}

static int counter(struct sbuf *o, const char *name, const char *help, uint64_t v)
{
    int rc = head(o, name, "counter", help);
    return rc ? rc : sbuf_printf(o, "%s %llu\n", name, (unsigned long long)v);
}

static int hist(struct sbuf *o, const char *name, const char *help, const struct histogram *h)
{
    int rc = head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n_bounds && !rc; i++) {
        cum += h->counts[i];
        if (i < h->n_bounds)
            rc = sbuf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i],
                             (unsigned long long)cum);
        else
            rc = sbuf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    if (!rc) rc = sbuf_printf(o, "%s_sum %.17g\n", name, h->sum);
    if (!rc) rc = sbuf_printf(o, "%s_count %llu\n", name, (unsigned long long)h->count);
    return rc;
}

/* Speculative decoding, as vLLM counts it (drafts, draft tokens, accepted tokens), and how many
 * tokens each draft had accepted as a histogram (mean acceptance length = 1 + sum / count). */
static int render_spec(const struct engine_stats *s, struct sbuf *o)
{
    int rc = counter(o, "quern_spec_decode_num_drafts_total", "Speculative drafts verified.",
                     s->spec_drafts);
    rc = rc ? rc
            : counter(o, "quern_spec_decode_num_draft_tokens_total", "Tokens drafted.",
                      s->spec_draft_tokens);
    rc = rc ? rc
            : counter(o, "quern_spec_decode_num_accepted_tokens_total",
                      "Drafted tokens accepted (output tokens the draft had right).",
                      s->spec_accepted_tokens);
    rc = rc ? rc
            : counter(o, "quern_spec_decode_draft_model_errors_total",
                      "Steps whose draft model failed (they verified no drafts).",
                      s->spec_draft_errors);
    rc = rc ? rc
            : counter(o, "quern_spec_decode_grammar_draft_tokens_total",
                      "Tokens drafted because a grammar forced their bytes (of the drafted).",
                      s->spec_grammar_draft_tokens);
    rc = rc ? rc
            : counter(o, "quern_spec_decode_grammar_accepted_tokens_total",
                      "Of those, tokens accepted.", s->spec_grammar_accepted_tokens);
    rc = rc ? rc
            : counter(o, "quern_spec_decode_history_draft_tokens_total",
                      "Tokens drafted from earlier requests' answers (of the drafted).",
                      s->spec_history_draft_tokens);
    rc = rc ? rc
            : counter(o, "quern_spec_decode_history_accepted_tokens_total",
                      "Of those, tokens accepted.", s->spec_history_accepted_tokens);
    rc = rc ? rc
            : head(o, "quern_spec_decode_accepted_tokens_per_draft", "histogram",
                   "Drafted tokens accepted, per draft.");
    uint64_t cum = 0;
    for (int k = 0; k <= SPEC_K_MAX && !rc; k++) {
        cum += s->spec_accepted_hist[k];
        rc = sbuf_printf(o, "quern_spec_decode_accepted_tokens_per_draft_bucket{le=\"%d\"} %llu\n",
                         k, (unsigned long long)cum);
    }
    rc = rc ? rc
            : sbuf_printf(o,
                          "quern_spec_decode_accepted_tokens_per_draft_bucket{le=\"+Inf\"} %llu\n"
                          "quern_spec_decode_accepted_tokens_per_draft_sum %llu\n"
                          "quern_spec_decode_accepted_tokens_per_draft_count %llu\n",
                          (unsigned long long)cum, (unsigned long long)s->spec_accepted_tokens,
                          (unsigned long long)s->spec_drafts);
    return rc;
}

static int render_engine(const struct engine_stats *s, struct sbuf *o)
{
    int rc = 0;
    rc = rc ? rc : gauge(o, "quern_requests_running", "Requests in the running batch.", s->running);
    rc = rc ? rc
            : gauge(o, "quern_requests_waiting", "Requests waiting to be admitted.", s->waiting);
    rc = rc ? rc : gauge(o, "quern_kv_blocks_used", "KV cache blocks in use.", s->kv_blocks_used);
    rc = rc ? rc
            : gauge(o, "quern_kv_blocks_total", "KV cache blocks in the pool.", s->kv_blocks_total);
    rc = rc ? rc
            : gauge(o, "quern_kv_blocks_peak", "Most KV cache blocks ever in use at once.",
                    s->kv_blocks_peak);
    rc = rc ? rc
            : gauge(o, "quern_kv_cache_usage_ratio", "Fraction of KV cache blocks in use.",
                    s->kv_blocks_total ? (double)s->kv_blocks_used / s->kv_blocks_total : 0);
    /* the KV cache's shape, as labels: what vLLM's cache_config_info carries and the Gateway API
     * Inference Extension's endpoint picker reads (--cache-info-metric) */
    rc = rc ? rc
            : sbuf_printf(o,
                          "# HELP quern_cache_config_info The KV cache: tokens per block and "
                          "blocks in the pool.\n# TYPE quern_cache_config_info gauge\n"
                          "quern_cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\"} 1\n",
                          s->kv_block_size, s->kv_blocks_total);
    rc = rc ? rc
            : counter(o, "quern_prefix_cache_queries_total", "Prefix cache lookups.",
                      s->prefix_lookups);
    rc = rc ? rc
            : counter(o, "quern_prefix_cache_hit_tokens_total",
                      "Prompt tokens served from the prefix cache.", s->prefix_hit_tokens);
    rc = rc ? rc
            : counter(o, "quern_preemptions_total", "Sequences preempted for lack of KV blocks.",
                      s->preemptions);
    rc = rc ? rc
            : counter(o, "quern_prompt_tokens_total", "Prompt tokens prefilled.", s->prompt_tokens);
    rc =
        rc ? rc
           : counter(o, "quern_generation_tokens_total", "Tokens generated.", s->generation_tokens);
    rc = rc ? rc : counter(o, "quern_engine_steps_total", "Engine steps run.", s->steps);
    rc = rc ? rc
            : counter(o, "quern_grammar_masks_total",
                      "Token masks computed for structured outputs.", s->grammar_masks);
    rc = rc ? rc
            : head(o, "quern_grammar_mask_seconds_total", "counter",
                   "Engine time spent computing and applying them.");
    rc = rc ? rc : sbuf_printf(o, "quern_grammar_mask_seconds_total %.17g\n", s->grammar_mask_s);
    rc = rc ? rc
            : head(o, "quern_grammar_mask_ahead_seconds_total", "counter",
                   "Of which computing masks while the forward ran (--mask-mode).");
    rc = rc ? rc
            : sbuf_printf(o, "quern_grammar_mask_ahead_seconds_total %.17g\n",
                          s->grammar_mask_ahead_s);
    rc = rc ? rc
            : head(o, "quern_grammar_mask_wait_seconds_total", "counter",
                   "Engine time waiting after the forward for the mask thread.");
    rc = rc ? rc
            : sbuf_printf(o, "quern_grammar_mask_wait_seconds_total %.17g\n",
                          s->grammar_mask_wait_s);
    rc = rc ? rc : render_spec(s, o);
    rc = rc ? rc
            : gauge(o, "quern_requests_paused",
                    "Requests waiting for their client to read (back-pressure).", s->paused);
    rc = rc ? rc
            : counter(o, "quern_requests_stalled_total",
                      "Requests aborted because their client stopped reading.", s->stalled);
    rc = rc ? rc
            : gauge(o, "quern_engine_last_step_age_seconds",
                    "Seconds since the engine finished a step while it had work.",
                    s->last_step_age_s);
    rc = rc ? rc
            : head(o, "quern_engine_requests_finished_total", "counter",
                   "Requests the engine finished, by finish reason.");
    for (int i = 1; i < 5 && !rc; i++)
        rc = sbuf_printf(o, "quern_engine_requests_finished_total{finished_reason=\"%s\"} %llu\n",
                         finish_reason_name((enum finish_reason)i),
                         (unsigned long long)s->finished[i]);
    return rc;
}

int metrics_render_lora(const struct engine_stats *s, const char *const *names, int n,
                        struct sbuf *out)
{
    static const char *const what[3] = {"running", "waiting", "finished"};
    static const char *const help[3] = {
        "Requests in the running batch, by LoRA adapter.",
        "Requests waiting to be admitted, by LoRA adapter.",
        "Requests the engine finished, by LoRA adapter.",
    };
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        char name[64];
        snprintf(name, sizeof name,
                 k < 2 ? "quern_lora_requests_%s" : "quern_lora_requests_%s_total", what[k]);
        rc = head(out, name, k < 2 ? "gauge" : "counter", help[k]);
        for (int i = 0; i < n && i < ENGINE_MAX_LORAS && !rc; i++) {
            if (!names[i]) continue; /* a free slot */
            unsigned long long v = k == 0   ? (unsigned long long)s->lora_running[i]
                                   : k == 1 ? (unsigned long long)s->lora_waiting[i]
                                            : (unsigned long long)s->lora_finished[i];
            rc = sbuf_printf(out, "%s{lora_name=\"%s\"} %llu\n", name, names[i], v);
        }
    }
    return rc;
}

int metrics_render(struct metrics *m, const struct engine_stats *s, int state, struct sbuf *out)
{
    pthread_mutex_lock(&m->mu);
    struct metrics c = *m; /* a consistent snapshot; the copy's mutex is never used */
    pthread_mutex_unlock(&m->mu);

    int rc = head(out, "quern_server_state", "gauge", "0 loading, 1 ready, 2 draining.");
    if (!rc) rc = sbuf_printf(out, "quern_server_state %d\n", state);
    if (!rc && s) rc = render_engine(s, out);
    if (!rc)
        rc = head(out, "quern_request_success_total", "counter",
                  "Generation requests that ran to their end, by finish reason (one per choice).");
    for (int i = FINISH_STOP; i <= FINISH_LENGTH && !rc; i++)
        rc = sbuf_printf(out, "quern_request_success_total{finished_reason=\"%s\"} %llu\n",
                         finish_reason_name((enum finish_reason)i),
                         (unsigned long long)c.finished[i]);
    if (!rc)
        rc = head(out, "quern_request_failure_total", "counter",
                  "Generation requests cut short: aborted (client gone, stalled, shutdown) or "
                  "failed by the engine (one per choice).");
    for (int i = FINISH_ABORT; i <= FINISH_ERROR && !rc; i++)
        rc = sbuf_printf(out, "quern_request_failure_total{finished_reason=\"%s\"} %llu\n",
                         finish_reason_name((enum finish_reason)i),
                         (unsigned long long)c.finished[i]);
    if (!rc) rc = gauge(out, "quern_http_connections_open", "HTTP connections open.", c.conns_open);
    if (!rc)
        rc = head(out, "quern_http_connections_closed_total", "counter",
                  "Connections the server closed itself, by reason.");
    for (int i = 0; i < METRICS_CONN_COUNT && !rc; i++)
        rc = sbuf_printf(out, "quern_http_connections_closed_total{reason=\"%s\"} %llu\n",
                         conn_close_names[i], (unsigned long long)c.conns_closed[i]);
    if (!rc)
        rc = head(out, "quern_request_errors_total", "counter",
                  "HTTP requests refused or failed, by reason.");
    for (int i = 0; i < METRICS_ERR_COUNT && !rc; i++)
        rc = sbuf_printf(out, "quern_request_errors_total{reason=\"%s\"} %llu\n", error_names[i],
                         (unsigned long long)c.errors[i]);
    if (!rc) rc = head(out, "quern_http_responses_total", "counter", "HTTP responses by status.");
    for (int i = 0; i <= METRICS_N_STATUS && !rc; i++) {
        if (i < METRICS_N_STATUS)
            rc = sbuf_printf(out, "quern_http_responses_total{code=\"%d\"} %llu\n", status_codes[i],
                             (unsigned long long)c.status[i]);
        else
            rc = sbuf_printf(out, "quern_http_responses_total{code=\"other\"} %llu\n",
                             (unsigned long long)c.status[i]);
    }
    if (!rc)
        rc = counter(out, "quern_request_prompt_tokens_total",
                     "Prompt tokens of finished requests.", c.prompt_tokens);
    if (!rc)
        rc = counter(out, "quern_request_generation_tokens_total",
                     "Tokens generated for finished requests.", c.completion_tokens);
    if (!rc)
        rc = counter(out, "quern_request_cached_tokens_total",
                     "Prompt tokens of finished requests served from the prefix cache.",
                     c.cached_tokens);
    if (!rc) rc = hist(out, "quern_time_to_first_token_seconds", "Time to first token.", &c.ttft);
    if (!rc)
        rc = hist(out, "quern_time_per_output_token_seconds",
                  "Time per output token after the first.", &c.tpot);
    if (!rc)
        rc = hist(out, "quern_e2e_request_latency_seconds", "End-to-end request latency.", &c.e2e);
    if (!rc)
        rc = hist(out, "quern_request_queue_time_seconds", "Time waiting before admission.",
                  &c.queue);
    return rc;
}
