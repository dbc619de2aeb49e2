/* model_tp: the tensor-parallel group behind model_load/model_forward (model_tp.h).
 *
 * One step: the caller publishes the batch and bumps `job`; each rank thread wakes, runs its
 * shard's forward, and counts itself done; rank 0 runs on the caller's thread meanwhile. The
 * ranks synchronize among themselves only inside the communicator's collectives, so a step
 * costs two wake-ups per rank thread beyond the all-reduces. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/comm.h"
#include "model_tp.h"

struct tp_group {
    int n;
    struct model *rank[COMM_MAX_RANKS];
    struct comm *comm[COMM_MAX_RANKS];
    pthread_t thread[COMM_MAX_RANKS];
    int started; /* rank threads running: ranks 1..started */

    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t job; /* bumped once per step */
    bool quit;
    const struct model_batch *b;
    int pending; /* rank threads still running this step */
    int rc[COMM_MAX_RANKS];
    struct qerr err[COMM_MAX_RANKS];
};

struct rank_arg {
    struct tp_group *g;
    int r;
};

/* A rank that fails tells the others through the communicator, so none waits for it. */
static int run_rank(struct tp_group *g, int r, const struct model_batch *b, float *logits)
{
    g->err[r] = (struct qerr){0};
    int rc = model_forward_rank(g->rank[r], b, logits, &g->err[r]);
    if (rc) comm_abort(g->comm[r], g->err[r].msg);
    return rc;
}

static void *rank_main(void *arg)
{
    struct tp_group *g = ((struct rank_arg *)arg)->g;
    int r = ((struct rank_arg *)arg)->r;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->job == seen && !g->quit) pthread_cond_wait(&g->go, &g->mu);
        if (g->quit) {
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        seen = g->job;
        const struct model_batch *b = g->b;
        pthread_mutex_unlock(&g->mu);
        int rc = run_rank(g, r, b, NULL);
        pthread_mutex_lock(&g->mu);
        g->rc[r] = rc;
        if (--g->pending == 0) pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
    }
}

int model_tp_forward(struct tp_group *g, const struct model_batch *b, float *logits,
                     struct qerr *err)
{
    pthread_mutex_lock(&g->mu);
    g->b = b;
    g->pending = g->n - 1;
    g->job++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    g->rc[0] = run_rank(g, 0, b, logits);
    pthread_mutex_lock(&g->mu);
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    /* the first failure is the cause; the others only saw the aborted group */
    int first = -1;
    for (int r = 0; r < g->n && first < 0; r++)
        if (g->rc[r] && strncmp(g->err[r].msg, "comm: ", 6) != 0) first = r;
    for (int r = 0; r < g->n && first < 0; r++)
        if (g->rc[r]) first = r;
    if (first < 0) return 0;
    return qerr_set(err, g->rc[first], "tp rank %d: %s", first, g->err[first].msg);
}

double model_tp_weight_bytes(const struct tp_group *g)
{
    double b = 0;
    for (int r = 1; r < g->n; r++) b += model_weight_bytes(g->rank[r]);
    return b;
}

void model_tp_free(struct tp_group *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r <= g->started; r++) pthread_join(g->thread[r], NULL);
    for (int r = 1; r < g->n; r++) model_free_rank(g->rank[r]);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

int model_tp_load(const struct gguf_file *f, struct backend *be, const struct model_opts *opts,
                  struct model **out, struct qerr *err)
{
    *out = NULL;
    int n = opts->tp;
    if (n > COMM_MAX_RANKS)
        return qerr_set(err, QERR_INVALID, "--tp %d: at most %d ranks", n, COMM_MAX_RANKS);
    if (!opts->tp_backends || !opts->tp_comms || opts->tp_backends[0] != be)
        return qerr_set(err, QERR_INVALID, "--tp %d: needs a backend and a communicator per rank",
                        n);
    for (int r = 0; r < n; r++)
        if (!opts->tp_backends[r] || !opts->tp_comms[r] || opts->tp_comms[r]->rank != r ||
            opts->tp_comms[r]->n_ranks != n)
            return qerr_set(err, QERR_INVALID, "--tp %d: rank %d has no backend or communicator", n,
                            r);
    struct model_config cfg;
    int rc = model_config_read(f, &cfg, err);
    if (rc) return rc;
    struct model_shard sh[COMM_MAX_RANKS];
    for (int r = 0; r < n; r++)
        if ((rc = model_shard_plan(&cfg, n, r, &sh[r], err))) return rc;

    struct tp_group *g = calloc(1, sizeof *g);
    if (!g) return qerr_set(err, QERR_NOMEM, "model: out of memory");
    g->n = n;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    struct model_opts one = *opts;
    one.tp = 1;
    for (int r = 0; r < n; r++) {
        g->comm[r] = opts->tp_comms[r];
        if ((rc = model_load_rank(f, opts->tp_backends[r], &one, &sh[r], g->comm[r], &g->rank[r],
                                  err))) {
            qerr_wrap(err, "tp rank %d", r);
            goto fail;
        }
    }
    for (int r = 1; r < n; r++) {
        struct rank_arg *a = malloc(sizeof *a);
        if (a) *a = (struct rank_arg){.g = g, .r = r};
        if (!a || pthread_create(&g->thread[r], NULL, rank_main, a) != 0) {
            free(a);
            rc = qerr_set(err, QERR_IO, "model: cannot start the thread of tp rank %d", r);
            goto fail;
        }
        g->started = r;
    }
    model_set_tp_group(g->rank[0], g);
    *out = g->rank[0];
    return 0;
fail:;
    struct model *r0 = g->rank[0];
    model_tp_free(g);
    model_free_rank(r0);
    return rc;
}
