/* attn_avx512_body: the AVX-512 attention kernel, instantiated per cache kind by attn_avx512.c
 * (float, fp16) and attn_avx512_q8.c (Q8_0), two files so that the two compile side by side.
 *
 * AVX-512 attention over the paged KV cache.
 *
 * DESIGN. For one row (token, head) the keys run in spans of SPAN at fixed positions (0..127,
 * 128..255, ...), and each span in three passes:
 *   1. scores, CHUNK keys at a time: each key's K row times q, summed by residue of d mod 16
 *      (a vector per key), then the chunk's 16 keys reduced by one shuffle-and-add tree
 *      (simd512.h's fold16x16) into one vector of 16 scores, scaled, -inf past the row's last key;
 *   2. the span maximum, the row's new running maximum m, corr = exp(m_old - m), and the
 *      weights p = exp(s - m) (one vector exp per chunk), summed into l;
 *   3. p . V summed over the span's keys in order, then out = out * corr + that sum.
 * Only the rescale waits on the previous span. Every ATTN_PART keys a row starts afresh and the
 * partitions are folded in order (attn_part.h), so a long row's partitions can run on several
 * threads and give the same bits. A set of rows (attn_rows.h: the GQA heads of a kv
 * head for a few consecutive tokens of one sequence) shares the work that does not depend on the
 * row: the dot products and p . V are register-blocked over 2-4 rows, so each K and V load
 * serves several rows. Blocking only interleaves independent rows; a row's own arithmetic, in
 * order, is the same in any set, on any thread. (Scores once came from each chunk of K
 * transposed in registers; the reduction tree costs fewer shuffles and stages nothing in
 * memory: attention alone, 16 sequences at context 160 read as whole slots, 0.79-0.81x the time
 * with their KV in the L2, 0.86x beyond it. It sums in another order, so the logits moved in
 * their last bits; test_structured had to learn that a sampled string may run to max_tokens.) */
#ifndef QUERN_ATTN_AVX512_BODY_H
#define QUERN_ATTN_AVX512_BODY_H

#include <math.h>
#include <string.h>

#include "attn_part.h"
#include "attn_rows.h"
#include "kern.h"
#include "simd512.h"

#define TGT    TGT512
#define INLINE INLINE512
#define CHUNK  16  /* keys per reduction tree: one vector of scores */
#define SPAN   128 /* keys between two rescalings; its V (32 KiB at head size 64) stays in L1 */
#define HD_MAX 256 /* Gemma 3's heads */
/* The prefetch walker runs one chunk ahead and issues PF_LINES line pairs at each key of a
 * block's scores, a chunk's keys' worth in all, what the blocks leave at the chunk's end (the
 * AVX2 kernel's scheme, attn_avx2.c). A decode batch's attention over KV from DRAM (`quern bench
 * --kernels`: 16 sequences, context 160, 30 layers' KV, 2 threads, Zen 5) took 96.5 us a layer
 * with the whole chunk's lines (192 for SmolLM2's whole slots) issued at once 32 keys ahead, where
 * the AVX2 kernel, slower on cached KV, took 61. */
#define PF_AHEAD CHUNK
#define PF_LINES 2

static inline __mmask16 first_lanes(int n)
{
    return n >= CHUNK ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Elements [e, e + 16) of the row at unit offset row of a cache of kind KT (ref.h): floats, fp16
 * values widened, or a Q8_0 block's half dequantized (d * q is exact in float): the values a
 * float cache of the dequantized elements would hold, so every kind runs the same arithmetic. */
TGT INLINE __m512 load16(const void *cache, size_t row, int e, const int KT)
{
    if (KT == KV_Q8) {
        uint16_t d;
        const int8_t *q = kv_q8_at(cache, row, e, &d);
        __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
        return _mm512_mul_ps(x, _mm512_set1_ps(_cvtsh_ss(d)));
    }
    if (KT == KV_F16)
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + row + e)));
    return _mm512_loadu_ps((const float *)cache + row + e);
}

struct row_state {
    float m, l, corr;
    int cnt;    /* keys of the current span from its start, 0 when the row reads none there */
    int c0;     /* its first chunk there (a sliding window's first key may lie beyond the span's) */
    float M, L; /* the partitions folded so far (attn_part.h) */
    _Alignas(64) float O[HD_MAX];
    _Alignas(64) float acc[HD_MAX];
    _Alignas(64) float p[SPAN]; /* scores, then weights, of the current span */
};

