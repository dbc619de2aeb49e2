/* Speculative decoding (engine/spec.h): the n-gram drafter and the adaptive draft length alone,
 * then the engine on the real model with --spec ngram against --spec off: the same tokens, text
 * and finish reasons for greedy and seeded sampling, golden and input-grounded prompts, 16
 * streams at once and under preemption; the pool, the spare blocks and the prefix cache
 * checked after every step (engine_check), and the cached prefixes at the end equal to plain
 * decoding's. The same with a draft model (--spec draft): the default model quantized to Q4_0
 * drafting for its Q8_0 copy, both made here (kept in the build dir). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/stat.h>

#include "../engine/engine_impl.h"
#include "../engine/generate.h"
#include "../engine/gguf_quantize.h"
#include "../engine/spec_history.h"
#include "../engine/synth.h"
#include "testbackend.h"
#include "testmodel.h"
#include "testutil.h"

/* ---- the drafter and the draft length, no model ---- */

START_TEST(ngram_drafts_the_latest_longest_match)
{
    struct spec_drafter d;
    spec_drafter_init(&d, SPEC_NGRAM);
    int32_t out[SPEC_K_MAX];
    /* the last 4 tokens (1 2 3 4) occurred at 0 and at 6: the later one's continuation */
    int32_t a[] = {1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7, 8, 1, 2, 3, 4};
    int n = (int)(sizeof a / sizeof *a);
    int match = -1;
    ck_assert_int_eq(spec_draft(&d, a, n, 3, out, &match), 3);
    ck_assert_int_eq(match, 4); /* 9 before the occurrence, 8 before the tail */
    ck_assert_int_eq(out[0], 6);
    ck_assert_int_eq(out[1], 7);
    ck_assert_int_eq(out[2], 8);
    /* the continuation may run into the current tail, and stops at the end */
    ck_assert_int_eq(spec_draft(&d, a, n, 16, out, NULL), 7);
    ck_assert_int_eq(out[6], 4);
    /* longest first: "3 4" matches late (after 0 3 4), but "2 3 4" only early */
    int32_t b[] = {2, 3, 4, 50, 51, 0, 3, 4, 60, 2, 3, 4};
    ck_assert_int_eq(spec_draft(&d, b, 12, 2, out, &match), 2);
    ck_assert_int_eq(match, 3);
    ck_assert_int_eq(out[0], 50);
    ck_assert_int_eq(out[1], 51);
    /* a lone repeated token is not enough (n >= 2), nothing repeated: no draft */
    int32_t c[] = {7, 1, 2, 7};
    ck_assert_int_eq(spec_draft(&d, c, 4, 4, out, &match), 0);
    ck_assert_int_eq(match, 0);
    ck_assert_int_eq(spec_draft(&d, a, 1, 4, out, NULL), 0);
    ck_assert_int_eq(spec_draft(&d, a, n, 0, out, NULL), 0);
    /* the match is counted past the 4 tokens searched for, while the tokens before agree */
    int32_t m6[] = {9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6};
    ck_assert_int_eq(spec_draft(&d, m6, 15, 2, out, &match), 2);
    ck_assert_int_eq(match, 6);
    ck_assert_int_eq(out[0], 7);
    ck_assert_int_eq(spec_match_class(match), 4);
    ck_assert_int_eq(spec_match_class(0), 0);
    ck_assert_int_eq(spec_match_class(1), 1);
    ck_assert_int_eq(spec_match_class(3), 3);
    ck_assert_int_eq(spec_match_class(8), 5);
    ck_assert_int_eq(spec_match_class(SPEC_MATCH_MAX), 5);
    /* a whole earlier copy: counted up to SPEC_MATCH_MAX */
    int32_t rep[40];
    for (int i = 0; i < 40; i++) rep[i] = i % 20;
    ck_assert_int_eq(spec_draft(&d, rep, 40, 4, out, &match), 4);
    ck_assert_int_eq(match, SPEC_MATCH_MAX);
    ck_assert_int_eq(out[0], 0);
    spec_drafter_init(&d, SPEC_OFF);
    ck_assert_int_eq(spec_draft(&d, a, n, 4, out, &match), 0);

    enum spec_mode m;
    struct qerr err = {0};
    ck_assert_int_eq(spec_mode_parse("ngram", &m, &err), 0);
    ck_assert_int_eq(m, SPEC_NGRAM);
    ck_assert_int_eq(spec_mode_parse("off", &m, &err), 0);
    ck_assert_int_eq(m, SPEC_OFF);
    ck_assert_int_eq(spec_mode_parse("draft", &m, &err), 0);
    ck_assert_int_eq(m, SPEC_DRAFT);
    ck_assert_int_eq(spec_mode_parse("eagle", &m, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "eagle"));
}
END_TEST

/* Earlier answers: the most recent occurrence of the longest n-gram, cut at its answer's end;
 * nothing from tokens the ring has overwritten; an answer longer than the ring keeps its end;
 * the drafter reads the history only where the context has no match. */
/* spec_draft_prediction: the prediction's start before any output, then what follows the
 * output's last tokens where they occur nearest the output's own length. */
START_TEST(prediction_drafts_where_the_output_is)
{
    struct spec_drafter d;
    spec_drafter_init(&d, SPEC_NGRAM);
    const int32_t pred[] = {10, 11, 12, 13, 14, 10, 11, 15, 16, 17};
    int32_t out[SPEC_K_MAX];
    int match;
    ck_assert_int_eq(spec_draft_prediction(&d, pred, 10, NULL, 0, 4, out, &match), 4);
    ck_assert_int_eq(out[0], 10);
    ck_assert_int_eq(out[3], 13);
    ck_assert_int_eq(match, SPEC_MATCH_MAX);
    /* seven tokens out, an edit among them: "14 10 11" ends at 7 in the prediction */
    const int32_t gen[] = {10, 11, 12, 99, 14, 10, 11};
    ck_assert_int_eq(spec_draft_prediction(&d, pred, 10, gen, 7, 8, out, &match), 3);
    ck_assert_int_eq(out[0], 15);
    ck_assert_int_eq(out[2], 17);
    ck_assert_int_eq(match, 3);
    /* two out: "10 11" occurs at 0 and 5; the one ending at 2 is where the output is */
    ck_assert_int_eq(spec_draft_prediction(&d, pred, 10, gen, 2, 2, out, &match), 2);
    ck_assert_int_eq(out[0], 12);
    ck_assert_int_eq(out[1], 13);
    ck_assert_int_eq(match, 2);
    /* with six out ("... 14 10") the second "10" is nearer: "10 11" is not the tail, "14 10" is */
    ck_assert_int_eq(spec_draft_prediction(&d, pred, 10, gen, 6, 1, out, &match), 1);
    ck_assert_int_eq(out[0], 11);
    /* nothing matches ngram_min tokens: no draft; SPEC_OFF drafts from a prediction too (it is
     * the only source there), and SPEC_DRAFT (before its draft model) */
    const int32_t other[] = {1, 2};
    ck_assert_int_eq(spec_draft_prediction(&d, pred, 10, other, 2, 4, out, &match), 0);
    ck_assert_int_eq(match, 0);
    spec_drafter_init(&d, SPEC_OFF);
    ck_assert_int_eq(spec_draft_prediction(&d, pred, 10, gen, 7, 8, out, &match), 3);
    ck_assert_int_eq(spec_draft(&d, gen, 7, 4, out, &match), 0);
    spec_drafter_init(&d, SPEC_DRAFT);
    ck_assert_int_eq(spec_draft_prediction(&d, pred, 10, NULL, 0, 4, out, &match), 4);
    ck_assert_int_eq(spec_draft(&d, gen, 7, 4, out, &match), 0);
}
END_TEST

