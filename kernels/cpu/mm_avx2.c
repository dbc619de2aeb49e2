/* AVX2 matmul kernels over the qpack layout (qpack.h), for x86-64 CPUs without AVX-512.
 *
 * The same design as mm_avx512.c on 8-row halves of each 16-row group (a 256-bit register holds
 * one 4-element slice of 8 rows). There is no vpdpbusd here: 4-bit weights use vpmaddubsw
 * (unsigned nibble x signed activation, pairs into int16: |sum of 8| <= 8 * 2 * 15 * 127 fits)
 * then vpmaddwd to int32; Q8_0 weights are turned back to signed and use the sign trick
 * (|w| x sign(w) * x) so no pair can saturate. The integer sums are exact and the float steps
 * per block are those of ref_dot_q8: Q8 results equal the reference bit for bit. */
#include <immintrin.h>
#include <string.h>

#include "kern.h"
#include "mm256.h"
#include "pf_walk.h"
#include "simd256.h"

#define TGT    __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))
#define HALF   MM256_HALF

/* Block b's 32 values quantized with 1 / d = inv (rounded to even, as ref_quantize_q8) into
 * q; returns the 8 partial sums of the quants. */
TGT INLINE __m256i quantize_block(const float *x, __m256 inv, int8_t *q)
{
    __m256i qi[4];
    /* cvtps rounds half to even in the default MXCSR mode, as ref_quantize_q8 does */
    for (int i = 0; i < 4; i++)
        qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inv));
    /* |q| <= 127: the saturating packs are exact; the permute undoes their lane order */
    __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
}

/* 8 blocks at once: their maxima, scales and sums one vector each (lane i: block i), where a
 * block alone reduces horizontally and divides in scalars; the same IEEE operations per block,
 * so the same bits. */
TGT INLINE void quantize8_q8(const float *x, int8_t *q, float *d, float *s, int32_t *sum)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m[8];
    for (int b = 0; b < 8; b++) {
        const float *xb = x + b * QK;
        __m256 a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb), absmask),
                                 _mm256_and_ps(_mm256_loadu_ps(xb + 8), absmask));
        __m256 c = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + 16), absmask),
                                 _mm256_and_ps(_mm256_loadu_ps(xb + 24), absmask));
        m[b] = _mm256_max_ps(a, c);
    }
    __m256 db = _mm256_div_ps(fold8x8(m, SIMD_FOLD_MAX), _mm256_set1_ps(127.0f));
    __m256 id = _mm256_and_ps(_mm256_cmp_ps(db, _mm256_setzero_ps(), _CMP_GT_OQ),
                              _mm256_div_ps(_mm256_set1_ps(1.0f), db));
    _Alignas(32) float idv[8];
    _mm256_store_ps(idv, id);
    __m256 t[8]; /* each block's int32 partial sums, as float bit patterns for the fold */
    for (int b = 0; b < 8; b++)
        t[b] = _mm256_castsi256_ps(quantize_block(x + b * QK, _mm256_set1_ps(idv[b]), q + b * QK));
    __m256i is = _mm256_castps_si256(fold8x8(t, SIMD_FOLD_ADD_I32));
    _mm256_storeu_ps(d, db);
    _mm256_storeu_si256((__m256i *)sum, is);
    _mm256_storeu_ps(s, _mm256_mul_ps(db, _mm256_cvtepi32_ps(is)));
}

TGT void avx2_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t nb = cols / QK, b = 0;
    for (; b + 8 <= nb; b += 8) quantize8_q8(x + b * QK, q + b * QK, d + b, s + b, sum + b);
    for (; b < nb; b++) {
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + b * QK + 8 * i), absmask));
        float db = hmax8(m) / 127.0f;
        __m256i total =
            quantize_block(x + b * QK, _mm256_set1_ps(db > 0 ? 1.0f / db : 0.0f), q + b * QK);
        int32_t isum = hsum8i(total);
        d[b] = db;
        sum[b] = isum;
        s[b] = db * (float)isum;
    }
}

