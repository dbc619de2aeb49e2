/* cuda_common: what the CUDA backend's .cu files share: the context, error checking, the view of
 * a prepared weight, warp reductions and the launchers each file defines for the others.
 *
 * C-style CUDA: structs and functions; templates only for compile-time tile sizes and weight
 * types (register arrays need constant indices). Entry points other translation units call from
 * C are in backend_cuda.h (extern "C"). */
#ifndef QUERN_CUDA_COMMON_CUH
#define QUERN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>
#ifdef QUERN_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

/* the C headers pin block layouts with C11's _Static_assert, which C++ spells static_assert */
#define _Static_assert static_assert
extern "C" {
#include "../backend.h"
#include "backend_cuda.h"
#include "cuda_pack.h"
}
#undef _Static_assert

#define CUDA_MAX_HEAD_DIM   512 /* as the reference (ref_attention_one) allows */
#define CUDA_MAX_ROPE_PAIRS (CUDA_MAX_HEAD_DIM / 2)

/* 1/freq of every rotated pair, computed on the host exactly as ref_rope computes it and passed
 * to the kernel by value (2 KiB of the 4 KiB parameter space). */
struct rope_freqs {
    double inv[CUDA_MAX_ROPE_PAIRS];
    double mscale; /* rope_mscale */
};

#define GRAPH_SLOTS 32

/* One step shape: seen once (ran directly), then captured into exec and replayed. */
struct cuda_graph_slot {
    bool seen;
    uint64_t key, last_use;
    cudaGraphExec_t exec;
};

#ifdef QUERN_HAVE_CUBLAS
/* cuBLAS, opened (dlopen) at create only when the cuBLAS GEMM is chosen: quern links only the
 * CUDA runtime, so a run that never uses cuBLAS never maps its ~200 MB of libraries (and starts
 * in a millisecond instead of ~60). The types are the header's own (but cublasGemmEx's, which
 * C++ overloads). */
struct cublas_fns {
    void *lib; /* the dlopen handle; NULL in the CPU emulation */
    decltype(&cublasCreate) create;
    decltype(&cublasDestroy) destroy;
    decltype(&cublasSetStream) set_stream;
    decltype(&cublasSetWorkspace) set_workspace;
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void *, const void *, cudaDataType, int, const void *,
                              cudaDataType, int, const void *, void *, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t); /* the 32-bit overload */
    decltype(&cublasGetStatusString) status_string;
};
#endif

struct cuda_ctx {
    int device;
    enum matmul_precision precision;
    int max_tokens;      /* tokens per matmul pass */
    int gemm_min_tokens; /* batches of this many tokens or more run a GEMM; 0: never */
    bool gemm_cublas;    /* that GEMM is cuBLAS's (weights keep fp16 copies), else gemm_mma */
    bool sync_launch;    /* backend_cuda_opts.sync_launch: wait after every op */
    bool kv_f16;         /* the KV cache holds fp16 (backend_cuda_opts.kv_f32 unset) */
    bool act_f16;        /* the F32 GEMV reads fp16 activations (backend_cuda_opts.act_f16) */
    cudaStream_t stream;
    char desc[224]; /* the probe's line and the matmul mode */
#ifdef QUERN_HAVE_CUBLAS
    struct cublas_fns blas;
    cublasHandle_t cublas;
    void *cublas_ws; /* given to cuBLAS so it never allocates inside a step */
    size_t cublas_ws_bytes;
#endif
    /* Per-step arena, sized at weight_prepare (load time) for max_tokens tokens of the widest
     * weight; the matmul carves it per call into (all [tokens][...]):
     *   Q8 activations: q int8 [cols], d float [nb], s float [nb], sum int32 [nb]
     *   or an fp16 copy of x [cols] (cuBLAS path), or an aligned fp32 copy of x [cols] */
    void *arena;
    size_t arena_bytes;
    int64_t arena_cols;
    /* the rope frequencies of the last rope_spec seen */
    struct rope_key rope_key;
    struct rope_freqs rope;
    /* the first error an op met */
    int err_code;
    char err_msg[384];
    /* attention's split partials (attention.cu), taken at create */
    float *att_part;
    size_t att_part_bytes;
    /* captured steps (graphs.cu) */
    bool graphs_on;
    struct cuda_graph_slot graphs[GRAPH_SLOTS];
    struct cuda_graph_slot *capturing; /* between step_begin and step_end, or NULL */
    uint64_t graph_clock, graph_captures, graph_replays;
};

