/* AVX2 attention over the paged KV cache: the design of attn_avx512.c with 8-key chunks (the
 * width of a register) and 8-lane vectors. */
#include <math.h>
#include <string.h>

#include "attn_part.h"
#include "attn_rows.h"
#include "kern.h"
#include "simd256.h"

#define TGT    TGT256
#define INLINE INLINE256
#define CHUNK  8
#define SPAN   128
#define HD_MAX 256 /* Gemma 3's heads */
/* The prefetch walker here runs one chunk ahead and issues PF_LINES line pairs at each key of a
 * block's scores, a chunk's keys' worth in all (a 3-row block's 8 keys times 3 blocks cover a
 * chunk of SmolLM2's whole KV slots, 6 lines each of K and V), what the blocks leave at the
 * chunk's end. A decode batch's attention over KV from DRAM (16 sequences, context 160, 30
 * layers' KV, one thread, Zen 3): 76-99 ns a key, against 120-162 with the whole chunk's 96
 * lines issued at once 32 keys ahead (the miss buffers fill and the arithmetic waits behind
 * them) and a floor of 66 ns a key at this machine's one-thread read bandwidth. */
#define PF_AHEAD 8
#define PF_LINES 2

TGT INLINE __m256 first_lanes(int n)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
}

/* Elements [e, e + 8) of the row at unit offset row of a cache of kind KT (ref.h), as load16 in
 * attn_avx512.c: floats, fp16 widened, or Q8_0 dequantized (exactly). */
TGT INLINE __m256 load8(const void *cache, size_t row, int e, const int KT)
{
    if (KT == KV_Q8) {
        uint16_t d;
        const int8_t *q = kv_q8_at(cache, row, e, &d);
        __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
        return _mm256_mul_ps(x, _mm256_set1_ps(_cvtsh_ss(d)));
    }
    if (KT == KV_F16)
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)((const uint16_t *)cache + row + e)));
    return _mm256_loadu_ps((const float *)cache + row + e);
}

struct row_state {
    float m, l, corr;
    float M, L; /* the partitions folded so far (attn_part.h) */
    _Alignas(32) float O[HD_MAX];
    _Alignas(32) float acc[HD_MAX];
    _Alignas(32) float pa[HD_MAX];
    _Alignas(32) float p[SPAN];
};

/* Scores of chunk c for rows [r0, r0 + RB), each row as it would run alone: per key, q . k as
 * mul then fma over the 8-lane slices in order, then the chunk's 8 keys summed by hsum8x8. A
 * block converts each K element once for its RB rows. The q pointers pass through an empty asm
 * at each key: left loop-invariant, gcc held the 24 q slices of a 3-row block in registers and
 * spilled the converted K instead (stack traffic on every key). */
TGT INLINE void score_rows(const struct attn_row *rows, struct row_state *st, __m256 *vmax, int r0,
                           const int RB, const void *k_cache, const size_t *o, size_t col, int c,
                           int j0, const int NV, const int KT, __m256 vscale, float cap,
                           struct key_prefetch *pf)
{
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 part[3][CHUNK];
    for (int k = 0; k < CHUNK; k++) {
        const float *q[3];
        for (int i = 0; i < RB; i++) {
            q[i] = rows[r0 + i].q;
            __asm__("" : "+r"(q[i]));
        }
        __m256 kv = load8(k_cache, o[k] + col, 0, KT), a[3];
        for (int i = 0; i < RB; i++) a[i] = _mm256_mul_ps(_mm256_loadu_ps(q[i]), kv);
        for (int v = 1; v < NV; v++) {
            kv = load8(k_cache, o[k] + col, 8 * v, KT);
            for (int i = 0; i < RB; i++)
                a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q[i] + 8 * v), kv, a[i]);
        }
        for (int i = 0; i < RB; i++) part[i][k] = a[i];
        key_prefetch_lines(pf, PF_LINES);
    }
    for (int i = 0; i < RB; i++) {
        int r = r0 + i, at = j0 + c * CHUNK;
        __m256 in =
            _mm256_andnot_ps(first_lanes(rows[r].key0 - at), first_lanes(rows[r].n_keys - at));
        __m256 sc = _mm256_mul_ps(hsum8x8(part[i]), vscale);
        if (cap > 0) sc = softcap256(sc, cap);
        __m256 sv = _mm256_blendv_ps(neg_inf, sc, in);
        _mm256_store_ps(st[r].p + c * CHUNK, sv);
        vmax[r] = _mm256_max_ps(vmax[r], sv);
    }
}

