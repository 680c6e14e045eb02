/*
 * ref.c — the plain-C definitions of the CUDA kernels in this directory.
 * Straightforward loops, no tricks: these are what the kernels are tested
 * against, not fast paths.
 */
#include <math.h>
#include <string.h>

#include "moeq/kernels.h"

static float bf16_to_f32(moeq_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void moeq_ref_rmsnorm(float *out, const float *x, const float *w, int T, int D, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * D;
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
        float r = 1.0f / sqrtf((float)(ss / D) + eps);
        for (int i = 0; i < D; i++) out[(size_t)t * D + i] = xr[i] * r * w[i];
    }
}

void moeq_ref_swiglu(float *out, const float *gate, const float *up, int T, int N) {
    for (size_t i = 0; i < (size_t)T * N; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void moeq_ref_matmul_bf16(float *y, const float *x, const moeq_bf16 *W, int T, int K, int O) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < O; o++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)x[(size_t)t * K + k] * bf16_to_f32(W[(size_t)o * K + k]);
            y[(size_t)t * O + o] = (float)acc;
        }
}

/* Index of the largest value among the allowed entries; ties go to the lower index. */
static int argmax_allowed(const float *v, const unsigned char *allowed, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (allowed[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

void moeq_ref_moe_route(int32_t *ids, float *weights, const float *logits, const float *bias, int T, int E,
                        int n_group, int topk_group, int k, int norm_topk, float scale) {
    float s[256], c[256], gscore[256];
    unsigned char allowed[256], gallowed[256];
    int per = E / n_group;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-logits[(size_t)t * E + e]));
            c[e] = s[e] + (bias ? bias[e] : 0.0f);
            allowed[e] = 1;
        }
        if (n_group > 1) {
            for (int g = 0; g < n_group; g++) {
                float a = -INFINITY, b = -INFINITY; /* top-2 of the group */
                for (int e = g * per; e < (g + 1) * per; e++) {
                    if (c[e] > a) { b = a; a = c[e]; }
                    else if (c[e] > b) b = c[e];
                }
                gscore[g] = a + (per > 1 ? b : 0.0f);
                gallowed[g] = 1;
            }
            unsigned char keep[256] = {0};
            for (int j = 0; j < topk_group; j++) {
                int g = argmax_allowed(gscore, gallowed, n_group);
                keep[g] = 1;
                gallowed[g] = 0;
            }
            for (int e = 0; e < E; e++) allowed[e] = keep[e / per];
        }
        float sum = 0;
        for (int j = 0; j < k; j++) {
            int e = argmax_allowed(c, allowed, E);
            allowed[e] = 0;
            ids[(size_t)t * k + j] = e;
            weights[(size_t)t * k + j] = s[e];
            sum += s[e];
        }
        for (int j = 0; j < k; j++) {
            float w = weights[(size_t)t * k + j];
            if (norm_topk) w /= (sum + 1e-20f);
            weights[(size_t)t * k + j] = w * scale;
        }
    }
}

void moeq_ref_rope(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int T, int H, int stride,
                   int off, int dim) {
    int half = dim / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)t * H + h) * stride + off;
            const float *cs = cos_t + (size_t)pos[t] * half, *sn = sin_t + (size_t)pos[t] * half;
            for (int i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * cs[i] - b * sn[i];
                v[2 * i + 1] = b * cs[i] + a * sn[i];
            }
        }
}
