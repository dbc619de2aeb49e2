/* http_head: the checks quern makes on a request head as libmicrohttpd hands it over, apart
 * from the daemon's connection handling so they can be fuzzed behind a real MHD parser
 * (tests/fuzz/fuzz_http_head.c) without a model or an engine.
 *
 * MHD parses the head in place in its connection buffer, turning each line end into NULs and
 * passing C strings on; a NUL byte inside a line would silently cut it. The checks read that
 * buffer's layout to refuse such heads, so they depend on MHD's parser and are tested with it. */
#ifndef QUERN_HTTP_HEAD_H
#define QUERN_HTTP_HEAD_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#define HTTP_URL_MAX  8192        /* longer: 414 */
#define HTTP_HEAD_MAX (64 * 1024) /* request line and headers; more: 431 */
/* MHD's per-connection buffer (MHD_OPTION_CONNECTION_MEMORY_LIMIT): room for HTTP_HEAD_MAX and
 * a reply; a head that does not fit is refused by MHD itself */
#define HTTP_CONN_POOL_KB 160

/* Checks the head of the request on mc: method and version (the on_request arguments), raw_url
 * and raw_url_len (the URL as MHD's URI callback saw it, before unescaping; raw_url may be NULL
 * when MHD skipped that callback). Returns 0, or the status to refuse it with (400, 414, 431),
 * with a one-line reason in msg. A NUL byte in the request line or in a header line is a 400,
 * except a line of one NUL byte alone that MHD took for the empty line ending the head where
 * its bytes cannot be told from a line end's (it hides nothing). Lines before the request line
 * that start with NUL are skipped by MHD as the empty lines a client may send first; they reach
 * no check and no handler, and nothing in MHD's API shows them. */
int http_head_check(struct MHD_Connection *mc, const char *method, const char *raw_url,
                    size_t raw_url_len, const char *version, char *msg, size_t cap);

/* header is 'Bearer KEY' with KEY equal to key: the scheme in any case (RFC 7235), compared in
 * constant time in the key's content. header may be NULL (false). */
bool http_key_ok(const char *key, const char *header);

#endif
