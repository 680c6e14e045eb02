/*
 * moe.h — internal: expert routing and the gather plan of a MoE layer. Pure
 * functions over arrays (no weights, no threads), tested directly.
 *
 * Routing follows HF modeling_deepseek.py:
 *   V3 (noaux_tc, sigmoid): choose on score + e_score_correction_bias; group
 *      score = sum of the group's top-2 biased scores; keep topk_group groups;
 *      experts of other groups excluded (-inf); top-k; weights from the
 *      unbiased scores, normalised when norm_topk_prob (sum + 1e-20), then
 *      always times routed_scaling_factor.
 *   V2 (softmax; greedy or group_limited_greedy with group score = max):
 *      normalised when norm_topk_prob, otherwise times routed_scaling_factor
 *      (DeepSeek-V2-Lite's MoEGate).
 * Ties go to the lower expert index. Slots are returned best first.
 */
#ifndef MOEQ_ENGINE_MOE_H
#define MOEQ_ENGINE_MOE_H

#include <stdint.h>

#include "moeq/engine.h"

typedef enum moeq_moe_method {
    MOEQ_MOE_GREEDY = 0,
    MOEQ_MOE_GROUP_LIMITED_GREEDY,
    MOEQ_MOE_NOAUX_TC,
} moeq_moe_method;

typedef struct moeq_moe_router {
    int n_experts, top_k, n_group, topk_group;
    int sigmoid;            /* 1: sigmoid scores, 0: softmax            */
    moeq_moe_method method;
    int norm_topk_prob;
    int scale_always;       /* V3: scale after normalising too          */
    float scaling;          /* routed_scaling_factor                    */
} moeq_moe_router;

/* From the config; errors name the field (e.g. n_routed_experts % n_group). */
moeq_err moeq_moe_router_init(moeq_moe_router *router, const moeq_model_config *config, char *errstr,
                              size_t errstr_size);

/* Scratch floats moeq_moe_route needs. */
int64_t moeq_moe_route_scratch(const moeq_moe_router *router);

/*
 * The gather plan of a step: ids [n_tok * top_k] → for each expert e the
 * slots routed to it are order[offsets[e] .. offsets[e+1]) (slot = t*top_k+s),
 * tokens ascending. offsets has n_experts+1 entries.
 */
void moeq_moe_plan(const int32_t *ids, int64_t n_tok, int top_k, int n_experts, int64_t *offsets, int64_t *order);

#endif
