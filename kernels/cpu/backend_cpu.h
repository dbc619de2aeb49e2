/* backend_cpu: the CPU backend's own options and what it tells about itself (the ops are
 * kernels/backend.h's contract). */
#ifndef QUERN_BACKEND_CPU_H
#define QUERN_BACKEND_CPU_H

#include <stdbool.h>

#include "../backend.h"
#include "threadpool.h"

/* The instruction set the CPU kernels use. AUTO picks the best the CPU reports (CPUID); asking
 * for an ISA the CPU lacks is an error. (backend_select.c applies $QUERN_CPU_ISA.) */
enum cpu_isa {
    CPU_ISA_AUTO = 0,
    CPU_ISA_SCALAR = 1, /* the reference kernels (kernels/cpu/ref.c) */
    CPU_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512 = 3, /* AVX-512 F/BW/VL/VNNI */
    /* AVX2 + FMA + F16C + AVX-VNNI (vpdpbusd on 256 bits): the AVX2 kernels but the Q8 matmul
     * (mm_avxvnni.c). Between AVX2 and AVX-512 in what AUTO prefers. */
    CPU_ISA_AVXVNNI = 4,
    /* AVX-512 + AMX-TILE + AMX-INT8, with the OS's leave to use the tiles: the AVX-512 kernels but
     * the Q8 matmul of 16 or more tokens (mm_amx.c). First in what AUTO prefers. */
    CPU_ISA_AMX = 5,
};

/* Where the AVX-512 kernels' software prefetch puts the lines of the weight stream and of the KV
 * cache (mm_avx512.c and attn_rows.h say what each core measured). AUTO picks by the core
 * (cpu_prefetch_best); the arithmetic, and so every result, is the same either way.
 * (backend_select.c applies $QUERN_CPU_PREFETCH.) */
enum cpu_prefetch {
    CPU_PREFETCH_AUTO = 0,
    CPU_PREFETCH_L2 = 1, /* prefetcht1 */
    CPU_PREFETCH_L1 = 2, /* prefetcht0 */
};

struct backend_cpu_opts {
    int n_threads; /* 0: all online CPUs */
    enum matmul_precision precision;
    enum cpu_isa isa;
    enum cpu_prefetch prefetch;
    /* the KV cache's element: fp16 (half the bytes attention reads; --kv-type f16) or float;
     * kv_q8 (before kv_f16): Q8_0 blocks (--kv-type q8, 34 bytes per 32 elements) */
    bool kv_f16, kv_q8;
};

int backend_cpu_create(const struct backend_cpu_opts *opts, struct backend **out, struct qerr *err);
/* The ISA a CPU backend resolved at create (never CPU_ISA_AUTO). */
enum cpu_isa backend_cpu_isa(const struct backend *be);

/* The backend's thread pool counts its jobs' waits (threadpool.h, pool_stats) while on;
 * backend_cpu_pool_stats reads the counts. */
void backend_cpu_pool_count(struct backend *be, bool on);
void backend_cpu_pool_stats(const struct backend *be, struct pool_stats *out);

/* True when this CPU can run kernels of isa (AUTO and SCALAR always). */
bool cpu_isa_supported(enum cpu_isa isa);
/* "scalar", "avx2", "avxvnni", "avx512", "amx", "auto" */
const char *cpu_isa_name(enum cpu_isa isa);
/* "l1", "l2", "auto"; the parse is case-insensitive, -1 when unknown. */
const char *cpu_prefetch_name(enum cpu_prefetch p);
int cpu_prefetch_parse(const char *s);
/* Parses "scalar", "avx2", "avxvnni", "avx512", "amx" or "auto" (case-insensitive); -1 when
 * unknown. */
int cpu_isa_parse(const char *s);

#endif
