/* quern-bench-kernels: CPU kernel and decode throughput next to this machine's ceiling.
 *
 *   quern bench --kernels [--threads N]   (or the quern-bench-kernels program, the same code)
 *   quern-bench-kernels [--threads N] [--isa scalar|avx2|avxvnni|avx512|amx] [--precision
 * f32|q8|both]
 *                       [--batches 1,8,64,512] [--model M.gguf [--pp 512] [--tg 64]]
 *
 * 1. Memory read bandwidth (a streaming read loop over 512 MiB, 1 thread and N threads) and
 *    memcpy bandwidth: the roofline every decode number is compared with; and the compute peak
 *    (fp32 FMA and int8 vpdpbusd or vpmaddubsw chains on N threads, of the ISA the kernels
 *    run), the roofline of large batches.
 * 2. The matmul of each matrix shape at each batch size, through the backend's matmul op (so it
 *    includes activation quantization and the pool): GB/s of weights and GFLOP/s. The shapes
 *    are the model's: with --model, that file's first layer and output matrix in their own
 *    types; else the default model's (SmolLM2-135M: Q4_1 layers, Q8_0 tied output). Batch-1
 *    runs rotate over enough copies of the weight to miss the last-level cache, as a decode
 *    does. Then the kernel alone: one thread, a slice of each shape held in cache, the fastest
 *    call of many: what the kernel can do, apart from the weight stream and the pool.
 * 3. The other ops (RMSNorm, SiLU*up, RoPE, attention) at the default model's sizes, and the
 *    attention of a decode batch over an fp16 KV cache (30 layers' and cached).
 * 4. With --model: prefill of a pp-token prompt and tg greedy decode steps (engine/generate.h),
 *    tokens/s, and the decode roofline (weight bytes per token / measured bandwidth). */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "generate.h"
#include "gguf.h"
#include "../kernels/cpu/backend_cpu.h"
#include "bench_kernels.h"
#include "../kernels/backend_profile.h"
#include "bench_ceiling.h"
#include "bench_profile.h"
#include "bench_util.h"

/* ---- matmul ---- */

struct shape {
    char name[48];
    int64_t rows, cols;
    enum qtype type;
};

#define N_SHAPES 5

/* The default model's (SmolLM2-135M Q4_1, tied Q8_0 output), timed when no --model is given. */
static const struct shape default_shapes[N_SHAPES] = {
    {"attn_q/o 576x576", 576, 576, QTYPE_Q4_1},      {"attn_k/v 192x576", 192, 576, QTYPE_Q4_1},
    {"ffn_gate/up 1536x576", 1536, 576, QTYPE_Q4_1}, {"ffn_down 576x1536", 576, 1536, QTYPE_Q4_1},
    {"output 49152x576", 49152, 576, QTYPE_Q8_0},
};

/* A model's own shapes: its first layer's q, k, gate and down projections (o, v and up have the
 * shapes of q, k and gate in a Llama) and its output matrix (the token embedding when tied), each
 * in the type the file stores it in. So a Q8_0 file's table times the Q8_0 kernels it runs. */
static int shapes_from_model(const char *path, struct shape out[N_SHAPES])
{
    static const char *const tensors[N_SHAPES] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                                  "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight",
                                                  "output.weight"};
    static const char *const labels[N_SHAPES] = {"attn_q/o", "attn_k/v", "ffn_gate/up", "ffn_down",
                                                 "output"};
    struct gguf_file *f;
    struct qerr err = {0};
    if (gguf_open(path, &f, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < N_SHAPES && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor_find(f, tensors[i]);
        if (!t && i == N_SHAPES - 1) t = gguf_tensor_find(f, "token_embd.weight");
        if (!t || t->n_dims != 2) {
            fprintf(stderr, "%s: no 2-d tensor %s to time\n", path, tensors[i]);
            rc = 1;
            break;
        }
        out[i] =
            (struct shape){.rows = (int64_t)t->ne[1], .cols = (int64_t)t->ne[0], .type = t->type};
        snprintf(out[i].name, sizeof out[i].name, "%s %lldx%lld", labels[i], (long long)out[i].rows,
                 (long long)out[i].cols);
    }
    gguf_close(f);
    return rc;
}

