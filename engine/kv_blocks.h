/*
 * kv_blocks.h — internal: the paged cache's bookkeeping, pure host logic:
 * which blocks each sequence holds (its block table), how many sequences
 * hold each block (reference counts), the free stack, forks and
 * copy-on-write. It knows block ids only — no storage, no float pointer — so
 * it is the same for every backend; the entries live in the backend's pool
 * (kv_cache.c puts the two together).
 *
 * When a sequence must get its own copy of a block (a fork's partial last
 * block, or a grow into a shared partial block after a truncation) the
 * storage owner is told through copy(ctx, dst, src) before the table points
 * at dst.
 *
 * The prefix cache (docs/PREFIX_CACHE.md) lives here too. A full block whose
 * token ids are known gets a key = hash(salt, parent's key, its key row)
 * (the row: the block's block_tokens token ids, plus `lookahead` more for a
 * cache whose entry i also reads token i + 1, as MTP's does) and goes into a
 * hash table. When its last sequence lets go it stays there, cached
 * (reference count 0, on an LRU list), instead of going to the free stack; a
 * new sequence takes the longest chain of registered blocks matching its
 * tokens (moeq_kv_blocks_seq_take_prefix). A hit is verified, never trusted
 * to the hash: the row is compared token by token and the parent must be the
 * block the chain took one step before, so by induction a taken block holds
 * exactly what these tokens at these positions compute. Cached blocks count
 * as free (moeq_kv_blocks_free); they are evicted only when the free stack is
 * empty (or their number passes max_cached), least recently released first,
 * a block with registered children never before them. Invariant that makes
 * every cached block evictable: a sequence that holds a registered block holds
 * its parent too (chains are taken whole, registration's parent is the
 * table's previous block, and a block found equal to a registered one is
 * replaced by it in the table).
 *
 * Not thread-safe for mutation.
 */
#ifndef MOEQ_ENGINE_KV_BLOCKS_H
#define MOEQ_ENGINE_KV_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

typedef struct moeq_kv_blocks moeq_kv_blocks;

typedef struct moeq_kv_blocks_params {
    int block_tokens;        /* tokens per block                */
    int64_t capacity_tokens; /* all sequences together          */
    int max_seqs;
    void (*copy)(void *ctx, int32_t dst_block, int32_t src_block); /* copy a block's storage; NULL: none */
    void *copy_ctx;
    /* Prefix cache; all zero = off (no block is ever registered, released blocks go to the free stack). */
    int prefix_cache;        /* 1: register full blocks with known tokens, keep them cached when released */
    int lookahead;           /* key row = block_tokens + lookahead tokens (0 main cache, 1 MTP)     */
    int64_t max_cached;      /* most cached (released, registered) blocks; 0 = every block, < 0 none */
    uint64_t salt;           /* whatever else decides a block's contents (model, which cache)       */
} moeq_kv_blocks_params;

/* The key of a row of n token ids under parent_key; the default is a 64-bit mix, tests force collisions. */
typedef uint64_t (*moeq_kv_blocks_hash_fn)(uint64_t parent_key, const int32_t *row, int n);
uint64_t moeq_kv_blocks_default_hash(uint64_t parent_key, const int32_t *row, int n);
/* Tests: replace the hash (NULL = the default). Only while no block is registered. */
void moeq_kv_blocks_set_hash(moeq_kv_blocks *blocks, moeq_kv_blocks_hash_fn hash);

typedef struct moeq_kv_blocks_stats {
    int64_t lookups;        /* moeq_kv_blocks_seq_take_prefix calls                                 */
    int64_t hit_blocks;     /* blocks they took                                                     */
    int64_t cached;         /* released registered blocks now (evictable)                           */
    int64_t registered;     /* blocks in the hash table now (cached or in use)                      */
    int64_t evictions;      /* cached blocks reused for something else                              */
    int64_t collisions;     /* key matched, row or parent did not: rejected by the comparison       */
    int64_t deduplicated;   /* blocks found equal to a registered one and replaced by it            */
} moeq_kv_blocks_stats;
void moeq_kv_blocks_get_stats(const moeq_kv_blocks *blocks, moeq_kv_blocks_stats *stats);

/* INVALID_ARG naming the fields when one is < 1, NOMEM. */
moeq_err moeq_kv_blocks_new(const moeq_kv_blocks_params *params, moeq_kv_blocks **out, char *errstr,
                            size_t errstr_size);
void moeq_kv_blocks_destroy(moeq_kv_blocks *blocks); /* NULL is safe */

int64_t moeq_kv_blocks_count(const moeq_kv_blocks *blocks);     /* blocks in the pool           */
int64_t moeq_kv_blocks_free(const moeq_kv_blocks *blocks);      /* on the free stack + cached   */
int64_t moeq_kv_blocks_max_seq_tokens(const moeq_kv_blocks *blocks);

