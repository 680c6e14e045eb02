// moe_route.cu — DeepSeek-V3 router (sigmoid, bias for choice only, group-limited top-k).
// One thread per token: E <= 256 experts fit in local memory and the
// selection is sequential by nature; the router is a tiny part of a step.
#include "common.cuh"

__device__ static int argmax_allowed(const float *v, const unsigned char *allowed, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (allowed[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

__global__ void moe_route_kernel(int32_t *ids, float *weights, const float *logits, const float *bias, int T, int E,
                                 int n_group, int topk_group, int k, int norm_topk, float scale) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    float s[256], c[256], gscore[256];
    unsigned char allowed[256], gallowed[256], keep[256];
    int per = E / n_group;
    for (int e = 0; e < E; e++) {
        s[e] = 1.0f / (1.0f + expf(-logits[(size_t)t * E + e]));
        c[e] = s[e] + (bias ? bias[e] : 0.0f);
        allowed[e] = 1;
    }
    if (n_group > 1) {
        for (int g = 0; g < n_group; g++) {
            float a = -INFINITY, b = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (c[e] > a) { b = a; a = c[e]; }
                else if (c[e] > b) b = c[e];
            }
            gscore[g] = a + (per > 1 ? b : 0.0f);
            gallowed[g] = 1;
            keep[g] = 0;
        }
        for (int j = 0; j < topk_group; j++) {
            int g = argmax_allowed(gscore, gallowed, n_group);
            keep[g] = 1;
            gallowed[g] = 0;
        }
        for (int e = 0; e < E; e++) allowed[e] = keep[e / per];
    }
    float sum = 0.f;
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

extern "C" moeq_err moeq_cuda_moe_route(int32_t *ids, float *weights, const float *logits, const float *bias, int T,
                                        int E, int n_group, int topk_group, int k, int norm_topk, float scale,
                                        void *stream) {
    if (T <= 0 || E <= 0 || E > 256 || n_group <= 0 || E % n_group || topk_group > n_group || k > E)
        return MOEQ_ERR_INVALID_ARG;
    moe_route_kernel<<<(T + 63) / 64, 64, 0, (cudaStream_t)stream>>>(ids, weights, logits, bias, T, E, n_group,
                                                                      topk_group, k, norm_topk, scale);
    return moeq_cuda_check_launch();
}
