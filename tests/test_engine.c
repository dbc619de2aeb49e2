/* The engine on the real model and real text (the GPL-3 text every Debian system carries):
 * batched results equal one-at-a-time results under chunked prefill and preemption, the prefix
 * cache, stop strings, seeded sampling inside a busy batch, and the KV pool's bookkeeping. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/engine.h"
#include "../engine/engine_impl.h" /* check_error */
#include "../engine/engine_state.h"
#include "../engine/kv_cache.h"
#include "../engine/stop_match.h"
#include "../kernels/cpu/backend_cpu.h"
#include "testbackend.h"
#include "testutil.h"

static struct gguf_file *file;
static struct tokenizer *tok;
static struct backend *be;
static int32_t *text_ids; /* the whole text, tokenized */
static size_t n_text;

/* The polls below wait for the engine thread in 10 ms ticks, up to two minutes: they end as
 * soon as it gets there, and a sanitized engine beside another suite on two cores took over
 * 10 s to prefill two 40-token prompts and decode four tokens (state_picture_matches_engine
 * failed so in CI with a 10 s wait). */
enum { WAIT_TICKS = 12000 };

/* Runs `refresh` (which reads the engine's published stats or state) until `done` holds or
 * WAIT_TICKS have passed; the caller asserts `done` after it, so a timeout fails there. */
#define POLL_UNTIL(refresh, done)                                                                  \
    for (int poll_tick_ = 0; poll_tick_ < WAIT_TICKS; poll_tick_++) {                              \
        refresh;                                                                                   \
        if (done) break;                                                                           \
        nanosleep(&(struct timespec){0, 10000000}, NULL);                                          \
    }

static void setup_once(void)
{
    tb_model_open(&file, &tok, &be, &text_ids, &n_text);
    ck_assert_uint_gt(n_text, 2000);
}

static void teardown_once(void)
{
    tb_model_close(file, tok, be, text_ids);
}

static struct engine *make_engine_opts(const struct engine_opts *o)
{
    struct engine *e;
    struct qerr err = {0};
    ck_assert_msg(engine_create(file, tok, be, o, &e, &err) == 0, "%s", err.msg);
    return e;
}

static struct engine *make_engine(int batch, int seqs, int blocks, bool prefix)
{
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = batch;
    o.max_seqs = seqs;
    o.kv_blocks = blocks;
    o.prefix_cache = prefix;
    return make_engine_opts(&o);
}

/* Two sequences at most, each paused once 4 of its events are unread; aborted after
 * stall_timeout_s of that (0: never). */
static struct engine *make_pausing_engine(double stall_timeout_s)
{
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = 64;
    o.max_seqs = 2;
    o.kv_blocks = 64;
    o.max_unread = 4;
    o.stall_timeout_s = stall_timeout_s;
    return make_engine_opts(&o);
}

/* Waits (up to WAIT_TICKS) until the engine has published a step with nothing left to do. */
static void wait_idle(struct engine *e, struct engine_stats *st)
{
    POLL_UNTIL(engine_get_stats(e, st),
               st->running == 0 && st->waiting == 0 && st->kv_blocks_used == 0);
}

struct result {
    int32_t tokens[256];
    int n;
    char text[4096];
    size_t text_len;
    struct req_event final;
};

static void greedy_request(struct gen_request *r, const int32_t *prompt, size_t n, int max_tokens)
{
    memset(r, 0, sizeof *r);
    r->prompt = prompt;
    r->n_prompt = n;
    sample_params_default(&r->sample);
    r->sample.temperature = 0;
    r->max_tokens = max_tokens;
    r->ignore_eos = true;
    r->top_logprobs = -1;
}

static struct request *submit(struct engine *e, const struct gen_request *r)
{
    struct request *q;
    struct qerr err = {0};
    ck_assert_msg(engine_submit(e, r, &q, &err) == 0, "%s", err.msg);
    return q;
}

static void collect(struct request *q, struct result *res)
{
    memset(res, 0, sizeof *res);
    for (;;) {
        struct req_event ev;
        ck_assert_int_eq(request_next(q, &ev, 120000), 0);
        if (ev.text_len > 0 && res->text_len + (size_t)ev.text_len < sizeof res->text) {
            memcpy(res->text + res->text_len, ev.text, (size_t)ev.text_len);
            res->text_len += (size_t)ev.text_len;
        }
        if (ev.done) {
            res->final = ev;
            break;
        }
        if (res->n < 256) res->tokens[res->n++] = ev.token;
    }
    request_release(q);
}

static void run_alone(struct engine *e, const struct gen_request *r, struct result *res)
{
    collect(submit(e, r), res);
}

/* Prompt i of the batch test: lengths from 1 to 700 tokens (350 under a sanitizer, which makes
 * each token some 10x dearer), from different places in the text. */
static void batch_prompt(int i, int n_prompts, const int32_t **p, size_t *n)
{
    size_t longest = tu_sanitized() ? 350 : 700;
    size_t len = i == 0 ? 1 : longest * (size_t)i / (size_t)(n_prompts - 1);
    if (len < 1) len = 1;
    size_t off = (size_t)(i * 97) % (n_text - len);
    *p = text_ids + off;
    *n = len;
}

/* What a prompt-output request gave: its prompt events, generated tokens, or embedding. */
struct prompt_result {
    int n_plp, n_gen;
    int32_t plp_token[256];
    float plp_lp[256];
    int plp_rank[256];
    struct token_logprob plp_top[256][2];
    int32_t gen[8];
    float emb[1024];
    int dim;
    enum finish_reason finish;
};

