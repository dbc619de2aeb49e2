#include "testutil.h"

#include <check.h>
#include <math.h>
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

int tu_tsan(void)
{
    const char *s = getenv("QUERN_SANITIZED");
    return s && !strcmp(s, "thread");
}

int tu_selected(const char *name)
{
    const char *only = getenv("QUERN_TEST_ONLY");
    if (!only || !*only) return 1;
    for (const char *w = only; *w;) {
        size_t n = strcspn(w, ",");
        char word[64];
        if (n > 0 && n < sizeof word) {
            memcpy(word, w, n);
            word[n] = 0;
            if (strstr(name, word)) return 1;
        }
        w += n + (w[n] == ',');
    }
    return 0;
}

static uint64_t rng_state;

void tu_seed(uint64_t seed)
{
    rng_state = seed;
}

uint64_t tu_rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

float tu_frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(tu_rnd() >> 40) * 0x1p-24f;
}

void tu_fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = tu_frand(-scale, scale);
    for (size_t i = 0; i < n / 97; i++) x[tu_rnd() % n] *= 8.0f;
}

void tu_make_weight(struct bweight *w, enum qtype t, int64_t rows, int64_t cols)
{
    *w = (struct bweight){.type = t, .rows = rows, .cols = cols};
    size_t rb = qtype_row_bytes(t, (size_t)cols), bytes = rb * (size_t)rows;
    uint8_t *p = malloc(bytes);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)tu_rnd();
    size_t bb = qtype_block_bytes(t);
    switch (t) {
    case QTYPE_F32:
        for (size_t i = 0; i < bytes / 4; i++) ((float *)p)[i] = tu_frand(-0.1f, 0.1f);
        break;
    case QTYPE_F16:
        for (size_t i = 0; i < bytes / 2; i++)
            ((uint16_t *)p)[i] = f32_to_fp16(tu_frand(-0.1f, 0.1f));
        break;
    case QTYPE_BF16:
        for (size_t i = 0; i < bytes / 2; i++) {
            float f = tu_frand(-0.1f, 0.1f);
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        }
        break;
    default:
        for (size_t off = 0; off < bytes; off += bb) {
            uint16_t d = f32_to_fp16(tu_frand(-0.02f, 0.02f));
            uint16_t m = f32_to_fp16(tu_frand(-0.1f, 0.1f));
            memcpy(p + off, &d, 2);
            if (t == QTYPE_Q4_1) memcpy(p + off + 2, &m, 2);
        }
    }
    w->host = p;
}

void tu_free_weight(struct bweight *w)
{
    free((void *)w->host);
}

int tu_bits_differ(const float *a, const float *b, size_t n, size_t *at)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            *at = i;
            return 1;
        }
    return 0;
}

double tu_matmul_error(const struct bweight *w, const float *x, int n, const float *y,
                       const float *yref)
{
    double worst = 0;
    float *row = malloc((size_t)w->cols * sizeof *row);
    size_t rb = qtype_row_bytes(w->type, (size_t)w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        qtype_dequantize_row(w->type, (const uint8_t *)w->host + (size_t)r * rb, row,
                             (size_t)w->cols);
        for (int i = 0; i < n; i++) {
            double mag = 0;
            for (int64_t k = 0; k < w->cols; k++)
                mag += fabs((double)row[k] * x[(size_t)i * (size_t)w->cols + (size_t)k]);
            size_t o = (size_t)i * (size_t)w->rows + (size_t)r;
            double e = fabs((double)y[o] - yref[o]) / (mag + 1e-30);
            if (!(e <= worst)) worst = e;
        }
    }
    free(row);
    return worst;
}

void tu_q8_quantize(struct q8act *a, const float *x, int n, int64_t cols)
{
    a->cols = cols;
    a->nb = cols / QK;
    a->q = malloc((size_t)n * (size_t)cols);
    a->d = malloc((size_t)n * (size_t)a->nb * sizeof(float));
    a->s = malloc((size_t)n * (size_t)a->nb * sizeof(float));
    a->sum = malloc((size_t)n * (size_t)a->nb * sizeof(int32_t));
    ck_assert(a->q && a->d && a->s && a->sum);
    for (int t = 0; t < n; t++)
        ref_quantize_q8(x + (size_t)t * (size_t)cols, cols, a->q + (size_t)t * (size_t)cols,
                        a->d + (size_t)t * (size_t)a->nb, a->s + (size_t)t * (size_t)a->nb,
                        a->sum + (size_t)t * (size_t)a->nb);
}

void tu_q8_free(struct q8act *a)
{
    free(a->q);
    free(a->d);
    free(a->s);
    free(a->sum);
}

const struct model_batch *tu_ragged_batch(const int32_t *x, int n, int from, int n_seqs,
                                          const int32_t *other, int n_other)
{
    enum { PER_SEQ = 8, BS = 16, MAXT = 1024, MAXS = 64 };
    static int32_t tokens[MAXT], pos[MAXT], seq[MAXT], slot[MAXT], table[MAXS * PER_SEQ],
        lidx[MAXS];
    static struct model_batch b;
    ck_assert_int_le(n_seqs, MAXS);
    int t = 0, nl = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int j = 0; j < PER_SEQ; j++) table[s * PER_SEQ + j] = s * PER_SEQ + j;
        int len = s == 0 ? n : 3 + (s * 7) % 29;
        int start = s == 0 ? from : 0;
        for (int p = start; p < len; p++, t++) {
            ck_assert_int_lt(t, MAXT);
            tokens[t] = s == 0 ? x[p] : other[(s * 13 + p) % n_other];
            pos[t] = p;
            seq[t] = s;
            slot[t] = table[s * PER_SEQ + p / BS] * BS + p % BS;
        }
        lidx[nl++] = t - 1;
    }
    b = (struct model_batch){.n_tokens = t,
                             .tokens = tokens,
                             .pos = pos,
                             .seq = seq,
                             .slot = slot,
                             .n_seqs = n_seqs,
                             .max_blocks = PER_SEQ,
                             .block_table = table,
                             .n_logits = nl,
                             .logit_idx = lidx};
    return &b;
}
