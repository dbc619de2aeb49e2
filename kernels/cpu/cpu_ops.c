/* cpu_ops: the CPU backend's ops other than matmul, each a loop over tokens (or token x head)
 * calling the ISA's row kernel; large batches are split across the pool by whole rows, small
 * ones run on the calling thread (a pool round trip costs more than a 576-wide RMSNorm). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ctx.h"

#define PAR_ELEMS 65536 /* elements from which an elementwise op uses the pool */
/* ... and silu_mul, whose exp and division cost about ten adds an element: a 16-token step's
 * 24,576 ran on one thread, 19 us a layer */
#define PAR_ELEMS_SILU 8192
/* (key, head) pairs from which attention uses the pool (SmolLM2's 9 heads: context 228). Its
 * reads miss the caches, and two threads' misses overlap, so a lower threshold was tried: 512
 * pairs, and every size. Where two threads read 42 GB/s the attention of a one-token step took
 * 0.55-0.75x the time below 2048; where they read 81 GB/s the caller alone is as fast there, and
 * tg128 after a 16-token prompt ran 0.96x (Q4_0, 5 alternating rounds, medians 779 against 815
 * tok/s) with a wider spread. docs/benchmarks.md, 2026-12-05 11:25 UTC. */
#define PAR_KEYS 2048

static struct cpu_ctx *ctx_of(struct backend *be)
{
    return be->ctx;
}

/* The most of a row embed unpacks at once, on the stack (Q8_0 at 8192 columns is 8704 bytes); a
 * longer row goes in pieces: the table's file bytes may be gone (backend.h: weight_prepare). */
#define EMBED_ROW_MAX 16384
#define EMBED_TOKENS  8 /* rows per embed task */

struct embed_job {
    const struct bweight *table;
    const int32_t *tokens;
    int n;
    float *out;
};

static void embed_task(void *arg, int task, int worker)
{
    (void)worker;
    const struct embed_job *j = arg;
    int t0 = task * EMBED_TOKENS, t1 = t0 + EMBED_TOKENS < j->n ? t0 + EMBED_TOKENS : j->n;
    size_t cols = (size_t)j->table->cols;
    const struct qpack *p = j->table->impl;
    size_t be = qtype_block_elems(j->table->type), bb = qtype_block_bytes(j->table->type);
    int64_t nb = (int64_t)(cols / be), step = (int64_t)(EMBED_ROW_MAX / bb);
    _Alignas(64) uint8_t row[EMBED_ROW_MAX];
    for (int i = t0; i < t1; i++)
        for (int64_t b0 = 0; b0 < nb; b0 += step) { /* a longer row than the buffer in pieces */
            int64_t n = nb - b0 < step ? nb - b0 : step;
            qpack_unpack_blocks(p, j->tokens[i], b0, n, row);
            qtype_dequantize_row(j->table->type, row, j->out + (size_t)i * cols + (size_t)b0 * be,
                                 (size_t)n * be);
        }
}

/* A packed table's rows come from its qpack, in memory since the load; the file's pages behind
 * it were dropped (model.c), and reading a row there took a page fault a token: 14-16 us of a
 * 1.2-1.4 ms decode step (Zen 5), now 1.5-2. The row unpacks to the file's bytes, so the values
 * are the same. A row's bytes lie in 162 lines of the packed layout (Q8_0, 576 columns), misses
 * that a prompt's rows share between the threads: 512 tokens 0.30 ms from the file pages that
 * earlier runs had faulted in, 0.69-0.71 ms from the qpack on one thread, 0.40-0.44 on two. */
void cpu_embed(struct backend *be, const struct bweight *table, const int32_t *tokens, int n,
               float *out)
{
    if (!table->impl) {
        ref_embed(table, tokens, n, out);
        return;
    }
    struct embed_job j = {table, tokens, n, out};
    pool_run(ctx_of(be)->pool, embed_task, &j, (n + EMBED_TOKENS - 1) / EMBED_TOKENS);
}

struct rows_job {
    const struct cpu_kernels *k;
    float *out;
    const float *x, *w;
    int n, dim, per_task;
    float eps;
};

