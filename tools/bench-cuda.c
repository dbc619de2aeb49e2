/* quern-bench-cuda: the CUDA backend's kernels and decode throughput next to the device's
 * ceilings. Every number is printed beside the roofline it is bounded by.
 *
 *   quern-bench-cuda [--device N] [--quick] [--only copy,gemv,gemm,decode] [--model M.gguf]
 *
 * 1. copy    device-to-device cudaMemcpy over 2 x 2 GiB, bytes read + written per second: the
 *            bandwidth ceiling every GEMV and decode number is compared with.
 * 2. gemv    the matmul op on random weights of Llama-3-8B's shapes (4096x4096, 14336x4096,
 *            4096x14336, 128256x4096) and SmolLM2-135M's (576x576, 1536x576, 576x1536,
 *            49152x576), INT4 (Q4_0) and INT8 (Q8_0), batch 1 and 8, Q8 activations (the decode
 *            path) and fp32 activations (the reference path, batch 1): achieved GB/s of weight
 *            bytes and its share of the copy bandwidth. Calls rotate over enough copies of the
 *            weight (>= 512 MiB together) to miss the 60 MB L2, as a decode does.
 * 3. gemm    batches of 16 to 4096 tokens on the Llama-3-8B shapes (Q4_0): TFLOP/s of the
 *            batch-invariant GEMV tiles (Q8), the tensor-core gemm_mma kernels (int8 and fp16)
 *            and cuBLAS fp16: where each wins, so gemm_min_tokens can be set from it.
 * 4. decode  synthetic models with random weights built in device memory (no file: the GPU
 *            machine receives no gigabytes): llama3-8b (Q4_0) and smollm2-135m (Q4_1 layers, Q8_0
 *            tied embedding), batch 1, 8 and 64 sequences at context 128 (+16 decoded), the same
 *            op sequence as engine/model.c, logits copied to the host every step as the engine
 *            does; tokens/s against the roofline (weight + KV bytes per step / copy bandwidth).
 *    --model runs the real file too (engine/generate.h, greedy).
 * Exits 77 when no CUDA device is usable. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/generate.h"
#include "../kernels/cuda/backend_cuda.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static float frand(void)
{
    return (float)(rnd() >> 40) * 0x1p-23f - 1.0f;
}

static void die(const char *what, const struct qerr *err)
{
    fprintf(stderr, "quern-bench-cuda: %s: %s\n", what, err ? err->msg : "failed");
    exit(1);
}

static void check_status(struct backend *be, const char *what)
{
    struct qerr err = {0};
    if (backend_cuda_status(be, &err)) die(what, &err);
}

/* Random bytes in the file layout of type t for `elems` weights, with sane scales. */
static void *random_weight_bytes(enum qtype t, size_t elems)
{
    size_t bytes = qtype_row_bytes(t, elems);
    uint8_t *p = malloc(bytes);
    if (!p) die("out of host memory", NULL);
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, 8);
    }
    size_t bb = qtype_block_bytes(t);
    if (t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0)
        for (size_t off = 0; off + bb <= bytes; off += bb) {
            uint16_t d = f32_to_fp16(0.01f * frand()), m = f32_to_fp16(0.05f * frand());
            memcpy(p + off, &d, 2);
            if (t == QTYPE_Q4_1) memcpy(p + off + 2, &m, 2);
        }
    else if (t == QTYPE_F16)
        for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)p)[i] = f32_to_fp16(0.05f * frand());
    return p;
}

static void prepare(struct backend *be, struct bweight *w, enum qtype t, int64_t rows, int64_t cols,
                    const void *host)
{
    struct qerr err = {0};
    *w = (struct bweight){.type = t, .rows = rows, .cols = cols, .host = host};
    if (be->ops->weight_prepare(be, w, &err)) die("weight_prepare", &err);
}

static float *dev_random(struct backend *be, size_t n, float scale)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = scale * frand();
    float *d = be->ops->buf_alloc(be, n * sizeof *d);
    if (!d) die("buf_alloc", NULL);
    be->ops->buf_write(be, d, h, n * sizeof *d);
    free(h);
    return d;
}

/* ---- 1. copy ---- */

static double copy_gbps;

static void bench_copy(struct backend *be, bool quick)
{
    struct qerr err = {0};
    if (backend_cuda_copy_bandwidth(be, (size_t)(quick ? 512 : 2048) << 20, 10, &copy_gbps, &err))
        die("copy bandwidth", &err);
    printf("\n## device-to-device copy\n\n%.0f GB/s (bytes read + written; the roofline below)\n",
           copy_gbps);
}

