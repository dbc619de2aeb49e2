/* The CPU backend: host buffers, a persistent thread pool, load-time weight packing, and the
 * kernels of one instruction set picked at create (cpu_isa.h, kern.h). Work is split by row
 * groups (matmul), by (token, head) pairs (attention) or by tokens (the rest). Splits never cut
 * a reduction, so results are the same for any thread count and any batch composition. */
#include <stdlib.h>
#include <string.h>
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
    cpu_rope_table_free(&c->rope);
    free(c->scratch);
    free(c);
    free(be);
}

static void *cpu_buf_alloc(struct backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) return NULL;
    memset(p, 0, bytes);
    return p;
}

static void cpu_buf_free(struct backend *be, void *buf)
{
    (void)be;
    free(buf);
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
        int rc = qpack_create(w, &p, err);
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
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .get_rows = cpu_get_rows,
    .silu_mul = cpu_silu_mul,
    .sync = cpu_sync,
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
    c->k = cpu_kernels_for(isa);
    c->n_threads = n;
    rc = pool_create(n, &c->pool, err);
    if (rc) {
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
