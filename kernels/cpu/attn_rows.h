/* attn_rows: how the SIMD attention kernels walk a batch and a sequence's keys.
 *
 * A kernel call covers tokens [t0, t1) of the batch and query heads [h0, h1). Kv head by kv
 * head, it cuts them into sets of at most ATTN_ROWS (token, head) rows of one sequence, so a set
 * reads each K and V row once for all its rows (GQA heads and neighbouring prefill tokens). Or,
 * when the call covers every head, one token per set: a set then reads whole KV slots (all kv
 * heads of a key), one contiguous run per block, where a kv head's row alone is a strided third
 * of each slot that the hardware prefetchers follow poorly (a decode batch's KV read 1.3-1.8x
 * faster this way in a read-only test). A range that cuts a kv head's group (a token's heads
 * split between threads) takes that group's heads in the range. Every row still runs its own
 * arithmetic, step for step as it would alone: which set a row lands in never changes its
 * result. */
#ifndef QUERN_ATTN_ROWS_H
#define QUERN_ATTN_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend.h"
#include "pf_walk.h"
#include "ref.h"

#define ATTN_ROWS 48
/* the most rows of a token's every-head pass (attn_heads_of) */
#define ATTN_ALL_ROWS 12

struct attn_row {
    const float *q; /* [head_dim] */
    float *out;     /* [head_dim] */
    int n_keys;     /* pos + 1 */
    int key0;       /* its first key: attn_first_key (0 but for a sliding window) */
    size_t col;     /* its kv head's offset within a KV slot, in units (ref.h: enum kv_kind) */
    int th;         /* t * n_heads + h: its record in a struct attn_parts (attn_part.h) */
};

static inline struct attn_row attn_row_of(const struct attn_batch *b, int t, const float *q,
                                          float *out, size_t col, int th)
{
    return (struct attn_row){.q = q,
                             .out = out,
                             .n_keys = b->pos[t] + 1,
                             .key0 = attn_first_key(b, b->pos[t]),
                             .col = col,
                             .th = th};
}

/* The first key any of rows[0, nr) reads, rounded down to a multiple of align (the kernels'
 * spans sit at fixed positions). */
static inline int attn_rows_first_key(const struct attn_row *rows, int nr, int align)
{
    int k = rows[0].key0;
    for (int r = 1; r < nr; r++) k = rows[r].key0 < k ? rows[r].key0 : k;
    return k - k % align;
}

struct attn_sets {
    int t, g;    /* next token and head within the kv group */
    int t1, kvh; /* kvh -1: the heads [g0, g1) of a token, one token per set */
    int g0, g1;  /* kvh >= 0: the group's heads [g0, g1) */
};

/* Fills rows with the next set (one sequence, at most ATTN_ROWS rows) over a cache of kind kk
 * and returns its size, or 0 when the range is done; *seq is the set's sequence. */
static inline int attn_next_set(struct attn_sets *it, const struct attn_batch *b,
                                const struct attn_shape *s, enum kv_kind kk, const float *q,
                                float *out, struct attn_row *rows, int *seq)
{
    int group = s->n_heads / s->n_kv_heads, nr = 0;
    size_t hd = (size_t)s->head_dim, hu = kv_units(kk, hd);
    if (it->kvh < 0) {
        if (it->t >= it->t1) return 0;
        *seq = b->seq[it->t];
        for (int h = it->g0; h < it->g1; h++) {
            size_t at = ((size_t)it->t * (size_t)s->n_heads + (size_t)h) * hd;
            rows[nr++] = attn_row_of(b, it->t, q + at, out + at, (size_t)(h / group) * hu,
                                     it->t * s->n_heads + h);
        }
        it->t++;
        return nr;
    }
    while (it->t < it->t1 && nr < ATTN_ROWS) {
        if (nr && b->seq[it->t] != *seq) break;
        *seq = b->seq[it->t];
        size_t h = (size_t)it->kvh * (size_t)group + (size_t)it->g;
        size_t at = ((size_t)it->t * (size_t)s->n_heads + h) * hd;
        rows[nr++] = attn_row_of(b, it->t, q + at, out + at, (size_t)it->kvh * hu,
                                 it->t * s->n_heads + (int)h);
        if (++it->g == it->g1) {
            it->g = it->g0;
            it->t++;
        }
    }
    return nr;
}

