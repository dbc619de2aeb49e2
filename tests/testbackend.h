/* testbackend: the backend the model and engine suites run on. $QUERN_TEST_DEVICE names it as
 * --device does (default cpu), so tools/gpu-check.sh runs the same suites on the CUDA backend;
 * always batch-invariant, since the suites compare batched with one-at-a-time results bit for
 * bit. A CUDA run needs CK_FORK=no (CUDA must not be used across a fork). */
#ifndef QUERN_TESTBACKEND_H
#define QUERN_TESTBACKEND_H

#include "../kernels/backend.h"

/* Creates it (threads: the CPU's workers); fails the running test when it cannot. */
struct backend *tb_backend(enum matmul_precision precision, int threads);

/* What the engine suites open once: the model's file, its tokenizer, tb_backend(MATMUL_F32, 2)
 * and /usr/share/common-licenses/GPL-3 tokenized (*ids malloc'd); fails the running test when
 * any of it cannot be had. tb_model_close frees it all. */
#include "../engine/gguf.h"
#include "../engine/tokenizer.h"
void tb_model_open(struct gguf_file **file, struct tokenizer **tok, struct backend **be,
                   int32_t **ids, size_t *n_ids);
void tb_model_close(struct gguf_file *file, struct tokenizer *tok, struct backend *be,
                    int32_t *ids);

#endif