START_TEST(history_drafts_from_earlier_answers)
{
    struct spec_history h;
    struct qerr err = {0};
    int32_t out[SPEC_K_MAX];
    int match = -1;
    ck_assert_int_eq(spec_history_init(&h, 0, &err), 0);
    ck_assert_uint_eq(h.cap, 0);
    static const int32_t a[] = {10, 11, 12, 13, 14, 15};
    spec_history_add(&h, a, 6); /* no history: nothing kept, nothing drafted */
    ck_assert_int_eq(spec_history_draft(&h, a, 3, 4, out, &match), 0);
    ck_assert_int_eq(match, 0);
    ck_assert_int_eq(spec_history_init(&h, 1L << 27, &err), QERR_INVALID);
    ck_assert_int_eq(spec_history_init(&h, 1000, &err), 0);
    ck_assert_uint_eq(h.cap, 1024);

    spec_history_add(&h, a, 6);
    /* ... 11 12 -> 13 14 15, and the answer ends there */
    static const int32_t c1[] = {7, 8, 11, 12};
    ck_assert_int_eq(spec_history_draft(&h, c1, 4, 8, out, &match), 3);
    ck_assert_int_eq(out[0], 13);
    ck_assert_int_eq(out[2], 15);
    ck_assert_int_eq(match, 2);
    ck_assert_int_eq(spec_history_draft(&h, c1, 4, 2, out, NULL), 2); /* k bounds it */
    /* a later answer with 11 12 followed otherwise: the most recent wins for the bigram, but a
     * context that matches the first answer's 4-gram gets that one's continuation */
    static const int32_t b[] = {11, 12, 20, 21};
    spec_history_add(&h, b, 4);
    ck_assert_int_eq(spec_history_draft(&h, c1, 4, 8, out, &match), 2);
    ck_assert_int_eq(out[0], 20);
    static const int32_t c2[] = {10, 11, 12, 13};
    ck_assert_int_eq(spec_history_draft(&h, c2, 4, 8, out, &match), 2);
    ck_assert_int_eq(out[0], 14);
    ck_assert_int_eq(match, 4);
    /* the match is counted back past the n-gram searched, within the answer */
    static const int32_t c3[] = {99, 10, 11, 12, 13, 14};
    ck_assert_int_eq(spec_history_draft(&h, c3, 6, 8, out, &match), 1);
    ck_assert_int_eq(out[0], 15);
    ck_assert_int_eq(match, 5);
    /* n-grams never span two answers (15 then 11 12 20) */
    static const int32_t c4[] = {14, 15, 11};
    ck_assert_int_eq(spec_history_draft(&h, c4, 3, 8, out, &match), 0);

    /* the ring wraps: the first answers are overwritten, and their n-grams draft nothing */
    static int32_t filler[1100];
    for (int i = 0; i < 1100; i++) filler[i] = 1000 + i;
    spec_history_add(&h, filler, 1100); /* longer than the ring: its last 1023 tokens */
    ck_assert_int_eq(spec_history_draft(&h, c2, 4, 8, out, &match), 0);
    ck_assert_int_eq(spec_history_draft(&h, c1, 4, 8, out, &match), 0);
    static const int32_t c5[] = {1076, 1077};
    ck_assert_int_eq(spec_history_draft(&h, c5, 2, 3, out, &match), 0); /* cut off */
    static const int32_t c6[] = {2097, 2098};
    ck_assert_int_eq(spec_history_draft(&h, c6, 2, 3, out, &match), 1);
    ck_assert_int_eq(out[0], 2099);

    /* the drafter: its own context first, the history where that finds nothing */
    struct spec_drafter d;
    spec_drafter_init(&d, SPEC_NGRAM);
    d.history = &h;
    int cls = -1;
    static const int32_t c7[] = {5, 6, 7, 5, 6, 2097, 2098};
    ck_assert_int_eq(spec_draft_classed(&d, c7, 5, 4, out, &cls), 3); /* 5 6 -> 7 5 6 */
    ck_assert_int_eq(out[0], 7);
    ck_assert_int_eq(cls, spec_match_class(2));
    ck_assert_int_eq(spec_draft_classed(&d, c7, 7, 4, out, &cls), 1);
    ck_assert_int_eq(out[0], 2099);
    ck_assert_int_eq(cls, SPEC_CLASS_HISTORY);
    d.history = NULL;
    ck_assert_int_eq(spec_draft_classed(&d, c7, 7, 4, out, &cls), 0);
    spec_history_free(&h);
}
END_TEST

/* Random answers over a 6-token vocabulary (n-grams recur, the 1024-token ring wraps many
 * times, index slots collide): every draft is what followed an occurrence of the context's
 * last n-gram (n <= the match reported) that the ring still holds, within that answer; and
 * where the latest answer holds the context's last 4 tokens followed by a token, a draft is
 * found. A shadow of the ring (every token ever added, by absolute position) is the reference. */
START_TEST(history_drafts_only_what_it_holds)
{
    struct spec_history h;
    struct qerr err = {0};
    ck_assert_int_eq(spec_history_init(&h, 1024, &err), 0);
    enum { TOTAL = 20000 };
    static int32_t shadow[TOTAL + 512];
    int64_t len = 0, found = 0, tries = 0;
    uint64_t rng = 12345;
    int32_t ans[64], ctx[16], out[SPEC_K_MAX];
    while (len < TOTAL) {
        int n = 1 + (int)((rng = rng * 6364136223846793005ULL + 1442695040888963407ULL) >> 59);
        n = n * 2 + 3; /* 5..65 */
        if (n > 64) n = 64;
        for (int i = 0; i < n; i++)
            ans[i] = (int32_t)((rng = rng * 6364136223846793005ULL + 1) >> 61) % 6;
        spec_history_add(&h, ans, n);
        memcpy(shadow + len, ans, (size_t)n * sizeof *ans);
        shadow[len + n] = -1;
        int64_t start = len;
        len += n + 1;
        ck_assert_uint_eq(h.head, (uint64_t)len);
        int64_t lo = len - 1024 > 0 ? len - 1024 : 0;
        for (int q = 0; q < 8; q++) {
            int c = 2 + q % 5; /* context of 2..6 tokens */
            for (int i = 0; i < c; i++)
                ctx[i] = (int32_t)((rng = rng * 6364136223846793005ULL + 1) >> 61) % 6;
            if (q == 7 && n >= 6) /* the latest answer's 4-gram at its start */
                memcpy(ctx + c - 4, ans, 4 * sizeof *ans);
            int k = 1 + q % 8, match = 0;
            int m = spec_history_draft(&h, ctx, c, k, out, &match);
            tries++;
            if (q == 7 && n >= 6) ck_assert_int_gt(m, 0);
            if (m == 0) continue;
            found++;
            ck_assert_int_ge(match, 2);
            ck_assert_int_le(match, c);
            /* some held occurrence of the last min(match, 4) tokens followed by the draft */
            int g = match < 4 ? match : 4;
            bool ok = false;
            for (int64_t p = lo + g; p < len && !ok; p++) {
                if (memcmp(shadow + p - g, ctx + c - g, (size_t)g * sizeof *ctx) != 0) continue;
                bool same = true;
                for (int j = 0; j < m && same; j++) same = p + j < len && shadow[p + j] == out[j];
                /* the draft stops at its answer's end or at k */
                bool ends = m == k || p + m >= len || shadow[p + m] == -1;
                ok = same && ends;
            }
            ck_assert_msg(ok, "a draft of %d tokens that no held answer has (answer at %lld)", m,
                          (long long)start);
        }
    }
    printf("spec history, random answers: %lld of %lld contexts drafted\n", (long long)found,
           (long long)tries);
    ck_assert_int_gt(found, tries / 4);
    spec_history_free(&h);
}
END_TEST

START_TEST(draft_length_follows_acceptance)
{
    struct spec_state st;
    spec_state_init(&st, 8);
    ck_assert_int_eq(spec_state_next_k(&st), 8);
    spec_state_update(&st, 8, 2, 8); /* 2 of 8: try 3 next */
    ck_assert_int_eq(spec_state_next_k(&st), 3);
    spec_state_update(&st, 3, 3, 8); /* all kept: double */
    ck_assert_int_eq(spec_state_next_k(&st), 6);
    spec_state_update(&st, 6, 6, 8);
    ck_assert_int_eq(spec_state_next_k(&st), 8);
    /* misses in a row: 1, then no drafts for 1, 2, 4 steps */
    spec_state_update(&st, 8, 0, 8);
    ck_assert_int_eq(st.k, 1);
    ck_assert_int_eq(spec_state_next_k(&st), 0);
    ck_assert_int_eq(spec_state_next_k(&st), 1);
    spec_state_update(&st, 1, 0, 8);
    ck_assert_int_eq(spec_state_next_k(&st), 0);
    ck_assert_int_eq(spec_state_next_k(&st), 0);
    ck_assert_int_eq(spec_state_next_k(&st), 1);
    spec_state_update(&st, 1, 0, 8);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(spec_state_next_k(&st), 0);
    ck_assert_int_eq(spec_state_next_k(&st), 1);
    for (int i = 0; i < 10; i++) spec_state_update(&st, 1, 0, 8);
    ck_assert_int_eq(st.cooldown, 16);
    /* one accepted token ends the streak */
    st.cooldown = 0;
    spec_state_update(&st, 1, 1, 8);
    ck_assert_int_eq(st.misses, 0);
    ck_assert_int_eq(spec_state_next_k(&st), 2);
}
END_TEST

/* A machine whose n-token step costs base + slope * (n - 1), for n = 1..n_max: what
 * spec_policy.c weighs, fed as numbers (no clock). */
static void synth_costs(struct spec_cost *c, double base, double slope, int n_max)
{
    spec_cost_init(c);
    for (int n = 1; n <= n_max; n++) spec_cost_record_step(c, n, base + slope * (n - 1));
}

