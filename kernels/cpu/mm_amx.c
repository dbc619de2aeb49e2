/* AMX matmul kernel over the qpack layout (qpack.h): tokens 16 at a time on the tile unit.
 *
 * A qpack block of a 16-row group is already in the order AMX's "B" operand wants: chunk c (64
 * bytes) holds elements 4c..4c+3 of each of the 16 rows, so the block's 8 chunks are an 8 x 64
 * byte tile (K = 32). They are widened once per call to signed bytes (the weights' own values:
 * the offsets of the unsigned layouts taken off), a group's blocks AMX_WIDEN at a time into a
 * stack buffer that every 16-token set of the call then reads (16 blocks, 8 KiB: a whole
 * 1536-wide group, 24 KiB beside 24 KiB of activations, had made ffn_down 7-15 % slower). The "A"
 * operand is 16 tokens' 32 activation bytes of the block, read in place (row stride: the activation
 * row). One tdpbssd gives the exact integer dot products of 16 tokens x 16 rows; they are stored,
 * and the AVX-512 kernel's float steps (mm_avx512.c, q8_tile) follow in its order: fma(d_w * d_x,
 * float(isum), acc), then Q4_1's fma(m_w, s_x, acc). Integer sums are exact, so each output is the
 * AVX-512 kernel's bits (the reference's), and a token's result does not depend on which kernel ran
 * it: calls of fewer than AMX_MIN_TOKENS tokens run on the AVX-512 kernel. A call's last set of
 * fewer than 16 tokens runs on tiles of that many rows (tiles 4-6), so the call reads its weights
 * in one pass: a 40-token prompt, which had run 32 tokens here and 8 in a second pass of the
 * AVX-512 kernel over the same weights, prefills 1.04-1.23x as fast (2 threads, 3 rounds;
 * 120 and 500 tokens within noise).
 *
 * What it buys, and what bounds it (2 vCPUs of a Sapphire Rapids class Xeon, 2026-12-06,
 * docs/benchmarks.md): one tdpbssd of K = 32 takes 4.7 ns (3.5 TOP/s a thread), a block's whole
 * tile work (zero, two loads, the product, the store) 8.7 ns, and its float steps for 16 tokens
 * (3-4 vector ops a token) 9-11 ns; the two do not overlap (a harness running both took their
 * sum, whether they alternated block by block or in runs of 2-32 blocks, and whether or not the
 * float steps read what the tiles had stored). So a block of 16 x 16 x 32 costs ~20-25 ns here
 * against ~45 ns in the AVX-512 kernel: `quern bench --kernels --precision q8 --threads 1`, 64
 * tokens, 1.6-1.8x (Q4_1 560-680 GOP/s, Q8_0 690-740), and a 512-token prompt 1.12-1.14x in
 * place, where attention is a quarter of it. The float steps per block are what is left: they
 * stay as long as each 32-block has its own scales.
 *
 * The tile configuration is loaded at each call and released at its end, so a thread holds AMX
 * state only inside this kernel. */
#include <immintrin.h>
#include <string.h>

#include "kern.h"
#include "pf_walk.h"
#include "qpack512.h"

#define TGT                                                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,"                    \
                          "amx-tile,amx-int8")))
#define INLINE     static inline __attribute__((always_inline))
#define AMX_TOKENS 16 /* tokens a tile: the A operand's rows */
#define AMX_SETS   4  /* 16-token sets a widened chunk serves */
/* Calls of fewer tokens run on the AVX-512 kernel: with one set the widening is not shared, and
 * a 16-sequence decode step ran 3-10 % slower on the tiles. Tried again with short sets
 * (2026-12-07, 2 threads): 16- and 24-sequence steps within the noise in 4 alternating rounds,
 * ffn_gate/up 0.89-0.94x the time but attn_output 1.06-1.17x and the Q8_0 output 1.07-1.10x. */
#define AMX_MIN_TOKENS 32
#define AMX_CHUNK      64 /* blocks whose activation scales are laid out at a time */
#define AMX_WIDEN      16 /* blocks widened at a time (8 KiB) */

/* Tiles: C0 and C1 take alternate blocks (a block's products are stored while the next one's
 * run), A the activations, B the weights; C0P, C1P and AP the same for a set of fewer tokens.
 * gcc's tile intrinsics paste their tile number into the instruction text, so the numbers go
 * through a macro that expands them first. */
