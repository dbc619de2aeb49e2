/* The KV block pool alone (engine/kv_cache.c), on synthetic token blocks: allocation order,
 * reference counts, the free queue's eviction order, prefix hits and misses, keys that go stale
 * when their block is reallocated (and the index tombstones they leave), pool exhaustion, and a
 * random walk against a model of the pool. kv_pool_check runs after every change. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/kv_cache.h"

enum { BS = 4 };

static struct kv_pool *pool_new(int blocks)
{
    struct kv_pool *p = NULL;
    struct qerr err = {0};
    ck_assert_msg(kv_pool_create(blocks, BS, &p, &err) == 0, "%s", err.msg);
    return p;
}

static void check(const struct kv_pool *p)
{
    struct qerr err = {0};
    ck_assert_msg(kv_pool_check(p, &err) == 0, "%s", err.msg);
}

/* used and free block counts, and the invariants */
static void expect_counts(const struct kv_pool *p, int used, int free_blocks)
{
    ck_assert_int_eq(kv_pool_used(p), used);
    ck_assert_int_eq(kv_pool_free_count(p), free_blocks);
    check(p);
}

/* A block of tokens base, base + 1, ... */
static const int32_t *blk(int32_t base)
{
    static int32_t t[4][BS];
    static int k;
    int32_t *b = t[k++ % 4];
    for (int i = 0; i < BS; i++) b[i] = base + i;
    return b;
}

/* A pool whose blocks *a and *b (referenced) hold blk(10), then blk(20) after it; *ka is a's key.
 */
static struct kv_pool *chain(int blocks, int *a, int *b, uint64_t *ka)
{
    struct kv_pool *p = pool_new(blocks);
    *a = kv_block_alloc(p);
    *b = kv_block_alloc(p);
    *ka = kv_prefix_insert(p, *a, 0, blk(10));
    ck_assert_uint_eq(kv_prefix_insert(p, *b, *ka, blk(20)), kv_block_key(*ka, blk(20), BS));
    return p;
}

START_TEST(create_rejects_bad_sizes)
{
    struct kv_pool *p = NULL;
    struct qerr err = {0};
    ck_assert_int_eq(kv_pool_create(0, 16, &p, &err), QERR_INVALID);
    ck_assert_int_eq(kv_pool_create(4, 0, &p, &err), QERR_INVALID);
    ck_assert_int_eq(kv_pool_create(4, 1025, &p, &err), QERR_INVALID);
    ck_assert_int_eq(kv_pool_create((1 << 24) + 1, 16, &p, &err), QERR_INVALID);
    ck_assert_ptr_null(p);
    p = pool_new(5);
    ck_assert_int_eq(kv_pool_blocks(p), 5);
    ck_assert_int_eq(kv_pool_block_size(p), BS);
    expect_counts(p, 0, 5);
    kv_pool_free(p);
}
END_TEST

/* A fresh pool hands out blocks in id order, each at ref 1; retain and release count; a block
 * is free again only when its last reference goes. */
START_TEST(alloc_and_reference_counts)
{
    struct kv_pool *p = pool_new(4);
    for (int b = 0; b < 4; b++) {
        ck_assert_int_eq(kv_block_alloc(p), b);
        ck_assert_int_eq(kv_block_ref(p, b), 1);
        check(p);
    }
    expect_counts(p, 4, 0);
    kv_block_retain(p, 1);
    kv_block_retain(p, 1);
    ck_assert_int_eq(kv_block_ref(p, 1), 3);
    kv_block_release(p, 1);
    kv_block_release(p, 1);
    ck_assert_int_eq(kv_block_ref(p, 1), 1);
    expect_counts(p, 4, 0);
    kv_block_release(p, 1);
    ck_assert_int_eq(kv_block_ref(p, 1), 0);
    expect_counts(p, 3, 1);
    ck_assert_int_eq(kv_block_alloc(p), 1);
    check(p);
    kv_pool_free(p);
}
END_TEST

/* Freed blocks are reused least recently freed first; a free block taken back (a prefix hit
 * retains it) leaves the queue from the middle without disturbing the others' order. */
