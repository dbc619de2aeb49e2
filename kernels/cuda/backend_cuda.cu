/* backend_cuda: the CUDA backend's context, device buffers, errors and ops table.
 *
 * DESIGN
 * - One stream per backend; every op enqueues on it and returns. buf_write copies from pageable
 *   host memory (the runtime stages it, so the caller may reuse its array at once); buf_read waits
 *   for the stream, since the engine reads the result next.
 * - Device memory is taken with cudaMalloc only: buffers (buf_alloc, at load and when the engine
 *   grows a table), prepared weights (weight_prepare) and the per-step arena (sized at
 *   weight_prepare for max_tokens tokens). No op allocates: a step runs on what load reserved.
 *   cuBLAS gets a fixed workspace for the same reason. Never managed memory.
 * - The ops are void (kernels/backend.h): the first error is kept in the context
 *   (backend_cuda_status) and poisons every later buf_read, so a failed step reads as NaN.
 * - The device is made current at every op entry (cudaGetDevice is thread-local and cheap),
 *   because the engine calls ops from its own thread. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

#define DEFAULT_MAX_TOKENS 1024

static_assert(sizeof(enum matmul_precision) == sizeof(int), "the C enum is read as an int");
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define ATTN_SCRATCH_BYTES     ((size_t)64 << 20)

/* ---- cuBLAS, on demand ---- */

#ifdef QUERN_HAVE_CUBLAS
/* Fills f from libcublas.so.<the headers' major version> (else libcublas.so); in the CPU
 * emulation, from its own functions. */
static int cublas_open(struct cublas_fns *f, struct qerr *err)
{
#ifdef QUERN_CUDA_EMU_H
    *f = (struct cublas_fns){
        NULL,          &cublasCreate,         &cublasDestroy, &cublasSetStream, &cublasSetWorkspace,
        &cublasGemmEx, &cublasGetStatusString};
    (void)err;
    return 0;
#else
    char name[32];
    snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    f->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!f->lib) f->lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!f->lib)
        return qerr_set(err, QERR_UNSUPPORTED, "cuda: the cuBLAS GEMM needs %s: %s", name,
                        dlerror());
    const struct {
        void **slot;
        const char *sym;
    } want[] = {{(void **)&f->create, "cublasCreate_v2"},
                {(void **)&f->destroy, "cublasDestroy_v2"},
                {(void **)&f->set_stream, "cublasSetStream_v2"},
                {(void **)&f->set_workspace, "cublasSetWorkspace_v2"},
                {(void **)&f->gemm_ex, "cublasGemmEx"},
                {(void **)&f->status_string, "cublasGetStatusString"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!(*want[i].slot = dlsym(f->lib, want[i].sym))) {
            dlclose(f->lib);
            f->lib = NULL;
            return qerr_set(err, QERR_UNSUPPORTED, "cuda: %s has no %s", name, want[i].sym);
        }
    return 0;
#endif
}
#endif

/* ---- errors ---- */

static void cuda_record(struct cuda_ctx *c, int code, const char *msg)
{
    if (c->err_code) return;
    c->err_code = code;
    snprintf(c->err_msg, sizeof c->err_msg, "%s", msg);
}

bool cuda_check(struct cuda_ctx *c, cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return true;
    char msg[384];
    snprintf(msg, sizeof msg, "cuda: %s failed at %s:%d: %s (%s)", what, file, line,
             cudaGetErrorString(e), cudaGetErrorName(e));
    cuda_record(c, e == cudaErrorMemoryAllocation ? QERR_NOMEM : QERR_IO, msg);
    return false;
}

void cuda_launched(struct cuda_ctx *c, const char *kernel, const char *file, int line)
{
    cuda_check(c, cudaGetLastError(), kernel, file, line);
    if (c->sync_launch) cuda_check(c, cudaStreamSynchronize(c->stream), kernel, file, line);
}

void cuda_fail(struct cuda_ctx *c, int code, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cuda_record(c, code, msg);
}

struct cuda_free_text cuda_free_now(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
    struct cuda_free_text t;
    snprintf(t.s, sizeof t.s, "%.1f MiB of %.1f MiB free", (double)free_b / 1048576.0,
             (double)total_b / 1048576.0);
    return t;
}

void cuda_use_device(struct cuda_ctx *c)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != c->device)
        CUDA_OK(c, cudaSetDevice(c->device));
}

/* ---- the arena ---- */

size_t cuda_arena_token_bytes(int64_t cols)
{
    size_t nb = (size_t)(cols + QK - 1) / QK;
    size_t q8 = (size_t)cols + nb * (sizeof(float) * 2 + sizeof(int32_t));
    size_t f16 = (size_t)cols * sizeof(__half);
    size_t f32 = (size_t)cols * sizeof(float);
    size_t most = q8 > f16 ? q8 : f16;
    return most > f32 ? most : f32;
}

