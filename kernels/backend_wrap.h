/* backend_wrap: a backend that runs another's ops and calls hooks around each, the common part
 * of backend_profile (times ops) and backend_nvtx (names them for Nsight).
 *
 * op_begin gets the op's name ("matmul", "attention", "rmsnorm", "add_rmsnorm", "add",
 * "silu_mul", "gelu_mul", "scale", "softcap", "rope", "kv_write", "embed", "get_rows", "copy" for
 * buf_write/buf_read, "graph replay" and "graph capture" around step_begin/step_end) and, for a
 * matmul, the weight; op_end
 * also gets what the op must move and do at minimum: bytes (weights read once, activations read
 * and written once; attention's KV reads are not counted, their positions live on the device),
 * flops, and the batch rows it processed. Buffer allocation and weight preparation pass through
 * without hooks. */
#ifndef QUERN_BACKEND_WRAP_H
#define QUERN_BACKEND_WRAP_H

#include <stdbool.h>

#include "backend.h"

struct backend_hooks {
    void *ctx;
    void (*op_begin)(void *ctx, const char *op, const struct bweight *w);
    void (*op_end)(void *ctx, const char *op, const struct bweight *w, double bytes, double flops,
                   double tokens);
    void (*destroy)(void *ctx); /* at the wrapper's destroy; NULL: nothing */
};

struct backend_wrap_opts {
    bool own_inner;    /* destroying the wrapper destroys inner too */
    bool sync_each_op; /* inner's sync before op_end, so an op's time is its own */
    bool steps;        /* pass step replay through (the ops of a replayed step get no hooks) */
    /* pass matmul_shared through as one op, "matmul_shared" with the first weight (else each
     * weight's matmul is its own op, as NVTX ranges and traces count them) */
    bool shared_matmuls;
};

int backend_wrap_create(struct backend *inner, const struct backend_hooks *h,
                        const struct backend_wrap_opts *o, struct backend **out, struct qerr *err);
/* The hooks' ctx of a wrapper made by backend_wrap_create. */
void *backend_wrap_hooks_ctx(struct backend *wrapper);

#endif
