/*
 * moe.c — the router's configuration and the gather plan (see moe.h); the
 * routing arithmetic is the CPU backend's (cpu/moe_route.c). No allocation: the caller
 * passes scratch sized by moeq_moe_route_scratch.
 */
#include "moe.h"

#include <string.h>

moeq_err moeq_moe_router_init(moeq_moe_router *router, const moeq_model_config *config, char *errstr,
                              size_t errstr_size) {
    memset(router, 0, sizeof(*router));
    router->n_experts = config->n_routed_experts;
    router->top_k = config->num_experts_per_tok;
    router->n_group = config->n_group > 0 ? config->n_group : 1;
    router->topk_group = config->topk_group > 0 ? config->topk_group : router->n_group;
    router->norm_topk_prob = config->norm_topk_prob;
    router->scaling = (float)config->routed_scaling_factor;
    router->sigmoid = !strcmp(config->scoring_func, "sigmoid");
    if (!router->sigmoid && strcmp(config->scoring_func, "softmax"))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "scoring_func '%s'", config->scoring_func);
    if (!strcmp(config->topk_method, "noaux_tc")) router->method = MOEQ_MOE_NOAUX_TC;
    else if (!strcmp(config->topk_method, "group_limited_greedy")) router->method = MOEQ_MOE_GROUP_LIMITED_GREEDY;
    else if (!strcmp(config->topk_method, "greedy") || !config->topk_method[0]) router->method = MOEQ_MOE_GREEDY;
    else return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "topk_method '%s'", config->topk_method);
    router->scale_always = !strcmp(config->model_type, "deepseek_v3");
    if (router->n_experts <= 0 || router->top_k <= 0 || router->top_k > router->n_experts)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "num_experts_per_tok %d with n_routed_experts %d",
                         router->top_k, router->n_experts);
    if (router->n_experts % router->n_group || router->topk_group > router->n_group)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "n_group %d / topk_group %d with %d experts",
                         router->n_group, router->topk_group, router->n_experts);
    if (router->method != MOEQ_MOE_GREEDY &&
        (int64_t)router->topk_group * (router->n_experts / router->n_group) < router->top_k)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "topk_group %d leaves fewer than %d experts",
                         router->topk_group, router->top_k);
    return MOEQ_OK;
}

int64_t moeq_moe_route_scratch(const moeq_moe_router *router) {
    return 2 * (int64_t)router->n_experts + router->n_group;
}

void moeq_moe_plan(const int32_t *ids, int64_t n_tok, int top_k, int n_experts, int64_t *offsets, int64_t *order) {
    for (int e = 0; e <= n_experts; e++) offsets[e] = 0;
    int64_t n_slots = n_tok * top_k;
    for (int64_t i = 0; i < n_slots; i++) offsets[ids[i] + 1]++;
    for (int e = 0; e < n_experts; e++) offsets[e + 1] += offsets[e];
    /* fill, using offsets as cursors, then shift back */
    for (int64_t i = 0; i < n_slots; i++) order[offsets[ids[i]]++] = i;
    for (int e = n_experts; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}
