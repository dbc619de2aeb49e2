/* qerr: the error type every quern module returns through.
 *
 * Functions return 0 on success or a negative QERR_* code, and fill a caller-owned struct qerr
 * with one line that names the input that failed (file, field, request parameter). quant/ is the
 * bottom of the dependency graph (quant <- kernels <- engine <- server), so the type lives here. */
#ifndef QUERN_QERR_H
#define QUERN_QERR_H

enum qerr_code {
    QERR_OK = 0,
    QERR_IO = -1,          /* open/read/mmap/write failed */
    QERR_FORMAT = -2,      /* malformed or corrupt input (file or request) */
    QERR_UNSUPPORTED = -3, /* valid input we do not handle (type, architecture, template) */
    QERR_NOMEM = -4,
    QERR_INVALID = -5,  /* bad argument or parameter value */
    QERR_FULL = -6,     /* a pool, queue or context is full */
    QERR_NOTFOUND = -7, /* missing key, tensor or token */
    QERR_TOO_LONG = -8, /* prompt + max_tokens over the context length */
};

struct qerr {
    int code;
    char msg[512];
};

/* Records code and a printf-style message in err (which may be NULL) and returns code. */
int qerr_set(struct qerr *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the message already in err with "context: ", keeping its code; returns the code. */
int qerr_wrap(struct qerr *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *qerr_code_name(int code);

#endif
