/* CPU kernel conformance: every fast kernel against the scalar reference (kernels/cpu/ref.c) on
 * random inputs at odd sizes, once per instruction set this machine has (forced through
 * backend_cpu_opts.isa), plus batch invariance (a token's outputs are bit-identical alone and
 * inside a batch of 37) and thread-count invariance.
 *
 * Tolerances: the Q8 matmul, activation quantization and RoPE must equal the reference bit for
 * bit on every ISA; the F32 matmul is within 1e-5 of sum |w x| per output; attention within
 * 1e-6 of the largest value, RMSNorm and SiLU within a few ulp.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../kernels/backend.h"
#include "../kernels/cpu/kern.h"
#include "../kernels/cpu/qpack.h"
#include "../kernels/cpu/ref.h"
#include "../quant/quantize.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

/* ---- helpers ---- */

static const enum cpu_isa all_isas[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVXVNNI,
                                        CPU_ISA_AVX512, CPU_ISA_AMX};
#define N_ISAS ((int)(sizeof all_isas / sizeof all_isas[0]))

static struct backend *make_backend(enum cpu_isa isa, enum matmul_precision p, int threads)
{
    struct backend *be = NULL;
    struct qerr err = {0};
    struct backend_cpu_opts o = {.n_threads = threads, .precision = p, .isa = isa};
    ck_assert_msg(backend_cpu_create(&o, &be, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(backend_cpu_isa(be), isa);
    return be;
}

/* y[n][rows] through a backend: prepare, run, release. */
static void be_matmul(struct backend *be, const struct bweight *w0, const float *x, int n, float *y)
{
    struct bweight w = *w0;
    struct qerr err = {0};
    ck_assert_msg(be->ops->weight_prepare(be, &w, &err) == 0, "%s", err.msg);
    be->ops->matmul(be, &w, x, n, y);
    be->ops->weight_release(be, &w);
}

static const enum qtype quant_types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};

/* Q8_0 values moved into [-16, 15], as every tensor of a Q5_0 file is once gguf_open has read it
 * as Q8_0 (qconv.h): -16 and 15 both occur in any block of random bytes, nearly always. */
static void squeeze_to_five_bits(struct bweight *w)
{
    struct block_q8_0 *blk = (struct block_q8_0 *)w->host;
    for (int64_t i = 0; i < w->rows * (w->cols / QK); i++)
        for (int j = 0; j < QK; j++) blk[i].qs[j] = (int8_t)((blk[i].qs[j] & 31) - 16);
}

/* The packed kinds the kernels meet: each quant type's own layout, then Q8_0 values that fit five
 * bits, which qpack stores as QPACK_Q5_0. */
#define N_PACKED 4
static const char *const packed_names[N_PACKED] = {"Q8_0", "Q4_0", "Q4_1", "Q8_0 in 5 bits"};

static void make_packed_weight(struct bweight *w, size_t kind, int64_t rows, int64_t cols)
{
    tu_make_weight(w, kind < 3 ? quant_types[kind] : QTYPE_Q8_0, rows, cols);
    if (kind == 3) squeeze_to_five_bits(w);
}
static const int64_t odd_rows[] = {1, 7, 16, 17, 33, 100};
static const int64_t odd_cols[] = {32, 96, 576, 1536};
static const int odd_n[] = {1, 2, 3, 5, 8, 13, 37, 64};

/* ---- packing ---- */

START_TEST(qpack_roundtrip)
{
    tu_seed(0x1234567);
    struct page_arena arena = {0}; /* as the backend packs them: zeroed, in shared chunks */
    const enum qpack_layout layouts[N_PACKED] = {QPACK_Q8_0, QPACK_Q4_0, QPACK_Q4_1, QPACK_Q5_0};
    for (size_t ti = 0; ti < N_PACKED; ti++)
        for (size_t ri = 0; ri < sizeof odd_rows / sizeof odd_rows[0]; ri++)
            for (size_t ci = 0; ci < sizeof odd_cols / sizeof odd_cols[0]; ci++) {
                struct bweight w;
                make_packed_weight(&w, ti, odd_rows[ri], odd_cols[ci]);
                struct qpack *p;
                struct qerr err = {0};
                ck_assert_msg(qpack_create(&w, &arena, &p, &err) == 0, "%s", err.msg);
                ck_assert_msg(p->layout == layouts[ti], "%s %lld x %lld: layout %d",
                              packed_names[ti], (long long)w.rows, (long long)w.cols, p->layout);
                size_t rb = qtype_row_bytes(w.type, (size_t)w.cols);
                uint8_t *row = malloc(rb);
                for (int64_t r = 0; r < w.rows; r++) {
                    qpack_unpack_row(p, r, row);
                    ck_assert_msg(!memcmp(row, (const uint8_t *)w.host + (size_t)r * rb, rb),
                                  "%s %lld x %lld: row %lld does not round-trip", packed_names[ti],
                                  (long long)w.rows, (long long)w.cols, (long long)r);
                }
                ck_assert_int_eq(p->data_bytes % 64, 0);
                free(row);
                qpack_free(p);
                tu_free_weight(&w);
            }
    page_arena_close(&arena);
}
END_TEST

static bool mapped(const void *p)
{
    unsigned char v;
    uintptr_t page = (uintptr_t)p & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1);
    return mincore((void *)page, 1, &v) == 0;
}

static bool all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* The packed weights' memory: small allocations back to back in a chunk that starts on a 2 MiB
 * boundary, a large one in a chunk of its own, and a chunk unmapped only when neither an
 * allocation nor the arena holds it, in whichever order they let go. */
START_TEST(page_arena_chunks)
{
    const size_t huge = (size_t)2 << 20;
    struct page_arena a = {0};
    struct page_chunk *c1, *c2, *c3, *cb;
    unsigned char *p1 = page_arena_alloc(&a, 100, &c1);
    unsigned char *p2 = page_arena_alloc(&a, 5000, &c2);
    unsigned char *p3 = page_arena_alloc(&a, huge + 7, &c3);
    ck_assert(p1 && p2 && p3);
    ck_assert(c1 == c2 && c2 == c3);
    ck_assert_uint_eq((uintptr_t)p1 % huge, 0);
    ck_assert_uint_eq((uintptr_t)p2 % 64, 0);
    ck_assert_uint_eq((uintptr_t)p3 % 64, 0);
    ck_assert(p2 >= p1 + 100 && p3 >= p2 + 5000);
    ck_assert(all_zero(p1, 100) && all_zero(p2, 5000) && all_zero(p3, huge + 7));
#if defined(__SANITIZE_ADDRESS__)
    ck_assert(!__asan_address_is_poisoned(p1 + 99));
    ck_assert(__asan_address_is_poisoned(p1 + 100)); /* a read past a weight is caught */
#endif
    memset(p1, 1, 100);
    memset(p2, 2, 5000);
    memset(p3, 3, huge + 7);

    unsigned char *pb = page_arena_alloc(&a, 5 * huge, &cb);
    ck_assert(pb && cb != c1);
    ck_assert_uint_eq((uintptr_t)pb % huge, 0);
    memset(pb, 4, 5 * huge);
    /* the open chunk stayed open: the next small one follows p3 */
    struct page_chunk *c4;
    unsigned char *p4 = page_arena_alloc(&a, 64, &c4);
    ck_assert(p4 && c4 == c1 && p4 > p3);

    /* allocations of 3 MiB until one opens another chunk; the first keeps its bytes */
    struct page_chunk *cs[32];
    unsigned char *ps[32];
    int n = 0;
    do {
        ck_assert_int_lt(n, 32);
        ps[n] = page_arena_alloc(&a, 3 * huge / 2, &cs[n]);
        ck_assert(ps[n]);
        memset(ps[n], 5, 3 * huge / 2);
    } while (cs[n++] == c1);
    ck_assert_int_gt(n, 1);
    struct page_chunk *c2nd = cs[n - 1];
    ck_assert_uint_eq((uintptr_t)ps[n - 1] % huge, 0);
    ck_assert(p2[4999] == 2 && p3[huge + 6] == 3);

    /* c1 is closed now: it goes when its last allocation does */
    page_arena_free(c1);
    page_arena_free(c2);
    page_arena_free(c4);
    for (int i = 0; i < n - 1; i++) page_arena_free(cs[i]);
    ck_assert(mapped(p3) && p3[0] == 3);
    page_arena_free(c3);
    ck_assert(!mapped(p3));
    /* the large one's chunk goes with it */
    ck_assert(mapped(pb));
    page_arena_free(cb);
    ck_assert(!mapped(pb));
    /* the open chunk outlives the arena's hold while an allocation is left in it */
    page_arena_close(&a);
    ck_assert(a.open == NULL && mapped(ps[n - 1]) && ps[n - 1][0] == 5);
    page_arena_free(c2nd);
    ck_assert(!mapped(ps[n - 1]));
    /* and an open chunk without allocations goes with the arena's hold */
    struct page_chunk *c5;
    unsigned char *p5 = page_arena_alloc(&a, 64, &c5);
    page_arena_free(c5);
    ck_assert(mapped(p5));
    page_arena_close(&a);
    ck_assert(!mapped(p5));
}
END_TEST

/* The five-bit layout is taken exactly when every value fits: one value of 16 or -17 anywhere
 * keeps the 8-bit one. Its bytes per row and block are the Q5_0 file's 22, and the padded last
 * group's rows are zeros (their outputs are never stored). */
