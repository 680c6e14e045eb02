/*
 * backend_cuda.h — internal: the CUDA backend (backend_cuda.cu), registered as
 * "cuda" in backend_reg.c when the build has nvcc and cuBLAS
 * (MOEQ_HAVE_CUDA_BACKEND). docs/CUDA.md describes what runs where.
 */
#ifndef MOEQ_ENGINE_CUDA_BACKEND_CUDA_H
#define MOEQ_ENGINE_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The backend on device config->device: UNSUPPORTED naming the reason when
 * there is no such device (none present, driver missing, ordinal past the
 * count), NOMEM when device or pinned memory for its staging runs out,
 * INTERNAL naming the CUDA/cuBLAS call that failed otherwise.
 */
moeq_err moeq_backend_cuda_new(const moeq_backend_config *config, moeq_backend **out, char *errstr,
                               size_t errstr_size);

/* What supports() answers, without a device: every op on F32, BF16, F16 and F8 E4M3 weights. */
int moeq_backend_cuda_supports(moeq_backend_op op, moeq_dtype dtype);

#ifdef __cplusplus
}
#endif
#endif