/* Scores of chunk c for rows [r0, r0 + RB): key k's products with the row, q[d] K[d] summed over
 * d of each residue mod 16 (d, d + 16, ... in order), then the 16 residues by fold16x16; scaled,
 * lanes past a row's last key -inf. Each K row (at o[k] + col) is loaded once for the RB rows (of
 * one kv head). */
TGT INLINE void score_rows(const struct attn_row *rows, struct row_state *st, __m512 *vmax, int r0,
                           const int RB, const void *k_cache, const size_t *o, size_t col,
                           const int NV, const int KT, int c, int j0, float scale, float cap,
                           struct key_prefetch *pf)
{
    __m512 v[4][CHUNK];
    for (int k = 0; k < CHUNK; k++) {
        __m512 kv[HD_MAX / 16];
        for (int j = 0; j < NV; j++) kv[j] = load16(k_cache, o[k] + col, 16 * j, KT);
        for (int i = 0; i < RB; i++) {
            const float *q = rows[r0 + i].q;
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(q), kv[0]);
            for (int j = 1; j < NV; j++) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * j), kv[j], a);
            v[i][k] = a;
        }
        key_prefetch_lines(pf, PF_LINES);
    }
    for (int i = 0; i < RB; i++) {
        int r = r0 + i, at = j0 + c * CHUNK;
        __mmask16 in =
            first_lanes(rows[r].n_keys - at) & (__mmask16)~first_lanes(rows[r].key0 - at);
        __m512 sc = _mm512_mul_ps(fold16x16(v[i], SIMD_FOLD_ADD), _mm512_set1_ps(scale));
        if (cap > 0) sc = softcap512(sc, cap);
        __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), in, sc);
        _mm512_store_ps(st[r].p + c * CHUNK, sv);
        vmax[r] = _mm512_max_ps(vmax[r], sv);
    }
}

/* p . V over the span for rows [r0, r0 + RB): keys every row has are shared (one load of V[k]
 * serves RB rows), the rest run row by row; each row sums its keys in order into its own
 * accumulator, then acc = acc * corr + that sum. */
TGT INLINE void pv_rows(struct row_state *st, int r0, const int RB, const void *v_cache,
                        const size_t *offs, size_t col, const int NV, const int KT)
{
    int common = SPAN;
    for (int i = 0; i < RB; i++) common = st[r0 + i].cnt < common ? st[r0 + i].cnt : common;
    __m512 a[4][HD_MAX / 16];
    for (int i = 0; i < RB; i++)
        for (int v = 0; v < NV; v++) a[i][v] = _mm512_setzero_ps();
    for (int k = 0; k < common; k++) {
        __m512 vv[HD_MAX / 16];
        for (int v = 0; v < NV; v++) vv[v] = load16(v_cache, offs[k] + col, 16 * v, KT);
        for (int i = 0; i < RB; i++) {
            __m512 p = _mm512_set1_ps(st[r0 + i].p[k]);
            for (int v = 0; v < NV; v++) a[i][v] = _mm512_fmadd_ps(p, vv[v], a[i][v]);
        }
    }
    for (int i = 0; i < RB; i++) {
        struct row_state *sr = &st[r0 + i];
        for (int k = common; k < sr->cnt; k++) {
            __m512 p = _mm512_set1_ps(sr->p[k]);
            for (int v = 0; v < NV; v++)
                a[i][v] = _mm512_fmadd_ps(p, load16(v_cache, offs[k] + col, 16 * v, KT), a[i][v]);
        }
        __m512 vc = _mm512_set1_ps(sr->corr);
        for (int v = 0; v < NV; v++)
            _mm512_store_ps(sr->acc + 16 * v,
                            _mm512_fmadd_ps(_mm512_load_ps(sr->acc + 16 * v), vc, a[i][v]));
    }
}

/* Rows per register block at NV vectors a row: RB * NV accumulators of the 32 registers. */
static inline int block_max_rows(int NV)
{
    return NV == 4 ? 4 : NV == 8 ? 2 : 1;
}

/* score_rows for each register block (bstart[i], blen[i]): K rows at o[k] plus the block's kv
 * head's column, or (col not SIZE_MAX) plus col. A block is never longer than block_max_rows, so
 * the longer ones' code is not compiled for that NV (the sanitized build's slowest file). */
