/* attention: causal attention over the paged KV cache, one thread block per (token, head).
 *
 * DESIGN
 * The block's 4 warps split the context 0..pos into chunks of 32 positions, dealt round-robin
 * (warp w takes chunks w, w + 4, ...). For a chunk, lane l scores position 32c + l (its K row
 * read through the block table, a dot product with q from shared memory in order d = 0..hd-1),
 * the warp takes the chunk's max, rescales its running sum and output (online softmax, as
 * ref_attention_one), then adds the chunk's 32 weighted V rows with lane l owning dims l, l + 32,
 * ... (coalesced V reads). At the end the 4 partial (max, sum, output) are merged in warp order.
 *
 * Every choice (chunking, the warp of a chunk, the lane of a position, the merge order) depends
 * only on the token's position, never on n_tokens or on the other tokens of the batch, so a
 * token's output is bit-identical alone and inside any batch. GQA: head h reads kv head
 * h / (n_heads / n_kv_heads); the heads of a group re-read the same K/V, which L2 serves.
 *
 * Long contexts are split (FlashDecoding): a token at position p has p / ATT_SPLIT + 1 splits of
 * ATT_SPLIT positions, one thread block each (grid z), so a decode batch of one sequence still
 * fills the GPU. A split writes its unnormalized partial (max, sum, output) to the scratch and
 * attention_reduce_kernel merges a token's splits in split order. The split count depends only on
 * the token's position, so batch invariance holds; a token with one split (p < ATT_SPLIT) writes
 * its output directly, with exactly the operations of an unsplit kernel.
 *
 * The cache is fp16 by default (backend_cuda_opts.kv_f32 keeps fp32): each element is widened
 * to fp32 as it is read, so the arithmetic is the fp32 kernel's on the rounded values.
 *
 * Staged fp16 path (attention_staged_kernel: fp16 cache, head dim a multiple of 8 up to 128, the
 * serving case): a warp first copies its chunk's 32 K rows into shared memory with 16-byte loads,
 * a row per half-warp (coalesced, every load of the chunk in flight at once), then lane l dots q
 * with row l from there; the V rows follow through the same buffer. The first H200 run
 * (docs/benchmarks.md) showed the direct path at ~30x the bytes' time: lane l reading its own K
 * row 2 bytes at a time touches 32 rows per load instruction, and the V loop waited on memory for
 * each of its 32 positions in turn. The staged kernel does each query's arithmetic in exactly
 * the direct kernel's order (the dot in d order, the same online-softmax steps, V rows folded in
 * position order per dimension, the same warp merge), so its results are the direct kernel's bit
 * for bit, and batch invariance holds as before.
 *
 * Prefill: a batch of at least ATT_TILE_MIN_TOKENS tokens (head dim <= 128) runs tiles of
 * ATT_TILE consecutive tokens per block, walked chunk by chunk together so the K/V rows that
 * neighbouring queries of one sequence share come from L1; a query's arithmetic is the same as
 * alone, so the tiling is invisible in the results (the conformance test compares bits). The
 * direct tile reads K/V from global memory; the staged kernel tiles the same way and stages each
 * chunk once for the queries of the tile that share a sequence.
 *
 * Sliding window (attn_batch.window > 0): a token at p sees keys f .. p, f = attn_first_key.
 * Splits and chunks stay anchored at position 0, as without a window; a query skips the splits
 * and chunks wholly before f and masks the keys before f in the chunk that holds it (never
 * reading them or their block-table entries). So a window that excludes nothing changes no
 * operation, a tile's queries still share their chunks, and everything still depends only on the
 * token's position and the window, a launch argument (each captured launch keeps its own, so a
 * replayed step may mix windows per layer). A token's splits are f / ATT_SPLIT .. p / ATT_SPLIT;
 * a block's first is its tile's earliest, and one split in all is written directly.
 *
 * Soft-capping (attn_shape.softcap > 0, Gemma 2): each key's score is capped where it is
 * computed, before the online softmax sees it, in every kernel; the cap, like the window, is a
 * launch argument, so a captured step replays with the value it was captured with. */
