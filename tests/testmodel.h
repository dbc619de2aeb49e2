/* testmodel: what the model suites share: tests/golden/smollm2.json (which Hugging Face
 * transformers computed in fp32 from the real model, tools/make-golden.py) and the checks of a
 * loaded model against it. tests/test_model.c runs them on $QUERN_TEST_DEVICE's backend,
 * tests/test_model_cuda.c on the CUDA backend's own paths. */
#ifndef QUERN_TESTMODEL_H
#define QUERN_TESTMODEL_H

#include <check.h>
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/model.h"

/* Parses $QUERN_GOLDEN for tm_case; false, having said why on stdout, when it or the model file
 * ($QUERN_MODEL) is missing or unreadable. */
bool tm_golden_load(void);
void tm_golden_free(void);
int tm_n_cases(void);
const cJSON *tm_case(int i);
/* Case i's token ids under key ("prompt_ids", "greedy_ids"), malloc'd; tm_ids: any case's. */
int32_t *tm_case_ids(int i, const char *key, size_t *n);
int32_t *tm_ids(const cJSON *c, const char *key, size_t *n);

/* A model under test. status, when set, is the backend's sticky error (backend_cuda_status),
 * checked after every forward so a device error is named rather than seen as wrong logits. */
struct tm_run {
    struct model *m;
    struct backend *be;
    int (*status)(struct backend *be, struct qerr *err);
    const char *label; /* in messages: "quern", "cuda fp16 KV" */
    int lora;          /* model_batch.seq_lora of its sequences: 0 none, 1 + an adapter index */
};

/* Golden case i's top logits within tol relative (|got - ref| / max(|ref|, 1)) over its prompt and
 * greedy text, prefilled in chunks of `chunk`; prints and returns the worst. */
double tm_check_logits(const struct tm_run *r, int i, int chunk, double tol);
/* The same for a case from another golden file, laid out as smollm2.json's (name, prompt_ids,
 * greedy_ids, top2_gap, logits); tm_case_logit_error only measures (asserts nothing). */
double tm_check_case_logits(const struct tm_run *r, const cJSON *c, int chunk, double tol);
double tm_case_logit_error(const struct tm_run *r, const cJSON *c, int chunk);
/* The same with int8 activations (MATMUL_Q8, as llama.cpp computes): the top-5 logits within
 * 1.5 (the spread llama.cpp itself shows, tests/golden/README.md) and the reference's top-1 kept
 * wherever its margin exceeds 1; prints and returns the worst difference. */
double tm_check_logits_q8(const struct tm_run *r, int i, int chunk);
/* Greedy decoding (prefill chunks of 29) follows case i's greedy text token for token, up to
 * the first step where the reference's top-2 gap is under 1e-3 (a near-tie may break either
 * way; after it the texts legitimately diverge). */
void tm_check_greedy(const struct tm_run *r, int i);
void tm_check_case_greedy(const struct tm_run *r, const cJSON *c);
/* Case 4's prompt gets bit-identical logits alone and in batches of 2, 7 and 33 sequences mixed
 * with prefill chunks of case 1's prompt, both when it is prefilled and when it decodes. The
 * model needs 1024 batch tokens, 64 logits and 33 * 8 blocks of 16. */
void tm_check_batch_invariant(const struct tm_run *r);

/* tests/test_model_cuda.c: the real model on the CUDA backend's own paths (fp16 KV cache,
 * tensor-core GEMM, graph replay, batch invariance in passes, both precisions) on device
 * `device`, as TCases of s; with golden_cases also the golden logits and greedy text, for the
 * emulation, which has no test_model of its own to run them. Needs tm_golden_load. */
void model_cuda_add(Suite *s, int device, bool golden_cases);

#endif
