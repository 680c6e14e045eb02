/*
 * kv_cache.c — the paged MLA cache (see kv_cache.h). One allocation for the
 * pool, one for the block tables, one for the free stack, one for the block
 * reference counts, all at creation.
 *
 * Sharing: a block is referenced by every sequence whose table holds it
 * (moeq_kv_cache_seq_fork). A sequence writes only at positions >= its
 * length, so the only shared block it can write into is its partially
 * filled last one, and only after a truncation made a shared full block
 * partial; grow copies exactly that block first (copy-on-write).
 */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

struct moeq_kv_cache {
    moeq_kv_cache_params p;
    int64_t n_blocks;
    int64_t max_blocks_per_seq;
    size_t block_floats;       /* n_layers * block_tokens * entry_floats */
    float *pool;               /* [n_blocks][block_floats]              */
    int own_pool;              /* 1: allocated here, 0: the backend's   */
    int32_t *tables;           /* [max_seqs][max_blocks_per_seq]        */
    int64_t *lens;             /* [max_seqs], -1 = free slot            */
    int32_t *free_stack;       /* [n_blocks]                            */
    int32_t *refs;             /* [n_blocks] tables holding the block; 0 = free */
    int64_t n_free;
};

moeq_err moeq_kv_cache_new(const moeq_kv_cache_params *params, moeq_kv_cache **out, char *errstr,
                           size_t errstr_size) {
    *out = NULL;
    const moeq_kv_cache_params *p = params;
    if (p->n_layers < 1 || p->entry_floats < 1 || p->block_tokens < 1 || p->capacity_tokens < 1 || p->max_seqs < 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "kv cache: n_layers, entry_floats, kv_block_tokens, kv_cache_tokens, max_seqs must be >= 1");
    moeq_kv_cache *c = calloc(1, sizeof(*c));
    if (!c) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "kv cache");
    c->p = *p;
    c->n_blocks = (p->capacity_tokens + p->block_tokens - 1) / p->block_tokens;
    c->max_blocks_per_seq = c->n_blocks;
    c->block_floats = (size_t)p->n_layers * p->block_tokens * p->entry_floats;
    c->own_pool = p->pool == NULL;
    c->pool = p->pool ? p->pool : aligned_alloc(64, (moeq_kv_cache_pool_floats(p) * sizeof(float) + 63) / 64 * 64);
    c->tables = malloc((size_t)p->max_seqs * c->max_blocks_per_seq * sizeof(int32_t));
    c->lens = malloc((size_t)p->max_seqs * sizeof(int64_t));
    c->free_stack = malloc((size_t)c->n_blocks * sizeof(int32_t));
    c->refs = calloc((size_t)c->n_blocks, sizeof(int32_t));
    if (!c->pool || !c->tables || !c->lens || !c->free_stack || !c->refs) {
        moeq_kv_cache_destroy(c);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "kv cache: %lld tokens x %zu bytes",
                         (long long)p->capacity_tokens, (size_t)p->n_layers * p->entry_floats * sizeof(float));
    }
    for (int i = 0; i < p->max_seqs; i++) c->lens[i] = -1;
    /* stack top = lowest block id, so a fresh cache hands out blocks in order */
    for (int64_t i = 0; i < c->n_blocks; i++) c->free_stack[i] = (int32_t)(c->n_blocks - 1 - i);
    c->n_free = c->n_blocks;
    *out = c;
    return MOEQ_OK;
}

void moeq_kv_cache_destroy(moeq_kv_cache *cache) {
    if (!cache) return;
    if (cache->own_pool) free(cache->pool);
    free(cache->tables);
    free(cache->lens);
    free(cache->free_stack);
    free(cache->refs);
    free(cache);
}

size_t moeq_kv_cache_pool_floats(const moeq_kv_cache_params *p) {
    int64_t n_blocks = (p->capacity_tokens + p->block_tokens - 1) / p->block_tokens;
    return (size_t)n_blocks * (size_t)p->n_layers * p->block_tokens * p->entry_floats;
}

size_t moeq_kv_cache_bytes_per_token(const moeq_kv_cache *cache) {
    return (size_t)cache->p.n_layers * cache->p.entry_floats * sizeof(float);
}

