/* quern serve: the OpenAI-compatible HTTP daemon. Options and lifecycle only; the endpoints
 * are in api*.c, the HTTP glue in http.c.
 *
 * Lifecycle, on the main thread: block SIGTERM/SIGINT/SIGPIPE (every thread started later
 * inherits the mask; one signal thread takes them) -> listen (health says "loading") -> load
 * the model and start the engine -> ready -> wait for a signal -> drain: new work gets 503,
 * in-flight requests run until they finish or --drain-timeout passes (a second signal cuts it
 * short) -> engine_stop aborts what is left (finish reason "abort"; the HTTP threads send those
 * last chunks) -> stop HTTP -> free the engine -> exit 0. A second signal also bounds the rest:
 * if shutdown has not finished FORCE_EXIT_S later, the process exits at once. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine/engine.h"
#include "../quant/fault.h"
#include "../engine/gguf.h"
#include "../engine/tokenizer.h"
#include "../engine/trace.h"
#include "cli.h"
#include "http.h"
#include "json_oom.h"
#include "serve.h"

static void serve_usage(FILE *out)
{
    fprintf(
        out,
        "usage: quern serve [--model PATH] [options]\n"
        "  --model PATH             GGUF model (default: $QUERN_MODEL or " QUERN_DEFAULT_MODEL ")\n"
        "  --host ADDR              numeric address to listen on (default 127.0.0.1)\n"
        "  --port N                 port (default 8080; 0: any free port)\n"
        "  --threads N              CPU threads for the model (default: all)\n" CLI_PRECISION_HELP
        "  --device D               auto (default: a usable GPU, else the CPU), cpu, cuda,\n"
        "                           cuda:N\n" CLI_TP_HELP CLI_BATCH_INVARIANT_HELP CLI_KNOBS_HELP
        "  --kv-mem SIZE            KV cache memory, e.g. 512M, 2G (default 256M)\n"
        "  --max-batch-tokens N     tokens per engine step (default 2048)\n"
        "  --max-seqs N             sequences running at once (default 64)\n"
        "  --max-queue N            waiting requests before 429 (default 256)\n"
        "  --ctx N                  context length per request (default: the model's)\n"
        "  --api-key KEY            require 'Authorization: Bearer KEY' on /v1/* and\n"
        "                           /tokenize, /detokenize (default: $QUERN_API_KEY; none)\n"
        "  --served-model-name NAME[,ALIAS...] the model id clients see (default: the file name);\n"
        "                           a request naming another model gets 404 model_not_found\n"
        "  --pooling mean|last|cls  how /v1/embeddings pools a text's final hidden states\n"
        "                           (default mean; last for last-token embedding models)\n"
        "  --max-body SIZE          largest request body (default 2M; more: 413)\n"
        "  --max-connections N      open connections at once (default 512); when all are\n"
        "                           taken, the one idle the longest makes room\n"
        "  --max-connections-per-client N\n"
        "                           open connections from one address (default: half of\n"
        "                           --max-connections; 0: no cap)\n"
        "  --request-timeout S      seconds for a request's head and body to arrive, and\n"
        "                           for an idle keep-alive connection (default 30; 0: none)\n"
        "  --stall-timeout S        a client that reads none of its answer for S seconds is\n"
        "                           cut off and its request aborted (default 30; 0: never)\n"
        "  --drain-timeout S        on SIGTERM/SIGINT, seconds to let requests finish\n"
        "                           (default 30)\n"
        "  --watchdog S             /health says 503 when the engine has work but no step\n"
        "                           finished for S seconds (default 60)\n"
        "  --log-format text|json   per-request log lines on stderr (default text)\n"
        "  --trace FILE             record the engine's steps and requests; written as a\n"
        "                           Chrome trace at exit and on SIGUSR1\n"
        "  --mask-mode launch|thread|after\n"
        "                           when structured outputs' token masks are computed: once\n"
        "                           the forward is issued (default), on a helper thread\n"
        "                           beside it, or before each sampling "
        "(docs/benchmarks.md)\n" CLI_CHAT_TEMPLATE_HELP "  --reasoning-format deepseek|none\n"
        "                           where the chat template opens a <think> block\n"
        "                           (DeepSeek-R1), or the model does (Qwen3): the answer's\n"
        "                           reasoning, up to </think>, as\n"
        "                           message.reasoning_content, the rest as content (default\n"
        "                           deepseek), or all of it as content (none)\n"
        "  --chat-template-kwargs J  what requests without chat_template_kwargs get:\n"
        "                           '{\"enable_thinking\": false}' switches Qwen3's\n"
        "                           reasoning off (llama.cpp's flag, vLLM's\n"
        "                           --default-chat-template-kwargs)\n"
        "  --chat-parse-special     let message content name control tokens such as\n"
        "                           <|im_end|> (default: content is plain text; llama.cpp\n"
        "                           and vLLM parse them)\n"
        "  --no-webui               serve no web page at / (default: the chat playground and\n"
        "                           engine view, http://HOST:PORT/)\n" CLI_SPEC_HELP CLI_LORA_HELP
        "                    a request runs with an adapter when its \"model\" names it\n"
        "                    (GET /v1/models lists them)\n"
        "  --lora-runtime      POST /v1/load_lora_adapter {lora_name, lora_path} and\n"
        "                    /v1/unload_lora_adapter {lora_name} (vLLM's) load and unload\n"
        "                    adapters while serving, up to 8 in all; any client with the\n"
        "                    API key can then have the server read a file it names\n");
}

/* "123", "512K", "256M", "2G" (binary multiples) into bytes. */
static bool parse_size(const char *text, size_t *out)
{
    if (!text || !*text) return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || text[0] == '-') return false;
    unsigned shift = 0;
    if (*end) {
        switch (*end) {
        case 'k':
        case 'K':
            shift = 10;
            break;
        case 'm':
        case 'M':
            shift = 20;
            break;
        case 'g':
        case 'G':
            shift = 30;
            break;
        default:
            return false;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return false;
    }
    if (v > (~0ull >> shift)) return false;
    *out = (size_t)(v << shift);
    return true;
}

