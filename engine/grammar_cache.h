/* grammar_cache: compiled grammars by source text, least recently used first out, so a client
 * that sends the same schema on every request compiles it once. Thread-safe; compilation runs
 * outside the lock (two threads compiling the same text at once keep the first). */
#ifndef QUERN_GRAMMAR_CACHE_H
#define QUERN_GRAMMAR_CACHE_H

#include "grammar.h"

struct grammar_cache;

int grammar_cache_create(int capacity, struct grammar_cache **out, struct qerr *err);
void grammar_cache_free(struct grammar_cache *c); /* drops its references */
/* A new reference (grammar_unref it) to the grammar of (kind, text[0..len)). Errors are
 * grammar_compile's and are not cached. A new compilation has its token masks precomputed for
 * v (when not NULL and the grammar is small enough) before anyone else can see it. */
int grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *text, size_t len,
                      const struct grammar_vocab *v, struct grammar **out, struct qerr *err);
/* Lookups answered from the cache, and compilations (for logs and tests). */
void grammar_cache_stats(struct grammar_cache *c, uint64_t *hits, uint64_t *misses);

#endif
