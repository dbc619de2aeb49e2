/* quern eval: perplexity of a model over a text and, against a reference model, the llama.cpp
 * --kl-divergence statistics (engine/eval.h).
 *
 * Windows as llama.cpp's perplexity tool cuts them: the text is tokenized once (with BOS when
 * the model adds one), split into consecutive windows of --ctx tokens (the tail that does not
 * fill a window is dropped), the first token of each window is replaced by BOS when the model
 * adds one, each window runs from position 0 with a fresh KV cache, and only the second half of
 * each window is scored: the logits at positions ctx/2 .. ctx-2 predicting tokens ctx/2+1 ..
 * ctx-1, so every scored token has at least ctx/2 tokens of context. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/eval.h"
#include "../engine/generate.h"
#include "../engine/tokenizer.h"
#include "cli.h"

#define EVAL_MAX_TEXT (64L << 20)

static void eval_usage(FILE *out)
{
    fprintf(
        out,
        "usage: quern eval [--model PATH] [--ref PATH] --text FILE [options]\n"
        "  --model PATH     GGUF model to evaluate (default: $QUERN_MODEL or " QUERN_DEFAULT_MODEL
        ")\n"
        "  --ref PATH       reference model (same vocabulary): adds mean KL divergence\n"
        "                   KL(ref || model), its percentiles, top-1 agreement and delta-p\n"
        "  --text FILE      UTF-8 text to score\n"
        "  --ctx N          tokens per window (default 512); the second half of each window\n"
        "                   is scored, as llama.cpp's perplexity does\n"
        "  --chunks K       score at most K windows (default: all the text fills)\n"
        "  --precision P    auto (default: q8 on the CPU, f32 on CUDA, as serve), f32 or q8\n"
        "                   (activations quantized to int8 per 32-block in matmuls)\n"
        "  --threads N      CPU threads (default: all)\n"
        "  --device D       auto (default: a usable GPU, else the CPU), cpu, cuda, "
        "cuda:N\n" CLI_TP_HELP CLI_BATCH_INVARIANT_HELP CLI_KNOBS_HELP);
}

struct eval_args {
    const char *model, *ref, *text;
    long ctx, chunks, threads;
    struct cli_backend_args be;
};

static int parse_args(int argc, char **argv, struct eval_args *a)
{
    enum { O_REF = 256, O_TEXT, O_CTX, O_CHUNKS, O_THREADS };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"ref", required_argument, 0, O_REF},
                                         {"text", required_argument, 0, O_TEXT},
                                         {"ctx", required_argument, 0, O_CTX},
                                         {"chunks", required_argument, 0, O_CHUNKS},
                                         {"threads", required_argument, 0, O_THREADS},
                                         CLI_BACKEND_OPTIONS,
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (struct eval_args){.ctx = 512, .be.precision = MATMUL_AUTO};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            a->model = optarg;
            break;
        case O_REF:
            a->ref = optarg;
            break;
        case O_TEXT:
            a->text = optarg;
            break;
        case O_CTX:
            if (!cli_parse_int(optarg, 8, 1 << 20, &a->ctx)) {
                fprintf(stderr, "quern eval: --ctx '%s' is not an integer in 8..1048576\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case O_CHUNKS:
        case O_THREADS: {
            long v;
            if (!cli_parse_int(optarg, c == O_CHUNKS ? 1 : 0, c == O_CHUNKS ? 1L << 30 : 1024,
                               &v)) {
                fprintf(stderr, "quern eval: '%s' is not a valid integer for this option\n",
                        optarg);
                return EXIT_USAGE;
            }
            if (c == O_CHUNKS) a->chunks = v;
            if (c == O_THREADS) a->threads = v;
            break;
        }
        case 'h':
            eval_usage(stdout);
            return -1;
        default: {
            int took = cli_backend_arg("eval", c, optarg, &a->be);
            if (took > 0) break;
            if (!took) eval_usage(stderr);
            return EXIT_USAGE;
        }
        }
    }
    if (optind < argc) {
        fprintf(stderr, "quern eval: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (!a->text) {
        fprintf(stderr, "quern eval: --text is required (see quern eval --help)\n");
        return EXIT_USAGE;
    }
    return 0;
}

/* One loaded model with its own backend. */
struct loaded {
    struct gguf_file *f;
    struct tokenizer *tok;
    struct backend_group grp; /* --tp ranks (one without) */
    struct model *m;
    struct model_config cfg;
};