START_TEST(cost_policy_maximizes_tokens_per_second)
{
    struct spec_cost t, d;
    struct spec_costs c = {.target = &t, .horizon = 100}; /* the n-gram drafter: free */
    struct spec_step one = {.n_tokens = 1, .out_tokens = 1};
    double g;
    /* E(k) = 1 + a + .. + a^k */
    ck_assert_double_eq_tol(spec_expected_tokens(0.5, 2), 1.75, 1e-12);
    ck_assert_double_eq_tol(spec_expected_tokens(1.0, 4), 5, 1e-12);
    ck_assert_double_eq_tol(spec_expected_tokens(0.3, 0), 1, 1e-12);

    /* nothing timed: no draft, and the step is due to be timed */
    spec_cost_init(&t);
    ck_assert_int_eq(spec_policy_best(&c, 0.9, &one, 8, &g), 0);
    ck_assert_double_eq(g, 1);
    ck_assert(spec_cost_stale(&t, 1));

    /* verification nearly free (a GPU, or a CPU step of a few tokens), drafting free */
    synth_costs(&t, 1.0, 0.05, 9);
    ck_assert(!spec_cost_stale(&t, 1));
    ck_assert_int_eq(spec_policy_best(&c, 0.9, &one, 8, &g), 8); /* 6.13 tokens / 1.4 */
    ck_assert_double_eq_tol(g, spec_expected_tokens(0.9, 8) / 1.4, 1e-9);
    ck_assert_int_eq(spec_policy_best(&c, 0.5, &one, 8, &g), 3); /* 1.875 / 1.15 */
    ck_assert_double_eq_tol(g, 1.875 / 1.15, 1e-9);
    /* a draft rarely kept is not worth even a cheap verification */
    ck_assert_int_eq(spec_policy_best(&c, 0.04, &one, 8, &g), 0);
    ck_assert_double_eq(g, 1);

    /* a draft model whose forward costs half the target's, 60 % kept: nothing pays (k = 1:
     * 1.6 tokens for 1.1 + 0.5); one at a twentieth: k = 2 (1.96 tokens for 1.2 + 0.1) */
    synth_costs(&t, 1.0, 0.1, 9);
    synth_costs(&d, 0.5, 0.05, 9);
    c.draft = &d;
    ck_assert_double_eq_tol(spec_draft_seconds(&c, 3), 1.5, 1e-12);
    ck_assert_int_eq(spec_policy_best(&c, 0.6, &one, 8, &g), 0);
    synth_costs(&d, 0.05, 0.005, 9);
    ck_assert_int_eq(spec_policy_best(&c, 0.6, &one, 8, &g), 2);
    ck_assert_double_eq_tol(g, 1.96 / 1.3, 1e-9);
    /* its catch-up on 8 positions (0.04 more than a one-token forward) is spread over the
     * next 32 steps, or over the steps left when fewer */
    c.behind = 8;
    ck_assert_double_eq_tol(spec_draft_seconds(&c, 2), 0.09 + 0.05, 1e-12);
    ck_assert_int_eq(spec_policy_best(&c, 0.6, &one, 8, &g), 2);
    ck_assert_double_eq_tol(g, 1.96 / (1.3 + 0.04 / 32), 1e-9);
    c.horizon = 2;
    spec_policy_best(&c, 0.6, &one, 8, &g);
    ck_assert_double_eq_tol(g, 1.96 / (1.3 + 0.04 / 2), 1e-9);
    /* a draft model not timed yet costs its prior share of the target */
    spec_cost_init(&d);
    c.behind = 0;
    c.draft_prior = 0.5;
    ck_assert_double_eq_tol(spec_draft_seconds(&c, 2), 0.5 * 1.0 + 0.5 * 1.0, 1e-12);
    ck_assert_int_eq(spec_policy_best(&c, 0.6, &one, 8, &g), 0);
    c.draft = NULL;

    /* a step that costs its token count (a CPU past a few tokens): no draft pays */
    synth_costs(&t, 1.0, 1.0, 16);
    ck_assert_int_eq(spec_policy_best(&c, 0.95, &one, 8, &g), 0);

    /* 16 decodes already in the step, each added token 1/16 of its cost: a draft of a sequence
     * with 80 % acceptance adds less than it costs, so a full step drafts nothing */
    spec_cost_init(&t);
    for (int n = 16; n <= 32; n++) spec_cost_record_step(&t, n, 4.0 + 0.25 * (n - 16));
    struct spec_step full = {.n_tokens = 16, .out_tokens = 16};
    ck_assert_int_eq(spec_policy_best(&c, 0.8, &full, 8, &g), 0);
    /* the same sequence alone in a 1-token step (2.0 s there) would draft */
    spec_cost_record_step(&t, 1, 2.0);
    ck_assert_int_gt(spec_policy_best(&c, 0.8, &one, 8, &g), 0);
    /* a step that already carries a draft: the next one is weighed against that step */
    struct spec_step st = {.n_tokens = 1, .out_tokens = 1};
    synth_costs(&t, 1.0, 0.05, 16);
    spec_step_add(&st, &c, 0.5, 3);
    ck_assert_int_eq(st.n_tokens, 4);
    ck_assert_double_eq_tol(st.out_tokens, 1.875, 1e-12);
    ck_assert_int_eq(spec_policy_best(&c, 0.5, &st, 8, &g), 3);
}
END_TEST

START_TEST(cost_estimates_fill_the_gaps)
{
    struct spec_cost c;
    spec_cost_init(&c);
    ck_assert_double_eq(spec_cost_step(&c, 3), 0);
    /* one size timed: larger ones 10 % of it per token more (optimistic, so they get tried),
     * smaller ones no dearer */
    spec_cost_record_step(&c, 2, 1.0);
    ck_assert_double_eq_tol(spec_cost_step(&c, 4), 1.0 + 2 * 0.1 / 2, 1e-12);
    ck_assert_double_eq_tol(spec_cost_step(&c, 1), 1.0, 1e-12);
    /* two: interpolated between, extrapolated with their slope beyond */
    spec_cost_record_step(&c, 6, 3.0);
    ck_assert_double_eq_tol(spec_cost_step(&c, 4), 2.0, 1e-12);
    ck_assert_double_eq_tol(spec_cost_step(&c, 10), 5.0, 1e-12);
    ck_assert_double_eq_tol(spec_cost_step(&c, SPEC_COST_N + 6), 3.0 + 0.5 * SPEC_COST_N, 1e-9);
    /* moving averages: a new time weighs 0.2 */
    spec_cost_record_step(&c, 2, 2.0);
    ck_assert_double_eq_tol(spec_cost_step(&c, 2), 1.2, 1e-12);
    /* steps too large to time are counted; a size not timed for SPEC_COST_REFRESH steps is due */
    ck_assert(!spec_cost_stale(&c, 2));
    for (int i = 0; i < SPEC_COST_REFRESH; i++) spec_cost_record_step(&c, SPEC_COST_N + 1, 9);
    ck_assert(!spec_cost_stale(&c, 2));
    spec_cost_record_step(&c, 6, 3.0);
    ck_assert(spec_cost_stale(&c, 2));
    ck_assert(!spec_cost_stale(&c, 6));
    ck_assert(!spec_cost_stale(&c, SPEC_COST_N + 1)); /* never timed: nothing to refresh */

    /* acceptance: a prior of a half, then decayed counts of kept tokens and misses */
    struct spec_rate r;
    spec_rate_init(&r);
    ck_assert_double_eq_tol(spec_rate_accept(&r), 0.5, 1e-12);
    spec_rate_update(&r, 4, 4);
    ck_assert_double_eq_tol(spec_rate_accept(&r), 4.75 / 5.5, 1e-12);
    spec_rate_update(&r, 4, 0);
    ck_assert_double_eq_tol(spec_rate_accept(&r), 0.75 * 4.75 / (0.75 * 5.5 + 1), 1e-12);
    spec_rate_update(&r, 0, 0); /* no draft: nothing learnt */
    ck_assert_double_eq_tol(spec_rate_accept(&r), 0.75 * 4.75 / (0.75 * 5.5 + 1), 1e-12);

    enum spec_policy pol;
    struct qerr err = {0};
    ck_assert_int_eq(spec_policy_parse("acceptance", &pol, &err), 0);
    ck_assert_int_eq(pol, SPEC_POLICY_ACCEPTANCE);
    ck_assert_int_eq(spec_policy_parse("cost", &pol, &err), 0);
    ck_assert_int_eq(pol, SPEC_POLICY_COST);
    ck_assert_int_eq(spec_policy_parse("fast", &pol, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "fast"));
}
END_TEST

START_TEST(cost_policy_probes_where_drafts_do_not_pay)
{
    struct spec_cost t, d;
    /* each drafted token costs half a step: not worth it at a = 0.5 (k = 1: 1.5 tokens for
     * 1.5 steps), less so after misses */
    synth_costs(&t, 1.0, 0.5, 16);
    struct spec_costs c = {.target = &t, .horizon = 100};
    struct spec_step one = {.n_tokens = 1, .out_tokens = 1};
    struct spec_rate r;
    spec_rate_init(&r);
    /* SPEC_PROBE_EVERY steps without a draft, then a probe */
    for (int i = 1; i < SPEC_PROBE_EVERY; i++)
        ck_assert_int_eq(spec_policy_next_k(&r, &c, &one, 8), 0);
    ck_assert_int_ge(spec_policy_next_k(&r, &c, &one, 8), 1);
    ck_assert(r.probing);
    /* a probe that found no draft (the drafter had nothing) stays due */
    ck_assert_int_ge(spec_policy_next_k(&r, &c, &one, 8), 1);
    /* a missed probe doubles the wait, up to 8x */
    int waits[5];
    for (int p = 0; p < 5; p++) {
        spec_rate_update(&r, 1, 0);
        int w = 1;
        while (spec_policy_next_k(&r, &c, &one, 8) == 0) w++;
        waits[p] = w;
    }
    ck_assert_int_eq(waits[0], 2 * SPEC_PROBE_EVERY);
    ck_assert_int_eq(waits[1], 4 * SPEC_PROBE_EVERY);
    ck_assert_int_eq(waits[2], 8 * SPEC_PROBE_EVERY);
    ck_assert_int_eq(waits[4], 8 * SPEC_PROBE_EVERY);
    /* a probe that would cost more than SPEC_PROBE_SHARE of the idle steps waits longer: here
     * a draft model 40 positions behind, its forward 0.1 + 0.1 per position */
    spec_rate_update(&r, 1, 1);
    spec_cost_init(&d);
    for (int n = 1; n <= 64; n++) spec_cost_record_step(&d, n, 0.1 * n);
    c.draft = &d;
    c.behind = 40;
    int w = 1;
    while (spec_policy_next_k(&r, &c, &one, 8) == 0) w++;
    /* 0.5 (verification) + 4.1 (catch-up) <= 0.05 * w */
    ck_assert_int_eq(w, 92);
    c.draft = NULL;
    c.behind = 0;
    spec_rate_update(&r, 1, 0);
    /* where drafts pay, the policy drafts at once; a wholly kept draft resets the wait */
    synth_costs(&t, 1.0, 0.05, 16);
    spec_rate_update(&r, 2, 2);
    ck_assert_int_eq(r.backoff, 0);
    for (int i = 0; i < 4; i++) spec_rate_update(&r, 8, 8);
    ck_assert_int_eq(spec_policy_next_k(&r, &c, &one, 8), 8);
    ck_assert(!r.probing);
    /* nothing timed: no draft and no probe count */
    spec_cost_init(&t);
    spec_rate_init(&r);
    for (int i = 0; i < 3 * SPEC_PROBE_EVERY; i++)
        ck_assert_int_eq(spec_policy_next_k(&r, &c, &one, 8), 0);
    ck_assert_int_eq(r.idle, 0);
}
END_TEST

