#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

#define LORA_MAX_RANK 4096

/* The matrices a file may adapt: the model's targets, and Phi-3's fused q/k/v (its fused
 * gate/up is named ffn_up, as the model names it) */
enum { FT_QKV = LORA_N_TARGETS, N_FILE_TARGETS };

static const char *const target_names[N_FILE_TARGETS] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_qkv",
};

const char *lora_target_name(enum lora_target t)
{
    return t >= 0 && t < LORA_N_TARGETS ? target_names[t] : "?";
}

/* A run of B's rows that is one of the model's targets: rows [off, off + rows) of the file's
 * matrix, moved within each head when neox_hd is a head size (rope_neox's q and k). */
struct piece {
    enum lora_target t;
    int64_t off, rows;
    int neox_hd;
};

/* The pieces of file target ft in the model of cfg, its weight's in (cols) and out (rows): one
 * piece, or q/k/v of a fused attn_qkv and gate/up of a fused ffn_up; 0 when the model has no
 * such matrix (attn_q where it fuses q/k/v, attn_qkv where it does not, ffn_gate beside a fused
 * ffn_up, the FFN's of a mixture of experts). */
static int file_pieces(const struct model_config *c, int ft, struct piece *p, int64_t *in,
                       int64_t *out)
{
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int neox = c->rope_neox ? c->head_dim : 0;
    if (ft == FT_QKV) {
        if (!c->fused_qkv) return 0;
        *in = c->dim;
        *out = q + 2 * kv;
        p[0] = (struct piece){LORA_Q, 0, q, neox};
        p[1] = (struct piece){LORA_K, q, kv, neox};
        p[2] = (struct piece){LORA_V, q + kv, kv, 0};
        return 3;
    }
    if ((c->fused_qkv && ft <= LORA_V) || (c->fused_gate_up && ft == LORA_GATE)) return 0;
    /* a mixture's FFN is its experts' (model_moe.h): no dense ffn_gate, ffn_up, ffn_down */
    if (c->n_experts && ft >= LORA_GATE && ft <= LORA_DOWN) return 0;
    if (c->fused_gate_up && ft == LORA_UP) {
        *in = c->dim;
        *out = 2 * (int64_t)c->ffn_dim;
        p[0] = (struct piece){LORA_GATE, 0, c->ffn_dim, 0};
        p[1] = (struct piece){LORA_UP, c->ffn_dim, c->ffn_dim, 0};
        return 2;
    }
    static const int in_kind[LORA_N_TARGETS] = {0, 0, 0, 1, 0, 0, 2};
    static const int out_kind[LORA_N_TARGETS] = {1, 3, 3, 0, 2, 2, 0};
    int64_t by_kind[4] = {c->dim, q, c->ffn_dim, kv};
    *in = by_kind[in_kind[ft]];
    *out = by_kind[out_kind[ft]];
    p[0] = (struct piece){(enum lora_target)ft, 0, *out, ft == LORA_Q || ft == LORA_K ? neox : 0};
    return 1;
}

/* "blk.N.<target>.weight.lora_a" -> layer N, the target, which matrix (0 a, 1 b); QERR_FORMAT
 * for a name that is neither, 1 for a norm vector (skipped). */
