/*
 * ops.c — row operations (see ops.h). Plain C: the compiler vectorises the
 * element-wise loops; the reductions go through moeq_dot_f32 or run in
 * ascending order so every row is computed the same way in every step.
 */
#include "ops.h"

#include <math.h>

#include "ops_matmul.h"

void moeq_ops_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float var = moeq_dot_f32(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

float moeq_ops_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

void moeq_ops_silu_mul(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void moeq_ops_softmax(float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] /= sum;
}