START_TEST(free_queue_eviction_order)
{
    struct kv_pool *p = pool_new(5);
    for (int b = 0; b < 5; b++) ck_assert_int_eq(kv_block_alloc(p), b);
    const int freed[] = {3, 0, 4, 1, 2};
    for (int i = 0; i < 5; i++) {
        kv_block_release(p, freed[i]);
        check(p);
    }
    kv_block_retain(p, 4); /* from the middle of the queue */
    ck_assert_int_eq(kv_block_ref(p, 4), 1);
    ck_assert_int_eq(kv_pool_free_count(p), 4);
    check(p);
    ck_assert_int_eq(kv_block_alloc(p), 3);
    ck_assert_int_eq(kv_block_alloc(p), 0);
    kv_block_release(p, 4); /* now the most recently freed: last out */
    ck_assert_int_eq(kv_block_alloc(p), 1);
    ck_assert_int_eq(kv_block_alloc(p), 2);
    ck_assert_int_eq(kv_block_alloc(p), 4);
    ck_assert_int_eq(kv_block_alloc(p), -1);
    check(p);
    kv_pool_free(p);
}
END_TEST

/* Every block referenced: alloc says -1 and changes nothing; one release makes one block. */
START_TEST(pool_exhaustion)
{
    struct kv_pool *p = pool_new(3);
    for (int b = 0; b < 3; b++) ck_assert_int_ge(kv_block_alloc(p), 0);
    for (int k = 0; k < 3; k++) ck_assert_int_eq(kv_block_alloc(p), -1);
    expect_counts(p, 3, 0);
    /* a free block that holds a cached prefix still counts as free, and is the one handed out */
    kv_prefix_insert(p, 2, 0, blk(100));
    kv_block_release(p, 2);
    ck_assert_int_eq(kv_pool_free_count(p), 1);
    ck_assert_int_eq(kv_block_alloc(p), 2);
    ck_assert_int_eq(kv_block_alloc(p), -1);
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(100)), -1); /* evicted by that alloc */
    check(p);
    kv_pool_free(p);
}
END_TEST

/* A chain of two cached blocks: each is found by its tokens after its parent's key, retained by
 * the lookup; other tokens, another parent or one changed token miss. */
START_TEST(prefix_hits_and_misses)
{
    int a, b;
    uint64_t ka;
    struct kv_pool *p = chain(8, &a, &b, &ka);
    ck_assert_uint_eq(ka, kv_block_key(0, blk(10), BS));
    ck_assert_uint_ne(ka, 0);
    uint64_t kb = kv_block_key(ka, blk(20), BS);
    ck_assert_uint_ne(kb, kv_block_key(0, blk(20), BS)); /* the key names the whole prefix */
    check(p);

    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(10)), a);
    ck_assert_int_eq(kv_block_ref(p, a), 2);
    ck_assert_int_eq(kv_prefix_lookup(p, ka, blk(20)), b);
    ck_assert_int_eq(kv_block_ref(p, b), 2);
    kv_block_release(p, a);
    kv_block_release(p, b);

    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(20)), -1);  /* b's tokens, no parent */
    ck_assert_int_eq(kv_prefix_lookup(p, ka, blk(10)), -1); /* a's tokens after a */
    ck_assert_int_eq(kv_prefix_lookup(p, kb, blk(20)), -1);
    int32_t t[BS];
    memcpy(t, blk(10), sizeof t);
    t[BS - 1]++;
    ck_assert_int_eq(kv_prefix_lookup(p, 0, t), -1);
    ck_assert_int_eq(kv_block_ref(p, a), 1);
    ck_assert_int_eq(kv_block_ref(p, b), 1);

    /* freed, a cached block stays findable; the hit takes it off the free queue */
    kv_block_release(p, a);
    ck_assert_int_eq(kv_pool_free_count(p), 7);
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(10)), a);
    ck_assert_int_eq(kv_block_ref(p, a), 1);
    ck_assert_int_eq(kv_pool_free_count(p), 6);
    check(p);
    kv_pool_free(p);
}
END_TEST

/* A partial lookup finds the cached block after the same parent whose first tokens match the
 * longest, never one after another parent, and retains nothing. */
START_TEST(partial_lookup_longest_prefix)
{
    int a, b;
    uint64_t ka;
    struct kv_pool *p = chain(8, &a, &b, &ka);
    int c = kv_block_alloc(p);
    int32_t t[BS];
    memcpy(t, blk(20), sizeof t);
    t[2] = 999; /* after a, like b for two tokens */
    kv_prefix_insert(p, c, ka, t);
    int len = -1;
    int32_t q[BS];
    memcpy(q, blk(20), sizeof q);
    q[3] = 777; /* b's first three tokens */
    ck_assert_int_eq(kv_prefix_lookup_partial(p, ka, q, BS - 1, &len), b);
    ck_assert_int_eq(len, 3);
    ck_assert_int_eq(kv_block_ref(p, b), 1);
    q[1] = 555; /* only the first token is b's and c's: the lower block id wins */
    ck_assert_int_eq(kv_prefix_lookup_partial(p, ka, q, BS - 1, &len), b < c ? b : c);
    ck_assert_int_eq(len, 1);
    memcpy(q, t, sizeof q);
    ck_assert_int_eq(kv_prefix_lookup_partial(p, ka, q, 2, &len), b < c ? b : c); /* n caps it */
    ck_assert_int_eq(len, 2);
    ck_assert_int_eq(kv_prefix_lookup_partial(p, ka, q, BS, &len), c);
    ck_assert_int_eq(len, BS);
    ck_assert_int_eq(kv_prefix_lookup_partial(p, 0, q, BS - 1, &len), -1); /* another parent */
    ck_assert_int_eq(len, 0);
    q[0] = 12345;
    ck_assert_int_eq(kv_prefix_lookup_partial(p, ka, q, BS - 1, &len), -1);
    /* a freed cached block is still found; an evicted one is not */
    kv_block_release(p, c);
    memcpy(q, t, sizeof q);
    ck_assert_int_eq(kv_prefix_lookup_partial(p, ka, q, BS, &len), c);
    check(p);
    kv_pool_free(p);
}
END_TEST

