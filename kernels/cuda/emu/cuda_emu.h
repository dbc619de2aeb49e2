/* cuda_emu: runs the CUDA backend's own kernel source on the CPU, to check its logic on machines
 * without a GPU (kernels/cuda/emu/emu-check.sh). Not a CUDA implementation: just enough of the
 * runtime, cuBLAS and the device intrinsics that the backend's .cu files use. x86-64 only.
 *
 * A launch runs its blocks one after another; a block's threads are fibers on the calling thread,
 * so __syncthreads is a barrier over the block and a warp shuffle is a barrier over the warp's 32
 * fibers around a slot array. `__shared__` becomes `static`: one copy, used by one block at a
 * time. Every lane of a warp must reach every shuffle, as on the hardware (else the emulation
 * spins: the wrapper script runs it under a timeout). Device memory is host memory,
 * streams and events are synchronous, numerics are the host's (libm expf/sincos, not the GPU's).
 * Stream capture (CUDA graphs) records each launch, memset and copy as a closure instead of
 * running it, with its arguments as they were, and a graph launch runs the closures in order; a
 * synchronize during a capture fails, as on the hardware.
 *
 * emu-check.sh rewrites `k<<<grid, block, smem, stream>>>(args)` into
 * `emu_launch(grid, block, [=] { k(args); })` before compiling the .cu files as C++. */
#ifndef QUERN_CUDA_EMU_H
#define QUERN_CUDA_EMU_H

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

#define EMU_MAX_THREADS 256

/* ---- vector types, thread indices ---- */

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
    return uint4{x, y, z, w};
}
inline float4 make_float4(float x, float y, float z, float w)
{
    return float4{x, y, z, w};
}

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

template <typename T> inline T min(T a, T b)
{
    return a < b ? a : b;
}

/* ---- fp16 / bf16 ---- */

struct __half {
    uint16_t x;
};
struct __nv_bfloat16 {
    uint16_t x;
};

inline float emu_bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint32_t emu_f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
inline __half __ushort_as_half(unsigned short u)
{
    return __half{u};
}
inline unsigned short __half_as_ushort(__half h)
{
    return h.x;
}
inline float __half2float(__half h)
{
    uint32_t sign = (uint32_t)(h.x & 0x8000) << 16, exp = (h.x >> 10) & 0x1f, man = h.x & 0x3ff;
    if (exp == 0) {
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return emu_bits_f(sign | 0x7f800000u | (man << 13));
    return emu_bits_f(sign | ((exp + 112) << 23) | (man << 13));
}
inline __half __float2half_rn(float f)
{
    uint32_t x = emu_f_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return __half{(uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0))};
    if (ax >= 0x477ff000u) return __half{(uint16_t)(sign | 0x7c00)};
    if (ax < 0x38800000u) {
        float v = emu_bits_f(ax) * 0x1p24f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1))) m++;
        return __half{(uint16_t)(sign | m)};
    }
    uint32_t h = (((ax >> 23) - 112) << 10) | ((ax & 0x7fffff) >> 13), rest = ax & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return __half{(uint16_t)(sign | h)};
}

/* ---- arithmetic intrinsics (one IEEE rounding each; built with -ffp-contract=off) ---- */

inline float __int_as_float(int v)
{
    return emu_bits_f((uint32_t)v);
}
inline float __uint_as_float(unsigned v)
{
    return emu_bits_f(v);
}
inline float __fmul_rn(float a, float b)
{
    return a * b;
}
inline float __fadd_rn(float a, float b)
{
    return a + b;
}
inline float __fsub_rn(float a, float b)
{
    return a - b;
}
inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}

/* ---- the block's threads: fibers, barriers, warp exchange ----
 * Every CUDA thread of the running block is a fiber on the calling host thread, switched by a
 * minimal x86-64 context switch (callee-saved registers and the stack pointer). A fiber runs
 * until it waits at a barrier (a shuffle, __syncthreads) or ends; the scheduler then resumes the
 * next one, round-robin. */

