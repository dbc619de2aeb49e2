/* The CPU shared-memory communicator (kernels/comm.h): ranks are threads of one process.
 *
 * all_reduce, the hot path (two per layer), costs one barrier: each rank copies its buffer into
 * a staging buffer of its own, meets the others, then sums every rank's staging copy in rank
 * order into its own buffer. Staging buffers alternate between two sets by the parity of the
 * all-reduce's sequence number: a rank may start all-reduce k+1 while a slower one still reads
 * set k % 2, but it cannot start k+2 (which rewrites that set) before everyone has arrived at
 * k+1's barrier, i.e. finished reading k. all_gather and broadcast (not per layer) work on the
 * others' buffers directly between two barriers, so no rank returns while another still reads.
 *
 * The barrier spins briefly (a decode step's all-reduce is a few microseconds of work, less than
 * a futex wake), then sleeps on a condition variable with a deadline. A timeout or comm_abort
 * marks the group failed and wakes everyone; failure is sticky. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../quant/qtypes.h"
#include "../comm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spins before sleeping: ~20-50 us, the time a peer rank takes to finish a small op. */
#define BARRIER_SPINS 2000

struct group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, arrived, refs, timeout_ms;
    uint64_t gen; /* barrier generation: read while spinning with atomic loads */
    int failed;   /* atomic as well; guarded by mu for writes */
    char why[200];
    void *buf[COMM_MAX_RANKS];
    const void *src[COMM_MAX_RANKS];
    const void *stage[2][COMM_MAX_RANKS]; /* each rank's staging copy, by all-reduce parity */
};

struct rank {
    struct comm c;
    struct group *g;
    uint64_t seq;   /* all-reduces this rank has entered */
    void *stage[2]; /* its staging buffers (only it writes them) */
    size_t cap[2];  /* their bytes */
};

static struct group *group_of(struct comm *c)
{
    return ((struct rank *)c)->g;
}

static int failed_err(struct group *g, int rank, struct qerr *err)
{
    pthread_mutex_lock(&g->mu);
    int rc = qerr_set(err, QERR_IO, "comm: rank %d: group failed: %s", rank, g->why);
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* Marks the group failed (first reason wins) and wakes every waiter. mu held. */
static void fail_locked(struct group *g, const char *why)
{
    if (!g->failed) snprintf(g->why, sizeof g->why, "%s", why);
    __atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&g->cv);
}

static int barrier(struct comm *c, struct qerr *err)
{
    struct group *g = group_of(c);
    if (__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE)) return failed_err(g, c->rank, err);
    pthread_mutex_lock(&g->mu);
    uint64_t my = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        __atomic_store_n(&g->gen, my + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < BARRIER_SPINS; i++) {
        if (__atomic_load_n(&g->gen, __ATOMIC_ACQUIRE) != my) return 0;
        /* A rank that left this barrier may fail the group between the two loads: its abort
         * comes after the generation moved, so look again before reporting a failure (seen
         * under ThreadSanitizer's scheduling: a rank failed the step before the abort). */
        if (__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE))
            return __atomic_load_n(&g->gen, __ATOMIC_ACQUIRE) != my ? 0
                                                                    : failed_err(g, c->rank, err);
        CPU_RELAX();
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += g->timeout_ms / 1000;
    dl.tv_nsec += (long)(g->timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g->mu);
    while (g->gen == my && !g->failed) {
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT && g->gen == my &&
            !g->failed) {
            char why[160];
            snprintf(why, sizeof why, "rank %d waited %d ms for the other ranks", c->rank,
                     g->timeout_ms);
            fail_locked(g, why);
        }
    }
    bool passed = g->gen != my;
    pthread_mutex_unlock(&g->mu);
    return passed ? 0 : failed_err(g, c->rank, err);
}

static int cpu_barrier(struct comm *c, struct qerr *err)
{
    return barrier(c, err);
}

/* out[i] = in[0][i] + in[1][i] + ... in rank order */
static void sum_f32(float *out, const float *const *in, int n, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float s = in[0][i];
        for (int k = 1; k < n; k++) s += in[k][i];
        out[i] = s;
    }
}

static void sum_f16(uint16_t *out, const uint16_t *const *in, int n, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float s = fp16_to_f32(in[0][i]);
        for (int k = 1; k < n; k++) s += fp16_to_f32(in[k][i]);
        out[i] = f32_to_fp16(s);
    }
}

