// rmsnorm.cu — out(T, D) = x * rsqrt(mean(x^2) + eps) * w. One block of 256 threads per row.
#include "common.cuh"

__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int D, float eps) {
    const float *xr = x + (size_t)blockIdx.x * D;
    float ss = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    __shared__ float part[8];
    ss = moeq_warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        v = moeq_warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float r = rsqrtf(part[0] / D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) out[(size_t)blockIdx.x * D + i] = xr[i] * r * w[i];
}

extern "C" moeq_err moeq_cuda_rmsnorm(float *out, const float *x, const float *w, int T, int D, float eps,
                                      void *stream) {
    if (T <= 0 || D <= 0) return MOEQ_ERR_INVALID_ARG;
    rmsnorm_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(out, x, w, D, eps);
    return moeq_cuda_check_launch();
}