#include <limits.h>
#include <math.h>

#include "cuda_common.cuh"

#define ATT_WARPS           4
#define ATT_SPLIT           256 /* positions per split block: 8 chunks, 2 per warp */
#define ATT_DIMS_PER_LANE   (CUDA_MAX_HEAD_DIM / 32)
#define ATT_TILE            8  /* queries per block in tiled (prefill) launches */
#define ATT_TILE_DPL        4  /* their head dimension: up to 128 */
#define ATT_TILE_MIN_TOKENS 32 /* batches from which the tiled launch is used */
/* Blocks a launch aims at (132 SMs x 8 blocks x 2): a grid sized by the longest context in the
 * batch gives a batch of short sequences beside one long one a block per (token, head, split of
 * the long one), nearly all of them with nothing to do. */
#define ATT_TARGET_BLOCKS 2048

/* A cache element widened to fp32 (exact for fp16). */
__device__ __forceinline__ float kv_load(const float *p)
{
    return *p;
}

__device__ __forceinline__ float kv_load(const __half *p)
{
    return __half2float(*p);
}

__device__ __forceinline__ float4 kv_load4(const float *p)
{
    return *(const float4 *)p;
}

__device__ __forceinline__ float4 kv_load4(const __half *p)
{
    return make_float4(__half2float(p[0]), __half2float(p[1]), __half2float(p[2]),
                       __half2float(p[3]));
}

/* backend.h's attn_first_key: the first key a token at pos sees. */
__device__ __forceinline__ int att_first_key(int pos, int window)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

/* backend.h's soft-capping of a key's score s = scale q.k, in the reference's operations (a true
 * division, then tanhf within its 2 ulp). Only a key the query sees is scored (the others stay
 * -inf, so the cap never lets a masked key in); cap 0 returns s itself, so an uncapped model's
 * results keep their bits. */
__device__ __forceinline__ float att_softcap(float s, float cap)
{
    return cap > 0 ? cap * tanhf(s / cap) : s;
}

/* The first split any query of the tile t0 .. t0 + TQ - 1 has: where its block starts. */
template <int TQ>
__device__ __forceinline__ int att_tile_first_split(const int32_t *pos, int t0, int n_tokens,
                                                    int window)
{
    int s0 = INT_MAX;
#pragma unroll
    for (int i = 0; i < TQ; i++)
        if (t0 + i < n_tokens) s0 = min(s0, att_first_key(pos[t0 + i], window) / ATT_SPLIT);
    return s0;
}

/* A tile's queries t0 .. t0 + TQ - 1 for one split: lo[i] .. hi[i], query i's keys in the split
 * (hi -1 when it has none there: the split past its position or before its window, or the token
 * past the batch), whole[i], whether that is its only split, tbl[i], its sequence's block table
 * row; the queries' rows of head h into q_s. Returns the tile's furthest key, -1 when no query has
 * a key in this split, and then *more: whether one has in a later split (the same for the whole
 * block; a barrier only then not reached by anyone). */
template <int TQ, int QW>
__device__ __forceinline__ int
att_tile_begin(const float *q, const int32_t *pos, const int32_t *seq, const int32_t *table, int t0,
               int n_tokens, int max_blocks, int h, int n_heads, int hd, int window, int split,
               int (&lo)[TQ], int (&hi)[TQ], bool (&whole)[TQ], const int32_t *(&tbl)[TQ],
               bool *more, float (*q_s)[QW])
{
    const int s_lo = split * ATT_SPLIT;
    int hi_max = -1;
    *more = false;
#pragma unroll
    for (int i = 0; i < TQ; i++) {
        lo[i] = s_lo;
        hi[i] = -1;
        whole[i] = true;
        tbl[i] = table;
        if (t0 + i >= n_tokens) continue;
        const int p = pos[t0 + i], f = att_first_key(p, window);
        const int n_split = p / ATT_SPLIT + 1;
        whole[i] = n_split - f / ATT_SPLIT == 1;
        if (split >= n_split) continue; /* the grid is sized for the longest context */
        *more = true;
        if (split < f / ATT_SPLIT) continue; /* before the window */
        lo[i] = f > s_lo ? f : s_lo;
        hi[i] = min(p, s_lo + ATT_SPLIT - 1);
        tbl[i] = table + (size_t)seq[t0 + i] * (size_t)max_blocks;
        hi_max = hi[i] > hi_max ? hi[i] : hi_max;
    }
    if (hi_max < 0) return -1;
#pragma unroll
    for (int i = 0; i < TQ; i++) {
        if (hi[i] < 0) continue;
        const float *qh = q + ((size_t)(t0 + i) * (size_t)n_heads + (size_t)h) * (size_t)hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) q_s[i][d] = qh[d];
    }
    __syncthreads();
    return hi_max;
}