static void rmsnorm_task(void *arg, int task, int worker)
{
    (void)worker;
    struct rows_job *j = arg;
    int t0 = task * j->per_task, t1 = t0 + j->per_task < j->n ? t0 + j->per_task : j->n;
    for (int t = t0; t < t1; t++)
        j->k->rmsnorm(j->out + (size_t)t * (size_t)j->dim, j->x + (size_t)t * (size_t)j->dim, j->w,
                      j->dim, j->eps);
}

/* Tasks of whole rows covering about PAR_ELEMS / 4 elements each (1 task when small). */
static int row_tasks(int n, int dim, int *per_task)
{
    size_t total = (size_t)n * (size_t)dim;
    if (total < PAR_ELEMS) {
        *per_task = n;
        return 1;
    }
    size_t rows = (PAR_ELEMS / 4) / (size_t)dim;
    *per_task = rows < 1 ? 1 : (int)rows;
    return (n + *per_task - 1) / *per_task;
}

void cpu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                 float eps)
{
    struct cpu_ctx *c = ctx_of(be);
    struct rows_job j = {.k = c->k, .out = out, .x = x, .w = w, .n = n, .dim = dim, .eps = eps};
    int tasks = row_tasks(n, dim, &j.per_task);
    pool_run(c->pool, rmsnorm_task, &j, tasks);
}

/* Elementwise ops split into equal spans of at most SPAN elements, a multiple of 16 (a cache
 * line), at least one per thread. */
#define SPAN 16384

enum elem_op { ELEM_ADD, ELEM_SILU_MUL, ELEM_GELU_MUL, ELEM_SCALE, ELEM_SOFTCAP };

struct elem_job {
    const struct cpu_kernels *k;
    enum elem_op op;
    float *x;
    const float *y;
    float f; /* scale's factor, softcap's cap */
    size_t n, span;
};

static void elem_run(const struct elem_job *j, size_t i0, size_t len)
{
    float *x = j->x + i0;
    const float *y = j->y ? j->y + i0 : NULL;
    switch (j->op) {
    case ELEM_ADD:
        j->k->add(x, y, len);
        return;
    case ELEM_SILU_MUL:
        j->k->silu_mul(x, y, len);
        return;
    case ELEM_GELU_MUL:
        j->k->gelu_mul(x, y, len);
        return;
    case ELEM_SCALE:
        for (size_t i = 0; i < len; i++) x[i] *= j->f;
        return;
    case ELEM_SOFTCAP:
        j->k->softcap(x, j->f, len);
        return;
    }
}

static void elem_task(void *arg, int task, int worker)
{
    (void)worker;
    struct elem_job *j = arg;
    size_t i0 = (size_t)task * j->span, len = j->n - i0 < j->span ? j->n - i0 : j->span;
    elem_run(j, i0, len);
}

static void run_elem(struct cpu_ctx *c, enum elem_op op, float *x, const float *y, float f,
                     size_t n)
{
    struct elem_job j = {.k = c->k, .op = op, .x = x, .y = y, .f = f, .n = n};
    /* exp and a division per element cost about ten adds */
    bool costly = op == ELEM_SILU_MUL || op == ELEM_GELU_MUL || op == ELEM_SOFTCAP;
    if (n < (costly ? PAR_ELEMS_SILU : PAR_ELEMS)) {
        elem_run(&j, 0, n);
        return;
    }
    size_t tasks = (n + SPAN - 1) / SPAN, threads = (size_t)pool_threads(c->pool);
    tasks = tasks < threads ? threads : tasks;
    j.span = ((n + tasks - 1) / tasks + 15) & ~(size_t)15;
    pool_run(c->pool, elem_task, &j, (int)((n + j.span - 1) / j.span));
}

void cpu_add(struct backend *be, float *x, const float *y, size_t n)
{
    run_elem(ctx_of(be), ELEM_ADD, x, y, 0, n);
}

/* On the calling thread: a bias is a few hundred floats a token, less than a job's wake-up. */
void cpu_add_rows(struct backend *be, float *x, const float *b, int n, int dim)
{
    const struct cpu_kernels *k = ctx_of(be)->k;
    for (int i = 0; i < n; i++) k->add(x + (size_t)i * (size_t)dim, b, (size_t)dim);
}

void cpu_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    run_elem(ctx_of(be), ELEM_SILU_MUL, g, u, 0, n);
}

