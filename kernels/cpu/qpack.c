#include "qpack.h"

#include <stdlib.h>
#include <string.h>

bool qpack_type(enum qtype t)
{
    return t == QTYPE_Q8_0 || t == QTYPE_Q4_0 || t == QTYPE_Q4_1;
}

/* Scale and quant byte offsets of a file block of type t. */
static void block_fields(enum qtype t, size_t *d_off, size_t *m_off, size_t *qs_off, size_t *qs_len)
{
    *d_off = 0;
    *m_off = 0;
    switch (t) {
    case QTYPE_Q8_0:
        *qs_off = offsetof(struct block_q8_0, qs);
        *qs_len = QK;
        break;
    case QTYPE_Q4_0:
        *qs_off = offsetof(struct block_q4_0, qs);
        *qs_len = QK / 2;
        break;
    default:
        *m_off = offsetof(struct block_q4_1, m);
        *qs_off = offsetof(struct block_q4_1, qs);
        *qs_len = QK / 2;
        break;
    }
}

/* Whether every value of a Q8_0 weight lies in [-16, 15]: true of each tensor a Q5_0 file holds,
 * whose quants gguf_open turns into Q8_0 unchanged (qconv.h), hardly ever of another. */
static bool q8_fits_five_bits(const struct bweight *w, size_t rb)
{
    for (int64_t r = 0; r < w->rows; r++) {
        const struct block_q8_0 *blk =
            (const struct block_q8_0 *)((const uint8_t *)w->host + (size_t)r * rb);
        for (int64_t b = 0; b < w->cols / QK; b++)
            for (int j = 0; j < QK; j++)
                if (blk[b].qs[j] < -16 || blk[b].qs[j] > 15) return false;
    }
    return true;
}

static enum qpack_layout layout_of(const struct bweight *w, size_t rb)
{
    switch (w->type) {
    case QTYPE_Q4_0:
        return QPACK_Q4_0;
    case QTYPE_Q4_1:
        return QPACK_Q4_1;
    default:
        return q8_fits_five_bits(w, rb) ? QPACK_Q5_0 : QPACK_Q8_0;
    }
}

/* Element e of a block's 32 as the layout stores it: byte j of dword lane of chunk c, and for
 * QPACK_Q5_0 the fifth bit's word and bit (qpack.h). */
static void q5_place(int e, int64_t lane, size_t *byte, bool *high_nibble, size_t *word, int *bit)
{
    int half = e >= QK / 2, k = e % (QK / 2), c = k / 4, j = k % 4;
    *byte = (size_t)c * 64 + (size_t)lane * 4 + (size_t)j;
    *high_nibble = half;
    *word = (size_t)(c + 4 * half);
    *bit = (int)(lane * 4 + j);
}

int qpack_create(const struct bweight *w, struct page_arena *arena, struct qpack **out,
                 struct qerr *err)
{
    *out = NULL;
    if (!qpack_type(w->type))
        return qerr_set(err, QERR_UNSUPPORTED, "qpack: type %s", qtype_name(w->type));
    if (w->cols <= 0 || w->cols % QK || w->rows <= 0)
        return qerr_set(err, QERR_INVALID, "qpack: %lld x %lld is not rows x (multiple of %d)",
                        (long long)w->rows, (long long)w->cols, QK);
    struct qpack *p = calloc(1, sizeof *p);
    if (!p) return qerr_set(err, QERR_NOMEM, "qpack: out of memory");
    size_t bb = qtype_block_bytes(w->type), rb = qtype_row_bytes(w->type, (size_t)w->cols);
    p->type = w->type;
    p->layout = layout_of(w, rb);
    p->rows = w->rows;
    p->cols = w->cols;
    p->nb = w->cols / QK;
    p->ngroups = (w->rows + QPACK_ROWS - 1) / QPACK_ROWS;
    p->scale_bytes = (w->type == QTYPE_Q4_1 ? 2 : 1) * QPACK_ROWS * sizeof(uint16_t);
    p->quant_bytes = p->layout == QPACK_Q8_0   ? QK * QPACK_ROWS
                     : p->layout == QPACK_Q5_0 ? QPACK_Q5_BITS_OFFSET + QK / 8 * QPACK_ROWS
                                               : QK / 2 * QPACK_ROWS;
    p->scales_size = ((size_t)p->nb * p->scale_bytes + 63) / 64 * 64;
    p->group_bytes = p->scales_size + (size_t)p->nb * p->quant_bytes;
    p->data_bytes = (size_t)p->ngroups * p->group_bytes;
    /* in an arena: on 2 MiB pages with the other weights (page_arena.h); alone: the heap */
    void *mem = NULL;
    if (arena)
        mem = page_arena_alloc(arena, p->data_bytes, &p->chunk);
    else if (posix_memalign(&mem, 64, p->data_bytes) == 0)
        memset(mem, 0, p->data_bytes);
    else
        mem = NULL;
    if (!mem) {
        size_t bytes = p->data_bytes;
        free(p);
        return qerr_set(err, QERR_NOMEM, "qpack: cannot allocate %zu bytes", bytes);
    }
    p->data = mem;

