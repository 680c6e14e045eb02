/*
 * kv_blocks.c — block tables, reference counts, the free stack, forks and
 * copy-on-write (see kv_blocks.h). Four allocations at creation, none after.
 *
 * Sharing: a block is referenced by every sequence whose table holds it. A
 * sequence writes only at positions >= its length, so the only shared block
 * it can write into is its partially filled last one, and only after a
 * truncation made a shared full block partial; grow copies exactly that
 * block first (copy-on-write). A registered block counts as shared for this
 * (the hash table is one more holder): a sequence truncated into one copies it
 * before writing, so a registered block's contents never change.
 *
 * The prefix cache (kv_blocks.h): a chained hash table over registered
 * blocks (buckets of block ids, linked through hash_next), an LRU list of the
 * cached ones (refs 0) through lru_prev/lru_next, head = evicted first.
 */
#include "kv_blocks.h"

#include <stdlib.h>
#include <string.h>

struct moeq_kv_blocks {
    moeq_kv_blocks_params p;
    int64_t n_blocks;
    int64_t max_blocks_per_seq;
    int32_t *tables;           /* [max_seqs][max_blocks_per_seq]        */
    int64_t *lens;             /* [max_seqs], -1 = free slot            */
    int32_t *free_stack;       /* [n_blocks]                            */
    int32_t *refs;             /* [n_blocks] tables holding the block; 0 = free or cached */
    int64_t n_free;
    /* prefix cache */
    int key_width;             /* block_tokens + lookahead                                   */
    int32_t *rows;             /* [n_blocks][key_width] token ids of the block (its key row) */
    uint64_t *keys;            /* [n_blocks]                                                 */
    int32_t *parent;           /* [n_blocks] registered parent, -1 = first block             */
    int32_t *children;         /* [n_blocks] registered blocks whose parent it is            */
    unsigned char *reg;        /* [n_blocks] in the hash table                               */
    int32_t *hash_next, *buckets, *lru_prev, *lru_next;
    int64_t n_buckets;         /* power of two                                               */
    int32_t lru_head, lru_tail;
    int64_t *keyed;            /* [max_seqs] leading blocks registered                       */
    int64_t *recorded;         /* [max_seqs] leading tokens whose ids are in rows            */
    int64_t max_cached;
    moeq_kv_blocks_hash_fn hash;
    moeq_kv_blocks_stats st;
};

static int alloc_cache(moeq_kv_blocks *c) {
    size_t n = (size_t)c->n_blocks;
    c->key_width = c->p.block_tokens + (c->p.lookahead > 0 ? c->p.lookahead : 0);
    c->n_buckets = 1;
    while (c->n_buckets < c->n_blocks) c->n_buckets <<= 1;
    c->rows = malloc(n * c->key_width * sizeof(int32_t));
    c->keys = calloc(n, sizeof(uint64_t));
    c->parent = malloc(n * sizeof(int32_t));
    c->children = calloc(n, sizeof(int32_t));
    c->reg = calloc(n, 1);
    c->hash_next = malloc(n * sizeof(int32_t));
    c->lru_prev = malloc(n * sizeof(int32_t));
    c->lru_next = malloc(n * sizeof(int32_t));
    c->buckets = malloc((size_t)c->n_buckets * sizeof(int32_t));
    c->keyed = calloc((size_t)c->p.max_seqs, sizeof(int64_t));
    c->recorded = calloc((size_t)c->p.max_seqs, sizeof(int64_t));
    if (!c->rows || !c->keys || !c->parent || !c->children || !c->reg || !c->hash_next || !c->lru_prev ||
        !c->lru_next || !c->buckets || !c->keyed || !c->recorded)
        return 0;
    for (int64_t i = 0; i < c->n_buckets; i++) c->buckets[i] = -1;
    c->lru_head = c->lru_tail = -1;
    c->max_cached = c->p.max_cached < 0                                  ? 0
                    : c->p.max_cached > 0 && c->p.max_cached < c->n_blocks ? c->p.max_cached
                                                                           : c->n_blocks;
    c->hash = moeq_kv_blocks_default_hash;
    return 1;
}

