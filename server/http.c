/* http: libmicrohttpd glue and routing (see http.h).
 *
 * DESIGN. MHD runs an internal listening thread and one thread per connection, so a handler may
 * block (waiting for tokens) without stalling anyone else. A connection's request goes through
 * on_request several times: first with the headers (we allocate the per-request struct conn,
 * route, check the API key and Content-Length and may answer at once: 404, 405, 401, 413), then
 * once per piece of body (collected under --max-body; past it the rest is read and dropped), and
 * finally with no data, when the handler runs. on_completed fires once per request whatever
 * happened: it writes the log line, counts the status and frees the conn. A streamed response's
 * context is freed by MHD through the response's free callback, after the last read.
 *
 * HOSTILE CLIENTS. A thread per connection makes each connection cost a slot, so slots must
 * not be held by clients that send nothing. Every open connection has a struct conn_slot in a
 * fixed table (MHD's connection notifications keep it): READING while its request's head and
 * body are on the way (and while idle between keep-alive requests), HANDLING from the handler
 * on. A READING connection has --request-timeout seconds in all, however it trickles (the
 * reaper thread shuts its socket); a new connection that finds every slot taken evicts the
 * connection READING the longest, and is refused only when none is (so idle connections
 * cannot lock anyone out, while requests being served are never cut); one client address may
 * hold at most --max-connections-per-client. Request heads with NUL bytes or no HTTP/1.x
 * version are refused, since MHD would read them as C strings. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "../quant/fault.h"
#include "api.h"
#include "http_head.h"

enum conn_phase { PHASE_READING, PHASE_HANDLING };

/* One open connection (MHD's socket_context). Guarded by http_server.mu. */
struct conn_slot {
    bool used, closing; /* closing: the server shut its socket; MHD has yet to notice */
    bool has_head;      /* a request's head arrived; its body has not all */
    int fd;
    enum conn_phase phase;
    double since; /* monotonic seconds: when it began READING */
    unsigned char addr[16];
    int addr_len; /* 4 or 16; 0 when unknown */
};

struct http_server {
    struct serve *s;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t wake;     /* the reaper's sleep (CLOCK_MONOTONIC) */
    struct conn_slot *slots; /* [n_slots]: MHD's own limit, a little over max_connections */
    int n_slots, open;       /* open counts used slots that are not closing */
    bool stopping;
    bool reaper_started;
    pthread_t reaper;
};

#define SEND_BUFFER_BYTES (128 * 1024)
#define EVICT_AFTER_S     1.0

struct route {
    const char *path;
    const char *method; /* GET also answers HEAD */
    bool auth;          /* needs the API key when one is set */
    api_handler fn;
    bool prefix; /* path is a prefix: the handler reads the rest of the URL */
};

static const struct route routes[] = {
    {"/v1/completions", "POST", true, api_completions, false},
    {"/v1/chat/completions", "POST", true, api_chat, false},
    {"/v1/models", "GET", true, api_models, false},
    {API_MODELS_PREFIX, "GET", true, api_model, true},
    {"/v1/embeddings", "POST", true, api_embeddings, false},
    {"/v1/responses", "POST", true, api_responses, false},
    {"/tokenize", "POST", true, api_tokenize, false},
    {"/detokenize", "POST", true, api_detokenize, false},
    {"/health", "GET", false, api_health, false},
    {"/health/live", "GET", false, api_liveness, false},
    {"/health/ready", "GET", false, api_readiness, false},
    {"/metrics", "GET", false, api_metrics, false},
    {"/v1/engine/state", "GET", true, api_engine_state, false},
    {"/v1/load_lora_adapter", "POST", true, api_load_lora, false},
    {"/v1/unload_lora_adapter", "POST", true, api_unload_lora, false},
    /* the page itself is open (it asks for the API key when the API needs one) */
    {"/", "GET", false, api_webui, false},
    {API_WEBUI_PREFIX, "GET", false, api_webui, true},
};

