/* engine_impl: the state the engine's files share (engine.c: thread, submit, outputs;
 * sched.c: building each step's batch). Not part of the engine's contract. */
#ifndef QUERN_ENGINE_IMPL_H
#define QUERN_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine.h"
#include "grammar_cache.h"
#include "kv_cache.h"
#include "spec_history.h"
#include "spec_model.h"

/* The channel between the engine thread and whoever holds the request. */
struct request {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the client's and the engine's; guarded by mu */
    atomic_bool abort;
    struct req_event *events; /* guarded by mu */
    int n_events, cap_events, read;
    int max_unread; /* > 0: the engine pauses the sequence while this many events are unread */
    bool finished;
    /* NULL once the final event is pushed: the engine may be gone after that. Guarded by mu;
     * whoever holds mu with e set may lock e->mu (never the other way round), because the
     * engine cannot finish this request, and so cannot be freed, until mu is released. */
    struct engine *e;
    /* a pooled request's vector, set by the engine before its final event (then immutable) */
    float *embedding;
    int n_embedding;
};

struct seq {
    struct request *req;
    uint64_t order;    /* admission order: the newest running sequence is preempted first */
    int priority;      /* gen_request.priority */
    int lora;          /* gen_request.lora: 1 + the adapter's slot, 0: none */
    uint64_t root_key; /* seq_root_key */
    int preemptions;   /* times preempted */
    int32_t *tokens;   /* prompt then generated; the last one may not be computed yet */
    int n_tokens, cap_tokens, n_prompt;
    int n_computed; /* tokens whose K/V are in the cache */
    int *blocks;
    int n_blocks, cap_blocks;
    int n_keyed;       /* leading full blocks registered in (or found in) the prefix cache */
    uint64_t last_key; /* key of block n_keyed - 1, seq_root_key when none */
    /* copy_len > 0: the first copy_len tokens of its last block are to be copied from cached
     * block copy_src in the step that admits it (engine_opts.prefix_partial) */
    int copy_src, copy_len;
    int max_tokens, n_generated, cached_tokens;
    bool ignore_eos;
    int n_stop_ids;
    int32_t stop_ids[ENGINE_MAX_STOPS];
    int n_stop_strings;
    char *stop_strings[ENGINE_MAX_STOPS];
    struct logit_bias *logit_bias; /* [n_logit_bias], owned */
    uint64_t *allowed_mask;        /* gen_request.allowed as a token bitmask (owned), or NULL */
    int32_t *bad_ids, *bad_lens;   /* gen_request's bad words (owned) */
    int n_bad;
    int min_tokens;
    bool include_stop_str; /* gen_request.include_stop_str */
    int stop_string;       /* the stop string that ended it, or -1 (req_event.stop_string) */
    int32_t stop_token;    /* the stop id that ended it, or -1 */
    int n_logit_bias;
    int top_logprobs;
    struct sampler sampler;
    struct detok detok;
    char *hold; /* text held back because it may begin a stop string */
    int n_hold, cap_hold;
    double t_submit, t_admit, t_first;
    double paused_since;        /* > 0: its client has had max_unread events unread since then */
    uint64_t id;                /* submission order, from 1 (the trace's request id) */
    struct grammar *grammar;    /* NULL: unconstrained */
    struct grammar_matcher *gm; /* made at its first sampling step (engine thread) */
    /* the mask of its next sampled position, computed while the forward runs (mask_ready) */
    uint64_t *premask;
    int premask_n;
    bool mask_ready;
    bool spec; /* drafts for this sequence are verified (engine_opts.spec, or its prediction) */
    struct spec_state spec_st; /* SPEC_POLICY_ACCEPTANCE's */
    /* SPEC_POLICY_COST's, one per class of draft (spec_match_class); spec_cls: the class of
     * the draft being verified */
    struct spec_rate spec_rate[SPEC_MATCH_CLASSES];
    int spec_cls;
    int spec_accepted; /* output tokens a draft had guessed (the final event's count) */
    int spec_drafted;  /* tokens drafted for it in all (kept or not) */
    int32_t *pred;     /* the request's predicted output (owned), or NULL */
    int n_pred;
    int draft_computed; /* SPEC_DRAFT: leading positions whose draft-model K/V are in blocks */
    char error[200];    /* why it failed, for FINISH_ERROR */
    bool request_fault; /* that failure came from its own constraints (req_event.request_fault) */
    /* prompt logprobs (engine_prefill.c): plp_next is the next prompt position whose
     * logprob is still to be sent (from 1; n_prompt when all are) */
    bool prompt_logprobs;
    int prompt_top, plp_next;
    /* pooling (engine_prefill.c): the running sum of hidden states, in position order */
    enum engine_pooling pooling;
    double *pool_sum; /* [dim] */
    int pool_n;
};

