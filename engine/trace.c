/* trace: the engine's step and request rings, written as Chrome trace events (trace.h). */
#include "trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

struct ring {
    void *items;
    size_t size, cap, head, n; /* item size; capacity; next write; items held */
    uint64_t dropped;          /* overwritten when full */
};

struct trace {
    pthread_mutex_t mu;
    double origin; /* CLOCK_MONOTONIC seconds at create: ts 0 */
    struct ring steps, requests;
};

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
        ring_init(&t->requests, sizeof(struct trace_request), max_requests)) {
        if (t) {
            free(t->steps.items);
            free(t);
        }
        return qerr_set(err, QERR_NOMEM, "trace: out of memory for %zu steps and %zu requests",
                        max_steps, max_requests);
    }
    pthread_mutex_init(&t->mu, NULL);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t->origin = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    *out = t;
    return 0;
}

void trace_free(struct trace *t)
{
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->steps.items);
    free(t->requests.items);
    free(t);
}

void trace_add_step(struct trace *t, const struct trace_step *s)
{
    pthread_mutex_lock(&t->mu);
    ring_push(&t->steps, s);
    pthread_mutex_unlock(&t->mu);
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
    slice(f, "sample", us(t, s->t_sample), (s->t_end - s->t_sample) * 1e6, 1);
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
    struct ring steps = t->steps, requests = t->requests;
    struct trace_step *sv = ring_copy(&t->steps);
    struct trace_request *rv = ring_copy(&t->requests);
    pthread_mutex_unlock(&t->mu);
    int rc = 0;
    if ((steps.n && !sv) || (requests.n && !rv)) {
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
            "\"requests\":%zu,\"requests_dropped\":%llu",
            steps.n, (unsigned long long)steps.dropped, requests.n,
            (unsigned long long)requests.dropped);
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
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0) rc = qerr_set(err, QERR_IO, "trace: writing %s failed", path);
out:
    free(sv);
    free(rv);
    return rc;
}
