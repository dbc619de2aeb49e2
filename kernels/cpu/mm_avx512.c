/* AVX-512 matmul kernels over the qpack layout (qpack.h).
 *
 * Design: a register holds one 4-element slice of 16 rows (dword r = row r), so a vpdpbusd with 4
 * activation bytes broadcast to every dword adds 4 products to each of 16 rows' sums; 8 of them
 * cover a 32-block, and the block's 16 row scales are one vector. A tile is one group of 16 rows
 * by T tokens: the group's block is unpacked once and used for T tokens (T = 1..8), so a
 * prefill reads each weight block once per 8 tokens, and a decode (T = 1) streams the weights with
 * no horizontal sums. Every token keeps its own accumulators and runs the same instruction
 * sequence whatever T is, so a token's result does not depend on its neighbours in the batch.
 * From KERN_PAIR_MIN_TOKENS tokens a tile is two groups by up to 4 tokens (q8_tile2), which
 * shares each activation broadcast between the groups.
 *
 * Q8 path: the integer block sums are exact, and the float steps per block are exactly those of
 * ref_dot_q8 (mul, then fma), so the results equal the reference bit for bit.
 * F32 path: element (r, k) of the block is converted to float and multiplied by x[k] into one of
 * four partial sums by k mod 4, each summed over k in a fixed order; then
 * acc = fma(d, (p0 + p1) + (p2 + p3), acc), plus fma(m, sum(x of the block), acc) for Q4_1. */
#include <immintrin.h>
#include <string.h>

#include "kern.h"
#include "pf_walk.h"
#include "qpack512.h"

#define TGT    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))
#define TMAX   8 /* most tokens per tile */

/* 16 blocks at once: their maxima, scales and sums one vector each (lane i: block i), where a
 * block alone reduces its vectors horizontally and divides in scalars. The same IEEE operations
 * per block (abs max, amax / 127, 1 / d, x * (1 / d) rounded to even, d * sum), so the same bits.
 * One thread, 1536 values: 0.383 us block by block, 0.189 so (docs/benchmarks.md). */
TGT INLINE void quantize16_q8(const float *x, int8_t *q, float *d, float *s, int32_t *sum)
{
    __m512 m[16];
    for (int i = 0; i < 16; i++)
        m[i] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i * QK)),
                             _mm512_abs_ps(_mm512_loadu_ps(x + i * QK + 16)));
    __m512 db = _mm512_div_ps(fold16x16(m, SIMD_FOLD_MAX), _mm512_set1_ps(127.0f));
    __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(db, _mm512_setzero_ps(), _CMP_GT_OQ),
                                    _mm512_set1_ps(1.0f), db);
    _Alignas(64) float idv[16];
    _mm512_store_ps(idv, id);
    __m512 t[16]; /* each block's int32 partial sums, as float bit patterns for the fold */
    for (int i = 0; i < 16; i += 2) {
        __m512i qv[4];
        for (int k = 0; k < 2; k++) {
            __m512 ib = _mm512_set1_ps(idv[i + k]);
            /* cvtps rounds half to even in the default MXCSR mode, as ref_quantize_q8 does */
            qv[2 * k] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + (i + k) * QK), ib));
            qv[2 * k + 1] =
                _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + (i + k) * QK + 16), ib));
            t[i + k] = _mm512_castsi512_ps(_mm512_add_epi32(qv[2 * k], qv[2 * k + 1]));
        }
        /* |q| <= 127: the saturating packs are exact; the permute undoes their lane order */
        __m512i p =
            _mm512_packs_epi16(_mm512_packs_epi32(qv[0], qv[1]), _mm512_packs_epi32(qv[2], qv[3]));
        p = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), p);
        _mm512_storeu_si512((void *)(q + i * QK), p);
    }
    __m512i is = _mm512_castps_si512(fold16x16(t, SIMD_FOLD_ADD_I32));
    _mm512_storeu_ps(d, db);
    _mm512_storeu_si512((void *)sum, is);
    _mm512_storeu_ps(s, _mm512_mul_ps(db, _mm512_cvtepi32_ps(is)));
}

