/* cpu_matmul: y[n][rows] = x[n][cols] W^T on the CPU.
 *
 * Paths, chosen per call:
 *   packed weight (w->impl, a qpack) + MATMUL_Q8:  activations quantized (k->quantize_q8), then
 *       k->matmul_q8 tiles over 16-row groups x tokens (GEMV at n = 1, GEMM above)
 *   packed weight + MATMUL_F32:  k->matmul_f32 (Q4_1 first gets per-block sums of x)
 *   float weight types:  k->matmul_float (4 x 4 register tiles over rows x tokens)
 *   scalar ISA:  the reference kernels, split the same way
 * The tokens run in chunks that fit the scratch (normally all at once); the work of a chunk is
 * cut into (row groups x up to 64 tokens) tasks, about four per thread, claimed dynamically.
 * A task never splits a dot product, so neither the cut nor the thread count changes a value. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ctx.h"

#define TOK_TILE         64 /* most tokens per task */
#define PREP_TOKENS      8  /* tokens per activation-prep task */
#define PREP_PARALLEL    16 /* tokens from which the prep itself runs on the pool */
#define TASKS_PER_THREAD 4

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static bool use_q8(const struct cpu_ctx *c, const struct bweight *w)
{
    return c->precision == MATMUL_Q8 && ref_q8_type(w->type);
}

size_t cpu_matmul_token_bytes(const struct cpu_ctx *c, const struct bweight *w)
{
    size_t nb = (size_t)w->cols / QK;
    if (use_q8(c, w)) return (size_t)w->cols + nb * (sizeof(float) * 2 + sizeof(int32_t));
    if (w->impl && w->type == QTYPE_Q4_1) return nb * sizeof(float);
    return 0;
}

int cpu_scratch_reserve(struct cpu_ctx *c, size_t bytes)
{
    if (bytes <= c->scratch_bytes) return 0;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes)) return -1;
    free(c->scratch);
    c->scratch = p;
    c->scratch_bytes = bytes;
    return 0;
}

struct mm_job {
    const struct cpu_kernels *k;
    const struct bweight *w;
    const struct qpack *p;
    bool q8;
    const float *x; /* [n][cols] this chunk's tokens */
    struct q8act a; /* q8: this chunk's quantized tokens */
    float *xs;      /* f32 + Q4_1: [n][nb] block sums */
    float *y;       /* [n][rows] */
    int n;
    int64_t units; /* 16-row groups */
    int64_t units_per_task;
    int64_t unit_tasks; /* tasks along the rows */
    int tok_per_task;
};

static void prep_task(void *arg, int task, int worker)
{
    (void)worker;
    struct mm_job *j = arg;
    int t0 = task * PREP_TOKENS, t1 = t0 + PREP_TOKENS < j->n ? t0 + PREP_TOKENS : j->n;
    int64_t cols = j->w->cols, nb = cols / QK;
    for (int t = t0; t < t1; t++) {
        const float *xt = j->x + (size_t)t * (size_t)cols;
        size_t o = (size_t)t * (size_t)nb;
        if (j->q8)
            j->k->quantize_q8(xt, cols, j->a.q + (size_t)t * (size_t)cols, j->a.d + o, j->a.s + o,
                              j->a.sum + o);
        else
            j->k->block_sums(xt, cols, j->xs + o);
    }
}