int cuda_arena_reserve(struct cuda_ctx *c, int64_t cols, struct qerr *err)
{
    if (cols <= c->arena_cols) return 0;
    /* four parts at most, each rounded up to 256 bytes */
    size_t need = (size_t)c->max_tokens * cuda_arena_token_bytes(cols) + 4 * 256;
    if (c->arena) {
        cudaStreamSynchronize(c->stream); /* nothing in flight may still use the old one */
        cudaFree(c->arena);
        c->arena = NULL;
        c->arena_bytes = 0;
        c->arena_cols = 0;
    }
    cudaError_t e = cudaMalloc(&c->arena, need);
    if (e != cudaSuccess) {
        cudaGetLastError();
        c->arena = NULL;
        return qerr_set(err, QERR_NOMEM,
                        "cuda: cannot allocate the %.1f MiB activation arena (%d tokens x %lld "
                        "columns): %s",
                        (double)need / 1048576.0, c->max_tokens, (long long)cols,
                        cuda_free_now().s);
    }
    c->arena_bytes = need;
    c->arena_cols = cols;
    return 0;
}

/* ---- buffers ---- */

static void *cuda_buf_alloc(struct backend *be, size_t bytes)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    cuda_use_device(c);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: clear it */
        return NULL;
    }
    if (!CUDA_OK(c, cudaMemsetAsync(p, 0, bytes, c->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_buf_free(struct backend *be, void *buf)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!buf) return;
    cuda_use_device(c);
    cuda_graphs_reset(c); /* a graph may hold its address */
    CUDA_OK(c, cudaFree(buf));
}

static void cuda_buf_write(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!bytes) return;
    cuda_use_device(c);
    CUDA_OK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void cuda_buf_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!bytes) return;
    cuda_use_device(c);
    CUDA_OK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cuda_buf_read(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!bytes) return;
    cuda_use_device(c);
    if (!c->err_code) {
        CUDA_OK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
        CUDA_OK(c, cudaStreamSynchronize(c->stream));
    }
    if (c->err_code) memset(dst, 0xff, bytes);
}

static void cuda_sync(struct backend *be)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    cuda_use_device(c);
    CUDA_OK(c, cudaStreamSynchronize(c->stream));
}

/* ---- create / destroy ---- */

static void cuda_destroy(struct backend *be)
{
    if (!be) return;
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (c) {
        cuda_use_device(c);
        if (c->stream) cudaStreamSynchronize(c->stream);
        cuda_graphs_reset(c);
        if (c->arena) cudaFree(c->arena);
        if (c->att_part) cudaFree(c->att_part);
#ifdef QUERN_HAVE_CUBLAS
        if (c->cublas) c->blas.destroy(c->cublas);
        if (c->blas.lib) dlclose(c->blas.lib);
        if (c->cublas_ws) cudaFree(c->cublas_ws);
#endif
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

static size_t cuda_kv_elem_bytes(const struct backend *be)
{
    return cuda_ctx_of(be)->kv_f16 ? sizeof(__half) : sizeof(float);
}

static void cuda_mem_info(struct backend *be, size_t *free_bytes, size_t *total_bytes)
{
    cuda_use_device(cuda_ctx_of(be));
    *free_bytes = *total_bytes = 0;
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) cudaGetLastError();
}

static void *cuda_host_alloc(struct backend *be, size_t bytes)
{
    cuda_use_device(cuda_ctx_of(be));
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the caller reports it */
        return NULL;
    }
    return p;
}

static void cuda_host_free(struct backend *be, void *p)
{
    if (!p) return;
    cuda_use_device(cuda_ctx_of(be));
    CUDA_OK(cuda_ctx_of(be), cudaFreeHost(p));
}

