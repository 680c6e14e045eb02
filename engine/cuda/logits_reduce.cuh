/*
 * logits_reduce.cuh — the arithmetic of the CUDA backend's logits_reduce
 * kernel (backend_cuda.cu), as __host__ __device__ inline functions in
 * plain C, so that tests/test_logits_reduce.c drives them on the host, with
 * the kernel's block emulated thread by thread, against the CPU backend's
 * op (engine/cpu/logits_reduce.c) over many row lengths, block sizes and
 * candidate counts.
 *
 * A row is cut into partitions (moeq_cu_lr_part_len values each, at most
 * MOEQ_CU_LR_MAX_PARTS; one block each, so a batch-1 row of V3's 129,280
 * values is read by 32 SMs, not one: that single block took 650 us a step).
 * A partition's block reads its values in tiles of nt, thread t taking value
 * j * nt + t of tile j (coalesced reads, and the tile order is the index
 * order, which the ordered selection below needs), and writes its c best
 * candidates in rank order with its best value and finite flag. The row's
 * best c are among the partitions' (an element with fewer than c better in
 * the row has fewer than c better in its partition), so the row's last block
 * to finish (a counter) selects them from that union by the same steps over
 * the candidates' keys (moeq_cu_lr_key_pass_thread): the union is read in
 * (partition, rank) order, in which equal keys come in index order, so the
 * lowest ids of those equal to the threshold are the first met. A second
 * kernel sums each partition, and the row's last block adds the partitions'
 * sums in partition order.
 *
 *   order key   a float's 32-bit key: larger key = ranks first; -0 is +0;
 *               every NaN is 0, below -inf (moeq_cu_lr_key). Candidates rank
 *               by key descending, then id ascending: the sampler's order.
 *   radix       the c-th best key by 4 passes of 8 bits (256 buckets, high
 *               bits first): each pass counts the digits of the values whose
 *               higher bits match the prefix chosen so far, and the bucket
 *               holding the c-th is picked from the top (moeq_cu_lr_pick).
 *               Counts are integers: the same whatever order threads add in.
 *   selection   every value above the threshold key, and the lowest ids of
 *               those equal to it (as many as the c still needs), each
 *               thread's place given by the counts of lower indices (a block
 *               scan per tile; moeq_cu_lr_slot); then each candidate's rank
 *               is the number of candidates better than it (moeq_cu_lr_better
 *               is a total order: no two are equal).
 *   argmax      the best candidate, unless value 0 is a NaN (the sampler's
 *               scalar loop then keeps 0); finite: no exponent field all ones.
 *   sums        per thread over its values in tile order, then a fixed tree
 *               (stride nt/2, nt/4, ..., 1), then the partitions in order:
 *               deterministic, but not the CPU's left-to-right order (nor
 *               its exp): within moeq_logits_sum_bound of it, which is all
 *               the sampler assumes.
 *
 * Not here: the launch and the copy back of the records (backend_cuda.cu).
 */
#ifndef MOEQ_CUDA_LOGITS_REDUCE_CUH
#define MOEQ_CUDA_LOGITS_REDUCE_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops.cuh"

#define MOEQ_CU_LR_THREADS 256 /* the kernel's block (a power of two: the sum tree halves it) */
#define MOEQ_CU_LR_BUCKETS 256
#define MOEQ_CU_LR_PASSES 4
#define MOEQ_CU_LR_MAX_PARTS 32   /* partitions of a row: the union of their candidates stays in shared memory */
#define MOEQ_CU_LR_PART_MIN 4096  /* values of a partition at least: fewer make the union the larger read */

