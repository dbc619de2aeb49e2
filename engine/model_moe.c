#include "model_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows (a token and one of its experts) one chunk runs: the scratch holds this many rows of the
 * model's width and of an expert's, whatever the batch (Qwen3-30B-A3B's 8 of 128 experts over a
 * 2048-token prefill would otherwise ask ~400 MiB). */
#define MOE_CHUNK_ROWS 4096

struct moe_run {
    struct backend *be;
    int n_experts, k, dim, ff, chunk; /* chunk: tokens a pass */
    int sff;                          /* the shared expert's channels, or 0 */
    int kk;                           /* terms a token's sum has: k, and the shared expert */
    bool norm;                        /* expert_weights_norm */
    /* host */
    float *logits;                /* [chunk][n_experts], read back from the device */
    float *sh_logits;             /* [chunk]: the shared expert's gate, read back */
    int32_t *gather;              /* [chunk * k] */
    int32_t *rows;                /* [chunk * kk] */
    float *weights;               /* [chunk * kk] */
    int *count, *offset, *cursor; /* [n_experts] */
    int32_t *pick;                /* [chunk * k]: token t's experts, in expert order */
    /* device */
    float *d_logits, *d_weights, *xg, *gate, *up, *y; /* y: [chunk * kk][dim] */
    float *d_sh_logits, *sh_gate, *sh_up;             /* [chunk], [chunk][sff] each */
    int32_t *d_gather, *d_rows;
};

void moe_run_free(struct moe_run *r)
{
    if (!r) return;
    struct backend *be = r->be;
    if (r->logits) backend_host_free(be, r->logits);
    if (r->sh_logits) backend_host_free(be, r->sh_logits);
    free(r->gather);
    free(r->rows);
    free(r->weights);
    free(r->count);
    free(r->offset);
    free(r->cursor);
    free(r->pick);
    void *dev[] = {r->d_logits, r->d_weights, r->xg,      r->gate,  r->up,         r->y,
                   r->d_gather, r->d_rows,    r->sh_gate, r->sh_up, r->d_sh_logits};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) be->ops->buf_free(be, dev[i]);
    free(r);
}

int moe_run_create(struct backend *be, const struct model_config *c, int ff, int sff,
                   int max_tokens, struct moe_run **out, struct qerr *err)
{
    *out = NULL;
    struct moe_run *r = calloc(1, sizeof *r);
    if (!r) return qerr_set(err, QERR_NOMEM, "model: out of memory for the experts' scratch");
    r->be = be;
    r->n_experts = c->n_experts;
    r->k = c->n_experts_used;
    r->dim = c->dim;
    r->ff = ff;
    r->sff = sff;
    r->kk = r->k + (sff > 0);
    r->norm = c->expert_weights_norm;
    r->chunk = MOE_CHUNK_ROWS / r->k;
    if (r->chunk < 1) r->chunk = 1;
    if (r->chunk > max_tokens) r->chunk = max_tokens;
    size_t rows = (size_t)r->chunk * (size_t)r->k, E = (size_t)r->n_experts;
    size_t terms = (size_t)r->chunk * (size_t)r->kk, chunk = (size_t)r->chunk;
    r->logits = backend_host_alloc(be, (size_t)r->chunk * E * sizeof(float));
    r->gather = malloc(rows * sizeof *r->gather);
    r->rows = malloc(terms * sizeof *r->rows);
    r->weights = malloc(terms * sizeof *r->weights);
    r->sh_logits = backend_host_alloc(be, chunk * sizeof(float));
    r->pick = malloc(rows * sizeof *r->pick);
    r->count = malloc(E * sizeof *r->count);
    r->offset = malloc(E * sizeof *r->offset);
    r->cursor = malloc(E * sizeof *r->cursor);
    struct {
        void **p;
        size_t bytes;
    } plan[] = {
        {(void **)&r->d_logits, (size_t)r->chunk * E * sizeof(float)},
        {(void **)&r->d_weights, terms * sizeof(float)},
        {(void **)&r->d_gather, rows * sizeof(int32_t)},
        {(void **)&r->d_rows, terms * sizeof(int32_t)},
        {(void **)&r->xg, rows * (size_t)r->dim * sizeof(float)},
        {(void **)&r->y, terms * (size_t)r->dim * sizeof(float)},
        {(void **)&r->gate, rows * (size_t)r->ff * sizeof(float)},
        {(void **)&r->up, rows * (size_t)r->ff * sizeof(float)},
        {(void **)&r->d_sh_logits, sff ? chunk * sizeof(float) : 0},
        {(void **)&r->sh_gate, chunk * (size_t)sff * sizeof(float)},
        {(void **)&r->sh_up, chunk * (size_t)sff * sizeof(float)},
    };
    bool ok = r->logits && r->sh_logits && r->gather && r->rows && r->weights && r->pick &&
              r->count && r->offset && r->cursor;
    size_t total = 0;
    for (size_t i = 0; ok && i < sizeof plan / sizeof plan[0]; i++) {
        if (!plan[i].bytes) continue; /* no shared expert */
        total += plan[i].bytes;
        *plan[i].p = be->ops->buf_alloc(be, plan[i].bytes);
        ok = *plan[i].p != NULL;
    }
    if (!ok) {
        moe_run_free(r);
        return qerr_set(err, QERR_NOMEM,
                        "model: cannot allocate the experts' scratch (%d tokens x %d experts, "
                        "%.1f MiB so far)",
                        max_tokens, c->n_experts_used, (double)total / 1048576.0);
    }
    *out = r;
    return 0;
}