/* ---- 2. gemv ---- */

struct shape {
    const char *model;
    int64_t rows, cols;
};

static const struct shape gemv_shapes[] = {
    {"llama3-8b", 4096, 4096},   {"llama3-8b", 14336, 4096}, {"llama3-8b", 4096, 14336},
    {"llama3-8b", 128256, 4096}, {"smollm2", 576, 576},      {"smollm2", 1536, 576},
    {"smollm2", 576, 1536},      {"smollm2", 49152, 576},
};

static void bench_gemv(struct backend *be, bool quick)
{
    printf("\n## GEMV (matmul op, weights streamed from HBM)\n\n");
    printf("| model | rows x cols | type | batch | activations | us/call | GB/s | of copy |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q8_0};
    for (size_t si = 0; si < sizeof gemv_shapes / sizeof gemv_shapes[0]; si++) {
        const struct shape *sh = &gemv_shapes[si];
        if (quick && sh->rows * sh->cols > 60000000) continue;
        for (size_t ti = 0; ti < 2; ti++) {
            enum qtype t = types[ti];
            void *host = random_weight_bytes(t, (size_t)(sh->rows * sh->cols));
            struct bweight w0;
            prepare(be, &w0, t, sh->rows, sh->cols, host);
            size_t wbytes = backend_cuda_weight_bytes(&w0);
            int copies = (int)(((size_t)512 << 20) / wbytes) + 1;
            if (copies > 4096) copies = 4096;
            struct bweight *ws = malloc((size_t)copies * sizeof *ws);
            ws[0] = w0;
            for (int c = 1; c < copies; c++) prepare(be, &ws[c], t, sh->rows, sh->cols, host);
            free(host);
            float *x = dev_random(be, (size_t)8 * (size_t)sh->cols, 1.0f);
            float *y = be->ops->buf_alloc(be, (size_t)8 * (size_t)sh->rows * sizeof(float));
            const int batches[] = {1, 8};
            for (int bi = 0; bi < 2; bi++)
                for (int p = 0; p < 2; p++) {
                    int n = batches[bi];
                    enum matmul_precision prec = p == 0 ? MATMUL_Q8 : MATMUL_F32;
                    if (prec == MATMUL_F32 && n > 1) continue;
                    backend_cuda_set_precision(be, prec, NULL);
                    int calls = copies > 200 ? copies : 200;
                    for (int c = 0; c < copies; c++) be->ops->matmul(be, &ws[c], x, n, y);
                    be->ops->sync(be);
                    double t0 = now();
                    for (int c = 0; c < calls; c++) be->ops->matmul(be, &ws[c % copies], x, n, y);
                    be->ops->sync(be);
                    double dt = (now() - t0) / calls;
                    check_status(be, "gemv");
                    double gbs = (double)wbytes / dt / 1e9;
                    printf("| %s | %lld x %lld | %s | %d | %s | %.1f | %.0f | %.0f%% |\n",
                           sh->model, (long long)sh->rows, (long long)sh->cols, qtype_name(t), n,
                           prec == MATMUL_Q8 ? "int8" : "fp32", dt * 1e6, gbs,
                           100.0 * gbs / copy_gbps);
                    fflush(stdout);
                }
            backend_cuda_set_precision(be, MATMUL_Q8, NULL);
            for (int c = 0; c < copies; c++) be->ops->weight_release(be, &ws[c]);
            free(ws);
            be->ops->buf_free(be, x);
            be->ops->buf_free(be, y);
        }
    }
}

/* ---- 3. gemm ---- */

/* The matmul paths a large batch can take (backend_cuda_opts). */
static const struct gemm_path {
    const char *name;
    enum matmul_precision precision;
    bool invariant;
    enum cuda_gemm gemm;
} gemm_paths[] = {
    {"GEMV tiles, int8 (--batch-invariant)", MATMUL_Q8, true, CUDA_GEMM_MMA},
    {"MMA int8 (gemm_mma, q8)", MATMUL_Q8, false, CUDA_GEMM_MMA},
    {"MMA fp16 (gemm_mma, f32)", MATMUL_F32, false, CUDA_GEMM_MMA},
    {"cuBLAS fp16", MATMUL_F32, false, CUDA_GEMM_CUBLAS},
};
#define N_GEMM_PATHS (sizeof gemm_paths / sizeof gemm_paths[0])

static void bench_gemm(int device, bool quick)
{
    printf("\n## GEMM (prefill-sized batches, Q4_0 weights)\n\n");
    printf("| rows x cols | tokens | path | ms/call | TFLOP/s |\n|---|---|---|---|---|\n");
    const int ns[] = {16, 32, 64, 128, 512, 4096};
    struct backend *be[N_GEMM_PATHS] = {NULL};
    struct qerr err = {0};
    for (size_t p = 0; p < N_GEMM_PATHS; p++) {
        struct backend_cuda_opts o = {.device = device,
                                      .precision = gemm_paths[p].precision,
                                      .max_tokens = 4096,
                                      .gemm_min_tokens = 1,
                                      .gemm = gemm_paths[p].gemm,
                                      .batch_invariant = gemm_paths[p].invariant};
        if (backend_cuda_create(&o, &be[p], &err)) die("create", &err);
    }
    for (size_t si = 0; si < 4; si++) {
        const struct shape *sh = &gemv_shapes[si];
        if (quick && si > 1) break;
        void *host = random_weight_bytes(QTYPE_Q4_0, (size_t)(sh->rows * sh->cols));
        for (size_t p = 0; p < N_GEMM_PATHS; p++) {
            struct bweight w;
            prepare(be[p], &w, QTYPE_Q4_0, sh->rows, sh->cols, host);
            float *x = dev_random(be[p], (size_t)4096 * (size_t)sh->cols, 1.0f);
            float *y = be[p]->ops->buf_alloc(be[p], (size_t)4096 * (size_t)sh->rows * 4);
            if (!y) die("buf_alloc", NULL);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni];
                if (quick && n != 64 && n != 512) continue;
                be[p]->ops->matmul(be[p], &w, x, n, y);
                be[p]->ops->sync(be[p]);
                int calls = n >= 512 ? 3 : 20;
                double t0 = now();
                for (int c = 0; c < calls; c++) be[p]->ops->matmul(be[p], &w, x, n, y);
                be[p]->ops->sync(be[p]);
                double dt = (now() - t0) / calls;
                check_status(be[p], "gemm");
                printf("| %lld x %lld | %d | %s | %.3f | %.1f |\n", (long long)sh->rows,
                       (long long)sh->cols, n, gemm_paths[p].name, dt * 1e3,
                       2.0 * (double)sh->rows * (double)sh->cols * n / dt / 1e12);
                fflush(stdout);
            }
            be[p]->ops->buf_free(be[p], x);
            be[p]->ops->buf_free(be[p], y);
            be[p]->ops->weight_release(be[p], &w);
        }
        free(host);
    }
    for (size_t p = 0; p < N_GEMM_PATHS; p++) backend_destroy(be[p]);
}