MOEQ_HD uint32_t moeq_cu_lr_key(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0; /* NaN: below everything */
    if (u == 0x80000000u) u = 0;                    /* -0 ranks as +0 (they compare equal) */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* a ranks before b. */
MOEQ_HD int moeq_cu_lr_better(uint32_t key_a, int32_t id_a, uint32_t key_b, int32_t id_b) {
    return key_a > key_b || (key_a == key_b && id_a < id_b);
}

/* Tiles of nt values over a row of n. */
MOEQ_HD int64_t moeq_cu_lr_tiles(int64_t n, int nt) { return (n + nt - 1) / nt; }

/* Pass p's digit of key (p = 0: the top 8 bits). */
MOEQ_HD uint32_t moeq_cu_lr_digit(uint32_t key, int pass) { return (key >> (24 - 8 * pass)) & 0xffu; }

/* key's bits above pass p's digit equal prefix's (pass 0: every key). */
MOEQ_HD int moeq_cu_lr_in_prefix(uint32_t key, uint32_t prefix, int pass) {
    return pass == 0 || (key >> (32 - 8 * pass)) == (prefix >> (32 - 8 * pass));
}

/*
 * The bucket holding the k-th best (1-based) of the counted values, from the top bucket down; *k_left = its
 * rank inside that bucket. Requires k <= the sum of hist.
 */
MOEQ_HD uint32_t moeq_cu_lr_pick(const uint32_t *hist, uint32_t k, uint32_t *k_left) {
    for (int b = MOEQ_CU_LR_BUCKETS - 1; b > 0; b--) {
        if (hist[b] >= k) {
            *k_left = k;
            return (uint32_t)b;
        }
        k -= hist[b];
    }
    *k_left = k;
    return 0;
}

/* One count: atomic on the device (shared memory), a plain add in the host's emulation (one thread at a time). */
MOEQ_HD void moeq_cu_lr_count(uint32_t *hist, uint32_t digit) {
#ifdef __CUDA_ARCH__
    atomicAdd(&hist[digit], 1u);
#else
    hist[digit]++;
#endif
}

/* A thread's best (key, id) so far and whether it saw a non-finite value. */
typedef struct moeq_cu_lr_best {
    uint32_t key;
    int32_t id;
    int nonfinite;
} moeq_cu_lr_best;

/*
 * Thread t's share of radix pass p over row x (n values): the digits of its values inside the prefix into
 * hist; on pass 0 also its best value and the finite check (best starts as key 0, id n: worse than any value).
 */
MOEQ_HD void moeq_cu_lr_pass_thread(const float *x, int64_t n, int nt, int t, int pass, uint32_t prefix,
                                    uint32_t *hist, moeq_cu_lr_best *best) {
    for (int64_t i = t; i < n; i += nt) {
        float v = x[i];
        uint32_t key = moeq_cu_lr_key(v), bits;
        if (pass == 0) {
            memcpy(&bits, &v, sizeof bits);
            if ((bits & 0x7f800000u) == 0x7f800000u) best->nonfinite = 1;
            if (moeq_cu_lr_better(key, (int32_t)i, best->key, best->id)) best->key = key, best->id = (int32_t)i;
        }
        if (moeq_cu_lr_in_prefix(key, prefix, pass)) moeq_cu_lr_count(hist, moeq_cu_lr_digit(key, pass));
    }
}

/* The better of two threads' bests (the reduction; a total order, so any tree gives the same). */
MOEQ_HD moeq_cu_lr_best moeq_cu_lr_best_merge(moeq_cu_lr_best a, moeq_cu_lr_best b) {
    moeq_cu_lr_best r = moeq_cu_lr_better(a.key, a.id, b.key, b.id) ? a : b;
    r.nonfinite = a.nonfinite | b.nonfinite;
    return r;
}

/* Thread t's sums over its values in tile order: (float)exp((x - top) * inv_t) (inv_t > 0) and exp(x - top). */
MOEQ_HD void moeq_cu_lr_sum_thread(const float *x, int64_t n, int nt, int t, double top, double inv_t, double *sum_t,
                                   double *sum_1) {
    double st = 0.0, s1 = 0.0;
    for (int64_t i = t; i < n; i += nt) {
        double d = (double)x[i] - top;
        s1 += exp(d);
        if (inv_t > 0) st += (float)exp(d * inv_t);
    }
    *sum_t = st, *sum_1 = s1;
}

/*
 * The candidate slot of the value with key at index i, or -1: thr is the c-th best key; n_gt values are above
 * it (all taken, slots 0..n_gt-1 in index order), n_eq of those equal to it are taken (the lowest ids: slots
 * n_gt.. in index order). gt_before / eq_before: values above / equal to thr at lower indices.
 */
MOEQ_HD int moeq_cu_lr_slot(uint32_t key, uint32_t thr, uint32_t gt_before, uint32_t eq_before, uint32_t n_gt,
                            uint32_t n_eq) {
    if (key > thr) return (int)gt_before;
    if (key == thr && eq_before < n_eq) return (int)(n_gt + eq_before);
    return -1;
}

/* Candidate i's place among the m: how many candidates rank before it. */
MOEQ_HD int moeq_cu_lr_rank(const uint32_t *keys, const int32_t *ids, int m, int i) {
    int r = 0;
    for (int j = 0; j < m; j++) r += moeq_cu_lr_better(keys[j], ids[j], keys[i], ids[i]);
    return r;
}

/* Values per partition of a row of n: a multiple of nt, at least MOEQ_CU_LR_PART_MIN, at most
 * MOEQ_CU_LR_MAX_PARTS partitions. */
MOEQ_HD int64_t moeq_cu_lr_part_len(int64_t n, int nt) {
    int64_t s = (n + MOEQ_CU_LR_MAX_PARTS - 1) / MOEQ_CU_LR_MAX_PARTS;
    if (s < MOEQ_CU_LR_PART_MIN) s = MOEQ_CU_LR_PART_MIN;
    return (s + nt - 1) / nt * nt;
}

MOEQ_HD int moeq_cu_lr_parts(int64_t n, int nt) {
    int64_t s = moeq_cu_lr_part_len(n, nt);
    return n > 0 ? (int)((n + s - 1) / s) : 1;
}

/* Thread t's share of radix pass p over the union's n candidate keys (the merge's histogram). */
MOEQ_HD void moeq_cu_lr_key_pass_thread(const uint32_t *keys, int n, int nt, int t, int pass, uint32_t prefix,
                                        uint32_t *hist) {
    for (int i = t; i < n; i += nt)
        if (moeq_cu_lr_in_prefix(keys[i], prefix, pass)) moeq_cu_lr_count(hist, moeq_cu_lr_digit(keys[i], pass));
}

/* The record's argmax: the best candidate, or 0 when x[0] is a NaN (moeq_sampler_argmax's scalar loop). */
MOEQ_HD int32_t moeq_cu_lr_argmax(const float *x, int32_t best_id) {
    float v0 = x[0];
    return v0 != v0 ? 0 : best_id;
}

#endif