START_TEST(qpack_five_bit_layout)
{
    tu_seed(0x5b175);
    struct bweight w;
    make_packed_weight(&w, 3, 33, 96);
    struct qpack *p;
    struct qerr err = {0};
    ck_assert_msg(qpack_create(&w, NULL, &p, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(p->layout, QPACK_Q5_0);
    ck_assert_uint_eq(p->quant_bytes + p->scale_bytes, 22 * QPACK_ROWS);
    qpack_free(p);
    /* what the backend says a pass reads: the packed bytes (3 groups of 16 rows, 3 blocks
     * each, the scales padded to 64), the file's rows where nothing is packed (scalar) */
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        struct backend *be = make_backend(all_isas[i], MATMUL_Q8, 1);
        struct bweight pw = w;
        ck_assert_msg(be->ops->weight_prepare(be, &pw, &err) == 0, "%s", err.msg);
        size_t want = all_isas[i] == CPU_ISA_SCALAR ? 33 * 3 * sizeof(struct block_q8_0)
                                                    : 3 * (128 + 3 * 320);
        ck_assert_uint_eq(backend_weight_bytes(be, &pw), want);
        be->ops->weight_release(be, &pw);
        backend_destroy(be);
    }
    struct block_q8_0 *blk = (struct block_q8_0 *)w.host;
    const int8_t outside[] = {16, -17, 127, -128};
    for (size_t i = 0; i < sizeof outside; i++) {
        int8_t keep = blk[97].qs[31];
        blk[97].qs[31] = outside[i];
        ck_assert_msg(qpack_create(&w, NULL, &p, &err) == 0, "%s", err.msg);
        ck_assert_msg(p->layout == QPACK_Q8_0, "a value of %d took the five-bit layout",
                      outside[i]);
        qpack_free(p);
        blk[97].qs[31] = keep;
    }
    tu_free_weight(&w);
}
END_TEST

/* The largest sums five-bit weights make: every value 15 (stored as 31) or -16 (stored as 0)
 * against activations all +-1 (quantized to +-127), where a 256-bit kernel's int16 pair sums
 * would wrap if held over a whole block. GEMV (1 token) and tiles (5, 16, 48: the AMX kernel's
 * sets); rows of 576 and of 2080 (65 blocks: wider than the AVX-512 pair tile widens, so one-group
 * tiles run them, and more than the AMX kernel widens at a time). */
START_TEST(five_bit_extremes_match_reference)
{
    const int64_t rows = 33, cols = _i ? 2080 : 576;
    const int8_t values[] = {15, -16};
    const float xs[] = {1.0f, -1.0f};
    const int ns[] = {1, 5, 16, 48};
    const int nmax = 48;
    float *x = malloc((size_t)nmax * cols * sizeof *x),
          *y = malloc((size_t)nmax * rows * sizeof *y);
    float *yq = malloc((size_t)nmax * rows * sizeof *yq);
    for (size_t vi = 0; vi < sizeof values; vi++)
        for (size_t xi = 0; xi < 2; xi++) {
            struct bweight w;
            tu_make_weight(&w, QTYPE_Q8_0, rows, cols);
            struct block_q8_0 *blk = (struct block_q8_0 *)w.host;
            for (int64_t i = 0; i < rows * (cols / QK); i++) memset(blk[i].qs, values[vi], QK);
            for (int64_t i = 0; i < nmax * cols; i++) x[i] = xs[xi];
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni];
                struct q8act a;
                tu_q8_quantize(&a, x, n, cols);
                ref_matmul_q8_rows(&w, &a, n, yq, 0, rows);
                for (int i = 1; i < N_ISAS; i++) {
                    if (!cpu_isa_supported(all_isas[i])) continue;
                    struct backend *be = make_backend(all_isas[i], MATMUL_Q8, 1);
                    be_matmul(be, &w, x, n, y);
                    size_t at;
                    ck_assert_msg(!tu_bits_differ(y, yq, (size_t)n * rows, &at),
                                  "%s, values %d, x %g, %lld columns, n %d: y[%zu] = %.9g, "
                                  "reference %.9g",
                                  cpu_isa_name(all_isas[i]), values[vi], xs[xi], (long long)cols, n,
                                  at, y[at], yq[at]);
                    backend_destroy(be);
                }
                tu_q8_free(&a);
            }
            tu_free_weight(&w);
        }
    free(x);
    free(y);
    free(yq);
}
END_TEST

START_TEST(qpack_rejects_bad_shapes)
{
    struct bweight w = {.type = QTYPE_Q4_0, .rows = 4, .cols = 48};
    struct qpack *p;
    struct qerr err = {0};
    ck_assert_int_eq(qpack_create(&w, NULL, &p, &err), QERR_INVALID);
    w = (struct bweight){.type = QTYPE_F32, .rows = 4, .cols = 64};
    ck_assert_int_eq(qpack_create(&w, NULL, &p, &err), QERR_UNSUPPORTED);
}
END_TEST

/* ---- activation quantization ---- */

START_TEST(quantize_q8_matches_reference)
{
    tu_seed(0xabcdef);
    const int64_t cols_max = 1536;
    int64_t cols = cols_max, nb = cols / QK;
    float *x = malloc(cols_max * sizeof *x);
    int8_t q0[1536], q1[1536];
    float d0[48], d1[48], s0[48], s1[48];
    int32_t u0[48], u1[48];
    for (int rep = 0; rep < 200; rep++) {
        /* whole and partial runs of 16 blocks (the SIMD kernels take 16 at once), and fewer */
        cols = rep % 3 == 0 ? cols_max : rep % 3 == 1 ? 576 : 5 * QK;
        nb = cols / QK;
        tu_fill(x, (size_t)cols, rep % 7 == 0 ? 1e-30f : tu_frand(0.01f, 100.0f));
        if (rep % 5 == 1) x[3 * QK + 7] = -1e6f; /* one block far larger than its neighbours */
        for (int j = 0; j < QK; j++) x[j] = 0;   /* an all-zero block */
        x[40] = 127.5f * x[41];                  /* exact halves appear in practice too */
        ref_quantize_q8(x, cols, q0, d0, s0, u0);
        for (int i = 1; i < N_ISAS; i++) {
            if (!cpu_isa_supported(all_isas[i])) continue;
            cpu_kernels_for(all_isas[i])->quantize_q8(x, cols, q1, d1, s1, u1);
            ck_assert_msg(!memcmp(q0, q1, (size_t)cols), "%s: quants differ (%lld columns)",
                          cpu_isa_name(all_isas[i]), (long long)cols);
            ck_assert(!memcmp(d0, d1, (size_t)nb * 4) && !memcmp(s0, s1, (size_t)nb * 4) &&
                      !memcmp(u0, u1, (size_t)nb * 4));
        }
    }
    for (int b = 0; b < nb; b++) {
        int32_t sum = 0;
        for (int j = 0; j < QK; j++) sum += q0[b * QK + j];
        ck_assert_int_eq(sum, u0[b]);
    }
    free(x);
}
END_TEST

/* ---- matmul ---- */

START_TEST(matmul_matches_reference)
{
    tu_seed(0x5eed + (uint64_t)_i);
    int shrink = tu_sanitized();
    int runs[N_ISAS] = {0};
    double worst_f32[N_ISAS] = {0};
    for (size_t ti = 0; ti < N_PACKED; ti++)
        for (size_t ri = 0; ri < sizeof odd_rows / sizeof odd_rows[0]; ri++)
            for (size_t ci = 0; ci < sizeof odd_cols / sizeof odd_cols[0]; ci++) {
                if (shrink && odd_cols[ci] > 576) continue;
                int n = odd_n[(ri + ci + ti) % (sizeof odd_n / sizeof odd_n[0])];
                struct bweight w;
                make_packed_weight(&w, ti, odd_rows[ri], odd_cols[ci]);
                size_t ny = (size_t)n * (size_t)w.rows;
                float *x = malloc((size_t)n * (size_t)w.cols * sizeof *x);
                tu_fill(x, (size_t)n * (size_t)w.cols, 1.0f);
                float *yref = malloc(ny * sizeof *yref), *yq = malloc(ny * sizeof *yq);
                float *y = malloc(ny * sizeof *y);
                ref_matmul_rows(&w, x, n, yref, 0, w.rows);
                struct q8act a;
                tu_q8_quantize(&a, x, n, w.cols);
                ref_matmul_q8_rows(&w, &a, n, yq, 0, w.rows);
                for (int i = 0; i < N_ISAS; i++) {
                    if (!cpu_isa_supported(all_isas[i])) continue;
                    runs[i]++;
                    /* one thread on every other shape: one task then spans all the row
                     * groups, so the kernels' multi-group tiles meet every row count */
                    struct backend *be = make_backend(all_isas[i], MATMUL_Q8, 1 + (int)(ci % 2));
                    be_matmul(be, &w, x, n, y);
                    size_t at;
                    ck_assert_msg(!tu_bits_differ(y, yq, ny, &at),
                                  "%s Q8 %s %lld x %lld n %d: y[%zu] = %.9g, reference %.9g",
                                  cpu_isa_name(all_isas[i]), packed_names[ti], (long long)w.rows,
                                  (long long)w.cols, n, at, y[at], yq[at]);
                    backend_destroy(be);
                    be = make_backend(all_isas[i], MATMUL_F32, 2);
                    be_matmul(be, &w, x, n, y);
                    double e = tu_matmul_error(&w, x, n, y, yref);
                    ck_assert_msg(e <= 1e-5, "%s F32 %s %lld x %lld n %d: error %.3g",
                                  cpu_isa_name(all_isas[i]), packed_names[ti], (long long)w.rows,
                                  (long long)w.cols, n, e);
                    if (e > worst_f32[i]) worst_f32[i] = e;
                    backend_destroy(be);
                }
                tu_q8_free(&a);
                free(x);
                free(y);
                free(yq);
                free(yref);
                tu_free_weight(&w);
            }
    for (int i = 0; i < N_ISAS; i++)
        if (runs[i])
            printf("matmul %s: %d shapes, Q8 bit-exact, F32 worst error %.2e\n",
                   cpu_isa_name(all_isas[i]), runs[i], worst_f32[i]);
}
END_TEST

/* The AVX-512 GEMV's weight prefetch (into L1 or L2, chosen by the core) changes no bit: both
 * give the reference's results, on weights longer than the prefetch distance; so too the AMX
 * kernel's (33 and 40 tokens: two sets on the tiles and a short one of 1 or 8 rows). */
START_TEST(matmul_prefetch_variants)
{
    if (!cpu_isa_supported(CPU_ISA_AVX512)) return;
    tu_seed(0x9f1);
    const int ns[] = {1, 8, 13, 33, 40};
    for (size_t ti = 0; ti < N_PACKED; ti++) {
        struct bweight w;
        make_packed_weight(&w, ti, 100, 1536);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            int n = ns[ni];
            size_t ny = (size_t)n * (size_t)w.rows;
            float *x = malloc((size_t)n * (size_t)w.cols * sizeof *x);
            float *yq = malloc(ny * sizeof *yq), *y = malloc(ny * sizeof *y);
            tu_fill(x, (size_t)n * (size_t)w.cols, 1.0f);
            struct q8act a;
            tu_q8_quantize(&a, x, n, w.cols);
            ref_matmul_q8_rows(&w, &a, n, yq, 0, w.rows);
            const enum cpu_prefetch pfs[] = {CPU_PREFETCH_L1, CPU_PREFETCH_L2};
            for (int p = 0; p < 4; p++) {
                enum cpu_isa isa = p < 2 ? CPU_ISA_AVX512 : CPU_ISA_AMX;
                if (!cpu_isa_supported(isa)) continue;
                struct backend *be = NULL;
                struct qerr err = {0};
                struct backend_cpu_opts o = {
                    .n_threads = 2, .precision = MATMUL_Q8, .isa = isa, .prefetch = pfs[p % 2]};
                ck_assert_msg(backend_cpu_create(&o, &be, &err) == 0, "%s", err.msg);
                memset(y, 0xff, ny * sizeof *y);
                be_matmul(be, &w, x, n, y);
                size_t at;
                ck_assert_msg(!tu_bits_differ(y, yq, ny, &at),
                              "%s prefetch %s, %s n %d: y[%zu] = %.9g, reference %.9g",
                              cpu_isa_name(isa), cpu_prefetch_name(pfs[p % 2]), packed_names[ti], n,
                              at, y[at], yq[at]);
                backend_destroy(be);
            }
            tu_q8_free(&a);
            free(x);
            free(y);
            free(yq);
        }
        tu_free_weight(&w);
    }
    ck_assert_int_eq(cpu_prefetch_parse("L1"), CPU_PREFETCH_L1);
    ck_assert_int_eq(cpu_prefetch_parse("l2"), CPU_PREFETCH_L2);
    ck_assert_int_eq(cpu_prefetch_parse("l3"), -1);
    ck_assert_int_ne(cpu_prefetch_best(), CPU_PREFETCH_AUTO);
}
END_TEST

