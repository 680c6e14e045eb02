// matmul_bf16.cu — the engine's NT matmul with BF16 weights, in its 16-lane order (see ops.cuh's tiling):
// half-warp per (output row, tile of tokens), one lane per thread, the tree as a butterfly.
#include "common.cuh"

__global__ void matmul_bf16_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, const uint16_t *W, int64_t T,
                                   int64_t K, int64_t O) {
    moeq_cu_mm_at a = moeq_cu_mm_index(blockIdx.x, blockIdx.y, (int)threadIdx.x, T, O);
    float acc[MOEQ_CU_MM_TILE_T];
    // a half-warp past O or T still joins the shuffles (they name the whole warp); it only stores nothing.
    if (a.nt > 0) moeq_cu_mm_bf16_lanes(acc, a, x, ldx, W, K);
    else
        for (int j = 0; j < MOEQ_CU_MM_TILE_T; j++) acc[j] = 0.0f;
#pragma unroll
    for (int j = 0; j < MOEQ_CU_MM_TILE_T; j++) {
        float v = moeq_cu_tree16_shfl(acc[j], 0xffffffffu);
        if (a.lane == 0 && j < a.nt) y[(a.t0 + j) * ldy + a.o] = v;
    }
}

extern "C" moeq_err moeq_cuda_matmul_bf16(float *y, int64_t ldy, const float *x, int64_t ldx, const uint16_t *W,
                                          int64_t T, int64_t K, int64_t O, void *stream) {
    if (T <= 0 || K <= 0 || O <= 0 || ldx < K || ldy < O || moeq_cu_mm_grid_y(T) > 65535)
        return MOEQ_ERR_INVALID_ARG;
    dim3 grid((unsigned)moeq_cu_mm_grid_x(O), (unsigned)moeq_cu_mm_grid_y(T));
    matmul_bf16_kernel<<<grid, MOEQ_CU_MM_THREADS, 0, (cudaStream_t)stream>>>(y, ldy, x, ldx, W, T, K, O);
    return moeq_cuda_check_launch();
}
