/* bench_decode: batched decode steps through model_forward (bench_decode.h). */
#include "bench_decode.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/backend_profile.h"

#define BENCH_BS 16 /* KV block size, the engine's default */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int blocks_per_seq(int ctx, int steps)
{
    return (ctx + 2 + steps + BENCH_BS - 1) / BENCH_BS; /* ctx, 2 warm-ups, the timed steps */
}

void bench_decode_model_opts(int max_batch, int ctx, int steps, struct model_opts *mo)
{
    *mo = (struct model_opts){.max_batch_tokens = ctx > max_batch ? ctx : max_batch,
                              .max_logits = max_batch,
                              .kv_blocks = max_batch * blocks_per_seq(ctx, steps),
                              .kv_block_size = BENCH_BS};
}

int bench_decode_run(struct model *m, struct backend *be, double weight_bytes, int batch, int ctx,
                     int steps, uint64_t seed, struct backend *prof, struct decode_bench *out,
                     struct qerr *err)
{
    const struct model_opts *mo = model_get_opts(m);
    const struct model_config *cfg = model_get_config(m);
    const int bps = blocks_per_seq(ctx, steps);
    if (batch < 1 || ctx < 1 || steps < 1 || batch > mo->max_logits || ctx > mo->max_batch_tokens ||
        batch * bps > mo->kv_blocks || mo->kv_block_size != BENCH_BS)
        return qerr_set(err, QERR_INVALID,
                        "bench decode: batch %d, context %d, %d steps do not fit the model's "
                        "options (%d logits, %d tokens, %d blocks of %d)",
                        batch, ctx, steps, mo->max_logits, mo->max_batch_tokens, mo->kv_blocks,
                        mo->kv_block_size);
    int n = ctx > batch ? ctx : batch;
    int32_t *tok = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    int32_t *slot = malloc((size_t)n * 4), *idx = malloc((size_t)n * 4);
    int32_t *table = malloc((size_t)batch * (size_t)bps * 4);
    float *logits = malloc((size_t)batch * (size_t)cfg->vocab * sizeof(float));
    int rc = 0;
    if (!tok || !pos || !seq || !slot || !idx || !table || !logits) {
        rc = qerr_set(err, QERR_NOMEM, "bench decode: out of memory");
        goto out;
    }
    for (int i = 0; i < batch * bps; i++) table[i] = i; /* sequence b: blocks b*bps .. */
    uint64_t x = seed | 1;
    /* prefill: one forward per sequence, its own table row as a one-sequence batch */
    double t0 = now_s();
    for (int b = 0; b < batch && !rc; b++) {
        for (int i = 0; i < ctx; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            tok[i] = (int32_t)(x % (uint64_t)cfg->vocab);
            pos[i] = i;
            seq[i] = 0;
            slot[i] = (b * bps + i / BENCH_BS) * BENCH_BS + i % BENCH_BS;
        }
        idx[0] = ctx - 1;
        struct model_batch mb = {.n_tokens = ctx,
                                 .tokens = tok,
                                 .pos = pos,
                                 .seq = seq,
                                 .slot = slot,
                                 .n_seqs = 1,
                                 .max_blocks = bps,
                                 .block_table = table + (size_t)b * (size_t)bps,
                                 .n_logits = 1,
                                 .logit_idx = idx};
        rc = model_forward(m, &mb, logits, err);
    }
    double prefill = now_s() - t0;
    /* decode: two warm-up steps (they capture the step where the backend replays), then timed */
    double t_dec = 0;
    for (int s = -2; s < steps && !rc; s++) {
        if (s == 0) {
            if (prof) backend_profile_reset(prof);
            t_dec = now_s();
        }
        for (int b = 0; b < batch; b++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            tok[b] = (int32_t)(x % (uint64_t)cfg->vocab);
            pos[b] = ctx + 2 + s; /* the warm-ups write positions ctx and ctx + 1 */
            seq[b] = b;
            slot[b] = (b * bps + pos[b] / BENCH_BS) * BENCH_BS + pos[b] % BENCH_BS;
            idx[b] = b;
        }
        struct model_batch mb = {.n_tokens = batch,
                                 .tokens = tok,
                                 .pos = pos,
                                 .seq = seq,
                                 .slot = slot,
                                 .n_seqs = batch,
                                 .max_blocks = bps,
                                 .block_table = table,
                                 .n_logits = batch,
                                 .logit_idx = idx};
        rc = model_forward(m, &mb, logits, err);
    }
    if (!rc) {
        double kv = (double)backend_kv_bytes(be, model_kv_bytes_per_token(cfg, 1));
        /* keys a token reads, averaged over the layers: a local layer's window at most */
        double keys = ctx + 2.0 + steps / 2.0, layer_keys = 0;
        for (int l = 0; l < cfg->n_layers; l++)
            layer_keys += model_layer_local(cfg, l) ? fmin(keys, cfg->swa_window) : keys;
        *out = (struct decode_bench){.batch = batch,
                                     .ctx = ctx,
                                     .steps = steps,
                                     .step_s = (now_s() - t_dec) / steps,
                                     .prefill_s = prefill,
                                     .read_bytes = weight_bytes +
                                                   kv * (double)batch * layer_keys / cfg->n_layers};
    }
out:
    free(tok);
    free(pos);
    free(seq);
    free(slot);
    free(idx);
    free(table);
    free(logits);
    return rc;
}