int64_t moeq_kv_cache_max_seq_tokens(const moeq_kv_cache *cache) {
    return cache->max_blocks_per_seq * cache->p.block_tokens;
}

int64_t moeq_kv_cache_free_blocks(const moeq_kv_cache *cache) { return cache->n_free; }

moeq_err moeq_kv_cache_seq_new(moeq_kv_cache *cache, int *seq_id) {
    for (int i = 0; i < cache->p.max_seqs; i++)
        if (cache->lens[i] < 0) {
            cache->lens[i] = 0;
            *seq_id = i;
            return MOEQ_OK;
        }
    return MOEQ_ERR_LIMIT;
}

moeq_err moeq_kv_cache_seq_open(moeq_kv_cache *cache, int seq_id) {
    if (seq_id < 0 || seq_id >= cache->p.max_seqs || cache->lens[seq_id] >= 0) return MOEQ_ERR_INVALID_ARG;
    cache->lens[seq_id] = 0;
    return MOEQ_OK;
}

int moeq_kv_cache_seq_alive(const moeq_kv_cache *cache, int seq_id) {
    return seq_id >= 0 && seq_id < cache->p.max_seqs && cache->lens[seq_id] >= 0;
}

int64_t moeq_kv_cache_seq_len(const moeq_kv_cache *cache, int seq_id) {
    return moeq_kv_cache_seq_alive(cache, seq_id) ? cache->lens[seq_id] : -1;
}

static int64_t blocks_for(const moeq_kv_cache *cache, int64_t n_tokens) {
    return (n_tokens + cache->p.block_tokens - 1) / cache->p.block_tokens;
}

static int32_t *table_of(const moeq_kv_cache *cache, int seq_id) {
    return cache->tables + (size_t)seq_id * cache->max_blocks_per_seq;
}

static int32_t take_block(moeq_kv_cache *cache) {
    int32_t b = cache->free_stack[--cache->n_free];
    cache->refs[b] = 1;
    return b;
}

/* Drop one reference; the block is free again when it was the last. */
static void release_block(moeq_kv_cache *cache, int32_t b) {
    if (--cache->refs[b] == 0) cache->free_stack[cache->n_free++] = b;
}

/* A fresh block with every layer's entries of block src (entries past the owner's length are don't-care). */
static int32_t copy_block(moeq_kv_cache *cache, int32_t src) {
    int32_t b = take_block(cache);
    float *to = cache->pool + (size_t)b * cache->block_floats;
    const float *from = cache->pool + (size_t)src * cache->block_floats;
    if (cache->p.copy) cache->p.copy(cache->p.copy_ctx, to, from, cache->block_floats);
    else memcpy(to, from, cache->block_floats * sizeof(float));
    return b;
}

/* 1 when the sequence's last block is partially filled and shared: the next grow must copy it first. */
static int last_block_shared(const moeq_kv_cache *cache, int seq_id, int64_t len) {
    if (len % cache->p.block_tokens == 0) return 0;
    return cache->refs[table_of(cache, seq_id)[blocks_for(cache, len) - 1]] > 1;
}

void moeq_kv_cache_seq_free(moeq_kv_cache *cache, int seq_id) {
    if (!moeq_kv_cache_seq_alive(cache, seq_id)) return;
    moeq_kv_cache_truncate(cache, seq_id, 0);
    cache->lens[seq_id] = -1;
}

int64_t moeq_kv_cache_blocks_needed_after(const moeq_kv_cache *cache, int seq_id, int64_t keep_tokens,
                                          int64_t n_tokens) {
    int64_t len = cache->lens[seq_id], keep = keep_tokens < len ? keep_tokens : len;
    if (n_tokens <= keep) return 0; /* the grow is a no-op; what the truncation frees is not counted */
    const int32_t *table = table_of(cache, seq_id);
    int64_t kept = blocks_for(cache, keep), freed = 0;
    for (int64_t b = kept; b < blocks_for(cache, len); b++) freed += cache->refs[table[b]] == 1;
    int64_t need = blocks_for(cache, n_tokens) - kept + last_block_shared(cache, seq_id, keep);
    return need > freed ? need - freed : 0;
}

int64_t moeq_kv_cache_blocks_needed(const moeq_kv_cache *cache, int seq_id, int64_t n_tokens) {
    return moeq_kv_cache_blocks_needed_after(cache, seq_id, cache->lens[seq_id], n_tokens);
}