START_TEST(matmul_float_weights)
{
    tu_seed(0xf10a7);
    const enum qtype types[] = {QTYPE_F32, QTYPE_F16, QTYPE_BF16};
    const int shapes[][3] = {{37, 100, 5}, {19, 64, 9}, {5, 7, 3}, {64, 576, 13}};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int rows = shapes[si][0], cols = shapes[si][1], n = shapes[si][2];
            if (types[ti] != QTYPE_F32 && cols % 2) continue;
            struct bweight w;
            tu_make_weight(&w, types[ti], rows, cols);
            float *x = malloc((size_t)n * (size_t)cols * 4), *y = malloc((size_t)n * rows * 4);
            float *yref = malloc((size_t)n * rows * 4), *y1 = malloc((size_t)rows * 4);
            tu_fill(x, (size_t)n * (size_t)cols, 1.0f);
            ref_matmul_rows(&w, x, n, yref, 0, w.rows);
            for (int i = 0; i < N_ISAS; i++) {
                if (!cpu_isa_supported(all_isas[i])) continue;
                for (int p = 0; p < 2; p++) {
                    struct backend *be = make_backend(all_isas[i], (enum matmul_precision)p, 3);
                    be_matmul(be, &w, x, n, y);
                    double e = tu_matmul_error(&w, x, n, y, yref);
                    ck_assert_msg(e <= 1e-5, "%s %s %dx%d: error %.3g", cpu_isa_name(all_isas[i]),
                                  qtype_name(w.type), rows, cols, e);
                    /* the last token alone: the same bits */
                    be_matmul(be, &w, x + (size_t)(n - 1) * (size_t)cols, 1, y1);
                    size_t at;
                    ck_assert(!tu_bits_differ(y1, y + (size_t)(n - 1) * rows, (size_t)rows, &at));
                    backend_destroy(be);
                }
            }
            free(x);
            free(y);
            free(yref);
            free(y1);
            tu_free_weight(&w);
        }
}
END_TEST

/* A token's row is bit-identical alone, inside a batch of 37, and at 1, 2 or 3 threads. */
START_TEST(matmul_batch_and_thread_invariant)
{
    tu_seed(0xba7c4);
    const int n = 37;
    for (size_t ti = 0; ti < N_PACKED; ti++) {
        struct bweight w;
        make_packed_weight(&w, ti, 45, 576);
        float *x = malloc((size_t)n * 576 * sizeof *x);
        tu_fill(x, (size_t)n * 576, 1.0f);
        float *yb = malloc((size_t)n * 45 * sizeof *yb), *y1 = malloc(45 * sizeof *y1);
        float *yt = malloc((size_t)n * 45 * sizeof *yt);
        for (int i = 0; i < N_ISAS; i++) {
            if (!cpu_isa_supported(all_isas[i])) continue;
            for (int p = 0; p < 2; p++) {
                struct backend *be = make_backend(all_isas[i], (enum matmul_precision)p, 2);
                be_matmul(be, &w, x, n, yb);
                for (int t = 0; t < n; t++) {
                    be_matmul(be, &w, x + (size_t)t * 576, 1, y1);
                    size_t at;
                    ck_assert_msg(!tu_bits_differ(y1, yb + (size_t)t * 45, 45, &at),
                                  "%s %s precision %d: token %d differs alone vs in a batch",
                                  cpu_isa_name(all_isas[i]), packed_names[ti], p, t);
                }
                /* prefixes of the batch: different tiles (every remainder of 8 and of 4
                 * tokens), same values */
                size_t at;
                for (int m = 2; m <= 11; m++) {
                    be_matmul(be, &w, x, m, yt);
                    ck_assert_msg(!tu_bits_differ(yt, yb, (size_t)m * 45, &at),
                                  "%s %s precision %d: the first %d tokens differ at %zu",
                                  cpu_isa_name(all_isas[i]), packed_names[ti], p, m, at);
                }
                backend_destroy(be);
                for (int th = 1; th <= 3; th += 2) {
                    be = make_backend(all_isas[i], (enum matmul_precision)p, th);
                    be_matmul(be, &w, x, n, yt);
                    ck_assert_msg(!tu_bits_differ(yt, yb, (size_t)n * 45, &at),
                                  "%s: %d threads changed output %zu", cpu_isa_name(all_isas[i]),
                                  th, at);
                    backend_destroy(be);
                }
            }
        }
        free(x);
        free(yb);
        free(y1);
        free(yt);
        tu_free_weight(&w);
    }
}
END_TEST

/* matmul_shared: weights that read one input, run as one job, give the bits of one matmul call
 * each: quantized weights of one type (shared activations), a mix of types (Q4_1 wants block
 * sums on the f32 path), a float weight among them (a job of its own), 1-3 threads (3: spans of
 * odd ends across the parts, and stealing). */
START_TEST(matmul_shared_equals_separate_calls)
{
    tu_seed(0x5ba7ed);
    const int cols = 576, ns[] = {1, 5, 70, 16}; /* 1-64 tokens: spans a thread (cpu_matmul.c) */
    const int64_t rows[] = {576, 192, 45, 1536};
    const enum qtype sets[][4] = {{QTYPE_Q8_0, QTYPE_Q8_0, QTYPE_Q8_0, QTYPE_Q8_0},
                                  {QTYPE_Q4_1, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q8_0},
                                  {QTYPE_Q4_0, QTYPE_F16, QTYPE_Q4_0, QTYPE_Q4_1},
                                  {QTYPE_Q8_0, QTYPE_Q8_0, QTYPE_Q4_1, QTYPE_Q8_0}};
    float *x = malloc((size_t)70 * cols * sizeof *x);
    tu_fill(x, (size_t)70 * cols, 1.0f);
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        struct bweight w[4];
        float *ys[4], *yone[4];
        for (int k = 0; k < 4; k++) {
            tu_make_weight(&w[k], sets[si][k], rows[k], cols);
            if (si == 3 && k != 0 && sets[si][k] == QTYPE_Q8_0) squeeze_to_five_bits(&w[k]);
            ys[k] = malloc((size_t)70 * (size_t)rows[k] * sizeof(float));
            yone[k] = malloc((size_t)70 * (size_t)rows[k] * sizeof(float));
        }
        for (int i = 0; i < N_ISAS; i++) {
            if (!cpu_isa_supported(all_isas[i])) continue;
            for (int p = 0; p < 2; p++)
                for (int th = tu_sanitized() ? 3 : 1; th <= 3; th += 2) {
                    struct backend *be = make_backend(all_isas[i], (enum matmul_precision)p, th);
                    struct qerr err = {0};
                    struct bweight pw[4];
                    const struct bweight *wp[4];
                    for (int k = 0; k < 4; k++) {
                        pw[k] = w[k];
                        ck_assert_msg(be->ops->weight_prepare(be, &pw[k], &err) == 0, "%s",
                                      err.msg);
                        wp[k] = &pw[k];
                    }
                    ck_assert(be->ops->matmul_shared);
                    /* under a sanitizer: one thread count, and n = 1 and 70 */
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0];
                         ni += tu_sanitized() ? 2 : 1) {
                        int n = ns[ni];
                        be->ops->matmul_shared(be, wp, 4, x, n, ys);
                        for (int k = 0; k < 4; k++) {
                            be->ops->matmul(be, wp[k], x, n, yone[k]);
                            size_t at;
                            ck_assert_msg(!tu_bits_differ(ys[k], yone[k], (size_t)n * rows[k], &at),
                                          "%s precision %d, %d threads, set %zu, weight %d (%s), "
                                          "n %d: element %zu differs",
                                          cpu_isa_name(all_isas[i]), p, th, si, k,
                                          qtype_name(w[k].type), n, at);
                        }
                    }
                    for (int k = 0; k < 4; k++) be->ops->weight_release(be, &pw[k]);
                    backend_destroy(be);
                }
        }
        for (int k = 0; k < 4; k++) {
            tu_free_weight(&w[k]);
            free(ys[k]);
            free(yone[k]);
        }
    }
    free(x);
}
END_TEST

/* ---- row ops ---- */

static double rel_err(float a, float b)
{
    return fabs((double)a - b) / fmax(fabs((double)b), 1e-6);
}

/* The embedding lookup reads a packed table's rows from its qpack alone (the model frees or drops
 * the bytes behind w->host, so the test takes them away): every row, for every ISA, thread count
 * and quant type, has the bits of the reference's lookup in the file's rows, one token or a
 * prompt's worth (pool tasks of 8), rows longer than embed's buffer (32768 columns) included. */
START_TEST(embed_matches_reference)
{
    tu_seed(0xe3bed);
    const int64_t shapes[][2] = {{17, 32}, {100, 96}, {49, 576}, {3, 32768}};
    const int counts[] = {1, 7, 8, 37};
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        for (int threads = 1; threads <= 2; threads++) {
            struct backend *be = make_backend(all_isas[i], MATMUL_Q8, threads);
            for (size_t ti = 0; ti < N_PACKED; ti++)
                for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                    struct bweight w0, w;
                    make_packed_weight(&w0, ti, shapes[si][0], shapes[si][1]);
                    w = w0;
                    struct qerr err = {0};
                    ck_assert_msg(be->ops->weight_prepare(be, &w, &err) == 0, "%s", err.msg);
                    if (w.impl) w.host = NULL;
                    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                        int n = counts[ci];
                        int32_t tok[37];
                        for (int t = 0; t < n; t++) tok[t] = (int32_t)(tu_rnd() % (uint64_t)w.rows);
                        tok[n - 1] = (int32_t)w.rows - 1; /* the padded last group's last row */
                        size_t len = (size_t)n * (size_t)w.cols;
                        float *y = malloc(len * sizeof *y), *r = malloc(len * sizeof *r);
                        be->ops->embed(be, &w, tok, n, y);
                        ref_embed(&w0, tok, n, r);
                        size_t at;
                        ck_assert_msg(!tu_bits_differ(y, r, len, &at),
                                      "%s %d thread(s) %s %lld x %lld, %d tokens: [%zu] %.9g vs "
                                      "%.9g",
                                      cpu_isa_name(all_isas[i]), threads, packed_names[ti],
                                      (long long)w.rows, (long long)w.cols, n, at, y[at], r[at]);
                        free(y);
                        free(r);
                    }
                    be->ops->weight_release(be, &w);
                    tu_free_weight(&w0);
                }
            backend_destroy(be);
        }
    }
}
END_TEST

