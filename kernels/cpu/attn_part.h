/* attn_part: attention over a long context in partitions of ATTN_PART keys.
 *
 * One decode token's attention at a long context is most of its step (context 4096, one
 * sequence: 68 % of it), and the SIMD kernels run a row's keys in order, one span after another,
 * so a lone row ran on one thread (or its heads were cut between threads, which read a cut kv
 * head's K and V twice). So a row's keys are cut at fixed positions into partitions of
 * ATTN_PART keys: each partition is an online softmax of its own (m, l and the unnormalized sum
 * of p V) and the partitions are folded in order, by attn_fold. The cut depends on the row's
 * position alone, so a row has the same bits whether one kernel call ran all its partitions
 * (folding them as it goes) or the partitions ran as tasks on several threads, their records
 * written to a buffer and folded after (attn_parts_combine): the batch and thread invariance of
 * every other kernel. A row of at most ATTN_PART keys is one partition and keeps the bits it
 * had before partitions existed. */
#ifndef QUERN_ATTN_PART_H
#define QUERN_ATTN_PART_H

#include <stddef.h>

#include "../backend.h"

#define ATTN_PART 512 /* keys per partition: a multiple of the kernels' spans (128) */

/* Partitions [p0, p1) of rows, each partition's record in buf: see attn_part_rec. */
struct attn_parts {
    int p0, p1;
    int n_parts; /* records per row in buf */
    float *buf;
};

/* Partitions of a row with n_keys keys (from key 0: a row with a sliding window has none before
 * its first key's, attn_first_key(b, pos) / ATTN_PART). */
static inline int attn_part_count(int n_keys)
{
    return (n_keys + ATTN_PART - 1) / ATTN_PART;
}

/* The record of partition p of row th = t * n_heads + h: m, l, then head_dim sums of p V. */
static inline float *attn_part_rec(const struct attn_parts *pp, int th, int head_dim, int p)
{
    return pp->buf + ((size_t)th * (size_t)pp->n_parts + (size_t)p) * ((size_t)head_dim + 2);
}

/* The keys [*key0, *key1) of rows whose longest has max_keys: pp's partitions, or (pp NULL)
 * all of them; 0 when there are none. */
static inline int attn_part_keys(const struct attn_parts *pp, int max_keys, int *key0, int *key1)
{
    *key0 = pp ? pp->p0 * ATTN_PART : 0;
    *key1 = pp && pp->p1 * ATTN_PART < max_keys ? pp->p1 * ATTN_PART : max_keys;
    return *key1 > *key0;
}

void attn_fold(float *M, float *L, float *O, float m, float l, const float *acc, int head_dim,
               int first);

/* Whether a row reading keys [key0, n_keys) spans more than one partition. */
static inline int attn_row_multi(int key0, int n_keys)
{
    return attn_part_count(n_keys) - key0 / ATTN_PART > 1;
}

/* The partition from key part0 of a row reading keys [key0, n_keys) ends with (m, l, acc): its
 * record (pp), or folded into the row's running (*M, *L, O) when the row has more than one
 * partition. Partitions before key0's (a sliding window) hold none of its keys. */
static inline void attn_part_close(const struct attn_parts *pp, int th, int key0, int n_keys,
                                   int part0, int head_dim, float m, float l, const float *acc,
                                   float *M, float *L, float *O)
{
    if (n_keys <= part0 || key0 >= part0 + ATTN_PART) return;
    int p = part0 / ATTN_PART;
    if (pp) {
        float *rec = attn_part_rec(pp, th, head_dim, p);
        rec[0] = m;
        rec[1] = l;
        for (int i = 0; i < head_dim; i++) rec[2 + i] = acc[i];
    } else if (attn_row_multi(key0, n_keys)) {
        attn_fold(M, L, O, m, l, acc, head_dim, p == key0 / ATTN_PART);
    }
}

/* Folds partition (m, l, acc) into the running (*M, *L, O), the first one (first != 0) copied:
 * M' = max(M, m), L' = L e^(M - M') + l e^(m - M'), O' = O e^(M - M') + acc e^(m - M'). One
 * function, in one file, for the kernels and the combine alike: the same operations in the same
 * order wherever a row's partitions are folded. */
/* out[i] = O[i] / L (also a single partition's out = acc / l: the kernels' own division) */
void attn_finish(float *out, const float *O, float L, int head_dim);
/* For tokens [t0, t1) x every head: folds the records of each row's partitions (all of them
 * written to pp->buf, from its first key's on) in order into out. */
void attn_parts_combine(const struct attn_parts *pp, const struct attn_batch *b,
                        const struct attn_shape *s, int t0, int t1, float *out);

#endif