/* One HTTP request (MHD's con_cls). */
struct conn {
    bool started;        /* on_request has seen the headers */
    const char *raw_url; /* the URL as the request line had it (in MHD's buffer) */
    size_t raw_url_len;  /* its strlen before MHD unescapes it */
    struct conn_slot *slot;
    const struct route *route;
    struct sbuf body;
    size_t dropped;  /* body bytes past --max-body, read and thrown away */
    bool body_nomem; /* the body could not be stored: read, dropped, answered with a 500 */
#ifdef QUERN_FAULT_INJECTION
    long fault_ticket; /* the failure this request armed (tests/test_fault.py), or 0 */
#endif
    bool answered;    /* a response is queued */
    bool close_after; /* a malformed head: answer, then close */
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

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- the connection table ---- */

static struct conn_slot *slot_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void slot_set_phase(struct http_server *h, struct conn_slot *sl, enum conn_phase ph)
{
    if (!sl) return;
    pthread_mutex_lock(&h->mu);
    sl->phase = ph;
    sl->since = mono_s();
    sl->has_head = false;
    pthread_mutex_unlock(&h->mu);
}

static void slot_head_arrived(struct http_server *h, struct conn_slot *sl)
{
    if (!sl) return;
    pthread_mutex_lock(&h->mu);
    sl->has_head = true;
    pthread_mutex_unlock(&h->mu);
}

/* Shuts the slot's socket: MHD's thread for it sees the end and closes it. h->mu held. */
static void slot_close(struct http_server *h, struct conn_slot *sl, enum metrics_conn_close why)
{
    shutdown(sl->fd, SHUT_RDWR);
    sl->closing = true;
    h->open--;
    metrics_count_conn_close(&h->s->metrics, why);
}

static int addr_key(const struct sockaddr *a, unsigned char out[16])
{
    if (a && a->sa_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)(const void *)a)->sin_addr, 4);
        return 4;
    }
    if (a && a->sa_family == AF_INET6) {
        memcpy(out, &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr, 16);
        return 16;
    }
    return 0;
}

/* The open slot READING the longest, for at least EVICT_AFTER_S (a client that means it sends
 * its head in milliseconds; its request must not be cut before the server has read it), among
 * those of addr when addr_len > 0; NULL if none. */
static struct conn_slot *oldest_reading(struct http_server *h, const unsigned char *addr,
                                        int addr_len)
{
    struct conn_slot *best = NULL;
    double now = mono_s();
    for (int i = 0; i < h->n_slots; i++) {
        struct conn_slot *sl = &h->slots[i];
        if (!sl->used || sl->closing || sl->phase != PHASE_READING) continue;
        if (now - sl->since < EVICT_AFTER_S) continue;
        if (addr_len && (sl->addr_len != addr_len || memcmp(sl->addr, addr, (size_t)addr_len)))
            continue;
        if (!best || sl->since < best->since) best = sl;
    }
    return best;
}

/* MHD's accept policy: makes room for the new connection or refuses it. */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t len)
{
    (void)len;
    struct http_server *h = cls;
    const struct serve_opts *o = h->s->o;
    unsigned char key[16];
    int klen = addr_key(addr, key);
    bool ok = true;
    pthread_mutex_lock(&h->mu);
    if (o->max_conns_per_client > 0 && klen) {
        int mine = 0;
        for (int i = 0; i < h->n_slots; i++) {
            const struct conn_slot *sl = &h->slots[i];
            mine += sl->used && !sl->closing && sl->addr_len == klen &&
                    !memcmp(sl->addr, key, (size_t)klen);
        }
        if (mine >= o->max_conns_per_client) {
            struct conn_slot *victim = oldest_reading(h, key, klen);
            if (victim)
                slot_close(h, victim, METRICS_CONN_EVICTED);
            else
                ok = false;
        }
    }
    if (ok && h->open >= o->max_connections) {
        struct conn_slot *victim = oldest_reading(h, NULL, 0);
        if (victim)
            slot_close(h, victim, METRICS_CONN_EVICTED);
        else
            ok = false;
    }
    /* the evicted still hold MHD's slots until their threads end */
    int free_slots = 0;
    for (int i = 0; i < h->n_slots && ok && !free_slots; i++) free_slots += !h->slots[i].used;
    if (ok && !free_slots) ok = false;
    if (!ok) metrics_count_conn_close(&h->s->metrics, METRICS_CONN_REFUSED);
    pthread_mutex_unlock(&h->mu);
    return ok ? MHD_YES : MHD_NO;
}