TGT void avx512_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s,
                            int32_t *sum)
{
    int64_t nb = cols / QK, b = 0;
    for (; b + 16 <= nb; b += 16) quantize16_q8(x + b * QK, q + b * QK, d + b, s + b, sum + b);
    for (; b < nb; b++) {
        __m512 lo = _mm512_loadu_ps(x + b * QK), hi = _mm512_loadu_ps(x + b * QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        float db = amax / 127.0f;
        __m512 id = _mm512_set1_ps(db > 0 ? 1.0f / db : 0.0f);
        /* cvtps rounds half to even in the default MXCSR mode, as ref_quantize_q8 does */
        __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id));
        __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
        _mm_storeu_si128((__m128i *)(q + b * QK), _mm512_cvtepi32_epi8(qlo));
        _mm_storeu_si128((__m128i *)(q + b * QK + 16), _mm512_cvtepi32_epi8(qhi));
        int32_t isum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
        d[b] = db;
        sum[b] = isum;
        s[b] = db * (float)isum;
    }
}

TGT void avx512_block_sums(const float *x, int64_t cols, float *xs)
{
    for (int64_t b = 0; b < cols / QK; b++)
        xs[b] = _mm512_reduce_add_ps(
            _mm512_add_ps(_mm512_loadu_ps(x + b * QK), _mm512_loadu_ps(x + b * QK + 16)));
}

/* acc + the dot products of W's 4-byte groups with the 4 bytes at p, broadcast. Written as
 * asm so the broadcast is the instruction's own memory operand ({1to16}): one fused uop where
 * the compiler emits a vpbroadcastd and a vpdpbusd. */
TGT INLINE __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}

TGT INLINE void store_rows(const struct qpack *w, int64_t g, float *yt, __m512 v)
{
    int64_t r0 = g * QPACK_ROWS, left = w->rows - r0;
    if (left >= QPACK_ROWS) {
        _mm512_storeu_ps(yt + r0, v);
        return;
    }
    _mm512_mask_storeu_ps(yt + r0, (__mmask16)((1u << left) - 1), v);
}

/* The packed weight is one forward stream (each group's scales, then its quants, then the next
 * group's): prefetching a fixed distance ahead of the reads (pf_walk.h) keeps enough misses in
 * flight for DRAM bandwidth, which the out-of-order window alone does not (a decode reads each
 * byte once). Where the lines go depends on the core (enum cpu_prefetch, cpu_prefetch_best):
 * - L2 (prefetcht1): on Zen 4 an L1 prefetch held one of the core's few L1 miss buffers for a
 *   whole DRAM round trip, and a dozen of them in flight stalled the demand loads behind them.
 *   1-thread decode of the real model there: prefetcht0 -> prefetcht1 took tg128 from 62 to 104
 *   tok/s (Q8_0) and 95 to 147 (Q4_0); in a kernel-only loop over 140 MB, 12 -> 20 GB/s, of a 29
 *   GB/s plain read loop.
 * - L1 (prefetcht0): on Zen 5 the other way round. `quern bench --kernels --precision q8
 *   --batches 1 --threads 1` (the GEMV over weights from DRAM), GB/s, prefetcht1 / prefetcht0,
 *   two rounds with the walker: Q4_1 576x576 25.0-25.4 / 27.4-28.0, 1536x576 27.4-28.5 /
 *   30.7-30.8, Q8_0 49152x576 37.1-38.8 / 38.4-38.7 (of a 40 GB/s read loop); no software
 *   prefetch 15-17 (Q4_1). */
