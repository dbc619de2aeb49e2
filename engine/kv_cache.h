/* kv_cache: the paged KV block pool and its prefix cache (bookkeeping only: the K/V bytes live in
 * the model's storage, indexed by the block ids handed out here).
 *
 * Every block has a reference count: the number of sequence block tables holding it. Blocks at
 * zero sit in one free queue kept in eviction order (least recently freed first), the way vLLM's
 * block pool does it: a freed block that holds a cached prefix stays findable until it is
 * reallocated, so a later request with the same prefix can take it back for free.
 *
 * A full block's cache key chains its parent's: key = xxh64(tokens of the block, seed = parent's
 * key), so one key names the whole prefix up to the block's end. Lookups verify the stored tokens
 * and parent key, so a hash collision can never hand out the wrong K/V. */
#ifndef QUERN_KV_CACHE_H
#define QUERN_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "../quant/qerr.h"

struct kv_pool;

int kv_pool_create(int n_blocks, int block_size, struct kv_pool **out, struct qerr *err);
void kv_pool_free(struct kv_pool *p);

int kv_pool_blocks(const struct kv_pool *p);
int kv_pool_block_size(const struct kv_pool *p);
int kv_pool_free_count(const struct kv_pool *p); /* blocks with ref 0 (cached or not) */
int kv_pool_used(const struct kv_pool *p);       /* blocks with ref > 0 */
int kv_block_ref(const struct kv_pool *p, int block);

/* A block with ref 1, taken from the head of the free queue (evicting its cached key, if any);
 * -1 when every block is referenced. */
int kv_block_alloc(struct kv_pool *p);
void kv_block_retain(struct kv_pool *p, int block);
/* Drops one reference; at zero the block joins the tail of the free queue. */
void kv_block_release(struct kv_pool *p, int block);

/* The key of a full block of tokens whose prefix before it has key parent (0 for the first). */
uint64_t kv_block_key(uint64_t parent, const int32_t *tokens, int block_size);
/* The cached block holding exactly these tokens after parent, retained (ref + 1), or -1. */
int kv_prefix_lookup(struct kv_pool *p, uint64_t parent, const int32_t *tokens);
/* The cached block after parent whose first tokens match tokens[0..n) longest (n < block_size:
 * the part of a block a prompt has), that length in *len; -1 when no cached block after parent
 * starts with tokens[0]. Ties go to the lowest block id. Not retained: a caller that keeps using
 * the block must do so before anything can reallocate it. A scan of every block (once per
 * admitted request, not per token). */
int kv_prefix_lookup_partial(const struct kv_pool *p, uint64_t parent, const int32_t *tokens, int n,
                             int *len);
/* Records that block (full, computed, referenced) holds tokens after parent. A key already cached
 * by another block is left alone. Returns the block's key. */
uint64_t kv_prefix_insert(struct kv_pool *p, int block, uint64_t parent, const int32_t *tokens);

/* Whether block holds a cached prefix, and its key (*key). */
bool kv_block_cached(const struct kv_pool *p, int block, uint64_t *key);
/* The keys of every cached prefix block (ref 0 or not), in block order, up to cap of them;
 * returns how many there are. For tests comparing two pools. */
int kv_pool_cached_keys(const struct kv_pool *p, uint64_t *out, int cap);

/* A picture of the pool for live views: cell i covers blocks [i * per_cell, (i + 1) * per_cell)
 * and is KV_CELL_USED when one of them is referenced, else KV_CELL_CACHED when one holds a cached
 * prefix (free, but findable until reallocated), else KV_CELL_FREE. O(blocks). */
enum kv_cell { KV_CELL_FREE = 0, KV_CELL_CACHED = 1, KV_CELL_USED = 2 };
void kv_pool_cells(const struct kv_pool *p, int per_cell, uint8_t *cells, int n_cells);

/* Checks the pool's internal invariants (free-queue links, counts, hash index): 0 or a message
 * in err. For tests. */
int kv_pool_check(const struct kv_pool *p, struct qerr *err);

#endif
