#include "qerr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int qerr_set(struct qerr *err, int code, const char *fmt, ...)
{
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int qerr_wrap(struct qerr *err, const char *fmt, ...)
{
    if (!err) return QERR_INVALID;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    memcpy(err->msg, prefix, n); /* prefix is < 256 bytes, msg is 512 */
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, len = strlen(old);
    if (len > room) len = room;
    memcpy(err->msg + n + 2, old, len);
    err->msg[n + 2 + len] = '\0';
    return err->code;
}

const char *qerr_code_name(int code)
{
    switch (code) {
    case QERR_OK:
        return "ok";
    case QERR_IO:
        return "io";
    case QERR_FORMAT:
        return "format";
    case QERR_UNSUPPORTED:
        return "unsupported";
    case QERR_NOMEM:
        return "nomem";
    case QERR_INVALID:
        return "invalid";
    case QERR_FULL:
        return "full";
    case QERR_NOTFOUND:
        return "notfound";
    case QERR_TOO_LONG:
        return "too_long";
    }
    return "unknown";
}
