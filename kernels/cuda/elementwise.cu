/* elementwise: the CUDA backend's small ops (embed, rmsnorm, add, rope, kv_write, get_rows,
 * silu_mul, gelu_mul, scale, softcap, moe_combine) and the activation conversions the matmul uses
 * (Q8 quantization, fp16).
 *
 * Each matches kernels/cpu/ref.c: bit for bit where the reference's arithmetic can be reproduced
 * (embed, get_rows, kv_write, add, scale, moe_combine, Q8 quantization; rope, silu, gelu and
 * softcap up to the last bit of a double cos/sin/exp/tanh rounded to float), within a few ulp
 * otherwise (rmsnorm sums its squares in double in another order). The _rn intrinsics keep nvcc
 * from contracting a product and a sum into one fma where the reference rounds twice. Reductions
 * run in an order fixed by the row length, never by the number of tokens, so every op is
 * batch-invariant. */
#include <math.h>

#include "cuda_common.cuh"

#define EW_THREADS 256

static unsigned grid_for(size_t n, unsigned threads)
{
    size_t g = (n + threads - 1) / threads;
    return (unsigned)(g > 65535u * 16u ? 65535u * 16u : g); /* grid-stride beyond this */
}

/* ---- dequantization of one element of a packed weight (cuda_pack.h) ---- */

struct wview {
    int type;
    int64_t rows, cols, nb, row_elems;
    const uint8_t *qs;
    const uint8_t *sc;
};

static struct wview wview_of(const struct cuda_weight *w)
{
    struct wview v;
    v.type = (int)w->L.type;
    v.rows = w->L.rows;
    v.cols = w->L.cols;
    v.nb = w->L.nb;
    v.row_elems = w->L.row_elems;
    v.qs = w->dev + w->L.qs_off;
    v.sc = w->dev + w->L.sc_off;
    return v;
}

/* As qtype_dequantize_row computes it: d * q, d * (nib - 8), d * nib + m (two roundings). */
__device__ __forceinline__ float wview_get(const struct wview &w, int64_t r, int64_t j)
{
    switch (w.type) {
    case QTYPE_F32:
        return ((const float *)w.qs)[r * w.row_elems + j];
    case QTYPE_F16:
        return fp16_bits_to_f32(((const uint16_t *)w.qs)[r * w.row_elems + j]);
    case QTYPE_BF16:
        return bf16_bits_to_f32(((const uint16_t *)w.qs)[r * w.row_elems + j]);
    default:
        break;
    }
    int64_t blk = r * w.nb + j / QK;
    int k = (int)(j % QK);
    if (w.type == QTYPE_Q8_0) {
        float d = fp16_bits_to_f32(((const uint16_t *)w.sc)[blk]);
        return __fmul_rn(d, (float)((const int8_t *)w.qs)[blk * QK + k]);
    }
    uint32_t byte = w.qs[blk * (QK / 2) + (k & 15)];
    int nib = (int)(k < 16 ? byte & 15u : byte >> 4);
    if (w.type == QTYPE_Q4_0) {
        float d = fp16_bits_to_f32(((const uint16_t *)w.sc)[blk]);
        return __fmul_rn(d, (float)(nib - 8));
    }
    uint32_t dm = ((const uint32_t *)w.sc)[blk];
    return __fadd_rn(__fmul_rn(fp16_bits_to_f32(dm), (float)nib), fp16_bits_to_f32(dm >> 16));
}

/* ---- embed ---- */

/* out[t][:] = row tokens[t] of the table; one block per token. */
__global__ void embed_kernel(struct wview w, const int32_t *tokens, float *out)
{
    int64_t t = blockIdx.x;
    int32_t tok = tokens[t];
    float *o = out + t * w.cols;
    bool ok = tok >= 0 && tok < w.rows;
    for (int64_t j = threadIdx.x; j < w.cols; j += blockDim.x)
        o[j] = ok ? wview_get(w, tok, j) : __int_as_float(0x7fffffff);
}

void cuda_op_embed(struct backend *be, const struct bweight *table, const int32_t *tokens, int n,
                   float *out)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    const struct cuda_weight *w = (const struct cuda_weight *)table->impl;
    if (n <= 0) return;
    if (!w) {
        cuda_fail(c, QERR_INVALID, "cuda: embed: table not prepared");
        return;
    }
    cuda_use_device(c);
    embed_kernel<<<n, EW_THREADS, 0, c->stream>>>(wview_of(w), tokens, out);
    CUDA_LAUNCHED(c, "embed_kernel");
}

/* ---- rmsnorm ---- */