/* ---- the scheduler's pass D on a hand-built engine (no model, no thread) ---- */

struct rig {
    struct engine e;
    struct seq s;
    struct request req;
};

/* One running sequence decoding 1 2 3 4 5 6 7 1 2 3 (9 computed) in blocks of 4, spec_k 4. */
static struct rig *rig_new(int budget)
{
    struct rig *g = calloc(1, sizeof *g);
    ck_assert_ptr_nonnull(g);
    struct engine *e = &g->e;
    engine_opts_default(&e->o);
    e->o.max_batch_tokens = budget;
    e->o.max_seqs = 4;
    e->o.max_queue = 4;
    e->o.kv_block_size = 4;
    e->o.kv_blocks = 32;
    e->o.spec = SPEC_NGRAM;
    e->o.spec_k = 4;
    e->o.spec_policy = SPEC_POLICY_ACCEPTANCE; /* drafts_pass_the_cost_policy sets costs */
    e->spec_k = 4;
    spec_cost_init(&e->spec_cost);
    e->ctx_len = 1000;
    e->logit_rows = sched_logit_rows(&e->o);
    spec_drafter_init(&e->drafter, SPEC_NGRAM);
    e->waiting = calloc(8, sizeof *e->waiting);
    e->running = calloc(4, sizeof *e->running);
    e->spare = calloc(2, sizeof *e->spare);
    ck_assert(e->waiting && e->running && e->spare);
    struct qerr err = {0};
    ck_assert_msg(sched_plan_init(&e->plan, &e->o, &err) == 0, "%s", err.msg);
    ck_assert_msg(kv_pool_create(32, 4, &e->pool, &err) == 0, "%s", err.msg);
    e->spare_target = 2;
    while (e->n_spare < 2) e->spare[e->n_spare++] = kv_block_alloc(e->pool);
    pthread_mutex_init(&g->req.mu, NULL);
    struct seq *s = &g->s;
    s->req = &g->req;
    s->cap_tokens = 64;
    s->tokens = malloc(64 * sizeof *s->tokens);
    s->blocks = malloc(16 * sizeof *s->blocks);
    ck_assert(s->tokens && s->blocks);
    s->cap_blocks = 16;
    const int32_t t[] = {1, 2, 3, 4, 5, 6, 7, 1, 2, 3};
    memcpy(s->tokens, t, sizeof t);
    s->n_tokens = 10;
    s->n_prompt = 5;
    s->n_computed = 9;
    s->max_tokens = 40;
    s->n_generated = 5;
    for (int i = 0; i < 3; i++) s->blocks[s->n_blocks++] = kv_block_alloc(e->pool);
    s->spec = true;
    spec_state_init(&s->spec_st, 4);
    spec_rates_init(s->spec_rate);
    e->running[e->n_running++] = s;
    return g;
}

static void rig_free(struct rig *g)
{
    free(g->s.tokens);
    free(g->s.blocks);
    pthread_mutex_destroy(&g->req.mu);
    sched_plan_free(&g->e.plan);
    kv_pool_free(g->e.pool);
    free(g->e.waiting);
    free(g->e.running);
    free(g->e.spare);
    free(g);
}

/* The engine's side of a step with the draft verified: `kept` draft tokens kept, then the next
 * sampled token appended. */
static void rig_settle(struct rig *g, int kept)
{
    struct engine *e = &g->e;
    struct seq *s = &g->s;
    const struct step_plan *p = &e->plan;
    sched_commit(e);
    for (int j = 0; j < kept; j++) s->tokens[s->n_tokens++] = p->tokens[p->draft_at[0] + j];
    sched_spec_settle(e, 0, kept);
    s->tokens[s->n_tokens++] = 99;
    struct qerr err = {0};
    ck_assert_msg(engine_check(e, &err) == 0, "%s", err.msg);
}

START_TEST(drafts_take_the_budget_left_and_roll_back)
{
    struct rig *g = rig_new(64);
    struct engine *e = &g->e;
    struct seq *s = &g->s;
    const struct step_plan *p = &e->plan;
    int used = kv_pool_used(e->pool);
    /* the last token, then "4 5 6 7" (what followed 1 2 3 before) at positions 10..13: two in
     * the sequence's third block, two in a spare block after it */
    ck_assert_int_eq(sched_step_plan(e), 5);
    ck_assert_int_eq(p->n_seqs, 1);
    ck_assert_int_eq(p->chunk[0], 1);
    ck_assert_int_eq(p->n_draft[0], 4);
    ck_assert_int_eq(p->draft_at[0], 1);
    ck_assert_int_eq(p->draft_row[0], 1);
    ck_assert_int_eq(p->n_logits, 5);
    int ext = p->ext_block[0];
    ck_assert_int_ge(ext, 0);
    ck_assert_int_eq(e->n_spare, 1);
    for (int j = 0; j < 4; j++) {
        ck_assert_int_eq(p->tokens[1 + j], 4 + j);
        ck_assert_int_eq(p->pos[1 + j], 10 + j);
        ck_assert_int_eq(p->seq_idx[1 + j], 0);
        ck_assert_int_eq(p->logit_idx[1 + j], 1 + j);
        int blk = j < 2 ? s->blocks[2] : ext;
        ck_assert_int_eq(p->slot[1 + j], blk * 4 + (10 + j) % 4);
    }
    ck_assert_int_eq(p->max_blocks, 4);
    ck_assert_int_eq(p->table[3], ext);
    /* one draft token kept: it sits in the sequence's own block; the spare goes back */
    rig_settle(g, 1);
    ck_assert_int_eq(s->n_computed, 11);
    ck_assert_int_eq(s->n_blocks, 3);
    ck_assert_int_eq(e->n_spare, 2);
    ck_assert_int_eq(kv_pool_used(e->pool), used);

    /* tokens 1 2 3 4 5 6 7 1 2 3 4 99: "4 99" never occurred, nor "99": no draft */
    ck_assert_int_eq(sched_step_plan(e), 1);
    ck_assert_int_eq(p->n_draft[0], 0);
    rig_settle(g, 0);
    rig_free(g);

    /* a draft kept into the spare block: the block becomes the sequence's, the pool replaces
     * the spare (the block plain decoding would have taken at this point) */
    g = rig_new(64);
    e = &g->e;
    s = &g->s;
    p = &e->plan;
    ck_assert_int_eq(sched_step_plan(e), 5);
    ext = p->ext_block[0];
    rig_settle(g, 3);
    ck_assert_int_eq(s->n_computed, 13);
    ck_assert_int_eq(s->n_blocks, 4);
    ck_assert_int_eq(s->blocks[3], ext);
    ck_assert_int_eq(e->n_spare, 2);
    ck_assert_int_eq(kv_pool_used(e->pool), used + 1);
    rig_free(g);

    /* a step whose budget the decodes fill drafts nothing; a smaller budget, less */
    g = rig_new(1);
    ck_assert_int_eq(sched_step_plan(&g->e), 1);
    ck_assert_int_eq(g->e.plan.n_draft[0], 0);
    ck_assert_int_eq(g->e.n_spare, 2);
    rig_settle(g, 0);
    rig_free(g);
    g = rig_new(3);
    ck_assert_int_eq(sched_step_plan(&g->e), 3);
    ck_assert_int_eq(g->e.plan.n_draft[0], 2);
    ck_assert_int_eq(g->e.plan.ext_block[0], -1); /* positions 10, 11: its own block */
    rig_settle(g, 2);
    ck_assert_int_eq(g->s.n_computed, 12);
    rig_free(g);
    /* nor past spec_step_tokens, whatever the budget */
    g = rig_new(64);
    g->e.o.spec_step_tokens = 4;
    ck_assert_int_eq(sched_step_plan(&g->e), 4);
    ck_assert_int_eq(g->e.plan.n_draft[0], 3);
    rig_settle(g, 0);
    g->e.o.spec_step_tokens = 1;
    ck_assert_int_eq(sched_step_plan(&g->e), 1);
    ck_assert_int_eq(g->e.plan.n_draft[0], 0);
    rig_settle(g, 0);
    rig_free(g);
}
END_TEST

/* Pass D with the cost policy, on costs fed in: a draft where verification is cheap, none where
 * a step costs its tokens, none while the one-token step is due to be timed again. */
/* One step of the rig (whose last tokens "1 2 3" the drafter continues with "4 5 6 7") under
 * the cost policy with acceptance 4 of 4 so far, on step costs base + slope * (n - 1), the
 * one-token step timed `age` steps ago (0: nothing timed); returns its draft's length. */
static int rig_cost_draft(double base, double slope, int age)
{
    struct rig *g = rig_new(64);
    struct engine *e = &g->e;
    e->o.spec_policy = SPEC_POLICY_COST;
    if (age > 0) {
        synth_costs(&e->spec_cost, base, slope, 8);
        for (int i = 1; i < age; i++) spec_cost_record_step(&e->spec_cost, 2, base + slope);
    }
    spec_rate_update(&g->s.spec_rate[3], 4, 4); /* the class of the rig's draft: "1 2 3" */
    int n = sched_step_plan(e), nd = e->plan.n_draft[0];
    ck_assert_int_eq(n, 1 + nd);
    rig_settle(g, 0);
    rig_free(g);
    return nd;
}

/* Pass D with the cost policy, on costs fed in: a draft where verification is cheap, none
 * where a step costs its tokens, none while the one-token step is due to be timed (first, or
 * again after SPEC_COST_REFRESH steps). */
