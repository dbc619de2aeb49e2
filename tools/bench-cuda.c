/* quern-bench-cuda: the CUDA backend's kernels and decode throughput next to the device's
 * ceilings. Every number is printed beside the roofline it is bounded by.
 *
 *   quern-bench-cuda [--device N] [--quick] [--only copy,gemv,gemm,decode] [--model M.gguf]
 *                    [--profile]
 *
 * 1. copy    device-to-device cudaMemcpy over 2 x 2 GiB, bytes read + written per second: the
 *            bandwidth ceiling every GEMV and decode number is compared with.
 * 2. gemv    the matmul op on random weights of Llama-3-8B's shapes (4096x4096, 14336x4096,
 *            4096x14336, 128256x4096) and SmolLM2-135M's (576x576, 1536x576, 576x1536,
 *            49152x576), INT4 (Q4_0) and INT8 (Q8_0), batch 1, 8 and 16, activations int8 (the
 *            Q8 decode path), fp32 (the reference path) and fp16: achieved GB/s of weight
 *            bytes and its share of the copy bandwidth. Calls rotate over enough copies of the
 *            weight (>= 512 MiB together) to miss the 60 MB L2, as a decode does.
 * 3. gemm    batches of 16 to 4096 tokens on the Llama-3-8B shapes (Q4_0): TFLOP/s of the
 *            batch-invariant GEMV tiles (Q8), the tensor-core gemm_mma kernels (int8 and fp16)
 *            and cuBLAS fp16: where each wins, so gemm_min_tokens can be set from it.
 * 4. decode  synthetic models of real shapes with random weights (engine/synth.h: written here
 *            to a temporary file, opened and unlinked: the GPU machine receives no gigabytes):
 *            llama3-8b (Q4_0 and Q8_0) and smollm2-135m (Q4_1), batch 1, 8 and 64 sequences
 *            at context 128 (+16 decoded) through the engine's model_forward
 *            (engine/bench_decode.h: CUDA graphs and their padding as in serving, logits copied
 *            to the host every step); tokens/s against the roofline (weight + KV bytes per step
 *            / copy bandwidth).
 *    --model runs the real file the same way.
 *    --profile then times every op of the llama3-8b decode steps at batch 1 and 64 apart
 *            (kernels/backend_profile.h: each op synchronized, no graph replay, so the step is
 *            slower than the table above), one table per batch, each op against the copy
 *            bandwidth: where a step's time goes.
 * Exits 77 when no CUDA device is usable. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/generate.h"
#include "../engine/synth.h"
#include "../kernels/cuda/backend_cuda.h"
#include "../engine/bench_decode.h"
#include "../engine/bench_profile.h"
#include "../kernels/backend_profile.h"
#include "../engine/bench_util.h"

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

/* Random weights in the file layout of type t for `elems` values, with sane scales. */
static void *random_weight_bytes(struct bench_rng *rng, enum qtype t, size_t elems)
{
    void *p = bench_random_weights(rng, t, 1, (int64_t)elems, 0.01f, 0.05f);
    if (!p) die("out of host memory", NULL);
    return p;
}

static void prepare(struct backend *be, struct bweight *w, enum qtype t, int64_t rows, int64_t cols,
                    const void *host)
{
    struct qerr err = {0};
    *w = (struct bweight){.type = t, .rows = rows, .cols = cols, .host = host};
    if (be->ops->weight_prepare(be, w, &err)) die("weight_prepare", &err);
}

