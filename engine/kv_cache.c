/*
 * kv_cache.c — the paged MLA cache (see kv_cache.h): the bookkeeping of
 * kv_blocks.c (tables, reference counts, forks, copy-on-write; block ids
 * only) put together with the storage — an entry pool that is the backend's
 * buffer (params.pool) or, standalone, a host allocation made here. This file
 * is the only one that turns a block id into a float pointer, and only for
 * the copies kv_blocks asks for and for tests' entry access; kernels get the
 * plain-data view (moeq_kv_cache_paged).
 */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "kv_blocks.h"

struct moeq_kv_cache {
    moeq_kv_cache_params p;
    moeq_kv_blocks *blocks;
    size_t block_floats;       /* n_layers * block_tokens * entry_floats */
    float *pool;               /* [n_blocks][block_floats]              */
    int own_pool;              /* 1: allocated here, 0: the backend's   */
};

/* kv_blocks gave a sequence its own copy of block src: move the storage (every layer). */
static void copy_storage(void *ctx, int32_t dst, int32_t src) {
    moeq_kv_cache *c = ctx;
    float *to = c->pool + (size_t)dst * c->block_floats;
    const float *from = c->pool + (size_t)src * c->block_floats;
    if (c->p.copy) c->p.copy(c->p.copy_ctx, to, from, c->block_floats);
    else memcpy(to, from, c->block_floats * sizeof(float));
}

size_t moeq_kv_cache_pool_floats(const moeq_kv_cache_params *p) {
    int64_t n_blocks = (p->capacity_tokens + p->block_tokens - 1) / p->block_tokens;
    return (size_t)n_blocks * (size_t)p->n_layers * p->block_tokens * p->entry_floats;
}

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
    c->block_floats = (size_t)p->n_layers * p->block_tokens * p->entry_floats;
    c->own_pool = p->pool == NULL;
    c->pool = p->pool ? p->pool : aligned_alloc(64, (moeq_kv_cache_pool_floats(p) * sizeof(float) + 63) / 64 * 64);
    if (!c->pool) {
        moeq_kv_cache_destroy(c);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "kv cache: %lld tokens x %zu bytes",
                         (long long)p->capacity_tokens, (size_t)p->n_layers * p->entry_floats * sizeof(float));
    }
    moeq_kv_blocks_params bp = {p->block_tokens, p->capacity_tokens, p->max_seqs, copy_storage, c,
                                p->prefix_cache, p->lookahead, p->max_cached_blocks, p->salt};
    moeq_err err = moeq_kv_blocks_new(&bp, &c->blocks, errstr, errstr_size);
    if (err) {
        moeq_kv_cache_destroy(c);
        return err;
    }
    *out = c;
    return MOEQ_OK;
}

void moeq_kv_cache_destroy(moeq_kv_cache *cache) {
    if (!cache) return;
    if (cache->own_pool) free(cache->pool);
    moeq_kv_blocks_destroy(cache->blocks);
    free(cache);
}

size_t moeq_kv_cache_bytes_per_token(const moeq_kv_cache *cache) {
    return (size_t)cache->p.n_layers * cache->p.entry_floats * sizeof(float);
}

int64_t moeq_kv_cache_max_seq_tokens(const moeq_kv_cache *c) { return moeq_kv_blocks_max_seq_tokens(c->blocks); }
int64_t moeq_kv_cache_free_blocks(const moeq_kv_cache *c) { return moeq_kv_blocks_free(c->blocks); }
int64_t moeq_kv_cache_total_blocks(const moeq_kv_cache *c) { return moeq_kv_blocks_count(c->blocks); }
moeq_err moeq_kv_cache_seq_new(moeq_kv_cache *c, int *seq_id) { return moeq_kv_blocks_seq_new(c->blocks, seq_id); }
moeq_err moeq_kv_cache_seq_open(moeq_kv_cache *c, int seq_id) { return moeq_kv_blocks_seq_open(c->blocks, seq_id); }
int moeq_kv_cache_seq_alive(const moeq_kv_cache *c, int seq_id) { return moeq_kv_blocks_seq_alive(c->blocks, seq_id); }
int64_t moeq_kv_cache_seq_len(const moeq_kv_cache *c, int seq_id) { return moeq_kv_blocks_seq_len(c->blocks, seq_id); }
void moeq_kv_cache_seq_free(moeq_kv_cache *c, int seq_id) { moeq_kv_blocks_seq_free(c->blocks, seq_id); }

