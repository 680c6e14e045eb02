/*
 * moeq/ep.h — the expert-parallel exchange: MoE dispatch and combine between ranks.
 *
 * Knows no engine type. A row is `hidden` float32 values in host memory
 * (the activation dtype); the wire carries them as F32 or BF16 (payload).
 * Device pointers and streams, where a transport takes them, are `void *`.
 *
 * One exchange, on every rank, in lockstep (a rank with zero tokens still calls
 * both steps):
 *   1. dispatch(T tokens × top_k expert ids, T rows): the layout step gives
 *      each slot (t, k) a destination rank (a replica picked by
 *      moeq_ep_placement_pick, never by timing); one message goes to every
 *      rank, its header carrying the counts, so no rank guesses a size (a
 *      transport that must know sizes first gets the counts first). A token's
 *      row travels once per destination rank. The receiver gets rows grouped
 *      by local expert, each with the rank and slot it came from
 *      (moeq_ep_recv).
 *   2. the caller runs its local experts on those rows, in that order;
 *   3. combine(expert output rows): each row goes back to its token's rank,
 *      as a per-slot row. No partial sums are formed across ranks: the caller
 *      forms the weighted sum in slot order on its own rank, so results never
 *      depend on the number of ranks or the placement.
 * Every conversion (F32 → BF16 or FP8 → F32) happens in ep.c, the same for every
 * transport, so the local transport gives the same bits as UCX.
 *
 * Receive buffers are sized at creation for the worst case (every rank sends
 * all of its max_tokens × top_k slots here), as DeepEP's Buffer; nothing is
 * allocated per exchange. A handle is used by one thread at a time.
 *
 * Transports: "local" (one rank, identity), "ucx" (UCP tag messages over
 * whatever UCX_TLS allows: tcp, shared memory, verbs), "nccl" (grouped
 * ncclSend/ncclRecv, staged through device buffers; in programs that link the
 * moeq_ep_nccl target). Dispatch sends a token's row once per destination
 * rank; combine returns one row per slot.
 */
#ifndef MOEQ_EP_H
#define MOEQ_EP_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/config.h"
#include "moeq/err.h"
#include "moeq/ep_placement.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moeq_ep_params {
    char transport[16];  /* "local" | "ucx" | "nccl"; default "local"                     */
    int rank;            /* this process's rank, 0..n_ranks-1; default 0                  */
    int n_ranks;         /* ranks in the group, 1..MOEQ_EP_MAX_RANKS; default 1           */
    int n_experts;       /* routed experts (global), >= 1; from the model                 */
    int hidden;          /* row width in elements, >= 1; from the model                   */
    int max_tokens;      /* tokens per rank per exchange (buffers sized from it), >= 1    */
    int top_k;           /* expert slots per token, >= 1                                   */
    char payload[8];     /* wire dtype of rows: "f32" | "bf16" (half the bytes) | "fp8"
                            (E4M3 + a float scale per 128: ~a quarter); default "f32"      */
    int timeout_ms;      /* a peer silent this long fails the exchange, 1..3600000; 10000 */
} moeq_ep_params;

/* Defaults (see above); n_experts, hidden, max_tokens, top_k = 1. */
moeq_ep_params moeq_ep_default_params(void);

/* The configurable keys (ep.transport, ep.rank, ep.ranks, ep.payload, ep.timeout_ms). */
extern const moeq_prop moeq_ep_props[];

/*
 * How ranks find each other: each rank publishes its transport address and
 * looks up every other rank's. The tests use a directory
 * (moeq_ep_rendezvous_dir); a worker group will use Redis (moeq:ep:{group}).
 * lookup waits up to timeout_ms; it returns MOEQ_ERR_TIMEOUT naming the rank.
 */
typedef struct moeq_ep_rendezvous {
    void *ctx;
    moeq_err (*publish)(void *ctx, int rank, const void *addr, size_t len, char *errstr, size_t errstr_size);
    /* *addr is malloc'd, the caller frees it. */
    moeq_err (*lookup)(void *ctx, int rank, int timeout_ms, void **addr, size_t *len, char *errstr,
                       size_t errstr_size);
} moeq_ep_rendezvous;

/*
 * A rendezvous through files dir/rank-<r>.addr (written atomically). The
 * returned struct borrows dir (valid for the rendezvous's use).
 */
moeq_ep_rendezvous moeq_ep_rendezvous_dir(const char *dir);

typedef struct moeq_ep moeq_ep;

/*
 * Create this rank's handle. placement is copied (NULL: the identity);
 * rendezvous is used during _new only (NULL is fine for "local"). Transports
 * that need a peer wait for it up to timeout_ms. Errors: INVALID_ARG (a param
 * or a placement that does not match it, named), UNSUPPORTED (transport not
 * built), TIMEOUT / IO (a peer not found or unreachable, named). Collective:
 * its last step checks that every rank has the same shape, payload and
 * placement (INVALID_ARG naming a rank that differs).
 */
moeq_err moeq_ep_new(const moeq_ep_params *params, const moeq_ep_placement *placement,
                     const moeq_ep_rendezvous *rendezvous, moeq_ep **out, char *errstr, size_t errstr_size);