TGT INLINE void q8_tile(const struct qpack *w, int64_t g, const struct q8act *a, int t0,
                        const int T, const enum qpack_layout type, struct pf_walk *pw, const int L1,
                        float *y)
{
    const int64_t nb = w->nb;
    const int32_t off = type_offset(type);
    /* The token loops are unrolled before gcc's scalar replacement runs, so acc[] lives in
     * registers: left to the late unroller, it stayed an array in memory, stored back every
     * block (the __m512 type may alias the loads of a->d), 8 stores and 8 moves per 64
     * vpdpbusd. */
    __m512 acc[TMAX];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *sc = qpack_scales(w, g, b);
        __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc));
        __m512 mw = _mm512_setzero_ps();
        if (type == QPACK_Q4_1)
            mw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc + QPACK_ROWS)));
        const uint8_t *qs = qpack_quants(w, g, b);
        pf_walk_to(pw, qs + w->quant_bytes, L1);
        __m512i W[8];
        load_block(qs, type, W);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
            const int8_t *xb = a->q + (size_t)(t0 + t) * (size_t)a->cols + (size_t)b * QK;
            /* starting at -offset * sum(q) turns the unsigned weights back into signed ones */
            __m512i i0 = off ? _mm512_set1_epi32(-off * a->sum[tb]) : _mm512_setzero_si512();
            __m512i i1 = _mm512_setzero_si512();
            for (int c = 0; c < 8; c += 2) {
                i0 = dpbusd_bcast(i0, W[c], xb + 4 * c);
                i1 = dpbusd_bcast(i1, W[c + 1], xb + 4 * c + 4);
            }
            __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[tb]));
            acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), acc[t]);
            if (type == QPACK_Q4_1) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->s[tb]), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) store_rows(w, g, y + (size_t)(t0 + t) * (size_t)w->rows, acc[t]);
}

/* A register broadcast of the 4 activation bytes at p. Written as asm so that gcc cannot fold
 * it back into each vpdpbusd as a {1to16} memory operand: the point is one load for two. */
TGT INLINE __m512i bcast4(const int8_t *p)
{
    __m512i v;
    __asm__("vpbroadcastd %1, %0" : "=v"(v) : "m"(*(const int32_t *)p));
    return v;
}

#define T2MAX 4 /* most tokens per two-group tile */

/* A QPACK_Q5_0 pair is widened to bytes once, into WIDE_BLOCKS x 512 bytes a group on the stack
 * (64 KiB for the pair: rows up to 2048 wide), and the passes of tokens run the Q8_0 tile on that
 * with the five-bit offset (Q5_WIDE, this file's own layout): each pass unpacking the nibbles and
 * fifth bits again made a 512-token prefill of a Q5_0 file 0.92-0.95x as fast as the same file
 * read as Q8_0 (one thread), widened 0.99-1.01x. So the pair tile never reads five bits itself
 * (an instantiation less: this file's compile under the fuzz build's clang and sanitizers had
 * doubled with one).
 *
 * Four-bit pairs are widened too, for calls of WIDE_MIN_TOKENS or more (8+ passes: a prompt's
 * 64-token tasks on a CPU without AMX): their passes then load bytes where each unpacked the
 * nibbles again. `bench --kernels --precision q8 --threads 1 --isa avx512` on the AMX Xeon,
 * Q4_1, 64 tokens: 1.03-1.17x by shape; a 512-token prefill on the AVX-512 table, 2 threads,
 * 6 alternating rounds, each faster: Q4_1 1.04x, Q4_0 1.08x. At 8 tokens (2 passes) the widening
 * cost more than it saved (0.75-0.95x), at 16 about as much (docs/benchmarks.md). */
#define WIDE_BLOCKS     64
#define WIDE_MIN_TOKENS 32
#define Q5_WIDE         ((enum qpack_layout)(QPACK_Q5_0 + 1))
#define Q4_1_WIDE       ((enum qpack_layout)(QPACK_Q5_0 + 2))

/* A widened layout's stored bytes are w + offset, with Q4_1's minimum term after the sums. */
INLINE bool wide_type(enum qpack_layout type)
{
    return type == Q5_WIDE || type == Q4_1_WIDE;
}