/* A prepared weight (bweight.impl): its layout and the device copy, one allocation. */
struct cuda_weight {
    struct cuda_pack_layout L;
    uint8_t *dev; /* L.total bytes */
    __half *f16;  /* [rows][cols] dequantized copy for the cuBLAS path, or NULL */
};

static inline struct cuda_ctx *cuda_ctx_of(const struct backend *be)
{
    return (struct cuda_ctx *)be->ctx;
}

/* Records the first failure (later ones are dropped) and returns false when e is an error. */
bool cuda_check(struct cuda_ctx *c, cudaError_t e, const char *what, const char *file, int line);
#define CUDA_OK(c, call) cuda_check((c), (call), #call, __FILE__, __LINE__)
/* After a launch: the launch error, and with $QUERN_SYNC_LAUNCH the execution error too. */
void cuda_launched(struct cuda_ctx *c, const char *kernel, const char *file, int line);
#define CUDA_LAUNCHED(c, kernel) cuda_launched((c), (kernel), __FILE__, __LINE__)
/* "F MiB of T MiB free" on the current device, for out-of-memory messages. */
struct cuda_free_text {
    char s[64];
};
struct cuda_free_text cuda_free_now(void);
/* Records a failure that is not a CUDA error (a bad argument). */
void cuda_fail(struct cuda_ctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Makes the backend's device current on the calling thread (the engine runs ops on its own). */
void cuda_use_device(struct cuda_ctx *c);
/* Grows the per-step arena to hold max_tokens tokens of a weight with `cols` columns. Load time
 * only (it may cudaMalloc). */
int cuda_arena_reserve(struct cuda_ctx *c, int64_t cols, struct qerr *err);
/* Bytes the arena needs per token for a weight of `cols` columns. */
size_t cuda_arena_token_bytes(int64_t cols);

/* ---- warp reductions (xor butterflies: every lane ends with the same bits) ---- */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_f64(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float fp16_bits_to_f32(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)(h & 0xffffu)));
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h)
{
    return __uint_as_float((h & 0xffffu) << 16);
}

/* One 32-block of one row as loaded: quants (lo: bytes 0..15, hi: 16..31 for Q8_0), scale d and
 * Q4_1's minimum m. */
struct wblock {
    uint4 lo, hi;
    float d, m;
};

template <int QT>
__device__ __forceinline__ struct wblock load_wblock(const uint8_t *__restrict__ qs,
                                                     const uint8_t *__restrict__ sc, int64_t blk)
{
    struct wblock w;
    if (QT == QTYPE_Q8_0) {
        w.lo = *(const uint4 *)(qs + blk * QK);
        w.hi = *(const uint4 *)(qs + blk * QK + 16);
    } else {
        w.lo = *(const uint4 *)(qs + blk * (QK / 2));
        w.hi = w.lo;
    }
    if (QT == QTYPE_Q4_1) {
        const uint32_t dm = ((const uint32_t *)sc)[blk];
        w.d = fp16_bits_to_f32(dm);
        w.m = fp16_bits_to_f32(dm >> 16);
    } else {
        w.d = fp16_bits_to_f32(((const uint16_t *)sc)[blk]);
        w.m = 0.0f;
    }
    return w;
}

/* ---- warp-level tensor-core MMA (sm_80+): D = A B + C over one warp's fragments ----
 * s8: A 16x32 int8 (row), B 32x8 int8 (col), C/D int32 16x8. f16: A 16x16, B 16x8 fp16, C/D fp32.
 * Fragment layouts are the PTX ISA's (kernels/cuda/emu/cuda_emu.h spells them out and emulates
 * both on the CPU). */
