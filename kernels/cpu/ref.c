#include "ref.h"

#include "../../quant/quantize.h"

#include <math.h>
#include <string.h>

#define LANES 16

static float sum_lanes(float *acc)
{
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++) acc[i] += acc[i + w];
    return acc[0];
}

float ref_dot_row(enum qtype t, const void *row, const float *x, int64_t cols)
{
    float acc[LANES] = {0};
    float w[QK];
    size_t be = qtype_block_elems(t) == 1 ? QK : qtype_block_elems(t);
    const uint8_t *src = row;
    size_t step = qtype_row_bytes(t, be);
    /* every type here has rows that are a multiple of 32 in the models we load; a float row
     * that is not is finished element by element */
    int64_t full = cols / (int64_t)be * (int64_t)be;
    for (int64_t c = 0; c < full; c += (int64_t)be, src += step) {
        qtype_dequantize_row(t, src, w, be);
        for (size_t j = 0; j < be; j += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += w[j + l] * x[c + (int64_t)j + l];
    }
    for (int64_t c = full; c < cols; c++) {
        qtype_dequantize_row(t, src, w, 1);
        src += qtype_block_bytes(t);
        acc[0] += w[0] * x[c];
    }
    return sum_lanes(acc);
}

void ref_matmul_rows(const struct bweight *w, const float *x, int n, float *y, int64_t r0,
                     int64_t r1)
{
    size_t rb = qtype_row_bytes(w->type, (size_t)w->cols);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->host + (size_t)r * rb;
        for (int i = 0; i < n; i++)
            y[(size_t)i * (size_t)w->rows + (size_t)r] =
                ref_dot_row(w->type, row, x + (size_t)i * (size_t)w->cols, w->cols);
    }
}

void ref_embed(const struct bweight *table, const int32_t *tokens, int n, float *out)
{
    size_t rb = qtype_row_bytes(table->type, (size_t)table->cols);
    for (int i = 0; i < n; i++)
        qtype_dequantize_row(table->type, (const uint8_t *)table->host + (size_t)tokens[i] * rb,
                             out + (size_t)i * (size_t)table->cols, (size_t)table->cols);
}

void ref_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * (size_t)dim;
        float *oi = out + (size_t)i * (size_t)dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float scale = (float)(1.0 / sqrt(ss / dim + eps));
        for (int j = 0; j < dim; j++) oi[j] = xi[j] * scale * w[j];
    }
}

void ref_rope(float *x, const int32_t *pos, int n, int n_heads, int head_dim,
              const struct rope_spec *rs)
{
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)i * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
            for (int d = 0; d < rs->rot_dim; d += 2) {
                double theta = (double)pos[i] * rope_inv_freq(rs, d / 2);
                float c = (float)(cos(theta) * rope_mscale(rs)),
                      s = (float)(sin(theta) * rope_mscale(rs));
                float a = v[d], b = v[d + 1];
                v[d] = a * c - b * s;
                v[d + 1] = a * s + b * c;
            }
        }
}

void ref_kv_write(float *k_cache, float *v_cache, const float *k, const float *v,
                  const struct attn_batch *b, int kv_dim)
{
    for (int i = 0; i < b->n_tokens; i++) {
        size_t dst = (size_t)b->slot[i] * (size_t)kv_dim, src = (size_t)i * (size_t)kv_dim;
        memcpy(k_cache + dst, k + src, (size_t)kv_dim * sizeof(float));
        memcpy(v_cache + dst, v + src, (size_t)kv_dim * sizeof(float));
    }
}

void ref_kv_write_f16(uint16_t *k_cache, uint16_t *v_cache, const float *k, const float *v,
                      const struct attn_batch *b, int kv_dim)
{
    for (int i = 0; i < b->n_tokens; i++) {
        size_t dst = (size_t)b->slot[i] * (size_t)kv_dim, src = (size_t)i * (size_t)kv_dim;
        for (int d = 0; d < kv_dim; d++) {
            k_cache[dst + (size_t)d] = f32_to_fp16(k[src + (size_t)d]);
            v_cache[dst + (size_t)d] = f32_to_fp16(v[src + (size_t)d]);
        }
    }
}

