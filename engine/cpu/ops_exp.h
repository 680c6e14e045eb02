/*
 * ops_exp.h — internal: exp for arguments <= 0 (softmax, sigmoid), as one
 * fixed sequence of IEEE operations, so the scalar form and the vector forms
 * give the same bits on every CPU (libm's expf may differ between its FMA
 * and non-FMA variants, and has no vector form).
 */
#ifndef MOEQ_ENGINE_OPS_EXP_H
#define MOEQ_ENGINE_OPS_EXP_H

#include <math.h>
#include <stdint.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#endif

/*
 * Cody-Waite reduction by ln 2 and Cephes' expf polynomial, every step one
 * IEEE operation; within 1 ulp of exp over [-87, 0] (the tests measure it);
 * 0 below -87 (where expf goes subnormal). Callers never pass x > 0.
 */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_ROUND 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
#define EXP_MIN -87.0f

static inline float moeq_exp_nonpos(float x) {
    if (!(x >= EXP_MIN)) return 0.0f;
    float n = fmaf(x, EXP_LOG2E, EXP_ROUND) - EXP_ROUND;
    float r = fmaf(n, -EXP_LN2_HI, x);
    r = fmaf(n, -EXP_LN2_LO, r);
    float p = fmaf(EXP_P0, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    union { uint32_t u; float f; } s = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return y * s.f;
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
/* moeq_exp_nonpos on 16 lanes, bit for bit. */
static inline __attribute__((always_inline, target("avx512f,avx512dq,fma"))) __m512 moeq_exp_nonpos512(__m512 x) {
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_MIN), _CMP_GE_OQ);
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(EXP_LOG2E), _mm512_set1_ps(EXP_ROUND)),
                             _mm512_set1_ps(EXP_ROUND));
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(EXP_P0), r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i s = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(ok, y, _mm512_castsi512_ps(s));
}
#endif

#endif