/* ---- 4. decode on a synthetic model ---- */

struct synth_cfg {
    const char *name;
    int n_layers, dim, ffn, n_heads, n_kv_heads, vocab;
    enum qtype type, embd_type;
    float rope_base;
};

static const struct synth_cfg synth_models[] = {
    {"llama3-8b", 32, 4096, 14336, 32, 8, 128256, QTYPE_Q4_0, QTYPE_Q4_0, 500000.0f},
    {"smollm2-135m", 30, 576, 1536, 9, 3, 49152, QTYPE_Q4_1, QTYPE_Q8_0, 100000.0f},
};

struct synth_layer {
    struct bweight wq, wk, wv, wo, gate, up, down;
    float *attn_norm, *ffn_norm, *k_cache, *v_cache;
};

#define SYNTH_BS 16

static void bench_decode_synth(struct backend *be, const struct synth_cfg *m, int ctx, int steps)
{
    const int hd = m->dim / m->n_heads, kv_dim = m->n_kv_heads * hd, maxb = 64;
    const int max_pos = ctx + steps + 2, blocks_per_seq = (max_pos + SYNTH_BS - 1) / SYNTH_BS;
    const size_t slots = (size_t)maxb * (size_t)blocks_per_seq * SYNTH_BS;
    double t_load = now();
    /* one random source big enough for the largest matrix; every weight reads a prefix */
    size_t big = (size_t)m->vocab * (size_t)m->dim;
    if ((size_t)m->ffn * (size_t)m->dim > big) big = (size_t)m->ffn * (size_t)m->dim;
    void *host = random_weight_bytes(m->type, big),
         *host_e = random_weight_bytes(m->embd_type, big);
    struct synth_layer *L = calloc((size_t)m->n_layers, sizeof *L);
    struct bweight embd;
    prepare(be, &embd, m->embd_type, m->vocab, m->dim, host_e);
    size_t wbytes = backend_cuda_weight_bytes(&embd); /* tied output: read every step */
    float *kv_init = malloc((size_t)16 << 20);
    if (backend_kv_elem_bytes(be) == 2) { /* fp16 cache: 16 MiB of finite halves */
        uint16_t *h = (uint16_t *)kv_init;
        for (size_t i = 0; i < ((size_t)16 << 20) / 2; i++) h[i] = f32_to_fp16(frand());
    } else {
        for (size_t i = 0; i < ((size_t)16 << 20) / 4; i++) kv_init[i] = frand();
    }
    for (int l = 0; l < m->n_layers; l++) {
        struct synth_layer *y = &L[l];
        prepare(be, &y->wq, m->type, m->dim, m->dim, host);
        prepare(be, &y->wk, m->type, kv_dim, m->dim, host);
        prepare(be, &y->wv, m->type, kv_dim, m->dim, host);
        prepare(be, &y->wo, m->type, m->dim, m->dim, host);
        prepare(be, &y->gate, m->type, m->ffn, m->dim, host);
        prepare(be, &y->up, m->type, m->ffn, m->dim, host);
        prepare(be, &y->down, m->type, m->dim, m->ffn, host);
        struct bweight *ws[] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->gate, &y->up, &y->down};
        for (int i = 0; i < 7; i++) wbytes += backend_cuda_weight_bytes(ws[i]);
        y->attn_norm = dev_random(be, (size_t)m->dim, 1.0f);
        y->ffn_norm = dev_random(be, (size_t)m->dim, 1.0f);
        size_t cb = slots * (size_t)kv_dim * backend_kv_elem_bytes(be);
        y->k_cache = be->ops->buf_alloc(be, cb);
        y->v_cache = be->ops->buf_alloc(be, cb);
        if (!y->k_cache || !y->v_cache) die("KV cache allocation", NULL);
        for (size_t off = 0; off < cb; off += (size_t)16 << 20) {
            size_t chunk = cb - off < ((size_t)16 << 20) ? cb - off : ((size_t)16 << 20);
            be->ops->buf_write(be, (char *)y->k_cache + off, kv_init, chunk);
            be->ops->buf_write(be, (char *)y->v_cache + off, kv_init, chunk);
        }
    }
    free(host);
    free(host_e);
    free(kv_init);
    float *out_norm = dev_random(be, (size_t)m->dim, 1.0f);
    size_t T = (size_t)maxb;
    float *x = be->ops->buf_alloc(be, T * (size_t)m->dim * 4);
    float *xn = be->ops->buf_alloc(be, T * (size_t)m->dim * 4);
    float *q = be->ops->buf_alloc(be, T * (size_t)m->dim * 4);
    float *k = be->ops->buf_alloc(be, T * (size_t)kv_dim * 4);
    float *v = be->ops->buf_alloc(be, T * (size_t)kv_dim * 4);
    float *att = be->ops->buf_alloc(be, T * (size_t)m->dim * 4);
    float *g = be->ops->buf_alloc(be, T * (size_t)m->ffn * 4);
    float *u = be->ops->buf_alloc(be, T * (size_t)m->ffn * 4);
    float *logits = be->ops->buf_alloc(be, T * (size_t)m->vocab * 4);
    int32_t *d_tok = be->ops->buf_alloc(be, T * 4), *d_pos = be->ops->buf_alloc(be, T * 4);
    int32_t *d_seq = be->ops->buf_alloc(be, T * 4), *d_slot = be->ops->buf_alloc(be, T * 4);
    int32_t *d_tab = be->ops->buf_alloc(be, T * (size_t)blocks_per_seq * 4);
    float *h_logits = malloc(T * (size_t)m->vocab * 4);
    int32_t *table = malloc(T * (size_t)blocks_per_seq * 4);
    for (size_t i = 0; i < T * (size_t)blocks_per_seq; i++) table[i] = (int32_t)i;
    be->ops->buf_write(be, d_tab, table, T * (size_t)blocks_per_seq * 4);
    be->ops->sync(be);
    check_status(be, "synthetic model load");
    double load_s = now() - t_load;

    struct attn_shape shape = {m->n_heads, m->n_kv_heads, hd, 1.0f / sqrtf((float)hd)};
    const int batches[] = {1, 8, 64};
    for (int bi = 0; bi < 3; bi++)
        for (int p = 0; p < 2; p++) {
            int B = batches[bi];
            enum matmul_precision prec = p == 0 ? MATMUL_Q8 : MATMUL_F32;
            if (prec == MATMUL_F32 && B > 1) continue;
            backend_cuda_set_precision(be, prec, NULL);
            double t0 = 0;
            for (int s = -2; s < steps; s++) { /* two warm-up steps */
                if (s == 0) {
                    be->ops->sync(be);
                    t0 = now();
                }
                int32_t tok[64], pos[64], seq[64], slot[64];
                for (int b = 0; b < B; b++) {
                    tok[b] = (int32_t)(rnd() % (uint64_t)m->vocab);
                    pos[b] = ctx + (s < 0 ? 0 : s);
                    seq[b] = b;
                    slot[b] = table[b * blocks_per_seq + pos[b] / SYNTH_BS] * SYNTH_BS +
                              pos[b] % SYNTH_BS;
                }
                be->ops->buf_write(be, d_tok, tok, (size_t)B * 4);
                be->ops->buf_write(be, d_pos, pos, (size_t)B * 4);
                be->ops->buf_write(be, d_seq, seq, (size_t)B * 4);
                be->ops->buf_write(be, d_slot, slot, (size_t)B * 4);
                struct attn_batch ab = {B, d_pos, d_seq,          d_slot,
                                        B, d_tab, blocks_per_seq, SYNTH_BS};
                be->ops->embed(be, &embd, d_tok, B, x);
                for (int l = 0; l < m->n_layers; l++) {
                    struct synth_layer *y = &L[l];
                    be->ops->rmsnorm(be, xn, x, y->attn_norm, B, m->dim, 1e-5f);
                    be->ops->matmul(be, &y->wq, xn, B, q);
                    be->ops->matmul(be, &y->wk, xn, B, k);
                    be->ops->matmul(be, &y->wv, xn, B, v);
                    be->ops->rope(be, q, d_pos, B, m->n_heads, hd, hd, m->rope_base);
                    be->ops->rope(be, k, d_pos, B, m->n_kv_heads, hd, hd, m->rope_base);
                    be->ops->kv_write(be, y->k_cache, y->v_cache, k, v, &ab, kv_dim);
                    be->ops->attention(be, att, q, y->k_cache, y->v_cache, &ab, &shape);
                    be->ops->matmul(be, &y->wo, att, B, xn);
                    be->ops->add(be, x, xn, (size_t)B * (size_t)m->dim);
                    be->ops->rmsnorm(be, xn, x, y->ffn_norm, B, m->dim, 1e-5f);
                    be->ops->matmul(be, &y->gate, xn, B, g);
                    be->ops->matmul(be, &y->up, xn, B, u);
                    be->ops->silu_mul(be, g, u, (size_t)B * (size_t)m->ffn);
                    be->ops->matmul(be, &y->down, g, B, xn);
                    be->ops->add(be, x, xn, (size_t)B * (size_t)m->dim);
                }
                be->ops->rmsnorm(be, xn, x, out_norm, B, m->dim, 1e-5f);
                be->ops->matmul(be, &embd, xn, B, logits);
                be->ops->buf_read(be, h_logits, logits, (size_t)B * (size_t)m->vocab * 4);
            }
            double dt = (now() - t0) / steps;
            check_status(be, "decode");
            /* bytes one step must read: every weight once, plus K and V of every context
             * position of every sequence in every layer */
            double kv_bytes = (double)B * (ctx + steps / 2.0) * kv_dim *
                              (double)backend_kv_elem_bytes(be) * 2.0 * m->n_layers;
            double roof = (double)copy_gbps * 1e9 / ((double)wbytes + kv_bytes);
            printf("| %s | %s | %d | %s | %.2f | %.0f | %.0f | %.0f%% |\n", m->name,
                   qtype_name(m->type), B, prec == MATMUL_Q8 ? "int8" : "fp32", dt * 1e3, B / dt,
                   B * roof, 100.0 / (dt * roof));
            fflush(stdout);
        }
    backend_cuda_set_precision(be, MATMUL_Q8, NULL);
    printf("(%s: %.2f GB of weights, load %.1f s)\n", m->name, (double)wbytes / 1e9, load_s);
    for (int l = 0; l < m->n_layers; l++) {
        struct synth_layer *y = &L[l];
        struct bweight *ws[] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->gate, &y->up, &y->down};
        for (int i = 0; i < 7; i++) be->ops->weight_release(be, ws[i]);
        void *bufs[] = {y->attn_norm, y->ffn_norm, y->k_cache, y->v_cache};
        for (int i = 0; i < 4; i++) be->ops->buf_free(be, bufs[i]);
    }
    be->ops->weight_release(be, &embd);
    void *bufs[] = {out_norm, x,      xn,    q,     k,     v,      att,  g,
                    u,        logits, d_tok, d_pos, d_seq, d_slot, d_tab};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->buf_free(be, bufs[i]);
    free(L);
    free(h_logits);
    free(table);
}

