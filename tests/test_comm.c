/* The CPU shared-memory communicator (kernels/comm.h): all-reduce bit-equal to a sum in rank
 * order for odd sizes and 1..8 ranks, fp16, all-gather, broadcast, thousands of back-to-back
 * calls, and failure: a rank that aborts or never arrives makes every other rank return an
 * error instead of hanging, and the group stays failed. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/comm.h"
#include "../quant/qtypes.h"
#include "testutil.h"

/* What a rank thread runs; rc and msg are its result. */
struct rank_job {
    struct comm *c;
    int (*fn)(struct rank_job *j);
    size_t count;
    int reps;
    int rc;
    char msg[512];
};

static float value(int rank, size_t i, int rep)
{
    /* varied magnitudes so that the sum order shows in the low bits */
    return (float)((rank + 1) * 0.37 + (double)(i % 13) * 1e-3 - (double)rep * 1e-4) *
           (i % 3 ? 1.0f : 1e4f);
}

static float rank_order_sum(int n, size_t i, int rep)
{
    float s = value(0, i, rep);
    for (int r = 1; r < n; r++) s += value(r, i, rep);
    return s;
}

static int run_all_reduce(struct rank_job *j)
{
    float *buf = malloc((j->count ? j->count : 1) * sizeof *buf);
    struct qerr err = {0};
    int rc = 0;
    for (int rep = 0; rep < j->reps && !rc; rep++) {
        for (size_t i = 0; i < j->count; i++) buf[i] = value(j->c->rank, i, rep);
        rc = comm_all_reduce(j->c, buf, j->count, COMM_F32, &err);
        for (size_t i = 0; i < j->count && !rc; i++)
            if (memcmp(&buf[i], &(float){rank_order_sum(j->c->n_ranks, i, rep)}, 4)) {
                rc = QERR_FORMAT;
                snprintf(err.msg, sizeof err.msg, "rank %d rep %d element %zu: %g", j->c->rank, rep,
                         i, buf[i]);
            }
    }
    j->rc = rc;
    memcpy(j->msg, err.msg, sizeof j->msg);
    free(buf);
    return rc;
}

static void *rank_main(void *arg)
{
    struct rank_job *j = arg;
    j->rc = j->fn(j);
    return NULL;
}

