/* serve: the state `quern serve` shares between its main thread (lifecycle, cli_serve.c), the
 * HTTP threads (http.c, api.c) and, through the engine API, the engine thread.
 *
 * Lifetimes: the tokenizer and chat template are set before state becomes SERVE_READY and freed
 * only after the HTTP daemon has stopped, so handlers read them without locks. The engine
 * pointer is guarded by lock: handlers hold it for reading around engine_submit and
 * engine_get_stats; the main thread takes it for writing to take the engine away before
 * engine_free. Requests already submitted stay valid after engine_free until released. */
#ifndef QUERN_SERVE_H
#define QUERN_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "../engine/chat.h"
#include "../engine/engine.h"
#include "../engine/tokenizer.h"
#include "cli.h"
#include "metrics.h"

#define SERVE_MAX_NAMES 8

struct serve_opts {
    const char *model_path;
    const char *host;
    int port; /* 0: any free port (the log line says which) */
    int threads;
    size_t kv_mem;
    int max_batch_tokens, max_seqs, max_queue, ctx;
    const char *api_key;     /* NULL: no authentication */
    const char *served_name; /* the model id responses carry: served_names[0] */
    /* --served-model-name NAME[,ALIAS...] (repeatable): the ids a request's "model" may name */
    const char *served_names[SERVE_MAX_NAMES];
    int n_served_names;
    double drain_timeout_s;
    double watchdog_s;
    size_t max_body;
    int max_connections;
    int max_conns_per_client; /* 0: no cap per client address */
    double request_timeout_s; /* a request's head and body must arrive within it; 0: no limit */
    double stall_timeout_s;   /* a stream whose client reads nothing that long is aborted */
    const char *trace_path;   /* --trace: engine/trace.h's file; NULL: no trace */
    bool log_json;
    struct cli_backend_args be; /* --precision, --device, --tp, --batch-invariant, the knobs */
    bool chat_parse_special;    /* --chat-parse-special: control tokens in message content count */
    /* --chat-template: a format's name or a template (NULL: the model's) */
    const char *chat_template;
    bool no_reasoning_split; /* --reasoning-format none: a <think> block stays in content */
    /* --chat-template-kwargs' enable_thinking: what a request that names none gets (true) */
    bool no_thinking;
    enum engine_pooling pooling;     /* --pooling: /v1/embeddings' pooling (default mean) */
    struct cli_spec spec;            /* --spec, --spec-k */
    bool no_webui;                   /* --no-webui: no page at / (server/webui.h) */
    enum engine_mask_mode mask_mode; /* --mask-mode (engine_opts.mask_mode) */
    struct cli_loras lora;           /* --lora, --lora-scaled: a request names one as its model */
    /* --lora-runtime: POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's) load and
     * unload adapters while serving, up to ENGINE_MAX_LORAS in all */
    bool lora_runtime;
};

enum serve_state { SERVE_LOADING = 0, SERVE_READY = 1, SERVE_DRAINING = 2 };

struct serve {
    const struct serve_opts *o;
    atomic_int state;      /* enum serve_state */
    pthread_rwlock_t lock; /* guards engine */
    struct engine *engine; /* NULL while loading and after shutdown */
    const struct tokenizer *tok;
    const struct chat_template *chat; /* NULL when the model has no usable template */
    char chat_error[512];             /* why not */
    int ctx_len, vocab;
    int pool_tokens; /* what the KV pool holds (engine_pool_tokens) */
    struct metrics metrics;
    atomic_long inflight; /* engine requests submitted and not yet released */
    long long started;    /* unix seconds, the models' "created" */
    /* the LoRA adapters a request may name (server/api_lora.c): --lora's, and those loaded
     * since (--lora-runtime); lora_admin serializes loads and unloads */
    pthread_mutex_t lora_mu, lora_admin;
    struct serve_lora {
        char name[LORA_NAME_MAX];
        int lora;     /* gen_request.lora */
        uint32_t gen; /* gen_request.lora_gen */
    } loras[ENGINE_MAX_LORAS];
    int n_loras;
};

/* The LoRA registry (server/api_lora.c): --lora's adapters at the start. */
void serve_lora_init(struct serve *s);
void serve_lora_destroy(struct serve *s);
/* The adapter named name (a copy in *out), or false. */
bool serve_lora_find(struct serve *s, const char *name, struct serve_lora *out);
/* A copy of every adapter (out: ENGINE_MAX_LORAS entries); returns how many. */
int serve_lora_list(struct serve *s, struct serve_lora *out);

/* engine_submit under the read lock; QERR_FULL with "draining" once the engine is gone. */
int serve_submit(struct serve *s, const struct gen_request *r, struct request **out,
                 struct qerr *err);
/* Releases a request from serve_submit (aborting it first when abort is set). */
void serve_release(struct serve *s, struct request *r, bool abort);
/* engine_get_stats under the read lock; false when there is no engine. */
bool serve_stats(struct serve *s, struct engine_stats *st);
/* engine_get_state (engine/engine_state.h) under the read lock; false when there is no engine. */
struct engine_state;
bool serve_engine_state(struct serve *s, struct engine_state *st);

#endif