INLINE int32_t tile2_offset(enum qpack_layout type)
{
    return type == Q4_1_WIDE ? 0 : type_offset(type);
}

/* Two groups (32 rows) by T tokens (T <= T2MAX), for calls of KERN_PAIR_MIN_TOKENS or more:
 * each activation broadcast feeds both groups' vpdpbusd. The one-group tile issues a load per
 * vpdpbusd (its {1to16} operand), and those loads bound it: `quern bench --kernels --precision
 * q8 --batches 64 --threads 1` on Zen 5 ran it at 59-62 % of the vpdpbusd peak, 66-73 % with
 * one broadcast per slice shared by all tokens (wrong sums, same arithmetic), and 59-62 % again
 * with register broadcasts but one per vpdpbusd. This tile: Q4_1 62-65 %, Q4_0 67-70 %, Q8_0
 * 67-68 %; with its float steps removed 80-85 %, and the rest is what they cost: a mul and an
 * fma (Q4_1 two) per 8 vpdpbusd, on the same two pipes. Six tokens (more registers) were no
 * faster. Each (row, token) still gets its block's exact integer sum and then q8_tile's float
 * steps, so the results are the same bits. */
TGT INLINE void q8_tile2(const struct qpack *w, int64_t g, const struct q8act *a, int t0,
                         const int T, const enum qpack_layout type, const uint8_t *const qbase[2],
                         size_t qstride, struct pf_walk *pw, int64_t pass, int64_t passes,
                         const int L1, float *y)
{
    /* Walking a fixed distance ahead, the first pass over a pair would stream it from DRAM with
     * a quarter of the arithmetic and the other passes none (a 16-token decode step ran 16 %
     * slower than with the one-group tile). The walker stays a pair ahead instead, the next
     * pair's bytes spread over this pair's passes: the memory works through every pass. */
    const size_t pair_bytes = 2 * w->group_bytes;
    const uint8_t *next_pair = w->data + (size_t)(g + 2) * w->group_bytes;
    const int64_t nb = w->nb;
    const int32_t off = tile2_offset(type);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc0[T2MAX], acc1[T2MAX];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc0[t] = acc1[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *sc0 = qpack_scales(w, g, b), *sc1 = qpack_scales(w, g + 1, b);
        const uint8_t *qs0 = qbase[0] + (size_t)b * qstride, *qs1 = qbase[1] + (size_t)b * qstride;
        pf_walk_share(pw, next_pair, pair_bytes, pass * nb + b, passes * nb, L1);
        __m512i i0[T2MAX], i1[T2MAX];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
            i0[t] = off ? _mm512_set1_epi32(-off * a->sum[tb]) : _mm512_setzero_si512();
            i1[t] = i0[t];
        }
        if (type == QPACK_Q8_0 || wide_type(type)) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m512i w0 = _mm512_load_si512(qs0 + 64 * c), w1 = _mm512_load_si512(qs1 + 64 * c);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    __m512i x =
                        bcast4(a->q + (size_t)(t0 + t) * (size_t)a->cols + (size_t)b * QK + 4 * c);
                    i0[t] = _mm512_dpbusd_epi32(i0[t], w0, x);
                    i1[t] = _mm512_dpbusd_epi32(i1[t], w1, x);
                }
            }
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i v0 = _mm512_load_si512(qs0 + 64 * c), v1 = _mm512_load_si512(qs1 + 64 * c);
                __m512i lo0 = _mm512_and_si512(v0, m4), lo1 = _mm512_and_si512(v1, m4);
                __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
                __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const int8_t *xb = a->q + (size_t)(t0 + t) * (size_t)a->cols + (size_t)b * QK;
                    __m512i xl = bcast4(xb + 4 * c), xh = bcast4(xb + 16 + 4 * c);
                    i0[t] = _mm512_dpbusd_epi32(i0[t], lo0, xl);
                    i1[t] = _mm512_dpbusd_epi32(i1[t], lo1, xl);
                    i0[t] = _mm512_dpbusd_epi32(i0[t], hi0, xh);
                    i1[t] = _mm512_dpbusd_epi32(i1[t], hi1, xh);
                }
            }
        }
        __m512 dw0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc0));
        __m512 dw1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc1));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
            __m512 dt = _mm512_set1_ps(a->d[tb]);
            acc0[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw0, dt), _mm512_cvtepi32_ps(i0[t]), acc0[t]);
            acc1[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw1, dt), _mm512_cvtepi32_ps(i1[t]), acc1[t]);
        }
        if (type == QPACK_Q4_1 || type == Q4_1_WIDE) {
            __m512 mw0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc0 + QPACK_ROWS)));
            __m512 mw1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc1 + QPACK_ROWS)));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m512 st = _mm512_set1_ps(a->s[(size_t)(t0 + t) * (size_t)nb + (size_t)b]);
                acc0[t] = _mm512_fmadd_ps(mw0, st, acc0[t]);
                acc1[t] = _mm512_fmadd_ps(mw1, st, acc1[t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        store_rows(w, g, y + (size_t)(t0 + t) * (size_t)w->rows, acc0[t]);
        store_rows(w, g + 1, y + (size_t)(t0 + t) * (size_t)w->rows, acc1[t]);
    }
}

