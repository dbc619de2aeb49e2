#include "backend_wrap.h"

#include <stdlib.h>

struct wrap {
    struct backend self;   /* what the caller uses */
    struct backend *inner; /* what does the work */
    struct backend_ops ops;
    struct backend_hooks h;
    struct backend_wrap_opts o;
};

static struct wrap *wrap_of(struct backend *be)
{
    return be->ctx;
}

#define F4 ((double)sizeof(float))

/* Runs `call` on the inner backend `in` between the hooks. */
#define HOOKED(op, w, bytes, flops, tokens, call)                                                  \
    do {                                                                                           \
        struct wrap *x_ = wrap_of(be);                                                             \
        struct backend *in = x_->inner;                                                            \
        x_->h.op_begin(x_->h.ctx, op, w);                                                          \
        call;                                                                                      \
        if (x_->o.sync_each_op) in->ops->sync(in);                                                 \
        x_->h.op_end(x_->h.ctx, op, w, bytes, flops, tokens);                                      \
    } while (0)

static void *w_alloc(struct backend *be, size_t n)
{
    struct backend *in = wrap_of(be)->inner;
    return in->ops->buf_alloc(in, n);
}

static void w_free(struct backend *be, void *b)
{
    struct backend *in = wrap_of(be)->inner;
    in->ops->buf_free(in, b);
}

static void w_write(struct backend *be, void *d, const void *s, size_t n)
{
    HOOKED("copy", NULL, (double)n, 0, 0, in->ops->buf_write(in, d, s, n));
}

static void w_read(struct backend *be, void *d, const void *s, size_t n)
{
    HOOKED("copy", NULL, (double)n, 0, 0, in->ops->buf_read(in, d, s, n));
}

static void w_buf_copy(struct backend *be, void *d, const void *s, size_t n)
{
    HOOKED("copy", NULL, 2.0 * (double)n, 0, 0, in->ops->buf_copy(in, d, s, n));
}

static int w_prepare(struct backend *be, struct bweight *w, struct qerr *err)
{
    struct backend *in = wrap_of(be)->inner;
    return in->ops->weight_prepare(in, w, err);
}

static void w_release(struct backend *be, struct bweight *w)
{
    struct backend *in = wrap_of(be)->inner;
    in->ops->weight_release(in, w);
}

static size_t w_weight_bytes(const struct backend *be, const struct bweight *w)
{
    const struct wrap *x = be->ctx;
    return backend_weight_bytes(x->inner, w);
}

static void w_embed(struct backend *be, const struct bweight *t, const int32_t *tok, int n,
                    float *out)
{
    double row = (double)backend_weight_bytes(wrap_of(be)->inner, t) / (double)t->rows;
    HOOKED("embed", NULL, n * (row + (double)t->cols * F4), 0, n,
           in->ops->embed(in, t, tok, n, out));
}

static void w_rmsnorm(struct backend *be, float *o, const float *x, const float *w, int n, int dim,
                      float eps)
{
    HOOKED("rmsnorm", NULL, (2.0 * n + 1) * dim * F4, 4.0 * n * dim, n,
           in->ops->rmsnorm(in, o, x, w, n, dim, eps));
}

static void w_add(struct backend *be, float *x, const float *y, size_t n)
{
    HOOKED("add", NULL, 3.0 * (double)n * F4, (double)n, 0, in->ops->add(in, x, y, n));
}

static void w_add_rows(struct backend *be, float *x, const float *b, int n, int dim)
{
    HOOKED("add_rows", NULL, (2.0 * n + 1) * dim * F4, (double)n * dim, n,
           in->ops->add_rows(in, x, b, n, dim));
}

static void w_add_rmsnorm(struct backend *be, float *o, float *x, const float *y, const float *w,
                          int n, int dim, float eps)
{
    HOOKED("add_rmsnorm", NULL, (4.0 * n + 1) * dim * F4, 5.0 * n * dim, n,
           in->ops->add_rmsnorm(in, o, x, y, w, n, dim, eps));
}