/* Query row th = token * n_heads + head, one split: the block's warps' partials (acc: this lane's
 * dims lane, lane + 32, ...; m, l: its warp's max and sum) merged in warp order. One split
 * (whole): the output; several: part[(th, split)] = max, sum, then hd unnormalized outputs
 * relative to the max, for attention_reduce_kernel. Every thread of the block calls it (two
 * barriers: acc_s and m_s are the next query's after it). */
template <int DPL>
__device__ __forceinline__ void att_merge_write(const float (&acc)[DPL], float m, float l,
                                                bool whole, size_t th, int split, int max_splits,
                                                int hd, float *out, float *part,
                                                float (*acc_s)[DPL * 32], float *m_s, float *l_s)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const int d = lane + 32 * k;
        if (d < hd) acc_s[warp][d] = acc[k];
    }
    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
    __syncthreads();
    float mt = m_s[0];
    for (int w = 1; w < ATT_WARPS; w++) mt = fmaxf(mt, m_s[w]);
    float den = 0, f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = m_s[w] == -INFINITY ? 0.0f : expf(m_s[w] - mt); /* a warp with no chunk: 0 */
        den = fmaf(l_s[w], f[w], den);
    }
    float *dst = whole ? out + th * (size_t)hd
                       : part + (th * (size_t)max_splits + (size_t)split) * ((size_t)hd + 2);
    if (!whole && threadIdx.x == 0) {
        dst[0] = mt;
        dst[1] = den;
    }
    if (!whole) dst += 2;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0;
        for (int w = 0; w < ATT_WARPS; w++) num = fmaf(acc_s[w][d], f[w], num);
        dst[d] = whole ? num / den : num;
    }
    __syncthreads();
}

/* Tokens [TQ x, TQ x + TQ) of the batch, head y, split z. The queries of a tile are walked chunk
 * by chunk together (warp w's chunk of every query, then its next chunk), so neighbouring
 * prefill tokens of one sequence read each K and V row from L1 while it is fresh; each query's
 * own arithmetic is exactly its arithmetic alone (TQ = 1), whatever shares its tile. DPL: head
 * dimensions per lane (hd <= 32 DPL). */