moeq_err moeq_kv_blocks_new(const moeq_kv_blocks_params *p, moeq_kv_blocks **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    if (p->block_tokens < 1 || p->capacity_tokens < 1 || p->max_seqs < 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "kv cache: kv_block_tokens, kv_cache_tokens, max_seqs must be >= 1");
    moeq_kv_blocks *c = calloc(1, sizeof(*c));
    if (!c) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "kv cache block tables");
    c->p = *p;
    c->n_blocks = (p->capacity_tokens + p->block_tokens - 1) / p->block_tokens;
    c->max_blocks_per_seq = c->n_blocks;
    c->tables = malloc((size_t)p->max_seqs * c->max_blocks_per_seq * sizeof(int32_t));
    c->lens = malloc((size_t)p->max_seqs * sizeof(int64_t));
    c->free_stack = malloc((size_t)c->n_blocks * sizeof(int32_t));
    c->refs = calloc((size_t)c->n_blocks, sizeof(int32_t));
    if (!c->tables || !c->lens || !c->free_stack || !c->refs || !alloc_cache(c)) {
        moeq_kv_blocks_destroy(c);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "kv cache block tables: %d sequences x %lld blocks",
                         p->max_seqs, (long long)(p->capacity_tokens + p->block_tokens - 1) / p->block_tokens);
    }
    for (int i = 0; i < p->max_seqs; i++) c->lens[i] = -1;
    /* stack top = lowest block id, so a fresh cache hands out blocks in order */
    for (int64_t i = 0; i < c->n_blocks; i++) c->free_stack[i] = (int32_t)(c->n_blocks - 1 - i);
    c->n_free = c->n_blocks;
    *out = c;
    return MOEQ_OK;
}

void moeq_kv_blocks_destroy(moeq_kv_blocks *c) {
    if (!c) return;
    free(c->tables);
    free(c->lens);
    free(c->free_stack);
    free(c->refs);
    free(c->rows);
    free(c->keys);
    free(c->parent);
    free(c->children);
    free(c->reg);
    free(c->hash_next);
    free(c->lru_prev);
    free(c->lru_next);
    free(c->buckets);
    free(c->keyed);
    free(c->recorded);
    free(c);
}

int64_t moeq_kv_blocks_count(const moeq_kv_blocks *c) { return c->n_blocks; }
int64_t moeq_kv_blocks_free(const moeq_kv_blocks *c) { return c->n_free + c->st.cached; }
int64_t moeq_kv_blocks_max_seq_tokens(const moeq_kv_blocks *c) { return c->max_blocks_per_seq * c->p.block_tokens; }
const int32_t *moeq_kv_blocks_tables(const moeq_kv_blocks *c) { return c->tables; }
int64_t moeq_kv_blocks_table_stride(const moeq_kv_blocks *c) { return c->max_blocks_per_seq; }
int32_t moeq_kv_blocks_refs(const moeq_kv_blocks *c, int32_t block) { return c->refs[block]; }

moeq_err moeq_kv_blocks_seq_new(moeq_kv_blocks *c, int *seq_id) {
    for (int i = 0; i < c->p.max_seqs; i++)
        if (c->lens[i] < 0) {
            c->lens[i] = 0;
            c->keyed[i] = c->recorded[i] = 0;
            *seq_id = i;
            return MOEQ_OK;
        }
    return MOEQ_ERR_LIMIT;
}

moeq_err moeq_kv_blocks_seq_open(moeq_kv_blocks *c, int seq_id) {
    if (seq_id < 0 || seq_id >= c->p.max_seqs || c->lens[seq_id] >= 0) return MOEQ_ERR_INVALID_ARG;
    c->lens[seq_id] = 0;
    c->keyed[seq_id] = c->recorded[seq_id] = 0;
    return MOEQ_OK;
}

int moeq_kv_blocks_seq_alive(const moeq_kv_blocks *c, int seq_id) {
    return seq_id >= 0 && seq_id < c->p.max_seqs && c->lens[seq_id] >= 0;
}

int64_t moeq_kv_blocks_seq_len(const moeq_kv_blocks *c, int seq_id) {
    return moeq_kv_blocks_seq_alive(c, seq_id) ? c->lens[seq_id] : -1;
}

