// swiglu.cu — moeq_ops_silu_mul, element-wise (the fixed-polynomial exp of exp(-|g|)).
#include "common.cuh"

__global__ void silu_mul_kernel(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = moeq_cu_silu_mul(gate[i], up[i]);
}

extern "C" moeq_err moeq_cuda_silu_mul(float *out, const float *gate, const float *up, int64_t n, void *stream) {
    if (n <= 0) return MOEQ_ERR_INVALID_ARG;
    silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(out, gate, up, n);
    return moeq_cuda_check_launch();
}
