/* threadpool: see threadpool.h.
 *
 * DESIGN. One 64-bit atomic word describes the current job: its id (16 bits), its task count
 * (24 bits) and the next unclaimed task (24 bits). pool_run writes fn/ctx, then publishes the
 * word with a new id and task 0 (release); everyone, the caller included, claims tasks with one
 * fetch_add on the word, which returns the job id, its size and the claimed index together.
 * A claim past the end means the job is drained: the claimer stops without reading anything
 * else. A claim inside it means that job is not finished (this task is not done), so the caller
 * is still waiting for it and fn/ctx still describe it. The caller counts finished tasks and
 * returns when all are done: it never waits for a worker that has not joined (one that is
 * asleep, or was preempted while idle), which keeps a loaded machine from stalling every step.
 *
 * Idle workers spin on the word (with pause) and then sleep on the condvar after counting
 * themselves in `sleepers`; pool_run takes the mutex and broadcasts only when someone sleeps, so
 * the hundreds of small jobs of a decode step pay no futex call. The handshake is Dekker-style on
 * seq_cst atomics: a worker increments `sleepers` and then re-reads the word (under the mutex);
 * pool_run publishes the word and then reads `sleepers`. At least one sees the other's write, so
 * no wake-up is lost. The hot atomics sit on their own cache lines. */
#include "threadpool.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* pause is ~40-140 cycles: this spins for roughly 0.2-1 ms before sleeping */
#define SPIN_ITERS 8192
#define LINE       64

#define JOB_SHIFT  48
#define N_SHIFT    24
#define FIELD_MASK ((UINT64_C(1) << N_SHIFT) - 1)
#define MAX_TASKS  (1 << 22) /* leaves room for one overshooting claim per thread */

struct worker {
    struct threadpool *pool;
    int id;
    pthread_t thread;
};

struct threadpool {
    int n_threads;
    struct worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    /* the current job's function: valid while any of its tasks is unfinished */
    pool_fn fn;
    void *ctx;
    _Alignas(LINE) _Atomic uint64_t word; /* job id | task count | next task */
    atomic_bool stop;
    _Alignas(LINE) atomic_int done; /* finished tasks of the current job */
    _Alignas(LINE) atomic_int sleepers;
    /* pool_stats: the caller's fields are its own; workers add to the atomics. on and
     * published (the job's publication time) are written before the job word (seq_cst) and read
     * after a claim of that job, which its publication orders before them. */
    _Alignas(LINE) _Atomic long joins;
    _Atomic uint64_t join_ns;
    atomic_bool stats_on;
    uint64_t published;
    struct pool_stats stats;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned job_of(uint64_t w)
{
    return (unsigned)(w >> JOB_SHIFT);
}

/* Claims and runs tasks of whatever job is current until it is drained; returns how many. */
static int run_tasks(struct threadpool *p, int worker)
{
    for (int ran = 0;; ran++) {
        uint64_t w = atomic_fetch_add_explicit(&p->word, 1, memory_order_acq_rel);
        uint64_t n = (w >> N_SHIFT) & FIELD_MASK, idx = w & FIELD_MASK;
        if (idx >= n) return ran;
        if (ran == 0 && worker > 0 && atomic_load_explicit(&p->stats_on, memory_order_relaxed)) {
            atomic_fetch_add_explicit(&p->join_ns, now_ns() - p->published, memory_order_relaxed);
            atomic_fetch_add_explicit(&p->joins, 1, memory_order_relaxed);
        }
        p->fn(p->ctx, (int)idx, worker);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    struct threadpool *p = wk->pool;
    unsigned seen = 0; /* the job this worker last helped with (0: none yet) */
    for (;;) {
        unsigned j = job_of(atomic_load_explicit(&p->word, memory_order_acquire));
        for (int spins = 0; j == seen && spins < SPIN_ITERS; spins++) {
            CPU_RELAX();
            j = job_of(atomic_load_explicit(&p->word, memory_order_acquire));
        }
        if (j == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((j = job_of(atomic_load(&p->word))) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = j;
        run_tasks(p, wk->id);
    }
}

int pool_create(int n_threads, struct threadpool **out, struct qerr *err)
{
    if (n_threads < 1 || n_threads > 1024)
        return qerr_set(err, QERR_INVALID, "threads: %d is not in 1..1024", n_threads);
    struct threadpool *p = aligned_alloc(LINE, (sizeof *p + LINE - 1) / LINE * LINE);
    if (!p) return qerr_set(err, QERR_NOMEM, "threadpool: out of memory");
    *p = (struct threadpool){.n_threads = n_threads};
    atomic_init(&p->word, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->joins, 0);
    atomic_init(&p->join_ns, 0);
    atomic_init(&p->stats_on, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        pool_destroy(p);
        return qerr_set(err, QERR_NOMEM, "threadpool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].id = i;
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            p->n_threads = i; /* join only the ones that started */
            pool_destroy(p);
            return qerr_set(err, QERR_IO, "threadpool: cannot start thread %d", i);
        }
    }
    *out = p;
    return 0;
}

/* Publishes a new job word: the next id (never 0, which workers start out having seen). */
static void publish(struct threadpool *p, uint64_t n_tasks)
{
    unsigned next = (job_of(atomic_load_explicit(&p->word, memory_order_relaxed)) + 1) & 0xffff;
    if (next == 0) next = 1;
    atomic_store(&p->word, ((uint64_t)next << JOB_SHIFT) | (n_tasks << N_SHIFT));
}

void pool_destroy(struct threadpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    publish(p, 0);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    if (p->workers)
        for (int i = 1; i < p->n_threads; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}

int pool_threads(const struct threadpool *p)
{
    return p->n_threads;
}

void pool_run(struct threadpool *p, pool_fn fn, void *ctx, int n_tasks)
{
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    assert(n_tasks <= MAX_TASKS);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    bool counting = atomic_load_explicit(&p->stats_on, memory_order_relaxed);
    if (counting) p->published = now_ns();
    publish(p, (uint64_t)n_tasks); /* seq_cst: releases the fields, orders the read below */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    int mine = run_tasks(p, 0);
    uint64_t own_done = counting ? now_ns() : 0;
    /* the others finish the tasks they claimed; if one was preempted mid-task (more threads
     * than free cores), give it the core rather than spinning out our time slice */
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; spins++) {
        if (spins < SPIN_ITERS)
            CPU_RELAX();
        else
            sched_yield();
    }
    if (counting) {
        p->stats.jobs++;
        p->stats.tasks += n_tasks;
        p->stats.caller_tasks += mine;
        p->stats.wait_s += (double)(now_ns() - own_done) * 1e-9;
    }
}

void pool_stats_count(struct threadpool *p, bool on)
{
    if (on) {
        p->stats = (struct pool_stats){0};
        atomic_store(&p->joins, 0);
        atomic_store(&p->join_ns, 0);
    }
    atomic_store(&p->stats_on, on);
}

void pool_stats_read(const struct threadpool *p, struct pool_stats *out)
{
    *out = p->stats;
    out->joins = atomic_load(&p->joins);
    out->join_s = (double)atomic_load(&p->join_ns) * 1e-9;
}
