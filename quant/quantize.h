/* quantize: reference (scalar) quantizers, the inverse of qtype_dequantize_row.
 *
 * Each one rounds exactly as ggml's reference quantizers (ggml-quants.c, quantize_row_*_ref)
 * do, so a file quern writes holds the same bytes llama-quantize would write from the same
 * floats (ggml's own build may contract a multiply-add into an FMA; see docs/quant.md):
 *
 *   Q8_0: d = amax / 127, q = roundf(x / d)          (roundf: half away from zero)
 *   Q4_0: d = max / -8 where max is the element of largest magnitude (the first one on a tie),
 *         q = min(15, trunc(x / d + 8.5))            (the extreme element lands on nibble 0)
 *   Q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5))
 *
 * "x / d" is x * (1/d) in float with the unrounded d; only the stored d (and m) are rounded to
 * fp16 (round to nearest even). An all-zero block stores d = 0 (Q4_0: -0, as max / -8 is) and
 * nibbles that decode to 0.
 * Inputs must be finite: a NaN or infinity gives unspecified (but memory-safe) blocks. */
#ifndef QUERN_QUANTIZE_H
#define QUERN_QUANTIZE_H

#include <stddef.h>

#include "qerr.h"
#include "qtypes.h"

/* n is a multiple of QK; y has n / QK blocks. */
void quantize_row_q8_0(const float *x, struct block_q8_0 *y, size_t n);
void quantize_row_q4_0(const float *x, struct block_q4_0 *y, size_t n);
void quantize_row_q4_1(const float *x, struct block_q4_1 *y, size_t n);

/* Q8_0 with each block's scale searched (quantize_search.c): candidate scales near the reference
 * one and the block's own grid step over 1, 2, 3, ..., each refitted by least squares, judged by
 * the squared error under the fp16-rounded scale; the reference scale is a candidate, so the
 * error is never larger. */
void quantize_row_q8_0_search(const float *x, struct block_q8_0 *y, size_t n);

enum qround {
    QROUND_REF = 0,    /* ggml's reference rounding: llama-quantize's bytes */
    QROUND_SEARCH = 1, /* searched scales for Q8_0 (Q4_0 and Q4_1 keep the reference) */
};

/* True when qtype_quantize_row can produce type t (F32, F16, Q8_0, Q4_0, Q4_1). */
bool qtype_can_quantize(enum qtype t);

/* Writes n floats as qtype_row_bytes(t, n) bytes of type t. QERR_UNSUPPORTED for a type that
 * cannot be produced, QERR_INVALID when n is not a multiple of the type's block. */
int qtype_quantize_row(enum qtype t, enum qround round, const float *x, void *dst, size_t n,
                       struct qerr *err);

#endif