/* The pool's picture: a block in use, a freed block holding a cached prefix and a plain free
 * block, one cell a block; then cells of 3 blocks show the most used state among theirs, and
 * the last cell covers what is left. */
START_TEST(cells_show_free_cached_and_used)
{
    int a, b;
    uint64_t ka;
    struct kv_pool *p = chain(7, &a, &b, &ka); /* a, b in use, both keyed */
    kv_block_release(p, b);                    /* b: free, still cached */
    uint8_t c[7];
    memset(c, 9, sizeof c);
    kv_pool_cells(p, 1, c, 7);
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(c[i], i == a ? KV_CELL_USED : i == b ? KV_CELL_CACHED : KV_CELL_FREE);
    ck_assert_int_eq(a, 0);
    ck_assert_int_eq(b, 1);
    int x = kv_block_alloc(p); /* the free queue's head: block 2 (b went to its tail) */
    ck_assert_int_eq(x, 2);
    memset(c, 9, sizeof c);
    kv_pool_cells(p, 3, c, 3); /* blocks 0-2 (used, cached, used), 3-5 (free), 6 (free) */
    ck_assert_int_eq(c[0], KV_CELL_USED);
    ck_assert_int_eq(c[1], KV_CELL_FREE);
    ck_assert_int_eq(c[2], KV_CELL_FREE);
    ck_assert_int_eq(c[3], 9); /* past n_cells: untouched */
    kv_block_release(p, a);
    kv_block_release(p, x);
    kv_pool_cells(p, 3, c, 3); /* 0 and 1 cached, 2 free: the cell shows cached */
    ck_assert_int_eq(c[0], KV_CELL_CACHED);
    check(p);
    kv_pool_free(p);
}
END_TEST

/* A key already cached by one block is not taken by another, and a keyed block keeps its key. */
START_TEST(insert_keeps_the_first_holder)
{
    struct kv_pool *p = pool_new(4);
    int a = kv_block_alloc(p), c = kv_block_alloc(p);
    uint64_t k = kv_prefix_insert(p, a, 0, blk(1));
    ck_assert_uint_eq(kv_prefix_insert(p, c, 0, blk(1)), k); /* the same key, c not recorded */
    ck_assert_uint_eq(kv_prefix_insert(p, a, 0, blk(7)), kv_block_key(0, blk(7), BS));
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(7)), -1); /* a still holds blk(1) */
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(1)), a);
    kv_block_release(p, a);
    check(p);
    /* a evicted (the queue's head: 2, 3 were never allocated, so take them first) */
    kv_block_release(p, a);
    ck_assert_int_eq(kv_block_alloc(p), 2);
    ck_assert_int_eq(kv_block_alloc(p), 3);
    ck_assert_int_eq(kv_block_alloc(p), a);
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(1)), -1); /* c never held it */
    check(p);
    kv_pool_free(p);
}
END_TEST

/* Reallocating a cached block forgets its key (a tombstone in the index); a child whose
 * parent block went is still found by its own key (the scheduler walks prefixes from the first
 * block, so it stops at the parent's miss). A thousand insert/evict rounds over a small pool
 * reuse the tombstones: the index never fills, every stale key misses, every live one hits. */
