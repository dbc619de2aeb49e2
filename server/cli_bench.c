/* quern bench: offline throughput and latency.
 *
 *   quern bench --model M --requests N --input-len L --output-len O [--concurrency C]
 *     runs the engine on N synthetic prompts (random token ids, seeded) with C clients each
 *     keeping one request in flight, and reports requests/s, prompt and output tokens/s, TTFT and
 *     time-per-output-token percentiles, peak KV blocks, preemptions and the prefix-cache hit
 *     rate (the figures vLLM's benchmark_serving prints).
 *   quern bench --model M --embeddings [--requests 64] [--input-len 128] [--concurrency C]
 *     the same driver with pooled (embedding) requests, all in flight by default as one
 *     /v1/embeddings request's inputs are: embeddings/s, prompt tokens/s, latency percentiles.
 *   quern bench --model M --pp 512 --tg 128 [--reps R]
 *     measures prompt processing and generation of one sequence the way llama-bench does:
 *     pp = a P-token prompt up to its first token, tg = T decode steps after a 1-token prompt.
 *   quern bench --model M --decode-batches 1,8,64 [--pp CTX] [--tg STEPS]
 *     B sequences with CTX-token contexts decoding together through the model's forward
 *     (engine/bench_decode.h): ms per step, tokens/s and the bytes a step must read. */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine/bench_ceiling.h"
#include "../engine/bench_decode.h"
#include "../engine/bench_kernels.h"
#include "../engine/bench_profile.h"
#include "../engine/bench_util.h"
#include "../engine/engine.h"
#include "../engine/generate.h"
#include "../engine/synth.h"
#include "../engine/trace.h"
#include "../kernels/backend_profile.h"
#include "../kernels/cpu/backend_cpu.h"
#include "cli.h"

static void bench_usage(FILE *out)
{
    fprintf(out,
            "usage: quern bench [--model PATH] --requests N --input-len L --output-len O\n"
            "                   [--concurrency C] [options]\n"
            "       quern bench [--model PATH] --embeddings [--requests 64] [--input-len 128]\n"
            "                   [--concurrency C] (embeddings/s; C default: all at once)\n"
            "       quern bench [--model PATH] --pp P --tg T [--reps R] [options]\n"
            "       quern bench [--model PATH] --decode-batches 1,8,64 [--pp CTX] [--tg STEPS]\n"
            "                   (B sequences decoding together; context 128, 16 steps default)\n"
            "       quern bench --kernels [--threads N] [--precision f32|q8|both]\n"
            "                   [--isa scalar|avx2|avxvnni|avx512|amx] [--batches 1,8,64,512]\n"
            "                   [--model M [--pp P] [--tg T]]\n"
            "                   (per-kernel GB/s and GFLOP/s against bandwidth and peak; the\n"
            "                   model's own matmul shapes and types with --model)\n"
            "  --threads N           CPU threads (default: all)\n"
            "  --precision P         auto (default: q8 on the CPU, f32 on CUDA, as serve), f32\n"
            "                        or q8; --kernels: f32, q8 or both (default f32)\n"
            "  --device D            auto (default: a usable GPU, else the CPU), cpu, cuda,\n"
            "                        cuda:N\n" CLI_TP_HELP CLI_BATCH_INVARIANT_HELP CLI_KNOBS_HELP
            "  --synthetic NAME      instead of --model: random weights of a real shape, made\n"
            "                        here (llama3-8b, llama2-7b, smollm2-135m)\n"
            "  --type T              the synthetic weights' type: q4_0 (default), q4_1, q8_0,\n"
            "                        f16\n"
            "  --write-model PATH    with --synthetic: write that model's GGUF to PATH and\n"
            "                        stop (a file for llama-bench beside quern)\n"
            "  --max-batch-tokens N  engine step budget (default 2048)\n"
            "  --max-seqs N          running sequences (default 64)\n"
            "  --kv-mem MIB          KV pool size in MiB (default 1024)\n"
            "  --seed S              prompt generator seed (default 1)\n"
            "  --json                print one JSON object instead of a table\n"
            "  --profile             with --pp/--tg: then one prefill and T decode steps with\n"
            "                        every op timed: a per-op table of each (docs/profiling.md);\n"
            "                        with --decode-batches: each batch's steps, every op timed\n"
            "  --trace FILE          with --requests: write the engine's steps and requests as a\n"
            "                        Chrome trace (Perfetto, chrome://tracing)\n"
            "  --grounded FILE       with --requests: prompts from FILE's text, each a passage\n"
            "                        then its first 16 tokens again, so the output copies the\n"
            "                        input (what prompt lookup speculation is for); default:\n"
            "                        random tokens, which nothing matches\n"
            "  --temp T              with --requests: sample at temperature T, request i with\n"
            "                        seed i (default 0: greedy)\n"
            "  with --requests:\n" CLI_SPEC_HELP CLI_LORA_HELP
            "                    request i runs with adapter i mod (the number given)\n");
}

