/* The scheduler. DESIGN: one step = one forward over a ragged batch built in three passes under
 * the token budget (max_batch_tokens) and the sequence cap (max_seqs):
 *   A. every running sequence with one token to compute (a decode), oldest first, but those
 *      whose reader has max_unread events unread (paused: back-pressure, see engine.h);
 *   B. running sequences part-way through their prompt get the next chunk, oldest first;
 *   C. waiting sequences are admitted first come, first served, reusing cached prefix blocks,
 *      while blocks remain beyond a reserve of one per running sequence (so admitting never
 *      starves the decodes of the next step).
 * When A or B cannot get a block, the newest running sequence not yet in this step is
 * preempted: its blocks are released (cached prefix blocks stay findable) and it returns to
 * the front of the waiting queue with its generated tokens, to be recomputed later. Where the
 * kernels are batch-invariant (the CPU; CUDA with --batch-invariant) the recomputed K/V and
 * logits are bit-identical to the first run; CUDA's GEMM for 128+ token batches may differ in
 * the last bits, which changes no token already sent (they are replayed, not resampled). */
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

int sched_plan_init(struct step_plan *p, const struct engine_opts *o, struct qerr *err)
{
    memset(p, 0, sizeof *p);
    size_t T = (size_t)o->max_batch_tokens, S = (size_t)o->max_seqs;
    size_t L = S + (size_t)o->prompt_logprob_rows;
    p->tokens = malloc(T * sizeof *p->tokens);
    p->pos = malloc(T * sizeof *p->pos);
    p->seq_idx = malloc(T * sizeof *p->seq_idx);
    p->slot = malloc(T * sizeof *p->slot);
    p->seqs = malloc(S * sizeof *p->seqs);
    p->chunk = malloc(S * sizeof *p->chunk);
    p->wants_logits = malloc(S * sizeof *p->wants_logits);
    p->logit_idx = malloc(L * sizeof *p->logit_idx);
    p->logit_row = malloc(S * sizeof *p->logit_row);
    p->n_plp = malloc(S * sizeof *p->n_plp);
    p->start = malloc(S * sizeof *p->start);
    p->hidden_idx = malloc(T * sizeof *p->hidden_idx);
    p->hidden_row = malloc(S * sizeof *p->hidden_row);
    p->n_hid = malloc(S * sizeof *p->n_hid);
    if (!p->tokens || !p->pos || !p->seq_idx || !p->slot || !p->seqs || !p->chunk ||
        !p->wants_logits || !p->logit_idx || !p->logit_row || !p->n_plp || !p->start ||
        !p->hidden_idx || !p->hidden_row || !p->n_hid) {
        sched_plan_free(p);
        return qerr_set(err, QERR_NOMEM, "scheduler: out of memory");
    }
    return 0;
}

void sched_plan_free(struct step_plan *p)
{
    free(p->tokens);
    free(p->pos);
    free(p->seq_idx);
    free(p->slot);
    free(p->seqs);
    free(p->chunk);
    free(p->wants_logits);
    free(p->logit_idx);
    free(p->logit_row);
    free(p->n_plp);
    free(p->start);
    free(p->hidden_idx);
    free(p->hidden_row);
    free(p->n_hid);
    free(p->table);
    memset(p, 0, sizeof *p);
}

void sched_release_blocks(struct engine *e, struct seq *s)
{
    for (int i = 0; i < s->n_blocks; i++) kv_block_release(e->pool, s->blocks[i]);
    s->n_blocks = 0;
    s->n_computed = 0;
    s->n_keyed = 0;
    s->last_key = 0;
}

static bool push_block(struct seq *s, int b)
{
    if (s->n_blocks == s->cap_blocks) {
        int cap = s->cap_blocks ? s->cap_blocks * 2 : 8;
        int *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return false;
        s->blocks = nb;
        s->cap_blocks = cap;
    }
    s->blocks[s->n_blocks++] = b;
    return true;
}

/* Gives s blocks for its first upto tokens; false (having taken none) when the pool is short. */
static bool grow_blocks(struct engine *e, struct seq *s, int upto)
{
    int bs = e->o.kv_block_size;
    int need = (upto + bs - 1) / bs - s->n_blocks;
    if (need <= 0) return true;
    if (need > kv_pool_free_count(e->pool)) return false;
    for (int i = 0; i < need; i++) {
        int b = kv_block_alloc(e->pool);
        if (b < 0 || !push_block(s, b)) {
            if (b >= 0) kv_block_release(e->pool, b);
            return false;
        }
    }
    return true;
}

