/*
 * ep.c — the expert-parallel handle: layout, packing, the two exchanges and
 * the wire dtype. Transports (ep_local.c, ep_ucx.c) only move byte messages of
 * known sizes; everything that decides which row goes where, and every dtype
 * conversion, is here, so every transport gives the same bits.
 *
 * A dispatch message to rank d is [n × (int32 local, int32 slot)][n rows];
 * a combine message is [n rows] in the order the dispatch message had them.
 * Not done here: device memory (the nccl transport will take void * rows).
 */
#include "moeq/ep.h"

#include <stdlib.h>
#include <string.h>

#include "ep_int.h"

#define P(field) offsetof(moeq_ep_params, field), sizeof(((moeq_ep_params *)0)->field)

const moeq_prop moeq_ep_props[] = {
    {"ep.transport", MOEQ_PROP_STR, P(transport), 0, 0, "local",
     "expert-parallel transport: local (one rank), ucx (UCP over UCX_TLS: tcp, shm, verbs), nccl"},
    {"ep.rank", MOEQ_PROP_INT, P(rank), 0, MOEQ_EP_MAX_RANKS - 1, "0", "this process's rank in the group"},
    {"ep.ranks", MOEQ_PROP_INT, P(n_ranks), 1, MOEQ_EP_MAX_RANKS, "1", "ranks in the expert-parallel group"},
    {"ep.payload", MOEQ_PROP_STR, P(payload), 0, 0, "f32",
     "wire dtype of dispatched and combined rows: f32, or bf16 (half the bytes, rounded to nearest even)"},
    {"ep.timeout_ms", MOEQ_PROP_INT, P(timeout_ms), 1, 3600000, "10000",
     "a peer that sends nothing for this long fails the exchange (ms), naming the rank"},
    MOEQ_PROP_END,
};

moeq_ep_params moeq_ep_default_params(void) {
    moeq_ep_params p;
    memset(&p, 0, sizeof p);
    moeq_props_defaults(moeq_ep_props, &p, NULL, 0);
    p.n_experts = p.hidden = p.max_tokens = p.top_k = 1;
    return p;
}

struct moeq_ep {
    moeq_ep_params params;
    moeq_ep_placement *pl;
    const moeq_ep_transport *ops;
    moeq_ep_tp *tp;
    int bf16;
    size_t row_bytes;     /* one row on the wire                                  */
    int64_t max_slots;    /* max_tokens * top_k: slots one rank sends per exchange */
    /* last dispatch, sender side */
    int64_t T;
    int32_t *dest_rank, *dest_local; /* (max_slots)                                 */
    int32_t *send_slot;              /* (max_slots) slot of the j-th row sent        */
    int64_t *send_count, *recv_count;  /* (n_ranks) rows                           */
    int64_t *send_first, *recv_first;  /* (n_ranks) first row index of each peer   */
    /* receiver side */
    int64_t n_recv;
    float *x;                        /* (n_ranks * max_slots, hidden) grouped rows   */
    int32_t *src_rank, *src_slot;    /* (n_ranks * max_slots)                        */
    int64_t *grouped_of;             /* arrival index → grouped position             */
    int64_t *expert_offset;          /* (n_local + 1)                                */
    int64_t *cursor;                 /* (n_local + 1) fill position while grouping   */
    int *local_expert;               /* (n_local)                                    */
    int n_local;
    /* wire buffers and the per-peer message views */
    unsigned char *sendbuf, *recvbuf;
    const void **msg_send;
    void **msg_recv;
    size_t *len_send, *len_recv;
    int64_t *cnt_out, *cnt_in;       /* the count messages                           */
    int failed;
};

/* ---- dtype -------------------------------------------------------------- */

uint16_t moeq_ep_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float moeq_ep_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void row_put(const moeq_ep *ep, unsigned char *dst, const float *src) {
    if (!ep->bf16) {
        memcpy(dst, src, ep->row_bytes);
        return;
    }
    for (int i = 0; i < ep->params.hidden; i++) {
        uint16_t b = moeq_ep_f32_to_bf16(src[i]);
        memcpy(dst + 2 * i, &b, 2);
    }
}