static void collect_prompt(struct request *q, struct prompt_result *res)
{
    memset(res, 0, sizeof *res);
    for (;;) {
        struct req_event ev;
        ck_assert_int_eq(request_next(q, &ev, 120000), 0);
        if (ev.done) {
            res->finish = ev.finish;
            break;
        }
        if (ev.prompt) {
            ck_assert_int_eq(res->n_gen, 0); /* every prompt event comes first */
            ck_assert_int_lt(res->n_plp, 256);
            res->plp_token[res->n_plp] = ev.token;
            res->plp_lp[res->n_plp] = ev.logprob;
            res->plp_rank[res->n_plp] = ev.rank;
            ck_assert_int_eq(ev.n_top, 2);
            memcpy(res->plp_top[res->n_plp], ev.top, sizeof res->plp_top[0]);
            res->n_plp++;
        } else if (res->n_gen < 8) {
            res->gen[res->n_gen++] = ev.token;
        }
    }
    const float *v = request_embedding(q, &res->dim);
    if (v) {
        ck_assert_int_le(res->dim, 1024);
        memcpy(res->emb, v, (size_t)res->dim * sizeof *v);
    }
    request_release(q);
}

/* Request i of the prompt-output test: prompt logprobs with 3 generated tokens, or pooled
 * (mean, last, cls in turn), over 30..250-token prompts. */
static void prompt_request(int i, struct gen_request *r)
{
    size_t len = 30 + (size_t)(i * 37) % 220;
    greedy_request(r, text_ids + (size_t)(i * 131) % (n_text - len), len, 3);
    if (i % 2 == 0) {
        r->prompt_logprobs = true;
        r->prompt_top_logprobs = 2;
    } else {
        r->max_tokens = 0;
        r->pooling = (enum engine_pooling)(ENGINE_POOL_MEAN + (i / 2) % 3);
    }
}

/* Prompt logprobs and embeddings are bit-identical alone and in a busy engine whose small step
 * budget, few logits rows and small pool chunk their prompts and preempt them; a prompt logprob
 * is the logprob of the prompt's next token; pooled vectors are unit vectors. */
START_TEST(prompt_outputs_batched_equal_alone)
{
    int n = tu_sanitized() ? 4 : 12;
    static struct prompt_result alone[12], busy[12];
    struct gen_request r;
    struct engine *e = make_engine(512, 4, 64, false);
    for (int i = 0; i < n; i++) {
        prompt_request(i, &r);
        collect_prompt(submit(e, &r), &alone[i]);
        if (i % 2 == 0) {
            ck_assert_int_eq(alone[i].n_plp, (int)r.n_prompt - 1);
            ck_assert_int_eq(alone[i].n_gen, 3);
            for (int k = 0; k < alone[i].n_plp; k++) {
                ck_assert_int_eq(alone[i].plp_token[k], r.prompt[k + 1]);
                ck_assert(alone[i].plp_lp[k] <= 0 && alone[i].plp_rank[k] >= 1);
                ck_assert(alone[i].plp_rank[k] > 1 ||
                          alone[i].plp_top[k][0].token == alone[i].plp_token[k]);
            }
        } else {
            ck_assert_int_eq(alone[i].finish, FINISH_STOP);
            ck_assert_int_eq(alone[i].dim, engine_model_config(e)->dim);
            double norm = 0;
            for (int d = 0; d < alone[i].dim; d++)
                norm += (double)alone[i].emb[d] * alone[i].emb[d];
            ck_assert_double_eq_tol(norm, 1.0, 1e-5);
        }
    }
    engine_free(e);
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = 128; /* several prompts admitted at once, each in chunks */
    o.max_seqs = 8;
    o.kv_blocks = 24; /* 384 tokens: too few for them all */
    o.prompt_logprob_rows = 16;
    o.max_unread = 0; /* the fillers are read last: they must not wait for their reader */
    struct qerr err = {0};
    ck_assert_msg(engine_create(file, tok, be, &o, &e, &err) == 0, "%s", err.msg);
    /* generations that grow while the others wait for blocks */
    struct request *fill[3];
    for (int i = 0; i < 3; i++) {
        greedy_request(&r, text_ids + 500 + 300 * i, 90, tu_sanitized() ? 60 : 100);
        fill[i] = submit(e, &r);
    }
    struct request *q[12];
    for (int i = 0; i < n; i++) {
        prompt_request(i, &r);
        q[i] = submit(e, &r);
    }
    for (int i = 0; i < n; i++) collect_prompt(q[i], &busy[i]);
    for (int i = 0; i < 3; i++) {
        struct result filled;
        collect(fill[i], &filled);
        ck_assert_int_eq(filled.final.finish, FINISH_LENGTH);
    }
    struct engine_stats st;
    wait_idle(e, &st);
    printf("prompt outputs: %llu steps, %llu preemptions\n", (unsigned long long)st.steps,
           (unsigned long long)st.preemptions);
    ck_assert_msg(st.preemptions > 0, "the pool was meant to force preemption");
    ck_assert_int_eq(st.kv_blocks_used, 0);
    engine_free(e);
    for (int i = 0; i < n; i++)
        ck_assert_msg(!memcmp(&busy[i], &alone[i], sizeof busy[i]),
                      "request %d: busy and alone differ (%d/%d prompt events, dim %d/%d)", i,
                      busy[i].n_plp, alone[i].n_plp, busy[i].dim, alone[i].dim);
}
END_TEST

