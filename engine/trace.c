/* trace: the engine's step and request rings, written as Chrome trace events (trace.h). */
#include "trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/backend_wrap.h"
#include "engine.h"

struct ring {
    void *items;
    size_t size, cap, head, n; /* item size; capacity; next write; items held */
    uint64_t dropped;          /* overwritten when full */
};

struct trace_op {
    double t0, t1;
    char name[40]; /* "matmul 576x1536 Q4_1", "attention", ... */
};

struct trace {
    pthread_mutex_t mu;
    double origin; /* CLOCK_MONOTONIC seconds at create: ts 0 */
    struct ring steps, requests, ops;
    /* the engine thread's alone: which step this is, whether its ops are recorded, and when the
     * running op began */
    uint64_t step_no;
    bool ops_on;
    double op_t0;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int ring_init(struct ring *r, size_t size, size_t cap)
{
    *r = (struct ring){.size = size, .cap = cap ? cap : 1};
    r->items = calloc(r->cap, size);
    return r->items ? 0 : -1;
}

static void ring_push(struct ring *r, const void *item)
{
    memcpy((char *)r->items + r->head * r->size, item, r->size);
    r->head = (r->head + 1) % r->cap;
    if (r->n < r->cap)
        r->n++;
    else
        r->dropped++;
}

/* A copy of r's items, oldest first (malloc'd; NULL when empty or out of memory). */
static void *ring_copy(const struct ring *r)
{
    if (!r->n) return NULL;
    char *out = malloc(r->n * r->size);
    if (!out) return NULL;
    size_t first = (r->head + r->cap - r->n) % r->cap;
    for (size_t i = 0; i < r->n; i++)
        memcpy(out + i * r->size, (const char *)r->items + ((first + i) % r->cap) * r->size,
               r->size);
    return out;
}

int trace_create(size_t max_steps, size_t max_requests, struct trace **out, struct qerr *err)
{
    struct trace *t = calloc(1, sizeof *t);
    if (!t || ring_init(&t->steps, sizeof(struct trace_step), max_steps) ||
        ring_init(&t->requests, sizeof(struct trace_request), max_requests) ||
        ring_init(&t->ops, sizeof(struct trace_op), TRACE_MAX_OPS)) {
        if (t) {
            free(t->steps.items);
            free(t->requests.items);
            free(t);
        }
        return qerr_set(err, QERR_NOMEM, "trace: out of memory for %zu steps and %zu requests",
                        max_steps, max_requests);
    }
    pthread_mutex_init(&t->mu, NULL);
    t->origin = now_s();
    *out = t;
    return 0;
}

void trace_free(struct trace *t)
{
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->steps.items);
    free(t->requests.items);
    free(t->ops.items);
    free(t);
}

void trace_add_step(struct trace *t, const struct trace_step *s)
{
    pthread_mutex_lock(&t->mu);
    ring_push(&t->steps, s);
    pthread_mutex_unlock(&t->mu);
}

void trace_step_begin(struct trace *t)
{
    t->ops_on = t->step_no++ % TRACE_OPS_EVERY == 0;
}

static void op_begin(void *ctx, const char *op, const struct bweight *w)
{
    (void)op;
    (void)w;
    struct trace *t = ctx;
    if (t->ops_on) t->op_t0 = now_s();
}

static void op_end(void *ctx, const char *op, const struct bweight *w, double bytes, double flops,
                   double tokens)
{
    (void)bytes, (void)flops, (void)tokens;
    struct trace *t = ctx;
    if (!t->ops_on) return;
    struct trace_op o = {.t0 = t->op_t0, .t1 = now_s()};
    if (w)
        snprintf(o.name, sizeof o.name, "%s %lldx%lld %s", op, (long long)w->rows,
                 (long long)w->cols, qtype_name(w->type));
    else
        snprintf(o.name, sizeof o.name, "%s", op);
    pthread_mutex_lock(&t->mu);
    ring_push(&t->ops, &o);
    pthread_mutex_unlock(&t->mu);
}

int trace_wrap_backend(struct trace *t, struct backend *inner, struct backend **out,
                       struct qerr *err)
{
    /* each op's end is synced so its slice is its own (a no-op on the CPU) */
    struct backend_hooks h = {.ctx = t, .op_begin = op_begin, .op_end = op_end};
    struct backend_wrap_opts o = {.own_inner = false, .sync_each_op = true, .steps = true};
    return backend_wrap_create(inner, &h, &o, out, err);
}

void trace_add_request(struct trace *t, const struct trace_request *r)
{
    pthread_mutex_lock(&t->mu);
    ring_push(&t->requests, r);
    pthread_mutex_unlock(&t->mu);
}

/* Microseconds since the trace began. */
static double us(const struct trace *t, double s)
{
    return (s - t->origin) * 1e6;
}

static void slice(FILE *f, const char *name, double ts, double dur, int tid)
{
    fprintf(f, ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
            name, tid, ts, dur);
}

