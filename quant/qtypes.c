#include "qtypes.h"

#include <string.h>

bool qtype_supported(uint32_t t)
{
    switch (t) {
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16:
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q4_1:
        return true;
    }
    return false;
}

const char *qtype_name(uint32_t t)
{
    switch (t) {
    case QTYPE_F32:
        return "F32";
    case QTYPE_F16:
        return "F16";
    case QTYPE_BF16:
        return "BF16";
    case QTYPE_Q8_0:
        return "Q8_0";
    case QTYPE_Q4_0:
        return "Q4_0";
    case QTYPE_Q4_1:
        return "Q4_1";
    }
    return "unsupported";
}

int qtype_from_name(const char *name)
{
    static const uint32_t all[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16,
                                   QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *n = qtype_name(all[i]);
        size_t k = 0;
        while (n[k] && name[k] && (n[k] | 0x20) == (name[k] | 0x20)) k++;
        if (!n[k] && !name[k]) return (int)all[i];
    }
    return -1;
}

size_t qtype_block_elems(enum qtype t)
{
    return (t == QTYPE_F32 || t == QTYPE_F16 || t == QTYPE_BF16) ? 1 : QK;
}

size_t qtype_block_bytes(enum qtype t)
{
    switch (t) {
    case QTYPE_F32:
        return 4;
    case QTYPE_F16:
    case QTYPE_BF16:
        return 2;
    case QTYPE_Q8_0:
        return sizeof(struct block_q8_0);
    case QTYPE_Q4_0:
        return sizeof(struct block_q4_0);
    case QTYPE_Q4_1:
        return sizeof(struct block_q4_1);
    }
    return 0;
}

size_t qtype_row_bytes(enum qtype t, size_t n)
{
    return n / qtype_block_elems(t) * qtype_block_bytes(t);
}

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
    return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_fp16(float f)
{
    uint32_t x = f32_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520: overflow to inf */
    if (ax < 0x38800000u) {
        /* result is subnormal in fp16: scale so the integer part is the fp16 mantissa */
        float v = bits_to_f32(ax) * 0x1p24f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1))) m++;
        return sign | (uint16_t)m;
    }
    uint32_t exp = (ax >> 23) - 112;
    uint32_t man = ax & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

float bf16_to_f32(uint16_t h)
{
    return bits_to_f32((uint32_t)h << 16);
}

void qtype_dequantize_row(enum qtype t, const void *src, float *dst, size_t n)
{
    switch (t) {
    case QTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case QTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = fp16_to_f32(s[i]);
        break;
    }
    case QTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
        break;
    }
    case QTYPE_Q8_0: {
        const struct block_q8_0 *b = src;
        for (size_t i = 0; i < n / QK; i++) {
            float d = fp16_to_f32(b[i].d);
            for (int j = 0; j < QK; j++) dst[i * QK + j] = d * (float)b[i].qs[j];
        }
        break;
    }
    case QTYPE_Q4_0: {
        const struct block_q4_0 *b = src;
        for (size_t i = 0; i < n / QK; i++) {
            float d = fp16_to_f32(b[i].d);
            for (int j = 0; j < QK / 2; j++) {
                dst[i * QK + j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
                dst[i * QK + j + QK / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    case QTYPE_Q4_1: {
        const struct block_q4_1 *b = src;
        for (size_t i = 0; i < n / QK; i++) {
            float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m);
            for (int j = 0; j < QK / 2; j++) {
                dst[i * QK + j] = d * (float)(b[i].qs[j] & 0x0f) + m;
                dst[i * QK + j + QK / 2] = d * (float)(b[i].qs[j] >> 4) + m;
            }
        }
        break;
    }
    }
}
