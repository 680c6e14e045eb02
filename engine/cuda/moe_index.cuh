/*
 * moe_index.cuh — the arithmetic of the CUDA backend's moe_experts op (backend_cuda.cu) as __host__ __device__
 * inline functions in plain C, so that the host unit test (tests/test_backend_cuda_host.c) drives them over
 * many shapes against a plain C model and the CPU backend's op without a GPU:
 *
 *   plan        one thread per expert: its slots counted (moeq_cu_moe_count), the counts' exclusive prefix
 *               sum by one thread (moeq_cu_moe_scan: integers, so any order gives the same offsets), then
 *               each expert's slots placed in ascending slot order (moeq_cu_moe_place): moeq_moe_plan's
 *               plan, the one moe_layer.c's host layout makes. No atomics: nothing depends on timing.
 *   work list   the grouped GEMM's grid is (row tiles of the output, token-tile capacity): block y takes
 *               the y-th (expert, token tile) item in expert order (moeq_cu_moe_item, a binary search over
 *               the tiles' prefix sum), past the plan's last item it idles. The capacity is a function of
 *               the call's slots and experts alone (moeq_cu_moe_tile_cap), never of the counts, so the
 *               launch does not depend on anything the host would have to read back.
 *   tiles       within an item, the tile is ops.cuh's matmul tile over the expert's rows (moeq_cu_mm_index
 *               with T = the expert's count), so every element has the single matmul's order: the CPU's bits.
 */
#ifndef MOEQ_CUDA_MOE_INDEX_CUH
#define MOEQ_CUDA_MOE_INDEX_CUH

#include <stdint.h>

#include "ops.cuh"

/* The plan kernel runs one block of one thread per expert. */
#define MOEQ_CU_MOE_MAX_EXPERTS 256

/* Slots of expert e among ids[0..S) (an id outside [0, E) counts nowhere). */
MOEQ_HD int64_t moeq_cu_moe_count(const int32_t *ids, int64_t S, int e) {
    int64_t n = 0;
    for (int64_t s = 0; s < S; s++) n += ids[s] == e;
    return n;
}

/* Token tiles of an expert with n rows. */
MOEQ_HD int64_t moeq_cu_moe_tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

/* offsets[0..E] = exclusive prefix sum of counts, tile_first[0..E] = that of each expert's tiles. */
MOEQ_HD void moeq_cu_moe_scan(const int64_t *counts, int E, int64_t tile, int64_t *offsets, int64_t *tile_first) {
    int64_t o = 0, f = 0;
    for (int e = 0; e < E; e++) {
        offsets[e] = o, tile_first[e] = f;
        o += counts[e], f += moeq_cu_moe_tiles(counts[e], tile);
    }
    offsets[E] = o, tile_first[E] = f;
}

/* Expert e's slots in ascending order at order[base ..]; slot_row[slot] = its row. */
MOEQ_HD void moeq_cu_moe_place(const int32_t *ids, int64_t S, int e, int64_t base, int64_t *order,
                               int64_t *slot_row) {
    for (int64_t s = 0; s < S; s++)
        if (ids[s] == e) order[base] = s, slot_row[s] = base, base++;
}

/* The most (expert, token tile) items a plan of up to max_slots slots over E experts has: the grid's y.
 * sum_e ceil(c_e / tile) <= ceil(S / tile) + (number of experts with rows) - 1, and at most S of them. */
MOEQ_HD int64_t moeq_cu_moe_tile_cap(int64_t max_slots, int E, int64_t tile) {
    int64_t cap = moeq_cu_moe_tiles(max_slots, tile) + (E > 0 ? E - 1 : 0);
    return cap < max_slots ? cap : max_slots;
}

/* Item y: the expert whose tiles hold it (tile_first[e] <= y < tile_first[e + 1], so experts without rows
 * are passed over) and *tile = y - tile_first[e]; -1 when y is past the last item. */
MOEQ_HD int moeq_cu_moe_item(const int64_t *tile_first, int E, int64_t y, int64_t *tile) {
    if (y < 0 || y >= tile_first[E]) return -1;
    int lo = 0, hi = E - 1; /* the first e with tile_first[e + 1] > y */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (tile_first[mid + 1] > y) hi = mid;
        else lo = mid + 1;
    }
    *tile = y - tile_first[lo];
    return lo;
}

#endif