/* Every pass of tokens [t0, t1) over the pair at g, whose quants are at qbase (qstride bytes a
 * block). */
TGT INLINE void q8_pair_passes(const struct qpack *w, int64_t g, const struct q8act *a, int t0,
                               int t1, const enum qpack_layout type, const uint8_t *const qbase[2],
                               size_t qstride, struct pf_walk *pw, const int L1, float *y)
{
    const int64_t passes = (t1 - t0 + T2MAX - 1) / T2MAX;
    int64_t pass = 0;
    for (int t = t0; t < t1; pass++) {
        int T = t1 - t < T2MAX ? t1 - t : T2MAX;
        switch (T) {
        case 4:
            q8_tile2(w, g, a, t, 4, type, qbase, qstride, pw, pass, passes, L1, y);
            break;
        case 3:
            q8_tile2(w, g, a, t, 3, type, qbase, qstride, pw, pass, passes, L1, y);
            break;
        case 2:
            q8_tile2(w, g, a, t, 2, type, qbase, qstride, pw, pass, passes, L1, y);
            break;
        default:
            q8_tile2(w, g, a, t, 1, type, qbase, qstride, pw, pass, passes, L1, y);
            break;
        }
        t += T;
    }
}

/* Group g's 4- or 5-bit quants (type) widened to a byte each in QPACK_Q8_0's chunk order, as
 * the wide tiles read them: w + 16 (Q5_WIDE, for Q5_0 and Q4_0) or Q4_1's w itself (Q4_1_WIDE);
 * out holds nb blocks of 512 bytes. */
TGT INLINE void widen_group(const struct qpack *w, int64_t g, const enum qpack_layout type,
                            uint8_t *out)
{
    for (int64_t b = 0; b < w->nb; b++) {
        __m512i W[8];
        load_block(qpack_quants(w, g, b), type, W);
        /* Q4_0's q (value q - 8) as five-bit's w + 16: q + 8, so both take one instantiation */
        if (type == QPACK_Q4_0)
            for (int c = 0; c < 8; c++) W[c] = _mm512_add_epi8(W[c], _mm512_set1_epi8(8));
        for (int c = 0; c < 8; c++) _mm512_store_si512(out + (size_t)b * 512 + 64 * c, W[c]);
    }
}

