// swiglu.cu — out(T, N) = silu(gate) * up, elementwise.
#include "common.cuh"

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
}

extern "C" moeq_err moeq_cuda_swiglu(float *out, const float *gate, const float *up, int T, int N, void *stream) {
    if (T <= 0 || N <= 0) return MOEQ_ERR_INVALID_ARG;
    size_t n = (size_t)T * N;
    swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(out, gate, up, n);
    return moeq_cuda_check_launch();
}
