/* fuzz_util: what the libFuzzer harnesses in tests/fuzz share.
 *
 * Harnesses that need a tokenizer load it once per process into a static (the documented
 * exception to "no global mutable state": libFuzzer calls LLVMFuzzerTestOneInput millions of
 * times, and a 49k-token vocabulary takes longer to load than thousands of inputs take to run).
 * What they load is never changed after the load, as the daemon shares it between threads. */
#ifndef QUERN_FUZZ_UTIL_H
#define QUERN_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "../../engine/gguf.h"
#include "../../engine/tokenizer.h"

/* Opens size bytes as a GGUF file (an anonymous memory file, so gguf_open reads it exactly as it
 * reads a model: open, fstat, mmap). Returns gguf_open's result. */
int fuzz_gguf_from_bytes(const uint8_t *data, size_t size, struct gguf_file **f, struct qerr *err);

/* The tokenizer of the GGUF at path (with its file, which must stay open); exits with a message
 * when it cannot be loaded, since the harness then tests nothing. */
const struct tokenizer *fuzz_tokenizer_at(const char *path, struct gguf_file **f);

/* The real model's gpt2 BPE tokenizer ($QUERN_MODEL, else the path meson compiled in) and the
 * SentencePiece tokenizer of tests/fuzz/corpus/gguf/tiny-spm.gguf, each loaded on first use. */
const struct tokenizer *fuzz_bpe(void);
const struct tokenizer *fuzz_spm(void);
const struct gguf_file *fuzz_bpe_file(void);

/* True when s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int fuzz_utf8_valid(const char *s, size_t n);

#endif