static int64_t blocks_for(const moeq_kv_blocks *c, int64_t n_tokens) {
    return (n_tokens + c->p.block_tokens - 1) / c->p.block_tokens;
}

static int32_t *table_of(const moeq_kv_blocks *c, int seq_id) {
    return c->tables + (size_t)seq_id * c->max_blocks_per_seq;
}

/* ---- the prefix cache: hash table, LRU, eviction ---------------------------- */

static int32_t *row_of(const moeq_kv_blocks *c, int32_t b) { return c->rows + (size_t)b * c->key_width; }

static void lru_unlink(moeq_kv_blocks *c, int32_t b) {
    int32_t p = c->lru_prev[b], n = c->lru_next[b];
    if (p >= 0) c->lru_next[p] = n;
    else c->lru_head = n;
    if (n >= 0) c->lru_prev[n] = p;
    else c->lru_tail = p;
    c->st.cached--;
}

static void lru_append(moeq_kv_blocks *c, int32_t b) {
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->st.cached++;
}

static void unregister(moeq_kv_blocks *c, int32_t b) {
    int32_t *link = &c->buckets[c->keys[b] & (uint64_t)(c->n_buckets - 1)];
    while (*link != b) link = &c->hash_next[*link];
    *link = c->hash_next[b];
    if (c->parent[b] >= 0) c->children[c->parent[b]]--;
    c->reg[b] = 0;
    c->st.registered--;
}

/* Reuse the least recently released cached block without registered children (there is one whenever any
 * block is cached: a cached block's registered children are cached too, by the invariant). */
static int evict_one(moeq_kv_blocks *c) {
    int32_t b = c->lru_head;
    while (b >= 0 && c->children[b] > 0) b = c->lru_next[b];
    if (b < 0) return 0;
    lru_unlink(c, b);
    unregister(c, b);
    c->free_stack[c->n_free++] = b;
    c->st.evictions++;
    return 1;
}

static int32_t take_block(moeq_kv_blocks *c) {
    if (c->n_free == 0) evict_one(c); /* callers checked moeq_kv_blocks_free: one is cached */
    int32_t b = c->free_stack[--c->n_free];
    c->refs[b] = 1;
    return b;
}

/* One more holder of b (a hit, a fork, a dedup): a cached block leaves the LRU. */
static void hold_block(moeq_kv_blocks *c, int32_t b) {
    if (c->refs[b]++ == 0) lru_unlink(c, b);
}

/* Drop one reference; the last one frees the block, or caches it when registered. */
static void release_block(moeq_kv_blocks *c, int32_t b) {
    if (--c->refs[b] > 0) return;
    if (!c->reg[b]) {
        c->free_stack[c->n_free++] = b;
        return;
    }
    lru_append(c, b);
    while (c->st.cached > c->max_cached && evict_one(c)) {}
}

/* A fresh block holding what block src holds (entries past the owner's length are don't-care). */
static int32_t copy_block(moeq_kv_blocks *c, int32_t src) {
    int32_t b = take_block(c);
    if (c->p.copy) c->p.copy(c->p.copy_ctx, b, src);
    memcpy(row_of(c, b), row_of(c, src), (size_t)c->key_width * sizeof(int32_t)); /* the recorded ids */
    return b;
}

/* 1 when the sequence's last block is partially filled and shared: the next grow must copy it first. */
static int last_block_shared(const moeq_kv_blocks *c, int seq_id, int64_t len) {
    if (len % c->p.block_tokens == 0) return 0;
    int32_t b = table_of(c, seq_id)[blocks_for(c, len) - 1];
    return c->refs[b] > 1 || c->reg[b];
}

void moeq_kv_blocks_seq_free(moeq_kv_blocks *c, int seq_id) {
    if (!moeq_kv_blocks_seq_alive(c, seq_id)) return;
    moeq_kv_blocks_truncate(c, seq_id, 0);
    c->lens[seq_id] = -1;
}