static float *dev_random(struct bench_rng *rng, struct backend *be, size_t n, float scale)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = scale * bench_rng_float(rng);
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
    struct bench_rng rng = BENCH_RNG_INIT;
    printf("\n## GEMV (matmul op, weights streamed from HBM)\n\n");
    printf("| model | rows x cols | type | batch | activations | us/call | GB/s | of copy |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    const enum qtype types[] = {QTYPE_Q4_0, QTYPE_Q8_0};
    for (size_t si = 0; si < sizeof gemv_shapes / sizeof gemv_shapes[0]; si++) {
        const struct shape *sh = &gemv_shapes[si];
        if (quick && sh->rows * sh->cols > 60000000) continue;
        for (size_t ti = 0; ti < 2; ti++) {
            enum qtype t = types[ti];
            void *host = random_weight_bytes(&rng, t, (size_t)(sh->rows * sh->cols));
            struct bweight w0;
            prepare(be, &w0, t, sh->rows, sh->cols, host);
            size_t wbytes = backend_cuda_weight_bytes(&w0);
            int copies = (int)(((size_t)512 << 20) / wbytes) + 1;
            if (copies > 4096) copies = 4096;
            struct bweight *ws = malloc((size_t)copies * sizeof *ws);
            ws[0] = w0;
            for (int c = 1; c < copies; c++) prepare(be, &ws[c], t, sh->rows, sh->cols, host);
            free(host);
            float *x = dev_random(&rng, be, (size_t)16 * (size_t)sh->cols, 1.0f);
            float *y = be->ops->buf_alloc(be, (size_t)16 * (size_t)sh->rows * sizeof(float));
            const int batches[] = {1, 8, 16};
            const char *const act_name[] = {"int8", "fp32", "fp16"};
            for (int bi = 0; bi < 3; bi++)
                for (int p = 0; p < 3; p++) { /* activations: int8 (q8), fp32, fp16 (act_f16) */
                    int n = batches[bi];
                    backend_cuda_set_precision(be, p == 0 ? MATMUL_Q8 : MATMUL_F32, NULL);
                    backend_cuda_set_act_f16(be, p == 2);
                    int calls = copies > 200 ? copies : 200;
                    for (int c = 0; c < copies; c++) be->ops->matmul(be, &ws[c], x, n, y);
                    be->ops->sync(be);
                    double t0 = bench_now_s();
                    for (int c = 0; c < calls; c++) be->ops->matmul(be, &ws[c % copies], x, n, y);
                    be->ops->sync(be);
                    double dt = (bench_now_s() - t0) / calls;
                    check_status(be, "gemv");
                    double gbs = (double)wbytes / dt / 1e9;
                    printf("| %s | %lld x %lld | %s | %d | %s | %.1f | %.0f | %.0f%% |\n",
                           sh->model, (long long)sh->rows, (long long)sh->cols, qtype_name(t), n,
                           act_name[p], dt * 1e6, gbs, 100.0 * gbs / copy_gbps);
                    fflush(stdout);
                }
            backend_cuda_set_act_f16(be, false);
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
    struct bench_rng rng = BENCH_RNG_INIT;
    printf("\n## GEMM (prefill-sized batches, Q4_0 weights)\n\n");
    printf("| rows x cols | tokens | path | ms/call | TFLOP/s |\n|---|---|---|---|---|\n");
    enum { N_NS = 6 };
    const int ns[N_NS] = {16, 32, 64, 128, 512, 4096};
    double ms[4][N_GEMM_PATHS][N_NS] = {{{0}}}; /* 0: not measured */
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
        void *host = random_weight_bytes(&rng, QTYPE_Q4_0, (size_t)(sh->rows * sh->cols));
        for (size_t p = 0; p < N_GEMM_PATHS; p++) {
            struct bweight w;
            prepare(be[p], &w, QTYPE_Q4_0, sh->rows, sh->cols, host);
            float *x = dev_random(&rng, be[p], (size_t)4096 * (size_t)sh->cols, 1.0f);
            float *y = be[p]->ops->buf_alloc(be[p], (size_t)4096 * (size_t)sh->rows * 4);
            if (!y) die("buf_alloc", NULL);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni];
                if (quick && n != 64 && n != 512) continue;
                be[p]->ops->matmul(be[p], &w, x, n, y);
                be[p]->ops->sync(be[p]);
                int calls = n >= 512 ? 3 : 20;
                double t0 = bench_now_s();
                for (int c = 0; c < calls; c++) be[p]->ops->matmul(be[p], &w, x, n, y);
                be[p]->ops->sync(be[p]);
                double dt = (bench_now_s() - t0) / calls;
                check_status(be[p], "gemm");
                ms[si][p][ni] = dt * 1e3;
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
    /* what --batch-invariant costs where the GEMM would run, and the fastest path per size (the
     * crossover gemm_min_tokens should sit at) */
    printf("\n| rows x cols | tokens | fastest | --batch-invariant (GEMV tiles) / fastest MMA |\n"
           "|---|---|---|---|\n");
    for (size_t si = 0; si < 4; si++)
        for (size_t ni = 0; ni < N_NS; ni++) {
            if (ms[si][0][ni] == 0) continue;
            size_t best = 0, best_mma = 1;
            for (size_t p = 1; p < N_GEMM_PATHS; p++)
                if (ms[si][p][ni] > 0 && ms[si][p][ni] < ms[si][best][ni]) best = p;
            if (ms[si][2][ni] > 0 && ms[si][2][ni] < ms[si][1][ni]) best_mma = 2;
            printf("| %lld x %lld | %d | %s | %.2fx |\n", (long long)gemv_shapes[si].rows,
                   (long long)gemv_shapes[si].cols, ns[ni], gemm_paths[best].name,
                   ms[si][0][ni] / ms[si][best_mma][ni]);
        }
}

/* ---- 4. decode through the engine's forward ---- */

/* B = 1, 8, 64 sequences at context 128 (engine/bench_decode.h: model_forward, the step replay
 * with its padding, logits to the host every step), int8 activations at every batch and fp32 at
 * batch 1, against the roofline: the bytes a step must read over the copy bandwidth. */
static void bench_decode_model(struct backend *be, const char *label, const struct gguf_file *f,
                               bool quick)
{
    struct bench_rng rng = BENCH_RNG_INIT;
    struct qerr err = {0};
    const int ctx = 128, steps = quick ? 8 : 16, batches[] = {1, 8, 64};
    struct model_opts mo;
    bench_decode_model_opts(64, ctx, steps, &mo);
    struct model *m;
    double t0 = bench_now_s();
    if (model_load(f, be, &mo, &m, &err)) die("model_load", &err);
    double load_s = bench_now_s() - t0, wb = model_weight_bytes(m);
    uint64_t cap0, rep0, cap, rep;
    backend_cuda_graph_counts(be, &cap0, &rep0);
    for (int bi = 0; bi < 3; bi++)
        for (int p = 0; p < 2; p++) {
            const int B = batches[bi];
            const enum matmul_precision prec = p == 0 ? MATMUL_Q8 : MATMUL_F32;
            if (prec == MATMUL_F32 && B > 1) continue;
            backend_cuda_set_precision(be, prec, NULL);
            struct decode_bench r;
            if (bench_decode_run(m, be, wb, B, ctx, steps, bench_rng_next(&rng), NULL, &r, &err))
                die("decode", &err);
            check_status(be, "decode");
            const double roof = copy_gbps * 1e9 / r.read_bytes; /* steps per second */
            printf("| %s | %d | %s | %.2f | %.0f | %.0f | %.0f%% |\n", label, B,
                   prec == MATMUL_Q8 ? "int8" : "fp32", r.step_s * 1e3, B / r.step_s, B * roof,
                   100.0 / (r.step_s * roof));
            fflush(stdout);
        }
    backend_cuda_set_precision(be, MATMUL_Q8, NULL);
    backend_cuda_graph_counts(be, &cap, &rep);
    printf("(%s: %.2f GB of weights read per step, load %.1f s; %llu steps captured, %llu "
           "replayed)\n",
           label, wb / 1e9, load_s, (unsigned long long)(cap - cap0),
           (unsigned long long)(rep - rep0));
    model_free(m);
}

/* --profile: the decode steps of f once more, every op timed apart (int8 activations). */
static void profile_decode_model(struct backend *be, const char *label, const struct gguf_file *f)
{
    struct qerr err = {0};
    struct backend *prof;
    if (backend_profile_create(be, &prof, &err)) die("profile", &err);
    const int ctx = 128, steps = 8, batches[] = {1, 64};
    struct model_opts mo;
    bench_decode_model_opts(64, ctx, steps, &mo);
    struct model *m;
    if (model_load(f, prof, &mo, &m, &err)) die("model_load (profiled)", &err);
    const double wb = model_weight_bytes(m);
    const struct bench_ceilings c = {.read_gbs = copy_gbps};
    struct bench_rng rng = BENCH_RNG_INIT;
    for (int bi = 0; bi < 2; bi++) {
        struct decode_bench r;
        if (bench_decode_run(m, prof, wb, batches[bi], ctx, steps, bench_rng_next(&rng), prof, &r,
                             &err))
            die("profiled decode", &err);
        check_status(be, "profiled decode");
        char title[160];
        snprintf(title, sizeof title,
                 "%s, batch %d, int8 activations: per-op profile (each op synchronized, no "
                 "graphs; %.2f ms/step)",
                 label, batches[bi], r.step_s * 1e3);
        bench_profile_print(stdout, title, prof, r.step_s, steps, &c);
        fflush(stdout);
    }
    model_free(m);
    backend_destroy(prof);
}

static void usage(void)
{
    fprintf(stderr, "usage: quern-bench-cuda [--device N] [--quick] "
                    "[--only copy,gemv,gemm,decode] [--model M.gguf] [--profile]\n");
}

int main(int argc, char **argv)
{
    int device = 0;
    bool quick = false, profile = false;
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
        else if (!strcmp(a, "--profile"))
            profile = true;
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
        printf("\n## decode (engine forward, context 128; synthetic: random weights)\n\n");
        printf("| model | batch | activations | ms/step | tokens/s | roofline tokens/s | "
               "of roofline |\n|---|---|---|---|---|---|---|\n");
        const struct {
            const char *name;
            enum qtype type;
        } synth[] = {
            {"llama3-8b", QTYPE_Q4_0}, {"llama3-8b", QTYPE_Q8_0}, {"smollm2-135m", QTYPE_Q4_1}};
        for (size_t i = 0; i < sizeof synth / sizeof synth[0]; i++) {
            if (quick && i < 2) continue;
            struct gguf_file *f;
            if (synth_model_open(synth[i].name, synth[i].type, 1, NULL, &f, &err))
                die("synthetic model", &err);
            char label[64];
            snprintf(label, sizeof label, "%s %s (synthetic)", synth[i].name,
                     qtype_name(synth[i].type));
            bench_decode_model(be, label, f, quick);
            if (profile && i == 0) profile_decode_model(be, label, f);
            gguf_close(f);
        }
        if (model) {
            struct gguf_file *f;
            if (gguf_open(model, &f, &err)) die(model, &err);
            bench_decode_model(be, model, f, quick);
            gguf_close(f);
        }
    }
    backend_destroy(be);
    return 0;
}