/* Runs fn on n rank threads of a new group; jobs[r] holds each rank's result. */
static void run_group(int n, int timeout_ms, int (*fn)(struct rank_job *), size_t count, int reps,
                      struct rank_job *jobs)
{
    struct comm *c[COMM_MAX_RANKS];
    struct qerr err = {0};
    struct comm_cpu_opts o = {.timeout_ms = timeout_ms};
    ck_assert_msg(comm_cpu_create(n, &o, c, &err) == 0, "%s", err.msg);
    pthread_t t[COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = (struct rank_job){.c = c[r], .fn = fn, .count = count, .reps = reps};
        ck_assert_int_eq(pthread_create(&t[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < n; r++) comm_destroy(c[r]);
}

START_TEST(all_reduce_odd_sizes)
{
    const size_t sizes[] = {0, 1, 3, 7, 31, 577, 1031, 9 * 64 + 5};
    int n = _i;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        struct rank_job jobs[8];
        run_group(n, 0, run_all_reduce, sizes[k], 3, jobs);
        for (int r = 0; r < n; r++)
            ck_assert_msg(jobs[r].rc == 0, "%d ranks, %zu elements: %s", n, sizes[k], jobs[r].msg);
    }
}
END_TEST

/* The decode pattern: many small all-reduces back to back, the ranks racing each other. */
START_TEST(all_reduce_thousands)
{
    int reps = tu_sanitized() ? 300 : 3000;
    struct rank_job jobs[8];
    for (int n = 2; n <= 3; n++) {
        run_group(n, 0, run_all_reduce, 576, reps, jobs);
        for (int r = 0; r < n; r++) ck_assert_msg(jobs[r].rc == 0, "%s", jobs[r].msg);
    }
}
END_TEST

static int run_f16(struct rank_job *j)
{
    uint16_t buf[101];
    for (int i = 0; i < 101; i++) buf[i] = f32_to_fp16(value(j->c->rank, (size_t)i, 0) * 1e-3f);
    struct qerr err = {0};
    int rc = comm_all_reduce(j->c, buf, 101, COMM_F16, &err);
    if (rc) return rc;
    for (int i = 0; i < 101; i++) {
        float s = fp16_to_f32(f32_to_fp16(value(0, (size_t)i, 0) * 1e-3f));
        for (int r = 1; r < j->c->n_ranks; r++)
            s += fp16_to_f32(f32_to_fp16(value(r, (size_t)i, 0) * 1e-3f));
        if (buf[i] != f32_to_fp16(s)) return QERR_FORMAT;
    }
    return 0;
}

static int run_gather_bcast(struct rank_job *j)
{
    int n = j->c->n_ranks, me = j->c->rank;
    float send[5], recv[8 * 5];
    for (int i = 0; i < 5; i++) send[i] = (float)(me * 10 + i);
    struct qerr err = {0};
    int rc = j->c->ops->all_gather(j->c, send, recv, 5, COMM_F32, &err);
    if (rc) return rc;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 5; i++)
            if (recv[r * 5 + i] != (float)(r * 10 + i)) return QERR_FORMAT;
    char msg[24];
    int root = n - 1;
    snprintf(msg, sizeof msg, "from rank %d", me);
    if ((rc = j->c->ops->broadcast(j->c, msg, sizeof msg, root, &err))) return rc;
    char want[24];
    snprintf(want, sizeof want, "from rank %d", root);
    if (strcmp(msg, want)) return QERR_FORMAT;
    return j->c->ops->barrier(j->c, &err);
}

START_TEST(f16_gather_broadcast)
{
    for (int n = 1; n <= 8; n++) {
        struct rank_job jobs[8];
        run_group(n, 0, run_f16, 0, 1, jobs);
        for (int r = 0; r < n; r++) ck_assert_msg(jobs[r].rc == 0, "f16, %d ranks", n);
        run_group(n, 0, run_gather_bcast, 0, 1, jobs);
        for (int r = 0; r < n; r++) ck_assert_msg(jobs[r].rc == 0, "gather/broadcast, %d ranks", n);
    }
}
END_TEST

/* Rank 1 fails after a few good steps and aborts; the others, waiting in the next all-reduce,
 * return an error naming it, and every later call fails at once. */
static int run_failing(struct rank_job *j)
{
    float buf[64] = {0};
    struct qerr err = {0};
    for (int step = 0; step < 10; step++) {
        if (j->c->rank == 1 && step == 5) {
            comm_abort(j->c, "out of memory in step 5");
            return QERR_NOMEM;
        }
        int rc = comm_all_reduce(j->c, buf, 64, COMM_F32, &err);
        if (rc) {
            memcpy(j->msg, err.msg, sizeof j->msg);
            if (step != 5) return QERR_FORMAT;
            /* sticky: the group stays failed */
            if (!comm_all_reduce(j->c, buf, 64, COMM_F32, &err)) return QERR_FORMAT;
            return rc;
        }
    }
    return 0;
}

START_TEST(failing_rank_reaches_all)
{
    struct rank_job jobs[4];
    run_group(4, 0, run_failing, 0, 1, jobs);
    ck_assert_int_eq(jobs[1].rc, QERR_NOMEM);
    for (int r = 0; r < 4; r++) {
        if (r == 1) continue;
        ck_assert_msg(jobs[r].rc == QERR_IO, "rank %d: rc %d", r, jobs[r].rc);
        ck_assert_msg(strstr(jobs[r].msg, "rank 1: out of memory"), "%s", jobs[r].msg);
    }
}
END_TEST

/* Rank 2 stops calling: the others time out instead of hanging. */
static int run_silent(struct rank_job *j)
{
    float buf[8] = {0};
    struct qerr err = {0};
    if (j->c->rank == 2) return 0;
    int rc = comm_all_reduce(j->c, buf, 8, COMM_F32, &err);
    memcpy(j->msg, err.msg, sizeof j->msg);
    return rc;
}

START_TEST(silent_rank_times_out)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct rank_job jobs[3];
    run_group(3, 150, run_silent, 0, 1, jobs);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(jobs[r].rc, QERR_IO);
        ck_assert_msg(strstr(jobs[r].msg, "waited 150 ms"), "%s", jobs[r].msg);
    }
    ck_assert_double_lt(s, 5.0);
}
END_TEST

START_TEST(bad_group_size)
{
    struct comm *c[1];
    struct qerr err = {0};
    ck_assert_int_eq(comm_cpu_create(0, NULL, c, &err), QERR_INVALID);
    ck_assert_int_eq(comm_cpu_create(COMM_MAX_RANKS + 1, NULL, c, &err), QERR_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, all_reduce_odd_sizes, 1, 9);
    tcase_add_test(tc, all_reduce_thousands);
    tcase_add_test(tc, f16_gather_broadcast);
    tcase_add_test(tc, failing_rank_reaches_all);
    tcase_add_test(tc, silent_rank_times_out);
    tcase_add_test(tc, bad_group_size);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
