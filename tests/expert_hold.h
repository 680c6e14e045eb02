/*
 * tests/expert_hold.h — which routed experts a test backend holds, as a GPU holds them after map_experts (engine
 * key expert_weights, docs/EP.md): the CPU backends that stand in for one (test_engine_group's "holding",
 * test_backend_cuda_gpu's stand-in) wrap map_experts with expert_hold_set and check each product's weight with
 * expert_hold_has. Header-only: each test is one program.
 */
#ifndef MOEQ_TESTS_EXPERT_HOLD_H
#define MOEQ_TESTS_EXPERT_HOLD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

typedef struct expert_hold {
    const moeq_model *model; /* whose experts; NULL: none known yet (every tensor counts as held) */
    uint8_t *held;           /* (num_hidden_layers, n_routed_experts) flags; NULL: every one */
    int none;                /* created with experts_deferred, before any map_experts: none held */
} expert_hold;

/* A backend made (none: with experts_deferred): what an earlier one held is forgotten. */
static inline void expert_hold_reset(expert_hold *h, int none) {
    free(h->held);
    h->held = NULL, h->model = NULL, h->none = none;
}

/* map_experts(model, resident) on it: the flags copied (NULL: every expert). */
static inline void expert_hold_set(expert_hold *h, const moeq_model *model, const uint8_t *resident) {
    size_t n = (size_t)model->config.num_hidden_layers * (size_t)model->config.n_routed_experts;
    free(h->held);
    h->held = resident ? malloc(n) : NULL;
    if (h->held) memcpy(h->held, resident, n);
    h->model = model, h->none = 0;
}

/* 0 when w is a main layer's routed expert weight the backend does not hold; 1 for any other tensor. */
static inline int expert_hold_has(const expert_hold *h, const moeq_tensor *w) {
    const moeq_model *m = h->model;
    if (!m || (!h->none && !h->held)) return 1;
    int E = m->config.n_routed_experts;
    for (int l = 0; l < m->config.num_hidden_layers; l++)
        for (int x = 0; m->layers[l].experts && x < E; x++) {
            const moeq_expert *ex = &m->layers[l].experts[x];
            if (w == ex->gate_proj || w == ex->up_proj || w == ex->down_proj)
                return !h->none && h->held[(size_t)l * (size_t)E + (size_t)x];
        }
    return 1;
}

#endif
