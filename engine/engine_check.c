/* The engine's own invariants between steps (engine_opts.check_invariants, for tests): what the
 * pool holds is exactly what the sequences and the spare blocks reference, every running
 * sequence holds the blocks its computed tokens need and no more, and every block keyed as a
 * cached prefix holds computed tokens of its sequence. A rejected draft that leaked into the
 * cache or kept a block would break one of these. */
#include <stdio.h>
#include <stdlib.h>

#include "engine_impl.h"

static int check_seq(const struct engine *e, const struct seq *s, struct qerr *err)
{
    int bs = e->o.kv_block_size;
    int need = (s->n_computed + bs - 1) / bs;
    if (s->n_blocks != need)
        return qerr_set(err, QERR_INVALID,
                        "request %llu: %d blocks for %d computed tokens (needs %d)",
                        (unsigned long long)s->id, s->n_blocks, s->n_computed, need);
    if (s->n_computed >= s->n_tokens)
        return qerr_set(err, QERR_INVALID, "request %llu: %d of %d tokens computed",
                        (unsigned long long)s->id, s->n_computed, s->n_tokens);
    /* the draft model's K/V never run ahead of the blocks the sequence keeps */
    if (s->draft_computed < 0 || s->draft_computed > s->n_computed)
        return qerr_set(err, QERR_INVALID,
                        "request %llu: draft model K/V for %d positions, %d computed",
                        (unsigned long long)s->id, s->draft_computed, s->n_computed);
    uint64_t chain = seq_root_key(s);
    for (int j = 0; j < s->n_blocks; j++) {
        bool full = (j + 1) * bs <= s->n_computed;
        if (full) chain = kv_block_key(chain, s->tokens + (size_t)j * (size_t)bs, bs);
        uint64_t key;
        if (!kv_block_cached(e->pool, s->blocks[j], &key)) continue;
        if (!full || key != chain)
            return qerr_set(err, QERR_INVALID,
                            "request %llu: block %d (#%d) is cached with a key that is not its "
                            "computed prefix's",
                            (unsigned long long)s->id, s->blocks[j], j);
    }
    return 0;
}

int engine_check(const struct engine *e, struct qerr *err)
{
    int rc = kv_pool_check(e->pool, err);
    if (rc) return rc;
    int nb = kv_pool_blocks(e->pool);
    int *refs = calloc((size_t)nb, sizeof *refs);
    if (!refs) return qerr_set(err, QERR_NOMEM, "engine check: out of memory");
    for (int i = 0; i < e->n_running && !rc; i++) {
        const struct seq *s = e->running[i], *prev = i ? e->running[i - 1] : NULL;
        rc = check_seq(e, s, err);
        if (!rc && prev &&
            (prev->priority > s->priority ||
             (prev->priority == s->priority && prev->order > s->order)))
            rc = qerr_set(err, QERR_INVALID,
                          "running request %llu (priority %d) after %llu (priority %d)",
                          (unsigned long long)s->id, s->priority, (unsigned long long)prev->id,
                          prev->priority);
        for (int j = 0; j < s->n_blocks; j++) refs[s->blocks[j]]++;
    }
    for (int i = 0; i < e->n_waiting && !rc; i++) {
        const struct seq *w = e->waiting[i], *prev = i ? e->waiting[i - 1] : NULL;
        if (w->n_blocks != 0)
            rc = qerr_set(err, QERR_INVALID, "waiting request %llu holds %d blocks",
                          (unsigned long long)w->id, w->n_blocks);
        else if (prev && (prev->priority > w->priority ||
                          (prev->priority == w->priority && prev->id > w->id)))
            rc = qerr_set(err, QERR_INVALID,
                          "waiting request %llu (priority %d) queued after %llu (priority %d)",
                          (unsigned long long)w->id, w->priority, (unsigned long long)prev->id,
                          prev->priority);
    }
    for (int i = 0; i < e->n_spare; i++) refs[e->spare[i]]++;
    for (int b = 0; b < nb && !rc; b++)
        if (refs[b] != kv_block_ref(e->pool, b))
            rc = qerr_set(err, QERR_INVALID, "block %d: ref %d, but %d holders", b,
                          kv_block_ref(e->pool, b), refs[b]);
    for (int i = 0; i < e->n_spare && !rc; i++) {
        uint64_t key;
        if (kv_block_cached(e->pool, e->spare[i], &key))
            rc = qerr_set(err, QERR_INVALID, "spare block %d is cached", e->spare[i]);
    }
    free(refs);
    return rc;
}
