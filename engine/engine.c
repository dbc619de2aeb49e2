/* The engine thread: takes submitted requests, runs one scheduled step at a time, samples, turns
 * tokens into text (holding back what may begin a stop string), and feeds each request's
 * channel. Only this thread touches the model, the KV pool and the sequences. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/nvtx.h"
#include "engine_impl.h"
#include "trace.h"
#include "model_shard.h"
#include "stop_match.h"

double engine_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void engine_opts_default(struct engine_opts *o)
{
    *o = (struct engine_opts){.max_batch_tokens = 2048,
                              .max_seqs = 64,
                              .max_queue = 256,
                              .kv_block_size = 16,
                              .kv_blocks = 0,
                              .kv_mem = (size_t)256 << 20,
                              .ctx_len = 0,
                              .prefix_cache = true,
                              .prefix_partial = true,
                              .max_unread = 64,
                              .stall_timeout_s = 30,
                              .prompt_logprob_rows = 128,
                              .spec = SPEC_OFF,
                              .spec_k = 8,
                              .spec_step_tokens = 8,
                              .spec_history = 65536,
                              .mask_mode = ENGINE_MASK_LAUNCH};
}

const char *finish_reason_name(enum finish_reason r)
{
    switch (r) {
    case FINISH_NONE:
        return "none";
    case FINISH_STOP:
        return "stop";
    case FINISH_LENGTH:
        return "length";
    case FINISH_ABORT:
        return "abort";
    case FINISH_ERROR:
        return "error";
    }
    return "unknown";
}

/* ---- request channel ---- */

#define LOST_EVENTS "out of memory: part of this request's output was lost"

/* Queues ev for the client; false when it could not (out of memory), and the caller must fail
 * the request: an answer missing a piece must not look whole. The final event always gets in
 * (the channel starts with room, see engine_submit), as an error if one before it was lost. */
static bool request_push(struct request *r, const struct req_event *ev)
{
    bool lost = false;
    pthread_mutex_lock(&r->mu);
    if (r->read > 0 && r->n_events == r->cap_events) {
        /* events already read are dropped, so a channel holds only what is unread */
        memmove(r->events, r->events + r->read,
                (size_t)(r->n_events - r->read) * sizeof *r->events);
        r->n_events -= r->read;
        r->read = 0;
    }
    if (r->n_events == r->cap_events) {
        int cap = r->cap_events ? r->cap_events * 2 : 16;
        struct req_event *n = realloc(r->events, (size_t)cap * sizeof *n);
        if (!n) {
            /* cannot queue: keep the final event, which the client must see, in the place of
             * the last unread one, and say the answer is incomplete */
            if (!ev->done || r->n_events == 0) {
                pthread_mutex_unlock(&r->mu);
                return false;
            }
            r->n_events--;
            lost = true;
        } else {
            r->events = n;
            r->cap_events = cap;
        }
    }
    r->events[r->n_events] = *ev;
    if (lost) {
        r->events[r->n_events].finish = FINISH_ERROR;
        snprintf(r->events[r->n_events].error, sizeof ev->error, "%s", LOST_EVENTS);
    }
    r->n_events++;
    if (ev->done) {
        r->finished = true;
        r->e = NULL;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return true;
}

bool engine_request_push(struct request *r, const struct req_event *ev)
{
    return request_push(r, ev);
}

/* Wakes the engine thread; the caller holds r->mu (see struct request). */
static void request_wake_engine(struct request *r)
{
    if (!r->e) return;
    pthread_mutex_lock(&r->e->mu);
    r->e->wakes++;
    pthread_cond_signal(&r->e->wake);
    pthread_mutex_unlock(&r->e->mu);
}

bool seq_backlogged(const struct seq *s)
{
    struct request *r = s->req;
    if (r->max_unread <= 0) return false;
    pthread_mutex_lock(&r->mu);
    bool full = r->n_events - r->read >= r->max_unread;
    pthread_mutex_unlock(&r->mu);
    return full;
}

/* Now + ms on the clock pthread_cond_timedwait uses by default. */
static struct timespec realtime_after_ms(long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long ns = (long long)t.tv_nsec + (long long)ms * 1000000LL;
    return (struct timespec){.tv_sec = t.tv_sec + (time_t)(ns / 1000000000LL),
                             .tv_nsec = (long)(ns % 1000000000LL)};
}

int request_next(struct request *r, struct req_event *ev, int timeout_ms)
{
    struct timespec deadline = realtime_after_ms(timeout_ms >= 0 ? timeout_ms : 0);
    pthread_mutex_lock(&r->mu);
    while (r->read == r->n_events && !(r->finished && r->n_events > 0)) {
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline)) {
            pthread_mutex_unlock(&r->mu);
            return 1;
        }
    }
    if (r->read < r->n_events) {
        /* a paused sequence goes on once its reader makes room */
        if (r->max_unread > 0 && r->n_events - r->read == r->max_unread) request_wake_engine(r);
        *ev = r->events[r->read++];
    } else {
        *ev = r->events[r->n_events - 1]; /* after the end: the final event again */
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void request_abort(struct request *r)
{
    atomic_store(&r->abort, true);
    pthread_mutex_lock(&r->mu);
    request_wake_engine(r);
    pthread_mutex_unlock(&r->mu);
}

static void request_unref(struct request *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->events);
    free(r->embedding);
    free(r);
}

const float *request_embedding(struct request *r, int *dim)
{
    pthread_mutex_lock(&r->mu);
    const float *v = r->finished ? r->embedding : NULL;
    *dim = v ? r->n_embedding : 0;
    pthread_mutex_unlock(&r->mu);
    return v;
}

void request_release(struct request *r)
{
    if (!r) return;
    /* a client that lets go before the end no longer wants the rest */
    pthread_mutex_lock(&r->mu);
    bool finished = r->finished;
    pthread_mutex_unlock(&r->mu);
    if (!finished) request_abort(r);
    request_unref(r);
}

/* ---- sequences ---- */

/* A malloc'd copy of n elements of size bytes at src, or NULL when out of memory. */
static void *copy_of(const void *src, size_t n, size_t size)
{
    void *p = malloc(n * size);
    if (p) memcpy(p, src, n * size);
    return p;
}

static void seq_free(struct seq *s)
{
    if (!s) return;
    free(s->tokens);
    free(s->blocks);
    for (int i = 0; i < s->n_stop_strings; i++) free(s->stop_strings[i]);
    free(s->logit_bias);
    free(s->pred);
    free(s->allowed_mask);
    free(s->bad_ids);
    free(s->bad_lens);
    sampler_free(&s->sampler);
    free(s->hold);
    free(s->pool_sum);
    grammar_matcher_free(s->gm);
    free(s->premask);
    grammar_unref(s->grammar);
    free(s);
}

static bool hold_append(struct seq *s, const char *text, int n)
{
    if (s->n_hold + n + 1 > s->cap_hold) {
        int cap = (s->n_hold + n + 1) * 2;
        char *h = realloc(s->hold, (size_t)cap);
        if (!h) return false;
        s->hold = h;
        s->cap_hold = cap;
    }
    memcpy(s->hold + s->n_hold, text, (size_t)n);
    s->n_hold += n;
    s->hold[s->n_hold] = 0;
    return true;
}

/* Moves up to n bytes from the front of hold into ev->text (the event's buffer bounds a piece;
 * the caller sends more events for longer text). */
static int take_text(struct seq *s, struct req_event *ev, int n)
{
    int room = (int)sizeof ev->text - 1 - ev->text_len;
    if (n > room) n = room;
    memcpy(ev->text + ev->text_len, s->hold, (size_t)n);
    ev->text_len += n;
    ev->text[ev->text_len] = 0;
    memmove(s->hold, s->hold + n, (size_t)(s->n_hold - n));
    s->n_hold -= n;
    return n;
}

