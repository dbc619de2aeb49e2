/* bench_ceiling: this machine's ceilings, measured, for the benchmarks to compare against
 * (engine/bench_kernels.c, engine/bench_profile.c): memory read bandwidth and the CPU's compute
 * peak. */
#ifndef QUERN_BENCH_CEILING_H
#define QUERN_BENCH_CEILING_H

#include <stdbool.h>

#include "../kernels/cpu/backend_cpu.h"

/* Best GB/s (1e9 B/s) of 3 streaming reads of a 512 MiB buffer split over `threads` threads;
 * 0 when the buffer cannot be allocated. */
double bench_read_bandwidth(int threads);
/* Best GB/s of 3 single-thread memcpys of 256 MiB (bytes read; as many are written). */
double bench_memcpy_bandwidth(void);
/* Best G(FL)OP/s of many windows on `threads` threads of independent chains of one
 * instruction: fp32 FMA (AVX-512: 32 flops per instruction; AVX2: 16), or the int8
 * multiply-add the Q8 kernels of `isa` use (AVX-512 VNNI vpdpbusd: 128 ops; AVX-VNNI vpdpbusd on
 * 256 bits and AVX2 vpmaddubsw: 64 ops; counted as the Q8 matmul's GOP/s count them, 2 per
 * multiply-add): the ceiling of the kernels of isa (AUTO: the best this CPU has). 0 where this
 * CPU cannot run isa, or has none of them. */
double bench_compute_peak(bool fp32_fma, int threads, enum cpu_isa isa);
/* The instruction bench_compute_peak(false, ..., isa) times here: "vpdpbusd", "vpdpbusd-ymm",
 * "vpmaddubsw" or "-". */
const char *bench_int8_peak_insn(enum cpu_isa isa);

#endif
