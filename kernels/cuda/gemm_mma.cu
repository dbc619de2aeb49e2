/* gemm_mma: the dequant-fused tensor-core GEMM for prefill and large batches,
 * y[n][rows] = x[n][cols] W^T with W in Q4_0, Q4_1 or Q8_0.
 *
 * DESIGN (Marlin-like in its data flow, not yet in its tuning)
 * A thread block owns MMA_BM = 64 weight rows and MMA_BN = 64 tokens; its 4 warps each own a
 * 32 x 32 corner (2 x 4 MMA tiles of 16 rows x 8 tokens). The k loop walks the weight's 32-blocks
 * KB at a time: the threads load the next KB blocks of the tile's rows and tokens from global
 * memory into registers while the warps multiply the current ones out of shared memory (register
 * double buffering), then store them, unpacked, for the next round. A weight block is unpacked
 * into exact small integers (Q4_0 nib - 8, Q4_1 nib, Q8_0 q), so the MMA sees no rounding of the
 * weights; the block's scale is applied afterwards, per block, in fp32:
 *
 *   MATMUL_Q8 (int8 MMA, m16n8k32): x is quantized per 32-block exactly as for the GEMV
 *     (cuda_quantize_q8); P = the block's exact int32 dot product, one MMA per tile and block;
 *     acc = fma(dw * dx, P, acc) (+ fma(m, s, acc) for Q4_1): ref_dot_q8's arithmetic per block.
 *   MATMUL_F32 (fp16 MMA, m16n8k16 x 2): x is rounded to fp16 as it is staged; P = the block's
 *     dot product in the tensor core's fp32; acc = fma(d, P, acc) (+ fma(m, sum x, acc)). The fp16
 *     rounding of x is the price of the tensor cores (normalized error ~1e-4, vs 1e-7).
 *
 * Each output's blocks are folded in k order by one lane whatever n, the tile or the grid, so
 * this path is batch-invariant on its own; it is not bit-equal to the GEMV (another order, and
 * fp16 x in the F32 mode), so a backend that switches between the two at gemm_min_tokens is not
 * batch-invariant across that switch (backend_cuda_opts.batch_invariant keeps the GEMV for every
 * n).
 *
 * Shared memory rows are padded (int8: 32 + 16 bytes, fp16: 64 + 16) so a warp's fragment loads,
 * eight rows by four words, hit 32 distinct banks. No ldmatrix or cp.async yet: plain 32-bit
 * shared loads and 16-byte global loads, which the CPU emulation can run. */
#include "cuda_common.cuh"

#define MMA_BM      64
#define MMA_BN      64
#define MMA_WARPS   4
#define MMA_THREADS (MMA_WARPS * 32)

/* Words (4 bytes) of one block-row in shared memory, padded: int8 32 bytes + 16, fp16 64 + 16. */
template <bool F16> struct mma_cfg {
    static constexpr int KB = F16 ? 2 : 4;                    /* 32-blocks per stage */
    static constexpr int WORDS = F16 ? 16 : 8;                /* data words of one block-row */
    static constexpr int STRIDE = WORDS + 4;                  /* padded */
    static constexpr int W_UNITS = MMA_BM * KB / MMA_THREADS; /* (row, block) pairs per thread */
    static constexpr int X_UNITS = MMA_BN * KB / MMA_THREADS; /* (token, block) pairs */
};

/* Q4 quants of one block (16 bytes: byte j = element j low, j + 16 high) as 8 words of int8 in
 * element order; Q4_0's nibbles become nib - 8 ((v + 120) ^ 128 per byte, no carries). */
template <int QT> __device__ __forceinline__ void q4_to_i8(const uint4 &v, uint32_t *o)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t lo = w[k] & 0x0f0f0f0fu, hi = (w[k] >> 4) & 0x0f0f0f0fu;
        if (QT == QTYPE_Q4_0) {
            lo = (lo + 0x78787878u) ^ 0x80808080u;
            hi = (hi + 0x78787878u) ^ 0x80808080u;
        }
        o[k] = lo;
        o[4 + k] = hi;
    }
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b)
{
    return (uint32_t)__half_as_ushort(__float2half_rn(a)) |
           (uint32_t)__half_as_ushort(__float2half_rn(b)) << 16;
}

