/*
 * moeq/cuda_kernels.h — the CUDA kernels of the (future) CUDA backend. Each
 * computes what one CPU engine op computes, in the same operation order, so
 * that its results are the CPU's bits (see engine/cuda/ops.cuh for the
 * arithmetic they share with the host tests, docs/CUDA.md for what was
 * verified where). The CPU engine is the reference: tests/test_kernels_gpu.c
 * compares every kernel with the engine's op.
 *
 * Launchers take device pointers and a cudaStream_t passed as void* (so C
 * callers need no CUDA headers), return a moeq_err, and never synchronise.
 * Shapes are written as (rows, cols), row-major.
 */
#ifndef MOEQ_CUDA_KERNELS_H
#define MOEQ_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "ops.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices usable here; 0 with a reason in why[] when none. */
int moeq_cuda_device_count(char *why, size_t why_size);

/* moeq_ops_rmsnorm on each of T rows of D floats: out = w * (x * (1 / sqrtf(dot(x, x) / D + eps))). */
moeq_err moeq_cuda_rmsnorm(float *out, const float *x, const float *w, int64_t T, int64_t D, float eps, void *stream);

/* moeq_ops_silu_mul: out[i] = silu(gate[i]) * up[i] over n floats. out may alias gate. */
moeq_err moeq_cuda_silu_mul(float *out, const float *gate, const float *up, int64_t n, void *stream);

/*
 * The engine's NT matmul with a BF16 weight (moeq_mm_nt_block): y[t, o] = sum_k x[t, k] * W[o, k],
 * W (O, K) bf16, x (T, K) with row stride ldx, y (T, O) with row stride ldy. The 16-lane order of the
 * CPU kernels: batch-invariant and equal to the CPU's bits.
 */
moeq_err moeq_cuda_matmul_bf16(float *y, int64_t ldy, const float *x, int64_t ldx, const uint16_t *W, int64_t T,
                               int64_t K, int64_t O, void *stream);

/*
 * moeq_moe_route for T tokens: logits (T, E), bias (E) or NULL -> ids (T, top_k), weights (T, top_k),
 * finite (T) or NULL (0 where a token's logits hold NaN/inf). E <= MOEQ_CU_ROUTE_MAX_EXPERTS.
 */
moeq_err moeq_cuda_moe_route(int32_t *ids, float *weights, int32_t *finite, const float *logits, const float *bias,
                             int64_t T, moeq_cu_router router, void *stream);

/*
 * moeq_rope_apply for T tokens x H heads: the rope part of head (t, h) is x + (t * H + h) * ldx (dim floats,
 * interleaved pairs) and goes to out + (t * H + h) * ldo (halves layout). cos_t/sin_t are (max_pos, dim/2)
 * tables of moeq_rope_cos_sin rows (mscale included), row pos[t] for token t (pos[t] < max_pos: the device
 * cannot check it). out must not overlap x.
 */
moeq_err moeq_cuda_rope(float *out, int64_t ldo, const float *x, int64_t ldx, const int32_t *pos, const float *cos_t,
                        const float *sin_t, int64_t T, int64_t H, int dim, void *stream);

#ifdef __cplusplus
}
#endif
#endif
