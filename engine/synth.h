/* synth: models of real shapes with random weights, built on the machine that runs them, so a
 * benchmark of an 8B model needs no 5 GB download (`quern bench --synthetic`).
 *
 * The model is an ordinary GGUF (llama architecture, every tensor the loader wants, a
 * SentencePiece-style vocabulary of byte and placeholder tokens) written into a private
 * temporary directory, opened (mmap), and unlinked at once: nothing is left behind, even when
 * the process is killed after the open. Weights are random blocks of the chosen type whose
 * values have the spread of trained weights (about N(0, 0.02)); norms are 1. Its logits mean
 * nothing; its speed is a real model's of that shape and type. */
#ifndef QUERN_SYNTH_H
#define QUERN_SYNTH_H

#include <stdint.h>

#include "gguf.h"

struct synth_shape {
    const char *name;
    int n_layers, dim, ffn_dim, n_heads, n_kv_heads, vocab, ctx_len;
    float rope_base;
    bool tied_output; /* the output matrix is token_embd (SmolLM2) */
};

/* The shape called name (llama3-8b, llama2-7b, smollm2-135m), or NULL. */
const struct synth_shape *synth_shape_find(const char *name);

/* Writes and opens a synthetic model of shape `name` with every 2-D weight of `type` (F32, F16,
 * Q8_0, Q4_0 or Q4_1). dir: where the temporary file goes (NULL: $TMPDIR, else /tmp); it needs
 * the model's size in free space for as long as the call runs. */
int synth_model_open(const char *name, enum qtype type, uint64_t seed, const char *dir,
                     struct gguf_file **out, struct qerr *err);

/* Writes the synthetic model of shape `name` and type as synth_model_open makes it to the file
 * path and keeps it there: a file to hand a peer (llama.cpp's llama-bench) beside quern, so both
 * read the same bytes of a model too large for any cache (`quern bench --synthetic NAME
 * --write-model PATH`). */
int synth_model_write(const char *name, enum qtype type, uint64_t seed, const char *path,
                      struct qerr *err);

#endif
