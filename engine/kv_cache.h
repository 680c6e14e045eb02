/*
 * kv_cache.h — internal: the paged MLA cache: the bookkeeping of
 * kv_blocks.h (pure host logic, block ids only) and the entry pool (a backend
 * buffer, or a host pool for standalone use) in one object.
 *
 * Per token and layer it holds only what MLA with weight absorption needs:
 * the normalised compressed latent (kv_lora_rank floats) followed by the
 * roped rope key (qk_rope_head_dim floats) — never expanded K/V. Memory is
 * one pool of fixed-size blocks, allocated at creation; each sequence has a
 * block table, free blocks sit on a stack. Appending reserves blocks,
 * truncating returns them; nothing is allocated per token.
 *
 * Blocks are reference counted so that sequences can share a prefix
 * (moeq_kv_cache_seq_fork): a block returns to the free stack when its last
 * sequence drops it, and a sequence about to write into a shared block (its
 * partially filled last block, after a truncation) gets its own copy first.
 *
 * Block layout: [layer][token in block][entry], float32.
 * Not thread-safe for mutation; concurrent reads of entries are fine.
 */
#ifndef MOEQ_ENGINE_KV_CACHE_H
#define MOEQ_ENGINE_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_paged.h"
#include "moeq/err.h"

typedef struct moeq_kv_cache moeq_kv_cache;

typedef struct moeq_kv_cache_params {
    int n_layers;
    int entry_floats;       /* kv_lora_rank + qk_rope_head_dim */
    int block_tokens;       /* tokens per block                */
    int64_t capacity_tokens;/* all sequences together          */
    int max_seqs;
    /* Storage from outside (the backend's cache buffer): NULL = the cache allocates a host pool. The pool
     * must hold moeq_kv_cache_pool_floats() floats; copy moves a block within it (copy-on-write, forks). */
    float *pool;
    void (*copy)(void *ctx, float *dst, const float *src, size_t n_floats);
    void *copy_ctx;
    /* The prefix cache of kv_blocks.h (docs/PREFIX_CACHE.md); 0 = off. */
    int prefix_cache;
    int lookahead;            /* key row tokens past the block: 0 main, 1 MTP (entry i reads token i + 1) */
    int64_t max_cached_blocks;/* most released blocks kept cached; 0 = all                                */
    uint64_t salt;            /* model identity and cache kind                                            */
} moeq_kv_cache_params;

/* Floats of the pool a cache with these params uses. */
size_t moeq_kv_cache_pool_floats(const moeq_kv_cache_params *params);

moeq_err moeq_kv_cache_new(const moeq_kv_cache_params *params, moeq_kv_cache **out, char *errstr,
                           size_t errstr_size);
void moeq_kv_cache_destroy(moeq_kv_cache *cache); /* NULL is safe */

size_t moeq_kv_cache_bytes_per_token(const moeq_kv_cache *cache);
/* Longest sequence the block table can describe (the capacity). */
int64_t moeq_kv_cache_max_seq_tokens(const moeq_kv_cache *cache);
int64_t moeq_kv_cache_free_blocks(const moeq_kv_cache *cache);  /* free stack + cached (evicted on demand) */
int64_t moeq_kv_cache_total_blocks(const moeq_kv_cache *cache); /* the pool                                 */

/* A new empty sequence; MOEQ_ERR_LIMIT when max_seqs are alive. */
moeq_err moeq_kv_cache_seq_new(moeq_kv_cache *cache, int *seq_id);
/* Open the free slot seq_id (a second cache kept in step with another's ids); INVALID_ARG when taken. */
moeq_err moeq_kv_cache_seq_open(moeq_kv_cache *cache, int seq_id);
void moeq_kv_cache_seq_free(moeq_kv_cache *cache, int seq_id);
int moeq_kv_cache_seq_alive(const moeq_kv_cache *cache, int seq_id);
int64_t moeq_kv_cache_seq_len(const moeq_kv_cache *cache, int seq_id);

/* Blocks that growing seq_id to n_tokens would take from the free list (counting the copy of a shared last block). */
int64_t moeq_kv_cache_blocks_needed(const moeq_kv_cache *cache, int seq_id, int64_t n_tokens);