static const char *basename_of(const char *path, char *buf, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(buf, cap, "%s", b);
    size_t n = strlen(buf);
    if (n > 5 && !strcmp(buf + n - 5, ".gguf")) buf[n - 5] = '\0';
    return buf;
}

static int parse_args(int argc, char **argv, struct serve_opts *o)
{
    enum {
        O_HOST = 256,
        O_PORT,
        O_THREADS,
        O_KVMEM,
        O_MBT,
        O_SEQS,
        O_QUEUE,
        O_CTX,
        O_KEY,
        O_NAME,
        O_DRAIN,
        O_WATCHDOG,
        O_LOGFMT,
        O_BODY,
        O_CONNS,
        O_CHATSPECIAL,
        O_NOWEBUI,
        O_TRACE,
        O_PERCLIENT,
        O_REQTIMEOUT,
        O_STALL,
        O_POOLING,
        O_MASK,
        O_CHATTMPL,
        O_REASONING,
        O_TMPLKW,
        O_LORA_RUNTIME
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},
        {"threads", required_argument, 0, O_THREADS},
        {"kv-mem", required_argument, 0, O_KVMEM},
        {"max-batch-tokens", required_argument, 0, O_MBT},
        {"max-seqs", required_argument, 0, O_SEQS},
        {"max-queue", required_argument, 0, O_QUEUE},
        {"ctx", required_argument, 0, O_CTX},
        {"api-key", required_argument, 0, O_KEY},
        {"served-model-name", required_argument, 0, O_NAME},
        {"drain-timeout", required_argument, 0, O_DRAIN},
        {"watchdog", required_argument, 0, O_WATCHDOG},
        {"log-format", required_argument, 0, O_LOGFMT},
        {"max-body", required_argument, 0, O_BODY},
        {"max-connections", required_argument, 0, O_CONNS},
        {"chat-parse-special", no_argument, 0, O_CHATSPECIAL},
        {"chat-template", required_argument, 0, O_CHATTMPL},
        {"reasoning-format", required_argument, 0, O_REASONING},
        {"chat-template-kwargs", required_argument, 0, O_TMPLKW},
        {"no-webui", no_argument, 0, O_NOWEBUI},
        {"trace", required_argument, 0, O_TRACE},
        {"max-connections-per-client", required_argument, 0, O_PERCLIENT},
        {"request-timeout", required_argument, 0, O_REQTIMEOUT},
        {"stall-timeout", required_argument, 0, O_STALL},
        {"pooling", required_argument, 0, O_POOLING},
        {"mask-mode", required_argument, 0, O_MASK},
        {"lora-runtime", no_argument, 0, O_LORA_RUNTIME},
        CLI_BACKEND_OPTIONS,
        CLI_SPEC_OPTIONS,
        CLI_LORA_OPTIONS,
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (struct serve_opts){.host = "127.0.0.1",
                             .be.precision = MATMUL_AUTO,
                             .port = 8080,
                             .drain_timeout_s = 30,
                             .watchdog_s = 60,
                             .max_body = 2u << 20,
                             .max_connections = 512,
                             .max_conns_per_client = -1,
                             .request_timeout_s = 30,
                             .stall_timeout_s = 30,
                             .pooling = ENGINE_POOL_MEAN};
    const char *env_key = getenv("QUERN_API_KEY");
    if (env_key && *env_key) o->api_key = env_key;
    optind = 1;
    int c;
    long l;
    double d;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 'm':
            o->model_path = optarg;
            break;
        case O_HOST:
            o->host = optarg;
            break;
        case O_KEY:
            o->api_key = *optarg ? optarg : NULL;
            break;
        case O_POOLING:
            if (!strcmp(optarg, "mean"))
                o->pooling = ENGINE_POOL_MEAN;
            else if (!strcmp(optarg, "last"))
                o->pooling = ENGINE_POOL_LAST;
            else if (!strcmp(optarg, "cls"))
                o->pooling = ENGINE_POOL_CLS;
            else
                bad = "wants mean, last or cls";
            break;
        case O_NAME:
            /* argv is ours to cut: each comma-separated name becomes its own string */
            for (char *n, *rest = optarg; !bad && (n = strsep(&rest, ","));) {
                if (!*n) continue;
                if (o->n_served_names == SERVE_MAX_NAMES)
                    bad = "takes at most 8 names";
                else
                    o->served_names[o->n_served_names++] = n;
            }
            if (!bad && o->n_served_names == 0) bad = "wants a name";
            break;
        case O_PORT:
            if (!cli_parse_int(optarg, 0, 65535, &l)) bad = "--port wants 0..65535";
            o->port = (int)l;
            break;
        case O_THREADS:
        case O_MBT:
        case O_SEQS:
        case O_QUEUE:
        case O_CTX:
        case O_CONNS:
            if (!cli_parse_int(optarg, 1, 1 << 24, &l)) {
                bad = "wants an integer in 1..16777216";
                break;
            }
            if (c == O_THREADS) o->threads = (int)l;
            if (c == O_MBT) o->max_batch_tokens = (int)l;
            if (c == O_SEQS) o->max_seqs = (int)l;
            if (c == O_QUEUE) o->max_queue = (int)l;
            if (c == O_CTX) o->ctx = (int)l;
            if (c == O_CONNS) o->max_connections = (int)l;
            break;
        case O_KVMEM:
            if (!parse_size(optarg, &o->kv_mem) || o->kv_mem == 0)
                bad = "--kv-mem wants a size such as 512M or 2G";
            break;
        case O_BODY:
            if (!parse_size(optarg, &o->max_body) || o->max_body == 0)
                bad = "--max-body wants a size such as 64K or 2M";
            break;
        case O_PERCLIENT:
            if (!cli_parse_int(optarg, 0, 1 << 24, &l)) bad = "wants an integer in 0..16777216";
            o->max_conns_per_client = (int)l;
            break;
        case O_DRAIN:
        case O_WATCHDOG:
        case O_REQTIMEOUT:
        case O_STALL:
            if (!cli_parse_float(optarg, 0, 86400, &d)) {
                bad = "wants seconds in 0..86400";
                break;
            }
            if (c == O_DRAIN) o->drain_timeout_s = d;
            if (c == O_WATCHDOG) o->watchdog_s = d;
            if (c == O_REQTIMEOUT) o->request_timeout_s = d;
            if (c == O_STALL) o->stall_timeout_s = d;
            break;
        case O_MASK:
            if (!strcmp(optarg, "launch"))
                o->mask_mode = ENGINE_MASK_LAUNCH;
            else if (!strcmp(optarg, "thread"))
                o->mask_mode = ENGINE_MASK_THREAD;
            else if (!strcmp(optarg, "after"))
                o->mask_mode = ENGINE_MASK_AFTER;
            else
                bad = "--mask-mode wants launch, thread or after";
            break;
        case O_LOGFMT:
            if (!strcmp(optarg, "json"))
                o->log_json = true;
            else if (strcmp(optarg, "text"))
                bad = "--log-format wants text or json";
            break;
        case O_CHATSPECIAL:
            o->chat_parse_special = true;
            break;
        case O_CHATTMPL:
            o->chat_template = optarg;
            break;
        case O_TMPLKW:
            bad = cli_template_kwargs(optarg, &o->no_thinking);
            break;
        case O_REASONING:
            if (!strcmp(optarg, "none"))
                o->no_reasoning_split = true;
            else if (strcmp(optarg, "deepseek"))
                bad = "--reasoning-format wants deepseek or none";
            break;
        case O_NOWEBUI:
            o->no_webui = true;
            break;
        case O_LORA_RUNTIME:
            o->lora_runtime = true;
            break;
        case O_TRACE:
            o->trace_path = optarg;
            break;
        case 'h':
            serve_usage(stdout);
            return -1;
        default: {
            int took = cli_backend_arg("serve", c, optarg, &o->be);
            if (!took) took = cli_spec_arg("serve", c, optarg, &o->spec);
            if (!took) took = cli_lora_arg("serve", c, optarg, argc, argv, &optind, &o->lora);
            if (took > 0) break;
            if (!took) serve_usage(stderr);
            return EXIT_USAGE;
        }
        }
        if (bad) {
            fprintf(stderr, "quern serve: '%s': %s\n", optarg, bad);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "quern serve: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (!cli_spec_check("serve", &o->spec)) return EXIT_USAGE;
    if (o->max_conns_per_client < 0) o->max_conns_per_client = (o->max_connections + 1) / 2;
    o->model_path = cli_model_path(o->model_path);
    return 0;
}

