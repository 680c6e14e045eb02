// rmsnorm.cu — moeq_ops_rmsnorm per row. One block per row: its first 16 threads hold the 16 lanes of the
// sum of squares (the lanes are sequential chains in the engine, so no more threads can share them without
// changing the bits), the tree runs as a butterfly, then every thread scales its share of the row.
#include "common.cuh"

#define RMS_THREADS 128

__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int64_t D, float eps) {
    const float *xr = x + (int64_t)blockIdx.x * D;
    float *yr = out + (int64_t)blockIdx.x * D;
    __shared__ float r;
    if (threadIdx.x < MOEQ_CU_LANES) {
        float v = moeq_cu_tree16_shfl(moeq_cu_dot_lane(xr, xr, D, (int)threadIdx.x), 0xffffu);
        if (threadIdx.x == 0) r = moeq_cu_rmsnorm_factor(v, D, eps);
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = moeq_cu_rmsnorm_elem(xr[i], w[i], r);
}

extern "C" moeq_err moeq_cuda_rmsnorm(float *out, const float *x, const float *w, int64_t T, int64_t D, float eps,
                                      void *stream) {
    if (T <= 0 || D <= 0 || T > 0x7fffffff) return MOEQ_ERR_INVALID_ARG;
    rmsnorm_kernel<<<(unsigned)T, RMS_THREADS, 0, (cudaStream_t)stream>>>(out, x, w, D, eps);
    return moeq_cuda_check_launch();
}
