/* attn_rows: how the SIMD attention kernels walk a batch and a sequence's keys.
 *
 * A kernel call covers tokens [t0, t1) of the batch and the query heads of one kv head. It cuts
 * them into sets of at most ATTN_ROWS (token, head) rows of one sequence, so a set reads each
 * K and V row once for all its rows (GQA heads and neighbouring prefill tokens). Every row still
 * runs its own arithmetic, step for step as it would alone: which set a row lands in never
 * changes its result. */
#ifndef QUERN_ATTN_ROWS_H
#define QUERN_ATTN_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"

#define ATTN_ROWS 12

struct attn_row {
    const float *q; /* [head_dim] */
    float *out;     /* [head_dim] */
    int n_keys;     /* pos + 1 */
};

struct attn_sets {
    int t, g; /* next token and head within the kv group */
    int t1, kvh;
};

/* Fills rows with the next set (one sequence, at most ATTN_ROWS rows) and returns its size, or 0
 * when the range is done; *seq is the set's sequence. */
static inline int attn_next_set(struct attn_sets *it, const struct attn_batch *b,
                                const struct attn_shape *s, const float *q, float *out,
                                struct attn_row *rows, int *seq)
{
    int group = s->n_heads / s->n_kv_heads, nr = 0;
    size_t hd = (size_t)s->head_dim;
    while (it->t < it->t1 && nr < ATTN_ROWS) {
        if (nr && b->seq[it->t] != *seq) break;
        *seq = b->seq[it->t];
        size_t h = (size_t)it->kvh * (size_t)group + (size_t)it->g;
        size_t at = ((size_t)it->t * (size_t)s->n_heads + h) * hd;
        rows[nr++] = (struct attn_row){q + at, out + at, b->pos[it->t] + 1};
        if (++it->g == group) {
            it->g = 0;
            it->t++;
        }
    }
    return nr;
}

/* Key j of a sequence lives at slot table[j / bs] * bs + j % bs; walking the keys in order
 * keeps (block, offset) without a division per key. */
struct key_walk {
    const int32_t *table;
    int bs, blk, in_blk;
    size_t row, col; /* floats per slot; offset of the kv head in a slot */
};

static inline size_t key_next(struct key_walk *kw)
{
    size_t off =
        ((size_t)kw->table[kw->blk] * (size_t)kw->bs + (size_t)kw->in_blk) * kw->row + kw->col;
    if (++kw->in_blk == kw->bs) {
        kw->in_blk = 0;
        kw->blk++;
    }
    return off;
}

#endif