static void mm_task(void *arg, int task, int worker)
{
    (void)worker;
    struct mm_job *j = arg;
    int64_t ui = task % j->unit_tasks, ti = task / j->unit_tasks;
    int64_t g0 = ui * j->units_per_task;
    int64_t g1 = g0 + j->units_per_task < j->units ? g0 + j->units_per_task : j->units;
    int t0 = (int)ti * j->tok_per_task;
    int t1 = t0 + j->tok_per_task < j->n ? t0 + j->tok_per_task : j->n;
    if (j->p) {
        if (j->q8)
            j->k->matmul_q8(j->p, &j->a, g0, g1, t0, t1, j->y);
        else
            j->k->matmul_f32(j->p, j->x, j->xs, g0, g1, t0, t1, j->y);
        return;
    }
    const struct bweight *w = j->w;
    int64_t r0 = g0 * QPACK_ROWS, r1 = g1 * QPACK_ROWS < w->rows ? g1 * QPACK_ROWS : w->rows;
    if (!j->q8 && j->k->matmul_float) {
        j->k->matmul_float(w, j->x, r0, r1, t0, t1, j->y);
        return;
    }
    float *y = j->y + (size_t)t0 * (size_t)w->rows;
    if (j->q8) {
        struct q8act a = j->a;
        a.q += (size_t)t0 * (size_t)a.cols;
        a.d += (size_t)t0 * (size_t)a.nb;
        a.s += (size_t)t0 * (size_t)a.nb;
        a.sum += (size_t)t0 * (size_t)a.nb;
        ref_matmul_q8_rows(w, &a, t1 - t0, y, r0, r1);
    } else {
        ref_matmul_rows(w, j->x + (size_t)t0 * (size_t)w->cols, t1 - t0, y, r0, r1);
    }
}

/* Carves the scratch for n tokens: q8 tensors, or the block sums. */
static void carve(struct mm_job *j, void *scratch, int n)
{
    int64_t cols = j->w->cols, nb = cols / QK;
    uint8_t *p = scratch;
    if (j->q8) {
        j->a.cols = cols;
        j->a.nb = nb;
        j->a.q = (int8_t *)p;
        p += align64((size_t)n * (size_t)cols);
        j->a.d = (float *)p;
        p += align64((size_t)n * (size_t)nb * sizeof(float));
        j->a.s = (float *)p;
        p += align64((size_t)n * (size_t)nb * sizeof(float));
        j->a.sum = (int32_t *)p;
    } else {
        j->xs = (float *)p;
    }
}

void cpu_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y)
{
    struct cpu_ctx *c = be->ctx;
    if (n <= 0) return;
    struct mm_job j = {.k = c->k, .w = w, .p = w->impl, .q8 = use_q8(c, w)};
    size_t per_token = cpu_matmul_token_bytes(c, w);
    const size_t slack = 4 * 64;
    int chunk = n;
    if (per_token) {
        /* grow to the whole batch if memory allows; else run in the chunks the scratch holds
         * (weight_prepare reserved room for at least 64 tokens) */
        if (cpu_scratch_reserve(c, (size_t)n * per_token + slack) != 0) {
            size_t fit = c->scratch_bytes > slack ? (c->scratch_bytes - slack) / per_token : 0;
            assert(fit >= 1); /* weight_prepare reserved it */
            chunk = fit < (size_t)n ? (int)fit : n;
        }
    }
    int threads = c->n_threads;
    j.units = (w->rows + QPACK_ROWS - 1) / QPACK_ROWS;
    for (int t0 = 0; t0 < n; t0 += chunk) {
        int cnt = n - t0 < chunk ? n - t0 : chunk;
        j.n = cnt;
        j.x = x + (size_t)t0 * (size_t)w->cols;
        j.y = y + (size_t)t0 * (size_t)w->rows;
        if (per_token) {
            carve(&j, c->scratch, cnt);
            int prep_tasks = (cnt + PREP_TOKENS - 1) / PREP_TOKENS;
            if (cnt >= PREP_PARALLEL)
                pool_run(c->pool, prep_task, &j, prep_tasks);
            else
                for (int t = 0; t < prep_tasks; t++) prep_task(&j, t, 0);
        }
        j.tok_per_task = cnt < TOK_TILE ? cnt : TOK_TILE;
        int64_t tok_tasks = (cnt + j.tok_per_task - 1) / j.tok_per_task;
        int64_t target = threads > 1 ? (int64_t)threads * TASKS_PER_THREAD : 1;
        int64_t upt = (j.units * tok_tasks + target - 1) / target;
        j.units_per_task = upt < 1 ? 1 : upt > j.units ? j.units : upt;
        j.unit_tasks = (j.units + j.units_per_task - 1) / j.units_per_task;
        pool_run(c->pool, mm_task, &j, (int)(j.unit_tasks * tok_tasks));
    }
}