template <typename T, int TQ, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_kernel(float *out, const float *q, const T *kc, const T *vc, const int32_t *pos,
                     const int32_t *seq, const int32_t *table, int n_tokens, int max_blocks, int bs,
                     int n_heads, int n_kv_heads, int hd, float scale, float softcap, int window,
                     float *part, int max_splits)
{
    __shared__ float q_s[TQ][DPL * 32];
    __shared__ float acc_s[ATT_WARPS][DPL * 32];
    __shared__ float m_s[ATT_WARPS], l_s[ATT_WARPS];
    const int t0 = blockIdx.x * TQ, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv_dim = n_kv_heads * hd;
    const int kvh = h / (n_heads / n_kv_heads);
    /* the splits s0 + z, s0 + z + gridDim.z, ...: a launch of many tokens needs no more blocks
     * than fill the GPU, and which block computes a split changes nothing in it */
    const int s0 = att_tile_first_split<TQ>(pos, t0, n_tokens, window);
    for (int split = s0 + blockIdx.z; split < max_splits; split += gridDim.z) {
        const int split_lo = split * ATT_SPLIT;
        int lo[TQ], hi[TQ];
        bool whole[TQ], more;
        const int32_t *tbl[TQ];
        const int hi_max =
            att_tile_begin<TQ>(q, pos, seq, table, t0, n_tokens, max_blocks, h, n_heads, hd, window,
                               split, lo, hi, whole, tbl, &more, q_s);
        if (hi_max < 0 && !more) break; /* the same for the whole block, and for later splits */
        if (hi_max < 0) continue;

        const bool vec = (hd & 3) == 0;
        float m[TQ], l[TQ], acc[TQ][DPL];
#pragma unroll
        for (int i = 0; i < TQ; i++) {
            m[i] = -INFINITY;
            l[i] = 0;
#pragma unroll
            for (int k = 0; k < DPL; k++) acc[i][k] = 0;
        }

        for (int c0 = split_lo + warp * 32; c0 <= hi_max; c0 += ATT_WARPS * 32) {
#pragma unroll
            for (int i = 0; i < TQ; i++) {
                if (c0 > hi[i] || c0 + 31 < lo[i]) continue; /* the same for the whole warp */
                const int j = c0 + lane;
                const bool valid = j >= lo[i] && j <= hi[i];
                int64_t slot = 0;
                float sc = -INFINITY;
                if (valid) {
                    slot = (int64_t)tbl[i][j / bs] * bs + j % bs;
                    const T *kj = kc + slot * kv_dim + (int64_t)kvh * hd;
                    float dot = 0;
                    if (vec) {
                        for (int d = 0; d < hd; d += 4) {
                            float4 k4 = kv_load4(kj + d);
                            dot = fmaf(q_s[i][d], k4.x, dot);
                            dot = fmaf(q_s[i][d + 1], k4.y, dot);
                            dot = fmaf(q_s[i][d + 2], k4.z, dot);
                            dot = fmaf(q_s[i][d + 3], k4.w, dot);
                        }
                    } else {
                        for (int d = 0; d < hd; d++) dot = fmaf(q_s[i][d], kv_load(kj + d), dot);
                    }
                    sc = att_softcap(dot * scale, softcap);
                }
                const float cmax = warp_max(sc);
                const float m_new = fmaxf(m[i], cmax);
                const float corr = expf(m[i] - m_new); /* 0 for the first chunk (m = -inf) */
                const float pl = valid ? expf(sc - m_new) : 0.0f;
                l[i] = l[i] * corr + warp_sum(pl);
#pragma unroll
                for (int k = 0; k < DPL; k++) acc[i][k] *= corr;
                const int cnt = min(32, hi[i] - c0 + 1);
                for (int jj = lo[i] > c0 ? lo[i] - c0 : 0; jj < cnt; jj++) {
                    const float pj = __shfl_sync(0xffffffffu, pl, jj);
                    const int64_t sj = __shfl_sync(0xffffffffu, slot, jj);
                    const T *vj = vc + sj * kv_dim + (int64_t)kvh * hd;
#pragma unroll
                    for (int k = 0; k < DPL; k++) {
                        const int d = lane + 32 * k;
                        if (d < hd) acc[i][k] = fmaf(pj, kv_load(vj + d), acc[i][k]);
                    }
                }
                m[i] = m_new;
            }
        }

        /* per query, merge the warps' partials in warp order */
#pragma unroll
        for (int i = 0; i < TQ; i++)
            if (hi[i] >= 0) /* the same for the whole block */
                att_merge_write<DPL>(acc[i], m[i], l[i], whole[i],
                                     (size_t)(t0 + i) * (size_t)n_heads + (size_t)h, split,
                                     max_splits, hd, out, part, acc_s, m_s, l_s);
    }
}

/* ---- the staged fp16 kernel ---- */

/* A staged row of up to 128 halves as words, + 1: row l starts at bank l, so 32 lanes reading
 * word w of their own rows hit 32 banks. */
#define ATT_STAGE_DPL   4 /* head dims per lane: up to 128 */
#define ATT_STAGE_WORDS (ATT_STAGE_DPL * 16 + 1)