extern "C" void emu_switch(void **save_sp, void *load_sp);
asm(".text\n"
    ".weak emu_switch\n" /* one copy per translation unit: the linker keeps one */
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n");

#define EMU_STACK (256 << 10)

struct emu_barrier {
    unsigned count, gen;
};

struct emu_state {
    void *sched_sp;
    void *sp[EMU_MAX_THREADS];
    char *stacks;
    bool done[EMU_MAX_THREADS];
    unsigned current;
    emu_barrier block_bar, warp_bar[EMU_MAX_THREADS / 32];
    uint64_t slots[2][EMU_MAX_THREADS];
    uint32_t mma_frag[2][EMU_MAX_THREADS][6]; /* a warp's MMA operands: A (4 words), B (2) */
    std::function<void()> body;
    dim3 grid, block;
    uint3 block_idx;
    std::vector<std::function<void()>> *capture; /* the graph being captured, or NULL */
};

inline emu_state emu;

inline void emu_yield()
{
    emu_switch(&emu.sp[emu.current], emu.sched_sp);
}

inline void emu_barrier_wait(emu_barrier *b, unsigned n)
{
    unsigned gen = b->gen;
    if (++b->count == n) {
        b->count = 0;
        b->gen++;
        return;
    }
    while (b->gen == gen) emu_yield();
}

inline void __syncthreads()
{
    emu_barrier_wait(&emu.block_bar, emu.block.x);
}

/* A barrier over the calling lane's warp (every lane of it must arrive, as for a shuffle). */
inline void __syncwarp(unsigned = 0xffffffffu)
{
    emu_barrier_wait(&emu.warp_bar[threadIdx.x / 32], 32);
}

/* One barrier per shuffle: rounds alternate between two slot arrays. A lane can write the array
 * of round g again (round g + 2) only after every lane reached round g + 1's barrier, that is
 * after every lane read round g's values. */
template <typename T> inline T emu_exchange(T v, int src_lane)
{
    static_assert(sizeof(T) <= 8, "shuffle of a wider type");
    unsigned tid = threadIdx.x, warp = tid / 32;
    emu_barrier *b = &emu.warp_bar[warp];
    unsigned buf = b->gen & 1; /* the same for every lane of this round */
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    emu.slots[buf][tid] = bits;
    emu_barrier_wait(b, 32);
    uint64_t got = emu.slots[buf][warp * 32 + ((unsigned)src_lane & 31)];
    T r;
    memcpy(&r, &got, sizeof r);
    return r;
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask)
{
    return emu_exchange(v, (int)(threadIdx.x & 31) ^ mask);
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src)
{
    return emu_exchange(v, src);
}

/* ---- warp-level MMA (mma.sync.aligned.m16n8k32 s8 and m16n8k16 f16, row.col) ----
 * Each lane posts its A and B fragment registers, one barrier (the slot arrays alternate as the
 * shuffles' do), then computes its own four outputs from the warp's fragments. Layouts as the
 * PTX ISA gives them: g = lane / 4, t = lane % 4; D and C hold rows g, g + 8 at columns 2t, 2t+1.
 * s8: A regs (row g, k 4t..), (g + 8, 4t..), (g, 16 + 4t..), (g + 8, 16 + 4t..); B regs
 * (k 4t.., col g), (16 + 4t.., g). f16: the same with two halves per register and k offsets 2t
 * and 8 + 2t. Integer sums are exact; fp16 products are exact in double and summed there, then
 * added to C with one rounding (the hardware's internal order is unspecified). */
inline const uint32_t *emu_mma_post(const uint32_t a[4], const uint32_t b[2])
{
    unsigned tid = threadIdx.x, warp = tid / 32;
    emu_barrier *bar = &emu.warp_bar[warp];
    unsigned buf = bar->gen & 1;
    uint32_t *mine = emu.mma_frag[buf][tid];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0];
    mine[5] = b[1];
    emu_barrier_wait(bar, 32);
    return &emu.mma_frag[buf][warp * 32][0];
}

