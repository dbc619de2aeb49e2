/* engine: the only door into model execution. Many requests share one model, one step at a
 * time, on one engine thread that owns the scheduler, the KV block pool and the model; other
 * threads (HTTP workers, the bench driver) only submit requests and read their events.
 *
 * A request's life: engine_submit copies the prompt and parameters and queues it (or refuses:
 * queue full, prompt too long for the context or the pool). The engine thread admits it, prefills
 * it in chunks under the step's token budget, then decodes one token per step, pushing one
 * event per token (with the text it completes) into the request's channel, and a final event
 * with the finish reason and usage. A channel holds at most about max_unread unread events:
 * past that the request waits for its reader, and is aborted when the reader stalls for
 * stall_timeout_s. request_abort may be called at any time from any thread; the request's KV
 * blocks are free by the end of the next step. A request stays valid until released, even
 * after engine_free. */
#ifndef QUERN_ENGINE_H
#define QUERN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "model.h"
#include "sample.h"
#include "spec.h"
#include "spec_policy.h"
#include "tokenizer.h"

/* When constrained sequences' token masks are computed (engine/engine_grammar.c). A mask depends
 * only on the tokens before the step, so it need not wait for the forward; the masks, and so
 * the output, are the same bytes in every mode. */
enum engine_mask_mode {
    ENGINE_MASK_LAUNCH = 0, /* engine thread, once the forward is issued: while a GPU runs it
                               (on the CPU, after the forward: the work is done by then) */
    ENGINE_MASK_THREAD,     /* a helper thread, while the engine thread runs the forward */
    ENGINE_MASK_AFTER,      /* engine thread, each just before its sequence's sampling */
};

struct engine_opts {
    int max_batch_tokens; /* tokens per step, decodes first (default 2048) */
    int max_seqs;         /* sequences running at once (default 64) */
    int max_queue;        /* waiting requests before submit says QERR_FULL (default 256) */
    int kv_block_size;    /* tokens per KV block (default 16) */
    int kv_blocks;        /* KV blocks in the pool; 0: derive from kv_mem */
    size_t kv_mem;        /* bytes for the KV pool when kv_blocks is 0 (default 256 MiB) */
    int ctx_len;          /* max prompt + output tokens per request; 0: the model's */
    /* model_opts' rope overrides (0: the file's); a rope_scale lets ctx_len reach the model's
     * context times the factor it adds to the file's own */
    float rope_freq_base, rope_scale;
    bool prefix_cache; /* reuse cached full blocks of identical prefixes (default on) */
    /* With prefix_cache: a prompt that goes on to match only the first tokens of a cached block
     * takes those tokens' K/V too, copied into a block of its own (default on; a backend without
     * buf_copy computes them instead) */
    bool prefix_partial;
    /* Back-pressure: a request whose reader leaves max_unread events unread takes no decode
     * step until it reads (0: never pause), and one paused for stall_timeout_s seconds is
     * aborted, freeing its KV blocks (0: never). Defaults 64 and 30. */
    int max_unread;
    double stall_timeout_s;
    struct trace *trace; /* engine/trace.h: steps and requests recorded there; NULL: none */
    /* Tensor parallelism (model_opts.tp): tp ranks on tp_backends (tp_backends[0] is the
     * engine's be) and tp_comms; kv_mem then sizes each rank's pool (its KV heads only).
     * 0 or 1: one rank. */
    int tp;
    struct backend *const *tp_backends;
    struct comm *const *tp_comms;
    /* Logits rows a step may spend on prompt logprobs, beyond one per sequence (default 128):
     * a prompt that asks for them is prefilled in chunks of at most this many tokens. >= 1. */
    int prompt_logprob_rows;
    /* Speculative decoding (spec.h): SPEC_OFF (default) or a drafter whose guesses, up to
     * spec_k (1..SPEC_K_MAX, at most kv_block_size; default 8) per sequence and step, are
     * verified in the step's batch with the budget the other sequences leave; the output is
     * byte-identical either way (logprobs and grammar masks included). */
    enum spec_mode spec;
    int spec_k;
    /* Drafts only fill a step up to this many tokens in all (default 8): past it a CPU step
     * costs about its token count, so a draft that may be rejected displaces nothing only in a
     * small step (docs/speculation.md); a GPU stays memory-bound much longer. */
    int spec_step_tokens;
    /* How each sequence's draft length is chosen (spec_policy.h): SPEC_POLICY_COST (default)
     * weighs measured step and draft costs against its acceptance and drafts nothing where that
     * does not pay; SPEC_POLICY_ACCEPTANCE follows acceptance alone (no timing: tests that need
     * drafts to happen use it). Either way the output is the same. */
    enum spec_policy spec_policy;
    /* SPEC_NGRAM: tokens of finished answers the drafter also drafts from (spec_history.h;
     * default 65536, 0: none), where a sequence's own context has no match. */
    long spec_history;
    bool check_invariants;           /* tests: check the pool and sequences after every step */
    enum engine_mask_mode mask_mode; /* default ENGINE_MASK_LAUNCH (docs/benchmarks.md) */
    /* SPEC_DRAFT: the draft model's GGUF (borrowed; it must outlive the engine), with the
     * target's vocabulary. It runs on the engine's backend, its K/V in the same pool blocks as
     * the target's: kv_mem then pays for both (docs/speculation.md). Not with tp > 1. */
    const struct gguf_file *draft_file;
    /* LoRA adapters loaded with the model (model_opts.loras; not with tp > 1; at most
     * ENGINE_MAX_LORAS): a request picks one by gen_request.lora. The specs are read while
     * engine_create runs. */
    const struct lora_spec *loras;
    int n_loras;
    /* slots for adapters loaded while the engine runs (engine_lora_load), n_loras..
     * ENGINE_MAX_LORAS; 0: n_loras (none can be added) */
    int max_loras;
};

