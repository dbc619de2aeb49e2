/* The CPU backend: host buffers, a persistent thread pool, and kernels split by rows (matmul),
 * by (token, head) pairs (attention) or by tokens (the rest). Splits never cut a reduction, so
 * results are the same for any thread count and any batch composition. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend.h"
#include "ref.h"
#include "threadpool.h"

struct cpu_ctx {
    struct threadpool *pool;
    enum matmul_precision precision;
};

static struct cpu_ctx *ctx_of(struct backend *be)
{
    return be->ctx;
}

static void cpu_destroy(struct backend *be)
{
    struct cpu_ctx *c = ctx_of(be);
    pool_destroy(c->pool);
    free(c);
    free(be);
}

static void *cpu_buf_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) return NULL;
    memset(p, 0, bytes);
    return p;
}

static void cpu_buf_free(struct backend *be, void *buf)
{
    (void)be;
    free(buf);
}

static void cpu_buf_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
}

static int cpu_weight_prepare(struct backend *be, struct bweight *w, struct qerr *err)
{
    (void)be;
    if (!qtype_supported(w->type))
        return qerr_set(err, QERR_UNSUPPORTED, "cpu backend: weight type %s",
                        qtype_name(w->type));
    w->impl = NULL; /* the reference kernels read the file's layout directly */
    return 0;
}

static void cpu_weight_release(struct backend *be, struct bweight *w)
{
    (void)be;
    w->impl = NULL;
}

static void cpu_embed(struct backend *be, const struct bweight *table, const int32_t *tokens,
                      int n, float *out)
{
    (void)be;
    ref_embed(table, tokens, n, out);
}

static void cpu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n,
                        int dim, float eps)
{
    (void)be;
    ref_rmsnorm(out, x, w, n, dim, eps);
}

static void cpu_add(struct backend *be, float *x, const float *y, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

struct matmul_job {
    const struct bweight *w;
    const float *x;
    float *y;
    int n;
    int64_t rows_per_task;
};

static void matmul_task(void *arg, int task, int worker)
{
    (void)worker;
    struct matmul_job *j = arg;
    int64_t r0 = (int64_t)task * j->rows_per_task;
    int64_t r1 = r0 + j->rows_per_task < j->w->rows ? r0 + j->rows_per_task : j->w->rows;
    ref_matmul_rows(j->w, j->x, j->n, j->y, r0, r1);
}

static void cpu_matmul(struct backend *be, const struct bweight *w, const float *x, int n,
                       float *y)
{
    struct cpu_ctx *c = ctx_of(be);
    struct matmul_job j = {.w = w, .x = x, .y = y, .n = n, .rows_per_task = 16};
    int tasks = (int)((w->rows + j.rows_per_task - 1) / j.rows_per_task);
    pool_run(c->pool, matmul_task, &j, tasks);
}

static void cpu_rope(struct backend *be, float *x, const int32_t *pos, int n, int n_heads,
                     int head_dim, int rot_dim, float freq_base)
{
    (void)be;
    ref_rope(x, pos, n, n_heads, head_dim, rot_dim, freq_base);
}

static void cpu_kv_write(struct backend *be, float *k_cache, float *v_cache, const float *k,
                         const float *v, const struct attn_batch *b, int kv_dim)
{
    (void)be;
    ref_kv_write(k_cache, v_cache, k, v, b, kv_dim);
}

struct attn_job {
    float *out;
    const float *q, *k_cache, *v_cache;
    const struct attn_batch *b;
    const struct attn_shape *s;
};

static void attn_task(void *arg, int task, int worker)
{
    (void)worker;
    struct attn_job *j = arg;
    ref_attention_one(j->out, j->q, j->k_cache, j->v_cache, j->b, j->s, task / j->s->n_heads,
                      task % j->s->n_heads);
}

static void cpu_attention(struct backend *be, float *out, const float *q, const float *k_cache,
                          const float *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s)
{
    struct attn_job j = {out, q, k_cache, v_cache, b, s};
    pool_run(ctx_of(be)->pool, attn_task, &j, b->n_tokens * s->n_heads);
}

static void cpu_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx,
                         int n, int dim)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * (size_t)dim, x + (size_t)idx[i] * (size_t)dim,
               (size_t)dim * sizeof(float));
}

static void cpu_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    (void)be;
    ref_silu_mul(g, u, n);
}

static void cpu_sync(struct backend *be)
{
    (void)be;
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .buf_write = cpu_buf_copy,
    .buf_read = cpu_buf_copy,
    .weight_prepare = cpu_weight_prepare,
    .weight_release = cpu_weight_release,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .get_rows = cpu_get_rows,
    .silu_mul = cpu_silu_mul,
    .sync = cpu_sync,
};

int backend_cpu_create(const struct backend_cpu_opts *opts, struct backend **out,
                       struct qerr *err)
{
    int n = opts->n_threads;
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    struct backend *be = calloc(1, sizeof *be);
    struct cpu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return qerr_set(err, QERR_NOMEM, "cpu backend: out of memory");
    }
    c->precision = opts->precision;
    int rc = pool_create(n, &c->pool, err);
    if (rc) {
        free(be);
        free(c);
        return rc;
    }
    be->ops = &cpu_ops;
    be->ctx = c;
    *out = be;
    return 0;
}
