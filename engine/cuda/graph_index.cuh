/*
 * graph_index.cuh — the launch-shape arithmetic a captured (CUDA graph) decode step needs, as __host__ __device__
 * inline functions in plain C beside backend_index.cuh, so that tests/test_backend_cuda_host.c drives them over
 * many shapes against the eager path's host plan without a GPU. A graph replays the launches it recorded:
 * same grids, same pointers. So nothing a launch is shaped by may depend on the step's positions, and the host
 * data a step reads must sit at addresses fixed per bucket.
 *
 *   buckets     a step of T tokens runs as the smallest bucket T_b >= T of a fixed list (powers of two up to
 *               256, none past the engine's max_step_tokens); a step past the largest runs eagerly.
 *   padding     rows [n_valid, T_b) are padding: token id 0 at position 0 of the scratch row (a block table
 *               row whose entries all name one reserved cache block), so their cache writes land there and
 *               their attention reads only it; the device-side n_valid keeps them out of the expert counts.
 *   split plan  the split-KV partitions are computed on the device from the positions (moeq_cu_split_scan
 *               by one thread, then each block of a grid of capacity items finds its item by a binary
 *               search, moeq_cu_split_find, and idles past the last): the same items, slots and merge order
 *               as the host's moeq_cu_split_plan, so the results are the eager path's bits.
 *   tables      one block-table row of fixed stride per token (the blocks of max_ctx positions): token t's
 *               row is tab + t * stride, which kv_dev addresses through a row_off of t * stride (uploaded
 *               once), so the kernels that read the compact tables read these unchanged.
 *
 * Not here: the capture itself (backend_cuda.cu) and which cache block is reserved (the engine's).
 */
#ifndef MOEQ_CUDA_GRAPH_INDEX_CUH
#define MOEQ_CUDA_GRAPH_INDEX_CUH

#include <stdint.h>

#include "backend_index.cuh"

/* ---- buckets ------------------------------------------------------------------------------------------------ */

#define MOEQ_CU_GRAPH_MAX_BUCKETS 9   /* 1, 2, 4, ..., 256 */
#define MOEQ_CU_GRAPH_LARGEST 256     /* decode batches past this run eagerly (prefill chunks always do) */

/* Host: the bucket sizes for an engine whose steps hold at most max_tokens tokens: powers of two up to
 * min(256, max_tokens), ascending, into sizes[MOEQ_CU_GRAPH_MAX_BUCKETS]. Returns how many (>= 1). */
static inline int moeq_cu_graph_buckets(int64_t max_tokens, int64_t *sizes) {
    int n = 0;
    for (int64_t b = 1; b <= MOEQ_CU_GRAPH_LARGEST && (b <= max_tokens || n == 0); b *= 2) sizes[n++] = b;
    return n;
}

/* Host: the index of the smallest of sizes[0..n) (ascending) holding n_tok tokens; -1 when n_tok < 1 or
 * n_tok is past the largest (the step runs eagerly). */
static inline int moeq_cu_graph_bucket(const int64_t *sizes, int n, int64_t n_tok) {
    if (n_tok < 1) return -1;
    for (int i = 0; i < n; i++)
        if (sizes[i] >= n_tok) return i;
    return -1;
}

/* ---- padding -------------------------------------------------------------------------------------------------- */

/* Host: a step of n_valid tokens padded to n_rows: ids and positions of the padding rows 0, their sequence
 * pad_seq (the scratch row). ids or seq may be NULL (not staged by the caller). */
static inline void moeq_cu_graph_pad(int32_t *ids, int32_t *seq, int64_t *pos, int64_t n_valid, int64_t n_rows,
                                     int32_t pad_seq) {
    for (int64_t t = n_valid; t < n_rows; t++) {
        if (ids) ids[t] = 0;
        if (seq) seq[t] = pad_seq;
        pos[t] = 0;
    }
}

/* ---- the split plan on the device ------------------------------------------------------------------------------ */

/* Partitions of all n_tok tokens' contexts: the items the eager plan would have (the grid's need). */
MOEQ_HD int64_t moeq_cu_split_items(const int64_t *pos, int64_t n_tok) {
    int64_t n = 0;
    for (int64_t t = 0; t < n_tok; t++) n += moeq_cu_split_parts(pos[t] + 1);
    return n;
}

/* The most items a bucket of n_rows tokens may need at contexts up to max_ctx, capped by what the workspace
 * holds (ws_items): the capacity a captured grid is launched with. A step whose moeq_cu_split_items exceeds it
 * must run eagerly (the host knows its positions before the replay). */
MOEQ_HD int64_t moeq_cu_split_item_cap(int64_t n_rows, int64_t max_ctx, int64_t ws_items) {
    int64_t need = n_rows * (int64_t)moeq_cu_split_max_parts(max_ctx);
    return need < ws_items ? need : ws_items;
}

/* The plan kernel's one thread: first[t] = the exclusive prefix sum of each token's partitions, count[t] its
 * partitions (moeq_cu_split_plan's first and count for tokens [0, n_tok)); *total = every item. Integers: the
 * same plan whatever the timing. */
MOEQ_HD void moeq_cu_split_scan(const int64_t *pos, int64_t n_tok, int32_t *first, int32_t *count, int32_t *total) {
    int32_t n = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        int parts = moeq_cu_split_parts(pos[t] + 1);
        first[t] = n, count[t] = parts;
        n += parts;
    }
    *total = n;
}

/* Item x of the plan (block x of the capacity grid): the token whose slots hold it (first[t] <= x < first[t] +
 * count[t]: every token has a partition, so first increases strictly), its rows, slot x. 0 when x is past the
 * last item (the block idles), else 1 with *it = moeq_cu_split_plan's items[x]. */
