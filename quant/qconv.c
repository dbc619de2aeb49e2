/* qconv: see qconv.h. The dequantizers follow ggml-quants.c's dequantize_row_* operation for
 * operation (the float products in the same order), so a converted Q8_0 block is the one
 * quantize_row_q8_0 makes from the values llama.cpp would compute. */
#include "qconv.h"

#include <math.h>
#include <string.h>

#include "quantize.h"

struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
struct block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
struct block_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
struct block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
struct block_q6_k {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
_Static_assert(sizeof(struct block_q5_0) == 22, "Q5_0 block is 22 bytes on disk");
_Static_assert(sizeof(struct block_q5_1) == 24, "Q5_1 block is 24 bytes on disk");
_Static_assert(sizeof(struct block_q4_k) == 144, "Q4_K block is 144 bytes on disk");
_Static_assert(sizeof(struct block_q5_k) == 176, "Q5_K block is 176 bytes on disk");
_Static_assert(sizeof(struct block_q6_k) == 210, "Q6_K block is 210 bytes on disk");

bool qconv_type(uint32_t t)
{
    return qconv_name(t) != NULL;
}

const char *qconv_name(uint32_t t)
{
    switch (t) {
    case QCONV_Q5_0:
        return "Q5_0";
    case QCONV_Q5_1:
        return "Q5_1";
    case QCONV_Q4_K:
        return "Q4_K";
    case QCONV_Q5_K:
        return "Q5_K";
    case QCONV_Q6_K:
        return "Q6_K";
    }
    return NULL;
}

size_t qconv_block_elems(uint32_t t)
{
    return t == QCONV_Q5_0 || t == QCONV_Q5_1 ? QK : QK_K;
}

size_t qconv_block_bytes(uint32_t t)
{
    switch (t) {
    case QCONV_Q5_0:
        return sizeof(struct block_q5_0);
    case QCONV_Q5_1:
        return sizeof(struct block_q5_1);
    case QCONV_Q4_K:
        return sizeof(struct block_q4_k);
    case QCONV_Q5_K:
        return sizeof(struct block_q5_k);
    case QCONV_Q6_K:
        return sizeof(struct block_q6_k);
    }
    return 0;
}

enum qtype qconv_target(uint32_t t)
{
    return t == QCONV_Q4_K ? QTYPE_Q4_1 : QTYPE_Q8_0;
}

/* Sub-block j's 6-bit scale and minimum in a Q4_K/Q5_K scales[12] (ggml's get_scale_min_k4):
 * the first four in the low 6 bits of bytes 0-3 and 4-7, the last four split between the low or
 * high nibble of bytes 8-11 and the top 2 bits of bytes 0-7. */
static void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Element j's 5-bit quant in a Q5_0/Q5_1 block. */
static int q5_quant(const uint8_t *qs, uint32_t qh, int j)
{
    int nib = j < QK / 2 ? qs[j] & 0x0F : qs[j - QK / 2] >> 4;
    return nib | (int)((qh >> j) & 1) << 4;
}

static void dequantize_q5(uint32_t t, const void *src, float *dst, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *qs, *qhb;
        float d, m = 0;
        if (t == QCONV_Q5_0) {
            const struct block_q5_0 *b = (const struct block_q5_0 *)src + i;
            d = fp16_to_f32(b->d);
            qs = b->qs;
            qhb = b->qh;
        } else {
            const struct block_q5_1 *b = (const struct block_q5_1 *)src + i;
            d = fp16_to_f32(b->d);
            m = fp16_to_f32(b->m);
            qs = b->qs;
            qhb = b->qh;
        }
        uint32_t qh;
        memcpy(&qh, qhb, 4);
        for (int j = 0; j < QK; j++) {
            int q = q5_quant(qs, qh, j);
            dst[i * QK + (size_t)j] = t == QCONV_Q5_0 ? (float)(q - 16) * d : (float)q * d + m;
        }
    }
}