static void notify_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                              enum MHD_ConnectionNotificationCode code)
{
    struct http_server *h = cls;
    pthread_mutex_lock(&h->mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn_slot *sl = NULL;
        for (int i = 0; i < h->n_slots && !sl; i++)
            if (!h->slots[i].used) sl = &h->slots[i];
        if (sl) {
            const union MHD_ConnectionInfo *fd =
                MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
            const union MHD_ConnectionInfo *ad =
                MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
            *sl = (struct conn_slot){.used = true,
                                     .fd = fd ? fd->connect_fd : -1,
                                     .phase = PHASE_READING,
                                     .since = mono_s()};
            sl->addr_len = addr_key(ad ? ad->client_addr : NULL, sl->addr);
            /* A client that stops reading must stall its stream soon (back-pressure), not after
             * the kernel has taken megabytes of it: the send buffer is capped. */
            int sndbuf = SEND_BUFFER_BYTES;
            if (sl->fd >= 0) setsockopt(sl->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
            if (sl->fd < 0)
                sl->closing = true; /* cannot be shut: never counted */
            else
                h->open++;
        }
        *socket_context = sl;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn_slot *sl = *socket_context;
        if (sl) {
            if (!sl->closing) h->open--;
            *sl = (struct conn_slot){0};
        }
        *socket_context = NULL;
    }
    metrics_set_conns_open(&h->s->metrics, h->open);
    pthread_mutex_unlock(&h->mu);
}

#define TIMEOUT_BODY                                                                               \
    "{\"error\":{\"message\":\"the request did not arrive within --request-timeout\",\"type\":"    \
    "\"invalid_request_error\",\"param\":null,\"code\":\"request_timeout\"}}"
static const char timeout_reply[] =
    "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
    "Content-Length: 144\r\n\r\n" TIMEOUT_BODY;
_Static_assert(sizeof TIMEOUT_BODY - 1 == 144, "the 408's Content-Length is its body's");

/* Closes connections whose request has been on its way for over --request-timeout. */
static void *reaper_main(void *arg)
{
    struct http_server *h = arg;
    double limit = h->s->o->request_timeout_s;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        double now = mono_s();
        for (int i = 0; i < h->n_slots; i++) {
            struct conn_slot *sl = &h->slots[i];
            if (!sl->used || sl->closing || sl->phase != PHASE_READING || now - sl->since <= limit)
                continue;
            /* a request whose body is late is answered; an idle connection is just closed (a
             * keep-alive client would take an unasked-for answer for its next request's) */
            if (sl->has_head) {
                ssize_t sent = fault_hit(FAULT_WRITE)
                                   ? -1
                                   : send(sl->fd, timeout_reply, sizeof timeout_reply - 1,
                                          MSG_DONTWAIT | MSG_NOSIGNAL);
                (void)sent;
            }
            slot_close(h, sl, METRICS_CONN_TIMED_OUT);
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long long ns = (long long)until.tv_nsec + 250000000LL; /* a check every 250 ms */
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&h->wake, &h->mu, &until);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
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

static unsigned idle_timeout_of(const struct serve *s)
{
    return (unsigned)(s->o->stall_timeout_s + 0.999);
}

/* Restarts MHD's idle clock of mc. MHD 0.9.75 restarts it only when the timeout it replaces is
 * 0, hence the two calls. */
static void restart_idle_clock(struct MHD_Connection *mc, unsigned timeout)
{
    if (!timeout) return;
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, timeout);
}

/* A streamed response's context (MHD's reader cls). */
struct stream_box {
    const struct http_stream_ops *ops;
    void *ctx;
    struct MHD_Connection *mc;
    unsigned idle_timeout; /* MHD's, restarted whenever the stream produced bytes */
};

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream_box *b = cls;
    long n = b->ops->read(b->ctx, buf, max);
    if (n > 0 && fault_hit(FAULT_WRITE)) return MHD_CONTENT_READER_END_WITH_ERROR; /* gone */
    /* the time the reader spent waiting for tokens (a long queue, a slow prefill) is the
     * server's, not the client's: MHD's idle clock restarts here */
    if (n > 0) restart_idle_clock(b->mc, b->idle_timeout);
    if (n > 0) return (ssize_t)n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls)
{
    struct stream_box *b = cls;
    b->ops->free(b->ctx);
    free(b);
}

static void fill_error(struct http_resp *out, struct req_log *log, int status, const char *type,
                       const char *code, const char *msg)
{
    struct oai_error e = {0};
    oai_error_set(&e, status, type, code, NULL, "%s", msg);
    api_error(&e, log, out);
}