int64_t moeq_kv_cache_blocks_needed_after(const moeq_kv_cache *c, int seq_id, int64_t keep_tokens, int64_t n_tokens) {
    return moeq_kv_blocks_needed_after(c->blocks, seq_id, keep_tokens, n_tokens);
}

int64_t moeq_kv_cache_blocks_needed(const moeq_kv_cache *c, int seq_id, int64_t n_tokens) {
    return moeq_kv_blocks_needed(c->blocks, seq_id, n_tokens);
}

moeq_err moeq_kv_cache_grow(moeq_kv_cache *c, int seq_id, int64_t n_tokens) {
    return moeq_kv_blocks_grow(c->blocks, seq_id, n_tokens);
}

moeq_err moeq_kv_cache_truncate(moeq_kv_cache *c, int seq_id, int64_t n_tokens) {
    return moeq_kv_blocks_truncate(c->blocks, seq_id, n_tokens);
}

int64_t moeq_kv_cache_fork_blocks_needed(const moeq_kv_cache *c, int64_t n_tokens) {
    return moeq_kv_blocks_fork_needed(c->blocks, n_tokens);
}

moeq_err moeq_kv_cache_seq_fork(moeq_kv_cache *c, int src, int64_t n_tokens, int dst) {
    return moeq_kv_blocks_seq_fork(c->blocks, src, n_tokens, dst);
}

moeq_kv_paged moeq_kv_cache_paged(const moeq_kv_cache *c, int layer) {
    return (moeq_kv_paged){c->pool, moeq_kv_blocks_tables(c->blocks), moeq_kv_blocks_table_stride(c->blocks),
                           c->block_floats, (size_t)layer * c->p.block_tokens * c->p.entry_floats, c->p.block_tokens,
                           c->p.entry_floats};
}

moeq_kv_view moeq_kv_cache_view(const moeq_kv_cache *cache, int seq_id, int layer) {
    moeq_kv_paged kv = moeq_kv_cache_paged(cache, layer);
    return moeq_kv_paged_view(&kv, seq_id);
}

float *moeq_kv_cache_entry(const moeq_kv_cache *cache, int seq_id, int layer, int64_t pos) {
    moeq_kv_paged kv = moeq_kv_cache_paged(cache, layer);
    return moeq_kv_paged_entry(&kv, seq_id, pos);
}

void moeq_kv_cache_set_tokens(moeq_kv_cache *c, int seq_id, int64_t from, const int32_t *tokens, int64_t n) {
    moeq_kv_blocks_set_tokens(c->blocks, seq_id, from, tokens, n);
}

int moeq_kv_cache_seq_tokens(const moeq_kv_cache *c, int seq_id, int64_t from, int64_t n, int32_t *out) {
    return moeq_kv_blocks_seq_tokens(c->blocks, seq_id, from, n, out);
}

int64_t moeq_kv_cache_seq_keyed(const moeq_kv_cache *c, int seq_id) { return moeq_kv_blocks_seq_keyed(c->blocks, seq_id); }
int moeq_kv_cache_key_next(moeq_kv_cache *c, int seq_id, const int32_t *row) {
    return moeq_kv_blocks_key_next(c->blocks, seq_id, row);
}

int64_t moeq_kv_cache_lookup(const moeq_kv_cache *c, const int32_t *tokens, int64_t n_tokens, int64_t max_blocks) {
    return moeq_kv_blocks_lookup(c->blocks, tokens, n_tokens, max_blocks);
}

int64_t moeq_kv_cache_lookup_held(const moeq_kv_cache *c, const int32_t *tokens, int64_t n_tokens,
                                  int64_t max_blocks) {
    return moeq_kv_blocks_lookup_held(c->blocks, tokens, n_tokens, max_blocks);
}

int64_t moeq_kv_cache_take_prefix(moeq_kv_cache *c, int seq_id, const int32_t *tokens, int64_t n_tokens,
                                  int64_t max_blocks) {
    return moeq_kv_blocks_seq_take_prefix(c->blocks, seq_id, tokens, n_tokens, max_blocks);
}

int moeq_kv_cache_block_tokens(const moeq_kv_cache *c) { return c->p.block_tokens; }
void moeq_kv_cache_prefix_stats(const moeq_kv_cache *c, moeq_kv_blocks_stats *stats) {
    moeq_kv_blocks_get_stats(c->blocks, stats);
}
void moeq_kv_cache_set_hash(moeq_kv_cache *c, moeq_kv_blocks_hash_fn hash) { moeq_kv_blocks_set_hash(c->blocks, hash); }