inline void mma_s8_16832(int d[4], const uint32_t a[4], const uint32_t b[2])
{
    const uint32_t(*f)[6] = (const uint32_t(*)[6])emu_mma_post(a, b);
    const unsigned lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int c = 0; c < 4; c++) {
        const unsigned row = g + (c >= 2 ? 8 : 0), col = 2 * t + (c & 1);
        int sum = d[c];
        for (unsigned k = 0; k < 32; k++) {
            const unsigned ka = k % 16 / 4, byte = k % 4;
            const uint32_t aw = f[(row % 8) * 4 + ka][(k >= 16 ? 2 : 0) + (row >= 8 ? 1 : 0)];
            const uint32_t bw = f[col * 4 + ka][4 + (k >= 16 ? 1 : 0)];
            sum += (int)(int8_t)(aw >> (8 * byte)) * (int)(int8_t)(bw >> (8 * byte));
        }
        d[c] = sum;
    }
}

inline void mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    const uint32_t(*f)[6] = (const uint32_t(*)[6])emu_mma_post(a, b);
    const unsigned lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int c = 0; c < 4; c++) {
        const unsigned row = g + (c >= 2 ? 8 : 0), col = 2 * t + (c & 1);
        double sum = 0;
        for (unsigned k = 0; k < 16; k++) {
            const unsigned ka = k % 8 / 2, half = k % 2;
            const uint32_t aw = f[(row % 8) * 4 + ka][(k >= 8 ? 2 : 0) + (row >= 8 ? 1 : 0)];
            const uint32_t bw = f[col * 4 + ka][4 + (k >= 8 ? 1 : 0)];
            sum += (double)__half2float(__ushort_as_half((unsigned short)(aw >> (16 * half)))) *
                   (double)__half2float(__ushort_as_half((unsigned short)(bw >> (16 * half))));
        }
        d[c] = (float)((double)d[c] + sum);
    }
}

inline void emu_fiber_entry()
{
    emu.body();
    emu.done[emu.current] = true;
    emu_switch(&emu.sp[emu.current], emu.sched_sp);
    abort(); /* a finished fiber is never resumed */
}

inline void emu_run_grid(dim3 grid, dim3 block, std::function<void()> body);

/* Runs a whole grid now, block after block; during a capture, records it. */
inline void emu_launch(dim3 grid, dim3 block, std::function<void()> body)
{
    if (emu.capture) {
        emu.capture->push_back([=] { emu_run_grid(grid, block, body); });
        return;
    }
    emu_run_grid(grid, block, body);
}

inline void emu_run_grid(dim3 grid, dim3 block, std::function<void()> body)
{
    if (block.x % 32 || block.x > EMU_MAX_THREADS || block.y != 1 || block.z != 1) {
        fprintf(stderr, "cuda_emu: unsupported block %u x %u x %u\n", block.x, block.y, block.z);
        abort();
    }
    if (!emu.stacks &&
        !(emu.stacks = (char *)aligned_alloc(64, (size_t)EMU_MAX_THREADS * EMU_STACK)))
        abort();
    emu.grid = grid;
    emu.block = block;
    emu.body = body;
    blockDim = block;
    gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu.block_idx = blockIdx = uint3{x, y, z};
                emu.block_bar = emu_barrier{0, 0};
                for (int w = 0; w < EMU_MAX_THREADS / 32; w++) emu.warp_bar[w] = emu_barrier{0, 0};
                for (unsigned t = 0; t < block.x; t++) {
                    /* a fresh stack: 6 saved registers, then the entry as the return address,
                     * then a fake return address so the entry sees a call-aligned stack */
                    uint64_t *top = (uint64_t *)(emu.stacks + (size_t)(t + 1) * EMU_STACK);
                    top[-1] = 0;
                    top[-2] = (uint64_t)(uintptr_t)&emu_fiber_entry;
                    for (int r = 3; r <= 8; r++) top[-r] = 0;
                    emu.sp[t] = top - 8;
                    emu.done[t] = false;
                }
                for (unsigned left = block.x; left;) {
                    left = 0;
                    for (unsigned t = 0; t < block.x; t++) {
                        if (emu.done[t]) continue;
                        emu.current = t;
                        threadIdx = uint3{t, 0, 0};
                        emu_switch(&emu.sched_sp, emu.sp[t]);
                        left += !emu.done[t];
                    }
                }
            }
}

