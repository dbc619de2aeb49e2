/* qpack512: a qpack block (qpack.h) in AVX-512 registers, shared by the kernels that read the
 * layout on AVX-512 (mm_avx512.c, mm_amx.c): static inline, compiled with each caller's target
 * attribute (a superset of TGT512). */
#ifndef QUERN_QPACK512_H
#define QUERN_QPACK512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "qpack.h"
#include "simd512.h"

/* Operand register k of a QPACK_Q5_0 block with its fifth bits: 16 added to each byte whose bit
 * is set in word k of the bit chunk (a byte mask, one masked add). */
TGT512 INLINE512 __m512i fifth_bits(__m512i w, const uint8_t *qs, int k)
{
    uint64_t m;
    memcpy(&m, qs + QPACK_Q5_BITS_OFFSET + 8 * k, sizeof m);
    return _mm512_mask_add_epi8(w, _cvtu64_mask64(m), w, _mm512_set1_epi8(16));
}

/* The 8 operand registers of block b of a group: W[c] holds elements 4c..4c+3 of the 16 rows as
 * unsigned bytes (nibbles for 4-bit types, w + 16 for the 5-bit layout, w + 128 for Q8_0). */
TGT512 INLINE512 void load_block(const uint8_t *qs, enum qpack_layout type, __m512i W[8])
{
    if (type == QPACK_Q8_0) {
        for (int c = 0; c < 8; c++) W[c] = _mm512_load_si512(qs + 64 * c);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        __m512i v = _mm512_load_si512(qs + 64 * c);
        W[c] = _mm512_and_si512(v, m4);
        W[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (type == QPACK_Q5_0)
        for (int c = 0; c < 8; c++) W[c] = fifth_bits(W[c], qs, c);
}

/* The constant the unsigned weights carry: w = stored - offset (16 for five bits, widened or
 * not). */
INLINE512 int32_t type_offset(enum qpack_layout type)
{
    return type == QPACK_Q8_0 ? 128 : type == QPACK_Q4_0 ? 8 : type != QPACK_Q4_1 ? 16 : 0;
}

#endif