static void w_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y)
{
    double wbytes = (double)backend_weight_bytes(wrap_of(be)->inner, w);
    HOOKED("matmul", w, wbytes + (double)n * (double)(w->rows + w->cols) * F4,
           2.0 * n * (double)w->rows * (double)w->cols, n, in->ops->matmul(in, w, x, n, y));
}

static void w_matmul_shared(struct backend *be, const struct bweight *const *w, int n_w,
                            const float *x, int n, float *const *y)
{
    double bytes = 0, flops = 0;
    for (int i = 0; i < n_w; i++) {
        bytes += (double)backend_weight_bytes(wrap_of(be)->inner, w[i]) +
                 (double)n * (double)w[i]->rows * F4;
        flops += 2.0 * n * (double)w[i]->rows * (double)w[i]->cols;
    }
    bytes += (double)n * (double)w[0]->cols * F4; /* the input, read once */
    HOOKED("matmul_shared", w[0], bytes, flops, n, in->ops->matmul_shared(in, w, n_w, x, n, y));
}

static void w_rope(struct backend *be, float *x, const int32_t *pos, int n, int nh, int hd,
                   const struct rope_spec *rs)
{
    HOOKED("rope", NULL, 2.0 * n * nh * hd * F4, 3.0 * n * nh * rs->rot_dim, n,
           in->ops->rope(in, x, pos, n, nh, hd, rs));
}

static void w_kv_write(struct backend *be, void *kc, void *vc, const float *k, const float *v,
                       const struct attn_batch *b, int kv_dim)
{
    double row = (double)backend_kv_bytes(wrap_of(be)->inner, (size_t)kv_dim);
    HOOKED("kv_write", NULL, 2.0 * b->n_tokens * (kv_dim * F4 + row), 0, b->n_tokens,
           in->ops->kv_write(in, kc, vc, k, v, b, kv_dim));
}

static void w_attention(struct backend *be, float *out, const float *q, const void *kc,
                        const void *vc, const struct attn_batch *b, const struct attn_shape *s)
{
    HOOKED("attention", NULL, 0, 0, b->n_tokens, in->ops->attention(in, out, q, kc, vc, b, s));
}

static void w_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                       int dim)
{
    HOOKED("get_rows", NULL, 2.0 * n * dim * F4, 0, n, in->ops->get_rows(in, out, x, idx, n, dim));
}

static void w_silu(struct backend *be, float *g, const float *u, size_t n)
{
    HOOKED("silu_mul", NULL, 3.0 * (double)n * F4, 5.0 * (double)n, 0,
           in->ops->silu_mul(in, g, u, n));
}

static void w_gelu(struct backend *be, float *g, const float *u, size_t n)
{
    HOOKED("gelu_mul", NULL, 3.0 * (double)n * F4, 8.0 * (double)n, 0,
           in->ops->gelu_mul(in, g, u, n));
}

static void w_scale(struct backend *be, float *x, float f, size_t n)
{
    HOOKED("scale", NULL, 2.0 * (double)n * F4, (double)n, 0, in->ops->scale(in, x, f, n));
}

static void w_softcap(struct backend *be, float *x, float cap, size_t n)
{
    HOOKED("softcap", NULL, 2.0 * (double)n * F4, 5.0 * (double)n, 0,
           in->ops->softcap(in, x, cap, n));
}

static void w_moe_combine(struct backend *be, float *out, const float *y, const int32_t *rows,
                          const float *w, int n, int k, int dim)
{
    double e = (double)n * (double)k * (double)dim;
    HOOKED("moe_combine", NULL, (e + (double)n * dim) * F4, 2.0 * e, n,
           in->ops->moe_combine(in, out, y, rows, w, n, k, dim));
}

static void w_sync(struct backend *be)
{
    struct backend *in = wrap_of(be)->inner;
    in->ops->sync(in);
}

static bool w_step_begin(struct backend *be, uint64_t key)
{
    bool replayed = false;
    HOOKED("graph replay", NULL, 0, 0, 0, replayed = in->ops->step_begin(in, key));
    return replayed;
}