/* out[t] = x[t] / rms(x[t]) * w; one block per token. The sum of squares is in double (as the
 * reference), each thread over a fixed stride, then warps, then the block, in a fixed order. out
 * may alias x: every element is read before the reduction's barrier and written after it by the
 * same thread. */
/* One block per row; with y (add_rmsnorm) the row is first x += y, each thread on the elements
 * it later normalizes, so the arithmetic is add_kernel's then this kernel's (out may alias y:
 * a thread reads y[j] before it writes out[j]). */
__global__ void rmsnorm_kernel(float *out, float *x, const float *y, const float *w, int dim,
                               float eps)
{
    __shared__ double part[EW_THREADS / 32];
    __shared__ float scale_s;
    float *xi = x + (size_t)blockIdx.x * (size_t)dim;
    float *oi = out + (size_t)blockIdx.x * (size_t)dim;
    if (y) {
        const float *yi = y + (size_t)blockIdx.x * (size_t)dim;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) xi[j] = __fadd_rn(xi[j], yi[j]);
    }
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        double v = (double)xi[j];
        ss = fma(v, v, ss); /* the product of two floats is exact in double: same as v * v + ss */
    }
    ss = warp_sum_f64(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += part[i];
        scale_s = (float)(1.0 / sqrt(t / dim + (double)eps));
    }
    __syncthreads();
    float scale = scale_s;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        oi[j] = __fmul_rn(__fmul_rn(xi[j], scale), w[j]);
}

void cuda_op_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                     float eps)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (n <= 0 || dim <= 0) return;
    cuda_use_device(c);
    /* x is only read when y is NULL */
    rmsnorm_kernel<<<n, EW_THREADS, 0, c->stream>>>(out, (float *)x, (const float *)NULL, w, dim,
                                                    eps);
    CUDA_LAUNCHED(c, "rmsnorm_kernel");
}

void cuda_op_add_rmsnorm(struct backend *be, float *out, float *x, const float *y, const float *w,
                         int n, int dim, float eps)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (n <= 0 || dim <= 0) return;
    cuda_use_device(c);
    rmsnorm_kernel<<<n, EW_THREADS, 0, c->stream>>>(out, x, y, w, dim, eps);
    CUDA_LAUNCHED(c, "rmsnorm_kernel (add)");
}

/* ---- add, silu_mul, gelu_mul, scale, softcap ---- */

__global__ void add_kernel(float *x, const float *y, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], y[i]);
}

void cuda_op_add(struct backend *be, float *x, const float *y, size_t n)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!n) return;
    cuda_use_device(c);
    add_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, c->stream>>>(x, y, n);
    CUDA_LAUNCHED(c, "add_kernel");
}

/* x[n][dim] += b[dim]: add_kernel's sum, b read again for each row */
__global__ void add_rows_kernel(float *x, const float *b, size_t total, int dim)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], b[i % (size_t)dim]);
}

void cuda_op_add_rows(struct backend *be, float *x, const float *b, int n, int dim)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (n <= 0 || dim <= 0) return;
    size_t total = (size_t)n * (size_t)dim;
    cuda_use_device(c);
    add_rows_kernel<<<grid_for(total, EW_THREADS), EW_THREADS, 0, c->stream>>>(x, b, total, dim);
    CUDA_LAUNCHED(c, "add_rows_kernel");
}

/* g = g / (1 + exp(-g)) * u. exp in double rounded to float: the correctly rounded expf almost
 * always, which is what glibc's expf returns, so the result matches the reference bit for bit
 * nearly everywhere (CUDA's expf is 2 ulp). */
__global__ void silu_mul_kernel(float *g, const float *u, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = g[i];
        float e = (float)exp(-(double)v);
        g[i] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, e)), u[i]);
    }
}

void cuda_op_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!n) return;
    cuda_use_device(c);
    silu_mul_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, c->stream>>>(g, u, n);
    CUDA_LAUNCHED(c, "silu_mul_kernel");
}

/* g = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u with the reference's roundings, in its
 * order, and tanh in double rounded to float (the correctly rounded tanhf). Not the equal
 * g / (1 + exp(-2z)): where tanh is near -1 (g from about -3 to -10) the reference's 1 + tanhf
 * holds only multiples of 2^-24, so only the same tanh reproduces its values there. */
__global__ void gelu_mul_kernel(float *g, const float *u, size_t n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi), the reference's float */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
        const float z = __fmul_rn(c, __fadd_rn(x, x3));
        const float t = (float)tanh((double)z);
        g[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t)), u[i]);
    }
}

void cuda_op_gelu_mul(struct backend *be, float *g, const float *u, size_t n)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!n) return;
    cuda_use_device(c);
    gelu_mul_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, c->stream>>>(g, u, n);
    CUDA_LAUNCHED(c, "gelu_mul_kernel");
}

