/* testbackend: $QUERN_TEST_DEVICE's backend for the suites (testbackend.h). */
#include "testbackend.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/backend_select.h"

struct backend *tb_backend(enum matmul_precision precision, int threads)
{
    const char *dev = getenv("QUERN_TEST_DEVICE");
    struct backend_request r = {.device = dev && *dev ? dev : "cpu",
                                .threads = threads,
                                .precision = precision,
                                .batch_invariant = true};
    struct backend *be = NULL;
    struct qerr err = {0};
    ck_assert_msg(backend_create_auto(&r, &be, &err) == 0, "%s", err.msg);
    if (dev && *dev) printf("backend: %s\n", err.msg);
    return be;
}
