/* cpu_matmul: y[n][rows] = x[n][cols] W^T on the CPU.
 *
 * Paths, chosen per call:
 *   packed weight (w->impl, a qpack) + MATMUL_Q8:  activations quantized (k->quantize_q8), then
 *       k->matmul_q8 tiles over 16-row groups x tokens (GEMV at n = 1, GEMM above)
 *   packed weight + MATMUL_F32:  k->matmul_f32 (Q4_1 first gets per-block sums of x)
 *   float weight types:  k->matmul_float (4 x 4 register tiles over rows x tokens)
 *   scalar ISA:  the reference kernels, split the same way
 * The tokens run in chunks that fit the scratch (normally all at once); the work of a chunk is
 * cut into (row groups x up to 64 tokens) tasks, about four per thread (one for up to FEW_TOKENS),
 * claimed dynamically. A task never splits a dot product, so neither the cut nor the thread count
 * changes a value. cpu_matmul_shared runs weights that read the same input (q, k, v; gate, up) as
 * one job: the activations are prepared once and one pool job (one wait) covers all of them. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ctx.h"

#define TOK_TILE         64 /* most tokens per task */
#define PREP_TOKENS      8  /* tokens per activation-prep task */
#define PREP_PARALLEL    16 /* tokens from which the prep itself runs on the pool */
#define TASKS_PER_THREAD 4
/* A few tokens' matmul (a decode batch of 1-8, a draft being verified) is mostly a weight stream,
 * and each task restarts one: its first lines wait a full DRAM round trip before the prefetch
 * walker (pf_walk.h) runs ahead. So each thread gets one task, a run of whole groups. Zen 5, 2
 * threads, `quern bench --pp 16 --tg 128 --reps 2`, tokens/s, medians of 4-5 alternating rounds,
 * 2 tasks a thread / 1: in a phase where two threads read 81 GB/s, Q4_0 727 / 827, Q4_1 675 /
 * 752, Q8_0 499 / 551 (Q4_0 then at 92 % of the read roofline); where they read 42 GB/s (one
 * thread as much), 601 / 612, 548 / 558, 360 / 361; with a busy loop on one of the two vCPUs,
 * 292-334 / 302-319. `--decode-batches 1,2,4,8`, ms a step, 2 / 1: 1.47 / 1.28-1.31, 1.60-1.62 /
 * 1.46-1.54, 2.03 / 1.84-1.88, 3.23-3.32 / 3.10-3.13. (On the Zen 4, 1 a thread had measured
 * +17 % on Q4_0 and level on Q8_0 against 4; 2 was kept then as slack for a preempted thread,
 * which the busy-loop rounds above do not show to matter.) From 9 tokens a step is compute-bound
 * and the threads' balance counts: 4 a thread. */
#define TASKS_PER_THREAD_FEW 1
#define FEW_TOKENS           8

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

/* One weight of a job: its output and its share of the job's task list. */
struct mm_part {
    const struct bweight *w;
    const struct qpack *p;
    float *y;      /* [n][rows] this chunk's rows of the output */
    int64_t units; /* 16-row groups */
    int64_t units_per_task;
    int64_t unit_tasks; /* tasks along the rows */
    int first_task;     /* the job's task index of this part's first task */
};

#define MM_PARTS_MAX 4

/* A job: up to MM_PARTS_MAX weights of the same input width applied to one chunk of tokens,
 * whose activations are prepared once for all of them. */
struct mm_job {
    const struct cpu_kernels *k;
    bool q8;
    int64_t cols;
    const float *x; /* [n][cols] this chunk's tokens */
    struct q8act a; /* q8: this chunk's quantized tokens */
    float *xs;      /* f32 with a packed weight: [n][nb] block sums (Q4_1 reads them) */
    int n;
    int tok_per_task;
    int n_parts;
    struct mm_part part[MM_PARTS_MAX];
};