void cpu_gelu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    run_elem(ctx_of(be), ELEM_GELU_MUL, g, u, 0, n);
}

void cpu_scale(struct backend *be, float *x, float s, size_t n)
{
    run_elem(ctx_of(be), ELEM_SCALE, x, NULL, s, n);
}

void cpu_softcap(struct backend *be, float *x, float cap, size_t n)
{
    run_elem(ctx_of(be), ELEM_SOFTCAP, x, NULL, cap, n);
}

struct moe_job {
    float *out;
    const float *y, *w;
    const int32_t *rows;
    int n, k, dim, per_task;
};

/* Row by row: the products of a token's experts join its row in the order given (backend.h),
 * each rounded before the add, so the row's bits are the reference's. */
static void moe_combine_task(void *arg, int task, int worker)
{
    (void)worker;
    const struct moe_job *j = arg;
    int t0 = task * j->per_task, t1 = t0 + j->per_task < j->n ? t0 + j->per_task : j->n;
    size_t dim = (size_t)j->dim;
    for (int t = t0; t < t1; t++) {
        float *o = j->out + (size_t)t * dim;
        for (size_t d = 0; d < dim; d++) o[d] = 0.0f;
        for (int e = 0; e < j->k; e++) {
            size_t at = (size_t)t * (size_t)j->k + (size_t)e;
            const float *y = j->y + (size_t)j->rows[at] * dim;
            float w = j->w[at];
            for (size_t d = 0; d < dim; d++) {
                float p = w * y[d];
                o[d] += p;
            }
        }
    }
}

void cpu_moe_combine(struct backend *be, float *out, const float *y, const int32_t *rows,
                     const float *w, int n, int k, int dim)
{
    struct moe_job j = {.out = out, .y = y, .w = w, .rows = rows, .n = n, .k = k, .dim = dim};
    int tasks = row_tasks(n, dim * k, &j.per_task);
    pool_run(ctx_of(be)->pool, moe_combine_task, &j, tasks);
}

void cpu_rope_table_free(struct rope_table *rt)
{
    free(rt->cos);
    free(rt->sin);
    *rt = (struct rope_table){0};
}

/* Makes rows 0..need-1 of c's table for rs valid (the other table, used less recently, gives
 * way to a new rope); NULL when out of memory. */
static const struct rope_table *rope_table_fill(struct cpu_ctx *c, int need,
                                                const struct rope_spec *rs)
{
    int i = rope_key_matches(&c->rope[c->rope_last].key, rs)    ? c->rope_last
            : rope_key_matches(&c->rope[!c->rope_last].key, rs) ? !c->rope_last
                                                                : -1;
    if (i < 0) {
        i = !c->rope_last;
        cpu_rope_table_free(&c->rope[i]);
        rope_key_set(&c->rope[i].key, rs);
    }
    c->rope_last = i;
    struct rope_table *rt = &c->rope[i];
    if (need <= rt->n_pos) return rt;
    int rot_dim = rs->rot_dim;
    if (need > rt->cap) {
        int cap = rt->cap ? rt->cap : 256;
        while (cap < need) cap *= 2;
        size_t bytes = (size_t)cap * (size_t)rot_dim * sizeof(float);
        float *nc = realloc(rt->cos, bytes);
        if (!nc) return NULL;
        rt->cos = nc;
        float *ns = realloc(rt->sin, bytes);
        if (!ns) return NULL;
        rt->sin = ns;
        rt->cap = cap;
    }
    double inv[ROPE_MAX_PAIRS];
    for (int i = 0; i < rot_dim / 2; i++) inv[i] = rope_inv_freq(rs, i);
    double ms = rope_mscale(rs);
    for (int p = rt->n_pos; p < need; p++) {
        float *cr = rt->cos + (size_t)p * (size_t)rot_dim,
              *sr = rt->sin + (size_t)p * (size_t)rot_dim;
        for (int d = 0; d < rot_dim; d += 2) {
            /* the expression ref_rope evaluates, so the results match it bit for bit */
            double theta = (double)p * inv[d / 2];
            float co = (float)(cos(theta) * ms), si = (float)(sin(theta) * ms);
            cr[d] = co;
            cr[d + 1] = co;
            sr[d] = -si;
            sr[d + 1] = si;
        }
    }
    rt->n_pos = need;
    return rt;
}

