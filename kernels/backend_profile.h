/* backend_profile: a backend that runs another backend's ops and times each one
 * (kernels/backend_wrap.h), for `quern bench --profile` and `quern bench --kernels --model M
 * --profile`.
 *
 * Every op is followed by the inner backend's sync, so an op's time is its own on an
 * asynchronous device too (on CUDA that also removes launch overlap: the profile's step is
 * slower than a real one). The wrapper has no step replay (CUDA graphs): a profiled step issues
 * every op.
 *
 * Ops are grouped into rows by op and shape: each matmul by its weight (rows x cols, type), the
 * others by op name. A row counts calls, seconds, and the bytes and flops the op must move and
 * do at minimum (backend_wrap.h says how they are counted), so callers can print GB/s and
 * GFLOP/s against a measured ceiling. */
#ifndef QUERN_BACKEND_PROFILE_H
#define QUERN_BACKEND_PROFILE_H

#include <stddef.h>

#include "backend.h"

struct profile_row {
    char op[16];    /* "matmul", "attention", "rmsnorm", ..., "copy" (buf_write/buf_read) */
    char shape[40]; /* "576x1536 Q4_1" for a matmul, "" otherwise */
    long calls;
    double seconds, bytes, flops;
    double tokens; /* summed over calls: the batch rows each call processed (0: not per token) */
};

/* A wrapper around inner (which it does not own: destroy the wrapper, then inner). */
int backend_profile_create(struct backend *inner, struct backend **out, struct qerr *err);
/* Forgets every row (between the phases a caller profiles apart). */
void backend_profile_reset(struct backend *prof);
/* The rows so far, most time first; *n_rows set. Valid until the next op or reset. */
const struct profile_row *backend_profile_rows(struct backend *prof, size_t *n_rows);

#endif