__global__ void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

void cuda_op_scale(struct backend *be, float *x, float s, size_t n)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!n) return;
    cuda_use_device(c);
    scale_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, c->stream>>>(x, s, n);
    CUDA_LAUNCHED(c, "scale_kernel");
}

/* x = cap tanh(x / cap): a true division, as the reference's (x * (1 / cap) rounds twice), and
 * tanh in double rounded to float. */
__global__ void softcap_kernel(float *x, float cap, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(cap, (float)tanh((double)__fdiv_rn(x[i], cap)));
}

void cuda_op_softcap(struct backend *be, float *x, float cap, size_t n)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!n) return;
    cuda_use_device(c);
    softcap_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, c->stream>>>(x, cap, n);
    CUDA_LAUNCHED(c, "softcap_kernel");
}

/* ---- rope ---- */

/* One thread per (token, head, pair): theta = pos * inv[i] in double as the reference, cos and
 * sin in double rounded to float, then the rotation with the reference's two roundings. */
__global__ void rope_kernel(float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                            int pairs, struct rope_freqs f)
{
    size_t total = (size_t)n * (size_t)n_heads * (size_t)pairs;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % (size_t)pairs);
        size_t th = idx / (size_t)pairs; /* token * n_heads + head */
        int t = (int)(th / (size_t)n_heads);
        float *v = x + th * (size_t)head_dim + 2 * (size_t)i;
        double theta = (double)pos[t] * f.inv[i];
        double sd, cd;
        sincos(theta, &sd, &cd);
        float cs = (float)(cd * f.mscale), sn = (float)(sd * f.mscale);
        float a = v[0], b = v[1];
        v[0] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        v[1] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
    }
}

void cuda_op_rope(struct backend *be, float *x, const int32_t *pos, int n, int n_heads,
                  int head_dim, const struct rope_spec *rs)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    int rot_dim = rs->rot_dim;
    if (n <= 0 || n_heads <= 0 || rot_dim <= 0) return;
    if (rot_dim > head_dim || rot_dim % 2 || rot_dim / 2 > CUDA_MAX_ROPE_PAIRS) {
        cuda_fail(c, QERR_INVALID, "cuda: rope: rot_dim %d, head_dim %d", rot_dim, head_dim);
        return;
    }
    if (!rope_key_matches(&c->rope_key, rs)) {
        for (int i = 0; i < rot_dim / 2; i++) c->rope.inv[i] = rope_inv_freq(rs, i);
        c->rope.mscale = rope_mscale(rs);
        rope_key_set(&c->rope_key, rs);
    }
    cuda_use_device(c);
    size_t total = (size_t)n * (size_t)n_heads * (size_t)(rot_dim / 2);
    rope_kernel<<<grid_for(total, EW_THREADS), EW_THREADS, 0, c->stream>>>(
        x, pos, n, n_heads, head_dim, rot_dim / 2, c->rope);
    CUDA_LAUNCHED(c, "rope_kernel");
}

/* ---- kv_write, get_rows ---- */

__device__ __forceinline__ void kv_store(float *p, float x)
{
    *p = x;
}

__device__ __forceinline__ void kv_store(__half *p, float x)
{
    *p = __float2half_rn(x);
}

/* One block per token: its k and v rows into their slot (fp16 caches round to nearest even). */
template <typename T>
__global__ void kv_write_kernel(T *kc, T *vc, const float *k, const float *v, const int32_t *slot,
                                int kv_dim)
{
    size_t t = blockIdx.x;
    size_t dst = (size_t)slot[t] * (size_t)kv_dim, src = t * (size_t)kv_dim;
    for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
        kv_store(kc + dst + j, k[src + j]);
        kv_store(vc + dst + j, v[src + j]);
    }
}

void cuda_op_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *k,
                      const float *v, const struct attn_batch *b, int kv_dim)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (b->n_tokens <= 0 || kv_dim <= 0) return;
    cuda_use_device(c);
    if (c->kv_f16)
        kv_write_kernel<__half><<<b->n_tokens, EW_THREADS, 0, c->stream>>>(
            (__half *)k_cache, (__half *)v_cache, k, v, b->slot, kv_dim);
    else
        kv_write_kernel<float><<<b->n_tokens, EW_THREADS, 0, c->stream>>>(
            (float *)k_cache, (float *)v_cache, k, v, b->slot, kv_dim);
    CUDA_LAUNCHED(c, "kv_write_kernel");
}

