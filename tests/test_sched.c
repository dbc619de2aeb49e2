/* The scheduler alone (engine/sched.c) over a hand-built engine: no model, no engine thread, only
 * what sched_step_plan and sched_commit read (options, the KV pool, the waiting and running
 * arrays, the step plan) and sequences of synthetic tokens. A step here is the plan, then the
 * commit, then one generated token for each sequence whose chunk reached its last token, as the
 * engine thread does around the forward. Every plan is checked against its sequences: slots,
 * tokens, block table, logits, budget. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine_impl.h"

enum { MAXS = 8 };

struct rig {
    struct engine e;
    struct seq s[MAXS];
    struct request req[MAXS];
};

static struct rig *rig_new(int budget, int max_seqs, int blocks, int bs, bool prefix)
{
    struct rig *g = calloc(1, sizeof *g);
    ck_assert_ptr_nonnull(g);
    struct engine *e = &g->e;
    engine_opts_default(&e->o);
    e->o.max_batch_tokens = budget;
    e->o.max_seqs = max_seqs;
    e->o.max_queue = MAXS;
    e->o.kv_block_size = bs;
    e->o.kv_blocks = blocks;
    e->o.prefix_cache = prefix;
    /* as engine_create sizes them */
    e->waiting = calloc((size_t)e->o.max_queue + (size_t)max_seqs, sizeof *e->waiting);
    e->running = calloc((size_t)max_seqs, sizeof *e->running);
    ck_assert(e->waiting && e->running);
    struct qerr err = {0};
    ck_assert_msg(sched_plan_init(&e->plan, &e->o, &err) == 0, "%s", err.msg);
    ck_assert_msg(kv_pool_create(blocks, bs, &e->pool, &err) == 0, "%s", err.msg);
    for (int i = 0; i < MAXS; i++) {
        pthread_mutex_init(&g->req[i].mu, NULL);
        g->s[i].req = &g->req[i];
    }
    return g;
}

static void rig_free(struct rig *g)
{
    for (int i = 0; i < MAXS; i++) {
        free(g->s[i].tokens);
        free(g->s[i].blocks);
        pthread_mutex_destroy(&g->req[i].mu);
    }
    sched_plan_free(&g->e.plan);
    kv_pool_free(g->e.pool);
    free(g->e.waiting);
    free(g->e.running);
    free(g);
}

/* Sequence i holding n tokens base, base + 1, ... (room for 64 more). */
static struct seq *make_seq(struct rig *g, int i, int n, int32_t base)
{
    struct seq *s = &g->s[i];
    s->cap_tokens = n + 64;
    s->tokens = malloc((size_t)s->cap_tokens * sizeof *s->tokens);
    ck_assert_ptr_nonnull(s->tokens);
    for (int k = 0; k < n; k++) s->tokens[k] = base + k;
    s->n_tokens = s->n_prompt = n;
    s->id = ++g->e.next_id; /* submission order: made in the order the test submits them */
    return s;
}

/* A new request with an n-token prompt, at the back of the waiting queue. */
static struct seq *submit(struct rig *g, int i, int n, int32_t base)
{
    struct seq *s = make_seq(g, i, n, base);
    g->e.waiting[g->e.n_waiting++] = s;
    return s;
}

/* A sequence as earlier steps left it: n tokens, the first `computed` in the cache on blocks of
 * its own, admitted after the running ones. */
static struct seq *running(struct rig *g, int i, int n, int computed, int32_t base)
{
    struct seq *s = make_seq(g, i, n, base);
    int bs = g->e.o.kv_block_size, nb = (computed + bs - 1) / bs;
    s->blocks = malloc((size_t)(nb + 8) * sizeof *s->blocks);
    s->cap_blocks = nb + 8;
    for (int k = 0; k < nb; k++) {
        s->blocks[k] = kv_block_alloc(g->e.pool);
        ck_assert_int_ge(s->blocks[k], 0);
    }
    s->n_blocks = nb;
    s->n_computed = computed;
    s->order = g->e.next_order++;
    g->e.running[g->e.n_running++] = s;
    return s;
}