static const char NOMEM_BODY[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
    "\"code\":null}}";

static enum MHD_Result queue(struct serve *s, struct MHD_Connection *mc, struct conn *c,
                             struct http_resp *r)
{
    c->answered = true;
    c->log.status = r->status;
    if (r->status == 0) {
        free(r->body);
        return MHD_NO; /* close without answering */
    }
    if (fault_hit(FAULT_WRITE)) { /* the client is gone before its answer could be sent */
        if (r->stream)
            r->stream->free(r->stream_ctx);
        else
            free(r->body);
        return MHD_NO;
    }
    struct MHD_Response *resp;
    /* the handler's time (waiting for a whole completion) is not the client's idleness */
    restart_idle_clock(mc, idle_timeout_of(s));
    struct stream_box *box = NULL;
    if (r->stream && !(box = malloc(sizeof *box))) {
        /* no room to stream it: the client still hears why (the fixed body below) */
        r->stream->free(r->stream_ctx);
        *r = (struct http_resp){.status = 500, .content_type = "application/json"};
        c->log.status = 500;
        c->log.has_error = true;
    }
    if (r->stream) {
        *box = (struct stream_box){
            .ops = r->stream, .ctx = r->stream_ctx, .mc = mc, .idle_timeout = idle_timeout_of(s)};
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, box,
                                                 stream_free);
        if (!resp) {
            stream_free(box);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else if (!r->body && r->status >= 400) {
        /* the error's own body could not be allocated: a fixed one says so */
        r->status = c->log.status = 500;
        resp = MHD_create_response_from_buffer(sizeof NOMEM_BODY - 1, (void *)NOMEM_BODY,
                                               MHD_RESPMEM_PERSISTENT);
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
    if (r->csp) {
        MHD_add_response_header(resp, "Content-Security-Policy", r->csp);
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    }
    if (r->status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    MHD_add_response_header(resp, "X-Request-Id", c->log.id);
    if (atomic_load(&s->state) == SERVE_DRAINING || c->close_after)
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
        if (routes[i].fn == api_webui && s->o->no_webui) continue;
        size_t pl = strlen(routes[i].path);
        if (routes[i].prefix ? strncmp(url, routes[i].path, pl) != 0 || !url[pl]
                             : strcmp(url, routes[i].path) != 0)
            continue;
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
               !http_key_ok(s->o->api_key,
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

/* MHD's URI log callback: the first sight of a request, before MHD rewrites its URL in place;
 * the conn made here is the request's con_cls. */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *mc)
{
    (void)cls;
    (void)mc;
    struct conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->raw_url = uri;
    c->raw_url_len = uri ? strlen(uri) : 0;
    return c;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct http_server *h = cls;
    struct serve *s = h->s;
    struct conn *c = *con_cls;
    if (!c) {
        c = on_request_line(NULL, NULL, mc); /* MHD skipped the URI callback */
        if (!c) return MHD_NO;
        *con_cls = c;
    }
    if (!c->started) {
        c->started = true;
#ifdef QUERN_FAULT_INJECTION
        /* a sweep's request arms its one failure (only under QUERN_FAULT=request) */
        const char *arm = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "X-Quern-Fault");
        if (arm) c->fault_ticket = fault_arm(arm);
#endif
        c->slot = slot_of(mc);
        slot_head_arrived(h, c->slot);
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
        char msg[160];
        int bad = http_head_check(mc, method, c->raw_url, c->raw_url_len, version, msg, sizeof msg);
        if (bad) {
            struct http_resp r = {0};
            fill_error(&r, &c->log, bad, "invalid_request_error",
                       bad == 400   ? "malformed_request"
                       : bad == 414 ? "url_too_long"
                                    : "headers_too_large",
                       msg);
            c->close_after = true;
            if (bad == 400) metrics_count_conn_close(&s->metrics, METRICS_CONN_MALFORMED);
            return queue(s, mc, c, &r);
        }
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
        if (!c->body_nomem && sbuf_append(&c->body, upload_data, n)) {
            sbuf_free(&c->body);
            c->body_nomem = true;
        }
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
    if (c->body_nomem) {
        fill_error(&r, &c->log, 500, "server_error", NULL,
                   "out of memory while reading the request body");
        return queue(s, mc, c, &r);
    }
    slot_set_phase(h, c->slot, PHASE_HANDLING);
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
                "\"ttft_ms\":%s,\"total_ms\":%.1f,\"finish\":%s%s%s%s%s%s}\n",
                ts, c->log.id, c->method, c->path, status, c->log.prompt_tokens,
                c->log.completion_tokens, c->log.cached_tokens, c->log.ttft_ms >= 0 ? ttft : "null",
                total_ms, c->log.finish ? "\"" : "", c->log.finish ? finish : "null",
                c->log.finish ? "\"" : "", c->log.ignored[0] ? ",\"ignored\":\"" : "",
                c->log.ignored, c->log.ignored[0] ? "\"" : "");
    } else {
        fprintf(stderr,
                "quern: req %s %s %s %d prompt=%d output=%d cached=%d ttft_ms=%s total_ms=%.1f "
                "finish=%s%s%s\n",
                c->log.id, c->method, c->path, status, c->log.prompt_tokens,
                c->log.completion_tokens, c->log.cached_tokens, ttft, total_ms, finish,
                c->log.ignored[0] ? " ignored=" : "", c->log.ignored);
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_server *h = cls;
    struct serve *s = h->s;
    struct conn *c = *con_cls;
    struct conn_slot *sl = slot_of(mc);
    slot_set_phase(h, sl, PHASE_READING); /* a keep-alive connection waits for the next one */
    if (!c) return;
#ifdef QUERN_FAULT_INJECTION
    if (c->fault_ticket > 0) fault_disarm(c->fault_ticket); /* an armed failure lasts a request */
#endif
    *con_cls = NULL;
    if (!c->started) { /* MHD refused the head itself (and answered it) */
        free(c);
        return;
    }
    int status = c->answered ? c->log.status : 0;
    pthread_mutex_lock(&h->mu);
    bool cut = sl && sl->closing && !c->answered;
    pthread_mutex_unlock(&h->mu);
    if (cut) {
        /* the server closed it: the head or body did not arrive in time, or it made room */
        c->log.has_error = true;
        c->log.error = METRICS_ERR_TIMEOUT;
        status = 408;
    } else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || c->log.disconnected) {
        if (toe != MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN) {
            c->log.has_error = true;
            c->log.error = METRICS_ERR_DISCONNECT;
        }
        status = 499; /* nginx's "client closed request" */
    }
    metrics_count_status(&s->metrics, status);
    if (c->log.has_error) metrics_count_error(&s->metrics, c->log.error);
    /* the probes and scrapes would drown the log: only their failures are logged */
    bool quiet = c->route &&
                 (c->route->fn == api_health || c->route->fn == api_liveness ||
                  c->route->fn == api_readiness || c->route->fn == api_metrics) &&
                 status == 200;
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

static void server_free(struct http_server *h)
{
    if (h->reaper_started) {
        pthread_mutex_lock(&h->mu);
        h->stopping = true;
        pthread_cond_signal(&h->wake);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->reaper, NULL);
    }
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->mu);
    free(h->slots);
    free(h);
}

int http_start(struct serve *s, struct http_server **out, struct qerr *err)
{
    const struct serve_opts *o = s->o;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai)
        return qerr_set(err, QERR_INVALID, "--host '%s': %s (give a numeric IPv4 or IPv6 address)",
                        o->host, gai_strerror(gai));
    struct http_server *h = calloc(1, sizeof *h);
    /* room for the evicted, whose threads are still ending, beyond max_connections */
    int n_slots = o->max_connections + (o->max_connections / 4 > 16 ? o->max_connections / 4 : 16);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (h) {
        h->s = s;
        h->n_slots = n_slots;
        pthread_mutex_init(&h->mu, NULL);
        pthread_cond_init(&h->wake, &ca);
        h->slots = calloc((size_t)n_slots, sizeof *h->slots);
    }
    pthread_condattr_destroy(&ca);
    if (!h || !h->slots) {
        freeaddrinfo(ai);
        if (h) server_free(h);
        return qerr_set(err, QERR_NOMEM, "out of memory");
    }
    /* MHD's own idle timeout cuts a client that stops reading its answer (the reaper times
     * requests on their way in) */
    unsigned idle = idle_timeout_of(s);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(
        flags, (uint16_t)o->port, accept_policy, h, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
        mhd_log, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
        h, MHD_OPTION_NOTIFY_CONNECTION, notify_connection, h, MHD_OPTION_URI_LOG_CALLBACK,
        on_request_line, h, MHD_OPTION_CONNECTION_LIMIT, (unsigned)n_slots,
        MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)HTTP_CONN_POOL_KB * 1024, MHD_OPTION_STRICT_FOR_CLIENT, 1,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)256, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        server_free(h);
        return qerr_set(err, QERR_IO, "cannot listen on %s:%d (in use, or not an address here)",
                        o->host, o->port);
    }
    if (o->request_timeout_s > 0) {
        if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
            MHD_stop_daemon(h->d);
            server_free(h);
            return qerr_set(err, QERR_IO, "cannot start the connection reaper thread");
        }
        h->reaper_started = true;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
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
    server_free(h);
}