void ref_kv_write_q8(uint8_t *k_cache, uint8_t *v_cache, const float *k, const float *v,
                     const struct attn_batch *b, int kv_dim)
{
    size_t row = kv_units(KV_Q8, (size_t)kv_dim);
    for (int i = 0; i < b->n_tokens; i++) {
        size_t dst = (size_t)b->slot[i] * row, src = (size_t)i * (size_t)kv_dim;
        quantize_row_q8_0(k + src, (struct block_q8_0 *)(k_cache + dst), (size_t)kv_dim);
        quantize_row_q8_0(v + src, (struct block_q8_0 *)(v_cache + dst), (size_t)kv_dim);
    }
}

/* Element d of the row at unit offset at of a cache of kind kk. */
static inline float kv_at(enum kv_kind kk, const void *cache, size_t at, int d)
{
    if (kk == KV_F32) return ((const float *)cache)[at + (size_t)d];
    if (kk == KV_F16) return fp16_to_f32(((const uint16_t *)cache)[at + (size_t)d]);
    uint16_t dh;
    const int8_t *q = kv_q8_at(cache, at, d, &dh);
    return fp16_to_f32(dh) * (float)*q;
}

static void attention_one(float *out, const float *q, const void *kc, const void *vc,
                          enum kv_kind kk, const struct attn_batch *b, const struct attn_shape *s,
                          int t, int h)
{
    int hd = s->head_dim;
    int kvh = h / (s->n_heads / s->n_kv_heads);
    size_t slot_units = kv_units(kk, (size_t)s->n_kv_heads * (size_t)hd),
           col = kv_units(kk, (size_t)kvh * (size_t)hd);
    const float *qh = q + ((size_t)t * (size_t)s->n_heads + (size_t)h) * (size_t)hd;
    float *oh = out + ((size_t)t * (size_t)s->n_heads + (size_t)h) * (size_t)hd;
    const int32_t *table = b->block_table + (size_t)b->seq[t] * (size_t)b->max_blocks;
    /* online softmax: one pass, no scratch sized by the context */
    float m = -INFINITY, l = 0;
    float acc[512];
    for (int d = 0; d < hd; d++) acc[d] = 0;
    for (int j = attn_first_key(b, b->pos[t]); j <= b->pos[t]; j++) {
        size_t slot =
            (size_t)table[j / b->block_size] * (size_t)b->block_size + (size_t)(j % b->block_size);
        size_t kj = slot * slot_units + col;
        float sc = 0;
        for (int d = 0; d < hd; d++) sc += qh[d] * kv_at(kk, kc, kj, d);
        sc *= s->scale;
        if (s->softcap > 0) sc = s->softcap * tanhf(sc / s->softcap);
        if (sc > m) {
            float corr = expf(m - sc);
            l *= corr;
            for (int d = 0; d < hd; d++) acc[d] *= corr;
            m = sc;
        }
        float p = expf(sc - m);
        l += p;
        for (int d = 0; d < hd; d++) acc[d] += p * kv_at(kk, vc, kj, d);
    }
    for (int d = 0; d < hd; d++) oh[d] = acc[d] / l;
}

void ref_attention_one(float *out, const float *q, const float *k_cache, const float *v_cache,
                       const struct attn_batch *b, const struct attn_shape *s, int t, int h)
{
    attention_one(out, q, k_cache, v_cache, KV_F32, b, s, t, h);
}

void ref_attention_one_f16(float *out, const float *q, const uint16_t *k_cache,
                           const uint16_t *v_cache, const struct attn_batch *b,
                           const struct attn_shape *s, int t, int h)
{
    attention_one(out, q, k_cache, v_cache, KV_F16, b, s, t, h);
}

void ref_attention_one_q8(float *out, const float *q, const uint8_t *k_cache,
                          const uint8_t *v_cache, const struct attn_batch *b,
                          const struct attn_shape *s, int t, int h)
{
    attention_one(out, q, k_cache, v_cache, KV_Q8, b, s, t, h);
}

