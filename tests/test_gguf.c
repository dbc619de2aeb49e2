/* GGUF reader: the real model file, and corrupt files built byte by byte: each must give one
 * clear error naming the field, never a crash or a read outside the file. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/gguf.h"
#include "../engine/model.h"
#include "testutil.h"

/* A growable byte buffer to write small GGUF files with. */
struct buf {
    unsigned char *p;
    size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(struct buf *b, uint32_t v)
{
    put(b, &v, 4);
}
static void put_u64(struct buf *b, uint64_t v)
{
    put(b, &v, 8);
}
static void put_str(struct buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_u32(struct buf *b, const char *k, uint32_t v)
{
    put_str(b, k);
    put_u32(b, GGUF_U32);
    put_u32(b, v);
}
static void kv_str(struct buf *b, const char *k, const char *v)
{
    put_str(b, k);
    put_u32(b, GGUF_STRING);
    put_str(b, v);
}

struct spec {
    const char *magic;
    uint32_t version;
    uint32_t tensor_type;
    uint64_t tensor_offset;
    uint32_t n_dims;
    uint64_t data_bytes; /* bytes of tensor data actually written */
    uint32_t alignment;  /* general.alignment, 0 for none (32); the data is 32-aligned anyway */
};

static const struct spec good = {"GGUF", 3, QTYPE_F32, 0, 2, 8 * 4 * 4, 0};

/* One tensor "w" of 8x4 F32 plus a few keys. */
static struct buf build(const struct spec *s)
{
    struct buf b = {0};
    put(&b, s->magic, 4);
    put_u32(&b, s->version);
    put_u64(&b, 1);                    /* tensors */
    put_u64(&b, s->alignment ? 4 : 3); /* kvs */
    kv_str(&b, "general.architecture", "llama");
    if (s->alignment) kv_u32(&b, "general.alignment", s->alignment);
    kv_u32(&b, "llama.block_count", 2);
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, 2);
    put_str(&b, "a");
    put_str(&b, "bc");
    put_str(&b, "w");
    put_u32(&b, s->n_dims);
    put_u64(&b, 8);
    if (s->n_dims > 1) put_u64(&b, 4);
    for (uint32_t d = 2; d < s->n_dims; d++) put_u64(&b, 1);
    put_u32(&b, s->tensor_type);
    put_u64(&b, s->tensor_offset);
    while (b.n % 32) put(&b, "", 1);
    float v = 1.5f;
    for (uint64_t i = 0; i < s->data_bytes / 4; i++) put(&b, &v, 4);
    return b;
}

/* Opens b as a file; returns the rc and leaves the message in err. */
static int open_buf(const struct buf *b, struct qerr *err)
{
    char *path = tu_write_temp(b->p, b->n);
    ck_assert_ptr_nonnull(path);
    struct gguf_file *f = NULL;
    int rc = gguf_open(path, &f, err);
    if (rc == 0) {
        ck_assert_ptr_nonnull(f);
        gguf_close(f);
    } else {
        ck_assert_ptr_null(f);
        ck_assert_msg(strstr(err->msg, path) != NULL, "error must name the file: %s", err->msg);
    }
    unlink(path);
    free(path);
    return rc;
}

START_TEST(small_file_ok)
{
    struct buf b = build(&good);
    char *path = tu_write_temp(b.p, b.n);
    struct gguf_file *f;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_open(path, &f, &err), 0);
    uint32_t v;
    ck_assert_int_eq(gguf_get_u32(f, "llama.block_count", &v, &err), 0);
    ck_assert_uint_eq(v, 2);
    struct gguf_str s;
    ck_assert_int_eq(gguf_get_str(f, "general.architecture", &s, &err), 0);
    ck_assert(gguf_str_eq(s, "llama"));
    ck_assert_int_eq(gguf_get_u32(f, "general.architecture", &v, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "general.architecture"));
    ck_assert_int_eq(gguf_get_u32(f, "nope", &v, &err), QERR_NOTFOUND);
    const struct gguf_kv *kv;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &kv, &err), 0);
    ck_assert_uint_eq(kv->arr_len, 2);
    ck_assert(gguf_str_eq(kv->strs[1], "bc"));
    const struct gguf_tensor *t = gguf_tensor_find(f, "w");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->ne[0], 8);
    ck_assert_uint_eq(t->ne[1], 4);
    ck_assert_float_eq(((const float *)t->data)[31], 1.5f);
    gguf_close(f);
    unlink(path);
    free(path);
    free(b.p);
}
END_TEST

