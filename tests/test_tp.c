/* Tensor parallelism (engine/model_tp.h) on the CPU shared-memory communicator, with the real
 * model (9 query heads, 3 KV heads, so --tp 2 splits heads unevenly and --tp 4 replicates KV
 * heads): the shard plan; greedy output of --tp 2 and --tp 3 equal to --tp 1 token for token on
 * the golden prompts; logits within 1e-4 relative; a --tp 2 run bit-identical to itself across
 * runs, threads per rank and batch compositions; the engine's batched-equals-sequential test
 * under --tp 2 (chunked prefill, prefix cache, preemption); a failed rank fails the step without
 * hanging; impossible splits are refused with a reason. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "../engine/generate.h"
#include "../engine/model_shard.h"
#include "../kernels/backend_select.h"
#include "../kernels/comm.h"
#include "../kernels/cpu/backend_cpu.h"
#include "testutil.h"

static cJSON *golden;
static struct gguf_file *file;

/* A model over n ranks (n = 1: no split): each a CPU backend of `threads` workers over the
 * shared-memory communicator, or, when $QUERN_TEST_DEVICE names a CUDA device
 * (tools/gpu-check.sh on a machine with several GPUs), one GPU each over NCCL. */
struct tp_model {
    int n;
    struct backend *be[COMM_MAX_RANKS];
    struct comm *comm[COMM_MAX_RANKS];
    struct model *m;
};

static void tp_ranks(struct tp_model *t, int n, int threads)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    struct qerr err = {0};
    const char *dev = getenv("QUERN_TEST_DEVICE");
    if (dev && !strncmp(dev, "cuda", 4)) {
        struct backend_request req = {
            .device = dev, .threads = threads, .precision = MATMUL_F32, .batch_invariant = true};
        struct backend_group g;
        ck_assert_msg(backend_group_create(&req, n, &g, &err) == 0, "%s", err.msg);
        memcpy(t->be, g.be, sizeof t->be);
        memcpy(t->comm, g.comm, sizeof t->comm);
        return;
    }
    for (int r = 0; r < n; r++) {
        struct backend_cpu_opts bo = {.n_threads = threads, .precision = MATMUL_F32};
        ck_assert_msg(backend_cpu_create(&bo, &t->be[r], &err) == 0, "%s", err.msg);
    }
    ck_assert_msg(comm_cpu_create(n, NULL, t->comm, &err) == 0, "%s", err.msg);
}

static void tp_opts(struct tp_model *t, struct model_opts *mo)
{
    *mo = (struct model_opts){.max_batch_tokens = 512,
                              .max_logits = 64,
                              .kv_blocks = 33 * 8,
                              .kv_block_size = 16,
                              .tp = t->n,
                              .tp_backends = t->be,
                              .tp_comms = t->comm};
}

static void tp_load(struct tp_model *t, int n, int threads)
{
    tp_ranks(t, n, threads);
    struct model_opts mo;
    tp_opts(t, &mo);
    struct qerr err = {0};
    ck_assert_msg(model_load(file, t->be[0], &mo, &t->m, &err) == 0, "%s", err.msg);
}

static void tp_free(struct tp_model *t)
{
    model_free(t->m);
    for (int r = 0; r < t->n; r++) {
        comm_destroy(t->comm[r]);
        backend_destroy(t->be[r]);
    }
}

static void open_file(void)
{
    struct qerr err = {0};
    ck_assert_msg(gguf_open(tu_model_path(), &file, &err) == 0, "%s", err.msg);
}

static void close_file(void)
{
    gguf_close(file);
}

static int32_t *json_ids(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) ids[i++] = (int32_t)v->valueint;
    return ids;
}

static const cJSON *gen_case(int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(golden, "generate"), i);
}