struct rope_job {
    const struct cpu_kernels *k;
    const struct rope_table *rt;
    float *x;
    const int32_t *pos;
    int n, n_heads, head_dim, rot_dim, per_task;
};

static void rope_task(void *arg, int task, int worker)
{
    (void)worker;
    struct rope_job *j = arg;
    int t0 = task * j->per_task, t1 = t0 + j->per_task < j->n ? t0 + j->per_task : j->n;
    size_t stride = (size_t)j->n_heads * (size_t)j->head_dim;
    for (int t = t0; t < t1; t++) {
        size_t row = (size_t)j->pos[t] * (size_t)j->rot_dim;
        j->k->rope(j->x + (size_t)t * stride, j->n_heads, j->head_dim, j->rot_dim, j->rt->cos + row,
                   j->rt->sin + row);
    }
}

void cpu_rope(struct backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
              const struct rope_spec *rs)
{
    int rot_dim = rs->rot_dim;
    struct cpu_ctx *c = ctx_of(be);
    int need = 0;
    for (int i = 0; i < n; i++) need = pos[i] + 1 > need ? pos[i] + 1 : need;
    const struct rope_table *rt = rot_dim > 0 ? rope_table_fill(c, need, rs) : NULL;
    if (!rt) {
        ref_rope(x, pos, n, n_heads, head_dim, rs); /* same values, slower */
        return;
    }
    struct rope_job j = {.k = c->k,
                         .rt = rt,
                         .x = x,
                         .pos = pos,
                         .n = n,
                         .n_heads = n_heads,
                         .head_dim = head_dim,
                         .rot_dim = rot_dim};
    int tasks = row_tasks(n, n_heads * head_dim, &j.per_task);
    pool_run(c->pool, rope_task, &j, tasks);
}

struct kv_write_job {
    const struct cpu_kernels *k;
    void *k_cache, *v_cache;
    const float *kx, *vx;
    const struct attn_batch *b;
    enum kv_kind kv; /* KV_F16 or KV_Q8 */
    int kv_dim, per_task;
};

#define KV_WRITE_PAR_TOKENS 8 /* tokens from which the fp16 or Q8_0 KV write runs on the pool */

static void kv_write_task(void *arg, int task, int worker)
{
    (void)worker;
    struct kv_write_job *j = arg;
    int t0 = task * j->per_task,
        t1 = t0 + j->per_task < j->b->n_tokens ? t0 + j->per_task : j->b->n_tokens;
    size_t n = (size_t)j->kv_dim, row = kv_units(j->kv, n);
    for (int i = t0; i < t1; i++) {
        size_t dst = (size_t)j->b->slot[i] * row, src = (size_t)i * n;
        if (j->kv == KV_Q8) {
            j->k->quantize_kv_q8(j->kx + src, (struct block_q8_0 *)((uint8_t *)j->k_cache + dst),
                                 n);
            j->k->quantize_kv_q8(j->vx + src, (struct block_q8_0 *)((uint8_t *)j->v_cache + dst),
                                 n);
        } else {
            j->k->to_fp16(j->kx + src, (uint16_t *)j->k_cache + dst, n);
            j->k->to_fp16(j->vx + src, (uint16_t *)j->v_cache + dst, n);
        }
    }
}

void cpu_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *k, const float *v,
                  const struct attn_batch *b, int kv_dim)
{
    struct cpu_ctx *c = ctx_of(be);
    if (c->kv == KV_F32) {
        ref_kv_write(k_cache, v_cache, k, v, b, kv_dim);
        return;
    }
    struct kv_write_job j = {.k = c->k,
                             .kv = c->kv,
                             .k_cache = k_cache,
                             .v_cache = v_cache,
                             .kx = k,
                             .vx = v,
                             .b = b,
                             .kv_dim = kv_dim};
    int threads = pool_threads(c->pool);
    if (b->n_tokens < KV_WRITE_PAR_TOKENS || threads < 2) {
        j.per_task = b->n_tokens;
        kv_write_task(&j, 0, 0);
        return;
    }
    /* each token's rows land in a cold slot (a store miss each line): several threads keep
     * more of those misses in flight */
    j.per_task = (b->n_tokens + 2 * threads - 1) / (2 * threads);
    pool_run(c->pool, kv_write_task, &j, (b->n_tokens + j.per_task - 1) / j.per_task);
}

