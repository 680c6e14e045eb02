/*
 * moe_route.h — the CPU backend's routing arithmetic: one token's router
 * logits to its experts and weights (DeepSeek-V3 noaux_tc, V2 greedy and
 * group-limited greedy), the reference the device router is tested against.
 * The router's configuration and the gather plan are engine-level (moe.h).
 */
#ifndef MOEQ_ENGINE_CPU_MOE_ROUTE_H
#define MOEQ_ENGINE_CPU_MOE_ROUTE_H

#include <stdint.h>

#include "moe.h"

/*
 * One token: logits [n_experts] (router output), bias [n_experts] or NULL →
 * ids [top_k], weights [top_k]. Returns 1, or 0 when a logit is not finite
 * (NaN, inf): the ids are then still top_k distinct valid experts (the plan
 * never sees -1), the weights may be NaN, and the caller flags the token.
 * Finite logits route exactly as without the check.
 */
int moeq_moe_route(const moeq_moe_router *router, const float *logits, const float *bias, int32_t *ids,
                    float *weights, float *scratch);

#endif