/* Length of the longest suffix of hold that is a proper prefix of some stop string. */
static int stop_prefix_suffix(const struct seq *s)
{
    return stop_partial_suffix(s->hold, s->n_hold, s->stop_strings, s->n_stop_strings);
}

/* Earliest offset in hold where a stop string starts, or -1. */
static int find_stop(const struct seq *s)
{
    return stop_find(s->hold, s->n_hold, s->stop_strings, s->n_stop_strings);
}

static void fill_final(struct engine *e, struct seq *s, struct req_event *ev,
                       enum finish_reason why)
{
    (void)e;
    double now = engine_now();
    ev->done = true;
    ev->finish = why;
    ev->prompt_tokens = s->n_prompt;
    ev->completion_tokens = s->n_generated;
    ev->cached_tokens = s->cached_tokens;
    ev->accepted_tokens = s->spec_accepted;
    ev->rejected_tokens = s->spec_drafted - s->spec_accepted;
    ev->preemptions = s->preemptions;
    ev->stop_string = s->stop_string;
    ev->stop_token = s->stop_token;
    ev->total_ms = (now - s->t_submit) * 1e3;
    ev->ttft_ms = s->t_first > 0 ? (s->t_first - s->t_submit) * 1e3 : 0;
    ev->queue_ms = s->t_admit > 0 ? (s->t_admit - s->t_submit) * 1e3 : ev->total_ms;
}

/* Ends s: flushes text that is still held (unless a stop string cut it), sends the final event,
 * and drops the engine's reference. The caller has removed s from running/waiting. */
static void seq_finish(struct engine *e, struct seq *s, enum finish_reason why, bool flush,
                       const char *error)
{
    sched_release_blocks(e, s);
    if (s->lora) e->local.lora_finished[s->lora - 1]++;
    /* a whole answer, for later sequences' drafts (a request that opted out of speculation
     * lends its answer to none) */
    if (s->spec && (why == FINISH_STOP || why == FINISH_LENGTH))
        spec_history_add(&e->history, s->tokens + s->n_prompt, s->n_tokens - s->n_prompt);
    struct req_event ev = {0};
    bool lost = false;
    if (flush) {
        char tail[16];
        int n = detok_flush(&s->detok, tail, sizeof tail);
        if (n > 0) lost = !hold_append(s, tail, n);
        while (s->n_hold > 0) {
            take_text(s, &ev, s->n_hold);
            if (s->n_hold > 0) {
                lost |= !request_push(s->req, &ev);
                memset(&ev, 0, sizeof ev);
            }
        }
    }
    fill_final(e, s, &ev, why);
    if (lost) {
        ev.finish = why = FINISH_ERROR;
        error = LOST_EVENTS;
    }
    if (error) snprintf(ev.error, sizeof ev.error, "%s", error);
    ev.request_fault = why == FINISH_ERROR && !lost && s->request_fault;
    if (e->o.trace)
        trace_add_request(e->o.trace, &(struct trace_request){.id = s->id,
                                                              .t_submit = s->t_submit,
                                                              .t_admit = s->t_admit,
                                                              .t_first = s->t_first,
                                                              .t_end = engine_now(),
                                                              .prompt_tokens = s->n_prompt,
                                                              .completion_tokens = s->n_generated,
                                                              .cached_tokens = s->cached_tokens,
                                                              .finish = why});
    request_push(s->req, &ev);
    e->local.finished[why]++;
    request_unref(s->req);
    seq_free(s);
}

static void remove_running(struct engine *e, int i)
{
    memmove(e->running + i, e->running + i + 1,
            (size_t)(e->n_running - i - 1) * sizeof *e->running);
    e->n_running--;
}

/* End of generation, or one of the request's stop ids (recorded as what stopped it). */
static bool is_stop_token(const struct engine *e, struct seq *s, int32_t t)
{
    if (!s->ignore_eos && tokenizer_is_eog(e->tok, t)) return true;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == t) {
            s->stop_token = t;
            return true;
        }
    return false;
}

/* vLLM's bad_words: each sequence's last token where the output ends with the others. */
static void ban_bad_words(const struct seq *s, float *logits)
{
    int out = s->n_tokens - s->n_prompt;
    const int32_t *ids = s->bad_ids;
    for (int i = 0; i < s->n_bad; ids += s->bad_lens[i++]) {
        int m = s->bad_lens[i];
        if (m - 1 <= out &&
            !memcmp(s->tokens + s->n_tokens - (m - 1), ids, (size_t)(m - 1) * sizeof *ids))
            logits[ids[m - 1]] = -INFINITY;
    }
}

static bool any_finite(const float *logits, int vocab)
{
    for (int t = 0; t < vocab; t++)
        if (logits[t] > -INFINITY) return true;
    return false;
}

/* min_tokens: end of generation and the stop ids cannot be sampled yet. */
static void hold_off_stops(const struct engine *e, const struct seq *s, float *logits)
{
    if (!s->ignore_eos)
        for (int t = 0; t < e->vocab; t++)
            if (tokenizer_is_eog(e->tok, t)) logits[t] = -INFINITY;
    for (int i = 0; i < s->n_stop_ids; i++) logits[s->stop_ids[i]] = -INFINITY;
}

/* The n most likely tokens of a logits row with their log-probabilities, most likely first. */
void engine_top_logprobs(const float *logits, int vocab, int n, struct req_event *ev)
{
    /* sample_logprob's terms, so a chosen token's entry here equals its own logprob */
    struct log_softmax ls = sample_log_softmax(logits, vocab);
    /* insertion into a sorted list of at most n (<= 20) raw logits */
    ev->n_top = 0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        if (ev->n_top == n && v <= ev->top[n - 1].logprob) continue;
        int k = ev->n_top < n ? ev->n_top++ : n - 1;
        while (k > 0 && ev->top[k - 1].logprob < v) {
            ev->top[k] = ev->top[k - 1];
            k--;
        }
        ev->top[k] = (struct token_logprob){i, v};
    }
    for (int k = 0; k < ev->n_top; k++)
        ev->top[k].logprob = sample_log_softmax_at(ls, ev->top[k].logprob);
}

/* Samples the next token of s from its logits row (into *sampled) and advances the request.
 * Returns the finish reason, or FINISH_NONE while it goes on. */
/* An event of s could not be queued: s fails, saying why. */
static enum finish_reason seq_lost(struct seq *s)
{
    snprintf(s->error, sizeof s->error, "%s", LOST_EVENTS);
    return FINISH_ERROR;
}

