/* threadpool: a persistent pool of worker threads that run one parallel-for at a time.
 *
 * The caller's thread takes part as worker 0, so a pool of n threads starts n - 1. Workers spin
 * for a short while after each job before sleeping on a condition variable: decode steps arrive
 * back to back and a futex wake costs more than the work of a small op. */
#ifndef QUERN_THREADPOOL_H
#define QUERN_THREADPOOL_H

#include <stdbool.h>

#include "../../quant/qerr.h"

struct threadpool;

/* fn(ctx, task, worker) runs once for every task in [0, n_tasks); worker in [0, n_threads). */
typedef void (*pool_fn)(void *ctx, int task, int worker);

int pool_create(int n_threads, struct threadpool **out, struct qerr *err);
void pool_destroy(struct threadpool *p);
int pool_threads(const struct threadpool *p);
/* Runs the tasks and returns when all are done. Not reentrant: one job at a time. */
void pool_run(struct threadpool *p, pool_fn fn, void *ctx, int n_tasks);

/* What the jobs shared with the workers cost beyond their tasks, counted while on (for
 * `quern bench`: how long the caller waits at each job's end, and how soon workers join). */
struct pool_stats {
    long jobs;         /* pool_run calls that the workers could join (n_tasks > 1) */
    long tasks;        /* their tasks */
    long caller_tasks; /* of which the caller's thread ran */
    double wait_s;     /* the caller's time from finishing its last task to the job's end */
    long joins;        /* (job, worker) pairs where a worker ran a task */
    double join_s;     /* summed over them: from the job's publication to that first task */
};
/* Starts counting from zero (on) or stops (off). From the thread that calls pool_run. */
void pool_stats_count(struct threadpool *p, bool on);
/* The counts since pool_stats_count(p, true). From the thread that calls pool_run. */
void pool_stats_read(const struct threadpool *p, struct pool_stats *out);

#endif