void engine_opts_default(struct engine_opts *o);

enum finish_reason {
    FINISH_NONE = 0, /* still running */
    FINISH_STOP,     /* EOS, a stop token id or a stop string */
    FINISH_LENGTH,   /* max_tokens or the context length */
    FINISH_ABORT,    /* request_abort, a disconnect, or engine shutdown */
    FINISH_ERROR,    /* the engine failed this request (message in the event) */
};

const char *finish_reason_name(enum finish_reason r); /* "stop", "length", "abort", "error" */

/* How a pooled (embedding) request turns its prompt's final hidden states (after the final
 * norm) into one vector, which is then L2-normalized. */
enum engine_pooling {
    ENGINE_POOL_NONE = 0, /* a generation request */
    ENGINE_POOL_MEAN,     /* the mean over every prompt token */
    ENGINE_POOL_LAST,     /* the last prompt token's (decoder embedding models) */
    ENGINE_POOL_CLS,      /* the first token's (BERT-style [CLS]) */
};

#define ENGINE_MAX_STOPS        8
#define ENGINE_MAX_STOP_BYTES   200 /* the longest stop string */
#define ENGINE_MAX_TOP_LOGPROBS 20
#define ENGINE_MAX_LOGIT_BIAS   1024
#define ENGINE_MAX_BAD_WORDS    128 /* token sequences of bad_words */
#define ENGINE_MAX_BAD_LEN      32  /* tokens in one */

/* OpenAI's logit_bias: bias is added to token's logit before sampling. */
struct logit_bias {
    int32_t token;
    float bias;
};

