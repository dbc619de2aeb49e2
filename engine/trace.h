/* trace: a bounded record of the engine's steps and requests, written in the Chrome trace event
 * format (open it in https://ui.perfetto.dev or chrome://tracing).
 *
 * The engine thread appends one record per step and one per finished request into two rings of
 * fixed size (the oldest records go first); trace_write may run on any thread at any time (at
 * exit, on SIGUSR1): it copies the rings under the lock and writes without holding it. A step
 * shows as a slice with its batch (sequences, prefill and decode tokens, KV blocks in use,
 * preemptions) and two slices inside it, the forward and the sampling; a request as an async
 * slice with its queued, prefill and decode phases. Off (no trace) costs one pointer test per
 * step. */
#ifndef QUERN_TRACE_H
#define QUERN_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "../quant/qerr.h"

struct engine_stats;

#define TRACE_DEFAULT_STEPS    20000
#define TRACE_DEFAULT_REQUESTS 20000

/* Times are engine_now() seconds (CLOCK_MONOTONIC). */
struct trace_step {
    double t_begin, t_forward, t_sample, t_end; /* plan, forward, sampling + detokenizing */
    int n_seqs, prefill_tokens, decode_tokens;  /* prefill: prompt chunks and recomputation */
    int prompt_tokens;                          /* of prefill, new prompt tokens (engine stats') */
    int sampled;                                /* tokens sampled (engine stats' generation) */
    int kv_blocks_used, preemptions, paused;
};

struct trace_request {
    uint64_t id;
    double t_submit, t_admit, t_first, t_end; /* t_admit, t_first 0 when never reached */
    int prompt_tokens, completion_tokens, cached_tokens;
    int finish; /* enum finish_reason */
};

struct trace;

int trace_create(size_t max_steps, size_t max_requests, struct trace **out, struct qerr *err);
void trace_free(struct trace *t);

void trace_add_step(struct trace *t, const struct trace_step *s);
void trace_add_request(struct trace *t, const struct trace_request *r);

/* Writes the trace to path (replacing it). stats, when given, go into the file's metadata
 * ("otherData") so a reader can check the steps against the engine's counters. */
int trace_write(struct trace *t, const char *path, const struct engine_stats *stats,
                struct qerr *err);

#endif