void ref_silu_mul(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ref_gelu_mul(float *g, const float *u, size_t n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

void ref_scale(float *x, float s, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void ref_softcap(float *x, float cap, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void ref_moe_combine(float *out, const float *y, const int32_t *rows, const float *w, int n, int k,
                     int dim)
{
    for (int t = 0; t < n; t++)
        for (int d = 0; d < dim; d++) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) {
                float p =
                    w[(size_t)t * (size_t)k + (size_t)j] *
                    y[(size_t)rows[(size_t)t * (size_t)k + (size_t)j] * (size_t)dim + (size_t)d];
                acc += p;
            }
            out[(size_t)t * (size_t)dim + (size_t)d] = acc;
        }
}

/* round half to even for |v| < 2^22, in the default rounding mode, without libm */
static int32_t round_even(float v)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (int32_t)((v + magic) - magic);
}

void ref_quantize_q8(const float *x, int64_t cols, int8_t *q, float *d, float *s, int32_t *sum)
{
    for (int64_t b = 0; b < cols / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f;
        float id = db > 0 ? 1.0f / db : 0.0f;
        int32_t acc = 0;
        for (int j = 0; j < QK; j++) {
            int32_t v = round_even(xb[j] * id);
            q[b * QK + j] = (int8_t)v;
            acc += v;
        }
        d[b] = db;
        sum[b] = acc;
        s[b] = db * (float)acc;
    }
}

bool ref_q8_type(enum qtype t)
{
    return t == QTYPE_Q8_0 || t == QTYPE_Q4_0 || t == QTYPE_Q4_1;
}

float ref_dot_q8(enum qtype t, const void *row, const struct q8act *a, int token)
{
    const int8_t *q = a->q + (size_t)token * (size_t)a->cols;
    const float *d = a->d + (size_t)token * (size_t)a->nb;
    const float *s = a->s + (size_t)token * (size_t)a->nb;
    float acc = 0;
    for (int64_t b = 0; b < a->nb; b++) {
        const int8_t *qb = q + b * QK;
        int32_t isum = 0;
        switch (t) {
        case QTYPE_Q8_0: {
            const struct block_q8_0 *w = (const struct block_q8_0 *)row + b;
            for (int j = 0; j < QK; j++) isum += (int32_t)w->qs[j] * qb[j];
            acc = fmaf(fp16_to_f32(w->d) * d[b], (float)isum, acc);
            break;
        }
        case QTYPE_Q4_0: {
            const struct block_q4_0 *w = (const struct block_q4_0 *)row + b;
            for (int j = 0; j < QK / 2; j++)
                isum += ((w->qs[j] & 0x0f) - 8) * qb[j] + ((w->qs[j] >> 4) - 8) * qb[j + QK / 2];
            acc = fmaf(fp16_to_f32(w->d) * d[b], (float)isum, acc);
            break;
        }
        case QTYPE_Q4_1: {
            const struct block_q4_1 *w = (const struct block_q4_1 *)row + b;
            for (int j = 0; j < QK / 2; j++)
                isum += (w->qs[j] & 0x0f) * qb[j] + (w->qs[j] >> 4) * qb[j + QK / 2];
            acc = fmaf(fp16_to_f32(w->d) * d[b], (float)isum, acc);
            acc = fmaf(fp16_to_f32(w->m), s[b], acc);
            break;
        }
        default:
            return NAN; /* not a Q8-path type: the caller checks ref_q8_type */
        }
    }
    return acc;
}

void ref_matmul_q8_rows(const struct bweight *w, const struct q8act *a, int n, float *y, int64_t r0,
                        int64_t r1)
{
    size_t rb = qtype_row_bytes(w->type, (size_t)w->cols);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->host + (size_t)r * rb;
        for (int i = 0; i < n; i++)
            y[(size_t)i * (size_t)w->rows + (size_t)r] = ref_dot_q8(w->type, row, a, i);
    }
}