/* Rows ls .. hs of the chunk at c0 (at most 32) of one sequence's K or V for kv head kvh into buf
 * (row r = position c0 + r; rows before ls left as they were): 16-byte loads, hd / 8 per row, a
 * half-warp per row of 128 dims. Every lane runs the same trip count (shuffles). hd % 8 == 0. */
__device__ __forceinline__ void att_stage_rows(uint32_t (*buf)[ATT_STAGE_WORDS],
                                               const __half *cache, const int32_t *tbl, int c0,
                                               int ls, int hs, int bs, int kv_dim, int kvh, int hd,
                                               int lane)
{
    const int j = c0 + lane;
    const int64_t my_slot = j >= ls && j <= hs ? (int64_t)tbl[j / bs] * bs + j % bs : 0;
    const int pieces = hd / 8;
    __syncwarp(); /* every lane is done with what the buffer held */
    for (int p = lane; p < 32 * pieces; p += 32) {
        const int r = p / pieces, u = p - r * pieces;
        const int64_t sr = __shfl_sync(0xffffffffu, my_slot, r);
        if (c0 + r >= ls && c0 + r <= hs) {
            const uint4 v = *(const uint4 *)(cache + sr * kv_dim + (int64_t)kvh * hd + u * 8);
            uint32_t *dst = &buf[r][u * 4];
            dst[0] = v.x;
            dst[1] = v.y;
            dst[2] = v.z;
            dst[3] = v.w;
        }
    }
    __syncwarp();
}

/* attention_kernel<__half, TQ, ATT_STAGE_DPL> with each warp's K and V rows staged in shared
 * memory. Per chunk, the tile's queries are taken in runs that share a sequence (a prefill tile
 * spans at most a few): K rows staged once per run (up to the run's furthest position), every
 * query of the run scored, then its V rows staged and folded into every query of the run. */