TGT INLINE void q8_groups(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                          int64_t gp, int t0, int t1, float *y, const enum qpack_layout type,
                          const int L1)
{
    struct pf_walk pw = pf_walk_start(w, g0, gp, L1);
    int64_t g = g0;
    /* five-bit pairs only widened (rows wider than that take the one-group tile); four-bit ones
     * widened where they fit, for calls of WIDE_MIN_TOKENS or more */
    const bool widen = type == QPACK_Q5_0 ||
                       (type != QPACK_Q8_0 && w->nb <= WIDE_BLOCKS && t1 - t0 >= WIDE_MIN_TOKENS);
    if (t1 - t0 >= KERN_PAIR_MIN_TOKENS && (type != QPACK_Q5_0 || w->nb <= WIDE_BLOCKS))
        for (; g + 2 <= g1; g += 2) {
            if (widen) {
                _Alignas(64) uint8_t wide[2][WIDE_BLOCKS * 512];
                widen_group(w, g, type, wide[0]);
                widen_group(w, g + 1, type, wide[1]);
                const uint8_t *const qbase[2] = {wide[0], wide[1]};
                const enum qpack_layout wt = type == QPACK_Q4_1 ? Q4_1_WIDE : Q5_WIDE;
                q8_pair_passes(w, g, a, t0, t1, wt, qbase, 512, &pw, L1, y);
            } else {
                const uint8_t *const qbase[2] = {qpack_quants(w, g, 0), qpack_quants(w, g + 1, 0)};
                q8_pair_passes(w, g, a, t0, t1, type, qbase, w->quant_bytes, &pw, L1, y);
            }
        }
    for (; g < g1; g++)
        for (int t = t0; t < t1;) {
            /* one pass over the group's weights per TMAX tokens: a remainder of 3, 5, 6 or 7
             * tokens is one tile, not 2-3 (each pass unpacks the weights again; a step that
             * verifies a draft of k tokens has k + 1) */
            int T = t1 - t < TMAX ? t1 - t : TMAX;
            switch (T) {
            case 8:
                q8_tile(w, g, a, t, 8, type, &pw, L1, y);
                break;
            case 7:
                q8_tile(w, g, a, t, 7, type, &pw, L1, y);
                break;
            case 6:
                q8_tile(w, g, a, t, 6, type, &pw, L1, y);
                break;
            case 5:
                q8_tile(w, g, a, t, 5, type, &pw, L1, y);
                break;
            case 4:
                q8_tile(w, g, a, t, 4, type, &pw, L1, y);
                break;
            case 3:
                q8_tile(w, g, a, t, 3, type, &pw, L1, y);
                break;
            case 2:
                q8_tile(w, g, a, t, 2, type, &pw, L1, y);
                break;
            default:
                q8_tile(w, g, a, t, 1, type, &pw, L1, y);
                break;
            }
            t += T;
        }
}

TGT INLINE void q8_types(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                         int64_t gp, int t0, int t1, float *y, const int L1)
{
    switch (w->layout) {
    case QPACK_Q8_0:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q8_0, L1);
        break;
    case QPACK_Q4_0:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_0, L1);
        break;
    case QPACK_Q4_1:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_1, L1);
        break;
    case QPACK_Q5_0:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q5_0, L1);
        break;
    default:
        break;
    }
}

TGT void avx512_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                          int64_t gp, int t0, int t1, float *y)
{
    q8_types(w, a, g0, g1, gp, t0, t1, y, 0);
}

TGT void avx512_matmul_q8_l1(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                             int64_t gp, int t0, int t1, float *y)
{
    q8_types(w, a, g0, g1, gp, t0, t1, y, 1);
}

/* pshufb control moving byte j of every dword to its low byte, zeroing the rest */
TGT INLINE __m512i byte_sel(int j)
{
    const int z = (int)0x80808000;
    return _mm512_set4_epi32(z | (12 + j), z | (8 + j), z | (4 + j), z | j);
}

#define F32_TMAX 4