/* The key a sequence's chain of cached-prefix keys starts from: 0 without an adapter, a value of
 * its own for each LoRA adapter (its slot and generation), whose K/V differ from the base
 * model's for the same tokens. */
static inline uint64_t seq_root_key(const struct seq *s)
{
    return s->root_key;
}

/* One step's plan: which tokens of which sequences run, and where their K/V go. */
struct step_plan {
    int n_tokens;
    int32_t *tokens, *pos, *seq_idx, *slot; /* [max_batch_tokens] */
    int n_seqs;
    struct seq **seqs;  /* [max_seqs] sequences in this step */
    int32_t *seq_lora;  /* [max_seqs] their LoRA adapters (model_batch.seq_lora) */
    int *chunk;         /* [max_seqs] tokens each runs */
    bool *wants_logits; /* [max_seqs] chunk ends at the sequence's last token */
    int32_t *logit_idx; /* [logit_rows] */
    int n_logits;
    int *logit_row;      /* [max_seqs] the seq's first logits row: its prompt rows, then its own */
    int *n_plp;          /* [max_seqs] logits rows for prompt logprobs (positions start[i]..) */
    int *start;          /* [max_seqs] the position its chunk starts at */
    int32_t *hidden_idx; /* [max_batch_tokens] tokens whose final hidden states are read */
    int n_hidden;
    int *hidden_row; /* [max_seqs] the seq's first row of those, n_hid of them */
    int *n_hid;
    /* Speculation, per sequence of the step: n_draft guessed tokens follow its chunk's last
     * token at positions n_tokens.. (none are in s->tokens); they sit in the batch from token
     * draft_at, their logits from row draft_row (after every chunk's rows); ext_block is a
     * spare block holding the draft positions past the sequence's own blocks (-1: none). */
    int *n_draft, *draft_at, *draft_row, *ext_block; /* [max_seqs] */
    int32_t *table;                                  /* [max_seqs][max_blocks] */
    int table_cap, max_blocks;
    struct kv_block_copy *copies; /* [max_seqs] K/V the forward copies first (prefix_partial) */
    int n_copies;
};

struct engine {
    struct engine_opts o;
    const struct tokenizer *tok;
    struct backend *be;
    struct backend *traced; /* --trace: be wrapped so sampled steps record their ops; or NULL */
    double step_sampler_s;  /* --trace: this step's time in the sampler (grammar masks included) */
    struct model *model;
    struct kv_pool *pool;
    bool kv_copy; /* prefix_partial is on and the model can copy K/V between blocks */
    int vocab, ctx_len;

    pthread_t thread;
    pthread_mutex_t mu; /* guards incoming, n_incoming, stop, draining, stats, lora_* */
    pthread_cond_t wake;
    /* LoRA slots: the generation of the adapter in each (0: free; a slot's next adapter gets
     * a new one, so a request named for the one before is refused), and the load or unload in
     * flight, which the engine thread carries out between steps (engine_lora_load) */
    uint32_t lora_gen[ENGINE_MAX_LORAS], lora_gen_next;
    int lora_slots;
    struct lora_cmd *lora_cmd;
    pthread_cond_t lora_done;
    pthread_mutex_t lora_mu; /* one command at a time */
    struct seq **incoming;
    int n_incoming, cap_incoming;
    bool stop, draining;
    unsigned wakes;   /* counts wake-ups, so one between a step and the sleep is not lost */
    uint64_t next_id; /* the last request id given (seq.id) */
    bool joined;      /* the engine thread has ended (engine_stop); main thread only */
    struct engine_stats stats;
    int n_waiting_pub;    /* n_waiting as last seen under mu; bounds the queue at submit */
    double last_progress; /* time of the last finished step (or of going idle) */