static enum finish_reason seq_advance(struct engine *e, struct seq *s, const float *row,
                                      int32_t *sampled)
{
    double t0 = e->o.trace ? engine_now() : 0;
    *sampled = -1;
    bool hold = s->n_generated < s->min_tokens && !(s->gm && grammar_matcher_done(s->gm));
    int32_t t;
    if (s->n_logit_bias || hold || s->grammar || s->allowed_mask || s->n_bad ||
        sampler_penalizes(&s->sampler)) {
        /* the row stays as the forward left it (logprobs read it below); edits go to a copy */
        memcpy(e->work, row, (size_t)e->vocab * sizeof *e->work);
        for (int i = 0; i < s->n_logit_bias; i++)
            e->work[s->logit_bias[i].token] += s->logit_bias[i].bias;
        if (hold) hold_off_stops(e, s, e->work);
        if (s->allowed_mask) grammar_mask_apply(s->allowed_mask, e->work, e->vocab);
        if (s->n_bad) ban_bad_words(s, e->work);
        if (s->grammar && seq_constrain(e, s, e->work)) return FINISH_ERROR;
        if ((s->allowed_mask || s->n_bad) && !any_finite(e->work, e->vocab)) {
            s->request_fault = true;
            snprintf(s->error, sizeof s->error,
                     "allowed_token_ids and bad_words (and the grammar) leave no token to sample "
                     "after %d tokens",
                     s->n_generated);
            return FINISH_ERROR;
        }
        t = sampler_sample(&s->sampler, e->work);
    } else {
        /* nothing to edit: no copy (a 49152-token row is 192 KiB, ~10 us a sequence) */
        t = sampler_pick(&s->sampler, row);
    }
    *sampled = t;
    if (s->grammar && seq_constrain_accept(e, s, t)) return FINISH_ERROR;
    sampler_accept(&s->sampler, t);
    if (e->o.trace) e->step_sampler_s += engine_now() - t0;
    if (s->t_first == 0) {
        s->t_first = engine_now();
        engine_state_first_token(e, s->t_first, s->t_first - s->t_submit);
    }
    s->n_generated++;
    e->local.generation_tokens++;
    if (is_stop_token(e, s, t) || (s->gm && grammar_vocab_is_eog(e->gvocab, t))) return FINISH_STOP;

    struct req_event ev = {0};
    ev.token = t;
    ev.completion_tokens = s->n_generated;
    if (s->top_logprobs >= 0) {
        ev.logprob = sample_logprob(row, e->vocab, t);
        if (s->top_logprobs > 0) engine_top_logprobs(row, e->vocab, s->top_logprobs, &ev);
    }
    char piece[2048]; /* > 3 * the longest token of any vocabulary we load, plus slack */
    int n = detok_push(&s->detok, e->tok, t, piece, sizeof piece);
    if (n < 0) return FINISH_ERROR;
    if (n > 0 && !hold_append(s, piece, n)) {
        snprintf(s->error, sizeof s->error, "out of memory for the output text");
        return FINISH_ERROR;
    }
    enum finish_reason why = FINISH_NONE;
    int cut = s->n_stop_strings ? find_stop(s) : -1;
    if (cut >= 0) {
        /* the first stop string (in the request's order) found where the earliest one begins */
        int k = 0;
        while (k < s->n_stop_strings - 1 &&
               (strlen(s->stop_strings[k]) > (size_t)(s->n_hold - cut) ||
                memcmp(s->hold + cut, s->stop_strings[k], strlen(s->stop_strings[k]))))
            k++;
        s->stop_string = k;
        /* drop what follows the stop string, and the stop string unless it is to be sent */
        s->n_hold = cut + (s->include_stop_str ? (int)strlen(s->stop_strings[k]) : 0);
        why = FINISH_STOP;
    }
    int keep = why == FINISH_NONE && s->n_stop_strings ? stop_prefix_suffix(s) : 0;
    int emit = s->n_hold - keep;
    while (emit > 0) {
        int took = take_text(s, &ev, emit);
        emit -= took;
        if (emit > 0) {
            if (!request_push(s->req, &ev)) return seq_lost(s);
            ev.text_len = 0;
            ev.text[0] = 0;
        }
    }
    if (!request_push(s->req, &ev)) return seq_lost(s);
    if (why != FINISH_NONE) return why;

    /* the token becomes part of the sequence, computed in the next step */
    if (s->n_tokens == s->cap_tokens) return FINISH_LENGTH;
    s->tokens[s->n_tokens++] = t;
    if (s->n_generated >= s->max_tokens || s->n_tokens >= e->ctx_len) return FINISH_LENGTH;
    return FINISH_NONE;
}

/* Ends s, which is running (it leaves the running list). */
static void finish_running(struct engine *e, struct seq *s, enum finish_reason why, bool flush,
                           const char *error)
{
    for (int j = 0; j < e->n_running; j++)
        if (e->running[j] == s) {
            remove_running(e, j);
            break;
        }
    seq_finish(e, s, why, flush, error);
}

static void abort_flagged(struct engine *e)
{
    for (int i = 0; i < e->n_running; i++) {
        struct seq *s = e->running[i];
        if (!atomic_load(&s->req->abort)) continue;
        remove_running(e, i--);
        seq_finish(e, s, FINISH_ABORT, false, NULL);
    }
    for (int i = 0; i < e->n_waiting; i++) {
        struct seq *s = e->waiting[i];
        if (!atomic_load(&s->req->abort)) continue;
        memmove(e->waiting + i, e->waiting + i + 1,
                (size_t)(e->n_waiting - i - 1) * sizeof *e->waiting);
        e->n_waiting--;
        i--;
        seq_finish(e, s, FINISH_ABORT, false, NULL);
    }
}

/* Tracks which sequences wait on their reader; aborts those whose reader stalled too long.
 * Returns how many of list are paused. */
static int check_stalls(struct engine *e, struct seq **list, int *n, double now)
{
    int paused = 0;
    for (int i = 0; i < *n; i++) {
        struct seq *s = list[i];
        if (!seq_backlogged(s)) {
            s->paused_since = 0;
            continue;
        }
        if (s->paused_since == 0) s->paused_since = now;
        if (e->o.stall_timeout_s <= 0 || now - s->paused_since < e->o.stall_timeout_s) {
            paused++;
            continue;
        }
        memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof *list);
        (*n)--;
        i--;
        e->local.stalled++;
        char why[128];
        snprintf(why, sizeof why, "the client read nothing for %.0f s", now - s->paused_since);
        seq_finish(e, s, FINISH_ABORT, false, why);
    }
    return paused;
}

/* Sequence i of the step had a draft and has sampled its first token t (with result why) from
 * the row of its last real token. Each further row is the logits after one more draft token, so
 * it is the row plain decoding would sample from next only while every draft token so far was
 * the token sampled: sampling goes on (the same sampler, the same RNG draws, in the same order)
 * while that holds, and the first sampled token that differs from the draft is the one emitted.
 * Returns the finish reason. */
static enum finish_reason spec_verify(struct engine *e, int i, int32_t t, enum finish_reason why)
{
    const struct step_plan *p = &e->plan;
    struct seq *s = p->seqs[i];
    int nd = p->n_draft[i], accepted = 0, kept = 0;
    const int32_t *draft = p->tokens + p->draft_at[i];
    while (accepted < nd && t == draft[accepted]) {
        accepted++;
        /* a token that ended the sequence is never computed by plain decoding: its K/V is not
         * kept */
        if (why != FINISH_NONE) break;
        kept++;
        const float *row = e->logits + (size_t)(p->draft_row[i] + accepted - 1) * (size_t)e->vocab;
        why = seq_advance(e, s, row, &t);
    }
    sched_spec_settle(e, i, kept);
    s->spec_accepted += accepted;
    s->spec_drafted += nd;
    spec_state_update(&s->spec_st, nd, accepted, e->spec_k);
    spec_rate_update(&s->spec_rate[s->spec_cls], nd, accepted);
    e->local.spec_drafts++;
    e->local.spec_draft_tokens += (uint64_t)nd;
    e->local.spec_accepted_tokens += (uint64_t)accepted;
    e->local.spec_accepted_hist[accepted]++;
    if (s->spec_cls == SPEC_CLASS_GRAMMAR) {
        e->local.spec_grammar_drafts++;
        e->local.spec_grammar_draft_tokens += (uint64_t)nd;
        e->local.spec_grammar_accepted_tokens += (uint64_t)accepted;
    }
    if (s->spec_cls == SPEC_CLASS_HISTORY) {
        e->local.spec_history_drafts++;
        e->local.spec_history_draft_tokens += (uint64_t)nd;
        e->local.spec_history_accepted_tokens += (uint64_t)accepted;
    }
    return why;
}