/* sched_step_plan, and the plan checked against the sequences it names. */
static int plan(struct rig *g)
{
    struct engine *e = &g->e;
    const struct step_plan *p = &e->plan;
    int n = sched_step_plan(e);
    ck_assert_int_eq(n, p->n_tokens);
    ck_assert_int_le(n, e->o.max_batch_tokens);
    ck_assert_int_le(p->n_seqs, e->o.max_seqs);
    int bs = e->o.kv_block_size, t = 0, nl = 0;
    for (int i = 0; i < p->n_seqs; i++) {
        const struct seq *s = p->seqs[i];
        ck_assert_int_gt(p->chunk[i], 0);
        for (int k = 0; k < p->chunk[i]; k++, t++) {
            int pos = p->pos[t];
            ck_assert_int_eq(p->seq_idx[t], i);
            ck_assert_int_eq(pos, s->n_computed + k);
            ck_assert_int_eq(p->tokens[t], s->tokens[pos]);
            ck_assert_int_lt(pos / bs, s->n_blocks);
            ck_assert_int_eq(p->slot[t], s->blocks[pos / bs] * bs + pos % bs);
        }
        ck_assert_int_eq(p->wants_logits[i], s->n_computed + p->chunk[i] == s->n_tokens);
        if (p->wants_logits[i]) ck_assert_int_eq(p->logit_idx[nl++], t - 1);
        ck_assert_int_ge(p->max_blocks, s->n_blocks);
        for (int j = 0; j < p->max_blocks; j++)
            ck_assert_int_eq(p->table[i * p->max_blocks + j], j < s->n_blocks ? s->blocks[j] : -1);
    }
    ck_assert_int_eq(t, n);
    ck_assert_int_eq(nl, p->n_logits);
    struct qerr err = {0};
    ck_assert_msg(kv_pool_check(e->pool, &err) == 0, "%s", err.msg);
    return n;
}

/* The rest of the step: commit, and a generated token for every sequence that got logits. */
static void finish(struct rig *g)
{
    struct step_plan *p = &g->e.plan;
    sched_commit(&g->e);
    for (int i = 0; i < p->n_seqs; i++) {
        struct seq *s = p->seqs[i];
        if (!p->wants_logits[i]) continue;
        s->tokens[s->n_tokens] = 5000 + s->n_tokens;
        s->n_tokens++;
    }
}

/* The plan is exactly these sequences with these chunks, in this order. */
static void expect_plan(const struct rig *g, int n, struct seq *const *seqs, const int *chunks)
{
    const struct step_plan *p = &g->e.plan;
    ck_assert_int_eq(p->n_seqs, n);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(p->seqs[i] == seqs[i], "plan slot %d: sequence %ld, want %ld", i,
                      (long)(p->seqs[i] - g->s), (long)(seqs[i] - g->s));
        ck_assert_int_eq(p->chunk[i], chunks[i]);
    }
}

static void expect_queue(struct seq *const *q, int nq, struct seq *const *want, int n)
{
    ck_assert_int_eq(nq, n);
    for (int i = 0; i < n; i++) ck_assert_ptr_eq(q[i], want[i]);
}

#define SEQS(...)                                                                                  \
    (struct seq *const[])                                                                          \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }
#define CHUNKS(...)                                                                                \
    (const int[])                                                                                  \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }

/* Admissions go first come, first served while the budget lasts: the second prompt gets the
 * rest of it as a first chunk, the third waits. The next step decodes the first, continues the
 * second, then admits the third. */
START_TEST(admits_fcfs_under_budget)
{
    struct rig *g = rig_new(16, 4, 64, 4, false);
    struct seq *a = submit(g, 0, 10, 100), *b = submit(g, 1, 10, 200), *c = submit(g, 2, 3, 300);
    ck_assert_int_eq(plan(g), 16);
    expect_plan(g, 2, SEQS(a, b), CHUNKS(10, 6));
    ck_assert(g->e.plan.wants_logits[0] && !g->e.plan.wants_logits[1]);
    expect_queue(g->e.running, g->e.n_running, SEQS(a, b), 2);
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(c), 1);
    ck_assert_uint_lt(a->order, b->order);
    ck_assert_int_eq(a->n_blocks, 3);
    ck_assert_int_eq(b->n_blocks, 2);
    finish(g);
    ck_assert_int_eq(a->n_computed, 10);
    ck_assert_int_eq(b->n_computed, 6);
    ck_assert_int_eq(a->n_keyed, 0); /* no prefix cache */

    ck_assert_int_eq(plan(g), 8);
    expect_plan(g, 3, SEQS(a, b, c), CHUNKS(1, 4, 3));
    ck_assert_int_eq(g->e.plan.n_logits, 3);
    ck_assert_int_eq(g->e.n_waiting, 0);
    finish(g);
    rig_free(g);
}
END_TEST

