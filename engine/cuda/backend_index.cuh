/*
 * backend_index.cuh — the index arithmetic and the split-KV arithmetic of the
 * CUDA backend's kernels (backend_cuda.cu), as __host__ __device__ inline
 * functions in plain C, so that the host unit test (tests/
 * test_backend_cuda_host.c) drives them against the CPU backend over many
 * shapes without a GPU: the mistakes blind device code makes most are here.
 *
 *   paged blocks    the engine's block table is host bookkeeping; each call
 *                   that reads or writes the cache gets a compact copy on the
 *                   device: one row per run of consecutive tokens of one
 *                   sequence, as many blocks as the run's last position needs
 *                   (moeq_cu_kv_compact, host), and a token's entry is found
 *                   through its row (moeq_cu_kv_entry_offset, both sides).
 *   split-KV        a query's context 0..pos is cut into partitions whose
 *                   number depends only on the context length (so a token's
 *                   result does not depend on its batch-mates): each gives a
 *                   partial softmax (max m, sum l of exp(s - m), o = sum of
 *                   exp(s - m) c, unnormalised), and the merge rescales them
 *                   by exp(m_p - M) (FlashMLA's two kernels).
 *   permutation     the gather's thread -> (slot row, column, source row)
 *                   and the combine's slot-order sum; the F8 block-scale
 *                   lookup is ops.cuh's (moeq_cu_widen, absolute rows).
 *
 * Scores are the CPU's bits (same lanes and tree); the softmax is not the
 * CPU's order (partials rescaled, one division at the end), so attention
 * agrees with the CPU within float tolerance, not bit for bit.
 */
#ifndef MOEQ_CUDA_BACKEND_INDEX_CUH
#define MOEQ_CUDA_BACKEND_INDEX_CUH

#include <stddef.h>
#include <stdint.h>

#include "ops.cuh"

/* ---- paged cache addressing ---------------------------------------------------- */

/* Float offset in the pool of the entry at pos, row = the token's sequence's block ids (compact or the
 * engine's). The formula of kv_paged.h's moeq_kv_paged_entry. */
MOEQ_HD size_t moeq_cu_kv_entry_offset(const int32_t *row, int64_t pos, int block_tokens, size_t block_floats,
                                       size_t layer_offset, int entry_floats) {
    return (size_t)row[pos / block_tokens] * block_floats + layer_offset +
           (size_t)(pos % block_tokens) * (size_t)entry_floats;
}

/* Blocks a context of n positions spans. */
MOEQ_HD int64_t moeq_cu_kv_blocks(int64_t n_pos, int block_tokens) { return (n_pos + block_tokens - 1) / block_tokens; }

/*
 * Host: the int32 entries moeq_cu_kv_compact uses for a call: one row per run of a sequence's consecutive
 * tokens, as many blocks as the run's largest position needs. Linear in the tokens, where the sum over
 * tokens of each one's blocks (a bound) is quadratic in a prefill chunk's length.
 */
static inline int64_t moeq_cu_kv_compact_entries(const int32_t *seq, const int64_t *pos, int64_t n_tok,
                                                 int block_tokens) {
    int64_t used = 0;
    for (int64_t t0 = 0; t0 < n_tok;) {
        int64_t t1 = t0 + 1, max_pos = pos[t0];
        while (t1 < n_tok && seq[t1] == seq[t0]) max_pos = pos[t1] > max_pos ? pos[t1] : max_pos, t1++;
        used += moeq_cu_kv_blocks(max_pos + 1, block_tokens);
        t0 = t1;
    }
    return used;
}

/*
 * Host: the compact block table of one call. Token t's row starts at ctab + row_off[t]; a run of
 * consecutive tokens of one sequence shares a row holding the blocks its largest position needs.
 * Returns the int32 entries of ctab used, or -1 when they would pass cap (nothing is promised then).
 */
