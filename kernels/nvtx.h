/* nvtx: named ranges on a thread's timeline for Nsight Systems (NVTX 3, the header-only API in
 * the CUDA toolkit), or nothing in a build without it (QUERN_HAVE_NVTX unset).
 *
 * With no tool attached each call costs one indirect call into NVTX's no-op stub, so the engine
 * and the model mark their steps and layers unconditionally; the per-op ranges come from
 * backend_nvtx (kernels/backend_nvtx.h), which backend_select puts in only when a tool is
 * attached. A tool attaches through $NVTX_INJECTION64_PATH, as `nsys profile` does. */
#ifndef QUERN_NVTX_H
#define QUERN_NVTX_H

#include <stdarg.h>
#include <stdio.h>

#ifdef QUERN_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

static inline void nvtx_push(const char *name)
{
#ifdef QUERN_HAVE_NVTX
    nvtxRangePushA(name);
#else
    (void)name;
#endif
}

static inline void nvtx_pop(void)
{
#ifdef QUERN_HAVE_NVTX
    nvtxRangePop();
#endif
}

/* nvtx_push with an integer beside the name (Nsight shows it as the range's payload): for the
 * ranges a step opens many times, where formatting a name each time costs more than the call. */
static inline void nvtx_push_i64(const char *name, long long value)
{
#ifdef QUERN_HAVE_NVTX
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = value;
    nvtxRangePushEx(&a);
#else
    (void)name, (void)value;
#endif
}

/* nvtx_push with a printf-formatted name (at most 127 bytes). */
__attribute__((format(printf, 1, 2))) static inline void nvtx_pushf(const char *fmt, ...)
{
#ifdef QUERN_HAVE_NVTX
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    nvtxRangePushA(name);
#else
    (void)fmt;
#endif
}

#endif
