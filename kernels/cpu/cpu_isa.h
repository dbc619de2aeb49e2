/* cpu_isa: which instruction sets this CPU has, and the names tests and $QUERN_CPU_ISA use.
 *
 * Detection runs CPUID (through __builtin_cpu_supports) when the backend is created and the result
 * lives in the backend's context; nothing here keeps state. Kernels for each ISA are compiled with
 * per-function target attributes, so one binary runs on any x86-64 and picks its path at run time.
 */
#ifndef QUERN_CPU_ISA_H
#define QUERN_CPU_ISA_H

#include <stdbool.h>

#include "../backend.h"

/* The best ISA this CPU supports (never CPU_ISA_AUTO). */
enum cpu_isa cpu_isa_best(void);
/* True when this CPU can run kernels of isa (AUTO and SCALAR always). */
bool cpu_isa_supported(enum cpu_isa isa);
const char *cpu_isa_name(enum cpu_isa isa); /* "scalar", "avx2", "avx512", "auto" */
/* Parses "scalar", "avx2", "avx512" or "auto" (case-insensitive); -1 when unknown. */
int cpu_isa_parse(const char *s);
/* Resolves the requested ISA: AUTO consults $QUERN_CPU_ISA, then CPUID. QERR_UNSUPPORTED when the
 * CPU lacks the requested ISA, QERR_INVALID when the variable names none. */
int cpu_isa_resolve(enum cpu_isa want, enum cpu_isa *out, struct qerr *err);

#endif
