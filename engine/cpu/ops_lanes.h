/*
 * ops_lanes.h — internal: the one reduction tree of the CPU kernels. Every
 * dot product (matmul, attention scores, RMSNorm's sum of squares, the
 * softmax sum) accumulates in 16 float lanes and ends in this tree, halves
 * 16 -> 8 -> 4 -> 2 -> 1; the scalar form is the emulation the vector forms
 * must match bit for bit (ops_matmul.c, attention.c).
 */
#ifndef MOEQ_ENGINE_OPS_LANES_H
#define MOEQ_ENGINE_OPS_LANES_H

#include <stdint.h>

#define MOEQ_LANES 16

static inline float moeq_tree16(const float *l) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) c[i] = b[i] + b[i + 2];
    return c[0] + c[1];
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>

/* The lanes of a 16-float chunk that lie before the end, `left` floats away (none when left <= 0). */
static inline __mmask16 moeq_tail_mask16(int64_t left) {
    return left >= MOEQ_LANES ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : (__mmask16)0;
}

/* moeq_tree16 of one zmm. */
static inline __attribute__((always_inline, target("avx512f,avx512dq"))) float moeq_hsum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(d);
}

/* moeq_tree16 of 16 lanes held as two ymm halves (lanes 0-7, 8-15): their sum is the tree's first level. */
static inline __attribute__((always_inline, target("avx2"))) float moeq_hsum256(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(d);
}
#endif

#endif
