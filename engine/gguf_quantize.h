/* gguf_quantize: rewrites a GGUF model with its weights in another type (what `quern quantize`
 * runs).
 *
 * Every metadata key is copied, general.file_type is set to the llama.cpp file type of the
 * target (and general.quantization_version to 2 for a quantized target). Each tensor becomes:
 *   - 1-D (norms, biases): F32, whatever it was;
 *   - token_embd.weight / output.weight with keep_output: unchanged (bytes copied);
 *   - every other tensor of 2+ dims: the target type. A tensor already of that type is copied
 *     byte for byte; any other is dequantized row by row (F32/F16/BF16/Q8_0/Q4_0/Q4_1) and
 *     quantized with the reference quantizers (quant/quantize.h), or with searched scales
 *     (round = QROUND_SEARCH).
 * Everything is checked before the output is created: a row length that is not a multiple of
 * the target's block is QERR_INVALID naming the tensor, and no file is written. The output is
 * written atomically (engine/gguf_write.h): on any failure nothing is left behind. */
#ifndef QUERN_GGUF_QUANTIZE_H
#define QUERN_GGUF_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "../quant/quantize.h"
#include "gguf.h"
#include "gguf_write.h"

struct gguf_quantize_opts {
    enum qtype type;                /* F32, F16, Q8_0, Q4_0 or Q4_1 */
    bool keep_output;               /* token_embd.weight and output.weight keep their type */
    enum qround round;              /* QROUND_REF: llama-quantize's bytes */
    const struct gguf_write_io *io; /* NULL: the system calls */
};

struct gguf_quantize_stats {
    uint64_t n_tensors;           /* tensors written */
    uint64_t n_converted;         /* tensors dequantized and requantized */
    uint64_t n_copied;            /* tensors copied byte for byte */
    uint64_t bytes_in, bytes_out; /* tensor data, without padding */
};

/* The general.file_type (llama_ftype) value of a file whose weights are mostly of type t. */
uint32_t gguf_file_type_of(enum qtype t);

/* Reads in (already open) and writes out. stats may be NULL. */
int gguf_quantize(const struct gguf_file *in, const char *out, const struct gguf_quantize_opts *o,
                  struct gguf_quantize_stats *stats, struct qerr *err);

#endif
