/* pf_walk: software prefetch of a qpack weight, a fixed distance ahead of the kernel's reads.
 *
 * A thread's share of a matmul is a run of whole groups, and it reads their bytes front to back:
 * each group's scale section, then its quants (qpack.h). The walker keeps the first line it has
 * not yet prefetched; after each block the kernel asks for every line up to PF_WALK_DIST bytes past
 * the block's end, so the scale sections ahead are prefetched with the quants. (A prefetch of one
 * block's quant lines at a fixed offset from the quants being read skipped them: 18 of a Q4_1
 * 576-column group's 90 lines, left to DRAM latency on demand.) A tile's later passes over a
 * group ask for lines already issued and issue nothing.
 *
 * `L1` picks prefetcht0 (1) or prefetcht1 (0), a constant in every caller (enum cpu_prefetch).
 *
 * The distance, one thread's GEMV over weights from DRAM on Zen 5 (`quern bench --kernels
 * --precision q8 --batches 1 --threads 1`, GB/s, two rounds each, Q4_1 576x576 / 192x576 /
 * 1536x576 / 576x1536, Q8_0 49152x576): 2 KiB 25 / 23-24 / 27 / 27 / 35-36; 4 KiB 28 / 26 / 31 /
 * 29-31 / 38-39; 8 KiB 29.5-30 / 27 / 32 / 31 / 39; 16 KiB 28 / 23-24 / 31 / 29-30 / 38-39; 32 KiB
 * 27 / 20 / 29-30 / 27-29 / 35-38. The AVX2 kernels likewise (8 KiB over 16 KiB: +5-15 % on the
 * small shapes, level on the large); Zen 4 had 8 and 16 KiB within noise for 4-bit weights. A
 * longer walk starts with a longer burst, which the small matrices (69-207 KiB) feel. */
#ifndef QUERN_PF_WALK_H
#define QUERN_PF_WALK_H

#include <stddef.h>
#include <stdint.h>

#include "qpack.h"

#define PF_WALK_DIST 8192

struct pf_walk {
    const uint8_t *next; /* the first line not yet prefetched */
    const uint8_t *end;  /* the end of the thread's groups: nothing past it is its to read */
};

/* One line into L1 or L2 (also attention's KV walker, attn_rows.h). */
static inline __attribute__((always_inline)) void pf_line(const uint8_t *p, const int L1)
{
    if (L1)
        __builtin_prefetch(p, 0, 3);
    else
        __builtin_prefetch(p, 0, 2);
}

/* The kernel has read up to `upto`: every line up to PF_WALK_DIST past it. */
static inline __attribute__((always_inline)) void pf_walk_to(struct pf_walk *pw,
                                                             const uint8_t *upto, const int L1)
{
    const uint8_t *stop = pw->end - upto > PF_WALK_DIST ? upto + PF_WALK_DIST : pw->end;
    const uint8_t *p = pw->next;
    for (; p < stop; p += 64) pf_line(p, L1);
    pw->next = p;
}

/* Starts a walk over groups [g0, g1): the first PF_WALK_DIST bytes, which no block's request
 * covers. */
static inline __attribute__((always_inline)) struct pf_walk
pf_walk_start(const struct qpack *w, int64_t g0, int64_t g1, const int L1)
{
    const uint8_t *p = w->data + (size_t)g0 * w->group_bytes;
    struct pf_walk pw = {p, w->data + (size_t)g1 * w->group_bytes};
    pf_walk_to(&pw, p, L1);
    return pw;
}

/* Step i of n over the bytes [base, base + bytes): every line up to its even share (and
 * PF_WALK_DIST past it). */
static inline __attribute__((always_inline)) void pf_walk_share(struct pf_walk *pw,
                                                                const uint8_t *base, size_t bytes,
                                                                int64_t i, int64_t n, const int L1)
{
    size_t upto = bytes * (size_t)(i + 1) / (size_t)n;
    /* base <= pw->end; the span may run past the walk's end (a last pair's next one) */
    pf_walk_to(pw, (size_t)(pw->end - base) < upto ? pw->end : base + upto, L1);
}

/* For a kernel that reads group g in n steps (the AVX2 tiles' two passes, one per row half, each
 * over all blocks): step i's even share of the group's bytes, so the prefetches flow through
 * every pass, not the first alone. */
static inline __attribute__((always_inline)) void pf_walk_step(struct pf_walk *pw,
                                                               const struct qpack *w, int64_t g,
                                                               int64_t i, int64_t n, const int L1)
{
    pf_walk_share(pw, w->data + (size_t)g * w->group_bytes, w->group_bytes, i, n, L1);
}

#endif