START_TEST(shard_plan_splits_heads)
{
    struct model_config c;
    struct qerr err = {0};
    ck_assert_int_eq(model_config_read(file, &c, &err), 0);
    ck_assert_int_eq(c.n_heads, 9);
    ck_assert_int_eq(c.n_kv_heads, 3);
    struct model_shard s;
    /* --tp 2: KV heads 2+1, query heads 6+3, FFN halves */
    ck_assert_int_eq(model_shard_plan(&c, 2, 0, &s, &err), 0);
    ck_assert(s.q0 == 0 && s.nq == 6 && s.kv0 == 0 && s.nkv == 2 && s.f0 == 0 && s.nf == 768);
    ck_assert_int_eq(model_shard_plan(&c, 2, 1, &s, &err), 0);
    ck_assert(s.q0 == 6 && s.nq == 3 && s.kv0 == 2 && s.nkv == 1 && s.f0 == 768 && s.nf == 768);
    /* --tp 4: more ranks than KV heads, KV head 0 replicated on ranks 0 and 1 */
    const int q0[] = {0, 2, 3, 6}, nq[] = {2, 1, 3, 3}, kv0[] = {0, 0, 1, 2};
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(model_shard_plan(&c, 4, r, &s, &err), 0);
        ck_assert_msg(s.q0 == q0[r] && s.nq == nq[r] && s.kv0 == kv0[r] && s.nkv == 1,
                      "rank %d: q %d+%d kv %d+%d", r, s.q0, s.nq, s.kv0, s.nkv);
    }
    /* every split covers each query head and FFN channel once, each head beside its KV head */
    for (int n = 1; n <= 9; n++) {
        int q_seen[9] = {0}, f_next = 0;
        for (int r = 0; r < n; r++) {
            ck_assert_msg(model_shard_plan(&c, n, r, &s, &err) == 0, "%s", err.msg);
            ck_assert_int_gt(s.nq, 0);
            ck_assert_int_eq(s.f0, f_next);
            ck_assert_int_eq(s.f0 % 32, 0);
            f_next += s.nf;
            for (int h = s.q0; h < s.q0 + s.nq; h++) {
                q_seen[h]++;
                int kv = h / 3;
                ck_assert(kv >= s.kv0 && kv < s.kv0 + s.nkv);
            }
            ck_assert_int_eq(s.nq % s.nkv, 0);
        }
        ck_assert_int_eq(f_next, c.ffn_dim);
        for (int h = 0; h < 9; h++) ck_assert_int_eq(q_seen[h], 1);
    }
    ck_assert_int_eq(model_shard_plan(&c, 10, 0, &s, &err), QERR_INVALID);
    ck_assert_msg(strstr(err.msg, "9 query heads"), "%s", err.msg);
    /* what quern info prints: the shards add up to the whole model once replicas are counted */
    uint64_t w1, w2a, w2b;
    size_t kv1, kv2a, kv2b;
    model_shard_whole(&c, &s);
    ck_assert_int_eq(model_shard_bytes(file, &c, &s, 4, &w1, &kv1, &err), 0);
    ck_assert_uint_eq(kv1, model_kv_bytes_per_token(&c, 4));
    model_shard_plan(&c, 2, 0, &s, &err);
    ck_assert_int_eq(model_shard_bytes(file, &c, &s, 4, &w2a, &kv2a, &err), 0);
    model_shard_plan(&c, 2, 1, &s, &err);
    ck_assert_int_eq(model_shard_bytes(file, &c, &s, 4, &w2b, &kv2b, &err), 0);
    ck_assert_uint_eq(kv2a + kv2b, kv1);
    ck_assert_uint_lt(w2a, w1);
    ck_assert_uint_eq(model_shard_kv_bytes_max(&c, 2, 4), kv2a);
}
END_TEST

START_TEST(impossible_tp_is_refused)
{
    struct tp_model t;
    tp_ranks(&t, 10, 1);
    struct model_opts mo;
    tp_opts(&t, &mo);
    struct qerr err = {0};
    ck_assert_int_eq(model_load(file, t.be[0], &mo, &t.m, &err), QERR_INVALID);
    ck_assert_msg(strstr(err.msg, "--tp 10") && strstr(err.msg, "at most 9"), "%s", err.msg);
    t.m = NULL;
    /* a backend list that does not start with be */
    mo.tp = 2;
    ck_assert_int_eq(model_load(file, t.be[1], &mo, &t.m, &err), QERR_INVALID);
    tp_free(&t);
}
END_TEST

struct collect {
    int32_t *out;
    int n, cap;
};

static bool collect_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    struct collect *c = ctx;
    if (c->n < c->cap) c->out[c->n++] = token;
    return false;
}