#ifndef QUERN_CUDA_EMU_H
__device__ __forceinline__ void mma_s8_16832(int d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

/* ---- ops (the backend_ops slots), defined in the file named ---- */

/* matmul_q.cu */
int cuda_op_weight_prepare(struct backend *be, struct bweight *w, struct qerr *err);
void cuda_op_weight_release(struct backend *be, struct bweight *w);
void cuda_op_matmul(struct backend *be, const struct bweight *w, const float *x, int n, float *y);

/* elementwise.cu */
void cuda_op_embed(struct backend *be, const struct bweight *table, const int32_t *tokens, int n,
                   float *out);
void cuda_op_add_rmsnorm(struct backend *be, float *out, float *x, const float *y, const float *w,
                         int n, int dim, float eps);
void cuda_op_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                     float eps);
void cuda_op_add(struct backend *be, float *x, const float *y, size_t n);
void cuda_op_add_rows(struct backend *be, float *x, const float *b, int n, int dim);
void cuda_op_rope(struct backend *be, float *x, const int32_t *pos, int n, int n_heads,
                  int head_dim, const struct rope_spec *rs);
void cuda_op_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *k,
                      const float *v, const struct attn_batch *b, int kv_dim);
void cuda_op_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                      int dim);
void cuda_op_silu_mul(struct backend *be, float *g, const float *u, size_t n);
void cuda_op_gelu_mul(struct backend *be, float *g, const float *u, size_t n);
void cuda_op_scale(struct backend *be, float *x, float s, size_t n);
void cuda_op_softcap(struct backend *be, float *x, float cap, size_t n);
void cuda_op_moe_combine(struct backend *be, float *out, const float *y, const int32_t *rows,
                         const float *w, int n, int k, int dim);

/* attention.cu */
bool cuda_op_step_begin(struct backend *be, uint64_t key);
bool cuda_op_step_end(struct backend *be);
void cuda_op_step_reset(struct backend *be);
void cuda_graphs_init(struct cuda_ctx *c, bool off);
void cuda_graphs_reset(struct cuda_ctx *c);

void cuda_op_attention(struct backend *be, float *out, const float *q, const void *k_cache,
                       const void *v_cache, const struct attn_batch *b, const struct attn_shape *s);

/* Q8 activations of n tokens, carved from the arena: q [n][cols], d, s [n][nb] float (scale,
 * block sum of the dequantized values), sum [n][nb] int32 (block sum of q). */
struct q8_parts {
    int8_t *q;
    float *d, *s;
    int32_t *sum;
};

/* gemm_mma.cu: the tensor-core GEMM, n tokens (any n; the caller picks it for large batches).
 * Weights Q4_0, Q4_1 or Q8_0 only. _q8: int8 MMA on the Q8 activations p; _f16: fp16 MMA on fp32
 * activations x (16-byte aligned) rounded to fp16. */
void cuda_gemm_mma_q8(struct cuda_ctx *c, const struct cuda_weight *w, const struct q8_parts *p,
                      int n, float *y);
void cuda_gemm_mma_f16(struct cuda_ctx *c, const struct cuda_weight *w, const float *x, int n,
                       float *y);

/* ---- launchers shared between files (elementwise.cu) ---- */

/* Quantizes x[n][cols] per 32-block as ref_quantize_q8 does (bit for bit). */
void cuda_quantize_q8(struct cuda_ctx *c, const float *x, int n, int64_t cols, int8_t *q, float *d,
                      float *s, int32_t *sum);
/* dst[i] = fp16(src[i]), round to nearest even. */
void cuda_f32_to_f16(struct cuda_ctx *c, const float *src, __half *dst, size_t n);
/* Dequantizes a whole prepared weight to fp16 [rows][cols]. */
void cuda_weight_to_f16(struct cuda_ctx *c, const struct cuda_weight *w, __half *dst);

#endif
