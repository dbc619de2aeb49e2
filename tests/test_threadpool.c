/* The worker pool: every task runs exactly once per job, for any thread count, across many
 * back-to-back jobs (the decode pattern), after the workers have gone to sleep, and with uneven
 * tasks on more threads than cores (late joiners). */
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "../kernels/cpu/threadpool.h"

struct count_job {
    atomic_int *hits;
    atomic_int workers_seen[64];
    int n_threads;
};

static void count_task(void *arg, int task, int worker)
{
    struct count_job *j = arg;
    ck_assert_int_ge(worker, 0);
    ck_assert_int_lt(worker, j->n_threads);
    atomic_fetch_add(&j->hits[task], 1);
    atomic_fetch_add(&j->workers_seen[worker], 1);
}

START_TEST(each_task_once)
{
    const int threads[] = {1, 2, 3, 8};
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        struct threadpool *p;
        struct qerr err = {0};
        ck_assert_int_eq(pool_create(threads[ti], &p, &err), 0);
        ck_assert_int_eq(pool_threads(p), threads[ti]);
        struct count_job j = {.n_threads = threads[ti]};
        j.hits = calloc(1000, sizeof *j.hits);
        for (int rep = 0; rep < 2000; rep++) {
            int n = 1 + rep % 97;
            for (int t = 0; t < n; t++) atomic_store(&j.hits[t], 0);
            pool_run(p, count_task, &j, n);
            for (int t = 0; t < n; t++) ck_assert_int_eq(atomic_load(&j.hits[t]), 1);
            if (rep == 1000) usleep(20000); /* let the workers fall asleep once */
        }
        pool_run(p, count_task, &j, 0); /* no tasks: returns at once */
        free(j.hits);
        pool_destroy(p);
    }
}
END_TEST

static void slow_task(void *arg, int task, int worker)
{
    (void)worker;
    atomic_int *hits = arg;
    if (task % 3 == 0) usleep(50);
    atomic_fetch_add(&hits[task], 1);
}

/* Uneven tasks and more threads than cores: workers join late, or not at all, and a job must
 * still run each task once and return only when all are done. */
START_TEST(late_joiners)
{
    struct threadpool *p;
    struct qerr err = {0};
    ck_assert_int_eq(pool_create(6, &p, &err), 0);
    atomic_int hits[16];
    for (int rep = 0; rep < 500; rep++) {
        int n = 2 + rep % 15;
        for (int t = 0; t < n; t++) atomic_store(&hits[t], 0);
        pool_run(p, slow_task, hits, n);
        for (int t = 0; t < n; t++) ck_assert_int_eq(atomic_load(&hits[t]), 1);
    }
    pool_destroy(p);
}
END_TEST

START_TEST(bad_thread_counts)
{
    struct threadpool *p;
    struct qerr err = {0};
    ck_assert_int_eq(pool_create(0, &p, &err), QERR_INVALID);
    ck_assert_int_eq(pool_create(5000, &p, &err), QERR_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("threadpool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, each_task_once);
    tcase_add_test(tc, late_joiners);
    tcase_add_test(tc, bad_thread_counts);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
