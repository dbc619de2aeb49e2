/* An NVTX injection library for tests: loaded by NVTX itself when $NVTX_INJECTION64_PATH names
 * it (as Nsight Systems' own is), it writes every range push and pop to $QUERN_NVTX_LOG as
 * "TID push NAME" and "TID pop" lines, for tests/check_nvtx.py. */
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The tool's state: NVTX calls the callbacks below with no context pointer. */
static FILE *log_file;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static void log_line(const char *what, const char *name)
{
    pthread_mutex_lock(&log_mu);
    fprintf(log_file, "%ld %s%s%s\n", (long)syscall(SYS_gettid), what, name ? " " : "",
            name ? name : "");
    pthread_mutex_unlock(&log_mu);
}

static int push_a(const char *message)
{
    log_line("push", message);
    return 0;
}

static int push_ex(const nvtxEventAttributes_t *a)
{
    log_line("push", a && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "?");
    return 0;
}

static int pop(void)
{
    log_line("pop", NULL);
    return 0;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get)
{
    const char *path = getenv("QUERN_NVTX_LOG");
    const NvtxExportTableCallbacks *cb = get(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table;
    unsigned size;
    if (!path || !cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) ||
        size <= NVTX_CBID_CORE_RangePop || !(log_file = fopen(path, "w")))
        return 0;
    setvbuf(log_file, NULL, _IOLBF, 0);
    *table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)push_a;
    *table[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)push_ex;
    *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)pop;
    return 1;
}
