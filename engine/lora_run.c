/* LoRA adapters on a backend: each adapted matmul of a step adds (x A^T) B^T for every adapter
 * some sequence of the step runs with, to that adapter's tokens only.
 *
 * When every token of the step runs with adapter j: t = x A^T, y += t B^T (two matmuls and an
 * add). When only some do, their rows of x are gathered into a compact batch (get_rows), run
 * through A and B there (so an adapter costs its own tokens, not the step's), and the result is
 * spread back with a second get_rows whose index sends every other token to a row of zeros: the
 * scratch d starts with max_out zero floats that are never written, and the compact result is
 * written O rows in, O = ceil(max_out / out), so row 0 of width out is zeros and token i's row is
 * O + its place in the compact batch. Other tokens thus get exact zeros added, which leave their
 * values as they were (a -0.0 may become +0.0, which compares equal): a sequence's result does
 * not depend on which adapters share its batch.
 *
 * Adapters live in slots (a batch's seq_lora names slot + 1); lora_run_add fills a free one and
 * grows the scratch when the new adapter is wider than those before, lora_run_remove empties
 * one. Both run between steps, on the thread that runs the forwards. */
#include <stdlib.h>
#include <string.h>

#include "lora.h"

/* the distinct output widths of the adapted matrices (q, k/v, dim, ffn) */
#define MAX_OUTS LORA_N_TARGETS

struct lora_run {
    struct backend *be;
    struct model_config cfg;
    int cap, max_tokens, max_rank, max_out, max_in;
    struct lora_adapter **ads; /* [cap]; NULL: a free slot */
    int n_outs, outs[MAX_OUTS];
    /* device: xc [T][max_in] compact inputs, t [T][max_rank], d [2 max_out + T max_out]
     * (max_out zeros first), e [T][max_out] the spread result */
    float *xc, *t, *d, *e;
    int32_t **gather; /* device [cap][T]: adapter j's tokens, in order */
    int32_t **spread; /* device [cap][MAX_OUTS][T]: each token's row of d per output width */
    int32_t *host;    /* [T] */
    /* this step: per slot, how many of its tokens (0: none, n_tokens: all) */
    int n_tokens;
    int *count;
};

static int prepare_pairs(struct backend *be, struct lora_adapter *ad, struct qerr *err)
{
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_N_TARGETS; i++) {
        struct lora_pair *p = &ad->pairs[i];
        if (!p->rank) continue;
        int rc = be->ops->weight_prepare(be, &p->a, err);
        if (!rc) rc = be->ops->weight_prepare(be, &p->b, err);
        if (rc) return rc;
    }
    return 0;
}

static void release_pairs(struct backend *be, struct lora_adapter *ad)
{
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_N_TARGETS; i++) {
        struct lora_pair *p = &ad->pairs[i];
        if (p->a.impl) be->ops->weight_release(be, &p->a);
        if (p->b.impl) be->ops->weight_release(be, &p->b);
        p->a.impl = p->b.impl = NULL;
    }
}

static void drop_adapter(struct backend *be, struct lora_adapter *ad)
{
    release_pairs(be, ad);
    lora_free(ad);
}

static int out_slot(const struct lora_run *r, int out)
{
    for (int k = 0; k < r->n_outs; k++)
        if (r->outs[k] == out) return k;
    return -1;
}

/* The widths ad adds to those the scratch holds: true when the scratch must grow. */
static bool note_shapes(struct lora_run *r, const struct lora_adapter *ad)
{
    bool grew = false;
    for (size_t i = 0; i < (size_t)ad->n_layers * LORA_N_TARGETS; i++) {
        const struct lora_pair *p = &ad->pairs[i];
        if (!p->rank) continue;
        int out = (int)p->b.rows, in = (int)p->a.cols;
        if (p->rank > r->max_rank) r->max_rank = p->rank, grew = true;
        if (out > r->max_out) r->max_out = out, grew = true;
        if (in > r->max_in) r->max_in = in, grew = true;
        if (out_slot(r, out) < 0 && r->n_outs < MAX_OUTS) r->outs[r->n_outs++] = out;
    }
    return grew;
}

static void free_scratch(struct lora_run *r)
{
    float **bufs[] = {&r->xc, &r->t, &r->d, &r->e};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) r->be->ops->buf_free(r->be, *bufs[i]);
        *bufs[i] = NULL;
    }
}

/* The float scratch for the widths noted so far (d's leading zeros written); on failure the
 * scratch before stays. */
