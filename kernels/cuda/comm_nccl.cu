/* comm_nccl: kernels/comm.h over NCCL (comm_nccl.h).
 *
 * DESIGN
 * - libnccl.so.2 is opened with dlopen when a group is created, as cuBLAS is: quern links only
 *   the CUDA runtime, and builds without NCCL's headers or library. The few types and values used
 *   are NCCL 2's stable ABI, declared below (checked against nccl.h when the build has it).
 * - One process, one host thread per rank (model_tp.c), communicators from ncclCommInitAll; each
 *   thread enqueues its rank's collective on its backend's stream, so it is ordered after the
 *   ops that produced the buffer and before the ones that read it, without a host sync.
 * - A host-side barrier (the CPU shared-memory group, comm_cpu.c) precedes every enqueue: a rank
 *   that failed or stopped calling is noticed on the host, within the group's timeout, before
 *   the others enqueue a collective that would wait on the GPU forever. Its cost is a few
 *   microseconds of host time per collective, while the GPU still runs the previous ops.
 * - Any failure aborts every rank's communicator (ncclCommAbort), which also ends collectives
 *   already on the GPU, so no stream synchronization hangs; the group stays failed.
 * Built with -DQUERN_HAVE_NCCL (meson option nccl, default auto); without it every create says
 * so. Compiled in CI, never run yet: no multi-GPU machine has been lent. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

#include "comm_nccl.h"

#ifdef QUERN_HAVE_NCCL

/* NCCL 2's ABI, the subset used here */
typedef struct ncclComm *nccl_comm_t;
typedef int nccl_result_t;
enum { NCCL_SUCCESS = 0, NCCL_SUM = 0, NCCL_I8 = 0, NCCL_F16 = 6, NCCL_F32 = 7 };
#ifdef QUERN_HAVE_NCCL_H
#include <nccl.h>
static_assert((int)ncclSuccess == NCCL_SUCCESS && (int)ncclSum == NCCL_SUM &&
                  (int)ncclFloat16 == NCCL_F16 && (int)ncclFloat32 == NCCL_F32 &&
                  (int)ncclInt8 == NCCL_I8,
              "NCCL's enum values as declared here");
#endif

struct nccl_fns {
    void *lib;
    nccl_result_t (*init_all)(nccl_comm_t *comms, int n, const int *devs);
    nccl_result_t (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                                nccl_comm_t comm, cudaStream_t stream);
    nccl_result_t (*all_gather)(const void *send, void *recv, size_t count, int dtype,
                                nccl_comm_t comm, cudaStream_t stream);
    nccl_result_t (*broadcast)(const void *send, void *recv, size_t count, int dtype, int root,
                               nccl_comm_t comm, cudaStream_t stream);
    nccl_result_t (*destroy)(nccl_comm_t comm);
    nccl_result_t (*abort)(nccl_comm_t comm);
    const char *(*error_string)(nccl_result_t r);
};

struct nccl_group {
    struct nccl_fns f;
    int n, refs;
    nccl_comm_t comms[COMM_MAX_RANKS];
    struct comm *host[COMM_MAX_RANKS]; /* the host-side barrier and its failure flag */
    pthread_mutex_t mu;
    bool aborted;
};

struct nccl_rank {
    struct comm c;
    struct nccl_group *g;
    struct cuda_ctx *cu; /* the rank's backend: device and stream */
};

static struct nccl_rank *rank_of(struct comm *c)
{
    return (struct nccl_rank *)c;
}

static int open_nccl(struct nccl_fns *f, struct qerr *err)
{
    f->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!f->lib) f->lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!f->lib)
        return qerr_set(err, QERR_UNSUPPORTED, "comm: --tp on CUDA needs libnccl.so.2: %s",
                        dlerror());
    const struct {
        void **slot;
        const char *sym;
    } want[] = {{(void **)&f->init_all, "ncclCommInitAll"},
                {(void **)&f->all_reduce, "ncclAllReduce"},
                {(void **)&f->all_gather, "ncclAllGather"},
                {(void **)&f->broadcast, "ncclBroadcast"},
                {(void **)&f->destroy, "ncclCommDestroy"},
                {(void **)&f->abort, "ncclCommAbort"},
                {(void **)&f->error_string, "ncclGetErrorString"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!(*want[i].slot = dlsym(f->lib, want[i].sym))) {
            dlclose(f->lib);
            f->lib = NULL;
            return qerr_set(err, QERR_UNSUPPORTED, "comm: libnccl has no %s", want[i].sym);
        }
    return 0;
}

/* Aborts every communicator once: collectives in flight end, streams drain. */
static void abort_all(struct nccl_group *g)
{
    pthread_mutex_lock(&g->mu);
    if (!g->aborted) {
        g->aborted = true;
        for (int r = 0; r < g->n; r++)
            if (g->comms[r]) g->f.abort(g->comms[r]);
    }
    pthread_mutex_unlock(&g->mu);
}

static void nccl_abort(struct comm *c, const char *why)
{
    struct nccl_rank *rk = rank_of(c);
    comm_abort(rk->g->host[c->rank], why);
    abort_all(rk->g);
}

/* The host barrier before an enqueue; on failure the devices are released too. */
static int enter(struct comm *c, struct qerr *err)
{
    struct nccl_rank *rk = rank_of(c);
    struct comm *h = rk->g->host[c->rank];
    int rc = h->ops->barrier(h, err);
    if (rc) {
        abort_all(rk->g);
        return rc;
    }
    cudaSetDevice(rk->cu->device);
    return 0;
}

