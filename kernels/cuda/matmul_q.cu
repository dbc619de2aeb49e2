/* matmul_q: weight upload and y[n][rows] = x[n][cols] W^T on the GPU.
 *
 * DESIGN
 * Weights are packed on the host (cuda_pack.h: quants and scales as separate arrays over
 * (row, 32-block)) and uploaded once at weight_prepare. Three paths:
 *
 * 1. GEMV, MATMUL_F32 (any weight type): a warp owns GEMV_ROWS rows and a tile of T <= 16 tokens.
 *    Lane l takes the row's 32-blocks l, l + 32, ...: one 16-byte load of quants (two for Q8_0)
 *    and one scale per row and block, 32 lanes reading 512 contiguous bytes. The block is
 *    dequantized in registers (nibble - 8, nibble, int8 as small exact floats), dotted with the
 *    token's 32 fp32 activations (float4 loads), and folded into the lane's sum with one fma per
 *    block by the block's scale. Float weights (F32/F16/BF16, rows padded to 8) go 8 elements per
 *    lane and step the same way.
 * 2. GEMV, MATMUL_Q8 (Q4_0, Q4_1, Q8_0): the activations are first quantized per 32-block to
 *    int8 exactly as ref_quantize_q8 (into the arena); a block's dot product is exact in integers
 *    (dp4a), then acc = fma(dw * dx, isum, acc) (+ fma(m, s, acc) for Q4_1) as ref_dot_q8.
 *    This is the fast decode path: a lane reads 18-34 bytes of weight and 32 bytes of activation
 *    per block and token.
 *    In both GEMV paths each (row, token) is reduced by the same lane sums in the same order
 *    followed by the same xor butterfly, whatever T, the tile, or n: batch-invariant. Batches
 *    larger than 16 tokens run as tiles of 16 (grid.x), each re-reading the weight (from L2 when
 *    it fits), so large batches cost more passes over the weight than a GEMM would.
 * 3. GEMM, for batches of at least gemm_min_tokens (default 128) unless batch_invariant:
 *    gemm_mma.cu's tensor-core kernels (Q4_0/Q4_1/Q8_0; int8 MMA on the Q8 activations, or fp16
 *    MMA on fp16-rounded activations in MATMUL_F32), or with CUDA_GEMM_CUBLAS: x converted to
 *    fp16 and cublasGemmEx with a persistent fp16 copy of the weight (dequantized once at load;
 *    +2 bytes per weight of device memory), fp32 accumulate. cuBLAS picks its kernel (and split)
 *    by shape, so its path is not even batch-invariant among large batches; the MMA kernels are
 *    (a fixed k order per output), but neither equals the GEMV bit for bit, so a backend that
 *    switches at gemm_min_tokens is not batch-invariant across the switch. The contract of
 *    kernels/backend.h holds with backend_cuda_opts.batch_invariant (the GEMV for every n).
 *
 * Reduction order differs from the CPU's (kernels/cpu/ref.c sums 16 interleaved lanes), so the
 * CUDA result equals the reference within the normalized tolerance of the conformance test, not
 * bit for bit; the integer parts of the Q8 path are exact. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

#define GEMV_WARPS 4  /* warps per block */
#define GEMV_ROWS  2  /* rows per warp */
#define GEMV_TILE  16 /* the largest token tile */

static inline bool is_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* ---- per-block helpers ---- */

#define MAGIC_2P23 8388608.0f /* 2^23: a float whose low mantissa bits hold a small integer */

/* Element e of a packed block as an exact float, with full-rate integer and add instructions
 * (no int-to-float conversion): 2^23 + v is exact, and so is subtracting 2^23 + offset. */
__device__ __forceinline__ float nib_at(uint32_t word, int shift, float off)
{
    return __int_as_float(0x4b000000u | ((word >> shift) & 15u)) - off;
}