static int parse_name(const char *path, struct gguf_str s, const struct model_config *c, int *layer,
                      int *t, int *which, struct qerr *err)
{
    char name[128];
    if (s.len >= sizeof name)
        return qerr_set(err, QERR_FORMAT, "%s: tensor name of %llu bytes", path,
                        (unsigned long long)s.len);
    memcpy(name, s.ptr, s.len);
    name[s.len] = 0;
    size_t n = strlen(name);
    static const char sa[] = ".weight.lora_a", sb[] = ".weight.lora_b";
    bool is_a = n > sizeof sa - 1 && !strcmp(name + n - (sizeof sa - 1), sa);
    bool is_b = n > sizeof sb - 1 && !strcmp(name + n - (sizeof sb - 1), sb);
    if (!is_a && !is_b) {
        static const char norm[] = "_norm.weight";
        if (n > sizeof norm - 1 && !strcmp(name + n - (sizeof norm - 1), norm)) return 1;
        return qerr_set(err, QERR_FORMAT,
                        "%s: tensor '%s' is not a LoRA matrix (no .lora_a or .lora_b suffix)", path,
                        name);
    }
    *which = is_b;
    name[n - (sizeof sa - 1)] = 0;
    int l = -1, used = 0;
    if (sscanf(name, "blk.%d.%n", &l, &used) != 1 || used == 0 || l < 0)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: LoRA of '%s' is not supported (only a layer's attention and "
                        "feed-forward matrices)",
                        path, name);
    if (l >= c->n_layers)
        return qerr_set(err, QERR_FORMAT, "%s: tensor of layer %d, but the model has %d layers",
                        path, l, c->n_layers);
    for (int k = 0; k < N_FILE_TARGETS; k++)
        if (!strcmp(name + used, target_names[k])) {
            *layer = l;
            *t = k;
            return 0;
        }
    return qerr_set(err, QERR_UNSUPPORTED, "%s: LoRA of '%s.weight' is not supported", path, name);
}

static int check_meta(const struct gguf_file *f, const struct model_config *c, float *alpha,
                      struct qerr *err)
{
    const char *path = gguf_path(f);
    struct gguf_str s = {0};
    if (gguf_get_str(f, "general.type", &s, NULL) || !gguf_str_eq(s, "adapter"))
        return qerr_set(err, QERR_FORMAT,
                        "%s: not a LoRA adapter (general.type '%.*s', want 'adapter')", path,
                        (int)(s.len > 40 ? 40 : s.len), s.ptr ? s.ptr : "");
    s = (struct gguf_str){0};
    if (gguf_get_str(f, "adapter.type", &s, NULL) || !gguf_str_eq(s, "lora"))
        return qerr_set(err, QERR_UNSUPPORTED,
                        "%s: adapter.type '%.*s' is not supported (only 'lora')", path,
                        (int)(s.len > 40 ? 40 : s.len), s.ptr ? s.ptr : "");
    s = (struct gguf_str){0};
    if (gguf_get_str(f, "general.architecture", &s, NULL) || !gguf_str_eq(s, c->arch))
        return qerr_set(err, QERR_INVALID,
                        "%s: a LoRA adapter for architecture '%.*s', but the model is '%s'", path,
                        (int)(s.len > 40 ? 40 : s.len), s.ptr ? s.ptr : "", c->arch);
    *alpha = 0;
    int rc = gguf_get_f32(f, "adapter.lora.alpha", alpha, err);
    if (rc == QERR_NOTFOUND) return 0; /* llama.cpp's default: the user's scale alone */
    if (rc) return rc;
    if (!isfinite(*alpha) || *alpha < 0)
        return qerr_set(err, QERR_FORMAT, "%s: adapter.lora.alpha %g", path, (double)*alpha);
    return 0;
}