static int alloc_scratch(struct lora_run *r, struct qerr *err)
{
    struct backend *be = r->be;
    size_t T = (size_t)r->max_tokens, R = (size_t)r->max_rank, O = (size_t)r->max_out;
    /* d: max_out zeros, then up to out - 1 floats of padding (O rows of width out), then T rows */
    size_t bytes[4] = {T * (size_t)r->max_in * 4, T * R * 4, (2 * O + T * O) * 4, T * O * 4};
    float *nb[4] = {0};
    bool ok = true;
    for (int i = 0; i < 4 && ok; i++) ok = (nb[i] = be->ops->buf_alloc(be, bytes[i] + 4)) != NULL;
    float *zeros = ok ? calloc(O + 1, sizeof *zeros) : NULL;
    if (!zeros) {
        for (int i = 0; i < 4; i++)
            if (nb[i]) be->ops->buf_free(be, nb[i]);
        return qerr_set(
            err, QERR_NOMEM, "lora: cannot allocate %.1f MiB of scratch on the %s device",
            (double)(bytes[0] + bytes[1] + bytes[2] + bytes[3]) / 1048576.0, be->ops->name);
    }
    be->ops->buf_write(be, nb[2], zeros, O * sizeof *zeros);
    free(zeros);
    free_scratch(r);
    r->xc = nb[0];
    r->t = nb[1];
    r->d = nb[2];
    r->e = nb[3];
    return 0;
}

/* The index buffers of every slot (small: T int32 each). */
static int alloc_indexes(struct lora_run *r, struct qerr *err)
{
    struct backend *be = r->be;
    size_t T = (size_t)r->max_tokens;
    r->gather = calloc((size_t)r->cap, sizeof *r->gather);
    r->spread = calloc((size_t)r->cap * MAX_OUTS, sizeof *r->spread);
    bool ok = r->gather && r->spread;
    for (int j = 0; ok && j < r->cap; j++) {
        ok = (r->gather[j] = be->ops->buf_alloc(be, T * 4)) != NULL;
        for (int k = 0; ok && k < MAX_OUTS; k++)
            ok = (r->spread[j * MAX_OUTS + k] = be->ops->buf_alloc(be, T * 4)) != NULL;
    }
    if (!ok)
        return qerr_set(err, QERR_NOMEM, "lora: cannot allocate the index buffers of %d adapters",
                        r->cap);
    return 0;
}

int lora_run_create(struct backend *be, const struct model_config *cfg,
                    const struct lora_spec *specs, int n_specs, int cap, int max_tokens,
                    struct lora_run **out, struct qerr *err)
{
    *out = NULL;
    if (cap < n_specs || cap < 1)
        return qerr_set(err, QERR_INVALID, "lora: %d adapters in %d slots", n_specs, cap);
    struct lora_run *r = calloc(1, sizeof *r);
    if (!r) return qerr_set(err, QERR_NOMEM, "lora: out of memory");
    r->be = be;
    r->cfg = *cfg;
    r->cap = cap;
    r->max_tokens = max_tokens;
    r->ads = calloc((size_t)cap, sizeof *r->ads);
    r->count = calloc((size_t)cap, sizeof *r->count);
    r->host = calloc((size_t)max_tokens, sizeof *r->host);
    int rc = 0;
    if (!r->ads || !r->count || !r->host) {
        rc = qerr_set(err, QERR_NOMEM, "lora: out of memory");
        goto fail;
    }
    if ((rc = alloc_indexes(r, err))) goto fail;
    for (int i = 0; i < n_specs; i++) {
        int slot;
        if ((rc = lora_run_add(r, &specs[i], &slot, err))) goto fail;
    }
    if (!r->xc && (rc = alloc_scratch(r, err))) goto fail;
    *out = r;
    return 0;
fail:
    lora_run_free(r);
    return rc;
}

