/* engine_state: a picture of the engine for live views (GET /v1/engine/state, the web page's
 * engine view): the requests it holds and what each is doing, the KV pool block by block, the
 * batch split of its last steps, and a per-second history of throughput and time to first token.
 *
 * The engine thread publishes it without ever waiting for a reader. DESIGN: a triple buffer.
 * The engine fills its back copy, then swaps it with the middle one in one atomic exchange that
 * also marks it fresh; a reader (under a lock only readers take) swaps its front copy with a
 * fresh middle one and copies the front out. Neither side ever touches a copy the other owns, so
 * no reader can stall a step, and a slow reader only sees an older picture. Per step the engine
 * records its step and history in O(1); it publishes (O(requests listed + pool blocks)) at most
 * every ENGINE_STATE_PERIOD_S while busy, and always when it runs out of work, so a reader of an
 * idle engine sees its final state. What both cost the engine thread is measured and published
 * with the picture (step_cost_ns_*). */
#ifndef QUERN_ENGINE_STATE_H
#define QUERN_ENGINE_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

#define ENGINE_STATE_MAX_REQS  128  /* requests listed: running first, then waiting */
#define ENGINE_STATE_MAX_CELLS 4096 /* cells in the pool picture (a cell covers >= 1 block) */
#define ENGINE_STATE_STEPS     64   /* the last steps kept */
#define ENGINE_STATE_HISTORY   180  /* seconds of history */
#define ENGINE_STATE_PERIOD_S  0.02 /* publications at most this often while the engine works */

enum engine_req_phase {
    ENGINE_REQ_WAITING = 0, /* queued, never admitted */
    ENGINE_REQ_PREFILL,     /* admitted, its prompt (or, after preemption, its tokens) computing */
    ENGINE_REQ_DECODE,      /* one token a step */
    ENGINE_REQ_PREEMPTED,   /* admitted once, its blocks taken back: waiting to recompute */
};

const char *engine_req_phase_name(enum engine_req_phase p); /* "waiting", "prefill", ... */

struct engine_req_view {
    uint64_t id; /* submission order, from 1 */
    int phase;   /* enum engine_req_phase */
    bool paused; /* its reader has max_unread events unread */
    int prompt_tokens, computed_tokens, generated_tokens, max_tokens, cached_tokens, blocks;
    int priority; /* gen_request.priority */
    float age_s;  /* since submission, at publication */
};

struct engine_step_view {
    uint64_t step;                     /* the engine's step count after it */
    int prefill_tokens, decode_tokens; /* decode: one token after the prompt (and its draft) */
    int seqs;
    float ms; /* the step's wall time */
};

/* One second of history (CLOCK_MONOTONIC seconds, engine_state.now's clock). */
struct engine_second {
    int64_t t;                  /* which second this slot holds (slot = t % ENGINE_STATE_HISTORY) */
    uint32_t generated, prompt; /* tokens sampled; prompt tokens computed */
    uint32_t ttft_n;            /* requests whose first token came in this second */
    float ttft_sum_ms;
};

struct engine_state {
    uint64_t version; /* publications so far (0: none yet) */
    double now;       /* the engine's clock (engine_now, seconds) at publication */
    double read_now;  /* the same clock when engine_get_state copied it */
    struct engine_stats stats;
    int n_running, n_waiting; /* all of them; the first n_reqs are listed */
    int n_reqs;
    struct engine_req_view reqs[ENGINE_STATE_MAX_REQS];
    int kv_blocks, kv_used, kv_cached_free, blocks_per_cell, n_cells;
    uint8_t cells[ENGINE_STATE_MAX_CELLS]; /* enum kv_cell (kv_cache.h) */
    int n_steps;
    struct engine_step_view steps[ENGINE_STATE_STEPS]; /* oldest first */
    struct engine_second history[ENGINE_STATE_HISTORY];
    /* what keeping this picture cost the engine thread: step_cost_ns_avg is the time of every
     * record and publication so far over the cost_steps steps that ran; _max the largest one */
    uint64_t cost_steps;
    double step_cost_ns_avg, step_cost_ns_max, publish_ns_max;
};

struct engine;

/* The newest published picture (any thread; never blocks the engine thread). */
void engine_get_state(struct engine *e, struct engine_state *out);

#endif
