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
} moeq_kv_blocks_params;

/* INVALID_ARG naming the fields when one is < 1, NOMEM. */
moeq_err moeq_kv_blocks_new(const moeq_kv_blocks_params *params, moeq_kv_blocks **out, char *errstr,
                            size_t errstr_size);
void moeq_kv_blocks_destroy(moeq_kv_blocks *blocks); /* NULL is safe */

int64_t moeq_kv_blocks_count(const moeq_kv_blocks *blocks);     /* blocks in the pool           */
int64_t moeq_kv_blocks_free(const moeq_kv_blocks *blocks);      /* on the free stack            */
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

#endif
