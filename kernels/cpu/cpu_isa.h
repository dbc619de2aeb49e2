/* cpu_isa: which instruction sets this CPU has, and the names tests and $QUERN_CPU_ISA use.
 *
 * Detection runs CPUID (through __builtin_cpu_supports) when the backend is created and the result
 * lives in the backend's context; nothing here keeps state. Kernels for each ISA are compiled with
 * per-function target attributes, so one binary runs on any x86-64 and picks its path at run time.
 */
#ifndef QUERN_CPU_ISA_H
#define QUERN_CPU_ISA_H

#include <stdbool.h>

#include "backend_cpu.h"

/* The best ISA this CPU supports (never CPU_ISA_AUTO). */
enum cpu_isa cpu_isa_best(void);
/* cpu_isa_supported, cpu_isa_name and cpu_isa_parse are public: backend_cpu.h. */
/* The prefetch target this core streams weights fastest with (never AUTO): L1 on AMD Zen 5
 * (family 1Ah) and later, else L2 (mm_avx512.c has the measurements). */
enum cpu_prefetch cpu_prefetch_best(void);
/* Resolves the requested ISA (AUTO: the best CPUID reports). QERR_UNSUPPORTED when the CPU lacks
 * it. */
int cpu_isa_resolve(enum cpu_isa want, enum cpu_isa *out, struct qerr *err);

#endif