static void bench_decode_file(struct backend *be, const char *path)
{
    struct qerr err = {0};
    struct gguf_file *f;
    struct model *m;
    if (gguf_open(path, &f, &err)) die(path, &err);
    struct model_opts mo = {
        .max_batch_tokens = 512, .max_logits = 8, .kv_blocks = 64, .kv_block_size = 16};
    if (model_load(f, be, &mo, &m, &err)) die("model_load", &err);
    int32_t prompt[128];
    int vocab = model_get_config(m)->vocab;
    for (int i = 0; i < 128; i++) prompt[i] = (int32_t)(rnd() % (uint64_t)vocab);
    struct gen_opts o = {.n_predict = 1, .prefill_chunk = 128};
    sample_params_default(&o.sample);
    o.sample.temperature = 0;
    /* a 128-token prefill and one token, then the same plus 64 more: the difference is decode */
    double t0 = now();
    if (generate_run(m, prompt, 128, &o, NULL, NULL, &err)) die("generate", &err);
    double t_prefill = now() - t0;
    o.n_predict = 65;
    t0 = now();
    if (generate_run(m, prompt, 128, &o, NULL, NULL, &err)) die("generate", &err);
    double dt = now() - t0 - t_prefill;
    check_status(be, "generate");
    printf("| %s (file, prefill 128 in %.1f ms) | | 1 | int8 | %.2f | %.0f | | |\n", path,
           t_prefill * 1e3, dt * 1e3 / 64, 64 / dt);
    model_free(m);
    gguf_close(f);
}