/* Decodes come first, oldest first, then prefill chunks, then admissions, all under the budget:
 * four tokens go to two decodes and half of the prefill's next chunk. */
START_TEST(decodes_before_chunks_before_admissions)
{
    struct rig *g = rig_new(4, 4, 64, 4, false);
    struct seq *p = running(g, 0, 10, 4, 100);
    struct seq *d1 = running(g, 1, 6, 5, 200), *d2 = running(g, 2, 6, 5, 300);
    struct seq *w = submit(g, 3, 3, 400);
    ck_assert_int_eq(plan(g), 4);
    expect_plan(g, 3, SEQS(d1, d2, p), CHUNKS(1, 1, 2));
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(w), 1);
    finish(g);
    ck_assert_int_eq(p->n_computed, 6);
    /* budget 4 again: the two decodes, then p's chunk takes the rest; w still waits */
    ck_assert_int_eq(plan(g), 4);
    expect_plan(g, 3, SEQS(d1, d2, p), CHUNKS(1, 1, 2));
    finish(g);
    ck_assert_int_eq(plan(g), 4);
    expect_plan(g, 3, SEQS(d1, d2, p), CHUNKS(1, 1, 2));
    finish(g);
    /* p's prompt is done: three decodes, and the budget's last token admits w's first chunk */
    ck_assert_int_eq(plan(g), 4);
    expect_plan(g, 4, SEQS(p, d1, d2, w), CHUNKS(1, 1, 1, 1));
    rig_free(g);
}
END_TEST

START_TEST(max_seqs_caps_admissions)
{
    struct rig *g = rig_new(64, 2, 64, 4, false);
    struct seq *a = submit(g, 0, 3, 100), *b = submit(g, 1, 3, 200), *c = submit(g, 2, 3, 300);
    ck_assert_int_eq(plan(g), 6);
    expect_plan(g, 2, SEQS(a, b), CHUNKS(3, 3));
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(c), 1);
    finish(g);
    ck_assert_int_eq(plan(g), 2);
    expect_plan(g, 2, SEQS(a, b), CHUNKS(1, 1));
    ck_assert_int_eq(g->e.n_waiting, 1);
    rig_free(g);
}
END_TEST

/* A request is admitted only while a block per running sequence stays free beyond what it
 * takes, so admitting never starves the next step's decodes; refused, it holds no block. */
START_TEST(admission_keeps_a_block_per_running_sequence)
{
    struct rig *g = rig_new(64, 4, 6, 4, false);
    struct seq *a = running(g, 0, 7, 6, 100); /* 2 blocks, the next token inside the second */
    struct seq *b = submit(g, 1, 13, 200);    /* 4 blocks: 4 free, but 1 is a's reserve */
    ck_assert_int_eq(kv_pool_free_count(g->e.pool), 4);
    ck_assert_int_eq(plan(g), 1);
    expect_plan(g, 1, SEQS(a), CHUNKS(1));
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(b), 1);
    ck_assert_int_eq(b->n_blocks, 0);
    ck_assert_int_eq(kv_pool_free_count(g->e.pool), 4);
    finish(g);
    b->n_tokens = b->n_prompt = 12; /* 3 blocks: exactly what is left beyond the reserve */
    ck_assert_int_eq(plan(g), 13);
    expect_plan(g, 2, SEQS(a, b), CHUNKS(1, 12));
    ck_assert_int_eq(kv_pool_free_count(g->e.pool), 1);
    rig_free(g);
}
END_TEST

/* vLLM's priority: a waiting request of a lower value goes ahead of earlier ones (first come,
 * first served among equals) and is admitted first, into the running list at its priority's
 * place; the list is planned in that order, so a high-priority sequence that needs a block
 * preempts the low-priority one behind it, older though that one is. */
