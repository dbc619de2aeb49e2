#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#include <cjson/cJSON.h>

#include "../engine/chat.h"
#include "../engine/gguf.h"
#include "../engine/model.h"

bool cli_parse_int(const char *text, long lo, long hi, long *out)
{
    if (!text || !*text) return false;
    errno = 0;
    char *end;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *text, double lo, double hi, double *out)
{
    if (!text || !*text) return false;
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

const char *cli_model_path(const char *arg)
{
    if (arg) return arg;
    const char *env = getenv("QUERN_MODEL");
    return env && *env ? env : QUERN_DEFAULT_MODEL;
}

static bool device_arg(const char *prog, const char *text, const char **out)
{
    enum backend_kind kind;
    int index;
    struct qerr err = {0};
    if (backend_device_parse(text, &kind, &index, &err)) {
        fprintf(stderr, "quern %s: %s\n", prog, err.msg);
        return false;
    }
    *out = text;
    return true;
}

static bool precision_arg(const char *prog, const char *text, enum matmul_precision *out)
{
    static const struct {
        const char *name;
        enum matmul_precision p;
    } names[] = {{"auto", MATMUL_AUTO}, {"f32", MATMUL_F32}, {"q8", MATMUL_Q8}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(text, names[i].name)) {
            *out = names[i].p;
            return true;
        }
    fprintf(stderr, "quern %s: --precision '%s' is not auto, f32 or q8\n", prog, text);
    return false;
}

bool cli_tp_arg(const char *prog, const char *text, int *out)
{
    long v;
    if (!cli_parse_int(text, 1, COMM_MAX_RANKS, &v)) {
        fprintf(stderr, "quern %s: --tp '%s': want a rank count in 1..%d\n", prog, text,
                COMM_MAX_RANKS);
        return false;
    }
    *out = (int)v;
    return true;
}

static bool knob_arg(const char *prog, int code, const char *text, struct cli_knobs *k)
{
    long v;
    switch (code) {
    case CLI_O_KV_TYPE:
        if (strcmp(text, "f16") && strcmp(text, "f32") && strcmp(text, "q8")) break;
        k->kv_type = text;
        return true;
    case CLI_O_GEMM:
        if (strcmp(text, "mma") && strcmp(text, "cublas")) break;
        k->gemm = text;
        return true;
    case CLI_O_GEMM_MIN:
        if (!cli_parse_int(text, 1, 1 << 20, &v)) break;
        k->gemm_min_tokens = (int)v;
        return true;
    case CLI_O_ROPE_BASE:
    case CLI_O_ROPE_SCALE: {
        double d;
        if (!cli_parse_float(text, 1e-30, 1e12, &d)) break;
        *(code == CLI_O_ROPE_BASE ? &k->rope_freq_base : &k->rope_scale) = (float)d;
        return true;
    }
    }
    fprintf(stderr, "quern %s: '%s': %s\n", prog, text,
            code == CLI_O_KV_TYPE     ? "--kv-type wants f16, f32 or q8"
            : code == CLI_O_GEMM      ? "--gemm wants mma or cublas"
            : code == CLI_O_GEMM_MIN  ? "--gemm-min-tokens wants 1..1048576 (for never: "
                                        "--batch-invariant)"
            : code == CLI_O_ROPE_BASE ? "--rope-freq-base wants a number > 0"
                                      : "--rope-scale wants a number > 0");
    return false;
}

void cli_knobs_model(const struct cli_knobs *k, struct model_opts *mo)
{
    mo->rope_freq_base = k->rope_freq_base;
    mo->rope_scale = k->rope_scale;
}

int cli_backend_arg(const char *prog, int code, const char *text, struct cli_backend_args *b)
{
    bool ok;
    switch (code) {
    case CLI_O_PRECISION:
        ok = precision_arg(prog, text, &b->precision);
        break;
    case CLI_O_DEVICE:
        ok = device_arg(prog, text, &b->device);
        break;
    case CLI_O_TP:
        ok = cli_tp_arg(prog, text, &b->tp);
        break;
    case CLI_O_BATCH_INVARIANT:
        b->batch_invariant = ok = true;
        break;
    case CLI_O_KV_TYPE:
    case CLI_O_GEMM:
    case CLI_O_GEMM_MIN:
    case CLI_O_ROPE_BASE:
    case CLI_O_ROPE_SCALE:
        ok = knob_arg(prog, code, text, &b->knobs);
        break;
    default:
        return 0;
    }
    return ok ? 1 : -1;
}

int cli_backends_open(const char *prog, const struct cli_backend_args *b, int threads,
                      struct backend_group *g, struct qerr *err)
{
    struct backend_request r = {.device = b->device,
                                .threads = threads,
                                .precision = b->precision,
                                .batch_invariant = b->batch_invariant,
                                .kv_type = b->knobs.kv_type,
                                .gemm = b->knobs.gemm,
                                .gemm_min_tokens = b->knobs.gemm_min_tokens};
    int rc = backend_group_create(&r, b->tp > 0 ? b->tp : 1, g, err);
    if (!rc) fprintf(stderr, "quern %s: backend: %s\n", prog, err->msg);
    return rc;
}

int cli_chat_template(const struct gguf_file *f, const char *arg, struct chat_template *out,
                      struct qerr *err)
{
    if (!arg) {
        struct gguf_str tmpl;
        int rc = gguf_get_str(f, "tokenizer.chat_template", &tmpl, err);
        return rc ? rc : chat_template_parse(tmpl.ptr, (size_t)tmpl.len, out, err);
    }
    if (chat_template_by_name(arg, out, NULL) == 0) return 0;
    FILE *fp = fopen(arg, "rb");
    if (!fp && !strchr(arg, '{')) /* neither a file nor Jinja: a name misspelled */
        return chat_template_by_name(arg, out, err);
    if (!fp) return chat_template_parse(arg, strlen(arg), out, err);
    char *text = malloc((size_t)1 << 20);
    size_t len = text ? fread(text, 1, ((size_t)1 << 20) - 1, fp) : 0;
    bool whole = text && feof(fp) && !ferror(fp);
    fclose(fp);
    int rc = !text ? qerr_set(err, QERR_NOMEM, "--chat-template %s: out of memory", arg)
             : !whole
                 ? qerr_set(err, QERR_INVALID, "--chat-template %s: unreadable or over 1 MiB", arg)
                 : chat_template_parse(text, len, out, err);
    free(text);
    return rc;
}

const char *cli_template_kwargs(const char *json, bool *no_thinking)
{
    cJSON *j = cJSON_Parse(json);
    const char *bad = NULL;
    const cJSON *x;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return "--chat-template-kwargs wants a JSON object";
    }
    cJSON_ArrayForEach(x, j)
    {
        if (strcmp(x->string, "enable_thinking"))
            bad = "--chat-template-kwargs: quern's chat formats read only enable_thinking";
        else if (!cJSON_IsBool(x))
            bad = "--chat-template-kwargs: enable_thinking must be true or false";
        else
            *no_thinking = cJSON_IsFalse(x);
    }
    cJSON_Delete(j);
    return bad;
}

