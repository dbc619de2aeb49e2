/* synth: random-weight models of real shapes (synth.h). */
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_write.h"

static const struct synth_shape shapes[] = {
    {"llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, 500000.0f, false},
    {"llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096, 10000.0f, false},
    {"smollm2-135m", 30, 576, 1536, 9, 3, 49152, 8192, 100000.0f, true},
    {NULL, 0, 0, 0, 0, 0, 0, 0, 0.0f, false},
};

const struct synth_shape *synth_shape_find(const char *name)
{
    for (const struct synth_shape *s = shapes; name && s->name; s++)
        if (!strcmp(s->name, name)) return s;
    return NULL;
}

/* One tensor of the file: its name, shape and type; the fill callback makes its bytes. */
struct synth_tensor {
    char name[64];
    uint64_t ne[2];
    uint32_t n_dims;
    enum qtype type;
};

struct synth_fill {
    const struct synth_tensor *t;
    uint64_t seed;
};

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A uniform float in [-1, 1). */
static float unit(uint64_t *s)
{
    return (float)(next(s) >> 40) * 0x1p-23f - 1.0f;
}

/* Random bytes with a block scale that gives values of about N(0, 0.02): a 4-bit quant spans
 * 16 steps, an 8-bit one 256, so d is 0.04 / 16 and 0.04 / 128 (m centres Q4_1 on zero). */
static int fill(void *vctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)err;
    const struct synth_fill *c = vctx;
    const struct synth_tensor *t = &c->t[index];
    uint64_t s = c->seed ^ (0x9e3779b97f4a7c15ull * (index + 1));
    uint8_t *p = dst;
    if (t->n_dims == 1) { /* norm weights: 1 */
        float *f = dst;
        for (size_t i = 0; i < nbytes / sizeof *f; i++) f[i] = 1.0f;
        return 0;
    }
    if (t->type == QTYPE_F32 || t->type == QTYPE_F16) {
        size_t n = nbytes / (t->type == QTYPE_F32 ? 4 : 2);
        for (size_t i = 0; i < n; i++) {
            float v = 0.035f * unit(&s); /* uniform with the sd of N(0, 0.02) */
            if (t->type == QTYPE_F32)
                memcpy(p + 4 * i, &v, 4);
            else {
                uint16_t h = f32_to_fp16(v);
                memcpy(p + 2 * i, &h, 2);
            }
        }
        return 0;
    }
    for (size_t i = 0; i + 8 <= nbytes; i += 8) {
        uint64_t r = next(&s);
        memcpy(p + i, &r, 8);
    }
    for (size_t i = nbytes / 8 * 8; i < nbytes; i++) p[i] = (uint8_t)next(&s);
    size_t bb = qtype_block_bytes(t->type);
    for (size_t off = 0; off + bb <= nbytes; off += bb) {
        float jitter = 1.0f + 0.25f * unit(&s);
        uint16_t d, m;
        switch (t->type) {
        case QTYPE_Q8_0:
            d = f32_to_fp16(0.04f / 128 * jitter);
            memcpy(p + off, &d, 2);
            break;
        case QTYPE_Q4_0:
            d = f32_to_fp16(0.04f / 16 * jitter);
            memcpy(p + off, &d, 2);
            break;
        default: /* Q4_1: d * q + m with m = -7.5 d */
            d = f32_to_fp16(0.04f / 16 * jitter);
            m = f32_to_fp16(-7.5f * 0.04f / 16 * jitter);
            memcpy(p + off, &d, 2);
            memcpy(p + off + 2, &m, 2);
            break;
        }
    }
    return 0;
}

static int add_tensor(struct gguf_writer *w, struct synth_tensor *ts, int *n, const char *name,
                      uint64_t ne0, uint64_t ne1, enum qtype type, struct qerr *err)
{
    struct synth_tensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->n_dims = ne1 ? 2 : 1;
    t->type = ne1 ? type : QTYPE_F32;
    if (!ne1) t->ne[1] = 1;
    return gguf_writer_add_tensor(w, t->name, t->n_dims, t->ne, t->type, err);
}

/* Metadata: the llama keys the loader reads, and a SentencePiece vocabulary (<unk>, <s>, </s>,
 * the 256 byte tokens, then placeholders) of the shape's size. */
static int add_metadata(struct gguf_writer *w, const struct synth_shape *sh, enum qtype type,
                        struct qerr *err)
{
    char name[96];
    snprintf(name, sizeof name, "synthetic %s %s (random weights)", sh->name, qtype_name(type));
    int hd = sh->dim / sh->n_heads;
    int rc = gguf_writer_set_str(w, "general.architecture", "llama", 5, err);
    if (!rc) rc = gguf_writer_set_str(w, "general.name", name, strlen(name), err);
    if (!rc) rc = gguf_writer_set_u32(w, "llama.block_count", (uint32_t)sh->n_layers, err);
    if (!rc) rc = gguf_writer_set_u32(w, "llama.context_length", (uint32_t)sh->ctx_len, err);
    if (!rc) rc = gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)sh->dim, err);
    if (!rc) rc = gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)sh->ffn_dim, err);
    if (!rc) rc = gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)sh->n_heads, err);
    if (!rc)
        rc = gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)sh->n_kv_heads, err);
    if (!rc) rc = gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f, err);
    if (!rc) rc = gguf_writer_set_f32(w, "llama.rope.freq_base", sh->rope_base, err);
    if (!rc) rc = gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)hd, err);
    if (rc) return rc;

    size_t n = (size_t)sh->vocab;
    struct gguf_str *toks = calloc(n, sizeof *toks);
    char *text = malloc(n * 12);
    float *scores = malloc(n * sizeof *scores);
    int32_t *types = malloc(n * sizeof *types);
    if (!toks || !text || !scores || !types) {
        rc = qerr_set(err, QERR_NOMEM, "synthetic vocabulary: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char *s = text + i * 12;
        int len;
        if (i < 3) {
            static const char *const special[] = {"<unk>", "<s>", "</s>"};
            len = snprintf(s, 12, "%s", special[i]);
            types[i] = i == 0 ? 2 : 3;
        } else if (i < 259) {
            len = snprintf(s, 12, "<0x%02X>", (unsigned)(i - 3));
            types[i] = 6;
        } else {
            len = snprintf(s, 12, "\xe2\x96\x81t%zu", i); /* "▁t123": a word of its own */
            types[i] = 1;
        }
        toks[i] = (struct gguf_str){s, (uint64_t)len};
        scores[i] = -(float)i;
    }
    rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", 5, err);
    if (!rc) rc = gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", toks, n, err);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_F32, scores, n, err);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, n, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0, err);
out:
    free(toks);
    free(text);
    free(scores);
    free(types);
    return rc;
}