__device__ __forceinline__ float i8_at(uint32_t word, int shift)
{
    return __int_as_float(0x4b000000u | (((word >> shift) & 0xffu) ^ 0x80u)) -
           (MAGIC_2P23 + 128.0f);
}

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int k)
{
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

/* The 32 weights of one block, unscaled, in element order: Q4_0 nib - 8, Q4_1 nib, Q8_0 q.
 * Byte j of a Q4 block holds element j (low nibble) and j + 16 (high nibble). */
template <int QT>
__device__ __forceinline__ void block_values(const uint4 &a, const uint4 &b, float *v)
{
#pragma unroll
    for (int e = 0; e < QK; e++) {
        if (QT == QTYPE_Q8_0) {
            const uint32_t w = e < 16 ? u4_word(a, e / 4) : u4_word(b, (e - 16) / 4);
            v[e] = i8_at(w, 8 * (e % 4));
        } else {
            const int j = e & 15;
            const uint32_t w = u4_word(a, j / 4);
            v[e] = nib_at(w, 8 * (j % 4) + (e < 16 ? 0 : 4),
                          QT == QTYPE_Q4_0 ? MAGIC_2P23 + 8.0f : MAGIC_2P23);
        }
    }
}

/* ---- path 1: fp32 (or fp16) activations, quantized weights ---- */

/* Activations 4k .. 4k + 3 of a block as fp32: fp32 as stored, or fp16 widened (exact). */
__device__ __forceinline__ float4 load_x4(const float *p, int k)
{
    return ((const float4 *)p)[k];
}

__device__ __forceinline__ float4 load_x4(const __half *p, int k)
{
    const uint2 v = ((const uint2 *)p)[k];
    return make_float4(fp16_bits_to_f32(v.x), fp16_bits_to_f32(v.x >> 16), fp16_bits_to_f32(v.y),
                       fp16_bits_to_f32(v.y >> 16));
}

/* XT: float, or __half when backend_cuda_opts.act_f16 halves the activation bytes each warp
 * reads (the same arithmetic on the rounded values). */
template <int QT, int T, typename XT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_f32_quant_kernel(const uint8_t *__restrict__ qs, const uint8_t *__restrict__ sc,
                          int64_t rows, int64_t nb, const XT *__restrict__ x, int n,
                          float *__restrict__ y)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = ((int64_t)blockIdx.y * GEMV_WARPS + warp) * GEMV_ROWS;
    if (r0 >= rows) return;
    const int t0 = blockIdx.x * T, nt = min(T, n - t0);
    const int64_t cols = nb * QK;
    const XT *xt = x + (size_t)t0 * (size_t)cols;
    int64_t row[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) row[r] = min(r0 + r, rows - 1); /* clamped: loads stay in */
    float acc[GEMV_ROWS][T];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;

    for (int64_t b = lane; b < nb; b += 32) {
        float wv[GEMV_ROWS][QK];
        float d[GEMV_ROWS], mn[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            const struct wblock w = load_wblock<QT>(qs, sc, row[r] * nb + b);
            d[r] = w.d;
            mn[r] = w.m;
            block_values<QT>(w.lo, w.hi, wv[r]);
        }
#pragma unroll
        for (int t = 0; t < T; t++) {
            if (t >= nt) break;
            const XT *xb = xt + (size_t)t * (size_t)cols + (size_t)b * QK;
            float s[GEMV_ROWS], sx = 0.0f;
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) s[r] = 0.0f;
#pragma unroll
            for (int k = 0; k < QK / 4; k++) {
                const float4 x4 = load_x4(xb, k);
                if (QT == QTYPE_Q4_1) sx += (x4.x + x4.y) + (x4.z + x4.w);
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++) {
                    s[r] = fmaf(wv[r][4 * k], x4.x, s[r]);
                    s[r] = fmaf(wv[r][4 * k + 1], x4.y, s[r]);
                    s[r] = fmaf(wv[r][4 * k + 2], x4.z, s[r]);
                    s[r] = fmaf(wv[r][4 * k + 3], x4.w, s[r]);
                }
            }
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) {
                acc[r][t] = fmaf(d[r], s[r], acc[r][t]);
                if (QT == QTYPE_Q4_1) acc[r][t] = fmaf(mn[r], sx, acc[r][t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0 && t < nt && r0 + r < rows)
                y[(size_t)(t0 + t) * (size_t)rows + (size_t)(r0 + r)] = v;
        }
}

/* ---- path 1: fp32 activations, float weights (rows padded to 8 elements) ---- */

