/* quern generate: one prompt, one sequence, text streamed to stdout as it is produced. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine/chat.h"
#include "../engine/engine.h"
#include "../engine/generate.h"
#include "../engine/tokenizer.h"
#include "../engine/trace.h"
#include "cli.h"

static void generate_usage(FILE *out)
{
    fprintf(
        out,
        "usage: quern generate [--model PATH] --prompt TEXT [options]\n"
        "  --model PATH      GGUF model (default: $QUERN_MODEL or " QUERN_DEFAULT_MODEL ")\n"
        "  --prompt TEXT     the prompt (UTF-8)\n"
        "  -n N              tokens to generate (default 64)\n"
        "  --chat            wrap the prompt in the model's chat template as a user message\n"
        "  --system TEXT     system message for --chat (default: the template's "
        "own)\n" CLI_CHAT_TEMPLATE_HELP
        "  --chat-template-kwargs J  '{\"enable_thinking\": false}': Qwen3's reasoning off\n"
        "  --temp T          temperature, 0 = greedy (default 0.8)\n"
        "  --top-k K         keep the K most likely tokens (default 40, 0 = off)\n"
        "  --top-p P         nucleus sampling (default 0.95)\n"
        "  --min-p P         drop tokens below P x the top probability (default 0.05)\n"
        "  --repeat-penalty R  repetition penalty (default 1.0 = off)\n"
        "  --seed S          RNG seed (default 0)\n"
        "  --threads N       CPU threads (default: all)\n" CLI_PRECISION_HELP CLI_DEVICE_HELP
            CLI_TP_HELP CLI_BATCH_INVARIANT_HELP CLI_KNOBS_HELP
        "  --ignore-eos      keep generating past end-of-generation tokens\n"
        "  --no-stats        do not print timings to stderr\n"
        "  --trace FILE      write each forward as a step, and the run, as a Chrome trace\n"
        "                    (docs/profiling.md; plain decoding: not with --spec)\n" CLI_SPEC_HELP
            CLI_LORA_HELP);
}

struct gen_state {
    const struct tokenizer *tok;
    struct detok dt;
    bool ignore_eos;
    int produced;
    double t_first;
    struct timespec t0;
};

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static bool on_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    struct gen_state *g = ctx;
    if (g->produced++ == 0) g->t_first = seconds_since(&g->t0);
    if (!g->ignore_eos && tokenizer_is_eog(g->tok, token)) return true;
    char piece[256];
    int n = detok_push(&g->dt, g->tok, token, piece, sizeof piece);
    if (n > 0) {
        fwrite(piece, 1, (size_t)n, stdout);
        fflush(stdout);
    }
    return false;
}

struct gen_args {
    struct cli_loras lora; /* --lora: at most one here */
    const char *model, *prompt, *system;
    const char *chat_template; /* --chat-template (implies --chat) */
    const char *trace_path;    /* --trace */
    long n_predict, threads;
    bool chat, ignore_eos, stats;
    bool no_thinking; /* --chat-template-kwargs '{"enable_thinking": false}' */
    struct cli_backend_args be;
    struct cli_spec spec;
    struct sample_params sp;
};