/* ---- runtime API ---- */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorStreamCaptureUnsupported = 900,
} cudaError_t;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event {
    int unused;
} * cudaEvent_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
};
#define cudaStreamNonBlocking 1
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount;
    size_t totalGlobalMem;
};

inline const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess                 ? "no error"
           : e == cudaErrorMemoryAllocation ? "out of memory"
                                            : "invalid value";
}
inline const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmu";
}
inline cudaError_t cudaGetLastError()
{
    return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda_emu (CPU emulation)");
    p->major = 9;
    p->multiProcessorCount = 1;
    p->totalGlobalMem = (size_t)8 << 30;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int)
{
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    *s = (cudaStream_t)(uintptr_t)1;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    return emu.capture ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t)
{
    return cudaSuccess;
}
#define cudaHostAllocDefault 0
inline cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned)
{
    return (*p = malloc(bytes)) ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void *p)
{
    free(p);
    return cudaSuccess;
}
template <typename T> inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
    /* poisoned, as fresh device memory is not zero either */
    void *m = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!m) return cudaErrorMemoryAllocation;
    memset(m, 0xcd, bytes);
    *p = (T *)m;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t = 0)
{
    if (emu.capture)
        emu.capture->push_back([=] { memset(p, v, n); });
    else
        memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind,
                                   cudaStream_t = 0)
{
    if (emu.capture)
        emu.capture->push_back([=] { memmove(d, s, n); });
    else
        memmove(d, s, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
    *f = *t = (size_t)8 << 30;
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new emu_event();
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = 0)
{
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t)
{
    return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t)
{
    *ms = 1.0f;
    return cudaSuccess;
}

/* ---- cuBLAS: the one call the backend makes ---- */

/* ---- graphs ---- */

struct emu_graph {
    std::vector<std::function<void()>> ops;
};
typedef emu_graph *cudaGraph_t;
typedef emu_graph *cudaGraphExec_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeThreadLocal = 1 };
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode)
{
    if (emu.capture) return cudaErrorInvalidValue;
    emu.capture = new std::vector<std::function<void()>>;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g)
{
    if (!emu.capture) return cudaErrorInvalidValue;
    *g = new emu_graph{*emu.capture};
    delete emu.capture;
    emu.capture = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long)
{
    *e = new emu_graph{g->ops};
    return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t)
{
    if (emu.capture) return cudaErrorStreamCaptureUnsupported;
    for (auto &op : e->ops) op();
    return cudaSuccess;
}

typedef struct emu_cublas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_16F = 2, CUDA_R_32F = 0 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

inline cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = (cublasHandle_t)(uintptr_t)1;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t)
{
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t)
{
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t)
{
    return CUBLAS_STATUS_SUCCESS;
}
inline const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}
/* Column-major C (m x n, ldc) = op(A) (m x k) * op(B) (k x n), fp16 inputs, fp32 output. */
inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha, const void *A,
                                   cudaDataType at, int lda, const void *B, cudaDataType bt,
                                   int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t, cublasGemmAlgo_t)
{
    if (at != CUDA_R_16F || bt != CUDA_R_16F || ct != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (emu.capture) {
        float al = *(const float *)alpha, be = *(const float *)beta;
        emu.capture->push_back([=] {
            cublasGemmEx(nullptr, ta, tb, m, n, k, &al, A, at, lda, B, bt, ldb, &be, C, ct, ldc,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    const __half *a = (const __half *)A, *b = (const __half *)B;
    float *c = (float *)C, al = *(const float *)alpha, be = *(const float *)beta;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) {
                float av = __half2float(ta == CUBLAS_OP_T ? a[(size_t)i * lda + l]
                                                          : a[(size_t)l * lda + i]);
                float bv = __half2float(tb == CUBLAS_OP_T ? b[(size_t)l * ldb + j]
                                                          : b[(size_t)j * ldb + l]);
                s += (double)av * bv;
            }
            float *o = &c[(size_t)j * ldc + i];
            *o = al * (float)s + (be != 0 ? be * *o : 0.0f);
        }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
