#include "lorafix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/gguf_write.h"

struct lorafix lorafix_default(void)
{
    return (struct lorafix){.rank = 8,
                            .alpha = 16.0f,
                            .targets = (1u << LORA_N_TARGETS) - 1,
                            .seed = 7,
                            .amp_a = 0.05,
                            .amp_b = 0.2};
}

float lorafix_value(uint64_t i, int layer, int target, int which, uint32_t seed, double amp)
{
    uint32_t h = (uint32_t)(i * 2654435761u + (uint64_t)layer * 2246822519u +
                            (uint64_t)target * 3266489917u + (uint64_t)which * 668265263u + seed);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)((double)((int64_t)(h % 2001) - 1000) / 1000.0 * amp);
}

/* One tensor of the file: which matrix of which target, and its shape. */
struct fix_tensor {
    int layer, target, which, neox_hd;
    uint64_t rows, cols;
};

struct fix_ctx {
    const struct lorafix *fx;
    const struct model_config *cfg;
    struct fix_tensor *ts;
};

static void target_dims(const struct model_config *c, int t, uint64_t *in, uint64_t *out)
{
    uint64_t q = (uint64_t)c->n_heads * (uint64_t)c->head_dim;
    uint64_t kv = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    uint64_t ins[LORA_N_TARGETS] = {(uint64_t)c->dim, (uint64_t)c->dim, (uint64_t)c->dim,    q,
                                    (uint64_t)c->dim, (uint64_t)c->dim, (uint64_t)c->ffn_dim};
    uint64_t outs[LORA_N_TARGETS] = {
        q, kv, kv, (uint64_t)c->dim, (uint64_t)c->ffn_dim, (uint64_t)c->ffn_dim, (uint64_t)c->dim};
    *in = ins[t];
    *out = outs[t];
}

static int fill(void *vctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)err;
    struct fix_ctx *ctx = vctx;
    const struct fix_tensor *t = &ctx->ts[index];
    float *out = dst;
    uint64_t n = nbytes / sizeof(float);
    double amp = t->which ? ctx->fx->amp_b : ctx->fx->amp_a;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = i / t->cols, col = i % t->cols;
        /* llama-order row r sits at Hugging Face row model_neox_at(r) */
        uint64_t at = (uint64_t)model_neox_at((int64_t)r, t->neox_hd, ctx->cfg->rot_dim);
        out[at * t->cols + col] =
            lorafix_value(i, t->layer, t->target, t->which, ctx->fx->seed, amp);
    }
    if (ctx->fx->brk == LORAFIX_NAN && t->layer == 0 && t->target == LORA_Q && t->which == 1)
        out[0] = NAN;
    return 0;
}

int lorafix_write(const struct model_config *cfg, const char *path, const struct lorafix *fx,
                  struct qerr *err)
{
    struct gguf_writer *w = NULL;
    int rc = gguf_writer_init(&w, err);
    if (rc) return rc;
    const char *arch = fx->arch ? fx->arch : cfg->arch;
    const char *type = fx->general_type ? fx->general_type : "adapter";
    size_t cap = (size_t)cfg->n_layers * LORA_N_TARGETS * 2 + 2;
    struct fix_tensor *ts = calloc(cap, sizeof *ts);
    if (!ts) {
        gguf_writer_free(w);
        return qerr_set(err, QERR_NOMEM, "lorafix: out of memory");
    }
    rc = gguf_writer_set_str(w, "general.architecture", arch, strlen(arch), err);
    if (!rc) rc = gguf_writer_set_str(w, "general.type", type, strlen(type), err);
    if (!rc) rc = gguf_writer_set_str(w, "adapter.type", "lora", 4, err);
    if (!rc) rc = gguf_writer_set_f32(w, "adapter.lora.alpha", fx->alpha, err);
    size_t n = 0;
    for (int l = 0; l < cfg->n_layers && !rc; l++)
        for (int t = 0; t < LORA_N_TARGETS && !rc; t++) {
            if (!(fx->targets >> t & 1)) continue;
            uint64_t in, out;
            target_dims(cfg, t, &in, &out);
            bool first = l == 0 && t == LORA_Q;
            for (int which = 0; which < 2 && !rc; which++) {
                if (first && which == 1 && fx->brk == LORAFIX_NO_B) continue;
                uint64_t rows = which ? out : (uint64_t)fx->rank;
                uint64_t cols = which ? (uint64_t)fx->rank : in;
                if (first && which == 1 && fx->brk == LORAFIX_BAD_RANK) cols++;
                if (first && which == 0 && fx->brk == LORAFIX_WRONG_IN) cols -= 8;
                int neox =
                    fx->hf_rows && which == 1 && (t == LORA_Q || t == LORA_K) ? cfg->head_dim : 0;
                ts[n] = (struct fix_tensor){l, t, which, neox, rows, cols};
                char name[96];
                snprintf(name, sizeof name, "blk.%d.%s.weight.lora_%c", l, lora_target_name(t),
                         which ? 'b' : 'a');
                uint64_t ne[2] = {cols, rows};
                rc = gguf_writer_add_tensor(w, name, 2, ne, QTYPE_F32, err);
                n++;
            }
        }
    if (!rc && fx->brk == LORAFIX_OUTPUT) {
        uint64_t dims[2][2] = {{(uint64_t)cfg->dim, (uint64_t)fx->rank},
                               {(uint64_t)fx->rank, (uint64_t)cfg->vocab}};
        for (int which = 0; which < 2 && !rc; which++) {
            ts[n] = (struct fix_tensor){0, 0, which, 0, dims[which][1], dims[which][0]};
            rc = gguf_writer_add_tensor(w, which ? "output.weight.lora_b" : "output.weight.lora_a",
                                        2, dims[which], QTYPE_F32, err);
            n++;
        }
    }
    struct fix_ctx ctx = {fx, cfg, ts};
    if (!rc) rc = gguf_writer_write(w, path, fill, &ctx, NULL, err);
    gguf_writer_free(w);
    free(ts);
    return rc;
}
