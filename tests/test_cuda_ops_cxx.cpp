// test_cuda_ops_cxx.cpp — engine/cuda/ops.cuh compiled as C++, the way nvcc's host pass and any C++ caller
// compile it; test_cuda_ops_host.c compares these results with its C build's, bit for bit (a C++ compiler
// contracting a * b + c into an fma on its own would show here).
#include "ops.cuh"

extern "C" {
float moeq_cu_cxx_silu_mul(float g, float u) { return moeq_cu_silu_mul(g, u); }
float moeq_cu_cxx_exp_nonpos(float x) { return moeq_cu_exp_nonpos(x); }
void moeq_cu_cxx_rope_pair(const float *x, float cs, float sn, int64_t i, int64_t half, float *out) {
    moeq_cu_rope_pair(x, cs, sn, i, half, out);
}
float moeq_cu_cxx_rmsnorm(float sumsq, int64_t n, float eps, float x, float w) {
    return moeq_cu_rmsnorm_elem(x, w, moeq_cu_rmsnorm_factor(sumsq, n, eps));
}
float moeq_cu_cxx_dot_lane(const float *a, const float *b, int64_t n, int lane) {
    return moeq_cu_dot_lane(a, b, n, lane);
}
float moeq_cu_cxx_widen(int dtype, const void *W, const float *scale_inv, int64_t cols, int64_t row, int64_t k) {
    return moeq_cu_widen(dtype, W, scale_inv, cols, row, k);
}
}
