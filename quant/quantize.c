#include "quantize.h"

#include <float.h>
#include <math.h>
#include <string.h>

void quantize_row_q8_0(const float *x, struct block_q8_0 *y, size_t n)
{
    for (size_t i = 0; i < n / QK; i++) {
        const float *v = x + i * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)roundf(v[j] * id);
    }
}

/* The nibble of a value already scaled and offset: truncation toward zero, capped at 15. The
 * argument is >= 0 for finite input (at worst -0.0f + 0.5 rounding), so the cast is defined. */
static uint8_t nibble(float scaled)
{
    int q = (int)scaled;
    return (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
}

void quantize_row_q4_0(const float *x, struct block_q4_0 *y, size_t n)
{
    for (size_t i = 0; i < n / QK; i++) {
        const float *v = x + i * QK;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++) {
            if (amax < fabsf(v[j])) {
                amax = fabsf(v[j]);
                max = v[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK / 2; j++) {
            uint8_t lo = nibble(v[j] * id + 8.5f);
            uint8_t hi = nibble(v[j + QK / 2] * id + 8.5f);
            y[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

void quantize_row_q4_1(const float *x, struct block_q4_1 *y, size_t n)
{
    for (size_t i = 0; i < n / QK; i++) {
        const float *v = x + i * QK;
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK; j++) {
            if (v[j] < min) min = v[j];
            if (v[j] > max) max = v[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        y[i].m = f32_to_fp16(min);
        for (int j = 0; j < QK / 2; j++) {
            uint8_t lo = nibble((v[j] - min) * id + 0.5f);
            uint8_t hi = nibble((v[j + QK / 2] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

bool qtype_can_quantize(enum qtype t)
{
    switch (t) {
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q4_1:
        return true;
    case QTYPE_BF16:
        return false;
    }
    return false;
}

int qtype_quantize_row(enum qtype t, enum qround round, const float *x, void *dst, size_t n,
                       struct qerr *err)
{
    if (!qtype_can_quantize(t))
        return qerr_set(err, QERR_UNSUPPORTED, "cannot quantize to %s", qtype_name(t));
    if (n % qtype_block_elems(t))
        return qerr_set(err, QERR_INVALID,
                        "row of %zu elements is not a multiple of the %zu of a %s block", n,
                        qtype_block_elems(t), qtype_name(t));
    switch (t) {
    case QTYPE_F32:
        memcpy(dst, x, n * sizeof(float));
        break;
    case QTYPE_F16: {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++) h[i] = f32_to_fp16(x[i]);
        break;
    }
    case QTYPE_Q8_0:
        if (round == QROUND_SEARCH)
            quantize_row_q8_0_search(x, dst, n);
        else
            quantize_row_q8_0(x, dst, n);
        break;
    case QTYPE_Q4_0:
        quantize_row_q4_0(x, dst, n);
        break;
    case QTYPE_Q4_1:
        quantize_row_q4_1(x, dst, n);
        break;
    case QTYPE_BF16:
        break;
    }
    return 0;
}