static const struct backend_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .destroy = */ cuda_destroy,
    /* .buf_alloc = */ cuda_buf_alloc,
    /* .buf_free = */ cuda_buf_free,
    /* .buf_write = */ cuda_buf_write,
    /* .buf_read = */ cuda_buf_read,
    /* .weight_prepare = */ cuda_op_weight_prepare,
    /* .weight_release = */ cuda_op_weight_release,
    /* .weight_bytes = */ NULL, /* the type's rows: what the decode kernels read */
    /* .embed = */ cuda_op_embed,
    /* .rmsnorm = */ cuda_op_rmsnorm,
    /* .add = */ cuda_op_add,
    /* .matmul = */ cuda_op_matmul,
    /* .rope = */ cuda_op_rope,
    /* .kv_write = */ cuda_op_kv_write,
    /* .attention = */ cuda_op_attention,
    /* .get_rows = */ cuda_op_get_rows,
    /* .silu_mul = */ cuda_op_silu_mul,
    /* .sync = */ cuda_sync,
    /* .step_begin = */ cuda_op_step_begin,
    /* .step_end = */ cuda_op_step_end,
    /* .step_reset = */ cuda_op_step_reset,
    /* .kv_elem_bytes = */ cuda_kv_elem_bytes,
    /* .add_rmsnorm = */ cuda_op_add_rmsnorm,
    /* .mem_info = */ cuda_mem_info,
    /* .host_alloc = */ cuda_host_alloc,
    /* .host_free = */ cuda_host_free,
    /* .matmul_shared = */ NULL, /* the engine calls matmul per weight */
    /* .buf_copy = */ cuda_buf_copy,
    /* .kv_bytes = */ NULL, /* n times kv_elem_bytes */
    /* .add_rows = */ cuda_op_add_rows,
    /* .gelu_mul = */ cuda_op_gelu_mul,
    /* .scale = */ cuda_op_scale,
    /* .softcap = */ cuda_op_softcap,
    /* .moe_combine = */ cuda_op_moe_combine,
};

extern "C" int backend_cuda_probe(int device, char *desc, size_t desc_len, struct qerr *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return qerr_set(err, QERR_UNSUPPORTED, "cuda: no usable device: %s (%s)",
                        cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (count < 1) return qerr_set(err, QERR_UNSUPPORTED, "cuda: no usable device: none found");
    if (device < 0 || device >= count)
        return qerr_set(err, QERR_INVALID, "cuda: device %d requested, %d present", device, count);
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return qerr_set(err, QERR_UNSUPPORTED, "cuda: device %d: %s", device,
                        cudaGetErrorString(e));
    }
    /* the build carries sm_80 and sm_90 code (and compute_90 PTX for newer chips) */
    if (p.major < 8)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "cuda: device %d (%s) is sm_%d%d; quern's CUDA kernels need sm_80 or newer",
                        device, p.name, p.major, p.minor);
    if (desc && desc_len)
        snprintf(desc, desc_len, "cuda:%d %s, sm_%d%d, %d SMs, %.1f GiB", device, p.name, p.major,
                 p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / 1073741824.0);
    return 0;
}

extern "C" int backend_cuda_create(const struct backend_cuda_opts *o, struct backend **out,
                                   struct qerr *err)
{
    *out = NULL;
    /* read as an int: the caller is C, and a value outside the enum is undefined in C++ */
    int prec;
    memcpy(&prec, &o->precision, sizeof prec);
    if (prec != MATMUL_F32 && prec != MATMUL_Q8)
        return qerr_set(err, QERR_INVALID, "cuda backend: matmul precision %d", prec);
    int gemm;
    memcpy(&gemm, &o->gemm, sizeof gemm);
    if (o->max_tokens < 0 || o->gemm_min_tokens < 0 ||
        (gemm != CUDA_GEMM_MMA && gemm != CUDA_GEMM_CUBLAS))
        return qerr_set(err, QERR_INVALID,
                        "cuda backend: max_tokens %d, gemm_min_tokens %d, gemm %d", o->max_tokens,
                        o->gemm_min_tokens, gemm);
#ifndef QUERN_HAVE_CUBLAS
    if (gemm == CUDA_GEMM_CUBLAS)
        return qerr_set(err, QERR_UNSUPPORTED, "cuda backend: this build has no cuBLAS");
#endif
    char desc[160];
    int rc = backend_cuda_probe(o->device, desc, sizeof desc, err);
    if (rc) return rc;
    struct backend *be = (struct backend *)calloc(1, sizeof *be);
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return qerr_set(err, QERR_NOMEM, "cuda backend: out of memory");
    }
    be->ops = &cuda_ops;
    be->ctx = c;
    c->device = o->device;
    c->precision = (enum matmul_precision)prec;
    c->max_tokens = o->max_tokens ? o->max_tokens : DEFAULT_MAX_TOKENS;
    c->gemm_min_tokens = o->batch_invariant   ? 0
                         : o->gemm_min_tokens ? o->gemm_min_tokens
                                              : CUDA_GEMM_MIN_TOKENS_DEFAULT;
    c->gemm_cublas = gemm == CUDA_GEMM_CUBLAS && c->gemm_min_tokens > 0;
    c->sync_launch = o->sync_launch;
    c->kv_f16 = !o->kv_f32;
    c->act_f16 = o->act_f16;
    cuda_graphs_init(c, o->no_graphs);
    if (c->gemm_min_tokens == 0)
        snprintf(c->desc, sizeof c->desc, "%s; batch-invariant (GEMV for every batch)", desc);
    else
        snprintf(c->desc, sizeof c->desc, "%s; gemm %s from %d tokens", desc,
                 c->gemm_cublas ? "cublas" : "mma", c->gemm_min_tokens);
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cuda_destroy(be);
        return qerr_set(err, QERR_UNSUPPORTED, "cuda: device %d: cannot start: %s", o->device,
                        cudaGetErrorString(e));
    }
    const size_t att = o->attn_scratch_bytes ? o->attn_scratch_bytes : ATTN_SCRATCH_BYTES;
    if (cudaMalloc((void **)&c->att_part, att) != cudaSuccess) {
        cudaGetLastError();
        c->att_part = NULL;
        const struct cuda_free_text avail = cuda_free_now();
        cuda_destroy(be);
        return qerr_set(err, QERR_NOMEM, "cuda: cannot allocate %.1f MiB of attention scratch: %s",
                        (double)att / 1048576.0, avail.s);
    }
    c->att_part_bytes = att;