static inline int64_t moeq_cu_kv_compact(const int32_t *block_table, int64_t table_stride, const int32_t *seq,
                                         const int64_t *pos, int64_t n_tok, int block_tokens, int32_t *row_off,
                                         int32_t *ctab, int64_t cap) {
    int64_t used = 0;
    for (int64_t t0 = 0; t0 < n_tok;) {
        int64_t t1 = t0 + 1, max_pos = pos[t0];
        while (t1 < n_tok && seq[t1] == seq[t0]) max_pos = pos[t1] > max_pos ? pos[t1] : max_pos, t1++;
        int64_t nb = moeq_cu_kv_blocks(max_pos + 1, block_tokens);
        if (used + nb > cap || used + nb > INT32_MAX) return -1;
        const int32_t *src = block_table + (size_t)seq[t0] * (size_t)table_stride;
        for (int64_t b = 0; b < nb; b++) ctab[used + b] = src[b];
        for (int64_t t = t0; t < t1; t++) row_off[t] = (int32_t)used;
        used += nb;
        t0 = t1;
    }
    return used;
}

/* ---- split-KV partitions ---------------------------------------------------------- */

#define MOEQ_CU_SPLIT_ROWS 256      /* a partition covers at least this many context rows ...      */
#define MOEQ_CU_SPLIT_PARTS 16      /* ... until there are this many partitions ...                */
#define MOEQ_CU_SPLIT_MAX_ROWS 2048 /* ... and then at most this many rows (the kernel's scores in shared memory) */

/* Partitions of a context of n rows: a function of n alone (batch invariance). */
MOEQ_HD int moeq_cu_split_parts(int64_t n) {
    int64_t p = (n + MOEQ_CU_SPLIT_ROWS - 1) / MOEQ_CU_SPLIT_ROWS;
    if (p > MOEQ_CU_SPLIT_PARTS) {
        int64_t q = (n + MOEQ_CU_SPLIT_MAX_ROWS - 1) / MOEQ_CU_SPLIT_MAX_ROWS;
        p = q > MOEQ_CU_SPLIT_PARTS ? q : MOEQ_CU_SPLIT_PARTS;
    }
    return p < 1 ? 1 : (int)p;
}

/* Rows [*j0, *j1) of partition p of n rows (n_parts = moeq_cu_split_parts(n)); never empty. */
MOEQ_HD void moeq_cu_split_range(int64_t n, int n_parts, int p, int64_t *j0, int64_t *j1) {
    int64_t len = (n + n_parts - 1) / n_parts;
    *j0 = (int64_t)p * len;
    *j1 = *j0 + len < n ? *j0 + len : n;
}

/* The most partitions any context up to max_ctx rows gets (the workspace is sized by it). */
MOEQ_HD int moeq_cu_split_max_parts(int64_t max_ctx) { return moeq_cu_split_parts(max_ctx > 0 ? max_ctx : 1); }

/* One partition of one query token (the kernel's grid): which token, its rows, where its partial goes. */
typedef struct moeq_cu_split_item {
    int32_t t, slot;
    int32_t j0, j1;
} moeq_cu_split_item;

/*
 * Host: the partitions of tokens [t0, t1) of a call: items[0..n) in token order, slot = index; first[t - t0]
 * and count[t - t0] give each token's slots. Returns the number of items (<= cap, else -1).
 */
static inline int64_t moeq_cu_split_plan(const int64_t *pos, int64_t t0, int64_t t1, moeq_cu_split_item *items,
                                         int32_t *first, int32_t *count, int64_t cap) {
    int64_t n = 0;
    for (int64_t t = t0; t < t1; t++) {
        int64_t ctx = pos[t] + 1;
        int parts = moeq_cu_split_parts(ctx);
        if (n + parts > cap) return -1;
        first[t - t0] = (int32_t)n;
        count[t - t0] = parts;
        for (int p = 0; p < parts; p++, n++) {
            int64_t j0, j1;
            moeq_cu_split_range(ctx, parts, p, &j0, &j1);
            items[n].t = (int32_t)t;
            items[n].slot = (int32_t)n;
            items[n].j0 = (int32_t)j0;
            items[n].j1 = (int32_t)j1;
        }
    }
    return n;
}