static void row_get(const moeq_ep *ep, float *dst, const unsigned char *src) {
    if (!ep->bf16) {
        memcpy(dst, src, ep->row_bytes);
        return;
    }
    for (int i = 0; i < ep->params.hidden; i++) {
        uint16_t b;
        memcpy(&b, src + 2 * i, 2);
        dst[i] = moeq_ep_bf16_to_f32(b);
    }
}

/* ---- layout (pure) ------------------------------------------------------ */

moeq_err moeq_ep_layout(const moeq_ep_placement *pl, int rank, int64_t T, int top_k, const int32_t *topk_ids,
                        int32_t *dest_rank, int32_t *dest_local, int64_t *count, char *errstr, size_t n) {
    int R = moeq_ep_placement_n_ranks(pl), E = moeq_ep_placement_n_experts(pl);
    for (int r = 0; r < R; r++) count[r] = 0;
    for (int64_t t = 0; t < T; t++) {
        for (int k = 0; k < top_k; k++) {
            int64_t s = t * top_k + k;
            int32_t e = topk_ids[s];
            if (e < 0) {
                dest_rank[s] = dest_local[s] = -1;
                continue;
            }
            if (e >= E)
                return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: slot %lld (token %lld, k %d): expert %d >= %d",
                                 (long long)s, (long long)t, k, e, E);
            int d = moeq_ep_placement_pick(pl, e, rank, t, k);
            dest_rank[s] = d;
            dest_local[s] = moeq_ep_placement_local_index(pl, d, e);
            count[d]++;
        }
    }
    return MOEQ_OK;
}

/* ---- create / destroy --------------------------------------------------- */

static moeq_err check_params(const moeq_ep_params *p, char *errstr, size_t n) {
    if (p->n_ranks < 1 || p->n_ranks > MOEQ_EP_MAX_RANKS || p->rank < 0 || p->rank >= p->n_ranks)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: rank %d of %d ranks is out of range", p->rank,
                         p->n_ranks);
    if (p->n_experts < 1 || p->n_experts > MOEQ_EP_MAX_EXPERTS)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: n_experts %d is outside [1, %d]", p->n_experts,
                         MOEQ_EP_MAX_EXPERTS);
    if (p->hidden < 1 || p->max_tokens < 1 || p->top_k < 1 || p->top_k > p->n_experts)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: hidden %d, max_tokens %d, top_k %d (of %d experts)",
                         p->hidden, p->max_tokens, p->top_k, p->n_experts);
    if (strcmp(p->payload, "f32") && strcmp(p->payload, "bf16"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep.payload: '%s' is not f32 or bf16", p->payload);
    if ((int64_t)p->n_ranks * p->max_tokens * p->top_k > INT32_MAX)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, n, "ep: %d ranks x %d tokens x top_k %d rows exceed 2^31",
                         p->n_ranks, p->max_tokens, p->top_k);
    if (p->timeout_ms < 1) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep.timeout_ms: %d < 1", p->timeout_ms);
    return MOEQ_OK;
}

static const moeq_ep_transport *find_transport(const char *name) {
    if (!strcmp(name, "local")) return &moeq_ep_transport_local;
    if (!strcmp(name, "ucx")) return moeq_ep_transport_ucx;
    return NULL;
}