START_TEST(priority_orders_the_queue_and_the_victims)
{
    struct rig *g = rig_new(64, 4, 4, 4, false);
    struct seq *lo = running(g, 0, 9, 8, 100), *hi = running(g, 1, 9, 8, 200);
    lo->priority = 5; /* admitted first, but of a higher value: the list is hi, lo */
    g->e.running[0] = hi;
    g->e.running[1] = lo;
    struct seq *w1 = submit(g, 2, 3, 300), *w2 = submit(g, 3, 3, 400);
    struct seq *w0 = make_seq(g, 4, 3, 500);
    w0->priority = -1;
    sched_waiting_insert(&g->e, w0);
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(w0, w1, w2), 3);
    /* the pool is full: hi's next token needs a third block, which lo gives up */
    ck_assert_int_eq(plan(g), 1);
    expect_plan(g, 1, SEQS(hi), CHUNKS(1));
    ck_assert_int_eq(lo->preemptions, 1);
    ck_assert_int_eq(hi->preemptions, 0);
    expect_queue(g->e.running, g->e.n_running, SEQS(hi), 1);
    /* lo came back behind the waiting requests of lower values */
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(w0, w1, w2, lo), 4);
    finish(g);
    rig_free(g);

    /* room for all: admitted in the queue's order, listed by priority */
    g = rig_new(64, 4, 64, 4, false);
    hi = running(g, 0, 9, 8, 200);
    w1 = submit(g, 1, 3, 300);
    w0 = make_seq(g, 2, 3, 500);
    w0->priority = -1;
    sched_waiting_insert(&g->e, w0);
    ck_assert_int_eq(plan(g), 1 + 3 + 3);
    expect_plan(g, 3, SEQS(hi, w0, w1), CHUNKS(1, 3, 3));
    expect_queue(g->e.running, g->e.n_running, SEQS(w0, hi, w1), 3);
    rig_free(g);
}
END_TEST

/* The oldest decode needs a block and none is free: the newest running sequence not in the step
 * is preempted (its blocks freed, its tokens kept, generated ones too) and goes to the front of
 * the waiting queue, ahead of a request that was there first. It comes back before that one,
 * recomputing all its tokens in one chunk. */
START_TEST(preempts_the_newest_not_in_the_step)
{
    struct rig *g = rig_new(64, 4, 6, 4, false);
    struct seq *a = running(g, 0, 9, 8, 100); /* its next token needs a third block */
    struct seq *b = running(g, 1, 6, 5, 200), *c = running(g, 2, 6, 5, 300);
    c->n_prompt = 4; /* two tokens generated */
    struct seq *d = submit(g, 3, 3, 400);
    ck_assert_int_eq(kv_pool_free_count(g->e.pool), 0);
    ck_assert_int_eq(plan(g), 2);
    expect_plan(g, 2, SEQS(a, b), CHUNKS(1, 1));
    expect_queue(g->e.running, g->e.n_running, SEQS(a, b), 2);
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(c, d), 2);
    ck_assert_uint_eq(g->e.local.preemptions, 1);
    ck_assert_int_eq(c->n_blocks, 0);
    ck_assert_int_eq(c->n_computed, 0);
    ck_assert_int_eq(c->n_tokens, 6);
    ck_assert_int_eq(a->n_blocks, 3);
    /* c's two blocks: one to a, one left as b's reserve, so c cannot come back yet */
    ck_assert_int_eq(kv_pool_free_count(g->e.pool), 1);
    finish(g);

    /* b finishes (the engine frees it): c is admitted first, with all six tokens; d, behind it,
     * finds no block beyond the reserve */
    sched_release_blocks(&g->e, b);
    g->e.running[1] = NULL;
    g->e.n_running = 1;
    ck_assert_int_eq(plan(g), 1 + 6);
    expect_plan(g, 2, SEQS(a, c), CHUNKS(1, 6));
    ck_assert(g->e.plan.wants_logits[1]);
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(d), 1);
    rig_free(g);
}
END_TEST

/* The newest running sequence is already in the step (its decode came first): the older one
 * whose prefill chunk cannot get blocks is the one that goes back to waiting. */
START_TEST(preemption_skips_sequences_in_the_step)
{
    struct rig *g = rig_new(64, 4, 4, 4, false);
    struct seq *x = running(g, 0, 12, 4, 100); /* prefilling: 2 more blocks */
    struct seq *y = running(g, 1, 10, 9, 200); /* decoding inside its third block */
    ck_assert_int_eq(kv_pool_free_count(g->e.pool), 0);
    ck_assert_int_eq(plan(g), 1);
    expect_plan(g, 1, SEQS(y), CHUNKS(1));
    expect_queue(g->e.running, g->e.n_running, SEQS(y), 1);
    expect_queue(g->e.waiting, g->e.n_waiting, SEQS(x), 1);
    ck_assert_uint_eq(g->e.local.preemptions, 1);
    ck_assert_int_eq(x->n_blocks, 0);
    ck_assert_int_eq(y->n_blocks, 3);
    rig_free(g);
}
END_TEST

