#include "backend_profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_wrap.h"

#define PROFILE_MAX_ROWS 64

struct profile {
    struct profile_row rows[PROFILE_MAX_ROWS];
    size_t n_rows;
    struct profile_row sorted[PROFILE_MAX_ROWS]; /* what backend_profile_rows hands out */
    double t0;                                   /* the running op's start */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The row of (op, shape); a full table folds the rest into its last row, "other". */
static struct profile_row *row_of(struct profile *p, const char *op, const char *shape)
{
    for (size_t i = 0; i < p->n_rows; i++)
        if (!strcmp(p->rows[i].op, op) && !strcmp(p->rows[i].shape, shape)) return &p->rows[i];
    if (p->n_rows == PROFILE_MAX_ROWS) return &p->rows[PROFILE_MAX_ROWS - 1];
    struct profile_row *r = &p->rows[p->n_rows++];
    bool last = p->n_rows == PROFILE_MAX_ROWS;
    *r = (struct profile_row){0};
    snprintf(r->op, sizeof r->op, "%s", last ? "other" : op);
    snprintf(r->shape, sizeof r->shape, "%s", last ? "" : shape);
    return r;
}

static void op_begin(void *ctx, const char *op, const struct bweight *w)
{
    (void)op;
    (void)w;
    ((struct profile *)ctx)->t0 = now_s();
}

static void op_end(void *ctx, const char *op, const struct bweight *w, double bytes, double flops,
                   double tokens)
{
    struct profile *p = ctx;
    double dt = now_s() - p->t0;
    char shape[40] = "";
    if (w)
        snprintf(shape, sizeof shape, "%lldx%lld %s", (long long)w->rows, (long long)w->cols,
                 qtype_name(w->type));
    struct profile_row *r = row_of(p, op, shape);
    r->calls++;
    r->seconds += dt;
    r->bytes += bytes;
    r->flops += flops;
    r->tokens += tokens;
}

int backend_profile_create(struct backend *inner, struct backend **out, struct qerr *err)
{
    struct profile *p = calloc(1, sizeof *p);
    if (!p) return qerr_set(err, QERR_NOMEM, "profile backend: out of memory");
    struct backend_hooks h = {.ctx = p, .op_begin = op_begin, .op_end = op_end, .destroy = free};
    /* q, k, v (and gate, up) as the backend runs them, one job: apart, each small matmul paid a
     * pool round trip of its own and a 16-sequence step profiled 1.2x its real time */
    struct backend_wrap_opts o = {
        .own_inner = false, .sync_each_op = true, .steps = false, .shared_matmuls = true};
    int rc = backend_wrap_create(inner, &h, &o, out, err);
    if (rc) free(p);
    return rc;
}

void backend_profile_reset(struct backend *prof)
{
    ((struct profile *)backend_wrap_hooks_ctx(prof))->n_rows = 0;
}

static int by_time(const void *a, const void *b)
{
    double x = ((const struct profile_row *)a)->seconds,
           y = ((const struct profile_row *)b)->seconds;
    return (x < y) - (x > y);
}

const struct profile_row *backend_profile_rows(struct backend *prof, size_t *n_rows)
{
    struct profile *p = backend_wrap_hooks_ctx(prof);
    memcpy(p->sorted, p->rows, p->n_rows * sizeof *p->rows);
    qsort(p->sorted, p->n_rows, sizeof *p->sorted, by_time);
    *n_rows = p->n_rows;
    return p->sorted;
}