static bool w_step_end(struct backend *be)
{
    bool ok = false;
    HOOKED("graph capture", NULL, 0, 0, 0, ok = in->ops->step_end(in));
    return ok;
}

static void w_step_reset(struct backend *be)
{
    struct backend *in = wrap_of(be)->inner;
    in->ops->step_reset(in);
}

static size_t w_kv_elem_bytes(const struct backend *be)
{
    const struct wrap *x = be->ctx;
    return backend_kv_elem_bytes(x->inner);
}

static size_t w_kv_bytes(const struct backend *be, size_t n)
{
    const struct wrap *x = be->ctx;
    return backend_kv_bytes(x->inner, n);
}

static void w_mem_info(struct backend *be, size_t *free_b, size_t *total_b)
{
    struct backend *in = wrap_of(be)->inner;
    in->ops->mem_info(in, free_b, total_b);
}

static void *w_host_alloc(struct backend *be, size_t n)
{
    return backend_host_alloc(wrap_of(be)->inner, n);
}

static void w_host_free(struct backend *be, void *ptr)
{
    backend_host_free(wrap_of(be)->inner, ptr);
}

static void w_destroy(struct backend *be)
{
    struct wrap *x = wrap_of(be);
    if (x->h.destroy) x->h.destroy(x->h.ctx);
    if (x->o.own_inner) backend_destroy(x->inner);
    free(x);
}

int backend_wrap_create(struct backend *inner, const struct backend_hooks *h,
                        const struct backend_wrap_opts *o, struct backend **out, struct qerr *err)
{
    *out = NULL;
    struct wrap *x = calloc(1, sizeof *x);
    if (!x) return qerr_set(err, QERR_NOMEM, "backend wrapper: out of memory");
    const struct backend_ops *in = inner->ops;
    bool steps = o->steps && in->step_begin;
    x->inner = inner;
    x->h = *h;
    x->o = *o;
    x->ops = (struct backend_ops){
        .name = in->name,
        .destroy = w_destroy,
        .buf_alloc = w_alloc,
        .buf_free = w_free,
        .buf_write = w_write,
        .buf_read = w_read,
        .weight_prepare = w_prepare,
        .weight_bytes = w_weight_bytes,
        .weight_release = w_release,
        .embed = w_embed,
        .rmsnorm = w_rmsnorm,
        .add = w_add,
        .matmul = w_matmul,
        .rope = w_rope,
        .kv_write = w_kv_write,
        .attention = w_attention,
        .get_rows = w_get_rows,
        .silu_mul = w_silu,
        .gelu_mul = in->gelu_mul ? w_gelu : NULL,
        .scale = in->scale ? w_scale : NULL,
        .softcap = in->softcap ? w_softcap : NULL,
        .moe_combine = in->moe_combine ? w_moe_combine : NULL,
        .sync = w_sync,
        .step_begin = steps ? w_step_begin : NULL,
        .step_end = steps ? w_step_end : NULL,
        .step_reset = steps ? w_step_reset : NULL,
        .kv_elem_bytes = in->kv_elem_bytes ? w_kv_elem_bytes : NULL,
        .kv_bytes = in->kv_bytes ? w_kv_bytes : NULL,
        .add_rmsnorm = in->add_rmsnorm ? w_add_rmsnorm : NULL,
        .add_rows = in->add_rows ? w_add_rows : NULL,
        .mem_info = in->mem_info ? w_mem_info : NULL,
        .host_alloc = in->host_alloc ? w_host_alloc : NULL,
        .host_free = in->host_free ? w_host_free : NULL,
        .buf_copy = in->buf_copy ? w_buf_copy : NULL,
        .matmul_shared = o->shared_matmuls && in->matmul_shared ? w_matmul_shared : NULL};
    x->self = (struct backend){.ops = &x->ops, .ctx = x};
    *out = &x->self;
    return 0;
}

void *backend_wrap_hooks_ctx(struct backend *wrapper)
{
    return wrap_of(wrapper)->h.ctx;
}