int64_t moeq_kv_blocks_needed_after(const moeq_kv_blocks *c, int seq_id, int64_t keep_tokens, int64_t n_tokens) {
    int64_t len = c->lens[seq_id], keep = keep_tokens < len ? keep_tokens : len;
    if (n_tokens <= keep) return 0; /* the grow is a no-op; what the truncation frees is not counted */
    const int32_t *table = table_of(c, seq_id);
    int64_t kept = blocks_for(c, keep), freed = 0;
    for (int64_t b = kept; b < blocks_for(c, len); b++) freed += c->refs[table[b]] == 1;
    int64_t need = blocks_for(c, n_tokens) - kept + last_block_shared(c, seq_id, keep);
    return need > freed ? need - freed : 0;
}

int64_t moeq_kv_blocks_needed(const moeq_kv_blocks *c, int seq_id, int64_t n_tokens) {
    return moeq_kv_blocks_needed_after(c, seq_id, c->lens[seq_id], n_tokens);
}

moeq_err moeq_kv_blocks_grow(moeq_kv_blocks *c, int seq_id, int64_t n_tokens) {
    if (!moeq_kv_blocks_seq_alive(c, seq_id)) return MOEQ_ERR_INVALID_ARG;
    int64_t len = c->lens[seq_id];
    if (n_tokens <= len) return MOEQ_OK;
    int64_t have = blocks_for(c, len), want = blocks_for(c, n_tokens);
    if (want > c->max_blocks_per_seq || moeq_kv_blocks_needed(c, seq_id, n_tokens) > moeq_kv_blocks_free(c))
        return MOEQ_ERR_LIMIT;
    int32_t *table = table_of(c, seq_id);
    if (last_block_shared(c, seq_id, len)) { /* copy-on-write: the new positions land in this block */
        int32_t shared = table[have - 1];
        table[have - 1] = copy_block(c, shared);
        release_block(c, shared);
    }
    for (int64_t b = have; b < want; b++) table[b] = take_block(c);
    c->lens[seq_id] = n_tokens;
    return MOEQ_OK;
}

moeq_err moeq_kv_blocks_truncate(moeq_kv_blocks *c, int seq_id, int64_t n_tokens) {
    if (!moeq_kv_blocks_seq_alive(c, seq_id) || n_tokens < 0) return MOEQ_ERR_INVALID_ARG;
    if (n_tokens >= c->lens[seq_id]) return MOEQ_OK;
    int64_t have = blocks_for(c, c->lens[seq_id]), keep = blocks_for(c, n_tokens);
    int32_t *table = table_of(c, seq_id);
    for (int64_t b = have - 1; b >= keep; b--) release_block(c, table[b]); /* leaves first: older in the LRU */
    c->lens[seq_id] = n_tokens;
    if (c->keyed[seq_id] > n_tokens / c->p.block_tokens) c->keyed[seq_id] = n_tokens / c->p.block_tokens;
    if (c->recorded[seq_id] > n_tokens) c->recorded[seq_id] = n_tokens;
    return MOEQ_OK;
}

int64_t moeq_kv_blocks_fork_needed(const moeq_kv_blocks *c, int64_t n_tokens) {
    return n_tokens % c->p.block_tokens ? 1 : 0;
}

moeq_err moeq_kv_blocks_seq_fork(moeq_kv_blocks *c, int src, int64_t n_tokens, int dst) {
    if (!moeq_kv_blocks_seq_alive(c, src) || !moeq_kv_blocks_seq_alive(c, dst) || src == dst || c->lens[dst] != 0 ||
        n_tokens < 0 || n_tokens > c->lens[src])
        return MOEQ_ERR_INVALID_ARG;
    if (moeq_kv_blocks_fork_needed(c, n_tokens) > moeq_kv_blocks_free(c)) return MOEQ_ERR_LIMIT;
    const int32_t *from = table_of(c, src);
    int32_t *to = table_of(c, dst);
    int64_t full = n_tokens / c->p.block_tokens;
    for (int64_t b = 0; b < full; b++) {
        to[b] = from[b];
        hold_block(c, from[b]);
    }
    /* the partial block is copied now rather than shared: both sides would write into it next */
    if (full < blocks_for(c, n_tokens)) to[full] = copy_block(c, from[full]);
    c->lens[dst] = n_tokens;
    c->keyed[dst] = c->keyed[src] < full ? c->keyed[src] : full;
    c->recorded[dst] = c->recorded[src] < n_tokens ? c->recorded[src] : n_tokens;
    return MOEQ_OK;
}