static int cpu_all_reduce(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                          struct qerr *err)
{
    if (c->n_ranks == 1) return 0;
    struct rank *rk = (struct rank *)c;
    struct group *g = rk->g;
    /* A failed group: fail before touching a staging buffer. The alternation above holds only
     * for barriers everyone reached; a rank that left all-reduce k+1 on the failure must not
     * rewrite set k % 2 while a slower rank may still be summing all-reduce k from it (seen
     * under ThreadSanitizer in test_comm's failing rank). */
    if (__atomic_load_n(&g->failed, __ATOMIC_ACQUIRE)) return failed_err(g, c->rank, err);
    int p = (int)(rk->seq++ & 1);
    size_t bytes = count * comm_dtype_bytes(dt);
    if (bytes > rk->cap[p]) { /* nobody reads set p now (see the top of this file) */
        void *grown = realloc(rk->stage[p], bytes);
        if (!grown) {
            comm_abort(c, "out of memory for an all-reduce's staging buffer");
            return qerr_set(err, QERR_NOMEM, "comm: rank %d: staging %zu bytes", c->rank, bytes);
        }
        rk->stage[p] = grown;
        rk->cap[p] = bytes;
    }
    if (bytes) memcpy(rk->stage[p], buf, bytes);
    g->stage[p][c->rank] = rk->stage[p];
    int rc = barrier(c, err);
    if (rc) return rc;
    if (dt == COMM_F16)
        sum_f16(buf, (const uint16_t *const *)g->stage[p], c->n_ranks, count);
    else
        sum_f32(buf, (const float *const *)g->stage[p], c->n_ranks, count);
    return 0;
}

static int cpu_all_gather(struct comm *c, const void *send, void *recv, size_t count,
                          enum comm_dtype dt, struct qerr *err)
{
    struct group *g = group_of(c);
    size_t bytes = count * comm_dtype_bytes(dt);
    g->src[c->rank] = send;
    int rc = barrier(c, err);
    if (rc) return rc;
    for (int k = 0; k < c->n_ranks; k++)
        if ((char *)recv + (size_t)k * bytes != g->src[k])
            memmove((char *)recv + (size_t)k * bytes, g->src[k], bytes);
    return barrier(c, err);
}

static int cpu_broadcast(struct comm *c, void *buf, size_t bytes, int root, struct qerr *err)
{
    if (root < 0 || root >= c->n_ranks) {
        comm_abort(c, "broadcast from a root outside the group");
        return qerr_set(err, QERR_INVALID, "comm: broadcast root %d of %d ranks", root, c->n_ranks);
    }
    struct group *g = group_of(c);
    g->buf[c->rank] = buf;
    int rc = barrier(c, err);
    if (rc) return rc;
    if (c->rank != root) memcpy(buf, g->buf[root], bytes);
    return barrier(c, err);
}

static void cpu_abort(struct comm *c, const char *why)
{
    struct group *g = group_of(c);
    char line[200];
    snprintf(line, sizeof line, "rank %d: %s", c->rank, why ? why : "aborted");
    pthread_mutex_lock(&g->mu);
    fail_locked(g, line);
    pthread_mutex_unlock(&g->mu);
}

static void cpu_destroy(struct comm *c)
{
    struct group *g = group_of(c);
    free(((struct rank *)c)->stage[0]);
    free(((struct rank *)c)->stage[1]);
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    free(c);
    if (!last) return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static const struct comm_ops cpu_comm_ops = {
    .name = "cpu-shm",
    .all_reduce = cpu_all_reduce,
    .all_gather = cpu_all_gather,
    .broadcast = cpu_broadcast,
    .barrier = cpu_barrier,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
};

int comm_cpu_create(int n_ranks, const struct comm_cpu_opts *opts, struct comm **out,
                    struct qerr *err)
{
    if (n_ranks < 1 || n_ranks > COMM_MAX_RANKS)
        return qerr_set(err, QERR_INVALID, "comm: %d ranks (1..%d)", n_ranks, COMM_MAX_RANKS);
    int timeout = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 30000;
    struct group *g = calloc(1, sizeof *g);
    if (!g) return qerr_set(err, QERR_NOMEM, "comm: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->n = n_ranks;
    g->timeout_ms = timeout;
    for (int r = 0; r < n_ranks; r++) {
        struct rank *rk = calloc(1, sizeof *rk);
        if (!rk) {
            for (int k = 0; k < r; k++) free(out[k]);
            pthread_cond_destroy(&g->cv);
            pthread_mutex_destroy(&g->mu);
            free(g);
            return qerr_set(err, QERR_NOMEM, "comm: out of memory");
        }
        rk->c = (struct comm){.ops = &cpu_comm_ops, .rank = r, .n_ranks = n_ranks, .ctx = rk};
        rk->g = g;
        out[r] = &rk->c;
    }
    g->refs = n_ranks;
    return 0;
}