__device__ __forceinline__ void load8(int FT, const uint8_t *vals, int64_t off, float *w)
{
    if (FT == QTYPE_F32) {
        const float4 a = *(const float4 *)(vals + off * 4),
                     b = *(const float4 *)(vals + off * 4 + 16);
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z,
        w[7] = b.w;
    } else {
        const uint4 v = *(const uint4 *)(vals + off * 2);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (FT == QTYPE_F16) {
                w[2 * i] = fp16_bits_to_f32(u[i]);
                w[2 * i + 1] = fp16_bits_to_f32(u[i] >> 16);
            } else {
                w[2 * i] = bf16_bits_to_f32(u[i]);
                w[2 * i + 1] = bf16_bits_to_f32(u[i] >> 16);
            }
        }
    }
}

template <int FT, int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_f32_float_kernel(const uint8_t *__restrict__ vals, int64_t rows, int64_t cols,
                          int64_t row_elems, const float *__restrict__ x, int n, bool xvec,
                          float *__restrict__ y)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = ((int64_t)blockIdx.y * GEMV_WARPS + warp) * GEMV_ROWS;
    if (r0 >= rows) return;
    const int t0 = blockIdx.x * T, nt = min(T, n - t0);
    const float *xt = x + (size_t)t0 * (size_t)cols;
    int64_t row[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) row[r] = min(r0 + r, rows - 1);
    float acc[GEMV_ROWS][T];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;

    for (int64_t c8 = (int64_t)lane * 8; c8 < cols; c8 += 32 * 8) {
        float w[GEMV_ROWS][8];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) load8(FT, vals, row[r] * row_elems + c8, w[r]);
        const bool full = c8 + 8 <= cols;
#pragma unroll
        for (int t = 0; t < T; t++) {
            if (t >= nt) break;
            const float *xr = xt + (size_t)t * (size_t)cols + (size_t)c8;
            float xv[8];
            if (full && xvec) {
                const float4 a = *(const float4 *)xr, b = *(const float4 *)(xr + 4);
                xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
                xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) xv[e] = c8 + e < cols ? xr[e] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][t] = fmaf(w[r][e], xv[e], acc[r][t]);
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0 && t < nt && r0 + r < rows)
                y[(size_t)(t0 + t) * (size_t)rows + (size_t)(r0 + r)] = v;
        }
}

/* ---- path 2: int8 activations, quantized weights ---- */

/* Folds block b of GEMV_ROWS rows into acc for the tile's tokens, as ref_dot_q8 folds a block:
 * an exact integer dot product, then acc = fma(dw * dx, isum, acc) (+ fma(m, s, acc)). */
template <int QT, int T>
__device__ __forceinline__ void
q8_block(const struct wblock *w, int64_t b, int64_t nb, int64_t cols, int t0, int nt,
         const int8_t *__restrict__ xq, const float *__restrict__ xd, const float *__restrict__ xs,
         const int32_t *__restrict__ xsum, float (*acc)[T])
{
#pragma unroll
    for (int t = 0; t < T; t++) {
        if (t >= nt) break;
        const size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
        const int4 *qb = (const int4 *)(xq + (size_t)(t0 + t) * (size_t)cols + (size_t)b * QK);
        const int4 q0 = qb[0], q1 = qb[1];
        const int xw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const float dx = xd[tb];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            int isum = 0;
            if (QT == QTYPE_Q8_0) {
#pragma unroll
                for (int k = 0; k < 8; k++)
                    isum = __dp4a((int)(k < 4 ? u4_word(w[r].lo, k) : u4_word(w[r].hi, k - 4)),
                                  xw[k], isum);
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const uint32_t wv = u4_word(w[r].lo, k);
                    isum = __dp4a((int)(wv & 0x0f0f0f0fu), xw[k], isum);
                    isum = __dp4a((int)((wv >> 4) & 0x0f0f0f0fu), xw[4 + k], isum);
                }
                if (QT == QTYPE_Q4_0) isum -= 8 * xsum[tb]; /* sum((nib - 8) q), exactly */
            }
            acc[r][t] = fmaf(__fmul_rn(w[r].d, dx), (float)isum, acc[r][t]);
            if (QT == QTYPE_Q4_1) acc[r][t] = fmaf(w[r].m, xs[tb], acc[r][t]);
        }
    }
}