#define TILE_C0                  0
#define TILE_C1                  1
#define TILE_A                   2
#define TILE_B                   3
#define TILE_C0P                 4
#define TILE_C1P                 5
#define TILE_AP                  6
#define TILE_ZERO(t)             _tile_zero(t)
#define TILE_LOAD(t, p, stride)  _tile_loadd(t, p, stride)
#define TILE_STORE(t, p, stride) _tile_stored(t, p, stride)
#define TILE_DPBSSD(c, a, b)     _tile_dpbssd(c, a, b)

struct amx_tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
_Static_assert(sizeof(struct amx_tilecfg) == 64, "ldtilecfg reads 64 bytes");

/* The tiles above: C 16 x 64 bytes, A 16 x 32, B 8 x 64; and C and A again (tiles 4-6) with
 * part_rows rows, for a call's last set of fewer than 16 tokens (none when part_rows is 0).
 * ldtilecfg on the whole 64-byte record: gcc 12's _tile_loadconfig tells the compiler it reads
 * only a pointer's worth, so a configuration built on the stack can lose its stores to dead-store
 * elimination (a test program faulted so). */
TGT INLINE void amx_configure(int part_rows)
{
    struct amx_tilecfg cfg = {
        .palette = 1,
        .colsb = {QPACK_ROWS * 4, QPACK_ROWS * 4, QK, QPACK_ROWS * 4},
        .rows = {AMX_TOKENS, AMX_TOKENS, AMX_TOKENS, QK / 4},
    };
    if (part_rows) {
        cfg.colsb[TILE_C0P] = cfg.colsb[TILE_C1P] = QPACK_ROWS * 4;
        cfg.colsb[TILE_AP] = QK;
        cfg.rows[TILE_C0P] = cfg.rows[TILE_C1P] = cfg.rows[TILE_AP] = (uint8_t)part_rows;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

/* Block b's 8 chunks of a group as signed bytes (the weight values themselves), in QPACK_Q8_0's
 * chunk order, into out[512]: the offsets the unsigned layouts carry are taken off here, once per
 * call, rather than as a correction per token and block (Q8_0's 128 wraps as a byte: w + 128 -
 * 128). */
TGT INLINE void widen_block(const uint8_t *qs, enum qpack_layout type, uint8_t *out)
{
    __m512i W[8];
    load_block(qs, type, W);
    const __m512i off = _mm512_set1_epi8((char)type_offset(type));
    for (int c = 0; c < 8; c++) _mm512_store_si512(out + 64 * c, _mm512_sub_epi8(W[c], off));
}

/* One 16-token set's activation scales for a chunk of blocks, token-minor: d[b][t] (and s[b][t]
 * for Q4_1), so a block's 16 broadcasts are constant offsets from one address. */
struct amx_scales {
    _Alignas(64) float d[AMX_CHUNK][AMX_TOKENS];
    _Alignas(64) float s[AMX_CHUNK][AMX_TOKENS];
};

/* The float steps of block b (bi within its chunk) for the set's nt tokens, from their integer
 * sums cs[nt][16]: those of the AVX-512 kernel, in its order. */
TGT INLINE void scale_block(const int32_t *cs, const struct qpack *w, int64_t g, int64_t b,
                            int64_t bi, const struct amx_scales *as, const enum qpack_layout type,
                            const int nt, __m512 acc[AMX_TOKENS])
{
    const uint16_t *sc = qpack_scales(w, g, b);
    __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc));
    __m512 mw = _mm512_setzero_ps();
    if (type == QPACK_Q4_1)
        mw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc + QPACK_ROWS)));
#pragma GCC unroll 16
    for (int t = 0; t < AMX_TOKENS; t++) {
        if (t >= nt) break;
        __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(as->d[bi][t]));
        __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(cs + QPACK_ROWS * t));
        acc[t] = _mm512_fmadd_ps(scale, isum, acc[t]);
        if (type == QPACK_Q4_1) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(as->s[bi][t]), acc[t]);
    }
}

/* Blocks [b0, b1) of group g for one set of nt tokens whose activations start at xa, into acc:
 * block b's signed weights at wq + (b - b0) * 512, its activation scales row b - sb0 of as. Each
 * block's products go to C0 or C1 in turn and are scaled after the next block's tile work is
 * issued. Defined twice: on the 16-row tiles, and on those of a call's last, shorter set. */
