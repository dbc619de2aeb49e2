/* Sampling: empirical frequencies against the renormalized distributions each filter defines
 * (chi-square), penalties exactly as defined, seeds, and parameter validation. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/sample.h"

enum { V = 10, DRAWS = 20000 };
static const float base[V] = {2.0f, 1.5f, 1.2f, 1.0f, 0.5f, 0.2f, 0.0f, -0.5f, -1.0f, -3.0f};

/* Expected distribution: softmax(base / T) restricted to keep[], renormalized. */
static void expected(float T, const bool *keep, double *p)
{
    double sum = 0;
    for (int i = 0; i < V; i++) sum += p[i] = keep[i] ? exp(base[i] / T) : 0;
    for (int i = 0; i < V; i++) p[i] /= sum;
}

/* Draws DRAWS tokens and returns the chi-square statistic against p (cells with p = 0 must
 * never be drawn). */
static double chi_square(const struct sample_params *sp, const double *p, int *df)
{
    struct sampler s;
    struct qerr err = {0};
    ck_assert_int_eq(sampler_init(&s, sp, V, &err), 0);
    int count[V] = {0};
    float logits[V];
    for (int d = 0; d < DRAWS; d++) {
        memcpy(logits, base, sizeof logits);
        int t = sampler_sample(&s, logits);
        ck_assert(t >= 0 && t < V);
        count[t]++;
    }
    sampler_free(&s);
    double chi = 0;
    *df = -1;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0) {
            ck_assert_msg(count[i] == 0, "token %d was filtered out but drawn %d times", i,
                          count[i]);
            continue;
        }
        double e = p[i] * DRAWS;
        chi += (count[i] - e) * (count[i] - e) / e;
        (*df)++;
    }
    return chi;
}

/* 99.9% quantiles of chi-square for df 1..9 */
static const double chi999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};

static void check_fit(const struct sample_params *sp, const bool *keep)
{
    double p[V];
    expected(sp->temperature, keep, p);
    int df;
    double chi = chi_square(sp, p, &df);
    ck_assert_msg(df >= 1 && chi < chi999[df], "chi-square %.2f with %d dof", chi, df);
}

START_TEST(plain_temperature)
{
    struct sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 0.8f;
    sp.seed = 1;
    bool keep[V];
    for (int i = 0; i < V; i++) keep[i] = true;
    check_fit(&sp, keep);
}
END_TEST

START_TEST(top_k)
{
    struct sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 0.7f;
    sp.top_k = 4;
    sp.seed = 2;
    bool keep[V] = {true, true, true, true};
    check_fit(&sp, keep);
}
END_TEST

START_TEST(top_p)
{
    struct sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 1.0f;
    sp.top_p = 0.6f;
    sp.seed = 3;
    /* the smallest prefix of the sorted distribution whose mass reaches 0.6 */
    double p[V];
    bool all[V], keep[V] = {0};
    for (int i = 0; i < V; i++) all[i] = true;
    expected(1.0f, all, p);
    double acc = 0;
    for (int i = 0; i < V && acc < 0.6; i++) {
        keep[i] = true;
        acc += p[i];
    }
    check_fit(&sp, keep);
}
END_TEST

START_TEST(min_p)
{
    struct sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 1.0f;
    sp.min_p = 0.3f;
    sp.seed = 4;
    bool keep[V];
    /* p_i / p_max = exp(base_i - base_0) >= 0.3  <=>  base_i >= 2 + ln 0.3 = 0.796 */
    for (int i = 0; i < V; i++) keep[i] = base[i] >= 2.0f + logf(0.3f);
    check_fit(&sp, keep);
}
END_TEST

START_TEST(greedy_and_ties)
{
    struct sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 0;
    struct sampler s;
    ck_assert_int_eq(sampler_init(&s, &sp, 4, NULL), 0);
    float l[4] = {1, 3, 3, 2};
    ck_assert_int_eq(sampler_sample(&s, l), 1); /* ties go to the lowest id */
    sampler_free(&s);
}
END_TEST