/* Everything the daemon loads; freed in reverse by unload. */
struct loaded {
    struct gguf_file *f;
    struct tokenizer *tok;
    struct backend_group grp; /* --tp ranks (one without) */
    struct engine *e;
    struct chat_template chat;
    bool has_chat;
    struct trace *trace;     /* --trace; outlives the engine */
    struct gguf_file *draft; /* --draft-model; outlives the engine */
};

static int load(struct serve *s, struct loaded *L, struct qerr *err)
{
    const struct serve_opts *o = s->o;
    int rc;
    if ((rc = gguf_open(o->model_path, &L->f, err))) return rc;
    if ((rc = tokenizer_load(L->f, &L->tok, err))) return rc;
    if (tokenizer_pre_is_fallback(L->tok))
        fprintf(stderr, "quern serve: warning: unknown pre-tokenizer '%s'; using GPT-2's\n",
                tokenizer_pre_name(L->tok));
    struct qerr cerr = {0};
    if (cli_chat_template(L->f, o->chat_template, &L->chat, &cerr) == 0) {
        L->has_chat = true;
    } else if (o->chat_template) {
        return qerr_set(err, cerr.code, "%s", cerr.msg); /* asked for: not served without it */
    } else {
        snprintf(s->chat_error, sizeof s->chat_error, "%s", cerr.msg);
        fprintf(stderr, "quern serve: warning: no chat endpoint: %s\n", cerr.msg);
    }
    if ((rc = cli_backends_open("serve", &o->be, o->threads, &L->grp, err))) return rc;
    struct engine_opts eo;
    engine_opts_default(&eo);
    if (o->max_batch_tokens) eo.max_batch_tokens = o->max_batch_tokens;
    if (o->max_seqs) eo.max_seqs = o->max_seqs;
    if (o->max_queue) eo.max_queue = o->max_queue;
    if (o->kv_mem) eo.kv_mem = o->kv_mem;
    if (o->ctx) eo.ctx_len = o->ctx;
    eo.rope_freq_base = o->be.knobs.rope_freq_base;
    eo.rope_scale = o->be.knobs.rope_scale;
    eo.stall_timeout_s = o->stall_timeout_s;
    struct cli_spec sp = o->spec;
    if ((rc = cli_spec_open(&sp, err))) return rc;
    L->draft = sp.draft_file;
    eo.spec = sp.mode;
    eo.draft_file = L->draft;
    if (o->spec.k) eo.spec_k = o->spec.k;
    if (o->spec.step_tokens) eo.spec_step_tokens = o->spec.step_tokens;
    eo.spec_policy = o->spec.policy;
    if (o->spec.history_set) eo.spec_history = o->spec.history;
    eo.mask_mode = o->mask_mode;
    eo.loras = o->lora.specs; /* named by cli_lora_specs in cli_serve */
    eo.n_loras = o->lora.n;
    if (o->lora_runtime) eo.max_loras = ENGINE_MAX_LORAS;
    if (o->trace_path &&
        (rc = trace_create(TRACE_DEFAULT_STEPS, TRACE_DEFAULT_REQUESTS, &L->trace, err)))
        return rc;
    eo.trace = L->trace;
    eo.tp = L->grp.n;
    eo.tp_backends = L->grp.be;
    eo.tp_comms = L->grp.comm;
    if ((rc = engine_create(L->f, L->tok, L->grp.be[0], &eo, &L->e, err))) return rc;
    s->tok = L->tok;
    s->chat = L->has_chat ? &L->chat : NULL;
    s->vocab = tokenizer_vocab_size(L->tok);
    s->ctx_len = engine_ctx_len(L->e);
    s->pool_tokens = engine_pool_tokens(L->e);
    return 0;
}