/* ---- split-KV arithmetic ---------------------------------------------------------------- */

/* Lane `lane` of a score: the latent part then the rope part in the same 16 lanes, each padded with
 * fmaf(0, 0, lane) (attention.c's score_scalar). The tree of the 16 lanes, times scale, is the CPU's score. */
MOEQ_HD float moeq_cu_score_lane(const float *ql, const float *qp, const float *e, int L, int R, int lane) {
    float acc = 0.0f;
    for (int k = 0; k < L; k += MOEQ_CU_LANES)
        acc = k + lane < L ? fmaf(ql[k + lane], e[k + lane], acc) : fmaf(0.0f, 0.0f, acc);
    for (int k = 0; k < R; k += MOEQ_CU_LANES)
        acc = k + lane < R ? fmaf(qp[k + lane], e[L + k + lane], acc) : fmaf(0.0f, 0.0f, acc);
    return acc;
}

/* Lane `lane` of a partition's sum of exponentials: rows j0 + lane, j0 + lane + 16, ... of e (in order). */
MOEQ_HD float moeq_cu_split_sum_lane(const float *e, int64_t n, int lane) {
    float acc = 0.0f;
    for (int64_t j = lane; j < n; j += MOEQ_CU_LANES) acc += e[j];
    return acc;
}

/* The largest of n scores (-inf for none; a NaN is skipped as max ignores it). */
MOEQ_HD float moeq_cu_split_max(const float *s, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    return m;
}

/*
 * The merge: a[p] = exp(m[p] - M), M the largest m; returns L = sum of a[p] * l[p] in partition order.
 * out[d] = (sum over p in order of a[p] * o_p[d]) / L. One partition: a = 1, L = l.
 */
MOEQ_HD float moeq_cu_split_merge_scales(const float *m, const float *l, int n_parts, float *a) {
    float M = moeq_cu_split_max(m, n_parts), L = 0.0f;
    for (int p = 0; p < n_parts; p++) {
        a[p] = moeq_cu_exp_nonpos(m[p] - M);
        L = L + a[p] * l[p];
    }
    return L;
}

/* Element d of the merged output: partials o (n_parts rows, stride ld), scales a, total L. */
MOEQ_HD float moeq_cu_split_merge_elem(const float *o, int64_t ld, const float *a, int n_parts, float L, int64_t d) {
    float acc = 0.0f;
    for (int p = 0; p < n_parts; p++) acc = acc + a[p] * o[(int64_t)p * ld + d];
    return acc / L;
}

/* ---- the token permutation (gather) ---------------------------------------------------------- */

/* Thread idx of the gather over n_slots rows of dim: slot row i, column d. */
typedef struct moeq_cu_gather_at {
    int64_t i, d;
} moeq_cu_gather_at;

MOEQ_HD moeq_cu_gather_at moeq_cu_gather_index(int64_t idx, int64_t dim) {
    moeq_cu_gather_at a;
    a.i = idx / dim;
    a.d = idx % dim;
    return a;
}

/* The token row slot order[i] reads: slot / top_k. */
MOEQ_HD int64_t moeq_cu_gather_src(const int64_t *order, int64_t i, int64_t top_k) { return order[i] / top_k; }

/* ---- combine ------------------------------------------------------------------------------------ */

/* Column d of token t's combined row: slots in routing order, each product then its sum (no fma: the CPU's
 * `acc += w * y` under -ffp-contract=off), the shared expert's row last; slot_row NULL: slot s is row s. */
MOEQ_HD float moeq_cu_combine_elem(const float *rows, const int64_t *slot_row, const float *weights,
                                   const float *shared, int64_t t, int64_t K, int64_t D, int64_t d) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        int64_t s = t * K + k;
        acc = acc + weights[s] * rows[(slot_row ? slot_row[s] : s) * D + d];
    }
    return shared ? acc + shared[t * D + d] : acc;
}

#endif
