/* backend_cuda: the CUDA implementation of kernels/backend.h (issue 6).
 *
 * Built only when meson finds nvcc (QUERN_HAVE_CUDA); callers that may run without it go through
 * kernels/backend_select.h. Every entry point is C; the kernels live in these .cu files:
 *   backend_cuda.cu  context, buffers, the ops table, errors
 *   matmul_q.cu      weight upload (cuda_pack.h layout) and the dequant-fused GEMV / cuBLAS GEMM
 *   attention.cu     paged attention (causal, or over a sliding window)
 *   elementwise.cu   embed, rmsnorm, add, rope, kv_write, get_rows, silu_mul, gelu_mul, scale,
 *                    softcap, moe_combine, activation quantization
 *
 * Ops enqueue on the backend's stream and return; buf_read and sync wait. Ops return no status
 * (the contract is void): the first CUDA error an op meets is kept and reported by
 * backend_cuda_status, and after it buf_read fills its destination with NaN bytes (0xff) so a
 * failed step never looks like a valid one. */
#ifndef QUERN_BACKEND_CUDA_H
#define QUERN_BACKEND_CUDA_H

#include <stddef.h>

#include "../backend.h"

enum cuda_gemm {
    /* gemm_mma.cu: tensor-core MMA on weights dequantized into shared memory (int8 MMA in
     * MATMUL_Q8, fp16 in MATMUL_F32); Q4_0, Q4_1, Q8_0 weights (float weights keep the GEMV) */
    CUDA_GEMM_MMA = 0,
    /* cublasGemmEx over a persistent fp16 copy of every weight (+2 bytes per weight of device
     * memory), fp16 activations, any weight type; needs cuBLAS in the build */
    CUDA_GEMM_CUBLAS = 1,
};

/* Decode steps (at most 64 sequences, the replayed shapes) stay on the GEMV, whose tiles keep
 * every SM streaming weights; gemm_mma's 64-row blocks give a 4096-row matrix 64 blocks, too few
 * to fill an H200 at decode sizes. Prefill chunks of 128+ tokens take the MMA. A guess until
 * quern-bench-cuda's GEMM table has measured the crossover. */
#define CUDA_GEMM_MIN_TOKENS_DEFAULT 128

struct backend_cuda_opts {
    int device; /* CUDA device ordinal */
    /* MATMUL_F32: fp32 activations, weights dequantized in registers, fp32 FMA.
     * MATMUL_Q8: activations quantized per 32-block to int8 exactly as ref_quantize_q8 does,
     * integer dot products (dp4a) per block, fp32 accumulation across blocks. */
    enum matmul_precision precision;
    /* Tokens one matmul pass takes (the per-step arena is sized for this many tokens of the
     * widest weight); larger batches run in passes. 0: 1024. */
    int max_tokens;
    /* Batches of at least this many tokens run a GEMM (`gemm`) instead of the GEMV tiles, which
     * re-read the weight for every 16 tokens. 0: CUDA_GEMM_MIN_TOKENS_DEFAULT. The GEMM is
     * batch-invariant on its own but not bit-equal to the GEMV, so across this threshold a
     * token's logits depend on how many tokens share its step; batch_invariant turns it off. */
    int gemm_min_tokens;
    enum cuda_gemm gemm;
    /* Every batch size on the GEMV tiles: a token's result never depends on its batch (the
     * contract of kernels/backend.h, which the CPU backend always keeps), at the price of prefill
     * and large-batch speed (docs/benchmarks.md). */
    bool batch_invariant;
    /* Keep the KV cache in fp32, as the CPU backend does (bit-comparable attention). Default
     * (false): fp16, rounded to nearest even by kv_write and widened to fp32 when attention
     * reads it: half the memory and the bytes read per decoded token. */
    bool kv_f32;
    /* MATMUL_F32 on quantized weights: the GEMV reads fp16 activations (converted once per
     * matmul, round to nearest even) instead of fp32, half the bytes every warp reads per token;
     * weights are still dequantized exactly in registers and accumulated in fp32. Results then
     * carry fp16's rounding of x (~1e-4 normalized), as the MMA GEMM's do. */
    bool act_f16;
    bool no_graphs;   /* run every step op by op: no CUDA graph capture or replay */
    bool sync_launch; /* wait after every op, to pin an error on the kernel that made it */
    /* Device memory for attention's FlashDecoding partials, taken at create: a batch whose
     * partials exceed it runs attention in passes over its tokens (same results). 0: 64 MiB. */
    size_t attn_scratch_bytes;
};

/* 0 when device `device` is usable by this build's kernels (present, compute capability 8.0 or
 * newer), with its description in desc ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB") when desc is
 * not NULL. QERR_UNSUPPORTED when no device is usable (no driver, no GPU, too old), naming the
 * reason; QERR_INVALID when the ordinal is out of range. Never exits. */
int backend_cuda_probe(int device, char *desc, size_t desc_len, struct qerr *err);

int backend_cuda_create(const struct backend_cuda_opts *o, struct backend **out, struct qerr *err);

/* The first CUDA error any op of this backend met (0 and err untouched when none). */
int backend_cuda_status(struct backend *be, struct qerr *err);

/* One line describing the device, as backend_cuda_probe gives it, and the matmul mode:
 * "...; gemm mma from 128 tokens" or "...; batch-invariant (GEMV for every batch)". */
const char *backend_cuda_describe(const struct backend *be);
/* Steps captured as graphs and steps replayed so far (graphs.cu). */
void backend_cuda_graph_counts(const struct backend *be, uint64_t *captures, uint64_t *replays);

/* Bytes of device memory the prepared copy of a weight occupies (packed quants, scales and the
 * fp16 copy when the GEMM path keeps one); 0 when w is not prepared by a CUDA backend. */
size_t backend_cuda_weight_bytes(const struct bweight *w);

/* Switches the matmul precision of a created backend (prepared weights serve both). Between
 * steps only. QERR_INVALID for an unknown precision. */
int backend_cuda_set_precision(struct backend *be, enum matmul_precision p, struct qerr *err);

/* Switches act_f16 (backend_cuda_opts) of a created backend. Between steps only. */
void backend_cuda_set_act_f16(struct backend *be, bool on);

/* Device-to-device copy bandwidth over a buffer of `bytes` (bytes read plus bytes written per
 * second, best of `iters` copies): the ceiling the GEMV numbers are compared with. */
int backend_cuda_copy_bandwidth(struct backend *be, size_t bytes, int iters, double *gbps,
                                struct qerr *err);

#endif
