/* backend_select: picks and creates the compute backend a `--device` string names.
 *
 *   auto     the CUDA backend on device 0 when this build has it (QUERN_HAVE_CUDA) and a device
 *            is usable; otherwise the CPU backend. A missing driver, no GPU, a too-old GPU or a
 *            CUDA start-up failure all lead to the CPU, never to an error.
 *   cpu      the CPU backend (`threads` workers, 0: all CPUs).
 *   cuda     the CUDA backend on device 0; cuda:N on device N. An error when it cannot start.
 *
 * $QUERN_FORCE_CPU=1 makes every choice the CPU (a debug switch, as calm's).
 * CUDA only: batches of $QUERN_CUDA_GEMM_MIN_TOKENS (default 128; 0: never, as batch_invariant)
 * or more tokens run a GEMM, $QUERN_CUDA_GEMM=mma (the default: gemm_mma.cu's tensor-core
 * kernels) or cublas (cuBLAS over fp16 copies of the weights); $QUERN_CUDA_KV=f32 keeps the KV
 * cache fp32; $QUERN_CUDA_ACT=f16 gives the f32-precision GEMV fp16 activations;
 * $QUERN_CUDA_GRAPHS=0 turns step replay off.
 *
 * On success err->code is 0 and err->msg holds one line saying which backend runs and why, for
 * the caller to log: "cuda:0 NVIDIA H200, sm_90, 132 SMs, 139.8 GiB; gemm mma from 128 tokens", or
 * "cpu (auto: cuda: no usable device: CUDA driver version is insufficient for CUDA runtime
 * version ...)". */
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
    const char *device; /* as backend_device_parse reads it */
    int threads;        /* CPU workers, 0: all online CPUs */
    enum matmul_precision precision;
    /* Keep every batch size on batch-invariant kernels (kernels/backend.h), where a backend
     * would otherwise switch to faster ones for large batches (CUDA: the GEMM path). The CPU
     * backend always is. */
    bool batch_invariant;
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