/* 8 words of int8 (element order) as 16 words of fp16 pairs: exact, |v| <= 128. */
__device__ __forceinline__ void i8_to_f16(const uint32_t *in, uint32_t *o)
{
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t w = in[k];
        o[2 * k] = pack_half2((float)(int8_t)(w & 0xffu), (float)(int8_t)((w >> 8) & 0xffu));
        o[2 * k + 1] =
            pack_half2((float)(int8_t)((w >> 16) & 0xffu), (float)(int8_t)((w >> 24) & 0xffu));
    }
}

/* One stage in registers: the weight and activation blocks one thread moves. */
template <bool F16> struct mma_stage {
    uint32_t w[mma_cfg<F16>::W_UNITS][mma_cfg<F16>::WORDS];
    float wd[mma_cfg<F16>::W_UNITS], wm[mma_cfg<F16>::W_UNITS];
    uint32_t x[mma_cfg<F16>::X_UNITS][mma_cfg<F16>::WORDS];
    float xd[mma_cfg<F16>::X_UNITS], xs[mma_cfg<F16>::X_UNITS];
};

/* Loads blocks b0 .. b0 + KB - 1 of the tile's rows and tokens (zeros past the ends). */
template <int QT, bool F16>
__device__ __forceinline__ void
stage_load(struct mma_stage<F16> &st, const uint8_t *__restrict__ qs,
           const uint8_t *__restrict__ sc, int64_t rows, int64_t nb, int64_t r0,
           const int8_t *__restrict__ xq, const float *__restrict__ xd,
           const float *__restrict__ xs, const float *__restrict__ xf, int n, int t0, int64_t b0)
{
    typedef mma_cfg<F16> C;
#pragma unroll
    for (int i = 0; i < C::W_UNITS; i++) {
        const int u = threadIdx.x + i * MMA_THREADS, kb = u % C::KB;
        const int64_t row = r0 + u / C::KB, b = b0 + kb;
        uint32_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float d = 0.0f, m = 0.0f;
        if (b < nb) { /* the row clamped: loads stay in */
            const struct wblock wb = load_wblock<QT>(qs, sc, min(row, rows - 1) * nb + b);
            if (QT == QTYPE_Q8_0) {
                q[0] = wb.lo.x, q[1] = wb.lo.y, q[2] = wb.lo.z, q[3] = wb.lo.w;
                q[4] = wb.hi.x, q[5] = wb.hi.y, q[6] = wb.hi.z, q[7] = wb.hi.w;
            } else {
                q4_to_i8<QT>(wb.lo, q);
            }
            d = wb.d;
            m = wb.m;
        }
        if (F16) {
            i8_to_f16(q, st.w[i]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) st.w[i][k] = q[k];
        }
        st.wd[i] = d;
        st.wm[i] = m;
    }
#pragma unroll
    for (int i = 0; i < C::X_UNITS; i++) {
        const int u = threadIdx.x + i * MMA_THREADS, kb = u % C::KB;
        const int tok = t0 + u / C::KB;
        const int64_t b = b0 + kb;
        const bool in = tok < n && b < nb;
        const size_t tb = (size_t)min(tok, n - 1) * (size_t)nb + (size_t)(b < nb ? b : 0);
        if (F16) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < QK / 4; k++) {
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (in) v = ((const float4 *)(xf + tb * QK))[k];
                const uint32_t p0 = pack_half2(v.x, v.y), p1 = pack_half2(v.z, v.w);
                st.x[i][2 * k] = p0;
                st.x[i][2 * k + 1] = p1;
                if (QT == QTYPE_Q4_1) /* the sum of the values the MMA multiplies */
                    s += (fp16_bits_to_f32(p0) + fp16_bits_to_f32(p0 >> 16)) +
                         (fp16_bits_to_f32(p1) + fp16_bits_to_f32(p1 >> 16));
            }
            st.xd[i] = 1.0f;
            st.xs[i] = s;
        } else {
            uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
            if (in) {
                lo = *(const uint4 *)(xq + tb * QK);
                hi = *(const uint4 *)(xq + tb * QK + 16);
            }
            st.x[i][0] = lo.x, st.x[i][1] = lo.y, st.x[i][2] = lo.z, st.x[i][3] = lo.w;
            st.x[i][4] = hi.x, st.x[i][5] = hi.y, st.x[i][6] = hi.z, st.x[i][7] = hi.w;
            st.xd[i] = in ? xd[tb] : 0.0f;
            st.xs[i] = in && QT == QTYPE_Q4_1 ? xs[tb] : 0.0f;
        }
    }
}

