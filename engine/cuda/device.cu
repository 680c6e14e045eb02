// device.cu — device discovery with a human-readable reason when there is none.
#include <stdio.h>

#include "common.cuh"

extern "C" int moeq_cuda_device_count(char *why, size_t why_size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why && why_size) snprintf(why, why_size, "no usable CUDA device: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why && why_size) snprintf(why, why_size, "no CUDA device present");
    return n;
}