static void unload(struct loaded *L)
{
    engine_free(L->e);
    gguf_close(L->draft);
    trace_free(L->trace);
    backend_group_free(&L->grp);
    if (L->has_chat) chat_template_free(&L->chat);
    tokenizer_free(L->tok);
    gguf_close(L->f);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* SIGTERM/SIGINT, taken by one thread so that a signal is seen whatever the main thread is
 * doing (loading, draining, joining): the first starts the drain, the second cuts it short,
 * and if the orderly shutdown has not finished FORCE_EXIT_S after it (or a third comes), the
 * process exits at once. */
#define FORCE_EXIT_S 3.0
struct sigwatch {
    sigset_t set;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    int count;         /* signals so far */
    int last;          /* the last one */
    bool done;         /* the main thread has shut everything down */
    pthread_t thread;
    void (*on_usr1)(void *ctx); /* SIGUSR1, on the signal thread under mu; NULL: ignored */
    void *usr1_ctx;
};

static void sigwatch_on_usr1(struct sigwatch *w, void (*fn)(void *), void *ctx)
{
    pthread_mutex_lock(&w->mu);
    w->on_usr1 = fn;
    w->usr1_ctx = ctx;
    pthread_mutex_unlock(&w->mu);
}

static void deadline_in(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    double ns = (double)ts->tv_nsec + s * 1e9;
    ts->tv_sec += (time_t)(ns / 1e9);
    ts->tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
}

static void *sigwatch_main(void *arg)
{
    struct sigwatch *w = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&w->set, &sig) != 0) continue;
        pthread_mutex_lock(&w->mu);
        if (w->done) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        if (sig == SIGUSR1) { /* not a shutdown signal */
            if (w->on_usr1) w->on_usr1(w->usr1_ctx);
            pthread_mutex_unlock(&w->mu);
            continue;
        }
        int n = ++w->count;
        w->last = sig;
        pthread_cond_broadcast(&w->cv);
        if (n == 2) {
            /* the orderly shutdown gets FORCE_EXIT_S; a third signal ends the wait */
            double end = now_s() + FORCE_EXIT_S;
            while (!w->done && now_s() < end) {
                pthread_mutex_unlock(&w->mu);
                struct timespec tick = {.tv_sec = 0, .tv_nsec = 50 * 1000000L};
                int more = sigtimedwait(&w->set, NULL, &tick);
                pthread_mutex_lock(&w->mu);
                if (more > 0 && more != SIGUSR1) break;
            }
        }
        bool done = w->done;
        pthread_mutex_unlock(&w->mu);
        if (done) return NULL;
        if (n >= 2) {
            static const char msg[] = "quern serve: shutdown did not finish; exiting now\n";
            ssize_t ignored = write(2, msg, sizeof msg - 1);
            (void)ignored;
            _exit(EXIT_RUNTIME);
        }
    }
}