START_TEST(stale_keys_after_reallocation)
{
    int a, b;
    uint64_t ka;
    struct kv_pool *p = chain(4, &a, &b, &ka);
    kv_block_release(p, a);
    kv_block_release(p, b);
    ck_assert_int_eq(kv_block_alloc(p), 2);
    ck_assert_int_eq(kv_block_alloc(p), 3);
    ck_assert_int_eq(kv_block_alloc(p), a); /* a reallocated: its key is gone */
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(10)), -1);
    ck_assert_int_eq(kv_prefix_lookup(p, ka, blk(20)), b);
    kv_block_release(p, b);
    /* a, now holding other tokens, is found by those only */
    kv_prefix_insert(p, a, 0, blk(30));
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(10)), -1);
    ck_assert_int_eq(kv_prefix_lookup(p, 0, blk(30)), a);
    kv_block_release(p, a);
    check(p);
    kv_pool_free(p);

    p = pool_new(4);
    for (int32_t round = 0; round < 1000; round++) {
        int got[4];
        for (int i = 0; i < 4; i++) {
            got[i] = kv_block_alloc(p);
            ck_assert_int_ge(got[i], 0);
            kv_prefix_insert(p, got[i], 0, blk(round * 16 + i * 4));
        }
        for (int i = 0; i < 4; i++) kv_block_release(p, got[i]);
        for (int i = 0; i < 4; i++) {
            int hit = kv_prefix_lookup(p, 0, blk(round * 16 + i * 4));
            ck_assert_int_eq(hit, got[i]);
            kv_block_release(p, hit);
            if (round > 0)
                ck_assert_int_eq(kv_prefix_lookup(p, 0, blk((round - 1) * 16 + i * 4)), -1);
        }
        if (round % 100 == 0) check(p);
    }
    check(p);
    kv_pool_free(p);
}
END_TEST

/* Random allocs, retains, releases, inserts and lookups against a model of what each block
 * holds; the free queue order is the model's too. */
START_TEST(random_walk_matches_model)
{
    enum { N = 16, OPS = 10000 };
    struct kv_pool *p = pool_new(N);
    int ref[N] = {0}, keyed[N], queue[N], nq = N;
    for (int b = 0; b < N; b++) {
        keyed[b] = -1; /* the token base its block holds, or -1 */
        queue[b] = b;
    }
    uint64_t s = 0x6b76;
    for (int op = 0; op < OPS; op++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        int b = (int)(s % N), base = (int)((s >> 8) % 24) * 4;
        switch ((s >> 20) % 5) {
        case 0: { /* alloc: the head of the queue, its key forgotten */
            int got = kv_block_alloc(p);
            if (nq == 0) {
                ck_assert_int_eq(got, -1);
                break;
            }
            ck_assert_int_eq(got, queue[0]);
            memmove(queue, queue + 1, (size_t)--nq * sizeof *queue);
            ref[got] = 1;
            keyed[got] = -1;
            break;
        }
        case 1: /* retain a referenced block */
            if (ref[b] == 0) break;
            kv_block_retain(p, b);
            ref[b]++;
            break;
        case 2: /* release one reference */
            if (ref[b] == 0) break;
            kv_block_release(p, b);
            if (--ref[b] == 0) queue[nq++] = b;
            break;
        case 3: { /* insert: only where no block holds these tokens and b holds none */
            if (ref[b] == 0) break;
            bool held = false;
            for (int k = 0; k < N; k++) held |= keyed[k] == base;
            kv_prefix_insert(p, b, 0, blk(base));
            if (!held && keyed[b] < 0) keyed[b] = base;
            break;
        }
        default: { /* lookup */
            int want = -1;
            for (int k = 0; k < N; k++)
                if (keyed[k] == base) want = k;
            int got = kv_prefix_lookup(p, 0, blk(base));
            ck_assert_int_eq(got, want);
            if (got < 0) break;
            if (ref[got]++ == 0) {
                int at = 0;
                while (queue[at] != got) at++;
                memmove(queue + at, queue + at + 1, (size_t)(nq - at - 1) * sizeof *queue);
                nq--;
            }
        }
        }
        ck_assert_int_eq(kv_pool_free_count(p), nq);
        if (op % 32 == 0) check(p);
    }
    for (int b = 0; b < N; b++) ck_assert_int_eq(kv_block_ref(p, b), ref[b]);
    check(p);
    kv_pool_free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_cache");
    TCase *tc = tcase_create("pool");
    tcase_add_test(tc, create_rejects_bad_sizes);
    tcase_add_test(tc, alloc_and_reference_counts);
    tcase_add_test(tc, free_queue_eviction_order);
    tcase_add_test(tc, pool_exhaustion);
    tcase_add_test(tc, prefix_hits_and_misses);
    tcase_add_test(tc, partial_lookup_longest_prefix);
    tcase_add_test(tc, insert_keeps_the_first_holder);
    tcase_add_test(tc, cells_show_free_cached_and_used);
    tcase_add_test(tc, stale_keys_after_reallocation);
    tcase_add_test(tc, random_walk_matches_model);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