/* How a SIMD kernel call walks query heads [h0, h1): in one pass (all: the range's rows of a
 * token in each set, its kv heads' columns of each slot read together) when the range spans kv
 * heads and fits a set, else kv head by kv head, kvh0 to kvh1, each over its heads in the
 * range. */
struct attn_heads {
    bool all;
    int kvh0, kvh1;
    int h0, h1;
};

static inline struct attn_heads attn_heads_of(const struct attn_shape *s, int h0, int h1)
{
    int group = s->n_heads / s->n_kv_heads, k0 = h0 / group, k1 = (h1 + group - 1) / group;
    bool all = k1 - k0 > 1 && h1 - h0 <= ATTN_ALL_ROWS;
    return (struct attn_heads){all, k0, all ? k0 + 1 : k1, h0, h1};
}

/* The sets of kv head kvh's pass (-1: the one pass of hs.all) over tokens [t0, t1). */
static inline struct attn_sets attn_sets_of(const struct attn_shape *s, struct attn_heads hs,
                                            int t0, int t1, int kvh)
{
    if (kvh < 0) return (struct attn_sets){.t = t0, .t1 = t1, .kvh = -1, .g0 = hs.h0, .g1 = hs.h1};
    int group = s->n_heads / s->n_kv_heads, base = kvh * group;
    int g0 = hs.h0 > base ? hs.h0 - base : 0, g1 = hs.h1 - base < group ? hs.h1 - base : group;
    return (struct attn_sets){.t = t0, .g = g0, .t1 = t1, .kvh = kvh, .g0 = g0, .g1 = g1};
}

/* Tokens [t0, t1) x query heads [h0, h1) by the reference, over a cache of kind kk: the head
 * sizes the SIMD kernels have no tiles for. */
static inline void attn_ref_heads(float *out, const float *q, const void *k_cache,
                                  const void *v_cache, const struct attn_batch *b,
                                  const struct attn_shape *s, int t0, int t1, int h0, int h1,
                                  enum kv_kind kk)
{
    for (int t = t0; t < t1; t++)
        for (int h = h0; h < h1; h++)
            if (kk == KV_Q8)
                ref_attention_one_q8(out, q, k_cache, v_cache, b, s, t, h);
            else if (kk == KV_F16)
                ref_attention_one_f16(out, q, k_cache, v_cache, b, s, t, h);
            else
                ref_attention_one(out, q, k_cache, v_cache, b, s, t, h);
}

/* Cuts the active rows act[0, na) into register blocks: runs of consecutive rows of one kv head,
 * each cut into blocks of at most rb. start[i] and len[i] per block; returns their count. */
static inline int attn_blocks(const struct attn_row *rows, const int *act, int na, int rb,
                              int *start, int *len)
{
    int nb = 0;
    na = na < ATTN_ROWS ? na : ATTN_ROWS; /* never more: says so to the compiler */
    for (int i = 0; i < na;) {
        int j = i + 1;
        while (j < na && act[j] == act[j - 1] + 1 && rows[act[j]].col == rows[act[i]].col) j++;
        for (int k = i; k < j; k += rb) {
            start[nb] = act[k];
            len[nb++] = j - k < rb ? j - k : rb;
        }
        i = j;
    }
    return nb;
}

/* Key j of a sequence lives at slot table[j / bs] * bs + j % bs; walking the keys in order
 * keeps (block, offset) without a division per key. */
struct key_walk {
    const int32_t *table;
    int bs, blk, in_blk;
    size_t row, col; /* units per slot; offset of the kv head in a slot */
};

/* Moves a walk that is at key 0 to key k. */
static inline void key_skip(struct key_walk *kw, int k)
{
    kw->blk = k / kw->bs;
    kw->in_blk = k % kw->bs;
}

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

/* Software prefetch of the K and V rows a set is about to read. A kv head's row is a third
 * (SmolLM2) of each slot, so the keys a set walks are short runs at a stride that crosses a block
 * every block_size keys: the hardware prefetchers keep too few lines in flight for that, and a
 * batch-16 decode step read its KV at a quarter of the bandwidth its weights get. Each kernel's
 * walker runs a chunk ahead of the keys being scored (K and V both: V is read a span later, from
 * L2), its lines spread through the scoring loop (attn_avx2.c, attn_avx512.c). */