static void greedy(struct model *m, const int32_t *p, size_t np, int n, int32_t *out)
{
    struct collect col = {.out = out, .cap = n};
    struct gen_opts o = {.n_predict = n, .prefill_chunk = 29};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    struct qerr err = {0};
    ck_assert_msg(generate_run(m, p, np, &o, collect_token, &col, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(col.n, n);
}

/* --tp 2 and --tp 3 give --tp 1's greedy tokens on every golden prompt. */
START_TEST(greedy_equal_across_tp)
{
    int n_cases = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(golden, "generate"));
    int n_tok = tu_sanitized() ? 6 : 24;
    if (tu_sanitized()) n_cases = 2;
    struct tp_model t[3];
    tp_load(&t[0], 1, 2);
    tp_load(&t[1], 2, 1);
    tp_load(&t[2], 3, 1);
    for (int i = 0; i < n_cases; i++) {
        const cJSON *c = gen_case(i);
        size_t np;
        int32_t *p = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
        int32_t want[48], got[48];
        greedy(t[0].m, p, np, n_tok, want);
        for (int k = 1; k < 3; k++) {
            greedy(t[k].m, p, np, n_tok, got);
            for (int j = 0; j < n_tok; j++)
                ck_assert_msg(got[j] == want[j], "%s --tp %d step %d: %d, --tp 1: %d",
                              cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, t[k].n, j,
                              got[j], want[j]);
        }
        free(p);
    }
    for (int k = 0; k < 3; k++) tp_free(&t[k]);
}
END_TEST

/* The logits of a whole golden continuation, --tp 2/3/4 against --tp 1. */
START_TEST(logits_close_across_tp)
{
    const cJSON *c = gen_case(4);
    size_t np, ng;
    int32_t *p = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
    int32_t *g = json_ids(cJSON_GetObjectItemCaseSensitive(c, "greedy_ids"), &ng);
    if (tu_sanitized()) ng = 4;
    int32_t *seq = malloc((np + ng) * sizeof *seq);
    memcpy(seq, p, np * sizeof *seq);
    memcpy(seq + np, g, ng * sizeof *seq);
    size_t n = np + ng;
    struct qerr err = {0};
    struct tp_model one;
    tp_load(&one, 1, 2);
    float *want;
    ck_assert_msg(generate_all_logits(one.m, seq, n, 37, &want, &err) == 0, "%s", err.msg);
    int vocab = model_get_config(one.m)->vocab;
    tp_free(&one);
    const int ranks[] = {2, 3, 4};
    for (int k = 0; k < (tu_sanitized() ? 1 : 3); k++) {
        struct tp_model t;
        tp_load(&t, ranks[k], 1);
        float *got;
        ck_assert_msg(generate_all_logits(t.m, seq, n, 37, &got, &err) == 0, "%s", err.msg);
        double worst = 0;
        for (size_t i = 0; i < n * (size_t)vocab; i++) {
            double rel = fabs((double)got[i] - want[i]) / fmax(fabs((double)want[i]), 1.0);
            if (rel > worst) worst = rel;
        }
        printf("--tp %d: worst relative logit difference to --tp 1 %.2e over %zu positions\n",
               ranks[k], worst, n);
        ck_assert_msg(worst <= 1e-4, "--tp %d: logits differ by %.2e", ranks[k], worst);
        free(got);
        tp_free(&t);
    }
    free(want);
    free(seq);
    free(p);
    free(g);
}
END_TEST

/* One forward: sequence 0 is x (positions [from, n) now, [0, from) already cached), sequences
 * 1..n_seqs-1 prefill chunks of other text; each owns blocks [s * 8, s * 8 + 8). Returns
 * sequence 0's last logits in out. */
static void batched_forward(struct model *m, const int32_t *x, int n, int from, int n_seqs,
                            const int32_t *other, int n_other, float *out)
{
    const struct model_batch *b = tu_ragged_batch(x, n, from, n_seqs, other, n_other);
    int vocab = model_get_config(m)->vocab;
    float *logits = malloc((size_t)b->n_logits * (size_t)vocab * sizeof *logits);
    struct qerr err = {0};
    ck_assert_msg(model_forward(m, b, logits, &err) == 0, "%s", err.msg);
    memcpy(out, logits, (size_t)vocab * sizeof *out);
    free(logits);
}

/* --tp 2: a sequence's logits are the same bits alone, in batches of 2 and 7 sequences (prefill
 * and decode), in a second model with 2 threads per rank, and on a second run. */
START_TEST(tp2_bit_identical)
{
    size_t nx, no;
    int32_t *x = json_ids(cJSON_GetObjectItemCaseSensitive(gen_case(4), "prompt_ids"), &nx);
    int32_t *other = json_ids(cJSON_GetObjectItemCaseSensitive(gen_case(1), "prompt_ids"), &no);
    struct tp_model a, b;
    tp_load(&a, 2, 1);
    tp_load(&b, 2, 2);
    int vocab = model_get_config(a.m)->vocab;
    size_t bytes = (size_t)vocab * sizeof(float);
    float *alone = malloc(bytes), *got = malloc(bytes);
    batched_forward(a.m, x, (int)nx, 0, 1, other, (int)no, alone);
    batched_forward(a.m, x, (int)nx, 0, 1, other, (int)no, got);
    ck_assert_msg(memcmp(alone, got, bytes) == 0, "a second run differs");
    batched_forward(b.m, x, (int)nx, 0, 1, other, (int)no, got);
    ck_assert_msg(memcmp(alone, got, bytes) == 0, "2 threads per rank differ");
    const int sizes[] = {2, 7};
    for (int k = 0; k < (tu_sanitized() ? 1 : 2); k++) {
        batched_forward(a.m, x, (int)nx, 0, sizes[k], other, (int)no, got);
        ck_assert_msg(memcmp(alone, got, bytes) == 0, "prefill differs in a batch of %d", sizes[k]);
        batched_forward(b.m, x, (int)nx - 1, 0, 1, other, (int)no, got);
        batched_forward(b.m, x, (int)nx, (int)nx - 1, sizes[k], other, (int)no, got);
        ck_assert_msg(memcmp(alone, got, bytes) == 0, "decode differs in a batch of %d", sizes[k]);
    }
    free(alone);
    free(got);
    tp_free(&a);
    tp_free(&b);
    free(x);
    free(other);
}
END_TEST

/* A rank whose communicator has failed makes the whole forward fail, at once, with its reason;
 * the group stays failed. */
START_TEST(failed_rank_fails_the_step)
{
    struct tp_model t;
    tp_load(&t, 3, 1);
    int32_t tok = 1, pos = 0, seq = 0, slot = 0, table = 0, li = 0;
    struct model_batch b = {.n_tokens = 1,
                            .tokens = &tok,
                            .pos = &pos,
                            .seq = &seq,
                            .slot = &slot,
                            .n_seqs = 1,
                            .max_blocks = 1,
                            .block_table = &table,
                            .n_logits = 1,
                            .logit_idx = &li};
    float *logits = malloc((size_t)model_get_config(t.m)->vocab * sizeof *logits);
    struct qerr err = {0};
    ck_assert_msg(model_forward(t.m, &b, logits, &err) == 0, "%s", err.msg);
    comm_abort(t.comm[2], "device lost");
    ck_assert_int_eq(model_forward(t.m, &b, logits, &err), QERR_IO);
    ck_assert_msg(strstr(err.msg, "rank 2: device lost"), "%s", err.msg);
    ck_assert_int_eq(model_forward(t.m, &b, logits, &err), QERR_IO);
    free(logits);
    tp_free(&t);
}
END_TEST

/* The engine under --tp 2: requests batched together (chunked prefill, the prefix cache, a pool
 * small enough to preempt) give the tokens they give alone. */
static struct tokenizer *tok;

static struct engine *make_engine(struct tp_model *t, int batch, int seqs, int blocks)
{
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = batch;
    o.max_seqs = seqs;
    o.kv_blocks = blocks;
    o.tp = t->n;
    o.tp_backends = t->be;
    o.tp_comms = t->comm;
    /* whole cached blocks only: the partial-block copies shrink what the prompts need, and
     * whether the small pool below then preempts came to depend on timing (an ASan run) */
    o.prefix_partial = false;
    struct engine *e;
    struct qerr err = {0};
    ck_assert_msg(engine_create(file, tok, t->be[0], &o, &e, &err) == 0, "%s", err.msg);
    return e;
}

static void collect_tokens(struct request *q, int n_out, int32_t *out)
{
    int n = 0;
    for (;;) {
        struct req_event ev;
        ck_assert_int_eq(request_next(q, &ev, 120000), 0);
        if (ev.done) break;
        if (n < 16) out[n++] = ev.token;
    }
    ck_assert_int_eq(n, n_out);
    request_release(q);
}

/* Request i: a 40-token prefix every request shares, then text of its own (41..190 tokens). One
 * at a time, or all submitted before any is read. */
static void run_requests(struct engine *e, const int32_t *ids, int n_req, int n_out, bool together,
                         int32_t (*out)[16])
{
    static int32_t prompts[16][200];
    struct request *q[16];
    for (int i = 0; i < n_req; i++) {
        int len = 41 + (i * 37) % 150;
        memcpy(prompts[i], ids, 40 * sizeof(int32_t));
        memcpy(prompts[i] + 40, ids + 40 + i * 50, (size_t)(len - 40) * sizeof(int32_t));
        struct gen_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompts[i];
        r.n_prompt = (size_t)len;
        sample_params_default(&r.sample);
        r.sample.temperature = 0;
        r.max_tokens = n_out;
        r.ignore_eos = true;
        r.top_logprobs = -1;
        struct qerr err = {0};
        ck_assert_msg(engine_submit(e, &r, &q[i], &err) == 0, "%s", err.msg);
        if (!together) collect_tokens(q[i], n_out, out[i]);
    }
    for (int i = 0; together && i < n_req; i++) collect_tokens(q[i], n_out, out[i]);
}

START_TEST(engine_tp2_batched_equals_alone)
{
    struct qerr err = {0};
    ck_assert_msg(tokenizer_load(file, &tok, &err) == 0, "%s", err.msg);
    size_t len;
    char *text = tu_read_file("/usr/share/common-licenses/GPL-3", &len);
    ck_assert_ptr_nonnull(text);
    int32_t *ids;
    size_t n_ids;
    ck_assert_int_eq(tokenizer_encode(tok, text, len, false, false, &ids, &n_ids, &err), 0);
    free(text);
    ck_assert_uint_gt(n_ids, 1000);
    int n_req = tu_sanitized() ? 4 : 6, n_out = tu_sanitized() ? 4 : 12;
    static int32_t alone[16][16], together[16][16];
    struct tp_model t;
    tp_load(&t, 2, 1);
    model_free(t.m); /* the engine loads its own */
    struct engine *e = make_engine(&t, 256, 4, 64);
    run_requests(e, ids, n_req, n_out, false, alone);
    engine_free(e);
    e = make_engine(&t, 48, 6, tu_sanitized() ? 12 : 16); /* too small for all at once */
    run_requests(e, ids, n_req, n_out, true, together);
    struct engine_stats st;
    engine_get_stats(e, &st);
    printf("--tp 2 engine: %llu steps, %llu preemptions, %llu prefix-hit tokens\n",
           (unsigned long long)st.steps, (unsigned long long)st.preemptions,
           (unsigned long long)st.prefix_hit_tokens);
    ck_assert_msg(st.preemptions > 0, "the pool was meant to force preemption");
    ck_assert_uint_gt(st.prefix_hit_tokens, 0);
    engine_free(e);
    for (int i = 0; i < n_req; i++)
        for (int k = 0; k < n_out; k++)
            ck_assert_msg(together[i][k] == alone[i][k],
                          "request %d token %d: %d batched, %d alone", i, k, together[i][k],
                          alone[i][k]);
    t.m = NULL;
    tp_free(&t);
    free(ids);
    tokenizer_free(tok);
}
END_TEST

int main(void)
{
    tu_model_path();
    const char *gp = tu_golden_path();
    char *text = gp ? tu_read_file(gp, NULL) : NULL;
    golden = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!golden) {
        fprintf(stderr, "missing or unreadable golden file ($QUERN_GOLDEN)\n");
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("tp");
    /* "tp2" needs two ranks at most (on CUDA: two GPUs; CK_RUN_CASE=tp2), "tp" up to four */
    TCase *tc2 = tcase_create("tp2");
    tcase_set_timeout(tc2, 600);
    tcase_add_checked_fixture(tc2, open_file, close_file);
    tcase_add_test(tc2, tp2_bit_identical);
    tcase_add_test(tc2, engine_tp2_batched_equals_alone);
    suite_add_tcase(s, tc2);
    TCase *tc = tcase_create("tp");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, open_file, close_file);
    tcase_add_test(tc, shard_plan_splits_heads);
    tcase_add_test(tc, impossible_tp_is_refused);
    tcase_add_test(tc, failed_rank_fails_the_step);
    tcase_add_test(tc, logits_close_across_tp);
    tcase_add_test(tc, greedy_equal_across_tp);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cJSON_Delete(golden);
    return failed ? 1 : 0;
}