#define DEFINE_RUN_BLOCKS(name, C0, C1, A)                                                         \
    TGT INLINE void name(const struct qpack *w, int64_t g, int64_t b0, int64_t b1,                 \
                         const uint8_t *wq, const int8_t *xa, size_t xstride,                      \
                         const struct amx_scales *as, int64_t sb0, const enum qpack_layout type,   \
                         const int nt, __m512 acc[AMX_TOKENS])                                     \
    {                                                                                              \
        _Alignas(64) int32_t cs[2][AMX_TOKENS * QPACK_ROWS];                                       \
        int64_t b = b0;                                                                            \
        for (; b + 2 <= b1; b += 2) {                                                              \
            const uint8_t *q0 = wq + (size_t)(b - b0) * 512;                                       \
            TILE_ZERO(C0);                                                                         \
            TILE_LOAD(A, xa + (size_t)b * QK, xstride);                                            \
            TILE_LOAD(TILE_B, q0, 64);                                                             \
            TILE_DPBSSD(C0, A, TILE_B);                                                            \
            TILE_STORE(C0, cs[0], 64);                                                             \
            if (b > b0) scale_block(cs[1], w, g, b - 1, b - 1 - sb0, as, type, nt, acc);           \
            TILE_ZERO(C1);                                                                         \
            TILE_LOAD(A, xa + (size_t)(b + 1) * QK, xstride);                                      \
            TILE_LOAD(TILE_B, q0 + 512, 64);                                                       \
            TILE_DPBSSD(C1, A, TILE_B);                                                            \
            TILE_STORE(C1, cs[1], 64);                                                             \
            scale_block(cs[0], w, g, b, b - sb0, as, type, nt, acc);                               \
        }                                                                                          \
        if (b > b0) scale_block(cs[1], w, g, b - 1, b - 1 - sb0, as, type, nt, acc);               \
        if (b < b1) {                                                                              \
            TILE_ZERO(C0);                                                                         \
            TILE_LOAD(A, xa + (size_t)b * QK, xstride);                                            \
            TILE_LOAD(TILE_B, wq + (size_t)(b - b0) * 512, 64);                                    \
            TILE_DPBSSD(C0, A, TILE_B);                                                            \
            TILE_STORE(C0, cs[0], 64);                                                             \
            scale_block(cs[0], w, g, b, b - sb0, as, type, nt, acc);                               \
        }                                                                                          \
    }
DEFINE_RUN_BLOCKS(run_blocks, TILE_C0, TILE_C1, TILE_A)
DEFINE_RUN_BLOCKS(run_blocks_part, TILE_C0P, TILE_C1P, TILE_AP)

/* Groups [g0, g1) for `sets` sets of 16 tokens from t0 (at most AMX_SETS), of which the last
 * holds last_nt (1..16). The sets' activation scales are laid out token-minor AMX_CHUNK blocks
 * at a time (all of them for rows of up to AMX_CHUNK blocks); each group's blocks are widened
 * AMX_WIDEN at a time (a small stack buffer, beside the activations in L1) and each widened run
 * serves every set. Between runs a (row, token)'s running sum waits in y, which is exact (a
 * float stored and loaded back). */
