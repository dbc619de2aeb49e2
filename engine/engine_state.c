/* engine_state: the engine's live picture, recorded and published by the engine thread through
 * a triple buffer (the design note is in engine_state.h). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "engine_state.h"

#define FRESH 4u /* in mid: the middle copy is newer than the reader's front copy */

struct engine_state_pub {
    struct engine_state copy[3];
    atomic_uint mid;         /* the middle copy's index, | FRESH once published */
    int back;                /* engine thread: the copy it fills next */
    int front;               /* readers (under read_mu): the copy they read */
    pthread_mutex_t read_mu; /* readers only: one swap at a time */
    /* engine thread only */
    struct engine_step_view steps[ENGINE_STATE_STEPS]; /* a ring: the newest at n_steps - 1 */
    uint64_t n_steps;
    struct engine_second history[ENGINE_STATE_HISTORY];
    double last_publish;
    uint64_t cost_steps;
    double cost_ns_total, cost_ns_max, publish_ns_max;
};

const char *engine_req_phase_name(enum engine_req_phase p)
{
    switch (p) {
    case ENGINE_REQ_WAITING:
        return "waiting";
    case ENGINE_REQ_PREFILL:
        return "prefill";
    case ENGINE_REQ_DECODE:
        return "decode";
    case ENGINE_REQ_PREEMPTED:
        return "preempted";
    }
    return "unknown";
}

int engine_state_pub_create(struct engine_state_pub **out, struct qerr *err)
{
    struct engine_state_pub *p = calloc(1, sizeof *p);
    if (!p) return qerr_set(err, QERR_NOMEM, "engine: out of memory for the state picture");
    p->back = 0;
    atomic_init(&p->mid, 1u);
    p->front = 2;
    pthread_mutex_init(&p->read_mu, NULL);
    *out = p;
    return 0;
}

void engine_state_pub_free(struct engine_state_pub *p)
{
    if (!p) return;
    pthread_mutex_destroy(&p->read_mu);
    free(p);
}

static struct engine_second *second_of(struct engine_state_pub *p, double now)
{
    int64_t t = (int64_t)floor(now);
    struct engine_second *h = &p->history[t % ENGINE_STATE_HISTORY];
    if (h->t != t) *h = (struct engine_second){.t = t};
    return h;
}

static void add_cost(struct engine_state_pub *p, double t0)
{
    double ns = (engine_now() - t0) * 1e9;
    p->cost_ns_total += ns;
    if (ns > p->cost_ns_max) p->cost_ns_max = ns;
}

void engine_state_record_step(struct engine *e, double t_begin, int prefill, int decode, int seqs,
                              uint32_t generated, uint32_t prompt)
{
    struct engine_state_pub *p = e->state;
    double now = engine_now();
    p->steps[p->n_steps % ENGINE_STATE_STEPS] =
        (struct engine_step_view){.step = e->local.steps,
                                  .prefill_tokens = prefill,
                                  .decode_tokens = decode,
                                  .seqs = seqs,
                                  .ms = (float)((now - t_begin) * 1e3)};
    p->n_steps++;
    struct engine_second *h = second_of(p, now);
    h->generated += generated;
    h->prompt += prompt;
    p->cost_steps++;
    add_cost(p, now);
}

void engine_state_first_token(struct engine *e, double now, double ttft_s)
{
    struct engine_second *h = second_of(e->state, now);
    h->ttft_n++;
    h->ttft_sum_ms += (float)(ttft_s * 1e3);
}

