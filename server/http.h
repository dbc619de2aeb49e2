/* http: the libmicrohttpd glue. One daemon with its own threads (one per connection): it
 * collects each request body under --max-body, checks the API key, routes to the handlers in
 * api.c, turns their struct http_resp into MHD responses (a streamed one through a content
 * reader), and writes one log line per request when it completes. No MHD type leaves this
 * file. */
#ifndef QUERN_HTTP_H
#define QUERN_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "metrics.h"
#include "serve.h"

/* What a request did, for its log line and the metrics; handlers fill it. */
struct req_log {
    char id[24]; /* 16 hex digits, also the X-Request-Id */
    int status;
    int prompt_tokens, completion_tokens, cached_tokens;
    double ttft_ms;     /* the first choice's, < 0 when none */
    const char *finish; /* the first choice's finish reason, NULL when none */
    bool has_error;
    enum metrics_error error;
    bool disconnected; /* the client went away before the answer was complete */
    char ignored[128]; /* the request's members the endpoint ignored (oai_request.ignored) */
};

struct http_req {
    const char *method, *path;
    const char *body;
    size_t body_len;
    int fd; /* the client's socket: api.c polls it to notice a disconnect while waiting */
    struct req_log *log;
};

/* A streamed body: read fills buf with up to max bytes and returns the count (> 0), 0 at the
 * end, or -1 to drop the connection (the client is gone). free runs once, whatever happened,
 * possibly on another thread; after it the stream must not touch the req_log. */
struct http_stream_ops {
    long (*read)(void *ctx, char *buf, size_t max);
    void (*free)(void *ctx);
};

struct http_resp {
    int status; /* 0: close the connection without answering */
    const char *content_type;
    char *body; /* owned (malloc'd) */
    size_t body_len;
    int retry_after;                      /* > 0: a Retry-After header */
    const char *allow;                    /* 405: the Allow header */
    const char *csp;                      /* a Content-Security-Policy header (the page) */
    const struct http_stream_ops *stream; /* non-NULL: stream instead of body */
    void *stream_ctx;
};

struct http_server;

/* Binds host:port and starts serving s. */
int http_start(struct serve *s, struct http_server **out, struct qerr *err);
int http_port(const struct http_server *h); /* the bound port */
/* Stops the daemon, closing every connection and joining its threads. */
void http_stop(struct http_server *h);

#endif
