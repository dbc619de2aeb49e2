/* AVX-512 attention over a Q8_0 cache (the kernel: attn_avx512_body.h). */
#include "attn_avx512_body.h"

ATTN_ENTRY(avx512_attention_q8, uint8_t, KV_Q8, 0)
ATTN_ENTRY(avx512_attention_q8_l1, uint8_t, KV_Q8, 1)