START_TEST(drafts_pass_the_cost_policy)
{
    ck_assert_int_eq(rig_cost_draft(0.01, 0.0005, 1), 4); /* as the acceptance policy drafts */
    ck_assert_int_eq(rig_cost_draft(0.01, 0.01, 1), 0);
    ck_assert_int_eq(rig_cost_draft(0.01, 0.0005, 0), 0);
    ck_assert_int_eq(rig_cost_draft(0.01, 0.0005, SPEC_COST_REFRESH - 8), 4);
    ck_assert_int_eq(rig_cost_draft(0.01, 0.0005, SPEC_COST_REFRESH + 1), 0);
}
END_TEST

/* ---- the engine, real model ---- */

static struct gguf_file *file;
static struct tokenizer *tok;
static struct backend *be;
static int32_t *text_ids;
static size_t n_text;

static void setup_once(void)
{
    tb_model_open(&file, &tok, &be, &text_ids, &n_text);
    ck_assert_uint_gt(n_text, 3000);
    ck_assert(tm_golden_load());
}

static void teardown_once(void)
{
    tm_golden_free();
    tb_model_close(file, tok, be, text_ids);
}

enum { MAXR = 16, MAXOUT = 64 };

struct req_case {
    int32_t prompt[256];
    size_t n_prompt;
    struct gen_request r;
    bool grounded; /* the output copies the prompt: drafts must be accepted */
};

struct result {
    int32_t tokens[MAXOUT];
    float logprob[MAXOUT];
    struct token_logprob top[MAXOUT][3];
    int n;
    char text[2048];
    size_t text_len;
    struct req_event final;
};

/* Request i of n: golden prompts (greedy, stopping at EOS) and input-grounded ones (a passage,
 * then its first words again, so the model goes on copying it), greedy or seeded sampling with
 * several sampler settings; one has a stop string that occurs in the passage. */
static void make_case(int i, int n_out, struct req_case *c)
{
    memset(c, 0, sizeof *c);
    struct gen_request *r = &c->r;
    sample_params_default(&r->sample);
    r->sample.temperature = 0;
    r->max_tokens = n_out;
    r->top_logprobs = -1;
    int golden = tm_n_cases();
    if (i % 3 == 0 && i / 3 < golden) {
        size_t n;
        int32_t *ids = tm_case_ids(i / 3, "prompt_ids", &n);
        ck_assert_uint_le(n, 256);
        memcpy(c->prompt, ids, n * sizeof *ids);
        free(ids);
        c->n_prompt = n;
    } else {
        size_t len = tu_sanitized() ? 60 : 110, off = 300 + (size_t)i * 211 % (n_text - 400);
        memcpy(c->prompt, text_ids + off, len * sizeof *c->prompt);
        memcpy(c->prompt + len, text_ids + off, 12 * sizeof *c->prompt);
        c->n_prompt = len + 12;
        c->grounded = true;
        r->ignore_eos = true;
    }
    if (i % 4 == 1) { /* seeded sampling: each draw must be the one plain decoding makes */
        r->sample.temperature = i % 8 == 1 ? 0.7f : 1.1f;
        r->sample.top_p = i % 8 == 1 ? 0.9f : 1.0f;
        r->sample.top_k = i % 8 == 5 ? 30 : 0;
        r->sample.repetition_penalty = i == 5 ? 1.2f : 1.0f;
        r->sample.seed = 1000 + (uint64_t)i;
    }
    if (i == 4) {
        /* "the" appears in every passage: a stop string the copied text reaches */
        r->stop_strings[0] = " the";
        r->n_stop_strings = 1;
    }
    r->prompt = c->prompt;
    r->n_prompt = c->n_prompt;
}

/* An engine on target (and draft, for SPEC_DRAFT) that checks its invariants every step. */
static struct engine *make_engine_with(const struct gguf_file *target,
                                       const struct gguf_file *draft, enum spec_mode spec,
                                       enum spec_policy policy, int batch, int seqs, int blocks,
                                       int bs)
{
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = batch;
    o.max_seqs = seqs;
    o.kv_blocks = blocks;
    o.kv_block_size = bs;
    o.spec = spec;
    o.spec_k = 8;
    /* drafts in every step, however many streams, whatever the clock says: this is about
     * exactness, not policy */
    o.spec_step_tokens = batch;
    o.spec_policy = policy;
    o.check_invariants = true;
    o.draft_file = draft;
    struct engine *e;
    struct qerr err = {0};
    ck_assert_msg(engine_create(target, tok, be, &o, &e, &err) == 0, "%s", err.msg);
    return e;
}

static struct engine *make_engine_on(const struct gguf_file *target, const struct gguf_file *draft,
                                     enum spec_mode spec, int batch, int seqs, int blocks, int bs)
{
    return make_engine_with(target, draft, spec, SPEC_POLICY_ACCEPTANCE, batch, seqs, blocks, bs);
}

static struct engine *make_engine(enum spec_mode spec, int batch, int seqs, int blocks, int bs)
{
    return make_engine_on(file, NULL, spec, batch, seqs, blocks, bs);
}

static void collect(struct request *q, struct result *res)
{
    memset(res, 0, sizeof *res);
    for (;;) {
        struct req_event ev;
        ck_assert_int_eq(request_next(q, &ev, 120000), 0);
        ck_assert_uint_lt(res->text_len + (size_t)ev.text_len, sizeof res->text);
        memcpy(res->text + res->text_len, ev.text, (size_t)ev.text_len);
        res->text_len += (size_t)ev.text_len;
        if (ev.done) {
            res->final = ev;
            break;
        }
        ck_assert_int_lt(res->n, MAXOUT);
        res->logprob[res->n] = ev.logprob;
        memcpy(res->top[res->n], ev.top, sizeof res->top[0]);
        res->tokens[res->n++] = ev.token;
    }
    request_release(q);
}

/* Submits cases [0, n) at once, collects them, and stops the engine (its thread is gone, so
 * its pool may be read). */
