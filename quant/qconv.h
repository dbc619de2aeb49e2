/* qconv: the GGML weight formats a GGUF file may hold that quern's kernels do not read, and the
 * one they are read as. gguf_open converts each such tensor once, into memory it owns, so every
 * consumer (model, quantize, info, the backends) sees only the types of qtypes.h.
 *
 *   Q4_K -> Q4_1: one Q4_1 block per 32-element sub-block, d = fp16(d * sc), m = fp16(-dmin * m):
 *                 the nibbles are the file's; the scale and minimum carry one fp16 rounding
 *                 (relative 2^-11), where the file's product is exact in float
 *   Q5_0 -> Q8_0: q - 16 is the int8, d is the file's: the same values
 *   Q5_1, Q5_K, Q6_K -> Q8_0: dequantized and requantized (quantize_row_q8_0); each element moves
 *                 by at most half a Q8_0 step and the step's fp16 rounding (amax / 254 + amax /
 *                 2048 of its block), against the file's own step of about amax / 15.5 (Q5) or
 *                 amax / 31.5 (Q6) in a (sub-)block; a block with a NaN or infinity (a
 *                 non-finite scale in the file) becomes a Q8_0 block of NaNs
 *
 * Block layouts (ggml-common.h; QK_K = 256 elements a super-block):
 *   Q5_0: fp16 d, uint8 qh[4], uint8 qs[16]:             x = d * (q - 16)
 *   Q5_1: fp16 d, fp16 m, uint8 qh[4], uint8 qs[16]:     x = d * q + m
 *         q = nibble | (bit of qh) << 4; byte j of qs holds elements j and j + 16, bit j of qh
 *         element j's fifth bit, bit j + 16 element j + 16's
 *   Q4_K: fp16 d, fp16 dmin, uint8 scales[12], uint8 qs[128]
 *   Q5_K: fp16 d, fp16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]
 *         x = (d * sc) * q - dmin * m per 32-element sub-block, sc and m 6-bit (scales[]: see
 *         k4_scale_min); qs: 32 bytes per 64 elements, low nibbles the first 32; Q5_K's fifth bits
 *         are bits 2i and 2i + 1 of qh[l] for the 64 elements of chunk i
 *   Q6_K: uint8 ql[128], uint8 qh[64], int8 scales[16], fp16 d
 *         x = (d * sc) * (q - 32) per 16-element sub-block, q = 4 low bits from ql, 2 from qh */
#ifndef QUERN_QCONV_H
#define QUERN_QCONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qtypes.h"

/* GGML's type ids of the formats converted here. */
enum qconv_type {
    QCONV_Q5_0 = 6,
    QCONV_Q5_1 = 7,
    QCONV_Q4_K = 12,
    QCONV_Q5_K = 13,
    QCONV_Q6_K = 14,
};

#define QK_K 256

/* True when t is one of the types above. */
bool qconv_type(uint32_t t);
const char *qconv_name(uint32_t t);   /* "Q4_K", or NULL for another id */
size_t qconv_block_elems(uint32_t t); /* 32 or QK_K */
size_t qconv_block_bytes(uint32_t t); /* bytes per block in the file */
enum qtype qconv_target(uint32_t t);  /* the type t is read as */

/* Reference dequantization of n elements (a multiple of the block) of type t, as ggml's
 * dequantize_row_* computes them. */
void qconv_dequantize_row(uint32_t t, const void *src, float *dst, size_t n);

/* Writes n elements of type t as qtype_row_bytes(qconv_target(t), n) bytes of the target. */
void qconv_row(uint32_t t, const void *src, void *dst, size_t n);

#endif
