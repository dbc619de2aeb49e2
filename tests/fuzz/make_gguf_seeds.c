/* make_gguf_seeds: writes the GGUF seeds of the fuzz corpus (tests/fuzz/corpus/gguf/), tiny but
 * complete models made with the project's GGUF writer: tiny-spm.gguf (a Llama model with a
 * SentencePiece vocabulary, a Llama-2 chat template), tiny-bpe.gguf (a byte-level BPE vocabulary
 * with merges, SmolLM2's ChatML template), tiny-rope.gguf (tiny-bpe with rope scaling: linear, and
 * a rope_freqs.weight tensor), tiny-gemma.gguf (tiny-spm as a gemma3 model: a sliding window, q/k
 * norms, post-norms, a logit cap), tiny-moe.gguf (tiny-bpe as a qwen3moe model: q/k norms, the
 * NeoX rope, 4 experts of FFN / 2 channels with 2 used a token, an F32 router ffn_gate_inp and
 * the Q8_0 experts stacked in 3-D ffn_{gate,up,down}_exps), tiny-moe-shared.gguf (tiny-bpe as a
 * qwen2moe model: q/k/v biases, no q/k norms, tiny-moe's experts, and a shared expert of
 * SHARED_FFN channels, Q8_0 ffn_{gate,up,down}_shexp, gated by the F32 vector
 * ffn_gate_inp_shexp), and tiny-lora.gguf, a rank-2 LoRA adapter for the llama ones (every layer
 * matrix, float32, one norm vector to skip; fuzz_gguf loads every input as one too). Each is a few
 * tens of KB, so the fuzzer mutates a whole model quickly, and fuzz_tokenizer uses tiny-spm.gguf as
 * its SentencePiece tokenizer.
 *
 *   build-fuzz/tests/fuzz/make_gguf_seeds tests/fuzz/corpus/gguf
 *
 * The output is deterministic; the seeds are committed, so this only runs when they change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/gguf_write.h"

enum { DIM = 32, FFN = 64, HEADS = 2, KV_HEADS = 1, CTX = 64 };
/* tiny-moe: experts of EXPERT_FFN channels, ffn_down_exps' row length (whole Q8_0 blocks) */
enum { EXPERTS = 4, EXPERTS_USED = 2, EXPERT_FFN = FFN / 2 };
/* tiny-moe-shared: the shared expert's channels (ffn_down_shexp's row length, whole blocks) */
enum { SHARED_FFN = 32 };

struct tiny_tensor {
    char name[64];
    uint64_t ne[3];
    uint32_t n_dims;
    enum qtype type;
};

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Norms 1; a float32 matrix (tiny-moe's router), tiny-moe-shared's biases and shared-expert
 * gate small values of both signs, so tokens pick different experts; Q8_0 weights: a small
 * scale and random quants. */
static int fill(void *ctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)err;
    const struct tiny_tensor *t = (const struct tiny_tensor *)ctx + index;
    uint64_t s = 0x9e3779b97f4a7c15ull * (index + 1);
    bool norm = !strstr(t->name, ".bias") && !strstr(t->name, "_shexp");
    if (t->n_dims == 1 && norm) {
        float one = 1.0f;
        for (size_t i = 0; i < nbytes / 4; i++) memcpy((char *)dst + 4 * i, &one, 4);
        return 0;
    }
    if (t->type == QTYPE_F32) {
        for (size_t i = 0; i < nbytes / 4; i++) {
            float v = (float)((int)(next(&s) % 201) - 100) / 100.0f;
            memcpy((char *)dst + 4 * i, &v, 4);
        }
        return 0;
    }
    uint8_t *p = dst;
    for (size_t off = 0; off + 34 <= nbytes; off += 34) {
        uint16_t d = f32_to_fp16(0.02f / 64);
        memcpy(p + off, &d, 2);
        for (int i = 0; i < 32; i++) p[off + 2 + i] = (uint8_t)next(&s);
    }
    return 0;
}

/* A tensor of n_dims dimensions ne0.. of the given type. */
static int add_typed(struct gguf_writer *w, struct tiny_tensor *ts, int *n, const char *name,
                     uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2, enum qtype type,
                     struct qerr *err)
{
    struct tiny_tensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
    t->n_dims = n_dims;
    t->type = type;
    return gguf_writer_add_tensor(w, t->name, t->n_dims, t->ne, type, err);
}

