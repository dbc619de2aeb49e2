/* trace: a bounded record of the engine's steps and requests, written in the Chrome trace event
 * format (open it in https://ui.perfetto.dev or chrome://tracing).
 *
 * The engine thread appends one record per step and one per finished request into two rings of
 * fixed size (the oldest records go first); trace_write may run on any thread at any time (at
 * exit, on SIGUSR1): it copies the rings under the lock and writes without holding it. A step
 * shows as a slice with its batch (sequences, prefill and decode tokens, KV blocks in use,
 * preemptions) and two slices inside it, the forward and the sampling; a request as an async
 * slice with its queued, prefill and decode phases. Every TRACE_OPS_EVERY-th step also records
 * each backend op of its forward as a slice inside it (trace_wrap_backend), into a third ring.
 * Off (no trace) costs one pointer test per step. */
#ifndef QUERN_TRACE_H
#define QUERN_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "../quant/qerr.h"

struct engine_stats;

#define TRACE_DEFAULT_STEPS    20000
#define TRACE_DEFAULT_REQUESTS 20000
#define TRACE_OPS_EVERY        16    /* steps whose ops are recorded: 1 in this many */
#define TRACE_MAX_OPS          50000 /* op slices kept (~120 sampled steps of a 30-layer model) */

/* Times are engine_now() seconds (CLOCK_MONOTONIC). */
struct trace_step {
    double t_begin, t_forward, t_sample, t_end; /* plan, forward, sampling + detokenizing */
    double sampler_s; /* of t_sample..t_end, the sampler's (summed over the step's sequences) */
    int n_seqs, prefill_tokens, decode_tokens; /* prefill: prompt chunks and recomputation */
    int prompt_tokens;                         /* of prefill, new prompt tokens (engine stats') */
    int sampled;                               /* tokens sampled (engine stats' generation) */
    int kv_blocks_used, preemptions, paused;
};

struct trace_request {
    uint64_t id;
    double t_submit, t_admit, t_first, t_end; /* t_admit, t_first 0 when never reached */
    int prompt_tokens, completion_tokens, cached_tokens;
    int finish; /* enum finish_reason */
};

struct trace;
struct backend;

int trace_create(size_t max_steps, size_t max_requests, struct trace **out, struct qerr *err);
void trace_free(struct trace *t);

void trace_add_step(struct trace *t, const struct trace_step *s);
/* The engine thread, before each step: decides whether this step's ops are recorded. */
void trace_step_begin(struct trace *t);
/* A backend that runs inner's ops and, in the steps trace_step_begin samples, records each as a
 * slice (kernels/backend_wrap.h); the engine loads its model on it. Does not own inner. */
int trace_wrap_backend(struct trace *t, struct backend *inner, struct backend **out,
                       struct qerr *err);
void trace_add_request(struct trace *t, const struct trace_request *r);

/* Writes the trace to path (replacing it). stats, when given, go into the file's metadata
 * ("otherData") so a reader can check the steps against the engine's counters. */
int trace_write(struct trace *t, const char *path, const struct engine_stats *stats,
                struct qerr *err);

#endif
