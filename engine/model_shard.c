/* model_shard: the tensor-parallel split of a model (model_shard.h). */
#include "model_shard.h"

#include <stdio.h>
#include <string.h>

void model_shard_whole(const struct model_config *c, struct model_shard *s)
{
    *s = (struct model_shard){.rank = 0,
                              .n_ranks = 1,
                              .q0 = 0,
                              .nq = c->n_heads,
                              .kv0 = 0,
                              .nkv = c->n_kv_heads,
                              .f0 = 0,
                              .nf = c->n_experts ? c->expert_ffn_dim : c->ffn_dim,
                              .s0 = 0,
                              .ns = c->expert_shared_ffn_dim};
}

/* Part i of n when `total` units are split as evenly as possible, the first ones larger. */
static void even_part(int total, int n, int i, int *start, int *count)
{
    int base = total / n, extra = total % n;
    *count = base + (i < extra);
    *start = i * base + (i < extra ? i : extra);
}

int model_shard_plan(const struct model_config *c, int n_ranks, int rank, struct model_shard *s,
                     struct qerr *err)
{
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return qerr_set(err, QERR_INVALID, "tp: rank %d of %d", rank, n_ranks);
    if (n_ranks > c->n_heads)
        return qerr_set(err, QERR_INVALID,
                        "--tp %d: the model has %d query heads (%d KV heads); at most %d ranks",
                        n_ranks, c->n_heads, c->n_kv_heads, c->n_heads);
    /* FFN channels (each expert's, in a mixture) in whole quant blocks, so down's column shards
     * start on a block */
    int ffn = c->n_experts ? c->expert_ffn_dim : c->ffn_dim;
    int unit = ffn % 32 == 0 ? 32 : 1;
    if (n_ranks > ffn / unit)
        return qerr_set(err, QERR_INVALID, "--tp %d: FFN of %d channels has only %d blocks",
                        n_ranks, ffn, ffn / unit);
    int shared = c->expert_shared_ffn_dim, sunit = shared % 32 == 0 ? 32 : 1;
    if (shared && n_ranks > shared / sunit)
        return qerr_set(err, QERR_INVALID,
                        "--tp %d: the shared expert of %d channels has only %d blocks", n_ranks,
                        shared, shared / sunit);
    int g = c->n_heads / c->n_kv_heads; /* query heads per KV head */
    s->rank = rank;
    s->n_ranks = n_ranks;
    if (n_ranks <= c->n_kv_heads) {
        even_part(c->n_kv_heads, n_ranks, rank, &s->kv0, &s->nkv);
        s->q0 = s->kv0 * g;
        s->nq = s->nkv * g;
    } else {
        /* one KV head per rank, replicated over the ranks that share it */
        int k = (int)((int64_t)rank * c->n_kv_heads / n_ranks), first = -1, sharing = 0;
        for (int r = 0; r < n_ranks; r++)
            if ((int)((int64_t)r * c->n_kv_heads / n_ranks) == k) {
                if (first < 0) first = r;
                sharing++;
            }
        s->kv0 = k;
        s->nkv = 1;
        even_part(g, sharing, rank - first, &s->q0, &s->nq);
        s->q0 += k * g;
        if (s->nq == 0) /* n_ranks <= n_heads makes this unreachable; kept as a guard */
            return qerr_set(err, QERR_INVALID,
                            "--tp %d: KV head %d's %d query heads cannot cover "
                            "%d ranks",
                            n_ranks, k, g, sharing);
    }
    int fs, fc;
    even_part(ffn / unit, n_ranks, rank, &fs, &fc);
    s->f0 = fs * unit;
    s->nf = fc * unit;
    s->s0 = s->ns = 0;
    if (shared) {
        even_part(shared / sunit, n_ranks, rank, &fs, &fc);
        s->s0 = fs * sunit;
        s->ns = fc * sunit;
    }
    return 0;
}

static const struct gguf_tensor *tensor(const struct gguf_file *f, const char *name)
{
    return gguf_tensor_find(f, name);
}

/* This rank's bytes of layer l's experts of one matrix (part "gate", "up" or "down": rows or
 * columns [f0, f0 + nf) of each), stacked or one tensor an expert, and the router with gate; a
 * shared expert's channels [s0, s0 + ns) of it, and its gate with gate's. */
