/*
 * moeq/ep_placement.h — where each routed expert lives: a table expert → rank(s).
 *
 * An expert may have several replicas (on distinct ranks); each rank holds a
 * list of "local experts", ascending by global expert id, and a local index is
 * a position in that list. Replicas compute identical bits, so which replica
 * serves a slot never changes a result; the choice is deterministic (see
 * moeq_ep_placement_pick) so it never depends on timing either.
 *
 * Pure data and text: no I/O except moeq_ep_placement_load/_save. Not
 * thread-safe for writes; a finished table may be read from many threads.
 *
 * File format (text, one expert per line, '#' comments, blank lines skipped):
 *     moeq-ep-placement 1 experts=8 ranks=2
 *     0 0
 *     1 1 0        # expert 1 on rank 1, replica on rank 0
 *     ...
 */
#ifndef MOEQ_EP_PLACEMENT_H
#define MOEQ_EP_PLACEMENT_H

#include <stdint.h>
#include <stdio.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Upper bounds that keep every table small and every wire field 32-bit. */
#define MOEQ_EP_MAX_RANKS 1024
#define MOEQ_EP_MAX_EXPERTS 65536

typedef struct moeq_ep_placement moeq_ep_placement;

/* Experts in contiguous blocks: expert e on rank e * n_ranks / n_experts (DeepEP's layout). */
moeq_err moeq_ep_placement_new_identity(int n_experts, int n_ranks, moeq_ep_placement **out,
                                        char *errstr, size_t errstr_size);
/* The blocks of the identity over a permutation of the experts drawn from seed (same seed, same table). */
moeq_err moeq_ep_placement_new_permuted(int n_experts, int n_ranks, uint64_t seed, moeq_ep_placement **out,
                                        char *errstr, size_t errstr_size);
/*
 * The identity plus one extra replica for each of `n_replicated` experts (experts
 * 0, 1, ...), each placed on the next rank after its home (needs n_ranks >= 2).
 */
moeq_err moeq_ep_placement_new_replicated(int n_experts, int n_ranks, int n_replicated, moeq_ep_placement **out,
                                          char *errstr, size_t errstr_size);
/*
 * From an explicit table: ranks_of[e] lists n_rep[e] >= 1 distinct ranks for
 * expert e (copied). Errors name the expert and rank at fault.
 */
moeq_err moeq_ep_placement_new_table(int n_experts, int n_ranks, const int *n_rep, const int *const *ranks_of,
                                     moeq_ep_placement **out, char *errstr, size_t errstr_size);
void moeq_ep_placement_destroy(moeq_ep_placement *pl); /* NULL is safe */
moeq_err moeq_ep_placement_clone(const moeq_ep_placement *pl, moeq_ep_placement **out);

int moeq_ep_placement_n_experts(const moeq_ep_placement *pl);
int moeq_ep_placement_n_ranks(const moeq_ep_placement *pl);
/* Replicas of expert e (>= 1) and the i-th one's rank. */
int moeq_ep_placement_n_replicas(const moeq_ep_placement *pl, int expert);
int moeq_ep_placement_replica(const moeq_ep_placement *pl, int expert, int i);
/* Experts held by rank (local experts), and the global id of local index l. */
int moeq_ep_placement_n_local(const moeq_ep_placement *pl, int rank);
int moeq_ep_placement_local_expert(const moeq_ep_placement *pl, int rank, int local);
/* Local index of expert on rank, or -1 when rank does not hold it. */
int moeq_ep_placement_local_index(const moeq_ep_placement *pl, int rank, int expert);
/*
 * The rank that serves slot k of token t sent from src_rank: replica
 * (t + k + src_rank) mod n_replicas. A pure function of its arguments.
 */
int moeq_ep_placement_pick(const moeq_ep_placement *pl, int expert, int src_rank, int64_t t, int k);

/* Parse / print the text format above. Parse errors name the line. */
moeq_err moeq_ep_placement_parse(const char *text, size_t len, moeq_ep_placement **out, char *errstr,
                                 size_t errstr_size);
moeq_err moeq_ep_placement_print(const moeq_ep_placement *pl, FILE *out);
moeq_err moeq_ep_placement_load(const char *path, moeq_ep_placement **out, char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