TGT INLINE void score_blocks(const struct attn_row *rows, struct row_state *st, __m512 *vmax,
                             const int *bstart, const int *blen, int nb, const void *k_cache,
                             const size_t *o, size_t col, const int NV, const int KT, int c, int j0,
                             float scale, float cap, struct key_prefetch *pf)
{
    for (int i = 0; i < nb; i++) {
        size_t cl = col == SIZE_MAX ? rows[bstart[i]].col : col;
        const int RB = block_max_rows(NV);
        if (RB >= 4 && blen[i] == 4)
            score_rows(rows, st, vmax, bstart[i], 4, k_cache, o, cl, NV, KT, c, j0, scale, cap, pf);
        else if (RB >= 3 && blen[i] == 3)
            score_rows(rows, st, vmax, bstart[i], 3, k_cache, o, cl, NV, KT, c, j0, scale, cap, pf);
        else if (RB >= 2 && blen[i] == 2)
            score_rows(rows, st, vmax, bstart[i], 2, k_cache, o, cl, NV, KT, c, j0, scale, cap, pf);
        else
            score_rows(rows, st, vmax, bstart[i], 1, k_cache, o, cl, NV, KT, c, j0, scale, cap, pf);
    }
}

/* pv_rows for each register block, V rows placed as score_blocks' K rows. */
TGT INLINE void pv_blocks(const struct attn_row *rows, struct row_state *st, const int *bstart,
                          const int *blen, int nb, const void *v_cache, const size_t *offs,
                          size_t col, const int NV, const int KT)
{
    for (int i = 0; i < nb; i++) {
        size_t cl = col == SIZE_MAX ? rows[bstart[i]].col : col;
        const int RB = block_max_rows(NV);
        if (RB >= 4 && blen[i] == 4)
            pv_rows(st, bstart[i], 4, v_cache, offs, cl, NV, KT);
        else if (RB >= 3 && blen[i] == 3)
            pv_rows(st, bstart[i], 3, v_cache, offs, cl, NV, KT);
        else if (RB >= 2 && blen[i] == 2)
            pv_rows(st, bstart[i], 2, v_cache, offs, cl, NV, KT);
        else
            pv_rows(st, bstart[i], 1, v_cache, offs, cl, NV, KT);
    }
}

/* n rows of hd elements (kv head column col of the slots at offs) of a Q8_0 cache, dequantized
 * into stage[n][hd]. */
TGT INLINE void stage_rows(float *stage, const void *cache, const size_t *offs, size_t col, int n,
                           const int NV)
{
    for (int k = 0; k < n; k++)
        for (int j = 0; j < NV; j++)
            _mm512_store_ps(stage + (size_t)k * 16 * NV + 16 * j,
                            load16(cache, offs[k] + col, 16 * j, KV_Q8));
}