/* The tensor as float32 [rows][cols] in new memory. */
static int read_matrix(const struct gguf_file *f, const struct gguf_tensor *t, int64_t rows,
                       int64_t cols, float **out, struct qerr *err)
{
    const void *bytes;
    int rc = gguf_tensor_bytes(f, t, &bytes, err);
    if (rc) return rc;
    float *m = malloc((size_t)rows * (size_t)cols * sizeof *m);
    if (!m)
        return qerr_set(err, QERR_NOMEM, "%s: out of memory for %.*s", gguf_path(f),
                        (int)t->name.len, t->name.ptr);
    size_t row_bytes = qtype_row_bytes(t->type, (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        float *dst = m + (size_t)r * (size_t)cols;
        qtype_dequantize_row(t->type, (const uint8_t *)bytes + (size_t)r * row_bytes, dst,
                             (size_t)cols);
        for (int64_t i = 0; i < cols; i++)
            if (!isfinite(dst[i])) {
                double v = (double)dst[i]; /* read before m is freed */
                free(m);
                return qerr_set(err, QERR_FORMAT, "%s: %.*s holds %g at [%lld][%lld]", gguf_path(f),
                                (int)t->name.len, t->name.ptr, v, (long long)r, (long long)i);
            }
    }
    *out = m;
    return 0;
}

static void base_name(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
    if (n >= cap) n = cap - 1;
    memcpy(out, b, n);
    out[n] = 0;
}

/* Fills the pairs from the file's tensors: shapes checked, a and b read, b scaled. */
static int read_pairs(const struct gguf_file *f, const struct model_config *c,
                      struct lora_adapter *ad, struct qerr *err)
{
    const char *path = gguf_path(f);
    size_t n_slots = (size_t)c->n_layers * N_FILE_TARGETS;
    const struct gguf_tensor **found = calloc(n_slots * 2, sizeof *found);
    if (!found) return qerr_set(err, QERR_NOMEM, "%s: out of memory", path);
    int rc = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f) && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        int layer = 0, which = 0, ft = 0;
        rc = parse_name(path, t->name, c, &layer, &ft, &which, err);
        if (rc == 1) {
            rc = 0;
            continue;
        }
        if (rc) break;
        size_t slot = ((size_t)layer * N_FILE_TARGETS + (size_t)ft) * 2 + (size_t)which;
        if (found[slot])
            rc = qerr_set(err, QERR_FORMAT, "%s: tensor '%.*s' appears twice", path,
                          (int)t->name.len, t->name.ptr);
        found[slot] = t;
    }
    for (size_t s = 0; s < n_slots && !rc; s++) {
        const struct gguf_tensor *ta = found[2 * s], *tb = found[2 * s + 1];
        if (!ta && !tb) continue;
        int layer = (int)(s / N_FILE_TARGETS), ft = (int)(s % N_FILE_TARGETS);
        if (!ta || !tb) {
            rc = qerr_set(err, QERR_FORMAT, "%s: blk.%d.%s.weight has lora_%s but no lora_%s", path,
                          layer, target_names[ft], ta ? "a" : "b", ta ? "b" : "a");
            break;
        }
        struct piece pieces[3];
        int64_t in = 0, out = 0;
        int n_pieces = file_pieces(c, ft, pieces, &in, &out);
        if (n_pieces == 0) {
            rc = qerr_set(err, QERR_INVALID,
                          "%s: LoRA of blk.%d.%s.weight, a matrix this %s model does not have "
                          "(an adapter for another model?)",
                          path, layer, target_names[ft], c->arch);
            break;
        }
        int64_t rank = (int64_t)ta->ne[1];
        if (ta->n_dims != 2 || tb->n_dims != 2 || (int64_t)ta->ne[0] != in ||
            (int64_t)tb->ne[1] != out || (int64_t)tb->ne[0] != rank || rank < 1 ||
            rank > LORA_MAX_RANK) {
            rc = qerr_set(err, QERR_INVALID,
                          "%s: blk.%d.%s.weight: lora_a is %llux%llu and lora_b %llux%llu (ne0 x "
                          "ne1), want %lldxR and Rx%lld with 1 <= R <= %d (an adapter for another "
                          "model?)",
                          path, layer, target_names[ft], (unsigned long long)ta->ne[0],
                          (unsigned long long)ta->ne[1], (unsigned long long)tb->ne[0],
                          (unsigned long long)tb->ne[1], (long long)in, (long long)out,
                          LORA_MAX_RANK);
            break;
        }
        float *a = NULL, *b = NULL;
        if ((rc = read_matrix(f, ta, rank, in, &a, err))) break;
        if ((rc = read_matrix(f, tb, out, rank, &b, err))) {
            free(a);
            break;
        }
        float scale = ad->alpha > 0 ? ad->user_scale * ad->alpha / (float)rank : ad->user_scale;
        for (int k = 0; k < n_pieces && !rc; k++) {
            const struct piece *pc = &pieces[k];
            /* each piece owns its copies: lora_free frees every pair's */
            float *pa = malloc((size_t)rank * (size_t)in * sizeof *pa);
            float *pb = malloc((size_t)pc->rows * (size_t)rank * sizeof *pb);
            if (!pa || !pb) {
                free(pa);
                free(pb);
                rc = qerr_set(err, QERR_NOMEM, "%s: out of memory", path);
                break;
            }
            memcpy(pa, a, (size_t)rank * (size_t)in * sizeof *pa);
            for (int64_t r = 0; r < pc->rows; r++) {
                const float *src =
                    b +
                    (size_t)(pc->off + model_neox_at(r, pc->neox_hd, c->rot_dim)) * (size_t)rank;
                for (int64_t i = 0; i < rank; i++)
                    pb[(size_t)r * (size_t)rank + (size_t)i] = src[i] * scale;
            }
            struct lora_pair *p = lora_pair_at(ad, layer, pc->t);
            p->rank = (int)rank;
            p->a = (struct bweight){.type = QTYPE_F32, .rows = rank, .cols = in, .host = pa};
            p->b = (struct bweight){.type = QTYPE_F32, .rows = pc->rows, .cols = rank, .host = pb};
            ad->n_pairs++;
        }
        free(a);
        free(b);
    }
    free(found);
    if (!rc && ad->n_pairs == 0)
        rc = qerr_set(err, QERR_FORMAT, "%s: a LoRA adapter with no lora_a/lora_b pairs", path);
    return rc;
}

