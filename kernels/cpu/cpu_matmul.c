/* cpu_matmul: y[n][rows] = x[n][cols] W^T on the CPU.
 *
 * Paths, chosen per call:
 *   packed weight (w->impl, a qpack) + MATMUL_Q8:  activations quantized (k->quantize_q8), then
 *       k->matmul_q8 tiles over 16-row groups x tokens (GEMV at n = 1, GEMM above)
 *   packed weight + MATMUL_F32:  k->matmul_f32 (Q4_1 first gets per-block sums of x)
 *   float weight types:  k->matmul_float (4 x 4 register tiles over rows x tokens)
 *   scalar ISA:  the reference kernels, split the same way
 * The tokens run in chunks that fit the scratch (normally all at once). A chunk of up to 64 tokens
 * (a decode step, a draft being verified, a short prompt) on several threads is one span of row
 * groups a thread, read as one weight stream, with threads that finish first taking the back half
 * of the others' (mm_span_task); a larger chunk is cut into (row groups x up to 64 tokens) tasks,
 * about four per thread, claimed dynamically. Neither cut splits a dot product, so neither the cut
 * nor the thread count changes a value. cpu_matmul_shared runs weights that read the same input
 * (q, k, v; gate, up) as one job: the activations are prepared once and one pool job (one wait)
 * covers all of them. */
#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ctx.h"

#define TOK_TILE         64 /* most tokens per task */
#define PREP_TOKENS      8  /* tokens per activation-prep task */
#define PREP_PARALLEL    16 /* tokens from which the prep itself runs on the pool */
#define TASKS_PER_THREAD 4
/* Multiply-adds below which a job runs on the calling thread: waking the pool costs more than a
 * LoRA matrix's few thousand (rank x width) for a token or a few. */
#define INLINE_MACS (1 << 16)
/* The fewest row groups a span's owner claims from its front, or another thread takes from its
 * back (mm_span_task) */
#define SPAN_CLAIM_UNITS 2

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
    /* a job of up to TOK_TILE tokens: a span of the parts' groups (concatenated) a thread */
    int n_spans;
    struct mm_span *span;
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

/* Part pt's groups [g0, g1) for tokens [t0, t1); the kernel's weight prefetch runs on to group
 * g_pf (>= g1), where the caller reads on next, so its calls are one stream. */