START_TEST(batched_equals_sequential)
{
    int n_prompts = tu_sanitized() ? 8 : 24, n_out = tu_sanitized() ? 6 : 12;
    static struct result alone[24], batched[24];
    struct gen_request r;
    /* alone: a pool big enough for one request at a time, one request in the engine */
    struct engine *e = make_engine(256, 4, 64, false);
    for (int i = 0; i < n_prompts; i++) {
        const int32_t *p;
        size_t n;
        batch_prompt(i, n_prompts, &p, &n);
        greedy_request(&r, p, n, n_out);
        run_alone(e, &r, &alone[i]);
        ck_assert_int_eq(alone[i].final.finish, FINISH_LENGTH);
        ck_assert_int_eq(alone[i].n, n_out);
    }
    engine_free(e);
    /* together: small step budget (chunked prefill) and a pool too small for all at once */
    e = make_engine(64, 8, tu_sanitized() ? 26 : 80, true);
    struct request *q[24];
    for (int i = 0; i < n_prompts; i++) {
        const int32_t *p;
        size_t n;
        batch_prompt(i, n_prompts, &p, &n);
        greedy_request(&r, p, n, n_out);
        q[i] = submit(e, &r);
    }
    for (int i = 0; i < n_prompts; i++) collect(q[i], &batched[i]);
    struct engine_stats st;
    wait_idle(e, &st);
    printf("batched: %llu steps, %llu preemptions, peak %d/%d blocks\n",
           (unsigned long long)st.steps, (unsigned long long)st.preemptions, st.kv_blocks_peak,
           st.kv_blocks_total);
    ck_assert_msg(st.preemptions > 0, "the pool was meant to force preemption");
    ck_assert_int_eq(st.kv_blocks_used, 0);
    engine_free(e);
    for (int i = 0; i < n_prompts; i++) {
        ck_assert_int_eq(batched[i].n, alone[i].n);
        for (int k = 0; k < alone[i].n; k++)
            ck_assert_msg(batched[i].tokens[k] == alone[i].tokens[k],
                          "prompt %d token %d: batched %d, alone %d", i, k, batched[i].tokens[k],
                          alone[i].tokens[k]);
        ck_assert_str_eq(batched[i].text, alone[i].text);
    }
}
END_TEST

/* The serving mode with an int8 KV cache (q8 activations, --kv-type q8: Q8_0 slots, 34 bytes per
 * 32 elements): greedy tokens alone equal those in a batch that chunks its prompts, shares
 * cached prefixes and preempts (its blocks copied, partly matching ones too). */
START_TEST(q8_kv_batched_equals_alone)
{
    int n_prompts = tu_sanitized() ? 4 : 8, n_out = 6;
    struct backend *bq = NULL;
    struct qerr err = {0};
    struct backend_cpu_opts bo = {.n_threads = 2, .precision = MATMUL_Q8, .kv_q8 = true};
    ck_assert_msg(backend_cpu_create(&bo, &bq, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(backend_kv_bytes(bq, 64), 68);
    /* the prompts, and last the longest one's first 150 tokens: a cached prefix that ends
     * inside a block, whose matching part is copied */
    const int32_t *p[9];
    size_t n[9];
    for (int i = 0; i < n_prompts; i++) {
        batch_prompt(i, n_prompts, &p[i], &n[i]);
        n[i] = n[i] > 300 ? 300 : n[i];
    }
    p[n_prompts] = p[n_prompts - 1];
    n[n_prompts] = 150;
    static struct result alone[9], batched[9];
    struct gen_request r;
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = 256;
    o.max_seqs = 4;
    o.kv_blocks = 64;
    struct engine *e;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            o.max_batch_tokens = 64;
            o.max_seqs = 8;
            o.kv_blocks = tu_sanitized() ? 20 : 28; /* too few for them all */
            o.prefix_cache = true;
        }
        ck_assert_msg(engine_create(file, tok, bq, &o, &e, &err) == 0, "%s", err.msg);
        struct request *q[9];
        for (int i = 0; i <= n_prompts; i++) {
            greedy_request(&r, p[i], n[i], n_out);
            if (!pass)
                run_alone(e, &r, &alone[i]);
            else if (i < n_prompts)
                q[i] = submit(e, &r);
        }
        for (int i = 0; pass && i < n_prompts; i++) collect(q[i], &batched[i]);
        if (pass) { /* after the others: its prefix is in the cache */
            greedy_request(&r, p[n_prompts], n[n_prompts], n_out);
            run_alone(e, &r, &batched[n_prompts]);
        }
        struct engine_stats st;
        wait_idle(e, &st);
        if (pass) {
            printf("q8 KV batched: %llu steps, %llu preemptions, %llu prefix tokens reused\n",
                   (unsigned long long)st.steps, (unsigned long long)st.preemptions,
                   (unsigned long long)st.prefix_hit_tokens);
            ck_assert_msg(st.preemptions > 0, "the pool was meant to force preemption");
            ck_assert_msg(st.prefix_hit_tokens > 0, "the last prompt was meant to hit the cache");
        }
        ck_assert_int_eq(st.kv_blocks_used, 0);
        engine_free(e);
    }
    backend_destroy(bq);
    for (int i = 0; i <= n_prompts; i++) {
        ck_assert_int_eq(batched[i].n, n_out);
        for (int k = 0; k < n_out; k++)
            ck_assert_msg(batched[i].tokens[k] == alone[i].tokens[k],
                          "q8 KV, prompt %d token %d: batched %d, alone %d", i, k,
                          batched[i].tokens[k], alone[i].tokens[k]);
    }
}
END_TEST