static int parse_args(int argc, char **argv, struct gen_args *a)
{
    enum {
        O_CHAT = 256,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_SEED,
        O_THREADS,
        O_IGNORE,
        O_SYSTEM,
        O_REPEAT,
        O_NOSTATS,
        O_TRACE,
        O_CHATTMPL,
        O_TMPLKW
    };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"chat", no_argument, 0, O_CHAT},
                                         {"temp", required_argument, 0, O_TEMP},
                                         {"top-k", required_argument, 0, O_TOPK},
                                         {"top-p", required_argument, 0, O_TOPP},
                                         {"min-p", required_argument, 0, O_MINP},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"ignore-eos", no_argument, 0, O_IGNORE},
                                         {"system", required_argument, 0, O_SYSTEM},
                                         {"repeat-penalty", required_argument, 0, O_REPEAT},
                                         {"no-stats", no_argument, 0, O_NOSTATS},
                                         CLI_BACKEND_OPTIONS,
                                         CLI_SPEC_OPTIONS,
                                         CLI_LORA_OPTIONS,
                                         {"help", no_argument, 0, 'h'},
                                         {"trace", required_argument, 0, O_TRACE},
                                         {"chat-template", required_argument, 0, O_CHATTMPL},
                                         {"chat-template-kwargs", required_argument, 0, O_TMPLKW},
                                         {0, 0, 0, 0}};
    *a = (struct gen_args){.n_predict = 64, .stats = true, .be.precision = MATMUL_AUTO};
    sample_params_cli_default(&a->sp); /* the defaults --help states */
    optind = 1;
    int c;
    double d;
    long l;
    while ((c = getopt_long(argc, argv, "m:p:n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            a->model = optarg;
            break;
        case 'p':
            a->prompt = optarg;
            break;
        case 'n':
            if (!cli_parse_int(optarg, 0, 1000000, &a->n_predict)) {
                fprintf(stderr, "quern generate: -n '%s' is not an integer in 0..1000000\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case O_CHAT:
            a->chat = true;
            break;
        case O_IGNORE:
            a->ignore_eos = true;
            break;
        case O_NOSTATS:
            a->stats = false;
            break;
        case O_TRACE:
            a->trace_path = optarg;
            break;
        case O_CHATTMPL:
            a->chat_template = optarg;
            a->chat = true;
            break;
        case O_TMPLKW: {
            const char *bad = cli_template_kwargs(optarg, &a->no_thinking);
            if (bad) {
                fprintf(stderr, "quern generate: %s\n", bad);
                return EXIT_USAGE;
            }
            break;
        }
        case O_SYSTEM:
            a->system = optarg;
            break;
        case O_TEMP:
        case O_TOPP:
        case O_MINP:
        case O_REPEAT:
            if (!cli_parse_float(optarg, 0, 100, &d)) {
                fprintf(stderr, "quern generate: '%s' is not a number in 0..100\n", optarg);
                return EXIT_USAGE;
            }
            if (c == O_TEMP) a->sp.temperature = (float)d;
            if (c == O_TOPP) a->sp.top_p = (float)d;
            if (c == O_MINP) a->sp.min_p = (float)d;
            if (c == O_REPEAT) a->sp.repetition_penalty = (float)d;
            break;
        case O_TOPK:
        case O_THREADS:
        case O_SEED:
            if (!cli_parse_int(optarg, 0, c == O_SEED ? 0x7fffffffffffffffL : 1024, &l)) {
                fprintf(stderr, "quern generate: '%s' is not a valid integer for this option\n",
                        optarg);
                return EXIT_USAGE;
            }
            if (c == O_TOPK) a->sp.top_k = (int)l;
            if (c == O_THREADS) a->threads = l;
            if (c == O_SEED) a->sp.seed = (uint64_t)l;
            break;
        case 'h':
            generate_usage(stdout);
            return -1;
        default: {
            int took = cli_backend_arg("generate", c, optarg, &a->be);
            if (!took) took = cli_spec_arg("generate", c, optarg, &a->spec);
            if (!took) took = cli_lora_arg("generate", c, optarg, argc, argv, &optind, &a->lora);
            if (took > 0) break;
            if (!took) generate_usage(stderr);
            return EXIT_USAGE;
        }
        }
    }
    if (optind < argc) {
        fprintf(stderr, "quern generate: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (a->lora.n > 1) {
        fprintf(stderr, "quern generate: one --lora at a time (serve takes several)\n");
        return EXIT_USAGE;
    }
    if (!a->prompt) {
        fprintf(stderr, "quern generate: --prompt is required (see quern generate --help)\n");
        return EXIT_USAGE;
    }
    struct qerr err = {0};
    if (sample_params_check(&a->sp, &err)) {
        fprintf(stderr, "quern generate: %s\n", err.msg);
        return EXIT_USAGE;
    }
    if (!cli_spec_check("generate", &a->spec)) return EXIT_USAGE;
    return 0;
}

/* Tokenizes the prompt itself, or the conversation the chat template makes of it. Either way
 * the prompt is text: only the template's own markers become control tokens, as in the server
 * without --chat-parse-special. */
static int tokenize_prompt(const struct gguf_file *f, const struct tokenizer *tok,
                           const struct gen_args *a, int32_t **ids, size_t *n, struct qerr *err)
{
    bool bos = tokenizer_adds_bos(tok);
    int rc;
    if (!a->chat) {
        if ((rc = tokenizer_encode(tok, a->prompt, strlen(a->prompt), bos, false, ids, n, err)))
            qerr_wrap(err, "--prompt");
        return rc;
    }
    struct chat_template ct;
    if ((rc = cli_chat_template(f, a->chat_template, &ct, err)))
        return qerr_wrap(err, a->chat_template ? "--chat-template" : "--chat");
    struct chat_msg msgs[2];
    size_t n_msgs = 0;
    if (a->system) msgs[n_msgs++] = (struct chat_msg){.role = "system", .content = a->system};
    msgs[n_msgs++] = (struct chat_msg){.role = "user", .content = a->prompt};
    enum chat_end end = a->no_thinking ? CHAT_END_GENERATE_NO_THINK : CHAT_END_GENERATE;
    if ((rc = chat_encode_tools(&ct, tok, msgs, n_msgs, NULL, end, bos, false, ids, n, err)))
        qerr_wrap(err, "--prompt");
    chat_template_free(&ct);
    return rc;
}

int cli_generate(int argc, char **argv)
{
    struct gen_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? EXIT_OK : rc;
    if (a.trace_path && a.spec.mode != SPEC_OFF) {
        fprintf(stderr, "quern generate: --trace records plain decoding: not with --spec %s\n",
                spec_mode_name(a.spec.mode));
        return EXIT_USAGE;
    }
    const char *path = cli_model_path(a.model);
    struct qerr err = {0};
    struct spec_model *dm = NULL; /* --spec draft */
    struct gguf_file *f = NULL;
    struct tokenizer *tok = NULL;
    struct backend_group grp = {0};
    struct model *m = NULL;
    struct trace *tr = NULL;
    struct backend *traced = NULL; /* --trace: grp.be[0], its sampled steps' ops recorded */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int exit_code = EXIT_RUNTIME;

    if ((rc = gguf_open(path, &f, &err))) goto out;
    if ((rc = tokenizer_load(f, &tok, &err))) goto out;
    if ((rc = cli_spec_open(&a.spec, &err))) goto out;
    if (a.spec.mode == SPEC_DRAFT && a.be.tp > 1) {
        rc = qerr_set(&err, QERR_INVALID, "--spec draft runs on one rank: not with --tp %d",
                      a.be.tp);
        goto out;
    }
    if ((rc = tokenize_prompt(f, tok, &a, &ids, &n_ids, &err))) goto out;
    if (n_ids == 0) {
        rc = qerr_set(&err, QERR_INVALID, "--prompt: the prompt has no tokens");
        goto out;
    }
    struct model_config cfg;
    if ((rc = model_config_read(f, &cfg, &err))) goto out;
    struct model_opts ro = {0};
    cli_knobs_model(&a.be.knobs, &ro);
    int ctx_limit = model_ctx_limit(&cfg, &ro);
    size_t total = n_ids + (size_t)a.n_predict;
    if (total > (size_t)ctx_limit) {
        rc = qerr_set(&err, QERR_FULL,
                      "prompt (%zu tokens) + -n %ld exceeds the context length of %d tokens", n_ids,
                      a.n_predict, ctx_limit);
        goto out;
    }
    if ((rc = cli_backends_open("generate", &a.be, (int)a.threads, &grp, &err))) goto out;
    /* as the engine's defaults (engine_opts): drafts of up to 8 tokens, steps of up to 8 */
    int bs = 16, spec_k = a.spec.k ? a.spec.k : 8;
    int step = a.spec.step_tokens ? a.spec.step_tokens : 8;
    if (spec_k > step - 1) spec_k = step - 1;
    struct model_opts mo = {.max_batch_tokens = 256,
                            .max_logits = a.spec.mode != SPEC_OFF ? 1 + spec_k : 1,
                            .kv_blocks = (int)((total + (size_t)bs - 1) / (size_t)bs),
                            .kv_block_size = bs,
                            .tp = grp.n,
                            .tp_backends = grp.be,
                            .tp_comms = grp.comm,
                            .loras = cli_lora_specs(&a.lora),
                            .n_loras = a.lora.n};
    cli_knobs_model(&a.be.knobs, &mo);
    if (a.trace_path &&
        ((rc = trace_create(TRACE_DEFAULT_STEPS, TRACE_DEFAULT_REQUESTS, &tr, &err)) ||
         (grp.n == 1 && (rc = trace_wrap_backend(tr, grp.be[0], &traced, &err)))))
        goto out;
    if ((rc = model_load(f, traced ? traced : grp.be[0], &mo, &m, &err))) goto out;
    if (a.spec.mode == SPEC_DRAFT) {
        /* one sequence: a row of logits per draft round */
        struct model_opts dmo = mo;
        dmo.max_logits = 1;
        dmo.rope_freq_base = dmo.rope_scale = 0; /* the draft's own file says */
        dmo.loras = NULL;
        dmo.n_loras = 0;
        if ((rc = spec_model_create(a.spec.draft_file, tok, grp.be[0], &dmo, &dm, &err))) {
            qerr_wrap(&err, "--draft-model %s", a.spec.draft_model);
            goto out;
        }
    }

    struct gen_state g = {.tok = tok, .ignore_eos = a.ignore_eos};
    detok_init(&g.dt);
    clock_gettime(CLOCK_MONOTONIC, &g.t0);
    struct gen_spec_stats ss = {0};
    struct gen_opts go = {.n_predict = (int)a.n_predict,
                          .prefill_chunk = 256,
                          .sample = a.sp,
                          .trace = tr,
                          .spec = a.spec.mode,
                          .spec_k = spec_k,
                          .spec_stats = &ss,
                          .draft = dm,
                          .spec_policy = a.spec.policy,
                          .lora = a.lora.n};
    if (dm) go.draft_prior = spec_model_cost_prior(a.spec.draft_file, f);
    if (!a.chat) fputs(a.prompt, stdout);
    rc = generate_run(m, ids, n_ids, &go, on_token, &g, &err);
    char tail[16];
    int nt = detok_flush(&g.dt, tail, sizeof tail);
    if (nt > 0) fwrite(tail, 1, (size_t)nt, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (rc) goto out;
    double total_s = seconds_since(&g.t0);
    if (tr) {
        /* what the trace's steps must add up to: a forward per prefill chunk, then one per
         * token sampled except the last */
        struct engine_stats st = {.prompt_tokens = n_ids,
                                  .generation_tokens = (uint64_t)g.produced};
        st.steps = (n_ids + 255) / 256 + (uint64_t)(g.produced > 0 ? g.produced - 1 : 0);
        if ((rc = trace_write(tr, a.trace_path, &st, &err))) goto out;
        fprintf(stderr, "quern generate: trace written to %s\n", a.trace_path);
    }
    if (a.stats && g.produced > 0) {
        double decode_s = total_s - g.t_first;
        fprintf(stderr,
                "quern: prompt %zu tokens in %.3f s (%.1f tok/s); generated %d tokens, decode "
                "%.1f tok/s; %d threads (CPU)\n",
                n_ids, g.t_first, (double)n_ids / g.t_first, g.produced,
                g.produced > 1 ? (g.produced - 1) / decode_s : 0.0,
                a.threads ? (int)a.threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
        if (a.spec.mode != SPEC_OFF)
            fprintf(stderr,
                    "quern: spec %s: %d drafts, %d of %d drafted tokens accepted (mean accepted "
                    "length %.2f)\n",
                    spec_mode_name(a.spec.mode), ss.drafts, ss.accepted, ss.drafted,
                    ss.drafts ? 1.0 + (double)ss.accepted / ss.drafts : 0.0);
    }
    exit_code = EXIT_OK;
out:
    if (exit_code != EXIT_OK) fprintf(stderr, "quern generate: %s\n", err.msg);
    free(ids);
    spec_model_free(dm);
    cli_spec_close(&a.spec);
    model_free(m);
    backend_destroy(traced);
    trace_free(tr);
    backend_group_free(&grp);
    tokenizer_free(tok);
    gguf_close(f);
    return exit_code;
}
