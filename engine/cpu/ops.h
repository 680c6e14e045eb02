/*
 * ops.h — internal: the small per-row operations of the forward pass
 * (RMSNorm, SiLU-gated product, in-place softmax). Each works on one row and
 * has a fixed evaluation order, so a row's result never depends on the other
 * rows of the step. They do not thread (rows are cheap next to the matmuls).
 */
#ifndef MOEQ_ENGINE_OPS_H
#define MOEQ_ENGINE_OPS_H

#include <stdint.h>

/* out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)), as HF DeepseekV3RMSNorm in float32. out may be x.
 * A row whose sum of squares overflows (or holds NaN/inf) comes out NaN, never as zeros. */
void moeq_ops_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) (exp of -|g| only, ops_exp.h). out may alias gate. */
void moeq_ops_silu_mul(float *out, const float *gate, const float *up, int64_t n);
/* The same, always the scalar form (the vector form must match it bit for bit; for tests). */
void moeq_ops_silu_mul_scalar(float *out, const float *gate, const float *up, int64_t n);

/* In place: x = softmax(x) (max-subtracted, ascending sums). */
void moeq_ops_softmax(float *x, int64_t n);

/* 1 / (1 + exp(-x)). */
float moeq_ops_sigmoid(float x);

/* 1 when every x[i] is finite, 0 when one is NaN or +-inf. By the exponent bits, so it vectorises: a pass over a
 * logits row costs a few microseconds next to the lm_head matmul that wrote it. */
int moeq_ops_finite(const float *x, int64_t n);

#endif
