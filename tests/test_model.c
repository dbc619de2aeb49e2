/* The forward pass on the real model against tests/golden/smollm2.json, which Hugging Face
 * transformers computed in fp32 from the same GGUF file (tools/make-golden.py): logits at chosen
 * positions within 1e-3 relative, and 48-token greedy continuations token for token. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/generate.h"
#include "testutil.h"

static cJSON *golden;
static struct gguf_file *file;
static struct backend *be;
static struct model *model;

static void setup(void)
{
    struct qerr err = {0};
    ck_assert_msg(gguf_open(tu_model_path(), &file, &err) == 0, "%s", err.msg);
    struct backend_cpu_opts bo = {.n_threads = 2, .precision = MATMUL_F32};
    ck_assert_msg(backend_cpu_create(&bo, &be, &err) == 0, "%s", err.msg);
    struct model_opts mo = {
        .max_batch_tokens = 64, .max_logits = 64, .kv_blocks = 16, .kv_block_size = 16};
    ck_assert_msg(model_load(file, be, &mo, &model, &err) == 0, "%s", err.msg);
}

static void teardown(void)
{
    model_free(model);
    backend_destroy(be);
    gguf_close(file);
}

static int32_t *json_ids(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) ids[i++] = (int32_t)v->valueint;
    return ids;
}

static const cJSON *gen_case(int i)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(golden, "generate");
    return cJSON_GetArrayItem(g, i);
}

START_TEST(logits_match_reference)
{
    const cJSON *c = gen_case(_i);
    size_t np, ng;
    int32_t *p = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
    int32_t *g = json_ids(cJSON_GetObjectItemCaseSensitive(c, "greedy_ids"), &ng);
    int32_t *seq = malloc((np + ng) * sizeof *seq);
    memcpy(seq, p, np * sizeof *seq);
    memcpy(seq + np, g, ng * sizeof *seq);
    float *logits;
    struct qerr err = {0};
    ck_assert_msg(generate_all_logits(model, seq, np + ng, 37, &logits, &err) == 0, "%s", err.msg);
    int vocab = model_get_config(model)->vocab;
    double worst = 0;
    const cJSON *pl;
    cJSON_ArrayForEach(pl, cJSON_GetObjectItemCaseSensitive(c, "logits"))
    {
        int pos = cJSON_GetObjectItemCaseSensitive(pl, "pos")->valueint;
        ck_assert_int_lt(pos, (int)(np + ng));
        const float *row = logits + (size_t)pos * (size_t)vocab;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(pl, "top_ids");
        const cJSON *vals = cJSON_GetObjectItemCaseSensitive(pl, "top_logits");
        for (int k = 0; k < cJSON_GetArraySize(ids); k++) {
            int id = cJSON_GetArrayItem(ids, k)->valueint;
            double ref = cJSON_GetArrayItem(vals, k)->valuedouble;
            double rel = fabs(row[id] - ref) / fmax(fabs(ref), 1.0);
            if (rel > worst) worst = rel;
            ck_assert_msg(rel <= 1e-3, "%s pos %d token %d: quern %.6f, reference %.6f",
                          cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, pos, id,
                          row[id], ref);
        }
    }
    printf("%s: worst relative logit error %.2e\n",
           cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, worst);
    free(logits);
    free(seq);
    free(p);
    free(g);
}
END_TEST

struct collect {
    int32_t *out;
    int n, cap;
};

static bool collect_token(void *ctx, int32_t token, const float *logits)
{
    (void)logits;
    struct collect *c = ctx;
    if (c->n < c->cap) c->out[c->n++] = token;
    return false;
}

START_TEST(greedy_matches_reference)
{
    const cJSON *c = gen_case(_i);
    const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
    size_t np, ng;
    int32_t *p = json_ids(cJSON_GetObjectItemCaseSensitive(c, "prompt_ids"), &np);
    int32_t *g = json_ids(cJSON_GetObjectItemCaseSensitive(c, "greedy_ids"), &ng);
    const cJSON *gaps = cJSON_GetObjectItemCaseSensitive(c, "top2_gap");
    struct collect col = {.out = calloc(ng, sizeof(int32_t)), .cap = (int)ng};
    struct gen_opts o = {.n_predict = (int)ng, .prefill_chunk = 29};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    struct qerr err = {0};
    ck_assert_msg(generate_run(model, p, np, &o, collect_token, &col, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(col.n, (int)ng);
    for (size_t i = 0; i < ng; i++) {
        if (col.out[i] == g[i]) continue;
        double gap = cJSON_GetArrayItem(gaps, (int)i)->valuedouble;
        ck_assert_msg(gap < 1e-3, "%s: step %zu: quern %d, reference %d (top-2 gap %.4f)", name, i,
                      col.out[i], g[i], gap);
        /* a near-tie may break either way; after it the texts legitimately diverge */
        printf("%s: step %zu differs at a near-tie (gap %.2e); later steps not compared\n", name, i,
               gap);
        break;
    }
    free(col.out);
    free(p);
    free(g);
}
END_TEST

int main(void)
{
    tu_model_path();
    const char *gp = tu_golden_path();
    if (!gp) {
        fprintf(stderr, "missing golden file ($QUERN_GOLDEN)\n");
        return EXIT_FAILURE;
    }
    char *text = tu_read_file(gp, NULL);
    golden = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!golden) {
        fprintf(stderr, "cannot parse %s\n", gp);
        return EXIT_FAILURE;
    }
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(golden, "generate"));
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, logits_match_reference, 0, n);
    tcase_add_loop_test(tc, greedy_matches_reference, 0, n);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    cJSON_Delete(golden);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
