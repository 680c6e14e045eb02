// moe_route.cu — moeq_moe_route, one thread per token: E <= 256 experts fit in local memory and the
// selection is sequential by nature; the router is a tiny part of a step.
#include "common.cuh"

__global__ void moe_route_kernel(int32_t *ids, float *weights, int32_t *finite, const float *logits,
                                 const float *bias, int64_t T, moeq_cu_router r) {
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    float scratch[3 * MOEQ_CU_ROUTE_MAX_EXPERTS];
    int ok = moeq_cu_route(&r, logits + t * r.n_experts, bias, ids + t * r.top_k, weights + t * r.top_k, scratch);
    if (finite) finite[t] = ok;
}

extern "C" moeq_err moeq_cuda_moe_route(int32_t *ids, float *weights, int32_t *finite, const float *logits,
                                        const float *bias, int64_t T, moeq_cu_router r, void *stream) {
    if (T <= 0 || r.n_experts <= 0 || r.n_experts > MOEQ_CU_ROUTE_MAX_EXPERTS || r.n_group <= 0 ||
        r.n_experts % r.n_group || r.topk_group > r.n_group || r.top_k <= 0 || r.top_k > r.n_experts)
        return MOEQ_ERR_INVALID_ARG;
    moe_route_kernel<<<(unsigned)((T + 63) / 64), 64, 0, (cudaStream_t)stream>>>(ids, weights, finite, logits, bias,
                                                                                 T, r);
    return moeq_cuda_check_launch();
}