START_TEST(prefix_cache_reuses_blocks)
{
    /* two requests share a 300-token prefix and differ after it; two short ones (like a load
     * test's) share 13 tokens, less than a block */
    size_t shared = 300, tail = 20;
    int32_t a[320], b[320], c[15], d[15];
    memcpy(a, text_ids + 500, shared * sizeof *a);
    memcpy(b, text_ids + 500, shared * sizeof *b);
    memcpy(a + shared, text_ids + 1200, tail * sizeof *a);
    memcpy(b + shared, text_ids + 1500, tail * sizeof *b);
    memcpy(c, text_ids + 1700, sizeof c);
    memcpy(d, text_ids + 1700, sizeof d);
    memcpy(d + 13, text_ids + 1900, 2 * sizeof *d);
    struct gen_request r;
    struct result ra, rb, rb_nocache, rc, rd, rd_nocache;
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = 128;
    o.max_seqs = 4;
    o.kv_blocks = 128;
    o.check_invariants = true; /* the pool's references with copies in flight */
    struct engine *e = make_engine_opts(&o);
    greedy_request(&r, a, shared + tail, 8);
    run_alone(e, &r, &ra);
    greedy_request(&r, b, shared + tail, 8);
    run_alone(e, &r, &rb);
    greedy_request(&r, c, 15, 4);
    run_alone(e, &r, &rc);
    greedy_request(&r, d, 15, 4);
    run_alone(e, &r, &rd);
    struct engine_stats st;
    wait_idle(e, &st);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    engine_free(e);
    /* 300 shared tokens = 18 full blocks of 16 (288 tokens), then 12 of a's 19th block, whose
     * K/V b gets as a copy (prefix_partial); d takes 13 tokens of c's first block the same way */
    ck_assert_int_eq(rb.final.cached_tokens, 300);
    ck_assert_int_eq(rd.final.cached_tokens, 13);
    ck_assert_uint_eq(st.prefix_hit_tokens, 300 + 13);
    ck_assert_int_eq(ra.final.cached_tokens, 0);
    ck_assert_int_eq(rc.final.cached_tokens, 0);

    e = make_engine(128, 4, 128, false);
    greedy_request(&r, b, shared + tail, 8);
    run_alone(e, &r, &rb_nocache);
    greedy_request(&r, d, 15, 4);
    run_alone(e, &r, &rd_nocache);
    engine_free(e);
    ck_assert_int_eq(rb_nocache.final.cached_tokens, 0);
    ck_assert_int_eq(rb.n, rb_nocache.n);
    ck_assert_mem_eq(rb.tokens, rb_nocache.tokens, (size_t)rb.n * sizeof rb.tokens[0]);
    ck_assert_int_eq(rd.n, rd_nocache.n);
    ck_assert_mem_eq(rd.tokens, rd_nocache.tokens, (size_t)rd.n * sizeof rd.tokens[0]);
}
END_TEST

START_TEST(stop_string_across_tokens)
{
    const char *prompt = "The capital of France is";
    int32_t *ids;
    size_t n;
    struct qerr err = {0};
    ck_assert_int_eq(tokenizer_encode(tok, prompt, strlen(prompt), false, false, &ids, &n, &err),
                     0);
    struct engine *e = make_engine(128, 4, 64, true);
    struct gen_request r;
    static struct result full, cut, kept;
    greedy_request(&r, ids, n, 24);
    run_alone(e, &r, &full);
    /* a stop string made of the last 2 bytes of one token's text and the first 2 of the next */
    int k = -1;
    char stop[16] = {0};
    for (int i = 0; i + 1 < full.n && k < 0; i++) {
        char a[64], b[64];
        int la = tokenizer_token_bytes(tok, full.tokens[i], a, sizeof a);
        int lb = tokenizer_token_bytes(tok, full.tokens[i + 1], b, sizeof b);
        if (la >= 3 && lb >= 3 && i >= 2) {
            memcpy(stop, a + la - 2, 2);
            memcpy(stop + 2, b, 2);
            k = i;
        }
    }
    ck_assert_msg(k >= 0, "no two long adjacent tokens in: %s", full.text);
    const char *first = strstr(full.text, stop);
    ck_assert_ptr_nonnull(first);
    /* the second of two stop strings ends it (the first never occurs): its index is reported */
    r.n_stop_strings = 2;
    r.stop_strings[0] = "\x01never";
    r.stop_strings[1] = stop;
    run_alone(e, &r, &cut);
    /* vLLM's include_stop_str_in_output: the same cut, after the stop string */
    r.include_stop_str = true;
    run_alone(e, &r, &kept);
    engine_free(e);
    ck_assert_int_eq(cut.final.finish, FINISH_STOP);
    ck_assert_uint_eq(cut.text_len, (size_t)(first - full.text));
    ck_assert(strncmp(cut.text, full.text, cut.text_len) == 0);
    ck_assert_ptr_null(strstr(cut.text, stop));
    ck_assert_int_eq(cut.final.stop_string, 1);
    ck_assert_int_eq(cut.final.stop_token, -1);
    ck_assert_int_eq(full.final.stop_string, -1);
    ck_assert_int_eq(kept.final.finish, FINISH_STOP);
    ck_assert_int_eq(kept.final.stop_string, 1);
    ck_assert_uint_eq(kept.text_len, cut.text_len + strlen(stop));
    ck_assert(strncmp(kept.text, full.text, kept.text_len) == 0);

    /* a first token with no text (a control token, forced) before anything is held: the stop
     * strings are looked for in an empty hold (a NULL buffer, which memmem may not take: the
     * soak's UBSan report) */
    static struct result ctl;
    struct logit_bias force = {.token = 1, .bias = 100}; /* <|im_start|>: no text */
    greedy_request(&r, ids, n, 2);
    r.logit_bias = &force;
    r.n_logit_bias = 1;
    r.n_stop_strings = 1;
    r.stop_strings[0] = stop;
    e = make_engine(128, 4, 64, true);
    run_alone(e, &r, &ctl);
    engine_free(e);
    ck_assert_int_eq(ctl.final.finish, FINISH_LENGTH);
    ck_assert_int_eq(ctl.n, 2);
    ck_assert_uint_eq(ctl.text_len, 0);
    ck_assert_int_eq(stop_find(NULL, 0, (char *const[]){stop}, 1), -1);
    free(ids);
}
END_TEST

