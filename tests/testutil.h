/* testutil: what the Check suites share: where the real model and golden data are, small file
 * helpers, and the random inputs the kernel, backend and model suites build (one generator, so
 * a seed names the same data in every suite). */
#ifndef QUERN_TESTUTIL_H
#define QUERN_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/model.h"
#include "../kernels/backend.h"
#include "../kernels/cpu/ref.h"

/* $QUERN_MODEL; exits 77 (meson's "skipped") when it is unset or the file is missing. */
const char *tu_model_path(void);
/* $QUERN_GOLDEN, or NULL when unset or missing. */
const char *tu_golden_path(void);
/* Reads a whole file into a malloc'd NUL-terminated buffer; NULL on failure. */
char *tu_read_file(const char *path, size_t *len);
/* Writes len bytes to a new temporary file and returns its malloc'd path. */
char *tu_write_temp(const void *data, size_t len);
/* True when the tests run under a sanitizer (slow): suites shrink their workloads. */
int tu_sanitized(void);
/* QUERN_SANITIZED=thread (tools/tsan.sh): ThreadSanitizer, where a token costs some 50x a
 * release build's; the engine suites cut their prompts further (tu_sanitized() is true too). */
int tu_tsan(void);
/* Whether a test named name runs: every one, or those whose names contain one of the
 * comma-separated words of $QUERN_TEST_ONLY. */
int tu_selected(const char *name);

/* ---- random inputs: xorshift64, reseeded by each test so its data never depends on order ---- */

void tu_seed(uint64_t seed);
uint64_t tu_rnd(void);
/* Uniform in [lo, hi). */
float tu_frand(float lo, float hi);
/* Uniform in [-scale, scale] with a few outliers 8 times larger, as real activations have. */
void tu_fill(float *x, size_t n, float scale);

/* A random weight of type t: host bytes malloc'd into w->host, with sane block scales (random
 * bytes there would make NaNs and infinities). */
void tu_make_weight(struct bweight *w, enum qtype t, int64_t rows, int64_t cols);
void tu_free_weight(struct bweight *w);

/* 1 and the first differing index in *at when a and b differ in any bit. */
int tu_bits_differ(const float *a, const float *b, size_t n, size_t *at);
/* Max over the outputs of y = x W^T of |y - yref| / (sum |w x| + 1e-30): errors of a matmul,
 * normalized by the sum they are rounding. A NaN wins. */
double tu_matmul_error(const struct bweight *w, const float *x, int n, const float *y,
                       const float *yref);
/* x [n][cols] quantized per 32-block as ref_quantize_q8 does, into malloc'd arrays of a. */
void tu_q8_quantize(struct q8act *a, const float *x, int n, int64_t cols);
void tu_q8_free(struct q8act *a);

/* A ragged batch as the scheduler makes them, for batch-invariance tests: sequence 0 is x
 * (tokens [from, n) computed now, [0, from) already in the cache), sequences 1..n_seqs-1 (up to
 * 63) are prefill chunks of 3 + 7s % 29 tokens of `other`. Sequence s owns KV blocks
 * [8s, 8s + 8) of 16 tokens, and asks for the logits of its last token, sequence 0's first.
 * The arrays are static: valid until the next call. */
const struct model_batch *tu_ragged_batch(const int32_t *x, int n, int from, int n_seqs,
                                          const int32_t *other, int n_other);

/* Token t of batch b as a batch of its own (its position, sequence and slot; b's block table). */
static inline struct attn_batch tu_attn_token(const struct attn_batch *b, int t)
{
    struct attn_batch b1 = *b;
    b1.n_tokens = 1;
    b1.pos = b->pos + t;
    b1.seq = b->seq + t;
    b1.slot = b->slot + t;
    return b1;
}

#endif