static moeq_err alloc_buffers(moeq_ep *ep) {
    int R = ep->params.n_ranks;
    size_t S = (size_t)ep->max_slots, RS = (size_t)R * S, H = (size_t)ep->params.hidden;
    size_t wire = 8 + ep->row_bytes;
    ep->n_local = moeq_ep_placement_n_local(ep->pl, ep->params.rank);
    ep->dest_rank = malloc(S * 4), ep->dest_local = malloc(S * 4), ep->send_slot = malloc(S * 4);
    ep->send_count = calloc(R, 8), ep->recv_count = calloc(R, 8);
    ep->send_first = calloc(R, 8), ep->recv_first = calloc(R, 8);
    ep->x = malloc(RS * H * sizeof(float));
    ep->src_rank = malloc(RS * 4), ep->src_slot = malloc(RS * 4), ep->grouped_of = malloc(RS * 8);
    ep->expert_offset = calloc((size_t)ep->n_local + 1, 8), ep->cursor = calloc((size_t)ep->n_local + 1, 8);
    ep->local_expert = malloc(((size_t)ep->n_local + 1) * sizeof(int));
    ep->sendbuf = malloc(S * wire), ep->recvbuf = malloc(RS * wire);
    ep->msg_send = calloc(R, sizeof(void *)), ep->msg_recv = calloc(R, sizeof(void *));
    ep->len_send = calloc(R, sizeof(size_t)), ep->len_recv = calloc(R, sizeof(size_t));
    ep->cnt_out = calloc(R, 8), ep->cnt_in = calloc(R, 8);
    if (!ep->dest_rank || !ep->dest_local || !ep->send_slot || !ep->send_count || !ep->recv_count ||
        !ep->send_first || !ep->recv_first || !ep->x || !ep->src_rank || !ep->src_slot || !ep->grouped_of ||
        !ep->expert_offset || !ep->cursor || !ep->local_expert || !ep->sendbuf || !ep->recvbuf || !ep->msg_send ||
        !ep->msg_recv || !ep->len_send || !ep->len_recv || !ep->cnt_out || !ep->cnt_in)
        return MOEQ_ERR_NOMEM;
    for (int l = 0; l < ep->n_local; l++) ep->local_expert[l] = moeq_ep_placement_local_expert(ep->pl, ep->params.rank, l);
    return MOEQ_OK;
}

moeq_err moeq_ep_new(const moeq_ep_params *params, const moeq_ep_placement *placement,
                     const moeq_ep_rendezvous *rv, moeq_ep **out, char *errstr, size_t n) {
    *out = NULL;
    moeq_err err = check_params(params, errstr, n);
    if (err) return err;
    const moeq_ep_transport *ops = find_transport(params->transport);
    if (!ops)
        return moeq_errf(!strcmp(params->transport, "nccl") || !strcmp(params->transport, "ucx")
                             ? MOEQ_ERR_UNSUPPORTED : MOEQ_ERR_INVALID_ARG, errstr, n,
                         "ep.transport: '%s' is not built in (built: local%s)", params->transport,
                         moeq_ep_transport_ucx ? ", ucx" : "");
    moeq_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return MOEQ_ERR_NOMEM;
    ep->params = *params;
    ep->ops = ops;
    ep->bf16 = !strcmp(params->payload, "bf16");
    ep->row_bytes = (size_t)params->hidden * (ep->bf16 ? 2 : 4);
    ep->max_slots = (int64_t)params->max_tokens * params->top_k;
    err = placement ? moeq_ep_placement_clone(placement, &ep->pl)
                    : moeq_ep_placement_new_identity(params->n_experts, params->n_ranks, &ep->pl, errstr, n);
    if (err) goto fail;
    if (moeq_ep_placement_n_experts(ep->pl) != params->n_experts ||
        moeq_ep_placement_n_ranks(ep->pl) != params->n_ranks) {
        err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep.placement: %d experts on %d ranks, the group has %d on %d",
                        moeq_ep_placement_n_experts(ep->pl), moeq_ep_placement_n_ranks(ep->pl), params->n_experts,
                        params->n_ranks);
        goto fail;
    }
    if ((err = alloc_buffers(ep))) {
        moeq_errf(err, errstr, n, "ep: receive buffers for %d ranks x %lld slots x %zu bytes", params->n_ranks,
                  (long long)ep->max_slots, ep->row_bytes);
        goto fail;
    }
    if ((err = ops->open(params, rv, (size_t)ep->max_slots * (8 + ep->row_bytes), &ep->tp, errstr, n))) goto fail;
    *out = ep;
    return MOEQ_OK;
fail:
    moeq_ep_destroy(ep);
    return err;
}

void moeq_ep_destroy(moeq_ep *ep) {
    if (!ep) return;
    if (ep->tp) ep->ops->close(ep->tp);
    moeq_ep_placement_destroy(ep->pl);
    void *bufs[] = {ep->dest_rank, ep->dest_local, ep->send_slot, ep->send_count, ep->recv_count, ep->send_first,
                    ep->recv_first, ep->x, ep->src_rank, ep->src_slot, ep->grouped_of, ep->expert_offset,
                    ep->cursor, ep->local_expert, ep->sendbuf, ep->recvbuf, (void *)ep->msg_send, ep->msg_recv, ep->len_send,
                    ep->len_recv, ep->cnt_out, ep->cnt_in};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(ep);
}

