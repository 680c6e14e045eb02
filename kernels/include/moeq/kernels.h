/*
 * moeq/kernels.h — CUDA kernels for the engine's GPU backend, each with a
 * plain-C reference (moeq_ref_*) beside it that a test compares it against
 * (tests/test_kernels.c, label gpu). The reference is the CPU definition of
 * the op; the kernel that ships is the kernel that was tested.
 *
 * Launchers take device pointers and a cudaStream_t passed as void* (so C
 * callers need no CUDA headers), return a moeq_err, and never synchronise.
 * Shapes are written as (rows, cols), row-major.
 *
 * No cuBLAS: the toolkit on the build machines ships without it, and the
 * engine needs a GEMM whose per-element reduction order is fixed whatever
 * the batch size (batch invariance), which cuBLAS does not promise.
 */
#ifndef MOEQ_KERNELS_H
#define MOEQ_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices usable here; 0 with a reason in why[] when none. */
int moeq_cuda_device_count(char *why, size_t why_size);

/* bf16 stored as its upper 16 bits of an IEEE float, as in safetensors. */
typedef uint16_t moeq_bf16;

/* out(T, D) = x(T, D) * rsqrt(mean(x^2) + eps) * w(D) */
moeq_err moeq_cuda_rmsnorm(float *out, const float *x, const float *w, int T, int D, float eps, void *stream);
void moeq_ref_rmsnorm(float *out, const float *x, const float *w, int T, int D, float eps);

/* out(T, N) = silu(gate(T, N)) * up(T, N) */
moeq_err moeq_cuda_swiglu(float *out, const float *gate, const float *up, int T, int N, void *stream);
void moeq_ref_swiglu(float *out, const float *gate, const float *up, int T, int N);

/*
 * y(T, O) = x(T, K) . W(O, K)^T with W in bf16, fp32 accumulation. Each
 * output element is reduced in one fixed order (32 strided lane partials,
 * then a fixed butterfly), independent of T: batch-invariant.
 */
moeq_err moeq_cuda_matmul_bf16(float *y, const float *x, const moeq_bf16 *W, int T, int K, int O, void *stream);
void moeq_ref_matmul_bf16(float *y, const float *x, const moeq_bf16 *W, int T, int K, int O);

/*
 * DeepSeek-V3 router for T tokens over E experts: scores = sigmoid(logits),
 * choice on scores + bias (bias may be NULL), group-limited (n_group groups,
 * keep topk_group by the sum of each group's top-2 biased scores), top-k;
 * weights from the unbiased scores, normalised when norm_topk, times scale.
 * ids(T, k), weights(T, k), ordered by descending biased score. E <= 256.
 */
moeq_err moeq_cuda_moe_route(int32_t *ids, float *weights, const float *logits, const float *bias, int T, int E,
                             int n_group, int topk_group, int k, int norm_topk, float scale, void *stream);
void moeq_ref_moe_route(int32_t *ids, float *weights, const float *logits, const float *bias, int T, int E,
                        int n_group, int topk_group, int k, int norm_topk, float scale);

/*
 * Rotary embedding on interleaved pairs (x[2i], x[2i+1]) of the last `dim`
 * values of each head: x(T, H, stride) rotated in place at offset `off`, with
 * cos/sin tables (max_pos, dim/2) already carrying any YaRN mscale.
 */
moeq_err moeq_cuda_rope(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int T, int H,
                        int stride, int off, int dim, void *stream);
void moeq_ref_rope(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int T, int H, int stride,
                   int off, int dim);

#ifdef __cplusplus
}
#endif
#endif