/* A Q8_0 matrix [ne0, ne1], or with ne1 = 0 a float32 vector (a norm, all 1; a bias or the
 * shared-expert gate, small values: fill). */
static int add(struct gguf_writer *w, struct tiny_tensor *ts, int *n, const char *name,
               uint64_t ne0, uint64_t ne1, struct qerr *err)
{
    return add_typed(w, ts, n, name, ne1 ? 2 : 1, ne0, ne1, 1, ne1 ? QTYPE_Q8_0 : QTYPE_F32, err);
}

/* "ARCH.SUFFIX" */
static const char *akey(const char *arch, const char *suffix)
{
    static char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return key;
}

static int model_keys(struct gguf_writer *w, const char *arch, const char *name, struct qerr *err)
{
    int rc = gguf_writer_set_str(w, "general.architecture", arch, strlen(arch), err);
    if (!rc) rc = gguf_writer_set_str(w, "general.name", name, strlen(name), err);
    if (!rc) rc = gguf_writer_set_u32(w, "general.alignment", 32, err);
    if (!rc) rc = gguf_writer_set_u32(w, akey(arch, "block_count"), 1, err);
    if (!rc) rc = gguf_writer_set_u32(w, akey(arch, "context_length"), CTX, err);
    if (!rc) rc = gguf_writer_set_u32(w, akey(arch, "embedding_length"), DIM, err);
    if (!rc) rc = gguf_writer_set_u32(w, akey(arch, "feed_forward_length"), FFN, err);
    if (!rc) rc = gguf_writer_set_u32(w, akey(arch, "attention.head_count"), HEADS, err);
    if (!rc) rc = gguf_writer_set_u32(w, akey(arch, "attention.head_count_kv"), KV_HEADS, err);
    if (!rc)
        rc = gguf_writer_set_f32(w, akey(arch, "attention.layer_norm_rms_epsilon"), 1e-5f, err);
    if (!rc) rc = gguf_writer_set_f32(w, akey(arch, "rope.freq_base"), 10000.0f, err);
    if (!rc) rc = gguf_writer_set_u32(w, akey(arch, "rope.dimension_count"), DIM / HEADS, err);
    return rc;
}

