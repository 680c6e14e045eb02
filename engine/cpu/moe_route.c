/*
 * moe_route.c — one token's routing (see moe_route.h). No allocation: the
 * caller passes scratch sized by moeq_moe_route_scratch.
 */
#include "moe_route.h"

#include <math.h>
#include <string.h>

#include "ops.h"

/* Index of the largest v[i] (first on ties) among i < n with v[i] > -inf; -1 when none. */
static int argmax_first(const float *v, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (v[i] > -INFINITY && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

static float group_score(const moeq_moe_router *router, const float *g, int size) {
    if (router->method == MOEQ_MOE_GROUP_LIMITED_GREEDY || size < 2) {
        float m = g[0];
        for (int i = 1; i < size; i++) m = g[i] > m ? g[i] : m;
        return m;
    }
    int a = 0; /* top-2 sum, first index on ties */
    for (int i = 1; i < size; i++)
        if (g[i] > g[a]) a = i;
    int b = a == 0 ? 1 : 0;
    for (int i = 0; i < size; i++)
        if (i != a && g[i] > g[b]) b = i;
    return g[a] + g[b];
}

/* Exclude (-inf) the experts outside the topk_group best groups of choice[]. */
static void mask_groups(const moeq_moe_router *router, float *choice, float *gscore) {
    int size = router->n_experts / router->n_group;
    for (int g = 0; g < router->n_group; g++) gscore[g] = group_score(router, choice + g * size, size);
    for (int kept = 0; kept < router->topk_group; kept++) {
        int g = argmax_first(gscore, router->n_group);
        if (g < 0) break; /* every score left is NaN: those groups stay unmasked (the token is flagged) */
        gscore[g] = NAN;  /* kept; argmax_first skips NaN */
    }
    for (int g = 0; g < router->n_group; g++)
        if (!isnan(gscore[g]))
            for (int i = 0; i < size; i++) choice[g * size + i] = -INFINITY;
}

/* The lowest expert not among ids[0..s): a valid pick when no score compares (all NaN). */
static int first_unpicked(const int32_t *ids, int s) {
    for (int e = 0;; e++) {
        int taken = 0;
        for (int j = 0; j < s && !taken; j++) taken = ids[j] == e;
        if (!taken) return e;
    }
}

int moeq_moe_route(const moeq_moe_router *router, const float *logits, const float *bias, int32_t *ids,
                   float *weights, float *scratch) {
    int n = router->n_experts, finite = 1;
    float *scores = scratch, *choice = scratch + n, *gscore = scratch + 2 * n;
    for (int i = 0; i < n; i++) finite &= isfinite(logits[i]) != 0;
    if (router->sigmoid)
        for (int i = 0; i < n; i++) scores[i] = moeq_ops_sigmoid(logits[i]);
    else {
        memcpy(scores, logits, (size_t)n * sizeof(float));
        moeq_ops_softmax(scores, n);
    }
    for (int i = 0; i < n; i++) choice[i] = scores[i] + (bias && router->method == MOEQ_MOE_NOAUX_TC ? bias[i] : 0.0f);
    if (router->method != MOEQ_MOE_GREEDY && router->n_group > 1) mask_groups(router, choice, gscore);
    float sum = 0.0f;
    for (int s = 0; s < router->top_k; s++) {
        int e = argmax_first(choice, n);
        if (e < 0) e = first_unpicked(ids, s); /* NaN scores: never index by -1 */
        choice[e] = -INFINITY;
        ids[s] = e;
        weights[s] = scores[e];
        sum += scores[e];
    }
    int norm = router->top_k > 1 && router->norm_topk_prob;
    for (int s = 0; s < router->top_k; s++) {
        if (norm) weights[s] /= sum + 1e-20f;
        if (!norm || router->scale_always) weights[s] *= router->scaling;
    }
    return finite;
}