/* One step; returns the tokens it ran (0: nothing could run). */
static int run_step(struct engine *e)
{
    double t_begin = engine_now();
    uint64_t preempted_before = e->local.preemptions;
    abort_flagged(e);
    double now = t_begin;
    e->local.paused = check_stalls(e, e->running, &e->n_running, now) +
                      check_stalls(e, e->waiting, &e->n_waiting, now);
    /* requests that ask for nothing finish at admission without touching the model */
    for (int i = 0; i < e->n_waiting; i++) {
        struct seq *s = e->waiting[i];
        if (s->max_tokens > 0 || seq_needs_prompt(s)) continue;
        memmove(e->waiting + i, e->waiting + i + 1,
                (size_t)(e->n_waiting - i - 1) * sizeof *e->waiting);
        e->n_waiting--;
        i--;
        s->t_admit = engine_now();
        seq_finish(e, s, FINISH_LENGTH, false, NULL);
    }
    int n = sched_step_plan(e);
    if (n <= 0) return 0;
    struct step_plan *p = &e->plan;
    for (int i = 0; i < p->n_seqs; i++) p->seq_lora[i] = p->seqs[i]->lora;
    struct model_batch b = {.n_tokens = p->n_tokens,
                            .tokens = p->tokens,
                            .pos = p->pos,
                            .seq = p->seq_idx,
                            .slot = p->slot,
                            .n_seqs = p->n_seqs,
                            .max_blocks = p->max_blocks,
                            .block_table = p->table,
                            .n_logits = p->n_logits,
                            .logit_idx = p->logit_idx,
                            .n_hidden = p->n_hidden,
                            .hidden_idx = p->hidden_idx,
                            .hidden = e->hidden,
                            .n_kv_copies = p->n_copies,
                            .kv_copies = p->copies,
                            .seq_lora = p->seq_lora};
    struct qerr err = {0};
    double t_forward = engine_now();
    grammar_step_begin(e, &b); /* the masks are computed while the forward runs */
    int rc = model_forward(e->model, &b, e->logits, &err);
    grammar_step_end(e);
    double t_sample = engine_now();
    e->local.steps++;
    /* what the cost-aware draft length weighs drafts against (spec_policy.h) */
    if (e->spec_k > 0 && !rc)
        spec_cost_record_step(&e->spec_cost, p->n_tokens, t_sample - t_forward);
    if (rc) {
        /* the step failed as a whole: fail its sequences, keep serving the others */
        sched_spec_abandon(e);
        for (int i = 0; i < p->n_seqs; i++) {
            struct seq *s = p->seqs[i];
            for (int j = 0; j < e->n_running; j++)
                if (e->running[j] == s) {
                    remove_running(e, j);
                    break;
                }
            seq_finish(e, s, FINISH_ERROR, false, err.msg);
        }
        return n;
    }
    struct trace_step ts = {.t_begin = t_begin,
                            .t_forward = t_forward,
                            .t_sample = t_sample,
                            .n_seqs = p->n_seqs,
                            .sampled = 0};
    for (int i = 0; i < p->n_seqs; i++) {
        const struct seq *s = p->seqs[i];
        if (s->n_computed < s->n_prompt) ts.prompt_tokens += p->chunk[i];
        /* a decode is one token after the prompt (and its draft); any other chunk is prefill
         * or recomputation */
        if (p->chunk[i] == 1 && s->n_computed >= s->n_prompt) ts.decode_tokens += 1 + p->n_draft[i];
    }
    ts.prefill_tokens = p->n_tokens - ts.decode_tokens;
    e->step_sampler_s = 0;
    e->local.prompt_tokens += (uint64_t)ts.prompt_tokens;
    uint64_t generated_before = e->local.generation_tokens;
    sched_commit(e);
    for (int i = 0; i < p->n_seqs; i++) {
        struct seq *s = p->seqs[i];
        if (seq_prefill_outputs(e, i)) {
            finish_running(e, s, FINISH_ERROR, false, s->error);
            continue;
        }
        if (s->pooling != ENGINE_POOL_NONE) {
            if (s->n_computed < s->n_prompt) continue;
            bool ok = !seq_pool_finish(e, s);
            finish_running(e, s, ok ? FINISH_STOP : FINISH_ERROR, false, ok ? NULL : s->error);
            continue;
        }
        if (!p->wants_logits[i]) continue;
        if (s->max_tokens == 0) { /* prompt logprobs only */
            finish_running(e, s, FINISH_LENGTH, false, NULL);
            continue;
        }
        /* the sequence's rows: its prompt logprobs', then its own (drafts' rows are after all) */
        const float *row = e->logits + (size_t)(p->logit_row[i] + p->n_plp[i]) * (size_t)e->vocab;
        int32_t t;
        enum finish_reason why = seq_advance(e, s, row, &t);
        if (p->n_draft[i] > 0) why = spec_verify(e, i, t, why);
        if (why == FINISH_NONE) continue;
        finish_running(e, s, why, why != FINISH_STOP || s->n_hold > 0,
                       s->error[0] ? s->error : NULL);
    }
    engine_state_record_step(e, t_begin, ts.prefill_tokens, ts.decode_tokens, p->n_seqs,
                             (uint32_t)(e->local.generation_tokens - generated_before),
                             (uint32_t)ts.prompt_tokens);
    if (e->o.trace) {
        ts.t_end = engine_now();
        /* tokens sampled: drafts may add several a sequence, prompt-logprob rows none */
        ts.sampled = (int)(e->local.generation_tokens - generated_before);
        ts.sampler_s = e->step_sampler_s;
        ts.kv_blocks_used = kv_pool_used(e->pool);
        ts.preemptions = (int)(e->local.preemptions - preempted_before);
        ts.paused = e->local.paused;
        trace_add_step(e->o.trace, &ts);
    }
    return n;
}

static void publish_stats(struct engine *e)
{
    e->local.running = e->n_running;
    e->local.waiting = e->n_waiting;
    memset(e->local.lora_running, 0, sizeof e->local.lora_running);
    memset(e->local.lora_waiting, 0, sizeof e->local.lora_waiting);
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->lora) e->local.lora_running[e->running[i]->lora - 1]++;
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->lora) e->local.lora_waiting[e->waiting[i]->lora - 1]++;
    e->local.kv_blocks_total = kv_pool_blocks(e->pool);
    /* the spare blocks are the engine's, not any request's */
    e->local.kv_blocks_used = kv_pool_used(e->pool) - e->n_spare;
    if (e->local.kv_blocks_used > e->local.kv_blocks_peak)
        e->local.kv_blocks_peak = e->local.kv_blocks_used;
    pthread_mutex_lock(&e->mu);
    e->stats = e->local;
    e->n_waiting_pub = e->n_waiting;
    e->last_progress = engine_now();
    pthread_mutex_unlock(&e->mu);
}

/* A LoRA load or unload (engine_lora_load), between steps. */
struct lora_cmd {
    bool load;
    const struct lora_spec *spec;
    int slot; /* unload: the slot; load: the slot filled */
    uint32_t gen;
    int rc;
    struct qerr err;
    bool done;
};

/* Requests of slot's adapter that are queued, waiting or running. */
static int lora_users(const struct engine *e, int slot)
{
    int n = 0;
    for (int i = 0; i < e->n_incoming; i++) n += e->incoming[i]->lora == slot + 1;
    for (int i = 0; i < e->n_waiting; i++) n += e->waiting[i]->lora == slot + 1;
    for (int i = 0; i < e->n_running; i++) n += e->running[i]->lora == slot + 1;
    return n;
}

/* Carries out e->lora_cmd; called and returns with mu held (the load itself runs without it:
 * submissions go on meanwhile). */
