/* Failure injection (quant/fault.h). Built only with -Dfault_injection=true. The state is
 * process-wide by nature: every allocation in every module counts against one sequence, as in
 * SQLite's test_malloc.c, so it lives in one file-scope struct of atomics, set once from
 * $QUERN_FAULT before any thread exists (the first allocation reads it). */
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* this file calls the real allocators */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup
#undef aligned_alloc
#undef posix_memalign

/* a sanitizer build's runtime prints where the failure was injected (QUERN_FAULT_STACK=1) */
void __sanitizer_print_stack_trace(void) __attribute__((weak));

enum fault_mode { MODE_OFF, MODE_COUNT, MODE_AT, MODE_REQUEST };

static const char *const kind_names[FAULT_KIND_COUNT] = {"alloc", "kv_block", "write", "read"};

static struct {
    pthread_once_t once;
    enum fault_mode mode;
    atomic_long count[FAULT_KIND_COUNT];
    atomic_int kind;    /* the kind armed, or -1 */
    atomic_long target; /* the count of that kind that fails */
    bool stack;
    pthread_mutex_t arm_mu; /* orders fault_arm and fault_disarm */
    long ticket;            /* the latest arming's; guarded by arm_mu */
} g = {.once = PTHREAD_ONCE_INIT, .kind = -1, .arm_mu = PTHREAD_MUTEX_INITIALIZER};

static int parse_kind(const char *s, size_t len)
{
    for (int k = 0; k < FAULT_KIND_COUNT; k++)
        if (strlen(kind_names[k]) == len && !memcmp(s, kind_names[k], len)) return k;
    return -1;
}

/* "KIND:N" -> kind and N >= 1; -1 when malformed */
static int parse_spec(const char *spec, int *kind, long *n)
{
    const char *colon = strchr(spec, ':');
    if (!colon) return -1;
    *kind = parse_kind(spec, (size_t)(colon - spec));
    char *end;
    *n = strtol(colon + 1, &end, 10);
    return *kind < 0 || *n < 1 || *end ? -1 : 0;
}

static void init(void)
{
    const char *v = getenv("QUERN_FAULT");
    if (!v || !*v) return;
    const char *st = getenv("QUERN_FAULT_STACK");
    g.stack = st && *st && strcmp(st, "0") != 0;
    int kind;
    long n;
    if (!strcmp(v, "count")) {
        g.mode = MODE_COUNT;
    } else if (!strcmp(v, "request")) {
        g.mode = MODE_REQUEST;
    } else if (!parse_spec(v, &kind, &n)) {
        g.mode = MODE_AT;
        atomic_store(&g.target, n);
        atomic_store(&g.kind, kind);
    } else {
        /* a sweep that silently injects nothing would pass: refuse to run */
        fprintf(stderr,
                "quern: fault: QUERN_FAULT='%s' is not count, request or KIND:N (KIND: "
                "alloc, kv_block, write, read)\n",
                v);
        exit(2);
    }
}

bool fault_hit(enum fault_kind kind)
{
    pthread_once(&g.once, init);
    if (g.mode == MODE_OFF) return false;
    long n = atomic_fetch_add(&g.count[kind], 1) + 1;
    if (atomic_load(&g.kind) != (int)kind || n != atomic_load(&g.target)) return false;
    /* one failure per arming: whoever clears the kind first fails */
    int expect = (int)kind;
    if (!atomic_compare_exchange_strong(&g.kind, &expect, -1)) return false;
    fprintf(stderr, "quern: fault: injected %s failure #%ld\n", kind_names[kind], n);
    if (g.stack && __sanitizer_print_stack_trace) __sanitizer_print_stack_trace();
    return true;
}

long fault_arm(const char *spec)
{
    pthread_once(&g.once, init);
    int kind;
    long n;
    if (g.mode != MODE_REQUEST || parse_spec(spec, &kind, &n)) return -1;
    pthread_mutex_lock(&g.arm_mu);
    atomic_store(&g.kind, -1);
    atomic_store(&g.target, atomic_load(&g.count[kind]) + n);
    long ticket = ++g.ticket;
    atomic_store(&g.kind, kind);
    pthread_mutex_unlock(&g.arm_mu);
    return ticket;
}

void fault_disarm(long ticket)
{
    /* MHD may report a request complete after its client has read the answer and sent the
     * next one, which armed its own failure: only the arming's own request disarms it */
    pthread_mutex_lock(&g.arm_mu);
    if (ticket == g.ticket) atomic_store(&g.kind, -1);
    pthread_mutex_unlock(&g.arm_mu);
}

void fault_mark(const char *phase)
{
    pthread_once(&g.once, init);
    if (g.mode == MODE_OFF) return;
    fprintf(stderr, "quern: fault: points at %s: alloc=%ld kv_block=%ld write=%ld read=%ld\n",
            phase, atomic_load(&g.count[FAULT_ALLOC]), atomic_load(&g.count[FAULT_KV_BLOCK]),
            atomic_load(&g.count[FAULT_WRITE]), atomic_load(&g.count[FAULT_READ]));
}

void *fault_malloc(size_t n)
{
    return fault_hit(FAULT_ALLOC) ? NULL : malloc(n);
}

void *fault_calloc(size_t n, size_t size)
{
    return fault_hit(FAULT_ALLOC) ? NULL : calloc(n, size);
}

void *fault_realloc(void *p, size_t n)
{
    return fault_hit(FAULT_ALLOC) ? NULL : realloc(p, n);
}

char *fault_strdup(const char *s)
{
    return fault_hit(FAULT_ALLOC) ? NULL : strdup(s);
}

char *fault_strndup(const char *s, size_t n)
{
    return fault_hit(FAULT_ALLOC) ? NULL : strndup(s, n);
}

void *fault_aligned_alloc(size_t align, size_t n)
{
    return fault_hit(FAULT_ALLOC) ? NULL : aligned_alloc(align, n);
}

int fault_posix_memalign(void **p, size_t align, size_t n)
{
    return fault_hit(FAULT_ALLOC) ? ENOMEM : posix_memalign(p, align, n);
}
