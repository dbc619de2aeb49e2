/* The scheduler. DESIGN: one step = one forward over a ragged batch built in three passes under
 * the token budget (max_batch_tokens) and the sequence cap (max_seqs):
 *   A. every running sequence with one token to compute (a decode), oldest first (by priority
 *      first, see C), but those whose reader has max_unread events unread (paused:
 *      back-pressure, see engine.h);
 *   B. running sequences part-way through their prompt get the next chunk, in the same order;
 *   C. waiting sequences are admitted in order of their priority (gen_request.priority, vLLM's:
 *      lower first), first come, first served among equals, reusing cached prefix blocks,
 *      while blocks remain beyond a reserve of one per running sequence (so admitting never
 *      starves the decodes of the next step); the queue's head is never skipped.
 * When A or B cannot get a block, the last running sequence not yet in this step is preempted
 * (the highest priority value, the newest among those, as vLLM's priority policy): its blocks are
 * released (cached prefix blocks stay findable) and it returns to the waiting queue ahead of
 * every later submission of its priority, with its generated tokens, to be recomputed later. Where
 * the kernels are batch-invariant (the CPU; CUDA with --batch-invariant) the recomputed K/V and
 * logits are bit-identical to the first run; CUDA's GEMM for 128+ token batches may differ in
 * the last bits, which changes no token already sent (they are replayed, not resampled).
 *
 * Speculation (engine_opts.spec) adds pass D: a sequence whose chunk ends at its last token may
 * append a draft of guessed tokens after it, with the budget A, B and C left, and only while
 * the step has fewer than spec_step_tokens tokens (a full step drafts nothing: the budget
 * serves other sequences first, and past a few tokens a CPU step costs about its size); within
 * that, how many tokens a sequence drafts is the policy's (engine_opts.spec_policy: by default
 * spec_policy.h, measured step and draft costs against its acceptance, weighed against the step
 * as built so far, no draft at all where none pays). Draft tokens are not part of the
 * sequence until the engine has verified them (sched_spec_settle); positions past the
 * sequence's own blocks go to one of the engine's spare blocks, so a rejected draft never takes
 * a block from the pool, and never evicts or registers a cached prefix.
 * With a draft model (SPEC_DRAFT) pass D first lays out each draft's positions and slots, then
 * runs the draft model once for all of them (spec_model.h), writing its guesses into the
 * batch; the draft's K/V use the same blocks and spares, so the rollback is the same. */
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