int lora_run_add(struct lora_run *r, const struct lora_spec *spec, int *slot, struct qerr *err)
{
    *slot = -1;
    int free_slot = -1;
    for (int j = r->cap - 1; j >= 0; j--)
        if (!r->ads[j]) free_slot = j;
    if (free_slot < 0)
        return qerr_set(err, QERR_FULL, "%s: every one of the %d LoRA slots is taken", spec->path,
                        r->cap);
    struct lora_adapter *ad = NULL;
    int rc = lora_load(spec->path, spec->name, spec->scale, &r->cfg, &ad, err);
    if (rc) return rc;
    for (int j = 0; j < r->cap; j++)
        if (r->ads[j] && !strcmp(r->ads[j]->name, ad->name)) {
            rc = qerr_set(err, QERR_INVALID, "%s: a second LoRA adapter named '%s'", spec->path,
                          ad->name);
            lora_free(ad);
            return rc;
        }
    if ((rc = prepare_pairs(r->be, ad, err))) {
        drop_adapter(r->be, ad);
        return rc;
    }
    /* a wider adapter grows the scratch; if that fails, the widths are those of before */
    int was[3] = {r->max_rank, r->max_out, r->max_in};
    if (note_shapes(r, ad) && (rc = alloc_scratch(r, err))) {
        r->max_rank = was[0];
        r->max_out = was[1];
        r->max_in = was[2];
        drop_adapter(r->be, ad);
        return rc;
    }
    r->ads[free_slot] = ad;
    *slot = free_slot;
    return 0;
}

void lora_run_remove(struct lora_run *r, int slot)
{
    if (!r || slot < 0 || slot >= r->cap || !r->ads[slot]) return;
    drop_adapter(r->be, r->ads[slot]);
    r->ads[slot] = NULL;
}

void lora_run_free(struct lora_run *r)
{
    if (!r) return;
    struct backend *be = r->be;
    for (int j = 0; j < r->cap; j++) {
        if (r->ads && r->ads[j]) drop_adapter(be, r->ads[j]);
        if (r->gather && r->gather[j]) be->ops->buf_free(be, r->gather[j]);
        for (int k = 0; r->spread && k < MAX_OUTS; k++)
            if (r->spread[j * MAX_OUTS + k]) be->ops->buf_free(be, r->spread[j * MAX_OUTS + k]);
    }
    free_scratch(r);
    free(r->ads);
    free(r->gather);
    free(r->spread);
    free(r->count);
    free(r->host);
    free(r);
}

int lora_run_count(const struct lora_run *r)
{
    return r ? r->cap : 0;
}

const struct lora_adapter *lora_run_adapter(const struct lora_run *r, int i)
{
    return r && i >= 0 && i < r->cap ? r->ads[i] : NULL;
}

bool lora_run_begin(struct lora_run *r, int n, const int32_t *seq, const int32_t *seq_lora)
{
    struct backend *be = r->be;
    bool used = false;
    r->n_tokens = n;
    for (int j = 0; j < r->cap; j++) {
        int m = 0;
        for (int i = 0; r->ads[j] && i < n; i++)
            if (seq_lora && seq_lora[seq[i]] == j + 1) r->host[m++] = i;
        r->count[j] = m;
        used |= m > 0;
        if (m == 0 || m == n) continue;
        be->ops->buf_write(be, r->gather[j], r->host, (size_t)m * 4);
        for (int k = 0; k < r->n_outs; k++) {
            int o = (r->max_out + r->outs[k] - 1) / r->outs[k];
            for (int i = 0, c = 0; i < n; i++) r->host[i] = seq_lora[seq[i]] == j + 1 ? o + c++ : 0;
            be->ops->buf_write(be, r->spread[j * MAX_OUTS + k], r->host, (size_t)n * 4);
        }
    }
    return used;
}

void lora_run_apply(struct lora_run *r, int layer, enum lora_target t, const float *x, int n,
                    float *y)
{
    struct backend *be = r->be;
    for (int j = 0; j < r->cap; j++) {
        int m = r->count[j];
        if (m == 0) continue;
        const struct lora_pair *p = lora_pair_at(r->ads[j], layer, t);
        if (!p->rank) continue;
        int in = (int)p->a.cols, out = (int)p->b.rows;
        if (m == n) {
            be->ops->matmul(be, &p->a, x, n, r->t);
            be->ops->matmul(be, &p->b, r->t, n, r->e);
            be->ops->add(be, y, r->e, (size_t)n * (size_t)out);
            continue;
        }
        int k = out_slot(r, out), o = (r->max_out + out - 1) / out;
        be->ops->get_rows(be, r->xc, x, r->gather[j], m, in);
        be->ops->matmul(be, &p->a, r->xc, m, r->t);
        be->ops->matmul(be, &p->b, r->t, m, r->d + (size_t)o * (size_t)out);
        be->ops->get_rows(be, r->e, r->d, r->spread[j * MAX_OUTS + k], n, out);
        be->ops->add(be, y, r->e, (size_t)n * (size_t)out);
    }
}
