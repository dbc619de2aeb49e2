/* AVX-512 attention over the paged KV cache.
 *
 * DESIGN. For one row (token, head) the keys run in spans of SPAN at fixed positions (0..127,
 * 128..255, ...), and each span in three passes:
 *   1. scores, CHUNK keys at a time: the chunk of K is transposed (kt[d] = element d of the 16
 *      keys), so a row's 16 scores are one vector: sum over d of q[d] * kt[d] (even d and odd d
 *      in two sums, added), scaled, -inf past the row's last key;
 *   2. the span maximum, the row's new running maximum m, corr = exp(m_old - m), and the
 *      weights p = exp(s - m) (one vector exp per chunk), summed into l;
 *   3. p . V summed over the span's keys in order, then out = out * corr + that sum.
 * Only the rescale waits on the previous span. A set of rows (attn_rows.h: the GQA heads of a kv
 * head for a few consecutive tokens of one sequence) shares the work that does not depend on the
 * row: each K chunk is transposed once per kv head, and the dot products and p . V are
 * register-blocked over 2-4 rows of one kv head, so each K and V load serves several rows. Blocking
 * only interleaves independent rows; a row's own arithmetic, in order, is the same in any set, on
 * any thread. */
#include <math.h>

#include "attn_rows.h"
#include "kern.h"
#include "simd512.h"

#define TGT    TGT512
#define INLINE INLINE512
#define CHUNK  16  /* keys per transpose-and-add tree */
#define SPAN   128 /* keys between two rescalings; its V (32 KiB at head size 64) stays in L1 */
#define HD_MAX 128

static inline __mmask16 first_lanes(int n)
{
    return n >= CHUNK ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* 16 rows of 16 floats, transposed in registers */
TGT INLINE void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* 16 elements of a K or V cache of floats, or of fp16 values (widened exactly) */
TGT INLINE __m512 load16(const void *cache, size_t off, const int F16)
{
    if (F16)
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + off)));
    return _mm512_loadu_ps((const float *)cache + off);
}

struct row_state {
    float m, l, corr;
    int cnt; /* keys of the current span */
    _Alignas(64) float acc[HD_MAX];
    _Alignas(64) float p[SPAN]; /* scores, then weights, of the current span */
};

/* Scores of chunk c for rows [r0, r0 + RB): s = (sum over even d of q[d] K[d] + sum over odd d)
 * * scale, lanes past a row's last key -inf. kt is the chunk transposed: kt[d] = the 16 keys'
 * element d. */
TGT INLINE void score_rows(const struct attn_row *rows, struct row_state *st, __m512 *vmax, int r0,
                           const int RB, const float *kt, int hd, int c, int j0, float scale)
{
    __m512 s0[4], s1[4];
    for (int i = 0; i < RB; i++) s0[i] = s1[i] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 2) {
        __m512 k0 = _mm512_load_ps(kt + 16 * d), k1 = _mm512_load_ps(kt + 16 * (d + 1));
        for (int i = 0; i < RB; i++) {
            const float *q = rows[r0 + i].q;
            s0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), k0, s0[i]);
            s1[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), k1, s1[i]);
        }
    }
    for (int i = 0; i < RB; i++) {
        int r = r0 + i, left = rows[r].n_keys - j0 - c * CHUNK;
        __m512 sv =
            _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), first_lanes(left),
                               _mm512_mul_ps(_mm512_add_ps(s0[i], s1[i]), _mm512_set1_ps(scale)));
        _mm512_store_ps(st[r].p + c * CHUNK, sv);
        vmax[r] = _mm512_max_ps(vmax[r], sv);
    }
}

/* p . V over the span for rows [r0, r0 + RB): keys every row has are shared (one load of V[k]
 * serves RB rows), the rest run row by row; each row sums its keys in order into its own
 * accumulator, then acc = acc * corr + that sum. */