TGT void avx2_block_sums(const float *x, int64_t cols, float *xs)
{
    for (int64_t b = 0; b < cols / QK; b++) {
        const float *p = x + b * QK;
        __m256 s01 = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
        __m256 s23 = _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24));
        xs[b] = hsum8(_mm256_add_ps(s01, s23));
    }
}

/* The 8 operand registers of half h of a 4-bit block: W[c] = elements 4c..4c+3 of 8 rows. */
TGT INLINE void load_nibbles(const uint8_t *qs, int h, __m256i W[8])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_load_si256((const __m256i *)(qs + 64 * c + 32 * h));
        W[c] = _mm256_and_si256(v, m4);
        W[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
}

#define TMAX 4

/* Software prefetch a fixed distance ahead of the weight stream (pf_walk.h), into L2 (see
 * mm_avx512.c; the AVX2 path on Zen 4, 1 thread: tg128 Q8_0 60 -> 94 tok/s, Q4_0 86 -> 126 with
 * prefetcht1). */
#define PF_L1 0

/* An empty asm that takes v in a register: gcc may not move v's sum past it. Integer adds are
 * associative, and gcc would otherwise regroup a tile's chunk sums into a tree whose products,
 * all live at once, spill (a reordering that changes no bit but put the T = 4 loop's products on
 * the stack). */
TGT INLINE void keep_order(__m256i *v)
{
    __asm__("" : "+x"(*v));
}

/* T tokens against half h of group g. The token loop sits inside the loop over a block's 4-byte
 * chunks: each chunk's weight registers are made once and used by every token while only the
 * tokens' partial sums stay live (T int16/int32 sums and T float accumulators: 14 of the 16 ymm
 * registers at T = 4). Holding all 8 of a block's weight registers across the tokens instead
 * (16 for Q8_0, with the signs) spilled them and the accumulators to the stack every block. The
 * integer sums are exact, so the new order of their terms changes no bit. */
TGT INLINE void q8_tile(const struct qpack *w, int64_t g, int h, const struct q8act *a, int t0,
                        const int T, const enum qpack_layout type, struct pf_walk *pw, float *y)
{
    int valid = mm256_half_rows(w, g, h);
    if (!valid) return;
    const int64_t nb = w->nb;
    const size_t cols = (size_t)a->cols;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80),
                  m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[TMAX];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *sc = qpack_scales(w, g, b) + HALF * h;
        const uint8_t *qb = qpack_quants(w, g, b), *qs = qb + 32 * h;
        pf_walk_step(pw, w, g, h * nb + b, 2 * nb, PF_L1);
        const int8_t *xb = a->q + (size_t)t0 * cols + (size_t)b * QK;
        __m256i isum[TMAX];
        if (type == QPACK_Q8_0) {
            for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                __m256i sw =
                    _mm256_xor_si256(_mm256_load_si256((const __m256i *)(qs + 64 * c)), flip);
                __m256i aw = _mm256_abs_epi8(sw);
                for (int t = 0; t < T; t++) {
                    __m256i p = _mm256_maddubs_epi16(
                        aw, _mm256_sign_epi8(mm256_bcast4(xb + (size_t)t * cols + 4 * c), sw));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
                    keep_order(&isum[t]);
                }
            }
        } else {
            /* chunk c: the low nibbles are elements 4c..4c+3, the high ones 16+4c..16+4c+3.
             * A pair of products fits int16 8 times over for 4-bit weights (8 x 3810), 4 times
             * for 5-bit ones (4 x 7874): those widen to int32 every two chunks. */
            __m256i p[TMAX];
            for (int t = 0; t < T; t++) p[t] = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_load_si256((const __m256i *)(qs + 64 * c));
                __m256i lo = _mm256_and_si256(v, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (type == QPACK_Q5_0) {
                    lo = _mm256_or_si256(lo, mm256_fifth_bits(qb, c, h));
                    hi = _mm256_or_si256(hi, mm256_fifth_bits(qb, c + 4, h));
                }
                for (int t = 0; t < T; t++) {
                    const int8_t *xt = xb + (size_t)t * cols;
                    p[t] =
                        _mm256_add_epi16(p[t], _mm256_maddubs_epi16(lo, mm256_bcast4(xt + 4 * c)));
                    p[t] = _mm256_add_epi16(
                        p[t], _mm256_maddubs_epi16(hi, mm256_bcast4(xt + 16 + 4 * c)));
                    keep_order(&p[t]);
                    if (type == QPACK_Q5_0 && c == 1) {
                        isum[t] = _mm256_madd_epi16(p[t], ones);
                        p[t] = _mm256_setzero_si256();
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                __m256i last = _mm256_madd_epi16(p[t], ones);
                isum[t] = type == QPACK_Q5_0 ? _mm256_add_epi32(isum[t], last) : last;
                if (type == QPACK_Q4_0 || type == QPACK_Q5_0) {
                    size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
                    isum[t] = _mm256_add_epi32(
                        isum[t], _mm256_set1_epi32(-mm256_type_offset(type) * a->sum[tb]));
                }
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)sc));
        for (int t = 0; t < T; t++) {
            size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
            __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a->d[tb]));
            acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
        if (type == QPACK_Q4_1) {
            __m256 mw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sc + QPACK_ROWS)));
            for (int t = 0; t < T; t++) {
                size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
                acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->s[tb]), acc[t]);
            }
        }
    }
    for (int t = 0; t < T; t++)
        mm256_store_half(y + (size_t)(t0 + t) * (size_t)w->rows, g * QPACK_ROWS + HALF * h, valid,
                         acc[t]);
}

