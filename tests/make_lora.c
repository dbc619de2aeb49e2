/* make_lora MODEL OUT [SEED [ALPHA]]: writes tests/lorafix.h's adapter (rank 8, every layer
 * matrix; seed 7 and alpha 16 unless given: the golden one) for the model at MODEL, for the
 * black-box tests of --lora (test_cli.sh, test_api.py). */
#include <stdio.h>
#include <stdlib.h>

#include "../engine/gguf.h"
#include "lorafix.h"

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: make_lora MODEL OUT [SEED [ALPHA]]\n");
        return 2;
    }
    struct qerr err = {0};
    struct gguf_file *f = NULL;
    struct model_config cfg;
    struct lorafix fx = lorafix_default();
    if (argc >= 4) fx.seed = (uint32_t)strtoul(argv[3], NULL, 10);
    if (argc == 5) fx.alpha = strtof(argv[4], NULL);
    if (gguf_open(argv[1], &f, &err) || model_config_read(f, &cfg, &err) ||
        lorafix_write(&cfg, argv[2], &fx, &err)) {
        fprintf(stderr, "make_lora: %s\n", err.msg);
        gguf_close(f);
        return 1;
    }
    gguf_close(f);
    return 0;
}