TGT INLINE void amx_sets(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                         int64_t gp, int t0, int sets, int last_nt, float *y,
                         const enum qpack_layout type, const int L1)
{
    const int64_t nb = w->nb;
    struct amx_scales as[AMX_SETS];
    _Alignas(64) uint8_t wide[AMX_WIDEN * 512];
    const size_t xstride = (size_t)a->cols;
    /* one scale chunk (rows of up to AMX_CHUNK blocks): the groups are read front to back */
    struct pf_walk pw = pf_walk_start(w, g0, gp, L1);
    for (int64_t c0 = 0; c0 < nb; c0 += AMX_CHUNK) {
        int64_t c1 = c0 + AMX_CHUNK < nb ? c0 + AMX_CHUNK : nb;
        for (int s = 0; s < sets; s++)
            for (int t = 0; t < (s + 1 < sets ? AMX_TOKENS : last_nt); t++) {
                size_t tb = (size_t)(t0 + s * AMX_TOKENS + t) * (size_t)nb;
                for (int64_t b = c0; b < c1; b++) {
                    as[s].d[b - c0][t] = a->d[tb + (size_t)b];
                    if (type == QPACK_Q4_1) as[s].s[b - c0][t] = a->s[tb + (size_t)b];
                }
            }
        for (int64_t g = g0; g < g1; g++) {
            int64_t r0 = g * QPACK_ROWS, left = w->rows - r0;
            __mmask16 m = left >= QPACK_ROWS ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            for (int64_t b0 = c0; b0 < c1; b0 += AMX_WIDEN) {
                int64_t b1 = b0 + AMX_WIDEN < c1 ? b0 + AMX_WIDEN : c1;
                for (int64_t b = b0; b < b1; b++) {
                    const uint8_t *qs = qpack_quants(w, g, b);
                    if (nb <= AMX_CHUNK) pf_walk_to(&pw, qs + w->quant_bytes, L1);
                    widen_block(qs, type, wide + (size_t)(b - b0) * 512);
                }
                for (int s = 0; s < sets; s++) {
                    int ts = t0 + s * AMX_TOKENS, nt = s + 1 < sets ? AMX_TOKENS : last_nt;
                    float *ys = y + (size_t)ts * (size_t)w->rows + r0;
                    const int8_t *xa = a->q + (size_t)ts * xstride;
                    __m512 acc[AMX_TOKENS];
#pragma GCC unroll 16
                    for (int t = 0; t < AMX_TOKENS; t++) /* a short set's other lanes: none */
                        acc[t] = b0 ? _mm512_maskz_loadu_ps(t < nt ? m : 0,
                                                            ys + (size_t)t * (size_t)w->rows)
                                    : _mm512_setzero_ps();
                    if (nt == AMX_TOKENS)
                        run_blocks(w, g, b0, b1, wide, xa, xstride, &as[s], c0, type, AMX_TOKENS,
                                   acc);
                    else
                        run_blocks_part(w, g, b0, b1, wide, xa, xstride, &as[s], c0, type, nt, acc);
#pragma GCC unroll 16
                    for (int t = 0; t < AMX_TOKENS; t++) {
                        if (t >= nt) break;
                        _mm512_mask_storeu_ps(ys + (size_t)t * (size_t)w->rows, m, acc[t]);
                    }
                }
            }
        }
    }
}

/* Tokens [t0, t1) in runs of up to AMX_SETS sets; the last set may be short (the tiles
 * configured for it). */
TGT INLINE void amx_groups(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                           int64_t gp, int t0, int t1, float *y, const enum qpack_layout type,
                           const int L1)
{
    amx_configure((t1 - t0) % AMX_TOKENS);
    for (int t = t0; t < t1;) {
        int left = t1 - t, sets = (left + AMX_TOKENS - 1) / AMX_TOKENS;
        sets = sets < AMX_SETS ? sets : AMX_SETS;
        int n = left < sets * AMX_TOKENS ? left : sets * AMX_TOKENS;
        amx_sets(w, a, g0, g1, gp, t, sets, n - (sets - 1) * AMX_TOKENS, y, type, L1);
        t += n;
    }
    _tile_release();
}

/* Calls of AMX_MIN_TOKENS or more run on the tiles, a short last set included; fewer on the
 * AVX-512 kernel. */
TGT static void amx_matmul(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                           int64_t gp, int t0, int t1, float *y, const int L1)
{
    if (t1 - t0 < AMX_MIN_TOKENS) {
        if (L1)
            avx512_matmul_q8_l1(w, a, g0, g1, gp, t0, t1, y);
        else
            avx512_matmul_q8(w, a, g0, g1, gp, t0, t1, y);
        return;
    }
    switch (w->layout) {
    case QPACK_Q8_0:
        amx_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q8_0, L1);
        break;
    case QPACK_Q4_0:
        amx_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_0, L1);
        break;
    case QPACK_Q4_1:
        amx_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q4_1, L1);
        break;
    case QPACK_Q5_0:
        amx_groups(w, a, g0, g1, gp, t0, t1, y, QPACK_Q5_0, L1);
        break;
    default:
        break;
    }
}

TGT void amx_matmul_q8(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                       int64_t gp, int t0, int t1, float *y)
{
    amx_matmul(w, a, g0, g1, gp, t0, t1, y, 0);
}

TGT void amx_matmul_q8_l1(const struct qpack *w, const struct q8act *a, int64_t g0, int64_t g1,
                          int64_t gp, int t0, int t1, float *y)
{
    amx_matmul(w, a, g0, g1, gp, t0, t1, y, 1);
}