/* Every proper prefix of a valid file is a truncated file: each must fail cleanly. */
START_TEST(every_truncation_fails)
{
    struct buf b = build(&good);
    for (size_t n = 0; n < b.n; n++) {
        struct buf t = {b.p, n, n};
        struct qerr err = {0};
        int rc = open_buf(&t, &err);
        ck_assert_msg(rc != 0, "prefix of %zu bytes opened", n);
    }
    free(b.p);
}
END_TEST

START_TEST(bad_magic)
{
    struct spec s = good;
    s.magic = "GGML";
    struct buf b = build(&s);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "magic"));
    free(b.p);
}
END_TEST

START_TEST(bad_version)
{
    struct spec s = good;
    s.version = 7;
    struct buf b = build(&s);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "version 7"));
    free(b.p);
}
END_TEST

START_TEST(offset_past_end)
{
    struct spec s = good;
    s.tensor_offset = 4096;
    struct buf b = build(&s);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'w'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "past the end"));
    free(b.p);
}
END_TEST

START_TEST(offset_unaligned)
{
    struct spec s = good;
    s.tensor_offset = 4;
    s.data_bytes += 64;
    struct buf b = build(&s);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "not aligned"));
    free(b.p);
}
END_TEST

/* The spec's alignment is a multiple of 8: a smaller power of two could put a block's fp16
 * scale (or an f32) at an odd address of the mapping (a fuzzed Q5_1 file did). */
START_TEST(alignment_below_8)
{
    struct spec s = good;
    for (uint32_t a = 1; a <= 8; a *= 2) {
        s.alignment = a;
        struct buf b = build(&s);
        struct qerr err = {0};
        int rc = open_buf(&b, &err);
        if (a < 8) {
            ck_assert_int_eq(rc, QERR_FORMAT);
            ck_assert_ptr_nonnull(strstr(err.msg, "general.alignment"));
        } else {
            ck_assert_msg(rc == 0, "alignment 8: %s", err.msg);
        }
        free(b.p);
    }
}
END_TEST

START_TEST(unsupported_tensor_type)
{
    struct spec s = good;
    s.tensor_type = 10; /* Q2_K: neither read nor converted */
    struct buf b = build(&s);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "type 10"));
    free(b.p);
}
END_TEST

/* A type converted on reading (Q4_K: 256-element blocks) whose rows (8 elements) hold no whole
 * block: refused before anything is converted. */
START_TEST(converted_type_short_rows)
{
    struct spec s = good;
    s.tensor_type = 12;
    struct buf b = build(&s);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "not a multiple of the Q4_K block (256)"));
    free(b.p);
}
END_TEST

START_TEST(too_many_dims)
{
    struct spec s = good;
    s.n_dims = 5;
    struct buf b = build(&s);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "n_dims"));
    free(b.p);
}
END_TEST

START_TEST(huge_counts_and_lengths)
{
    /* a string length, an array count and a tensor count far beyond the file */
    struct buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    put_u64(&b, (uint64_t)1 << 62); /* key length */
    put(&b, "xxxxxxxx", 8);
    struct qerr err = {0};
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "truncated"));
    free(b.p);

    b = (struct buf){0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    put_str(&b, "arr");
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_U32);
    put_u64(&b, (uint64_t)1 << 61);
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'arr'"));
    free(b.p);

    b = (struct buf){0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, UINT64_MAX); /* tensors */
    put_u64(&b, 0);
    put_u64(&b, 0);
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor count"));
    free(b.p);

    b = (struct buf){0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    put_str(&b, "k");
    put_u32(&b, 99); /* unknown value type */
    put_u64(&b, 0);
    ck_assert_int_eq(open_buf(&b, &err), QERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "unknown value type 99"));
    free(b.p);
}
END_TEST

