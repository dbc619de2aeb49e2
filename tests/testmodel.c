/* testmodel: the golden data and the checks the model suites share (testmodel.h). */
#include "testmodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/generate.h"
#include "testutil.h"

static cJSON *golden;

bool tm_golden_load(void)
{
    const char *mp = getenv("QUERN_MODEL");
    if (!mp || access(mp, R_OK) != 0) {
        printf("model tests: model file %s not found\n", mp ? mp : "($QUERN_MODEL unset)");
        return false;
    }
    const char *gp = tu_golden_path();
    char *text = gp ? tu_read_file(gp, NULL) : NULL;
    golden = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!golden) printf("model tests: no golden file, or cannot parse it ($QUERN_GOLDEN)\n");
    return golden != NULL;
}

void tm_golden_free(void)
{
    cJSON_Delete(golden);
    golden = NULL;
}

int tm_n_cases(void)
{
    return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(golden, "generate"));
}

const cJSON *tm_case(int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(golden, "generate"), i);
}

static const char *case_name(const cJSON *c)
{
    return cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
}

int32_t *tm_case_ids(int i, const char *key, size_t *n)
{
    return tm_ids(tm_case(i), key, n);
}

int32_t *tm_ids(const cJSON *c, const char *key, size_t *n)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(c, key);
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    size_t k = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) ids[k++] = (int32_t)v->valueint;
    return ids;
}

static void check_status(const struct tm_run *r)
{
    struct qerr err = {0};
    if (r->status) ck_assert_msg(r->status(r->be, &err) == 0, "%s: %s", r->label, err.msg);
}

/* Logits after every token of case c's prompt + greedy text (malloc'd [n][vocab]). */
static float *case_logits(const struct tm_run *r, const cJSON *c, int chunk, size_t *n)
{
    size_t np, ng;
    int32_t *p = tm_ids(c, "prompt_ids", &np);
    int32_t *g = tm_ids(c, "greedy_ids", &ng);
    int32_t *seq = malloc((np + ng) * sizeof *seq);
    memcpy(seq, p, np * sizeof *seq);
    memcpy(seq + np, g, ng * sizeof *seq);
    float *logits = NULL;
    struct qerr err = {0};
    ck_assert_msg(generate_all_logits_lora(r->m, seq, np + ng, chunk, r->lora, &logits, &err) == 0,
                  "%s", err.msg);
    check_status(r);
    *n = np + ng;
    free(seq);
    free(p);
    free(g);
    return logits;
}

/* Case c's golden top logits against the model's: within tol relative, or with q8 within 1.5
 * absolute and the reference's top-1 kept where its margin exceeds 1 (with check false, neither
 * is asserted). Returns the worst. */
static double check_top(const struct tm_run *r, const cJSON *c, int chunk, double tol, bool q8,
                        bool check)
{
    size_t n;
    float *logits = case_logits(r, c, chunk, &n);
    int vocab = model_get_config(r->m)->vocab;
    double worst = 0;
    const cJSON *pl;
    cJSON_ArrayForEach(pl, cJSON_GetObjectItemCaseSensitive(c, "logits"))
    {
        int pos = cJSON_GetObjectItemCaseSensitive(pl, "pos")->valueint;
        ck_assert_int_lt(pos, (int)n);
        const float *row = logits + (size_t)pos * (size_t)vocab;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(pl, "top_ids");
        const cJSON *vals = cJSON_GetObjectItemCaseSensitive(pl, "top_logits");
        for (int k = 0; k < cJSON_GetArraySize(ids); k++) {
            int id = cJSON_GetArrayItem(ids, k)->valueint;
            double ref = cJSON_GetArrayItem(vals, k)->valuedouble, d = fabs(row[id] - ref);
            double e = q8 ? d : d / fmax(fabs(ref), 1.0);
            if (!(e <= worst)) worst = e; /* NaN wins */
            if (check)
                ck_assert_msg(q8 ? e < 1.5 : e <= tol,
                              "%s %s pos %d token %d: %.6f, reference %.6f", r->label, case_name(c),
                              pos, id, row[id], ref);
        }
        double margin =
            cJSON_GetArrayItem(vals, 0)->valuedouble - cJSON_GetArrayItem(vals, 1)->valuedouble;
        if (!check || !q8 || margin <= 1.0) continue;
        int best = 0;
        for (int k = 1; k < vocab; k++)
            if (row[k] > row[best]) best = k;
        ck_assert_int_eq(best, cJSON_GetArrayItem(ids, 0)->valueint);
    }
    free(logits);
    return worst;
}