/* Q4_K and Q5_K: sub-block s (32 elements) of a super-block. */
static void dequantize_k45(uint32_t t, const void *src, float *dst, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *scales, *qs, *qh = NULL;
        float d, dmin;
        if (t == QCONV_Q4_K) {
            const struct block_q4_k *b = (const struct block_q4_k *)src + i;
            d = fp16_to_f32(b->d);
            dmin = fp16_to_f32(b->dmin);
            scales = b->scales;
            qs = b->qs;
        } else {
            const struct block_q5_k *b = (const struct block_q5_k *)src + i;
            d = fp16_to_f32(b->d);
            dmin = fp16_to_f32(b->dmin);
            scales = b->scales;
            qs = b->qs;
            qh = b->qh;
        }
        float *y = dst + i * QK_K;
        for (int s = 0; s < QK_K / QK; s++) {
            uint8_t sc, m;
            k4_scale_min(s, scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            const uint8_t *q = qs + QK * (s / 2);
            for (int l = 0; l < QK; l++) {
                int v = s % 2 ? q[l] >> 4 : q[l] & 0xF;
                if (qh && (qh[l] >> s & 1)) v += 16;
                y[QK * s + l] = d1 * (float)v - m1;
            }
        }
    }
}

static void dequantize_q6k(const void *src, float *dst, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        const struct block_q6_k *b = (const struct block_q6_k *)src + i;
        const float d = fp16_to_f32(b->d);
        float *y = dst + i * QK_K;
        /* two halves of 128: ql 64 bytes, qh 32, scales 8 each */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            const int8_t *sc = b->scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
                y[128 * h + l] = d * (float)sc[is] * (float)q1;
                y[128 * h + l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[128 * h + l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[128 * h + l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void qconv_dequantize_row(uint32_t t, const void *src, float *dst, size_t n)
{
    size_t nb = n / qconv_block_elems(t);
    if (t == QCONV_Q5_0 || t == QCONV_Q5_1)
        dequantize_q5(t, src, dst, nb);
    else if (t == QCONV_Q4_K || t == QCONV_Q5_K)
        dequantize_k45(t, src, dst, nb);
    else if (t == QCONV_Q6_K)
        dequantize_q6k(src, dst, nb);
}

/* One Q4_K super-block as 8 Q4_1 blocks: sub-block s's nibbles are the low (s even) or high (s
 * odd) nibbles of the 32 bytes qs[32 (s / 2) ...]; a Q4_1 byte j holds elements j and j + 16. */
static void q4k_to_q4_1(const struct block_q4_k *b, struct block_q4_1 *out)
{
    const float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
    for (int s = 0; s < QK_K / QK; s++) {
        uint8_t sc, m;
        k4_scale_min(s, b->scales, &sc, &m);
        out[s].d = f32_to_fp16(d * sc);
        out[s].m = f32_to_fp16(-(dmin * m));
        const uint8_t *q = b->qs + QK * (s / 2);
        for (int j = 0; j < QK / 2; j++) {
            int lo = s % 2 ? q[j] >> 4 : q[j] & 0xF;
            int hi = s % 2 ? q[j + QK / 2] >> 4 : q[j + QK / 2] & 0xF;
            out[s].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

static bool finite_block(const float *x)
{
    for (int j = 0; j < QK; j++)
        if (!isfinite(x[j])) return false;
    return true;
}

void qconv_row(uint32_t t, const void *src, void *dst, size_t n)
{
    if (t == QCONV_Q4_K) {
        for (size_t i = 0; i < n / QK_K; i++)
            q4k_to_q4_1((const struct block_q4_k *)src + i,
                        (struct block_q4_1 *)dst + i * (QK_K / QK));
        return;
    }
    if (t == QCONV_Q5_0) {
        for (size_t i = 0; i < n / QK; i++) {
            const struct block_q5_0 *b = (const struct block_q5_0 *)src + i;
            struct block_q8_0 *o = (struct block_q8_0 *)dst + i;
            uint32_t qh;
            memcpy(&qh, b->qh, 4);
            o->d = b->d;
            for (int j = 0; j < QK; j++) o->qs[j] = (int8_t)(q5_quant(b->qs, qh, j) - 16);
        }
        return;
    }
    /* the rest a super-block (or a Q5_1 block) at a time through floats */
    size_t be = qconv_block_elems(t), bb = qconv_block_bytes(t);
    float x[QK_K];
    for (size_t i = 0; i < n / be; i++) {
        qconv_dequantize_row(t, (const uint8_t *)src + i * bb, x, be);
        for (size_t k = 0; k < be / QK; k++) {
            struct block_q8_0 *o = (struct block_q8_0 *)dst + i * (be / QK) + k;
            if (finite_block(x + k * QK)) {
                quantize_row_q8_0(x + k * QK, o, QK);
                continue;
            }
            /* a NaN or infinite scale in the file: every element NaN, which the load's scan
             * reports (quantize_row_q8_0 wants finite inputs) */
            o->d = 0x7e00;
            memset(o->qs, 1, sizeof o->qs);
        }
    }
}
