/* backend_select: picks and creates the compute backend a `--device` string names.
 *
 *   auto     the CUDA backend on device 0 when this build has it (QUERN_HAVE_CUDA) and a device
 *            is usable; otherwise the CPU backend. A missing driver, no GPU, a too-old GPU or a
 *            CUDA start-up failure all lead to the CPU, never to an error.
 *   cpu      the CPU backend (`threads` workers, 0: all CPUs).
 *   cuda     the CUDA backend on device 0; cuda:N on device N. An error when it cannot start.
 *
 * The knobs (docs/ARCHITECTURE.md, "Knobs") are read here and nowhere else, once per backend
 * created, into the backends' options: the request's fields (the CLI's flags: --kv-type,
 * --gemm, --gemm-min-tokens) first, then the environment's test and debug switches for what the
 * request leaves open: $QUERN_FORCE_CPU=1 (every choice the CPU), $QUERN_CPU_ISA
 * (scalar|avx2|avxvnni|avx512|amx), $QUERN_CPU_PREFETCH (l1|l2: the AVX-512 GEMV's weight
 * prefetch), $QUERN_CUDA_GEMM (mma|cublas), $QUERN_CUDA_GEMM_MIN_TOKENS (0: never, as
 * batch_invariant), $QUERN_CUDA_KV=f16|f32, $QUERN_CUDA_ACT=f16, $QUERN_CUDA_GRAPHS=0,
 * $QUERN_SYNC_LAUNCH=1. A backend created directly (backend_cpu_create, backend_cuda_create) sees
 * none of them.
 *
 * On success err->code is 0 and err->msg holds one line saying which backend runs and why, for
 * the caller to log: "cuda:0 NVIDIA H200, sm_90, 132 SMs, 139.8 GiB; gemm mma from 128 tokens", or
 * "cpu (auto: cuda: no usable device: CUDA driver version is insufficient for CUDA runtime
 * version ...), q8 activations". */
#ifndef QUERN_BACKEND_SELECT_H
#define QUERN_BACKEND_SELECT_H

#include "backend.h"

enum backend_kind {
    BACKEND_KIND_AUTO = 0,
    BACKEND_KIND_CPU = 1,
    BACKEND_KIND_CUDA = 2,
};

/* Parses "auto" (also NULL or ""), "cpu", "cuda" or "cuda:N" (N a decimal ordinal). */
int backend_device_parse(const char *device, enum backend_kind *kind, int *index, struct qerr *err);

/* True when this build contains the CUDA backend. */
bool backend_have_cuda(void);

struct backend_request {
    const char *device;              /* as backend_device_parse reads it */
    int threads;                     /* CPU workers, 0: all online CPUs */
    enum matmul_precision precision; /* MATMUL_AUTO: q8 on the CPU, f32 on CUDA */
    /* Keep every batch size on batch-invariant kernels (kernels/backend.h), where a backend
     * would otherwise switch to faster ones for large batches (CUDA: the GEMM path). The CPU
     * backend always is. */
    bool batch_invariant;
    const char *kv_type; /* "f16", "f32" or "q8" (CPU only); NULL: the backend's own (CPU f16,
                            f32 with f32 activations; CUDA f16) */
    const char *gemm;    /* CUDA's GEMM for large batches: "mma" or "cublas"; NULL: mma */
    int gemm_min_tokens; /* CUDA: batches from this many tokens take the GEMM; 0: 128 */
};

int backend_create_auto(const struct backend_request *r, struct backend **out, struct qerr *err);

/* Tensor parallelism (`--tp N`): n ranks, each a backend of its own and a handle on one
 * communicator group (kernels/comm.h), as model_opts.tp_backends/tp_comms want them.
 *   cpu      n CPU backends over the shared-memory group; r->threads (0: all online CPUs) is
 *            split across the ranks, at least one each
 *   cuda     devices index .. index + n - 1 over NCCL (loaded on demand); an error naming the
 *            device count when there are fewer devices, or when NCCL cannot be loaded
 *   auto     cuda when device 0 is usable, else cpu
 * n = 1 is exactly backend_create_auto with no communicator. err->msg says what was chosen, as
 * backend_create_auto's does. */
#include "comm.h"
struct backend_group {
    int n;
    struct backend *be[COMM_MAX_RANKS];
    struct comm *comm[COMM_MAX_RANKS];
};

int backend_group_create(const struct backend_request *r, int n, struct backend_group *g,
                         struct qerr *err);
/* Destroys every rank's backend and handle (after the model that uses them is freed). */
void backend_group_free(struct backend_group *g);

#endif
