/* AVX-512 attention over float and fp16 caches (the kernel: attn_avx512_body.h). */
#include "attn_avx512_body.h"

ATTN_ENTRY(avx512_attention, float, KV_F32, 0)
ATTN_ENTRY(avx512_attention_f16, uint16_t, KV_F16, 0)
ATTN_ENTRY(avx512_attention_l1, float, KV_F32, 1)
ATTN_ENTRY(avx512_attention_f16_l1, uint16_t, KV_F16, 1)
