/* http: libmicrohttpd glue and routing (see http.h).
 *
 * DESIGN. MHD runs an internal listening thread and one thread per connection, so a handler may
 * block (waiting for tokens) without stalling anyone else. A connection's request goes through
 * on_request several times: first with the headers (we allocate the per-request struct conn,
 * route, check the API key and Content-Length and may answer at once: 404, 405, 401, 413), then
 * once per piece of body (collected under --max-body; past it the rest is read and dropped), and
 * finally with no data, when the handler runs. on_completed fires once per request whatever
 * happened: it writes the log line, counts the status and frees the conn. A streamed response's
 * context is freed by MHD through the response's free callback, after the last read. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api.h"

struct http_server {
    struct serve *s;
    struct MHD_Daemon *d;
    int port;
};

struct route {
    const char *path;
    const char *method; /* GET also answers HEAD */
    bool auth;          /* needs the API key when one is set */
    api_handler fn;
};

static const struct route routes[] = {
    {"/v1/completions", "POST", true, api_completions},
    {"/v1/chat/completions", "POST", true, api_chat},
    {"/v1/models", "GET", true, api_models},
    {"/tokenize", "POST", true, api_tokenize},
    {"/detokenize", "POST", true, api_detokenize},
    {"/health", "GET", false, api_health},
    {"/metrics", "GET", false, api_metrics},
};

/* One HTTP request (MHD's con_cls). */
struct conn {
    const struct route *route;
    struct sbuf body;
    size_t dropped; /* body bytes past --max-body, read and thrown away */
    bool answered;  /* a response is queued */
    struct timespec t0;
    char method[8];
    char path[96]; /* printable copy for the log */
    struct req_log log;
};

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) * 1e-6;
}

/* Constant-time in the key's content: every byte of the expected key is compared. */
static bool key_ok(const char *key, const char *header)
{
    static const char bearer[] = "Bearer ";
    if (!header || strncmp(header, bearer, sizeof bearer - 1) != 0) return false;
    const char *given = header + sizeof bearer - 1;
    size_t glen = strlen(given), klen = strlen(key);
    volatile unsigned char diff = glen != klen;
    for (size_t i = 0; i < klen; i++) {
        size_t j = i < glen ? i : 0;
        diff |= (unsigned char)(key[i] ^ (glen ? given[j] : 0));
    }
    return diff == 0;
}

static void copy_printable(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c >= 0x21 && c < 0x7f && c != '"' && c != '\\' ? (char)c : '?';
    }
    dst[i] = '\0';
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    void **pair = cls; /* [0]: ops, [1]: ctx */
    const struct http_stream_ops *ops = pair[0];
    long n = ops->read(pair[1], buf, max);
    if (n > 0) return (ssize_t)n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls)
{
    void **pair = cls;
    const struct http_stream_ops *ops = pair[0];
    ops->free(pair[1]);
    free(pair);
}

static void fill_error(struct http_resp *out, struct req_log *log, int status, const char *type,
                       const char *code, const char *msg)
{
    struct oai_error e = {0};
    oai_error_set(&e, status, type, code, NULL, "%s", msg);
    api_error(&e, log, out);
}