/* One token against both 8-row halves of a group in one pass (a decode's GEMV): each 4-byte
 * broadcast of the token serves both halves, and the group's weights are walked once. Per half
 * the integer sums are the same exact values and the float steps per block those of q8_tile.
 * The kernel alone, one thread, 1536x576: 1.1-1.5x q8_tile's GB/s with the weight in cache,
 * 1.04-1.13x streamed from DRAM. */
TGT INLINE void q8_gemv_group(const struct qpack *w, int64_t g, const struct q8act *a, int t,
                              struct pf_walk *pw, const enum qpack_layout type, float *y)
{
    const int64_t nb = w->nb;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80),
                  m4 = _mm256_set1_epi8(0x0f);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *sc = qpack_scales(w, g, b);
        const uint8_t *qs = qpack_quants(w, g, b);
        pf_walk_to(pw, qs + w->quant_bytes, PF_L1);
        size_t tb = (size_t)t * (size_t)nb + (size_t)b;
        const int8_t *xb = a->q + (size_t)t * (size_t)a->cols + (size_t)b * QK;
        __m256i s0, s1;
        if (type == QPACK_Q8_0) {
            s0 = _mm256_setzero_si256();
            s1 = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                __m256i x = mm256_bcast4(xb + 4 * c);
                __m256i w0 =
                    _mm256_xor_si256(_mm256_load_si256((const __m256i *)(qs + 64 * c)), flip);
                __m256i w1 =
                    _mm256_xor_si256(_mm256_load_si256((const __m256i *)(qs + 64 * c + 32)), flip);
                __m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(x, w0));
                __m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(x, w1));
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, ones));
                s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, ones));
            }
        } else {
            /* chunk c: the low nibbles are elements 4c..4c+3, the high ones 16+4c..16+4c+3
             * (5-bit weights widen to int32 every two chunks, as in q8_tile) */
            __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
            __m256i f0 = _mm256_setzero_si256(), f1 = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                __m256i xl = mm256_bcast4(xb + 4 * c), xh = mm256_bcast4(xb + 16 + 4 * c);
                __m256i v0 = _mm256_load_si256((const __m256i *)(qs + 64 * c));
                __m256i v1 = _mm256_load_si256((const __m256i *)(qs + 64 * c + 32));
                __m256i l0 = _mm256_and_si256(v0, m4), l1 = _mm256_and_si256(v1, m4);
                __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4);
                __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
                if (type == QPACK_Q5_0) {
                    l0 = _mm256_or_si256(l0, mm256_fifth_bits(qs, c, 0));
                    l1 = _mm256_or_si256(l1, mm256_fifth_bits(qs, c, 1));
                    h0 = _mm256_or_si256(h0, mm256_fifth_bits(qs, c + 4, 0));
                    h1 = _mm256_or_si256(h1, mm256_fifth_bits(qs, c + 4, 1));
                }
                p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(l0, xl));
                p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(l1, xl));
                p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(h0, xh));
                p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(h1, xh));
                if (type == QPACK_Q5_0 && c == 1) {
                    f0 = _mm256_madd_epi16(p0, ones);
                    f1 = _mm256_madd_epi16(p1, ones);
                    p0 = p1 = _mm256_setzero_si256();
                }
            }
            s0 = _mm256_madd_epi16(p0, ones);
            s1 = _mm256_madd_epi16(p1, ones);
            if (type == QPACK_Q5_0) {
                s0 = _mm256_add_epi32(s0, f0);
                s1 = _mm256_add_epi32(s1, f1);
            }
            if (type == QPACK_Q4_0 || type == QPACK_Q5_0) {
                __m256i o = _mm256_set1_epi32(-mm256_type_offset(type) * a->sum[tb]);
                s0 = _mm256_add_epi32(s0, o);
                s1 = _mm256_add_epi32(s1, o);
            }
        }
        __m256 dx = _mm256_set1_ps(a->d[tb]);
        __m256 d0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)sc));
        __m256 d1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sc + HALF)));
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(d0, dx), _mm256_cvtepi32_ps(s0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_mul_ps(d1, dx), _mm256_cvtepi32_ps(s1), acc1);
        if (type == QPACK_Q4_1) {
            __m256 xs = _mm256_set1_ps(a->s[tb]);
            const uint16_t *m = sc + QPACK_ROWS;
            acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)m)), xs, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(m + HALF))), xs,
                                   acc1);
        }
    }
    float *yt = y + (size_t)t * (size_t)w->rows;
    mm256_store_half(yt, g * QPACK_ROWS, HALF, acc0);
    mm256_store_half(yt, g * QPACK_ROWS + HALF, HALF, acc1);
}

