/* threadpool: see threadpool.h.
 *
 * DESIGN. A job is published by writing fn/ctx/n_tasks and then bumping `generation` (release).
 * Workers spin on `generation` for a while (with pause) and only then sleep on the condvar, after
 * counting themselves in `sleepers`. pool_run takes the mutex and broadcasts only when someone
 * sleeps: a decode step runs hundreds of small jobs back to back and each one would otherwise
 * pay a futex call. The handshake is Dekker-style on two seq_cst atomics: the worker increments
 * `sleepers` and then re-reads `generation` (under the mutex); pool_run bumps `generation` and
 * then reads `sleepers`. At least one of them sees the other's write, so no wake-up is lost.
 * Tasks are claimed from an atomic counter, so a slow task does not hold the others back. The
 * hot atomics sit on their own cache lines. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* pause is ~40-140 cycles: this spins for roughly 0.2-1 ms before sleeping */
#define SPIN_ITERS 8192
#define LINE       64

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
    /* the job: published by bumping generation after the fields are set */
    pool_fn fn;
    void *ctx;
    int n_tasks;
    _Alignas(LINE) atomic_uint generation;
    atomic_bool stop;
    _Alignas(LINE) atomic_int next_task;
    _Alignas(LINE) atomic_int active; /* workers still inside the current job */
    _Alignas(LINE) atomic_int sleepers;
};

static void run_tasks(struct threadpool *p, int worker)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, worker);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct threadpool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int spins = 0; g == seen && spins < SPIN_ITERS; spins++) {
            CPU_RELAX();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = g;
        run_tasks(p, w->id);
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
    }
}

int pool_create(int n_threads, struct threadpool **out, struct qerr *err)
{
    if (n_threads < 1 || n_threads > 1024)
        return qerr_set(err, QERR_INVALID, "threads: %d is not in 1..1024", n_threads);
    struct threadpool *p = aligned_alloc(LINE, (sizeof *p + LINE - 1) / LINE * LINE);
    if (!p) return qerr_set(err, QERR_NOMEM, "threadpool: out of memory");
    *p = (struct threadpool){.n_threads = n_threads};
    atomic_init(&p->generation, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->next_task, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->sleepers, 0);
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

void pool_destroy(struct threadpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->generation, 1);
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
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: publishes the job, orders the read below */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p, 0);
    while (atomic_load_explicit(&p->active, memory_order_acquire) > 0) CPU_RELAX();
}