static void mm_run(const struct mm_job *j, const struct mm_part *pt, int64_t g0, int64_t g1,
                   int64_t g_pf, int t0, int t1)
{
    if (pt->p) {
        if (j->q8)
            j->k->matmul_q8(pt->p, &j->a, g0, g1, g_pf, t0, t1, pt->y);
        else
            j->k->matmul_f32(pt->p, j->x, j->xs, g0, g1, g_pf, t0, t1, pt->y);
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
    mm_run(j, pt, g0, g1, g1, t0, t1);
}

/* Units [u0, u1) of the parts' concatenated groups, all tokens; prefetch runs on to unit u_pf
 * within each part. */
static void mm_run_units(const struct mm_job *j, int64_t u0, int64_t u1, int64_t u_pf)
{
    int64_t base = 0;
    for (int i = 0; i < j->n_parts && u0 < u1; i++) {
        const struct mm_part *pt = &j->part[i];
        int64_t end = base + pt->units;
        if (u0 < end) {
            int64_t g0 = u0 - base, g1 = (u1 < end ? u1 : end) - base;
            int64_t g_pf = (u_pf < end ? u_pf : end) - base;
            mm_run(j, pt, g0, g1, g_pf < g1 ? g1 : g_pf, 0, j->n);
            u0 = base + g1;
        }
        base = end;
    }
}

/* Where span i of n begins: an even unit (the last span ends at the job's end). */
static uint64_t span_edge(int64_t units, int i, int n)
{
    return i == n ? (uint64_t)units : (uint64_t)(units * i / n) & ~(uint64_t)1;
}

static inline uint64_t span_word(uint64_t front, uint64_t back)
{
    return front | back << 32;
}

/* The span's owner takes a quarter of what its span has left from the front (an even count, at
 * least SPAN_CLAIM_UNITS, at most all): [*u0, *u1), and *back, the span's end when it did. False
 * when the span is done. Even counts keep the pair tile's groups together (spans start even). */
static bool span_take_front(_Atomic uint64_t *fb, uint64_t *u0, uint64_t *u1, uint64_t *back)
{
    uint64_t v = atomic_load_explicit(fb, memory_order_relaxed);
    for (;;) {
        uint64_t f = v & 0xffffffffu, b = v >> 32;
        if (f >= b) return false;
        uint64_t take = ((b - f) / 4) & ~(uint64_t)1;
        take = take > SPAN_CLAIM_UNITS ? take : SPAN_CLAIM_UNITS;
        take = take < b - f ? take : b - f;
        if (atomic_compare_exchange_weak_explicit(fb, &v, span_word(f + take, b),
                                                  memory_order_relaxed, memory_order_relaxed)) {
            *u0 = f;
            *u1 = f + take;
            *back = b;
            return true;
        }
    }
}

/* A thread out of work takes the back half of what the span has left (an even count, at least
 * SPAN_CLAIM_UNITS): [*u0, *u1). False when less is left. */
static bool span_take_back(_Atomic uint64_t *fb, uint64_t *u0, uint64_t *u1)
{
    uint64_t v = atomic_load_explicit(fb, memory_order_relaxed);
    for (;;) {
        uint64_t f = v & 0xffffffffu, b = v >> 32;
        uint64_t half = b > f ? ((b - f) / 2) & ~(uint64_t)1 : 0;
        if (half < SPAN_CLAIM_UNITS) return false;
        uint64_t mid = b - half;
        if (atomic_compare_exchange_weak_explicit(fb, &v, span_word(f, mid), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *u0 = mid;
            *u1 = b;
            return true;
        }
    }
}

/* A job of up to 64 tokens (a decode step's weight streams; from 9 tokens compute-bound, yet
 * still fed from DRAM): task i is span i, a run of whole groups that its thread reads front to
 * back in claims of a quarter of what is left, its kernel calls one prefetch stream (their
 * horizon, mm_run_units); a thread that runs out takes the back half of the span with the most
 * left, again and again. So each thread restarts its weight stream once, where every task
 * restarts one (its first lines wait a DRAM round trip before the walker, pf_walk.h, runs
 * ahead), and the threads still end together where a fixed cut would leave one waiting. On the
 * Zen 4, 2 threads, against four tasks a thread (from 9 tokens; one from 1 to 8):
 * `bench --kernels --batches 16` from DRAM, the 1536x576 Q4_1 matmul 52-55 against 57-61 us;
 * `bench --decode-batches 4,16 --pp 160`, 5 alternating rounds, ms a step, batch 4 4.83 / 5.06,
 * batch 16 13.49 / 14.58 (each round faster); whole serving runs, whose prefill this leaves
 * alone, within their noise (docs/benchmarks.md, 2026-12-06 04:33 UTC). The one-task-a-thread cut
 * it replaces for 1-8 tokens had measured on Zen 5, 2 tasks a thread / 1, tg128 Q4_0 727 / 827
 * where two threads read 81 GB/s. Each group is still one kernel call's, over all the tokens: which
 * thread runs it changes no bit. */
static void mm_span_task(void *arg, int task, int worker)
{
    (void)worker;
    struct mm_job *j = arg;
    uint64_t u0, u1, back;
    while (span_take_front(&j->span[task].fb, &u0, &u1, &back))
        mm_run_units(j, (int64_t)u0, (int64_t)u1, (int64_t)back);
    for (;;) {
        int best = -1;
        uint64_t most = 2 * SPAN_CLAIM_UNITS - 1;
        for (int i = 0; i < j->n_spans; i++) {
            uint64_t v = atomic_load_explicit(&j->span[i].fb, memory_order_relaxed);
            uint64_t f = v & 0xffffffffu, b = v >> 32;
            if (b > f && b - f > most) {
                most = b - f;
                best = i;
            }
        }
        if (best < 0 || !span_take_back(&j->span[best].fb, &u0, &u1)) return;
        mm_run_units(j, (int64_t)u0, (int64_t)u1, (int64_t)u1);
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
 * chunk of tokens, then one pool job for all the weights: a span a thread (mm_span_task) for up
 * to TOK_TILE tokens, else (row groups x tokens) tasks, about TASKS_PER_THREAD per thread in
 * all, each weight's rows cut evenly. */
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
    int64_t all_units = 0, macs = 0;
    for (int i = 0; i < nw; i++) {
        macs += ws[i]->rows * ws[i]->cols * (int64_t)n;
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
        for (int i = 0; i < nw; i++) j.part[i].y = ys[i] + (size_t)t0 * (size_t)ws[i]->rows;
        bool inline_job = macs <= INLINE_MACS || c->n_threads == 1;
        if (cnt <= TOK_TILE && !inline_job) {
            j.n_spans = c->n_threads;
            j.span = c->spans;
            for (int i = 0; i < j.n_spans; i++)
                atomic_store_explicit(&j.span[i].fb,
                                      span_word(span_edge(all_units, i, j.n_spans),
                                                span_edge(all_units, i + 1, j.n_spans)),
                                      memory_order_relaxed); /* pool_run publishes them */
            pool_run(c->pool, mm_span_task, &j, j.n_spans);
            continue;
        }
        j.tok_per_task = cnt < TOK_TILE ? cnt : TOK_TILE;
        int64_t tok_tasks = (cnt + j.tok_per_task - 1) / j.tok_per_task;
        int64_t target = inline_job ? 1 : (int64_t)c->n_threads * TASKS_PER_THREAD;
        int64_t upt = (all_units * tok_tasks + target - 1) / target;
        /* whole pairs of groups (KERN_PAIR_MIN_TOKENS): no task ends on a lone one */
        if (cnt >= KERN_PAIR_MIN_TOKENS && upt > 1) upt += upt & 1;
        int tasks = 0;
        for (int i = 0; i < nw; i++) {
            struct mm_part *pt = &j.part[i];
            pt->units_per_task = upt < 1 ? 1 : upt > pt->units ? pt->units : upt;
            pt->unit_tasks = (pt->units + pt->units_per_task - 1) / pt->units_per_task;
            pt->first_task = tasks;
            tasks += (int)(pt->unit_tasks * tok_tasks);
        }
        if (inline_job && c->n_threads > 1)
            for (int t = 0; t < tasks; t++) mm_task(&j, t, 0);
        else
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
