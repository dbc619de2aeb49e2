/* quern info: what a GGUF file holds, as quern reads it. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "../engine/chat.h"
#include "../engine/model.h"
#include "../engine/tokenizer.h"
#include "cli.h"

static void info_usage(FILE *out)
{
    fprintf(out, "usage: quern info [--model PATH]\n"
                 "  --model PATH  GGUF model (default: $QUERN_MODEL or " QUERN_DEFAULT_MODEL ")\n"
                 "Prints architecture, dimensions, tensor types, vocabulary, special tokens and\n"
                 "the chat template.\n");
}

static void print_token(const struct tokenizer *tok, const char *label, int32_t id)
{
    const char *text = id >= 0 ? tokenizer_token_text(tok, id) : NULL;
    printf("  %-14s %d %s\n", label, id, text ? text : "(none)");
}

int cli_info(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *model = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'm')
            model = optarg;
        else if (c == 'h') {
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
    printf("feed-forward  %d\n", cfg.ffn_dim);
    printf("heads         %d (kv %d, head dim %d, rope dims %d)\n", cfg.n_heads, cfg.n_kv_heads,
           cfg.head_dim, cfg.rot_dim);
    printf("context       %d\n", cfg.ctx_len);
    printf("rope base     %g\n", cfg.rope_base);
    printf("rms epsilon   %g\n", cfg.eps);
    printf("output        %s\n", cfg.tied_output ? "tied to token_embd" : "output.weight");

    uint64_t count[64] = {0}, bytes[64] = {0}, params = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        unsigned ty = (unsigned)t->type < 64 ? (unsigned)t->type : 63;
        count[ty]++;
        bytes[ty] += t->nbytes;
        params += t->n_elems;
    }
    printf("tensors       %llu (%.1f M parameters)\n", (unsigned long long)gguf_tensor_count(f),
           (double)params / 1e6);
    for (unsigned ty = 0; ty < 64; ty++)
        if (count[ty])
            printf("  %-6s %4llu tensors %8.2f MiB\n", qtype_name(ty),
                   (unsigned long long)count[ty], (double)bytes[ty] / (1024.0 * 1024.0));
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
            printf("chat template %s%s%s\n", chat_kind_name(ct.kind),
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