double tm_check_logits(const struct tm_run *r, int i, int chunk, double tol)
{
    return tm_check_case_logits(r, tm_case(i), chunk, tol);
}

double tm_check_case_logits(const struct tm_run *r, const cJSON *c, int chunk, double tol)
{
    double worst = check_top(r, c, chunk, tol, false, true);
    printf("%s %s: worst relative logit error %.2e\n", r->label, case_name(c), worst);
    return worst;
}

double tm_case_logit_error(const struct tm_run *r, const cJSON *c, int chunk)
{
    return check_top(r, c, chunk, 0, false, false);
}

double tm_check_logits_q8(const struct tm_run *r, int i, int chunk)
{
    double worst = check_top(r, tm_case(i), chunk, 0, true, true);
    printf("%s %s: worst top-5 logit difference %.3f (bar 1.5)\n", r->label, case_name(tm_case(i)),
           worst);
    return worst;
}

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

void tm_check_greedy(const struct tm_run *r, int i)
{
    tm_check_case_greedy(r, tm_case(i));
}

void tm_check_case_greedy(const struct tm_run *r, const cJSON *c)
{
    const char *name = case_name(c);
    size_t np, ng;
    int32_t *p = tm_ids(c, "prompt_ids", &np);
    int32_t *g = tm_ids(c, "greedy_ids", &ng);
    const cJSON *gaps = cJSON_GetObjectItemCaseSensitive(c, "top2_gap");
    struct collect col = {.out = calloc(ng ? ng : 1, sizeof(int32_t)), .cap = (int)ng};
    struct gen_opts o = {.n_predict = (int)ng, .prefill_chunk = 29, .lora = r->lora};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    struct qerr err = {0};
    ck_assert_msg(generate_run(r->m, p, np, &o, collect_token, &col, &err) == 0, "%s", err.msg);
    check_status(r);
    ck_assert_int_eq(col.n, (int)ng);
    for (size_t k = 0; k < ng; k++) {
        if (col.out[k] == g[k]) continue;
        double gap = cJSON_GetArrayItem(gaps, (int)k)->valuedouble;
        ck_assert_msg(gap < 1e-3, "%s %s: step %zu: %d, reference %d (top-2 gap %.4f)", r->label,
                      name, k, col.out[k], g[k], gap);
        printf("%s %s: step %zu differs at a near-tie (gap %.2e); later steps not compared\n",
               r->label, name, k, gap);
        break;
    }
    free(col.out);
    free(p);
    free(g);
}

/* Sequence 0's last logits of one forward over tu_ragged_batch's batch. */
static void batched_forward(const struct tm_run *r, const int32_t *x, int n, int from, int n_seqs,
                            const int32_t *other, int n_other, float *out)
{
    const struct model_batch *b = tu_ragged_batch(x, n, from, n_seqs, other, n_other);
    int vocab = model_get_config(r->m)->vocab;
    float *logits = malloc((size_t)b->n_logits * (size_t)vocab * sizeof *logits);
    struct qerr err = {0};
    ck_assert_msg(model_forward(r->m, b, logits, &err) == 0, "%s", err.msg);
    check_status(r);
    memcpy(out, logits, (size_t)vocab * sizeof *out);
    free(logits);
}

void tm_check_batch_invariant(const struct tm_run *r)
{
    size_t nx, no;
    int32_t *x = tm_case_ids(4, "prompt_ids", &nx);
    int32_t *other = tm_case_ids(1, "prompt_ids", &no);
    ck_assert_uint_le(nx, 120);
    int vocab = model_get_config(r->m)->vocab;
    float *alone = malloc((size_t)vocab * sizeof *alone);
    float *got = malloc((size_t)vocab * sizeof *got);
    batched_forward(r, x, (int)nx, 0, 1, other, (int)no, alone);
    const int sizes[] = {2, 7, 33};
    for (int k = 0; k < 3; k++) {
        batched_forward(r, x, (int)nx, 0, sizes[k], other, (int)no, got);
        ck_assert_msg(memcmp(alone, got, (size_t)vocab * sizeof *got) == 0,
                      "%s: prefill logits differ in a batch of %d", r->label, sizes[k]);
        /* decode: the first n-1 tokens alone, then the last one among other prefills */
        batched_forward(r, x, (int)nx - 1, 0, 1, other, (int)no, got);
        batched_forward(r, x, (int)nx, (int)nx - 1, sizes[k], other, (int)no, got);
        ck_assert_msg(memcmp(alone, got, (size_t)vocab * sizeof *got) == 0,
                      "%s: decode logits differ in a batch of %d", r->label, sizes[k]);
    }
    free(alone);
    free(got);
    free(x);
    free(other);
}