    /* engine thread only */
    /* by priority, then submission (id): preempted sequences go back before every later
     * submission of their priority (sched_waiting_insert) */
    struct seq **waiting;
    int n_waiting, cap_waiting;
    struct seq **running; /* by priority, then admission order (s->order) */
    int n_running;
    uint64_t next_order;
    struct engine_stats local; /* counters, published into stats under mu after each step */
    struct step_plan plan;
    float *logits;  /* [logit_rows][vocab] */
    int logit_rows; /* sched_logit_rows: a row per sequence, prompt logprobs', drafts' */
    float *hidden;  /* [max_batch_tokens][dim] final-normed hidden states for pooling */
    /* speculation: the drafter; spare blocks (the engine's own, never keyed) that hold draft
     * positions past a sequence's blocks, so a rejected draft takes no block from the pool and
     * evicts no cached prefix; a spare whose draft is accepted becomes the sequence's block and
     * the pool's next free block replaces it (the block plain decoding takes at that point) */
    struct spec_drafter drafter;
    struct spec_history history; /* SPEC_NGRAM: finished answers (engine_opts.spec_history) */
    int spec_k; /* the longest draft: engine_opts.spec_k within 1..min(SPEC_K_MAX, block) */
    /* SPEC_POLICY_COST: the target's and the draft model's measured forward times, and the
     * draft model's share of the target's until it is timed */
    struct spec_cost spec_cost, draft_cost;
    double draft_prior;
    int *spare;
    int n_spare, spare_target;
    struct engine_state_pub *state; /* the live picture (engine_state.c) */
    struct spec_model *draft;       /* SPEC_DRAFT: the draft model, or NULL */
    struct spec_model_seq *dm_seqs; /* [max_seqs] one step's draft-model requests */
    char check_error[600]; /* the first engine_check failure (check_invariants); "" if none */
    float *work;           /* [vocab] */
    /* structured outputs: the cache any thread compiles through; the vocabulary trie, made by
     * the first thread that needs it; the mask buffer (engine thread) */
    struct grammar_cache *grammars;
    pthread_mutex_t gvocab_mu; /* guards gvocab's creation; it is immutable after */
    struct grammar_vocab *gvocab;
    uint64_t *gmask;
    /* masks computed while the forward runs (engine_opts.mask_mode): this step's sequences, and
     * the helper thread of ENGINE_MASK_THREAD (posted/done step counts under mask_mu) */
    struct seq **mask_jobs;
    int n_mask_jobs;
    pthread_t mask_thread;
    bool mask_thread_on, mask_quit;
    pthread_mutex_t mask_mu;
    pthread_cond_t mask_cv;
    unsigned mask_posted, mask_done;
    double jobs_mask_s; /* their time, by whichever thread ran them; read after they end */
};

double engine_now(void);

/* True while s's client has max_unread events unread: s takes no decode step until it reads. */
bool seq_backlogged(const struct seq *s);

/* engine_grammar.c: masks row (the sequence's logits) by s's grammar before sampling; a
 * non-zero return fails s with s->error set. */
int seq_constrain(struct engine *e, struct seq *s, float *row);
/* Moves s's grammar past its sampled token t; non-zero (s->error set) when it cannot. */
int seq_constrain_accept(struct engine *e, struct seq *s, int32_t t);
/* Speculation under s's grammar (sched.c's pass D): given the n-gram drafter's draft[0..n),
 * returns the length of the draft to verify, at most cap: the tokens spelling the bytes the
 * grammar forces next (written to draft, *cls set to SPEC_CLASS_GRAMMAR) unless the n-gram
 * draft already begins with them, else the n-gram draft cut where the grammar stops allowing
 * it. Only tokens are guessed: verification decides as for any draft. */
int seq_grammar_draft(struct engine *e, struct seq *s, int32_t *draft, int n, int cap, int *cls);
/* The masks of this step's constrained sequences, computed while its forward runs: begin
 * before model_forward (lists them; ENGINE_MASK_THREAD starts the helper on them), the hook
 * goes in model_batch.while_running (ENGINE_MASK_LAUNCH), end after model_forward (waits for
 * the helper). A mask not computed this way is computed by seq_constrain as before. */
