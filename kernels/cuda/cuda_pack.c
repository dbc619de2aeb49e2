/* cuda_pack: host-side planning and packing of the CUDA backend's weight layout (cuda_pack.h). */
#include "cuda_pack.h"

#include <string.h>

#define PACK_ALIGN 256

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

int cuda_pack_is_quant(enum qtype t)
{
    return t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0;
}

int cuda_pack_plan(enum qtype t, int64_t rows, int64_t cols, struct cuda_pack_layout *L,
                   struct qerr *err)
{
    memset(L, 0, sizeof *L);
    if (!qtype_supported(t))
        return qerr_set(err, QERR_UNSUPPORTED, "cuda backend: weight type %s", qtype_name(t));
    if (rows < 1 || cols < 1 || rows > ((int64_t)1 << 31) || cols > ((int64_t)1 << 31))
        return qerr_set(err, QERR_INVALID, "cuda backend: weight shape %lld x %lld",
                        (long long)rows, (long long)cols);
    L->type = t;
    L->rows = rows;
    L->cols = cols;
    if (cuda_pack_is_quant(t)) {
        if (cols % QK)
            return qerr_set(err, QERR_INVALID,
                            "cuda backend: %s weight with %lld columns (not a multiple of %d)",
                            qtype_name(t), (long long)cols, QK);
        L->nb = cols / QK;
        L->qs_block = t == QTYPE_Q8_0 ? QK : QK / 2;
        L->sc_elem = t == QTYPE_Q4_1 ? 4 : 2;
        L->qs_bytes = (size_t)rows * (size_t)L->nb * (size_t)L->qs_block;
        L->sc_bytes = (size_t)rows * (size_t)L->nb * (size_t)L->sc_elem;
    } else {
        L->row_elems = (cols + 7) / 8 * 8;
        L->qs_bytes = (size_t)rows * (size_t)L->row_elems * qtype_block_bytes(t);
    }
    L->qs_off = 0;
    L->sc_off = align_up(L->qs_bytes, PACK_ALIGN);
    L->total = align_up(L->sc_off + L->sc_bytes, PACK_ALIGN);
    return 0;
}

void cuda_pack_weight(const struct cuda_pack_layout *L, const void *src, void *dst)
{
    uint8_t *qs = (uint8_t *)dst + L->qs_off, *sc = (uint8_t *)dst + L->sc_off;
    const uint8_t *s = src;
    memset(dst, 0, L->total); /* row padding and the gaps between parts */
    if (!cuda_pack_is_quant(L->type)) {
        size_t eb = qtype_block_bytes(L->type), rb = (size_t)L->cols * eb;
        for (int64_t r = 0; r < L->rows; r++)
            memcpy(qs + (size_t)r * (size_t)L->row_elems * eb, s + (size_t)r * rb, rb);
        return;
    }
    size_t n_blocks = (size_t)L->rows * (size_t)L->nb;
    for (size_t i = 0; i < n_blocks; i++) {
        uint8_t *q = qs + i * (size_t)L->qs_block;
        switch (L->type) {
        case QTYPE_Q4_0: {
            const struct block_q4_0 *b = (const struct block_q4_0 *)s + i;
            memcpy(q, b->qs, QK / 2);
            memcpy(sc + i * 2, &b->d, 2);
            break;
        }
        case QTYPE_Q4_1: {
            const struct block_q4_1 *b = (const struct block_q4_1 *)s + i;
            uint32_t dm = (uint32_t)b->d | ((uint32_t)b->m << 16);
            memcpy(q, b->qs, QK / 2);
            memcpy(sc + i * 4, &dm, 4);
            break;
        }
        case QTYPE_Q8_0: {
            const struct block_q8_0 *b = (const struct block_q8_0 *)s + i;
            memcpy(q, b->qs, QK);
            memcpy(sc + i * 2, &b->d, 2);
            break;
        }
        default:
            break;
        }
    }
}

void cuda_pack_unpack_row(const struct cuda_pack_layout *L, const void *packed, int64_t r,
                          void *row)
{
    const uint8_t *qs = (const uint8_t *)packed + L->qs_off;
    const uint8_t *sc = (const uint8_t *)packed + L->sc_off;
    uint8_t *out = row;
    if (!cuda_pack_is_quant(L->type)) {
        size_t eb = qtype_block_bytes(L->type);
        memcpy(out, qs + (size_t)r * (size_t)L->row_elems * eb, (size_t)L->cols * eb);
        return;
    }
    for (int64_t b = 0; b < L->nb; b++) {
        size_t i = (size_t)r * (size_t)L->nb + (size_t)b;
        const uint8_t *q = qs + i * (size_t)L->qs_block;
        switch (L->type) {
        case QTYPE_Q4_0: {
            struct block_q4_0 *o = (struct block_q4_0 *)out + b;
            memcpy(&o->d, sc + i * 2, 2);
            memcpy(o->qs, q, QK / 2);
            break;
        }
        case QTYPE_Q4_1: {
            struct block_q4_1 *o = (struct block_q4_1 *)out + b;
            uint32_t dm;
            memcpy(&dm, sc + i * 4, 4);
            o->d = (uint16_t)(dm & 0xffff);
            o->m = (uint16_t)(dm >> 16);
            memcpy(o->qs, q, QK / 2);
            break;
        }
        case QTYPE_Q8_0: {
            struct block_q8_0 *o = (struct block_q8_0 *)out + b;
            memcpy(&o->d, sc + i * 2, 2);
            memcpy(o->qs, q, QK);
            break;
        }
        default:
            break;
        }
    }
}
