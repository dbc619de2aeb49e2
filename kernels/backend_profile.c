#include "backend_profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROFILE_MAX_ROWS 64

struct profile {
    struct backend self;   /* what the model calls */
    struct backend *inner; /* what does the work */
    struct backend_ops ops;
    struct profile_row rows[PROFILE_MAX_ROWS];
    size_t n_rows;
    /* the rows are sorted for the reader; new calls must find theirs again */
    struct profile_row sorted[PROFILE_MAX_ROWS];
};

static struct profile *prof_of(struct backend *be)
{
    return be->ctx;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The row of (op, shape); a full table folds the rest into one "other" row. */
static struct profile_row *row_of(struct profile *p, const char *op, const char *shape)
{
    for (size_t i = 0; i < p->n_rows; i++)
        if (!strcmp(p->rows[i].op, op) && !strcmp(p->rows[i].shape, shape)) return &p->rows[i];
    if (p->n_rows == PROFILE_MAX_ROWS) return &p->rows[PROFILE_MAX_ROWS - 1];
    struct profile_row *r = &p->rows[p->n_rows++];
    *r = (struct profile_row){0};
    snprintf(r->op, sizeof r->op, "%s", p->n_rows == PROFILE_MAX_ROWS ? "other" : op);
    snprintf(r->shape, sizeof r->shape, "%s", p->n_rows == PROFILE_MAX_ROWS ? "" : shape);
    return r;
}

static void account(struct profile *p, const char *op, const char *shape, double t0, double bytes,
                    double flops, double tokens)
{
    p->inner->ops->sync(p->inner);
    double dt = now_s() - t0;
    struct profile_row *r = row_of(p, op, shape);
    r->calls++;
    r->seconds += dt;
    r->bytes += bytes;
    r->flops += flops;
    r->tokens += tokens;
}

#define F4 ((double)sizeof(float))

static void *pf_alloc(struct backend *be, size_t n)
{
    struct backend *r = prof_of(be)->inner;
    return r->ops->buf_alloc(r, n);
}

static void pf_free(struct backend *be, void *b)
{
    struct backend *r = prof_of(be)->inner;
    r->ops->buf_free(r, b);
}

static void pf_write(struct backend *be, void *d, const void *s, size_t n)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->buf_write(p->inner, d, s, n);
    account(p, "copy", "", t0, (double)n, 0, 0);
}

static void pf_read(struct backend *be, void *d, const void *s, size_t n)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->buf_read(p->inner, d, s, n);
    account(p, "copy", "", t0, (double)n, 0, 0);
}

static int pf_prepare(struct backend *be, struct bweight *w, struct qerr *err)
{
    struct backend *r = prof_of(be)->inner;
    return r->ops->weight_prepare(r, w, err);
}

static void pf_release(struct backend *be, struct bweight *w)
{
    struct backend *r = prof_of(be)->inner;
    r->ops->weight_release(r, w);
}

static void pf_embed(struct backend *be, const struct bweight *t, const int32_t *tok, int n,
                     float *out)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->embed(p->inner, t, tok, n, out);
    double row = (double)qtype_row_bytes(t->type, (size_t)t->cols);
    account(p, "embed", "", t0, n * (row + (double)t->cols * F4), 0, n);
}

static void pf_rmsnorm(struct backend *be, float *o, const float *x, const float *w, int n, int dim,
                       float eps)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->rmsnorm(p->inner, o, x, w, n, dim, eps);
    account(p, "rmsnorm", "", t0, (2.0 * n + 1) * dim * F4, 4.0 * n * dim, n);
}

static void pf_add(struct backend *be, float *x, const float *y, size_t n)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->add(p->inner, x, y, n);
    account(p, "add", "", t0, 3.0 * (double)n * F4, (double)n, 0);
}

static void pf_add_rmsnorm(struct backend *be, float *o, float *x, const float *y, const float *w,
                           int n, int dim, float eps)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->add_rmsnorm(p->inner, o, x, y, w, n, dim, eps);
    account(p, "add_rmsnorm", "", t0, (4.0 * n + 1) * dim * F4, 5.0 * n * dim, n);
}

static void pf_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y)
{
    struct profile *p = prof_of(be);
    char shape[40];
    snprintf(shape, sizeof shape, "%lldx%lld %s", (long long)w->rows, (long long)w->cols,
             qtype_name(w->type));
    double t0 = now_s();
    p->inner->ops->matmul(p->inner, w, x, n, y);
    double wbytes = (double)w->rows * (double)qtype_row_bytes(w->type, (size_t)w->cols);
    account(p, "matmul", shape, t0, wbytes + (double)n * (double)(w->rows + w->cols) * F4,
            2.0 * n * (double)w->rows * (double)w->cols, n);
}

