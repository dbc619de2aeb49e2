/* bench_decode: decode throughput of B sequences stepping together through the engine's own
 * forward (engine/model.c: the backend's step replay and its padding included), the figure
 * `quern bench --decode-batches` and quern-bench-cuda report against the bandwidth roofline.
 *
 * Each of the B sequences gets its own KV blocks and a prefilled context of ctx random tokens
 * (one forward per sequence); then `steps` decode steps run all B at once, one token each, logits
 * for every sequence copied to the host as the engine does. Only the decode steps are timed. */
#ifndef QUERN_BENCH_DECODE_H
#define QUERN_BENCH_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct decode_bench {
    int batch, ctx, steps;
    double step_s;     /* seconds per decode step (mean over the timed steps) */
    double prefill_s;  /* seconds to prefill the B contexts */
    double read_bytes; /* bytes one step must read: every weight once, K and V of each context */
};

/* Model options that fit bench_decode_run up to max_batch sequences of ctx + steps positions. */
void bench_decode_model_opts(int max_batch, int ctx, int steps, struct model_opts *mo);

/* Runs one measurement on m (loaded on be with bench_decode_model_opts for at least `batch`).
 * prof: NULL, or the profile wrapper (kernels/backend_profile.h) that be is or wraps, reset as the
 * timed steps begin, so its rows afterwards are the decode steps alone. */
int bench_decode_run(struct model *m, struct backend *be, double weight_bytes, int batch, int ctx,
                     int steps, uint64_t seed, struct backend *prof, struct decode_bench *out,
                     struct qerr *err);

#endif