template <bool F16>
__device__ __forceinline__ void
stage_store(const struct mma_stage<F16> &st, uint32_t (*w_s)[MMA_BM][mma_cfg<F16>::STRIDE],
            uint32_t (*x_s)[MMA_BN][mma_cfg<F16>::STRIDE], float (*wd_s)[MMA_BM],
            float (*wm_s)[MMA_BM], float (*xd_s)[MMA_BN], float (*xs_s)[MMA_BN])
{
    typedef mma_cfg<F16> C;
#pragma unroll
    for (int i = 0; i < C::W_UNITS; i++) {
        const int u = threadIdx.x + i * MMA_THREADS, kb = u % C::KB, r = u / C::KB;
#pragma unroll
        for (int k = 0; k < C::WORDS; k++) w_s[kb][r][k] = st.w[i][k];
        wd_s[kb][r] = st.wd[i];
        wm_s[kb][r] = st.wm[i];
    }
#pragma unroll
    for (int i = 0; i < C::X_UNITS; i++) {
        const int u = threadIdx.x + i * MMA_THREADS, kb = u % C::KB, t = u / C::KB;
#pragma unroll
        for (int k = 0; k < C::WORDS; k++) x_s[kb][t][k] = st.x[i][k];
        xd_s[kb][t] = st.xd[i];
        xs_s[kb][t] = st.xs[i];
    }
}

/* grid.x: token tiles (fastest: neighbouring blocks share a weight tile through L2), grid.y: row
 * tiles. F16: fp32 activations xf; else the Q8 activations xq, xd, xs (Q4_1's block sums s). */
template <int QT, bool F16>
__global__ void __launch_bounds__(MMA_THREADS)
    gemm_mma_kernel(const uint8_t *__restrict__ qs, const uint8_t *__restrict__ sc, int64_t rows,
                    int64_t nb, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                    const float *__restrict__ xs, const float *__restrict__ xf, int n,
                    float *__restrict__ y)
{
    typedef mma_cfg<F16> C;
    __shared__ uint32_t w_s[C::KB][MMA_BM][C::STRIDE];
    __shared__ uint32_t x_s[C::KB][MMA_BN][C::STRIDE];
    __shared__ float wd_s[C::KB][MMA_BM], wm_s[C::KB][MMA_BM];
    __shared__ float xd_s[C::KB][MMA_BN], xs_s[C::KB][MMA_BN];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wr = (warp & 1) * 32, wt = (warp >> 1) * 32; /* the warp's corner of the tile */
    const int t0 = blockIdx.x * MMA_BN;
    const int64_t r0 = (int64_t)blockIdx.y * MMA_BM;

    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] = 0.0f;

    struct mma_stage<F16> st;
    stage_load<QT, F16>(st, qs, sc, rows, nb, r0, xq, xd, xs, xf, n, t0, 0);
    stage_store<F16>(st, w_s, x_s, wd_s, wm_s, xd_s, xs_s);
    __syncthreads();
    for (int64_t b0 = 0; b0 < nb; b0 += C::KB) {
        const bool more = b0 + C::KB < nb;
        if (more) stage_load<QT, F16>(st, qs, sc, rows, nb, r0, xq, xd, xs, xf, n, t0, b0 + C::KB);
#pragma unroll
        for (int kb = 0; kb < C::KB; kb++) {
            if (b0 + kb >= nb) break; /* the same for the whole block */
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const int ra = wr + mi * 16 + g;
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int tb = wt + ni * 8 + g;
                    float p[4];
                    if (F16) {
                        p[0] = p[1] = p[2] = p[3] = 0.0f;
#pragma unroll
                        for (int kk = 0; kk < 2; kk++) { /* the block's two k16 halves */
                            const int o = 8 * kk + t;
                            const uint32_t a[4] = {w_s[kb][ra][o], w_s[kb][ra + 8][o],
                                                   w_s[kb][ra][o + 4], w_s[kb][ra + 8][o + 4]};
                            const uint32_t bb[2] = {x_s[kb][tb][o], x_s[kb][tb][o + 4]};
                            mma_f16_16816(p, a, bb);
                        }
                    } else {
                        const uint32_t a[4] = {w_s[kb][ra][t], w_s[kb][ra + 8][t],
                                               w_s[kb][ra][t + 4], w_s[kb][ra + 8][t + 4]};
                        const uint32_t bb[2] = {x_s[kb][tb][t], x_s[kb][tb][t + 4]};
                        int d4[4] = {0, 0, 0, 0};
                        mma_s8_16832(d4, a, bb);
#pragma unroll
                        for (int c = 0; c < 4; c++) p[c] = (float)d4[c];
                    }
                    /* the block's scales, in fp32: acc += s P (+ m sum x) */
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int rl = ra + (c >= 2 ? 8 : 0), tl = wt + ni * 8 + 2 * t + (c & 1);
                        const float s = F16 ? wd_s[kb][rl] : __fmul_rn(wd_s[kb][rl], xd_s[kb][tl]);
                        acc[mi][ni][c] = fmaf(s, p[c], acc[mi][ni][c]);
                        if (QT == QTYPE_Q4_1)
                            acc[mi][ni][c] = fmaf(wm_s[kb][rl], xs_s[kb][tl], acc[mi][ni][c]);
                    }
                }
            }
        }
        __syncthreads(); /* every warp is done with this stage */
        if (more) {
            stage_store<F16>(st, w_s, x_s, wd_s, wm_s, xd_s, xs_s);
            __syncthreads();
        }
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int64_t row = r0 + wr + mi * 16 + g + (c >= 2 ? 8 : 0);
                const int tok = t0 + wt + ni * 8 + 2 * t + (c & 1);
                if (row < rows && tok < n)
                    y[(size_t)tok * (size_t)rows + (size_t)row] = acc[mi][ni][c];
            }
}