struct gen_request {
    const int32_t *prompt; /* copied by engine_submit */
    size_t n_prompt;
    struct sample_params sample;
    int max_tokens; /* >= 0; 0 generates nothing (prompt-only: echo/logprobs of the prompt) */
    /* vLLM's min_tokens (0..max_tokens): end-of-generation and the stop ids cannot be sampled
     * before this many tokens are out (stop strings still end the output); not where a grammar
     * allows nothing but the end */
    int min_tokens;
    bool ignore_eos; /* do not stop on end-of-generation tokens */
    int n_stop_ids;
    int32_t stop_ids[ENGINE_MAX_STOPS];
    int n_stop_strings;
    const char *stop_strings[ENGINE_MAX_STOPS]; /* copied; matched on the detokenized text */
    bool include_stop_str; /* vLLM's include_stop_str_in_output: the matched stop string is sent */
    int top_logprobs;      /* -1: no logprobs; 0: the chosen token's; N: and the top N */
    /* Added to these tokens' logits before the grammar mask and the sampler (greedy decoding
     * too); the logprobs a client sees stay the model's own, as vLLM's do. Copied; at most
     * ENGINE_MAX_LOGIT_BIAS, ids in the vocabulary, biases finite. */
    const struct logit_bias *logit_bias;
    int n_logit_bias;
    /* vLLM's allowed_token_ids: only these may be sampled (copied; ids in the vocabulary; 0 of
     * them: any). Masked as the grammar masks, and checked with it: where the two leave nothing
     * the request fails rather than sample a token neither allows. */
    const int32_t *allowed;
    int n_allowed;
    /* vLLM's bad_words as token sequences (the server tokenizes the words): bad_lens[i] tokens
     * each (1..ENGINE_MAX_BAD_LEN), back to back in bad_ids; copied. A sequence's last token is
     * never sampled right after its others in the output (a one-token one, never). */
    const int32_t *bad_ids;
    const int32_t *bad_lens;
    int n_bad;
    /* NULL, or the grammar the output must follow (engine_submit takes its own reference):
     * tokens it does not allow are masked before sampling, end-of-generation only where it
     * accepts; a dead end fails the request (FINISH_ERROR, the message in the event). */
    struct grammar *grammar;
    /* the output's text keeps the tool-call markers (tokenizer_is_tool_marker) that control
     * tokens otherwise lose: set when the request offers tools */
    bool keep_tool_markers;
    /* Prompt logprobs: each prompt token from the second on gets one event (req_event.prompt)
     * with its log-probability given the tokens before it, its rank, and the top
     * prompt_top_logprobs (0..20) alternatives, all before the first generated token. The
     * prompt is then computed in full (no prefix-cache reuse). */
    bool prompt_logprobs;
    int prompt_top_logprobs;
    /* Not NONE: an embedding request (max_tokens must be 0). The prompt is prefilled, its
     * hidden states pooled into one L2-normalized vector that request_embedding returns after
     * the final event (finish reason stop), and its KV blocks freed. */
    enum engine_pooling pooling;
    bool no_spec; /* never speculate for this request, whatever engine_opts.spec says */
    /* vLLM's priority: waiting requests are admitted lowest value first (ties: first come,
     * first served), and when blocks run out the running sequence with the highest value is
     * preempted (ties: the newest). 0 for all is plain first come, first served. */
    int priority;
    /* OpenAI's Predicted Outputs: tokens the output is expected to resemble (copied; ids in the
     * vocabulary, at most the context length). They are drafted from first
     * (spec_draft_prediction) with engine_opts.spec SPEC_NGRAM, before the draft model with
     * SPEC_DRAFT, and alone with SPEC_OFF; the output is the same bytes either way. */
    const int32_t *prediction;
    int n_prediction;
    /* A later choice of one client request (n > 1, or several prompts) whose first choice was
     * just queued: it may take the queue's room beyond max_queue kept for such choices
     * (ENGINE_MAX_GROUP - 1 of them), so that under overload a request of n choices is
     * admitted whenever one of a single choice would be, not only when n places are free. */
    bool joins_group;
    /* 1 + the slot of the LoRA adapter the request runs with (engine_opts.loras' index, or
     * engine_lora_load's); 0: none. Its prompt shares cached K/V only with requests of the same
     * adapter. lora_gen: the adapter's generation as the caller found it (1 for engine_opts'
     * adapters, engine_lora_load's for others); a slot holding another adapter by now refuses
     * the request (QERR_NOTFOUND); 0: whatever the slot holds. */
    int lora;
    uint32_t lora_gen;
};

struct token_logprob {
    int32_t token;
    float logprob;
};

struct req_event {
    bool done;     /* false: a token event; true: the final event */
    bool prompt;   /* a prompt-logprob event: token is a prompt token, no text */
    int32_t token; /* token events: the sampled token */
    int rank;      /* prompt events: 1 + the tokens more likely than token */
    /* Text this event completes: the token's piece, less any bytes held back because they
     * may begin a stop string or an incomplete UTF-8 sequence. May be empty. NUL-terminated. */
    char text[256];
    int text_len;
    float logprob;
    int n_top;
    struct token_logprob top[ENGINE_MAX_TOP_LOGPROBS];
    int completion_tokens; /* tokens generated so far (every event) */
    /* final event only */
    enum finish_reason finish;
    int prompt_tokens, cached_tokens;
    int accepted_tokens; /* output tokens that a speculative draft had guessed */
    int rejected_tokens; /* drafted tokens that were not kept */
    int preemptions;     /* times it was preempted (its K/V dropped, recomputed later) */
    /* What ended a FINISH_STOP other than end of generation (vLLM's stop_reason): the index of
     * the stop string matched (-1: none), or the stop_ids token sampled (-1: none) */
    int stop_string;
    int32_t stop_token;
    double ttft_ms, total_ms, queue_ms;
    char error[256];
    /* FINISH_ERROR that the request's own constraints caused: its allowed tokens, bad words
     * and grammar left no token to sample. The client's to fix (HTTP 400), not the server's. */
    bool request_fault;
};

/* LoRA adapters an engine takes (engine_opts.loras) */
#define ENGINE_MAX_LORAS 8