/* p . V of chunk c for rows [r0, r0 + RB), which all read its first n keys: each row's partial
 * sum adds the keys in order, as alone; a block converts each V element once for its rows. Four
 * 8-lane slices at a time: 12 independent sums for 3 rows, where one slice at a time left 3
 * chains of dependent fmas (latency, not the fma ports, set the pace). */
TGT INLINE void pv_rows(struct row_state *st, int r0, const int RB, const void *v_cache,
                        const size_t *o, size_t col, int c, int n, const int NV, const int KT)
{
    enum { SL = 4 };
    for (int v0 = 0; v0 < NV; v0 += SL) {
        __m256 pa[3][SL];
        for (int i = 0; i < RB; i++)
            for (int u = 0; u < SL; u++) pa[i][u] = _mm256_load_ps(st[r0 + i].pa + 8 * (v0 + u));
        for (int k = 0; k < n; k++) {
            __m256 w[3];
            for (int i = 0; i < RB; i++) w[i] = _mm256_set1_ps(st[r0 + i].p[c * CHUNK + k]);
            for (int u = 0; u < SL; u++) {
                __m256 vv = load8(v_cache, o[k] + col, 8 * (v0 + u), KT);
                for (int i = 0; i < RB; i++) pa[i][u] = _mm256_fmadd_ps(w[i], vv, pa[i][u]);
            }
        }
        for (int i = 0; i < RB; i++)
            for (int u = 0; u < SL; u++) _mm256_store_ps(st[r0 + i].pa + 8 * (v0 + u), pa[i][u]);
    }
}

/* n rows of hd elements (kv head column col of the slots at offs) of a Q8_0 cache, dequantized
 * into stage[n][hd]. */
TGT INLINE void stage_rows(float *stage, const void *cache, const size_t *offs, size_t col, int n,
                           const int NV)
{
    for (int k = 0; k < n; k++)
        for (int j = 0; j < NV; j++)
            _mm256_store_ps(stage + (size_t)k * 8 * NV + 8 * j,
                            load8(cache, offs[k] + col, 8 * j, KV_Q8));
}

/* Keys of chunk c row r reads, counted from the chunk's first (0 when past its last, or before
 * a sliding window's first: keys of the chunk before that one weigh exactly 0). */
static inline int chunk_keys(const struct attn_row *rows, int r, int c, int j0)
{
    int n = rows[r].n_keys - j0 - c * CHUNK;
    if (rows[r].key0 >= j0 + (c + 1) * CHUNK) return 0;
    return n <= 0 ? 0 : n < CHUNK ? n : CHUNK;
}

/* Whether row r reads any key of the span at j0 of span keys. */
static inline bool span_reads(const struct attn_row *rows, int r, int j0, int span)
{
    return rows[r].n_keys > j0 && rows[r].key0 < j0 + span;
}

/* How many rows from r (at most max, of one kv head) read the same keys of chunk c: a register
 * block. */
static inline int block_rows(const struct attn_row *rows, int nr, int r, int c, int j0, int max)
{
    int n = chunk_keys(rows, r, c, j0), b = 1;
    while (b < max && r + b < nr && rows[r + b].col == rows[r].col &&
           chunk_keys(rows, r + b, c, j0) == n)
        b++;
    return b;
}