START_TEST(rmsnorm_add_silu_match_reference)
{
    tu_seed(0x70);
    const int dims[] = {8, 64, 100, 576, 1536};
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        struct backend *be = make_backend(all_isas[i], MATMUL_F32, 2);
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            int dim = dims[di], n = 1 + (int)(tu_rnd() % 64);
            size_t len = (size_t)n * (size_t)dim;
            float *x = malloc(len * 4), *w = malloc((size_t)dim * 4), *o = malloc(len * 4);
            float *r = malloc(len * 4), *y = malloc(len * 4);
            tu_fill(x, len, 3.0f);
            tu_fill(w, (size_t)dim, 1.0f);
            tu_fill(y, len, 3.0f);
            be->ops->rmsnorm(be, o, x, w, n, dim, 1e-5f);
            ref_rmsnorm(r, x, w, n, dim, 1e-5f);
            for (size_t k = 0; k < len; k++)
                ck_assert_msg(fabs(o[k] - r[k]) <= 1e-6 * fabs(r[k]) + 1e-30,
                              "%s rmsnorm dim %d: %g vs %g", cpu_isa_name(all_isas[i]), dim, o[k],
                              r[k]);
            memcpy(r, x, len * 4);
            be->ops->add(be, x, y, len);
            for (size_t k = 0; k < len; k++) ck_assert_float_eq(x[k], r[k] + y[k]);
            memcpy(r, x, len * 4);
            be->ops->add_rows(be, x, w, n, dim);
            for (size_t k = 0; k < len; k++) ck_assert_float_eq(x[k], r[k] + w[k % (size_t)dim]);
            for (size_t k = 0; k < len; k++) x[k] = tu_frand(-30.0f, 30.0f);
            memcpy(r, x, len * 4);
            be->ops->silu_mul(be, x, y, len);
            ref_silu_mul(r, y, len);
            for (size_t k = 0; k < len; k++)
                ck_assert_msg(fabs(x[k] - r[k]) <= 4e-7 * fabs(r[k]) + 1e-30,
                              "%s silu: %.9g vs %.9g (err %.2e)", cpu_isa_name(all_isas[i]), x[k],
                              r[k], rel_err(x[k], r[k]));
            free(x);
            free(w);
            free(o);
            free(r);
            free(y);
        }
        backend_destroy(be);
    }
}
END_TEST

/* moe_combine is the reference's to the bit on 1 and 3 threads (a token's products in the
 * order given: tokens sharing experts, k of 1 to 8, rows large enough to split over the pool),
 * and the order matters: summed in another order, some bits move. */
START_TEST(moe_combine_matches_reference)
{
    tu_seed(0x3e);
    const struct {
        int n, k, dim;
    } shapes[] = {{1, 1, 64}, {7, 2, 576}, {64, 8, 96}, {300, 2, 576}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si].n, k = shapes[si].k, dim = shapes[si].dim, rows = n * k;
        float *y = malloc((size_t)rows * (size_t)dim * 4), *w = malloc((size_t)rows * 4);
        float *want = malloc((size_t)n * (size_t)dim * 4),
              *got = malloc((size_t)n * (size_t)dim * 4);
        int32_t *idx = malloc((size_t)rows * 4);
        tu_fill(y, (size_t)rows * (size_t)dim, 4.0f);
        for (int i = 0; i < rows; i++) {
            idx[i] = (int32_t)(tu_rnd() % (uint64_t)rows);
            w[i] = tu_frand(0.0f, 1.0f);
        }
        ref_moe_combine(want, y, idx, w, n, k, dim);
        for (int th = 1; th <= 3; th += 2) {
            struct backend *be = make_backend(cpu_isa_best(), MATMUL_F32, th);
            memset(got, 0xff, (size_t)n * (size_t)dim * 4); /* NaNs: every row must be written */
            be->ops->moe_combine(be, got, y, idx, w, n, k, dim);
            size_t at;
            ck_assert_msg(!tu_bits_differ(got, want, (size_t)n * (size_t)dim, &at),
                          "n %d k %d dim %d, %d threads: element %zu is %.9g, the reference's %.9g",
                          n, k, dim, th, at, got[at], want[at]);
            backend_destroy(be);
        }
        if (k >= 8) { /* the last expert first: the sums round differently */
            for (int t = 0; t < n; t++) {
                int32_t *r = idx + (size_t)t * (size_t)k;
                float *ww = w + (size_t)t * (size_t)k;
                for (int a = 0, b = k - 1; a < b; a++, b--) {
                    int32_t ti = r[a];
                    r[a] = r[b];
                    r[b] = ti;
                    float tw = ww[a];
                    ww[a] = ww[b];
                    ww[b] = tw;
                }
            }
            ref_moe_combine(got, y, idx, w, n, k, dim);
            size_t at;
            ck_assert(tu_bits_differ(got, want, (size_t)n * (size_t)dim, &at));
        }
        free(y);
        free(w);
        free(want);
        free(got);
        free(idx);
    }
}
END_TEST

START_TEST(large_batch_ops_thread_invariant)
{
    /* big enough that the ops split across the pool */
    tu_seed(0x1a7);
    const int n = 300, dim = 576, ffn = 1536;
    float *x = malloc((size_t)n * ffn * 4), *u = malloc((size_t)n * ffn * 4);
    float *w = malloc(dim * 4), *out[2];
    tu_fill(w, dim, 1.0f);
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        for (int th = 0; th < 2; th++) {
            struct backend *be = make_backend(all_isas[i], MATMUL_F32, th ? 3 : 1);
            tu_seed(0x1a8);
            tu_fill(x, (size_t)n * ffn, 2.0f);
            tu_fill(u, (size_t)n * ffn, 2.0f);
            out[th] = calloc((size_t)n * ffn * 2, 4); /* rmsnorm fills n * dim of the first half */
            be->ops->rmsnorm(be, out[th], x, w, n, dim, 1e-5f);
            be->ops->silu_mul(be, x, u, (size_t)n * ffn);
            be->ops->add(be, x, u, (size_t)n * ffn);
            memcpy(out[th] + (size_t)n * ffn, x, (size_t)n * ffn * 4);
            backend_destroy(be);
        }
        size_t at;
        ck_assert(!tu_bits_differ(out[0], out[1], (size_t)n * ffn * 2, &at));
        free(out[0]);
        free(out[1]);
    }
    free(x);
    free(u);
    free(w);
}
END_TEST

START_TEST(rope_matches_reference_exactly)
{
    tu_seed(0x20be);
    const int cfg[][3] = {{64, 64, 9}, {64, 32, 3}, {128, 128, 2}, {48, 16, 1}, {20, 10, 2}};
    float factors[64];
    for (int i = 0; i < 64; i++) factors[i] = 1.0f + (float)(tu_rnd() % 3100) / 100.0f;
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        struct backend *be = make_backend(all_isas[i], MATMUL_F32, 2);
        /* each shape twice, with and without linear scaling, per-pair factors and YaRN's
         * attention factor, so a table kept from the last call under another spec would show */
        for (size_t c = 0; c < 2 * sizeof cfg / sizeof cfg[0]; c++) {
            const int *g = cfg[c % (sizeof cfg / sizeof cfg[0])];
            int hd = g[0], rot = g[1], heads = g[2], n = 1 + (int)(tu_rnd() % 64);
            size_t len = (size_t)n * (size_t)heads * (size_t)hd;
            float *x = malloc(len * 4), *r = malloc(len * 4);
            int32_t *pos = malloc((size_t)n * 4);
            for (int t = 0; t < n; t++) pos[t] = (int32_t)(tu_rnd() % 9000);
            tu_fill(x, len, 2.0f);
            memcpy(r, x, len * 4);
            bool scaled = c % 3 == 1;
            struct rope_spec rs = {.rot_dim = rot,
                                   .base = c % 2 ? 10000.0f : 100000.0f,
                                   .scale = scaled ? 0.25f : 1.0f,
                                   .factors = c % 3 == 2 ? factors : NULL,
                                   .mscale = c % 4 == 3 ? 1.1386294f : 0};
            be->ops->rope(be, x, pos, n, heads, hd, &rs);
            ref_rope(r, pos, n, heads, hd, &rs);
            size_t at;
            ck_assert_msg(!tu_bits_differ(x, r, len, &at),
                          "%s rope hd %d rot %d scale %g factors %d: [%zu] %g vs %g",
                          cpu_isa_name(all_isas[i]), hd, rot, rs.scale, rs.factors != NULL, at,
                          x[at], r[at]);
            free(x);
            free(r);
            free(pos);
        }
        backend_destroy(be);
    }
}
END_TEST

/* ---- attention ---- */

struct attn_case {
    struct attn_batch b;
    struct attn_shape s;
    int32_t *pos, *seq, *slot, *table;
    float *q, *kc, *vc;
    size_t q_len;
};

/* n tokens over 3 sequences of up to max_blocks blocks of 16 with a shuffled block table:
 * random tokens of random sequences (a decode batch), or with `prefill` consecutive positions
 * of one sequence (a prompt chunk). */
static void attn_case_make_blocks(struct attn_case *c, int n, int heads, int kv_heads, int hd,
                                  bool prefill, int max_blocks)
{
    const int n_seqs = 3, bs = 16, n_blocks = n_seqs * max_blocks;
    c->s = (struct attn_shape){heads, kv_heads, hd, 1.0f / sqrtf((float)hd), 0};
    c->pos = malloc((size_t)n * 4);
    c->seq = malloc((size_t)n * 4);
    c->slot = malloc((size_t)n * 4);
    c->table = malloc((size_t)n_seqs * max_blocks * 4);
    for (int i = 0; i < n_blocks; i++) c->table[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(tu_rnd() % (uint64_t)(i + 1)), tmp = c->table[i];
        c->table[i] = c->table[j];
        c->table[j] = tmp;
    }
    int base = (int)(tu_rnd() % (uint64_t)(max_blocks * bs - n));
    for (int t = 0; t < n; t++) {
        c->seq[t] = (int32_t)(tu_rnd() % n_seqs);
        c->pos[t] = (int32_t)(tu_rnd() % (max_blocks * bs));
        if (t % 5 == 0) c->pos[t] = t % 3; /* short contexts, a partial first chunk */
        if (prefill) {
            c->seq[t] = 1;
            c->pos[t] = base + t;
        }
        c->slot[t] = c->table[c->seq[t] * max_blocks + c->pos[t] / bs] * bs + c->pos[t] % bs;
    }
    c->b = (struct attn_batch){n, c->pos, c->seq, c->slot, n_seqs, c->table, max_blocks, bs, 0};
    size_t kv = (size_t)n_blocks * bs * (size_t)kv_heads * (size_t)hd;
    c->kc = malloc(kv * 4);
    c->vc = malloc(kv * 4);
    tu_fill(c->kc, kv, 2.0f);
    tu_fill(c->vc, kv, 1.0f);
    c->q_len = (size_t)n * (size_t)heads * (size_t)hd;
    c->q = malloc(c->q_len * 4);
    tu_fill(c->q, c->q_len, 2.0f);
}

/* ... of up to 40 blocks (640 positions: several attention spans, up to two partitions of
 * ATTN_PART keys) */
static void attn_case_make(struct attn_case *c, int n, int heads, int kv_heads, int hd,
                           bool prefill)
{
    attn_case_make_blocks(c, n, heads, kv_heads, hd, prefill, 40);
}

static void attn_case_free(struct attn_case *c)
{
    free(c->pos);
    free(c->seq);
    free(c->slot);
    free(c->table);
    free(c->kc);
    free(c->vc);
    free(c->q);
}

/* fp16 copies of c's caches (*k16, *v16, freed by the caller), the float caches rounded to the
 * same values. */