int lora_load(const char *path, const char *name, float user_scale, const struct model_config *cfg,
              struct lora_adapter **out, struct qerr *err)
{
    *out = NULL;
    struct gguf_file *f = NULL;
    int rc = gguf_open(path, &f, err);
    if (rc) return rc;
    rc = lora_load_file(f, name, user_scale, cfg, out, err);
    gguf_close(f);
    return rc;
}

int lora_load_file(const struct gguf_file *f, const char *name, float user_scale,
                   const struct model_config *cfg, struct lora_adapter **out, struct qerr *err)
{
    *out = NULL;
    const char *path = gguf_path(f);
    if (!isfinite(user_scale))
        return qerr_set(err, QERR_INVALID, "%s: LoRA scale %g", path, (double)user_scale);
    int rc = 0;
    struct lora_adapter *ad = calloc(1, sizeof *ad);
    if (ad) ad->pairs = calloc((size_t)cfg->n_layers * LORA_N_TARGETS, sizeof *ad->pairs);
    if (!ad || !ad->pairs) {
        rc = qerr_set(err, QERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    ad->n_layers = cfg->n_layers;
    ad->user_scale = user_scale;
    if (name && (!*name || strlen(name) >= sizeof ad->name)) {
        rc = qerr_set(err, QERR_INVALID, "%s: LoRA name '%.80s' must be 1..%d bytes", path, name,
                      LORA_NAME_MAX - 1);
        goto done;
    }
    if (name)
        snprintf(ad->name, sizeof ad->name, "%s", name);
    else
        base_name(path, ad->name, sizeof ad->name);
    if ((rc = check_meta(f, cfg, &ad->alpha, err))) goto done;
    rc = read_pairs(f, cfg, ad, err);
done:
    if (rc) {
        lora_free(ad);
        return rc;
    }
    *out = ad;
    return 0;
}

void lora_free(struct lora_adapter *ad)
{
    if (!ad) return;
    for (size_t i = 0; ad->pairs && i < (size_t)ad->n_layers * LORA_N_TARGETS; i++) {
        free((void *)ad->pairs[i].a.host);
        free((void *)ad->pairs[i].b.host);
    }
    free(ad->pairs);
    free(ad);
}
