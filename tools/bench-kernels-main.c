/* quern-bench-kernels: tools/bench-kernels.c as a program of its own. */
#include "bench_kernels.h"

int main(int argc, char **argv)
{
    return bench_kernels_main(argc, argv);
}