static bool in_plan(const struct step_plan *p, const struct seq *s)
{
    for (int i = 0; i < p->n_seqs; i++)
        if (p->seqs[i] == s) return true;
    return false;
}

static void waiting_push_front(struct engine *e, struct seq *s)
{
    /* capacity was reserved at submit for every sequence that can be waiting or running */
    memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
    e->waiting[0] = s;
    e->n_waiting++;
}

/* Preempts the newest running sequence not in the plan; returns it, or NULL if none. */
static struct seq *preempt_newest(struct engine *e)
{
    for (int i = e->n_running - 1; i >= 0; i--) {
        struct seq *v = e->running[i];
        if (in_plan(&e->plan, v)) continue;
        memmove(e->running + i, e->running + i + 1,
                (size_t)(e->n_running - i - 1) * sizeof *e->running);
        e->n_running--;
        sched_release_blocks(e, v);
        waiting_push_front(e, v);
        e->local.preemptions++;
        return v;
    }
    return NULL;
}

static bool ensure_table(struct step_plan *p, int n_seqs, int max_blocks)
{
    int need = n_seqs * max_blocks;
    if (need <= p->table_cap) return true;
    int32_t *t = realloc(p->table, (size_t)need * sizeof *t);
    if (!t) return false;
    p->table = t;
    p->table_cap = need;
    return true;
}

static void add_chunk(struct engine *e, struct seq *s, int n)
{
    struct step_plan *p = &e->plan;
    int bs = e->o.kv_block_size, idx = p->n_seqs++, first = p->n_tokens;
    p->seqs[idx] = s;
    p->chunk[idx] = n;
    p->start[idx] = s->n_computed;
    for (int i = 0; i < n; i++) {
        int pos = s->n_computed + i, t = p->n_tokens++;
        p->tokens[t] = s->tokens[pos];
        p->pos[t] = pos;
        p->seq_idx[t] = idx;
        p->slot[t] = s->blocks[pos / bs] * bs + pos % bs;
    }
    /* prompt-logprob rows: consecutive positions from lo (see seq_plp_rows) */
    int lo = 0;
    p->logit_row[idx] = p->n_logits;
    p->n_plp[idx] = seq_plp_rows(s, s->n_computed, n, &lo);
    for (int i = 0; i < p->n_plp[idx]; i++)
        p->logit_idx[p->n_logits++] = first + lo - s->n_computed + i;
    p->hidden_row[idx] = p->n_hidden;
    p->n_hid[idx] = seq_hidden_rows(s, s->n_computed, n, first, p->hidden_idx + p->n_hidden);
    p->n_hidden += p->n_hid[idx];
    /* a pooled sequence samples nothing */
    p->wants_logits[idx] = s->n_computed + n == s->n_tokens && s->pooling == ENGINE_POOL_NONE;
    if (p->wants_logits[idx]) p->logit_idx[p->n_logits++] = p->n_tokens - 1;
}

/* n cut so that s's prompt-logprob rows fit the step's logits rows, keeping one row for every
 * sequence that may still join the step; 0: none fit now. */
static int chunk_fit_logits(const struct engine *e, const struct seq *s, int n)
{
    if (!s->prompt_logprobs || s->plp_next >= s->n_prompt) return n;
    const struct step_plan *p = &e->plan;
    int room = e->max_logits - p->n_logits - (e->o.max_seqs - p->n_seqs - 1) - 1, lo;
    if (seq_plp_rows(s, s->n_computed, n, &lo) > room) n = room > 0 ? room : 0;
    return n;
}

/* Reuses cached blocks for the longest cached prefix of s, leaving at least one token to compute
 * (its logits are needed). */