int cli_lora_arg(const char *prog, int code, char *text, int argc, char **argv, int *optind,
                 struct cli_loras *l)
{
    if (code != CLI_O_LORA && code != CLI_O_LORA_SCALED) return 0;
    const char *opt = code == CLI_O_LORA ? "--lora" : "--lora-scaled";
    double scale = 1.0;
    if (code == CLI_O_LORA_SCALED) {
        if (*optind >= argc || !cli_parse_float(argv[*optind], -1e6, 1e6, &scale)) {
            fprintf(stderr, "quern %s: --lora-scaled wants a file and a scale (-1e6..1e6)\n", prog);
            return -1;
        }
        (*optind)++;
    }
    if (l->n == CLI_MAX_LORAS) {
        fprintf(stderr, "quern %s: %s: at most %d adapters\n", prog, opt, CLI_MAX_LORAS);
        return -1;
    }
    /* NAME=FILE where NAME has no '/': a path may hold '=' in a directory's name */
    char *eq = strchr(text, '='), *slash = strchr(text, '/');
    const char *path = text, *name = NULL;
    size_t name_len = 0;
    if (eq && (!slash || eq < slash)) {
        name = text;
        name_len = (size_t)(eq - text);
        path = eq + 1;
    } else {
        const char *base = strrchr(text, '/');
        name = base ? base + 1 : text;
        name_len = strlen(name);
        if (name_len > 5 && !strcmp(name + name_len - 5, ".gguf")) name_len -= 5;
    }
    if (!*path || name_len == 0 || name_len >= LORA_NAME_MAX) {
        fprintf(stderr, "quern %s: %s '%s': wants [NAME=]FILE, NAME 1..%d bytes\n", prog, opt, text,
                LORA_NAME_MAX - 1);
        return -1;
    }
    for (size_t i = 0; i < name_len; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("._-", name[i])) {
            fprintf(stderr,
                    "quern %s: %s '%s': the name '%.*s' may hold letters, digits, '.', '_' and "
                    "'-' (name it: NAME=FILE)\n",
                    prog, opt, text, (int)name_len, name);
            return -1;
        }
    memcpy(l->names[l->n], name, name_len);
    l->names[l->n][name_len] = 0;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->names[i], l->names[l->n])) {
            fprintf(stderr, "quern %s: %s: two adapters named '%s' (name them: NAME=FILE)\n", prog,
                    opt, l->names[i]);
            return -1;
        }
    l->specs[l->n] =
        (struct lora_spec){.path = path, .name = l->names[l->n], .scale = (float)scale};
    l->n++;
    return 1;
}