void moeq_ep_destroy(moeq_ep *ep); /* NULL is safe */

/* Borrowed, valid until destroy. */
const moeq_ep_placement *moeq_ep_placement_of(const moeq_ep *ep);
const char *moeq_ep_transport_name(const moeq_ep *ep);

/*
 * What dispatch delivered to this rank. Borrowed from the handle, valid until
 * the next dispatch. Rows are grouped by local expert (local index l holds
 * rows [expert_offset[l], expert_offset[l+1])), within an expert by source
 * rank, then by slot: a deterministic order.
 */
typedef struct moeq_ep_recv {
    int64_t n_rows;                /* rows received                                 */
    const float *x;                /* (n_rows, hidden)                               */
    int n_local;                   /* local experts on this rank                     */
    const int *local_expert;       /* (n_local) global expert id of each local index */
    const int64_t *expert_offset;  /* (n_local + 1)                                  */
    const int32_t *src_rank;       /* (n_rows) rank the row came from                */
    const int32_t *src_slot;       /* (n_rows) slot t * top_k + k on that rank       */
    const float *const *row;       /* (n_rows) each grouped row's source row (see _dispatch_rows) */
} moeq_ep_recv;

/*
 * Layout only, no I/O (pure; exposed for tests and planners): for each slot
 * s = t * top_k + k of this rank's T tokens, dest_rank[s] and dest_local[s]
 * (the local index on that rank), or -1 / -1 for a masked slot (id < 0), and
 * rows per destination rank in count[n_ranks]. An id >= n_experts is
 * INVALID_ARG naming the slot.
 */
moeq_err moeq_ep_layout(const moeq_ep_placement *pl, int rank, int64_t T, int top_k, const int32_t *topk_ids,
                        int32_t *dest_rank, int32_t *dest_local, int64_t *count, char *errstr, size_t errstr_size);

/*
 * Dispatch this rank's T <= max_tokens tokens: topk_ids (T, top_k) (id < 0:
 * masked slot, sends nothing), x (T, hidden). Collective: every rank calls it
 * (T may be 0). On success *recv describes what arrived. A peer that died or
 * said nothing for timeout_ms gives TIMEOUT or IO with the rank named; the
 * handle is then unusable (destroy it).
 */
moeq_err moeq_ep_dispatch(moeq_ep *ep, int64_t T, const int32_t *topk_ids, const float *x, moeq_ep_recv *recv,
                          char *errstr, size_t errstr_size);

/*
 * Dispatch without the per-slot copy: the same collective and the same
 * recv, except that recv->x is NULL and row p's values are at recv->row[p]
 * (a token with several experts here has one row, shared). The rows live in
 * the handle's receive buffers (f32 rows from this rank itself: in x, which
 * must not change meanwhile; bf16 and fp8: decoded once per token row) and
 * are valid until the next combine or dispatch. For a caller that gathers
 * rows itself (a kernel reading them by index); moeq_ep_dispatch is this plus
 * the copy into recv->x.
 */
moeq_err moeq_ep_dispatch_rows(moeq_ep *ep, int64_t T, const int32_t *topk_ids, const float *x, moeq_ep_recv *recv,
                               char *errstr, size_t errstr_size);

/*
 * Combine: y (recv->n_rows, hidden) are the expert outputs for the rows of the
 * last dispatch, in its order. Each goes back to its token's rank; out
 * (T, top_k, hidden) receives, for every slot of this rank's last dispatch,
 * its expert's output row (zeros for a masked slot). Collective, like dispatch.
 */
moeq_err moeq_ep_combine(moeq_ep *ep, const float *y, float *out, char *errstr, size_t errstr_size);

/*
 * Combine without the copy out: rows (T * top_k) receives, for every slot,
 * a pointer to its expert's output row (hidden floats; zeros for a masked
 * slot): in the handle's receive buffer, in y (rows of this rank's own
 * experts), or decoded (bf16, fp8). Valid until the next dispatch or
 * combine, and while y is. The same values as moeq_ep_combine's out.
 */
moeq_err moeq_ep_combine_rows(moeq_ep *ep, const float *y, const float **rows, char *errstr, size_t errstr_size);

/* An exchange of nothing: returns once every rank has reached it (or a peer failed, named). */
moeq_err moeq_ep_barrier(moeq_ep *ep, char *errstr, size_t errstr_size);

/*
 * Every rank's value: values[r] (n_ranks) receives rank r's. Collective, like
 * barrier (a worker group's per-tick agreement: who is draining, who has work).
 */
moeq_err moeq_ep_allgather(moeq_ep *ep, int64_t value, int64_t *values, char *errstr, size_t errstr_size);

/* BF16 rounding used on the wire (round to nearest even; NaN stays NaN). */
uint16_t moeq_ep_f32_to_bf16(float f);
float moeq_ep_bf16_to_f32(uint16_t b);
/* FP8 E4M3 ("fn": max 448, saturating, round to nearest even, no infinities) used with payload "fp8". */
uint8_t moeq_ep_f32_to_e4m3(float x);
float moeq_ep_e4m3_to_f32(uint8_t c);

#ifdef __cplusplus
}
#endif
#endif
