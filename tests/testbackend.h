/* testbackend: the backend the model and engine suites run on. $QUERN_TEST_DEVICE names it as
 * --device does (default cpu), so tools/gpu-check.sh runs the same suites on the CUDA backend;
 * always batch-invariant, since the suites compare batched with one-at-a-time results bit for
 * bit. A CUDA run needs CK_FORK=no (CUDA must not be used across a fork). */
#ifndef QUERN_TESTBACKEND_H
#define QUERN_TESTBACKEND_H

#include "../kernels/backend.h"

/* Creates it (threads: the CPU's workers); fails the running test when it cannot. */
struct backend *tb_backend(enum matmul_precision precision, int threads);

#endif