/* One set, its keys walked as w says (attn_rows.h). */
TGT INLINE void attn_set(const struct attn_row *rows, int nr, struct row_state *st,
                         const void *k_cache, const void *v_cache, struct attn_walks w, float scale,
                         float cap, const int NV, const int KT, const struct attn_parts *pp)
{
    struct key_walk kw = w.kw, pw = w.pf;
    const int hd = 8 * NV;
    /* rows a register block shares each K and V load among: one for heads of 256, whose
     * blocks' code would double the sanitized build's time of this file */
    const int RB = NV >= 32 ? 1 : 3;
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
    const __m256 vscale = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(-INFINITY);
    size_t offs[SPAN];
    struct key_prefetch pf = key_prefetch_start(pw, key1 - key0, k_cache, v_cache, w.pf_elems,
                                                kv_unit_bytes(KT), PF_AHEAD, 0);
    const int pf_key_lines = (int)((pf.row_bytes + 63) / 64);
    /* A prompt's set over a Q8_0 cache (more rows of one kv head than a register block): each
     * chunk's K and V rows dequantized once into float stages that every block then reads, as
     * in attn_avx512_body.h (pp4096 0.85x fp16's speed without). The same bits. */
    bool stage = KT == KV_Q8 && nr > 3;
    for (int r = 1; stage && r < nr; r++) stage = rows[r].col == rows[0].col;
    _Alignas(32) float kst[CHUNK * HD_MAX], vst[CHUNK * HD_MAX];
    size_t so[CHUNK]; /* a stage's rows */
    for (int k = 0; k < CHUNK; k++) so[k] = (size_t)k * (size_t)hd;
    for (int part0 = key0 - key0 % ATTN_PART; part0 < key1; part0 += ATTN_PART) {
        int part1 = key1 - part0 < ATTN_PART ? key1 : part0 + ATTN_PART;
        /* a row whose keys ended in an earlier partition (or start in a later one) keeps what
         * they left */
        for (int r = 0; r < nr; r++) {
            if (rows[r].n_keys <= part0 || rows[r].key0 >= part0 + ATTN_PART) continue;
            st[r].m = -INFINITY;
            st[r].l = 0;
            for (int v = 0; v < NV; v++) _mm256_store_ps(st[r].acc + 8 * v, _mm256_setzero_ps());
        }
        for (int j0 = part0 > key0 ? part0 : key0; j0 < part1; j0 += SPAN) {
            int span = part1 - j0 < SPAN ? part1 - j0 : SPAN;
            int chunks = (span + CHUNK - 1) / CHUNK;
            __m256 vmax[ATTN_ROWS];
            for (int r = 0; r < nr; r++) vmax[r] = neg_inf;
            /* 1. scores */
            for (int c = 0; c < chunks; c++) {
                size_t *o = offs + c * CHUNK;
                int left = span - c * CHUNK;
                for (int k = 0; k < CHUNK; k++) o[k] = k < left ? key_next(&kw) : o[0];
                pf.budget = CHUNK * pf_key_lines;
                if (KT == KV_Q8 && stage) stage_rows(kst, k_cache, o, rows[0].col, CHUNK, NV);
                for (int r = 0; r < nr;) {
                    if (!chunk_keys(rows, r, c, j0)) {
                        r++;
                        continue;
                    }
                    int b = block_rows(rows, nr, r, c, j0, RB);
                    if (KT == KV_Q8 && stage) {
                        if (RB >= 3 && b == 3)
                            score_rows(rows, st, vmax, r, 3, kst, so, 0, c, j0, NV, KV_F32, vscale,
                                       cap, &pf);
                        else if (RB >= 2 && b == 2)
                            score_rows(rows, st, vmax, r, 2, kst, so, 0, c, j0, NV, KV_F32, vscale,
                                       cap, &pf);
                        else
                            score_rows(rows, st, vmax, r, 1, kst, so, 0, c, j0, NV, KV_F32, vscale,
                                       cap, &pf);
                    } else {
                        size_t col = rows[r].col;
                        if (RB >= 3 && b == 3)
                            score_rows(rows, st, vmax, r, 3, k_cache, o, col, c, j0, NV, KT, vscale,
                                       cap, &pf);
                        else if (RB >= 2 && b == 2)
                            score_rows(rows, st, vmax, r, 2, k_cache, o, col, c, j0, NV, KT, vscale,
                                       cap, &pf);
                        else
                            score_rows(rows, st, vmax, r, 1, k_cache, o, col, c, j0, NV, KT, vscale,
                                       cap, &pf);
                    }
                    r += b;
                }
                /* what the blocks left of this chunk's keys */
                key_prefetch_lines(&pf, pf.budget);
            }
            /* 2. maximum, rescale factor, weights */
            for (int r = 0; r < nr; r++) {
                if (!span_reads(rows, r, j0, span)) continue;
                int cnt = rows[r].n_keys - j0;
                cnt = cnt < SPAN ? cnt : SPAN;
                float mc = hmax8(vmax[r]);
                float mnew = mc > st[r].m ? mc : st[r].m;
                st[r].corr = _mm256_cvtss_f32(exp256(_mm256_set1_ps(st[r].m - mnew)));
                __m256 vm = _mm256_set1_ps(mnew), lsum = _mm256_setzero_ps();
                for (int c = 0; c * CHUNK < cnt; c++) {
                    /* keys before a window's first weigh exactly 0 (a chunk it skipped holds
                     * no scores) */
                    __m256 in = _mm256_andnot_ps(first_lanes(rows[r].key0 - j0 - c * CHUNK),
                                                 first_lanes(cnt - c * CHUNK));
                    if (!chunk_keys(rows, r, c, j0)) in = _mm256_setzero_ps();
                    __m256 p = _mm256_and_ps(
                        exp256(_mm256_sub_ps(_mm256_load_ps(st[r].p + c * CHUNK), vm)), in);
                    _mm256_store_ps(st[r].p + c * CHUNK, p);
                    lsum = _mm256_add_ps(lsum, p);
                }
                st[r].l = st[r].l * st[r].corr + hsum8(lsum);
                st[r].m = mnew;
                for (int v = 0; v < NV; v++) _mm256_store_ps(st[r].pa + 8 * v, _mm256_setzero_ps());
            }
            /* 3. p . V in key order */
            for (int c = 0; c < chunks; c++) {
                const size_t *o = offs + c * CHUNK;
                if (KT == KV_Q8 && stage) {
                    int keys = 0;
                    for (int r = 0; r < nr; r++) {
                        int n = chunk_keys(rows, r, c, j0);
                        keys = n > keys ? n : keys;
                    }
                    stage_rows(vst, v_cache, o, rows[0].col, keys, NV);
                }
                for (int r = 0; r < nr;) {
                    int n = chunk_keys(rows, r, c, j0);
                    if (!n) {
                        r++;
                        continue;
                    }
                    int b = block_rows(rows, nr, r, c, j0, RB);
                    if (KT == KV_Q8 && stage) {
                        if (RB >= 3 && b == 3)
                            pv_rows(st, r, 3, vst, so, 0, c, n, NV, KV_F32);
                        else if (RB >= 2 && b == 2)
                            pv_rows(st, r, 2, vst, so, 0, c, n, NV, KV_F32);
                        else
                            pv_rows(st, r, 1, vst, so, 0, c, n, NV, KV_F32);
                    } else if (RB >= 3 && b == 3) {
                        pv_rows(st, r, 3, v_cache, o, rows[r].col, c, n, NV, KT);
                    } else if (RB >= 2 && b == 2) {
                        pv_rows(st, r, 2, v_cache, o, rows[r].col, c, n, NV, KT);
                    } else {
                        pv_rows(st, r, 1, v_cache, o, rows[r].col, c, n, NV, KT);
                    }
                    r += b;
                }
            }
            for (int r = 0; r < nr; r++) {
                if (!span_reads(rows, r, j0, span)) continue;
                __m256 vc = _mm256_set1_ps(st[r].corr);
                for (int v = 0; v < NV; v++)
                    _mm256_store_ps(st[r].acc + 8 * v,
                                    _mm256_fmadd_ps(_mm256_load_ps(st[r].acc + 8 * v), vc,
                                                    _mm256_load_ps(st[r].pa + 8 * v)));
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
        __m256 vl = _mm256_set1_ps(st[r].l);
        for (int v = 0; v < NV; v++)
            _mm256_storeu_ps(rows[r].out + 8 * v,
                             _mm256_div_ps(_mm256_load_ps(st[r].acc + 8 * v), vl));
    }
}

/* Tokens [t0, t1) x query heads [h0, h1) over a cache of kind KT. */
TGT INLINE void attention_kv(float *out, const float *q, const void *k_cache, const void *v_cache,
                             const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,
                             int h0, int h1, const int KT, const struct attn_parts *pp)
{
    int hd = s->head_dim;
    if (hd != 64 && hd != 128 && hd != 256) {
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
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, s->softcap, 8, KT, pp);
            else if (hd == 128)
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, s->softcap, 16, KT, pp);
            else
                attn_set(rows, nr, st, k_cache, v_cache, w, s->scale, s->softcap, 32, KT, pp);
        }
    }
}