TGT INLINE void q8_groups(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                          int64_t gp, int t0, int t1, float *y, const enum qpack_layout type)
{
    struct pf_walk pw = pf_walk_start(w, g0, gp, PF_L1);
    for (int64_t g = g0; g < g1; g++) {
        if (t1 - t0 == 1 && mm256_half_rows(w, g, 1) == HALF) {
            q8_gemv_group(w, g, a, t0, &pw, type, y);
            continue;
        }
        for (int h = 0; h < 2; h++) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) q8_tile(w, g, h, a, t, 4, type, &pw, y);
            /* the rest in one pass over the weights (as mm_avx512.c) */
            if (t + 3 == t1)
                q8_tile(w, g, h, a, t, 3, type, &pw, y);
            else if (t + 2 == t1)
                q8_tile(w, g, h, a, t, 2, type, &pw, y);
            else if (t < t1)
                q8_tile(w, g, h, a, t, 1, type, &pw, y);
        }
    }
}

TGT void avx2_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                        int64_t gp, int t0, int t1, float *y)
{
    switch (w->layout) {
    case QPACK_Q8_0:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q8_0);
        break;
    case QPACK_Q4_0:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_0);
        break;
    case QPACK_Q4_1:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_1);
        break;
    case QPACK_Q5_0:
        q8_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q5_0);
        break;
    default:
        break;
    }
}

/* pshufb control moving byte j of every dword to its low byte, zeroing the rest */
TGT INLINE __m256i byte_sel(int j)
{
    const int z = (int)0x80808000;
    return _mm256_setr_epi32(z | j, z | (4 + j), z | (8 + j), z | (12 + j), z | j, z | (4 + j),
                             z | (8 + j), z | (12 + j));
}