#ifdef QUERN_HAVE_CUBLAS
    if (c->gemm_cublas) {
        if ((rc = cublas_open(&c->blas, err))) {
            cuda_destroy(be);
            return rc;
        }
        cublasStatus_t s = c->blas.create(&c->cublas);
        if (s == CUBLAS_STATUS_SUCCESS) s = c->blas.set_stream(c->cublas, c->stream);
        if (s == CUBLAS_STATUS_SUCCESS &&
            cudaMalloc(&c->cublas_ws, CUBLAS_WORKSPACE_BYTES) != cudaSuccess) {
            cudaGetLastError();
            cuda_destroy(be);
            return qerr_set(err, QERR_NOMEM, "cuda: cannot allocate the %zu MiB cuBLAS workspace",
                            CUBLAS_WORKSPACE_BYTES >> 20);
        }
        c->cublas_ws_bytes = CUBLAS_WORKSPACE_BYTES;
        if (s == CUBLAS_STATUS_SUCCESS)
            s = c->blas.set_workspace(c->cublas, c->cublas_ws, c->cublas_ws_bytes);
        if (s != CUBLAS_STATUS_SUCCESS) {
            cuda_destroy(be);
            return qerr_set(err, QERR_IO, "cuda: cuBLAS setup failed: %s",
                            c->blas.status_string(s));
        }
    }
#endif
    *out = be;
    return 0;
}

extern "C" int backend_cuda_status(struct backend *be, struct qerr *err)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (!c->err_code) return 0;
    return qerr_set(err, c->err_code, "%s", c->err_msg);
}

extern "C" void backend_cuda_set_act_f16(struct backend *be, bool on)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (c->act_f16 != on) cuda_graphs_reset(c); /* the graphs hold the other kernels */
    c->act_f16 = on;
}

extern "C" int backend_cuda_set_precision(struct backend *be, enum matmul_precision p,
                                          struct qerr *err)
{
    if (p != MATMUL_F32 && p != MATMUL_Q8)
        return qerr_set(err, QERR_INVALID, "cuda backend: matmul precision %d", p);
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (c->precision != p) cuda_graphs_reset(c); /* the graphs hold the other kernels */
    c->precision = p;
    return 0;
}

extern "C" const char *backend_cuda_describe(const struct backend *be)
{
    return cuda_ctx_of(be)->desc;
}

extern "C" size_t backend_cuda_weight_bytes(const struct bweight *w)
{
    const struct cuda_weight *cw = (const struct cuda_weight *)w->impl;
    if (!cw) return 0;
    size_t b = cw->L.total;
    if (cw->f16) b += (size_t)cw->L.rows * (size_t)cw->L.cols * sizeof(__half);
    return b;
}

extern "C" int backend_cuda_copy_bandwidth(struct backend *be, size_t bytes, int iters,
                                           double *gbps, struct qerr *err)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    cuda_use_device(c);
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 0;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaGetLastError();
        rc = qerr_set(err, QERR_NOMEM, "cuda: copy bandwidth: cannot allocate 2 x %zu MiB",
                      bytes >> 20);
        goto out;
    }
    /* random-ish contents, not zeros */
    cudaMemsetAsync(a, 0x5a, bytes, c->stream);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    *gbps = 0;
    for (int i = 0; i < iters + 1; i++) {
        cudaEventRecord(e0, c->stream);
        cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, c->stream);
        cudaEventRecord(e1, c->stream);
        if (cudaEventSynchronize(e1) != cudaSuccess) {
            rc = qerr_set(err, QERR_IO, "cuda: copy bandwidth: %s",
                          cudaGetErrorString(cudaGetLastError()));
            goto out;
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        double v = 2.0 * (double)bytes / ((double)ms * 1e-3) / 1e9;
        if (i > 0 && v > *gbps) *gbps = v; /* the first one warms up */
    }
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return rc;
}
