/* Force-included (-include) into every C file of a -Dfault_injection=true build: the C library's
 * allocators become quant/fault.c's, which can fail on demand. The system headers come first so
 * their declarations are seen before the names are redefined. */
#ifndef QUERN_FAULT_ALLOC_H
#define QUERN_FAULT_ALLOC_H

#include <stdlib.h>
#include <string.h>

#include "fault.h"

#ifndef QUERN_FAULT_NO_REDIRECT
#undef strdup
#undef strndup
#define malloc(n)               fault_malloc(n)
#define calloc(n, s)            fault_calloc(n, s)
#define realloc(p, n)           fault_realloc(p, n)
#define strdup(s)               fault_strdup(s)
#define strndup(s, n)           fault_strndup(s, n)
#define aligned_alloc(a, n)     fault_aligned_alloc(a, n)
#define posix_memalign(p, a, n) fault_posix_memalign(p, a, n)
#endif

#endif
