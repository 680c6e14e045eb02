// rope.cu — moeq_rope_apply: interleaved pairs in, halves layout out, out of place. One thread per
// (token, head, pair); the index math is moeq_cu_rope_index.
#include "common.cuh"

__global__ void rope_kernel(float *out, int64_t ldo, const float *x, int64_t ldx, const int32_t *pos,
                            const float *cos_t, const float *sin_t, int64_t T, int64_t H, int64_t half) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * H * half) return;
    moeq_cu_rope_at a = moeq_cu_rope_index(idx, H, half);
    int64_t row = (int64_t)pos[a.t] * half + a.i;
    moeq_cu_rope_pair(x + (a.t * H + a.h) * ldx, cos_t[row], sin_t[row], a.i, half, out + (a.t * H + a.h) * ldo);
}

extern "C" moeq_err moeq_cuda_rope(float *out, int64_t ldo, const float *x, int64_t ldx, const int32_t *pos,
                                   const float *cos_t, const float *sin_t, int64_t T, int64_t H, int dim,
                                   void *stream) {
    if (T <= 0 || H <= 0 || dim <= 0 || dim % 2 || ldx < dim || ldo < dim) return MOEQ_ERR_INVALID_ARG;
    int64_t total = T * H * (dim / 2);
    rope_kernel<<<(unsigned)((total + 255) / 256), 256, 0, (cudaStream_t)stream>>>(out, ldo, x, ldx, pos, cos_t,
                                                                                   sin_t, T, H, dim / 2);
    return moeq_cuda_check_launch();
}