static void step_events(FILE *f, const struct trace *t, const struct trace_step *s)
{
    fprintf(f,
            ",\n{\"name\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,"
            "\"args\":{\"seqs\":%d,\"prefill_tokens\":%d,\"decode_tokens\":%d,"
            "\"prompt_tokens\":%d,\"sampled\":%d,\"kv_blocks_used\":%d,\"preemptions\":%d,"
            "\"paused\":%d}}",
            us(t, s->t_begin), (s->t_end - s->t_begin) * 1e6, s->n_seqs, s->prefill_tokens,
            s->decode_tokens, s->prompt_tokens, s->sampled, s->kv_blocks_used, s->preemptions,
            s->paused);
    slice(f, "forward", us(t, s->t_forward), (s->t_sample - s->t_forward) * 1e6, 1);
    /* the sampler and the rest (detokenizing, stop strings, events) alternate per sequence:
     * the slice carries both sums */
    fprintf(f,
            ",\n{\"name\":\"sample\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,"
            "\"dur\":%.3f,\"args\":{\"sampler_us\":%.3f,\"detokenize_and_events_us\":%.3f}}",
            us(t, s->t_sample), (s->t_end - s->t_sample) * 1e6, s->sampler_s * 1e6,
            (s->t_end - s->t_sample - s->sampler_s) * 1e6);
}

static void op_event(FILE *f, const struct trace *t, const struct trace_op *o)
{
    fprintf(f,
            ",\n{\"name\":\"%s\",\"cat\":\"op\",\"ph\":\"X\",\"pid\":1,\"tid\":1,"
            "\"ts\":%.3f,\"dur\":%.3f}",
            o->name, us(t, o->t0), (o->t1 - o->t0) * 1e6);
}

static void async(FILE *f, const char *name, char ph, uint64_t id, double ts)
{
    fprintf(f,
            ",\n{\"name\":\"%s\",\"cat\":\"request\",\"ph\":\"%c\",\"pid\":1,\"tid\":2,"
            "\"id\":%llu,\"ts\":%.3f}",
            name, ph, (unsigned long long)id, ts);
}

static void request_events(FILE *f, const struct trace *t, const struct trace_request *r)
{
    double end = us(t, r->t_end);
    fprintf(f,
            ",\n{\"name\":\"request\",\"cat\":\"request\",\"ph\":\"b\",\"pid\":1,\"tid\":2,"
            "\"id\":%llu,\"ts\":%.3f,\"args\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
            "\"cached_tokens\":%d,\"finish\":\"%s\"}}",
            (unsigned long long)r->id, us(t, r->t_submit), r->prompt_tokens, r->completion_tokens,
            r->cached_tokens, finish_reason_name(r->finish));
    double admit = r->t_admit > 0 ? us(t, r->t_admit) : end;
    async(f, "queued", 'b', r->id, us(t, r->t_submit));
    async(f, "queued", 'e', r->id, admit);
    if (r->t_admit > 0) {
        double first = r->t_first > 0 ? us(t, r->t_first) : end;
        async(f, "prefill", 'b', r->id, admit);
        async(f, "prefill", 'e', r->id, first);
        if (r->t_first > 0) {
            async(f, "decode", 'b', r->id, first);
            async(f, "decode", 'e', r->id, end);
        }
    }
    async(f, "request", 'e', r->id, end);
}

int trace_write(struct trace *t, const char *path, const struct engine_stats *st, struct qerr *err)
{
    pthread_mutex_lock(&t->mu);
    struct ring steps = t->steps, requests = t->requests, ops = t->ops;
    struct trace_step *sv = ring_copy(&t->steps);
    struct trace_request *rv = ring_copy(&t->requests);
    struct trace_op *ov = ring_copy(&t->ops);
    pthread_mutex_unlock(&t->mu);
    int rc = 0;
    if ((steps.n && !sv) || (requests.n && !rv) || (ops.n && !ov)) {
        rc = qerr_set(err, QERR_NOMEM, "trace: out of memory writing %s", path);
        goto out;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        rc = qerr_set(err, QERR_IO, "trace: cannot write %s", path);
        goto out;
    }
    fprintf(f,
            "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"steps\":%zu,\"steps_dropped\":%llu,"
            "\"requests\":%zu,\"requests_dropped\":%llu,\"ops\":%zu,\"ops_dropped\":%llu,"
            "\"ops_every\":%d",
            steps.n, (unsigned long long)steps.dropped, requests.n,
            (unsigned long long)requests.dropped, ops.n, (unsigned long long)ops.dropped,
            TRACE_OPS_EVERY);
    if (st)
        fprintf(f,
                ",\"engine_steps\":%llu,\"engine_prompt_tokens\":%llu,"
                "\"engine_generation_tokens\":%llu,\"engine_preemptions\":%llu",
                (unsigned long long)st->steps, (unsigned long long)st->prompt_tokens,
                (unsigned long long)st->generation_tokens, (unsigned long long)st->preemptions);
    fprintf(f, "},\n\"traceEvents\":[\n"
               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"quern\"}},\n"
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,"
               "\"args\":{\"name\":\"engine steps\"}},\n"
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,"
               "\"args\":{\"name\":\"requests\"}}");
    for (size_t i = 0; i < steps.n; i++) step_events(f, t, &sv[i]);
    for (size_t i = 0; i < requests.n; i++) request_events(f, t, &rv[i]);
    for (size_t i = 0; i < ops.n; i++) op_event(f, t, &ov[i]);
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0) rc = qerr_set(err, QERR_IO, "trace: writing %s failed", path);
out:
    free(sv);
    free(rv);
    free(ov);
    return rc;
}
