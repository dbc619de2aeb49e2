/* fuzz_util: shared harness helpers (fuzz_util.h). */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int fuzz_gguf_from_bytes(const uint8_t *data, size_t size, struct gguf_file **f, struct qerr *err)
{
    *f = NULL;
    int fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
    if (fd < 0) {
        perror("memfd_create");
        abort();
    }
    for (size_t off = 0; off < size;) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            perror("memfd write");
            abort();
        }
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int rc = gguf_open(path, f, err);
    close(fd); /* the mapping, if any, holds the file */
    return rc;
}

const struct tokenizer *fuzz_tokenizer_at(const char *path, struct gguf_file **f)
{
    struct qerr err = {0};
    struct tokenizer *t = NULL;
    if (gguf_open(path, f, &err) || tokenizer_load(*f, &t, &err)) {
        fprintf(stderr, "fuzz: cannot load the tokenizer of %s: %s\n", path, err.msg);
        exit(1);
    }
    return t;
}

static struct gguf_file *bpe_file;

const struct tokenizer *fuzz_bpe(void)
{
    static const struct tokenizer *t;
    if (!t) {
        const char *path = getenv("QUERN_MODEL");
        t = fuzz_tokenizer_at(path && *path ? path : QUERN_FUZZ_MODEL, &bpe_file);
    }
    return t;
}

const struct gguf_file *fuzz_bpe_file(void)
{
    fuzz_bpe();
    return bpe_file;
}

const struct tokenizer *fuzz_spm(void)
{
    static const struct tokenizer *t;
    static struct gguf_file *f;
    if (!t) t = fuzz_tokenizer_at(QUERN_FUZZ_CORPUS "/gguf/tiny-spm.gguf", &f);
    return t;
}

int fuzz_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += len;
    }
    return 1;
}
