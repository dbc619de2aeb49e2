#include "gguf_quantize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/quantize.h"

uint32_t gguf_file_type_of(enum qtype t)
{
    switch (t) {
    case QTYPE_F32:
        return 0; /* LLAMA_FTYPE_ALL_F32 */
    case QTYPE_F16:
        return 1; /* LLAMA_FTYPE_MOSTLY_F16 */
    case QTYPE_Q4_0:
        return 2;
    case QTYPE_Q4_1:
        return 3;
    case QTYPE_Q8_0:
        return 7;
    case QTYPE_BF16:
        return 32;
    }
    return 0;
}

/* What happens to one tensor. */
struct plan {
    enum qtype dst;
    bool copy; /* bytes copied unchanged */
};

struct fill_ctx {
    const struct gguf_file *in;
    const struct plan *plan;
    float *row; /* [max row length] one dequantized row */
    enum qround round;
};

static void tensor_name(const struct gguf_tensor *t, char *buf, size_t cap)
{
    size_t n = t->name.len < cap - 1 ? (size_t)t->name.len : cap - 1;
    memcpy(buf, t->name.ptr, n);
    buf[n] = '\0';
}

static int fill(void *vctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    const struct fill_ctx *c = vctx;
    const struct gguf_tensor *t = gguf_tensor_at(c->in, index);
    const struct plan *p = &c->plan[index];
    const void *bytes;
    int rc = gguf_tensor_bytes(c->in, t, &bytes, err); /* a released converted tensor again */
    if (rc) return rc;
    if (p->copy) {
        memcpy(dst, bytes, nbytes);
        return 0;
    }
    size_t ne0 = (size_t)t->ne[0], rows = (size_t)(t->n_elems / t->ne[0]);
    size_t src_rb = qtype_row_bytes(t->type, ne0), dst_rb = qtype_row_bytes(p->dst, ne0);
    const unsigned char *src = bytes;
    unsigned char *out = dst;
    for (size_t r = 0; r < rows; r++) {
        qtype_dequantize_row(t->type, src + r * src_rb, c->row, ne0);
        for (size_t j = 0; j < ne0; j++) {
            float v = c->row[j];
            if (!isfinite(v) || (p->dst == QTYPE_F16 && fabsf(v) > 65504.0f)) {
                char name[80];
                tensor_name(t, name, sizeof name);
                return qerr_set(err, QERR_FORMAT,
                                "tensor '%s' row %zu element %zu is %g, which %s cannot hold", name,
                                r, j, (double)v, qtype_name(p->dst));
            }
        }
        int rc = qtype_quantize_row(p->dst, c->round, c->row, out + r * dst_rb, ne0, err);
        if (rc) return rc;
    }
    return 0;
}

static bool is_router(const struct gguf_tensor *t)
{
    static const char suffix[] = ".ffn_gate_inp.weight";
    size_t n = sizeof suffix - 1;
    return t->name.len >= n && !memcmp(t->name.ptr + t->name.len - n, suffix, n);
}

static bool is_output_tensor(const struct gguf_tensor *t)
{
    return gguf_str_eq(t->name, "token_embd.weight") || gguf_str_eq(t->name, "output.weight");
}

/* Decides each tensor's fate and adds its info to the writer; checks every shape first. */
static int plan_tensors(const struct gguf_file *in, const struct gguf_quantize_opts *o,
                        struct gguf_writer *w, struct plan *plan, size_t *max_row, struct qerr *err)
{
    *max_row = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(in); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(in, i);
        char name[80];
        tensor_name(t, name, sizeof name);
        if (t->name.len >= sizeof name || strlen(name) != t->name.len)
            return qerr_set(err, QERR_INVALID, "%s: tensor name '%s...' is too long or has a NUL",
                            gguf_path(in), name);
        enum qtype dst = o->type;
        /* vectors, and an expert router (ffn_gate_inp: a few rows whose order picks experts),
         * stay float32 as llama-quantize keeps them */
        if (t->n_dims == 1 || is_router(t))
            dst = QTYPE_F32;
        else if (o->keep_output && is_output_tensor(t))
            dst = t->type;
        plan[i] = (struct plan){.dst = dst, .copy = dst == t->type};
        if (t->ne[0] % qtype_block_elems(dst))
            return qerr_set(err, QERR_INVALID,
                            "%s: tensor '%s' has rows of %llu elements, not a multiple of the "
                            "%zu-element %s block",
                            gguf_path(in), name, (unsigned long long)t->ne[0],
                            qtype_block_elems(dst), qtype_name(dst));
        if (!plan[i].copy && t->ne[0] > *max_row) *max_row = (size_t)t->ne[0];
        int rc = gguf_writer_add_tensor(w, name, t->n_dims, t->ne, dst, err);
        if (rc) return qerr_wrap(err, "%s", gguf_path(in));
    }
    return 0;
}

int gguf_quantize(const struct gguf_file *in, const char *out, const struct gguf_quantize_opts *o,
                  struct gguf_quantize_stats *stats, struct qerr *err)
{
    if (!qtype_can_quantize(o->type))
        return qerr_set(err, QERR_UNSUPPORTED, "cannot quantize to %s", qtype_name(o->type));
    struct gguf_writer *w = NULL;
    uint64_t n = gguf_tensor_count(in);
    struct plan *plan = calloc(n ? n : 1, sizeof *plan);
    struct fill_ctx fc = {.in = in, .plan = plan, .round = o->round};
    int rc = plan ? 0 : qerr_set(err, QERR_NOMEM, "out of memory");
    if (!rc) rc = gguf_writer_init(&w, err);
    for (uint64_t i = 0; !rc && i < gguf_kv_count(in); i++)
        rc = gguf_writer_copy_kv(w, gguf_kv_at(in, i), err);
    if (!rc) rc = gguf_writer_set_u32(w, "general.file_type", gguf_file_type_of(o->type), err);
    if (!rc && o->type != QTYPE_F32 && o->type != QTYPE_F16)
        rc = gguf_writer_set_u32(w, "general.quantization_version", 2, err);
    size_t max_row = 0;
    if (!rc) rc = plan_tensors(in, o, w, plan, &max_row, err);
    if (!rc && max_row && !(fc.row = malloc(max_row * sizeof *fc.row)))
        rc = qerr_set(err, QERR_NOMEM, "out of memory for a row of %zu floats", max_row);
    if (!rc) rc = gguf_writer_write(w, out, fill, &fc, o->io, err);
    if (!rc && stats) {
        *stats = (struct gguf_quantize_stats){.n_tensors = n};
        for (uint64_t i = 0; i < n; i++) {
            if (plan[i].copy)
                stats->n_copied++;
            else
                stats->n_converted++;
            stats->bytes_in += gguf_tensor_at(in, i)->nbytes;
            stats->bytes_out += gguf_writer_tensor_bytes(w, i);
        }
    }
    free(fc.row);
    free(plan);
    gguf_writer_free(w);
    return rc;
}
