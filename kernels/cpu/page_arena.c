/* page_arena: see page_arena.h. */
#include "page_arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)
/* A chunk's size: SmolLM2-135M's weights in 4 of them; what a chunk leaves unused at its end is
 * never touched, so never resident */
#define CHUNK_BYTES ((size_t)32 << 20)
/* From this size an allocation gets a chunk of its own, and the open chunk stays open */
#define OWN_CHUNK_MIN (CHUNK_BYTES / 4)
#define ALIGN         64

/* Under ASan the chunk is poisoned but for its allocations' own bytes, with a gap between them,
 * so a kernel that reads past its weight's end is caught as it was on the heap. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define ARENA_ASAN 1
#endif
#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define REDZONE ALIGN
#else
#define ASAN_POISON_MEMORY_REGION(p, n)   ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define REDZONE                           0
#endif

struct page_chunk {
    char *base;   /* HUGE_PAGE-aligned */
    size_t bytes; /* mapped, a multiple of HUGE_PAGE */
    size_t used;  /* carved so far */
    long holders; /* live allocations, plus one while the arena's open chunk */
};

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* A mapping of bytes (a multiple of HUGE_PAGE) that starts on a HUGE_PAGE boundary: mmap gives
 * only page alignment, so map a huge page more and unmap the ends. */
static struct page_chunk *chunk_map(size_t bytes)
{
    if (bytes > SIZE_MAX - HUGE_PAGE) return NULL;
    struct page_chunk *c = malloc(sizeof *c);
    if (!c) return NULL;
    size_t len = bytes + HUGE_PAGE;
    char *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        free(c);
        return NULL;
    }
    char *base = (char *)round_up((uintptr_t)raw, HUGE_PAGE);
    size_t head = (size_t)(base - raw), tail = len - head - bytes;
    if (head) munmap(raw, head);
    if (tail) munmap(base + bytes, tail);
    madvise(base, bytes, MADV_HUGEPAGE); /* a hint: without THP the pages are small */
    ASAN_POISON_MEMORY_REGION(base, bytes);
    *c = (struct page_chunk){.base = base, .bytes = bytes, .used = 0, .holders = 0};
    return c;
}

static void chunk_drop(struct page_chunk *c)
{
    if (--c->holders > 0) return;
    ASAN_UNPOISON_MEMORY_REGION(c->base, c->bytes); /* the addresses may be mapped again */
    munmap(c->base, c->bytes);
    free(c);
}

void *page_arena_alloc(struct page_arena *a, size_t bytes, struct page_chunk **chunk)
{
    *chunk = NULL;
    if (bytes == 0 || bytes > SIZE_MAX / 2) return NULL;
    size_t need = round_up(bytes + REDZONE, ALIGN);
    struct page_chunk *c;
    if (need >= OWN_CHUNK_MIN) {
        if (!(c = chunk_map(round_up(need, HUGE_PAGE)))) return NULL;
    } else {
        if (!a->open || a->open->bytes - a->open->used < need) {
            struct page_chunk *fresh = chunk_map(CHUNK_BYTES);
            if (!fresh) return NULL;
            page_arena_close(a);
            fresh->holders = 1;
            a->open = fresh;
        }
        c = a->open;
    }
    void *p = c->base + c->used;
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    c->used += need;
    c->holders++;
    *chunk = c;
    return p;
}

void page_arena_free(struct page_chunk *chunk)
{
    if (chunk) chunk_drop(chunk);
}

void page_arena_close(struct page_arena *a)
{
    if (!a->open) return;
    chunk_drop(a->open);
    a->open = NULL;
}