static dim3 mma_grid(int64_t rows, int n)
{
    return dim3((unsigned)((n + MMA_BN - 1) / MMA_BN), (unsigned)((rows + MMA_BM - 1) / MMA_BM));
}

template <bool F16>
static void launch_mma(struct cuda_ctx *c, const struct cuda_weight *w, const struct q8_parts *p,
                       const float *xf, int n, float *y)
{
    const uint8_t *qs = w->dev + w->L.qs_off, *sc = w->dev + w->L.sc_off;
    const int8_t *xq = p ? p->q : NULL;
    const float *xd = p ? p->d : NULL, *xs = p ? p->s : NULL;
    const dim3 grid = mma_grid(w->L.rows, n);
    switch (w->L.type) {
    case QTYPE_Q4_0:
        gemm_mma_kernel<QTYPE_Q4_0, F16>
            <<<grid, MMA_THREADS, 0, c->stream>>>(qs, sc, w->L.rows, w->L.nb, xq, xd, xs, xf, n, y);
        break;
    case QTYPE_Q4_1:
        gemm_mma_kernel<QTYPE_Q4_1, F16>
            <<<grid, MMA_THREADS, 0, c->stream>>>(qs, sc, w->L.rows, w->L.nb, xq, xd, xs, xf, n, y);
        break;
    default:
        gemm_mma_kernel<QTYPE_Q8_0, F16>
            <<<grid, MMA_THREADS, 0, c->stream>>>(qs, sc, w->L.rows, w->L.nb, xq, xd, xs, xf, n, y);
        break;
    }
    CUDA_LAUNCHED(c, "gemm_mma_kernel");
}

void cuda_gemm_mma_q8(struct cuda_ctx *c, const struct cuda_weight *w, const struct q8_parts *p,
                      int n, float *y)
{
    launch_mma<false>(c, w, p, NULL, n, y);
}

void cuda_gemm_mma_f16(struct cuda_ctx *c, const struct cuda_weight *w, const float *x, int n,
                       float *y)
{
    launch_mma<true>(c, w, NULL, x, n, y);
}
