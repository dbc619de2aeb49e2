/* cuda_pack: the device layout of a weight, planned and packed on the host (plain C, so it is
 * tested without a GPU: tests/test_cuda_pack.c).
 *
 * The file stores a quantized row as an array of blocks (scale, then quants), 18, 20 or 34 bytes
 * each: no 16-byte alignment anywhere. On the device the GEMV kernels give each lane of a warp one
 * 32-block at a time, so the layout separates the two parts, each an array over (row, block):
 *
 *   quant types   qs [rows][nb][16] (Q4_0, Q4_1: the file's nibble bytes, unchanged)
 *                    [rows][nb][32] (Q8_0: the int8 quants)
 *                 sc [rows][nb] uint16 fp16 d           (Q4_0, Q8_0)
 *                    [rows][nb] uint32 d | (m << 16)    (Q4_1: d and m as two fp16)
 *   float types   qs [rows][row_elems] of F32, F16 or BF16, each row zero-padded to a multiple of
 *                    8 elements so every row starts 16-byte aligned (sc is empty)
 *
 * A lane reads a block's quants with one (Q4) or two (Q8_0) 16-byte loads, and the 32 lanes of a
 * warp read 32 consecutive blocks: 512 or 1024 contiguous bytes, coalesced. Each part starts on a
 * 256-byte boundary of one allocation of `total` bytes. */
#ifndef QUERN_CUDA_PACK_H
#define QUERN_CUDA_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "../../quant/qerr.h"
#include "../../quant/qtypes.h"

struct cuda_pack_layout {
    enum qtype type;
    int64_t rows, cols;
    int64_t nb;        /* 32-blocks per row (quant types), else 0 */
    int64_t row_elems; /* float types: cols rounded up to 8 (the row stride), else 0 */
    int qs_block;      /* bytes of quants per block: 16 (Q4_0, Q4_1), 32 (Q8_0); 0 for floats */
    int sc_elem;       /* bytes of scale per block: 2 (Q4_0, Q8_0), 4 (Q4_1); 0 for floats */
    size_t qs_off, qs_bytes;
    size_t sc_off, sc_bytes;
    size_t total; /* bytes of the whole packed weight */
};

/* True for the types whose packed layout is quantized blocks (Q4_0, Q4_1, Q8_0). */
int cuda_pack_is_quant(enum qtype t);

/* Plans the layout of a rows x cols weight of type t. QERR_UNSUPPORTED for a type the CUDA
 * backend does not run, QERR_INVALID for a shape that is not one (cols not a multiple of 32 for a
 * quantized type, rows or cols < 1). */
int cuda_pack_plan(enum qtype t, int64_t rows, int64_t cols, struct cuda_pack_layout *L,
                   struct qerr *err);

/* Packs the file's bytes (rows * qtype_row_bytes(type, cols)) into dst (L->total bytes). */
void cuda_pack_weight(const struct cuda_pack_layout *L, const void *src, void *dst);

/* Rebuilds row r in the file's layout (qtype_row_bytes(type, cols) bytes) from a packed copy: the
 * inverse of cuda_pack_weight, for tests. */
void cuda_pack_unpack_row(const struct cuda_pack_layout *L, const void *packed, int64_t r,
                          void *row);

#endif
