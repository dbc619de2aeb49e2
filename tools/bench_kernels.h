/* bench_kernels: the CPU kernel benchmark (tools/bench-kernels.c), as `quern bench --kernels`
 * and as the quern-bench-kernels program. argv[0] is ignored; the rest are its options. */
#ifndef QUERN_BENCH_KERNELS_H
#define QUERN_BENCH_KERNELS_H

int bench_kernels_main(int argc, char **argv);

#endif
