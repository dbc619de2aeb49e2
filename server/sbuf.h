/* sbuf: a growable byte buffer, always NUL-terminated, for building response bodies, SSE
 * chunks, metrics text and request bodies. The buffer owns p; sbuf_free releases it. */
#ifndef QUERN_SBUF_H
#define QUERN_SBUF_H

#include <stddef.h>

struct sbuf {
    char *p; /* NUL-terminated when non-NULL */
    size_t len, cap;
};

/* Each returns 0 or QERR_NOMEM (the buffer is then unchanged). */
int sbuf_append(struct sbuf *b, const char *s, size_t n);
int sbuf_puts(struct sbuf *b, const char *s);
int sbuf_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbuf_reset(struct sbuf *b); /* length 0, memory kept */
void sbuf_free(struct sbuf *b);
/* Hands p to the caller (who frees it) and empties b; never NULL unless out of memory. */
char *sbuf_take(struct sbuf *b);

#endif
