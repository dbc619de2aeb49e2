/* lorafix: LoRA adapter files for tests, their values a formula that tools/make-golden-lora.py
 * computes the same way (so llama.cpp's reference runs the very adapter the C tests load):
 *
 *   h = i * 2654435761 + layer * 2246822519 + target * 3266489917 + which * 668265263 + seed
 *   h ^= h >> 15; h *= 2246822519; h ^= h >> 13          (all mod 2^32)
 *   value = float((double)(h % 2001 - 1000) / 1000.0 * amp[which])
 *
 * i: the element's index in the matrix as GGUF stores it (row-major [rows][cols]); target: enum
 * lora_target; which: 0 for lora_a, 1 for lora_b. */
#ifndef QUERN_TESTS_LORAFIX_H
#define QUERN_TESTS_LORAFIX_H

#include <stdint.h>

#include "../engine/lora.h"

enum lorafix_break {
    LORAFIX_OK = 0,
    LORAFIX_NO_B,     /* layer 0's attn_q has lora_a alone */
    LORAFIX_BAD_RANK, /* layer 0's attn_q lora_b has rank + 1 columns */
    LORAFIX_OUTPUT,   /* a pair for output.weight */
    LORAFIX_WRONG_IN, /* layer 0's attn_q lora_a is 8 columns short */
    LORAFIX_NAN,      /* layer 0's attn_q lora_b starts with a NaN */
};

struct lorafix {
    int rank;
    float alpha;
    unsigned targets; /* bit t: enum lora_target t is adapted */
    uint32_t seed;
    double amp_a, amp_b;
    const char *arch;         /* NULL: cfg's */
    const char *general_type; /* NULL: "adapter" */
    enum lorafix_break brk;
    /* B's rows of q and k in Hugging Face's order (a NeoX model's file), computed from the
     * formula's llama order: the same adapter for a model whose rows the converter left alone */
    bool hf_rows;
    /* q/k/v share one A (q's formula), and gate/up one (gate's): the adapter a fused one is */
    bool shared_a;
    /* Phi-3's fused matrices: attn_qkv (one A, B's q, k, v rows in turn) and ffn_up (one A,
     * B's gate then up rows): the same adapter as shared_a's, as a fused model's file holds it */
    bool fused;
};

/* The golden adapter: rank 8, alpha 16, every target, seed 7, amps 0.05 and 0.2. */
struct lorafix lorafix_default(void);

float lorafix_value(uint64_t i, int layer, int target, int which, uint32_t seed, double amp);

/* Writes the adapter for a model of configuration cfg to path; 0 or a QERR code. */
int lorafix_write(const struct model_config *cfg, const char *path, const struct lorafix *fx,
                  struct qerr *err);

#endif
