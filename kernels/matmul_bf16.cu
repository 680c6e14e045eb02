// matmul_bf16.cu — y(T, O) = x(T, K) . W(O, K)^T, W bf16, fp32 accumulation.
//
// One warp per (output row o, tile of up to TILE_T tokens): W's row is read
// once per tile. Every output element is reduced the same way whatever T is:
// lane l accumulates k = l, l+32, l+64, ... in order, then a fixed butterfly
// sums the 32 lanes. That is what makes it batch-invariant.
#include "common.cuh"

#define TILE_T 8
#define WARPS_PER_BLOCK 4

__global__ void matmul_bf16_kernel(float *y, const float *x, const moeq_bf16 *W, int T, int K, int O) {
    int o = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    int t0 = blockIdx.y * TILE_T;
    if (o >= O) return;
    int nt = min(TILE_T, T - t0);
    float acc[TILE_T];
#pragma unroll
    for (int j = 0; j < TILE_T; j++) acc[j] = 0.f;
    const moeq_bf16 *wr = W + (size_t)o * K;
    for (int k = lane; k < K; k += 32) {
        float wv = moeq_bf16_to_f32(wr[k]);
#pragma unroll
        for (int j = 0; j < TILE_T; j++)
            if (j < nt) acc[j] = fmaf(x[(size_t)(t0 + j) * K + k], wv, acc[j]);
    }
#pragma unroll
    for (int j = 0; j < TILE_T; j++) {
        float v = moeq_warp_sum(acc[j]);
        if (lane == 0 && j < nt) y[(size_t)(t0 + j) * O + o] = v;
    }
}

extern "C" moeq_err moeq_cuda_matmul_bf16(float *y, const float *x, const moeq_bf16 *W, int T, int K, int O,
                                          void *stream) {
    if (T <= 0 || K <= 0 || O <= 0) return MOEQ_ERR_INVALID_ARG;
    dim3 grid((unsigned)((O + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK), (unsigned)((T + TILE_T - 1) / TILE_T));
    matmul_bf16_kernel<<<grid, 32 * WARPS_PER_BLOCK, 0, (cudaStream_t)stream>>>(y, x, W, T, K, O);
    return moeq_cuda_check_launch();
}
