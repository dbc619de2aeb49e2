/* fuzz_http_head: raw bytes sent to libmicrohttpd as a client's request, and quern's checks on
 * the head it parses (server/http_head.c), under the daemon's MHD options (strict parsing, the
 * same connection buffer, the URI callback that sees the URL before unescaping).
 *
 * Each input is one connection: a socketpair handed to a daemon that has no listening socket
 * (MHD_add_connection), the bytes written and the write side shut, and MHD run in this thread
 * until it closes the connection. The handler does what server/http.c does with a head:
 * http_head_check, then the API key and Content-Length, then reads the body and answers.
 * Checked: a request whose head (as MHD took it) holds a NUL byte with more of its line after it
 * is never accepted, since MHD's C strings would hide the rest of that line from every later
 * check. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../server/http_head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct run {
    int requests;     /* heads the handler saw */
    int first_status; /* http_head_check's answer for the first one */
    size_t head_size; /* its head's bytes (MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE) */
    char method[64];  /* its method */
};

struct req {
    const char *raw_url;
    size_t raw_url_len;
    bool started;
};

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc)
{
    (void)cls;
    (void)mc;
    struct req *r = calloc(1, sizeof *r);
    if (!r) abort();
    r->raw_url = uri;
    r->raw_url_len = uri ? strlen(uri) : 0;
    return r;
}

static void on_done(void *cls, struct MHD_Connection *mc, void **con_cls,
                    enum MHD_RequestTerminationCode why)
{
    (void)cls;
    (void)mc;
    (void)why;
    free(*con_cls);
    *con_cls = NULL;
}

static void quiet(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    (void)fmt;
    (void)ap;
}

static enum MHD_Result answer(struct MHD_Connection *mc, unsigned status, bool close)
{
    static const char body[] = "{}";
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    if (close) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(mc, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)url;
    (void)upload_data;
    struct run *run = cls;
    struct req *r = *con_cls;
    if (!r) *con_cls = r = on_uri(NULL, NULL, mc);
    if (!r->started) {
        r->started = true;
        char msg[160];
        int bad = http_head_check(mc, method, r->raw_url, r->raw_url_len, version, msg, sizeof msg);
        if (run->requests++ == 0) {
            run->first_status = bad;
            const union MHD_ConnectionInfo *ci =
                MHD_get_connection_info(mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
            run->head_size = ci ? ci->header_size : 0;
            snprintf(run->method, sizeof run->method, "%s", method);
        }
        if (bad) return answer(mc, (unsigned)bad, true);
        if (!http_key_ok("k1", MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization")))
            return answer(mc, 401, false);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > 1024) return answer(mc, 413, false);
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    return answer(mc, 200, false);
}

/* MHD's lines end at LF, with a CR before it dropped (a CR elsewhere is an ordinary byte): the
 * length of the line at data[i..], *next the offset after its LF (size when it has none). */
static size_t line_at(const uint8_t *data, size_t size, size_t i, size_t *next)
{
    const uint8_t *lf = memchr(data + i, '\n', size - i);
    size_t end = lf ? (size_t)(lf - data) : size;
    *next = lf ? end + 1 : size;
    return end - i - (lf && end > i && data[end - 1] == '\r');
}

/* The first request's head, as MHD took it (run->head_size bytes from its method), holds a byte
 * that no check sees: one other than NUL after a NUL in its line. MHD skips empty lines and
 * lines that start with NUL before the request line; when the bytes found there do not start
 * with the method MHD reported, this model of MHD is wrong for the input and nothing is
 * claimed. */
static bool head_hides_bytes(const uint8_t *data, size_t size, const struct run *run)
{
    size_t i = 0, next, n;
    while (i < size && ((n = line_at(data, size, i, &next)) == 0 || data[i] == 0)) i = next;
    size_t mlen = strlen(run->method);
    if (i + run->head_size > size || i + mlen > size || memcmp(data + i, run->method, mlen) != 0)
        return false;
    size_t end = i + run->head_size;
    for (; i < end; i = next) {
        n = line_at(data, end, i, &next);
        const uint8_t *line = data + i;
        for (const uint8_t *p = memchr(line, 0, n); p && p < line + n; p++)
            if (*p) return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct run run = {0};
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, &run,
        MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_URI_LOG_CALLBACK, on_uri, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)HTTP_CONN_POOL_KB * 1024, MHD_OPTION_STRICT_FOR_CLIENT, 1, MHD_OPTION_END);
    if (!d) abort();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) abort();
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    struct sockaddr_in peer = {
        .sin_family = AF_INET, .sin_port = htons(40000), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (MHD_add_connection(d, sv[0], (const struct sockaddr *)&peer, sizeof peer) != MHD_YES)
        abort();
    size_t sent = 0;
    bool shut = false, eof = false;
    char sink[4096];
    for (int round = 0; round < 1000 && !eof; round++) {
        if (sent < size) {
            ssize_t w = send(sv[1], data + sent, size - sent, MSG_NOSIGNAL);
            if (w > 0) sent += (size_t)w;
            if (w < 0 && errno != EAGAIN) sent = size; /* MHD closed its side: stop sending */
        }
        if (sent == size && !shut) shut = !shutdown(sv[1], SHUT_WR);
        MHD_run(d);
        ssize_t r;
        while ((r = read(sv[1], sink, sizeof sink)) > 0) continue;
        if (r == 0 || (r < 0 && errno != EAGAIN)) eof = true;
    }
    close(sv[1]);
    MHD_run(d); /* notices the close and frees the connection */
    MHD_stop_daemon(d);
    if (run.requests > 0 && run.first_status == 0 && head_hides_bytes(data, size, &run))
        __builtin_trap();
    return 0;
}
