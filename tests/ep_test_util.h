/*
 * ep_test_util.h — shared by the ep tests and bench-ep: random tokens, a
 * deterministic "expert" (row * (e + 1) + e, per element) and one full round
 * dispatch → experts → combine.
 */
#ifndef MOEQ_EP_TEST_UTIL_H
#define MOEQ_EP_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/ep.h"

static inline uint64_t ept_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* T tokens: top_k distinct expert ids each (one slot in 16 masked with -1 when mask), rows in [-2, 2). */
static inline void ept_inputs(uint64_t seed, int64_t T, int K, int E, int H, int mask, int32_t *ids, float *x) {
    uint64_t s = seed;
    for (int64_t t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(ept_next(&s) % (uint64_t)E), dup = 0;
                for (int j = 0; j < k; j++) dup |= ids[t * K + j] == e;
            } while (dup);
            ids[t * K + k] = e;
        }
        if (mask && ept_next(&s) % 16 == 0) ids[t * K + (int)(ept_next(&s) % (uint64_t)K)] = -1;
        for (int h = 0; h < H; h++) x[t * H + h] = (float)((double)(ept_next(&s) >> 11) / 9007199254740992.0 * 4 - 2);
    }
}

/* The owning rank's "expert": y = x * (e + 1) + e, element by element. */
static inline void ept_experts(const moeq_ep_recv *r, int H, float *y) {
    for (int l = 0; l < r->n_local; l++) {
        float e = (float)r->local_expert[l];
        for (int64_t i = r->expert_offset[l]; i < r->expert_offset[l + 1]; i++)
            for (int h = 0; h < H; h++) y[i * H + h] = r->x[i * H + h] * (e + 1.0f) + e;
    }
}

/* dispatch → experts → combine; y needs room for n_ranks * max_tokens * top_k rows. */
static inline moeq_err ept_round(moeq_ep *ep, int64_t T, const int32_t *ids, const float *x, int H, float *y,
                                 float *out, char *errstr, size_t n) {
    moeq_ep_recv r;
    moeq_err err = moeq_ep_dispatch(ep, T, ids, x, &r, errstr, n);
    if (err) return err;
    ept_experts(&r, H, y);
    return moeq_ep_combine(ep, y, out, errstr, n);
}

/* The same round on a one-rank local handle over every expert: the reference. */
static inline moeq_err ept_reference(const moeq_ep_params *p, int64_t T, const int32_t *ids, const float *x,
                                     float *out, char *errstr, size_t n) {
    moeq_ep_params lp = *p;
    strcpy(lp.transport, "local");
    lp.rank = 0, lp.n_ranks = 1;
    moeq_ep *ep = NULL;
    float *y = malloc((size_t)p->max_tokens * p->top_k * p->hidden * sizeof(float) + 1);
    moeq_err err = y ? moeq_ep_new(&lp, NULL, NULL, &ep, errstr, n) : MOEQ_ERR_NOMEM;
    if (!err) err = ept_round(ep, T, ids, x, p->hidden, y, out, errstr, n);
    moeq_ep_destroy(ep);
    free(y);
    return err;
}

#endif
