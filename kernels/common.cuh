// common.cuh — shared helpers for the kernels: error mapping, bf16 widening.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "moeq/kernels.h"

static inline moeq_err moeq_cuda_check_launch(void) {
    return cudaGetLastError() == cudaSuccess ? MOEQ_OK : MOEQ_ERR_INTERNAL;
}

__device__ __forceinline__ float moeq_bf16_to_f32(moeq_bf16 h) {
    return __uint_as_float((uint32_t)h << 16);
}

// Sum over a warp in one fixed butterfly order: the same result whatever the caller's batch.
__device__ __forceinline__ float moeq_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
