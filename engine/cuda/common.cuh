// common.cuh — device-only glue of the kernels: error mapping and the 16-lane butterfly.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "moeq/cuda_kernels.h"

static inline moeq_err moeq_cuda_check_launch(void) {
    return cudaGetLastError() == cudaSuccess ? MOEQ_OK : MOEQ_ERR_INTERNAL;
}

// The 16-lane tree as shuffles within each half-warp (moeq_cu_butterfly16 is its host emulation): lane i adds
// lane i^m, m = 8, 4, 2, 1, own value first. Every lane of the half-warp ends with the tree's sum.
// mask: the warp's threads that take part (all that reach the call).
__device__ __forceinline__ float moeq_cu_tree16_shfl(float v, unsigned mask) {
    for (int m = 8; m > 0; m >>= 1) v = v + __shfl_xor_sync(mask, v, m, 16);
    return v;
}
