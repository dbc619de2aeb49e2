/* --device selection (kernels/backend_select.h), in every build: parsing, QUERN_FORCE_CPU, and
 * what `auto` and `cuda` do here. Without a usable GPU (CI), auto must give the CPU backend and
 * say why, and an explicit cuda must be an error, never an exit; with one, auto gives CUDA.
 * The CUDA runtime must not be used after a fork, so the suite runs without forking. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/backend_select.h"
#include "../kernels/cpu/backend_cpu.h"
#ifdef QUERN_HAVE_CUDA
#include "../kernels/cuda/backend_cuda.h"
#endif

/* 1 when a CUDA device is usable in this build on this machine */
static int gpu_usable(char *why, size_t len)
{
#ifdef QUERN_HAVE_CUDA
    struct qerr err = {0};
    int rc = backend_cuda_probe(0, NULL, 0, &err);
    snprintf(why, len, "%s", rc ? err.msg : "usable");
    return rc == 0;
#else
    snprintf(why, len, "built without CUDA");
    return 0;
#endif
}

START_TEST(parse_device_strings)
{
    struct qerr err = {0};
    enum backend_kind k;
    int i;
    ck_assert_int_eq(backend_device_parse(NULL, &k, &i, &err), 0);
    ck_assert_int_eq(k, BACKEND_KIND_AUTO);
    ck_assert_int_eq(backend_device_parse("auto", &k, &i, &err), 0);
    ck_assert_int_eq(k, BACKEND_KIND_AUTO);
    ck_assert_int_eq(backend_device_parse("cpu", &k, &i, &err), 0);
    ck_assert_int_eq(k, BACKEND_KIND_CPU);
    ck_assert_int_eq(backend_device_parse("cuda", &k, &i, &err), 0);
    ck_assert_int_eq(k, BACKEND_KIND_CUDA);
    ck_assert_int_eq(i, 0);
    ck_assert_int_eq(backend_device_parse("cuda:3", &k, &i, &err), 0);
    ck_assert_int_eq(k, BACKEND_KIND_CUDA);
    ck_assert_int_eq(i, 3);
    const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:1x", "cuda:-1", "cudax", "CPU", "cpu:0"};
    for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
        ck_assert_int_eq(backend_device_parse(bad[j], &k, &i, &err), QERR_INVALID);
        ck_assert_ptr_nonnull(strstr(err.msg, bad[j]));
    }
}
END_TEST

static int create(const char *device, int precision, struct backend **be, struct qerr *err)
{
    struct backend_request r = {.device = device, .threads = 1};
    memcpy(&r.precision, &precision, sizeof precision); /* 7: an out-of-range value on purpose */
    return backend_create_auto(&r, be, err);
}

START_TEST(cpu_and_force_cpu)
{
    struct backend *be = NULL;
    struct qerr err = {0};
    ck_assert_int_eq(create("cpu", MATMUL_F32, &be, &err), 0);
    ck_assert_str_eq(be->ops->name, "cpu");
    ck_assert_int_eq(err.code, 0);
    char want[96];
    snprintf(want, sizeof want, "cpu, %s kernels, f32 activations, f32 KV",
             cpu_isa_name(backend_cpu_isa(be)));
    ck_assert_str_eq(err.msg, want);
    backend_destroy(be);
    /* MATMUL_AUTO: the CPU takes q8, with an fp16 KV cache, and says so */
    ck_assert_int_eq(create("cpu", MATMUL_AUTO, &be, &err), 0);
    snprintf(want, sizeof want, "cpu, %s kernels, q8 activations, f16 KV",
             cpu_isa_name(backend_cpu_isa(be)));
    ck_assert_str_eq(err.msg, want);
    ck_assert_uint_eq(backend_kv_elem_bytes(be), 2);
    backend_destroy(be);
    setenv("QUERN_FORCE_CPU", "1", 1);
    const char *devs[] = {"auto", "cuda", "cuda:0"};
    for (size_t j = 0; j < 3; j++) {
        ck_assert_int_eq(create(devs[j], MATMUL_Q8, &be, &err), 0);
        ck_assert_str_eq(be->ops->name, "cpu");
        ck_assert_ptr_nonnull(strstr(err.msg, "QUERN_FORCE_CPU"));
        backend_destroy(be);
    }
    unsetenv("QUERN_FORCE_CPU");
    ck_assert_int_eq(create("auto", 7, &be, &err), QERR_INVALID);
}
END_TEST

START_TEST(auto_and_cuda_follow_the_machine)
{
    char why[512];
    int gpu = gpu_usable(why, sizeof why);
    struct backend *be = NULL;
    struct qerr err = {0};
    ck_assert_int_eq(create("auto", MATMUL_F32, &be, &err), 0);
    printf("auto: %s\n", err.msg);
    ck_assert_str_eq(be->ops->name, gpu ? "cuda" : "cpu");
    if (!gpu) ck_assert_msg(strstr(err.msg, "auto: ") != NULL, "no reason given: %s", err.msg);
    backend_destroy(be);
    be = NULL;
    int rc = create("cuda", MATMUL_F32, &be, &err);
    if (gpu) {
        ck_assert_msg(rc == 0, "%s", err.msg);
        ck_assert_str_eq(be->ops->name, "cuda");
        backend_destroy(be);
    } else {
        ck_assert_int_eq(rc, QERR_UNSUPPORTED);
        ck_assert_ptr_null(be);
        printf("cuda: %s\n", err.msg);
    }
    /* an ordinal past the devices present: an error, not the CPU */
    rc = create("cuda:1000", MATMUL_F32, &be, &err);
    ck_assert_int_ne(rc, 0);
    ck_assert_ptr_null(be);
    printf("machine: %s\n", why);
}
END_TEST

int main(void)
{
    unsetenv("QUERN_FORCE_CPU");
    Suite *s = suite_create("cuda_select");
    TCase *tc = tcase_create("select");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, parse_device_strings);
    tcase_add_test(tc, cpu_and_force_cpu);
    tcase_add_test(tc, auto_and_cuda_follow_the_machine);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_set_fork_status(r, CK_NOFORK);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