START_TEST(missing_file)
{
    struct gguf_file *f;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_open("/nonexistent/model.gguf", &f, &err), QERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/model.gguf"));
}
END_TEST

START_TEST(missing_key_and_bad_arch)
{
    /* the small file is llama but lacks embedding_length etc. */
    struct buf b = build(&good);
    char *path = tu_write_temp(b.p, b.n);
    struct gguf_file *f;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_open(path, &f, &err), 0);
    struct model_config cfg;
    ck_assert_int_eq(model_config_read(f, &cfg, &err), QERR_NOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "llama.embedding_length"));
    gguf_close(f);
    unlink(path);
    free(path);
    free(b.p);

    b = (struct buf){0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    kv_str(&b, "general.architecture", "mamba");
    path = tu_write_temp(b.p, b.n);
    ck_assert_int_eq(gguf_open(path, &f, &err), 0);
    ck_assert_int_eq(model_config_read(f, &cfg, &err), QERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "'mamba'"));
    gguf_close(f);
    unlink(path);
    free(path);
    free(b.p);
}
END_TEST

/* The eight keys of a small llama config (embedding 8, two heads of 4, rope over all 4 dims), with
 * block_count as given. */
static void put_small_llama_keys(struct buf *b, uint32_t block_count)
{
    kv_str(b, "general.architecture", "llama");
    kv_u32(b, "llama.block_count", block_count);
    kv_u32(b, "llama.embedding_length", 8);
    kv_u32(b, "llama.feed_forward_length", 16);
    kv_u32(b, "llama.attention.head_count", 2);
    kv_u32(b, "llama.context_length", 64);
    put_str(b, "llama.attention.layer_norm_rms_epsilon");
    put_u32(b, GGUF_F32);
    float eps = 1e-5f;
    put(b, &eps, 4);
    kv_u32(b, "llama.rope.dimension_count", 4);
}

/* A config that passes every key's own check but counts more layers than the file has tensors
 * for (what the fuzzer found: a block_count of 2^24 made the loader ask for 3.4 GB): refused by
 * model_config_read, naming the count. */
START_TEST(block_count_beyond_the_tensors)
{
    struct buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 1); /* tensors */
    put_u64(&b, 8); /* kvs */
    put_small_llama_keys(&b, 1u << 24);
    put_str(&b, "token_embd.weight");
    put_u32(&b, 2);
    put_u64(&b, 8);
    put_u64(&b, 4);
    put_u32(&b, QTYPE_F32);
    put_u64(&b, 0);
    while (b.n % 32) put(&b, "", 1);
    float v = 0.5f;
    for (int i = 0; i < 32; i++) put(&b, &v, 4);
    char *path = tu_write_temp(b.p, b.n);
    struct gguf_file *f;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_open(path, &f, &err), 0);
    struct model_config cfg;
    ck_assert_int_eq(model_config_read(f, &cfg, &err), QERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "block_count 16777216") && strstr(err.msg, path), "%s", err.msg);
    gguf_close(f);
    unlink(path);
    free(path);
    free(b.p);
}
END_TEST

/* A one-layer llama config (rot_dim 4: two rope pairs) with ten 4-float tensors, so
 * model_config_read can succeed, and the rope scaling given: scaling type (NULL: none written),
 * factor under key (NULL: none), and rope_freqs.weight of n_freqs values (0: none). */