static void take_cached_prefix(struct engine *e, struct seq *s)
{
    if (!e->o.prefix_cache || seq_needs_prompt(s)) return;
    int bs = e->o.kv_block_size;
    int full = (s->n_tokens - 1) / bs;
    for (int i = 0; i < full; i++) {
        int b = kv_prefix_lookup(e->pool, s->last_key, s->tokens + (size_t)i * (size_t)bs);
        if (b < 0) break;
        if (!push_block(s, b)) {
            kv_block_release(e->pool, b);
            break;
        }
        s->last_key = kv_block_key(s->last_key, s->tokens + (size_t)i * (size_t)bs, bs);
        s->n_keyed++;
        s->n_computed += bs;
    }
    s->cached_tokens = s->n_computed;
}

int sched_step_plan(struct engine *e)
{
    struct step_plan *p = &e->plan;
    p->n_tokens = p->n_seqs = p->n_logits = p->n_hidden = 0;
    int budget = e->o.max_batch_tokens;

    /* A then B: running sequences, decodes before prefill chunks */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < e->n_running && budget > 0; i++) {
            struct seq *s = e->running[i];
            int todo = s->n_tokens - s->n_computed;
            if ((pass == 0) != (todo == 1) || in_plan(p, s)) continue;
            if (todo == 1 && s->paused_since > 0) continue; /* its reader is behind */
            int n = chunk_fit_logits(e, s, todo < budget ? todo : budget);
            if (n == 0) continue;
            while (!grow_blocks(e, s, s->n_computed + n)) {
                struct seq *v = preempt_newest(e);
                if (!v || v == s) {
                    n = 0;
                    break;
                }
            }
            if (n == 0) {
                /* s itself was the newest: it went back to waiting; the array shifted */
                if (i < e->n_running && e->running[i] != s) i--;
                continue;
            }
            add_chunk(e, s, n);
            budget -= n;
        }
    }

    /* C: admissions, first come first served */
    while (e->n_waiting > 0 && budget > 0 && e->n_running < e->o.max_seqs) {
        struct seq *s = e->waiting[0];
        if (s->n_blocks == 0) take_cached_prefix(e, s);
        int todo = s->n_tokens - s->n_computed;
        int n = chunk_fit_logits(e, s, todo < budget ? todo : budget);
        if (n == 0) break;
        int bs = e->o.kv_block_size;
        int need = (s->n_computed + n + bs - 1) / bs - s->n_blocks;
        if (need > kv_pool_free_count(e->pool) - e->n_running ||
            !grow_blocks(e, s, s->n_computed + n)) {
            /* not now: give back the prefix blocks so they do not pin the pool while waiting */
            sched_release_blocks(e, s);
            s->cached_tokens = 0;
            break;
        }
        memmove(e->waiting, e->waiting + 1, (size_t)(e->n_waiting - 1) * sizeof *e->waiting);
        e->n_waiting--;
        s->order = e->next_order++;
        if (e->o.prefix_cache) {
            e->local.prefix_lookups += (uint64_t)s->n_tokens;
            e->local.prefix_hit_tokens += (uint64_t)s->n_computed;
        }
        s->t_admit = engine_now();
        e->running[e->n_running++] = s;
        add_chunk(e, s, n);
        budget -= n;
    }

    /* block table of the step's sequences */
    int maxb = 1;
    for (int i = 0; i < p->n_seqs; i++)
        if (p->seqs[i]->n_blocks > maxb) maxb = p->seqs[i]->n_blocks;
    if (!ensure_table(p, p->n_seqs, maxb)) return -1;
    p->max_blocks = maxb;
    for (int i = 0; i < p->n_seqs; i++) {
        int32_t *row = p->table + (size_t)i * (size_t)maxb;
        for (int j = 0; j < maxb; j++)
            row[j] = j < p->seqs[i]->n_blocks ? p->seqs[i]->blocks[j] : -1;
    }
    return p->n_tokens;
}

void sched_commit(struct engine *e)
{
    struct step_plan *p = &e->plan;
    int bs = e->o.kv_block_size;
    for (int i = 0; i < p->n_seqs; i++) {
        struct seq *s = p->seqs[i];
        s->n_computed += p->chunk[i];
        if (!e->o.prefix_cache) continue;
        while ((s->n_keyed + 1) * bs <= s->n_computed) {
            s->last_key = kv_prefix_insert(e->pool, s->blocks[s->n_keyed], s->last_key,
                                           s->tokens + (size_t)s->n_keyed * (size_t)bs);
            s->n_keyed++;
        }
    }
}