static void attn_case_fp16(struct attn_case *c, uint16_t **k16, uint16_t **v16)
{
    size_t kv_len = (size_t)c->b.n_seqs * (size_t)c->b.max_blocks * (size_t)c->b.block_size *
                    (size_t)c->s.n_kv_heads * (size_t)c->s.head_dim;
    *k16 = malloc(kv_len * 2);
    *v16 = malloc(kv_len * 2);
    for (size_t j = 0; j < kv_len; j++) {
        (*k16)[j] = f32_to_fp16(c->kc[j]);
        (*v16)[j] = f32_to_fp16(c->vc[j]);
        c->kc[j] = fp16_to_f32((*k16)[j]); /* the float cache holds the same values */
        c->vc[j] = fp16_to_f32((*v16)[j]);
    }
}

START_TEST(attention_matches_reference)
{
    tu_seed(0xa77e);
    const int cfg[][4] = {{9, 3, 64, 0},  {9, 3, 64, 1},  {4, 4, 128, 0},
                          {8, 2, 128, 1}, {6, 2, 32, 0},  {2, 1, 64, 1},
                          {16, 1, 64, 1}, {4, 1, 256, 0}, {8, 4, 256, 1}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        /* heads of 256 (the last two) run in attention_sliding_window under the sanitizers */
        if (tu_sanitized() && cfg[ci][2] == 256) break;
        int n = 1 + (int)(tu_rnd() % 64);
        struct attn_case c;
        attn_case_make(&c, n, cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3]);
        float *ref = malloc(c.q_len * 4), *out = malloc(c.q_len * 4), *one = malloc(c.q_len * 4);
        /* outputs are convex combinations of values: errors scale with the largest one */
        size_t kv_len = (size_t)c.b.n_seqs * (size_t)c.b.max_blocks * (size_t)c.b.block_size *
                        (size_t)c.s.n_kv_heads * (size_t)c.s.head_dim;
        double vmax = 0;
        for (size_t k = 0; k < kv_len; k++) vmax = fmax(vmax, fabs(c.vc[k]));
        for (int t = 0; t < n; t++)
            for (int h = 0; h < c.s.n_heads; h++)
                ref_attention_one(ref, c.q, c.kc, c.vc, &c.b, &c.s, t, h);
        for (int i = 0; i < N_ISAS; i++) {
            if (!cpu_isa_supported(all_isas[i])) continue;
            struct backend *be = make_backend(all_isas[i], MATMUL_F32, 2);
            be->ops->attention(be, out, c.q, c.kc, c.vc, &c.b, &c.s);
            for (size_t k = 0; k < c.q_len; k++)
                ck_assert_msg(fabs(out[k] - ref[k]) <= 1e-6 * vmax,
                              "%s attention heads %d/%d hd %d%s: [%zu] %.8g vs %.8g",
                              cpu_isa_name(all_isas[i]), c.s.n_heads, c.s.n_kv_heads, c.s.head_dim,
                              cfg[ci][3] ? " prefill" : "", k, out[k], ref[k]);
            /* each token alone (a batch of one, same position and sequence): same bits */
            size_t row = (size_t)c.s.n_heads * (size_t)c.s.head_dim;
            for (int t = 0; t < n; t++) {
                struct attn_batch b1 = tu_attn_token(&c.b, t);
                be->ops->attention(be, one, c.q + (size_t)t * row, c.kc, c.vc, &b1, &c.s);
                size_t at;
                ck_assert_msg(!tu_bits_differ(one, out + (size_t)t * row, row, &at),
                              "%s: token %d differs alone vs in the batch",
                              cpu_isa_name(all_isas[i]), t);
            }
            backend_destroy(be);
        }
        free(ref);
        free(out);
        free(one);
        attn_case_free(&c);
    }
}
END_TEST

/* Rows longer than ATTN_PART keys run in partitions folded in order (attn_part.h): a batch's
 * tokens (each row whole, in one kernel call) must have the bits each token gets alone, where
 * a decode batch of one cuts its rows' partitions into tasks across the threads; on one thread
 * and two, float and fp16 caches alike; and stay near the reference. */
START_TEST(attention_partitions_invariant)
{
    tu_seed(0x9a27);
    const int cfg[][3] = {{9, 3, 64}, {8, 2, 128}, {4, 1, 256}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        if (tu_sanitized() && cfg[ci][2] == 256) break; /* as attention_matches_reference */
        const int n = 24;
        struct attn_case c;
        /* 120 blocks: up to 1920 positions, four partitions */
        attn_case_make_blocks(&c, n, cfg[ci][0], cfg[ci][1], cfg[ci][2], false, 120);
        uint16_t *k16, *v16;
        attn_case_fp16(&c, &k16, &v16);
        size_t row = (size_t)c.s.n_heads * (size_t)c.s.head_dim;
        float *ref = malloc(c.q_len * 4), *all = malloc(c.q_len * 4), *one = malloc(row * 4);
        double vmax = 0;
        for (size_t k = 0;
             k < (size_t)c.b.n_seqs * 120 * 16 * (size_t)c.s.n_kv_heads * (size_t)c.s.head_dim; k++)
            vmax = fmax(vmax, fabs(c.vc[k]));
        for (int t = 0; t < n; t++)
            for (int h = 0; h < c.s.n_heads; h++)
                ref_attention_one(ref, c.q, c.kc, c.vc, &c.b, &c.s, t, h);
        for (int i = 0; i < N_ISAS; i++) {
            if (!cpu_isa_supported(all_isas[i])) continue;
            for (int f16 = 0; f16 < 2; f16++) {
                const void *kc = f16 ? (const void *)k16 : c.kc,
                           *vc = f16 ? (const void *)v16 : c.vc;
                struct backend *be1 = NULL, *be2 = NULL;
                struct qerr err = {0};
                struct backend_cpu_opts o = {
                    .n_threads = 1, .precision = MATMUL_F32, .isa = all_isas[i], .kv_f16 = f16};
                ck_assert_int_eq(backend_cpu_create(&o, &be1, &err), 0);
                o.n_threads = 2;
                ck_assert_int_eq(backend_cpu_create(&o, &be2, &err), 0);
                be2->ops->attention(be2, all, c.q, kc, vc, &c.b, &c.s);
                for (size_t k = 0; k < c.q_len; k++)
                    ck_assert_msg(fabs(all[k] - ref[k]) <= 1e-5 * vmax,
                                  "%s attention%s, %d/%d heads hd %d: [%zu] %.8g vs %.8g",
                                  cpu_isa_name(all_isas[i]), f16 ? "_f16" : "", c.s.n_heads,
                                  c.s.n_kv_heads, c.s.head_dim, k, all[k], ref[k]);
                for (int t = 0; t < n; t++) {
                    struct attn_batch b1 = tu_attn_token(&c.b, t);
                    for (int th = 1; th <= 2; th++) {
                        struct backend *be = th == 1 ? be1 : be2;
                        be->ops->attention(be, one, c.q + (size_t)t * row, kc, vc, &b1, &c.s);
                        size_t at;
                        ck_assert_msg(!tu_bits_differ(one, all + (size_t)t * row, row, &at),
                                      "%s attention%s: token %d (position %d) on %d thread(s) "
                                      "differs alone vs in the batch at [%zu]",
                                      cpu_isa_name(all_isas[i]), f16 ? "_f16" : "", t, c.pos[t], th,
                                      at);
                    }
                }
                backend_destroy(be1);
                backend_destroy(be2);
            }
        }
        free(ref);
        free(all);
        free(one);
        free(k16);
        free(v16);
        attn_case_free(&c);
    }
}
END_TEST

/* A decode batch whose one long sequence outweighs a thread's share of the keys runs its rows'
 * partitions as tasks (cpu_ops.c, attn_runs_uneven): each token must have the bits it has alone,
 * on one thread and two, near the reference. */
START_TEST(attention_uneven_decode_batch)
{
    tu_seed(0x0e7e);
    enum { SEQS = 5, MB = 72 }; /* up to 1152 positions a sequence: three partitions */
    struct attn_case c;
    attn_case_make_blocks(&c, 1, 9, 3, 64, false, 120); /* its caches: 360 blocks */
    int32_t table[SEQS * MB], pos[SEQS] = {1100, 40, 700, 90, 12}, seq[SEQS], slot[SEQS];
    for (int i = 0; i < SEQS * MB; i++) table[i] = c.table[i];
    for (int t = 0; t < SEQS; t++) {
        seq[t] = t;
        slot[t] = table[t * MB + pos[t] / 16] * 16 + pos[t] % 16;
    }
    struct attn_batch b = {SEQS, pos, seq, slot, SEQS, table, MB, 16, 0};
    size_t row = 9 * 64;
    float *q = malloc(SEQS * row * 4), *all = malloc(SEQS * row * 4), *one = malloc(row * 4),
          *ref = malloc(SEQS * row * 4);
    tu_fill(q, SEQS * row, 2.0f);
    float vmax = 0;
    for (size_t k = 0; k < (size_t)3 * 120 * 16 * 3 * 64; k++) vmax = fmaxf(vmax, fabsf(c.vc[k]));
    for (int t = 0; t < SEQS; t++)
        for (int h = 0; h < 9; h++) ref_attention_one(ref, q, c.kc, c.vc, &b, &c.s, t, h);
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        for (int th = 1; th <= 2; th++) {
            struct backend *be = NULL;
            struct qerr err = {0};
            struct backend_cpu_opts o = {
                .n_threads = th, .precision = MATMUL_F32, .isa = all_isas[i]};
            ck_assert_int_eq(backend_cpu_create(&o, &be, &err), 0);
            be->ops->attention(be, all, q, c.kc, c.vc, &b, &c.s);
            for (size_t k = 0; k < SEQS * row; k++)
                ck_assert_msg(fabsf(all[k] - ref[k]) <= 1e-5f * vmax,
                              "%s, %d thread(s): [%zu] %.8g vs %.8g", cpu_isa_name(all_isas[i]), th,
                              k, all[k], ref[k]);
            for (int t = 0; t < SEQS; t++) {
                struct attn_batch b1 = tu_attn_token(&b, t);
                be->ops->attention(be, one, q + (size_t)t * row, c.kc, c.vc, &b1, &c.s);
                size_t at;
                ck_assert_msg(!tu_bits_differ(one, all + (size_t)t * row, row, &at),
                              "%s, %d thread(s): token %d (position %d) alone vs in the batch "
                              "differs at [%zu]",
                              cpu_isa_name(all_isas[i]), th, t, pos[t], at);
            }
            backend_destroy(be);
        }
    }
    free(q);
    free(all);
    free(one);
    free(ref);
    attn_case_free(&c);
}
END_TEST

/* A prompt chunk's tokens of one kv head run in sets of up to ATTN_ROWS rows (48: 16 tokens of
 * SmolLM2's 3 GQA heads), register-blocked and sharing each K and V read: every token's rows
 * must have the bits they have alone (a decode step's set of one token's heads), on both caches,
 * at sizes below, at and past a set's size. */