__global__ void get_rows_kernel(float *out, const float *x, const int32_t *idx, int dim)
{
    size_t i = blockIdx.x;
    const float *src = x + (size_t)idx[i] * (size_t)dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) out[i * (size_t)dim + j] = src[j];
}

void cuda_op_get_rows(struct backend *be, float *out, const float *x, const int32_t *idx, int n,
                      int dim)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (n <= 0 || dim <= 0) return;
    cuda_use_device(c);
    get_rows_kernel<<<n, EW_THREADS, 0, c->stream>>>(out, x, idx, dim);
    CUDA_LAUNCHED(c, "get_rows_kernel");
}

/* ---- moe_combine ---- */

/* One block per token, its threads across the row: out[t][d] is the sum over j < k, in the
 * caller's order, of w[t k + j] y[rows[t k + j]][d], from 0, each product rounded before its add
 * (no fma), as the reference, so the row's bits are the reference's. */
__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *rows, const float *w,
                                   int k, int dim)
{
    const size_t t = blockIdx.x;
    const int32_t *r = rows + t * (size_t)k;
    const float *wt = w + t * (size_t)k;
    float *o = out + t * (size_t)dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++)
            acc = __fadd_rn(acc, __fmul_rn(wt[j], y[(size_t)r[j] * (size_t)dim + (size_t)d]));
        o[d] = acc;
    }
}

void cuda_op_moe_combine(struct backend *be, float *out, const float *y, const int32_t *rows,
                         const float *w, int n, int k, int dim)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (n <= 0 || dim <= 0) return;
    cuda_use_device(c);
    moe_combine_kernel<<<n, EW_THREADS, 0, c->stream>>>(out, y, rows, w, k < 0 ? 0 : k, dim);
    CUDA_LAUNCHED(c, "moe_combine_kernel");
}

/* ---- activation conversions for the matmul ---- */

/* One warp per (token, 32-block), as ref_quantize_q8: d = max|x| / 127, q = round-half-even(x *
 * (1/d)), sum = the sum of q, s = d * sum. Bit for bit: max and the integer sum are exact in any
 * order, the rest is one IEEE operation each (nvcc's default -prec-div=true). */
__global__ void quantize_q8_kernel(const float *x, int64_t cols, int64_t nb, int n, int8_t *q,
                                   float *d, float *s, int32_t *sum)
{
    int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (gw >= (int64_t)n * nb) return; /* whole warps */
    int64_t t = gw / nb, b = gw % nb;
    float v = x[t * cols + b * QK + lane];
    float amax = warp_max(fabsf(v));
    float db = __fdiv_rn(amax, 127.0f);
    float id = db > 0 ? __fdiv_rn(1.0f, db) : 0.0f;
    int qv = (int)rintf(__fmul_rn(v, id));
    q[t * cols + b * QK + lane] = (int8_t)qv;
    int su = warp_sum_int(qv);
    if (lane == 0) {
        d[t * nb + b] = db;
        sum[t * nb + b] = su;
        s[t * nb + b] = __fmul_rn(db, (float)su);
    }
}

void cuda_quantize_q8(struct cuda_ctx *c, const float *x, int n, int64_t cols, int8_t *q, float *d,
                      float *s, int32_t *sum)
{
    int64_t nb = cols / QK;
    size_t threads = (size_t)n * (size_t)nb * 32;
    quantize_q8_kernel<<<(unsigned)((threads + EW_THREADS - 1) / EW_THREADS), EW_THREADS, 0,
                         c->stream>>>(x, cols, nb, n, q, d, s, sum);
    CUDA_LAUNCHED(c, "quantize_q8_kernel");
}

__global__ void f32_to_f16_kernel(const float *src, __half *dst, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

void cuda_f32_to_f16(struct cuda_ctx *c, const float *src, __half *dst, size_t n)
{
    if (!n) return;
    f32_to_f16_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, c->stream>>>(src, dst, n);
    CUDA_LAUNCHED(c, "f32_to_f16_kernel");
}

__global__ void weight_to_f16_kernel(struct wview w, __half *dst)
{
    size_t total = (size_t)w.rows * (size_t)w.cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int64_t r = (int64_t)(i / (size_t)w.cols), j = (int64_t)(i % (size_t)w.cols);
        dst[i] = __float2half_rn(wview_get(w, r, j));
    }
}

void cuda_weight_to_f16(struct cuda_ctx *c, const struct cuda_weight *w, __half *dst)
{
    size_t total = (size_t)w->L.rows * (size_t)w->L.cols;
    weight_to_f16_kernel<<<grid_for(total, EW_THREADS), EW_THREADS, 0, c->stream>>>(wview_of(w),
                                                                                    dst);
    CUDA_LAUNCHED(c, "weight_to_f16_kernel");
}