/* Lane l folds blocks l, l + 32, l + 64, ... in that order; each step loads two of them (both
 * rows) before using either, so a 4096-row matrix at batch 1 (few warps per SM) still keeps
 * enough bytes in flight to stream HBM. */
template <int QT, int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_q8_kernel(const uint8_t *__restrict__ qs, const uint8_t *__restrict__ sc, int64_t rows,
                   int64_t nb, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                   const float *__restrict__ xs, const int32_t *__restrict__ xsum, int n,
                   float *__restrict__ y)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = ((int64_t)blockIdx.y * GEMV_WARPS + warp) * GEMV_ROWS;
    if (r0 >= rows) return;
    const int t0 = blockIdx.x * T, nt = min(T, n - t0);
    const int64_t cols = nb * QK;
    int64_t row[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) row[r] = min(r0 + r, rows - 1);
    float acc[GEMV_ROWS][T];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;

    for (int64_t b = lane; b < nb; b += 64) {
        const bool second = b + 32 < nb;
        struct wblock w0[GEMV_ROWS], w1[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            w0[r] = load_wblock<QT>(qs, sc, row[r] * nb + b);
            if (second) w1[r] = load_wblock<QT>(qs, sc, row[r] * nb + b + 32);
        }
        q8_block<QT, T>(w0, b, nb, cols, t0, nt, xq, xd, xs, xsum, acc);
        if (second) q8_block<QT, T>(w1, b + 32, nb, cols, t0, nt, xq, xd, xs, xsum, acc);
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0 && t < nt && r0 + r < rows)
                y[(size_t)(t0 + t) * (size_t)rows + (size_t)(r0 + r)] = v;
        }
}

/* ---- launchers ---- */

/* The token tile of a launch: the smallest of 1, 2, 4, 8, 16 that holds n (16 for larger n, as
 * several tiles). The tile never changes a result, only how many tokens share a weight load. */
static int tile_for(int n)
{
    return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : n <= 8 ? 8 : 16;
}

/* x: token tiles (fastest, so the tiles of one row group run side by side and share its weight
 * through L2), y: groups of GEMV_WARPS * GEMV_ROWS rows (at most 65535: 524280 rows). */
static dim3 gemv_grid(int64_t rows, int n, int T)
{
    const int64_t rows_per_block = GEMV_WARPS * GEMV_ROWS;
    return dim3((unsigned)((n + T - 1) / T),
                (unsigned)((rows + rows_per_block - 1) / rows_per_block));
}

template <int QT, int T, typename XT>
static void launch_f32_quant_t(struct cuda_ctx *c, const struct cuda_weight *w, const XT *x, int n,
                               float *y)
{
    gemv_f32_quant_kernel<QT, T, XT><<<gemv_grid(w->L.rows, n, T), GEMV_WARPS * 32, 0, c->stream>>>(
        w->dev + w->L.qs_off, w->dev + w->L.sc_off, w->L.rows, w->L.nb, x, n, y);
}

template <int QT, typename XT>
static void launch_f32_quant(struct cuda_ctx *c, const struct cuda_weight *w, const XT *x, int n,
                             float *y)
{
    switch (tile_for(n)) {
    case 1:
        launch_f32_quant_t<QT, 1, XT>(c, w, x, n, y);
        break;
    case 2:
        launch_f32_quant_t<QT, 2, XT>(c, w, x, n, y);
        break;
    case 4:
        launch_f32_quant_t<QT, 4, XT>(c, w, x, n, y);
        break;
    case 8:
        launch_f32_quant_t<QT, 8, XT>(c, w, x, n, y);
        break;
    default:
        launch_f32_quant_t<QT, 16, XT>(c, w, x, n, y);
        break;
    }
}

/* The slot of a weight's quant type in the launch tables below: the one switch from a type to
 * the template instance that serves it. */
static int qtype_slot(enum qtype t)
{
    return t == QTYPE_Q4_0 ? 0 : t == QTYPE_Q4_1 ? 1 : 2; /* else Q8_0 */
}