static int expert_bytes(const struct gguf_file *f, const struct model_config *c,
                        const struct model_shard *s, int l, const char *part, uint64_t *total,
                        struct qerr *err)
{
    char name[96];
    bool down = !strcmp(part, "down");
    if (!strcmp(part, "gate")) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        const struct gguf_tensor *t = tensor(f, name);
        if (!t) return qerr_set(err, QERR_FORMAT, "%s: missing tensor %s", gguf_path(f), name);
        *total += t->nbytes;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", l);
        if ((t = tensor(f, name))) *total += t->nbytes;
    }
    snprintf(name, sizeof name, "blk.%d.ffn_%s_shexp.weight", l, part);
    const struct gguf_tensor *sh = c->expert_shared_ffn_dim ? tensor(f, name) : NULL;
    if (sh) /* the shared expert's channels [s0, s0 + ns) */
        *total += down ? sh->ne[1] * qtype_row_bytes(sh->type, (size_t)s->ns)
                       : (uint64_t)s->ns * qtype_row_bytes(sh->type, (size_t)sh->ne[0]);
    for (int e = -1; e < c->n_experts; e++) {
        if (e < 0)
            snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, part);
        else
            snprintf(name, sizeof name, "blk.%d.ffn_%s.%d.weight", l, part, e);
        const struct gguf_tensor *t = tensor(f, name);
        if (!t && e < 0) continue; /* one tensor an expert */
        if (!t) return qerr_set(err, QERR_FORMAT, "%s: missing tensor %s", gguf_path(f), name);
        uint64_t n = e < 0 ? (uint64_t)c->n_experts : 1;
        if (down && (size_t)s->nf % qtype_block_elems(t->type))
            return qerr_set(err, QERR_UNSUPPORTED,
                            "--tp %d: %s's %d-column shard cuts a quant block", s->n_ranks, name,
                            s->nf);
        *total += down ? n * t->ne[1] * qtype_row_bytes(t->type, (size_t)s->nf)
                       : n * (uint64_t)s->nf * qtype_row_bytes(t->type, (size_t)t->ne[0]);
        if (e < 0) break;
    }
    return 0;
}

int model_shard_bytes(const struct gguf_file *f, const struct model_config *c,
                      const struct model_shard *s, size_t elem_bytes, uint64_t *weight_bytes,
                      size_t *kv_bytes_per_token, struct qerr *err)
{
    uint64_t total = 0;
    const char *whole[] = {"token_embd.weight", "output.weight", "output_norm.weight"};
    for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++) {
        const struct gguf_tensor *t = tensor(f, whole[i]);
        if (t) total += t->nbytes;
    }
    int hd = c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        static const struct {
            const char *name;
            int split; /* 0 whole, 1 rows (column-parallel), 2 columns (row-parallel) */
        } parts[] = {{"attn_norm", 0}, {"ffn_norm", 0},    {"attn_q", 1},
                     {"attn_k", 1},    {"attn_v", 1},      {"ffn_gate", 1},
                     {"ffn_up", 1},    {"attn_output", 2}, {"ffn_down", 2}};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            char name[96];
            if (c->n_experts && !strncmp(parts[i].name, "ffn_", 4) &&
                strcmp(parts[i].name, "ffn_norm")) {
                int rc = expert_bytes(f, c, s, l, parts[i].name + 4, &total, err);
                if (rc) return rc;
                continue;
            }
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, parts[i].name);
            const struct gguf_tensor *t = tensor(f, name);
            if (!t) return qerr_set(err, QERR_FORMAT, "%s: missing tensor %s", gguf_path(f), name);
            const char *p = parts[i].name;
            if (parts[i].split == 0) {
                total += t->nbytes;
            } else if (parts[i].split == 1) {
                int rows = strcmp(p, "attn_q") == 0    ? s->nq * hd
                           : strncmp(p, "ffn", 3) == 0 ? s->nf
                                                       : s->nkv * hd;
                total += (uint64_t)rows * qtype_row_bytes(t->type, (size_t)t->ne[0]);
            } else {
                int cols = strcmp(p, "attn_output") == 0 ? s->nq * hd : s->nf;
                if ((size_t)cols % qtype_block_elems(t->type))
                    return qerr_set(err, QERR_UNSUPPORTED,
                                    "--tp %d: %s's %d-column shard cuts a quant block", s->n_ranks,
                                    name, cols);
                total += t->ne[1] * qtype_row_bytes(t->type, (size_t)cols);
            }
        }
    }
    *weight_bytes = total;
    *kv_bytes_per_token = (size_t)c->n_layers * 2 * (size_t)s->nkv * (size_t)hd * elem_bytes;
    return 0;
}

size_t model_shard_kv_bytes_max(const struct model_config *c, int n_ranks, size_t elem_bytes)
{
    int most = c->n_kv_heads;
    if (n_ranks > 1) {
        most = 0;
        for (int r = 0; r < n_ranks; r++) {
            struct model_shard s;
            if (model_shard_plan(c, n_ranks, r, &s, NULL))
                return model_kv_bytes_per_token(c, elem_bytes);
            if (s.nkv > most) most = s.nkv;
        }
    }
    return (size_t)c->n_layers * 2 * (size_t)most * (size_t)c->head_dim * elem_bytes;
}