template <int TQ>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_staged_kernel(float *out, const float *q, const __half *kc, const __half *vc,
                            const int32_t *pos, const int32_t *seq, const int32_t *table,
                            int n_tokens, int max_blocks, int bs, int n_heads, int n_kv_heads,
                            int hd, float scale, float softcap, int window, float *part,
                            int max_splits)
{
    constexpr int DPL = ATT_STAGE_DPL;
    __shared__ float q_s[TQ][DPL * 32];
    __shared__ float acc_s[ATT_WARPS][DPL * 32];
    __shared__ float m_s[ATT_WARPS], l_s[ATT_WARPS];
    __shared__ uint32_t rows_s[ATT_WARPS][32][ATT_STAGE_WORDS];
    const int t0 = blockIdx.x * TQ, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv_dim = n_kv_heads * hd;
    const int kvh = h / (n_heads / n_kv_heads);
    /* the splits s0 + z, s0 + z + gridDim.z, ...: a launch of many tokens needs no more blocks
     * than fill the GPU, and which block computes a split changes nothing in it */
    const int s0 = att_tile_first_split<TQ>(pos, t0, n_tokens, window);
    for (int split = s0 + blockIdx.z; split < max_splits; split += gridDim.z) {
        const int split_lo = split * ATT_SPLIT;
        int lo[TQ], hi[TQ];
        bool whole[TQ], more;
        const int32_t *tbl[TQ];
        const int hi_max =
            att_tile_begin<TQ>(q, pos, seq, table, t0, n_tokens, max_blocks, h, n_heads, hd, window,
                               split, lo, hi, whole, tbl, &more, q_s);
        if (hi_max < 0 && !more) break; /* the same for the whole block, and for later splits */
        if (hi_max < 0) continue;
        /* run[i]: the first query of i's sequence in the tile; run_lo[i] .. run_hi[i]: the keys
         * of that run */
        int run[TQ], run_lo[TQ], run_hi[TQ];
#pragma unroll
        for (int i = 0; i < TQ; i++) {
            run[i] = i;
            run_lo[i] = lo[i];
            run_hi[i] = hi[i];
#pragma unroll
            for (int i2 = 0; i2 < TQ; i2++)
                if (hi[i] >= 0 && hi[i2] >= 0 && tbl[i2] == tbl[i]) {
                    if (i2 < run[i]) run[i] = i2;
                    if (lo[i2] < run_lo[i]) run_lo[i] = lo[i2];
                    if (hi[i2] > run_hi[i]) run_hi[i] = hi[i2];
                }
        }

        float m[TQ], l[TQ], acc[TQ][DPL], pl[TQ];
#pragma unroll
        for (int i = 0; i < TQ; i++) {
            m[i] = -INFINITY;
            l[i] = 0;
            pl[i] = 0;
#pragma unroll
            for (int k = 0; k < DPL; k++) acc[i][k] = 0;
        }
        uint32_t(*buf)[ATT_STAGE_WORDS] = rows_s[warp];
        const uint32_t *mine = buf[lane];

        for (int c0 = split_lo + warp * 32; c0 <= hi_max; c0 += ATT_WARPS * 32) {
#pragma unroll
            for (int r = 0; r < TQ; r++) {
                /* the run led by query r (warp-uniform conditions throughout) */
                if (run[r] != r || hi[r] < 0 || c0 > run_hi[r] || c0 + 31 < run_lo[r]) continue;
                const int hs = min(c0 + 31, run_hi[r]);
                att_stage_rows(buf, kc, tbl[r], c0, run_lo[r], hs, bs, kv_dim, kvh, hd, lane);
#pragma unroll
                for (int i = 0; i < TQ; i++) {
                    if (run[i] != r || hi[i] < 0 || c0 > hi[i] || c0 + 31 < lo[i]) continue;
                    const int j = c0 + lane;
                    const bool valid = j >= lo[i] && j <= hi[i];
                    float sc = -INFINITY;
                    if (valid) {
                        float dot = 0;
                        for (int w = 0; w < hd / 2; w++) {
                            const uint32_t kw = mine[w];
                            dot = fmaf(q_s[i][2 * w], fp16_bits_to_f32(kw), dot);
                            dot = fmaf(q_s[i][2 * w + 1], fp16_bits_to_f32(kw >> 16), dot);
                        }
                        sc = att_softcap(dot * scale, softcap);
                    }
                    const float cmax = warp_max(sc);
                    const float m_new = fmaxf(m[i], cmax);
                    const float corr = expf(m[i] - m_new);
                    pl[i] = valid ? expf(sc - m_new) : 0.0f;
                    l[i] = l[i] * corr + warp_sum(pl[i]);
#pragma unroll
                    for (int k = 0; k < DPL; k++) acc[i][k] *= corr;
                    m[i] = m_new;
                }
                att_stage_rows(buf, vc, tbl[r], c0, run_lo[r], hs, bs, kv_dim, kvh, hd, lane);
                const int cnt_run = hs - c0 + 1;
                for (int jj = run_lo[r] > c0 ? run_lo[r] - c0 : 0; jj < cnt_run; jj++) {
                    const uint32_t *vrow = buf[jj];
#pragma unroll
                    for (int i = 0; i < TQ; i++) {
                        if (run[i] != r || hi[i] < 0 || c0 + jj > hi[i] || c0 + jj < lo[i])
                            continue;
                        const float pj = __shfl_sync(0xffffffffu, pl[i], jj);
#pragma unroll
                        for (int k = 0; k < DPL; k++) {
                            const int d = lane + 32 * k;
                            if (d < hd)
                                acc[i][k] =
                                    fmaf(pj, fp16_bits_to_f32(vrow[d >> 1] >> (16 * (d & 1))),
                                         acc[i][k]);
                        }
                    }
                }
            }
        }

#pragma unroll
        for (int i = 0; i < TQ; i++)
            if (hi[i] >= 0) /* the same for the whole block */
                att_merge_write<DPL>(acc[i], m[i], l[i], whole[i],
                                     (size_t)(t0 + i) * (size_t)n_heads + (size_t)h, split,
                                     max_splits, hd, out, part, acc_s, m_s, l_s);
    }
}