TGT INLINE void pv_rows(struct row_state *st, int r0, const int RB, const void *v_cache,
                        const size_t *offs, size_t col, const int NV, const int F16)
{
    int common = SPAN;
    for (int i = 0; i < RB; i++) common = st[r0 + i].cnt < common ? st[r0 + i].cnt : common;
    __m512 a[4][8];
    for (int i = 0; i < RB; i++)
        for (int v = 0; v < NV; v++) a[i][v] = _mm512_setzero_ps();
    for (int k = 0; k < common; k++) {
        __m512 vv[8];
        for (int v = 0; v < NV; v++) vv[v] = load16(v_cache, offs[k] + col + 16 * (size_t)v, F16);
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
                a[i][v] = _mm512_fmadd_ps(p, load16(v_cache, offs[k] + col + 16 * (size_t)v, F16),
                                          a[i][v]);
        }
        __m512 vc = _mm512_set1_ps(sr->corr);
        for (int v = 0; v < NV; v++)
            _mm512_store_ps(sr->acc + 16 * v,
                            _mm512_fmadd_ps(_mm512_load_ps(sr->acc + 16 * v), vc, a[i][v]));
    }
}

/* One set, its keys walked as w says (attn_rows.h). */
TGT INLINE void attn_set(const struct attn_row *rows, int nr, struct row_state *st,
                         const void *k_cache, const void *v_cache, struct attn_walks w, float scale,
                         const int NV, const int F16)
{
    struct key_walk kw = w.kw;
    const int RB = NV == 4 ? 4 : 2; /* rows per register block: RB * NV accumulators */
    int max_keys = 0;
    for (int r = 0; r < nr; r++) {
        max_keys = rows[r].n_keys > max_keys ? rows[r].n_keys : max_keys;
        st[r].m = -INFINITY;
        st[r].l = 0;
        for (int v = 0; v < NV; v++) _mm512_store_ps(st[r].acc + 16 * v, _mm512_setzero_ps());
    }
    size_t offs[SPAN];
    struct key_prefetch pf =
        key_prefetch_start(w.pf, max_keys, k_cache, v_cache, w.pf_elems, F16 ? 2 : 4);
    _Alignas(64) float kt[HD_MAX * CHUNK];
    const int hd = 16 * NV;
    for (int j0 = 0; j0 < max_keys; j0 += SPAN) {
        int span = max_keys - j0 < SPAN ? max_keys - j0 : SPAN;
        int chunks = (span + CHUNK - 1) / CHUNK;
        __m512 vmax[ATTN_ROWS];
        /* rows still reading keys here: the set's rows are in order of position, mostly */
        int act[ATTN_ROWS], na = 0, bstart[ATTN_ROWS], blen[ATTN_ROWS], nb;
        for (int r = 0; r < nr; r++) {
            vmax[r] = _mm512_set1_ps(-INFINITY);
            int cnt = rows[r].n_keys - j0;
            st[r].cnt = cnt <= 0 ? 0 : cnt < SPAN ? cnt : SPAN;
        }
        /* 1. scores: transpose the chunk's K, then register-blocked dot products */
        for (int c = 0; c < chunks; c++) {
            size_t *o = offs + c * CHUNK;
            int left = span - c * CHUNK;
            /* lanes past the span's last key re-read the chunk's first key; masked later */
            for (int k = 0; k < CHUNK; k++) o[k] = k < left ? key_next(&kw) : o[0];
            key_prefetch_next(&pf, CHUNK);
            na = 0;
            for (int r = 0; r < nr; r++)
                if (st[r].cnt > c * CHUNK) act[na++] = r;
            /* blocks of up to RB consecutive active rows of one kv head share each load (a
             * decode token's GQA heads: 3 rows for SmolLM2, whose dot products would otherwise
             * each be one latency-bound fma chain) */
            nb = attn_blocks(rows, act, na, RB, bstart, blen);
            size_t kt_col = SIZE_MAX; /* the kv head whose K kt holds */
            for (int i = 0; i < nb; i++) {
                size_t col = rows[bstart[i]].col;
                if (col != kt_col) {
                    for (int v = 0; v < NV; v++) {
                        __m512 t[16];
                        for (int k = 0; k < CHUNK; k++)
                            t[k] = load16(k_cache, o[k] + col + 16 * (size_t)v, F16);
                        transpose16(t);
                        for (int u = 0; u < 16; u++) _mm512_store_ps(kt + (16 * v + u) * 16, t[u]);
                    }
                    kt_col = col;
                }
                if (blen[i] == 4)
                    score_rows(rows, st, vmax, bstart[i], 4, kt, hd, c, j0, scale);
                else if (blen[i] == 3)
                    score_rows(rows, st, vmax, bstart[i], 3, kt, hd, c, j0, scale);
                else if (blen[i] == 2)
                    score_rows(rows, st, vmax, bstart[i], 2, kt, hd, c, j0, scale);
                else
                    score_rows(rows, st, vmax, bstart[i], 1, kt, hd, c, j0, scale);
            }
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
                __m512 p = _mm512_maskz_mov_ps(
                    first_lanes(cnt - c * CHUNK),
                    exp512(_mm512_sub_ps(_mm512_load_ps(st[r].p + c * CHUNK), vm)));
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
        for (int i = 0; i < nb; i++) {
            size_t col = rows[bstart[i]].col;
            if (blen[i] == 4)
                pv_rows(st, bstart[i], 4, v_cache, offs, col, NV, F16);
            else if (blen[i] == 3)
                pv_rows(st, bstart[i], 3, v_cache, offs, col, NV, F16);
            else if (blen[i] == 2)
                pv_rows(st, bstart[i], 2, v_cache, offs, col, NV, F16);
            else
                pv_rows(st, bstart[i], 1, v_cache, offs, col, NV, F16);
        }
    }
    for (int r = 0; r < nr; r++) {
        __m512 vl = _mm512_set1_ps(st[r].l);
        for (int v = 0; v < NV; v++)
            _mm512_storeu_ps(rows[r].out + 16 * v,
                             _mm512_div_ps(_mm512_load_ps(st[r].acc + 16 * v), vl));
    }
}

/* Tokens [t0, t1) x the heads of kv head kvh (-1: every kv head) over a float (F16 0) or fp16
 * cache. */
TGT INLINE void attention_kv(float *out, const float *q, const void *k_cache, const void *v_cache,
                             const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                             int kvh, const int F16)
{
    int hd = s->head_dim;
    if (hd != 64 && hd != 128) {
        attn_ref_heads(out, q, k_cache, v_cache, b, s, t0, t1, kvh, F16);
        return;
    }
    struct attn_heads hs = attn_heads_of(s, kvh);
    for (int h = hs.h0; h < hs.h1; h++) {
        int walk = hs.all ? -1 : h;
        struct attn_sets it = {.t = t0, .g = 0, .t1 = t1, .kvh = walk};
        struct attn_row rows[ATTN_ROWS];
        struct row_state st[ATTN_ROWS];
        int seq = -1, nr;
        while ((nr = attn_next_set(&it, b, s, q, out, rows, &seq)) > 0) {
            struct attn_walks w = attn_walks_of(b, s, seq, walk);
            if (hd == 64)
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, 4, F16);
            else
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, 8, F16);
        }
    }
}

TGT void avx512_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                          int kvh)
{
    attention_kv(out, q, k_cache, v_cache, b, s, t0, t1, kvh, 0);
}

TGT void avx512_attention_f16(float *out, const float *q, const uint16_t *k_cache,
                              const uint16_t *v_cache, const struct attn_batch *b,
                              const struct attn_shape *s, int t0, int t1, int kvh)
{
    attention_kv(out, q, k_cache, v_cache, b, s, t0, t1, kvh, 1);
}