START_TEST(attention_prompt_sets_match_one_token)
{
    tu_seed(0x5e75);
    const int cfg[][3] = {{9, 3, 64}, {8, 2, 128}, {16, 1, 64}, {4, 1, 256}};
    const int sizes[] = {5, 16, 17, 40};
    /* heads of 256 (the last) not under the sanitizers, as attention_matches_reference */
    size_t n_cfg = sizeof cfg / sizeof cfg[0] - (tu_sanitized() ? 1 : 0);
    for (size_t ci = 0; ci < n_cfg; ci++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            int nt = sizes[si];
            struct attn_case c;
            attn_case_make(&c, nt, cfg[ci][0], cfg[ci][1], cfg[ci][2], true);
            uint16_t *k16, *v16;
            attn_case_fp16(&c, &k16, &v16);
            float *set = malloc(c.q_len * 4), *one = malloc(c.q_len * 4);
            int group = c.s.n_heads / c.s.n_kv_heads;
            for (int i = 0; i < N_ISAS; i++) {
                if (!cpu_isa_supported(all_isas[i])) continue;
                const struct cpu_kernels *k = cpu_kernels_for(all_isas[i]);
                for (int f16 = 0; f16 < 2; f16++) {
                    memset(set, 0xff, c.q_len * 4);
                    memset(one, 0xfe, c.q_len * 4);
                    for (int kvh = 0; kvh < c.s.n_kv_heads; kvh++) {
                        int h0 = kvh * group, h1 = h0 + group;
                        if (f16)
                            k->attention_f16(set, c.q, k16, v16, &c.b, &c.s, 0, nt, h0, h1);
                        else
                            k->attention(set, c.q, c.kc, c.vc, &c.b, &c.s, 0, nt, h0, h1);
                        for (int t = 0; t < nt; t++)
                            if (f16)
                                k->attention_f16(one, c.q, k16, v16, &c.b, &c.s, t, t + 1, h0, h1);
                            else
                                k->attention(one, c.q, c.kc, c.vc, &c.b, &c.s, t, t + 1, h0, h1);
                    }
                    size_t at;
                    ck_assert_msg(!tu_bits_differ(set, one, c.q_len, &at),
                                  "%s attention%s, %d prompt tokens, heads %d/%d hd %d: [%zu] "
                                  "%.8g in the set vs %.8g alone",
                                  cpu_isa_name(all_isas[i]), f16 ? "_f16" : "", nt, c.s.n_heads,
                                  c.s.n_kv_heads, c.s.head_dim, at, set[at], one[at]);
                }
            }
            free(k16);
            free(v16);
            free(set);
            free(one);
            attn_case_free(&c);
        }
}
END_TEST

/* An fp16 KV cache: to_fp16 rounds as f32_to_fp16 on every ISA (ties, subnormals, overflow,
 * infinities); attention_f16 over fp16 values gives the bits attention gives over the same
 * values widened to float, on every ISA and in the reference; the backend with kv_f16 reports
 * 2-byte elements and writes its cache with those roundings. */
START_TEST(fp16_kv_cache)
{
    tu_seed(0xf16c);
    float special[] = {0.0f,           -0.0f,          1.0f,     65504.0f, 65520.0f,  70000.0f,
                       -1e9f,          6e-8f,          3e-8f,    1e-5f,    0.000061f, 1.0009765625f,
                       1.00048828125f, 1.00146484375f, INFINITY, -INFINITY};
    size_t ns = sizeof special / sizeof special[0], n = 1000 + ns;
    float *x = malloc(n * sizeof *x);
    uint16_t *h = malloc(n * sizeof *h), *href = malloc(n * sizeof *href);
    tu_fill(x, n, 4.0f);
    for (size_t i = 0; i < ns; i++) x[1000 + i] = special[i];
    for (size_t i = 0; i < 300; i++) x[i] *= 1e-4f; /* small ones: subnormal results */
    for (size_t i = 0; i < n; i++) href[i] = f32_to_fp16(x[i]);
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        const struct cpu_kernels *k = cpu_kernels_for(all_isas[i]);
        for (size_t len = n; len + 7 > n; len -= 3) { /* vector bodies and scalar tails */
            memset(h, 0xff, n * sizeof *h);
            k->to_fp16(x, h, len);
            for (size_t j = 0; j < len; j++)
                ck_assert_msg(h[j] == href[j], "%s to_fp16(%.9g) = %04x, want %04x",
                              cpu_isa_name(all_isas[i]), (double)x[j], h[j], href[j]);
        }
    }
    free(x);
    free(h);
    free(href);

    const int cfg[][4] = {{9, 3, 64, 0}, {9, 3, 64, 1},  {8, 2, 128, 1},
                          {6, 2, 32, 0}, {16, 2, 64, 0}, {12, 4, 128, 0}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        int nt = 1 + (int)(tu_rnd() % 40);
        struct attn_case c;
        attn_case_make(&c, nt, cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3]);
        uint16_t *k16, *v16;
        attn_case_fp16(&c, &k16, &v16);
        float *want = malloc(c.q_len * 4), *got = malloc(c.q_len * 4), *all = malloc(c.q_len * 4);
        for (int t = 0; t < nt; t++)
            for (int hh = 0; hh < c.s.n_heads; hh++) {
                ref_attention_one(want, c.q, c.kc, c.vc, &c.b, &c.s, t, hh);
                ref_attention_one_f16(got, c.q, k16, v16, &c.b, &c.s, t, hh);
            }
        size_t at;
        ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at), "reference: [%zu] differs", at);
        for (int i = 0; i < N_ISAS; i++) {
            if (!cpu_isa_supported(all_isas[i])) continue;
            const struct cpu_kernels *k = cpu_kernels_for(all_isas[i]);
            int group = c.s.n_heads / c.s.n_kv_heads;
            for (int kvh = 0; kvh < c.s.n_kv_heads; kvh++) {
                int h0 = kvh * group, h1 = h0 + group;
                k->attention(want, c.q, c.kc, c.vc, &c.b, &c.s, 0, nt, h0, h1);
                k->attention_f16(got, c.q, k16, v16, &c.b, &c.s, 0, nt, h0, h1);
            }
            ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at),
                          "%s attention_f16, heads %d/%d hd %d: [%zu] %.8g vs %.8g",
                          cpu_isa_name(all_isas[i]), c.s.n_heads, c.s.n_kv_heads, c.s.head_dim, at,
                          got[at], want[at]);
            /* every head in one pass over whole slots, and the heads cut in three ranges
             * anywhere (kv heads' groups split between calls): the same bits, both caches */
            for (int f16 = 0; f16 < 2; f16++)
                for (int cut = 0; cut < 2; cut++) {
                    int a = 1 + (int)(tu_rnd() % (unsigned)(c.s.n_heads - 1));
                    int bnd = 1 + (int)(tu_rnd() % (unsigned)(c.s.n_heads - 1));
                    int e[4] = {0, a < bnd ? a : bnd, a < bnd ? bnd : a, c.s.n_heads};
                    if (!cut) e[1] = e[2] = c.s.n_heads;
                    memset(all, 0xff, c.q_len * 4);
                    for (int r = 0; r < 3; r++) {
                        if (e[r] == e[r + 1]) continue;
                        if (f16)
                            k->attention_f16(all, c.q, k16, v16, &c.b, &c.s, 0, nt, e[r], e[r + 1]);
                        else
                            k->attention(all, c.q, c.kc, c.vc, &c.b, &c.s, 0, nt, e[r], e[r + 1]);
                    }
                    ck_assert_msg(!tu_bits_differ(all, want, c.q_len, &at),
                                  "%s attention%s, heads [0,%d) [%d,%d) [%d,%d), heads %d/%d hd "
                                  "%d: [%zu] %.8g vs %.8g",
                                  cpu_isa_name(all_isas[i]), f16 ? "_f16" : "", e[1], e[1], e[2],
                                  e[2], e[3], c.s.n_heads, c.s.n_kv_heads, c.s.head_dim, at,
                                  all[at], want[at]);
                }
        }
        /* the AVX-512 tables prefetch KV into L1 or L2 (enum cpu_prefetch): the same bits */
        if (cpu_isa_supported(CPU_ISA_AVX512)) {
            const struct cpu_kernels *k2 = cpu_kernels_with(CPU_ISA_AVX512, CPU_PREFETCH_L2),
                                     *k1 = cpu_kernels_with(CPU_ISA_AVX512, CPU_PREFETCH_L1);
            ck_assert_ptr_ne(k1->attention_f16, k2->attention_f16);
            k2->attention(want, c.q, c.kc, c.vc, &c.b, &c.s, 0, nt, 0, c.s.n_heads);
            memset(got, 0xff, c.q_len * 4);
            k1->attention(got, c.q, c.kc, c.vc, &c.b, &c.s, 0, nt, 0, c.s.n_heads);
            ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at), "L1 attention: [%zu]", at);
            for (int p = 0; p < 2; p++) {
                memset(got, 0xff, c.q_len * 4);
                (p ? k1 : k2)->attention_f16(got, c.q, k16, v16, &c.b, &c.s, 0, nt, 0, c.s.n_heads);
                ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at), "%s attention_f16: [%zu]",
                              p ? "L1" : "L2", at);
            }
        }
        free(k16);
        free(v16);
        free(want);
        free(got);
        free(all);
        attn_case_free(&c);
    }

    /* the backend: 2-byte elements, kv_write rounds each value as f32_to_fp16 */
    struct backend *be = NULL;
    struct qerr err = {0};
    struct backend_cpu_opts o = {.n_threads = 2, .precision = MATMUL_Q8, .kv_f16 = true};
    ck_assert_msg(backend_cpu_create(&o, &be, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(backend_kv_elem_bytes(be), 2);
    int32_t slot[2] = {5, 2}, pos[2] = {0, 1}, seq[2] = {0, 0}, table[1] = {0};
    struct attn_batch b = {.n_tokens = 2,
                           .pos = pos,
                           .seq = seq,
                           .slot = slot,
                           .n_seqs = 1,
                           .block_table = table,
                           .max_blocks = 1,
                           .block_size = 16};
    float kv[2][24];
    tu_fill(&kv[0][0], 48, 3.0f);
    uint16_t kc[16 * 24], vc[16 * 24];
    memset(kc, 0, sizeof kc);
    memset(vc, 0, sizeof vc);
    be->ops->kv_write(be, kc, vc, &kv[0][0], &kv[1][0], &b, 12);
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < 12; d++) {
            ck_assert_uint_eq(kc[slot[t] * 12 + d], f32_to_fp16(kv[0][t * 12 + d]));
            ck_assert_uint_eq(vc[slot[t] * 12 + d], f32_to_fp16(kv[1][t * 12 + d]));
        }
    backend_destroy(be);
}
END_TEST

/* Q8_0 copies of c's caches (*k8, *v8, freed by the caller: each slot's kv_dim elements as
 * quantize_row_q8_0 makes them), the float caches then holding the dequantized values. */
