/* Synthetic models (engine/synth.h): the file they make is a model the loader and tokenizer
 * take as it is, of the shape asked for, whose forward gives finite logits, and nothing is left
 * on disk; bad names and types are refused. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/generate.h"
#include "../engine/synth.h"
#include "../engine/tokenizer.h"
#include "../kernels/backend.h"
#include "../kernels/cpu/backend_cpu.h"

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static bool count_token(void *ctx, int32_t token, const float *logits)
{
    (void)token;
    int *n = ctx;
    (*n)++;
    for (int i = 0; i < 49152; i++) ck_assert(isfinite(logits[i]));
    return false;
}

START_TEST(smollm2_shape_loads_and_runs)
{
    char dir[] = "/tmp/quern-test-synth-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const enum qtype types[] = {QTYPE_Q4_1, QTYPE_Q8_0, QTYPE_F16};
    for (int k = 0; k < 3; k++) {
        struct gguf_file *f = NULL;
        struct qerr err = {0};
        ck_assert_msg(synth_model_open("smollm2-135m", types[k], 7, dir, &f, &err) == 0, "%s",
                      err.msg);
        ck_assert_int_eq(entries(dir), 0); /* unlinked as soon as it is open */
        struct model_config cfg;
        ck_assert_int_eq(model_config_read(f, &cfg, &err), 0);
        ck_assert_int_eq(cfg.n_layers, 30);
        ck_assert_int_eq(cfg.dim, 576);
        ck_assert_int_eq(cfg.ffn_dim, 1536);
        ck_assert_int_eq(cfg.n_heads, 9);
        ck_assert_int_eq(cfg.n_kv_heads, 3);
        ck_assert_int_eq(cfg.vocab, 49152);
        ck_assert(cfg.tied_output);
        ck_assert_int_eq((int)gguf_tensor_find(f, "blk.29.ffn_down.weight")->type, (int)types[k]);

        struct tokenizer *tok = NULL;
        ck_assert_msg(tokenizer_load(f, &tok, &err) == 0, "%s", err.msg);
        ck_assert_int_eq(tokenizer_vocab_size(tok), 49152);
        tokenizer_free(tok);

        struct backend *be = NULL;
        struct backend_cpu_opts bo = {.n_threads = 2, .precision = MATMUL_Q8};
        ck_assert_int_eq(backend_cpu_create(&bo, &be, &err), 0);
        struct model_opts mo = {
            .max_batch_tokens = 8, .max_logits = 1, .kv_blocks = 2, .kv_block_size = 16};
        struct model *m = NULL;
        ck_assert_msg(model_load(f, be, &mo, &m, &err) == 0, "%s", err.msg);
        int32_t prompt[4] = {1, 300, 301, 302};
        struct gen_opts go = {.n_predict = 3, .prefill_chunk = 8};
        sample_params_default(&go.sample);
        go.sample.temperature = 0;
        int produced = 0;
        ck_assert_msg(generate_run(m, prompt, 4, &go, count_token, &produced, &err) == 0, "%s",
                      err.msg);
        ck_assert_int_eq(produced, 3);
        model_free(m);
        backend_destroy(be);
        gguf_close(f);
    }
    ck_assert_int_eq(rmdir(dir), 0); /* still empty */
}
END_TEST

START_TEST(bad_requests_refused)
{
    struct gguf_file *f = NULL;
    struct qerr err = {0};
    ck_assert_int_eq(synth_model_open("llama9-1t", QTYPE_Q4_0, 1, NULL, &f, &err), QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "llama9-1t"));
    ck_assert_int_eq(synth_model_open("llama2-7b", QTYPE_BF16, 1, NULL, &f, &err),
                     QERR_UNSUPPORTED);
    ck_assert_int_eq(synth_model_open("smollm2-135m", QTYPE_Q4_0, 1, "/nonexistent/dir", &f, &err),
                     QERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/dir"));
    ck_assert_ptr_null(f);
    ck_assert_ptr_nonnull(synth_shape_find("llama3-8b"));
    ck_assert_int_eq(synth_shape_find("llama3-8b")->vocab, 128256);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("synth");
    TCase *tc = tcase_create("synth");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, smollm2_shape_loads_and_runs);
    tcase_add_test(tc, bad_requests_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
