#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

#define LORA_MAX_RANK 4096

static const char *const target_names[LORA_N_TARGETS] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};

const char *lora_target_name(enum lora_target t)
{
    return t >= 0 && t < LORA_N_TARGETS ? target_names[t] : "?";
}

/* The target's weight: in (cols) and out (rows) as cfg shapes it, and the head size whose rows
 * the model moves (rope_neox), else 0. */
static void target_shape(const struct model_config *c, enum lora_target t, int64_t *in,
                         int64_t *out, int *neox_hd)
{
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    static const int in_kind[LORA_N_TARGETS] = {0, 0, 0, 1, 0, 0, 2};
    static const int out_kind[LORA_N_TARGETS] = {1, 3, 3, 0, 2, 2, 0};
    int64_t by_kind[4] = {c->dim, q, c->ffn_dim, kv};
    *in = by_kind[in_kind[t]];
    *out = by_kind[out_kind[t]];
    *neox_hd = c->rope_neox && (t == LORA_Q || t == LORA_K) ? c->head_dim : 0;
}

/* "blk.N.<target>.weight.lora_a" -> layer N, the target, which matrix (0 a, 1 b); QERR_FORMAT
 * for a name that is neither, 1 for a norm vector (skipped). */
static int parse_name(const char *path, struct gguf_str s, const struct model_config *c, int *layer,
                      enum lora_target *t, int *which, struct qerr *err)
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
    for (int k = 0; k < LORA_N_TARGETS; k++)
        if (!strcmp(name + used, target_names[k])) {
            *layer = l;
            *t = (enum lora_target)k;
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

/* The tensor as float32 [rows][cols] in new memory; rows of q and k in the model's order. */
static int read_matrix(const struct gguf_file *f, const struct gguf_tensor *t, int64_t rows,
                       int64_t cols, int neox_hd, int rot_dim, float **out, struct qerr *err)
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
        int64_t src = model_neox_at(r, neox_hd, rot_dim);
        float *dst = m + (size_t)r * (size_t)cols;
        qtype_dequantize_row(t->type, (const uint8_t *)bytes + (size_t)src * row_bytes, dst,
                             (size_t)cols);
        for (int64_t i = 0; i < cols; i++)
            if (!isfinite(dst[i])) {
                double v = (double)dst[i]; /* read before m is freed */
                free(m);
                return qerr_set(err, QERR_FORMAT, "%s: %.*s holds %g at [%lld][%lld]", gguf_path(f),
                                (int)t->name.len, t->name.ptr, v, (long long)r, (long long)i);
            }
    }
    gguf_tensor_release(f, t);
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
    size_t n_slots = (size_t)c->n_layers * LORA_N_TARGETS;
    const struct gguf_tensor **found = calloc(n_slots * 2, sizeof *found);
    if (!found) return qerr_set(err, QERR_NOMEM, "%s: out of memory", path);
    int rc = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f) && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        int layer = 0, which = 0;
        enum lora_target tg = LORA_Q;
        rc = parse_name(path, t->name, c, &layer, &tg, &which, err);
        if (rc == 1) {
            rc = 0;
            continue;
        }
        if (rc) break;
        size_t slot = ((size_t)layer * LORA_N_TARGETS + (size_t)tg) * 2 + (size_t)which;
        if (found[slot])
            rc = qerr_set(err, QERR_FORMAT, "%s: tensor '%.*s' appears twice", path,
                          (int)t->name.len, t->name.ptr);
        found[slot] = t;
    }
    for (size_t s = 0; s < n_slots && !rc; s++) {
        const struct gguf_tensor *ta = found[2 * s], *tb = found[2 * s + 1];
        if (!ta && !tb) continue;
        int layer = (int)(s / LORA_N_TARGETS);
        enum lora_target tg = (enum lora_target)(s % LORA_N_TARGETS);
        if (!ta || !tb) {
            rc = qerr_set(err, QERR_FORMAT, "%s: blk.%d.%s.weight has lora_%s but no lora_%s", path,
                          layer, target_names[tg], ta ? "a" : "b", ta ? "b" : "a");
            break;
        }
        int64_t in, out;
        int neox_hd;
        target_shape(c, tg, &in, &out, &neox_hd);
        int64_t rank = (int64_t)ta->ne[1];
        if (ta->n_dims != 2 || tb->n_dims != 2 || (int64_t)ta->ne[0] != in ||
            (int64_t)tb->ne[1] != out || (int64_t)tb->ne[0] != rank || rank < 1 ||
            rank > LORA_MAX_RANK) {
            rc = qerr_set(err, QERR_INVALID,
                          "%s: blk.%d.%s.weight: lora_a is %llux%llu and lora_b %llux%llu (ne0 x "
                          "ne1), want %lldxR and Rx%lld with 1 <= R <= %d (an adapter for another "
                          "model?)",
                          path, layer, target_names[tg], (unsigned long long)ta->ne[0],
                          (unsigned long long)ta->ne[1], (unsigned long long)tb->ne[0],
                          (unsigned long long)tb->ne[1], (long long)in, (long long)out,
                          LORA_MAX_RANK);
            break;
        }
        struct lora_pair *p = lora_pair_at(ad, layer, tg);
        float *a = NULL, *b = NULL;
        if ((rc = read_matrix(f, ta, rank, in, 0, c->rot_dim, &a, err))) break;
        if ((rc = read_matrix(f, tb, out, rank, neox_hd, c->rot_dim, &b, err))) {
            free(a);
            break;
        }
        float scale = ad->alpha > 0 ? ad->user_scale * ad->alpha / (float)rank : ad->user_scale;
        for (size_t i = 0; i < (size_t)out * (size_t)rank; i++) b[i] *= scale;
        p->rank = (int)rank;
        p->a = (struct bweight){.type = QTYPE_F32, .rows = rank, .cols = in, .host = a};
        p->b = (struct bweight){.type = QTYPE_F32, .rows = out, .cols = rank, .host = b};
        if (rank > ad->max_rank) ad->max_rank = (int)rank;
        if (out > ad->max_out) ad->max_out = (int)out;
        ad->n_pairs++;
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
