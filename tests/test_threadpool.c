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

static void sleepy_workers_task(void *arg, int task, int worker)
{
    (void)task;
    atomic_int *ran = arg;
    if (worker > 0) usleep(2000);
    atomic_fetch_add(&ran[worker], 1);
}

/* pool_stats: every shared job and task counted (the caller's share equal to the tasks it ran),
 * nothing while off or for jobs run inline, and the caller's wait at a job's end seen when a
 * worker holds the last task. */
START_TEST(stats_count_jobs_and_waits)
{
    struct threadpool *p;
    struct qerr err = {0};
    ck_assert_int_eq(pool_create(3, &p, &err), 0);
    struct count_job j = {.n_threads = 3};
    j.hits = calloc(16, sizeof *j.hits);
    pool_run(p, count_task, &j, 8); /* before counting: not counted */
    for (int w = 0; w < 3; w++) atomic_store(&j.workers_seen[w], 0);
    pool_stats_count(p, true);
    long tasks = 0;
    for (int rep = 0; rep < 300; rep++) {
        int n = 1 + rep % 12; /* n = 1 runs inline: not a shared job */
        pool_run(p, count_task, &j, n);
        tasks += n > 1 ? n : 0;
    }
    struct pool_stats st;
    pool_stats_read(p, &st);
    ck_assert_int_eq(st.jobs, 300 - 300 / 12);
    ck_assert_int_eq(st.tasks, tasks);
    long by_workers = atomic_load(&j.workers_seen[1]) + atomic_load(&j.workers_seen[2]);
    /* the inline jobs ran on the caller too: 25 of one task each */
    ck_assert_int_eq(st.caller_tasks, atomic_load(&j.workers_seen[0]) - 300 / 12);
    ck_assert_int_eq(st.caller_tasks + by_workers, tasks);
    ck_assert(st.wait_s >= 0 && st.join_s >= 0);
    ck_assert_int_le(st.joins, 2 * st.jobs);
    ck_assert_int_ge(st.joins, by_workers > 0 ? 1 : 0);

    /* workers that hold a task for 2 ms make the caller wait about that long at the end */
    atomic_int ran[3] = {0};
    pool_stats_count(p, true);
    for (int rep = 0; rep < 20; rep++) pool_run(p, sleepy_workers_task, ran, 2);
    pool_stats_read(p, &st);
    ck_assert_int_eq(st.jobs, 20);
    ck_assert_int_eq(st.caller_tasks, atomic_load(&ran[0]));
    if (atomic_load(&ran[1]) + atomic_load(&ran[2]) > 0) {
        ck_assert_int_ge(st.joins, 1);
        ck_assert(st.wait_s > 0.001);
    }

    /* off: the counts stay as they were */
    pool_stats_count(p, false);
    pool_run(p, count_task, &j, 8);
    struct pool_stats after;
    pool_stats_read(p, &after);
    ck_assert_int_eq(after.jobs, st.jobs);
    ck_assert_int_eq(after.tasks, st.tasks);
    free(j.hits);
    pool_destroy(p);

    /* one thread: every job runs inline, none is shared */
    ck_assert_int_eq(pool_create(1, &p, &err), 0);
    pool_stats_count(p, true);
    atomic_int one[1] = {0};
    pool_run(p, sleepy_workers_task, one, 5);
    pool_stats_read(p, &st);
    ck_assert_int_eq(st.jobs, 0);
    ck_assert_int_eq(atomic_load(&one[0]), 5);
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
    tcase_add_test(tc, stats_count_jobs_and_waits);
    tcase_add_test(tc, bad_thread_counts);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
