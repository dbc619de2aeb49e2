/* bench_util: shared benchmark helpers (bench_util.h). */
#include "bench_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t bench_rng_next(struct bench_rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

float bench_rng_float(struct bench_rng *r)
{
    return (float)(bench_rng_next(r) >> 40) * 0x1p-23f - 1.0f;
}

void *bench_random_weights(struct bench_rng *r, enum qtype t, int64_t rows, int64_t cols,
                           float d_scale, float m_scale)
{
    size_t bytes = qtype_row_bytes(t, (size_t)cols) * (size_t)rows;
    uint8_t *p = malloc(bytes ? bytes : 1);
    if (!p) return NULL;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = bench_rng_next(r);
        memcpy(p + i, &v, bytes - i < 8 ? bytes - i : 8);
    }
    if (t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0) {
        size_t bb = qtype_block_bytes(t);
        for (size_t off = 0; off + bb <= bytes; off += bb) {
            uint16_t d = f32_to_fp16(d_scale * bench_rng_float(r));
            uint16_t m = f32_to_fp16(m_scale * bench_rng_float(r));
            memcpy(p + off, &d, 2);
            if (t == QTYPE_Q4_1) memcpy(p + off + 2, &m, 2);
        }
    } else if (t == QTYPE_F16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            uint16_t h = f32_to_fp16(m_scale * bench_rng_float(r));
            memcpy(p + i, &h, 2);
        }
    }
    return p;
}

bool bench_parse_count(const char *text, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

bool bench_parse_counts(const char *text, long lo, long hi, int *out, int max, int *n)
{
    int k = 0;
    for (const char *p = text; *p;) {
        char item[24];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || k == max) return false;
        memcpy(item, p, len);
        item[len] = 0;
        if (!bench_parse_count(item, lo, hi, &out[k++])) return false;
        p += len;
        if (*p == ',' && !*++p) return false; /* a trailing comma */
    }
    *n = k;
    return k > 0;
}
