/* model_tp: a model split over tensor-parallel ranks, behind the one-model API of model.h.
 *
 * model_load with opts->tp > 1 loads one shard per rank (engine/model_shard.h) on that rank's
 * backend and starts a host thread for each rank but 0. model_forward then hands the same
 * batch to every rank and runs rank 0 on the caller's thread; each rank computes its heads and
 * FFN channels and meets the others in two all-reduces per layer; rank 0 alone computes the
 * logits. A rank that fails aborts the communicator, so every rank returns and the forward
 * reports the first failure. The handle model_load returns is rank 0's.
 *
 * This header is the model module's internal seam between model.c (one rank) and model_tp.c
 * (the group); nothing outside engine/model*.c includes it. */
#ifndef QUERN_MODEL_TP_H
#define QUERN_MODEL_TP_H

#include "model.h"
#include "model_shard.h"

struct tp_group;

/* model.c: one rank (sh NULL and comm NULL: the whole model). */
int model_load_rank(const struct gguf_file *f, struct backend *be, const struct model_opts *opts,
                    const struct model_shard *sh, struct comm *comm, struct model **out,
                    struct qerr *err);
/* The batch is already checked; ranks other than 0 leave logits alone (it may be NULL). */
int model_forward_rank(struct model *m, const struct model_batch *b, float *logits,
                       struct qerr *err);
void model_free_rank(struct model *m);
void model_set_tp_group(struct model *m, struct tp_group *g);

/* model_tp.c: the group. */
int model_tp_load(const struct gguf_file *f, struct backend *be, const struct model_opts *opts,
                  struct model **out, struct qerr *err);
int model_tp_forward(struct tp_group *g, const struct model_batch *b, float *logits,
                     struct qerr *err);
/* model_weight_bytes of ranks 1.. (rank 0 counts its own). */
double model_tp_weight_bytes(const struct tp_group *g);
/* Stops the rank threads and frees every rank's model but rank 0's. */
void model_tp_free(struct tp_group *g);

#endif
