/* bench_kernels: the CPU kernel benchmark (bench_kernels.c), as `quern bench --kernels` and as
 * the quern-bench-kernels program (tools/bench-kernels.c). argv[0] is ignored; the rest are its
 * options. */
#ifndef QUERN_BENCH_KERNELS_H
#define QUERN_BENCH_KERNELS_H

int bench_kernels_main(int argc, char **argv);

#endif
