/* bench_util: what the benchmarks share (engine/bench_*.c, tools/bench-cuda.c): a clock, a
 * seeded random stream the caller owns, random weights in a file's block layout, and the
 * parsing of their count options. */
#ifndef QUERN_BENCH_UTIL_H
#define QUERN_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../quant/qtypes.h"

double bench_now_s(void); /* CLOCK_MONOTONIC seconds */

/* xorshift64: benchmark inputs only (not for sampling). Start it with any non-zero state. */
struct bench_rng {
    uint64_t s;
};
#define BENCH_RNG_INIT                                                                             \
    {                                                                                              \
        0x9e3779b97f4a7c15ull                                                                      \
    }

uint64_t bench_rng_next(struct bench_rng *r);
float bench_rng_float(struct bench_rng *r); /* uniform in [-1, 1) */

/* malloc'd random bytes in the file layout of type t for rows x cols weights, with sane block
 * scales (Q4_0/Q4_1/Q8_0: |d| <= d_scale, Q4_1 |m| <= m_scale; F16: values within m_scale);
 * NULL when out of memory. */
void *bench_random_weights(struct bench_rng *r, enum qtype t, int64_t rows, int64_t cols,
                           float d_scale, float m_scale);

/* A whole number in [lo, hi] that is all of text, into *out; else false. */
bool bench_parse_count(const char *text, long lo, long hi, int *out);
/* 1..max comma-separated counts in [lo, hi] (no empty item, no trailing comma) into out[],
 * their number into *n; else false. */
bool bench_parse_counts(const char *text, long lo, long hi, int *out, int max, int *n);

#endif
