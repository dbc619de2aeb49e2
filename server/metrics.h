/* metrics: the server's own counters and latency histograms, and the Prometheus text
 * exposition (format 0.0.4) of them together with the engine's statistics.
 *
 * HTTP threads record into one struct metrics (a mutex guards it; every update is a few adds);
 * GET /metrics renders a snapshot. Histograms are cumulative, with fixed upper bounds in
 * seconds, as Prometheus expects. */
#ifndef QUERN_METRICS_H
#define QUERN_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "sbuf.h"

#define METRICS_MAX_BUCKETS 20

struct histogram {
    const double *bounds; /* [n_bounds] ascending upper bounds; +Inf is implicit */
    int n_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket, not cumulative */
    double sum;
    uint64_t count;
};

/* Why a request was refused or failed (the reason label of quern_request_errors_total). */
enum metrics_error {
    METRICS_ERR_BAD_REQUEST, /* 400: malformed JSON, a bad field */
    METRICS_ERR_CONTEXT,     /* 400: prompt + max_tokens over the context */
    METRICS_ERR_AUTH,        /* 401 */
    METRICS_ERR_NOT_FOUND,   /* 404 */
    METRICS_ERR_METHOD,      /* 405 */
    METRICS_ERR_TOO_LARGE,   /* 413 */
    METRICS_ERR_QUEUE_FULL,  /* 429 */
    METRICS_ERR_UNAVAILABLE, /* 503: loading or draining */
    METRICS_ERR_INTERNAL,    /* 500 */
    METRICS_ERR_DISCONNECT,  /* the client went away before the answer was complete */
    METRICS_ERR_TIMEOUT,     /* 408: the request did not arrive within --request-timeout */
    METRICS_ERR_COUNT,
};

const char *metrics_error_name(enum metrics_error r);

/* The HTTP statuses counted by code; anything else counts as "other". */
#define METRICS_N_STATUS 11

/* Why the server closed a connection itself (quern_http_connections_closed_total). */
enum metrics_conn_close {
    METRICS_CONN_REFUSED,   /* at --max-connections (or per client) with no idle one to evict */
    METRICS_CONN_EVICTED,   /* idle, closed to make room for a new connection */
    METRICS_CONN_TIMED_OUT, /* its request head and body took over --request-timeout */
    METRICS_CONN_MALFORMED, /* NUL bytes or a bad HTTP version in the request head */
    METRICS_CONN_COUNT,
};

struct metrics {
    pthread_mutex_t mu;
    int conns_open; /* HTTP connections open now */
    uint64_t conns_closed[METRICS_CONN_COUNT];
    uint64_t finished[5]; /* engine requests by enum finish_reason, as the server saw them */
    uint64_t errors[METRICS_ERR_COUNT];
    uint64_t status[METRICS_N_STATUS + 1];
    uint64_t prompt_tokens, completion_tokens, cached_tokens;
    struct histogram ttft, tpot, e2e, queue;
};

int metrics_init(struct metrics *m);
void metrics_free(struct metrics *m);

void histogram_observe(struct histogram *h, double v);

/* Records one finished engine request from its final event. */
void metrics_observe_request(struct metrics *m, const struct req_event *final);
/* Counts a request that finished without its final event being seen (a client gone). */
void metrics_count_finish(struct metrics *m, enum finish_reason f);
void metrics_count_error(struct metrics *m, enum metrics_error r);
void metrics_count_status(struct metrics *m, int status);
void metrics_count_conn_close(struct metrics *m, enum metrics_conn_close why);
void metrics_set_conns_open(struct metrics *m, int open);

/* Appends the exposition of m and, when s is non-NULL, of the engine's statistics; state is
 * 0 loading, 1 ready, 2 draining (quern_server_state). 0 or QERR_NOMEM. */
int metrics_render(struct metrics *m, const struct engine_stats *s, int state, struct sbuf *out);
/* Appends the per-adapter gauges and counter (engine_stats.lora_*, by slot) for the LoRA
 * adapters of slots 0..n-1 named names[slot] (NULL: a free slot; letters, digits and "-_." only,
 * so they need no escaping). */
int metrics_render_lora(const struct engine_stats *s, const char *const *names, int n,
                        struct sbuf *out);

#endif