/* Token t's experts (the k best router scores, ties to the lower expert, as a stable sort) in
 * expert order, with their weights: each expert's softmax probability over all experts,
 * renormalized over the chosen where r->norm (so exp(l_e - max) over the chosen's sum). In
 * double, rounded once. */
static void route_token(const struct moe_run *r, const float *l, int32_t *pick, float *w)
{
    int E = r->n_experts, k = r->k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= pick[i] == e;
            if (!taken && (best < 0 || l[e] > l[best])) best = e;
        }
        pick[j] = best;
    }
    for (int j = 1; j < k; j++) /* expert order: the order the sum adds them in */
        for (int i = j; i > 0 && pick[i - 1] > pick[i]; i--) {
            int32_t t = pick[i];
            pick[i] = pick[i - 1];
            pick[i - 1] = t;
        }
    double top = -INFINITY, sum = 0, all = 0;
    for (int e = 0; e < E; e++) top = fmax(top, (double)l[e]);
    for (int e = 0; e < E; e++) all += exp((double)l[e] - top);
    double p[MOE_MAX_USED];
    for (int j = 0; j < k; j++) sum += p[j] = exp((double)l[pick[j]] - top);
    for (int j = 0; j < k; j++) w[j] = (float)(p[j] / (r->norm ? sum : all));
}

/* Tokens [0, n) of x, n <= chunk: route, gather each expert's tokens, run the experts (and the
 * shared one on every token), combine. */
static void moe_chunk(struct moe_run *r, const struct moe_weights *w, const float *x, int n,
                      float *out)
{
    struct backend *be = r->be;
    const struct backend_ops *ops = be->ops;
    int E = r->n_experts, k = r->k;
    size_t dim = (size_t)r->dim, ff = (size_t)r->ff, kk = (size_t)r->kk;
    size_t nk = (size_t)n * (size_t)k;
    ops->matmul(be, &w->router, x, n, r->d_logits);
    if (r->sff) ops->matmul(be, &w->sh_gate_inp, x, n, r->d_sh_logits);
    ops->buf_read(be, r->logits, r->d_logits, (size_t)n * (size_t)E * sizeof(float));
    if (r->sff) ops->buf_read(be, r->sh_logits, r->d_sh_logits, (size_t)n * sizeof(float));
    memset(r->count, 0, (size_t)E * sizeof *r->count);
    for (int t = 0; t < n; t++) {
        int32_t *pick = r->pick + (size_t)t * (size_t)k;
        route_token(r, r->logits + (size_t)t * (size_t)E, pick, r->weights + (size_t)t * kk);
        for (int j = 0; j < k; j++) r->count[pick[j]]++;
        if (r->sff) { /* the shared expert's output row and its sigmoid gate, added last */
            r->rows[(size_t)t * kk + (size_t)k] = (int32_t)(nk + (size_t)t);
            r->weights[(size_t)t * kk + (size_t)k] =
                (float)(1.0 / (1.0 + exp(-(double)r->sh_logits[t])));
        }
    }
    for (int e = 0, at = 0; e < E; e++) {
        r->offset[e] = r->cursor[e] = at;
        at += r->count[e];
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t row = r->cursor[r->pick[(size_t)t * (size_t)k + (size_t)j]]++;
            r->gather[row] = t;
            r->rows[(size_t)t * kk + (size_t)j] = row;
        }
    ops->buf_write(be, r->d_gather, r->gather, nk * sizeof(int32_t));
    ops->buf_write(be, r->d_rows, r->rows, (size_t)n * kk * sizeof(int32_t));
    ops->buf_write(be, r->d_weights, r->weights, (size_t)n * kk * sizeof(float));
    ops->get_rows(be, r->xg, x, r->d_gather, (int)nk, (int)dim);
    for (int e = 0; e < E; e++) {
        if (!r->count[e]) continue;
        size_t o = (size_t)r->offset[e];
        const struct bweight *gu[2] = {&w->gate[e], &w->up[e]};
        float *gu_out[2] = {r->gate + o * ff, r->up + o * ff};
        backend_matmul_shared(be, gu, 2, r->xg + o * dim, r->count[e], gu_out);
    }
    ops->silu_mul(be, r->gate, r->up, nk * ff);
    for (int e = 0; e < E; e++) {
        if (!r->count[e]) continue;
        size_t o = (size_t)r->offset[e];
        ops->matmul(be, &w->down[e], r->gate + o * ff, r->count[e], r->y + o * dim);
    }
    if (r->sff) { /* the shared expert on every token, its rows after the routed ones' */
        const struct bweight *gu[2] = {&w->sh_gate, &w->sh_up};
        float *gu_out[2] = {r->sh_gate, r->sh_up};
        backend_matmul_shared(be, gu, 2, x, n, gu_out);
        ops->silu_mul(be, r->sh_gate, r->sh_up, (size_t)n * (size_t)r->sff);
        ops->matmul(be, &w->sh_down, r->sh_gate, n, r->y + nk * dim);
    }
    ops->moe_combine(be, out, r->y, r->d_rows, r->d_weights, n, (int)kk, (int)dim);
}

void moe_run_ffn(struct moe_run *r, const struct moe_weights *w, const float *x, int n, float *out)
{
    size_t dim = (size_t)r->dim;
    /* chunk by chunk: a chunk reads only its rows of x before writing its rows of out */
    for (int t0 = 0; t0 < n; t0 += r->chunk) {
        int nc = n - t0 < r->chunk ? n - t0 : r->chunk;
        moe_chunk(r, w, x + (size_t)t0 * dim, nc, out + (size_t)t0 * dim);
    }
}