START_TEST(seeded_sampling_same_in_busy_batch)
{
    int32_t *p = text_ids + 100;
    struct gen_request r;
    greedy_request(&r, p, 40, 16);
    r.sample.temperature = 0.9f;
    r.sample.top_k = 50;
    r.sample.top_p = 0.95f;
    r.sample.seed = 1234;
    r.top_logprobs = 3;
    struct result alone, busy;
    struct engine *e = make_engine(128, 16, 256, true);
    run_alone(e, &r, &alone);
    /* the same request among 7 others of different lengths and seeds */
    struct request *others[7], *mine = NULL;
    for (int i = 0; i < 7; i++) {
        struct gen_request o;
        greedy_request(&o, text_ids + 900 + i * 50, (size_t)(10 + i * 23), 20);
        o.sample.temperature = 1.0f;
        o.sample.seed = (uint64_t)i;
        others[i] = submit(e, &o);
        if (i == 3) mine = submit(e, &r);
    }
    collect(mine, &busy);
    for (int i = 0; i < 7; i++) {
        struct result tmp;
        collect(others[i], &tmp);
    }
    engine_free(e);
    ck_assert_int_eq(busy.n, alone.n);
    ck_assert_mem_eq(busy.tokens, alone.tokens, (size_t)alone.n * sizeof alone.tokens[0]);
}
END_TEST