/* The largest rows and cols among the shapes: the activation and output buffers' sizes. */
static void shapes_extent(const struct shape *shapes, int64_t *rows, int64_t *cols)
{
    *rows = *cols = 0;
    for (int s = 0; s < N_SHAPES; s++) {
        *rows = shapes[s].rows > *rows ? shapes[s].rows : *rows;
        *cols = shapes[s].cols > *cols ? shapes[s].cols : *cols;
    }
}

/* Seconds per matmul call: the fastest of 5 windows of at least min_s / 5 each, each rotating
 * over `copies` prepared copies of the weight. The fastest window is the one least disturbed by
 * other processes on a shared machine. */
static double time_matmul(struct backend *be, struct bweight *ws, int copies, const float *x, int n,
                          float *y, double min_s)
{
    be->ops->matmul(be, &ws[0], x, n, y); /* warm the pool and the scratch */
    double best = 1e30;
    for (int win = 0; win < 5; win++) {
        int calls = 0;
        double t0 = bench_now_s(), dt;
        do {
            for (int c = 0; c < copies; c++) be->ops->matmul(be, &ws[c], x, n, y);
            calls += copies;
            dt = bench_now_s() - t0;
        } while (dt < min_s / 5);
        best = fmin(best, dt / calls);
    }
    return best;
}

/* Bytes of weight copies a streamed matmul rotates over: three times the last-level cache, at
 * least 128 MiB. A fixed 128 MiB was four times a 32 MiB L3, but a 260 MiB one held most of it,
 * and batch-1 figures came out above the DRAM bandwidth. */
static size_t stream_bytes(void)
{
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t want = llc > 0 ? 3 * (size_t)llc : 0;
    return want > ((size_t)128 << 20) ? want : (size_t)128 << 20;
}