struct engine_stats {
    int running, waiting;
    /* per LoRA adapter (engine_opts.loras' order): requests running and waiting with it, and
     * those it finished */
    int lora_running[ENGINE_MAX_LORAS], lora_waiting[ENGINE_MAX_LORAS];
    uint64_t lora_finished[ENGINE_MAX_LORAS];
    int kv_blocks_total, kv_blocks_used, kv_blocks_peak;
    int kv_block_size; /* tokens per KV block */
    uint64_t prefix_lookups, prefix_hit_tokens;
    uint64_t preemptions;
    int paused;       /* sequences waiting for their reader (max_unread events unread) */
    uint64_t stalled; /* requests aborted because their reader stalled (stall_timeout_s) */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t steps;
    uint64_t finished[5];   /* indexed by enum finish_reason */
    double last_step_age_s; /* seconds since the engine last finished a step while it had work */
    uint64_t grammar_masks; /* token masks computed for constrained sequences */
    double grammar_mask_s;  /* time spent computing and applying them */
    /* of which: computing masks while the forward ran (engine_opts.mask_mode), and the engine
     * thread's wait for the helper thread after the forward (ENGINE_MASK_THREAD) */
    double grammar_mask_ahead_s, grammar_mask_wait_s;
    /* speculation: drafts verified, tokens drafted, drafted tokens accepted, and how many
     * drafts had 0, 1, .. SPEC_K_MAX tokens accepted */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    uint64_t spec_accepted_hist[SPEC_K_MAX + 1];
    uint64_t spec_draft_errors; /* steps whose draft model failed (they verified no drafts) */
    /* of the drafts: those spelling the bytes a grammar forced next, their tokens and how many
     * of those were accepted */
    uint64_t spec_grammar_drafts, spec_grammar_draft_tokens, spec_grammar_accepted_tokens;
    /* the same for drafts from earlier requests' answers (spec_history.h) */
    uint64_t spec_history_drafts, spec_history_draft_tokens, spec_history_accepted_tokens;
};

struct engine;
struct request;

/* The engine borrows f, tok and be (they must outlive it) and owns the model it loads. */
int engine_create(const struct gguf_file *f, const struct tokenizer *tok, struct backend *be,
                  const struct engine_opts *o, struct engine **out, struct qerr *err);
/* Aborts everything still running or waiting (finish reason abort: each gets its final event)
 * and joins the engine thread; submit then refuses. The engine's memory stays until
 * engine_free, so stats can still be read. Idempotent. */
void engine_stop(struct engine *e);
/* engine_stop, then frees the model. Requests not yet released stay valid until
 * request_release, and request_abort/request_next on them stay safe. */
void engine_free(struct engine *e);

/* The most choices one client request queues (the first and those with joins_group). */
#define ENGINE_MAX_GROUP 64

/* Queues a request. QERR_FULL when the waiting queue is full (max_queue waiting; a request
 * with joins_group: max_queue + ENGINE_MAX_GROUP - 1); QERR_TOO_LONG when prompt +
 * max_tokens exceed the context; QERR_INVALID when the prompt is empty or it could never fit
 * the KV pool (the message has both counts). *out is the caller's reference: release it with
 * request_release. */
int engine_submit(struct engine *e, const struct gen_request *r, struct request **out,
                  struct qerr *err);

/* Waits up to timeout_ms (-1: forever) for the next event: returns 0 with *ev filled, or 1 on
 * timeout. After the final event, further calls return the final event again. */
int request_next(struct request *r, struct req_event *ev, int timeout_ms);
void request_abort(struct request *r);
/* A pooled request's embedding after its final event (finish stop): *dim floats, valid until
 * request_release; NULL before then, for other requests, and for a failed or aborted one. */
const float *request_embedding(struct request *r, int *dim);
void request_release(struct request *r);

void engine_get_stats(struct engine *e, struct engine_stats *s);

/* Loads a LoRA adapter into a free slot while the engine runs (the engine thread does it
 * between steps; the caller waits): *lora is gen_request.lora for it, *gen its lora_gen.
 * QERR_FULL when every slot (engine_opts.max_loras) is taken, the load's error otherwise. */
int engine_lora_load(struct engine *e, const struct lora_spec *spec, int *lora, uint32_t *gen,
                     struct qerr *err);
/* Unloads adapter lora (gen_request.lora) once no request runs with it or waits for it:
 * QERR_FULL while some do (nothing changes), QERR_NOTFOUND for an empty slot. */
int engine_lora_unload(struct engine *e, int lora, struct qerr *err);
const struct model_config *engine_model_config(const struct engine *e);
int engine_ctx_len(const struct engine *e);
/* Tokens the KV pool holds: engine_submit refuses a request whose prompt + max_tokens need more
 * (so a default max_tokens should not ask for more than this). */
int engine_pool_tokens(const struct engine *e);

/* A reference (grammar_unref it) to the compiled grammar of (kind, text), from the engine's
 * cache of recent compilations (any thread). Errors are grammar_compile's. */
int engine_grammar(struct engine *e, enum grammar_kind kind, const char *text, size_t len,
                   struct grammar **out, struct qerr *err);

/* Stops admitting new requests (engine_submit returns QERR_FULL with "draining"). */
void engine_drain(struct engine *e);

#endif