/* The one-pass loop sample_argmax must agree with, on every input. */
static int32_t argmax_one_pass(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

START_TEST(argmax_matches_one_pass)
{
    enum { N = 49152 + 7 };
    float *x = malloc(N * sizeof *x);
    ck_assert_ptr_nonnull(x);
    uint64_t r = 0x1234567;
    for (int rep = 0; rep < 400; rep++) {
        /* lengths around the lane width and a real vocabulary; few distinct values, so ties */
        int n = rep < 100 ? 1 + rep : rep < 390 ? 1 + (int)(r % 5000) : N - (rep % 3);
        for (int i = 0; i < n; i++) {
            r = r * 6364136223846793005u + 1442695040888963407u;
            x[i] = (float)((int)(r >> 33) % 9) - 4.0f;
        }
        if (rep % 5 == 1) x[(r >> 7) % (uint64_t)n] = NAN;    /* a NaN never wins */
        if (rep % 7 == 2) x[0] = NAN;                         /* nor is it beaten */
        if (rep % 11 == 3) x[(r >> 9) % (uint64_t)n] = -0.0f; /* signed zeros tie */
        ck_assert_int_eq(sample_argmax(x, n), argmax_one_pass(x, n));
    }
    for (int i = 0; i < N; i++) x[i] = -1e30f;
    x[N - 1] = 5;
    ck_assert_int_eq(sample_argmax(x, N), N - 1); /* the last lane of the tail */
    free(x);
}
END_TEST

START_TEST(penalties_exact)
{
    struct sample_params sp;
    sample_params_default(&sp);
    sp.repetition_penalty = 1.5f;
    sp.presence_penalty = 0.5f;
    sp.frequency_penalty = 0.25f;
    struct sampler s;
    ck_assert_int_eq(sampler_init(&s, &sp, 4, NULL), 0);
    sampler_accept(&s, 0);
    sampler_accept(&s, 0);
    sampler_accept(&s, 1);
    float l[4] = {2.0f, -1.0f, 0.5f, 3.0f};
    sampler_penalize(&s, l);
    ck_assert_float_eq_tol(l[0], 2.0f / 1.5f - 0.5f - 0.25f * 2, 1e-6f);
    ck_assert_float_eq_tol(l[1], -1.0f * 1.5f - 0.5f - 0.25f * 1, 1e-6f);
    ck_assert_float_eq(l[2], 0.5f); /* unseen tokens are untouched */
    ck_assert_float_eq(l[3], 3.0f);
    sampler_free(&s);
}
END_TEST

START_TEST(seed_reproducible)
{
    struct sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 1.0f;
    sp.seed = 99;
    struct sampler a, b;
    ck_assert_int_eq(sampler_init(&a, &sp, V, NULL), 0);
    ck_assert_int_eq(sampler_init(&b, &sp, V, NULL), 0);
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        float la[V], lb[V];
        memcpy(la, base, sizeof la);
        memcpy(lb, base, sizeof lb);
        ck_assert_int_eq(sampler_sample(&a, la), sampler_sample(&b, lb));
    }
    sp.seed = 100;
    struct sampler c;
    ck_assert_int_eq(sampler_init(&c, &sp, V, NULL), 0);
    sampler_free(&b);
    sp.seed = 99;
    ck_assert_int_eq(sampler_init(&b, &sp, V, NULL), 0);
    for (int i = 0; i < 200; i++) {
        float lb[V], lc[V];
        memcpy(lb, base, sizeof lb);
        memcpy(lc, base, sizeof lc);
        differ += sampler_sample(&b, lb) != sampler_sample(&c, lc);
    }
    ck_assert_int_gt(differ, 20);
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
}
END_TEST

START_TEST(params_validated)
{
    struct sample_params sp;
    struct qerr err = {0};
    sample_params_default(&sp);
    ck_assert_int_eq(sample_params_check(&sp, &err), 0);
    sp.top_p = 0;
    ck_assert_int_eq(sample_params_check(&sp, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "top_p"));
    sample_params_default(&sp);
    sp.temperature = -1;
    ck_assert_int_eq(sample_params_check(&sp, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "temperature"));
    sample_params_default(&sp);
    sp.temperature = NAN;
    ck_assert_int_eq(sample_params_check(&sp, &err), QERR_INVALID);
    sample_params_default(&sp);
    sp.min_p = 2;
    ck_assert_int_eq(sample_params_check(&sp, &err), QERR_INVALID);
}
END_TEST

START_TEST(logprob)
{
    float l[3] = {1, 2, 3};
    double lse = log(exp(1.0) + exp(2.0) + exp(3.0));
    ck_assert_float_eq_tol(sample_logprob(l, 3, 2), (float)(3 - lse), 1e-6f);
    ck_assert_float_eq_tol(sample_logprob(l, 3, 0), (float)(1 - lse), 1e-6f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sample");
    TCase *tc = tcase_create("sample");
    tcase_add_test(tc, plain_temperature);
    tcase_add_test(tc, top_k);
    tcase_add_test(tc, top_p);
    tcase_add_test(tc, min_p);
    tcase_add_test(tc, greedy_and_ties);
    tcase_add_test(tc, argmax_matches_one_pass);
    tcase_add_test(tc, penalties_exact);
    tcase_add_test(tc, seed_reproducible);
    tcase_add_test(tc, params_validated);
    tcase_add_test(tc, logprob);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
