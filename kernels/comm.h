/* comm: the contract a tensor-parallel communicator implements (beside backend.h).
 *
 * A group of n ranks; each rank holds its own handle (struct comm) and is driven by its own host
 * thread. Every collective is called by all ranks of the group in the same order with the same
 * sizes; buffers are the rank's backend buffers (host memory on the CPU, device memory under
 * NCCL). A call returns when this rank's part is done: for the CPU shared-memory group that
 * is when its output is complete; under NCCL when the work is queued on the rank's stream.
 *
 * Errors reach every rank: a rank that fails calls comm_abort (or stops calling), and every
 * other rank's pending or later collective returns QERR_IO with a message naming the rank and
 * its reason, within the group's timeout, never hanging. An aborted group stays aborted.
 *
 * Determinism: all_reduce sums in rank order, ((x0 + x1) + x2) + ... for every element, so a
 * result depends only on the ranks' inputs, never on the sizes or on timing (CPU group; NCCL
 * picks its own order, fixed for a given size and topology). */
#ifndef QUERN_COMM_H
#define QUERN_COMM_H

#include <stddef.h>

#include "../quant/qerr.h"

enum comm_dtype {
    COMM_F32 = 0,
    COMM_F16 = 1, /* summed in fp32, rounded to fp16 once (nearest even) */
};

struct comm;

struct comm_ops {
    const char *name;
    /* buf[count] = sum over ranks of each rank's buf, in place. */
    int (*all_reduce)(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                      struct qerr *err);
    /* recv[n_ranks][count] = every rank's send[count], in rank order. */
    int (*all_gather)(struct comm *c, const void *send, void *recv, size_t count,
                      enum comm_dtype dt, struct qerr *err);
    /* buf[bytes] = root's buf on every rank. */
    int (*broadcast)(struct comm *c, void *buf, size_t bytes, int root, struct qerr *err);
    int (*barrier)(struct comm *c, struct qerr *err);
    /* Marks the group failed with a reason every rank's collectives will report. */
    void (*abort)(struct comm *c, const char *why);
    /* Releases this rank's handle; the group's shared state goes with the last one. */
    void (*destroy)(struct comm *c);
};

struct comm {
    const struct comm_ops *ops;
    int rank, n_ranks;
    void *ctx; /* the implementation's state */
};

#define COMM_MAX_RANKS 64

static inline size_t comm_dtype_bytes(enum comm_dtype dt)
{
    return dt == COMM_F16 ? 2 : 4;
}

static inline int comm_all_reduce(struct comm *c, void *buf, size_t count, enum comm_dtype dt,
                                  struct qerr *err)
{
    return c->ops->all_reduce(c, buf, count, dt, err);
}

static inline void comm_abort(struct comm *c, const char *why)
{
    c->ops->abort(c, why);
}

static inline void comm_destroy(struct comm *c)
{
    if (c) c->ops->destroy(c);
}

/* The CPU shared-memory group: ranks are threads of this process. An all-reduce is one barrier:
 * each rank stages a copy of its buffer, meets the others, and sums all copies in rank order into
 * its own buffer (kernels/cpu/comm_cpu.c); all-gather and broadcast read the others' buffers
 * between two barriers. A rank waits at most timeout_ms (0: 30000) for the others, then aborts
 * the group. */
struct comm_cpu_opts {
    int timeout_ms;
};

/* out[r] is rank r's handle, r < n_ranks (1..COMM_MAX_RANKS). */
#ifdef __cplusplus
extern "C" {
#endif
int comm_cpu_create(int n_ranks, const struct comm_cpu_opts *opts, struct comm **out,
                    struct qerr *err);
#ifdef __cplusplus
}
#endif

#endif