const moeq_ep_placement *moeq_ep_placement_of(const moeq_ep *ep) { return ep->pl; }
const char *moeq_ep_transport_name(const moeq_ep *ep) { return ep->ops->name; }

/* ---- the exchanges ------------------------------------------------------ */

static moeq_err exchange(moeq_ep *ep, char *errstr, size_t n) {
    if (ep->failed) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: the handle failed before; destroy it");
    moeq_err err = ep->ops->exchange(ep->tp, ep->msg_send, ep->len_send, ep->msg_recv, ep->len_recv, errstr, n);
    if (err) ep->failed = 1;
    return err;
}

/* Counts first: every rank learns how many rows each peer will send it. */
static moeq_err exchange_counts(moeq_ep *ep, const int64_t *mine, int64_t *theirs, char *errstr, size_t n) {
    int R = ep->params.n_ranks;
    for (int r = 0; r < R; r++) {
        ep->cnt_out[r] = mine ? mine[r] : 0;
        ep->msg_send[r] = &ep->cnt_out[r], ep->len_send[r] = 8;
        ep->msg_recv[r] = &ep->cnt_in[r], ep->len_recv[r] = 8;
    }
    moeq_err err = exchange(ep, errstr, n);
    if (err || !theirs) return err;
    int64_t total = 0;
    for (int r = 0; r < R; r++) {
        if (ep->cnt_in[r] < 0 || ep->cnt_in[r] > ep->max_slots)
            return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "ep: rank %d announced %lld rows (max %lld)",
                                             r, (long long)ep->cnt_in[r], (long long)ep->max_slots);
        theirs[r] = ep->cnt_in[r], total += ep->cnt_in[r];
    }
    ep->n_recv = total;
    return MOEQ_OK;
}

moeq_err moeq_ep_barrier(moeq_ep *ep, char *errstr, size_t n) { return exchange_counts(ep, NULL, NULL, errstr, n); }

/* Sender side: rows in slot order within each destination. */
static void pack_dispatch(moeq_ep *ep, const float *x) {
    int R = ep->params.n_ranks, K = ep->params.top_k;
    size_t wire = 8 + ep->row_bytes;
    int64_t first = 0;
    for (int r = 0; r < R; r++) ep->send_first[r] = first, first += ep->send_count[r];
    int64_t *next = ep->cnt_out; /* reused as a cursor; the counts are already sent */
    for (int r = 0; r < R; r++) next[r] = 0;
    for (int64_t s = 0; s < ep->T * K; s++) {
        int d = ep->dest_rank[s];
        if (d < 0) continue;
        int64_t j = next[d]++;
        unsigned char *base = ep->sendbuf + (size_t)ep->send_first[d] * wire;
        int32_t meta[2] = {ep->dest_local[s], (int32_t)s};
        memcpy(base + (size_t)j * 8, meta, 8);
        row_put(ep, base + (size_t)ep->send_count[d] * 8 + (size_t)j * ep->row_bytes,
                x + (size_t)(s / K) * ep->params.hidden);
        ep->send_slot[ep->send_first[d] + j] = (int32_t)s;
    }
}

static void set_views(moeq_ep *ep, unsigned char *out, const int64_t *out_first, const int64_t *out_count,
                      unsigned char *in, const int64_t *in_first, const int64_t *in_count, size_t wire) {
    for (int r = 0; r < ep->params.n_ranks; r++) {
        ep->msg_send[r] = out + (size_t)out_first[r] * wire, ep->len_send[r] = (size_t)out_count[r] * wire;
        ep->msg_recv[r] = in + (size_t)in_first[r] * wire, ep->len_recv[r] = (size_t)in_count[r] * wire;
    }
}