static void view_of(const struct seq *s, bool waiting, double now, struct engine_req_view *v)
{
    int phase;
    if (waiting)
        phase = s->t_admit > 0 ? ENGINE_REQ_PREEMPTED : ENGINE_REQ_WAITING;
    else if (s->n_computed < s->n_prompt || s->n_computed < s->n_tokens - 1)
        phase = ENGINE_REQ_PREFILL;
    else
        phase = ENGINE_REQ_DECODE;
    *v = (struct engine_req_view){.id = s->id,
                                  .phase = phase,
                                  .paused = s->paused_since > 0,
                                  .prompt_tokens = s->n_prompt,
                                  .computed_tokens = s->n_computed,
                                  .generated_tokens = s->n_generated,
                                  .max_tokens = s->max_tokens,
                                  .cached_tokens = s->cached_tokens,
                                  .blocks = s->n_blocks,
                                  .priority = s->priority,
                                  .age_s = (float)(now - s->t_submit)};
}

void engine_state_publish(struct engine *e, bool force)
{
    struct engine_state_pub *p = e->state;
    double t0 = engine_now();
    if (!force && t0 - p->last_publish < ENGINE_STATE_PERIOD_S) return;
    p->last_publish = t0;
    struct engine_state *o = &p->copy[p->back];
    o->version++;
    o->now = t0;
    o->stats = e->local;
    o->n_running = e->n_running;
    o->n_waiting = e->n_waiting;
    int n = 0;
    for (int i = 0; i < e->n_running && n < ENGINE_STATE_MAX_REQS; i++)
        view_of(e->running[i], false, t0, &o->reqs[n++]);
    for (int i = 0; i < e->n_waiting && n < ENGINE_STATE_MAX_REQS; i++)
        view_of(e->waiting[i], true, t0, &o->reqs[n++]);
    o->n_reqs = n;
    int blocks = kv_pool_blocks(e->pool);
    o->kv_blocks = blocks;
    o->kv_used = kv_pool_used(e->pool);
    o->blocks_per_cell = (blocks + ENGINE_STATE_MAX_CELLS - 1) / ENGINE_STATE_MAX_CELLS;
    o->n_cells = (blocks + o->blocks_per_cell - 1) / o->blocks_per_cell;
    kv_pool_cells(e->pool, o->blocks_per_cell, o->cells, o->n_cells);
    int cached = 0;
    if (o->blocks_per_cell == 1)
        for (int c = 0; c < o->n_cells; c++) cached += o->cells[c] == KV_CELL_CACHED;
    o->kv_cached_free = cached; /* counted only when a cell is one block */
    uint64_t ns = p->n_steps < ENGINE_STATE_STEPS ? p->n_steps : ENGINE_STATE_STEPS;
    for (uint64_t i = 0; i < ns; i++)
        o->steps[i] = p->steps[(p->n_steps - ns + i) % ENGINE_STATE_STEPS];
    o->n_steps = (int)ns;
    memcpy(o->history, p->history, sizeof o->history);
    double pub_ns = (engine_now() - t0) * 1e9;
    if (pub_ns > p->publish_ns_max) p->publish_ns_max = pub_ns;
    add_cost(p, t0);
    o->cost_steps = p->cost_steps;
    o->step_cost_ns_avg = p->cost_steps ? p->cost_ns_total / (double)p->cost_steps : 0;
    o->step_cost_ns_max = p->cost_ns_max;
    o->publish_ns_max = p->publish_ns_max;
    /* hand the filled copy over; the one it replaces (read or not) is the next to fill */
    unsigned old =
        atomic_exchange_explicit(&p->mid, (unsigned)p->back | FRESH, memory_order_acq_rel);
    p->back = (int)(old & 3u);
    /* the next back copy's version must keep counting from this one's */
    p->copy[p->back].version = o->version;
}

void engine_get_state(struct engine *e, struct engine_state *out)
{
    struct engine_state_pub *p = e->state;
    pthread_mutex_lock(&p->read_mu);
    if (atomic_load_explicit(&p->mid, memory_order_acquire) & FRESH)
        p->front =
            (int)(atomic_exchange_explicit(&p->mid, (unsigned)p->front, memory_order_acq_rel) & 3u);
    *out = p->copy[p->front];
    pthread_mutex_unlock(&p->read_mu);
    out->read_now = engine_now();
}
