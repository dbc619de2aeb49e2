/* model_shard: which part of a Llama model each tensor-parallel rank holds (Megatron split).
 *
 * Q/K/V and gate/up are split by output rows (column-parallel) at head boundaries and at
 * 32-element quant-block boundaries of the FFN; attention output and down are split by input
 * columns (row-parallel) the same way, so each rank's partial sums add up (one all-reduce after
 * each, two per layer). A query head stays on the rank of its KV head:
 *   - n_ranks <= KV heads: KV heads split as evenly as possible (the first ranks get one more),
 *     each with its query heads: 9 q / 3 kv over 2 ranks is 6+3 q heads, 2+1 KV heads;
 *   - n_ranks > KV heads: every rank holds one KV head, replicated on the ranks that share it
 *     (as vLLM does), which split that head's query heads between them; impossible when a rank
 *     would get no query head.
 * Embedding, norms and the output matrix are not split (every rank embeds and keeps the residual
 * stream whole; rank 0 alone computes logits). */
#ifndef QUERN_MODEL_SHARD_H
#define QUERN_MODEL_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "model.h"

struct model_shard {
    int rank, n_ranks;
    int q0, nq;   /* query heads [q0, q0 + nq) */
    int kv0, nkv; /* KV heads [kv0, kv0 + nkv) */
    int f0, nf;   /* FFN channels [f0, f0 + nf) (each expert's, in a mixture) */
    int s0, ns;   /* a mixture's shared expert's channels [s0, s0 + ns) */
};

/* The whole model (one rank). */
void model_shard_whole(const struct model_config *c, struct model_shard *s);

/* Rank `rank` of n_ranks; QERR_INVALID naming the limit when n_ranks cannot split c. */
int model_shard_plan(const struct model_config *c, int n_ranks, int rank, struct model_shard *s,
                     struct qerr *err);

/* What one rank holds of a file's model: weight bytes (the file's blocks of its shards, the
 * replicated embedding, output and norms included) and KV bytes per token (elements of
 * elem_bytes). */
int model_shard_bytes(const struct gguf_file *f, const struct model_config *c,
                      const struct model_shard *s, size_t elem_bytes, uint64_t *weight_bytes,
                      size_t *kv_bytes_per_token, struct qerr *err);

/* KV bytes per token on the rank holding the most KV heads (n_ranks <= 1, or a split that is
 * impossible: the whole model's, as model_kv_bytes_per_token): what sizes a per-rank pool. */
size_t model_shard_kv_bytes_max(const struct model_config *c, int n_ranks, size_t elem_bytes);

#endif