struct key_prefetch {
    struct key_walk kw;
    int left;         /* keys not yet prefetched */
    size_t row_bytes; /* bytes per key: one kv head's row, or (kv head -1) the whole slot */
    const char *k, *v;
    size_t elem;
    size_t at, in_row; /* key_prefetch_lines: the key being fetched, the bytes of it done */
    int budget;        /* line pairs key_prefetch_lines may still issue (set per chunk) */
    int l1;            /* prefetcht0 (1) or prefetcht1 (0): a constant in every kernel */
};

/* A K line and its V line, into L1 or L2 (enum cpu_prefetch: as the GEMV's weights, by core; on
 * Zen 5 a decode batch's attention over KV from DRAM took 0.85-0.9x the time with L1). */
static inline __attribute__((always_inline)) void key_prefetch_pair(const struct key_prefetch *pf,
                                                                    size_t off)
{
    pf_line((const uint8_t *)pf->k + off, pf->l1);
    pf_line((const uint8_t *)pf->v + off, pf->l1);
}

static inline void key_prefetch_next(struct key_prefetch *pf, int n)
{
    for (; n > 0 && pf->left > 0; n--, pf->left--) {
        size_t at = key_next(&pf->kw) * pf->elem;
        for (size_t b = 0; b < pf->row_bytes; b += 64) key_prefetch_pair(pf, at + b);
    }
}

/* The walker's next n line pairs (a K line and its V line), key after key, at most its budget:
 * spread through a scoring loop, where a whole chunk's rows at once (96 lines for SmolLM2's 8
 * keys) filled the miss buffers and stalled the arithmetic behind them. */
static inline void key_prefetch_lines(struct key_prefetch *pf, int n)
{
    n = n < pf->budget ? n : pf->budget;
    pf->budget -= n;
    for (; n > 0 && pf->left > 0; n--) {
        if (!pf->in_row) pf->at = key_next(&pf->kw) * pf->elem;
        key_prefetch_pair(pf, pf->at + pf->in_row);
        pf->in_row += 64;
        if (pf->in_row >= pf->row_bytes) {
            pf->in_row = 0;
            pf->left--;
        }
    }
}

/* Starts a walker over the first n_keys keys of kw, fetching elems elements of each from kw's
 * column on, and prefetches its first `ahead` keys. */
static inline __attribute__((always_inline)) struct key_prefetch
key_prefetch_start(struct key_walk kw, int n_keys, const void *k_cache, const void *v_cache,
                   size_t elems, size_t elem, int ahead, const int l1)
{
    struct key_prefetch pf = {kw, n_keys, elems * elem, k_cache, v_cache, elem, 0, 0, 0, l1};
    key_prefetch_next(&pf, ahead);
    return pf;
}

/* The walks of one set of sequence seq over a cache of kind kk: kw over its slots (column 0:
 * each row adds its kv head's), pf over what the prefetch walker fetches, pf_elems units a key
 * from pf's column: for kv head -1 the columns of hs's kv heads, else head kvh's row. */
struct attn_walks {
    struct key_walk kw, pf;
    size_t pf_elems;
};

static inline struct attn_walks attn_walks_of(const struct attn_batch *b,
                                              const struct attn_shape *s, enum kv_kind kk, int seq,
                                              struct attn_heads hs, int kvh)
{
    size_t hd = kv_units(kk, (size_t)s->head_dim), slot = (size_t)s->n_kv_heads * hd;
    struct key_walk kw = {.table = b->block_table + (size_t)seq * (size_t)b->max_blocks,
                          .bs = b->block_size,
                          .row = slot};
    int group = s->n_heads / s->n_kv_heads, k0 = kvh < 0 ? hs.h0 / group : kvh,
        k1 = kvh < 0 ? (hs.h1 + group - 1) / group : kvh + 1;
    struct attn_walks w = {kw, kw, (size_t)(k1 - k0) * hd};
    w.pf.col = (size_t)k0 * hd;
    return w;
}

#endif
