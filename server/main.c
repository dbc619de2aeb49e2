/* quern: an LLM inference server. main only dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: quern <command> [options]\n"
            "commands:\n"
            "  generate   generate text from a prompt (quern generate --help)\n"
            "  info       describe a GGUF model file (quern info --help)\n"
            "  bench      measure throughput and latency (quern bench --help)\n"
            "  serve      run the OpenAI-compatible HTTP server (quern serve --help)\n"
            "  quantize   rewrite a GGUF model in Q8_0/Q4_0/Q4_1 (quern quantize --help)\n"
            "  eval       perplexity and KL divergence over a text (quern eval --help)\n"
            "  grammar    compile a JSON Schema or grammar, match texts (quern grammar --help)\n"
            "\n"
            "exit codes: 0 ok, 1 runtime error, 2 bad usage\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return EXIT_OK;
    }
    if (!strcmp(cmd, "generate")) return cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cli_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cli_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cli_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "grammar")) return cli_grammar(argc - 1, argv + 1);
    fprintf(stderr, "quern: unknown command '%s'\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}
