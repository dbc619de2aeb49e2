/* quern quantize: rewrite a GGUF model with its weights in another type (engine/gguf_quantize). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../engine/gguf_quantize.h"
#include "../quant/quantize.h"
#include "cli.h"

static void quantize_usage(FILE *out)
{
    fprintf(out,
            "usage: quern quantize --in MODEL.gguf --out OUT.gguf --type TYPE [--keep-output]\n"
            "                      [--rounding search|ref]\n"
            "  --in PATH       the GGUF model to read (F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors)\n"
            "  --out PATH      the GGUF file to write (replaced atomically; nothing is left\n"
            "                  behind on failure)\n"
            "  --type TYPE     q8_0, q4_0 or q4_1 (also f32 or f16: a dequantized copy)\n"
            "  --keep-output   keep token_embd.weight and output.weight in their source type\n"
            "  --rounding R    search (default): each Q8_0 block's scale chosen for the least\n"
            "                  squared error; ref: ggml's reference rounding, the bytes\n"
            "                  llama-quantize writes (Q4_0 and Q4_1 always use ref)\n"
            "1-D tensors (norms) are written as F32. Rows must be a multiple of 32 elements.\n");
}

struct quantize_args {
    const char *in, *out;
    int type;
    bool keep_output;
    enum qround round;
};

static int parse_args(int argc, char **argv, struct quantize_args *a)
{
    enum { O_KEEP = 256, O_ROUND };
    static const struct option opts[] = {{"in", required_argument, 0, 'i'},
                                         {"out", required_argument, 0, 'o'},
                                         {"type", required_argument, 0, 't'},
                                         {"keep-output", no_argument, 0, O_KEEP},
                                         {"rounding", required_argument, 0, O_ROUND},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (struct quantize_args){.type = -1, .round = QROUND_SEARCH};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "i:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            a->in = optarg;
            break;
        case 'o':
            a->out = optarg;
            break;
        case 't':
            a->type = qtype_from_name(optarg);
            if (a->type < 0 || !qtype_can_quantize((enum qtype)a->type)) {
                fprintf(stderr,
                        "quern quantize: unknown --type '%s' (want q8_0, q4_0, q4_1, f16 or "
                        "f32)\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case O_KEEP:
            a->keep_output = true;
            break;
        case O_ROUND:
            if (strcmp(optarg, "search") == 0) {
                a->round = QROUND_SEARCH;
            } else if (strcmp(optarg, "ref") == 0) {
                a->round = QROUND_REF;
            } else {
                fprintf(stderr, "quern quantize: unknown --rounding '%s' (want search or ref)\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'h':
            quantize_usage(stdout);
            return -1;
        default:
            quantize_usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "quern quantize: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (!a->in || !a->out || a->type < 0) {
        fprintf(stderr, "quern quantize: --in, --out and --type are required (see quern quantize "
                        "--help)\n");
        return EXIT_USAGE;
    }
    return 0;
}

int cli_quantize(int argc, char **argv)
{
    struct quantize_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? EXIT_OK : rc;
    struct qerr err = {0};
    struct gguf_file *f = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = gguf_open(a.in, &f, &err);
    struct gguf_quantize_stats st;
    struct gguf_quantize_opts o = {
        .type = (enum qtype)a.type, .keep_output = a.keep_output, .round = a.round};
    if (!rc) rc = gguf_quantize(f, a.out, &o, &st, &err);
    gguf_close(f);
    if (rc) {
        fprintf(stderr, "quern quantize: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    fprintf(stderr,
            "quern quantize: wrote %s (%s): %llu tensors, %llu converted, %llu copied; "
            "%.2f MiB -> %.2f MiB of tensor data in %.1f s\n",
            a.out, qtype_name((uint32_t)a.type), (unsigned long long)st.n_tensors,
            (unsigned long long)st.n_converted, (unsigned long long)st.n_copied,
            (double)st.bytes_in / 1048576.0, (double)st.bytes_out / 1048576.0, s);
    return EXIT_OK;
}
