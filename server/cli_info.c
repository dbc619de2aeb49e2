/* quern info: what a GGUF file holds, as quern reads it. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../engine/chat.h"
#include "../engine/model.h"
#include "../engine/model_shard.h"
#include "../engine/tokenizer.h"
#include "../quant/qconv.h"
#include "cli.h"

static void info_usage(FILE *out)
{
    fprintf(out, "usage: quern info [--model PATH] [--tp N]\n"
                 "  --model PATH  GGUF model (default: $QUERN_MODEL or " QUERN_DEFAULT_MODEL ")\n"
                 "  --tp N        also print what each of N tensor-parallel ranks holds\n"
                 "Prints architecture, dimensions, tensor types, vocabulary, special tokens and\n"
                 "the chat template.\n");
}

static void print_token(const struct tokenizer *tok, const char *label, int32_t id)
{
    const char *text = id >= 0 ? tokenizer_token_text(tok, id) : NULL;
    printf("  %-14s %d %s\n", label, id, text ? text : "(none)");
}

/* --tp N: each rank's heads, FFN channels, weight bytes (its shards plus the replicated
 * embedding, output and norms) and KV bytes per token, fp32, fp16 and q8 (Q8_0 blocks). */
static int print_tp(const struct gguf_file *f, const struct model_config *cfg, int n,
                    struct qerr *err)
{
    printf("tensor parallel --tp %d\n", n);
    for (int r = 0; r < n; r++) {
        struct model_shard s;
        uint64_t w;
        size_t kv;
        int rc = model_shard_plan(cfg, n, r, &s, err);
        if (!rc) rc = model_shard_bytes(f, cfg, &s, 4, &w, &kv, err);
        if (rc) return rc;
        printf("  rank %-2d q heads %d-%d, kv heads %d-%d, ffn %d-%d: weights %.2f MiB, KV %.1f "
               "KiB/token fp32 (%.1f fp16, %.1f q8)\n",
               r, s.q0, s.q0 + s.nq - 1, s.kv0, s.kv0 + s.nkv - 1, s.f0, s.f0 + s.nf - 1,
               (double)w / 1048576.0, (double)kv / 1024.0, (double)kv / 2048.0,
               (double)kv / 4 * 34 / 32 / 1024.0);
    }
    return 0;
}

/* A LoRA adapter's file (general.type "adapter"): what --lora would load. */
static void print_adapter(const char *path, const struct gguf_file *f)
{
    struct gguf_str arch = {"", 0}, kind = {"", 0};
    gguf_get_str(f, "general.architecture", &arch, NULL);
    gguf_get_str(f, "adapter.type", &kind, NULL);
    float alpha = 0;
    gguf_get_f32(f, "adapter.lora.alpha", &alpha, NULL);
    uint64_t pairs = 0, rank_lo = UINT64_MAX, rank_hi = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->name.len < 7 || memcmp(t->name.ptr + t->name.len - 7, ".lora_a", 7)) continue;
        pairs++;
        if (t->ne[1] < rank_lo) rank_lo = t->ne[1];
        if (t->ne[1] > rank_hi) rank_hi = t->ne[1];
    }
    printf("file          %s (GGUF v%u, %llu bytes)\n", path, gguf_version(f),
           (unsigned long long)gguf_file_size(f));
    printf("adapter       %.*s for architecture %.*s (load it with serve/generate --lora)\n",
           (int)kind.len, kind.ptr, (int)arch.len, arch.ptr);
    printf("alpha         %g\n", (double)alpha);
    if (pairs)
        printf("matrices      %llu (rank %llu..%llu)\n", (unsigned long long)pairs,
               (unsigned long long)rank_lo, (unsigned long long)rank_hi);
    else
        printf("matrices      0\n");
}