static struct gguf_file *rope_file(const char *type, const char *key, float factor,
                                   const float *freqs, int n_freqs, char **path)
{
    int n_tensors = 10 + (n_freqs > 0);
    struct buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)n_tensors);
    put_u64(&b, 8 + (type != NULL) + (key != NULL));
    put_small_llama_keys(&b, 1);
    if (type) kv_str(&b, "llama.rope.scaling.type", type);
    if (key) {
        put_str(&b, key);
        put_u32(&b, GGUF_F32);
        put(&b, &factor, 4);
    }
    for (int i = 0; i < n_tensors; i++) {
        char name[32];
        snprintf(name, sizeof name, i == 0 ? "token_embd.weight" : "t%d", i);
        bool rf = n_freqs > 0 && i == n_tensors - 1;
        put_str(&b, rf ? "rope_freqs.weight" : name);
        put_u32(&b, rf ? 1 : 2);
        put_u64(&b, rf ? (uint64_t)n_freqs : 4);
        if (!rf) put_u64(&b, 1);
        put_u32(&b, QTYPE_F32);
        put_u64(&b, (uint64_t)i * 32);
    }
    while (b.n % 32) put(&b, "", 1);
    for (int i = 0; i < n_tensors; i++) {
        float v[8] = {0.5f, 0.5f, 0.5f, 0.5f};
        if (n_freqs > 0 && i == n_tensors - 1) memcpy(v, freqs, (size_t)n_freqs * 4);
        put(&b, v, 32);
    }
    *path = tu_write_temp(b.p, b.n);
    free(b.p);
    struct gguf_file *f;
    struct qerr err = {0};
    ck_assert_msg(gguf_open(*path, &f, &err) == 0, "%s", err.msg);
    return f;
}

static int rope_config(const char *type, const char *key, float factor, const float *freqs,
                       int n_freqs, struct model_config *cfg, struct qerr *err)
{
    char *path;
    struct gguf_file *f = rope_file(type, key, factor, freqs, n_freqs, &path);
    int rc = model_config_read(f, cfg, err);
    gguf_close(f);
    unlink(path);
    free(path);
    return rc;
}

/* Rope scaling as llama.cpp reads it: a factor scales linearly when the type is linear or
 * unset (under either key), not under "none"; rope_freqs.weight gives per-pair divisors; YaRN
 * becomes divisors and an attention factor; other types are refused by name, and divisors of
 * the wrong count or value are format errors. */