static void loaded_free(struct loaded *l)
{
    model_free(l->m);
    backend_group_free(&l->grp);
    tokenizer_free(l->tok);
    gguf_close(l->f);
}

static int load(const char *path, const struct eval_args *a, struct loaded *l, struct qerr *err)
{
    int rc = gguf_open(path, &l->f, err);
    if (!rc) rc = model_config_read(l->f, &l->cfg, err);
    if (!rc) rc = tokenizer_load(l->f, &l->tok, err);
    if (rc) return rc;
    if (a->ctx > l->cfg.ctx_len)
        return qerr_set(err, QERR_INVALID, "--ctx %ld exceeds the context length %d of %s", a->ctx,
                        l->cfg.ctx_len, path);
    if ((rc = cli_backends_open("eval", &a->be, (int)a->threads, &l->grp, err))) return rc;
    int batch = a->ctx < 512 ? (int)a->ctx : 512, bs = 16;
    struct model_opts mo = {.max_batch_tokens = batch,
                            .max_logits = batch,
                            .kv_blocks = (int)((a->ctx + bs - 1) / bs),
                            .kv_block_size = bs,
                            .tp = l->grp.n,
                            .tp_backends = l->grp.be,
                            .tp_comms = l->grp.comm};
    cli_knobs_model(&a->be.knobs, &mo);
    return model_load(l->f, l->grp.be[0], &mo, &l->m, err);
}

