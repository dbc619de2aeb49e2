#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *tu_model_path(void)
{
    const char *p = getenv("QUERN_MODEL");
    if (!p || access(p, R_OK) != 0) {
        fprintf(stderr, "skipping: model file %s not found (run tools/setup.sh)\n",
                p ? p : "($QUERN_MODEL unset)");
        exit(77);
    }
    return p;
}

const char *tu_golden_path(void)
{
    const char *p = getenv("QUERN_GOLDEN");
    return p && access(p, R_OK) == 0 ? p : NULL;
}

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

char *tu_write_temp(const void *data, size_t len)
{
    char *path = strdup("/tmp/quern-test-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        free(path);
        return NULL;
    }
    if (write(fd, data, len) != (ssize_t)len) {
        close(fd);
        unlink(path);
        free(path);
        return NULL;
    }
    close(fd);
    return path;
}

int tu_sanitized(void)
{
    const char *s = getenv("QUERN_SANITIZED");
    return s && *s && strcmp(s, "0") != 0;
}