static void usage(void)
{
    fprintf(stderr, "usage: quern-bench-cuda [--device N] [--quick] "
                    "[--only copy,gemv,gemm,decode] [--model M.gguf]\n");
}

int main(int argc, char **argv)
{
    int device = 0;
    bool quick = false;
    const char *only = "copy,gemv,gemm,decode", *model = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v)
            device = atoi(argv[++i]);
        else if (!strcmp(a, "--quick"))
            quick = true;
        else if (!strcmp(a, "--only") && v)
            only = argv[++i];
        else if (!strcmp(a, "--model") && v)
            model = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    char desc[160];
    struct qerr err = {0};
    if (backend_cuda_probe(device, desc, sizeof desc, &err)) {
        printf("quern-bench-cuda: skipped: %s\n", err.msg);
        return 77;
    }
    printf("# quern CUDA benchmark: %s%s\n", desc, quick ? " (quick)" : "");
    struct backend *be;
    struct backend_cuda_opts o = {.device = device, .precision = MATMUL_Q8, .max_tokens = 64};
    if (backend_cuda_create(&o, &be, &err)) die("create", &err);
    bench_copy(be, quick); /* always: the roofline of the rest */
    if (strstr(only, "gemv")) bench_gemv(be, quick);
    if (strstr(only, "gemm")) bench_gemm(device, quick);
    if (strstr(only, "decode")) {
        printf("\n## decode (synthetic random weights, context 128)\n\n");
        printf("| model | type | batch | activations | ms/step | tokens/s | roofline tokens/s | "
               "of roofline |\n|---|---|---|---|---|---|---|---|\n");
        for (size_t i = 0; i < sizeof synth_models / sizeof synth_models[0]; i++) {
            if (quick && i == 0) continue;
            bench_decode_synth(be, &synth_models[i], 128, quick ? 8 : 16);
        }
        if (model) bench_decode_file(be, model);
    }
    backend_destroy(be);
    return 0;
}