static int read_text(const char *path, char **out, size_t *len, struct qerr *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return qerr_set(err, QERR_IO, "--text %s: cannot open", path);
    char *buf = malloc(EVAL_MAX_TEXT + 1);
    size_t n = buf ? fread(buf, 1, EVAL_MAX_TEXT + 1, fp) : 0;
    int bad = ferror(fp);
    fclose(fp);
    if (!buf) return qerr_set(err, QERR_NOMEM, "--text %s: out of memory", path);
    if (bad || n > EVAL_MAX_TEXT) {
        free(buf);
        return qerr_set(err, bad ? QERR_IO : QERR_INVALID, "--text %s: %s", path,
                        bad ? "read error" : "larger than 64 MiB");
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

static int tokenize(const struct loaded *l, const char *text, size_t len, int32_t **ids, size_t *n,
                    struct qerr *err)
{
    int rc = tokenizer_encode(l->tok, text, len, tokenizer_adds_bos(l->tok), false, ids, n, err);
    return rc ? qerr_wrap(err, "--text") : 0;
}

/* Scores window w of the token stream through model (and ref). */
static int score_window(struct loaded *m, struct loaded *ref, int32_t *win, int ctx,
                        struct eval_stats *st, struct qerr *err)
{
    float *lm = NULL, *lr = NULL;
    int rc = generate_all_logits(m->m, win, (size_t)ctx, 0, &lm, err);
    if (!rc && ref) rc = generate_all_logits(ref->m, win, (size_t)ctx, 0, &lr, err);
    size_t vocab = (size_t)m->cfg.vocab;
    for (int j = ctx / 2; !rc && j < ctx - 1; j++)
        rc = eval_stats_add(st, lm + (size_t)j * vocab, lr ? lr + (size_t)j * vocab : NULL,
                            win[j + 1], err);
    free(lm);
    free(lr);
    return rc;
}

static void print_summary(const struct eval_args *a, const char *model_path,
                          const struct eval_summary *s)
{
    printf("model             %s\n", model_path);
    printf("perplexity        %.4f +/- %.4f\n", s->ppl, s->ppl_err);
    if (!a->ref) return;
    printf("ref               %s\n", a->ref);
    printf("ref perplexity    %.4f +/- %.4f\n", s->ppl_ref, s->ppl_ref_err);
    printf("ppl ratio         %.5f\n", s->ppl / s->ppl_ref);
    printf("mean KL           %.6f +/- %.6f\n", s->kl_mean, s->kl_err);
    printf("median KL         %.6f\n", s->kl_median);
    printf("99%% KL            %.6f\n", s->kl_p99);
    printf("max KL            %.6f\n", s->kl_max);
    printf("top-1 agreement   %.3f %% +/- %.3f %%\n", 100 * s->top1, 100 * s->top1_err);
    printf("mean delta-p      %.4f %%\n", 100 * s->dp_mean);
    printf("RMS delta-p       %.4f %%\n", 100 * s->dp_rms);
}

int cli_eval(int argc, char **argv)
{
    struct eval_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? EXIT_OK : rc;
    const char *model_path = cli_model_path(a.model);
    struct qerr err = {0};
    struct loaded m = {0}, ref = {0};
    struct eval_stats st = {0};
    char *text = NULL;
    size_t len = 0, n_ids = 0, n_ref_ids = 0;
    int32_t *ids = NULL, *ref_ids = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    if ((rc = read_text(a.text, &text, &len, &err))) goto out;
    if ((rc = load(model_path, &a, &m, &err))) goto out;
    if ((rc = tokenize(&m, text, len, &ids, &n_ids, &err))) goto out;
    if (a.ref) {
        if ((rc = load(a.ref, &a, &ref, &err))) goto out;
        if ((rc = tokenize(&ref, text, len, &ref_ids, &n_ref_ids, &err))) goto out;
        if (ref.cfg.vocab != m.cfg.vocab || n_ref_ids != n_ids ||
            memcmp(ids, ref_ids, n_ids * sizeof *ids) != 0) {
            rc = qerr_set(&err, QERR_INVALID,
                          "--ref %s tokenizes the text differently from %s (vocabularies %d and "
                          "%d): KL divergence needs the same tokens",
                          a.ref, model_path, ref.cfg.vocab, m.cfg.vocab);
            goto out;
        }
    }
    size_t windows = n_ids / (size_t)a.ctx;
    if (a.chunks && windows > (size_t)a.chunks) windows = (size_t)a.chunks;
    if (windows == 0) {
        rc = qerr_set(&err, QERR_INVALID,
                      "--text %s has %zu tokens, fewer than one window of --ctx %ld", a.text, n_ids,
                      a.ctx);
        goto out;
    }
    if ((rc = eval_stats_init(&st, m.cfg.vocab, a.ref != NULL, &err))) goto out;
    int32_t bos = tokenizer_bos(m.tok);
    bool add_bos = tokenizer_adds_bos(m.tok) && bos >= 0;
    fprintf(stderr, "quern eval: %zu tokens, %zu windows of %ld, scoring %ld tokens each\n", n_ids,
            windows, a.ctx, a.ctx - 1 - a.ctx / 2);
    for (size_t w = 0; w < windows; w++) {
        int32_t *win = ids + w * (size_t)a.ctx;
        if (add_bos) win[0] = bos; /* the window's original first token is never scored */
        if ((rc = score_window(&m, a.ref ? &ref : NULL, win, (int)a.ctx, &st, &err))) goto out;
        struct eval_summary s;
        eval_stats_summarize(&st, &s);
        fprintf(stderr, "  [%zu/%zu] ppl %.4f\n", w + 1, windows, s.ppl);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    struct eval_summary s;
    eval_stats_summarize(&st, &s);
    printf("text              %s: %zu tokens, %zu windows of %ld, %llu tokens scored (the "
           "second half of each window)\n",
           a.text, n_ids, windows, a.ctx, (unsigned long long)s.n);
    printf("precision         %s\n", a.be.precision == MATMUL_F32 ? "f32"
                                     : a.be.precision == MATMUL_Q8
                                         ? "q8"
                                         : "auto (q8 on the CPU, f32 on CUDA)");
    print_summary(&a, model_path, &s);
    fprintf(stderr, "quern eval: %.1f s\n",
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
out:
    if (rc) fprintf(stderr, "quern eval: %s\n", err.msg);
    eval_stats_free(&st);
    free(ids);
    free(ref_ids);
    free(text);
    loaded_free(&ref);
    loaded_free(&m);
    return rc ? EXIT_RUNTIME : EXIT_OK;
}
