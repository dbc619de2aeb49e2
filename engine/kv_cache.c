#include "kv_cache.h"

#include "../quant/fault.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct kv_pool {
    int n_blocks, block_size;
    int *ref;
    /* free queue, doubly linked through prev/next; -1 ends it */
    int *prev, *next;
    int head, tail, n_free;
    /* prefix cache: per block, whether it holds a key, the key, its parent key and its tokens */
    bool *has_key;
    uint64_t *key, *parent;
    int32_t *tokens; /* [n_blocks][block_size] */
    /* open-addressing index key -> block, sized to a power of two >= 2 * n_blocks; tombstones
     * are -2 */
    int *index;
    uint32_t index_mask;
};

static void *zalloc(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

int kv_pool_create(int n_blocks, int block_size, struct kv_pool **out, struct qerr *err)
{
    if (n_blocks < 1 || n_blocks > (1 << 24) || block_size < 1 || block_size > 1024)
        return qerr_set(err, QERR_INVALID, "kv pool: %d blocks of %d tokens", n_blocks, block_size);
    struct kv_pool *p = calloc(1, sizeof *p);
    if (!p) return qerr_set(err, QERR_NOMEM, "kv pool: out of memory");
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n_blocks) cap *= 2;
    p->index_mask = cap - 1;
    p->ref = zalloc((size_t)n_blocks, sizeof *p->ref);
    p->prev = zalloc((size_t)n_blocks, sizeof *p->prev);
    p->next = zalloc((size_t)n_blocks, sizeof *p->next);
    p->has_key = zalloc((size_t)n_blocks, sizeof *p->has_key);
    p->key = zalloc((size_t)n_blocks, sizeof *p->key);
    p->parent = zalloc((size_t)n_blocks, sizeof *p->parent);
    p->tokens = zalloc((size_t)n_blocks * (size_t)block_size, sizeof *p->tokens);
    p->index = malloc(cap * sizeof *p->index);
    if (!p->ref || !p->prev || !p->next || !p->has_key || !p->key || !p->parent || !p->tokens ||
        !p->index) {
        kv_pool_free(p);
        return qerr_set(err, QERR_NOMEM, "kv pool: out of memory for %d blocks", n_blocks);
    }
    for (uint32_t i = 0; i < cap; i++) p->index[i] = -1;
    for (int b = 0; b < n_blocks; b++) {
        p->prev[b] = b - 1;
        p->next[b] = b + 1 < n_blocks ? b + 1 : -1;
    }
    p->head = 0;
    p->tail = n_blocks - 1;
    p->n_free = n_blocks;
    *out = p;
    return 0;
}

void kv_pool_free(struct kv_pool *p)
{
    if (!p) return;
    free(p->ref);
    free(p->prev);
    free(p->next);
    free(p->has_key);
    free(p->key);
    free(p->parent);
    free(p->tokens);
    free(p->index);
    free(p);
}

int kv_pool_blocks(const struct kv_pool *p)
{
    return p->n_blocks;
}
int kv_pool_block_size(const struct kv_pool *p)
{
    return p->block_size;
}
int kv_pool_free_count(const struct kv_pool *p)
{
    return p->n_free;
}
int kv_pool_used(const struct kv_pool *p)
{
    return p->n_blocks - p->n_free;
}
int kv_block_ref(const struct kv_pool *p, int block)
{
    return p->ref[block];
}

static void unlink_free(struct kv_pool *p, int b)
{
    if (p->prev[b] >= 0)
        p->next[p->prev[b]] = p->next[b];
    else
        p->head = p->next[b];
    if (p->next[b] >= 0)
        p->prev[p->next[b]] = p->prev[b];
    else
        p->tail = p->prev[b];
    p->prev[b] = p->next[b] = -1;
    p->n_free--;
}

static void append_free(struct kv_pool *p, int b)
{
    p->prev[b] = p->tail;
    p->next[b] = -1;
    if (p->tail >= 0)
        p->next[p->tail] = b;
    else
        p->head = b;
    p->tail = b;
    p->n_free++;
}

static uint32_t slot_of(const struct kv_pool *p, uint64_t key)
{
    return (uint32_t)(key ^ (key >> 32)) & p->index_mask;
}

static void index_remove(struct kv_pool *p, int b)
{
    for (uint32_t s = slot_of(p, p->key[b]);; s = (s + 1) & p->index_mask) {
        if (p->index[s] == -1) return;
        if (p->index[s] == b) {
            p->index[s] = -2;
            return;
        }
    }
}

static void forget_key(struct kv_pool *p, int b)
{
    if (!p->has_key[b]) return;
    index_remove(p, b);
    p->has_key[b] = false;
}

int kv_block_alloc(struct kv_pool *p)
{
    int b = p->head;
    if (b < 0 || fault_hit(FAULT_KV_BLOCK)) return -1;
    unlink_free(p, b);
    forget_key(p, b);
    p->ref[b] = 1;
    return b;
}

void kv_block_retain(struct kv_pool *p, int block)
{
    if (p->ref[block]++ == 0) unlink_free(p, block);
}

void kv_block_release(struct kv_pool *p, int block)
{
    if (--p->ref[block] == 0) append_free(p, block);
}

