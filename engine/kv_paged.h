/*
 * kv_paged.h — internal: the paged cache as kernels see it, plain data (as
 * FlashMLA's params: a pool pointer, a block table, a block size). No engine
 * object, no ownership, no bookkeeping: kv_cache.c decides which blocks a
 * sequence holds; the pool is backend memory; a kernel only reads (and the
 * RoPE op writes) entries through this description.
 *
 * Entry (seq, layer, pos) lives at
 *   pool + block_table[seq * table_stride + pos / block_tokens] * block_floats
 *        + layer_offset + (pos % block_tokens) * entry_floats
 * and holds entry_floats floats (kv_lora latent, then the roped k_pe).
 */
#ifndef MOEQ_ENGINE_KV_PAGED_H
#define MOEQ_ENGINE_KV_PAGED_H

#include <stddef.h>
#include <stdint.h>

typedef struct moeq_kv_paged {
    float *pool;                /* the entry pool (a backend buffer)                      */
    const int32_t *block_table; /* [max_seqs][table_stride] block ids                     */
    int64_t table_stride;       /* entries per sequence's row of the block table          */
    size_t block_floats;        /* floats per block (every layer's entries)               */
    size_t layer_offset;        /* floats from a block's start to this layer's entries    */
    int block_tokens;           /* tokens per block                                       */
    int entry_floats;           /* floats per entry                                       */
} moeq_kv_paged;

/*
 * One sequence's entries of one layer, for kernels that walk them without a
 * call per entry (a call in a register-tiled loop spills every accumulator).
 */
typedef struct moeq_kv_view {
    const float *pool;      /* block b of the layer starts at pool + table[b] * block_floats */
    const int32_t *table;   /* the sequence's block table                                     */
    size_t block_floats;
    int block_tokens, entry_floats;
} moeq_kv_view;

static inline moeq_kv_view moeq_kv_paged_view(const moeq_kv_paged *kv, int seq) {
    return (moeq_kv_view){kv->pool + kv->layer_offset, kv->block_table + (size_t)seq * (size_t)kv->table_stride,
                          kv->block_floats, kv->block_tokens, kv->entry_floats};
}

/* The first entry of the sequence's block blk; the block's entries follow, entry_floats apart. */
static inline const float *moeq_kv_view_block(const moeq_kv_view *v, int64_t blk) {
    return v->pool + (size_t)v->table[blk] * v->block_floats;
}

static inline const float *moeq_kv_view_entry(const moeq_kv_view *v, int64_t pos) {
    return moeq_kv_view_block(v, pos / v->block_tokens) + (size_t)(pos % v->block_tokens) * (size_t)v->entry_floats;
}

/* The writable entry of (seq, pos) of the described layer. */
static inline float *moeq_kv_paged_entry(const moeq_kv_paged *kv, int seq, int64_t pos) {
    const int32_t *table = kv->block_table + (size_t)seq * (size_t)kv->table_stride;
    return kv->pool + (size_t)table[pos / kv->block_tokens] * kv->block_floats + kv->layer_offset +
           (size_t)(pos % kv->block_tokens) * (size_t)kv->entry_floats;
}

#endif
