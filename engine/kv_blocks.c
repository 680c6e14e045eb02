/*
 * kv_blocks.c — block tables, reference counts, the free stack, forks and
 * copy-on-write (see kv_blocks.h). Four allocations at creation, none after.
 *
 * Sharing: a block is referenced by every sequence whose table holds it. A
 * sequence writes only at positions >= its length, so the only shared block
 * it can write into is its partially filled last one, and only after a
 * truncation made a shared full block partial; grow copies exactly that
 * block first (copy-on-write).
 */
#include "kv_blocks.h"

#include <stdlib.h>

struct moeq_kv_blocks {
    moeq_kv_blocks_params p;
    int64_t n_blocks;
    int64_t max_blocks_per_seq;
    int32_t *tables;           /* [max_seqs][max_blocks_per_seq]        */
    int64_t *lens;             /* [max_seqs], -1 = free slot            */
    int32_t *free_stack;       /* [n_blocks]                            */
    int32_t *refs;             /* [n_blocks] tables holding the block; 0 = free */
    int64_t n_free;
};

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
    if (!c->tables || !c->lens || !c->free_stack || !c->refs) {
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
    free(c);
}

int64_t moeq_kv_blocks_count(const moeq_kv_blocks *c) { return c->n_blocks; }
int64_t moeq_kv_blocks_free(const moeq_kv_blocks *c) { return c->n_free; }
int64_t moeq_kv_blocks_max_seq_tokens(const moeq_kv_blocks *c) { return c->max_blocks_per_seq * c->p.block_tokens; }
const int32_t *moeq_kv_blocks_tables(const moeq_kv_blocks *c) { return c->tables; }
int64_t moeq_kv_blocks_table_stride(const moeq_kv_blocks *c) { return c->max_blocks_per_seq; }
int32_t moeq_kv_blocks_refs(const moeq_kv_blocks *c, int32_t block) { return c->refs[block]; }

moeq_err moeq_kv_blocks_seq_new(moeq_kv_blocks *c, int *seq_id) {
    for (int i = 0; i < c->p.max_seqs; i++)
        if (c->lens[i] < 0) {
            c->lens[i] = 0;
            *seq_id = i;
            return MOEQ_OK;
        }
    return MOEQ_ERR_LIMIT;
}

moeq_err moeq_kv_blocks_seq_open(moeq_kv_blocks *c, int seq_id) {
    if (seq_id < 0 || seq_id >= c->p.max_seqs || c->lens[seq_id] >= 0) return MOEQ_ERR_INVALID_ARG;
    c->lens[seq_id] = 0;
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

static int32_t take_block(moeq_kv_blocks *c) {
    int32_t b = c->free_stack[--c->n_free];
    c->refs[b] = 1;
    return b;
}

/* Drop one reference; the block is free again when it was the last. */
static void release_block(moeq_kv_blocks *c, int32_t b) {
    if (--c->refs[b] == 0) c->free_stack[c->n_free++] = b;
}

/* A fresh block holding what block src holds (entries past the owner's length are don't-care). */
static int32_t copy_block(moeq_kv_blocks *c, int32_t src) {
    int32_t b = take_block(c);
    if (c->p.copy) c->p.copy(c->p.copy_ctx, b, src);
    return b;
}

/* 1 when the sequence's last block is partially filled and shared: the next grow must copy it first. */
static int last_block_shared(const moeq_kv_blocks *c, int seq_id, int64_t len) {
    if (len % c->p.block_tokens == 0) return 0;
    return c->refs[table_of(c, seq_id)[blocks_for(c, len) - 1]] > 1;
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
    if (want > c->max_blocks_per_seq || moeq_kv_blocks_needed(c, seq_id, n_tokens) > c->n_free) return MOEQ_ERR_LIMIT;
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
    for (int64_t b = have - 1; b >= keep; b--) release_block(c, table[b]);
    c->lens[seq_id] = n_tokens;
    return MOEQ_OK;
}

int64_t moeq_kv_blocks_fork_needed(const moeq_kv_blocks *c, int64_t n_tokens) {
    return n_tokens % c->p.block_tokens ? 1 : 0;
}

moeq_err moeq_kv_blocks_seq_fork(moeq_kv_blocks *c, int src, int64_t n_tokens, int dst) {
    if (!moeq_kv_blocks_seq_alive(c, src) || !moeq_kv_blocks_seq_alive(c, dst) || src == dst || c->lens[dst] != 0 ||
        n_tokens < 0 || n_tokens > c->lens[src])
        return MOEQ_ERR_INVALID_ARG;
    if (moeq_kv_blocks_fork_needed(c, n_tokens) > c->n_free) return MOEQ_ERR_LIMIT;
    const int32_t *from = table_of(c, src);
    int32_t *to = table_of(c, dst);
    int64_t full = n_tokens / c->p.block_tokens;
    for (int64_t b = 0; b < full; b++) {
        to[b] = from[b];
        c->refs[from[b]]++;
    }
    /* the partial block is copied now rather than shared: both sides would write into it next */
    if (full < blocks_for(c, n_tokens)) to[full] = copy_block(c, from[full]);
    c->lens[dst] = n_tokens;
    return MOEQ_OK;
}
