/* qpack: the CPU kernels' layout of a quantized weight (Q8_0, Q4_0, Q4_1), made once at load.
 *
 * Rows are taken 16 at a time (a "group"; the last group is padded with zero rows) so that one
 * 512-bit register holds the same 4 elements of 16 rows: a vpdpbusd against 4 broadcast
 * activation bytes then yields 16 rows' partial dot products, and the per-block scales of the 16
 * rows form one vector. No horizontal sums are needed. A group is
 *
 *   scales:  nb records of scale_bytes: d[16] fp16 (lane r = row r of the group),
 *            then m[16] fp16 for Q4_1; the section is padded to 64 bytes
 *   quants:  nb records of quant_bytes, each a sequence of 64-byte chunks, dword r = row r:
 *     Q4_0/Q4_1: 4 chunks; chunk c, dword r = bytes 4c..4c+3 of row r's qs, so the low nibbles
 *                hold elements 4c..4c+3 and the high nibbles elements 16+4c..16+4c+3
 *     Q8_0:      8 chunks; chunk c, dword r = elements 4c..4c+3 of row r, each stored as
 *                w + 128 (w XOR 0x80): unsigned, as vpdpbusd wants its first operand
 *     Q8_0 whose every value lies in [-16, 15] (layout QPACK_Q5_0; a Q5_0 tensor of the file,
 *                which gguf_open reads as Q8_0, qconv.h): w + 16 in five bits, Q5_0's bytes.
 *                The Q4_0 layout's 4 chunks hold the low 4 bits, then one chunk of fifth
 *                bits: 8 words of 64 bits, word k for operand register k (k < 4: the low
 *                nibbles of chunk k, k >= 4: the high nibbles of chunk k - 4), bit 4r + j =
 *                byte j of dword r. A 512-bit register takes its word as a byte mask; a 256-bit
 *                half h (rows 8h..8h+7) takes bits 32h..32h+31.
 *
 * Bytes per row and block stay those of the file (20 for Q4_1, 18 for Q4_0, 34 for Q8_0, 22 for
 * a Q5_0 file's tensor): decode reads exactly as much memory as the GGUF tensor holds. */
#ifndef QUERN_QPACK_H
#define QUERN_QPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend.h"
#include "page_arena.h"

#define QPACK_ROWS 16

/* How a group's quants are stored: what the kernels branch on. */
enum qpack_layout {
    QPACK_Q8_0,
    QPACK_Q4_0,
    QPACK_Q4_1,
    QPACK_Q5_0, /* Q8_0 values in [-16, 15], in five bits (above) */
};

/* Bytes of the fifth-bit chunk of a QPACK_Q5_0 block, after its 4 nibble chunks. */
#define QPACK_Q5_BITS_OFFSET 256

struct qpack {
    enum qtype type;          /* what the values are (the file's type, as read) */
    enum qpack_layout layout; /* how they are stored */
    int64_t rows, cols;
    int64_t nb;         /* 32-blocks per row */
    int64_t ngroups;    /* ceil(rows / 16) */
    size_t scale_bytes; /* per block: 32, or 64 with Q4_1's minimums */
    size_t quant_bytes; /* per block: 256 (4-bit), 320 (5-bit) or 512 (8-bit) */
    size_t scales_size; /* nb * scale_bytes rounded up to 64 */
    size_t group_bytes; /* scales_size + nb * quant_bytes */
    uint8_t *data;      /* [ngroups][group_bytes], 64-byte aligned */
    size_t data_bytes;
    struct page_chunk *chunk; /* data's chunk of an arena; NULL: data is from the heap */
};

/* True for the types qpack_create handles. */
bool qpack_type(enum qtype t);
/* Packs w->host (the file's rows) into a new qpack: a Q8_0 weight whose values all fit five bits
 * takes QPACK_Q5_0 (0.65x the bytes, the same values). Its data comes from arena, or from the
 * heap when arena is NULL. */
int qpack_create(const struct bweight *w, struct page_arena *arena, struct qpack **out,
                 struct qerr *err);
void qpack_free(struct qpack *p);
/* Writes row r back in the file's layout (qtype_row_bytes(type, cols) bytes): the inverse. */
void qpack_unpack_row(const struct qpack *p, int64_t r, void *out);
/* Blocks [b0, b0 + nb) of row r, in the file's layout (nb blocks of bytes at out). */
void qpack_unpack_blocks(const struct qpack *p, int64_t r, int64_t b0, int64_t nb, void *out);

/* Block b's scales of group g: d[16] then (Q4_1) m[16]. */
static inline const uint16_t *qpack_scales(const struct qpack *p, int64_t g, int64_t b)
{
    return (const uint16_t *)(p->data + (size_t)g * p->group_bytes + (size_t)b * p->scale_bytes);
}

/* Block b's quant chunks of group g. */
static inline const uint8_t *qpack_quants(const struct qpack *p, int64_t g, int64_t b)
{
    return p->data + (size_t)g * p->group_bytes + p->scales_size + (size_t)b * p->quant_bytes;
}

#endif