    size_t d_off, m_off, qs_off, qs_len;
    block_fields(w->type, &d_off, &m_off, &qs_off, &qs_len);
    for (int64_t r = 0; r < w->rows; r++) {
        int64_t g = r / QPACK_ROWS, lane = r % QPACK_ROWS;
        const uint8_t *row = (const uint8_t *)w->host + (size_t)r * rb;
        for (int64_t b = 0; b < p->nb; b++) {
            const uint8_t *blk = row + (size_t)b * bb;
            uint16_t *sc = (uint16_t *)qpack_scales(p, g, b);
            memcpy(&sc[lane], blk + d_off, 2);
            if (w->type == QTYPE_Q4_1) memcpy(&sc[QPACK_ROWS + lane], blk + m_off, 2);
            uint8_t *qd = (uint8_t *)qpack_quants(p, g, b);
            if (p->layout == QPACK_Q5_0) {
                for (int e = 0; e < QK; e++) {
                    int u = ((const int8_t *)blk + qs_off)[e] + 16; /* 0..31 */
                    size_t byte, word;
                    bool high;
                    int bit;
                    q5_place(e, lane, &byte, &high, &word, &bit);
                    qd[byte] |= (uint8_t)((u & 15) << (high ? 4 : 0));
                    if (u & 16)
                        qd[QPACK_Q5_BITS_OFFSET + 8 * word + (size_t)bit / 8] |= 1u << bit % 8;
                }
                continue;
            }
            for (size_t c = 0; c < qs_len / 4; c++)
                for (int j = 0; j < 4; j++) {
                    uint8_t v = blk[qs_off + 4 * c + (size_t)j];
                    if (w->type == QTYPE_Q8_0) v ^= 0x80;
                    qd[c * 64 + (size_t)lane * 4 + (size_t)j] = v;
                }
        }
    }
    *out = p;
    return 0;
}

void qpack_free(struct qpack *p)
{
    if (!p) return;
    if (p->chunk)
        page_arena_free(p->chunk);
    else
        free(p->data);
    free(p);
}

void qpack_unpack_row(const struct qpack *p, int64_t r, void *out)
{
    qpack_unpack_blocks(p, r, 0, p->nb, out);
}

void qpack_unpack_blocks(const struct qpack *p, int64_t r, int64_t b0, int64_t nb, void *out)
{
    size_t d_off, m_off, qs_off, qs_len;
    block_fields(p->type, &d_off, &m_off, &qs_off, &qs_len);
    size_t bb = qtype_block_bytes(p->type);
    int64_t g = r / QPACK_ROWS, lane = r % QPACK_ROWS;
    for (int64_t b = b0; b < b0 + nb; b++) {
        uint8_t *blk = (uint8_t *)out + (size_t)(b - b0) * bb;
        const uint16_t *sc = qpack_scales(p, g, b);
        memcpy(blk + d_off, &sc[lane], 2);
        if (p->type == QTYPE_Q4_1) memcpy(blk + m_off, &sc[QPACK_ROWS + lane], 2);
        const uint8_t *qd = qpack_quants(p, g, b);
        if (p->layout == QPACK_Q5_0) {
            for (int e = 0; e < QK; e++) {
                size_t byte, word;
                bool high;
                int bit;
                q5_place(e, lane, &byte, &high, &word, &bit);
                int u = (qd[byte] >> (high ? 4 : 0)) & 15;
                u |= (qd[QPACK_Q5_BITS_OFFSET + 8 * word + (size_t)bit / 8] >> bit % 8 & 1) << 4;
                blk[qs_off + (size_t)e] = (uint8_t)(int8_t)(u - 16);
            }
            continue;
        }
        for (size_t c = 0; c < qs_len / 4; c++)
            for (int j = 0; j < 4; j++) {
                uint8_t v = qd[c * 64 + (size_t)lane * 4 + (size_t)j];
                if (p->type == QTYPE_Q8_0) v ^= 0x80;
                blk[qs_off + 4 * c + (size_t)j] = v;
            }
    }
}
