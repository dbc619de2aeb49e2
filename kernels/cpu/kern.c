#include "kern.h"

#include "../../quant/quantize.h"

static const struct cpu_kernels kern_scalar = {
    .isa = CPU_ISA_SCALAR,
    .quantize_q8 = scalar_quantize_q8,
    .block_sums = scalar_block_sums,
    .matmul_q8 = NULL,
    .matmul_f32 = NULL,
    .matmul_float = NULL,
    .rmsnorm = scalar_rmsnorm,
    .add = scalar_add,
    .silu_mul = scalar_silu_mul,
    .gelu_mul = scalar_gelu_mul,
    .softcap = scalar_softcap,
    .rope = scalar_rope,
    .attention = scalar_attention,
    .attention_f16 = scalar_attention_f16,
    .attention_q8 = scalar_attention_q8,
    .to_fp16 = scalar_to_fp16,
    .quantize_kv_q8 = quantize_row_q8_0,
};

/* The AVX2 table, by its q8 matmul: vpmaddubsw (AVX2) or 256-bit vpdpbusd (AVX-VNNI); the two
 * tables differ in nothing else. */
#define KERN_AVX2(isa_, q8)                                                                        \
    {                                                                                              \
        .isa = isa_, .quantize_q8 = avx2_quantize_q8, .block_sums = avx2_block_sums,               \
        .matmul_q8 = q8, .matmul_f32 = avx2_matmul_f32, .matmul_float = avx2_matmul_float,         \
        .rmsnorm = avx2_rmsnorm, .add = avx2_add, .silu_mul = avx2_silu_mul, .rope = avx2_rope,    \
        .gelu_mul = avx2_gelu_mul, .softcap = avx2_softcap, .attention = avx2_attention,           \
        .attention_f16 = avx2_attention_f16, .attention_q8 = avx2_attention_q8,                    \
        .attention_part = avx2_attention_part, .attention_f16_part = avx2_attention_f16_part,      \
        .attention_q8_part = avx2_attention_q8_part, .to_fp16 = avx2_to_fp16,                      \
        .quantize_kv_q8 = avx2_quantize_kv_q8,                                                     \
    }

static const struct cpu_kernels kern_avx2 = KERN_AVX2(CPU_ISA_AVX2, avx2_matmul_q8);
static const struct cpu_kernels kern_avxvnni = KERN_AVX2(CPU_ISA_AVXVNNI, avxvnni_matmul_q8);

/* The AVX-512 table, by ISA (AVX-512, or AMX: its own q8 matmul) and by where its GEMV and
 * attention prefetch (enum cpu_prefetch): the tables differ in nothing else. */
#define KERN_AVX512(isa_, gemv, attn, attn_f16, attn_q8)                                           \
    {                                                                                              \
        .isa = isa_, .quantize_q8 = avx512_quantize_q8, .block_sums = avx512_block_sums,           \
        .matmul_q8 = gemv, .matmul_f32 = avx512_matmul_f32, .matmul_float = avx512_matmul_float,   \
        .rmsnorm = avx512_rmsnorm, .add = avx512_add, .silu_mul = avx512_silu_mul,                 \
        .gelu_mul = avx512_gelu_mul, .softcap = avx512_softcap, .rope = avx512_rope,               \
        .attention = attn, .attention_f16 = attn_f16, .attention_q8 = attn_q8,                     \
        .attention_part = attn##_part, .attention_f16_part = attn_f16##_part,                      \
        .attention_q8_part = attn_q8##_part, .to_fp16 = avx512_to_fp16,                            \
        .quantize_kv_q8 = avx512_quantize_kv_q8,                                                   \
    }

static const struct cpu_kernels kern_avx512 = KERN_AVX512(
    CPU_ISA_AVX512, avx512_matmul_q8, avx512_attention, avx512_attention_f16, avx512_attention_q8);
static const struct cpu_kernels kern_avx512_l1 =
    KERN_AVX512(CPU_ISA_AVX512, avx512_matmul_q8_l1, avx512_attention_l1, avx512_attention_f16_l1,
                avx512_attention_q8_l1);
static const struct cpu_kernels kern_amx = KERN_AVX512(CPU_ISA_AMX, amx_matmul_q8, avx512_attention,
                                                       avx512_attention_f16, avx512_attention_q8);
static const struct cpu_kernels kern_amx_l1 =
    KERN_AVX512(CPU_ISA_AMX, amx_matmul_q8_l1, avx512_attention_l1, avx512_attention_f16_l1,
                avx512_attention_q8_l1);

const struct cpu_kernels *cpu_kernels_for(enum cpu_isa isa)
{
    return cpu_kernels_with(isa, CPU_PREFETCH_AUTO);
}

const struct cpu_kernels *cpu_kernels_with(enum cpu_isa isa, enum cpu_prefetch pf)
{
    if (pf == CPU_PREFETCH_AUTO) pf = cpu_prefetch_best();
    switch (isa) {
    case CPU_ISA_AVX512:
        return pf == CPU_PREFETCH_L1 ? &kern_avx512_l1 : &kern_avx512;
    case CPU_ISA_AMX:
        return pf == CPU_PREFETCH_L1 ? &kern_amx_l1 : &kern_amx;
    case CPU_ISA_AVX2:
        return &kern_avx2;
    case CPU_ISA_AVXVNNI:
        return &kern_avxvnni;
    case CPU_ISA_AUTO:
    case CPU_ISA_SCALAR:
        break;
    }
    return &kern_scalar;
}
