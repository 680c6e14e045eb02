/*
 * kv_cache.c — the paged MLA cache (see kv_cache.h). One allocation for the
 * pool, one for the block tables, one for the free stack, all at creation.
 */
#include "kv_cache.h"

#include <stdlib.h>

struct moeq_kv_cache {
    moeq_kv_cache_params p;
    int64_t n_blocks;
    int64_t max_blocks_per_seq;
    size_t block_floats;       /* n_layers * block_tokens * entry_floats */
    float *pool;               /* [n_blocks][block_floats]              */
    int32_t *tables;           /* [max_seqs][max_blocks_per_seq]        */
    int64_t *lens;             /* [max_seqs], -1 = free slot            */
    int32_t *free_stack;       /* [n_blocks]                            */
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
    c->pool = aligned_alloc(64, ((c->n_blocks * c->block_floats * sizeof(float)) + 63) / 64 * 64);
    c->tables = malloc((size_t)p->max_seqs * c->max_blocks_per_seq * sizeof(int32_t));
    c->lens = malloc((size_t)p->max_seqs * sizeof(int64_t));
    c->free_stack = malloc((size_t)c->n_blocks * sizeof(int32_t));
    if (!c->pool || !c->tables || !c->lens || !c->free_stack) {
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
    free(cache->pool);
    free(cache->tables);
    free(cache->lens);
    free(cache->free_stack);
    free(cache);
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

void moeq_kv_cache_seq_free(moeq_kv_cache *cache, int seq_id) {
    if (!moeq_kv_cache_seq_alive(cache, seq_id)) return;
    moeq_kv_cache_truncate(cache, seq_id, 0);
    cache->lens[seq_id] = -1;
}

int64_t moeq_kv_cache_blocks_needed(const moeq_kv_cache *cache, int seq_id, int64_t n_tokens) {
    int64_t have = blocks_for(cache, cache->lens[seq_id]), want = blocks_for(cache, n_tokens);
    return want > have ? want - have : 0;
}

moeq_err moeq_kv_cache_grow(moeq_kv_cache *cache, int seq_id, int64_t n_tokens) {
    if (!moeq_kv_cache_seq_alive(cache, seq_id)) return MOEQ_ERR_INVALID_ARG;
    if (n_tokens <= cache->lens[seq_id]) return MOEQ_OK;
    int64_t have = blocks_for(cache, cache->lens[seq_id]), want = blocks_for(cache, n_tokens);
    if (want > cache->max_blocks_per_seq || want - have > cache->n_free) return MOEQ_ERR_LIMIT;
    int32_t *table = cache->tables + (size_t)seq_id * cache->max_blocks_per_seq;
    for (int64_t b = have; b < want; b++) table[b] = cache->free_stack[--cache->n_free];
    cache->lens[seq_id] = n_tokens;
    return MOEQ_OK;
}

moeq_err moeq_kv_cache_truncate(moeq_kv_cache *cache, int seq_id, int64_t n_tokens) {
    if (!moeq_kv_cache_seq_alive(cache, seq_id) || n_tokens < 0) return MOEQ_ERR_INVALID_ARG;
    if (n_tokens >= cache->lens[seq_id]) return MOEQ_OK;
    int64_t have = blocks_for(cache, cache->lens[seq_id]), keep = blocks_for(cache, n_tokens);
    int32_t *table = cache->tables + (size_t)seq_id * cache->max_blocks_per_seq;
    for (int64_t b = have - 1; b >= keep; b--) cache->free_stack[cache->n_free++] = table[b];
    cache->lens[seq_id] = n_tokens;
    return MOEQ_OK;
}

float *moeq_kv_cache_entry(const moeq_kv_cache *cache, int seq_id, int layer, int64_t pos) {
    const int32_t *table = cache->tables + (size_t)seq_id * cache->max_blocks_per_seq;
    int64_t blk = table[pos / cache->p.block_tokens], off = pos % cache->p.block_tokens;
    return cache->pool + (size_t)blk * cache->block_floats +
           ((size_t)layer * cache->p.block_tokens + (size_t)off) * cache->p.entry_floats;
}

moeq_kv_view moeq_kv_cache_view(const moeq_kv_cache *cache, int seq_id, int layer) {
    return (moeq_kv_view){cache->pool + (size_t)layer * cache->p.block_tokens * cache->p.entry_floats,
                          cache->tables + (size_t)seq_id * cache->max_blocks_per_seq, cache->block_floats,
                          cache->p.block_tokens, cache->p.entry_floats};
}
