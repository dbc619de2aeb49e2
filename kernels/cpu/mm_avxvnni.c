/* The Q8 matmul for x86-64 CPUs with AVX-VNNI but no AVX-512 (Intel Alder Lake and later client
 * cores, Xeon 6 E-cores; also forced on any CPU with both: QUERN_CPU_ISA=avxvnni). The AVX2 path
 * multiplies 4-bit weights by vpmaddubsw into int16 pairs, widens them by vpmaddwd and adds
 * (Q8_0 also needs its sign trick): three instructions per 32 products. vpdpbusd on 256 bits
 * (the VEX form AVX-VNNI adds) is one, straight into int32. Every other kernel is the AVX2 path's.
 *
 * A tile is a whole 16-row group (its two 8-row halves) by T tokens: each 4-byte activation
 * broadcast feeds both halves, and a decode's GEMV is the T = 1 tile. The weights are unsigned
 * bytes (nibbles; w + 128 for Q8_0), so each (row, token) sum starts at -offset * sum(x) of the
 * block as in mm_avx512.c; the integer sums are exact and the float steps per block those of
 * ref_dot_q8 (mul, then fma), so the results equal the reference bit for bit. */
#include <immintrin.h>

#include "kern.h"
#include "mm256.h"
#include "pf_walk.h"

#define TGT    __attribute__((target("avx2,fma,f16c,avxvnni")))
#define INLINE static inline __attribute__((always_inline))
#define HALF   MM256_HALF
#define TMAX   3 /* most tokens per tile */
#define PF_L1  0 /* prefetch into L2, as the AVX2 path (mm_avx2.c) */

/* T tokens against both halves of group g, pass `pass` of `passes` over it. One pass (a GEMV,
 * up to TMAX tokens) walks a fixed distance ahead of its reads; with more, the walker stays a
 * group ahead, the next group's lines spread over this group's passes (as q8_tile2 in
 * mm_avx512.c), so the memory works through every pass and not the first alone. */