uint64_t kv_block_key(uint64_t parent, const int32_t *tokens, int block_size)
{
    uint64_t k = XXH64(tokens, (size_t)block_size * sizeof *tokens, parent);
    return k ? k : 1; /* 0 is reserved for "no parent" */
}

static bool block_matches(const struct kv_pool *p, int b, uint64_t parent, const int32_t *tokens)
{
    return p->has_key[b] && p->parent[b] == parent &&
           memcmp(p->tokens + (size_t)b * (size_t)p->block_size, tokens,
                  (size_t)p->block_size * sizeof *tokens) == 0;
}

static int index_find(const struct kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens)
{
    for (uint32_t s = slot_of(p, key), n = 0; n <= p->index_mask;
         s = (s + 1) & p->index_mask, n++) {
        int b = p->index[s];
        if (b == -1) return -1;
        if (b >= 0 && p->key[b] == key && block_matches(p, b, parent, tokens)) return b;
    }
    return -1;
}

int kv_prefix_lookup(struct kv_pool *p, uint64_t parent, const int32_t *tokens)
{
    int b = index_find(p, kv_block_key(parent, tokens, p->block_size), parent, tokens);
    if (b >= 0) kv_block_retain(p, b);
    return b;
}

int kv_prefix_lookup_partial(const struct kv_pool *p, uint64_t parent, const int32_t *tokens, int n,
                             int *len)
{
    int best = -1, best_len = 0;
    if (n > p->block_size) n = p->block_size;
    for (int b = 0; b < p->n_blocks && best_len < n; b++) {
        if (!p->has_key[b] || p->parent[b] != parent) continue;
        const int32_t *t = p->tokens + (size_t)b * (size_t)p->block_size;
        int k = 0;
        while (k < n && t[k] == tokens[k]) k++;
        if (k > best_len) {
            best = b;
            best_len = k;
        }
    }
    *len = best_len;
    return best;
}

uint64_t kv_prefix_insert(struct kv_pool *p, int block, uint64_t parent, const int32_t *tokens)
{
    uint64_t key = kv_block_key(parent, tokens, p->block_size);
    if (p->has_key[block] || index_find(p, key, parent, tokens) >= 0) return key;
    p->has_key[block] = true;
    p->key[block] = key;
    p->parent[block] = parent;
    memcpy(p->tokens + (size_t)block * (size_t)p->block_size, tokens,
           (size_t)p->block_size * sizeof *tokens);
    /* the index holds at most n_blocks live entries in 2 * n_blocks slots, so a free or
     * tombstone slot always exists; tombstones are reused */
    uint32_t s = slot_of(p, key);
    while (p->index[s] >= 0) s = (s + 1) & p->index_mask;
    p->index[s] = block;
    return key;
}

bool kv_block_cached(const struct kv_pool *p, int block, uint64_t *key)
{
    if (p->has_key[block]) *key = p->key[block];
    return p->has_key[block];
}

int kv_pool_cached_keys(const struct kv_pool *p, uint64_t *out, int cap)
{
    int n = 0;
    for (int b = 0; b < p->n_blocks; b++)
        if (p->has_key[b]) {
            if (n < cap) out[n] = p->key[b];
            n++;
        }
    return n;
}

void kv_pool_cells(const struct kv_pool *p, int per_cell, uint8_t *cells, int n_cells)
{
    for (int c = 0; c < n_cells; c++) {
        uint8_t v = KV_CELL_FREE;
        int b0 = c * per_cell, b1 = b0 + per_cell < p->n_blocks ? b0 + per_cell : p->n_blocks;
        for (int b = b0; b < b1 && v != KV_CELL_USED; b++)
            if (p->ref[b] > 0)
                v = KV_CELL_USED;
            else if (p->has_key[b])
                v = KV_CELL_CACHED;
        cells[c] = v;
    }
}

int kv_pool_check(const struct kv_pool *p, struct qerr *err)
{
    int n = 0, last = -1;
    for (int b = p->head; b >= 0; b = p->next[b]) {
        if (n++ > p->n_blocks) return qerr_set(err, QERR_INVALID, "free queue has a cycle");
        if (p->ref[b] != 0)
            return qerr_set(err, QERR_INVALID, "block %d on the free queue has ref %d", b,
                            p->ref[b]);
        if (p->prev[b] != last) return qerr_set(err, QERR_INVALID, "block %d: bad prev link", b);
        last = b;
    }
    if (last != p->tail) return qerr_set(err, QERR_INVALID, "free queue tail mismatch");
    if (n != p->n_free)
        return qerr_set(err, QERR_INVALID, "free queue holds %d, count says %d", n, p->n_free);
    int zero = 0;
    for (int b = 0; b < p->n_blocks; b++) {
        if (p->ref[b] < 0) return qerr_set(err, QERR_INVALID, "block %d has ref %d", b, p->ref[b]);
        zero += p->ref[b] == 0;
        if (p->has_key[b] && index_find(p, p->key[b], p->parent[b],
                                        p->tokens + (size_t)b * (size_t)p->block_size) != b)
            return qerr_set(err, QERR_INVALID, "cached block %d missing from the index", b);
    }
    if (zero != p->n_free)
        return qerr_set(err, QERR_INVALID, "%d blocks at ref 0, %d free", zero, p->n_free);
    return 0;
}
