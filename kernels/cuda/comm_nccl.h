/* comm_nccl: the kernels/comm.h contract over NCCL, for ranks that are CUDA backends of one
 * process (one device each, one host thread each: model_tp.c's rank threads).
 *
 * libnccl is opened with dlopen on first use, as cuBLAS is (backend_cuda.cu), so quern links only
 * the CUDA runtime and a CPU or single-GPU run never needs NCCL. The communicators come from
 * ncclCommInitAll over the ranks' devices; each collective is enqueued on its rank's stream
 * (its CUDA backend's), ordered after the ops before it and before the ops after it.
 *
 * Errors: an NCCL failure or comm_abort marks the group failed (a flag every rank checks before
 * enqueueing) and aborts every rank's communicator (ncclCommAbort), which makes kernels stuck in
 * a collective return, so the ranks' next sync reports an error instead of hanging. */
#ifndef QUERN_COMM_NCCL_H
#define QUERN_COMM_NCCL_H

#include "../backend.h"
#include "../comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[r]: rank r's handle on a group over the devices of be[0..n-1] (CUDA backends). */
int comm_nccl_create(struct backend *const *be, int n, struct comm **out, struct qerr *err);

#ifdef __cplusplus
}
#endif

#endif
