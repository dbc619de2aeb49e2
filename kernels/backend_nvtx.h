/* backend_nvtx: a backend that runs another's ops inside NVTX ranges named after them ("matmul
 * 576x1536 Q4_1", "attention", ...), and marks step capture and replay ("graph replay",
 * "graph capture"), so Nsight Systems shows each op of a step. It adds no sync: a range on a
 * GPU backend spans the op's launch, and Nsight matches the kernels to it.
 *
 * backend_select wraps a backend in it only when an NVTX tool is attached
 * ($NVTX_INJECTION64_PATH set, as nsys sets it) or $QUERN_NVTX=1, so an unprofiled run pays
 * nothing. The wrapper owns inner: destroying it destroys inner. */
#ifndef QUERN_BACKEND_NVTX_H
#define QUERN_BACKEND_NVTX_H

#include "backend.h"

int backend_nvtx_wrap(struct backend *inner, struct backend **out, struct qerr *err);

#endif
