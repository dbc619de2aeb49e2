/* page_arena: 2 MiB-page memory for the packed weights, many weights to a page.
 *
 * A decode step streams every weight once, ~100 MB for SmolLM2-135M in some 200 pieces of
 * 0.1-30 MB. On 4 KiB pages that is ~25,000 TLB misses a token, each a page walk (two-level in a
 * VM); one 2 MiB page a weight would waste most of a page on each small one. The arena carves the
 * weights out of chunks mapped on 2 MiB boundaries and advised MADV_HUGEPAGE, back to back, so a
 * model's weights span about as many huge pages as their bytes need. A Xeon whose model stays in
 * its L3 decoded 1.04-1.12x faster on two threads (docs/benchmarks.md).
 *
 * A chunk counts its holders: its live allocations, and the arena while new ones are carved from
 * it. It is unmapped when none is left, so a chunk outlives neither its weights nor, after
 * page_arena_close, the arena, in whichever order the two go. Not thread-safe: one arena per
 * backend, whose weights are prepared and released from one thread at a time. */
#ifndef QUERN_PAGE_ARENA_H
#define QUERN_PAGE_ARENA_H

#include <stddef.h>

struct page_chunk;

struct page_arena {
    struct page_chunk *open; /* the chunk small allocations are carved from; NULL: none yet */
};

/* bytes, 64-byte aligned and zeroed, on 2 MiB-aligned memory advised for huge pages (the advice
 * is a hint: without transparent huge pages the memory is ordinary). *chunk is what
 * page_arena_free takes back. NULL when memory is short. */
void *page_arena_alloc(struct page_arena *a, size_t bytes, struct page_chunk **chunk);
/* Ends one allocation of chunk; the chunk is unmapped when it has no holder left. */
void page_arena_free(struct page_chunk *chunk);
/* The arena lets go of its open chunk (unmapped if no allocation is left in it). */
void page_arena_close(struct page_arena *a);

#endif