static void attn_case_q8(struct attn_case *c, uint8_t **k8, uint8_t **v8)
{
    size_t slots = (size_t)c->b.n_seqs * (size_t)c->b.max_blocks * (size_t)c->b.block_size,
           kv_dim = (size_t)c->s.n_kv_heads * (size_t)c->s.head_dim, nb = kv_dim / 32;
    *k8 = malloc(slots * nb * 34);
    *v8 = malloc(slots * nb * 34);
    for (int kv = 0; kv < 2; kv++) {
        float *x = kv ? c->vc : c->kc;
        struct block_q8_0 *q = (struct block_q8_0 *)(kv ? *v8 : *k8);
        for (size_t sl = 0; sl < slots; sl++)
            quantize_row_q8_0(x + sl * kv_dim, q + sl * nb, kv_dim);
        for (size_t j = 0; j < slots * kv_dim; j++)
            x[j] = fp16_to_f32(q[j / 32].d) * (float)q[j / 32].qs[j % 32];
    }
}

/* Sliding-window attention (attn_batch.window, Gemma 3's local layers) and soft-capped scores
 * (attn_shape.softcap, Gemma 2's): every ISA's kernels near
 * the reference (which reads keys pos - window + 1 .. pos), on float, fp16 and Q8_0 caches, each
 * token the same bits alone as in the batch on one thread and two (sets of prompt tokens whose
 * windows start at different keys, rows whose window starts in a later partition, decode batches
 * cut into partition tasks); a window no row outgrows changes no bit, and the windows here do
 * change the results (else the checks above would hold with the window ignored). */
START_TEST(attention_sliding_window)
{
    tu_seed(0x5a1d);
    /* windows, and Gemma 2's score soft-capping (a cap of 2 bites on these scores) */
    const struct {
        int window;
        float cap;
    } runs[] = {{1, 0}, {100, 0}, {550, 0}, {100, 2.0f}, {0, 2.0f}};
    const int cfg[][4] = {{9, 3, 64, 0}, {9, 3, 64, 1}, {8, 2, 128, 1}, {4, 1, 256, 1}};
    int changed = 0, capped = 0;
    /* under the sanitizers (ten times the time) two shapes: a decode batch and a wide prompt */
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci += tu_sanitized() ? 3 : 1) {
        const int n = cfg[ci][3] ? 40 : 24;
        struct attn_case c;
        /* 120 blocks: up to 1920 positions, four partitions */
        attn_case_make_blocks(&c, n, cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3], 120);
        uint16_t *k16, *v16;
        uint8_t *k8, *v8;
        attn_case_q8(&c, &k8, &v8);
        attn_case_fp16(&c, &k16, &v16);
        size_t row = (size_t)c.s.n_heads * (size_t)c.s.head_dim;
        float *ref = malloc(c.q_len * 4), *all = malloc(c.q_len * 4), *one = malloc(row * 4),
              *full = malloc(c.q_len * 4), *plain = malloc(c.q_len * 4);
        double vmax = 0;
        for (size_t k = 0;
             k < (size_t)c.b.n_seqs * 120 * 16 * (size_t)c.s.n_kv_heads * (size_t)c.s.head_dim; k++)
            vmax = fmax(vmax, fabs(c.vc[k]));
        for (size_t wi = tu_sanitized() ? 1 : 0; wi < sizeof runs / sizeof runs[0];
             wi += tu_sanitized() ? 2 : 1) { /* sanitized: windows 100 with and without a cap */
            c.b.window = runs[wi].window;
            c.s.softcap = runs[wi].cap;
            for (int kind = 0; kind < 3; kind++) {
                const void *kc = kind == 1   ? (const void *)k16
                                 : kind == 2 ? (const void *)k8
                                             : c.kc;
                const void *vc = kind == 1   ? (const void *)v16
                                 : kind == 2 ? (const void *)v8
                                             : c.vc;
                for (int t = 0; t < n; t++)
                    for (int h = 0; h < c.s.n_heads; h++)
                        if (kind == 0)
                            ref_attention_one(ref, c.q, c.kc, c.vc, &c.b, &c.s, t, h);
                        else if (kind == 1)
                            ref_attention_one_f16(ref, c.q, k16, v16, &c.b, &c.s, t, h);
                        else
                            ref_attention_one_q8(ref, c.q, k8, v8, &c.b, &c.s, t, h);
                for (int i = 0; i < N_ISAS; i++) {
                    if (!cpu_isa_supported(all_isas[i])) continue;
                    struct backend *bes[2];
                    struct qerr err = {0};
                    for (int th = 0; th < 2; th++) {
                        struct backend_cpu_opts o = {.n_threads = th + 1,
                                                     .precision = MATMUL_F32,
                                                     .isa = all_isas[i],
                                                     .kv_f16 = kind == 1,
                                                     .kv_q8 = kind == 2};
                        ck_assert_int_eq(backend_cpu_create(&o, &bes[th], &err), 0);
                    }
                    bes[1]->ops->attention(bes[1], all, c.q, kc, vc, &c.b, &c.s);
                    for (size_t k = 0; k < c.q_len; k++)
                        ck_assert_msg(fabs(all[k] - ref[k]) <= 1e-5 * vmax,
                                      "%s window %d cap %g cache %d, %d/%d heads hd %d%s: [%zu] "
                                      "(position %d) %.8g vs %.8g",
                                      cpu_isa_name(all_isas[i]), c.b.window, (double)c.s.softcap,
                                      kind, c.s.n_heads, c.s.n_kv_heads, c.s.head_dim,
                                      cfg[ci][3] ? " prefill" : "", k, c.pos[k / row], all[k],
                                      ref[k]);
                    for (int t = 0; t < n; t++) {
                        struct attn_batch b1 = tu_attn_token(&c.b, t);
                        for (int th = 0; th < 2; th++) {
                            bes[th]->ops->attention(bes[th], one, c.q + (size_t)t * row, kc, vc,
                                                    &b1, &c.s);
                            size_t at;
                            ck_assert_msg(!tu_bits_differ(one, all + (size_t)t * row, row, &at),
                                          "%s window %d cache %d: token %d (position %d) on %d "
                                          "thread(s) differs alone vs in the batch at [%zu]",
                                          cpu_isa_name(all_isas[i]), c.b.window, kind, t, c.pos[t],
                                          th + 1, at);
                        }
                    }
                    if (kind == 0) {
                        int longest = 0;
                        for (int t = 0; t < n; t++)
                            longest = c.pos[t] > longest ? c.pos[t] : longest;
                        /* a window past every position is no window, to the bit */
                        c.b.window = longest + 1 + (int)(tu_rnd() % 50);
                        bes[1]->ops->attention(bes[1], full, c.q, kc, vc, &c.b, &c.s);
                        c.b.window = 0;
                        bes[1]->ops->attention(bes[1], plain, c.q, kc, vc, &c.b, &c.s);
                        c.b.window = runs[wi].window;
                        size_t at;
                        ck_assert_msg(!tu_bits_differ(full, plain, c.q_len, &at),
                                      "%s: a window past every position changes [%zu]",
                                      cpu_isa_name(all_isas[i]), at);
                        for (size_t k = 0; k < c.q_len; k++) changed += all[k] != plain[k];
                        if (c.s.softcap > 0) { /* the cap changes the results */
                            c.s.softcap = 0;
                            bes[1]->ops->attention(bes[1], full, c.q, kc, vc, &c.b, &c.s);
                            c.s.softcap = runs[wi].cap;
                            for (size_t k = 0; k < c.q_len; k++) capped += all[k] != full[k];
                        }
                    }
                    backend_destroy(bes[0]);
                    backend_destroy(bes[1]);
                }
            }
        }
        free(ref);
        free(all);
        free(one);
        free(full);
        free(plain);
        free(k16);
        free(v16);
        free(k8);
        free(v8);
        attn_case_free(&c);
    }
    ck_assert_int_gt(changed, 1000);
    ck_assert_int_gt(capped, 1000);
}
END_TEST

/* A Q8_0 KV cache (--kv-type q8): attention_q8 gives the bits attention gives over a float
 * cache of the dequantized values, on every ISA, in the reference, whatever the head ranges,
 * the prefetch, the partitions (rows of up to 1920 keys on one and two threads, alone and in a
 * batch); the backend with kv_q8 writes each token's slot as quantize_row_q8_0 and sizes it as
 * 34 bytes per 32 elements. */
