/* qtypes: the tensor element formats quern reads, with their block layouts and a reference
 * (scalar, obviously-correct) dequantizer for each. Enum values are GGML's type ids, so a GGUF
 * tensor-info type maps onto this enum directly.
 *
 * Block layouts (ggml-common.h):
 *   Q8_0: 32 weights: fp16 d, int8 q[32];            x = d * q
 *   Q4_0: 32 weights: fp16 d, uint8 qs[16];          x = d * (nib - 8)
 *   Q4_1: 32 weights: fp16 d, fp16 m, uint8 qs[16];  x = d * nib + m
 * where byte j of qs holds element j in its low nibble and element j + 16 in its high nibble. */
#ifndef QUERN_QTYPES_H
#define QUERN_QTYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qtype {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q8_0 = 8,
    QTYPE_BF16 = 30,
};

#define QK 32 /* weights per block of every quantized type here */

struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK];
};
struct block_q4_0 {
    uint16_t d;
    uint8_t qs[QK / 2];
};
struct block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK / 2];
};
_Static_assert(sizeof(struct block_q8_0) == 34, "Q8_0 block is 34 bytes on disk");
_Static_assert(sizeof(struct block_q4_0) == 18, "Q4_0 block is 18 bytes on disk");
_Static_assert(sizeof(struct block_q4_1) == 20, "Q4_1 block is 20 bytes on disk");

/* True when t is a type this build can dequantize. */
bool qtype_supported(uint32_t t);
const char *qtype_name(uint32_t t);     /* "Q4_1", or "type#N" for unknown ids */
int qtype_from_name(const char *name);  /* enum value, or -1 */
size_t qtype_block_elems(enum qtype t); /* elements per block: 1 for float types, 32 otherwise */
size_t qtype_block_bytes(enum qtype t); /* bytes per block */
/* Bytes of a row of n elements; n must be a multiple of qtype_block_elems(t). */
size_t qtype_row_bytes(enum qtype t, size_t n);

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f); /* round to nearest even */
float bf16_to_f32(uint16_t h);

/* Reference dequantization of n elements (n a multiple of the block size) from src to dst. */
void qtype_dequantize_row(enum qtype t, const void *src, float *dst, size_t n);

#endif