/* The table's entry points: float, fp16 or Q8_0 cache; _part, the partitions pp names of each row,
 * written as records (attn_part.h); the whole-row entry is the _part one with no partitions,
 * so each kernel is compiled once per cache type (twice, the sanitized build's two slowest
 * files took twice as long). */
#define ATTN_ENTRY(name, T, KT)                                                                    \
    __attribute__((noinline))                                                                      \
    TGT void name##_part(float *out, const float *q, const T *k_cache, const T *v_cache,           \
                         const struct attn_batch *b, const struct attn_shape *s, int t0, int t1,   \
                         int h0, int h1, const struct attn_parts *pp)                              \
    {                                                                                              \
        attention_kv(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, KT, pp);                      \
    }                                                                                              \
    TGT void name(float *out, const float *q, const T *k_cache, const T *v_cache,                  \
                  const struct attn_batch *b, const struct attn_shape *s, int t0, int t1, int h0,  \
                  int h1)                                                                          \
    {                                                                                              \
        name##_part(out, q, k_cache, v_cache, b, s, t0, t1, h0, h1, NULL);                         \
    }

ATTN_ENTRY(avx2_attention, float, KV_F32)
ATTN_ENTRY(avx2_attention_f16, uint16_t, KV_F16)
ATTN_ENTRY(avx2_attention_q8, uint8_t, KV_Q8)