TGT INLINE void q8v_tile(const struct qpack *w, int64_t g, const struct q8act *a, int t0,
                         const int T, const enum qpack_layout type, struct pf_walk *pw,
                         int64_t pass, int64_t passes, float *y)
{
    const int64_t nb = w->nb;
    const size_t cols = (size_t)a->cols;
    const int32_t off = mm256_type_offset(type);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc0[TMAX], acc1[TMAX];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *sc = qpack_scales(w, g, b);
        const uint8_t *qs = qpack_quants(w, g, b);
        if (passes == 1)
            pf_walk_to(pw, qs + w->quant_bytes, PF_L1);
        else
            pf_walk_share(pw, w->data + (size_t)(g + 1) * w->group_bytes, w->group_bytes,
                          pass * nb + b, passes * nb, PF_L1);
        const int8_t *xb = a->q + (size_t)t0 * cols + (size_t)b * QK;
        __m256i i0[TMAX], i1[TMAX];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
            i0[t] = off ? _mm256_set1_epi32(-off * a->sum[tb]) : _mm256_setzero_si256();
            i1[t] = i0[t];
        }
        if (type == QPACK_Q8_0) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m256i w0 = _mm256_load_si256((const __m256i *)(qs + 64 * c));
                __m256i w1 = _mm256_load_si256((const __m256i *)(qs + 64 * c + 32));
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    __m256i x = mm256_bcast4(xb + (size_t)t * cols + 4 * c);
                    i0[t] = _mm256_dpbusd_avx_epi32(i0[t], w0, x);
                    i1[t] = _mm256_dpbusd_avx_epi32(i1[t], w1, x);
                }
            }
        } else {
            /* chunk c: the low nibbles are elements 4c..4c+3, the high ones 16+4c..16+4c+3 */
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m256i v0 = _mm256_load_si256((const __m256i *)(qs + 64 * c));
                __m256i v1 = _mm256_load_si256((const __m256i *)(qs + 64 * c + 32));
                __m256i lo0 = _mm256_and_si256(v0, m4), lo1 = _mm256_and_si256(v1, m4);
                __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4);
                __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
                if (type == QPACK_Q5_0) {
                    lo0 = _mm256_or_si256(lo0, mm256_fifth_bits(qs, c, 0));
                    lo1 = _mm256_or_si256(lo1, mm256_fifth_bits(qs, c, 1));
                    hi0 = _mm256_or_si256(hi0, mm256_fifth_bits(qs, c + 4, 0));
                    hi1 = _mm256_or_si256(hi1, mm256_fifth_bits(qs, c + 4, 1));
                }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const int8_t *xt = xb + (size_t)t * cols;
                    __m256i xl = mm256_bcast4(xt + 4 * c), xh = mm256_bcast4(xt + 16 + 4 * c);
                    i0[t] = _mm256_dpbusd_avx_epi32(i0[t], lo0, xl);
                    i1[t] = _mm256_dpbusd_avx_epi32(i1[t], lo1, xl);
                    i0[t] = _mm256_dpbusd_avx_epi32(i0[t], hi0, xh);
                    i1[t] = _mm256_dpbusd_avx_epi32(i1[t], hi1, xh);
                }
            }
        }
        __m256 dw0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)sc));
        __m256 dw1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sc + HALF)));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 dt = _mm256_set1_ps(a->d[(size_t)(t0 + t) * (size_t)nb + (size_t)b]);
            acc0[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw0, dt), _mm256_cvtepi32_ps(i0[t]), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw1, dt), _mm256_cvtepi32_ps(i1[t]), acc1[t]);
        }
        if (type == QPACK_Q4_1) {
            const uint16_t *m = sc + QPACK_ROWS;
            __m256 mw0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)m));
            __m256 mw1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(m + HALF)));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256 st = _mm256_set1_ps(a->s[(size_t)(t0 + t) * (size_t)nb + (size_t)b]);
                acc0[t] = _mm256_fmadd_ps(mw0, st, acc0[t]);
                acc1[t] = _mm256_fmadd_ps(mw1, st, acc1[t]);
            }
        }
    }
    int valid0 = mm256_half_rows(w, g, 0), valid1 = mm256_half_rows(w, g, 1);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)(t0 + t) * (size_t)w->rows;
        mm256_store_half(yt, g * QPACK_ROWS, valid0, acc0[t]);
        if (valid1) mm256_store_half(yt, g * QPACK_ROWS + HALF, valid1, acc1[t]);
    }
}

TGT INLINE void q8v_groups(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                           int64_t gp, int t0, int t1, float *y, const enum qpack_layout type)
{
    struct pf_walk pw = pf_walk_start(w, g0, gp, PF_L1);
    const int64_t passes = (t1 - t0 + TMAX - 1) / TMAX;
    for (int64_t g = g0; g < g1; g++) {
        int64_t pass = 0;
        for (int t = t0; t < t1; pass++) {
            /* the rest in one pass (as mm_avx512.c) */
            int T = t1 - t < TMAX ? t1 - t : TMAX;
            switch (T) {
            case 3:
                q8v_tile(w, g, a, t, 3, type, &pw, pass, passes, y);
                break;
            case 2:
                q8v_tile(w, g, a, t, 2, type, &pw, pass, passes, y);
                break;
            default:
                q8v_tile(w, g, a, t, 1, type, &pw, pass, passes, y);
                break;
            }
            t += T;
        }
    }
}

TGT void avxvnni_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                           int64_t gp, int t0, int t1, float *y)
{
    switch (w->layout) {
    case QPACK_Q8_0:
        q8v_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q8_0);
        break;
    case QPACK_Q4_0:
        q8v_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_0);
        break;
    case QPACK_Q4_1:
        q8v_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_1);
        break;
    case QPACK_Q5_0:
        q8v_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q5_0);
        break;
    default:
        break;
    }
}