/* Receiver side: a counting sort by local expert over arrival order (source rank, then slot). */
static moeq_err unpack_dispatch(moeq_ep *ep, char *errstr, size_t n) {
    int R = ep->params.n_ranks, L = ep->n_local;
    size_t wire = 8 + ep->row_bytes;
    int64_t *off = ep->expert_offset, *pos = ep->cursor;
    for (int l = 0; l <= L; l++) off[l] = 0;
    for (int r = 0; r < R; r++) {
        const unsigned char *base = ep->recvbuf + (size_t)ep->recv_first[r] * wire;
        for (int64_t j = 0; j < ep->recv_count[r]; j++) {
            int32_t meta[2];
            memcpy(meta, base + (size_t)j * 8, 8);
            if (meta[0] < 0 || meta[0] >= L || meta[1] < 0 || meta[1] >= ep->max_slots)
                return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n,
                                                 "ep: rank %d sent local expert %d slot %d (this rank has %d)", r,
                                                 meta[0], meta[1], L);
            off[meta[0] + 1]++;
        }
    }
    for (int l = 0; l < L; l++) off[l + 1] += off[l];
    memcpy(pos, off, ((size_t)L + 1) * 8);
    int64_t a = 0;
    for (int r = 0; r < R; r++) {
        const unsigned char *base = ep->recvbuf + (size_t)ep->recv_first[r] * wire;
        for (int64_t j = 0; j < ep->recv_count[r]; j++, a++) {
            int32_t meta[2];
            memcpy(meta, base + (size_t)j * 8, 8);
            int64_t p = pos[meta[0]]++;
            ep->grouped_of[a] = p, ep->src_rank[p] = r, ep->src_slot[p] = meta[1];
            row_get(ep, ep->x + (size_t)p * ep->params.hidden,
                    base + (size_t)ep->recv_count[r] * 8 + (size_t)j * ep->row_bytes);
        }
    }
    return MOEQ_OK;
}

moeq_err moeq_ep_dispatch(moeq_ep *ep, int64_t T, const int32_t *topk_ids, const float *x, moeq_ep_recv *recv,
                          char *errstr, size_t n) {
    if (T < 0 || T > ep->params.max_tokens || (T > 0 && (!topk_ids || !x)) || !recv)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: dispatch of %lld tokens (max_tokens %d)", (long long)T,
                         ep->params.max_tokens);
    moeq_err err = moeq_ep_layout(ep->pl, ep->params.rank, T, ep->params.top_k, topk_ids, ep->dest_rank,
                                  ep->dest_local, ep->send_count, errstr, n);
    if (err) return err;
    ep->T = T;
    if ((err = exchange_counts(ep, ep->send_count, ep->recv_count, errstr, n))) return err;
    int64_t first = 0;
    for (int r = 0; r < ep->params.n_ranks; r++) ep->recv_first[r] = first, first += ep->recv_count[r];
    pack_dispatch(ep, x);
    set_views(ep, ep->sendbuf, ep->send_first, ep->send_count, ep->recvbuf, ep->recv_first, ep->recv_count,
              8 + ep->row_bytes);
    if ((err = exchange(ep, errstr, n)) || (err = unpack_dispatch(ep, errstr, n))) return err;
    *recv = (moeq_ep_recv){ep->n_recv, ep->x, ep->n_local, ep->local_expert, ep->expert_offset, ep->src_rank,
                           ep->src_slot};
    return MOEQ_OK;
}

/* Rows go back in the order each source sent them; the source knows each one's slot. */
moeq_err moeq_ep_combine(moeq_ep *ep, const float *y, float *out, char *errstr, size_t n) {
    if ((ep->n_recv > 0 && !y) || (ep->T > 0 && !out))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: combine without rows");
    size_t H = (size_t)ep->params.hidden;
    for (int64_t a = 0; a < ep->n_recv; a++)
        row_put(ep, ep->recvbuf + (size_t)a * ep->row_bytes, y + (size_t)ep->grouped_of[a] * H);
    set_views(ep, ep->recvbuf, ep->recv_first, ep->recv_count, ep->sendbuf, ep->send_first, ep->send_count,
              ep->row_bytes);
    moeq_err err = exchange(ep, errstr, n);
    if (err) return err;
    int64_t S = ep->T * ep->params.top_k, sent = 0;
    for (int r = 0; r < ep->params.n_ranks; r++) sent += ep->send_count[r];
    for (int64_t s = 0; s < S; s++)
        if (ep->dest_rank[s] < 0) memset(out + (size_t)s * H, 0, H * sizeof(float));
    for (int64_t j = 0; j < sent; j++)
        row_get(ep, out + (size_t)ep->send_slot[j] * H, ep->sendbuf + (size_t)j * ep->row_bytes);
    return MOEQ_OK;
}