/* Merges the splits of the tokens that have more than one, in split order. */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_reduce_kernel(float *out, const float *part, const int32_t *pos, int n_heads, int hd,
                            int window, int max_splits)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const int s0 = att_first_key(pos[t], window) / ATT_SPLIT, n_split = pos[t] / ATT_SPLIT + 1;
    if (n_split - s0 == 1) return; /* written by attention_kernel */
    const float *ph =
        part + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)max_splits * ((size_t)hd + 2);
    const size_t stride = (size_t)hd + 2;
    float mt = ph[(size_t)s0 * stride];
    for (int s = s0 + 1; s < n_split; s++) mt = fmaxf(mt, ph[(size_t)s * stride]);
    float den = 0;
    for (int s = s0; s < n_split; s++)
        den = fmaf(ph[(size_t)s * stride + 1], expf(ph[(size_t)s * stride] - mt), den);
    float *oh = out + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0;
        for (int s = s0; s < n_split; s++)
            num = fmaf(ph[(size_t)s * stride + 2 + d], expf(ph[(size_t)s * stride] - mt), num);
        oh[d] = num / den;
    }
}

/* The staged kernel: an fp16 cache whose rows are whole 16-byte pieces (hd % 8 == 0), up to 128
 * dims. */
static bool att_staged(const float *, const struct attn_shape *)
{
    return false;
}

static bool att_staged(const __half *, const struct attn_shape *s)
{
    return s->head_dim % 8 == 0 && s->head_dim <= 32 * ATT_STAGE_DPL;
}

template <typename T>
static void launch_attention(struct cuda_ctx *c, bool tiled, dim3 grid, int max_splits, float *out,
                             const float *q, const T *kc, const T *vc, const struct attn_batch *b,
                             const struct attn_shape *s)
{
    if (att_staged(kc, s) && tiled)
        attention_staged_kernel<ATT_TILE><<<grid, ATT_WARPS * 32, 0, c->stream>>>(
            out, q, (const __half *)kc, (const __half *)vc, b->pos, b->seq, b->block_table,
            b->n_tokens, b->max_blocks, b->block_size, s->n_heads, s->n_kv_heads, s->head_dim,
            s->scale, s->softcap, b->window, c->att_part, max_splits);
    else if (att_staged(kc, s))
        attention_staged_kernel<1><<<grid, ATT_WARPS * 32, 0, c->stream>>>(
            out, q, (const __half *)kc, (const __half *)vc, b->pos, b->seq, b->block_table,
            b->n_tokens, b->max_blocks, b->block_size, s->n_heads, s->n_kv_heads, s->head_dim,
            s->scale, s->softcap, b->window, c->att_part, max_splits);
    else if (tiled)
        attention_kernel<T, ATT_TILE, ATT_TILE_DPL><<<grid, ATT_WARPS * 32, 0, c->stream>>>(
            out, q, kc, vc, b->pos, b->seq, b->block_table, b->n_tokens, b->max_blocks,
            b->block_size, s->n_heads, s->n_kv_heads, s->head_dim, s->scale, s->softcap, b->window,
            c->att_part, max_splits);
    else
        attention_kernel<T, 1, ATT_DIMS_PER_LANE><<<grid, ATT_WARPS * 32, 0, c->stream>>>(
            out, q, kc, vc, b->pos, b->seq, b->block_table, b->n_tokens, b->max_blocks,
            b->block_size, s->n_heads, s->n_kv_heads, s->head_dim, s->scale, s->softcap, b->window,
            c->att_part, max_splits);
}

