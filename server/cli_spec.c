/* --spec and --spec-k (cli.h). */
#include <stdio.h>

#include "cli.h"

bool cli_spec_arg(const char *prog, int code, const char *text, struct cli_spec *s)
{
    if (code == CLI_O_SPEC) {
        struct qerr err = {0};
        if (spec_mode_parse(text, &s->mode, &err) == 0) return true;
        fprintf(stderr, "quern %s: '%s': --spec wants off or ngram\n", prog, text);
        return false;
    }
    long v;
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