int sched_plan_init(struct step_plan *p, const struct engine_opts *o, struct qerr *err)
{
    memset(p, 0, sizeof *p);
    size_t T = (size_t)o->max_batch_tokens, S = (size_t)o->max_seqs;
    size_t L = (size_t)sched_logit_rows(o);
    p->tokens = malloc(T * sizeof *p->tokens);
    p->pos = malloc(T * sizeof *p->pos);
    p->seq_idx = malloc(T * sizeof *p->seq_idx);
    p->slot = malloc(T * sizeof *p->slot);
    p->seqs = malloc(S * sizeof *p->seqs);
    p->seq_lora = malloc(S * sizeof *p->seq_lora);
    p->chunk = malloc(S * sizeof *p->chunk);
    p->wants_logits = malloc(S * sizeof *p->wants_logits);
    p->logit_idx = malloc(L * sizeof *p->logit_idx);
    p->logit_row = malloc(S * sizeof *p->logit_row);
    p->n_plp = malloc(S * sizeof *p->n_plp);
    p->start = malloc(S * sizeof *p->start);
    p->hidden_idx = malloc(T * sizeof *p->hidden_idx);
    p->hidden_row = malloc(S * sizeof *p->hidden_row);
    p->n_hid = malloc(S * sizeof *p->n_hid);
    p->n_draft = calloc(S, sizeof *p->n_draft);
    p->draft_at = malloc(S * sizeof *p->draft_at);
    p->draft_row = malloc(S * sizeof *p->draft_row);
    p->ext_block = malloc(S * sizeof *p->ext_block);
    p->copies = malloc(S * sizeof *p->copies);
    if (!p->tokens || !p->pos || !p->seq_idx || !p->slot || !p->seqs || !p->chunk ||
        !p->wants_logits || !p->logit_idx || !p->logit_row || !p->n_plp || !p->start ||
        !p->hidden_idx || !p->hidden_row || !p->n_hid || !p->n_draft || !p->draft_at ||
        !p->draft_row || !p->ext_block || !p->copies) {
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
    free(p->seq_lora);
    free(p->wants_logits);
    free(p->logit_idx);
    free(p->logit_row);
    free(p->n_plp);
    free(p->start);
    free(p->hidden_idx);
    free(p->hidden_row);
    free(p->n_hid);
    free(p->n_draft);
    free(p->draft_at);
    free(p->draft_row);
    free(p->ext_block);
    free(p->copies);
    free(p->table);
    memset(p, 0, sizeof *p);
}

void sched_release_blocks(struct engine *e, struct seq *s)
{
    for (int i = 0; i < s->n_blocks; i++) kv_block_release(e->pool, s->blocks[i]);
    s->n_blocks = 0;
    s->n_computed = 0;
    s->n_keyed = 0;
    s->last_key = seq_root_key(s);
    s->draft_computed = 0;
    if (s->copy_len > 0) kv_block_release(e->pool, s->copy_src);
    s->copy_len = 0;
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

void sched_waiting_insert(struct engine *e, struct seq *s)
{
    /* a preempted sequence was submitted before every waiting one of its priority (admission
     * takes them in order), so with one priority this is the queue's front, as it always was */
    int at = e->n_waiting;
    while (at > 0 &&
           (e->waiting[at - 1]->priority > s->priority ||
            (e->waiting[at - 1]->priority == s->priority && e->waiting[at - 1]->id > s->id)))
        at--;
    memmove(e->waiting + at + 1, e->waiting + at, (size_t)(e->n_waiting - at) * sizeof *e->waiting);
    e->waiting[at] = s;
    e->n_waiting++;
}

/* Adds a newly admitted s to the running sequences, kept in order of priority, then admission:
 * passes A and B plan them in that order, so a sequence that needs a block finds every one
 * planned before it of a lower or equal priority value, and the victim (preempt_last) of a
 * higher or equal one. */
static void running_insert(struct engine *e, struct seq *s)
{
    int at = e->n_running;
    while (at > 0 && e->running[at - 1]->priority > s->priority) at--;
    memmove(e->running + at + 1, e->running + at, (size_t)(e->n_running - at) * sizeof *e->running);
    e->running[at] = s;
    e->n_running++;
}

/* Preempts the last running sequence not in the plan (the highest priority value, the newest
 * of those: vLLM's priority policy); returns it, or NULL if none. */
static struct seq *preempt_last(struct engine *e)
{
    for (int i = e->n_running - 1; i >= 0; i--) {
        struct seq *v = e->running[i];
        if (in_plan(&e->plan, v)) continue;
        memmove(e->running + i, e->running + i + 1,
                (size_t)(e->n_running - i - 1) * sizeof *e->running);
        e->n_running--;
        sched_release_blocks(e, v);
        sched_waiting_insert(e, v);
        v->preemptions++;
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
    p->n_draft[idx] = 0;
    p->ext_block[idx] = -1;
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
    int room = e->logit_rows - p->n_logits - (e->o.max_seqs - p->n_seqs - 1) - 1, lo;
    if (seq_plp_rows(s, s->n_computed, n, &lo) > room) n = room > 0 ? room : 0;
    return n;
}

/* Reuses cached blocks for the longest cached prefix of s, leaving at least one token to compute
 * (its logits are needed). With e->kv_copy, the tokens after the last whole cached block that
 * begin some cached block after it are taken too: a block of s's own gets their K/V copied in
 * the step that admits s (the copy comes before the step's writes, so the source is intact even
 * if this very plan reallocates it). The copied K/V are those s would compute: a position's K/V
 * depend only on the tokens up to it, and the kernels give them the same bits in any batch. */
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
    int rest = s->n_tokens - 1 - s->n_computed, len = 0;
    int src = e->kv_copy && rest > 0
                  ? kv_prefix_lookup_partial(e->pool, s->last_key, s->tokens + s->n_computed,
                                             rest < bs ? rest : bs, &len)
                  : -1;
    if (src >= 0) {
        kv_block_retain(e->pool, src); /* until the copy is in a plan: no one may take it */
        int dst = kv_block_alloc(e->pool);
        if (dst >= 0 && push_block(s, dst)) {
            s->copy_src = src;
            s->copy_len = len;
            s->n_computed += len;
        } else {
            if (dst >= 0) kv_block_release(e->pool, dst);
            kv_block_release(e->pool, src);
        }
    }
    s->cached_tokens = s->n_computed;
}

bool sched_drafts(const struct engine_opts *o)
{
    return o->spec != SPEC_OFF || (o->spec_k >= 1 && o->spec_k <= SPEC_K_MAX);
}

int sched_logit_rows(const struct engine_opts *o)
{
    /* a row per sequence, the prompt logprobs' own (engine_prefill.c) */
    int rows = o->max_seqs + (o->prompt_logprob_rows > 0 ? o->prompt_logprob_rows : 0);
    if (!sched_drafts(o)) return rows;
    /* drafts for up to 16 sequences a step: past that the batch keeps the weights busy anyway */
    int k = o->spec_k < SPEC_K_MAX ? o->spec_k : SPEC_K_MAX;
    int drafting = o->max_seqs < 16 ? o->max_seqs : 16;
    return rows + (k > 0 ? k * drafting : 0);
}

/* Up to k drafted tokens for s (n-gram mode): from its predicted output first, then from the
 * drafter's sources; s->spec_cls gets the draft's class. */
static int seq_ngram_draft(const struct engine *e, struct seq *s, int k, int32_t *draft)
{
    if (s->n_pred > 0) {
        int match,
            n = spec_draft_prediction(&e->drafter, s->pred, s->n_pred, s->tokens + s->n_prompt,
                                      s->n_tokens - s->n_prompt, k, draft, &match);
        if (n > 0) {
            s->spec_cls = spec_match_class(match);
            return n;
        }
    }
    return spec_draft_classed(&e->drafter, s->tokens, s->n_tokens, k, draft, &s->spec_cls);
}

/* Pass D: drafts after the chunks that end at their sequence's last token, oldest first, in
 * the budget left. */
static void plan_drafts(struct engine *e, int budget)
{
    struct step_plan *p = &e->plan;
    int bs = e->o.kv_block_size;
    /* a spare lost to a sequence when the pool was empty is replaced once blocks are free again,
     * keeping one per running sequence for their next decodes (as admission does) */
    while (e->n_spare < e->spare_target && kv_pool_free_count(e->pool) > e->n_running) {
        int b = kv_block_alloc(e->pool);
        if (b < 0) break;
        e->spare[e->n_spare++] = b;
    }
    int n_tokens0 = p->n_tokens, n_logits0 = p->n_logits, n_dm = 0;
    bool by_cost = e->o.spec_policy == SPEC_POLICY_COST;
    /* the cost policy weighs each draft against the step as built so far */
    struct spec_step st = {.n_tokens = p->n_tokens};
    for (int i = 0; i < p->n_seqs; i++) st.out_tokens += p->wants_logits[i];
    /* a step size not timed for a while is timed again, without drafts */
    if (by_cost && spec_cost_stale(&e->spec_cost, p->n_tokens)) return;
    for (int i = 0; i < p->n_seqs && budget > 0; i++) {
        struct seq *s = p->seqs[i];
        if (!s->spec || !p->wants_logits[i]) continue;
        /* (the acceptance policy counts its cooldown down in every step the sequence is in) */
        int k = by_cost ? 0 : spec_state_next_k(&s->spec_st);
        int cap = e->spec_k < budget ? e->spec_k : budget;
        if (cap > e->logit_rows - p->n_logits) cap = e->logit_rows - p->n_logits;
        /* up to k + 1 tokens come out of the step: stay within max_tokens and the context */
        if (cap > s->max_tokens - s->n_generated - 1) cap = s->max_tokens - s->n_generated - 1;
        if (cap > e->ctx_len - s->n_tokens) cap = e->ctx_len - s->n_tokens;
        int32_t draft[SPEC_K_MAX];
        int found = 0;
        /* with a draft model, a sequence whose prediction matches drafts from that instead:
         * its tokens are known now and cost nothing to make */
        if (e->draft && s->n_pred > 0 && cap > 0) {
            found = seq_ngram_draft(e, s, cap, draft);
            if (found > 0 && s->grammar)
                found = seq_grammar_draft(e, s, draft, found, cap, &s->spec_cls);
        }
        bool model = e->draft && found <= 0;
        if (model) s->spec_cls = 0; /* a draft model's guesses form class 0 */
        struct spec_costs sc = {.target = &e->spec_cost,
                                .draft = model ? &e->draft_cost : NULL,
                                .draft_prior = e->draft_prior,
                                .behind = s->n_tokens - 1 - s->draft_computed,
                                .horizon = s->max_tokens - s->n_generated};
        if (by_cost && cap > 0) {
            /* the n-gram draft first: what it rests on says how likely its tokens are kept,
             * and its length bounds k */
            if (!e->draft) {
                found = seq_ngram_draft(e, s, cap, draft);
                if (s->grammar) found = seq_grammar_draft(e, s, draft, found, cap, &s->spec_cls);
                if (found <= 0) continue;
            }
            k = spec_policy_next_k(&s->spec_rate[s->spec_cls], &sc, &st, model ? cap : found);
        }
        if (k > cap) k = cap;
        if (k <= 0) continue;
        /* a draft model always proposes k: it runs below, once the slots are known */
        int nd = k;
        if (!model && !by_cost) {
            if (e->draft) {
                nd = found < k ? found : k; /* the prediction's */
            } else {
                nd = seq_ngram_draft(e, s, k, draft);
                if (s->grammar) nd = seq_grammar_draft(e, s, draft, nd, k, &s->spec_cls);
            }
        }
        int first = s->n_tokens, held = s->n_blocks * bs, ext = -1;
        /* k <= block size: a draft reaches at most one block past the sequence's own */
        if (nd > 0 && first + nd > held) {
            if (e->n_spare > 0)
                ext = e->spare[--e->n_spare];
            else
                nd = held - first;
        }
        if (nd <= 0) continue;
        p->n_draft[i] = nd;
        p->ext_block[i] = ext;
        p->draft_at[i] = p->n_tokens;
        p->draft_row[i] = p->n_logits;
        for (int j = 0; j < nd; j++) {
            int pos = first + j, t = p->n_tokens++;
            int blk = pos / bs < s->n_blocks ? s->blocks[pos / bs] : ext;
            p->tokens[t] = model ? -1 : draft[j];
            p->pos[t] = pos;
            p->seq_idx[t] = i;
            p->slot[t] = blk * bs + pos % bs;
            p->logit_idx[p->n_logits++] = t;
        }
        if (model)
            e->dm_seqs[n_dm++] = (struct spec_model_seq){.tokens = s->tokens,
                                                         .n_tokens = s->n_tokens,
                                                         .computed = &s->draft_computed,
                                                         .blocks = s->blocks,
                                                         .n_blocks = s->n_blocks,
                                                         .ext_block = ext,
                                                         .k = nd,
                                                         .out = p->tokens + p->draft_at[i]};
        budget -= nd;
        spec_step_add(&st, &sc, spec_rate_accept(&s->spec_rate[s->spec_cls]), nd);
    }
    if (n_dm == 0) return;
    struct qerr err = {0};
    if (spec_model_draft(e->draft, e->dm_seqs, n_dm, &err) == 0) return;
    /* the draft model failed: this step verifies no drafts (the drafts are the batch's last
     * tokens and rows), and the draft K/V are computed again next time */
    p->n_tokens = n_tokens0;
    p->n_logits = n_logits0;
    sched_spec_abandon(e);
    for (int i = 0; i < p->n_seqs; i++) {
        p->n_draft[i] = 0;
        p->seqs[i]->draft_computed = 0;
    }
    e->local.spec_draft_errors++;
}

int sched_step_plan(struct engine *e)
{
    struct step_plan *p = &e->plan;
    p->n_tokens = p->n_seqs = p->n_logits = p->n_hidden = p->n_copies = 0;
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
                struct seq *v = preempt_last(e);
                if (!v || v == s) {
                    n = 0;
                    break;
                }
            }
            if (n == 0) {
                /* s itself was the victim: it went back to waiting; the array shifted */
                if (i < e->n_running && e->running[i] != s) i--;
                continue;
            }
            add_chunk(e, s, n);
            budget -= n;
        }
    }

    /* C: admissions, in the waiting queue's order (priority, then first come first served) */
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
        running_insert(e, s);
        if (s->copy_len > 0) {
            /* the forward copies before it writes, so the source may go back to the pool now */
            p->copies[p->n_copies++] = (struct kv_block_copy){
                .src = s->copy_src, .dst = s->blocks[s->n_keyed], .n = s->copy_len};
            kv_block_release(e->pool, s->copy_src);
            s->copy_len = 0;
        }
        add_chunk(e, s, n);
        budget -= n;
    }

    if (e->spec_k > 0) {
        int room = e->o.spec_step_tokens - p->n_tokens;
        plan_drafts(e, room < budget ? room : budget);
    }

    /* block table of the step's sequences (a draft's spare block after the sequence's own) */
    int maxb = 1;
    for (int i = 0; i < p->n_seqs; i++) {
        int nb = p->seqs[i]->n_blocks + (p->ext_block[i] >= 0);
        if (nb > maxb) maxb = nb;
    }
    if (!ensure_table(p, p->n_seqs, maxb)) {
        sched_spec_abandon(e);
        return -1;
    }
    p->max_blocks = maxb;
    for (int i = 0; i < p->n_seqs; i++) {
        const struct seq *s = p->seqs[i];
        int32_t *row = p->table + (size_t)i * (size_t)maxb;
        for (int j = 0; j < maxb; j++)
            row[j] = j < s->n_blocks                            ? s->blocks[j]
                     : j == s->n_blocks && p->ext_block[i] >= 0 ? p->ext_block[i]
                                                                : -1;
    }
    return p->n_tokens;
}

