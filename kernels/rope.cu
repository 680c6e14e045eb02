// rope.cu — rotary embedding on interleaved pairs, in place. One thread per (token, head, pair).
#include "common.cuh"

__global__ void rope_kernel(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int T, int H,
                            int stride, int off, int half) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)T * H * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    size_t th = idx / half;
    int t = (int)(th / H);
    float *v = x + th * stride + off;
    float cs = cos_t[(size_t)pos[t] * half + i], sn = sin_t[(size_t)pos[t] * half + i];
    float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * cs - b * sn;
    v[2 * i + 1] = b * cs + a * sn;
}

extern "C" moeq_err moeq_cuda_rope(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int T, int H,
                                   int stride, int off, int dim, void *stream) {
    if (T <= 0 || H <= 0 || dim <= 0 || dim % 2 || off + dim > stride) return MOEQ_ERR_INVALID_ARG;
    size_t total = (size_t)T * H * (dim / 2);
    rope_kernel<<<(unsigned)((total + 255) / 256), 256, 0, (cudaStream_t)stream>>>(x, pos, cos_t, sin_t, T, H, stride,
                                                                                   off, dim / 2);
    return moeq_cuda_check_launch();
}
