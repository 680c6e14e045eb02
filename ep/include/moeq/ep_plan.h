/*
 * moeq/ep_plan.h — the placement planner (EPLB's greedy): from measured
 * per-expert token counts, give extra replicas to the hottest experts, then
 * pack the experts' replicas onto ranks to even the predicted load.
 *
 * Pure: no I/O except moeq_ep_stats_load. Deterministic: ties go to the lower
 * expert id and the lower rank, so the same counts always give the same plan.
 * The predicted load of a rank is the sum, over the experts it holds, of the
 * expert's count divided by its number of replicas (moeq_ep_placement_pick
 * spreads an expert's slots evenly over its replicas by token index).
 */
#ifndef MOEQ_EP_PLAN_H
#define MOEQ_EP_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "moeq/ep_placement.h"
#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Plan n_experts experts (counts[e] >= 0 slots each) on n_ranks ranks with
 * at most n_replicas (0..4096) extra replicas in all: of the plans with 0, 1,
 * ... n_replicas extras, the one with the lowest predicted max load (the
 * fewest extras on a tie), so a larger budget never predicts worse. An expert
 * gets at most n_ranks replicas (on distinct ranks); with P experts and
 * replicas in the plan, every rank holds at most ceil(P / n_ranks).
 */
moeq_err moeq_ep_plan(const int64_t *counts, int n_experts, int n_ranks, int n_replicas, moeq_ep_placement **out,
                      char *errstr, size_t errstr_size);

/* Predicted load of each rank (rank_load may be NULL) and the max and mean over ranks. */
void moeq_ep_plan_predict(const moeq_ep_placement *pl, const int64_t *counts, double *rank_load, double *max_load,
                          double *mean_load);

/*
 * Per-expert counts from text: non-negative integers separated by blanks,
 * commas or newlines, '#' comments; the number of values is n_experts.
 * *counts is malloc'd (caller frees).
 */
moeq_err moeq_ep_stats_parse(const char *text, size_t len, int64_t **counts, int *n_experts, char *errstr,
                             size_t errstr_size);

/*
 * Write the text moeq_ep_stats_parse reads back, from a load table counts[l *
 * n_experts + x] (an engine's moeq_engine_expert_counts): comment lines
 * first ('# ' + note, when given; then '# layer L:' and that layer's counts,
 * for every layer with any), then the per-expert sums over layers, the one
 * line the parser reads (one placement serves every layer). IO when out
 * reports a write error.
 */
moeq_err moeq_ep_stats_print(const uint64_t *counts, int n_layers, int n_experts, const char *note, FILE *out,
                             char *errstr, size_t errstr_size);

/* Several ranks' stats files summed (each rank counts its own tokens); every file must have the same experts. */
moeq_err moeq_ep_stats_load_sum(const char *const *paths, int n_paths, int64_t **counts, int *n_experts,
                                char *errstr, size_t errstr_size);
moeq_err moeq_ep_stats_load(const char *path, int64_t **counts, int *n_experts, char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
