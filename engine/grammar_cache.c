/* grammar_cache: a small array kept in recency order (the newest first); capacities are tens,
 * so a linear scan under one mutex costs less than the hashing would. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_cache.h"

struct gc_entry {
    enum grammar_kind kind;
    char *text;
    size_t len;
    struct grammar *g;
};

struct grammar_cache {
    pthread_mutex_t mu;
    int cap, n;
    struct gc_entry *e; /* [cap], most recently used first */
    uint64_t hits, misses;
};

int grammar_cache_create(int capacity, struct grammar_cache **out, struct qerr *err)
{
    *out = NULL;
    struct grammar_cache *c = calloc(1, sizeof *c);
    if (capacity < 1) capacity = 1;
    if (c) c->e = calloc((size_t)capacity, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return qerr_set(err, QERR_NOMEM, "out of memory for the grammar cache");
    }
    c->cap = capacity;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return 0;
}

void grammar_cache_free(struct grammar_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        grammar_unref(c->e[i].g);
        free(c->e[i].text);
    }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Index of (kind, text) or -1; the caller holds mu. */
static int find(const struct grammar_cache *c, enum grammar_kind kind, const char *text, size_t len)
{
    for (int i = 0; i < c->n; i++)
        if (c->e[i].kind == kind && c->e[i].len == len && !memcmp(c->e[i].text, text, len))
            return i;
    return -1;
}

/* Moves entry i to the front; the caller holds mu. */
static void touch(struct grammar_cache *c, int i)
{
    struct gc_entry x = c->e[i];
    memmove(c->e + 1, c->e, (size_t)i * sizeof *c->e);
    c->e[0] = x;
}

/* Grammars up to this many states get every state's mask at compile time (at most about a
 * second of trie walks on the HTTP thread); bigger ones fill their cache as they are used. */
#define PRECOMPUTE_MAX_STATES 4096

int grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *text, size_t len,
                      const struct grammar_vocab *v, struct grammar **out, struct qerr *err)
{
    *out = NULL;
    pthread_mutex_lock(&c->mu);
    int i = find(c, kind, text, len);
    if (i >= 0) {
        touch(c, i);
        grammar_ref(c->e[0].g);
        *out = c->e[0].g;
        c->hits++;
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    c->misses++;
    pthread_mutex_unlock(&c->mu);
    struct grammar *g;
    int rc = grammar_compile(kind, text, len, &g, err);
    if (!rc && v) rc = grammar_precompute(g, v, PRECOMPUTE_MAX_STATES, err);
    if (rc) {
        grammar_unref(g);
        return rc;
    }
    char *copy = malloc(len + 1);
    pthread_mutex_lock(&c->mu);
    if ((i = find(c, kind, text, len)) >= 0) { /* another thread was quicker */
        touch(c, i);
        grammar_unref(g);
        g = c->e[0].g;
        free(copy);
    } else if (copy) {
        memcpy(copy, text, len);
        copy[len] = 0;
        if (c->n == c->cap) {
            c->n--;
            grammar_unref(c->e[c->n].g);
            free(c->e[c->n].text);
        }
        memmove(c->e + 1, c->e, (size_t)c->n * sizeof *c->e);
        c->e[0] = (struct gc_entry){kind, copy, len, g};
        c->n++;
    } else {
        /* no room to remember it: the caller still gets it */
        *out = g;
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    grammar_ref(g);
    *out = g;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void grammar_cache_stats(struct grammar_cache *c, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}