START_TEST(q8_kv_cache)
{
    tu_seed(0x98c8);
    /* the write: quantize_kv_q8 as quantize_row_q8_0 on every ISA, ties (a block whose scale
     * is 1: x.5 rounds away from zero), a zero block, subnormal and overflowing scales */
    enum { NB = 40 };
    float *x = malloc(NB * 32 * sizeof *x);
    struct block_q8_0 want_q[NB], got_q[NB];
    tu_fill(x, NB * 32, 4.0f);
    const float ties[] = {127.0f,       2.5f,   -2.5f,   0.5f,  -0.5f, 0.49999997f,
                          -0.49999997f, 126.5f, -126.5f, 1.5f,  -1.5f, 3.5000002f,
                          0.0f,         -0.0f,  63.5f,   -63.5f};
    for (int j = 0; j < 32; j++) x[j] = ties[j % 16] * (j < 16 ? 1.0f : -1.0f);
    for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;
    for (int j = 0; j < 32; j++) x[64 + j] *= 2e-4f;  /* a scale subnormal in fp16 */
    for (int j = 0; j < 32; j++) x[96 + j] *= 1e-36f; /* ... below it */
    for (int j = 0; j < 32; j++) x[128 + j] *= 1e30f; /* ... past its range */
    quantize_row_q8_0(x, want_q, NB * 32);
    for (int i = 0; i < N_ISAS; i++) {
        if (!cpu_isa_supported(all_isas[i])) continue;
        memset(got_q, 0x55, sizeof got_q);
        cpu_kernels_for(all_isas[i])->quantize_kv_q8(x, got_q, NB * 32);
        for (int bl = 0; bl < NB; bl++)
            ck_assert_msg(!memcmp(&got_q[bl], &want_q[bl], sizeof got_q[bl]),
                          "%s quantize_kv_q8: block %d differs (d %04x vs %04x, q[0] %d vs %d)",
                          cpu_isa_name(all_isas[i]), bl, got_q[bl].d, want_q[bl].d, got_q[bl].qs[0],
                          want_q[bl].qs[0]);
    }
    free(x);

    const int cfg[][5] = {{9, 3, 64, 0, 40},  {9, 3, 64, 1, 40},  {8, 2, 128, 1, 40},
                          {6, 2, 32, 0, 40},  {16, 2, 64, 0, 40}, {9, 3, 64, 0, 120},
                          {8, 2, 128, 0, 120}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        int nt = cfg[ci][4] > 40 ? 24 : 1 + (int)(tu_rnd() % 40);
        struct attn_case c;
        attn_case_make_blocks(&c, nt, cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3], cfg[ci][4]);
        uint8_t *k8, *v8;
        attn_case_q8(&c, &k8, &v8);
        size_t row = (size_t)c.s.n_heads * (size_t)c.s.head_dim, at;
        float *want = malloc(c.q_len * 4), *got = malloc(c.q_len * 4), *one = malloc(row * 4),
              *one_want = malloc(row * 4);
        for (int t = 0; t < nt; t++)
            for (int hh = 0; hh < c.s.n_heads; hh++) {
                ref_attention_one(want, c.q, c.kc, c.vc, &c.b, &c.s, t, hh);
                ref_attention_one_q8(got, c.q, k8, v8, &c.b, &c.s, t, hh);
            }
        ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at), "reference: [%zu] differs", at);
        for (int i = 0; i < N_ISAS; i++) {
            if (!cpu_isa_supported(all_isas[i])) continue;
            for (int pf = CPU_PREFETCH_L2; pf <= CPU_PREFETCH_L1; pf++) {
                const struct cpu_kernels *k = cpu_kernels_with(all_isas[i], (enum cpu_prefetch)pf);
                int group = c.s.n_heads / c.s.n_kv_heads;
                k->attention(want, c.q, c.kc, c.vc, &c.b, &c.s, 0, nt, 0, c.s.n_heads);
                memset(got, 0xff, c.q_len * 4);
                for (int kvh = 0; kvh < c.s.n_kv_heads; kvh++)
                    k->attention_q8(got, c.q, k8, v8, &c.b, &c.s, 0, nt, kvh * group,
                                    (kvh + 1) * group);
                ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at),
                              "%s attention_q8 by kv head, heads %d/%d hd %d: [%zu] %.8g vs %.8g",
                              cpu_isa_name(all_isas[i]), c.s.n_heads, c.s.n_kv_heads, c.s.head_dim,
                              at, got[at], want[at]);
                memset(got, 0xff, c.q_len * 4);
                k->attention_q8(got, c.q, k8, v8, &c.b, &c.s, 0, nt, 0, c.s.n_heads);
                ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at),
                              "%s attention_q8, every head: [%zu]", cpu_isa_name(all_isas[i]), at);
            }
            if (cfg[ci][4] <= 40 || !cpu_kernels_for(all_isas[i])->attention_q8_part) continue;
            /* the backend: a batch (rows whole) and each token alone (its partitions as tasks
             * on two threads), the float cache's bits every time */
            for (int th = 1; th <= 2; th++) {
                struct backend *bf = NULL, *b8 = NULL;
                struct qerr err = {0};
                struct backend_cpu_opts o = {
                    .n_threads = th, .precision = MATMUL_F32, .isa = all_isas[i]};
                ck_assert_int_eq(backend_cpu_create(&o, &bf, &err), 0);
                o.kv_q8 = true;
                ck_assert_int_eq(backend_cpu_create(&o, &b8, &err), 0);
                bf->ops->attention(bf, want, c.q, c.kc, c.vc, &c.b, &c.s);
                b8->ops->attention(b8, got, c.q, k8, v8, &c.b, &c.s);
                ck_assert_msg(!tu_bits_differ(got, want, c.q_len, &at),
                              "%s backend attention over q8, %d thread(s): [%zu]",
                              cpu_isa_name(all_isas[i]), th, at);
                for (int t = 0; t < nt; t++) {
                    struct attn_batch b1 = tu_attn_token(&c.b, t);
                    bf->ops->attention(bf, one_want, c.q + (size_t)t * row, c.kc, c.vc, &b1, &c.s);
                    b8->ops->attention(b8, one, c.q + (size_t)t * row, k8, v8, &b1, &c.s);
                    ck_assert_msg(!tu_bits_differ(one, one_want, row, &at),
                                  "%s q8 token %d (position %d) alone, %d thread(s): [%zu]",
                                  cpu_isa_name(all_isas[i]), t, c.pos[t], th, at);
                }
                backend_destroy(bf);
                backend_destroy(b8);
            }
        }
        free(k8);
        free(v8);
        free(want);
        free(got);
        free(one);
        free(one_want);
        attn_case_free(&c);
    }

    /* the backend's cache: 34 bytes per 32 elements, kv_write as quantize_row_q8_0 */
    struct backend *be = NULL;
    struct qerr err = {0};
    struct backend_cpu_opts o = {.n_threads = 2, .precision = MATMUL_Q8, .kv_q8 = true};
    ck_assert_msg(backend_cpu_create(&o, &be, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(backend_kv_elem_bytes(be), 1);
    ck_assert_uint_eq(backend_kv_bytes(be, 192), 204);
    enum { N = 12, KV_DIM = 64, ROW = 68 };
    int32_t slot[N], pos[N], seq[N], table[1] = {0};
    for (int t = 0; t < N; t++) {
        slot[t] = (t * 7 + 3) % 16; /* 12 distinct slots of the block */
        pos[t] = t;
        seq[t] = 0;
    }
    struct attn_batch b = {.n_tokens = N,
                           .pos = pos,
                           .seq = seq,
                           .slot = slot,
                           .n_seqs = 1,
                           .block_table = table,
                           .max_blocks = 1,
                           .block_size = 16};
    float kv[2][N * KV_DIM];
    tu_fill(&kv[0][0], 2 * N * KV_DIM, 3.0f);
    uint8_t kc[16 * ROW], vc[16 * ROW];
    struct block_q8_0 wk[2], wv[2];
    memset(kc, 0, sizeof kc);
    memset(vc, 0, sizeof vc);
    be->ops->kv_write(be, kc, vc, &kv[0][0], &kv[1][0], &b, KV_DIM); /* N >= 8: on the pool */
    for (int t = 0; t < N; t++) {
        quantize_row_q8_0(&kv[0][t * KV_DIM], wk, KV_DIM);
        quantize_row_q8_0(&kv[1][t * KV_DIM], wv, KV_DIM);
        ck_assert_msg(!memcmp(kc + slot[t] * ROW, wk, ROW), "token %d's K slot", t);
        ck_assert_msg(!memcmp(vc + slot[t] * ROW, wv, ROW), "token %d's V slot", t);
    }
    backend_destroy(be);
}
END_TEST

START_TEST(isa_selection)
{
    struct backend *be = NULL;
    struct qerr err = {0};
    struct backend_cpu_opts o = {.n_threads = 1, .isa = CPU_ISA_AUTO};
    ck_assert_int_eq(backend_cpu_create(&o, &be, &err), 0);
    /* AUTO: the best ISA this CPU has ($QUERN_CPU_ISA acts through backend_select only) */
    ck_assert_int_eq(backend_cpu_isa(be), cpu_isa_best());
    backend_destroy(be);
    ck_assert_int_eq(cpu_isa_parse("AVX512"), CPU_ISA_AVX512);
    ck_assert_int_eq(cpu_isa_parse("scalar"), CPU_ISA_SCALAR);
    ck_assert_int_eq(cpu_isa_parse("AvxVnni"), CPU_ISA_AVXVNNI);
    ck_assert_int_eq(cpu_isa_parse("AMX"), CPU_ISA_AMX);
    /* AMX above AVX-512, whose kernels it keeps but the q8 matmul */
    if (cpu_isa_supported(CPU_ISA_AMX)) {
        ck_assert(cpu_isa_supported(CPU_ISA_AVX512));
        ck_assert_int_eq(cpu_isa_best(), CPU_ISA_AMX);
    }
    /* AVX-VNNI sits between AVX2 and AVX-512 in what AUTO prefers */
    if (cpu_isa_supported(CPU_ISA_AVXVNNI) && !cpu_isa_supported(CPU_ISA_AVX512))
        ck_assert_int_eq(cpu_isa_best(), CPU_ISA_AVXVNNI);
    if (cpu_isa_supported(CPU_ISA_AVXVNNI)) ck_assert(cpu_isa_supported(CPU_ISA_AVX2));
    ck_assert_int_eq(cpu_isa_parse("sse9"), -1);
    for (int i = 0; i < N_ISAS; i++) {
        o.isa = all_isas[i];
        int rc = backend_cpu_create(&o, &be, &err);
        if (cpu_isa_supported(all_isas[i])) {
            ck_assert_int_eq(rc, 0);
            backend_destroy(be);
        } else {
            ck_assert_int_eq(rc, QERR_UNSUPPORTED);
        }
    }
    printf("isa: this CPU runs %s\n", cpu_isa_name(cpu_isa_best()));
}
END_TEST

/* Pages of [p, p + n) this process holds in memory (mincore on the whole pages inside). */
static size_t resident_pages(const void *p, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    size_t np = hi > lo ? (hi - lo) / page : 0, k = 0;
    unsigned char *v = malloc(np ? np : 1);
    ck_assert_int_eq(mincore((void *)lo, hi - lo, v), 0);
    for (size_t i = 0; i < np; i++) k += v[i] & 1;
    free(v);
    return k;
}

/* Buffers are zeroed and 64-byte aligned at every size, and a big one (a KV pool, the activation
 * arena) costs no resident memory until it is written: an idle server stays small. */
START_TEST(buffers_zeroed_and_lazy)
{
    struct backend *be = NULL;
    struct qerr err = {0};
    struct backend_cpu_opts o = {.n_threads = 1};
    ck_assert_int_eq(backend_cpu_create(&o, &be, &err), 0);
    const size_t sizes[] = {
        0, 1, 100, 4096, ((size_t)1 << 20) - 1, (size_t)1 << 20, ((size_t)64 << 20) + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = be->ops->buf_alloc(be, n);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq((uintptr_t)p % 64, 0);
        if (n >= ((size_t)64 << 20)) /* at most the page its header shares (a 2 MiB one with THP) */
            ck_assert_uint_le(resident_pages(p, n),
                              ((size_t)2 << 20) / (size_t)sysconf(_SC_PAGESIZE));
        for (size_t k = 0; k < n; k++)
            if (p[k]) ck_abort_msg("buffer of %zu bytes: byte %zu is %d", n, k, p[k]);
        if (n) {
            p[0] = 1;
            p[n - 1] = 2;
        }
        be->ops->buf_free(be, p);
    }
    be->ops->buf_free(be, NULL);
    backend_destroy(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("conformance");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, isa_selection);
    tcase_add_test(tc, qpack_roundtrip);
    tcase_add_test(tc, qpack_five_bit_layout);
    tcase_add_loop_test(tc, five_bit_extremes_match_reference, 0, 2);
    tcase_add_test(tc, qpack_rejects_bad_shapes);
    tcase_add_test(tc, page_arena_chunks);
    tcase_add_test(tc, quantize_q8_matches_reference);
    tcase_add_loop_test(tc, matmul_matches_reference, 0, 2);
    tcase_add_test(tc, matmul_prefetch_variants);
    tcase_add_test(tc, matmul_float_weights);
    tcase_add_test(tc, matmul_batch_and_thread_invariant);
    tcase_add_test(tc, matmul_shared_equals_separate_calls);
    tcase_add_test(tc, embed_matches_reference);
    tcase_add_test(tc, rmsnorm_add_silu_match_reference);
    tcase_add_test(tc, large_batch_ops_thread_invariant);
    tcase_add_test(tc, moe_combine_matches_reference);
    tcase_add_test(tc, rope_matches_reference_exactly);
    tcase_add_test(tc, attention_matches_reference);
    tcase_add_test(tc, attention_prompt_sets_match_one_token);
    tcase_add_test(tc, attention_partitions_invariant);
    tcase_add_test(tc, attention_uneven_decode_batch);
    tcase_add_test(tc, attention_sliding_window);
    tcase_add_test(tc, fp16_kv_cache);
    tcase_add_test(tc, q8_kv_cache);
    tcase_add_test(tc, buffers_zeroed_and_lazy);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