TGT INLINE void f32_tile(const struct qpack *w, int64_t g, const float *x, const float *xs, int t0,
                         const int T, const enum qpack_layout type, struct pf_walk *pw, float *y)
{
    const int64_t nb = w->nb, cols = w->cols;
    const __m512i offv = _mm512_set1_epi32(type_offset(type));
    __m512 acc[F32_TMAX];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *sc = qpack_scales(w, g, b);
        __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc));
        const uint8_t *qs = qpack_quants(w, g, b);
        pf_walk_to(pw, qs + w->quant_bytes, 0);
        __m512i W[8];
        load_block(qs, type, W);
        __m512 part[F32_TMAX][4];
        for (int t = 0; t < T; t++)
            for (int j = 0; j < 4; j++) part[t][j] = _mm512_setzero_ps();
        for (int c = 0; c < 8; c++)
            for (int j = 0; j < 4; j++) {
                __m512i wi = _mm512_shuffle_epi8(W[c], byte_sel(j));
                if (type != QPACK_Q4_1) wi = _mm512_sub_epi32(wi, offv);
                __m512 wf = _mm512_cvtepi32_ps(wi);
                for (int t = 0; t < T; t++) {
                    const float *xt = x + (size_t)(t0 + t) * (size_t)cols + b * QK;
                    part[t][j] = _mm512_fmadd_ps(wf, _mm512_set1_ps(xt[4 * c + j]), part[t][j]);
                }
            }
        __m512 mw = _mm512_setzero_ps();
        if (type == QPACK_Q4_1)
            mw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc + QPACK_ROWS)));
        for (int t = 0; t < T; t++) {
            __m512 sum = _mm512_add_ps(_mm512_add_ps(part[t][0], part[t][1]),
                                       _mm512_add_ps(part[t][2], part[t][3]));
            acc[t] = _mm512_fmadd_ps(dw, sum, acc[t]);
            if (type == QPACK_Q4_1)
                acc[t] = _mm512_fmadd_ps(
                    mw, _mm512_set1_ps(xs[(size_t)(t0 + t) * (size_t)nb + (size_t)b]), acc[t]);
        }
    }
    for (int t = 0; t < T; t++) store_rows(w, g, y + (size_t)(t0 + t) * (size_t)w->rows, acc[t]);
}

TGT INLINE void f32_groups(const struct qpack *w, const float *x, const float *xs, int64_t g0,
                           int64_t g1, int64_t gp, int t0, int t1, float *y,
                           const enum qpack_layout type)
{
    struct pf_walk pw = pf_walk_start(w, g0, gp, 0);
    for (int64_t g = g0; g < g1; g++) {
        int t = t0;
        for (; t + 4 <= t1; t += 4) f32_tile(w, g, x, xs, t, 4, type, &pw, y);
        /* the rest in one pass over the weights (as q8_groups) */
        if (t + 3 == t1)
            f32_tile(w, g, x, xs, t, 3, type, &pw, y);
        else if (t + 2 == t1)
            f32_tile(w, g, x, xs, t, 2, type, &pw, y);
        else if (t < t1)
            f32_tile(w, g, x, xs, t, 1, type, &pw, y);
    }
}

TGT void avx512_matmul_f32(const struct qpack *w, const float *x, const float *xs, int64_t g0,
                           int64_t g1, int64_t gp, int t0, int t1, float *y)
{
    switch (w->layout) {
    case QPACK_Q8_0:
        f32_groups(w, x, xs, g0, g1, gp, t0, t1, y, QPACK_Q8_0);
        break;
    case QPACK_Q4_0:
        f32_groups(w, x, xs, g0, g1, gp, t0, t1, y, QPACK_Q4_0);
        break;
    case QPACK_Q4_1:
        f32_groups(w, x, xs, g0, g1, gp, t0, t1, y, QPACK_Q4_1);
        break;
    case QPACK_Q5_0:
        f32_groups(w, x, xs, g0, g1, gp, t0, t1, y, QPACK_Q5_0);
        break;
    default:
        break;
    }
}