static enum MHD_Result queue(struct serve *s, struct MHD_Connection *mc, struct conn *c,
                             struct http_resp *r)
{
    c->answered = true;
    c->log.status = r->status;
    if (r->status == 0) {
        free(r->body);
        return MHD_NO; /* close without answering */
    }
    struct MHD_Response *resp;
    if (r->stream) {
        void **pair = malloc(2 * sizeof *pair);
        if (!pair) {
            r->stream->free(r->stream_ctx);
            return MHD_NO;
        }
        pair[0] = (void *)r->stream;
        pair[1] = r->stream_ctx;
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, pair,
                                                 stream_free);
        if (!resp) {
            stream_free(pair);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else {
        resp = MHD_create_response_from_buffer(r->body_len, r->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(r->body);
            return MHD_NO;
        }
    }
    if (r->content_type) MHD_add_response_header(resp, "Content-Type", r->content_type);
    if (r->retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", r->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (r->allow) MHD_add_response_header(resp, "Allow", r->allow);
    if (r->status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    MHD_add_response_header(resp, "X-Request-Id", c->log.id);
    if (atomic_load(&s->state) == SERVE_DRAINING)
        MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(mc, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* Routing, auth and size checks on the headers; true when it answered. */
static bool early_answer(struct serve *s, struct MHD_Connection *mc, struct conn *c,
                         const char *url, const char *method, enum MHD_Result *ret)
{
    struct http_resp r = {0};
    const struct route *path_match = NULL;
    bool head = !strcmp(method, "HEAD");
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path) != 0) continue;
        path_match = &routes[i];
        if (!strcmp(method, routes[i].method) || (head && !strcmp(routes[i].method, "GET")))
            c->route = &routes[i];
    }
    char msg[192];
    if (!path_match) {
        snprintf(msg, sizeof msg, "no route for %s %s", c->method, c->path);
        fill_error(&r, &c->log, 404, "invalid_request_error", "not_found", msg);
    } else if (!c->route) {
        snprintf(msg, sizeof msg, "%s %s is not allowed; use %s", c->method, c->path,
                 path_match->method);
        fill_error(&r, &c->log, 405, "invalid_request_error", "method_not_allowed", msg);
        r.allow = path_match->method;
    } else if (c->route->auth && s->o->api_key &&
               !key_ok(s->o->api_key,
                       MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization"))) {
        fill_error(&r, &c->log, 401, "authentication_error", "invalid_api_key",
                   "missing or incorrect API key (send 'Authorization: Bearer KEY')");
    } else {
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
        if (len <= s->o->max_body) return false;
        /* a body up to 16x the limit is read and dropped, so the client (still sending) sees
         * the 413; past that the connection is closed after it */
        if (len <= 16ull * s->o->max_body) {
            c->dropped = 1;
            return false;
        }
        snprintf(msg, sizeof msg, "the request body (%llu bytes) is over the limit of %zu bytes",
                 len, s->o->max_body);
        fill_error(&r, &c->log, 413, "invalid_request_error", "request_too_large", msg);
    }
    *ret = queue(s, mc, c, &r);
    return true;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    struct serve *s = cls;
    struct conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        *con_cls = c;
        clock_gettime(CLOCK_MONOTONIC, &c->t0);
        c->log.ttft_ms = -1;
        unsigned char rnd[8] = {0};
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            uint64_t t = (uint64_t)c->t0.tv_nsec ^ (uint64_t)(uintptr_t)c;
            memcpy(rnd, &t, sizeof rnd);
        }
        for (int i = 0; i < 8; i++) snprintf(c->log.id + 2 * i, 3, "%02x", rnd[i]);
        copy_printable(c->method, sizeof c->method, method);
        copy_printable(c->path, sizeof c->path, url);
        enum MHD_Result ret;
        if (early_answer(s, mc, c, url, method, &ret)) return ret;
        return MHD_YES;
    }
    if (c->answered) {
        *upload_data_size = 0; /* an early answer: drop the body */
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (c->dropped || c->body.len + n > s->o->max_body) {
            c->dropped += n;
            /* a chunked body far over the limit: stop reading it at all */
            return c->dropped > 16 * s->o->max_body ? MHD_NO : MHD_YES;
        }
        if (sbuf_append(&c->body, upload_data, n)) return MHD_NO;
        return MHD_YES;
    }
    struct http_resp r = {0};
    if (c->dropped) {
        char msg[160];
        snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes",
                 s->o->max_body);
        fill_error(&r, &c->log, 413, "invalid_request_error", "request_too_large", msg);
        return queue(s, mc, c, &r);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct http_req rq = {.method = method,
                          .path = url,
                          .body = c->body.p ? c->body.p : "",
                          .body_len = c->body.len,
                          .fd = ci ? ci->connect_fd : -1,
                          .log = &c->log};
    c->route->fn(s, &rq, &r);
    sbuf_free(&c->body);
    return queue(s, mc, c, &r);
}

static void log_line(struct serve *s, const struct conn *c, int status, double total_ms)
{
    char ttft[32] = "-";
    if (c->log.ttft_ms >= 0) snprintf(ttft, sizeof ttft, "%.1f", c->log.ttft_ms);
    const char *finish = c->log.finish ? c->log.finish : "-";
    if (s->o->log_json) {
        time_t now = time(NULL);
        struct tm tm;
        char ts[32];
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
        fprintf(stderr,
                "{\"ts\":\"%s\",\"id\":\"%s\",\"method\":\"%s\",\"path\":\"%s\",\"status\":%d,"
                "\"prompt_tokens\":%d,\"completion_tokens\":%d,\"cached_tokens\":%d,"
                "\"ttft_ms\":%s,\"total_ms\":%.1f,\"finish\":%s%s%s}\n",
                ts, c->log.id, c->method, c->path, status, c->log.prompt_tokens,
                c->log.completion_tokens, c->log.cached_tokens, c->log.ttft_ms >= 0 ? ttft : "null",
                total_ms, c->log.finish ? "\"" : "", c->log.finish ? finish : "null",
                c->log.finish ? "\"" : "");
    } else {
        fprintf(stderr,
                "quern: req %s %s %s %d prompt=%d output=%d cached=%d ttft_ms=%s total_ms=%.1f "
                "finish=%s\n",
                c->log.id, c->method, c->path, status, c->log.prompt_tokens,
                c->log.completion_tokens, c->log.cached_tokens, ttft, total_ms, finish);
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)mc;
    struct serve *s = cls;
    struct conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    int status = c->answered ? c->log.status : 0;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || c->log.disconnected) {
        if (toe != MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN) {
            c->log.has_error = true;
            c->log.error = METRICS_ERR_DISCONNECT;
        }
        status = 499; /* nginx's "client closed request" */
    }
    metrics_count_status(&s->metrics, status);
    if (c->log.has_error) metrics_count_error(&s->metrics, c->log.error);
    /* the probes and scrapes would drown the log: only their failures are logged */
    bool quiet =
        c->route && (c->route->fn == api_health || c->route->fn == api_metrics) && status == 200;
    if (!quiet) log_line(s, c, status, ms_since(&c->t0));
    sbuf_free(&c->body);
    free(c);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    /* a stream whose client left: the request's own log line says 499 */
    if (strstr(msg, "Application reported internal error")) return;
    fprintf(stderr, "quern serve: http: %s\n", msg);
}

int http_start(struct serve *s, struct http_server **out, struct qerr *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o->port);
    int gai = getaddrinfo(s->o->host, port, &hints, &ai);
    if (gai)
        return qerr_set(err, QERR_INVALID, "--host '%s': %s (give a numeric IPv4 or IPv6 address)",
                        s->o->host, gai_strerror(gai));
    struct http_server *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return qerr_set(err, QERR_NOMEM, "out of memory");
    }
    h->s = s;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(
        flags, (uint16_t)s->o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)300, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)256, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return qerr_set(err, QERR_IO, "cannot listen on %s:%d (in use, or not an address here)",
                        s->o->host, s->o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : s->o->port;
    *out = h;
    return 0;
}

int http_port(const struct http_server *h)
{
    return h->port;
}

void http_stop(struct http_server *h)
{
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