/* Back-pressure: a sequence whose reader has max_unread events unread is paused (the engine
 * sets paused_since) and gets no decode; its prefill chunks still run. Reading resumes it;
 * with every sequence paused nothing runs. */
START_TEST(paused_sequence_gets_no_decode)
{
    struct rig *g = rig_new(64, 4, 16, 4, false);
    struct seq *a = running(g, 0, 6, 5, 100), *b = running(g, 1, 6, 5, 200);
    struct seq *p = running(g, 2, 10, 4, 300);
    g->req[0].max_unread = g->req[2].max_unread = 2;
    g->req[0].n_events = g->req[2].n_events = 2;
    ck_assert(seq_backlogged(a) && seq_backlogged(p) && !seq_backlogged(b));
    a->paused_since = p->paused_since = engine_now();
    ck_assert_int_eq(plan(g), 1 + 6);
    expect_plan(g, 2, SEQS(b, p), CHUNKS(1, 6));
    finish(g);
    ck_assert_int_eq(a->n_computed, 5);

    g->req[0].read = 1; /* a's reader takes an event; p, still paused, now waits to decode */
    ck_assert(!seq_backlogged(a));
    a->paused_since = 0;
    ck_assert_int_eq(plan(g), 2);
    expect_plan(g, 2, SEQS(a, b), CHUNKS(1, 1));
    finish(g);

    a->paused_since = b->paused_since = p->paused_since = engine_now();
    ck_assert_int_eq(plan(g), 0);
    ck_assert_int_eq(g->e.plan.n_seqs, 0);
    rig_free(g);
}
END_TEST

/* sched_commit registers each block that became full in the prefix cache (chained keys), never
 * a partial one; a later request with the same first blocks is admitted on them (shared, ref 2)
 * and computes only the rest, always at least its last token. */
START_TEST(commit_registers_full_blocks)
{
    struct rig *g = rig_new(64, 4, 16, 4, true);
    struct seq *a = submit(g, 0, 10, 100);
    ck_assert_int_eq(plan(g), 10);
    finish(g);
    ck_assert_int_eq(a->n_keyed, 2);
    uint64_t k0 = kv_block_key(0, a->tokens, 4);
    ck_assert_uint_eq(a->last_key, kv_block_key(k0, a->tokens + 4, 4));
    struct kv_pool *pool = g->e.pool;
    ck_assert_int_eq(kv_prefix_lookup(pool, 0, a->tokens), a->blocks[0]);
    kv_block_release(pool, a->blocks[0]);
    ck_assert_int_eq(kv_prefix_lookup(pool, k0, a->tokens + 4), a->blocks[1]);
    kv_block_release(pool, a->blocks[1]);
    int32_t partial[4] = {a->tokens[8], a->tokens[9], a->tokens[10], 0};
    ck_assert_int_eq(kv_prefix_lookup(pool, a->last_key, partial), -1);

    struct seq *b = submit(g, 1, 10, 100);
    b->tokens[8] = b->tokens[9] = 7;      /* the same two first blocks, then its own */
    struct seq *c = submit(g, 2, 8, 100); /* exactly a's two first blocks */
    ck_assert_int_eq(plan(g), 1 + 2 + 4);
    expect_plan(g, 3, SEQS(a, b, c), CHUNKS(1, 2, 4));
    ck_assert_int_eq(b->cached_tokens, 8);
    ck_assert_int_eq(b->blocks[0], a->blocks[0]);
    ck_assert_int_eq(b->blocks[1], a->blocks[1]);
    ck_assert_int_eq(kv_block_ref(pool, a->blocks[0]), 3);
    ck_assert_int_eq(kv_block_ref(pool, a->blocks[1]), 2);
    ck_assert_int_eq(c->cached_tokens, 4); /* its last token must be computed for logits */
    ck_assert_int_eq(c->blocks[0], a->blocks[0]);
    ck_assert_uint_eq(g->e.local.prefix_lookups, 10 + 10 + 8);
    ck_assert_uint_eq(g->e.local.prefix_hit_tokens, 8 + 4);
    finish(g);
    ck_assert_int_eq(b->n_keyed, 2);
    ck_assert_int_eq(c->n_keyed, 2); /* its second block is a copy: a's key stays with a's */
    ck_assert_int_eq(a->n_keyed, 2);
    /* a's decode fills its third block: registered at that commit */
    ck_assert_int_eq(plan(g), 3);
    finish(g);
    ck_assert_int_eq(a->n_computed, 12);
    ck_assert_int_eq(a->n_keyed, 3);
    uint64_t k1 = kv_block_key(k0, a->tokens + 4, 4);
    ck_assert_uint_eq(a->last_key, kv_block_key(k1, a->tokens + 8, 4));
    ck_assert_int_eq(kv_prefix_lookup(pool, k1, a->tokens + 8), a->blocks[2]);
    kv_block_release(pool, a->blocks[2]);
    rig_free(g);
}
END_TEST