/* The block tables, [max_seqs][stride] block ids: row seq is that sequence's (valid up to its length). */
const int32_t *moeq_kv_blocks_tables(const moeq_kv_blocks *blocks);
int64_t moeq_kv_blocks_table_stride(const moeq_kv_blocks *blocks);
int32_t moeq_kv_blocks_refs(const moeq_kv_blocks *blocks, int32_t block); /* tables holding it; 0 = free */

moeq_err moeq_kv_blocks_seq_new(moeq_kv_blocks *blocks, int *seq_id);  /* LIMIT when max_seqs are alive */
moeq_err moeq_kv_blocks_seq_open(moeq_kv_blocks *blocks, int seq_id);  /* INVALID_ARG when taken        */
void moeq_kv_blocks_seq_free(moeq_kv_blocks *blocks, int seq_id);
int moeq_kv_blocks_seq_alive(const moeq_kv_blocks *blocks, int seq_id);
int64_t moeq_kv_blocks_seq_len(const moeq_kv_blocks *blocks, int seq_id); /* -1 when not alive */

/* As moeq_kv_cache_blocks_needed_after / _needed / _grow / _truncate / _fork_blocks_needed / _seq_fork. */
int64_t moeq_kv_blocks_needed_after(const moeq_kv_blocks *blocks, int seq_id, int64_t keep_tokens, int64_t n_tokens);
int64_t moeq_kv_blocks_needed(const moeq_kv_blocks *blocks, int seq_id, int64_t n_tokens);
moeq_err moeq_kv_blocks_grow(moeq_kv_blocks *blocks, int seq_id, int64_t n_tokens);
moeq_err moeq_kv_blocks_truncate(moeq_kv_blocks *blocks, int seq_id, int64_t n_tokens);
int64_t moeq_kv_blocks_fork_needed(const moeq_kv_blocks *blocks, int64_t n_tokens);
moeq_err moeq_kv_blocks_seq_fork(moeq_kv_blocks *blocks, int src, int64_t n_tokens, int dst);

/*
 * Record the token ids at positions from .. from + n - 1 of seq (already
 * grown that far); every block that becomes full is registered. Only
 * contiguous recording keys blocks: from must be the tokens recorded so far
 * (else nothing is recorded, and the sequence's later blocks stay unkeyed).
 * For a cache with lookahead 0; no-op with the prefix cache off.
 */
void moeq_kv_blocks_set_tokens(moeq_kv_blocks *blocks, int seq_id, int64_t from, const int32_t *tokens, int64_t n);
/* Copy recorded token ids from .. from + n - 1 of seq into out; 0 when not all of them are recorded. */
int moeq_kv_blocks_seq_tokens(const moeq_kv_blocks *blocks, int seq_id, int64_t from, int64_t n, int32_t *out);
/* Leading blocks of seq that are registered (its keyed chain). */
int64_t moeq_kv_blocks_seq_keyed(const moeq_kv_blocks *blocks, int seq_id);
/*
 * Register seq's next unkeyed block (index moeq_kv_blocks_seq_keyed) with an
 * explicit key row of block_tokens + lookahead ids: for a cache whose rows
 * the owner knows (MTP's, keyed from the main cache's tokens once its entries
 * are true). The block must be full. Returns 1 when keyed.
 */
int moeq_kv_blocks_key_next(moeq_kv_blocks *blocks, int seq_id, const int32_t *row);

/* Blocks of the longest registered chain matching tokens[0..n_tokens) (rows need block_tokens + lookahead
 * ids each), at most max_blocks; changes nothing. */
int64_t moeq_kv_blocks_lookup(const moeq_kv_blocks *blocks, const int32_t *tokens, int64_t n_tokens,
                              int64_t max_blocks);
/* As lookup, but only the leading blocks a sequence holds (taking them would allocate nothing). */
int64_t moeq_kv_blocks_lookup_held(const moeq_kv_blocks *blocks, const int32_t *tokens, int64_t n_tokens,
                                   int64_t max_blocks);
/*
 * Give the empty sequence seq the longest registered chain matching tokens
 * (at most max_blocks blocks): it then holds blocks x block_tokens tokens,
 * computed. Returns the blocks taken (0: a miss; the sequence stays empty).
 */
int64_t moeq_kv_blocks_seq_take_prefix(moeq_kv_blocks *blocks, int seq_id, const int32_t *tokens, int64_t n_tokens,
                                       int64_t max_blocks);

/* Tests: 1 when block is registered; its position in the LRU (0 = next evicted) or -1 when not cached. */
int moeq_kv_blocks_registered(const moeq_kv_blocks *blocks, int32_t block);
int64_t moeq_kv_blocks_lru_rank(const moeq_kv_blocks *blocks, int32_t block);

#endif