static void prep_task(void *arg, int task, int worker)
{
    (void)worker;
    struct mm_job *j = arg;
    int t0 = task * PREP_TOKENS, t1 = t0 + PREP_TOKENS < j->n ? t0 + PREP_TOKENS : j->n;
    int64_t cols = j->cols, nb = cols / QK;
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
    int pi = 0;
    while (pi + 1 < j->n_parts && task >= j->part[pi + 1].first_task) pi++;
    const struct mm_part *pt = &j->part[pi];
    int64_t local = task - pt->first_task;
    int64_t ui = local % pt->unit_tasks, ti = local / pt->unit_tasks;
    int64_t g0 = ui * pt->units_per_task;
    int64_t g1 = g0 + pt->units_per_task < pt->units ? g0 + pt->units_per_task : pt->units;
    int t0 = (int)ti * j->tok_per_task;
    int t1 = t0 + j->tok_per_task < j->n ? t0 + j->tok_per_task : j->n;
    if (pt->p) {
        if (j->q8)
            j->k->matmul_q8(pt->p, &j->a, g0, g1, t0, t1, pt->y);
        else
            j->k->matmul_f32(pt->p, j->x, j->xs, g0, g1, t0, t1, pt->y);
        return;
    }
    const struct bweight *w = pt->w;
    int64_t r0 = g0 * QPACK_ROWS, r1 = g1 * QPACK_ROWS < w->rows ? g1 * QPACK_ROWS : w->rows;
    if (!j->q8 && j->k->matmul_float) {
        j->k->matmul_float(w, j->x, r0, r1, t0, t1, pt->y);
        return;
    }
    float *y = pt->y + (size_t)t0 * (size_t)w->rows;
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
    int64_t cols = j->cols, nb = cols / QK;
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

/* Weights that can share one job: the same input width and the same activation preparation. */
static bool can_share(const struct cpu_ctx *c, const struct bweight *a, const struct bweight *b)
{
    return a->cols == b->cols && use_q8(c, a) == use_q8(c, b) &&
           cpu_matmul_token_bytes(c, a) == cpu_matmul_token_bytes(c, b);
}

/* Runs ws[0..nw) (can_share, nw <= MM_PARTS_MAX) on x[n]: the activations prepared once per
 * chunk of tokens, then every weight's (row groups x tokens) tasks in one pool job, about
 * TASKS_PER_THREAD per thread in all, each weight's rows cut evenly. */
static void matmul_set(struct cpu_ctx *c, const struct bweight *const *ws, int nw, const float *x,
                       int n, float *const *ys)
{
    const struct bweight *w0 = ws[0];
    struct mm_job j = {.k = c->k, .q8 = use_q8(c, w0), .cols = w0->cols, .n_parts = nw};
    size_t per_token = cpu_matmul_token_bytes(c, w0);
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
    int64_t all_units = 0;
    for (int i = 0; i < nw; i++) {
        j.part[i].w = ws[i];
        j.part[i].p = ws[i]->impl;
        j.part[i].units = (ws[i]->rows + QPACK_ROWS - 1) / QPACK_ROWS;
        all_units += j.part[i].units;
    }
    for (int t0 = 0; t0 < n; t0 += chunk) {
        int cnt = n - t0 < chunk ? n - t0 : chunk;
        j.n = cnt;
        j.x = x + (size_t)t0 * (size_t)w0->cols;
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
        int per = cnt <= FEW_TOKENS ? TASKS_PER_THREAD_FEW : TASKS_PER_THREAD;
        int64_t target = c->n_threads > 1 ? (int64_t)c->n_threads * per : 1;
        int64_t upt = (all_units * tok_tasks + target - 1) / target;
        /* whole pairs of groups (KERN_PAIR_MIN_TOKENS): no task ends on a lone one */
        if (cnt >= KERN_PAIR_MIN_TOKENS && upt > 1) upt += upt & 1;
        int tasks = 0;
        for (int i = 0; i < nw; i++) {
            struct mm_part *pt = &j.part[i];
            pt->y = ys[i] + (size_t)t0 * (size_t)ws[i]->rows;
            pt->units_per_task = upt < 1 ? 1 : upt > pt->units ? pt->units : upt;
            pt->unit_tasks = (pt->units + pt->units_per_task - 1) / pt->units_per_task;
            pt->first_task = tasks;
            tasks += (int)(pt->unit_tasks * tok_tasks);
        }
        pool_run(c->pool, mm_task, &j, tasks);
    }
}

void cpu_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y)
{
    if (n <= 0) return;
    matmul_set(be->ctx, &w, 1, x, n, &y);
}

void cpu_matmul_shared(struct backend *be, const struct bweight *const *w, int n_w, const float *x,
                       int n, float *const *y)
{
    struct cpu_ctx *c = be->ctx;
    if (n <= 0) return;
    /* consecutive weights that can share a job take one; any other starts the next */
    for (int i = 0; i < n_w;) {
        int k = 1;
        while (i + k < n_w && k < MM_PARTS_MAX && can_share(c, w[i], w[i + k])) k++;
        matmul_set(c, w + i, k, x, n, y + i);
        i += k;
    }
}
