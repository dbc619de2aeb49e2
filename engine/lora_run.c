/* LoRA adapters on a backend: each adapted matmul of a step adds B ((x A^T) masked)^T for every
 * adapter some sequence of the step runs with.
 *
 * The mask is a gather, not a multiply, so tokens of other sequences get exact zeros: the
 * scratch t starts with max_rank zero rows ([0, max_rank * max_rank) floats, never written),
 * x A^T goes to the rows after them, and get_rows picks row max_rank + i for a token of the
 * adapter and row 0 (zeros) for any other. A zero row through B adds zeros to y, which leave
 * its values as they were (a -0.0 may become +0.0, which compares equal). */
#include <stdlib.h>
#include <string.h>

#include "lora.h"

struct lora_run {
    struct backend *be;
    int n, max_tokens, max_rank, max_out;
    struct lora_adapter **ads;
    float *t, *g, *y;  /* device: t [max_rank + T][max_rank], g [T][max_rank], y [T][max_out] */
    int32_t **idx;     /* device [n][T]: each adapter's gather rows */
    int32_t *host_idx; /* [T] */
    /* this step: n_tokens, and per adapter whether any / every token runs with it */
    int n_tokens;
    bool *any, *all;
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

int lora_run_create(struct backend *be, const struct model_config *cfg,
                    const struct lora_spec *specs, int n_specs, int max_tokens,
                    struct lora_run **out, struct qerr *err)
{
    *out = NULL;
    struct lora_run *r = calloc(1, sizeof *r);
    if (!r) return qerr_set(err, QERR_NOMEM, "lora: out of memory");
    r->be = be;
    r->max_tokens = max_tokens;
    r->ads = calloc((size_t)n_specs, sizeof *r->ads);
    r->idx = calloc((size_t)n_specs, sizeof *r->idx);
    r->any = calloc((size_t)n_specs, sizeof *r->any);
    r->all = calloc((size_t)n_specs, sizeof *r->all);
    r->host_idx = calloc((size_t)max_tokens, sizeof *r->host_idx);
    int rc = 0;
    if (!r->ads || !r->idx || !r->any || !r->all || !r->host_idx) {
        rc = qerr_set(err, QERR_NOMEM, "lora: out of memory");
        goto fail;
    }
    for (int i = 0; i < n_specs; i++) {
        struct lora_adapter *ad = NULL;
        if ((rc = lora_load(specs[i].path, specs[i].name, specs[i].scale, cfg, &ad, err)))
            goto fail;
        r->ads[r->n++] = ad;
        for (int j = 0; j < i; j++)
            if (!strcmp(r->ads[j]->name, ad->name)) {
                rc = qerr_set(err, QERR_INVALID, "%s: a second LoRA adapter named '%s'",
                              specs[i].path, ad->name);
                goto fail;
            }
        if ((rc = prepare_pairs(be, ad, err))) goto fail;
        if (ad->max_rank > r->max_rank) r->max_rank = ad->max_rank;
        if (ad->max_out > r->max_out) r->max_out = ad->max_out;
    }
    size_t T = (size_t)max_tokens, R = (size_t)r->max_rank;
    size_t t_bytes = (R + T) * R * sizeof(float);
    r->t = be->ops->buf_alloc(be, t_bytes);
    r->g = be->ops->buf_alloc(be, T * R * sizeof(float));
    r->y = be->ops->buf_alloc(be, T * (size_t)r->max_out * sizeof(float));
    float *zeros = calloc(R * R, sizeof *zeros);
    bool ok = r->t && r->g && r->y && zeros;
    for (int i = 0; ok && i < r->n; i++) ok = (r->idx[i] = be->ops->buf_alloc(be, T * 4)) != NULL;
    if (!ok) {
        free(zeros);
        rc = qerr_set(err, QERR_NOMEM, "lora: cannot allocate %.1f MiB of scratch on the %s device",
                      (double)(t_bytes + T * (R + (size_t)r->max_out) * 4) / 1048576.0,
                      be->ops->name);
        goto fail;
    }
    be->ops->buf_write(be, r->t, zeros, R * R * sizeof *zeros);
    free(zeros);
    *out = r;
    return 0;
fail:
    lora_run_free(r);
    return rc;
}

void lora_run_free(struct lora_run *r)
{
    if (!r) return;
    struct backend *be = r->be;
    for (int i = 0; i < r->n; i++) {
        release_pairs(be, r->ads[i]);
        lora_free(r->ads[i]);
        if (r->idx[i]) be->ops->buf_free(be, r->idx[i]);
    }
    void *bufs[] = {r->t, r->g, r->y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->buf_free(be, bufs[i]);
    free(r->ads);
    free(r->idx);
    free(r->any);
    free(r->all);
    free(r->host_idx);
    free(r);
}

int lora_run_count(const struct lora_run *r)
{
    return r ? r->n : 0;
}

const struct lora_adapter *lora_run_adapter(const struct lora_run *r, int i)
{
    return r && i >= 0 && i < r->n ? r->ads[i] : NULL;
}

bool lora_run_begin(struct lora_run *r, int n, const int32_t *seq, const int32_t *seq_lora)
{
    bool used = false;
    r->n_tokens = n;
    for (int j = 0; j < r->n; j++) {
        bool any = false, all = true;
        for (int i = 0; i < n; i++) {
            bool mine = seq_lora && seq_lora[seq[i]] == j + 1;
            r->host_idx[i] = mine ? r->max_rank + i : 0;
            any |= mine;
            all &= mine;
        }
        r->any[j] = any;
        r->all[j] = all;
        if (any && !all) r->be->ops->buf_write(r->be, r->idx[j], r->host_idx, (size_t)n * 4);
        used |= any;
    }
    return used;
}

void lora_run_apply(struct lora_run *r, int layer, enum lora_target t, const float *x, int n,
                    float *y)
{
    struct backend *be = r->be;
    for (int j = 0; j < r->n; j++) {
        const struct lora_pair *p = lora_pair_at(r->ads[j], layer, t);
        if (!r->any[j] || !p->rank) continue;
        float *xa = r->t + (size_t)r->max_rank * (size_t)p->rank; /* row max_rank of width rank */
        be->ops->matmul(be, &p->a, x, n, xa);
        const float *src = xa;
        if (!r->all[j]) {
            be->ops->get_rows(be, r->g, r->t, r->idx[j], n, p->rank);
            src = r->g;
        }
        be->ops->matmul(be, &p->b, src, n, r->y);
        be->ops->add(be, y, r->y, (size_t)n * (size_t)p->b.rows);
    }
}