int synth_model_write(const char *name, enum qtype type, uint64_t seed, const char *path,
                      struct qerr *err)
{
    const struct synth_shape *sh = synth_shape_find(name);
    if (!sh)
        return qerr_set(err, QERR_INVALID,
                        "synthetic model '%s': want llama3-8b, llama2-7b or smollm2-135m",
                        name ? name : "");
    if (type != QTYPE_F32 && type != QTYPE_F16 && type != QTYPE_Q8_0 && type != QTYPE_Q4_0 &&
        type != QTYPE_Q4_1)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "synthetic model: type %s (want f32, f16, q8_0, "
                        "q4_0 or q4_1)",
                        qtype_name(type));
    int max_tensors = 3 + 9 * sh->n_layers;
    struct synth_tensor *ts = calloc((size_t)max_tensors, sizeof *ts);
    struct gguf_writer *w = NULL;
    int rc = ts ? gguf_writer_init(&w, err)
                : qerr_set(err, QERR_NOMEM, "synthetic model: out of memory");
    if (!rc) rc = add_metadata(w, sh, type, err);
    int n = 0;
    uint64_t dim = (uint64_t)sh->dim, ffn = (uint64_t)sh->ffn_dim;
    uint64_t kv = (uint64_t)(sh->n_kv_heads * (sh->dim / sh->n_heads));
    if (!rc) rc = add_tensor(w, ts, &n, "token_embd.weight", dim, (uint64_t)sh->vocab, type, err);
    if (!rc) rc = add_tensor(w, ts, &n, "output_norm.weight", dim, 0, type, err);
    if (!rc && !sh->tied_output)
        rc = add_tensor(w, ts, &n, "output.weight", dim, (uint64_t)sh->vocab, type, err);
    for (int l = 0; l < sh->n_layers && !rc; l++) {
        const struct {
            const char *suffix;
            uint64_t ne0, ne1;
        } lt[] = {{"attn_norm", dim, 0},  {"attn_q", dim, dim},      {"attn_k", dim, kv},
                  {"attn_v", dim, kv},    {"attn_output", dim, dim}, {"ffn_norm", dim, 0},
                  {"ffn_gate", dim, ffn}, {"ffn_up", dim, ffn},      {"ffn_down", ffn, dim}};
        for (size_t k = 0; k < sizeof lt / sizeof lt[0] && !rc; k++) {
            char tn[64];
            snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, lt[k].suffix);
            rc = add_tensor(w, ts, &n, tn, lt[k].ne0, lt[k].ne1, type, err);
        }
    }
    struct synth_fill fc = {.t = ts, .seed = seed | 1};
    if (!rc) rc = gguf_writer_write(w, path, fill, &fc, NULL, err);
    gguf_writer_free(w);
    free(ts);
    return rc;
}

int synth_model_open(const char *name, enum qtype type, uint64_t seed, const char *dir,
                     struct gguf_file **out, struct qerr *err)
{
    *out = NULL;
    const struct synth_shape *sh = synth_shape_find(name);
    if (!sh) return synth_model_write(name, type, seed, NULL, err); /* says why */
    if (!dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    char tmpl[512], path[600];
    snprintf(tmpl, sizeof tmpl, "%s/quern-synth-XXXXXX", dir);
    if (!mkdtemp(tmpl))
        return qerr_set(err, QERR_IO, "synthetic model: cannot make a directory in %s: %s", dir,
                        strerror(errno));
    snprintf(path, sizeof path, "%s/%s-%s.gguf", tmpl, sh->name, qtype_name(type));
    int rc = synth_model_write(name, type, seed, path, err);
    if (!rc) rc = gguf_open(path, out, err);
    /* the mapping outlives the name: remove it now, so nothing is left whatever happens */
    unlink(path);
    rmdir(tmpl);
    return rc;
}
