/*
 * moe_layer.h — internal: a MoE layer as a dispatch/combine seam.
 *
 *   route     router matmul + top-k (backend ops): (T, K) ids and weights
 *   layout    which slot goes to which expert, and where that expert lives
 *             (the placement table: expert -> rank(s), replicas allowed)
 *   dispatch  every slot's row to its expert's rank (the ep/ handle)
 *   experts   this rank's experts over the rows it received, grouped by
 *             local expert (one GEMM per expert, all in one backend dispatch)
 *   combine   every row back to its token's rank as a per-slot row
 *   sum       per token, in slot order (best first), w * row, + the shared
 *             expert, on the token's own rank (backend combine op)
 *
 * The transport returns rows, never partial sums, so a token's sum has one
 * grouping whatever the number of ranks or the placement: results do not
 * depend on either. On one rank (the engine today) the identity placement's
 * layout is played in place: no copies.
 */
#ifndef MOEQ_ENGINE_MOE_LAYER_H
#define MOEQ_ENGINE_MOE_LAYER_H

#include "engine_state.h"
#include "moeq/ep.h"
#include "moeq/ep_placement.h"

typedef struct moeq_moe_layer moeq_moe_layer;

/* The engine's MoE seam, one rank, the identity placement; NULL (no error) without routed experts. */
moeq_err moeq_moe_layer_new(moeq_engine *engine, moeq_moe_layer **out, char *errstr, size_t errstr_size);
void moeq_moe_layer_destroy(moeq_moe_layer *layer, moeq_backend *backend); /* NULL is safe */

/*
 * MoE block of layer L over s.h (T, D) into s.tmp (T, D). On one rank with the engine's own placement and a
 * backend that has moe_experts, the router's ids, flags and the expert counts stay in backend memory: nothing
 * comes back inside the layer (the pass ends with moeq_moe_layer_flush).
 */
void moeq_moe_layer_run(moeq_engine *engine, const moeq_layer *L, const moeq_layer_vecs *vecs, int64_t n_tok);

/* After a forward pass (a main step once its logits are out, an MTP pass), before s.tok_seq changes: the
 * router flags of the layers it ran on the backend come back in one download (read in place on a host
 * backend) and mark each sequence's first non-finite layer. */
void moeq_moe_layer_flush(moeq_engine *engine);

/* The last pass ran padded (cuda_graphs): only its first n_valid tokens are the step's; the flush reads their
 * flags alone. */
void moeq_moe_layer_set_valid(moeq_engine *engine, int64_t n_valid);

/*
 * Rank `rank` of a group of n_ranks: every MoE layer exchanges through ep
 * (borrowed; its placement decides this rank's experts), with buffers for the
 * rows every rank may send here (n_ranks * max_tokens * top_k). The backend
 * then holds only the main-layer experts the placement gives this rank
 * (moeq_moe_layer_map); a step that would run another fails, named.
 */
moeq_err moeq_moe_layer_join(moeq_engine *engine, moeq_ep *ep, int rank, int n_ranks, char *errstr,
                             size_t errstr_size);
int moeq_moe_layer_in_group(const moeq_engine *engine);
/*
 * Make the backend hold the main layers' routed experts that placement gives rank (replicas included; the MTP
 * layers' are always held), or every one when placement is NULL, and give back the others (backend
 * map_experts). On failure nothing is known to be held: the next step maps them all again.
 */
moeq_err moeq_moe_layer_map(moeq_engine *engine, const moeq_ep_placement *placement, int rank, char *errstr,
                            size_t errstr_size);
/* 1 when the routed experts are mapped (expert_weights = all, or a join or step mapped them); 1 without any. */
int moeq_moe_layer_mapped(const moeq_engine *engine);
/* The main layers' (layer, expert) pairs held, of all, and their weight bytes (moeq_engine_expert_residency). */
void moeq_moe_layer_residency(const moeq_engine *engine, int64_t *held, int64_t *total, size_t *bytes);

/* An empty step's part (a rank with no tokens): every main MoE layer's exchange, in order, serving others' rows. */
void moeq_moe_layer_run_empty(moeq_engine *engine);

/* Routed slots per (layer, expert) since creation, (n_layers, n_routed_experts); NULL without routed experts. */
const uint64_t *moeq_moe_layer_counts(const moeq_engine *engine, int *n_layers);

/* MOEQ_OK, or the first exchange error since creation (the transport failed; the step's results are void). */
moeq_err moeq_moe_layer_status(const moeq_engine *engine, char *errstr, size_t errstr_size);

/*
 * Tests: play every rank of placement (copied; any number of ranks, replicas
 * allowed) inside this process — each rank's experts run over the rows its
 * slots were laid out to, grouped as that rank would group them, and return
 * as per-slot rows (the default is the identity placement of one rank). NULL:
 * through the ep handle's local transport instead (made on first use), the
 * exchange a multi-rank group runs. INVALID_ARG when the placement's experts
 * are not the model's.
 */
moeq_err moeq_moe_layer_set_placement(moeq_engine *engine, const moeq_ep_placement *placement, char *errstr,
                                      size_t errstr_size);

#endif
