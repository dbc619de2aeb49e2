/* The CPU backend: host buffers, a persistent thread pool, load-time weight packing, and the
 * kernels of one instruction set picked at create (cpu_isa.h, kern.h). Work is split by row
 * groups (matmul), by (token, head) pairs (attention) or by tokens (the rest). Splits never cut
 * a reduction, so results are the same for any thread count and any batch composition. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../backend.h"
#include "cpu_ctx.h"

#define SCRATCH_MIN_TOKENS 64 /* tokens every matmul can take in one pass, reserved at load */

static struct cpu_ctx *ctx_of(struct backend *be)
{
    return be->ctx;
}

static void cpu_destroy(struct backend *be)
{
    struct cpu_ctx *c = ctx_of(be);
    pool_destroy(c->pool);
    cpu_rope_table_free(&c->rope[0]);
    cpu_rope_table_free(&c->rope[1]);
    page_arena_close(&c->weights); /* weights still held keep their chunks */
    free(c->scratch);
    free(c->spans);
    free(c);
    free(be);
}

/* Every buffer starts with a header saying how it was made, so buf_free can undo it. */
#define BUF_HEADER 64
#define BUF_MMAP   1
#define BUF_HEAP   2
/* From this size buffers come straight from mmap: the kernel's zero pages cost nothing until an
 * op first writes them, so a KV pool and an activation arena sized for peak load do not make an
 * idle process resident (a memset would touch every page at load). Below it, the heap. */
#define BUF_MMAP_MIN ((size_t)1 << 20)

struct buf_header {
    size_t map_bytes; /* BUF_MMAP: the length of the mapping that starts at the header */
    int kind;
};
_Static_assert(sizeof(struct buf_header) <= BUF_HEADER, "header fits its slot");

static void *cpu_buf_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    if (bytes > SIZE_MAX / 2) return NULL;
    if (bytes >= BUF_MMAP_MIN) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t len = (bytes + BUF_HEADER + page - 1) / page * page;
        void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        *(struct buf_header *)base = (struct buf_header){.map_bytes = len, .kind = BUF_MMAP};
        return (char *)base + BUF_HEADER;
    }
    void *base = NULL;
    if (posix_memalign(&base, 64, bytes + BUF_HEADER)) return NULL;
    memset(base, 0, bytes + BUF_HEADER);
    ((struct buf_header *)base)->kind = BUF_HEAP;
    return (char *)base + BUF_HEADER;
}

static void cpu_buf_free(struct backend *be, void *buf)
{
    (void)be;
    if (!buf) return;
    struct buf_header *h = (struct buf_header *)((char *)buf - BUF_HEADER);
    if (h->kind == BUF_MMAP)
        munmap(h, h->map_bytes);
    else
        free(h);
}

static void cpu_buf_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
}

static int cpu_weight_prepare(struct backend *be, struct bweight *w, struct qerr *err)
{
    struct cpu_ctx *c = ctx_of(be);
    if (!qtype_supported(w->type))
        return qerr_set(err, QERR_UNSUPPORTED, "cpu backend: weight type %s", qtype_name(w->type));
    w->impl = NULL;
    /* the SIMD kernels read a packed copy; the scalar ones (and float weights) the file */
    if (c->k->matmul_q8 && qpack_type(w->type)) {
        struct qpack *p;
        int rc = qpack_create(w, &c->weights, &p, err);
        if (rc) return rc;
        w->impl = p;
    }
    size_t per_token = cpu_matmul_token_bytes(c, w);
    if (per_token && cpu_scratch_reserve(c, SCRATCH_MIN_TOKENS * per_token + 4 * 64) != 0) {
        qpack_free(w->impl);
        w->impl = NULL;
        return qerr_set(err, QERR_NOMEM, "cpu backend: out of memory for matmul scratch");
    }
    return 0;
}

static void cpu_weight_release(struct backend *be, struct bweight *w)
{
    (void)be;
    qpack_free(w->impl);
    w->impl = NULL;
}

static size_t cpu_weight_bytes(const struct backend *be, const struct bweight *w)
{
    (void)be;
    const struct qpack *p = w->impl;
    return p ? p->data_bytes : (size_t)w->rows * qtype_row_bytes(w->type, (size_t)w->cols);
}

static size_t cpu_kv_elem_bytes(const struct backend *be)
{
    const struct cpu_ctx *c = be->ctx;
    return kv_unit_bytes(c->kv);
}

static size_t cpu_kv_bytes(const struct backend *be, size_t n)
{
    const struct cpu_ctx *c = be->ctx;
    return kv_units(c->kv, n) * kv_unit_bytes(c->kv);
}

static void cpu_sync(struct backend *be)
{
    (void)be;
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .buf_write = cpu_buf_copy,
    .buf_read = cpu_buf_copy,
    .weight_prepare = cpu_weight_prepare,
    .weight_release = cpu_weight_release,
    .weight_bytes = cpu_weight_bytes,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .add_rows = cpu_add_rows,
    .matmul = cpu_matmul,
    .matmul_shared = cpu_matmul_shared,
    .buf_copy = cpu_buf_copy,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .get_rows = cpu_get_rows,
    .silu_mul = cpu_silu_mul,
    .gelu_mul = cpu_gelu_mul,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .moe_combine = cpu_moe_combine,
    .sync = cpu_sync,
    .kv_elem_bytes = cpu_kv_elem_bytes,
    .kv_bytes = cpu_kv_bytes,
};

int backend_cpu_create(const struct backend_cpu_opts *opts, struct backend **out, struct qerr *err)
{
    int n = opts->n_threads;
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    if (opts->precision != MATMUL_F32 && opts->precision != MATMUL_Q8)
        return qerr_set(err, QERR_INVALID, "cpu backend: matmul precision %d", opts->precision);
    enum cpu_isa isa;
    int rc = cpu_isa_resolve(opts->isa, &isa, err);
    if (rc) return rc;
    struct backend *be = calloc(1, sizeof *be);
    struct cpu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return qerr_set(err, QERR_NOMEM, "cpu backend: out of memory");
    }
    c->precision = opts->precision;
    c->isa = isa;
    c->kv = opts->kv_q8 ? KV_Q8 : opts->kv_f16 ? KV_F16 : KV_F32;
    c->k = cpu_kernels_with(isa, opts->prefetch);
    c->n_threads = n;
    c->spans = aligned_alloc(64, (size_t)n * sizeof *c->spans);
    if (!c->spans) {
        free(be);
        free(c);
        return qerr_set(err, QERR_NOMEM, "cpu backend: out of memory");
    }
    rc = pool_create(n, &c->pool, err);
    if (rc) {
        free(c->spans);
        free(be);
        free(c);
        return rc;
    }
    be->ops = &cpu_ops;
    be->ctx = c;
    *out = be;
    return 0;
}

enum cpu_isa backend_cpu_isa(const struct backend *be)
{
    const struct cpu_ctx *c = be->ctx;
    return c->isa;
}

void backend_cpu_pool_count(struct backend *be, bool on)
{
    pool_stats_count(((struct cpu_ctx *)be->ctx)->pool, on);
}

void backend_cpu_pool_stats(const struct backend *be, struct pool_stats *out)
{
    pool_stats_read(((const struct cpu_ctx *)be->ctx)->pool, out);
}