struct bench_args {
    const char *model, *synthetic;
    const char *write_model; /* --synthetic's file, written there instead of a benchmark */
    const char *trace_path;  /* --trace */
    enum qtype synth_type;
    long requests, input_len, output_len, concurrency, threads, pp, tg, reps, batch, seqs, kv_mib,
        seed;
    bool json, profile;
    bool embeddings;      /* --embeddings: pooled requests (mean), no output */
    bool concurrency_set; /* --concurrency given */
    struct cli_backend_args be;
    struct cli_spec spec;             /* --spec, --spec-k */
    struct cli_loras lora;            /* --lora: request i runs with adapter i mod lora.n */
    const char *grounded;             /* --grounded FILE */
    double temp;                      /* --temp: serving runs' temperature (0: greedy) */
    int decode_batches[16], n_decode; /* --decode-batches */
    const struct backend_group *grp;  /* the ranks' backends and communicators */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[n]. */
static double pct(const double *v, int n, double p)
{
    if (n == 0) return 0;
    int k = (int)ceil(p / 100.0 * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

struct client_ctx {
    struct engine *e;
    const struct bench_args *a;
    int32_t *prompts; /* [requests][input_len] */
    pthread_mutex_t *mu;
    long *next;
    double *ttft, *tpot;
    long *done, *failed, *out_tokens;
};

static void *client_main(void *arg)
{
    struct client_ctx *c = arg;
    for (;;) {
        pthread_mutex_lock(c->mu);
        long i = (*c->next)++;
        pthread_mutex_unlock(c->mu);
        if (i >= c->a->requests) return NULL;
        struct gen_request r = {0};
        r.prompt = c->prompts + i * c->a->input_len;
        r.n_prompt = (size_t)c->a->input_len;
        sample_params_default(&r.sample);
        r.sample.temperature = (float)c->a->temp;
        r.sample.seed = (uint64_t)i; /* request i samples the same text in every run */
        r.max_tokens = c->a->embeddings ? 0 : (int)c->a->output_len;
        r.pooling = c->a->embeddings ? ENGINE_POOL_MEAN : ENGINE_POOL_NONE;
        r.ignore_eos = true;
        r.top_logprobs = -1;
        r.lora = c->a->lora.n ? (int)(i % c->a->lora.n) + 1 : 0;
        struct request *q;
        struct qerr err = {0};
        int rc = engine_submit(c->e, &r, &q, &err);
        while (rc == QERR_FULL) { /* more clients than queue slots: wait and retry */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            rc = engine_submit(c->e, &r, &q, &err);
        }
        struct req_event ev = {0};
        int dim = 0;
        if (!rc) {
            do request_next(q, &ev, -1);
            while (!ev.done);
            if (c->a->embeddings && !request_embedding(q, &dim)) ev.finish = FINISH_ERROR;
            request_release(q);
        }
        pthread_mutex_lock(c->mu);
        if (rc || ev.finish == FINISH_ERROR) {
            (*c->failed)++;
        } else {
            long k = (*c->done)++;
            /* an embedding has no first token: its latency stands in */
            c->ttft[k] = c->a->embeddings ? ev.total_ms : ev.ttft_ms;
            c->tpot[k] = ev.completion_tokens > 1
                             ? (ev.total_ms - ev.ttft_ms) / (ev.completion_tokens - 1)
                             : 0;
            *c->out_tokens += ev.completion_tokens;
        }
        pthread_mutex_unlock(c->mu);
    }
}

/* --grounded: request i's prompt is a passage of the file's text (from a place of its own) and
 * then the passage's first 16 tokens again, input_len tokens in all. */
static int grounded_prompts(const struct tokenizer *tok, const struct bench_args *a,
                            int32_t *prompts, struct qerr *err)
{
    FILE *fp = fopen(a->grounded, "rb");
    if (!fp) return qerr_set(err, QERR_IO, "--grounded %s: cannot open it", a->grounded);
    char *text = malloc(1 << 20);
    size_t len = text ? fread(text, 1, 1 << 20, fp) : 0;
    fclose(fp);
    if (!text) return qerr_set(err, QERR_NOMEM, "bench: out of memory");
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = tokenizer_encode(tok, text, len, false, false, &ids, &n_ids, err);
    free(text);
    if (rc) return qerr_wrap(err, "--grounded %s", a->grounded);
    size_t body = (size_t)a->input_len > 16 ? (size_t)a->input_len - 16 : 0;
    if (body < 16 || n_ids < body + 1) {
        free(ids);
        return qerr_set(err, QERR_INVALID,
                        "--grounded %s: %zu tokens; --input-len %ld needs more than %zu and "
                        "at least 32",
                        a->grounded, n_ids, a->input_len, body);
    }
    for (long i = 0; i < a->requests; i++) {
        int32_t *p = prompts + (size_t)i * (size_t)a->input_len;
        size_t off = (size_t)i * 997 % (n_ids - body);
        memcpy(p, ids + off, body * sizeof *p);
        memcpy(p + body, ids + off, 16 * sizeof *p);
    }
    free(ids);
    return 0;
}

static int run_serving(const struct gguf_file *f, const struct tokenizer *tok, struct backend *be,
                       const struct bench_args *a, struct qerr *err)
{
    struct engine_opts o;
    engine_opts_default(&o);
    o.max_batch_tokens = (int)a->batch;
    o.max_seqs = (int)a->seqs;
    o.kv_mem = (size_t)a->kv_mib << 20;
    o.max_queue = (int)(a->requests + a->concurrency);
    o.prefix_cache = true;
    o.spec = a->spec.mode;
    o.draft_file = a->spec.draft_file;
    if (a->spec.k) o.spec_k = a->spec.k;
    if (a->spec.step_tokens) o.spec_step_tokens = a->spec.step_tokens;
    o.spec_policy = a->spec.policy;
    if (a->spec.history_set) o.spec_history = a->spec.history;
    o.tp = a->grp->n;
    o.tp_backends = a->grp->be;
    o.tp_comms = a->grp->comm;
    o.rope_freq_base = a->be.knobs.rope_freq_base;
    o.rope_scale = a->be.knobs.rope_scale;
    o.loras = a->lora.specs; /* named by cli_lora_specs after the arguments */
    o.n_loras = a->lora.n;
    struct trace *tr = NULL;
    int rc =
        a->trace_path ? trace_create(TRACE_DEFAULT_STEPS, TRACE_DEFAULT_REQUESTS, &tr, err) : 0;
    if (rc) return rc;
    o.trace = tr;
    struct engine *e;
    if ((rc = engine_create(f, tok, be, &o, &e, err))) {
        trace_free(tr);
        return rc;
    }
    int vocab = engine_model_config(e)->vocab;
    size_t n = (size_t)a->requests * (size_t)a->input_len;
    int32_t *prompts = malloc(n * sizeof *prompts);
    double *ttft = calloc((size_t)a->requests, sizeof *ttft);
    double *tpot = calloc((size_t)a->requests, sizeof *tpot);
    pthread_t *th = calloc((size_t)a->concurrency, sizeof *th);
    if (!prompts || !ttft || !tpot || !th) {
        rc = qerr_set(err, QERR_NOMEM, "bench: out of memory");
        goto out;
    }
    uint64_t x = (uint64_t)a->seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* ids above the special tokens, so prompts are ordinary text pieces */
        prompts[i] = 100 + (int32_t)(x % (uint64_t)(vocab - 100));
    }
    if (a->grounded && (rc = grounded_prompts(tok, a, prompts, err))) goto out;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    long next = 0, done = 0, failed = 0, out_tokens = 0;
    struct client_ctx c = {e, a, prompts, &mu, &next, ttft, tpot, &done, &failed, &out_tokens};
    double t0 = now_s();
    for (long i = 0; i < a->concurrency; i++) pthread_create(&th[i], NULL, client_main, &c);
    for (long i = 0; i < a->concurrency; i++) pthread_join(th[i], NULL);
    double wall = now_s() - t0;
    struct engine_stats st;
    /* the last request's final event comes before the engine publishes that step's counters */
    for (int i = 0; i < 1000; i++) {
        engine_get_stats(e, &st);
        if (st.running == 0 && st.waiting == 0) break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    int trace_rc = tr ? trace_write(tr, a->trace_path, &st, err) : 0;
    qsort(ttft, (size_t)done, sizeof *ttft, cmp_double);
    qsort(tpot, (size_t)done, sizeof *tpot, cmp_double);
    double rps = (double)done / wall, in_tps = (double)done * (double)a->input_len / wall,
           out_tps = (double)out_tokens / wall;
    double hit = st.prefix_lookups ? (double)st.prefix_hit_tokens / (double)st.prefix_lookups : 0;
    double accept_len =
        st.spec_drafts ? 1.0 + (double)st.spec_accepted_tokens / (double)st.spec_drafts : 0;
    if (a->embeddings) {
        if (a->json)
            printf("{\"embeddings\": %ld, \"failed\": %ld, \"concurrency\": %ld, "
                   "\"input_len\": %ld, \"duration_s\": %.3f, \"embeddings_per_s\": %.2f, "
                   "\"prompt_tokens_per_s\": %.1f, \"latency_ms_p50\": %.1f, "
                   "\"latency_ms_p99\": %.1f, \"steps\": %llu}\n",
                   done, failed, a->concurrency, a->input_len, wall, rps, in_tps,
                   pct(ttft, (int)done, 50), pct(ttft, (int)done, 99),
                   (unsigned long long)st.steps);
        else
            printf("embeddings        %ld done, %ld failed, concurrency %ld (input %ld tokens)\n"
                   "duration          %.2f s\n"
                   "embeddings/s      %.2f\n"
                   "prompt tokens/s   %.1f\n"
                   "latency ms        p50 %.1f  p99 %.1f\n"
                   "engine steps      %llu\n",
                   done, failed, a->concurrency, a->input_len, wall, rps, in_tps,
                   pct(ttft, (int)done, 50), pct(ttft, (int)done, 99),
                   (unsigned long long)st.steps);
    } else if (a->json) {
        printf("{\"requests\": %ld, \"failed\": %ld, \"concurrency\": %ld, \"input_len\": %ld, "
               "\"output_len\": %ld, \"duration_s\": %.3f, \"requests_per_s\": %.3f, "
               "\"prompt_tokens_per_s\": %.1f, \"output_tokens_per_s\": %.1f, "
               "\"ttft_ms_p50\": %.1f, \"ttft_ms_p90\": %.1f, \"ttft_ms_p99\": %.1f, "
               "\"tpot_ms_p50\": %.2f, \"tpot_ms_p90\": %.2f, \"tpot_ms_p99\": %.2f, "
               "\"kv_blocks_peak\": %d, \"kv_blocks_total\": %d, \"preemptions\": %llu, "
               "\"prefix_cache_hit_rate\": %.4f, \"steps\": %llu, \"spec\": \"%s\", "
               "\"spec_drafts\": %llu, \"spec_draft_tokens\": %llu, "
               "\"spec_accepted_tokens\": %llu, \"mean_acceptance_length\": %.3f}\n",
               done, failed, a->concurrency, a->input_len, a->output_len, wall, rps, in_tps,
               out_tps, pct(ttft, (int)done, 50), pct(ttft, (int)done, 90),
               pct(ttft, (int)done, 99), pct(tpot, (int)done, 50), pct(tpot, (int)done, 90),
               pct(tpot, (int)done, 99), st.kv_blocks_peak, st.kv_blocks_total,
               (unsigned long long)st.preemptions, hit, (unsigned long long)st.steps,
               spec_mode_name(a->spec.mode), (unsigned long long)st.spec_drafts,
               (unsigned long long)st.spec_draft_tokens,
               (unsigned long long)st.spec_accepted_tokens, accept_len);
    } else {
        printf("requests          %ld done, %ld failed, concurrency %ld (input %ld, output %ld)\n",
               done, failed, a->concurrency, a->input_len, a->output_len);
        printf("duration          %.2f s\n", wall);
        printf("requests/s        %.3f\n", rps);
        printf("prompt tokens/s   %.1f\n", in_tps);
        printf("output tokens/s   %.1f\n", out_tps);
        printf("TTFT ms           p50 %.1f  p90 %.1f  p99 %.1f\n", pct(ttft, (int)done, 50),
               pct(ttft, (int)done, 90), pct(ttft, (int)done, 99));
        printf("TPOT ms           p50 %.2f  p90 %.2f  p99 %.2f\n", pct(tpot, (int)done, 50),
               pct(tpot, (int)done, 90), pct(tpot, (int)done, 99));
        printf("KV blocks peak    %d of %d\n", st.kv_blocks_peak, st.kv_blocks_total);
        printf("preemptions       %llu\n", (unsigned long long)st.preemptions);
        printf("prefix hit rate   %.1f%%\n", hit * 100);
        printf("engine steps      %llu\n", (unsigned long long)st.steps);
        if (a->spec.mode != SPEC_OFF)
            printf("spec %-12s %llu drafts, %llu of %llu tokens accepted, mean acceptance "
                   "length %.2f\n",
                   spec_mode_name(a->spec.mode), (unsigned long long)st.spec_drafts,
                   (unsigned long long)st.spec_accepted_tokens,
                   (unsigned long long)st.spec_draft_tokens, accept_len);
    }
    rc = failed ? qerr_set(err, QERR_INVALID, "bench: %ld requests failed", failed) : trace_rc;
out:
    free(prompts);
    free(ttft);
    free(tpot);
    free(th);
    engine_free(e);
    trace_free(tr);
    return rc;
}

static void mean_sd(const double *v, int n, double *mean, double *sd)
{
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static bool stop_after_first(void *ctx, int32_t t, const float *l)
{
    (void)ctx, (void)t, (void)l;
    return true;
}

static bool parse_batches(const char *text, struct bench_args *a)
{
    a->n_decode = 0;
    int max = (int)(sizeof a->decode_batches / sizeof *a->decode_batches);
    return bench_parse_counts(text, 1, 1024, a->decode_batches, max, &a->n_decode);
}

/* With --profile, *prof wraps be (kernels/backend_profile.h; the caller destroys it before be);
 * otherwise it stays NULL. */
static int profile_wrap(struct backend *be, const struct bench_args *a, struct backend **prof,
                        struct qerr *err)
{
    *prof = NULL;
    if (!a->profile) return 0;
    if (a->grp->n > 1)
        return qerr_set(err, QERR_UNSUPPORTED, "--profile times one rank's ops: not with --tp");
    return backend_profile_create(be, prof, err);
}

/* What --profile's tables hold each op to: on the CPU, the bandwidth and compute peak measured
 * now on the backend's threads and kernels; elsewhere nothing (the columns show "-"). */
static struct bench_ceilings profile_ceilings(struct backend *be, const struct bench_args *a)
{
    struct bench_ceilings c = {0};
    if (!strcmp(be->ops->name, "cpu")) {
        int threads = a->threads > 0 ? (int)a->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        bool fp32 = a->be.precision == MATMUL_F32;
        c.read_gbs = bench_read_bandwidth(threads);
        enum cpu_isa isa = backend_cpu_isa(be); /* the kernels it runs */
        c.peak_gops = bench_compute_peak(fp32, threads, isa);
        c.peak_what = fp32 ? "fp32 FMA" : bench_int8_peak_insn(isa);
    }
    return c;
}

/* --decode-batches: B sequences stepping together (engine/bench_decode.h), one row per B; with
 * --profile, each row is followed by the per-op table of its timed steps. */
static int run_decode_batches(const struct gguf_file *f, struct backend *be,
                              const struct bench_args *a, struct qerr *err)
{
    int maxb = 0, ctx = a->pp > 0 ? (int)a->pp : 128, steps = a->tg > 0 ? (int)a->tg : 16;
    for (int i = 0; i < a->n_decode; i++)
        if (a->decode_batches[i] > maxb) maxb = a->decode_batches[i];
    struct backend *prof = NULL;
    struct bench_ceilings c = {0};
    int prc = profile_wrap(be, a, &prof, err);
    if (prc) return prc;
    if (prof) {
        c = profile_ceilings(be, a);
        be = prof;
    }
    struct model_opts mo;
    bench_decode_model_opts(maxb, ctx, steps, &mo);
    mo.tp = a->grp->n;
    mo.tp_backends = a->grp->be;
    mo.tp_comms = a->grp->comm;
    cli_knobs_model(&a->be.knobs, &mo);
    struct model *m;
    int rc = model_load(f, be, &mo, &m, err);
    if (rc) {
        backend_destroy(prof);
        return rc;
    }
    double wb = model_weight_bytes(m);
    if (a->json)
        printf("{\"context\": %d, \"steps\": %d, \"weight_bytes\": %.0f, \"decode\": [", ctx, steps,
               wb);
    else
        printf("| batch | context | ms/step | tokens/s | MB read/step | prefill s |\n"
               "|---|---|---|---|---|---|\n");
    for (int i = 0; i < a->n_decode && !rc; i++) {
        struct decode_bench r;
        rc = bench_decode_run(m, be, wb, a->decode_batches[i], ctx, steps, (uint64_t)a->seed, prof,
                              &r, err);
        if (rc) break;
        if (a->json)
            printf("%s{\"batch\": %d, \"step_s\": %.6f, \"tokens_per_s\": %.2f, "
                   "\"read_bytes\": %.0f}",
                   i ? ", " : "", r.batch, r.step_s, r.batch / r.step_s, r.read_bytes);
        else
            printf("| %d | %d | %.3f | %.1f | %.1f | %.2f |\n", r.batch, ctx, r.step_s * 1e3,
                   r.batch / r.step_s, r.read_bytes / 1e6, r.prefill_s);
        if (prof && !a->json) {
            char title[96];
            snprintf(title, sizeof title, "decode, batch %d, context %d, %d steps", r.batch, ctx,
                     steps);
            bench_profile_print(stdout, title, prof, r.step_s, steps, &c);
            if (i + 1 < a->n_decode)
                printf("\n| batch | context | ms/step | tokens/s | MB read/step | prefill s |\n"
                       "|---|---|---|---|---|---|\n");
        }
        fflush(stdout);
    }
    if (a->json) printf("]}\n");
    model_free(m);
    backend_destroy(prof);
    return rc;
}

struct first_token_reset {
    struct backend *prof;
    double t0;
};

/* Decode's profile starts at the first generated token: the prompt's prefill is not counted. */
static bool reset_at_first(void *ctx, int32_t t, const float *l)
{
    (void)t;
    (void)l;
    struct first_token_reset *r = ctx;
    if (r->t0 == 0) {
        backend_profile_reset(r->prof);
        r->t0 = now_s();
    }
    return false;
}

/* --profile: one prefill of a->pp tokens and a->tg decode steps, every op timed (prof wraps be),
 * each printed as a per-op table against this machine's ceilings (the CPU's, measured now). */
static int profile_pp_tg(struct model *m, struct backend *prof, struct backend *be,
                         const struct bench_args *a, const int32_t *prompt, struct gen_opts go,
                         struct qerr *err)
{
    struct bench_ceilings c = profile_ceilings(be, a);
    int rc = 0;
    if (a->pp > 0) {
        go.n_predict = 1;
        backend_profile_reset(prof);
        double t0 = now_s();
        rc = generate_run(m, prompt, (size_t)a->pp, &go, stop_after_first, NULL, err);
        int steps = (int)((a->pp + go.prefill_chunk - 1) / go.prefill_chunk);
        char title[96];
        snprintf(title, sizeof title, "prefill of %ld tokens, %d step(s) of up to %d", a->pp, steps,
                 go.prefill_chunk);
        if (!rc) bench_profile_print(stdout, title, prof, (now_s() - t0) / steps, steps, &c);
    }
    if (a->tg > 1 && !rc) {
        struct first_token_reset r = {.prof = prof};
        go.n_predict = (int)a->tg + 1;
        rc = generate_run(m, prompt, 1, &go, reset_at_first, &r, err);
        char title[96];
        snprintf(title, sizeof title, "decode, batch 1, %ld steps", a->tg);
        if (!rc)
            bench_profile_print(stdout, title, prof, (now_s() - r.t0) / (double)a->tg, (int)a->tg,
                                &c);
    }
    return rc;
}

/* The CPU pool's waits over one phase (pp or tg) of the timed reps (kernels/cpu/threadpool.h):
 * how long the calling thread waited at the end of each job for the other threads' last tasks,
 * the tail that equal work split over unequal threads leaves, and how soon workers joined. */
struct phase_pool {
    bool on; /* a CPU backend, one rank (a one-thread pool shares no job: nothing printed) */
    struct pool_stats sum;
    double seconds;
    long steps;
};

static void phase_pool_begin(struct backend *inner, const struct phase_pool *ph)
{
    if (ph->on) backend_cpu_pool_count(inner, true);
}

static void phase_pool_end(struct backend *inner, struct phase_pool *ph, double seconds, long steps)
{
    if (!ph->on) return;
    struct pool_stats s;
    backend_cpu_pool_stats(inner, &s);
    backend_cpu_pool_count(inner, false);
    ph->sum.jobs += s.jobs;
    ph->sum.tasks += s.tasks;
    ph->sum.caller_tasks += s.caller_tasks;
    ph->sum.wait_s += s.wait_s;
    ph->sum.joins += s.joins;
    ph->sum.join_s += s.join_s;
    ph->seconds += seconds;
    ph->steps += steps;
}

static void phase_pool_print(const char *test, long n, const struct phase_pool *ph)
{
    const struct pool_stats *s = &ph->sum;
    if (!ph->on || ph->steps <= 0 || s->jobs <= 0 || ph->seconds <= 0) return;
    printf("pool, %s%ld: %.1f jobs a step; the caller ran %.1f %% of their tasks, then waited "
           "for the other threads' last ones %.1f %% of the time (%.0f us a step); a worker "
           "took its first task of a job %.2f us after it was published (mean of %ld)\n",
           test, n, (double)s->jobs / (double)ph->steps,
           100.0 * (double)s->caller_tasks / (double)(s->tasks > 0 ? s->tasks : 1),
           100.0 * s->wait_s / ph->seconds, s->wait_s / (double)ph->steps * 1e6,
           s->joins > 0 ? s->join_s / (double)s->joins * 1e6 : 0.0, s->joins);
}

static int run_pp_tg(const struct gguf_file *f, struct backend *be, const struct bench_args *a,
                     struct qerr *err)
{
    struct backend *prof = NULL, *inner = be;
    int prc = profile_wrap(be, a, &prof, err);
    if (prc) return prc;
    if (prof) be = prof;
    int bs = 16;
    long total = (a->pp > a->tg ? a->pp : a->tg) + 2;
    struct model_opts mo = {.max_batch_tokens = (int)(a->batch < a->pp ? a->batch : a->pp),
                            .max_logits = 1,
                            .kv_blocks = (int)((total + bs - 1) / bs),
                            .kv_block_size = bs,
                            .tp = a->grp->n,
                            .tp_backends = a->grp->be,
                            .tp_comms = a->grp->comm};
    cli_knobs_model(&a->be.knobs, &mo);
    if (mo.max_batch_tokens < 1) mo.max_batch_tokens = 1;
    struct model *m;
    int rc = model_load(f, be, &mo, &m, err);
    if (rc) {
        backend_destroy(prof);
        return rc;
    }
    int vocab = model_get_config(m)->vocab;
    int32_t *prompt = malloc((size_t)(a->pp > 0 ? a->pp : 1) * sizeof *prompt);
    double *pp = calloc((size_t)a->reps, sizeof *pp), *tg = calloc((size_t)a->reps, sizeof *tg);
    if (!prompt || !pp || !tg) {
        rc = qerr_set(err, QERR_NOMEM, "bench: out of memory");
        goto out;
    }
    uint64_t x = (uint64_t)a->seed | 1;
    for (long i = 0; i < (a->pp > 0 ? a->pp : 1); i++) { /* tg alone still needs prompt[0] */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = 100 + (int32_t)(x % (uint64_t)(vocab - 100));
    }
    struct gen_opts go = {.prefill_chunk = mo.max_batch_tokens};
    sample_params_default(&go.sample);
    go.sample.temperature = 0;
    bool pool_on = !strcmp(inner->ops->name, "cpu") && a->grp->n == 1;
    struct phase_pool pp_pool = {.on = pool_on}, tg_pool = {.on = pool_on};
    for (long r = -1; r < a->reps && !rc; r++) { /* r = -1 warms up */
        if (a->pp > 0) {
            go.n_predict = 1;
            if (r >= 0) phase_pool_begin(inner, &pp_pool);
            double t0 = now_s();
            rc = generate_run(m, prompt, (size_t)a->pp, &go, stop_after_first, NULL, err);
            double dt = now_s() - t0;
            if (r >= 0) {
                pp[r] = (double)a->pp / dt;
                phase_pool_end(inner, &pp_pool, dt,
                               (a->pp + go.prefill_chunk - 1) / go.prefill_chunk);
            }
        }
        if (a->tg > 0 && !rc) {
            go.n_predict = (int)a->tg + 1; /* the first token comes from the 1-token prompt */
            if (r >= 0) phase_pool_begin(inner, &tg_pool);
            double t0 = now_s();
            rc = generate_run(m, prompt, 1, &go, NULL, NULL, err);
            double dt = now_s() - t0;
            if (r >= 0) {
                tg[r] = (double)(a->tg + 1) / dt;
                phase_pool_end(inner, &tg_pool, dt, a->tg + 1);
            }
        }
    }
    if (!rc) {
        double ppm, pps, tgm, tgs;
        mean_sd(pp, (int)a->reps, &ppm, &pps);
        mean_sd(tg, (int)a->reps, &tgm, &tgs);
        if (a->json)
            printf("{\"pp\": %ld, \"tg\": %ld, \"reps\": %ld, \"threads\": %ld, "
                   "\"pp_tokens_per_s\": %.2f, \"pp_sd\": %.2f, \"tg_tokens_per_s\": %.2f, "
                   "\"tg_sd\": %.2f}\n",
                   a->pp, a->tg, a->reps, a->threads, ppm, pps, tgm, tgs);
        else {
            printf("| test | t/s |\n|---|---|\n");
            if (a->pp > 0) printf("| pp%ld | %.2f ± %.2f |\n", a->pp, ppm, pps);
            if (a->tg > 0) printf("| tg%ld | %.2f ± %.2f |\n", a->tg, tgm, tgs);
            phase_pool_print("pp", a->pp, &pp_pool);
            phase_pool_print("tg", a->tg, &tg_pool);
        }
    }
    if (!rc && prof) rc = profile_pp_tg(m, prof, inner, a, prompt, go, err);
out:
    free(prompt);
    free(pp);
    free(tg);
    model_free(m);
    backend_destroy(prof);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    /* --kernels: the CPU kernel benchmark (engine/bench_kernels.c) takes every other option */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--kernels")) {
            for (int j = i; j + 1 < argc; j++) argv[j] = argv[j + 1];
            return bench_kernels_main(argc - 1, argv);
        }
    enum {
        O_REQ = 256,
        O_IN,
        O_OUT,
        O_CONC,
        O_THREADS,
        O_PP,
        O_TG,
        O_REPS,
        O_BATCH,
        O_SEQS,
        O_KV,
        O_SEED,
        O_JSON,
        O_TRACE,
        O_SYNTH,
        O_WRITE,
        O_TYPE,
        O_DECODE,
        O_PROFILE,
        O_EMBED,
        O_GROUNDED,
        O_TEMP
    };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"requests", required_argument, 0, O_REQ},
                                         {"input-len", required_argument, 0, O_IN},
                                         {"output-len", required_argument, 0, O_OUT},
                                         {"concurrency", required_argument, 0, O_CONC},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"pp", required_argument, 0, O_PP},
                                         {"tg", required_argument, 0, O_TG},
                                         {"reps", required_argument, 0, O_REPS},
                                         {"max-batch-tokens", required_argument, 0, O_BATCH},
                                         {"max-seqs", required_argument, 0, O_SEQS},
                                         {"kv-mem", required_argument, 0, O_KV},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"json", no_argument, 0, O_JSON},
                                         {"profile", no_argument, 0, O_PROFILE},
                                         {"embeddings", no_argument, 0, O_EMBED},
                                         {"trace", required_argument, 0, O_TRACE},
                                         {"synthetic", required_argument, 0, O_SYNTH},
                                         {"type", required_argument, 0, O_TYPE},
                                         {"write-model", required_argument, 0, O_WRITE},
                                         {"decode-batches", required_argument, 0, O_DECODE},
                                         CLI_BACKEND_OPTIONS,
                                         CLI_SPEC_OPTIONS,
                                         CLI_LORA_OPTIONS,
                                         {"grounded", required_argument, 0, O_GROUNDED},
                                         {"temp", required_argument, 0, O_TEMP},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct bench_args a = {.concurrency = 1,
                           .reps = 5,
                           .batch = 2048,
                           .seqs = 64,
                           .kv_mib = 1024,
                           .seed = 1,
                           .be.precision = MATMUL_AUTO,
                           .synth_type = QTYPE_Q4_0,
                           .requests = -1,
                           .input_len = -1,
                           .output_len = -1,
                           .pp = -1,
                           .tg = -1};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        long *dst = NULL, lo = 1, hi = 1000000;
        switch (c) {
        case 'm':
            a.model = optarg;
            continue;
        case 'h':
            bench_usage(stdout);
            return EXIT_OK;
        case O_JSON:
            a.json = true;
            continue;
        case O_PROFILE:
            a.profile = true;
            continue;
        case O_EMBED:
            a.embeddings = true;
            continue;
        case O_TRACE:
            a.trace_path = optarg;
            continue;
        case O_GROUNDED:
            a.grounded = optarg;
            continue;
        case O_TEMP:
            if (!cli_parse_float(optarg, 0, 100, &a.temp)) {
                fprintf(stderr, "quern bench: --temp '%s' is not a number in 0..100\n", optarg);
                return EXIT_USAGE;
            }
            continue;
        case O_DECODE:
            if (!parse_batches(optarg, &a)) {
                fprintf(stderr,
                        "quern bench: --decode-batches '%s': want up to 16 sequence counts in "
                        "1..1024, comma-separated\n",
                        optarg);
                return EXIT_USAGE;
            }
            continue;
        case O_SYNTH:
            if (!synth_shape_find(optarg)) {
                fprintf(stderr,
                        "quern bench: --synthetic '%s': want llama3-8b, llama2-7b or "
                        "smollm2-135m\n",
                        optarg);
                return EXIT_USAGE;
            }
            a.synthetic = optarg;
            continue;
        case O_WRITE:
            a.write_model = optarg;
            continue;
        case O_TYPE: {
            int t = qtype_from_name(optarg);
            if (t != QTYPE_Q4_0 && t != QTYPE_Q4_1 && t != QTYPE_Q8_0 && t != QTYPE_F16) {
                fprintf(stderr, "quern bench: --type '%s': want q4_0, q4_1, q8_0 or f16\n", optarg);
                return EXIT_USAGE;
            }
            a.synth_type = (enum qtype)t;
            continue;
        }
        case O_REQ:
            dst = &a.requests;
            break;
        case O_IN:
            dst = &a.input_len;
            break;
        case O_OUT:
            dst = &a.output_len;
            lo = 1;
            break;
        case O_CONC:
            dst = &a.concurrency;
            a.concurrency_set = true;
            hi = 4096;
            break;
        case O_THREADS:
            dst = &a.threads;
            lo = 0;
            hi = 1024;
            break;
        case O_PP:
            dst = &a.pp;
            lo = 0;
            break;
        case O_TG:
            dst = &a.tg;
            lo = 0;
            break;
        case O_REPS:
            dst = &a.reps;
            hi = 1000;
            break;
        case O_BATCH:
            dst = &a.batch;
            break;
        case O_SEQS:
            dst = &a.seqs;
            hi = 4096;
            break;
        case O_KV:
            dst = &a.kv_mib;
            hi = 1 << 20;
            break;
        case O_SEED:
            dst = &a.seed;
            lo = 0;
            hi = 0x7fffffffL;
            break;
        default: {
            int took = cli_backend_arg("bench", c, optarg, &a.be);
            if (!took) took = cli_spec_arg("bench", c, optarg, &a.spec);
            if (!took) took = cli_lora_arg("bench", c, optarg, argc, argv, &optind, &a.lora);
            if (took > 0) continue;
            if (!took) bench_usage(stderr);
            return EXIT_USAGE;
        }
        }
        if (!cli_parse_int(optarg, lo, hi, dst)) {
            fprintf(stderr, "quern bench: '%s' is not an integer in %ld..%ld\n", optarg, lo, hi);
            return EXIT_USAGE;
        }
    }
    if (a.write_model) {
        if (!a.synthetic || optind < argc) {
            fprintf(stderr, "quern bench: --write-model PATH needs --synthetic NAME (and "
                            "takes --type, --seed)\n");
            return EXIT_USAGE;
        }
        struct qerr err = {0};
        if (synth_model_write(a.synthetic, a.synth_type, (uint64_t)a.seed, a.write_model, &err)) {
            fprintf(stderr, "quern bench: %s\n", err.msg);
            return EXIT_RUNTIME;
        }
        printf("wrote %s: synthetic %s, %s\n", a.write_model, a.synthetic,
               qtype_name(a.synth_type));
        return EXIT_OK;
    }
    if (a.embeddings) { /* 64 inputs of 128 tokens, all in flight, unless told otherwise */
        if (a.requests < 0) a.requests = 64;
        if (a.input_len < 0) a.input_len = 128;
        if (a.output_len < 0) a.output_len = 0;
        if (!a.concurrency_set) a.concurrency = a.requests;
        if (a.output_len != 0) {
            fprintf(stderr, "quern bench: --embeddings generates nothing (no --output-len)\n");
            return EXIT_USAGE;
        }
    }
    bool serving = a.requests > 0 || a.input_len > 0 || a.output_len > 0;
    bool single = a.pp >= 0 || a.tg >= 0 || a.n_decode > 0;
    if (optind < argc || serving == single ||
        (serving && (a.requests < 1 || a.input_len < 1 || (a.output_len < 1 && !a.embeddings)))) {
        fprintf(stderr, "quern bench: give either --requests/--input-len/--output-len or "
                        "--pp/--tg (see quern bench --help)\n");
        return EXIT_USAGE;
    }
    if (!serving && (a.spec.mode != SPEC_OFF || a.spec.draft_model || a.grounded || a.lora.n)) {
        fprintf(stderr, "quern bench: --spec, --grounded and --lora apply to --requests runs\n");
        return EXIT_USAGE;
    }
    if (!cli_spec_check("bench", &a.spec)) return EXIT_USAGE;
    cli_lora_specs(&a.lora);
    if (a.pp < 0) a.pp = 0;
    if (a.tg < 0) a.tg = 0;
    struct qerr err = {0};
    struct gguf_file *f = NULL;
    struct tokenizer *tok = NULL;
    struct backend *be = NULL;
    struct backend_group grp = {0};
    a.grp = &grp;
    int rc = a.synthetic
                 ? synth_model_open(a.synthetic, a.synth_type, (uint64_t)a.seed, NULL, &f, &err)
                 : gguf_open(cli_model_path(a.model), &f, &err);
    if (!rc) rc = tokenizer_load(f, &tok, &err);
    if (!rc) rc = cli_spec_open(&a.spec, &err);
    if (!rc) rc = cli_backends_open("bench", &a.be, (int)a.threads, &grp, &err);
    if (!rc) be = grp.be[0];
    if (!rc)
        rc = serving      ? run_serving(f, tok, be, &a, &err)
             : a.n_decode ? run_decode_batches(f, be, &a, &err)
                          : run_pp_tg(f, be, &a, &err);
    if (rc) fprintf(stderr, "quern bench: %s\n", err.msg);
    cli_spec_close(&a.spec);
    backend_group_free(&grp);
    tokenizer_free(tok);
    gguf_close(f);
    return rc ? EXIT_RUNTIME : EXIT_OK;
}