/* Registers s's full, computed blocks in the prefix cache. */
static void key_blocks(struct engine *e, struct seq *s)
{
    int bs = e->o.kv_block_size;
    if (!e->o.prefix_cache) return;
    while ((s->n_keyed + 1) * bs <= s->n_computed) {
        s->last_key = kv_prefix_insert(e->pool, s->blocks[s->n_keyed], s->last_key,
                                       s->tokens + (size_t)s->n_keyed * (size_t)bs);
        s->n_keyed++;
    }
}

void sched_commit(struct engine *e)
{
    struct step_plan *p = &e->plan;
    for (int i = 0; i < p->n_seqs; i++) {
        struct seq *s = p->seqs[i];
        s->n_computed += p->chunk[i];
        key_blocks(e, s);
    }
}

void sched_spec_settle(struct engine *e, int i, int kept)
{
    struct step_plan *p = &e->plan;
    struct seq *s = p->seqs[i];
    int bs = e->o.kv_block_size, ext = p->ext_block[i];
    p->ext_block[i] = -1;
    s->n_computed += kept;
    if (s->n_computed > s->n_blocks * bs) {
        /* kept tokens sit in the spare block: it becomes the sequence's */
        if (ext >= 0 && push_block(s, ext)) {
            ext = kv_block_alloc(e->pool);
        } else {
            /* no room to record it: those tokens are computed again later */
            s->n_computed = s->n_blocks * bs;
        }
    }
    if (ext >= 0) e->spare[e->n_spare++] = ext;
    /* the draft model's K/V past what was kept belong to rejected guesses (or to a spare that
     * went back): it recomputes from there */
    if (s->draft_computed > s->n_computed) s->draft_computed = s->n_computed;
    key_blocks(e, s);
}

void sched_spec_abandon(struct engine *e)
{
    struct step_plan *p = &e->plan;
    for (int i = 0; i < p->n_seqs; i++)
        if (p->ext_block[i] >= 0) {
            e->spare[e->n_spare++] = p->ext_block[i];
            p->ext_block[i] = -1;
        }
}