static int sigwatch_start(struct sigwatch *w, const sigset_t *set)
{
    *w = (struct sigwatch){.set = *set};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&w->mu, NULL) || pthread_cond_init(&w->cv, &ca) ||
             pthread_create(&w->thread, NULL, sigwatch_main, w);
    pthread_condattr_destroy(&ca);
    return rc;
}

/* Waits up to timeout_s (< 0: forever) until more than `seen` signals came; the count. */
static int sigwatch_wait(struct sigwatch *w, int seen, double timeout_s)
{
    struct timespec until;
    if (timeout_s >= 0) deadline_in(&until, timeout_s);
    pthread_mutex_lock(&w->mu);
    while (w->count <= seen) {
        if (timeout_s < 0)
            pthread_cond_wait(&w->cv, &w->mu);
        else if (pthread_cond_timedwait(&w->cv, &w->mu, &until))
            break;
    }
    int n = w->count;
    pthread_mutex_unlock(&w->mu);
    return n;
}

static void sigwatch_stop(struct sigwatch *w)
{
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_kill(w->thread, SIGTERM); /* blocked everywhere: only its sigwait takes it */
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* --trace: the trace written on SIGUSR1, with the engine's counters of the moment. */
struct trace_dump {
    struct serve *s;
    struct trace *trace;
    const char *path;
};

static void trace_dump(void *ctx)
{
    struct trace_dump *d = ctx;
    struct engine_stats st;
    bool have = serve_stats(d->s, &st);
    struct qerr err = {0};
    if (trace_write(d->trace, d->path, have ? &st : NULL, &err))
        fprintf(stderr, "quern serve: %s\n", err.msg);
    else
        fprintf(stderr, "quern serve: trace written to %s\n", d->path);
}

/* Lets in-flight requests finish for up to timeout_s; false when another signal (beyond
 * `seen`) cut it short. */
static bool drain(struct serve *s, struct sigwatch *w, int seen, double timeout_s)
{
    double end = now_s() + timeout_s;
    while (atomic_load(&s->inflight) > 0) {
        double left = end - now_s();
        if (left <= 0) return true;
        if (sigwatch_wait(w, seen, left < 0.05 ? left : 0.05) > seen) return false;
    }
    return true;
}

int cli_serve(int argc, char **argv)
{
    /* cJSON's allocation failures are noticed (and, under fault injection, counted) */
    json_oom_install();
    struct serve_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? EXIT_OK : rc;
    char name[256];
    if (o.n_served_names == 0)
        o.served_names[o.n_served_names++] = basename_of(o.model_path, name, sizeof name);
    o.served_name = o.served_names[0];
    cli_lora_specs(&o.lora);
    for (int i = 0; i < o.lora.n; i++)
        for (int j = 0; j < o.n_served_names; j++)
            if (!strcmp(o.lora.names[i], o.served_names[j])) {
                fprintf(stderr, "quern serve: LoRA adapter '%s' has the model's name\n",
                        o.served_names[j]);
                return EXIT_USAGE;
            }

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    sigdelset(&set, SIGPIPE);
    struct sigwatch w;
    if (sigwatch_start(&w, &set)) {
        fprintf(stderr, "quern serve: cannot start the signal thread\n");
        return EXIT_RUNTIME;
    }

    struct serve s = {.o = &o, .started = (long long)time(NULL)};
    atomic_init(&s.state, SERVE_LOADING);
    atomic_init(&s.inflight, 0);
    serve_lora_init(&s);
    if (metrics_init(&s.metrics) || pthread_rwlock_init(&s.lock, NULL)) {
        fprintf(stderr, "quern serve: out of memory\n");
        sigwatch_stop(&w);
        return EXIT_RUNTIME;
    }
    struct qerr err = {0};
    struct http_server *h = NULL;
    struct loaded L = {0};
    int exit_code = EXIT_RUNTIME;
    if ((rc = http_start(&s, &h, &err))) goto out;
    fprintf(stderr, "quern serve: listening on http://%s%s%s:%d (loading %s)\n",
            strchr(o.host, ':') ? "[" : "", o.host, strchr(o.host, ':') ? "]" : "", http_port(h),
            o.model_path);

    double t0 = now_s();
    if ((rc = load(&s, &L, &err))) goto out;
    pthread_rwlock_wrlock(&s.lock);
    s.engine = L.e;
    pthread_rwlock_unlock(&s.lock);
    atomic_store(&s.state, SERVE_READY);
    struct trace_dump dump = {.s = &s, .trace = L.trace, .path = o.trace_path};
    if (L.trace) sigwatch_on_usr1(&w, trace_dump, &dump);
    fprintf(stderr, "quern serve: ready in %.2f s: model '%s', context %d tokens%s%s\n",
            now_s() - t0, o.served_name, s.ctx_len, o.api_key ? ", API key required" : "",
            s.chat ? "" : ", no chat template");
    /* what fits, as vLLM's "maximum concurrency" line: the pool in tokens and in full contexts */
    struct engine_stats st;
    engine_get_stats(L.e, &st);
    long long pool = (long long)st.kv_blocks_total * st.kv_block_size;
    fprintf(stderr,
            "quern serve: KV pool: %lld tokens (%d blocks of %d), %.1f sequences at the "
            "full %d-token context\n",
            pool, st.kv_blocks_total, st.kv_block_size,
            s.ctx_len > 0 ? (double)pool / s.ctx_len : 0.0, s.ctx_len);
    fault_mark("ready");

    int seen = sigwatch_wait(&w, 0, -1);
    fprintf(stderr, "quern serve: %s: draining (%ld in flight, up to %.0f s)\n",
            w.last == SIGINT ? "SIGINT" : "SIGTERM", (long)atomic_load(&s.inflight),
            o.drain_timeout_s);
    atomic_store(&s.state, SERVE_DRAINING);
    engine_drain(L.e);
    bool patient = seen < 2 && drain(&s, &w, seen, o.drain_timeout_s);
    long left = (long)atomic_load(&s.inflight);
    if (left)
        fprintf(stderr, "quern serve: aborting %ld request%s%s\n", left, left == 1 ? "" : "s",
                patient ? " still running" : " (second signal)");
    /* Order matters: take the engine from the handlers, stop it (every request gets its final
     * event, so no HTTP thread waits on the engine any more), let the HTTP threads send those
     * last chunks, stop HTTP (joining its threads, which release their requests), and only
     * then free the engine. */
    pthread_rwlock_wrlock(&s.lock);
    s.engine = NULL;
    pthread_rwlock_unlock(&s.lock);
    engine_stop(L.e);
    if (L.trace) {
        sigwatch_on_usr1(&w, NULL, NULL);
        struct engine_stats st;
        engine_get_stats(L.e, &st);
        struct qerr terr = {0};
        if (trace_write(L.trace, o.trace_path, &st, &terr))
            fprintf(stderr, "quern serve: %s\n", terr.msg);
        else
            fprintf(stderr, "quern serve: trace written to %s\n", o.trace_path);
    }
    if (patient) drain(&s, &w, seen, 5.0);
    exit_code = EXIT_OK;
out:
    if (exit_code != EXIT_OK) fprintf(stderr, "quern serve: %s\n", err.msg);
    if (L.e) engine_stop(L.e); /* a failed start: nothing may wait on it while HTTP stops */
    http_stop(h);
    unload(&L);
    pthread_rwlock_destroy(&s.lock);
    metrics_free(&s.metrics);
    serve_lora_destroy(&s);
    sigwatch_stop(&w);
    if (exit_code == EXIT_OK) fprintf(stderr, "quern serve: stopped\n");
    fault_mark("exit");
    return exit_code;
}