static void lora_cmd_run(struct engine *e)
{
    struct lora_cmd *c = e->lora_cmd;
    e->lora_cmd = NULL;
    if (c->load) {
        pthread_mutex_unlock(&e->mu);
        c->rc = model_lora_add(e->model, c->spec, &c->slot, &c->err);
        pthread_mutex_lock(&e->mu);
        if (!c->rc) {
            c->gen = e->lora_gen[c->slot] = ++e->lora_gen_next;
            e->local.lora_finished[c->slot] = 0; /* the counter is the new adapter's */
        }
    } else if (c->slot < 0 || c->slot >= e->lora_slots || !e->lora_gen[c->slot]) {
        c->rc = qerr_set(&c->err, QERR_NOTFOUND, "no LoRA adapter in slot %d", c->slot);
    } else {
        int users = lora_users(e, c->slot);
        if (users) {
            c->rc = qerr_set(&c->err, QERR_FULL, "the LoRA adapter is in use by %d request%s",
                             users, users == 1 ? "" : "s");
        } else {
            e->lora_gen[c->slot] = 0; /* from here on submissions for it are refused */
            pthread_mutex_unlock(&e->mu);
            model_lora_remove(e->model, c->slot);
            pthread_mutex_lock(&e->mu);
        }
    }
    c->done = true;
    pthread_cond_broadcast(&e->lora_done);
}

static void *engine_main(void *arg)
{
    struct engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->lora_cmd && e->n_incoming == 0 && e->n_running == 0 &&
               e->n_waiting == 0)
            pthread_cond_wait(&e->wake, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        if (e->lora_cmd) { /* between steps: nothing of the model is in use */
            lora_cmd_run(e);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        /* capacity for these was reserved at submit */
        for (int i = 0; i < e->n_incoming; i++) sched_waiting_insert(e, e->incoming[i]);
        e->n_incoming = 0;
        e->n_waiting_pub = e->n_waiting;
        unsigned seen = e->wakes;
        pthread_mutex_unlock(&e->mu);
        nvtx_pushf("engine step %" PRIu64 ": %d running, %d waiting", e->local.steps, e->n_running,
                   e->n_waiting);
        if (e->o.trace) trace_step_begin(e->o.trace);
        int ran = run_step(e);
        nvtx_pop();
        if (e->o.check_invariants && !e->check_error[0]) {
            struct qerr err = {0};
            if (engine_check(e, &err))
                snprintf(e->check_error, sizeof e->check_error, "step %llu: %s",
                         (unsigned long long)e->local.steps, err.msg);
        }
        publish_stats(e);
        /* forced when it is about to sleep, so an idle engine's picture is its last state */
        engine_state_publish(e, ran <= 0 || (e->n_running == 0 && e->n_waiting == 0));
        if (ran > 0) continue;
        /* nothing could run (every sequence waits on its reader, or on blocks held by those):
         * sleep until someone reads, aborts or submits, or the next stall check */
        struct timespec until = realtime_after_ms(100);
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->lora_cmd && e->n_incoming == 0 && e->wakes == seen)
            if (pthread_cond_timedwait(&e->wake, &e->mu, &until)) break;
        pthread_mutex_unlock(&e->mu);
    }
    /* shutdown: everything still here ends with abort, and a LoRA command is refused */
    pthread_mutex_lock(&e->mu);
    if (e->lora_cmd) {
        e->lora_cmd->rc = qerr_set(&e->lora_cmd->err, QERR_FULL, "the engine stopped");
        e->lora_cmd->done = true;
        e->lora_cmd = NULL;
        pthread_cond_broadcast(&e->lora_done);
    }
    for (int i = 0; i < e->n_incoming; i++) e->waiting[e->n_waiting++] = e->incoming[i];
    e->n_incoming = 0;
    pthread_mutex_unlock(&e->mu);
    while (e->n_running > 0) {
        struct seq *s = e->running[e->n_running - 1];
        e->n_running--;
        seq_finish(e, s, FINISH_ABORT, true, NULL);
    }
    while (e->n_waiting > 0) seq_finish(e, e->waiting[--e->n_waiting], FINISH_ABORT, true, NULL);
    publish_stats(e);
    engine_state_publish(e, true);
    return NULL;
}

/* Frees what engine_create built; the engine thread is not running. */
static void engine_release(struct engine *e)
{
    grammar_overlap_stop(e);
    spec_history_free(&e->history);
    model_free(e->model);
    spec_model_free(e->draft);
    free(e->dm_seqs);
    backend_destroy(e->traced);
    kv_pool_free(e->pool);
    sched_plan_free(&e->plan);
    free(e->incoming);
    free(e->waiting);
    free(e->running);
    backend_host_free(e->be, e->logits);
    backend_host_free(e->be, e->hidden);
    free(e->work);
    grammar_cache_free(e->grammars);
    grammar_vocab_free(e->gvocab);
    free(e->gmask);
    free(e->spare);
    engine_state_pub_free(e->state);
    pthread_mutex_destroy(&e->gvocab_mu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->lora_done);
    pthread_mutex_destroy(&e->lora_mu);
    free(e);
}