/* <unk> <s> </s>, the 256 byte tokens, a few pieces (SentencePiece scores: higher merges first) */
static int spm_vocab(struct gguf_writer *w, int *vocab, struct qerr *err)
{
    static const char *const pieces[] = {
        "\xe2\x96\x81",
        "h",
        "e",
        "l",
        "o",
        "he",
        "ll",
        "llo",
        "hello",
        "\xe2\x96\x81hello",
        "\xe2\x96\x81w",
        "or",
        "\xe2\x96\x81wor",
        "ld",
        "\xe2\x96\x81world",
        "[INST]",
        "[/INST]",
    };
    enum { NP = sizeof pieces / sizeof pieces[0], N = 3 + 256 + NP };
    struct gguf_str tok[N];
    char bytes[256][8];
    float score[N];
    int32_t type[N];
    static const char *const special[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        tok[i] = (struct gguf_str){special[i], strlen(special[i])};
        score[i] = 0;
        type[i] = i == 0 ? 2 : 3;
    }
    for (int i = 0; i < 256; i++) {
        int len = snprintf(bytes[i], sizeof bytes[i], "<0x%02X>", i);
        tok[3 + i] = (struct gguf_str){bytes[i], (uint64_t)len};
        score[3 + i] = 0;
        type[3 + i] = 6;
    }
    for (int i = 0; i < NP; i++) {
        tok[259 + i] = (struct gguf_str){pieces[i], strlen(pieces[i])};
        score[259 + i] = -(float)(NP - i) / 4;
        type[259 + i] = 1;
    }
    static const char tmpl[] =
        "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
        "messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in messages "
        "%}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' "
        "[/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + "
        "eos_token }}{% endif %}{% endfor %}";
    *vocab = N;
    int rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", 5, err);
    if (!rc) rc = gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", tok, N, err);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_F32, score, N, err);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, type, N, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0, err);
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.chat_template", tmpl, strlen(tmpl), err);
    return rc;
}

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest for U+0100 on. */
static int byte_char(int b, char *out)
{
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* the 256 byte tokens, merged pieces, and ChatML's control tokens */
static int bpe_vocab(struct gguf_writer *w, const char *chat_template, int *vocab, struct qerr *err)
{
    static const char *const merged[] = {"he", "ll",          "llo", "hello",         "\xc4\xa0w",
                                         "or", "\xc4\xa0wor", "ld",  "\xc4\xa0world", "\xc4\xa0t"};
    static const char *const merges[] = {
        "h e", "l l",          "ll o", "he llo",         "\xc4\xa0 w",
        "o r", "\xc4\xa0w or", "l d",  "\xc4\xa0wor ld", "\xc4\xa0 t"};
    static const char *const control[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    enum {
        NM = sizeof merged / sizeof merged[0],
        NC = sizeof control / sizeof control[0],
        N = NC + 256 + NM,
    };
    struct gguf_str tok[N], mer[NM];
    char chars[256][4];
    int32_t type[N];
    for (int i = 0; i < NC; i++) {
        tok[i] = (struct gguf_str){control[i], strlen(control[i])};
        type[i] = 3;
    }
    for (int b = 0; b < 256; b++) {
        int len = byte_char(b, chars[b]);
        tok[NC + b] = (struct gguf_str){chars[b], (uint64_t)len};
        type[NC + b] = 1;
    }
    for (int i = 0; i < NM; i++) {
        tok[NC + 256 + i] = (struct gguf_str){merged[i], strlen(merged[i])};
        type[NC + 256 + i] = 1;
        mer[i] = (struct gguf_str){merges[i], strlen(merges[i])};
    }
    *vocab = N;
    int rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", 4, err);
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", "smollm", 6, err);
    if (!rc) rc = gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", tok, N, err);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, type, N, err);
    if (!rc) rc = gguf_writer_set_str_arr(w, "tokenizer.ggml.merges", mer, NM, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1, err);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2, err);
    if (!rc)
        rc = gguf_writer_set_str(w, "tokenizer.chat_template", chat_template, strlen(chat_template),
                                 err);
    return rc;
}

/* rope_scaled: linear rope scaling and Llama 3's per-pair divisors (rope_freqs.weight, all 1);
 * gemma: a gemma3 model (a sliding window of 4 keys, its rope base, a logit cap; q/k norms and
 * post-norms); moe: a qwen3moe model (q/k norms; the router and the stacked experts in place of
 * ffn_gate/up/down), with shared a qwen2moe one (q/k/v biases in place of the norms, and the
 * shared expert with its gate) */
static int write_model(const char *path, bool spm, const char *chat_template, bool rope_scaled,
                       bool gemma, bool moe, bool shared, struct qerr *err)
{
    struct gguf_writer *w = NULL;
    struct tiny_tensor ts[24];
    int n = 0, vocab = 0;
    const char *arch = gemma ? "gemma3" : shared ? "qwen2moe" : moe ? "qwen3moe" : "llama";
    int rc = gguf_writer_init(&w, err);
    if (!rc)
        rc = model_keys(w, arch,
                        gemma         ? "tiny gemma"
                        : shared      ? "tiny moe shared"
                        : moe         ? "tiny moe"
                        : spm         ? "tiny spm"
                        : rope_scaled ? "tiny rope"
                                      : "tiny bpe",
                        err);
    if (!rc && moe) rc = gguf_writer_set_u32(w, akey(arch, "expert_count"), EXPERTS, err);
    if (!rc && moe) rc = gguf_writer_set_u32(w, akey(arch, "expert_used_count"), EXPERTS_USED, err);
    if (!rc && moe)
        rc = gguf_writer_set_u32(w, akey(arch, "expert_feed_forward_length"), EXPERT_FFN, err);
    if (!rc && shared)
        rc = gguf_writer_set_u32(w, akey(arch, "expert_shared_feed_forward_length"), SHARED_FFN,
                                 err);
    if (!rc && gemma) rc = gguf_writer_set_u32(w, "gemma3.attention.sliding_window", 4, err);
    if (!rc && gemma) rc = gguf_writer_set_f32(w, "gemma3.rope.freq_base_swa", 1000.0f, err);
    if (!rc && gemma) rc = gguf_writer_set_f32(w, "gemma3.final_logit_softcapping", 30.0f, err);
    if (!rc && rope_scaled)
        rc = gguf_writer_set_str(w, "llama.rope.scaling.type", "linear", 6, err);
    if (!rc && rope_scaled) rc = gguf_writer_set_f32(w, "llama.rope.scaling.factor", 2.0f, err);
    if (!rc) rc = spm ? spm_vocab(w, &vocab, err) : bpe_vocab(w, chat_template, &vocab, err);
    const uint64_t kv = KV_HEADS * (DIM / HEADS);
    if (!rc) rc = add(w, ts, &n, "token_embd.weight", DIM, (uint64_t)vocab, err);
    if (!rc) rc = add(w, ts, &n, "output_norm.weight", DIM, 0, err);
    if (!rc) rc = add(w, ts, &n, "blk.0.attn_norm.weight", DIM, 0, err);
    if (!rc) rc = add(w, ts, &n, "blk.0.attn_q.weight", DIM, DIM, err);
    if (!rc) rc = add(w, ts, &n, "blk.0.attn_k.weight", DIM, kv, err);
    if (!rc) rc = add(w, ts, &n, "blk.0.attn_v.weight", DIM, kv, err);
    if (!rc) rc = add(w, ts, &n, "blk.0.attn_output.weight", DIM, DIM, err);
    if (!rc) rc = add(w, ts, &n, "blk.0.ffn_norm.weight", DIM, 0, err);
    if (!rc && !moe) rc = add(w, ts, &n, "blk.0.ffn_gate.weight", DIM, FFN, err);
    if (!rc && !moe) rc = add(w, ts, &n, "blk.0.ffn_up.weight", DIM, FFN, err);
    if (!rc && !moe) rc = add(w, ts, &n, "blk.0.ffn_down.weight", FFN, DIM, err);
    if (!rc && moe)
        rc = add_typed(w, ts, &n, "blk.0.ffn_gate_inp.weight", 2, DIM, EXPERTS, 1, QTYPE_F32, err);
    if (!rc && moe)
        rc = add_typed(w, ts, &n, "blk.0.ffn_gate_exps.weight", 3, DIM, EXPERT_FFN, EXPERTS,
                       QTYPE_Q8_0, err);
    if (!rc && moe)
        rc = add_typed(w, ts, &n, "blk.0.ffn_up_exps.weight", 3, DIM, EXPERT_FFN, EXPERTS,
                       QTYPE_Q8_0, err);
    if (!rc && moe)
        rc = add_typed(w, ts, &n, "blk.0.ffn_down_exps.weight", 3, EXPERT_FFN, DIM, EXPERTS,
                       QTYPE_Q8_0, err);
    if (!rc && rope_scaled) rc = add(w, ts, &n, "rope_freqs.weight", DIM / HEADS / 2, 0, err);
    const bool qk_norm = gemma || (moe && !shared);
    if (!rc && qk_norm) rc = add(w, ts, &n, "blk.0.attn_q_norm.weight", DIM / HEADS, 0, err);
    if (!rc && qk_norm) rc = add(w, ts, &n, "blk.0.attn_k_norm.weight", DIM / HEADS, 0, err);
    if (!rc && shared) rc = add(w, ts, &n, "blk.0.attn_q.bias", DIM, 0, err);
    if (!rc && shared) rc = add(w, ts, &n, "blk.0.attn_k.bias", kv, 0, err);
    if (!rc && shared) rc = add(w, ts, &n, "blk.0.attn_v.bias", kv, 0, err);
    if (!rc && shared) rc = add(w, ts, &n, "blk.0.ffn_gate_inp_shexp.weight", DIM, 0, err);
    if (!rc && shared) rc = add(w, ts, &n, "blk.0.ffn_gate_shexp.weight", DIM, SHARED_FFN, err);
    if (!rc && shared) rc = add(w, ts, &n, "blk.0.ffn_up_shexp.weight", DIM, SHARED_FFN, err);
    if (!rc && shared) rc = add(w, ts, &n, "blk.0.ffn_down_shexp.weight", SHARED_FFN, DIM, err);
    if (!rc && gemma) rc = add(w, ts, &n, "blk.0.post_attention_norm.weight", DIM, 0, err);
    if (!rc && gemma) rc = add(w, ts, &n, "blk.0.post_ffw_norm.weight", DIM, 0, err);
    if (!rc) rc = gguf_writer_write(w, path, fill, ts, NULL, err);
    gguf_writer_free(w);
    return rc;
}

/* LoRA matrices: small values of both signs */
static int fill_lora(void *ctx, uint64_t index, void *dst, size_t nbytes, struct qerr *err)
{
    (void)ctx;
    (void)err;
    uint64_t s = 0x9e3779b97f4a7c15ull * (index + 7);
    for (size_t i = 0; i < nbytes / 4; i++) {
        float v = (float)((int)(next(&s) % 201) - 100) / 1000.0f;
        memcpy((char *)dst + 4 * i, &v, 4);
    }
    return 0;
}

static int write_lora(const char *path, struct qerr *err)
{
    enum { RANK = 2 };
    static const char *const names[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                        "ffn_gate", "ffn_up", "ffn_down"};
    const uint64_t kv = KV_HEADS * (DIM / HEADS);
    const uint64_t in[] = {DIM, DIM, DIM, DIM, DIM, DIM, FFN};
    const uint64_t out[] = {DIM, kv, kv, DIM, FFN, FFN, DIM};
    struct gguf_writer *w = NULL;
    int rc = gguf_writer_init(&w, err);
    if (!rc) rc = gguf_writer_set_str(w, "general.architecture", "llama", 5, err);
    if (!rc) rc = gguf_writer_set_str(w, "general.type", "adapter", 7, err);
    if (!rc) rc = gguf_writer_set_str(w, "adapter.type", "lora", 4, err);
    if (!rc) rc = gguf_writer_set_f32(w, "adapter.lora.alpha", 4.0f, err);
    for (int t = 0; t < 7 && !rc; t++) {
        char name[64];
        uint64_t a[2] = {in[t], RANK}, b[2] = {RANK, out[t]};
        snprintf(name, sizeof name, "blk.0.%s.weight.lora_a", names[t]);
        rc = gguf_writer_add_tensor(w, name, 2, a, QTYPE_F32, err);
        snprintf(name, sizeof name, "blk.0.%s.weight.lora_b", names[t]);
        if (!rc) rc = gguf_writer_add_tensor(w, name, 2, b, QTYPE_F32, err);
    }
    uint64_t norm = DIM;
    if (!rc) rc = gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", 1, &norm, QTYPE_F32, err);
    if (!rc) rc = gguf_writer_write(w, path, fill_lora, NULL, NULL, err);
    gguf_writer_free(w);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_gguf_seeds DIR\n");
        return 2;
    }
    /* SmolLM2's template, from the real model, so the BPE seed carries a real ChatML one */
    const char *model = getenv("QUERN_MODEL");
    struct gguf_file *f = NULL;
    struct qerr err = {0};
    struct gguf_str tmpl;
    char *chat = NULL;
    if (gguf_open(model && *model ? model : QUERN_FUZZ_MODEL, &f, &err) ||
        gguf_get_str(f, "tokenizer.chat_template", &tmpl, &err) ||
        !(chat = strndup(tmpl.ptr, tmpl.len))) {
        fprintf(stderr, "make_gguf_seeds: %s\n", err.msg);
        return 1;
    }
    gguf_close(f);
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny-spm.gguf", argv[1]);
    int rc = write_model(path, true, NULL, false, false, false, false, &err);
    snprintf(path, sizeof path, "%s/tiny-bpe.gguf", argv[1]);
    if (!rc) rc = write_model(path, false, chat, false, false, false, false, &err);
    snprintf(path, sizeof path, "%s/tiny-rope.gguf", argv[1]);
    if (!rc) rc = write_model(path, false, chat, true, false, false, false, &err);
    snprintf(path, sizeof path, "%s/tiny-gemma.gguf", argv[1]);
    if (!rc) rc = write_model(path, true, NULL, false, true, false, false, &err);
    snprintf(path, sizeof path, "%s/tiny-moe.gguf", argv[1]);
    if (!rc) rc = write_model(path, false, chat, false, false, true, false, &err);
    snprintf(path, sizeof path, "%s/tiny-moe-shared.gguf", argv[1]);
    if (!rc) rc = write_model(path, false, chat, false, false, true, true, &err);
    snprintf(path, sizeof path, "%s/tiny-lora.gguf", argv[1]);
    if (!rc) rc = write_lora(path, &err);
    free(chat);
    if (rc) {
        fprintf(stderr, "make_gguf_seeds: %s\n", err.msg);
        return 1;
    }
    return 0;
}