static int bench_matmuls(const struct backend_cpu_opts *bo, const struct shape *shapes,
                         const int *batches, int n_batches, double bw, double peak)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct backend *be;
    struct qerr err = {0};
    if (backend_cpu_create(bo, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int maxn = 0;
    for (int i = 0; i < n_batches; i++) maxn = batches[i] > maxn ? batches[i] : maxn;
    printf("\nmatmul, %s, %s, %d thread(s): GB/s of weights read, GFLOP/s (2 rows cols n / s)\n",
           cpu_isa_name(backend_cpu_isa(be)),
           bo->precision == MATMUL_Q8 ? "Q8 activations" : "F32 activations", bo->n_threads);
    printf("%-22s %5s", "shape", "type");
    for (int i = 0; i < n_batches; i++) printf("   n=%-4d GB/s GFLOP/s", batches[i]);
    printf("\n");
    int64_t max_rows, max_cols;
    shapes_extent(shapes, &max_rows, &max_cols);
    float *x = malloc((size_t)maxn * (size_t)max_cols * sizeof *x);
    float *y = malloc((size_t)maxn * (size_t)max_rows * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        backend_destroy(be);
        return 1;
    }
    for (size_t i = 0; i < (size_t)maxn * (size_t)max_cols; i++) x[i] = bench_rng_float(&rng);
    for (int s = 0; s < N_SHAPES; s++) {
        const struct shape *sh = &shapes[s];
        size_t bytes = qtype_row_bytes(sh->type, (size_t)sh->cols) * (size_t)sh->rows;
        int copies = (int)(stream_bytes() / bytes) + 1;
        struct bweight *ws = calloc((size_t)copies, sizeof *ws);
        for (int c = 0; c < copies; c++) {
            ws[c] = (struct bweight){.type = sh->type, .rows = sh->rows, .cols = sh->cols};
            ws[c].host = bench_random_weights(&rng, sh->type, sh->rows, sh->cols, 0.02f, 0.1f);
            if (!ws[c].host || be->ops->weight_prepare(be, &ws[c], &err)) {
                fprintf(stderr, "cannot prepare weight: %s\n", err.msg);
                return 1;
            }
        }
        printf("%-22s %5s", sh->name, qtype_name(sh->type));
        for (int i = 0; i < n_batches; i++) {
            int n = batches[i];
            /* big batches are compute-bound: one copy (cached) is as good and far quicker */
            double sec = time_matmul(be, ws, n >= 64 ? 1 : copies, x, n, y, 0.25);
            double gbs = (double)bytes / sec / 1e9;
            double gflops = 2.0 * (double)sh->rows * (double)sh->cols * n / sec / 1e9;
            printf("   %6.1f %5.1f %7.1f", sec * 1e6, gbs, gflops);
        }
        printf("   (us GB/s GFLOP/s)\n");
        for (int c = 0; c < copies; c++) {
            be->ops->weight_release(be, &ws[c]);
            free((void *)ws[c].host);
        }
        free(ws);
    }
    printf("(memory read bandwidth at %d thread(s): %.1f GB/s; compute peak %.0f %s%s)\n",
           bo->n_threads, bw, peak,
           bo->precision == MATMUL_Q8 ? "GOP/s, int8 " : "GFLOP/s, fp32 FMA",
           bo->precision == MATMUL_Q8 ? bench_int8_peak_insn(bo->isa) : "");
    free(x);
    free(y);
    backend_destroy(be);
    return 0;
}

/* The matmul kernel's own speed, apart from the weight stream and the pool: one thread, at most
 * CACHED_ROWS rows of each shape (a weight of 0.4-1 MB, held in a 2 MB L2 after the first call),
 * the fastest single call of many. On a shared machine this is the figure that repeats (the
 * streamed table above moves by tens of percent between runs); the gap between the two is what
 * the weight stream and the threads cost. */
#define CACHED_ROWS 1536

static int bench_matmuls_cached(const struct backend_cpu_opts *bo, const struct shape *shapes,
                                const int *batches, int n_batches, double peak1)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct backend_cpu_opts o1 = *bo;
    o1.n_threads = 1;
    struct backend *be;
    struct qerr err = {0};
    if (backend_cpu_create(&o1, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int maxn = 0;
    for (int i = 0; i < n_batches; i++) maxn = batches[i] > maxn ? batches[i] : maxn;
    printf("\nmatmul kernel alone, %s, %s, 1 thread, at most %d rows held in cache, fastest call: "
           "GFLOP/s, %% of one thread's peak (%.0f)\n",
           cpu_isa_name(backend_cpu_isa(be)),
           bo->precision == MATMUL_Q8 ? "Q8 activations" : "F32 activations", CACHED_ROWS, peak1);
    printf("%-22s %5s %6s", "shape", "type", "rows");
    for (int i = 0; i < n_batches; i++) printf("   n=%-4d GFLOP/s    %%", batches[i]);
    printf("\n");
    int64_t max_rows, max_cols;
    shapes_extent(shapes, &max_rows, &max_cols);
    float *x = malloc((size_t)maxn * (size_t)max_cols * sizeof *x);
    float *y = malloc((size_t)maxn * CACHED_ROWS * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        backend_destroy(be);
        return 1;
    }
    for (size_t i = 0; i < (size_t)maxn * (size_t)max_cols; i++) x[i] = bench_rng_float(&rng);
    int rc = 0;
    for (int s = 0; s < N_SHAPES && !rc; s++) {
        const struct shape *sh = &shapes[s];
        /* at most a MiB of weight, so a larger model's wide rows stay in the L2 too */
        int64_t fit = (int64_t)(((size_t)1 << 20) / qtype_row_bytes(sh->type, (size_t)sh->cols));
        fit = fit < 16 ? 16 : fit / 16 * 16;
        int64_t cap = fit < CACHED_ROWS ? fit : CACHED_ROWS;
        int64_t rows = sh->rows < cap ? sh->rows : cap;
        struct bweight w = {.type = sh->type, .rows = rows, .cols = sh->cols};
        w.host = bench_random_weights(&rng, sh->type, rows, sh->cols, 0.02f, 0.1f);
        if (!w.host || be->ops->weight_prepare(be, &w, &err)) {
            fprintf(stderr, "cannot prepare weight: %s\n", w.host ? err.msg : "out of memory");
            free((void *)w.host);
            rc = 1;
            break;
        }
        printf("%-22s %5s %6lld", sh->name, qtype_name(sh->type), (long long)rows);
        for (int i = 0; i < n_batches; i++) {
            int n = batches[i];
            double best = 1e30, t_end = bench_now_s() + 0.2;
            for (int c = 0; c < 20 || bench_now_s() < t_end; c++) {
                double t0 = bench_now_s();
                be->ops->matmul(be, &w, x, n, y);
                best = fmin(best, bench_now_s() - t0);
            }
            double gflops = 2.0 * (double)rows * (double)sh->cols * n / best / 1e9;
            printf("   %7.1f %5.0f%%", gflops, 100.0 * gflops / peak1);
        }
        printf("\n");
        be->ops->weight_release(be, &w);
        free((void *)w.host);
    }
    free(x);
    free(y);
    backend_destroy(be);
    return rc;
}

/* ---- other ops ---- */

static int bench_ops(const struct backend_cpu_opts *bo, const int *batches, int n_batches)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct backend *be;
    struct qerr err = {0};
    if (backend_cpu_create(bo, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int dim = 576, ffn = 1536, heads = 9, kvh = 3, hd = 64, block = 16;
    int maxn = 0;
    for (int i = 0; i < n_batches; i++) maxn = batches[i] > maxn ? batches[i] : maxn;
    /* one sequence of ctx positions, the batch being its last n tokens (so a batch over 512
     * gets a context its size) */
    const int ctx = maxn > 512 ? (maxn + block - 1) / block * block : 512, n_table = ctx / block;
    size_t kv = (size_t)ctx * kvh * hd;
    float *x = malloc((size_t)maxn * ffn * 4), *u = malloc((size_t)maxn * ffn * 4);
    float *w = malloc(dim * 4), *o = calloc((size_t)maxn * ffn, 4);
    float *kc = malloc(kv * 4), *vc = malloc(kv * 4);
    int32_t *pos = malloc((size_t)ctx * 4), *seq = calloc((size_t)ctx, 4),
            *slot = malloc((size_t)ctx * 4), *table = malloc((size_t)n_table * 4);
    int rc = 0;
    if (!x || !u || !w || !o || !kc || !vc || !pos || !seq || !slot || !table) {
        fprintf(stderr, "bench --kernels: out of memory for the other ops at batch %d\n", maxn);
        rc = 1;
        goto out;
    }
    for (size_t i = 0; i < (size_t)maxn * ffn; i++) {
        x[i] = bench_rng_float(&rng);
        u[i] = bench_rng_float(&rng);
    }
    for (int i = 0; i < dim; i++) w[i] = bench_rng_float(&rng);
    for (size_t i = 0; i < kv; i++) {
        kc[i] = bench_rng_float(&rng);
        vc[i] = bench_rng_float(&rng);
    }
    for (int i = 0; i < n_table; i++) table[i] = i;
    const struct rope_spec rs = {.rot_dim = hd, .base = 10000.0f, .scale = 1.0f};
    printf("\nother ops, %s, %d thread(s): microseconds per call, fastest of 5 windows (batch of n "
           "tokens; attention at context %d)\n",
           cpu_isa_name(backend_cpu_isa(be)), bo->n_threads, ctx);
    printf("%-26s", "op");
    for (int i = 0; i < n_batches; i++) printf("  n=%-7d", batches[i]);
    printf("\n");
    for (int op = 0; op < 4; op++) {
        static const char *names[] = {"rmsnorm 576", "silu_mul 1536", "rope 9 heads x 64",
                                      "attention 9/3 heads x 64"};
        printf("%-26s", names[op]);
        for (int bi = 0; bi < n_batches; bi++) {
            int n = batches[bi];
            for (int i = 0; i < n; i++) {
                pos[i] = ctx - n + i;
                slot[i] = pos[i];
            }
            struct attn_batch b = {n, pos, seq, slot, 1, table, n_table, block, 0};
            struct attn_shape s = {heads, kvh, hd, 0.125f, 0};
            double best = 1e30;
            for (int win = 0; win < 5; win++) {
                int calls = 0;
                double t0 = bench_now_s(), dt;
                do {
                    switch (op) {
                    case 0:
                        be->ops->rmsnorm(be, o, x, w, n, dim, 1e-5f);
                        break;
                    case 1:
                        memcpy(o, x, (size_t)n * ffn * 4);
                        be->ops->silu_mul(be, o, u, (size_t)n * ffn);
                        break;
                    case 2:
                        be->ops->rope(be, o, pos, n, heads, hd, &rs);
                        break;
                    case 3:
                        be->ops->attention(be, o, x, kc, vc, &b, &s);
                        break;
                    }
                    calls++;
                    dt = bench_now_s() - t0;
                } while (dt < 0.02);
                best = fmin(best, dt / calls);
            }
            printf("  %9.2f", best * 1e6);
        }
        printf("\n");
    }
out:
    free(x);
    free(u);
    free(w);
    free(o);
    free(kc);
    free(vc);
    free(pos);
    free(seq);
    free(slot);
    free(table);
    backend_destroy(be);
    return rc;
}

/* A decode batch's attention over an fp16 KV cache as the engine lays it out: SEQS sequences at
 * context CTX (SmolLM2's 9/3 heads x 64), KV slots in 16-slot blocks handed out in a shuffled
 * order, through the backend's attention op on the pool. With 30 layers' KV rotated the KV
 * comes from beyond the L2, from DRAM where the L3 is smaller than it (tens of MB); with one
 * layer's it stays in the caches. In a decode step the weights streamed between two layers push
 * it out of a larger L3 too (the Xeon of docs/benchmarks.md, 2026-12-07: in place as this over
 * ten times the KV). long_ctx > 0:
 * sequence 0 at that context instead (one long conversation among short ones). */
static int bench_decode_attention(const struct backend_cpu_opts *bo, int SEQS, int CTX,
                                  int long_ctx)
{
    enum { BS = 16, LAYERS = 30, HEADS = 9, KVH = 3, HD = 64, MAX_SEQS = 16 };
    const int ctx0 = long_ctx > 0 ? long_ctx : CTX;
    /* the table's rows are mb wide; the blocks in use, nblk, are numbered in a shuffled order */
    const int mb = ctx0 / BS, nblk = mb + (SEQS - 1) * (CTX / BS);
    const size_t slot = (size_t)KVH * HD, per_layer = (size_t)nblk * BS * slot;
    struct backend_cpu_opts o = *bo;
    o.kv_f16 = true;
    struct backend *be;
    struct qerr err = {0};
    if (backend_cpu_create(&o, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    struct bench_rng rng = BENCH_RNG_INIT;
    uint16_t *kc = malloc(per_layer * LAYERS * sizeof *kc),
             *vc = malloc(per_layer * LAYERS * sizeof *vc);
    float *q = malloc((size_t)SEQS * HEADS * HD * sizeof *q),
          *out = malloc((size_t)SEQS * HEADS * HD * sizeof *out);
    int32_t *ids = malloc((size_t)nblk * sizeof *ids),
            *table = calloc((size_t)SEQS * (size_t)mb, sizeof *table), pos[MAX_SEQS], seq[MAX_SEQS],
            slots[MAX_SEQS];
    if (!kc || !vc || !q || !out || !ids || !table || SEQS > MAX_SEQS) {
        fprintf(stderr, "bench: out of memory for the decode attention\n");
        free(ids);
        free(table);
        free(kc);
        free(vc);
        free(q);
        free(out);
        backend_destroy(be);
        return 1;
    }
    for (size_t i = 0; i < per_layer * LAYERS; i++) {
        kc[i] = f32_to_fp16(bench_rng_float(&rng));
        vc[i] = f32_to_fp16(bench_rng_float(&rng));
    }
    for (int i = 0; i < SEQS * HEADS * HD; i++) q[i] = bench_rng_float(&rng);
    for (int i = 0; i < nblk; i++) ids[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = (int)(bench_rng_next(&rng) % (uint64_t)(i + 1)), t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    for (int t = 0, next = 0; t < SEQS; t++)
        for (int i = 0; i < (t == 0 ? ctx0 : CTX) / BS; i++) table[t * mb + i] = ids[next++];
    int64_t keys = 0;
    for (int t = 0; t < SEQS; t++) {
        pos[t] = (t == 0 ? ctx0 : CTX) - 1;
        seq[t] = t;
        slots[t] = table[t * mb + pos[t] / BS] * BS + pos[t] % BS;
        keys += pos[t] + 1;
    }
    struct attn_batch b = {SEQS, pos, seq, slots, SEQS, table, mb, BS, 0};
    struct attn_shape s = {HEADS, KVH, HD, 0.125f, 0};
    if (long_ctx > 0)
        printf("\nattention of a decode batch, fp16 KV, %d thread(s): one sequence at context %d "
               "and %d at %d, %d/%d heads x %d, shuffled %d-slot blocks; fastest of 5 windows\n",
               bo->n_threads, ctx0, SEQS - 1, CTX, HEADS, KVH, HD, BS);
    else
        printf("\nattention of a decode batch, fp16 KV, %d thread(s): %d sequences x context %d, "
               "%d/%d heads x %d, shuffled %d-slot blocks; fastest of 5 windows\n",
               bo->n_threads, SEQS, CTX, HEADS, KVH, HD, BS);
    printf("%-32s %12s %12s %12s\n", "KV", "us/layer", "ns/key", "KV GB/s");
    static const int layer_counts[2] = {LAYERS, 1};
    const double kv_bytes = 2.0 * (double)keys * (double)slot * sizeof(uint16_t); /* K and V */
    for (int li = 0; li < 2; li++) {
        int layers = layer_counts[li];
        double best = 1e30;
        for (int win = 0; win < 5; win++) {
            int calls = 0;
            double t0 = bench_now_s(), dt;
            do {
                for (int l = 0; l < layers; l++)
                    be->ops->attention(be, out, q, kc + per_layer * (size_t)l,
                                       vc + per_layer * (size_t)l, &b, &s);
                calls += layers;
                dt = bench_now_s() - t0;
            } while (dt < 0.05);
            best = fmin(best, dt / calls);
        }
        char what[48];
        snprintf(what, sizeof what, "%d layers' KV (%.0f MB)", layers,
                 2.0 * (double)(per_layer * (size_t)layers * sizeof *kc) / 1e6);
        printf("%-32s %12.1f %12.1f %12.2f\n", layers > 1 ? what : "one layer's KV (cached)",
               best * 1e6, best * 1e9 / (double)keys, kv_bytes / best / 1e9);
    }
    free(ids);
    free(table);
    free(kc);
    free(vc);
    free(q);
    free(out);
    backend_destroy(be);
    return 0;
}

/* ---- the model ---- */

struct timing {
    double first;
    int tokens;
    struct backend *prof; /* reset at the first token, when set */
};

static bool on_token(void *ctx, int32_t token, const float *logits)
{
    (void)token;
    (void)logits;
    struct timing *t = ctx;
    if (t->tokens++ == 0) {
        t->first = bench_now_s();
        if (t->prof) backend_profile_reset(t->prof); /* decode's profile starts here */
    }
    return false;
}

static int bench_model(const char *path, const struct backend_cpu_opts *bo, int pp, int tg,
                       double bw, double peak, bool profile)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct qerr err = {0};
    struct gguf_file *f = NULL;
    struct backend *be = NULL, *run, *prof = NULL;
    struct model *m = NULL;
    int rc = gguf_open(path, &f, &err);
    if (!rc) rc = backend_cpu_create(bo, &be, &err);
    run = be;
    if (!rc && profile && !(rc = backend_profile_create(be, &prof, &err))) run = prof;
    int total = pp + tg + 16;
    struct model_opts mo = {.max_batch_tokens = pp > 64 ? pp : 64,
                            .max_logits = 1,
                            .kv_blocks = (total + 15) / 16 + 1,
                            .kv_block_size = 16};
    if (!rc) rc = model_load(f, run, &mo, &m, &err);
    if (rc) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    double wbytes = model_weight_bytes(m); /* what a decode step reads */
    const struct model_config *c = model_get_config(m);
    int32_t *prompt = malloc((size_t)pp * sizeof *prompt);
    for (int i = 0; i < pp; i++) prompt[i] = (int32_t)(bench_rng_next(&rng) % (uint64_t)c->vocab);
    struct gen_opts o = {.n_predict = 1, .prefill_chunk = pp};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    /* prefill: pp tokens in one batch, best of 3 */
    double best_pp = 0;
    for (int rep = 0; rep < 3 && !rc; rep++) {
        struct timing t = {0};
        double t0 = bench_now_s();
        rc = generate_run(m, prompt, (size_t)pp, &o, on_token, &t, &err);
        best_pp = fmax(best_pp, pp / (t.first - t0));
    }
    /* decode: a 16-token prompt, then tg greedy steps, best of 3 */
    double best_tg = 0;
    o.n_predict = tg + 1;
    for (int rep = 0; rep < 3 && !rc; rep++) {
        struct timing t = {0};
        rc = generate_run(m, prompt, 16, &o, on_token, &t, &err);
        best_tg = fmax(best_tg, (t.tokens - 1) / (bench_now_s() - t.first));
    }
    if (profile && !rc) {
        /* one more prefill and one more decode run, each profiled */
        struct bench_ceilings c = {
            .read_gbs = bw,
            .peak_gops = peak,
            .peak_what = bo->precision == MATMUL_Q8 ? bench_int8_peak_insn(bo->isa) : "fp32 FMA"};
        struct gen_opts o1 = o;
        o1.n_predict = 1;
        struct timing t = {0};
        backend_profile_reset(prof);
        double t0 = bench_now_s();
        rc = generate_run(m, prompt, (size_t)pp, &o1, on_token, &t, &err);
        char title[64];
        snprintf(title, sizeof title, "prefill of %d tokens", pp);
        if (!rc) bench_profile_print(stdout, title, prof, t.first - t0, 1, &c);
        t = (struct timing){.prof = prof};
        if (!rc) rc = generate_run(m, prompt, 16, &o, on_token, &t, &err);
        snprintf(title, sizeof title, "decode, %d steps", tg);
        if (!rc) bench_profile_print(stdout, title, prof, (bench_now_s() - t.first) / tg, tg, &c);
    }
    free(prompt);
    if (rc) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    double roof = bw * 1e9 / wbytes;
    printf("\nmodel %s, %s, %s, %d thread(s)\n", path, cpu_isa_name(backend_cpu_isa(be)),
           bo->precision == MATMUL_Q8 ? "Q8 activations" : "F32 activations", bo->n_threads);
    printf("  prefill %d tokens: %8.1f tokens/s\n", pp, best_pp);
    printf("  decode %d steps:   %8.1f tokens/s = %.1f GB/s of weights (%.1f MB/token); "
           "roofline %.1f tokens/s at %.1f GB/s: %.0f%%\n",
           tg, best_tg, best_tg * wbytes / 1e9, wbytes / 1e6, roof, bw, 100.0 * best_tg / roof);
out:
    model_free(m);
    backend_destroy(prof);
    backend_destroy(be);
    gguf_close(f);
    return rc ? 1 : 0;
}

/* --batches: token counts up to this (the other ops' buffers are sized by the largest) */
#define MAX_BATCH  8192
#define MAX_COUNTS 16 /* batch sizes a run takes */

static void usage(void)
{
    fprintf(stderr,
            "usage: quern-bench-kernels [--threads N] [--isa scalar|avx2|avxvnni|avx512|amx]\n"
            "         [--precision f32|q8|both] [--batches 1,8,64,512] [--no-kernels]\n"
            "         [--model M.gguf [--pp 512] [--tg 64] [--profile]]\n"
            "  --isa: default $QUERN_CPU_ISA, else the best the CPU has; --model: the\n"
            "  matmul tables time that file's own shapes and types\n");
}

int bench_kernels_main(int argc, char **argv)
{
    struct backend_cpu_opts bo = {.n_threads = 0, .precision = MATMUL_F32, .isa = CPU_ISA_AUTO};
    const char *model = NULL;
    int pp = 512, tg = 64, both = 1, kernels = 1, profile = 0;
    bool isa_given = false;
    int batches[MAX_COUNTS] = {1, 8, 64, 512}, n_batches = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads") && v) {
            if (!bench_parse_count(v, 1, 1024, &bo.n_threads)) {
                fprintf(stderr, "quern bench --kernels: --threads '%s': want 1..1024\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--isa") && v) {
            int isa = cpu_isa_parse(v);
            if (isa < 0) return usage(), 2;
            bo.isa = (enum cpu_isa)isa;
            isa_given = true;
            i++;
        } else if (!strcmp(a, "--precision") && v) {
            both = !strcmp(v, "both");
            bo.precision = !strcmp(v, "q8") ? MATMUL_Q8 : MATMUL_F32;
            i++;
        } else if (!strcmp(a, "--batches") && v) {
            if (!bench_parse_counts(v, 1, MAX_BATCH, batches, MAX_COUNTS, &n_batches)) {
                fprintf(stderr,
                        "quern bench --kernels: --batches '%s': want up to %d token counts in "
                        "1..%d, comma-separated\n",
                        v, MAX_COUNTS, MAX_BATCH);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--model") && v) {
            model = v;
            i++;
        } else if (!strcmp(a, "--pp") && v) {
            if (!bench_parse_count(v, 16, 1 << 20, &pp)) {
                fprintf(stderr, "quern bench --kernels: --pp '%s': want 16 or more\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--tg") && v) {
            if (!bench_parse_count(v, 2, 1 << 20, &tg)) {
                fprintf(stderr, "quern bench --kernels: --tg '%s': want 2 or more\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--no-kernels")) {
            kernels = 0;
        } else if (!strcmp(a, "--profile")) {
            profile = 1;
        } else {
            usage();
            return 2;
        }
    }
    if (bo.n_threads <= 0) bo.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    /* as every other command: $QUERN_CPU_ISA picks the kernels unless --isa did */
    const char *env_isa = getenv("QUERN_CPU_ISA");
    if (!isa_given && env_isa && *env_isa) {
        int isa = cpu_isa_parse(env_isa);
        if (isa < 0) {
            fprintf(stderr, "QUERN_CPU_ISA=%s: want scalar, avx2, avxvnni, avx512, amx or auto\n",
                    env_isa);
            return 2;
        }
        bo.isa = (enum cpu_isa)isa;
    }
    const char *env_pf = getenv("QUERN_CPU_PREFETCH");
    if (env_pf && *env_pf) {
        int pf = cpu_prefetch_parse(env_pf);
        if (pf < 0) {
            fprintf(stderr, "QUERN_CPU_PREFETCH=%s: want l1, l2 or auto\n", env_pf);
            return 2;
        }
        bo.prefetch = (enum cpu_prefetch)pf;
    }
    struct shape shapes[N_SHAPES];
    memcpy(shapes, default_shapes, sizeof shapes);
    if (model && kernels && shapes_from_model(model, shapes)) return 1;

    double bw1 = bench_read_bandwidth(1), bwn = bench_read_bandwidth(bo.n_threads);
    double cp = bench_memcpy_bandwidth();
    if (bw1 <= 0 || bwn <= 0 || cp <= 0) return 1;
    printf("memory: read %.1f GB/s (1 thread), %.1f GB/s (%d threads); memcpy %.1f GB/s "
           "(1 thread)\n",
           bw1, bwn, bo.n_threads, cp);
    enum cpu_isa isa = bo.isa; /* the ceiling of the kernels these options select */
    double peak_fp32 = bench_compute_peak(true, bo.n_threads, isa),
           peak_int8 = bench_compute_peak(false, bo.n_threads, isa);
    printf("compute peak (%d threads): fp32 FMA %.0f GFLOP/s, int8 %s %.0f GOP/s\n", bo.n_threads,
           peak_fp32, bench_int8_peak_insn(isa), peak_int8);

    int rc = 0;
    enum matmul_precision precs[2] = {bo.precision, MATMUL_Q8};
    int n_prec = both ? 2 : 1;
    if (both) precs[0] = MATMUL_F32;
    for (int p = 0; p < n_prec && !rc && kernels; p++) {
        struct backend_cpu_opts o = bo;
        o.precision = precs[p];
        rc = bench_matmuls(&o, shapes, batches, n_batches, bwn,
                           o.precision == MATMUL_Q8 ? peak_int8 : peak_fp32);
        if (!rc)
            rc = bench_matmuls_cached(&o, shapes, batches, n_batches,
                                      bench_compute_peak(o.precision != MATMUL_Q8, 1, isa));
    }
    if (!rc && kernels) rc = bench_ops(&bo, batches, n_batches);
    if (!rc && kernels) rc = bench_decode_attention(&bo, 16, 160, 0);
    if (!rc && kernels) rc = bench_decode_attention(&bo, 4, 128, 4096);
    for (int p = 0; p < n_prec && !rc && model; p++) {
        struct backend_cpu_opts o = bo;
        o.precision = precs[p];
        rc = bench_model(model, &o, pp, tg, bwn, o.precision == MATMUL_Q8 ? peak_int8 : peak_fp32,
                         profile);
    }
    return rc;
}