/* Keys token t reads. */
static int64_t attn_keys_of(const struct attn_batch *b, int t)
{
    return (int64_t)b->pos[t] + 1 - attn_first_key(b, b->pos[t]);
}

/* A task's tokens: a run of consecutive tokens of one sequence (at most ATTN_TOKENS), whose
 * rows share every K and V read (see attn_rows.h); cost = the keys its rows read. */
struct attn_run {
    int t0, t1;
    int64_t cost;
};

struct attn_job {
    const struct cpu_kernels *k;
    enum kv_kind kv;
    float *out;
    const float *q;
    const void *k_cache, *v_cache;
    const struct attn_batch *b;
    const struct attn_shape *s;
    const struct attn_run *runs; /* NULL: task i covers tokens [i * run_tokens, ...) */
    int run_tokens;
    int pieces; /* query head ranges per run: n_kv_heads (a kv head's group each), 1 (every
                   head, the KV slots read whole) or another cut of the heads */
};

/* tokens per attention task: with the GQA heads of one kv head, a set of rows that shares
 * every K and V read (see attn_rows.h). A prompt long enough to give every thread two tasks of
 * ATTN_TOKENS_LONG takes those: a set of 16 tokens (48 rows for SmolLM2) reads its keys once
 * where four sets of 4 read them four times; a 512-token prefill's attention 0.85x the time
 * (2 threads, 4 alternating rounds). A short one (a draft being verified) keeps tasks enough
 * for the threads. */
#define ATTN_TOKENS      4
#define ATTN_TOKENS_LONG 16
/* runs the task list is built for; a batch with more (a long multi-sequence prefill) has tasks
 * enough that fixed groups of run_tokens balance the pool */
#define ATTN_RUNS_MAX 256

/* The table's kernel for the cache's kind: rows whole (pp NULL) or partitions pp. */
static void attn_call(const struct attn_job *j, int t0, int t1, int h0, int h1,
                      const struct attn_parts *pp)
{
    const struct cpu_kernels *k = j->k;
    switch (j->kv) {
    case KV_Q8:
        if (pp)
            k->attention_q8_part(j->out, j->q, j->k_cache, j->v_cache, j->b, j->s, t0, t1, h0, h1,
                                 pp);
        else
            k->attention_q8(j->out, j->q, j->k_cache, j->v_cache, j->b, j->s, t0, t1, h0, h1);
        return;
    case KV_F16:
        if (pp)
            k->attention_f16_part(j->out, j->q, j->k_cache, j->v_cache, j->b, j->s, t0, t1, h0, h1,
                                  pp);
        else
            k->attention_f16(j->out, j->q, j->k_cache, j->v_cache, j->b, j->s, t0, t1, h0, h1);
        return;
    case KV_F32:
        break;
    }
    if (pp)
        k->attention_part(j->out, j->q, j->k_cache, j->v_cache, j->b, j->s, t0, t1, h0, h1, pp);
    else
        k->attention(j->out, j->q, j->k_cache, j->v_cache, j->b, j->s, t0, t1, h0, h1);
}

static void attn_task(void *arg, int task, int worker)
{
    (void)worker;
    struct attn_job *j = arg;
    int piece = task % j->pieces, t0, t1, n_heads = j->s->n_heads;
    if (j->runs) {
        t0 = j->runs[task / j->pieces].t0;
        t1 = j->runs[task / j->pieces].t1;
    } else {
        t0 = task / j->pieces * j->run_tokens;
        t1 = t0 + j->run_tokens < j->b->n_tokens ? t0 + j->run_tokens : j->b->n_tokens;
    }
    int h0 = piece * n_heads / j->pieces, h1 = (piece + 1) * n_heads / j->pieces;
    attn_call(j, t0, t1, h0, h1, NULL);
}

static int attn_run_costlier(const void *a, const void *b)
{
    const struct attn_run *x = a, *y = b;
    return x->cost < y->cost ? 1 : x->cost > y->cost ? -1 : x->t0 - y->t0;
}