template <typename XT>
static void launch_f32_quant_any(struct cuda_ctx *c, const struct cuda_weight *w, const XT *x,
                                 int n, float *y)
{
    static void (*const by_type[])(struct cuda_ctx *, const struct cuda_weight *, const XT *, int,
                                   float *) = {launch_f32_quant<QTYPE_Q4_0, XT>,
                                               launch_f32_quant<QTYPE_Q4_1, XT>,
                                               launch_f32_quant<QTYPE_Q8_0, XT>};
    by_type[qtype_slot(w->L.type)](c, w, x, n, y);
}

template <int FT, int T>
static void launch_f32_float_t(struct cuda_ctx *c, const struct cuda_weight *w, const float *x,
                               int n, bool xvec, float *y)
{
    gemv_f32_float_kernel<FT, T><<<gemv_grid(w->L.rows, n, T), GEMV_WARPS * 32, 0, c->stream>>>(
        w->dev + w->L.qs_off, w->L.rows, w->L.cols, w->L.row_elems, x, n, xvec, y);
}

template <int FT>
static void launch_f32_float(struct cuda_ctx *c, const struct cuda_weight *w, const float *x, int n,
                             bool xvec, float *y)
{
    switch (tile_for(n)) {
    case 1:
        launch_f32_float_t<FT, 1>(c, w, x, n, xvec, y);
        break;
    case 2:
        launch_f32_float_t<FT, 2>(c, w, x, n, xvec, y);
        break;
    case 4:
        launch_f32_float_t<FT, 4>(c, w, x, n, xvec, y);
        break;
    case 8:
        launch_f32_float_t<FT, 8>(c, w, x, n, xvec, y);
        break;
    default:
        launch_f32_float_t<FT, 16>(c, w, x, n, xvec, y);
        break;
    }
}

static size_t up256(size_t v)
{
    return (v + 255) / 256 * 256;
}

static struct q8_parts q8_carve(struct cuda_ctx *c, int n, int64_t cols)
{
    size_t nb = (size_t)cols / QK, nt = (size_t)n;
    struct q8_parts p;
    uint8_t *a = (uint8_t *)c->arena;
    p.q = (int8_t *)a;
    a += up256(nt * (size_t)cols);
    p.d = (float *)a;
    a += up256(nt * nb * sizeof(float));
    p.s = (float *)a;
    a += up256(nt * nb * sizeof(float));
    p.sum = (int32_t *)a;
    return p;
}

template <int QT, int T>
static void launch_q8_t(struct cuda_ctx *c, const struct cuda_weight *w, const struct q8_parts *p,
                        int n, float *y)
{
    gemv_q8_kernel<QT, T><<<gemv_grid(w->L.rows, n, T), GEMV_WARPS * 32, 0, c->stream>>>(
        w->dev + w->L.qs_off, w->dev + w->L.sc_off, w->L.rows, w->L.nb, p->q, p->d, p->s, p->sum, n,
        y);
}

template <int QT>
static void launch_q8(struct cuda_ctx *c, const struct cuda_weight *w, const struct q8_parts *p,
                      int n, float *y)
{
    switch (tile_for(n)) {
    case 1:
        launch_q8_t<QT, 1>(c, w, p, n, y);
        break;
    case 2:
        launch_q8_t<QT, 2>(c, w, p, n, y);
        break;
    case 4:
        launch_q8_t<QT, 4>(c, w, p, n, y);
        break;
    case 8:
        launch_q8_t<QT, 8>(c, w, p, n, y);
        break;
    default:
        launch_q8_t<QT, 16>(c, w, p, n, y);
        break;
    }
}

static void launch_q8_any(struct cuda_ctx *c, const struct cuda_weight *w, const struct q8_parts *p,
                          int n, float *y)
{
    static void (*const by_type[])(struct cuda_ctx *, const struct cuda_weight *,
                                   const struct q8_parts *, int, float *) = {
        launch_q8<QTYPE_Q4_0>, launch_q8<QTYPE_Q4_1>, launch_q8<QTYPE_Q8_0>};
    by_type[qtype_slot(w->L.type)](c, w, p, n, y);
}

#ifdef QUERN_HAVE_CUBLAS
/* y[n][rows] = x[n][cols] W^T with W fp16 [rows][cols] row-major: in cuBLAS's column-major
 * terms y^T (rows x n) = W (cols x rows, ld cols)^T * x^T (cols x n, ld cols). */