void cuda_op_attention(struct backend *be, float *out, const float *q, const void *k_cache,
                       const void *v_cache, const struct attn_batch *b, const struct attn_shape *s)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (b->n_tokens <= 0) return;
    if (s->head_dim < 1 || s->head_dim > CUDA_MAX_HEAD_DIM || s->n_kv_heads < 1 ||
        s->n_heads % s->n_kv_heads || s->n_heads > 65535) {
        cuda_fail(c, QERR_INVALID, "cuda: attention: %d heads, %d kv heads, head_dim %d",
                  s->n_heads, s->n_kv_heads, s->head_dim);
        return;
    }
    cuda_use_device(c);
    /* the most splits any token of the batch can have: its block table's whole length */
    int64_t ctx_max = (int64_t)b->max_blocks * b->block_size;
    int max_splits = (int)((ctx_max + ATT_SPLIT - 1) / ATT_SPLIT);
    if (max_splits < 1) max_splits = 1;
    if (max_splits > 65535) {
        cuda_fail(c, QERR_INVALID, "cuda: attention: context of %lld positions",
                  (long long)ctx_max);
        return;
    }
    /* The split partials go to the scratch reserved at create (never allocated in a step); a
     * batch whose partials do not fit runs in passes over its tokens, which changes no result
     * (each token's arithmetic is its own). */
    int pass = b->n_tokens;
    if (max_splits > 1) {
        const size_t per_token =
            (size_t)s->n_heads * (size_t)max_splits * ((size_t)s->head_dim + 2) * sizeof(float);
        const size_t fit = c->att_part_bytes / per_token;
        if (fit < 1) {
            cuda_fail(c, QERR_UNSUPPORTED,
                      "cuda: attention: a context of %lld positions needs %.1f MiB of split "
                      "scratch per token; the scratch holds %.1f MiB",
                      (long long)ctx_max, (double)per_token / 1048576.0,
                      (double)c->att_part_bytes / 1048576.0);
            return;
        }
        if (fit < (size_t)pass) pass = (int)fit;
    }
    /* tiles of ATT_TILE tokens when a batch is big enough to fill the GPU with them and its
     * sequences have several tokens each (prefill), so a tile's queries share K/V rows; one
     * token per block otherwise: a decode batch of 64 sequences tiled ran 8 sequences one after
     * another in each of 256 blocks, 11x slower on the H200 than 2048 blocks of one token
     * (docs/benchmarks.md). A token's result is the same either way. */
    const bool tiled = s->head_dim <= 32 * ATT_TILE_DPL && b->n_tokens >= ATT_TILE_MIN_TOKENS &&
                       b->n_tokens >= ATT_TILE / 2 * b->n_seqs;
    const int tq = tiled ? ATT_TILE : 1;
    const size_t row = (size_t)s->n_heads * (size_t)s->head_dim;
    for (int t0 = 0; t0 < b->n_tokens; t0 += pass) {
        const int nt = b->n_tokens - t0 < pass ? b->n_tokens - t0 : pass;
        struct attn_batch pb = *b;
        pb.n_tokens = nt;
        pb.pos = b->pos + t0;
        pb.seq = b->seq + t0;
        float *o = out + (size_t)t0 * row;
        const float *qp = q + (size_t)t0 * row;
        /* splits per block: as many blocks as fill the GPU (ATT_TARGET_BLOCKS), never more
         * than the splits a token can have; a block takes splits z, z + grid.z, ... */
        const int64_t tiles = (int64_t)((nt + tq - 1) / tq) * s->n_heads;
        int64_t gz = (ATT_TARGET_BLOCKS + tiles - 1) / tiles;
        if (gz > max_splits) gz = max_splits;
        /* a window's keys span at most this many splits (a block takes the next ones too) */
        if (b->window > 0 && gz > (b->window - 1) / ATT_SPLIT + 2)
            gz = (b->window - 1) / ATT_SPLIT + 2;
        dim3 grid((unsigned)((nt + tq - 1) / tq), (unsigned)s->n_heads, (unsigned)gz);
        if (c->kv_f16)
            launch_attention<__half>(c, tiled, grid, max_splits, o, qp, (const __half *)k_cache,
                                     (const __half *)v_cache, &pb, s);
        else
            launch_attention<float>(c, tiled, grid, max_splits, o, qp, (const float *)k_cache,
                                    (const float *)v_cache, &pb, s);
        CUDA_LAUNCHED(c, "attention_kernel");
        if (max_splits > 1) {
            dim3 rgrid((unsigned)nt, (unsigned)s->n_heads);
            attention_reduce_kernel<<<rgrid, ATT_WARPS * 32, 0, c->stream>>>(
                o, c->att_part, pb.pos, s->n_heads, s->head_dim, b->window, max_splits);
            CUDA_LAUNCHED(c, "attention_reduce_kernel");
        }
    }
}