static void pf_rope(struct backend *be, float *x, const int32_t *pos, int n, int nh, int hd, int rd,
                    float base)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->rope(p->inner, x, pos, n, nh, hd, rd, base);
    account(p, "rope", "", t0, 2.0 * n * nh * hd * F4, 3.0 * n * nh * rd, n);
}

static void pf_kv_write(struct backend *be, void *kc, void *vc, const float *k, const float *v,
                        const struct attn_batch *b, int kv_dim)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->kv_write(p->inner, kc, vc, k, v, b, kv_dim);
    double elem = (double)backend_kv_elem_bytes(p->inner);
    account(p, "kv_write", "", t0, 2.0 * b->n_tokens * kv_dim * (F4 + elem), 0, b->n_tokens);
}

static void pf_attention(struct backend *be, float *out, const float *q, const void *kc,
                         const void *vc, const struct attn_batch *b, const struct attn_shape *s)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->attention(p->inner, out, q, kc, vc, b, s);
    account(p, "attention", "", t0, 0, 0, b->n_tokens);
}

static void pf_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                        int dim)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->get_rows(p->inner, out, x, idx, n, dim);
    account(p, "get_rows", "", t0, 2.0 * n * dim * F4, 0, n);
}

static void pf_silu(struct backend *be, float *g, const float *u, size_t n)
{
    struct profile *p = prof_of(be);
    double t0 = now_s();
    p->inner->ops->silu_mul(p->inner, g, u, n);
    account(p, "silu_mul", "", t0, 3.0 * (double)n * F4, 5.0 * (double)n, 0);
}

static void pf_sync(struct backend *be)
{
    struct backend *r = prof_of(be)->inner;
    r->ops->sync(r);
}

static size_t pf_kv_elem_bytes(const struct backend *be)
{
    const struct profile *p = be->ctx;
    return backend_kv_elem_bytes(p->inner);
}

static void pf_mem_info(struct backend *be, size_t *free_b, size_t *total_b)
{
    struct backend *r = prof_of(be)->inner;
    r->ops->mem_info(r, free_b, total_b);
}

static void *pf_host_alloc(struct backend *be, size_t n)
{
    return backend_host_alloc(prof_of(be)->inner, n);
}

static void pf_host_free(struct backend *be, void *ptr)
{
    backend_host_free(prof_of(be)->inner, ptr);
}

static void pf_destroy(struct backend *be)
{
    free(prof_of(be));
}

int backend_profile_create(struct backend *inner, struct backend **out, struct qerr *err)
{
    *out = NULL;
    struct profile *p = calloc(1, sizeof *p);
    if (!p) return qerr_set(err, QERR_NOMEM, "profile backend: out of memory");
    const struct backend_ops *in = inner->ops;
    p->inner = inner;
    p->ops = (struct backend_ops){.name = in->name,
                                  .destroy = pf_destroy,
                                  .buf_alloc = pf_alloc,
                                  .buf_free = pf_free,
                                  .buf_write = pf_write,
                                  .buf_read = pf_read,
                                  .weight_prepare = pf_prepare,
                                  .weight_release = pf_release,
                                  .embed = pf_embed,
                                  .rmsnorm = pf_rmsnorm,
                                  .add = pf_add,
                                  .matmul = pf_matmul,
                                  .rope = pf_rope,
                                  .kv_write = pf_kv_write,
                                  .attention = pf_attention,
                                  .get_rows = pf_get_rows,
                                  .silu_mul = pf_silu,
                                  .sync = pf_sync,
                                  .kv_elem_bytes = in->kv_elem_bytes ? pf_kv_elem_bytes : NULL,
                                  .add_rmsnorm = in->add_rmsnorm ? pf_add_rmsnorm : NULL,
                                  .mem_info = in->mem_info ? pf_mem_info : NULL,
                                  .host_alloc = in->host_alloc ? pf_host_alloc : NULL,
                                  .host_free = in->host_free ? pf_host_free : NULL};
    p->self = (struct backend){.ops = &p->ops, .ctx = p};
    *out = &p->self;
    return 0;
}

void backend_profile_reset(struct backend *prof)
{
    prof_of(prof)->n_rows = 0;
}

static int by_time(const void *a, const void *b)
{
    double x = ((const struct profile_row *)a)->seconds,
           y = ((const struct profile_row *)b)->seconds;
    return (x < y) - (x > y);
}

const struct profile_row *backend_profile_rows(struct backend *prof, size_t *n_rows)
{
    struct profile *p = prof_of(prof);
    memcpy(p->sorted, p->rows, p->n_rows * sizeof *p->rows);
    qsort(p->sorted, p->n_rows, sizeof *p->sorted, by_time);
    *n_rows = p->n_rows;
    return p->sorted;
}