/* With K/V copies (engine_opts.prefix_partial on a backend that copies): a prompt that shares a
 * cached block's first tokens after its whole cached blocks takes them too. The copy (source
 * block, a new block of its own, the length) is in the plan of the step that admits it, the
 * source is held only until then, and the chunk starts after the copied tokens; the admission
 * that cannot get its blocks gives everything back. */
START_TEST(partial_block_reuse_copies_kv)
{
    struct rig *g = rig_new(64, 4, 16, 4, true);
    g->e.kv_copy = true;
    struct seq *a = submit(g, 0, 10, 100);
    ck_assert_int_eq(plan(g), 10);
    ck_assert_int_eq(g->e.plan.n_copies, 0); /* nothing cached yet */
    finish(g);
    struct kv_pool *pool = g->e.pool;
    int a1 = a->blocks[1];
    /* b: a's first block whole, then 3 of the 4 tokens of a's second block, then its own */
    struct seq *b = submit(g, 1, 10, 100);
    b->tokens[7] = b->tokens[8] = b->tokens[9] = 7;
    ck_assert_int_eq(plan(g), 1 + 3);
    expect_plan(g, 2, SEQS(a, b), CHUNKS(1, 3));
    ck_assert_int_eq(b->cached_tokens, 4 + 3);
    ck_assert_int_eq(b->blocks[0], a->blocks[0]);
    ck_assert_int_ne(b->blocks[1], a1);
    const struct step_plan *p = &g->e.plan;
    ck_assert_int_eq(p->n_copies, 1);
    ck_assert_int_eq(p->copies[0].src, a1);
    ck_assert_int_eq(p->copies[0].dst, b->blocks[1]);
    ck_assert_int_eq(p->copies[0].n, 3);
    ck_assert_int_eq(kv_block_ref(pool, a1), 1); /* a's own, the copy's hold given back */
    ck_assert_int_eq(b->copy_len, 0);
    finish(g);
    ck_assert_int_eq(b->n_keyed, 2); /* the copied block filled up and was registered */

    /* a prompt that matches but cannot be admitted: a's decode takes one of the two free blocks,
     * c's copy the other, and then the reserve of a block per running sequence refuses c: its
     * blocks and the source's hold go back */
    struct seq *c = submit(g, 2, 7, 100);
    running(g, 3, 36, 35, 9000);
    ck_assert_int_eq(kv_pool_free_count(pool), 2);
    int ref_a1 = kv_block_ref(pool, a1);
    plan(g);
    ck_assert_int_eq(g->e.n_waiting, 1);
    ck_assert_ptr_eq(g->e.waiting[0], c);
    ck_assert_int_eq(c->n_blocks, 0);
    ck_assert_int_eq(c->copy_len, 0);
    ck_assert_int_eq(kv_block_ref(pool, a1), ref_a1);
    ck_assert_int_eq(g->e.plan.n_copies, 0);
    rig_free(g);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, admits_fcfs_under_budget);
    tcase_add_test(tc, decodes_before_chunks_before_admissions);
    tcase_add_test(tc, max_seqs_caps_admissions);
    tcase_add_test(tc, admission_keeps_a_block_per_running_sequence);
    tcase_add_test(tc, preempts_the_newest_not_in_the_step);
    tcase_add_test(tc, priority_orders_the_queue_and_the_victims);
    tcase_add_test(tc, preemption_skips_sequences_in_the_step);
    tcase_add_test(tc, paused_sequence_gets_no_decode);
    tcase_add_test(tc, commit_registers_full_blocks);
    tcase_add_test(tc, partial_block_reuse_copies_kv);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