void grammar_step_begin(struct engine *e, struct model_batch *b);
void grammar_step_end(struct engine *e);
int grammar_overlap_start(struct engine *e, struct qerr *err);
void grammar_overlap_stop(struct engine *e);

/* engine_prefill.c: the outputs of prompt positions, for the sequences that ask. */
/* True while s still needs every prompt position computed (prompt logprobs not all sent, or
 * pooling): it must not take cached prefix blocks. */
bool seq_needs_prompt(const struct seq *s);
/* Logits rows a chunk of s (n tokens from position start) needs for prompt logprobs: the
 * positions from *lo on whose next token's logprob is still to be sent. */
int seq_plp_rows(const struct seq *s, int start, int n, int *lo);
/* Hidden-state rows (positions from start, n tokens) s's pooling needs; with rows non-NULL,
 * also writes the token indices (first: the chunk's first token in the step). */
int seq_hidden_rows(const struct seq *s, int start, int n, int first, int32_t *rows);
/* After the forward: sends plan entry i's prompt logprobs from its rows and adds its hidden
 * rows into its pool. Non-zero: out of memory (s->error set). */
int seq_prefill_outputs(struct engine *e, int i);
/* A pooled sequence whose prompt is all computed: normalizes its vector into its request. */
int seq_pool_finish(struct engine *e, struct seq *s);
/* The top n alternatives of a logits row into ev (engine.c). */
void engine_top_logprobs(const float *logits, int vocab, int n, struct req_event *ev);
/* false when out of memory: the request must then fail (see request_push) */
bool engine_request_push(struct request *r, const struct req_event *ev);
/* engine_check.c: the invariants between steps (pool references, each sequence's blocks, cached
 * keys); 0 or the first violation in err. Engine thread (or after engine_stop). */
int engine_check(const struct engine *e, struct qerr *err);

/* engine_state.c: the live picture engine_get_state reads (engine_state.h). The engine thread
 * records each step that ran and each first token, and publishes after every step (at most
 * every ENGINE_STATE_PERIOD_S unless force: the engine is about to run out of work). */
struct engine_state_pub;
int engine_state_pub_create(struct engine_state_pub **out, struct qerr *err);
void engine_state_pub_free(struct engine_state_pub *p);
void engine_state_record_step(struct engine *e, double t_begin, int prefill, int decode, int seqs,
                              uint32_t generated, uint32_t prompt);
void engine_state_first_token(struct engine *e, double now, double ttft_s);
void engine_state_publish(struct engine *e, bool force);

/* sched.c */
int sched_plan_init(struct step_plan *p, const struct engine_opts *o, struct qerr *err);
void sched_plan_free(struct step_plan *p);
/* Fills e->plan for the next step: decodes first, then prefill chunks, then admissions, under
 * the token budget; preempts running sequences (the highest priority value, the newest of
 * those) when blocks run out. Returns the number of tokens planned (0: nothing can run). */
int sched_step_plan(struct engine *e);
/* Puts s into the waiting queue at its place: after every sequence of a lower priority value,
 * and of the same value submitted before it (capacity was reserved at submit). */
void sched_waiting_insert(struct engine *e, struct seq *s);
/* Releases a sequence's blocks back to the pool (cached prefix blocks stay findable). */
void sched_release_blocks(struct engine *e, struct seq *s);
/* After the forward: marks the planned tokens computed and registers newly full blocks in the
 * prefix cache. Draft tokens are not counted: sched_spec_settle does that once verified. */
void sched_commit(struct engine *e);
/* Whether the engine verifies drafts: a drafter runs (spec ngram or draft), or with spec off a
 * request may bring a prediction to draft from (spec_k in 1..SPEC_K_MAX). */
bool sched_drafts(const struct engine_opts *o);
/* Rows of logits a step may need: one per sequence, plus the drafts'. */
int sched_logit_rows(const struct engine_opts *o);
/* After sequence i of the plan had its draft verified: the first `kept` draft tokens (those
 * that became output and go on) count as computed, the spare block comes back or, holding kept
 * tokens, becomes the sequence's (the pool replaces it), and newly full blocks are keyed. */
void sched_spec_settle(struct engine *e, int i, int kept);
/* A failed step: every spare block the plan took goes back. */
void sched_spec_abandon(struct engine *e);

#endif
