#include "attn_part.h"

#include <math.h>
#include <string.h>

void attn_fold(float *M, float *L, float *O, float m, float l, const float *acc, int head_dim,
               int first)
{
    if (first) {
        *M = m;
        *L = l;
        memcpy(O, acc, (size_t)head_dim * sizeof *O);
        return;
    }
    float mn = m > *M ? m : *M;
    float a = expf(*M - mn), b = expf(m - mn);
    float la = *L * a, lb = l * b;
    *L = la + lb;
    for (int i = 0; i < head_dim; i++) {
        float oa = O[i] * a, ob = acc[i] * b;
        O[i] = oa + ob;
    }
    *M = mn;
}

void attn_finish(float *out, const float *O, float L, int head_dim)
{
    for (int i = 0; i < head_dim; i++) out[i] = O[i] / L;
}

void attn_parts_combine(const struct attn_parts *pp, const struct attn_batch *b,
                        const struct attn_shape *s, int t0, int t1, float *out)
{
    int hd = s->head_dim;
    float O[512];
    for (int t = t0; t < t1; t++) {
        int np = attn_part_count(b->pos[t] + 1), p0 = attn_first_key(b, b->pos[t]) / ATTN_PART;
        for (int h = 0; h < s->n_heads; h++) {
            float *o = out + ((size_t)t * (size_t)s->n_heads + (size_t)h) * (size_t)hd;
            float M = 0, L = 0;
            for (int p = p0; p < np; p++) {
                const float *r = attn_part_rec(pp, t * s->n_heads + h, hd, p);
                if (np - p0 == 1) {
                    attn_finish(o, r + 2, r[1], hd);
                    break;
                }
                attn_fold(&M, &L, O, r[0], r[1], r + 2, hd, p == p0);
            }
            if (np - p0 > 1) attn_finish(o, O, L, hd);
        }
    }
}