MOEQ_HD int moeq_cu_split_find(const int64_t *pos, const int32_t *first, const int32_t *count, int64_t n_tok,
                               int32_t total, int64_t x, moeq_cu_split_item *it) {
    if (x < 0 || x >= total || n_tok < 1) return 0;
    int64_t lo = 0, hi = n_tok - 1; /* the last t with first[t] <= x */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (first[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    int64_t j0, j1;
    moeq_cu_split_range(pos[lo] + 1, count[lo], (int)(x - first[lo]), &j0, &j1);
    it->t = (int32_t)lo, it->slot = (int32_t)x, it->j0 = (int32_t)j0, it->j1 = (int32_t)j1;
    return 1;
}

/* ---- block tables of fixed stride ------------------------------------------------------------------------------ */

/* Entries of one fixed row: the blocks max_ctx positions span. */
MOEQ_HD int64_t moeq_cu_kv_fixed_stride(int64_t max_ctx, int block_tokens) {
    int64_t s = moeq_cu_kv_blocks(max_ctx > 0 ? max_ctx : 1, block_tokens);
    return s > 0 ? s : 1;
}

/* Token t's row of a fixed table (what row_off[t] = t * stride gives kv_dev). */
MOEQ_HD const int32_t *moeq_cu_kv_fixed_row(const int32_t *tab, int64_t stride, int64_t t) { return tab + t * stride; }

/*
 * Host: the fixed table of a padded step into tab (n_rows rows of stride entries): row t < n_valid holds the
 * blocks of token t's sequence (block_table row seq[t], stride table_stride) that positions 0..pos[t] span;
 * each padding row's first entry is scratch_block (padding tokens sit at position 0). Entries past a row's
 * last needed block are not written: no kernel reads past position pos[t]. Returns 0, or -1 (nothing
 * promised) when a token's position needs more than stride blocks.
 */
static inline int moeq_cu_kv_fixed_fill(const int32_t *block_table, int64_t table_stride, const int32_t *seq,
                                        const int64_t *pos, int64_t n_valid, int64_t n_rows, int block_tokens,
                                        int64_t stride, int32_t scratch_block, int32_t *tab) {
    for (int64_t t = 0; t < n_valid; t++) {
        int64_t nb = moeq_cu_kv_blocks(pos[t] + 1, block_tokens);
        if (nb > stride) return -1;
        const int32_t *src = block_table + (int64_t)seq[t] * table_stride;
        int32_t *dst = tab + t * stride;
        for (int64_t b = 0; b < nb; b++) dst[b] = src[b];
    }
    for (int64_t t = n_valid; t < n_rows; t++) tab[t * stride] = scratch_block;
    return 0;
}

/* Host: diff[t] = 1 when row t of a candidate table (cand, filled for positions pos) needs an upload: its first
 * blocks (those positions 0..pos[t] span) are not the first held[t] entries of the mirror of the device's table.
 * Returns how many rows differ. */
static inline int64_t moeq_cu_kv_fixed_diff(const int32_t *cand, const int32_t *mirror, const int64_t *held,
                                           const int64_t *pos, int64_t n_rows, int block_tokens, int64_t stride,
                                           uint8_t *diff) {
    int64_t n = 0;
    for (int64_t t = 0; t < n_rows; t++) {
        int64_t nb = moeq_cu_kv_blocks(pos[t] + 1, block_tokens), b = 0;
        if (nb <= held[t])
            while (b < nb && cand[t * stride + b] == mirror[t * stride + b]) b++;
        diff[t] = (uint8_t)(nb > held[t] || b < nb);
        n += diff[t];
    }
    return n;
}

/* Host: the next run of rows that differ, from *t on: rows [*t0, *t1), *t moved past it; 0 when none is left.
 * A run goes up in one copy (whole rows: the mirror then holds them whole). */
static inline int moeq_cu_kv_fixed_run(const uint8_t *diff, int64_t n_rows, int64_t *t, int64_t *t0, int64_t *t1) {
    while (*t < n_rows && !diff[*t]) (*t)++;
    if (*t >= n_rows) return 0;
    *t0 = *t;
    while (*t < n_rows && diff[*t]) (*t)++;
    *t1 = *t;
    return 1;
}

/* Host: the end of the piece of a run of rows [r0, t1) that goes up next when at most per rows fit the staging at
 * once (per < 1: one row, which the staging then refuses by name): a run past the whole staging goes up in pieces,
 * each reserved alone, where one reservation of it failed the backend. */
static inline int64_t moeq_cu_kv_fixed_piece(int64_t r0, int64_t t1, int64_t per) {
    int64_t n = per > 0 ? per : 1;
    return t1 - r0 <= n ? t1 : r0 + n;
}

/* Host: row_off of a fixed table of n_rows rows (uploaded once per bucket): row_off[t] = t * stride; -1 when
 * an offset would not fit int32 (the table is too large for kv_dev's offsets). */
static inline int moeq_cu_kv_fixed_offsets(int64_t n_rows, int64_t stride, int32_t *row_off) {
    if (n_rows > 0 && (n_rows - 1) * stride > INT32_MAX) return -1;
    for (int64_t t = 0; t < n_rows; t++) row_off[t] = (int32_t)(t * stride);
    return 0;
}

/* Expert counts of the valid rows: moe_index.cuh's moeq_cu_moe_count(ids, n_valid * top_k, e) (a token's K slots
 * are consecutive), so the padding rows are routed and run like any row but stay out of the statistics. */

#endif
