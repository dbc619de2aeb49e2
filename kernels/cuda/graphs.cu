/* graphs: whole steps captured once as CUDA graphs and replayed (backend.h's step_begin /
 * step_end / step_reset).
 *
 * DESIGN
 * A decode step of a small model is hundreds of short kernels; launching them one by one costs
 * more than running them. The model issues a step's ops between step_begin(key) and step_end.
 * The first time a key is seen the ops just run (warming what they lazily set up); the second
 * time they are captured on the backend's stream (nothing runs during a capture), instantiated,
 * and the executable graph is launched; from then on step_begin(key) launches that graph alone.
 * A captured launch keeps its arguments, so a replay is exactly the ops it recorded: the engine's
 * inputs (tokens, positions, slots, block tables) are device buffers written before
 * step_begin, the outputs are read after, and no op allocates (the arena is sized at load).
 *
 * The model pads what it replays (engine/model.c): token and logit counts to powers of two up
 * to 64 (with padding tokens that write only a spare KV block), the block-table width to a power
 * of two, so a batch of 1..64 sequences at any context maps onto a few dozen keys; at most
 * GRAPH_SLOTS graphs are kept, the least recently used replaced. A capture that fails turns replay
 * off for the backend's life (step_end returns false and the caller runs the ops directly); so does
 * $QUERN_CUDA_GRAPHS=0, and so does $QUERN_SYNC_LAUNCH (it synchronizes inside ops, which a
 * capture forbids). A precision change, step_reset, and freeing any buffer or weight (a graph
 * may hold its address) drop every graph. */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

static void drop(struct cuda_graph_slot *s)
{
    if (s->exec) cudaGraphExecDestroy(s->exec);
    memset(s, 0, sizeof *s);
}

void cuda_graphs_reset(struct cuda_ctx *c)
{
    for (int i = 0; i < GRAPH_SLOTS; i++) drop(&c->graphs[i]);
}

void cuda_graphs_init(struct cuda_ctx *c, bool off)
{
    c->graphs_on = !c->sync_launch && !off;
}

/* The slot holding key, or NULL. */
static struct cuda_graph_slot *find(struct cuda_ctx *c, uint64_t key)
{
    for (int i = 0; i < GRAPH_SLOTS; i++)
        if (c->graphs[i].seen && c->graphs[i].key == key) return &c->graphs[i];
    return NULL;
}

/* An empty slot, else the least recently used one, emptied. */
static struct cuda_graph_slot *take(struct cuda_ctx *c)
{
    struct cuda_graph_slot *lru = &c->graphs[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (!c->graphs[i].seen) return &c->graphs[i];
        if (c->graphs[i].last_use < lru->last_use) lru = &c->graphs[i];
    }
    drop(lru);
    return lru;
}

bool cuda_op_step_begin(struct backend *be, uint64_t key)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    c->capturing = NULL;
    if (!c->graphs_on || c->err_code) return false;
    cuda_use_device(c);
    struct cuda_graph_slot *s = find(c, key);
    c->graph_clock++;
    if (!s) { /* first sight: run the ops as they are */
        s = take(c);
        s->seen = true;
        s->key = key;
        s->last_use = c->graph_clock;
        return false;
    }
    s->last_use = c->graph_clock;
    if (s->exec) {
        CUDA_OK(c, cudaGraphLaunch(s->exec, c->stream));
        c->graph_replays++;
        return true;
    }
    /* second sight: capture this time */
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        c->graphs_on = false;
        return false;
    }
    c->capturing = s;
    return false;
}

bool cuda_op_step_end(struct backend *be)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    struct cuda_graph_slot *s = c->capturing;
    if (!s) return true; /* the ops ran directly */
    c->capturing = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e == cudaSuccess && !c->err_code) e = cudaGraphInstantiate(&s->exec, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e == cudaSuccess && !c->err_code) e = cudaGraphLaunch(s->exec, c->stream);
    if (e == cudaSuccess && !c->err_code) {
        c->graph_captures++;
        return true;
    }
    /* an op refused the capture (or a launch failed in it): nothing of this step ran */
    cudaGetLastError();
    /* err_code was clear at step_begin: whatever an op recorded since came from the capture; a
     * real fault of an op recurs when the caller runs the ops directly */
    c->err_code = 0;
    c->err_msg[0] = '\0';
    drop(s);
    cuda_graphs_reset(c);
    c->graphs_on = false;
    return false;
}

extern "C" void backend_cuda_graph_counts(const struct backend *be, uint64_t *captures,
                                          uint64_t *replays)
{
    const struct cuda_ctx *c = cuda_ctx_of(be);
    *captures = c->graph_captures;
    *replays = c->graph_replays;
}

void cuda_op_step_reset(struct backend *be)
{
    struct cuda_ctx *c = cuda_ctx_of(be);
    if (c->capturing) return; /* not between begin and end */
    cuda_graphs_reset(c);
}