int engine_create(const struct gguf_file *f, const struct tokenizer *tok, struct backend *be,
                  const struct engine_opts *o, struct engine **out, struct qerr *err)
{
    *out = NULL;
    if (o->max_batch_tokens < 1 || o->max_seqs < 1 || o->max_queue < 1 || o->kv_block_size < 1)
        return qerr_set(err, QERR_INVALID,
                        "engine: max-batch-tokens %d, max-seqs %d, max-queue %d, kv-block %d "
                        "must be positive",
                        o->max_batch_tokens, o->max_seqs, o->max_queue, o->kv_block_size);
    if (o->spec != SPEC_OFF && (o->spec_k < 1 || o->spec_k > SPEC_K_MAX))
        return qerr_set(err, QERR_INVALID, "engine: spec-k %d not in 1..%d", o->spec_k, SPEC_K_MAX);
    if (o->spec == SPEC_DRAFT && (!o->draft_file || o->tp > 1))
        return qerr_set(err, QERR_INVALID, "engine: --spec draft needs %s",
                        o->draft_file ? "one rank (not --tp)" : "a draft model (--draft-model)");
    if (o->n_loras < 0 || o->n_loras > ENGINE_MAX_LORAS || o->max_loras < 0 ||
        o->max_loras > ENGINE_MAX_LORAS)
        return qerr_set(err, QERR_INVALID, "engine: %d LoRA adapters, %d slots (at most %d)",
                        o->n_loras, o->max_loras, ENGINE_MAX_LORAS);
    if (3 * tokenizer_max_token_bytes(tok) + 16 > 2048)
        return qerr_set(err, QERR_UNSUPPORTED, "engine: a token of %zu bytes is too long",
                        tokenizer_max_token_bytes(tok));
    struct model_config cfg;
    int rc = model_config_read(f, &cfg, err);
    if (rc) return rc;
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return qerr_set(err, QERR_NOMEM, "engine: out of memory");
    e->o = *o;
    e->tok = tok;
    e->be = be;
    e->vocab = cfg.vocab;
    struct model_opts ro = {.rope_freq_base = o->rope_freq_base, .rope_scale = o->rope_scale};
    int cap = model_ctx_limit(&cfg, &ro); /* a context stretched by --rope-scale */
    e->ctx_len = o->ctx_len > 0 && o->ctx_len < cap ? o->ctx_len : cap;
    int blocks = o->kv_blocks;
    /* a draft model's K/V share the target's blocks: each block costs both */
    struct model_config dcfg = {0};
    if (o->spec == SPEC_DRAFT && (rc = model_config_read(o->draft_file, &dcfg, err)))
        return qerr_wrap(err, "draft model");
    if (blocks <= 0) {
        /* elements per token, then this backend's bytes for them */
        size_t per_block =
            backend_kv_bytes(be,
                             model_shard_kv_bytes_max(&cfg, o->tp, 1) +
                                 (o->spec == SPEC_DRAFT ? model_kv_bytes_per_token(&dcfg, 1) : 0)) *
            (size_t)o->kv_block_size;
        size_t nb = o->kv_mem / per_block;
        if (nb < 1) {
            free(e);
            return qerr_set(err, QERR_INVALID,
                            "engine: kv-mem %zu bytes holds no %d-token block (%zu bytes)",
                            o->kv_mem, o->kv_block_size, per_block);
        }
        blocks = nb > (1 << 24) ? 1 << 24 : (int)nb;
    }
    e->o.kv_blocks = blocks;
    if (e->o.prompt_logprob_rows <= 0) e->o.prompt_logprob_rows = 128;
    e->logit_rows = sched_logit_rows(&e->o);
    spec_drafter_init(&e->drafter, o->spec);
    spec_cost_init(&e->spec_cost);
    spec_cost_init(&e->draft_cost);
    if (sched_drafts(o))
        /* a draft reaches at most one block past its sequence's own (plan_drafts) */
        e->spec_k = o->spec_k < o->kv_block_size ? o->spec_k : o->kv_block_size;
    if (o->spec != SPEC_OFF) {
        /* spares for up to 16 sequences crossing a block edge in one step, never more than a
         * sixteenth of the pool (with spec off, a prediction's drafts stop at the block's end
         * instead: the pool stays whole for those who never send one) */
        int t = o->max_seqs < 16 ? o->max_seqs : 16;
        e->spare_target = blocks / 16 < t ? blocks / 16 : t;
    }
    struct model_opts mo = {.max_batch_tokens = o->max_batch_tokens,
                            .max_logits = e->logit_rows,
                            .kv_blocks = blocks,
                            .kv_block_size = o->kv_block_size,
                            .tp = o->tp,
                            .tp_backends = o->tp_backends,
                            .tp_comms = o->tp_comms,
                            .rope_freq_base = o->rope_freq_base,
                            .rope_scale = o->rope_scale,
                            .loras = o->loras,
                            .n_loras = o->n_loras,
                            .max_loras = o->max_loras};
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->lora_done, NULL);
    pthread_mutex_init(&e->lora_mu, NULL);
    e->lora_slots = o->max_loras > o->n_loras ? o->max_loras : o->n_loras;
    for (int i = 0; i < o->n_loras; i++) e->lora_gen[i] = 1; /* engine_opts' adapters */
    e->lora_gen_next = 1;
    pthread_mutex_init(&e->gvocab_mu, NULL);
    /* the queue, a request's further choices (joins_group), and running sequences that are
     * preempted back into the queue */
    size_t slots = (size_t)o->max_queue + ENGINE_MAX_GROUP - 1 + (size_t)o->max_seqs;
    e->incoming = calloc(slots, sizeof *e->incoming);
    e->waiting = calloc(slots, sizeof *e->waiting);
    e->running = calloc((size_t)o->max_seqs, sizeof *e->running);
    /* read every step: the backend's fastest host memory (pinned on CUDA) */
    e->logits =
        backend_host_alloc(be, (size_t)e->logit_rows * (size_t)cfg.vocab * sizeof *e->logits);
    e->hidden =
        backend_host_alloc(be, (size_t)o->max_batch_tokens * (size_t)cfg.dim * sizeof *e->hidden);
    e->work = malloc((size_t)cfg.vocab * sizeof *e->work);
    e->spare = malloc((size_t)(e->spare_target > 0 ? e->spare_target : 1) * sizeof *e->spare);
    e->dm_seqs = calloc((size_t)o->max_seqs, sizeof *e->dm_seqs);
    if (!e->incoming || !e->waiting || !e->running || !e->logits || !e->hidden || !e->work ||
        !e->spare || !e->dm_seqs) {
        rc = qerr_set(err, QERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    if ((rc = sched_plan_init(&e->plan, &e->o, err))) goto fail;
    if (o->spec == SPEC_NGRAM) {
        if ((rc = spec_history_init(&e->history, o->spec_history, err))) goto fail;
        if (e->history.cap) e->drafter.history = &e->history;
    }
    if ((rc = grammar_overlap_start(e, err))) goto fail;
    if ((rc = grammar_cache_create(32, &e->grammars, err))) goto fail;
    if ((rc = kv_pool_create(blocks, o->kv_block_size, &e->pool, err))) goto fail;
    if ((rc = engine_state_pub_create(&e->state, err))) goto fail;
    /* one rank: its ops run on this thread, where trace_step_begin samples the steps */
    if (o->trace && o->tp <= 1 && (rc = trace_wrap_backend(o->trace, be, &e->traced, err)))
        goto fail;
    if ((rc = model_load(f, e->traced ? e->traced : be, &mo, &e->model, err))) goto fail;
    e->kv_copy = o->prefix_cache && o->prefix_partial && model_can_copy_kv(e->model);
    if (o->spec == SPEC_DRAFT) {
        /* a draft round has a row per drafting sequence; more are split over forwards */
        struct model_opts dmo = mo;
        dmo.max_logits = o->max_seqs < 16 ? o->max_seqs : 16;
        dmo.rope_freq_base = dmo.rope_scale = 0; /* the draft's own file says */
        dmo.loras = NULL;                        /* drafts come from the plain draft model */
        dmo.n_loras = 0;
        if ((rc = spec_model_create(o->draft_file, tok, be, &dmo, &e->draft, err))) goto fail;
        spec_model_time_into(e->draft, &e->draft_cost);
        e->draft_prior = spec_model_cost_prior(o->draft_file, f);
    }
    while (e->n_spare < e->spare_target) e->spare[e->n_spare++] = kv_block_alloc(e->pool);
    e->local.kv_blocks_total = blocks;
    e->local.kv_block_size = o->kv_block_size;
    e->stats = e->local;
    e->last_progress = engine_now();
    engine_state_publish(e, true);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        rc = qerr_set(err, QERR_IO, "engine: cannot start the engine thread");
        goto fail;
    }
    *out = e;
    return 0;
fail:
    engine_release(e);
    return rc;
}

void engine_stop(struct engine *e)
{
    if (!e || e->joined) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->joined = true;
}

void engine_free(struct engine *e)
{
    if (!e) return;
    engine_stop(e);
    engine_release(e);
}