moeq_err moeq_kv_cache_grow(moeq_kv_cache *cache, int seq_id, int64_t n_tokens) {
    if (!moeq_kv_cache_seq_alive(cache, seq_id)) return MOEQ_ERR_INVALID_ARG;
    int64_t len = cache->lens[seq_id];
    if (n_tokens <= len) return MOEQ_OK;
    int64_t have = blocks_for(cache, len), want = blocks_for(cache, n_tokens);
    if (want > cache->max_blocks_per_seq || moeq_kv_cache_blocks_needed(cache, seq_id, n_tokens) > cache->n_free)
        return MOEQ_ERR_LIMIT;
    int32_t *table = table_of(cache, seq_id);
    if (last_block_shared(cache, seq_id, len)) { /* copy-on-write: the new positions land in this block */
        int32_t shared = table[have - 1];
        table[have - 1] = copy_block(cache, shared);
        release_block(cache, shared);
    }
    for (int64_t b = have; b < want; b++) table[b] = take_block(cache);
    cache->lens[seq_id] = n_tokens;
    return MOEQ_OK;
}

moeq_err moeq_kv_cache_truncate(moeq_kv_cache *cache, int seq_id, int64_t n_tokens) {
    if (!moeq_kv_cache_seq_alive(cache, seq_id) || n_tokens < 0) return MOEQ_ERR_INVALID_ARG;
    if (n_tokens >= cache->lens[seq_id]) return MOEQ_OK;
    int64_t have = blocks_for(cache, cache->lens[seq_id]), keep = blocks_for(cache, n_tokens);
    int32_t *table = table_of(cache, seq_id);
    for (int64_t b = have - 1; b >= keep; b--) release_block(cache, table[b]);
    cache->lens[seq_id] = n_tokens;
    return MOEQ_OK;
}

int64_t moeq_kv_cache_fork_blocks_needed(const moeq_kv_cache *cache, int64_t n_tokens) {
    return n_tokens % cache->p.block_tokens ? 1 : 0;
}

moeq_err moeq_kv_cache_seq_fork(moeq_kv_cache *cache, int src, int64_t n_tokens, int dst) {
    if (!moeq_kv_cache_seq_alive(cache, src) || !moeq_kv_cache_seq_alive(cache, dst) || src == dst ||
        cache->lens[dst] != 0 || n_tokens < 0 || n_tokens > cache->lens[src])
        return MOEQ_ERR_INVALID_ARG;
    if (moeq_kv_cache_fork_blocks_needed(cache, n_tokens) > cache->n_free) return MOEQ_ERR_LIMIT;
    const int32_t *from = table_of(cache, src);
    int32_t *to = table_of(cache, dst);
    int64_t full = n_tokens / cache->p.block_tokens;
    for (int64_t b = 0; b < full; b++) {
        to[b] = from[b];
        cache->refs[from[b]]++;
    }
    /* the partial block is copied now rather than shared: both sides would write into it next */
    if (full < blocks_for(cache, n_tokens)) to[full] = copy_block(cache, from[full]);
    cache->lens[dst] = n_tokens;
    return MOEQ_OK;
}

float *moeq_kv_cache_entry(const moeq_kv_cache *cache, int seq_id, int layer, int64_t pos) {
    const int32_t *table = table_of(cache, seq_id);
    int64_t blk = table[pos / cache->p.block_tokens], off = pos % cache->p.block_tokens;
    return cache->pool + (size_t)blk * cache->block_floats +
           ((size_t)layer * cache->p.block_tokens + (size_t)off) * cache->p.entry_floats;
}

moeq_kv_paged moeq_kv_cache_paged(const moeq_kv_cache *cache, int layer) {
    return (moeq_kv_paged){cache->pool, cache->tables, cache->max_blocks_per_seq, cache->block_floats,
                           (size_t)layer * cache->p.block_tokens * cache->p.entry_floats, cache->p.block_tokens,
                           cache->p.entry_floats};
}

moeq_kv_view moeq_kv_cache_view(const moeq_kv_cache *cache, int seq_id, int layer) {
    moeq_kv_paged kv = moeq_kv_cache_paged(cache, layer);
    return moeq_kv_paged_view(&kv, seq_id);
}