START_TEST(rope_scaling_config)
{
    struct model_config cfg;
    struct qerr err = {0};
    const float two[2] = {1.0f, 8.0f};
    ck_assert_int_eq(rope_config(NULL, NULL, 0, NULL, 0, &cfg, &err), 0);
    ck_assert_float_eq(cfg.rope_scale, 1.0f);
    ck_assert_int_eq(cfg.n_rope_factors, 0);
    ck_assert_int_eq(rope_config("linear", "llama.rope.scaling.factor", 4, NULL, 0, &cfg, &err), 0);
    ck_assert_float_eq(cfg.rope_scale, 0.25f);
    ck_assert_int_eq(rope_config(NULL, "llama.rope.scale_linear", 2, NULL, 0, &cfg, &err), 0);
    ck_assert_float_eq(cfg.rope_scale, 0.5f);
    ck_assert_int_eq(rope_config("none", "llama.rope.scaling.factor", 4, NULL, 0, &cfg, &err), 0);
    ck_assert_float_eq(cfg.rope_scale, 1.0f);
    ck_assert_int_eq(rope_config(NULL, NULL, 0, two, 2, &cfg, &err), 0);
    ck_assert_int_eq(cfg.n_rope_factors, 2);
    ck_assert_float_eq(cfg.rope_factors[1], 8.0f);
    struct rope_spec rs = model_rope_spec(&cfg);
    ck_assert_ptr_eq(rs.factors, cfg.rope_factors);
    ck_assert_float_eq(cfg.rope_base, 10000.0f);
    ck_assert(rope_inv_freq(&rs, 1) == pow(10000.0, -0.5) / 8.0);

    /* YaRN, factor 4 over the original 64 positions (rot_dim 4, base 10000): pair 0 turns
     * more than beta_fast = 32 times there (kept), pair 1 fewer than beta_slow = 1 (scaled) */
    ck_assert_int_eq(rope_config("yarn", "llama.rope.scaling.factor", 4, NULL, 0, &cfg, &err), 0);
    ck_assert_int_eq(cfg.n_rope_factors, 2);
    ck_assert_float_eq_tol(cfg.rope_factors[0], 1.0f, 1e-6f);
    ck_assert_float_eq_tol(cfg.rope_factors[1], 4.0f, 1e-6f);
    ck_assert_float_eq(cfg.rope_scale, 1.0f);
    ck_assert_float_eq_tol(cfg.rope_mscale, 1.0f + 0.1f * logf(4.0f), 1e-6f);
    ck_assert_int_eq(rope_config("longrope", "llama.rope.scaling.factor", 4, NULL, 0, &cfg, &err),
                     QERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "rope scaling 'longrope'"), "%s", err.msg);
    ck_assert_int_eq(rope_config(NULL, "llama.rope.scaling.factor", -2, NULL, 0, &cfg, &err),
                     QERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "llama.rope.scaling.factor"), "%s", err.msg);
    const float three[3] = {1, 2, 3}, zero[2] = {1, 0};
    ck_assert_int_eq(rope_config(NULL, NULL, 0, three, 3, &cfg, &err), QERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "rope_freqs.weight") && strstr(err.msg, "F32 [2]"), "%s",
                  err.msg);
    ck_assert_int_eq(rope_config(NULL, NULL, 0, zero, 2, &cfg, &err), QERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "rope_freqs.weight[1] = 0"), "%s", err.msg);
}
END_TEST

/* A converted tensor's copy can be released after use and is made again, with the same bytes,
 * when asked for; a tensor of the file's own type keeps its bytes through a release. */
START_TEST(converted_tensor_release_and_remake)
{
    struct buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 2); /* tensors */
    put_u64(&b, 1); /* kvs */
    kv_str(&b, "general.architecture", "llama");
    const char *names[2] = {"q", "n"};
    for (int i = 0; i < 2; i++) {
        put_str(&b, names[i]);
        put_u32(&b, 2);
        put_u64(&b, 64);
        put_u64(&b, 2);
        put_u32(&b, i == 0 ? 6u /* Q5_0 */ : QTYPE_F32);
        put_u64(&b, i == 0 ? 0 : 96);
    }
    while (b.n % 32) put(&b, "", 1);
    for (int blk = 0; blk < 4; blk++) { /* fp16 scale, 4 bytes of high bits, 16 of nibbles */
        uint16_t d = (uint16_t)(0x3c00 + blk);
        put(&b, &d, 2);
        for (int k = 0; k < 20; k++) {
            uint8_t v = (uint8_t)(37 * blk + 11 * k);
            put(&b, &v, 1);
        }
    }
    while (b.n % 32) put(&b, "", 1);
    for (int k = 0; k < 128; k++) {
        float v = (float)k;
        put(&b, &v, 4);
    }
    char *path = tu_write_temp(b.p, b.n);
    struct gguf_file *f;
    struct qerr err = {0};
    ck_assert_msg(gguf_open(path, &f, &err) == 0, "%s", err.msg);
    const struct gguf_tensor *q = gguf_tensor_find(f, "q"), *n = gguf_tensor_find(f, "n");
    ck_assert_int_eq(q->type, QTYPE_Q8_0);
    ck_assert_uint_eq(q->file_type, 6);
    ck_assert_uint_eq(q->nbytes, 4 * 34);
    uint8_t first[4 * 34];
    memcpy(first, q->data, sizeof first);
    for (int round = 0; round < 2; round++) {
        gguf_tensor_release(f, q);
        ck_assert_ptr_null(q->data);
        const void *again;
        ck_assert_msg(gguf_tensor_bytes(f, q, &again, &err) == 0, "%s", err.msg);
        ck_assert_ptr_eq(again, q->data);
        ck_assert_mem_eq(again, first, sizeof first);
    }
    const void *nb = n->data, *got;
    gguf_tensor_release(f, n);
    ck_assert_ptr_eq(n->data, nb);
    ck_assert_int_eq(gguf_tensor_bytes(f, n, &got, &err), 0);
    ck_assert_ptr_eq(got, nb);
    ck_assert_float_eq(((const float *)got)[127], 127.0f);
    gguf_close(f);
    unlink(path);
    free(path);
    free(b.p);
}
END_TEST

