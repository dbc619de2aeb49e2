/* testbackend: $QUERN_TEST_DEVICE's backend for the suites (testbackend.h). */
#include "testbackend.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/backend_select.h"
#include "testutil.h"

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

void tb_model_open(struct gguf_file **file, struct tokenizer **tok, struct backend **be,
                   int32_t **ids, size_t *n_ids)
{
    struct qerr err = {0};
    ck_assert_msg(gguf_open(tu_model_path(), file, &err) == 0, "%s", err.msg);
    ck_assert_msg(tokenizer_load(*file, tok, &err) == 0, "%s", err.msg);
    *be = tb_backend(MATMUL_F32, 2);
    size_t len;
    char *text = tu_read_file("/usr/share/common-licenses/GPL-3", &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_int_eq(tokenizer_encode(*tok, text, len, false, false, ids, n_ids, &err), 0);
    free(text);
}

void tb_model_close(struct gguf_file *file, struct tokenizer *tok, struct backend *be, int32_t *ids)
{
    free(ids);
    backend_destroy(be);
    tokenizer_free(tok);
    gguf_close(file);
}