#define F32_TMAX 2

/* The float path, as in mm_avx512.c: four partial sums by k mod 4 per row and token. */
TGT INLINE void f32_tile(const struct qpack *w, int64_t g, int h, const float *x, const float *xs,
                         int t0, const int T, const enum qpack_layout type, struct pf_walk *pw,
                         float *y)
{
    int valid = mm256_half_rows(w, g, h);
    if (!valid) return;
    const int64_t nb = w->nb, cols = w->cols;
    const __m256i offv = _mm256_set1_epi32(mm256_type_offset(type));
    __m256 acc[F32_TMAX];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *sc = qpack_scales(w, g, b) + HALF * h;
        const uint8_t *qs = qpack_quants(w, g, b);
        pf_walk_step(pw, w, g, h * nb + b, 2 * nb, PF_L1);
        __m256 part[F32_TMAX][4];
        for (int t = 0; t < T; t++)
            for (int j = 0; j < 4; j++) part[t][j] = _mm256_setzero_ps();
        __m256i W[8];
        if (type == QPACK_Q8_0)
            for (int c = 0; c < 8; c++)
                W[c] = _mm256_load_si256((const __m256i *)(qs + 64 * c + 32 * h));
        else
            load_nibbles(qs, h, W);
        if (type == QPACK_Q5_0)
            for (int c = 0; c < 8; c++) W[c] = _mm256_or_si256(W[c], mm256_fifth_bits(qs, c, h));
        for (int c = 0; c < 8; c++)
            for (int j = 0; j < 4; j++) {
                __m256i wi = _mm256_shuffle_epi8(W[c], byte_sel(j));
                if (type != QPACK_Q4_1) wi = _mm256_sub_epi32(wi, offv);
                __m256 wf = _mm256_cvtepi32_ps(wi);
                for (int t = 0; t < T; t++) {
                    const float *xt = x + (size_t)(t0 + t) * (size_t)cols + b * QK;
                    part[t][j] =
                        _mm256_fmadd_ps(wf, _mm256_broadcast_ss(xt + 4 * c + j), part[t][j]);
                }
            }
        __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)sc));
        __m256 mw = _mm256_setzero_ps();
        if (type == QPACK_Q4_1)
            mw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sc + QPACK_ROWS)));
        for (int t = 0; t < T; t++) {
            __m256 sum = _mm256_add_ps(_mm256_add_ps(part[t][0], part[t][1]),
                                       _mm256_add_ps(part[t][2], part[t][3]));
            acc[t] = _mm256_fmadd_ps(dw, sum, acc[t]);
            if (type == QPACK_Q4_1)
                acc[t] = _mm256_fmadd_ps(
                    mw, _mm256_broadcast_ss(xs + (size_t)(t0 + t) * (size_t)nb + (size_t)b),
                    acc[t]);
        }
    }
    for (int t = 0; t < T; t++)
        mm256_store_half(y + (size_t)(t0 + t) * (size_t)w->rows, g * QPACK_ROWS + HALF * h, valid,
                         acc[t]);
}

TGT INLINE void f32_groups(const struct qpack *w, const float *x, const float *xs, int64_t g0,
                           int64_t g1, int64_t gp, int t0, int t1, float *y,
                           const enum qpack_layout type)
{
    struct pf_walk pw = pf_walk_start(w, g0, gp, PF_L1);
    for (int64_t g = g0; g < g1; g++)
        for (int h = 0; h < 2; h++) {
            int t = t0;
            for (; t + 2 <= t1; t += 2) f32_tile(w, g, h, x, xs, t, 2, type, &pw, y);
            if (t < t1) f32_tile(w, g, h, x, xs, t, 1, type, &pw, y);
        }
}

TGT void avx2_matmul_f32(const struct qpack *w, const float *x, const float *xs, int64_t g0,
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
