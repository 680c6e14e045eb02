/*
 * ops.c — row operations (see ops.h). Plain C: the compiler vectorises the
 * element-wise loops; the reductions go through moeq_dot_f32 or run in
 * ascending order so every row is computed the same way in every step. The
 * SiLU product has an AVX-512 form (libm's expf per element was ~1 % of a
 * decode step) that gives the scalar form's bits.
 */
#include "ops.h"

#include <math.h>
#include <string.h>

#include "ops_exp.h"
#include "ops_matmul.h"

void moeq_ops_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float var = moeq_dot_f32(x, x, n) / (float)n;
    /* An overflowed sum of squares would make r 0 and the row finite zeros: garbage that looks like numbers
     * (BF16 weights of 3.4e38 gave `ok` results). NaN instead, so the step's logits say what happened. */
    float r = isfinite(var) ? 1.0f / sqrtf(var + eps) : NAN;
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

float moeq_ops_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* silu(g) * u = g * sigmoid(g) * u, sigmoid through exp(-|g|) so exp never overflows. */
static inline float silu_mul1(float g, float u) {
    float e = moeq_exp_nonpos(0.0f - fabsf(g)), d = 1.0f + e;
    return (g >= 0.0f ? g / d : (g * e) / d) * u;
}

static void silu_mul_scalar(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = silu_mul1(gate[i], up[i]);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
static __attribute__((target("avx512f,avx512dq,fma"))) void silu_mul512(float *out, const float *gate, const float *up,
                                                                       int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i), u = _mm512_loadu_ps(up + i);
        __m512 e = moeq_exp_nonpos512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
        __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
        __mmask16 pos = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ);
        __m512 num = _mm512_mask_blend_ps(pos, _mm512_mul_ps(g, e), g);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(num, d), u));
    }
    silu_mul_scalar(out + i, gate + i, up + i, n - i);
}
#endif

void moeq_ops_silu_mul(float *out, const float *gate, const float *up, int64_t n) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    if (moeq_mm_isa_best() == MOEQ_MM_ISA_AVX512) {
        silu_mul512(out, gate, up, n);
        return;
    }
#endif
    silu_mul_scalar(out, gate, up, n);
}

void moeq_ops_silu_mul_scalar(float *out, const float *gate, const float *up, int64_t n) {
    silu_mul_scalar(out, gate, up, n);
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

int moeq_ops_finite(const float *x, int64_t n) {
    /* the largest exponent field seen, per lane: all ones only for NaN and inf. Lanes of a fixed count, so the
     * compiler vectorises the inner loop at -O2 (a plain loop over n stayed scalar: ~8x slower) */
    uint32_t top[16] = {0}, b[16];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        memcpy(b, x + i, sizeof b);
        for (int j = 0; j < 16; j++) top[j] = (b[j] & 0x7f800000u) > top[j] ? b[j] & 0x7f800000u : top[j];
    }
    for (int j = 0; i < n; i++, j++) {
        memcpy(b, x + i, sizeof b[0]);
        top[j] = (b[0] & 0x7f800000u) > top[j] ? b[0] & 0x7f800000u : top[j];
    }
    uint32_t m = 0;
    for (int j = 0; j < 16; j++) m = top[j] > m ? top[j] : m;
    return m != 0x7f800000u;
}
