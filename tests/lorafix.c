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

/* One target's run of rows in a tensor of the file: the formula's target, its rows, and the head
 * size whose rows sit in Hugging Face's order (0: llama's). */
struct fix_seg {
    int target, neox_hd;
    uint64_t rows;
};

/* One tensor of the file: which matrix (0 a, 1 b) of which layer, its width, and its segments
 * (one, or a fused B's q/k/v or gate/up). */
struct fix_tensor {
    int layer, which, n_seg;
    uint64_t cols;
    struct fix_seg seg[3];
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

/* The target whose formula gives target t's A: with shared_a (or fused), q/k/v share q's and
 * gate/up gate's, as a fused matrix has one A */
static int a_target(const struct lorafix *fx, int t)
{
    if (!fx->shared_a && !fx->fused) return t;
    return t <= LORA_V ? LORA_Q : t == LORA_UP ? LORA_GATE : t;
}

static int fill(void *vctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)err;
    struct fix_ctx *ctx = vctx;
    const struct fix_tensor *t = &ctx->ts[index];
    float *out = dst;
    double amp = t->which ? ctx->fx->amp_b : ctx->fx->amp_a;
    uint64_t row0 = 0;
    for (int k = 0; k < t->n_seg; k++) {
        const struct fix_seg *sg = &t->seg[k];
        for (uint64_t i = 0; i < sg->rows * t->cols; i++) {
            uint64_t r = i / t->cols, col = i % t->cols;
            /* llama-order row r sits at Hugging Face row model_neox_at(r) */
            uint64_t at =
                row0 + (uint64_t)model_neox_at((int64_t)r, sg->neox_hd, ctx->cfg->rot_dim);
            out[at * t->cols + col] =
                lorafix_value(i, t->layer, sg->target, t->which, ctx->fx->seed, amp);
        }
        row0 += sg->rows;
    }
    if (ctx->fx->brk == LORAFIX_NAN && t->layer == 0 && t->seg[0].target == LORA_Q && t->which == 1)
        out[0] = NAN;
    (void)nbytes;
    return 0;
}

/* Adds tensor ts[*n] (its segments already set) under blk.layer.name.weight.lora_{a,b}. */
static int add(struct gguf_writer *w, struct fix_tensor *ts, size_t *n, const char *name,
               struct qerr *err)
{
    const struct fix_tensor *t = &ts[*n];
    uint64_t rows = 0;
    for (int k = 0; k < t->n_seg; k++) rows += t->seg[k].rows;
    char full[96];
    snprintf(full, sizeof full, "blk.%d.%s.weight.lora_%c", t->layer, name, t->which ? 'b' : 'a');
    uint64_t ne[2] = {t->cols, rows};
    (*n)++;
    return gguf_writer_add_tensor(w, full, 2, ne, QTYPE_F32, err);
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
    uint64_t r = (uint64_t)fx->rank;
    for (int l = 0; l < cfg->n_layers && !rc; l++)
        for (int t = 0; t < LORA_N_TARGETS && !rc; t++) {
            if (!(fx->targets >> t & 1)) continue;
            uint64_t in, out;
            target_dims(cfg, t, &in, &out);
            int neox = fx->hf_rows && (t == LORA_Q || t == LORA_K) ? cfg->head_dim : 0;
            if (fx->fused && (t == LORA_K || t == LORA_V || t == LORA_UP)) continue;
            if (fx->fused && (t == LORA_Q || t == LORA_GATE)) {
                /* one A, and B's rows of q, k, v (gate, up) in turn */
                bool qkv = t == LORA_Q;
                ts[n] = (struct fix_tensor){l, 0, 1, in, {{t, 0, r}}};
                rc = add(w, ts, &n, qkv ? "attn_qkv" : "ffn_up", err);
                uint64_t kv_out, dummy;
                target_dims(cfg, qkv ? LORA_K : LORA_UP, &dummy, &kv_out);
                int kneox = fx->hf_rows && qkv ? cfg->head_dim : 0;
                ts[n] = qkv ? (struct fix_tensor){l,
                                                  1,
                                                  3,
                                                  r,
                                                  {{LORA_Q, neox, out},
                                                   {LORA_K, kneox, kv_out},
                                                   {LORA_V, 0, kv_out}}}
                            : (struct fix_tensor){
                                  l, 1, 2, r, {{LORA_GATE, 0, out}, {LORA_UP, 0, kv_out}}};
                if (!rc) rc = add(w, ts, &n, qkv ? "attn_qkv" : "ffn_up", err);
                continue;
            }
            bool first = l == 0 && t == LORA_Q;
            for (int which = 0; which < 2 && !rc; which++) {
                if (first && which == 1 && fx->brk == LORAFIX_NO_B) continue;
                uint64_t cols = which ? r : in;
                if (first && which == 1 && fx->brk == LORAFIX_BAD_RANK) cols++;
                if (first && which == 0 && fx->brk == LORAFIX_WRONG_IN) cols -= 8;
                ts[n] = (struct fix_tensor){
                    l,
                    which,
                    1,
                    cols,
                    {{which ? t : a_target(fx, t), which ? neox : 0, which ? out : r}}};
                rc = add(w, ts, &n, lora_target_name(t), err);
            }
        }
    if (!rc && fx->brk == LORAFIX_OUTPUT) {
        uint64_t dims[2][2] = {{(uint64_t)cfg->dim, r}, {r, (uint64_t)cfg->vocab}};
        for (int which = 0; which < 2 && !rc; which++) {
            ts[n] = (struct fix_tensor){0, which, 1, dims[which][0], {{0, 0, dims[which][1]}}};
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
