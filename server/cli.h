/* cli: the quern subcommands. Each takes argc/argv after the subcommand name and returns the
 * process exit code: 0 ok, 1 runtime error, 2 bad usage. */
#ifndef QUERN_CLI_H
#define QUERN_CLI_H

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

#define QUERN_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

int cli_generate(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_grammar(int argc, char **argv);

/* Parses a whole decimal integer / float into *out; false when text is not one or is out of
 * [lo, hi]. */
#include <stdbool.h>
bool cli_parse_int(const char *text, long lo, long hi, long *out);
bool cli_parse_float(const char *text, double lo, double hi, double *out);
#include "../kernels/backend_select.h"
/* Checks a --tp argument (1..COMM_MAX_RANKS): true and *out set, or false after a one-line
 * error. */
bool cli_tp_arg(const char *prog, const char *text, int *out);
#define CLI_TP_HELP                                                                                \
    "  --tp N            tensor parallelism: split the model over N ranks (CPU: --threads\n"       \
    "                    divided among them; CUDA: N devices over NCCL; default 1)\n"
#define CLI_DEVICE_HELP                                                                            \
    "  --device D        auto (default: a usable GPU, else the CPU), cpu, cuda or cuda:N\n"
#define CLI_PRECISION_HELP                                                                         \
    "  --precision P     matmul activations: auto (default: q8 on the CPU, f32 on CUDA), q8\n"     \
    "                    (int8 per 32-block, as llama.cpp; mean KL 0.003 on the default model)\n"  \
    "                    or f32 (exact: matches transformers' fp32 logits)\n"
/* --batch-invariant: the same text for every subcommand (the CPU always is). */
#define CLI_BATCH_INVARIANT_HELP                                                                   \
    "  --batch-invariant   GPU: batch-invariant kernels for every batch size (a token's\n"         \
    "                    result never depends on its batch; slower prefill). The CPU always is\n"

/* --kv-type, --gemm, --gemm-min-tokens: the backend knobs a user may set
 * (kernels/backend_select.h), and --rope-freq-base, --rope-scale: the model's (model_opts), the
 * same on every subcommand that makes a backend. The other knobs are the environment's test and
 * debug switches (docs/ARCHITECTURE.md, "Knobs"). */
struct cli_knobs {
    const char *kv_type, *gemm;
    int gemm_min_tokens;
    float rope_freq_base, rope_scale; /* 0: the file's */
};
enum { CLI_O_KV_TYPE = 0x4000, CLI_O_GEMM, CLI_O_GEMM_MIN, CLI_O_ROPE_BASE, CLI_O_ROPE_SCALE };
#define CLI_KNOB_OPTIONS                                                                           \
    {"kv-type", required_argument, 0, CLI_O_KV_TYPE}, {"gemm", required_argument, 0, CLI_O_GEMM},  \
        {"gemm-min-tokens", required_argument, 0, CLI_O_GEMM_MIN},                                 \
        {"rope-freq-base", required_argument, 0, CLI_O_ROPE_BASE},                                 \
    {                                                                                              \
        "rope-scale", required_argument, 0, CLI_O_ROPE_SCALE                                       \
    }
#define CLI_KNOBS_HELP                                                                             \
    "  --kv-type f16|f32|q8 the KV cache's element (default: the backend's: CPU f16, or f32\n"     \
    "                    with --precision f32; CUDA f16); q8 (CPU only): Q8_0 blocks,\n"           \
    "                    0.53x f16's bytes, as llama.cpp's -ctk/-ctv q8_0\n"                       \
    "  --gemm mma|cublas   GPU: the GEMM for large batches (default mma)\n"                        \
    "  --gemm-min-tokens N GPU: batches of N or more tokens take the GEMM (default 128)\n"         \
    "  --rope-freq-base F  the rope base frequency instead of the file's rope.freq_base\n"         \
    "  --rope-scale F      linear rope scaling by F instead of the file's (as llama.cpp's;\n"      \
    "                    lets serve's --ctx reach F times the trained context)\n"
/* Puts the model's knobs into model options. */
struct model_opts;
void cli_knobs_model(const struct cli_knobs *k, struct model_opts *mo);

/* What chooses and shapes the backend on every subcommand that makes one (generate, serve,
 * eval, bench): --precision, --device, --tp, --batch-invariant and the knobs above. */
struct cli_backend_args {
    const char *device;              /* --device: NULL is auto */
    int tp;                          /* --tp ranks, 0: one */
    bool batch_invariant;            /* --batch-invariant */
    enum matmul_precision precision; /* --precision; MATMUL_AUTO unless given */
    struct cli_knobs knobs;
};
enum { CLI_O_PRECISION = 0x4020, CLI_O_DEVICE, CLI_O_TP, CLI_O_BATCH_INVARIANT };
#define CLI_BACKEND_OPTIONS                                                                        \
    {"precision", required_argument, 0, CLI_O_PRECISION},                                          \
        {"device", required_argument, 0, CLI_O_DEVICE}, {"tp", required_argument, 0, CLI_O_TP},    \
        {"batch-invariant", no_argument, 0, CLI_O_BATCH_INVARIANT}, CLI_KNOB_OPTIONS
/* Takes getopt's option `code` with its argument when it is one of CLI_BACKEND_OPTIONS: 1, or
 * -1 after a one-line error naming prog (a usage error); 0 when it is not one of them. */
int cli_backend_arg(const char *prog, int code, const char *text, struct cli_backend_args *b);
/* The backends b asks for (backend_group_create, kernels/backend_select.h: --tp 1 is one backend
 * and no communicator), with threads CPU threads (0: all); the one-line reason for the choice
 * goes to stderr as "quern PROG: backend: ...". */
int cli_backends_open(const char *prog, const struct cli_backend_args *b, int threads,
                      struct backend_group *g, struct qerr *err);

/* --spec off|ngram|draft, --spec-k N and --draft-model PATH: speculative decoding
 * (engine/spec.h), the same on serve, generate and bench. Off unless asked:
 * docs/speculation.md has where it pays. */
#include "../engine/spec.h"
#include "../engine/spec_policy.h"
struct cli_spec {
    enum spec_mode mode;
    bool mode_set;           /* --spec was given */
    int k;                   /* 0: the engine's default */
    int step_tokens;         /* 0: the engine's default */
    enum spec_policy policy; /* --spec-policy (default cost) */
    long history;            /* --spec-history, where history_set */
    bool history_set;
    const char *draft_model;      /* --draft-model; implies --spec draft */
    struct gguf_file *draft_file; /* opened by cli_spec_open */
};
enum {
    CLI_O_SPEC = 0x4010,
    CLI_O_SPEC_K,
    CLI_O_SPEC_STEP,
    CLI_O_DRAFT_MODEL,
    CLI_O_SPEC_POLICY,
    CLI_O_SPEC_HISTORY
};
#define CLI_SPEC_OPTIONS                                                                           \
    {"spec", required_argument, 0, CLI_O_SPEC}, {"spec-k", required_argument, 0, CLI_O_SPEC_K},    \
        {"spec-step-tokens", required_argument, 0, CLI_O_SPEC_STEP},                               \
        {"spec-policy", required_argument, 0, CLI_O_SPEC_POLICY},                                  \
        {"spec-history", required_argument, 0, CLI_O_SPEC_HISTORY},                                \
    {                                                                                              \
        "draft-model", required_argument, 0, CLI_O_DRAFT_MODEL                                     \
    }
#define CLI_SPEC_HELP                                                                              \
    "  --spec off|ngram|draft  speculative decoding: ngram drafts from the prompt and\n"           \
    "                    output (prompt lookup), draft from a smaller model with the same\n"       \
    "                    tokenizer (--draft-model), verified so the output stays\n"                \
    "                    byte-identical (default off)\n"                                           \
    "  --draft-model PATH  the draft model's GGUF (implies --spec draft)\n"                        \
    "  --spec-k N          the longest draft, 1..16 (default 8)\n"                                 \
    "  --spec-step-tokens N  drafts fill a step up to N tokens in all\n"                           \
    "                    (default 8)\n"                                                            \
    "  --spec-policy cost|acceptance  draft length from measured costs and\n"                      \
    "                    acceptance, drafting nothing where it does not pay\n"                     \
    "                    (default cost), or from acceptance alone (serve, bench)\n"                \
    "  --spec-history N    ngram: also draft from the last N tokens of finished\n"                 \
    "                    answers (default 65536; 0: none; serve, bench)\n"
/* Takes getopt's option `code` with its argument when it is one of CLI_SPEC_OPTIONS: 1, or -1
 * after a one-line error naming prog (a usage error); 0 when it is not one of them. */
int cli_spec_arg(const char *prog, int code, const char *text, struct cli_spec *s);
/* After the arguments, a usage error (the caller exits 2): --spec draft without --draft-model,
 * or --draft-model with another --spec; false after a one-line error. */
bool cli_spec_check(const char *prog, struct cli_spec *s);
/* The same check (QERR_INVALID), then, with a draft model, opens its file (errors name the
 * path). */
int cli_spec_open(struct cli_spec *s, struct qerr *err);
void cli_spec_close(struct cli_spec *s);

/* The model path: the --model argument, else $QUERN_MODEL, else the default. */
const char *cli_model_path(const char *arg);

/* The chat template (serve, generate): with --chat-template ARG, the format ARG names
 * (chat_template_by_name), else the Jinja text of the file ARG, else ARG as Jinja text, the
 * last two recognized by their markers; without it, the model's tokenizer.chat_template.
 * Errors name ARG or the model's key. */
#define CLI_CHAT_TEMPLATE_HELP                                                                     \
    "  --chat-template T   the chat format instead of the model's: a name (chatml, llama3,\n"      \
    "                    llama2[-sys[-bos|-strip]], mistral-v1|v3|v3-tekken|v7, deepseek3,\n"      \
    "                    deepseek-r1, zephyr, phi3, gemma, gemma3, qwen3, granite), or a\n"        \
    "                    Jinja template of a known family, in a file or inline\n"
struct gguf_file;
struct chat_template;
int cli_chat_template(const struct gguf_file *f, const char *arg, struct chat_template *out,
                      struct qerr *err);

/* --chat-template-kwargs (serve, generate): a JSON object of which quern's chat formats read
 * enable_thinking (*no_thinking: it is false); any other key names a template variable quern
 * does not run, refused rather than ignored. NULL, or what is wrong. */
const char *cli_template_kwargs(const char *json, bool *no_thinking);

/* --lora [NAME=]FILE and --lora-scaled [NAME=]FILE SCALE (llama.cpp's flags; repeatable): LoRA
 * adapters (engine/lora.h) loaded with the model, named NAME or the file's base name. */
#include "../engine/lora.h"
#include "../engine/engine.h"
#define CLI_MAX_LORAS ENGINE_MAX_LORAS
struct cli_loras {
    struct lora_spec specs[CLI_MAX_LORAS];
    char names[CLI_MAX_LORAS][LORA_NAME_MAX];
    int n;
};
enum { CLI_O_LORA = 0x4030, CLI_O_LORA_SCALED };
#define CLI_LORA_OPTIONS                                                                           \
    {"lora", required_argument, 0, CLI_O_LORA},                                                    \
    {                                                                                              \
        "lora-scaled", required_argument, 0, CLI_O_LORA_SCALED                                     \
    }
/* Takes getopt's option `code` with its argument when it is one of CLI_LORA_OPTIONS: 1, or -1
 * after a one-line error naming prog (a usage error); 0 when it is not one of them.
 * --lora-scaled takes its SCALE from argv[*optind], which it moves past. */
int cli_lora_arg(const char *prog, int code, char *text, int argc, char **argv, int *optind,
                 struct cli_loras *l);
/* l's specs, their names pointing into l (where it now lives) */
static inline const struct lora_spec *cli_lora_specs(struct cli_loras *l)
{
    for (int i = 0; i < l->n; i++) l->specs[i].name = l->names[i];
    return l->specs;
}
#define CLI_LORA_HELP                                                                              \
    "  --lora [NAME=]FILE  a LoRA adapter (GGUF, as llama.cpp's convert_lora_to_gguf.py\n"         \
    "                    writes it), named NAME or the file's base name (repeatable)\n"            \
    "  --lora-scaled [NAME=]FILE SCALE  the same, its effect scaled by SCALE\n"

#endif