/* One set, its keys walked as w says (attn_rows.h). */
TGT INLINE void attn_set(const struct attn_row *rows, int nr, struct row_state *st,
                         const void *k_cache, const void *v_cache, struct attn_walks w, float scale,
                         float cap, const int NV, const int KT, const int L1,
                         const struct attn_parts *pp)
{
    struct key_walk kw = w.kw, pw = w.pf;
    const int RB = block_max_rows(NV); /* rows per register block */
    const int hd = 16 * NV;
    int max_keys = 0;
    for (int r = 0; r < nr; r++) max_keys = rows[r].n_keys > max_keys ? rows[r].n_keys : max_keys;
    /* the keys of partitions [p0, p1) (attn_part.h), or all of them */
    int key0, key1;
    if (!attn_part_keys(pp, max_keys, &key0, &key1)) return;
    /* from the span of the set's first key (a sliding window's keys start late) */
    int first = attn_rows_first_key(rows, nr, SPAN);
    key0 = first > key0 ? first : key0;
    if (key0 >= key1) return;
    key_skip(&kw, key0);
    key_skip(&pw, key0);
    size_t offs[SPAN];
    struct key_prefetch pf = key_prefetch_start(pw, key1 - key0, k_cache, v_cache, w.pf_elems,
                                                kv_unit_bytes(KT), PF_AHEAD, L1);
    /* A prompt's set over a Q8_0 cache (more rows of one kv head than a register block): each
     * chunk's K rows and each span's V rows dequantized once into float stages that every block
     * then reads, where each block would dequantize them again (pp4096 0.89x fp16's speed
     * without). The same values, so the same bits. */
    bool stage = KT == KV_Q8 && nr > RB;
    for (int r = 1; stage && r < nr; r++) stage = rows[r].col == rows[0].col;
    _Alignas(64) float kst[CHUNK * HD_MAX];
    _Alignas(64) float vst[SPAN * HD_MAX];
    size_t so[SPAN]; /* a stage's rows */
    if (stage)
        for (int k = 0; k < SPAN; k++) so[k] = (size_t)k * (size_t)hd;
    const int pf_key_lines = (int)((pf.row_bytes + 63) / 64);
    for (int part0 = key0 - key0 % ATTN_PART; part0 < key1; part0 += ATTN_PART) {
        int part1 = key1 - part0 < ATTN_PART ? key1 : part0 + ATTN_PART;
        /* a row whose keys ended in an earlier partition (or start in a later one) keeps what
         * they left */
        for (int r = 0; r < nr; r++) {
            if (rows[r].n_keys <= part0 || rows[r].key0 >= part0 + ATTN_PART) continue;
            st[r].m = -INFINITY;
            st[r].l = 0;
            for (int v = 0; v < NV; v++) _mm512_store_ps(st[r].acc + 16 * v, _mm512_setzero_ps());
        }
        for (int j0 = part0 > key0 ? part0 : key0; j0 < part1; j0 += SPAN) {
            int span = part1 - j0 < SPAN ? part1 - j0 : SPAN;
            int chunks = (span + CHUNK - 1) / CHUNK;
            __m512 vmax[ATTN_ROWS];
            /* rows still reading keys here: the set's rows are in order of position, mostly */
            int act[ATTN_ROWS], na = 0, bstart[ATTN_ROWS], blen[ATTN_ROWS], nb;
            for (int r = 0; r < nr; r++) {
                vmax[r] = _mm512_set1_ps(-INFINITY);
                int cnt = rows[r].n_keys - j0, lead = rows[r].key0 - j0;
                st[r].cnt = cnt <= 0 || lead >= span ? 0 : cnt < SPAN ? cnt : SPAN;
                st[r].c0 = lead > 0 ? lead / CHUNK : 0;
            }
            /* 1. scores: register-blocked dot products, one reduction tree per chunk and row */
            for (int c = 0; c < chunks; c++) {
                size_t *o = offs + c * CHUNK;
                int left = span - c * CHUNK;
                /* lanes past the span's last key re-read the chunk's first key; masked later */
                for (int k = 0; k < CHUNK; k++) o[k] = k < left ? key_next(&kw) : o[0];
                pf.budget = CHUNK * pf_key_lines;
                na = 0;
                for (int r = 0; r < nr; r++)
                    if (st[r].cnt > c * CHUNK && c >= st[r].c0) act[na++] = r;
                /* blocks of up to RB consecutive active rows of one kv head share each load (a
                 * decode token's GQA heads: 3 rows for SmolLM2, whose dot products would otherwise
                 * each be one latency-bound fma chain) */
                nb = attn_blocks(rows, act, na, RB, bstart, blen);
                if (KT == KV_Q8 && stage) {
                    stage_rows(kst, k_cache, o, rows[0].col, CHUNK, NV);
                    score_blocks(rows, st, vmax, bstart, blen, nb, kst, so, 0, NV, KV_F32, c, j0,
                                 scale, cap, &pf);
                } else {
                    score_blocks(rows, st, vmax, bstart, blen, nb, k_cache, o, SIZE_MAX, NV, KT, c,
                                 j0, scale, cap, &pf);
                }
                /* what the blocks left of this chunk's keys */
                key_prefetch_lines(&pf, pf.budget);
            }
            /* 2. maximum, rescale factor, weights */
            for (int r = 0; r < nr; r++) {
                int cnt = st[r].cnt;
                if (!cnt) continue;
                float mc = _mm512_reduce_max_ps(vmax[r]);
                float mnew = mc > st[r].m ? mc : st[r].m;
                /* exp(m - mnew); 0 on the first span, where m is -inf */
                st[r].corr = _mm512_cvtss_f32(exp512(_mm512_set1_ps(st[r].m - mnew)));
                __m512 vm = _mm512_set1_ps(mnew), lsum = _mm512_setzero_ps();
                for (int c = 0; c * CHUNK < cnt; c++) {
                    /* keys before a window's first weigh exactly 0 in p . V below */
                    __mmask16 in = first_lanes(cnt - c * CHUNK) &
                                   (__mmask16)~first_lanes(rows[r].key0 - j0 - c * CHUNK);
                    if (c < st[r].c0) in = 0;
                    __m512 p = _mm512_maskz_mov_ps(
                        in, exp512(_mm512_sub_ps(_mm512_load_ps(st[r].p + c * CHUNK), vm)));
                    _mm512_store_ps(st[r].p + c * CHUNK, p);
                    lsum = _mm512_add_ps(lsum, p);
                }
                st[r].l = st[r].l * st[r].corr + _mm512_reduce_add_ps(lsum);
                st[r].m = mnew;
            }
            /* 3. p . V */
            na = 0;
            for (int r = 0; r < nr; r++)
                if (st[r].cnt) act[na++] = r;
            nb = attn_blocks(rows, act, na, RB, bstart, blen);
            if (KT == KV_Q8 && stage) {
                int keys = 0;
                for (int r = 0; r < nr; r++) keys = st[r].cnt > keys ? st[r].cnt : keys;
                stage_rows(vst, v_cache, offs, rows[0].col, keys, NV);
                pv_blocks(rows, st, bstart, blen, nb, vst, so, 0, NV, KV_F32);
            } else {
                pv_blocks(rows, st, bstart, blen, nb, v_cache, offs, SIZE_MAX, NV, KT);
            }
        }
        /* the partition's end: its record, or folded into the row's running sums */
        for (int r = 0; r < nr; r++)
            attn_part_close(pp, rows[r].th, rows[r].key0, rows[r].n_keys, part0, hd, st[r].m,
                            st[r].l, st[r].acc, &st[r].M, &st[r].L, st[r].O);
    }
    if (pp) return;
    for (int r = 0; r < nr; r++) {
        if (attn_row_multi(rows[r].key0, rows[r].n_keys)) {
            attn_finish(rows[r].out, st[r].O, st[r].L, hd);
            continue;
        }
        __m512 vl = _mm512_set1_ps(st[r].l);
        for (int v = 0; v < NV; v++)
            _mm512_storeu_ps(rows[r].out + 16 * v,
                             _mm512_div_ps(_mm512_load_ps(st[r].acc + 16 * v), vl));
    }
}

