/* quern-bench-kernels: the CPU kernel benchmark (engine/bench_kernels.c, also `quern bench
 * --kernels`) as a program of its own. */
#include "../engine/bench_kernels.h"

int main(int argc, char **argv)
{
    return bench_kernels_main(argc, argv);
}
