/*
 * sampler.h — internal: the pieces of sampler.c that speculative decoding
 * (mtp_spec.c) shares, so that its target distribution is by construction
 * the one moeq_sampler_sample draws from, and its randomness the same
 * counter-based stream. The public sampler API is in moeq/engine.h.
 */
#ifndef MOEQ_ENGINE_SAMPLER_H
#define MOEQ_ENGINE_SAMPLER_H

#include <stdint.h>

#include "moeq/engine.h"

/* Uniform in [0, 1) from (seed, draw index): draw n of a sampler. */
double moeq_sampler_uniform(uint64_t seed, uint64_t n);

/* 1 when every logit is finite (the check the sampler makes before drawing). */
int moeq_sampler_finite(const float *logits, int64_t n);

/* Exact mode's draft from an MTP row: the sampler hook's draft when it has one, else the argmax. */
int32_t moeq_sampler_draft(moeq_sampler *sampler, const float *row, const int32_t *prefix, int n_prefix);

/* 1 when the sampler's hook drafts (moeq_sampler_draft then reads the whole MTP row). */
int moeq_sampler_has_draft_hook(const moeq_sampler *sampler);

/* 1 when the sampler's next draws read nothing of a row but its argmax (and whether it is finite): greedy,
 * no hook. The engine may then find the argmax without the whole row (head_screen.h). */
int moeq_sampler_argmax_only(const moeq_sampler *sampler);

/* The highest logit's id, the lowest id on ties. */
int32_t moeq_sampler_argmax(const float *logits, int vocab);

/*
 * The distribution of moeq_sampler_sample for these logits (temperature >
 * 0): temperature, then top-k, then top-p. Fills cand[0..m) with the
 * candidate ids and weight[0..m) with their unnormalised weights, *sum with
 * the total; returns m. The order is the sampler's draw order (logit
 * descending, id ascending) when `ordered` or when top-k/top-p need it;
 * otherwise all ids ascending, without sorting. cand and weight hold vocab
 * entries. Thread-safe (no shared state).
 */
int moeq_sampler_weights(const moeq_sampling_params *params, const float *logits, int vocab, int ordered,
                         int32_t *cand, float *weight, double *sum);

#endif