/* Cuts the batch into runs, costliest first (the pool claims tasks in order, so the long
 * contexts start first and the short ones fill in behind them); 0 when there are more than
 * ATTN_RUNS_MAX. A decode batch is one run per sequence: grouping tokens of different
 * sequences shares no reads and only makes the tasks uneven. */
static int attn_runs(const struct attn_batch *b, int run_tokens, struct attn_run *runs)
{
    int n = 0;
    for (int t = 0; t < b->n_tokens;) {
        if (n == ATTN_RUNS_MAX) return 0;
        struct attn_run r = {.t0 = t};
        for (; t < b->n_tokens && t - r.t0 < run_tokens && b->seq[t] == b->seq[r.t0]; t++)
            r.cost += attn_keys_of(b, t);
        r.t1 = t;
        runs[n++] = r;
    }
    qsort(runs, (size_t)n, sizeof *runs, attn_run_costlier);
    return n;
}

/* Head ranges per token for a decode batch too small for whole-slot tasks whose kv heads do
 * not divide among the threads (one token, three kv heads, two threads: one thread would run two
 * of the three tasks, and attention at context 512 ran 1.19x faster on two threads than on
 * one): the fewest ranges that make the task count a multiple of the threads. A range that cuts
 * a kv head's group reads that head's K and V in both of its tasks, and each row's arithmetic
 * is unchanged (attn_rows.h). */
static int decode_pieces(int n_runs, int threads, const struct attn_shape *s)
{
    for (int p = 2; p < s->n_heads; p++)
        if ((n_runs * p) % threads == 0) return p;
    return s->n_heads;
}

/* Token t's first partition (attn_part.h) and how many it has from there on. */
static int token_parts(const struct attn_batch *b, int t, int *first)
{
    *first = attn_first_key(b, b->pos[t]) / ATTN_PART;
    return attn_part_count(b->pos[t] + 1) - *first;
}

/* One partition of one token's every head (attn_part.h). */
struct attn_part_job {
    const struct attn_job *j;
    struct attn_parts pp; /* p0, p1 set per task */
};

static void attn_part_task(void *arg, int task, int worker)
{
    (void)worker;
    const struct attn_part_job *pj = arg;
    const struct attn_job *j = pj->j;
    int t = 0, np, first;
    while (task >= (np = token_parts(j->b, t, &first))) {
        task -= np;
        t++;
    }
    struct attn_parts pp = pj->pp;
    pp.p0 = first + task;
    pp.p1 = first + task + 1;
    attn_call(j, t, t + 1, 0, j->s->n_heads, &pp);
}

/* A decode batch with fewer tokens than two a thread, or one whose costliest sequence outweighs
 * a thread's share (attn_runs_uneven), one of them at a context longer than a partition: its
 * rows' partitions as tasks, every head of a token in each (whole KV slots),
 * then folded in order (attn_part.h). Cut by heads instead, one token's three kv heads over two
 * threads read the cut one's K and V twice. One sequence, 2 threads, Zen 5, Q4_0, a decode step
 * at context 4096: 6.23-6.65 -> 3.50-3.67 ms (AVX2 kernels 5.97 -> 4.38), at 1024: 2.16-2.29
 * -> 1.79-1.90. Returns 1 when it does not apply. */
static int attention_by_parts(struct cpu_ctx *c, const struct attn_job *j)
{
    const struct attn_batch *b = j->b;
    const struct attn_shape *s = j->s;
    if (!c->k->attention_part || (s->head_dim != 64 && s->head_dim != 128 && s->head_dim != 256))
        return 1;
    int max_parts = 0, most = 0, tasks = 0, first;
    for (int t = 0; t < b->n_tokens; t++) {
        int np = token_parts(b, t, &first);
        max_parts = first + np > max_parts ? first + np : max_parts; /* records by partition */
        most = np > most ? np : most;
        tasks += np;
    }
    if (most < 2) return 1;
    size_t recs = (size_t)b->n_tokens * (size_t)s->n_heads * (size_t)max_parts;
    if (cpu_scratch_reserve(c, recs * ((size_t)s->head_dim + 2) * sizeof(float))) return 1;
    struct attn_part_job pj = {j, {0, 0, max_parts, c->scratch}};
    pool_run(c->pool, attn_part_task, &pj, tasks);
    attn_parts_combine(&pj.pp, b, s, 0, b->n_tokens, j->out);
    return 0;
}

