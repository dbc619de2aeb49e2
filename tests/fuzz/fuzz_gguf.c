/* fuzz_gguf: a GGUF file of arbitrary bytes through everything that reads one at start-up: the
 * header, metadata and tensor infos (gguf_open), every typed accessor on every key, the tensor
 * data, the tokenizer, the chat template, the model configuration, then a model load on the
 * CPU backend and one forward step, and a load as a LoRA adapter for a tiny model. gguf_open
 * promises that after it succeeds every accessor is bounds-safe; ASan and UBSan check it, and the
 * walk below checks what the API says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/chat.h"
#include "../../engine/lora.h"
#include "../../engine/model.h"
#include "../../kernels/cpu/backend_cpu.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loaded once (see fuzz_util.h): a one-thread CPU backend holds no state between model loads. */
static struct backend *cpu(void)
{
    static struct backend *be;
    if (!be) {
        struct backend_cpu_opts o = {.n_threads = 1};
        struct qerr err = {0};
        if (backend_cpu_create(&o, &be, &err)) {
            fprintf(stderr, "fuzz_gguf: %s\n", err.msg);
            exit(1);
        }
    }
    return be;
}

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n)
{
    if (n) sink ^= ((const uint8_t *)p)[0] ^ ((const uint8_t *)p)[n - 1];
}

static void walk_kv(const struct gguf_file *f, const struct gguf_kv *kv)
{
    touch(kv->key.ptr, kv->key.len);
    if (kv->type == GGUF_STRING) touch(kv->str.ptr, kv->str.len);
    if (kv->type == GGUF_ARRAY) {
        if (kv->arr_type == GGUF_STRING)
            for (uint64_t i = 0; i < kv->arr_len; i++) touch(kv->strs[i].ptr, kv->strs[i].len);
        else
            touch(kv->value, kv->arr_len * gguf_vtype_size(kv->arr_type));
    } else if (kv->type != GGUF_STRING) {
        touch(kv->value, gguf_vtype_size(kv->type));
    }
    if (kv->key.len >= 256 || memchr(kv->key.ptr, 0, kv->key.len)) return;
    char key[256];
    memcpy(key, kv->key.ptr, kv->key.len);
    key[kv->key.len] = 0;
    /* a key that was read is found again (the first of that name, if repeated) */
    const struct gguf_kv *found = gguf_kv_find(f, key);
    if (!found || !gguf_str_eq(found->key, key)) __builtin_trap();
    struct qerr err = {0};
    uint32_t u;
    int32_t i;
    float x;
    bool b;
    struct gguf_str s;
    const struct gguf_kv *arr;
    gguf_get_u32(f, key, &u, &err);
    gguf_get_i32(f, key, &i, &err);
    gguf_get_f32(f, key, &x, &err);
    gguf_get_bool(f, key, &b, &err);
    if (gguf_get_str(f, key, &s, &err) == 0) touch(s.ptr, s.len);
    gguf_get_arr(f, key, GGUF_F32, &arr, &err);
    gguf_get_arr(f, key, GGUF_I32, &arr, &err);
}

static void try_tokenizer(const struct gguf_file *f)
{
    struct tokenizer *t = NULL;
    struct qerr err = {0};
    if (tokenizer_load(f, &t, &err)) return;
    static const char text[] = "Hello world <|im_start|> \xc3\xa9\xe2\x96\x81 12345";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(t, text, sizeof text - 1, true, true, &ids, &n, &err) == 0) {
        char *d = tokenizer_decode(t, ids, n);
        if (d && !fuzz_utf8_valid(d, strlen(d))) __builtin_trap();
        free(d);
        free(ids);
    }
    struct gguf_str tmpl;
    struct chat_template ct;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl, &err) == 0 &&
        chat_template_parse(tmpl.ptr, (size_t)tmpl.len, &ct, &err) == 0) {
        struct chat_msg m[] = {{.role = "system", .content = "S"},
                               {.role = "user", .content = "hi"}};
        if (chat_encode(&ct, t, m, 2, true, true, false, &ids, &n, &err) == 0) free(ids);
        chat_template_free(&ct);
    }
    tokenizer_free(t);
}

/* A load and one token through the model, as the engine's first step would run it. */
static void try_model(const struct gguf_file *f)
{
    struct model_config cfg;
    struct qerr err = {0};
    if (model_config_read(f, &cfg, &err)) return;
    struct model_opts o = {
        .max_batch_tokens = 2, .max_logits = 1, .kv_blocks = 1, .kv_block_size = 16};
    struct model *m = NULL;
    if (model_load(f, cpu(), &o, &m, &err)) return;
    const struct model_config *c = model_get_config(m);
    int32_t tok = 0, pos = 0, seq = 0, slot = 0, table = 0, idx = 0;
    struct model_batch b = {.n_tokens = 1,
                            .tokens = &tok,
                            .pos = &pos,
                            .seq = &seq,
                            .slot = &slot,
                            .n_seqs = 1,
                            .max_blocks = 1,
                            .block_table = &table,
                            .n_logits = 1,
                            .logit_idx = &idx};
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    if (logits) model_forward(m, &b, logits, &err);
    free(logits);
    model_free(m);
}

/* The file as a LoRA adapter for make_gguf_seeds' tiny model (tiny-lora.gguf is one), with
 * llama's rope and with the NeoX rope (whose q/k rows of B the loader moves). */
static void try_lora(const struct gguf_file *f)
{
    struct model_config cfg = {.arch = "llama",
                               .n_layers = 1,
                               .dim = 32,
                               .ffn_dim = 64,
                               .n_heads = 2,
                               .n_kv_heads = 1,
                               .head_dim = 16,
                               .rot_dim = 16};
    for (int neox = 0; neox < 2; neox++) {
        cfg.rope_neox = neox;
        struct lora_adapter *ad = NULL;
        struct qerr err = {0};
        if (lora_load_file(f, "fuzz", 1.0f, &cfg, &ad, &err)) continue;
        if (ad->n_pairs < 1) __builtin_trap();
        lora_free(ad);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file *f;
    struct qerr err = {0};
    if (fuzz_gguf_from_bytes(data, size, &f, &err)) return 0;
    if (gguf_file_size(f) != size) __builtin_trap();
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) walk_kv(f, gguf_kv_at(f, i));
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        touch(t->name.ptr, t->name.len);
        touch(t->data, t->nbytes);
    }
    try_tokenizer(f);
    try_model(f);
    try_lora(f);
    gguf_close(f);
    return 0;
}
