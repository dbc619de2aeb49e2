#include "backend_nvtx.h"

#include "backend_wrap.h"
#include "nvtx.h"

static void op_begin(void *ctx, const char *op, const struct bweight *w)
{
    (void)ctx;
    if (w)
        nvtx_pushf("%s %lldx%lld %s", op, (long long)w->rows, (long long)w->cols,
                   qtype_name(w->type));
    else
        nvtx_push(op);
}

static void op_end(void *ctx, const char *op, const struct bweight *w, double bytes, double flops,
                   double tokens)
{
    (void)ctx, (void)op, (void)w, (void)bytes, (void)flops, (void)tokens;
    nvtx_pop();
}

int backend_nvtx_wrap(struct backend *inner, struct backend **out, struct qerr *err)
{
    struct backend_hooks h = {.op_begin = op_begin, .op_end = op_end};
    struct backend_wrap_opts o = {.own_inner = true, .sync_each_op = false, .steps = true};
    return backend_wrap_create(inner, &h, &o, out, err);
}
