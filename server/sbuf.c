#include "sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/qerr.h"

static int reserve(struct sbuf *b, size_t extra)
{
    if (extra > (size_t)-1 / 2 - b->len) return QERR_NOMEM;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return QERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int sbuf_append(struct sbuf *b, const char *s, size_t n)
{
    if (reserve(b, n)) return QERR_NOMEM;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int sbuf_puts(struct sbuf *b, const char *s)
{
    return sbuf_append(b, s, strlen(s));
}

int sbuf_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n)) return QERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void sbuf_reset(struct sbuf *b)
{
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

void sbuf_free(struct sbuf *b)
{
    free(b->p);
    *b = (struct sbuf){0};
}

char *sbuf_take(struct sbuf *b)
{
    if (!b->p && reserve(b, 0)) return NULL;
    if (!b->len) b->p[0] = '\0';
    char *p = b->p;
    *b = (struct sbuf){0};
    return p;
}