static void gemm_cublas(struct cuda_ctx *c, const struct cuda_weight *w, const float *x, int n,
                        float *y)
{
    __half *x16 = (__half *)c->arena;
    cuda_f32_to_f16(c, x, x16, (size_t)n * (size_t)w->L.cols);
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t s = c->blas.gemm_ex(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->L.rows, n,
                                       (int)w->L.cols, &alpha, w->f16, CUDA_R_16F, (int)w->L.cols,
                                       x16, CUDA_R_16F, (int)w->L.cols, &beta, y, CUDA_R_32F,
                                       (int)w->L.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        cuda_fail(c, QERR_IO, "cuda: cublasGemmEx %lld x %lld x %d: %s", (long long)w->L.rows,
                  (long long)w->L.cols, n, c->blas.status_string(s));
}
#endif

/* One pass of at most max_tokens tokens. */
static void matmul_pass(struct cuda_ctx *c, const struct cuda_weight *w, const float *x, int n,
                        float *y)
{
    const enum qtype t = w->L.type;
#ifdef QUERN_HAVE_CUBLAS
    if (w->f16 && c->gemm_min_tokens > 0 && n >= c->gemm_min_tokens) {
        gemm_cublas(c, w, x, n, y);
        CUDA_LAUNCHED(c, "cublasGemmEx");
        return;
    }
#endif
    const bool mma = !c->gemm_cublas && c->gemm_min_tokens > 0 && n >= c->gemm_min_tokens &&
                     cuda_pack_is_quant(t);
    if (c->precision == MATMUL_Q8 && cuda_pack_is_quant(t)) {
        struct q8_parts p = q8_carve(c, n, w->L.cols);
        cuda_quantize_q8(c, x, n, w->L.cols, p.q, p.d, p.s, p.sum);
        if (mma) {
            cuda_gemm_mma_q8(c, w, &p, n, y);
            return;
        }
        launch_q8_any(c, w, &p, n, y);
        CUDA_LAUNCHED(c, "gemv_q8_kernel");
        return;
    }
    if (cuda_pack_is_quant(t)) {
        if (c->act_f16 && !mma) { /* the fp16 copy is the arena's, aligned, from any x */
            __half *xh = (__half *)c->arena;
            cuda_f32_to_f16(c, x, xh, (size_t)n * (size_t)w->L.cols);
            launch_f32_quant_any(c, w, (const __half *)xh, n, y);
            CUDA_LAUNCHED(c, "gemv_f32_quant_kernel (fp16 activations)");
            return;
        }
        /* float4 activation loads: a misaligned x (an offset the engine never passes) is copied
         * into the arena first */
        if (!is_aligned16(x)) {
            float *xa = (float *)c->arena;
            CUDA_OK(c, cudaMemcpyAsync(xa, x, (size_t)n * (size_t)w->L.cols * sizeof(float),
                                       cudaMemcpyDeviceToDevice, c->stream));
            x = xa;
        }
        if (mma) {
            cuda_gemm_mma_f16(c, w, x, n, y);
            return;
        }
        launch_f32_quant_any(c, w, x, n, y);
        CUDA_LAUNCHED(c, "gemv_f32_quant_kernel");
        return;
    }
    const bool xvec = w->L.cols % 4 == 0 && is_aligned16(x);
    switch (t) {
    case QTYPE_F32:
        launch_f32_float<QTYPE_F32>(c, w, x, n, xvec, y);
        break;
    case QTYPE_F16:
        launch_f32_float<QTYPE_F16>(c, w, x, n, xvec, y);
        break;
    default:
        launch_f32_float<QTYPE_BF16>(c, w, x, n, xvec, y);
        break;
    }
    CUDA_LAUNCHED(c, "gemv_f32_float_kernel");
}

void cuda_op_matmul(struct backend *be, const struct bweight *bw, const float *x, int n, float *y)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    const struct cuda_weight *w = (const struct cuda_weight *)bw->impl;
    if (n <= 0) return;
    if (!w) {
        cuda_fail(c, QERR_INVALID, "cuda: matmul: weight not prepared");
        return;
    }
    if ((w->L.rows + GEMV_WARPS * GEMV_ROWS - 1) / (GEMV_WARPS * GEMV_ROWS) > 65535) {
        cuda_fail(c, QERR_UNSUPPORTED, "cuda: matmul: %lld rows (at most %d)", (long long)w->L.rows,
                  65535 * GEMV_WARPS * GEMV_ROWS);
        return;
    }
    if (!c->arena || c->arena_cols < w->L.cols) {
        cuda_fail(c, QERR_INVALID, "cuda: matmul: arena holds %lld columns, weight has %lld",
                  (long long)c->arena_cols, (long long)w->L.cols);
        return;
    }
    cuda_use_device(c);
    for (int t0 = 0; t0 < n; t0 += c->max_tokens) {
        const int nt = n - t0 < c->max_tokens ? n - t0 : c->max_tokens;
        matmul_pass(c, w, x + (size_t)t0 * (size_t)w->L.cols, nt,
                    y + (size_t)t0 * (size_t)w->L.rows);
    }
}