/* Tokens [t0, t1) x query heads [h0, h1) over a cache of kind KT. */
TGT INLINE void attention_kv(float *out, const float *q, const void *k_cache, const void *v_cache,
                             const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                             int h0, int h1, const int KT, const int L1,
                             const struct attn_parts *pp)
{
    int hd = s->head_dim;
    if (hd != 64 && hd != 128 && hd != 256) {
        /* no partitions: the reference's rows whole (attention_part is not asked of such) */
        attn_ref_heads(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, KT);
        return;
    }
    struct attn_heads hs = attn_heads_of(s, h0, h1);
    for (int kvh = hs.kvh0; kvh < hs.kvh1; kvh++) {
        int walk = hs.all ? -1 : kvh;
        struct attn_sets it = attn_sets_of(s, hs, t0, t1, walk);
        struct attn_row rows[ATTN_ROWS];
        struct row_state st[ATTN_ROWS];
        int seq = -1, nr;
        while ((nr = attn_next_set(&it, b, s, KT, q, out, rows, &seq)) > 0) {
            struct attn_walks w = attn_walks_of(b, s, KT, seq, hs, walk);
            if (hd == 64)
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, s->softcap, 4, KT, L1, pp);
            else if (hd == 128)
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, s->softcap, 8, KT, L1, pp);
            else
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, s->softcap, 16, KT, L1, pp);
        }
    }
}

/* The tables' entry points: a cache of kind KT, KV prefetched into L2 or (_l1) L1; _part, the
 * partitions pp names of each row, written as records (attn_part.h); the whole-row entry is the
 * _part one with no partitions, so each kernel is compiled once per cache type (twice, the
 * sanitized build's two slowest files took twice as long). */
#define ATTN_ENTRY(name, T, KT, L1)                                                                \
    __attribute__((noinline))                                                                      \
    TGT void name##_part(float *out, const float *q, const T *k_cache, const T *v_cache,           \
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,   \
                         int h0, int h1, const struct attn_parts *pp)                              \
    {                                                                                              \
        attention_kv(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, KT, L1, pp);                  \
    }                                                                                              \
    TGT void name(float *out, const float *q, const T *k_cache, const T *v_cache,                  \
                  const struct attn_batch *b, const struct attn_shape *s, int t0, int t1, int h0,  \
                  int h1)                                                                          \
    {                                                                                              \
        name##_part(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, NULL);                         \
    }

#endif