START_TEST(real_model)
{
    struct gguf_file *f;
    struct qerr err = {0};
    ck_assert_int_eq(gguf_open(tu_model_path(), &f, &err), 0);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_tensor_count(f), 272);
    const struct gguf_tensor *t = gguf_tensor_find(f, "token_embd.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->type, QTYPE_Q8_0);
    ck_assert_uint_eq(t->ne[0], 576);
    ck_assert_uint_eq(t->ne[1], 49152);
    t = gguf_tensor_find(f, "blk.0.ffn_down.weight");
    ck_assert_int_eq(t->type, QTYPE_Q4_1);
    ck_assert_uint_eq(t->ne[0], 1536);
    struct model_config cfg;
    ck_assert_int_eq(model_config_read(f, &cfg, &err), 0);
    ck_assert_int_eq(cfg.n_layers, 30);
    ck_assert_int_eq(cfg.dim, 576);
    ck_assert_int_eq(cfg.n_kv_heads, 3);
    ck_assert_int_eq(cfg.head_dim, 64);
    ck_assert_int_eq(cfg.vocab, 49152);
    ck_assert(cfg.tied_output);
    ck_assert_float_eq(cfg.rope_base, 100000.0f);
    const struct gguf_kv *kv;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_STRING, &kv, &err), 0);
    ck_assert_uint_eq(kv->arr_len, 48900);
    gguf_close(f);
}
END_TEST

/* The real file cut at several points, and with one tensor offset pointed past the end. */
START_TEST(real_model_truncated)
{
    size_t len;
    char *data = tu_read_file(tu_model_path(), &len);
    ck_assert_ptr_nonnull(data);
    size_t cuts[] = {3, 100, 5000, 1 << 20, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        struct buf b = {(unsigned char *)data, cuts[i], cuts[i]};
        struct qerr err = {0};
        ck_assert_int_ne(open_buf(&b, &err), 0);
        ck_assert_msg(strstr(err.msg, "truncated") || strstr(err.msg, "too small") ||
                          strstr(err.msg, "past the end"),
                      "cut at %zu: %s", cuts[i], err.msg);
    }
    free(data);
}
END_TEST

int main(void)
{
    tu_model_path(); /* exits 77 (skip) before forking when the model is missing */
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("reader");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, small_file_ok);
    tcase_add_test(tc, every_truncation_fails);
    tcase_add_test(tc, bad_magic);
    tcase_add_test(tc, bad_version);
    tcase_add_test(tc, offset_past_end);
    tcase_add_test(tc, offset_unaligned);
    tcase_add_test(tc, alignment_below_8);
    tcase_add_test(tc, unsupported_tensor_type);
    tcase_add_test(tc, converted_type_short_rows);
    tcase_add_test(tc, too_many_dims);
    tcase_add_test(tc, huge_counts_and_lengths);
    tcase_add_test(tc, missing_file);
    tcase_add_test(tc, missing_key_and_bad_arch);
    tcase_add_test(tc, block_count_beyond_the_tensors);
    tcase_add_test(tc, rope_scaling_config);
    tcase_add_test(tc, converted_tensor_release_and_remake);
    tcase_add_test(tc, real_model);
    tcase_add_test(tc, real_model_truncated);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
