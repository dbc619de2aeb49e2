/* http_head: request-head checks on MHD's parse (http_head.h). */
#include "http_head.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

bool http_key_ok(const char *key, const char *header)
{
    static const char bearer[] = "bearer";
    if (!header || strncasecmp(header, bearer, sizeof bearer - 1) != 0) return false;
    const char *given = header + sizeof bearer - 1;
    if (*given != ' ' && *given != '\t') return false;
    while (*given == ' ' || *given == '\t') given++;
    size_t glen = strlen(given), klen = strlen(key);
    volatile unsigned char diff = glen != klen;
    for (size_t i = 0; i < klen; i++) {
        size_t j = i < glen ? i : 0;
        diff |= (unsigned char)(key[i] ^ (glen ? given[j] : 0));
    }
    return diff == 0;
}

struct head_walk {
    const char *end; /* of the previous item of the head, as MHD left it in its buffer */
    size_t bytes;
    bool nul;
};

/* Each header line's CR LF (or bare LF) became NULs: anything else between one header's value
 * and the next name means a NUL byte inside the line, which MHD's C strings cut off. */
static bool only_line_end(const char *from, const char *to)
{
    if (to < from + 1 || to > from + 2) return false;
    for (const char *p = from; p < to; p++)
        if (*p) return false;
    return true;
}

static enum MHD_Result walk_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    struct head_walk *w = cls;
    w->bytes += key_size + value_size + 4;
    if (w->end && !only_line_end(w->end, key)) {
        w->nul = true;
        return MHD_NO;
    }
    w->end = value ? value + value_size : key + key_size;
    return MHD_YES;
}

/* A line that starts with a NUL byte reads as the empty line that ends the head, so MHD ends it
 * there and drops the rest of that line unseen (a proxy that passed the NUL would see a header
 * quern never does). The head MHD took runs header_size bytes from the method, which starts the
 * request line in its buffer: after the last header only the NULs MHD wrote over two line ends
 * may remain. */
static bool head_swallowed_a_line(struct MHD_Connection *mc, const char *method,
                                  const char *last_end)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (!ci || method + ci->header_size < last_end) return false;
    size_t tail = (size_t)(method + ci->header_size - last_end);
    if (tail > 4) return true; /* more than CR LF CR LF */
    for (size_t i = 0; i < tail; i++)
        if (last_end[i]) return true;
    return false;
}

int http_head_check(struct MHD_Connection *mc, const char *method, const char *raw_url,
                    size_t raw_url_len, const char *version, char *msg, size_t cap)
{
    if (strcmp(version, MHD_HTTP_VERSION_1_1) != 0 && strcmp(version, MHD_HTTP_VERSION_1_0) != 0) {
        snprintf(msg, cap, "the request line has no HTTP/1.0 or HTTP/1.1 version");
        return 400;
    }
    /* MHD put a NUL where each space of the request line was: the method must reach the URL
     * and the URL the version. MHD 0.9.75 hands over the method in its buffer, where the request
     * line starts; should a version not, the method's checks are skipped, not failed. */
    bool method_in_line = method && raw_url && method < raw_url && raw_url - method <= HTTP_URL_MAX;
    if ((raw_url && raw_url + raw_url_len != version - 1) ||
        (method_in_line && method + strlen(method) + 1 != raw_url)) {
        snprintf(msg, cap, "the request line holds a NUL byte");
        return 400;
    }
    if (raw_url_len > HTTP_URL_MAX) {
        snprintf(msg, cap, "the URL (%zu bytes) is over the limit of %d bytes", raw_url_len,
                 HTTP_URL_MAX);
        return 414;
    }
    struct head_walk w = {.end = version + strlen(version)};
    MHD_get_connection_values_n(mc, MHD_HEADER_KIND, walk_header, &w);
    if (!w.nul && !(w.end[0] == '\0' && w.end[1] == '\0')) w.nul = true; /* the last line */
    if (!w.nul && method_in_line && head_swallowed_a_line(mc, method, w.end)) w.nul = true;
    if (w.nul) {
        snprintf(msg, cap, "a header line holds a NUL byte (or is folded)");
        return 400;
    }
    if (w.bytes + raw_url_len > HTTP_HEAD_MAX) {
        snprintf(msg, cap, "the request headers (%zu bytes) are over the limit of %d bytes",
                 w.bytes + raw_url_len, HTTP_HEAD_MAX);
        return 431;
    }
    return 0;
}