START_TEST(aborts_and_limits)
{
    struct engine *e = make_engine(64, 4, 64, true);
    struct gen_request r;
    struct qerr err = {0};
    struct request *q;
    /* over the context */
    greedy_request(&r, text_ids, 100, 8192);
    ck_assert_int_eq(engine_submit(e, &r, &q, &err), QERR_TOO_LONG);
    ck_assert_ptr_nonnull(strstr(err.msg, "exceeds the context length"));
    /* could never fit the pool (64 blocks = 1024 tokens) */
    greedy_request(&r, text_ids, 1000, 100);
    ck_assert_int_eq(engine_submit(e, &r, &q, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "KV blocks"));
    /* bad token id */
    int32_t bad[2] = {5, 999999};
    greedy_request(&r, bad, 2, 4);
    ck_assert_int_eq(engine_submit(e, &r, &q, &err), QERR_INVALID);
    /* abort mid-way: the request ends with abort and its blocks come back (a shorter prompt
     * under ThreadSanitizer, where each token costs some 50x) */
    greedy_request(&r, text_ids, tu_tsan() ? 24 : 200, 200);
    q = submit(e, &r);
    struct req_event ev;
    ck_assert_int_eq(request_next(q, &ev, 60000), 0); /* first token */
    request_abort(q);
    do ck_assert_int_eq(request_next(q, &ev, 60000), 0);
    while (!ev.done);
    ck_assert_int_eq(ev.finish, FINISH_ABORT);
    request_release(q);
    /* a request released without reading is aborted too */
    greedy_request(&r, text_ids + 50, tu_tsan() ? 24 : 120, 100);
    request_release(submit(e, &r));
    /* max_tokens 0 finishes at once */
    greedy_request(&r, text_ids, 10, 0);
    struct result res;
    run_alone(e, &r, &res);
    ck_assert_int_eq(res.final.finish, FINISH_LENGTH);
    ck_assert_int_eq(res.n, 0);
    /* the engine still serves, and everything is free afterwards */
    greedy_request(&r, text_ids, 10, 4);
    run_alone(e, &r, &res);
    ck_assert_int_eq(res.n, 4);
    struct engine_stats st;
    wait_idle(e, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert_uint_ge(st.finished[FINISH_ABORT], 2);
    engine_free(e);
}
END_TEST

/* Back-pressure: a request whose reader leaves max_unread events unread takes no decode step
 * (paused) and resumes when read; one left unread for stall_timeout_s is aborted with its
 * blocks freed; and a request may be read, aborted and released after engine_free. */
START_TEST(back_pressure_and_after_free)
{
    struct engine *e = make_pausing_engine(0.5);
    struct gen_request r;
    greedy_request(&r, text_ids, 8, 40);
    struct request *q = submit(e, &r);
    struct engine_stats st = {0};
    POLL_UNTIL(engine_get_stats(e, &st), st.paused != 0);
    ck_assert_int_eq(st.paused, 1);
    uint64_t gen = st.generation_tokens;
    ck_assert_uint_le(gen, 5); /* 4 unread events, the 5th token's maybe on its way */
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
    engine_get_stats(e, &st);
    ck_assert_uint_eq(st.generation_tokens, gen); /* paused: nothing more */
    /* reading makes room: it goes on, and pauses again 4 events later */
    struct req_event ev;
    for (int i = 0; i < 4; i++) ck_assert_int_eq(request_next(q, &ev, 5000), 0);
    POLL_UNTIL(engine_get_stats(e, &st), st.generation_tokens >= gen + 4);
    ck_assert_uint_ge(st.generation_tokens, gen + 4);
    /* left unread: aborted after stall_timeout_s, blocks freed */
    wait_idle(e, &st);
    ck_assert_uint_eq(st.stalled, 1);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    struct result res;
    collect(q, &res);
    ck_assert_int_eq(res.final.finish, FINISH_ABORT);
    ck_assert_msg(strstr(res.final.error, "read nothing"), "%s", res.final.error);

    /* a request still held when the engine is freed stays usable: abort, read, release */
    greedy_request(&r, text_ids, 8, 200);
    struct request *held = submit(e, &r);
    engine_free(e);
    request_abort(held);
    for (int i = 0; i < 300; i++) {
        ck_assert_int_eq(request_next(held, &ev, 1000), 0);
        if (ev.done) break;
    }
    ck_assert(ev.done);
    ck_assert_int_eq(ev.finish, FINISH_ABORT);
    request_abort(held);
    request_release(held);
}
END_TEST

/* A client request of several choices takes one place in the queue: its first choice needs a
 * free place as a single request does, its further ones (joins_group) the room kept for them
 * (ENGINE_MAX_GROUP - 1 past max_queue), so under overload it is admitted as often as a
 * single-choice request. One sequence runs (paused by its unread events), max_queue 2. */
START_TEST(a_request_of_many_choices_takes_one_queue_place)
{
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = 64;
    o.max_seqs = 1;
    o.max_queue = 2;
    o.kv_blocks = 64;
    o.max_unread = 4;
    o.stall_timeout_s = 0;
    struct engine *e = make_engine_opts(&o);
    enum { N = 2 + ENGINE_MAX_GROUP };
    struct request *q[N + 1] = {0};
    struct gen_request r;
    greedy_request(&r, text_ids, 20, 40);
    q[0] = submit(e, &r); /* runs, then pauses: its events are not read */
    struct engine_stats st;
    POLL_UNTIL(engine_get_stats(e, &st), st.running == 1 && st.waiting == 0);
    ck_assert_int_eq(st.running, 1);
    struct qerr err = {0};
    int n = 1;
    ck_assert_int_eq(engine_submit(e, &r, &q[n++], &err), 0); /* a single choice: 1 waiting */
    ck_assert_int_eq(engine_submit(e, &r, &q[n++], &err), 0); /* a first choice: 2 waiting */
    r.joins_group = true;
    /* its further choices fill the room kept for them, to max_queue + ENGINE_MAX_GROUP - 1 */
    while (n < N)
        ck_assert_msg(engine_submit(e, &r, &q[n++], &err) == 0, "choice %d: %s", n, err.msg);
    ck_assert_int_eq(engine_submit(e, &r, &q[n], &err), QERR_FULL);
    ck_assert_ptr_null(q[n]);
    r.joins_group = false; /* a new request finds the queue full */
    ck_assert_int_eq(engine_submit(e, &r, &q[n], &err), QERR_FULL);
    ck_assert_ptr_nonnull(strstr(err.msg, "queue is full"));
    /* the engine thread publishes what it took in */
    POLL_UNTIL(engine_get_stats(e, &st), st.waiting == N - 1);
    ck_assert_int_eq(st.waiting, N - 1);
    ck_assert_int_eq(st.running, 1);
    for (int i = 0; i < N; i++) {
        request_abort(q[i]);
        request_release(q[i]);
    }
    wait_idle(e, &st);
    ck_assert_int_eq(st.running, 0);
    ck_assert_int_eq(st.waiting, 0);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    engine_free(e);
}
END_TEST

/* The live picture (engine_state.h) against the engine's own counts, on a state that holds
 * still: two requests paused by their unread events (max_seqs 2), a third waiting; then, all
 * aborted, an idle picture with every block free and the prompts' full blocks cached. */
START_TEST(state_picture_matches_engine)
{
    struct engine *e = make_pausing_engine(0);
    struct engine_state *st = malloc(sizeof *st);
    ck_assert_ptr_nonnull(st);
    engine_get_state(e, st);
    ck_assert_uint_ge(st->version, 1); /* published at create */
    ck_assert_int_eq(st->kv_blocks, 64);
    ck_assert_int_eq(st->n_cells, 64);
    ck_assert_int_eq(st->n_reqs, 0);

    struct request *q[3];
    struct gen_request r;
    for (int i = 0; i < 3; i++) {
        greedy_request(&r, text_ids + 100 * i, 40, 40);
        q[i] = submit(e, &r);
    }
    int paused = 0;
    POLL_UNTIL(
        {
            engine_get_state(e, st);
            paused = 0;
            for (int j = 0; j < st->n_reqs; j++) paused += st->reqs[j].paused;
        },
        paused >= 2);
    ck_assert_int_eq(paused, 2);
    ck_assert_int_eq(st->n_running, 2);
    ck_assert_int_eq(st->n_waiting, 1);
    ck_assert_int_eq(st->n_reqs, 3);
    int blocks = 0, used_cells = 0;
    for (int j = 0; j < 2; j++) {
        ck_assert_int_eq(st->reqs[j].phase, ENGINE_REQ_DECODE);
        ck_assert_int_eq(st->reqs[j].prompt_tokens, 40);
        ck_assert_int_ge(st->reqs[j].generated_tokens, 4);
        blocks += st->reqs[j].blocks;
    }
    ck_assert_int_eq(st->reqs[2].phase, ENGINE_REQ_WAITING);
    ck_assert_uint_eq(st->reqs[2].id, 3);
    for (int c = 0; c < st->n_cells; c++) used_cells += st->cells[c] == KV_CELL_USED;
    ck_assert_int_eq(used_cells, blocks);
    ck_assert_int_eq(st->kv_used, blocks);
    /* every step recorded: the ring ends at the engine's step count, history holds its tokens */
    ck_assert_int_gt(st->n_steps, 0);
    ck_assert_uint_eq(st->steps[st->n_steps - 1].step, st->stats.steps);
    ck_assert_uint_eq(st->cost_steps, st->stats.steps);
    uint64_t gen = 0, prompt = 0, ttft_n = 0;
    for (int i = 0; i < ENGINE_STATE_HISTORY; i++) {
        gen += st->history[i].generated;
        prompt += st->history[i].prompt;
        ttft_n += st->history[i].ttft_n;
    }
    ck_assert_uint_eq(gen, st->stats.generation_tokens);
    ck_assert_uint_eq(prompt, 80);
    ck_assert_uint_eq(ttft_n, 2);
    /* measured: the average spreads the publications (also those of idle wake-ups while every
     * sequence is paused) over the steps that ran, so it may pass the largest single cost */
    ck_assert(st->step_cost_ns_avg > 0 && st->step_cost_ns_max > 0 && st->publish_ns_max > 0);

    for (int i = 0; i < 3; i++) {
        request_abort(q[i]);
        request_release(q[i]);
    }
    POLL_UNTIL(engine_get_state(e, st),
               st->n_running == 0 && st->n_waiting == 0 && st->kv_used == 0);
    ck_assert_int_eq(st->n_reqs, 0);
    ck_assert_int_eq(st->kv_used, 0);
    /* the two prompts' 2 full blocks each stay cached, free */
    ck_assert_int_eq(st->kv_cached_free, 4);
    for (int c = 0; c < st->n_cells; c++) ck_assert_int_ne(st->cells[c], KV_CELL_USED);
    uint64_t v = st->version;
    engine_free(e);
    ck_assert_uint_gt(v, 2);
    free(st);
}
END_TEST

/* The pool alone under thousands of random operations, checked after every one. */
START_TEST(pool_invariants_random)
{
    enum { BLOCKS = 48, BS = 4, SEQS = 12, MAXB = 16 };
    struct kv_pool *p;
    struct qerr err = {0};
    ck_assert_int_eq(kv_pool_create(BLOCKS, BS, &p, &err), 0);
    int table[SEQS][MAXB], nb[SEQS] = {0};
    uint64_t key[SEQS] = {0};
    int32_t toks[SEQS][MAXB * BS];
    uint64_t rng = 42;
    for (int step = 0; step < 20000; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int s = (int)((rng >> 33) % SEQS), op = (int)((rng >> 20) % 4);
        if (op <= 1 && nb[s] < MAXB) { /* grow: cached prefix first, else a new block */
            int32_t *t = toks[s] + nb[s] * BS;
            for (int i = 0; i < BS; i++) t[i] = (int32_t)((rng >> (i * 3)) % 3); /* few distinct */
            int b = kv_prefix_lookup(p, key[s], t);
            if (b < 0) b = kv_block_alloc(p);
            if (b >= 0) {
                table[s][nb[s]++] = b;
                key[s] = kv_prefix_insert(p, b, key[s], t);
            }
        } else { /* finish, abort or preempt: release everything */
            for (int i = 0; i < nb[s]; i++) kv_block_release(p, table[s][i]);
            nb[s] = 0;
            key[s] = 0;
        }
        ck_assert_msg(kv_pool_check(p, &err) == 0, "step %d: %s", step, err.msg);
        /* ref counts equal the number of table references */
        int refs[BLOCKS] = {0};
        for (int q = 0; q < SEQS; q++)
            for (int i = 0; i < nb[q]; i++) refs[table[q][i]]++;
        for (int b = 0; b < BLOCKS; b++) ck_assert_int_eq(kv_block_ref(p, b), refs[b]);
    }
    for (int q = 0; q < SEQS; q++)
        for (int i = 0; i < nb[q]; i++) kv_block_release(p, table[q][i]);
    ck_assert_int_eq(kv_pool_free_count(p), BLOCKS);
    ck_assert_int_eq(kv_pool_check(p, &err), 0);
    kv_pool_free(p);
}
END_TEST

/* The engine under random submits, aborts and releases with a tiny pool: every request ends,
 * nothing leaks, the pool is whole at the end. */
START_TEST(engine_random_workload)
{
    struct engine *e = make_engine(48, 6, 24, true);
    uint64_t rng = 7;
    struct request *live[32] = {0};
    int steps = tu_tsan() ? 24 : tu_sanitized() ? 40 : 200;
    /* prompts and outputs up to these lengths (shorter under ThreadSanitizer: the same
     * interleavings of submit, abort and release with the engine thread, fewer tokens) */
    uint64_t max_prompt = tu_tsan() ? 24 : 150, max_out = tu_tsan() ? 6 : 24;
    for (int it = 0; it < steps; it++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int slot = (int)((rng >> 33) % 32), op = (int)((rng >> 13) % 5);
        if (!live[slot]) {
            struct gen_request r;
            size_t off = (size_t)((rng >> 7) % 64) * 16; /* shared prefixes happen often */
            greedy_request(&r, text_ids + off, 1 + (size_t)((rng >> 17) % max_prompt),
                           1 + (int)((rng >> 27) % max_out));
            struct qerr err = {0};
            int rc = engine_submit(e, &r, &live[slot], &err);
            ck_assert(rc == 0 || rc == QERR_FULL);
        } else if (op == 0) {
            request_abort(live[slot]);
        } else if (op == 1) {
            request_release(live[slot]);
            live[slot] = NULL;
        } else {
            struct req_event ev;
            if (request_next(live[slot], &ev, 5) == 0 && ev.done) {
                request_release(live[slot]);
                live[slot] = NULL;
            }
        }
    }
    for (int i = 0; i < 32; i++)
        if (live[i]) {
            struct req_event ev;
            do ck_assert_int_eq(request_next(live[i], &ev, 120000), 0);
            while (!ev.done);
            request_release(live[i]);
        }
    struct engine_stats st;
    wait_idle(e, &st);
    ck_assert_int_eq(st.running, 0);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    printf("random workload: %llu steps, %llu preemptions, prefix hits %llu tokens\n",
           (unsigned long long)st.steps, (unsigned long long)st.preemptions,
           (unsigned long long)st.prefix_hit_tokens);
    engine_free(e);
}
END_TEST

/* Constrained requests (greedy and seeded, beside unconstrained ones, speculation on in one
 * run) give the same bytes whichever way the token masks are computed: before each sampling,
 * on the engine thread once the forward is issued, or on a helper thread beside it. */
START_TEST(grammar_masks_same_in_every_mode)
{
    static const char schema[] =
        "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":40},"
        "\"year\":{\"type\":\"integer\",\"minimum\":1900},\"tags\":{\"type\":\"array\",\"items\":{"
        "\"enum\":[\"gnu\",\"free\",\"license\"]}}},\"required\":[\"title\",\"year\",\"tags\"]}";
    static const char regex[] = "[a-z ,.]{10,60}";
    enum { MAX_N = 6, MODES = 3 };
    /* smaller under a sanitizer, where each token costs some 10x more */
    int N = tu_sanitized() ? 3 : MAX_N, max_tokens = tu_sanitized() ? 12 : 24;
    static const enum engine_mask_mode modes[MODES] = {ENGINE_MASK_AFTER, ENGINE_MASK_LAUNCH,
                                                       ENGINE_MASK_THREAD};
    static struct result out[MODES][MAX_N];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int m = 0; m < MODES; m++) {
        struct engine_opts o;
        engine_opts_default(&o);
        o.max_batch_tokens = 256;
        o.max_seqs = 8;
        o.kv_blocks = 256;
        o.mask_mode = modes[m];
        if (m == 2) o.spec = SPEC_NGRAM; /* later positions of a draft: masked at sampling */
        struct engine *e;
        struct qerr err = {0};
        ck_assert_msg(engine_create(file, tok, be, &o, &e, &err) == 0, "%s", err.msg);
        struct request *q[MAX_N];
        for (int i = 0; i < N; i++) {
            struct gen_request r;
            greedy_request(&r, text_ids + 300 + 40 * i, (size_t)(20 + 7 * i), max_tokens);
            r.ignore_eos = false;
            if (i % 2) {
                r.sample.temperature = 0.8f;
                r.sample.seed = (uint64_t)(10 + i);
            }
            struct grammar *g = NULL;
            if (i < 4) {
                bool js = i % 3 == 0;
                ck_assert_msg(engine_grammar(e, js ? GRAMMAR_JSON_SCHEMA : GRAMMAR_REGEX,
                                             js ? schema : regex, strlen(js ? schema : regex), &g,
                                             &err) == 0,
                              "%s", err.msg);
            }
            r.grammar = g;
            q[i] = submit(e, &r);
            grammar_unref(g);
        }
        for (int i = 0; i < N; i++) collect(q[i], &out[m][i]);
        struct engine_stats st;
        engine_get_stats(e, &st);
        ck_assert_uint_gt(st.grammar_masks, 0);
        engine_free(e);
        for (int i = 0; i < N; i++) {
            ck_assert_msg(out[m][i].final.finish != FINISH_ERROR, "mode %d request %d: %s", m, i,
                          out[m][i].final.error);
            ck_assert_msg(out[m][i].text_len == out[0][i].text_len &&
                              !memcmp(out[m][i].text, out[0][i].text, out[0][i].text_len),
                          "mode %d request %d: '%.*s' != '%.*s'", m, i, (int)out[m][i].text_len,
                          out[m][i].text, (int)out[0][i].text_len, out[0][i].text);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("grammar masks: %d requests give the same bytes in every mask mode ('%.*s'), %.1f s\n",
           N, (int)out[0][0].text_len, out[0][0].text,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}
END_TEST

/* vLLM's priority: with one sequence running, a later request of a lower value is admitted
 * before an earlier one (whose wait then spans the other's whole run); when the pool runs dry
 * the running sequence of the higher value is preempted even though it is the older one. */
START_TEST(priority_orders_admission_and_preemption)
{
    bool san = tu_sanitized();
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = 64;
    o.max_seqs = 1;
    o.kv_blocks = 64;
    o.check_invariants = true; /* the queue and the running list in priority order */
    struct engine *e = make_engine_opts(&o);
    struct gen_request r;
    greedy_request(&r, text_ids, 8, san ? 12 : 32);
    struct request *qa = submit(e, &r);
    greedy_request(&r, text_ids + 100, 8, 4);
    struct request *qb = submit(e, &r); /* priority 0 */
    r.priority = -1;
    struct request *qc = submit(e, &r);
    static struct result a, b, c;
    collect(qa, &a);
    collect(qb, &b);
    collect(qc, &c);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    engine_free(e);
    printf("priority: b waited %.1f ms, c (priority -1, submitted after b) %.1f ms of %.1f\n",
           b.final.queue_ms, c.final.queue_ms, c.final.total_ms);
    ck_assert_int_eq(b.n, 4);
    ck_assert_int_eq(c.n, 4);
    ck_assert_msg(b.final.queue_ms > c.final.total_ms,
                  "b was admitted after c had finished: waited %.1f ms, c took %.1f ms in all",
                  b.final.queue_ms, c.final.total_ms);

    /* two sequences growing in a pool that holds one to its end */
    o.max_seqs = 2;
    o.kv_blocks = 6;
    e = make_engine_opts(&o);
    greedy_request(&r, text_ids + 200, 16, 40);
    r.priority = 5;
    struct request *ql = submit(e, &r);
    greedy_request(&r, text_ids + 300, 16, 40);
    struct request *qh = submit(e, &r);
    static struct result lo, hi;
    collect(ql, &lo);
    collect(qh, &hi);
    struct engine_stats st;
    wait_idle(e, &st);
    ck_assert_msg(!e->check_error[0], "%s", e->check_error);
    engine_free(e);
    printf("priority: %llu preemptions, priority 5 preempted %d times, priority 0 %d\n",
           (unsigned long long)st.preemptions, lo.final.preemptions, hi.final.preemptions);
    ck_assert_int_eq(lo.n, 40);
    ck_assert_int_eq(hi.n, 40);
    ck_assert_uint_gt(st.preemptions, 0);
    ck_assert_int_eq(hi.final.preemptions, 0);
    ck_assert_int_eq((uint64_t)lo.final.preemptions, st.preemptions);
}
END_TEST

int main(void)
{
    tu_model_path();
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 900);
    tcase_add_unchecked_fixture(tc, setup_once, teardown_once);
    const TTest *tests[] = {
        pool_invariants_random,           a_request_of_many_choices_takes_one_queue_place,
        state_picture_matches_engine,     aborts_and_limits,
        back_pressure_and_after_free,     stop_string_across_tokens,
        prefix_cache_reuses_blocks,       seeded_sampling_same_in_busy_batch,
        engine_random_workload,           batched_equals_sequential,
        q8_kv_batched_equals_alone,       prompt_outputs_batched_equal_alone,
        grammar_masks_same_in_every_mode, priority_orders_admission_and_preemption};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (tu_selected(tests[i]->name)) tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