static void run_all(struct engine *e, struct req_case *c, int n, struct result *res)
{
    struct request *q[MAXR];
    struct qerr err = {0};
    for (int i = 0; i < n; i++)
        ck_assert_msg(engine_submit(e, &c[i].r, &q[i], &err) == 0, "case %d: %s", i, err.msg);
    for (int i = 0; i < n; i++) collect(q[i], &res[i]);
    engine_stop(e);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    struct engine_stats st;
    engine_get_stats(e, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert_int_eq(e->n_spare, e->spare_target);
}

static void check_same(const struct result *plain, const struct result *spec, int n,
                       const char *what)
{
    for (int i = 0; i < n; i++) {
        ck_assert_msg(spec[i].n == plain[i].n, "%s, case %d: %d tokens, plain decoding %d", what, i,
                      spec[i].n, plain[i].n);
        for (int k = 0; k < plain[i].n; k++) {
            ck_assert_msg(spec[i].tokens[k] == plain[i].tokens[k],
                          "%s, case %d, token %d: %d, plain decoding %d", what, i, k,
                          spec[i].tokens[k], plain[i].tokens[k]);
            /* logprobs: the same row, so the same bits */
            ck_assert_msg(memcmp(&spec[i].logprob[k], &plain[i].logprob[k], sizeof(float)) == 0 &&
                              memcmp(spec[i].top[k], plain[i].top[k], sizeof spec[i].top[k]) == 0,
                          "%s, case %d, token %d: logprobs differ", what, i, k);
        }
        ck_assert_msg(spec[i].text_len == plain[i].text_len &&
                          memcmp(spec[i].text, plain[i].text, plain[i].text_len) == 0,
                      "%s, case %d: the text differs", what, i);
        ck_assert_int_eq(spec[i].final.finish, plain[i].final.finish);
        ck_assert_int_eq(spec[i].final.completion_tokens, plain[i].final.completion_tokens);
        ck_assert_int_eq(plain[i].final.accepted_tokens, 0);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The cached prefixes of e's pool, sorted; returns how many. */
static int cached_keys(const struct engine *e, uint64_t *keys, int cap)
{
    int n = kv_pool_cached_keys(e->pool, keys, cap);
    ck_assert_int_le(n, cap);
    qsort(keys, (size_t)n, sizeof *keys, cmp_u64);
    return n;
}

/* Submits one case and collects it; the engine keeps running. */
static void run_one(struct engine *e, const struct req_case *c, struct result *res)
{
    struct request *q;
    struct qerr err = {0};
    ck_assert_msg(engine_submit(e, &c->r, &q, &err) == 0, "%s", err.msg);
    collect(q, res);
}

/* An engine with --spec ngram and the acceptance policy (no clock: the drafts are the same
 * every run), its history `history` tokens. */
static struct engine *make_history_engine(long history)
{
    struct engine_opts o;
    engine_opts_default(&o);
    o.kv_blocks = 64;
    o.max_seqs = 4;
    o.spec = SPEC_NGRAM;
    o.spec_policy = SPEC_POLICY_ACCEPTANCE;
    o.spec_step_tokens = 256;
    o.spec_history = history;
    o.check_invariants = true;
    struct engine *e;
    struct qerr err = {0};
    ck_assert_msg(engine_create(file, tok, be, &o, &e, &err) == 0, "%s", err.msg);
    return e;
}

static void same_tokens(const struct result *a, const struct result *b, const char *what)
{
    ck_assert_msg(a->n == b->n &&
                      memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof *a->tokens) == 0,
                  "%s: the tokens differ", what);
}

/* A finished answer is drafted from by a later request that asks the same (a greedy repeat): the
 * same tokens, and far more of them from drafts than the first time or without a history; a
 * request that opted out of speculation lends its answer to none. */
START_TEST(history_lends_answers_to_later_requests)
{
    int n_out = tu_sanitized() ? 16 : 32;
    static struct req_case c, off;
    static struct result first, again, first0, again0, lent, after;
    make_case(0, n_out, &c); /* a golden prompt, greedy: it copies nothing of its prompt */
    c.r.ignore_eos = true;
    off = c;
    off.r.prompt = off.prompt;
    off.r.no_spec = true;
    c.r.prompt = c.prompt;

    struct engine_stats st, st0;
    struct engine *e = make_history_engine(65536);
    run_one(e, &c, &first);
    run_one(e, &c, &again);
    engine_stop(e);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    engine_get_stats(e, &st);
    engine_free(e);
    e = make_history_engine(0);
    run_one(e, &c, &first0);
    run_one(e, &c, &again0);
    engine_stop(e);
    engine_get_stats(e, &st0);
    engine_free(e);
    e = make_history_engine(65536);
    run_one(e, &off, &lent);
    run_one(e, &c, &after);
    engine_free(e);
    printf("spec history: %d tokens, accepted %d then %d; without the history %d then %d; "
           "after an opted-out answer %d\n",
           first.n, first.final.accepted_tokens, again.final.accepted_tokens,
           first0.final.accepted_tokens, again0.final.accepted_tokens, after.final.accepted_tokens);
    same_tokens(&first, &again, "the repeat");
    same_tokens(&first, &first0, "without the history");
    same_tokens(&first, &again0, "the repeat without the history");
    same_tokens(&first, &lent, "opted out");
    same_tokens(&first, &after, "after an opted-out answer");
    ck_assert_int_eq(first.n, n_out);
    /* the repeat drafts the whole answer from the first (its first token comes from the
     * prefill, and a draft stops where its answer ended) */
    ck_assert_int_ge(again.final.accepted_tokens, n_out / 2);
    ck_assert_int_gt(again.final.accepted_tokens, first.final.accepted_tokens);
    ck_assert_int_eq(again0.final.accepted_tokens, first0.final.accepted_tokens);
    ck_assert_int_eq(lent.final.accepted_tokens, 0);
    ck_assert_int_eq(after.final.accepted_tokens, first.final.accepted_tokens);
    /* the counters /metrics shows: the repeat's drafts from the history, none without one */
    ck_assert_uint_gt(st.spec_history_accepted_tokens, 0);
    ck_assert_uint_le(st.spec_history_accepted_tokens, st.spec_history_draft_tokens);
    ck_assert_uint_le(st.spec_history_drafts, st.spec_drafts);
    ck_assert_uint_eq(st0.spec_history_drafts, 0);
}
END_TEST

/* *out: base's request with pred[0..n) as its prediction. */
static void with_prediction(const struct req_case *base, const int32_t *pred, int n,
                            struct req_case *out)
{
    *out = *base;
    out->r.prompt = out->prompt;
    out->r.prediction = pred;
    out->r.n_prediction = n;
}

/* A prediction of plain's length that is wrong at every token. */
static void wrong_prediction(const struct result *plain, int32_t *bad)
{
    for (int i = 0; i < plain->n; i++) bad[i] = plain->tokens[i] == 42 ? 43 : 42;
}

/* A predicted output (OpenAI's prediction) is drafted from: a greedy answer that copies nothing
 * of its prompt, given its own plain tokens as the prediction, comes out the same with most of
 * it from drafts; a prediction that is wrong from its first token, or sampled output, keeps the
 * same tokens too. An engine with spec off drafts from a prediction alone and from nothing else
 * (the acceptance policy, as everywhere here: the cost policy's choices follow the clock); a
 * request that opts out ignores its prediction. */
START_TEST(prediction_is_drafted_from)
{
    int n_out = tu_sanitized() ? 16 : 32;
    static struct req_case c, cp, cw, cs, csp;
    static struct req_case cpo;
    static struct result plain, with, wrong, sampled, sampled_p, off, off_plain, off_opted;
    make_case(0, n_out, &c); /* a golden prompt, greedy */
    c.r.ignore_eos = true;
    c.r.prompt = c.prompt;
    struct engine *e = make_history_engine(0);
    run_one(e, &c, &plain);
    ck_assert_int_eq(plain.n, n_out);
    with_prediction(&c, plain.tokens, plain.n, &cp);
    run_one(e, &cp, &with);
    int32_t bad[MAXOUT];
    wrong_prediction(&plain, bad);
    with_prediction(&c, bad, plain.n, &cw);
    run_one(e, &cw, &wrong);
    make_case(1, n_out, &cs); /* seeded sampling */
    cs.r.prompt = cs.prompt;
    run_one(e, &cs, &sampled);
    with_prediction(&cs, sampled.tokens, sampled.n, &csp);
    run_one(e, &csp, &sampled_p);
    engine_stop(e);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    engine_free(e);
    e = make_engine(SPEC_OFF, 64, 4, 64, 16);
    run_one(e, &cp, &off);
    run_one(e, &c, &off_plain);
    cpo = cp;
    cpo.r.prompt = cpo.prompt;
    cpo.r.no_spec = true;
    run_one(e, &cpo, &off_opted);
    engine_stop(e);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    engine_free(e);
    printf("prediction: %d tokens, accepted %d plain, %d with its own tokens predicted, %d with a "
           "wrong prediction (%d rejected); sampled %d then %d; spec off %d (%d rejected)\n",
           plain.n, plain.final.accepted_tokens, with.final.accepted_tokens,
           wrong.final.accepted_tokens, wrong.final.rejected_tokens, sampled.final.accepted_tokens,
           sampled_p.final.accepted_tokens, off.final.accepted_tokens, off.final.rejected_tokens);
    same_tokens(&plain, &with, "with its own tokens predicted");
    same_tokens(&plain, &wrong, "with a wrong prediction");
    same_tokens(&plain, &off, "with a prediction and spec off");
    same_tokens(&plain, &off_plain, "spec off");
    same_tokens(&plain, &off_opted, "spec off, a prediction, opted out");
    same_tokens(&sampled, &sampled_p, "sampled, with its own tokens predicted");
    ck_assert_int_ge(off.final.accepted_tokens, n_out / 2);
    ck_assert_int_eq(off_plain.final.accepted_tokens + off_plain.final.rejected_tokens, 0);
    ck_assert_int_eq(off_opted.final.accepted_tokens + off_opted.final.rejected_tokens, 0);
    /* the wrong prediction's first draft is refused: its tokens count as rejected */
    ck_assert_int_gt(wrong.final.rejected_tokens, 0);
    ck_assert_int_lt(with.final.rejected_tokens, with.final.accepted_tokens);
    /* the first token comes from the prefill; drafts cover most of the rest */
    ck_assert_int_ge(with.final.accepted_tokens, n_out / 2);
    ck_assert_int_gt(with.final.accepted_tokens, plain.final.accepted_tokens);
    ck_assert_int_gt(sampled_p.final.accepted_tokens, sampled.final.accepted_tokens);
}
END_TEST

START_TEST(ngram_output_equals_plain_decoding)
{
    int n = tu_sanitized() ? 6 : MAXR, n_out = tu_sanitized() ? 16 : 32;
    int n_tight = tu_sanitized() ? 6 : 8;
    static struct req_case c[MAXR];
    static struct result plain[MAXR], spec[MAXR], tight[MAXR];
    static uint64_t keys_plain[1024], keys_spec[1024];
    for (int i = 0; i < n; i++) make_case(i, n_out, &c[i]);

    /* a pool that never evicts: the cached prefixes at the end are every full computed block */
    struct engine *e = make_engine(SPEC_OFF, 256, MAXR, 256, 16);
    run_all(e, c, n, plain);
    int nk_plain = cached_keys(e, keys_plain, 1024);
    engine_free(e);

    double t0 = tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC;
    e = make_engine(SPEC_NGRAM, 256, MAXR, 256, 16);
    run_all(e, c, n, spec);
    struct engine_stats st;
    engine_get_stats(e, &st);
    int nk_spec = cached_keys(e, keys_spec, 1024);
    engine_free(e);
    printf("spec ngram, %d streams: %llu steps, %llu drafts, %llu of %llu drafted tokens "
           "accepted (%.1f s cpu)\n",
           n, (unsigned long long)st.steps, (unsigned long long)st.spec_drafts,
           (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens,
           tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC - t0);
    check_same(plain, spec, n, "16 streams");
    /* the test means something only if drafts were both kept and rejected */
    ck_assert_uint_gt(st.spec_accepted_tokens, 0);
    ck_assert_uint_lt(st.spec_accepted_tokens, st.spec_draft_tokens);
    uint64_t hist = 0;
    for (int k = 0; k <= SPEC_K_MAX; k++) hist += st.spec_accepted_hist[k];
    ck_assert_uint_eq(hist, st.spec_drafts);
    ck_assert_uint_gt(st.spec_accepted_hist[0], 0);
    int accepted = 0;
    for (int i = 0; i < n; i++) {
        accepted += spec[i].final.accepted_tokens;
        if (c[i].grounded && c[i].r.sample.temperature == 0 && !c[i].r.n_stop_strings)
            ck_assert_msg(spec[i].final.accepted_tokens > 0, "grounded case %d accepted nothing",
                          i);
    }
    ck_assert_uint_eq((uint64_t)accepted, st.spec_accepted_tokens);
    ck_assert_int_eq(nk_spec, nk_plain);
    for (int i = 0; i < nk_plain; i++)
        ck_assert_msg(keys_spec[i] == keys_plain[i], "cached prefix %d differs", i);

    /* a pool too small for all of them: preemption, recomputation, spare blocks running out;
     * blocks of 4 tokens, so drafts (k <= 4) cross into spare blocks all the time */
    e = make_engine(SPEC_NGRAM, 64, 8, tu_sanitized() ? 40 : 72, 4);
    run_all(e, c, n_tight, tight);
    engine_get_stats(e, &st);
    engine_free(e);
    printf("spec ngram, tight pool: %llu preemptions, %llu accepted\n",
           (unsigned long long)st.preemptions, (unsigned long long)st.spec_accepted_tokens);
    ck_assert_uint_gt(st.preemptions, 0);
    ck_assert_uint_gt(st.spec_accepted_tokens, 0);
    check_same(plain, tight, n_tight, "tight pool");

    /* the default, cost-aware policy: which drafts it makes depends on the clock, the text
     * must not (no count of drafts is asserted: on a slow or loaded machine it may make none) */
    t0 = tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC;
    e = make_engine_with(file, NULL, SPEC_NGRAM, SPEC_POLICY_COST, 256, MAXR, 256, 16);
    run_all(e, c, n_tight, tight);
    engine_get_stats(e, &st);
    engine_free(e);
    printf("spec ngram, cost policy: %llu drafts, %llu of %llu accepted (%.1f s cpu)\n",
           (unsigned long long)st.spec_drafts, (unsigned long long)st.spec_accepted_tokens,
           (unsigned long long)st.spec_draft_tokens,
           tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC - t0);
    check_same(plain, tight, n_tight, "cost policy");
}
END_TEST

/* Logprobs and grammars (a regex the copied text fits, so drafts are kept; a JSON Schema,
 * whose property names and enum values are drafted as the grammar forces them) come out of a
 * speculating engine exactly as from plain decoding; a request that opts out gets no drafts. */
START_TEST(logprobs_grammar_and_opt_out)
{
    enum { N = 5 };
    static struct req_case c[N];
    static struct result plain[N], spec[N];
    int n_out = tu_sanitized() ? 16 : 32;
    for (int i = 0; i < N; i++) make_case(2, n_out, &c[i]);
    c[0].r.top_logprobs = 3;
    c[1].r.top_logprobs = 0;
    c[1].r.sample.temperature = 0.8f;
    c[1].r.sample.seed = 9;
    c[3].r.no_spec = true; /* case 0 without logprobs: its drafts would be kept */
    struct engine *e = make_engine(SPEC_OFF, 256, 5, 64, 16);
    struct grammar *g;
    struct qerr err = {0};
    const char *re = "[^<>{}]+";
    ck_assert_msg(engine_grammar(e, GRAMMAR_REGEX, re, strlen(re), &g, &err) == 0, "%s", err.msg);
    c[2].r.grammar = g;
    static const char schema[] =
        "{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"license\",\"software\","
        "\"other\"]},\"free\":{\"type\":\"boolean\"},\"year\":{\"type\":\"integer\"}},"
        "\"required\":[\"kind\",\"free\",\"year\"]}";
    struct grammar *js;
    ck_assert_msg(engine_grammar(e, GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &js, &err) == 0,
                  "%s", err.msg);
    /* what a client asking for structured output sends: a chat turn */
    static const char chat[] =
        "<|im_start|>user\nDescribe the GNU GPL as a JSON object: its kind, whether it is free, "
        "and the year of its version 3.<|im_end|>\n<|im_start|>assistant\n";
    int32_t *ids;
    size_t n_ids;
    ck_assert(tokenizer_encode(tok, chat, strlen(chat), false, true, &ids, &n_ids, &err) == 0);
    ck_assert_uint_le(n_ids, sizeof c[4].prompt / sizeof c[4].prompt[0]);
    memcpy(c[4].prompt, ids, n_ids * sizeof *ids);
    free(ids);
    c[4].n_prompt = c[4].r.n_prompt = n_ids;
    c[4].r.grammar = js;
    c[4].r.ignore_eos = false;
    c[4].r.max_tokens = 40;
    run_all(e, c, N, plain);
    engine_free(e);
    e = make_engine(SPEC_NGRAM, 256, 5, 64, 16);
    run_all(e, c, N, spec);
    struct engine_stats st;
    engine_get_stats(e, &st);
    engine_free(e);
    grammar_unref(g);
    grammar_unref(js);
    printf("spec under a JSON Schema: '%.*s', %llu of %llu forced draft tokens accepted\n",
           (int)spec[4].text_len, spec[4].text, (unsigned long long)st.spec_grammar_accepted_tokens,
           (unsigned long long)st.spec_grammar_draft_tokens);
    check_same(plain, spec, N, "logprobs, grammars, opt-out");
    ck_assert_int_gt(spec[0].final.accepted_tokens, 0);
    ck_assert_int_gt(spec[2].final.accepted_tokens, 0);
    ck_assert_int_eq(spec[3].final.accepted_tokens, 0);
    ck_assert_int_eq(spec[4].final.finish, FINISH_STOP); /* a whole object, then EOS */
    ck_assert_uint_gt(st.spec_grammar_accepted_tokens, 0);
    ck_assert_int_ge(spec[4].final.accepted_tokens, (int)st.spec_grammar_accepted_tokens);
}
END_TEST

/* ---- a draft model: the default model quantized to Q4_0 drafting for its Q8_0 copy ---- */

/* dir/name: the test model quantized to t, made when missing or older than the model (the
 * build dir keeps it for the next run); opened into *out. Under a sanitizer, where quantizing
 * 135M weights would take minutes, the test model itself (a draft then guesses its own greedy
 * tokens: seeded sampling still rejects many). */
static void open_quantized(const char *name, enum qtype t, struct gguf_file **out)
{
    const char *dir = getenv("QUERN_SPEC_MODELS");
    char path[4096];
    struct qerr err = {0};
    if (tu_sanitized()) {
        ck_assert_msg(gguf_open(tu_model_path(), out, &err) == 0, "%s", err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : ".", name);
    struct stat src, dst;
    ck_assert_int_eq(stat(tu_model_path(), &src), 0);
    if (stat(path, &dst) != 0 || dst.st_mtime < src.st_mtime) {
        struct gguf_quantize_opts qo = {.type = t, .round = QROUND_REF};
        ck_assert_msg(gguf_quantize(file, path, &qo, NULL, &err) == 0, "%s: %s", path, err.msg);
    }
    ck_assert_msg(gguf_open(path, out, &err) == 0, "%s", err.msg);
}

START_TEST(draft_model_output_equals_plain_decoding)
{
    double t0 = tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC;
    struct gguf_file *q8, *q4;
    open_quantized("spec-target.Q8_0.gguf", QTYPE_Q8_0, &q8);
    open_quantized("spec-draft.Q4_0.gguf", QTYPE_Q4_0, &q4);
    /* sanitized: each draft round is a forward of its own, so fewer and shorter requests */
    int n = tu_sanitized() ? 3 : MAXR, n_out = tu_sanitized() ? 12 : 32;
    int n_tight = tu_sanitized() ? 3 : 8;
    static struct req_case c[MAXR];
    static struct result plain[MAXR], spec[MAXR], tight[MAXR];
    static uint64_t keys_plain[1024], keys_spec[1024];
    for (int i = 0; i < n; i++) make_case(i, n_out, &c[i]);

    struct engine *e = make_engine_on(q8, NULL, SPEC_OFF, 256, MAXR, 256, 16);
    run_all(e, c, n, plain);
    int nk_plain = cached_keys(e, keys_plain, 1024);
    engine_free(e);

    e = make_engine_on(q8, q4, SPEC_DRAFT, 256, MAXR, 256, 16);
    run_all(e, c, n, spec);
    struct engine_stats st;
    engine_get_stats(e, &st);
    int nk_spec = cached_keys(e, keys_spec, 1024);
    engine_free(e);
    printf("spec draft, %d streams: %llu steps, %llu drafts, %llu of %llu drafted tokens "
           "accepted\n",
           n, (unsigned long long)st.steps, (unsigned long long)st.spec_drafts,
           (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens);
    check_same(plain, spec, n, "draft model, 16 streams");
    /* drafts were both kept and rejected (sanitized, the test model drafts for itself: its
     * few short requests may reject nothing), and the draft model never failed */
    ck_assert_uint_gt(st.spec_accepted_tokens, 0);
    if (!tu_sanitized()) ck_assert_uint_lt(st.spec_accepted_tokens, st.spec_draft_tokens);
    ck_assert_uint_eq(st.spec_draft_errors, 0);
    int accepted = 0;
    for (int i = 0; i < n; i++) accepted += spec[i].final.accepted_tokens;
    ck_assert_uint_eq((uint64_t)accepted, st.spec_accepted_tokens);
    ck_assert_int_eq(nk_spec, nk_plain);
    for (int i = 0; i < nk_plain; i++)
        ck_assert_msg(keys_spec[i] == keys_plain[i], "cached prefix %d differs", i);

    /* preemption: the draft model's K/V go with the blocks and are recomputed after */
    e = make_engine_on(q8, q4, SPEC_DRAFT, 64, 8, tu_sanitized() ? 40 : 72, 4);
    run_all(e, c, n_tight, tight);
    engine_get_stats(e, &st);
    engine_free(e);
    printf("spec draft, tight pool: %llu preemptions, %llu accepted (whole test %.1f s cpu)\n",
           (unsigned long long)st.preemptions, (unsigned long long)st.spec_accepted_tokens,
           tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC - t0);
    ck_assert_uint_gt(st.preemptions, 0);
    ck_assert_uint_gt(st.spec_accepted_tokens, 0);
    check_same(plain, tight, n_tight, "draft model, tight pool");
    gguf_close(q4);
    gguf_close(q8);
}
END_TEST

/* With a draft model a prediction that matches is drafted from first: a seeded sample given its
 * own tokens as the prediction keeps more drafts than with the draft model's guesses alone, and
 * both are plain decoding's tokens; so is a greedy answer whose prediction is wrong from its
 * first token (the draft model proposes where it does not match). */
START_TEST(prediction_comes_before_the_draft_model)
{
    struct gguf_file *q8, *q4;
    open_quantized("spec-target.Q8_0.gguf", QTYPE_Q8_0, &q8);
    open_quantized("spec-draft.Q4_0.gguf", QTYPE_Q4_0, &q4);
    int n_out = tu_sanitized() ? 12 : 32;
    static struct req_case cs, csp, cg, cw;
    static struct result plain_s, plain_g, spec_s, spec_sp, spec_w;
    make_case(5, n_out, &cs); /* sampled at 1.1 with a repetition penalty */
    cs.r.prompt = cs.prompt;
    make_case(0, n_out, &cg); /* greedy */
    cg.r.ignore_eos = true;
    cg.r.prompt = cg.prompt;
    struct engine *e = make_engine_on(q8, NULL, SPEC_OFF, 256, MAXR, 256, 16);
    run_one(e, &cs, &plain_s);
    run_one(e, &cg, &plain_g);
    engine_free(e);

    e = make_engine_on(q8, q4, SPEC_DRAFT, 256, MAXR, 256, 16);
    run_one(e, &cs, &spec_s);
    with_prediction(&cs, plain_s.tokens, plain_s.n, &csp);
    run_one(e, &csp, &spec_sp);
    int32_t bad[MAXOUT];
    wrong_prediction(&plain_g, bad);
    with_prediction(&cg, bad, plain_g.n, &cw);
    run_one(e, &cw, &spec_w);
    struct engine_stats st;
    engine_get_stats(e, &st);
    engine_stop(e);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    engine_free(e);
    printf("prediction before a draft model: sampled %d tokens, %d accepted from the draft model, "
           "%d with its own tokens predicted; greedy %d with a wrong prediction (%d rejected)\n",
           plain_s.n, spec_s.final.accepted_tokens, spec_sp.final.accepted_tokens,
           spec_w.final.accepted_tokens, spec_w.final.rejected_tokens);
    same_tokens(&plain_s, &spec_s, "sampled, draft model");
    same_tokens(&plain_s, &spec_sp, "sampled, draft model and its own tokens predicted");
    same_tokens(&plain_g, &spec_w, "greedy, draft model and a wrong prediction");
    ck_assert_int_gt(spec_sp.final.accepted_tokens, spec_s.final.accepted_tokens);
    ck_assert_int_ge(spec_sp.final.accepted_tokens, plain_s.n / 2);
    ck_assert_int_gt(spec_w.final.rejected_tokens, 0);
    ck_assert_uint_eq(st.spec_draft_errors, 0);
    gguf_close(q4);
    gguf_close(q8);
}
END_TEST

struct greedy_ref {
    int32_t out[SPEC_K_MAX];
    int n;
};

static bool collect_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    struct greedy_ref *g = ctx;
    g->out[g->n++] = token;
    return false;
}

/* The draft model's own greedy continuation of ctx[0..n), k tokens, one sequence alone. */
static void greedy_ref(struct model *m, const int32_t *ctx, int n, int k, struct greedy_ref *g)
{
    struct gen_opts go = {.n_predict = k, .prefill_chunk = 64};
    sample_params_default(&go.sample);
    go.sample.temperature = 0;
    g->n = 0;
    struct qerr err = {0};
    ck_assert_msg(generate_run(m, ctx, (size_t)n, &go, collect_token, g, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(g->n, k);
}

/* The drafter's guesses are the draft model's greedy continuation, also after a rollback (some
 * guesses kept, then a token it did not guess) and for two sequences in one call, their
 * catch-up split over forwards of 64 tokens. */
START_TEST(draft_model_proposes_its_greedy_continuation)
{
    double t0 = tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC;
    struct gguf_file *q4;
    open_quantized("spec-draft.Q4_0.gguf", QTYPE_Q4_0, &q4);
    /* sanitized: a shorter passage, in forwards of 16 so the catch-up is still split */
    int len = tu_sanitized() ? 40 : 150;
    struct model_opts mo = {.max_batch_tokens = tu_sanitized() ? 16 : 64,
                            .max_logits = 1,
                            .kv_blocks = 24,
                            .kv_block_size = 16};
    struct spec_model *dm;
    struct model *ref;
    struct qerr err = {0};
    ck_assert_msg(spec_model_create(q4, tok, be, &mo, &dm, &err) == 0, "%s", err.msg);
    ck_assert_msg(model_load(q4, be, &mo, &ref, &err) == 0, "%s", err.msg);
    enum { N = 2, LEN = 150 };
    static int32_t ctx[N][LEN + 40]; /* the passage (len <= LEN tokens) and what follows */
    int n[N], computed[N] = {0, 0}, blocks[N][12];
    int32_t out[N][SPEC_K_MAX];
    struct spec_model_seq q[N];
    for (int i = 0; i < N; i++) {
        /* a passage, then its first words again: the guesses are mostly right, not all */
        memcpy(ctx[i], text_ids + 500 + 900 * i, (size_t)(len - 10) * sizeof **ctx);
        memcpy(ctx[i] + len - 10, text_ids + 500 + 900 * i, 10 * sizeof **ctx);
        n[i] = len;
        for (int b = 0; b < 12; b++) blocks[i][b] = 12 * i + b;
    }
    int k[3] = {8, 5, 1};
    for (int round = 0; round < (tu_sanitized() ? 2 : 3); round++) {
        for (int i = 0; i < N; i++)
            q[i] = (struct spec_model_seq){.tokens = ctx[i],
                                           .n_tokens = n[i],
                                           .computed = &computed[i],
                                           .blocks = blocks[i],
                                           .n_blocks = 12,
                                           .ext_block = -1,
                                           .k = k[round] + i,
                                           .out = out[i]};
        ck_assert_msg(spec_model_draft(dm, q, N, &err) == 0, "%s", err.msg);
        for (int i = 0; i < N; i++) {
            struct greedy_ref g;
            greedy_ref(ref, ctx[i], n[i], q[i].k, &g);
            for (int j = 0; j < q[i].k; j++)
                ck_assert_msg(out[i][j] == g.out[j], "round %d, seq %d, guess %d: %d, greedy %d",
                              round, i, j, out[i][j], g.out[j]);
            ck_assert_int_eq(computed[i], n[i] + q[i].k - 1);
            /* keep half the guesses, then a token it did not guess: the rest is rolled back */
            int keep = q[i].k / 2;
            memcpy(ctx[i] + n[i], out[i], (size_t)keep * sizeof **ctx);
            n[i] += keep;
            ctx[i][n[i]++] = out[i][keep] == 13 ? 14 : 13;
        }
    }
    /* a position past the blocks is refused, not written */
    int c0 = 0;
    q[0] = (struct spec_model_seq){.tokens = ctx[0],
                                   .n_tokens = 20,
                                   .computed = &c0,
                                   .blocks = blocks[0],
                                   .n_blocks = 1,
                                   .ext_block = -1,
                                   .k = 2,
                                   .out = out[0]};
    ck_assert_int_eq(spec_model_draft(dm, q, 1, &err), QERR_INVALID);
    ck_assert_msg(strstr(err.msg, "past the sequence"), "%s", err.msg);
    model_free(ref);
    spec_model_free(dm);
    gguf_close(q4);
    printf("spec draft, greedy continuation: %.1f s cpu\n",
           tu_sanitized() ? 0 : (double)clock() / CLOCKS_PER_SEC - t0);
}
END_TEST

/* A draft model must share the target's vocabulary; --spec draft needs one. */
START_TEST(draft_model_is_refused_without_the_same_vocabulary)
{
    struct gguf_file *other;
    struct qerr err = {0};
    ck_assert_msg(synth_model_open("smollm2-135m", QTYPE_Q4_0, 1, NULL, &other, &err) == 0, "%s",
                  err.msg);
    ck_assert_int_eq(spec_model_check_vocab(other, tok, &err), QERR_INVALID);
    ck_assert_msg(strstr(err.msg, "the target's tokenizer"), "%s", err.msg);
    struct engine_opts o;
    engine_opts_default(&o);
    o.kv_blocks = 64;
    o.spec = SPEC_DRAFT;
    o.draft_file = other;
    struct engine *e = NULL;
    ck_assert_int_eq(engine_create(file, tok, be, &o, &e, &err), QERR_INVALID);
    ck_assert_msg(strstr(err.msg, "draft model: token 0"), "%s", err.msg);
    ck_assert_ptr_null(e);
    o.draft_file = NULL;
    ck_assert_int_eq(engine_create(file, tok, be, &o, &e, &err), QERR_INVALID);
    ck_assert_msg(strstr(err.msg, "--draft-model"), "%s", err.msg);
    gguf_close(other);
}
END_TEST

int main(void)
{
    tu_model_path();
    Suite *s = suite_create("spec");
    TCase *unit = tcase_create("drafter");
    tcase_add_test(unit, ngram_drafts_the_latest_longest_match);
    tcase_add_test(unit, history_drafts_from_earlier_answers);
    tcase_add_test(unit, prediction_drafts_where_the_output_is);
    tcase_add_test(unit, history_drafts_only_what_it_holds);
    tcase_add_test(unit, draft_length_follows_acceptance);
    tcase_add_test(unit, drafts_take_the_budget_left_and_roll_back);
    tcase_add_test(unit, cost_policy_maximizes_tokens_per_second);
    tcase_add_test(unit, cost_estimates_fill_the_gaps);
    tcase_add_test(unit, cost_policy_probes_where_drafts_do_not_pay);
    tcase_add_test(unit, drafts_pass_the_cost_policy);
    suite_add_tcase(s, unit);
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 900);
    tcase_add_unchecked_fixture(tc, setup_once, teardown_once);
    const TTest *tests[] = {ngram_output_equals_plain_decoding,
                            logprobs_grammar_and_opt_out,
                            history_lends_answers_to_later_requests,
                            prediction_is_drafted_from,
                            draft_model_proposes_its_greedy_continuation,
                            draft_model_output_equals_plain_decoding,
                            prediction_comes_before_the_draft_model,
                            draft_model_is_refused_without_the_same_vocabulary};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (tu_selected(tests[i]->name)) tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
