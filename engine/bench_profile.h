/* bench_profile: the per-op table of profiled steps (kernels/backend_profile.h), for
 * `quern bench --profile` and `quern bench --kernels --model M --profile`. */
#ifndef QUERN_BENCH_PROFILE_H
#define QUERN_BENCH_PROFILE_H

#include <stdio.h>

#include "../kernels/backend.h"

/* What an op is compared with; 0: not measured on this backend (the column shows "-"). */
struct bench_ceilings {
    double read_gbs;  /* memory read bandwidth, GB/s */
    double peak_gops; /* compute peak of the matmuls' arithmetic, G(FL)OP/s */
    const char *peak_what;
};

/* Prints a markdown table of prof's rows, per step over `steps` steps that took step_s seconds
 * each in all: op, shape, calls, µs, share of the step, GB/s, G(FL)OP/s and the share of the op's
 * roofline reached (the larger of bytes/bandwidth and flops/peak), then the time outside the
 * backend's ops. */
void bench_profile_print(FILE *out, const char *title, struct backend *prof, double step_s,
                         int steps, const struct bench_ceilings *c);

#endif
