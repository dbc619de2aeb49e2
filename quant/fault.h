/* fault: failure injection for tests (issue 20), after SQLite's test_malloc.c.
 *
 * A build configured with -Dfault_injection=true (never a release build: meson refuses it)
 * defines QUERN_FAULT_INJECTION, and the places where quern allocates memory, takes a KV block,
 * hands bytes to a client's socket or reads the model file ask fault_hit(KIND) first: true means
 * "fail here as the real call would". Without the option fault_hit is the constant false, so the
 * release code is unchanged. Allocations are routed here by fault_alloc.h, which that build
 * force-includes into every C file; cJSON's allocations by cJSON_InitHooks in main.
 *
 * What fails is chosen at run time by $QUERN_FAULT, so one binary serves a whole sweep:
 *   count            count every point; print the counts at ready and at exit (fault_mark)
 *   KIND:N           fail the Nth KIND point of the process (1-based), once
 *   request          let each HTTP request arm one failure with the header
 *                    "X-Quern-Fault: KIND:N": the Nth KIND point from then on fails, once,
 *                    unless the request completes first
 * KIND is alloc, kv_block, write or read. Every injected failure prints one line to stderr,
 * "quern: fault: injected KIND failure #N", which the sweep (tests/test_fault.py) reads. */
#ifndef QUERN_FAULT_H
#define QUERN_FAULT_H

#include <stdbool.h>
#include <stddef.h>

enum fault_kind {
    FAULT_ALLOC,    /* malloc, calloc, realloc, strdup, strndup, aligned allocs, cJSON's */
    FAULT_KV_BLOCK, /* kv_block_alloc: the pool behaves as if empty */
    FAULT_WRITE,    /* a buffer handed to a client's socket: the client behaves as if gone */
    FAULT_READ,     /* open, mmap or a header read of a GGUF file: an I/O error */
    FAULT_KIND_COUNT
};

#ifdef QUERN_FAULT_INJECTION
/* Counts one KIND point; true when this one is to fail. Thread-safe. */
bool fault_hit(enum fault_kind kind);
/* $QUERN_FAULT=request only: arms one failure, "KIND:N" counted from now, replacing any armed.
 * Returns a ticket for fault_disarm, or -1 for a spec it cannot read (or when arming is not
 * enabled). */
long fault_arm(const char *spec);
/* Disarms the failure armed with ticket, unless another arming has replaced it. */
void fault_disarm(long ticket);
/* Prints "quern: fault: points at PHASE: alloc=A kv_block=K write=W read=R" when $QUERN_FAULT
 * is set. */
void fault_mark(const char *phase);
/* The allocators fault_alloc.h substitutes; cJSON's hooks take fault_malloc too. */
void *fault_malloc(size_t n);
void *fault_calloc(size_t n, size_t size);
void *fault_realloc(void *p, size_t n);
char *fault_strdup(const char *s);
char *fault_strndup(const char *s, size_t n);
void *fault_aligned_alloc(size_t align, size_t n);
int fault_posix_memalign(void **p, size_t align, size_t n);
#else
static inline bool fault_hit(enum fault_kind kind)
{
    (void)kind;
    return false;
}
static inline long fault_arm(const char *spec)
{
    (void)spec;
    return -1;
}
static inline void fault_disarm(long ticket)
{
    (void)ticket;
}
static inline void fault_mark(const char *phase)
{
    (void)phase;
}
#endif

#endif