static int check(struct comm *c, nccl_result_t r, const char *what, struct qerr *err)
{
    if (r == NCCL_SUCCESS) return 0;
    struct nccl_rank *rk = rank_of(c);
    char why[160];
    snprintf(why, sizeof why, "%s: %s", what, rk->g->f.error_string(r));
    nccl_abort(c, why);
    return qerr_set(err, QERR_IO, "comm: rank %d: %s", c->rank, why);
}

static int dtype_of(enum comm_dtype dt)
{
    return dt == COMM_F16 ? NCCL_F16 : NCCL_F32;
}

static int nccl_all_reduce(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                           struct qerr *err)
{
    int rc = enter(c, err);
    if (rc) return rc;
    struct nccl_rank *rk = rank_of(c);
    return check(c,
                 rk->g->f.all_reduce(buf, buf, count, dtype_of(dt), NCCL_SUM, rk->g->comms[c->rank],
                                     rk->cu->stream),
                 "ncclAllReduce", err);
}

static int nccl_all_gather(struct comm *c, const void *send, void *recv, size_t count,
                           enum comm_dtype dt, struct qerr *err)
{
    int rc = enter(c, err);
    if (rc) return rc;
    struct nccl_rank *rk = rank_of(c);
    return check(
        c,
        rk->g->f.all_gather(send, recv, count, dtype_of(dt), rk->g->comms[c->rank], rk->cu->stream),
        "ncclAllGather", err);
}

static int nccl_broadcast(struct comm *c, void *buf, size_t bytes, int root, struct qerr *err)
{
    if (root < 0 || root >= c->n_ranks) {
        nccl_abort(c, "broadcast from a root outside the group");
        return qerr_set(err, QERR_INVALID, "comm: broadcast root %d of %d ranks", root, c->n_ranks);
    }
    int rc = enter(c, err);
    if (rc) return rc;
    struct nccl_rank *rk = rank_of(c);
    /* bytes as int8, so any size goes */
    return check(
        c,
        rk->g->f.broadcast(buf, buf, bytes, NCCL_I8, root, rk->g->comms[c->rank], rk->cu->stream),
        "ncclBroadcast", err);
}

static int nccl_barrier(struct comm *c, struct qerr *err)
{
    int rc = enter(c, err);
    if (rc) return rc;
    /* the host barrier orders the hosts; the devices: wait for this rank's stream */
    if (cudaStreamSynchronize(rank_of(c)->cu->stream) != cudaSuccess) {
        nccl_abort(c, "cudaStreamSynchronize failed");
        return qerr_set(err, QERR_IO, "comm: rank %d: its stream failed", c->rank);
    }
    return 0;
}

static void group_release(struct nccl_group *g)
{
    for (int r = 0; r < g->n; r++) {
        if (g->comms[r] && !g->aborted) g->f.destroy(g->comms[r]);
        comm_destroy(g->host[r]);
    }
    if (g->f.lib) dlclose(g->f.lib);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void nccl_destroy(struct comm *c)
{
    struct nccl_group *g = rank_of(c)->g;
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    free(rank_of(c));
    if (last) group_release(g);
}

static const struct comm_ops nccl_comm_ops = {
    /* .name = */ "nccl",
    /* .all_reduce = */ nccl_all_reduce,
    /* .all_gather = */ nccl_all_gather,
    /* .broadcast = */ nccl_broadcast,
    /* .barrier = */ nccl_barrier,
    /* .abort = */ nccl_abort,
    /* .destroy = */ nccl_destroy,
};

extern "C" int comm_nccl_create(struct backend *const *be, int n, struct comm **out,
                                struct qerr *err)
{
    if (n < 1 || n > COMM_MAX_RANKS)
        return qerr_set(err, QERR_INVALID, "comm: %d ranks (1..%d)", n, COMM_MAX_RANKS);
    struct nccl_group *g = (struct nccl_group *)calloc(1, sizeof *g);
    if (!g) return qerr_set(err, QERR_NOMEM, "comm: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    g->n = n;
    int devs[COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        devs[r] = cuda_ctx_of(be[r])->device;
        for (int k = 0; k < r; k++)
            if (devs[k] == devs[r]) {
                group_release(g);
                return qerr_set(err, QERR_INVALID, "comm: ranks %d and %d share cuda:%d", k, r,
                                devs[r]);
            }
    }
    int rc = open_nccl(&g->f, err);
    if (!rc) rc = comm_cpu_create(n, NULL, g->host, err);
    if (rc) {
        group_release(g);
        return rc;
    }
    nccl_result_t nr = g->f.init_all(g->comms, n, devs);
    if (nr != NCCL_SUCCESS) {
        int code = qerr_set(err, QERR_IO, "comm: ncclCommInitAll over %d devices: %s", n,
                            g->f.error_string(nr));
        memset(g->comms, 0, sizeof g->comms);
        group_release(g);
        return code;
    }
    for (int r = 0; r < n; r++) {
        struct nccl_rank *rk = (struct nccl_rank *)calloc(1, sizeof *rk);
        if (!rk) {
            for (int k = 0; k < r; k++) free(out[k]);
            group_release(g);
            return qerr_set(err, QERR_NOMEM, "comm: out of memory");
        }
        rk->c.ops = &nccl_comm_ops;
        rk->c.rank = r;
        rk->c.n_ranks = n;
        rk->c.ctx = rk;
        rk->g = g;
        rk->cu = cuda_ctx_of(be[r]);
        out[r] = &rk->c;
    }
    g->refs = n;
    return 0;
}

#else /* !QUERN_HAVE_NCCL */

extern "C" int comm_nccl_create(struct backend *const *be, int n, struct comm **out,
                                struct qerr *err)
{
    (void)be;
    (void)out;
    return qerr_set(err, QERR_UNSUPPORTED,
                    "comm: --tp %d on CUDA: this build has no NCCL communicator (-Dnccl=disabled)",
                    n);
}

#endif