static int seq_from_request(struct engine *e, const struct gen_request *r, struct seq **out,
                            struct qerr *err)
{
    struct seq *s = calloc(1, sizeof *s);
    if (!s) return qerr_set(err, QERR_NOMEM, "out of memory");
    int rc = sampler_init(&s->sampler, &r->sample, e->vocab, err);
    if (rc) {
        free(s);
        return rc;
    }
    s->cap_tokens = (int)r->n_prompt + r->max_tokens;
    s->tokens = malloc((size_t)s->cap_tokens * sizeof *s->tokens);
    if (!s->tokens) {
        int cap = s->cap_tokens; /* read before s is freed */
        seq_free(s);
        return qerr_set(err, QERR_NOMEM, "out of memory for %d tokens", cap);
    }
    memcpy(s->tokens, r->prompt, r->n_prompt * sizeof *s->tokens);
    s->n_tokens = s->n_prompt = (int)r->n_prompt;
    for (size_t i = 0; i < r->n_prompt; i++) sampler_accept(&s->sampler, r->prompt[i]);
    s->max_tokens = r->max_tokens;
    s->min_tokens = r->min_tokens;
    s->ignore_eos = r->ignore_eos;
    s->include_stop_str = r->include_stop_str;
    s->stop_string = -1;
    s->stop_token = -1;
    s->n_stop_ids = r->n_stop_ids;
    memcpy(s->stop_ids, r->stop_ids, sizeof s->stop_ids);
    s->top_logprobs = r->top_logprobs;
    s->prompt_logprobs = r->prompt_logprobs;
    s->prompt_top = r->prompt_top_logprobs;
    s->plp_next = 1;
    s->pooling = r->pooling;
    s->priority = r->priority;
    s->lora = r->lora;
    if (r->grammar) {
        s->grammar = r->grammar;
        grammar_ref(s->grammar);
    }
    /* grammars and logprobs need nothing of their own: each kept position runs seq_advance,
     * which masks, samples and reports from that position's own row, in order */
    /* with spec off, a request's prediction is its only drafter */
    s->spec = !r->no_spec && e->spec_k > 0 && (e->o.spec != SPEC_OFF || r->n_prediction > 0);
    spec_state_init(&s->spec_st, e->spec_k);
    spec_rates_init(s->spec_rate);
    detok_init(&s->detok);
    s->detok.skip_control = true; /* clients see text, not <|im_end|> */
    s->detok.keep_tool_markers = r->keep_tool_markers;
    for (int i = 0; i < r->n_stop_strings; i++) {
        s->stop_strings[i] = strdup(r->stop_strings[i]);
        if (!s->stop_strings[i]) {
            seq_free(s);
            return qerr_set(err, QERR_NOMEM, "out of memory");
        }
        s->n_stop_strings++;
    }
    /* the prediction is kept only where it is drafted from */
    bool pred = r->n_prediction > 0 && s->spec;
    if ((r->n_logit_bias > 0 && !(s->logit_bias = copy_of(r->logit_bias, (size_t)r->n_logit_bias,
                                                          sizeof *s->logit_bias))) ||
        (pred && !(s->pred = copy_of(r->prediction, (size_t)r->n_prediction, sizeof *s->pred)))) {
        seq_free(s);
        return qerr_set(err, QERR_NOMEM, "out of memory");
    }
    s->n_logit_bias = r->n_logit_bias > 0 ? r->n_logit_bias : 0;
    s->n_pred = pred ? r->n_prediction : 0;
    if (r->n_allowed > 0) {
        /* the grammar mask's form: bit t of word t / 64 */
        s->allowed_mask = calloc((size_t)(e->vocab + 63) / 64, sizeof *s->allowed_mask);
        if (s->allowed_mask)
            for (int i = 0; i < r->n_allowed; i++)
                s->allowed_mask[r->allowed[i] / 64] |= 1ull << (r->allowed[i] % 64);
    }
    int bad_tokens = 0;
    for (int i = 0; i < r->n_bad; i++) bad_tokens += r->bad_lens[i];
    if ((r->n_allowed > 0 && !s->allowed_mask) ||
        (r->n_bad > 0 &&
         (!(s->bad_ids = copy_of(r->bad_ids, (size_t)bad_tokens, sizeof *s->bad_ids)) ||
          !(s->bad_lens = copy_of(r->bad_lens, (size_t)r->n_bad, sizeof *s->bad_lens))))) {
        seq_free(s);
        return qerr_set(err, QERR_NOMEM, "out of memory");
    }
    s->n_bad = r->n_bad;
    s->t_submit = engine_now();
    *out = s;
    return 0;
}

static int check_request(const struct engine *e, const struct gen_request *r, struct qerr *err)
{
    if (r->n_prompt == 0) return qerr_set(err, QERR_INVALID, "prompt: must have at least 1 token");
    if (r->max_tokens < 0)
        return qerr_set(err, QERR_INVALID, "max_tokens: %d is negative", r->max_tokens);
    if (r->lora < 0 || r->lora > e->lora_slots)
        return qerr_set(err, QERR_INVALID, "lora: slot %d of %d", r->lora - 1, e->lora_slots);
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->vocab)
            return qerr_set(err, QERR_INVALID, "prompt: token id %d is not in [0, %d)",
                            r->prompt[i], e->vocab);
    if (r->n_prompt + (size_t)r->max_tokens > (size_t)e->ctx_len)
        return qerr_set(err, QERR_TOO_LONG,
                        "prompt (%zu tokens) + max_tokens (%d) = %zu exceeds the context length "
                        "of %d tokens",
                        r->n_prompt, r->max_tokens, r->n_prompt + (size_t)r->max_tokens,
                        e->ctx_len);
    size_t bs = (size_t)e->o.kv_block_size;
    size_t need = (r->n_prompt + (size_t)r->max_tokens + bs - 1) / bs;
    int avail = e->o.kv_blocks - e->spare_target; /* the spares are speculation's */
    if (need > (size_t)avail)
        return qerr_set(err, QERR_INVALID,
                        "prompt (%zu tokens) + max_tokens (%d) needs %zu KV blocks; the pool has "
                        "%d",
                        r->n_prompt, r->max_tokens, need, avail);
    if (r->min_tokens < 0 || r->min_tokens > r->max_tokens)
        return qerr_set(err, QERR_INVALID, "min_tokens: %d is not in 0..max_tokens (%d)",
                        r->min_tokens, r->max_tokens);
    for (int i = 0; i < r->n_stop_ids && i < ENGINE_MAX_STOPS; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= e->vocab)
            return qerr_set(err, QERR_INVALID, "stop_token_ids: token id %d is not in [0, %d)",
                            r->stop_ids[i], e->vocab);
    if (r->n_stop_ids < 0 || r->n_stop_ids > ENGINE_MAX_STOPS || r->n_stop_strings < 0 ||
        r->n_stop_strings > ENGINE_MAX_STOPS)
        return qerr_set(err, QERR_INVALID, "stop: at most %d stop strings and %d stop ids",
                        ENGINE_MAX_STOPS, ENGINE_MAX_STOPS);
    for (int i = 0; i < r->n_stop_strings; i++)
        if (!r->stop_strings[i] || !*r->stop_strings[i] ||
            strlen(r->stop_strings[i]) > ENGINE_MAX_STOP_BYTES)
            return qerr_set(err, QERR_INVALID, "stop: strings must have 1..%d bytes",
                            ENGINE_MAX_STOP_BYTES);
    if (r->n_logit_bias < 0 || r->n_logit_bias > ENGINE_MAX_LOGIT_BIAS ||
        (r->n_logit_bias > 0 && !r->logit_bias))
        return qerr_set(err, QERR_INVALID, "logit_bias: at most %d tokens", ENGINE_MAX_LOGIT_BIAS);
    for (int i = 0; i < r->n_logit_bias; i++) {
        if (r->logit_bias[i].token < 0 || r->logit_bias[i].token >= e->vocab)
            return qerr_set(err, QERR_INVALID, "logit_bias: token id %d is not in [0, %d)",
                            r->logit_bias[i].token, e->vocab);
        if (!isfinite(r->logit_bias[i].bias))
            return qerr_set(err, QERR_INVALID, "logit_bias: the bias of token %d is not finite",
                            r->logit_bias[i].token);
    }
    if (r->n_allowed < 0 || r->n_allowed > e->vocab || (r->n_allowed > 0 && !r->allowed))
        return qerr_set(err, QERR_INVALID, "allowed_token_ids: at most the vocabulary's %d tokens",
                        e->vocab);
    for (int i = 0; i < r->n_allowed; i++)
        if (r->allowed[i] < 0 || r->allowed[i] >= e->vocab)
            return qerr_set(err, QERR_INVALID, "allowed_token_ids: token id %d is not in [0, %d)",
                            r->allowed[i], e->vocab);
    if (r->n_bad < 0 || r->n_bad > ENGINE_MAX_BAD_WORDS ||
        (r->n_bad > 0 && (!r->bad_ids || !r->bad_lens)))
        return qerr_set(err, QERR_INVALID, "bad_words: at most %d token sequences",
                        ENGINE_MAX_BAD_WORDS);
    for (int i = 0, at = 0; i < r->n_bad; at += r->bad_lens[i++]) {
        if (r->bad_lens[i] < 1 || r->bad_lens[i] > ENGINE_MAX_BAD_LEN)
            return qerr_set(err, QERR_INVALID, "bad_words: a word of %d tokens (1..%d)",
                            r->bad_lens[i], ENGINE_MAX_BAD_LEN);
        for (int k = 0; k < r->bad_lens[i]; k++)
            if (r->bad_ids[at + k] < 0 || r->bad_ids[at + k] >= e->vocab)
                return qerr_set(err, QERR_INVALID, "bad_words: token id %d is not in [0, %d)",
                                r->bad_ids[at + k], e->vocab);
    }
    if (r->n_prediction < 0 || r->n_prediction > e->ctx_len ||
        (r->n_prediction > 0 && !r->prediction))
        return qerr_set(err, QERR_INVALID, "prediction: %d tokens; at most the context's %d",
                        r->n_prediction, e->ctx_len);
    for (int i = 0; i < r->n_prediction; i++)
        if (r->prediction[i] < 0 || r->prediction[i] >= e->vocab)
            return qerr_set(err, QERR_INVALID, "prediction: token id %d is not in [0, %d)",
                            r->prediction[i], e->vocab);
    if (r->top_logprobs < -1 || r->top_logprobs > ENGINE_MAX_TOP_LOGPROBS)
        return qerr_set(err, QERR_INVALID, "top_logprobs: %d not in 0..%d", r->top_logprobs,
                        ENGINE_MAX_TOP_LOGPROBS);
    if (r->prompt_logprobs &&
        (r->prompt_top_logprobs < 0 || r->prompt_top_logprobs > ENGINE_MAX_TOP_LOGPROBS))
        return qerr_set(err, QERR_INVALID, "prompt_logprobs: %d not in 0..%d",
                        r->prompt_top_logprobs, ENGINE_MAX_TOP_LOGPROBS);
    if (r->pooling < ENGINE_POOL_NONE || r->pooling > ENGINE_POOL_CLS)
        return qerr_set(err, QERR_INVALID, "pooling: %d is not a pooling mode", (int)r->pooling);
    if (r->pooling != ENGINE_POOL_NONE && (r->max_tokens != 0 || r->prompt_logprobs))
        return qerr_set(err, QERR_INVALID,
                        "pooling: an embedding request generates nothing (max_tokens %d)",
                        r->max_tokens);
    return sample_params_check(&r->sample, err);
}