/* ---- weights ---- */

int cuda_op_weight_prepare(struct backend *be, struct bweight *bw, struct qerr *err)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    bw->impl = NULL;
    struct cuda_weight *w = (struct cuda_weight *)calloc(1, sizeof *w);
    if (!w) return qerr_set(err, QERR_NOMEM, "cuda backend: out of memory");
    int rc = cuda_pack_plan(bw->type, bw->rows, bw->cols, &w->L, err);
    if (!rc && bw->rows > (int64_t)65535 * GEMV_WARPS * GEMV_ROWS)
        rc = qerr_set(err, QERR_UNSUPPORTED, "cuda backend: a weight of %lld rows (at most %d)",
                      (long long)bw->rows, 65535 * GEMV_WARPS * GEMV_ROWS);
    if (rc) {
        free(w);
        return rc;
    }
    cuda_use_device(c);
    if ((rc = cuda_arena_reserve(c, bw->cols, err))) {
        free(w);
        return rc;
    }
    void *host = malloc(w->L.total);
    if (!host) {
        size_t mib = w->L.total >> 20;
        free(w);
        return qerr_set(err, QERR_NOMEM, "cuda backend: out of host memory packing %zu MiB", mib);
    }
    cuda_pack_weight(&w->L, bw->host, host);
    size_t want = w->L.total;
#ifdef QUERN_HAVE_CUBLAS
    const bool keep_f16 = c->gemm_cublas;
#else
    const bool keep_f16 = false;
#endif
    size_t f16_bytes = keep_f16 ? (size_t)bw->rows * (size_t)bw->cols * sizeof(__half) : 0;
    cudaError_t e = cudaMalloc((void **)&w->dev, want);
    if (e == cudaSuccess && f16_bytes) e = cudaMalloc((void **)&w->f16, f16_bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        const struct cuda_free_text avail = cuda_free_now();
        if (w->dev) cudaFree(w->dev);
        free(host);
        free(w);
        return qerr_set(err, QERR_NOMEM,
                        "cuda: out of device memory for a %s %lld x %lld weight: asked %.1f MiB, "
                        "%s",
                        qtype_name(bw->type), (long long)bw->rows, (long long)bw->cols,
                        (double)(want + f16_bytes) / 1048576.0, avail.s);
    }
    e = cudaMemcpyAsync(w->dev, host, want, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess && w->f16) {
        cuda_weight_to_f16(c, w, w->f16);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    free(host);
    if (e != cudaSuccess) {
        cudaFree(w->dev);
        if (w->f16) cudaFree(w->f16);
        free(w);
        return qerr_set(err, QERR_IO, "cuda: uploading a %s %lld x %lld weight: %s",
                        qtype_name(bw->type), (long long)bw->rows, (long long)bw->cols,
                        cudaGetErrorString(e));
    }
    bw->impl = w;
    return 0;
}

void cuda_op_weight_release(struct backend *be, struct bweight *bw)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    struct cuda_weight *w = (struct cuda_weight *)bw->impl;
    if (!w) return;
    cuda_use_device(c);
    cudaStreamSynchronize(c->stream); /* no queued op may still read it */
    cuda_graphs_reset(c);             /* nor a captured step replay it */
    cudaFree(w->dev);
    if (w->f16) cudaFree(w->f16);
    free(w);
    bw->impl = NULL;
}