/* Whether one run (the costliest, runs[0]) costs more than a thread's even share of them all:
 * a task per sequence then leaves the other threads idle behind it (one sequence at context
 * 4096 among short ones), where its partitions as tasks spread it. */
static bool attn_runs_uneven(const struct attn_run *runs, int n_runs, int threads)
{
    int64_t total = 0;
    for (int i = 0; i < n_runs; i++) total += runs[i].cost;
    return runs[0].cost * threads > total;
}

/* Whether no two neighbouring tokens of the batch share a sequence: a decode batch, whose
 * tokens share no K or V reads. */
static bool one_token_a_sequence(const struct attn_batch *b)
{
    for (int t = 1; t < b->n_tokens; t++)
        if (b->seq[t] == b->seq[t - 1]) return false;
    return true;
}

void cpu_attention(struct backend *be, float *out, const float *q, const void *k_cache,
                   const void *v_cache, const struct attn_batch *b, const struct attn_shape *s)
{
    struct cpu_ctx *c = ctx_of(be);
    int threads = pool_threads(c->pool);
    struct attn_job j = {.k = c->k,
                         .kv = c->kv,
                         .out = out,
                         .q = q,
                         .k_cache = k_cache,
                         .v_cache = v_cache,
                         .b = b,
                         .s = s,
                         .run_tokens = ATTN_TOKENS_LONG,
                         .pieces = s->n_kv_heads};
    int64_t keys = 0;
    for (int i = 0; i < b->n_tokens; i++) keys += attn_keys_of(b, i);
    /* one thread: its tasks would run in a row anyway, and a token's heads cut in two ranges (or
     * its partitions' records folded after) only cost it reads */
    bool serial = threads == 1 || keys * s->n_heads < PAR_KEYS;
    /* alone, a thread takes the longest sets; on the pool only where each thread gets two */
    if (!serial && b->n_tokens < 2 * threads * ATTN_TOKENS_LONG) j.run_tokens = ATTN_TOKENS;
    int tasks = (b->n_tokens + j.run_tokens - 1) / j.run_tokens * s->n_kv_heads;
    if (serial && one_token_a_sequence(b)) {
        /* A decode batch on the caller: each token's every head in one pass, its KV slots read
         * whole (attn_rows.h), as the pool's tasks of a larger batch do. Kv head by kv head, a
         * one-token step read each slot in three strided passes: 0.85-0.9x the attention time at
         * contexts 50-224 (a decode step's KV comes from beyond the L2: the weights streamed
         * since the last step evicted it), tg220 1.02-1.04x on 2 threads, same bits. */
        for (int t = 0; t < b->n_tokens; t++) attn_call(&j, t, t + 1, 0, s->n_heads, NULL);
        return;
    }
    if (serial) {
        for (int t = 0; t < tasks; t++) attn_task(&j, t, 0);
        return;
    }
    struct attn_run runs[ATTN_RUNS_MAX];
    int n_runs = attn_runs(b, j.run_tokens, runs);
    if (n_runs) {
        j.runs = runs;
        tasks = n_runs * s->n_kv_heads;
        /* A decode batch of sequences enough to even out the threads: a task per sequence,
         * which reads its KV slots whole, every kv head in one pass (attn_rows.h), where a kv
         * head's row alone is a strided third of each slot. 16 sequences at context 128, their
         * KV beyond the L2: attention 0.79-0.86x the time, same bits. Not for a prefill
         * run, whose tokens share each K and V read within a kv head, nor a small batch, whose
         * KV the caches still hold: a span of three heads' V no longer fits the L1. */
        if (n_runs == b->n_tokens &&
            (n_runs < 2 * threads || attn_runs_uneven(runs, n_runs, threads)) &&
            !attention_by_parts(c, &j))
            return;
        if (n_runs == b->n_tokens && n_runs >= 2 * threads)
            j.pieces = 1;
        else if (n_runs == b->n_tokens && tasks % threads)
            j.pieces = decode_pieces(n_runs, threads, s);
        tasks = n_runs * j.pieces;
    }
    pool_run(c->pool, attn_task, &j, tasks);
}

void cpu_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                  int dim)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * (size_t)dim, x + (size_t)idx[i] * (size_t)dim,
               (size_t)dim * sizeof(float));
}