int engine_submit(struct engine *e, const struct gen_request *r, struct request **out,
                  struct qerr *err)
{
    *out = NULL;
    int rc = check_request(e, r, err);
    if (rc) return rc;
    struct seq *s = NULL;
    if ((rc = seq_from_request(e, r, &s, err))) return rc;
    struct request *q = calloc(1, sizeof *q);
    if (!q) {
        seq_free(s);
        return qerr_set(err, QERR_NOMEM, "out of memory");
    }
    /* a channel with room from the start: its final event always fits (request_push) */
    q->cap_events = 16;
    q->events = malloc((size_t)q->cap_events * sizeof *q->events);
    if (!q->events) {
        free(q);
        seq_free(s);
        return qerr_set(err, QERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->refs = 2;
    q->e = e;
    q->max_unread = e->o.max_unread;
    s->req = q;
    pthread_mutex_lock(&e->mu);
    if (e->draining || e->stop) {
        pthread_mutex_unlock(&e->mu);
        rc = qerr_set(err, QERR_FULL, "the server is draining and accepts no new requests");
    } else if (r->lora && (!e->lora_gen[r->lora - 1] ||
                           (r->lora_gen && r->lora_gen != e->lora_gen[r->lora - 1]))) {
        pthread_mutex_unlock(&e->mu);
        rc = qerr_set(err, QERR_NOTFOUND, "the LoRA adapter (slot %d) was unloaded", r->lora - 1);
    } else if (e->n_incoming + e->n_waiting_pub >=
               e->o.max_queue + (r->joins_group ? ENGINE_MAX_GROUP - 1 : 0)) {
        pthread_mutex_unlock(&e->mu);
        rc = qerr_set(err, QERR_FULL, "the queue is full (%d waiting requests)", e->o.max_queue);
    } else {
        s->id = ++e->next_id;
        /* the adapter's slot and generation: K/V cached under another adapter is never its */
        if (r->lora)
            s->root_key = 0x9e3779b97f4a7c15ull * (uint64_t)r->lora ^
                          (uint64_t)e->lora_gen[r->lora - 1] << 40;
        s->last_key = s->root_key;
        e->incoming[e->n_incoming++] = s;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->mu);
    }
    if (rc) {
        seq_free(s);
        q->refs = 1;
        request_unref(q);
        return rc;
    }
    *out = q;
    return 0;
}

void engine_get_stats(struct engine *e, struct engine_stats *s)
{
    pthread_mutex_lock(&e->mu);
    *s = e->stats;
    bool busy = e->n_incoming > 0 || e->stats.running > 0 || e->stats.waiting > 0;
    s->waiting = e->stats.waiting + e->n_incoming;
    s->last_step_age_s = busy ? engine_now() - e->last_progress : 0;
    pthread_mutex_unlock(&e->mu);
}

const struct model_config *engine_model_config(const struct engine *e)
{
    return model_get_config(e->model);
}

int engine_ctx_len(const struct engine *e)
{
    return e->ctx_len;
}

int engine_pool_tokens(const struct engine *e)
{
    long long t = (long long)e->o.kv_blocks * e->o.kv_block_size;
    return t > 0x7fffffff ? 0x7fffffff : (int)t;
}

void engine_drain(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    pthread_mutex_unlock(&e->mu);
}

/* Hands c to the engine thread and waits for it to be carried out. */
static int lora_cmd_post(struct engine *e, struct lora_cmd *c, struct qerr *err)
{
    pthread_mutex_lock(&e->lora_mu);
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    if (e->stop || e->draining) {
        rc = qerr_set(err, QERR_FULL, "the server is draining");
    } else {
        /* the engine thread always answers, stopping or not (engine_main's shutdown) */
        e->lora_cmd = c;
        e->wakes++;
        pthread_cond_signal(&e->wake);
        while (!c->done) pthread_cond_wait(&e->lora_done, &e->mu);
        if (c->rc) rc = qerr_set(err, c->rc, "%s", c->err.msg);
    }
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&e->lora_mu);
    return rc;
}

int engine_lora_load(struct engine *e, const struct lora_spec *spec, int *lora, uint32_t *gen,
                     struct qerr *err)
{
    *lora = 0;
    *gen = 0;
    if (e->lora_slots == e->o.n_loras)
        return qerr_set(err, QERR_UNSUPPORTED,
                        "the engine has no slots for LoRA adapters loaded "
                        "while it runs");
    struct lora_cmd c = {.load = true, .spec = spec};
    int rc = lora_cmd_post(e, &c, err);
    if (rc) return rc;
    *lora = c.slot + 1;
    *gen = c.gen;
    return 0;
}

int engine_lora_unload(struct engine *e, int lora, struct qerr *err)
{
    struct lora_cmd c = {.load = false, .slot = lora - 1};
    return lora_cmd_post(e, &c, err);
}