/* ---- keys, registration, lookup ------------------------------------------------ */

uint64_t moeq_kv_blocks_default_hash(uint64_t h, const int32_t *row, int n) {
    for (int i = 0; i < n; i++) { /* splitmix64's finaliser over (h, id): every bit of each id reaches all 64 */
        uint64_t z = h ^ ((uint64_t)(uint32_t)row[i] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        h = z ^ (z >> 31);
    }
    return h;
}

void moeq_kv_blocks_set_hash(moeq_kv_blocks *c, moeq_kv_blocks_hash_fn hash) {
    if (c->st.registered == 0) c->hash = hash ? hash : moeq_kv_blocks_default_hash;
}

void moeq_kv_blocks_get_stats(const moeq_kv_blocks *c, moeq_kv_blocks_stats *stats) { *stats = c->st; }
int moeq_kv_blocks_registered(const moeq_kv_blocks *c, int32_t block) { return c->reg[block]; }
int64_t moeq_kv_blocks_seq_keyed(const moeq_kv_blocks *c, int seq_id) {
    return moeq_kv_blocks_seq_alive(c, seq_id) ? c->keyed[seq_id] : 0;
}

int64_t moeq_kv_blocks_lru_rank(const moeq_kv_blocks *c, int32_t block) {
    int64_t rank = 0;
    for (int32_t b = c->lru_head; b >= 0; b = c->lru_next[b], rank++)
        if (b == block) return rank;
    return -1;
}

static uint64_t key_of(const moeq_kv_blocks *c, int32_t parent, const int32_t *row) {
    return c->hash(parent >= 0 ? c->keys[parent] : c->p.salt, row, c->key_width);
}

/* The registered block with this key, parent and row, or -1; key matches that fail the comparison count
 * as collisions (through the non-const stats pointer, NULL for a pure lookup). */
static int32_t find(const moeq_kv_blocks *c, uint64_t key, int32_t parent, const int32_t *row, int64_t *collisions) {
    for (int32_t b = c->buckets[key & (uint64_t)(c->n_buckets - 1)]; b >= 0; b = c->hash_next[b]) {
        if (c->keys[b] != key) continue;
        if (c->parent[b] == parent && !memcmp(row_of(c, b), row, (size_t)c->key_width * sizeof(int32_t))) return b;
        if (collisions) (*collisions)++;
    }
    return -1;
}

/* Register block index bi of seq (full, row filled in): or, when an equal block is registered already,
 * put that one in the table instead (same tokens, same parent: the same entries) and let this one go. */
static void register_block(moeq_kv_blocks *c, int seq_id, int64_t bi) {
    int32_t *table = table_of(c, seq_id), b = table[bi], parent = bi > 0 ? table[bi - 1] : -1;
    uint64_t key = key_of(c, parent, row_of(c, b));
    int32_t same = find(c, key, parent, row_of(c, b), &c->st.collisions);
    if (same >= 0) {
        if (same != b) {
            hold_block(c, same);
            table[bi] = same;
            release_block(c, b);
            c->st.deduplicated++;
        }
    } else if (!c->reg[b]) {
        c->keys[b] = key;
        c->parent[b] = parent;
        c->reg[b] = 1;
        if (parent >= 0) c->children[parent]++;
        int32_t *head = &c->buckets[key & (uint64_t)(c->n_buckets - 1)];
        c->hash_next[b] = *head;
        *head = b;
        c->st.registered++;
    }
    c->keyed[seq_id] = bi + 1;
}

void moeq_kv_blocks_set_tokens(moeq_kv_blocks *c, int seq_id, int64_t from, const int32_t *tokens, int64_t n) {
    if (!c->p.prefix_cache || c->p.lookahead > 0 || !moeq_kv_blocks_seq_alive(c, seq_id)) return;
    if (from != c->recorded[seq_id] || from + n > c->lens[seq_id]) return;
    const int32_t *table = table_of(c, seq_id);
    int64_t bt = c->p.block_tokens;
    for (int64_t i = 0; i < n; i++) row_of(c, table[(from + i) / bt])[(from + i) % bt] = tokens[i];
    c->recorded[seq_id] = from + n;
    while ((c->keyed[seq_id] + 1) * bt <= c->recorded[seq_id]) register_block(c, seq_id, c->keyed[seq_id]);
}

int moeq_kv_blocks_seq_tokens(const moeq_kv_blocks *c, int seq_id, int64_t from, int64_t n, int32_t *out) {
    if (!moeq_kv_blocks_seq_alive(c, seq_id) || from < 0 || from + n > c->recorded[seq_id]) return 0;
    const int32_t *table = table_of(c, seq_id);
    int64_t bt = c->p.block_tokens;
    for (int64_t i = 0; i < n; i++) out[i] = row_of(c, table[(from + i) / bt])[(from + i) % bt];
    return 1;
}

int moeq_kv_blocks_key_next(moeq_kv_blocks *c, int seq_id, const int32_t *row) {
    if (!c->p.prefix_cache || !moeq_kv_blocks_seq_alive(c, seq_id)) return 0;
    int64_t bi = c->keyed[seq_id];
    if ((bi + 1) * c->p.block_tokens > c->lens[seq_id]) return 0;
    int32_t b = table_of(c, seq_id)[bi];
    /* a block registered by a sequence it is shared with already has this row (a shared prefix) */
    if (!c->reg[b]) memcpy(row_of(c, b), row, (size_t)c->key_width * sizeof(int32_t));
    register_block(c, seq_id, bi);
    return 1;
}

/*
 * Walk the registered chain matching tokens; out (may be NULL) receives its blocks. held_only: stop at the first
 * block no sequence holds (a held block's parents are held too, so the held ones are a leading run).
 */
static int64_t walk(const moeq_kv_blocks *c, const int32_t *tokens, int64_t n_tokens, int64_t max_blocks,
                    int32_t *out, int64_t *collisions, int held_only) {
    if (!c->p.prefix_cache || c->st.registered == 0) return 0;
    int64_t bt = c->p.block_tokens, n = 0;
    int32_t parent = -1;
    while (n < max_blocks && n < c->max_blocks_per_seq && (n + 1) * bt + (c->key_width - bt) <= n_tokens) {
        const int32_t *row = tokens + n * bt;
        int32_t b = find(c, key_of(c, parent, row), parent, row, collisions);
        if (b < 0 || (held_only && c->refs[b] <= 0)) break;
        if (out) out[n] = b;
        parent = b;
        n++;
    }
    return n;
}

int64_t moeq_kv_blocks_lookup(const moeq_kv_blocks *c, const int32_t *tokens, int64_t n_tokens, int64_t max_blocks) {
    return walk(c, tokens, n_tokens, max_blocks, NULL, NULL, 0);
}

int64_t moeq_kv_blocks_lookup_held(const moeq_kv_blocks *c, const int32_t *tokens, int64_t n_tokens,
                                   int64_t max_blocks) {
    return walk(c, tokens, n_tokens, max_blocks, NULL, NULL, 1);
}

int64_t moeq_kv_blocks_seq_take_prefix(moeq_kv_blocks *c, int seq_id, const int32_t *tokens, int64_t n_tokens,
                                       int64_t max_blocks) {
    if (!moeq_kv_blocks_seq_alive(c, seq_id) || c->lens[seq_id] != 0 || !c->p.prefix_cache) return 0;
    c->st.lookups++;
    int32_t *table = table_of(c, seq_id);
    int64_t n = walk(c, tokens, n_tokens, max_blocks, table, &c->st.collisions, 0);
    for (int64_t b = 0; b < n; b++) hold_block(c, table[b]);
    c->st.hit_blocks += n;
    c->lens[seq_id] = n * c->p.block_tokens;
    c->keyed[seq_id] = n;
    c->recorded[seq_id] = c->p.lookahead > 0 ? 0 : n * c->p.block_tokens;
    return n;
}
