/* --spec, --spec-k, --spec-step-tokens, --spec-policy, --spec-history and --draft-model (cli.h). */
#include <stdio.h>

#include "../engine/gguf.h"
#include "cli.h"

static bool spec_arg(const char *prog, int code, const char *text, struct cli_spec *s)
{
    if (code == CLI_O_SPEC) {
        struct qerr err = {0};
        s->mode_set = true;
        if (spec_mode_parse(text, &s->mode, &err) == 0) return true;
        fprintf(stderr, "quern %s: '%s': --spec wants off, ngram or draft\n", prog, text);
        return false;
    }
    if (code == CLI_O_SPEC_POLICY) {
        struct qerr err = {0};
        if (spec_policy_parse(text, &s->policy, &err) == 0) return true;
        fprintf(stderr, "quern %s: '%s': --spec-policy wants cost or acceptance\n", prog, text);
        return false;
    }
    if (code == CLI_O_DRAFT_MODEL) {
        s->draft_model = text;
        return true;
    }
    long v;
    if (code == CLI_O_SPEC_HISTORY) {
        if (cli_parse_int(text, 0, 1L << 26, &v)) {
            s->history = v;
            s->history_set = true;
            return true;
        }
        fprintf(stderr, "quern %s: '%s': --spec-history wants 0..67108864 tokens\n", prog, text);
        return false;
    }
    if (code == CLI_O_SPEC_STEP) {
        if (cli_parse_int(text, 1, 1 << 20, &v)) {
            s->step_tokens = (int)v;
            return true;
        }
        fprintf(stderr, "quern %s: '%s': --spec-step-tokens wants 1..1048576\n", prog, text);
        return false;
    }
    if (cli_parse_int(text, 1, SPEC_K_MAX, &v)) {
        s->k = (int)v;
        return true;
    }
    fprintf(stderr, "quern %s: '%s': --spec-k wants 1..%d\n", prog, text, SPEC_K_MAX);
    return false;
}

int cli_spec_arg(const char *prog, int code, const char *text, struct cli_spec *s)
{
    switch (code) {
    case CLI_O_SPEC:
    case CLI_O_SPEC_K:
    case CLI_O_SPEC_STEP:
    case CLI_O_SPEC_POLICY:
    case CLI_O_SPEC_HISTORY:
    case CLI_O_DRAFT_MODEL:
        return spec_arg(prog, code, text, s) ? 1 : -1;
    }
    return 0;
}

static int spec_combination(struct cli_spec *s, struct qerr *err)
{
    if (s->draft_model && !s->mode_set) s->mode = SPEC_DRAFT;
    if (s->mode == SPEC_DRAFT && !s->draft_model)
        return qerr_set(err, QERR_INVALID, "--spec draft needs --draft-model PATH");
    if (s->draft_model && s->mode != SPEC_DRAFT)
        return qerr_set(err, QERR_INVALID, "--draft-model drafts only with --spec draft, not %s",
                        spec_mode_name(s->mode));
    return 0;
}

bool cli_spec_check(const char *prog, struct cli_spec *s)
{
    struct qerr err = {0};
    if (!spec_combination(s, &err)) return true;
    fprintf(stderr, "quern %s: %s\n", prog, err.msg);
    return false;
}

int cli_spec_open(struct cli_spec *s, struct qerr *err)
{
    int rc = spec_combination(s, err);
    if (rc || !s->draft_model) return rc;
    rc = gguf_open(s->draft_model, &s->draft_file, err);
    if (rc) qerr_wrap(err, "--draft-model %s", s->draft_model);
    return rc;
}

void cli_spec_close(struct cli_spec *s)
{
    gguf_close(s->draft_file);
    s->draft_file = NULL;
}