/*
 * Blocks that truncating seq_id to keep_tokens and then growing it to
 * n_tokens would take from the free list, net of the blocks the truncation
 * frees (shared blocks are not freed by it). 0 when n_tokens <= keep_tokens.
 */
int64_t moeq_kv_cache_blocks_needed_after(const moeq_kv_cache *cache, int seq_id, int64_t keep_tokens,
                                          int64_t n_tokens);

/*
 * Grow the sequence to n_tokens (entries beyond the old length are
 * uninitialised). When its partially filled last block is shared it is
 * copied first (copy-on-write). MOEQ_ERR_LIMIT when full (nothing changed).
 */
moeq_err moeq_kv_cache_grow(moeq_kv_cache *cache, int seq_id, int64_t n_tokens);

/* Drop positions >= n_tokens; their blocks go back to the free stack when no other sequence holds them. */
moeq_err moeq_kv_cache_truncate(moeq_kv_cache *cache, int seq_id, int64_t n_tokens);

/* Blocks a fork of n_tokens takes from the free list: one for the copy of a partial last block, else 0. */
int64_t moeq_kv_cache_fork_blocks_needed(const moeq_kv_cache *cache, int64_t n_tokens);

/*
 * Give dst (open and empty: moeq_kv_cache_seq_new / seq_open) the first
 * n_tokens (0 .. src's length) of src: the full blocks below n_tokens are
 * shared (reference counted), a partially filled last block is copied into
 * a fresh block (every layer). src is unchanged. INVALID_ARG: src or dst not
 * alive, dst not empty or dst == src, n_tokens out of range; LIMIT: no free
 * block for the copy. Nothing changes on error.
 */
moeq_err moeq_kv_cache_seq_fork(moeq_kv_cache *cache, int src, int64_t n_tokens, int dst);

/* The prefix cache: as moeq_kv_blocks_set_tokens / _seq_tokens / _seq_keyed / _key_next / _lookup /
 * _seq_take_prefix / _get_stats / _set_hash (kv_blocks.h). lookup and take_prefix count blocks. */
void moeq_kv_cache_set_tokens(moeq_kv_cache *cache, int seq_id, int64_t from, const int32_t *tokens, int64_t n);
int moeq_kv_cache_seq_tokens(const moeq_kv_cache *cache, int seq_id, int64_t from, int64_t n, int32_t *out);
int64_t moeq_kv_cache_seq_keyed(const moeq_kv_cache *cache, int seq_id);
int moeq_kv_cache_key_next(moeq_kv_cache *cache, int seq_id, const int32_t *row);
int64_t moeq_kv_cache_lookup(const moeq_kv_cache *cache, const int32_t *tokens, int64_t n_tokens, int64_t max_blocks);
int64_t moeq_kv_cache_lookup_held(const moeq_kv_cache *cache, const int32_t *tokens, int64_t n_tokens,
                                  int64_t max_blocks);
int64_t moeq_kv_cache_take_prefix(moeq_kv_cache *cache, int seq_id, const int32_t *tokens, int64_t n_tokens,
                                  int64_t max_blocks);
int moeq_kv_cache_block_tokens(const moeq_kv_cache *cache);
struct moeq_kv_blocks_stats;
void moeq_kv_cache_prefix_stats(const moeq_kv_cache *cache, struct moeq_kv_blocks_stats *stats);
void moeq_kv_cache_set_hash(moeq_kv_cache *cache, uint64_t (*hash)(uint64_t parent_key, const int32_t *row, int n));

/* The entry of (seq, layer, pos): entry_floats floats. pos < seq_len. */
float *moeq_kv_cache_entry(const moeq_kv_cache *cache, int seq_id, int layer, int64_t pos);

/* The sequence's entries of one layer (the view kernels walk). Valid until the sequence grows, is truncated or freed. */
moeq_kv_view moeq_kv_cache_view(const moeq_kv_cache *cache, int seq_id, int layer);

/* Layer `layer` of the whole cache as plain data for kernels (pool, block table, block size). Valid until
 * the cache is destroyed; the table's contents change as sequences grow and shrink. */
moeq_kv_paged moeq_kv_cache_paged(const moeq_kv_cache *cache, int layer);

#endif