int cli_info(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tp", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL;
    int c, tp = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'm')
            model = optarg;
        else if (c == 't') {
            if (!cli_tp_arg("info", optarg, &tp)) return EXIT_USAGE;
        } else if (c == 'h') {
            info_usage(stdout);
            return EXIT_OK;
        } else {
            info_usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "quern info: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    const char *path = cli_model_path(model);
    struct qerr err = {0};
    struct gguf_file *f = NULL;
    struct tokenizer *tok = NULL;
    struct model_config cfg;
    int rc = gguf_open(path, &f, &err);
    struct gguf_str type = {"", 0};
    if (!rc && !gguf_get_str(f, "general.type", &type, NULL) && gguf_str_eq(type, "adapter")) {
        print_adapter(path, f);
        gguf_close(f);
        return EXIT_OK;
    }
    if (!rc) rc = model_config_read(f, &cfg, &err);
    if (!rc) rc = tokenizer_load(f, &tok, &err);
    if (rc) {
        fprintf(stderr, "quern info: %s\n", err.msg);
        tokenizer_free(tok);
        gguf_close(f);
        return EXIT_RUNTIME;
    }
    struct gguf_str name = {"", 0};
    gguf_get_str(f, "general.name", &name, NULL);
    printf("file          %s (GGUF v%u, %llu bytes)\n", path, gguf_version(f),
           (unsigned long long)gguf_file_size(f));
    printf("name          %.*s\n", (int)name.len, name.ptr);
    printf("architecture  %s\n", cfg.arch);
    printf("layers        %d\n", cfg.n_layers);
    printf("embedding     %d\n", cfg.dim);
    if (cfg.n_experts)
        printf("feed-forward  %d experts of %d, %d used a token (softmax routing%s)\n",
               cfg.n_experts, cfg.expert_ffn_dim, cfg.n_experts_used,
               cfg.expert_weights_norm ? ", weights renormalized" : "");
    else
        printf("feed-forward  %d\n", cfg.ffn_dim);
    if (cfg.expert_shared_ffn_dim)
        printf("shared expert %d channels, every token, sigmoid-gated\n",
               cfg.expert_shared_ffn_dim);
    char no_rope[48] = "";
    if (cfg.no_rope_step)
        snprintf(no_rope, sizeof no_rope, ", none in every %dth layer", cfg.no_rope_step);
    printf("heads         %d (kv %d, head dim %d, rope dims %d%s%s%s%s%s)\n", cfg.n_heads,
           cfg.n_kv_heads, cfg.head_dim, cfg.rot_dim, cfg.rope_neox ? " paired NeoX-style" : "",
           no_rope, cfg.qkv_bias ? ", q/k/v biases" : "", cfg.qk_norm ? ", q/k norms" : "",
           cfg.fused_qkv ? ", q/k/v fused" : "");
    if (cfg.fused_gate_up) printf("              gate and up fused in ffn_up\n");
    if (cfg.post_norms)
        printf("              embeddings x %g, post-attention and post-FFN norms, %s FFN\n",
               cfg.embed_scale, cfg.gelu ? "GELU" : "SiLU");
    if (cfg.swa_window > 0 && cfg.rope_base_swa > 0)
        printf("sliding window %d keys in %d of every %d layers (rope base %g there)\n",
               cfg.swa_window, cfg.swa_pattern - 1, cfg.swa_pattern, cfg.rope_base_swa);
    else if (cfg.swa_window > 0)
        printf("sliding window %d keys in %d of every %d layers\n", cfg.swa_window,
               cfg.swa_pattern - 1, cfg.swa_pattern);
    if (cfg.logit_scale > 0)
        printf("scales        embeddings x %g, residual x %g, q.k x %g, logits / %g (Granite)\n",
               cfg.embed_scale > 0 ? cfg.embed_scale : 1.0,
               cfg.residual_scale > 0 ? cfg.residual_scale : 1.0, cfg.attn_scale, cfg.logit_scale);
    if (cfg.final_softcap > 0) printf("logit cap     %g\n", cfg.final_softcap);
    if (cfg.attn_softcap > 0) printf("score cap     %g (attention)\n", cfg.attn_softcap);
    printf("context       %d\n", cfg.ctx_len);
    /* --kv-type's element per token and at the full context: f16 (the default), f32, q8 (Q8_0
     * blocks, 34 bytes per 32 elements) */
    double kv_elems = (double)model_kv_bytes_per_token(&cfg, 1);
    printf(
        "KV cache      %.1f KiB/token f16, %.1f f32, %.1f q8 (%.0f MiB f16 at the full context)\n",
        kv_elems * 2 / 1024, kv_elems * 4 / 1024, kv_elems * 34 / 32 / 1024,
        kv_elems * 2 * cfg.ctx_len / 1048576);
    printf("rope base     %g", cfg.rope_base);
    if (cfg.rope_scale != 1.0f) printf(", linear scaling x%g", 1.0 / cfg.rope_scale);
    if (cfg.n_rope_factors) {
        float lo = cfg.rope_factors[0], hi = lo;
        for (int i = 1; i < cfg.n_rope_factors; i++) {
            lo = fminf(lo, cfg.rope_factors[i]);
            hi = fmaxf(hi, cfg.rope_factors[i]);
        }
        printf(", rope_freqs divisors %g..%g", lo, hi);
    }
    printf("\n");
    printf("rms epsilon   %g\n", cfg.eps);
    printf("output        %s\n", cfg.tied_output ? "tied to token_embd" : "output.weight");

    /* by the file's type; the bytes are those in memory, after any conversion at open */
    uint64_t count[64] = {0}, bytes[64] = {0}, params = 0;
    enum qtype read_as[64];
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        unsigned ty = t->file_type < 64 ? t->file_type : 63;
        count[ty]++;
        bytes[ty] += t->nbytes;
        read_as[ty] = t->type;
        params += t->n_elems;
    }
    printf("tensors       %llu (%.1f M parameters)\n", (unsigned long long)gguf_tensor_count(f),
           (double)params / 1e6);
    for (unsigned ty = 0; ty < 64; ty++) {
        if (!count[ty]) continue;
        printf("  %-6s %4llu tensors %8.2f MiB", qconv_type(ty) ? qconv_name(ty) : qtype_name(ty),
               (unsigned long long)count[ty], (double)bytes[ty] / (1024.0 * 1024.0));
        if (qconv_type(ty)) printf(" (read as %s)", qtype_name(read_as[ty]));
        printf("\n");
    }
    if (tp > 0 && (rc = print_tp(f, &cfg, tp, &err))) {
        fprintf(stderr, "quern info: %s\n", err.msg);
        tokenizer_free(tok);
        gguf_close(f);
        return rc == QERR_INVALID ? EXIT_USAGE : EXIT_RUNTIME;
    }
    printf("tokenizer     %s (pre '%s'), %d tokens\n", tokenizer_model_name(tok),
           tokenizer_pre_name(tok), tokenizer_vocab_size(tok));
    print_token(tok, "bos", tokenizer_bos(tok));
    print_token(tok, "eos", tokenizer_eos(tok));
    printf("  add bos        %s\n", tokenizer_adds_bos(tok) ? "yes" : "no");
    struct gguf_str tmpl;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl, NULL) == 0) {
        struct chat_template ct;
        struct qerr terr = {0};
        if (chat_template_parse(tmpl.ptr, (size_t)tmpl.len, &ct, &terr) == 0) {
            printf("chat template %s%s%s%s\n", chat_template_name(&ct),
                   ct.think ? ", answers open with a <think> block" : "",
                   ct.default_system ? ", default system: " : "",
                   ct.default_system ? ct.default_system : "");
            chat_template_free(&ct);
        } else {
            printf("chat template unrecognized (%s)\n", terr.msg);
        }
    } else {
        printf("chat template none\n");
    }
    tokenizer_free(tok);
    gguf_close(f);
    return EXIT_OK;
}
