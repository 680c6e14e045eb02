/*
 * ep.c — the expert-parallel handle: layout, packing, the exchanges and the
 * wire dtype. Transports (ep_local.c, ep_ucx.c, ep_nccl.c) only move byte
 * messages; everything that decides which row goes where, and every dtype
 * conversion, is here, so every transport gives the same bits.
 *
 * A dispatch is one message per peer: a 24-byte header (int64 slots, int64
 * rows, int64 apart), then [slots × (int32 local, int32 slot)] in slot order,
 * then one row per distinct token among them (a token with three experts on d
 * sends its row once). The receiver learns the size from the header, so no
 * counts go first (a transport that needs them first, nccl, gets them: see
 * ep_int.h). Rows to self never touch a wire buffer in f32: the grouped rows
 * point into the caller's x. Large f32 rows to a peer are not packed at all
 * when its tokens form a dense span of x (apart = 1): the message then ends
 * after the entries, and the span [first token, last token] of x goes
 * straight from the caller's x in a second exchange whose sizes every
 * receiver knows from the verified headers (see move_apart). A combine message is one row per slot, in the
 * order the dispatch had them: combine is per slot by design (no partial sums
 * across ranks).
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
     "wire dtype of dispatched and combined rows: f32; bf16 (half the bytes, rounded to nearest even); fp8 (E4M3 "
     "with a float32 scale per 128 elements, as DeepEP: about a quarter)"},
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
    int bf16, fp8;
    float e4m3[256];      /* decoded FP8 codes                                     */
    size_t row_bytes;     /* one row on the wire                                  */
    int64_t max_slots;    /* max_tokens * top_k: slots one rank sends per exchange */
    /* last dispatch, sender side */
    int64_t T;
    int32_t *dest_rank, *dest_local; /* (max_slots)                                 */
    int32_t *send_slot;              /* (max_slots) slot of the j-th row sent        */
    int64_t *send_count, *recv_count;  /* (n_ranks) slots (rows after combine)      */
    int64_t *send_first, *recv_first;  /* (n_ranks) first slot of each peer (combine)  */
    int64_t *send_tok, *recv_tok;      /* (n_ranks) distinct token rows in dispatch  */
    int64_t *send_byte, *recv_byte;    /* (n_ranks) dispatch message lengths, bytes  */
    int64_t *cur_slot, *cur_tok, *last_tok; /* (n_ranks) packing cursors            */
    int64_t *first_tok;              /* (n_ranks) first token with a slot on each rank  */
    int64_t *send_apart;             /* (n_ranks) rows sent apart from x (a span), 0: packed */
    int64_t *recv_apart;             /* (n_ranks) 1: the source's rows come in the second exchange */
    size_t apart_min;                /* smallest span sent apart, bytes                 */
    int apart_always;                /* tests only: every f32 span to a peer goes apart */
    int rows_short;                  /* tests only: the next rows sent apart are one row short */
    /* receiver side */
    int64_t n_recv;
    size_t cap;                      /* bytes of one peer's dispatch region (the largest message) */
    float *x;                        /* (n_ranks * max_slots, hidden) grouped rows   */
    const float **row;               /* (n_ranks * max_slots) each grouped slot's row */
    float *dec;                      /* (n_ranks * max_tokens, hidden) decoded rows (bf16, fp8) */
    float *zero;                     /* (hidden) zeros: a masked slot's combine row  */
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
    size_t *len_send, *len_recv, *len_got;
    int64_t *cnt_out, *cnt_in;       /* (2 n_ranks) the count messages: slots, tokens */
    int failed;
    moeq_ep_mangle mangle;           /* tests only: malform the next dispatch        */
};

enum { HDR = 24 }; /* dispatch header: int64 slots, int64 rows, int64 apart (0: rows inline, 1: a span apart) */
/*
 * The dispatch protocol's version, in the fingerprint: a rank of an older
 * build (2: a 16-byte header and rows always inline; 1: counts first) makes
 * every rank refuse the group at creation rather than misread each other's
 * messages.
 */
enum { EP_WIRE = 3 };
/*
 * f32 rows to a peer go apart from x (no pack) from this many bytes on (37
 * rows of DeepSeek-V3's 7168). The copy saved is ~0.1 ms a MB on the
 * development machine; the second exchange waits for every peer's first
 * message (~10-20 us over tcp loopback), and at 8 and 32 tokens a rank
 * (0.2 and 0.9 MB) tcp showed no gain. See docs/EP.md, Benchmark.
 */
#define EP_APART_MIN ((size_t)1 << 20)

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
    if (ep->fp8) {
        moeq_ep_fp8_put(dst, src, ep->params.hidden);
        return;
    }
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
    if (ep->fp8) {
        moeq_ep_fp8_get(dst, src, ep->params.hidden, ep->e4m3);
        return;
    }
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
    if (strcmp(p->payload, "f32") && strcmp(p->payload, "bf16") && strcmp(p->payload, "fp8"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep.payload: '%s' is not f32, bf16 or fp8", p->payload);
    if ((int64_t)p->n_ranks * p->max_tokens * p->top_k > INT32_MAX)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, n, "ep: %d ranks x %d tokens x top_k %d rows exceed 2^31",
                         p->n_ranks, p->max_tokens, p->top_k);
    if (p->timeout_ms < 1) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep.timeout_ms: %d < 1", p->timeout_ms);
    return MOEQ_OK;
}

static const moeq_ep_transport *find_transport(const char *name) {
    if (!strcmp(name, "local")) return &moeq_ep_transport_local;
    if (!strcmp(name, "ucx")) return moeq_ep_transport_ucx;
    if (!strcmp(name, "nccl")) return &moeq_ep_transport_nccl ? &moeq_ep_transport_nccl : NULL;
    return NULL;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/*
 * Worst cases, sized once (nothing is allocated per exchange): a peer's
 * dispatch region holds a header, max_slots entries and max_tokens rows; a
 * combine sends back up to n_ranks * max_slots rows and receives max_slots.
 */
static moeq_err alloc_buffers(moeq_ep *ep) {
    int R = ep->params.n_ranks;
    size_t S = (size_t)ep->max_slots, RS = (size_t)R * S, H = (size_t)ep->params.hidden;
    ep->cap = (HDR + S * 8 + (size_t)ep->params.max_tokens * ep->row_bytes + 63) & ~(size_t)63;
    ep->n_local = moeq_ep_placement_n_local(ep->pl, ep->params.rank);
    ep->dest_rank = malloc(S * 4), ep->dest_local = malloc(S * 4), ep->send_slot = malloc(S * 4);
    ep->send_count = calloc(R, 8), ep->recv_count = calloc(R, 8);
    ep->send_first = calloc(R, 8), ep->recv_first = calloc(R, 8);
    ep->send_tok = calloc(R, 8), ep->recv_tok = calloc(R, 8), ep->send_byte = calloc(R, 8), ep->recv_byte = calloc(R, 8);
    ep->cur_slot = calloc(R, 8), ep->cur_tok = calloc(R, 8), ep->last_tok = calloc(R, 8);
    ep->first_tok = calloc(R, 8), ep->send_apart = calloc(R, 8), ep->recv_apart = calloc(R, 8);
    ep->x = malloc(RS * H * sizeof(float)), ep->row = malloc(RS * sizeof(float *)), ep->zero = calloc(H, sizeof(float));
    if (ep->bf16 || ep->fp8) ep->dec = malloc((size_t)R * (size_t)ep->params.max_tokens * H * sizeof(float));
    ep->src_rank = malloc(RS * 4), ep->src_slot = malloc(RS * 4), ep->grouped_of = malloc(RS * 8);
    ep->expert_offset = calloc((size_t)ep->n_local + 1, 8), ep->cursor = calloc((size_t)ep->n_local + 1, 8);
    ep->local_expert = malloc(((size_t)ep->n_local + 1) * sizeof(int));
    ep->sendbuf = malloc(max_size(R * ep->cap, S * ep->row_bytes));
    ep->recvbuf = malloc(max_size(R * ep->cap, RS * ep->row_bytes));
    ep->msg_send = calloc(R, sizeof(void *)), ep->msg_recv = calloc(R, sizeof(void *));
    ep->len_send = calloc(R, sizeof(size_t)), ep->len_recv = calloc(R, sizeof(size_t));
    ep->len_got = calloc(R, sizeof(size_t));
    ep->cnt_out = calloc(2 * (size_t)R, 8), ep->cnt_in = calloc(2 * (size_t)R, 8);
    if (!ep->dest_rank || !ep->dest_local || !ep->send_slot || !ep->send_count || !ep->recv_count ||
        !ep->send_first || !ep->recv_first || !ep->send_tok || !ep->recv_tok || !ep->send_byte || !ep->recv_byte ||
        !ep->cur_slot || !ep->cur_tok || !ep->last_tok || !ep->first_tok || !ep->send_apart || !ep->recv_apart || !ep->x || !ep->row || !ep->zero || ((ep->bf16 || ep->fp8) && !ep->dec) ||
        !ep->src_rank || !ep->src_slot || !ep->grouped_of || !ep->expert_offset || !ep->cursor || !ep->local_expert ||
        !ep->sendbuf || !ep->recvbuf || !ep->msg_send || !ep->msg_recv || !ep->len_send || !ep->len_recv ||
        !ep->len_got || !ep->cnt_out || !ep->cnt_in)
        return MOEQ_ERR_NOMEM;
    for (int l = 0; l < ep->n_local; l++) ep->local_expert[l] = moeq_ep_placement_local_expert(ep->pl, ep->params.rank, l);
    return MOEQ_OK;
}

static moeq_err hello(moeq_ep *ep, char *errstr, size_t n);

moeq_err moeq_ep_new(const moeq_ep_params *params, const moeq_ep_placement *placement,
                     const moeq_ep_rendezvous *rv, moeq_ep **out, char *errstr, size_t n) {
    *out = NULL;
    moeq_err err = check_params(params, errstr, n);
    if (err) return err;
    const moeq_ep_transport *ops = find_transport(params->transport);
    if (!ops)
        return moeq_errf(!strcmp(params->transport, "nccl") || !strcmp(params->transport, "ucx")
                             ? MOEQ_ERR_UNSUPPORTED : MOEQ_ERR_INVALID_ARG, errstr, n,
                         "ep.transport: '%s' is not built in (built: local%s%s)", params->transport,
                         moeq_ep_transport_ucx ? ", ucx" : "", &moeq_ep_transport_nccl ? ", nccl" : "");
    moeq_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return MOEQ_ERR_NOMEM;
    ep->params = *params;
    ep->ops = ops;
    ep->bf16 = !strcmp(params->payload, "bf16"), ep->fp8 = !strcmp(params->payload, "fp8");
    moeq_ep_fp8_table(ep->e4m3);
    ep->row_bytes = ep->fp8 ? moeq_ep_fp8_row_bytes(params->hidden) : (size_t)params->hidden * (ep->bf16 ? 2 : 4);
    ep->max_slots = (int64_t)params->max_tokens * params->top_k;
    ep->apart_min = EP_APART_MIN;
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
    size_t max_msg = max_size(ep->cap, (size_t)ep->max_slots * ep->row_bytes);
    if ((err = ops->open(params, rv, max_msg, &ep->tp, errstr, n))) goto fail;
    if ((err = hello(ep, errstr, n))) goto fail;
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
                    ep->len_recv, ep->cnt_out, ep->cnt_in, ep->send_tok, ep->recv_tok, ep->send_byte,
                    ep->recv_byte, ep->cur_slot, ep->cur_tok, ep->last_tok, (void *)ep->row, ep->dec, ep->len_got,
                    ep->first_tok, ep->send_apart, ep->recv_apart, ep->zero};
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

/* One 16-byte message to every rank (value, 0); cnt_in receives every rank's. */
static moeq_err exchange_small(moeq_ep *ep, int64_t value, char *errstr, size_t n) {
    for (int r = 0; r < ep->params.n_ranks; r++) {
        ep->cnt_out[2 * r] = value, ep->cnt_out[2 * r + 1] = 0;
        ep->msg_send[r] = &ep->cnt_out[2 * r], ep->len_send[r] = 16;
        ep->msg_recv[r] = &ep->cnt_in[2 * r], ep->len_recv[r] = 16;
    }
    return exchange(ep, errstr, n);
}

moeq_err moeq_ep_barrier(moeq_ep *ep, char *errstr, size_t n) { return exchange_small(ep, 0, errstr, n); }

moeq_err moeq_ep_allgather(moeq_ep *ep, int64_t value, int64_t *values, char *errstr, size_t n) {
    moeq_err err = exchange_small(ep, value, errstr, n);
    for (int r = 0; r < ep->params.n_ranks && !err; r++) values[r] = ep->cnt_in[2 * r];
    return err;
}

static uint64_t fnv(uint64_t h, int64_t v) {
    for (int i = 0; i < 8; i++) h = (h ^ (uint64_t)((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    return h;
}

/* What every rank must agree on: the group's shape, the wire dtype and protocol, and the whole placement. */
static uint64_t fingerprint(const moeq_ep *ep) {
    const moeq_ep_params *p = &ep->params;
    uint64_t h = 0xcbf29ce484222325ull;
    int64_t shape[] = {p->n_ranks, p->n_experts, p->hidden, p->max_tokens, p->top_k, ep->bf16, ep->fp8, EP_WIRE};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) h = fnv(h, shape[i]);
    for (int e = 0; e < p->n_experts; e++) {
        h = fnv(h, moeq_ep_placement_n_replicas(ep->pl, e));
        for (int i = 0; i < moeq_ep_placement_n_replicas(ep->pl, e); i++) h = fnv(h, moeq_ep_placement_replica(ep->pl, e, i));
    }
    return h;
}

/*
 * The first exchange: every rank is up and agrees on the shape and placement.
 * Ranks that disagreed would send rows to the wrong experts without noticing.
 */
static moeq_err hello(moeq_ep *ep, char *errstr, size_t n) {
    uint64_t fp = fingerprint(ep);
    moeq_err err = exchange_small(ep, (int64_t)fp, errstr, n);
    for (int r = 0; r < ep->params.n_ranks && !err; r++)
        if ((uint64_t)ep->cnt_in[2 * r] != fp)
            err = ep->failed = 1, moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n,
                                            "ep: rank %d has another group shape, payload, placement or protocol "
                                            "(fingerprint %016llx, this rank %016llx)", r,
                                            (unsigned long long)ep->cnt_in[2 * r], (unsigned long long)fp);
    return err;
}

/* ---- dispatch ------------------------------------------------------------ */

/* f32 rows to self are read from the caller's x; other dtypes go through the codec, as on the wire. */
static int self_direct(const moeq_ep *ep) { return !ep->bf16 && !ep->fp8; }

/* Source r's dispatch message: in the receive buffer, or (self) where this rank packed it. */
static const unsigned char *source_msg(const moeq_ep *ep, int r) {
    return (r == ep->params.rank ? ep->sendbuf : ep->recvbuf) + (size_t)r * ep->cap;
}

static void prefix(const int64_t *count, int64_t *first, int R) {
    for (int64_t r = 0, f = 0; r < R; f += count[r], r++) first[r] = f;
}

/* Distinct tokens per destination (a token with several slots on one rank sends its row once), first and last. */
static void count_tokens(moeq_ep *ep) {
    int R = ep->params.n_ranks, K = ep->params.top_k;
    for (int r = 0; r < R; r++) ep->send_tok[r] = 0, ep->last_tok[r] = ep->first_tok[r] = -1;
    for (int64_t s = 0; s < ep->T * K; s++) {
        int d = ep->dest_rank[s];
        if (d < 0 || ep->last_tok[d] == s / K) continue;
        if (ep->first_tok[d] < 0) ep->first_tok[d] = s / K;
        ep->send_tok[d]++, ep->last_tok[d] = s / K;
    }
}

/*
 * Rows to send apart to rank d (0: pack them). In f32 to a peer, when the
 * span of x from d's first token to its last holds at most 1/16 more rows
 * than d's distinct tokens, and is at least apart_min bytes: the whole span
 * then goes straight from x (the gap rows too; the receiver skips them), and
 * no row is copied on the way out. Only with exchange_any: a transport that
 * needs counts first (nccl) stages through its own buffers anyway.
 */
static int64_t rows_apart(const moeq_ep *ep, int d) {
    int64_t toks = ep->send_tok[d], span = toks ? ep->last_tok[d] - ep->first_tok[d] + 1 : 0;
    if (d == ep->params.rank || !self_direct(ep) || !ep->ops->exchange_any || toks == 0) return 0;
    if (ep->apart_always) return span;
    return span - toks <= toks / 16 && (size_t)span * ep->row_bytes >= ep->apart_min ? span : 0;
}

/*
 * Sender side: to rank d (region d of sendbuf), the header, [slots_d × (local,
 * slot)] in slot order, then each token's row once; send_byte[d] = its length.
 */
static void pack_dispatch(moeq_ep *ep, const float *x) {
    int R = ep->params.n_ranks, K = ep->params.top_k, me = ep->params.rank, direct = self_direct(ep);
    for (int r = 0; r < R; r++) {
        int64_t apart = ep->send_apart[r] = rows_apart(ep, r);
        int64_t hdr[3] = {ep->send_count[r], apart ? apart : ep->send_tok[r], apart > 0};
        memcpy(ep->sendbuf + (size_t)r * ep->cap, hdr, HDR);
        ep->cur_slot[r] = ep->cur_tok[r] = 0, ep->last_tok[r] = -1;
        int inline_rows = !(r == me && direct) && !apart;
        ep->send_byte[r] = HDR + ep->send_count[r] * 8 + (inline_rows ? ep->send_tok[r] * (int64_t)ep->row_bytes : 0);
    }
    for (int64_t s = 0; s < ep->T * K; s++) {
        int d = ep->dest_rank[s];
        if (d < 0) continue;
        unsigned char *base = ep->sendbuf + (size_t)d * ep->cap + HDR;
        int64_t j = ep->cur_slot[d]++, t = s / K;
        int32_t meta[2] = {ep->dest_local[s], (int32_t)s};
        memcpy(base + (size_t)j * 8, meta, 8);
        if (ep->last_tok[d] != t) {
            if ((d != me || !direct) && !ep->send_apart[d])
                row_put(ep, base + (size_t)ep->send_count[d] * 8 + (size_t)ep->cur_tok[d] * ep->row_bytes,
                        x + (size_t)t * ep->params.hidden);
            ep->cur_tok[d]++, ep->last_tok[d] = t;
        }
        ep->send_slot[ep->send_first[d] + j] = (int32_t)s;
    }
}

void moeq_ep_test_mangle(moeq_ep *ep, moeq_ep_mangle how) { ep->mangle = how; }
void moeq_ep_test_apart_always(moeq_ep *ep) { ep->apart_always = 1; }

/* Tests only: spoil every message to another rank, as moeq_ep_test_mangle asked. */
static void apply_mangle(moeq_ep *ep) {
    for (int r = 0; r < ep->params.n_ranks && ep->mangle; r++) {
        unsigned char *msg = ep->sendbuf + (size_t)r * ep->cap;
        int64_t hdr[3];
        memcpy(hdr, msg, HDR);
        if (r == ep->params.rank) continue;
        if (ep->mangle == MOEQ_EP_MANGLE_TRUNCATED) ep->send_byte[r] = 8;
        if (ep->mangle == MOEQ_EP_MANGLE_SHORT) hdr[1]++;
        if (ep->mangle == MOEQ_EP_MANGLE_ROWS_SHORT) ep->rows_short = 1;
        if (ep->mangle == MOEQ_EP_MANGLE_HUGE) hdr[0] = ep->max_slots + 1;
        if (ep->mangle == MOEQ_EP_MANGLE_BAD_EXPERT && hdr[0] > 0) {
            int32_t bad = INT32_MAX;
            memcpy(msg + HDR, &bad, 4);
        }
        memcpy(msg, hdr, HDR);
    }
    ep->mangle = MOEQ_EP_MANGLE_NONE;
}

/*
 * Move the packed messages: one per peer, received into region r of recvbuf
 * (capacity cap), recv_byte[r] = its length. A transport that cannot receive
 * an unknown size gets every length first.
 */
static moeq_err move_dispatch(moeq_ep *ep, char *errstr, size_t n) {
    int R = ep->params.n_ranks, me = ep->params.rank;
    moeq_err err = MOEQ_OK;
    if (!ep->ops->exchange_any) {
        for (int r = 0; r < R; r++) ep->cnt_out[2 * r] = r == me ? 0 : ep->send_byte[r];
        for (int r = 0; r < R; r++) {
            ep->msg_send[r] = &ep->cnt_out[2 * r], ep->len_send[r] = 16;
            ep->msg_recv[r] = &ep->cnt_in[2 * r], ep->len_recv[r] = 16;
        }
        if ((err = exchange(ep, errstr, n))) return err;
        for (int r = 0; r < R; r++)
            if (r != me && (ep->cnt_in[2 * r] < 1 || (uint64_t)ep->cnt_in[2 * r] > ep->cap))
                return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n,
                                                 "ep: rank %d announced a %lld-byte dispatch message (at most %zu)", r,
                                                 (long long)ep->cnt_in[2 * r], ep->cap);
    }
    for (int r = 0; r < R; r++) {
        ep->msg_send[r] = ep->sendbuf + (size_t)r * ep->cap, ep->len_send[r] = r == me ? 0 : (size_t)ep->send_byte[r];
        ep->msg_recv[r] = ep->recvbuf + (size_t)r * ep->cap;
        ep->len_recv[r] = r == me ? 0 : ep->ops->exchange_any ? ep->cap : (size_t)ep->cnt_in[2 * r];
    }
    if (ep->failed) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: the handle failed before; destroy it");
    if (ep->ops->exchange_any)
        err = ep->ops->exchange_any(ep->tp, ep->msg_send, ep->len_send, ep->msg_recv, ep->len_recv, ep->len_got,
                                    errstr, n);
    else
        err = ep->ops->exchange(ep->tp, ep->msg_send, ep->len_send, ep->msg_recv, ep->len_recv, errstr, n);
    if (err) return ep->failed = 1, err;
    for (int r = 0; r < R; r++)
        ep->recv_byte[r] = r == me ? ep->send_byte[me] : ep->ops->exchange_any ? (int64_t)ep->len_got[r] : ep->cnt_in[2 * r];
    return MOEQ_OK;
}

/* Source r's header: counts in range, and exactly as many bytes as they announce. */
static moeq_err read_header(moeq_ep *ep, int r, char *errstr, size_t n) {
    size_t got = (size_t)ep->recv_byte[r];
    if (got < HDR)
        return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n,
                                         "ep: rank %d sent a %zu-byte dispatch message, shorter than its %d-byte header",
                                         r, got, HDR);
    int64_t hdr[3];
    memcpy(hdr, source_msg(ep, r), HDR);
    int64_t slots = hdr[0], toks = hdr[1], apart = hdr[2];
    int may_apart = r != ep->params.rank && self_direct(ep) && ep->ops->exchange_any;
    if (slots < 0 || slots > ep->max_slots || toks < (slots > 0) || (!apart && toks > slots) ||
        toks > ep->params.max_tokens || apart < 0 || apart > may_apart)
        return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n,
                                         "ep: rank %d announced %lld slots of %lld token rows, apart %lld (max %lld, %d)",
                                         r, (long long)slots, (long long)toks, (long long)apart,
                                         (long long)ep->max_slots, ep->params.max_tokens);
    size_t rows = (r == ep->params.rank && self_direct(ep)) || apart ? 0 : (size_t)toks * ep->row_bytes;
    if (got != HDR + (size_t)slots * 8 + rows)
        return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n,
                                         "ep: rank %d sent %zu bytes for %lld slots and %lld token rows (%zu expected)",
                                         r, got, (long long)slots, (long long)toks, HDR + (size_t)slots * 8 + rows);
    ep->recv_count[r] = slots, ep->recv_tok[r] = toks, ep->recv_apart[r] = apart;
    return MOEQ_OK;
}

/*
 * Check one source's metadata (local index, slot range, ascending slots; token
 * rows: distinct tokens inline, the span from first to last token apart) and
 * count per expert.
 */
static moeq_err check_source(moeq_ep *ep, int r, char *errstr, size_t n) {
    const unsigned char *base = source_msg(ep, r) + HDR;
    int64_t toks = 0, prev_slot = -1, first_slot = -1, K = ep->params.top_k;
    for (int64_t j = 0; j < ep->recv_count[r]; j++) {
        int32_t meta[2];
        memcpy(meta, base + (size_t)j * 8, 8);
        if (meta[0] < 0 || meta[0] >= ep->n_local || meta[1] <= prev_slot || meta[1] >= ep->max_slots)
            return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n,
                                             "ep: rank %d sent local expert %d slot %d (this rank has %d)", r,
                                             meta[0], meta[1], ep->n_local);
        toks += prev_slot < 0 || meta[1] / K != prev_slot / K;
        if (prev_slot < 0) first_slot = meta[1];
        prev_slot = meta[1];
        ep->expert_offset[meta[0] + 1]++;
    }
    if (ep->recv_apart[r]) toks = prev_slot < 0 ? 0 : prev_slot / K - first_slot / K + 1;
    if (toks != ep->recv_tok[r])
        return ep->failed = 1, moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "ep: rank %d sent %lld token rows for %lld",
                                         r, (long long)ep->recv_tok[r], (long long)toks);
    return MOEQ_OK;
}

/* Every source's header and entries, before any row is awaited or read; counts per local expert. */
static moeq_err check_sources(moeq_ep *ep, char *errstr, size_t n) {
    moeq_err err = MOEQ_OK;
    for (int l = 0; l <= ep->n_local; l++) ep->expert_offset[l] = 0;
    for (int r = 0; r < ep->params.n_ranks && !err; r++)
        if (!(err = read_header(ep, r, errstr, n))) err = check_source(ep, r, errstr, n);
    return err;
}

/*
 * The second exchange: each span of x a sender put apart, exactly as many
 * bytes as its verified header announced (a longer or shorter one fails with
 * FORMAT naming it), landing right after its entries, where inline rows would
 * be. Every rank takes part whether or not anyone put rows apart (all lengths
 * 0: nothing moves); without exchange_any nothing is ever apart and it is not
 * run at all.
 */
static moeq_err move_apart(moeq_ep *ep, const float *x, char *errstr, size_t n) {
    if (!ep->ops->exchange_any) return MOEQ_OK;
    for (int r = 0; r < ep->params.n_ranks; r++) {
        size_t out = (size_t)ep->send_apart[r] * ep->row_bytes;
        if (out && ep->rows_short && ep->send_apart[r] > 1) out -= ep->row_bytes;
        ep->msg_send[r] = out ? x + (size_t)ep->first_tok[r] * ep->params.hidden : NULL, ep->len_send[r] = out;
        ep->msg_recv[r] = ep->recvbuf + (size_t)r * ep->cap + HDR + (size_t)ep->recv_count[r] * 8;
        ep->len_recv[r] = ep->recv_apart[r] ? (size_t)ep->recv_tok[r] * ep->row_bytes : 0;
    }
    ep->rows_short = 0;
    return exchange(ep, errstr, n);
}

/*
 * Receiver side: a counting sort by local expert over arrival order (source
 * rank, then slot). Each grouped slot gets a pointer to its token's row: in
 * the receive buffer (f32), in the caller's x (f32 rows to self), or decoded
 * once per token row (bf16, fp8). No row is copied per slot here.
 */
static void group_rows(moeq_ep *ep, const float *x) {
    int R = ep->params.n_ranks, L = ep->n_local, me = ep->params.rank;
    int64_t *off = ep->expert_offset, *pos = ep->cursor, K = ep->params.top_k, H = ep->params.hidden;
    prefix(ep->recv_count, ep->recv_first, R);
    ep->n_recv = ep->recv_first[R - 1] + ep->recv_count[R - 1];
    for (int l = 0; l < L; l++) off[l + 1] += off[l];
    memcpy(pos, off, ((size_t)L + 1) * 8);
    int64_t a = 0, decoded = 0;
    for (int r = 0; r < R; r++) {
        const unsigned char *base = source_msg(ep, r) + HDR, *rows = base + (size_t)ep->recv_count[r] * 8;
        int direct = r == me && self_direct(ep);
        int64_t row = -1, prev_t = -1, first_t = -1;
        const float *cur = NULL;
        for (int64_t j = 0; j < ep->recv_count[r]; j++, a++) {
            int32_t meta[2];
            memcpy(meta, base + (size_t)j * 8, 8);
            if (meta[1] / K != prev_t) {
                prev_t = meta[1] / K;
                if (first_t < 0) first_t = prev_t;
                row = ep->recv_apart[r] ? prev_t - first_t : row + 1; /* a span apart holds the gap rows too */
                const unsigned char *wire = rows + (size_t)row * ep->row_bytes;
                if (direct) cur = x + (size_t)prev_t * H;
                else if (self_direct(ep)) cur = (const float *)(const void *)wire;
                else row_get(ep, ep->dec + (size_t)decoded * H, wire), cur = ep->dec + (size_t)decoded++ * H;
            }
            int64_t p = pos[meta[0]]++;
            ep->grouped_of[a] = p, ep->src_rank[p] = r, ep->src_slot[p] = meta[1], ep->row[p] = cur;
        }
    }
}

static moeq_err dispatch_core(moeq_ep *ep, int64_t T, const int32_t *topk_ids, const float *x, moeq_ep_recv *recv,
                              char *errstr, size_t n) {
    if (T < 0 || T > ep->params.max_tokens || (T > 0 && (!topk_ids || !x)) || !recv)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: dispatch of %lld tokens (max_tokens %d)", (long long)T,
                         ep->params.max_tokens);
    moeq_err err = moeq_ep_layout(ep->pl, ep->params.rank, T, ep->params.top_k, topk_ids, ep->dest_rank,
                                  ep->dest_local, ep->send_count, errstr, n);
    if (err) return err;
    ep->T = T;
    count_tokens(ep);
    prefix(ep->send_count, ep->send_first, ep->params.n_ranks);
    pack_dispatch(ep, x);
    if (ep->mangle) apply_mangle(ep);
    if ((err = move_dispatch(ep, errstr, n)) || (err = check_sources(ep, errstr, n)) ||
        (err = move_apart(ep, x, errstr, n)))
        return err;
    group_rows(ep, x);
    *recv = (moeq_ep_recv){ep->n_recv, NULL, ep->n_local, ep->local_expert, ep->expert_offset, ep->src_rank,
                           ep->src_slot, ep->row};
    return MOEQ_OK;
}

moeq_err moeq_ep_dispatch_rows(moeq_ep *ep, int64_t T, const int32_t *topk_ids, const float *x, moeq_ep_recv *recv,
                               char *errstr, size_t n) {
    return dispatch_core(ep, T, topk_ids, x, recv, errstr, n);
}

/* The per-slot copy into expert groups: the one place a row is copied on the receiving side. */
moeq_err moeq_ep_dispatch(moeq_ep *ep, int64_t T, const int32_t *topk_ids, const float *x, moeq_ep_recv *recv,
                          char *errstr, size_t n) {
    moeq_err err = dispatch_core(ep, T, topk_ids, x, recv, errstr, n);
    if (err) return err;
    size_t H = (size_t)ep->params.hidden;
    for (int64_t p = 0; p < ep->n_recv; p++) memcpy(ep->x + (size_t)p * H, ep->row[p], H * sizeof(float));
    recv->x = ep->x;
    return MOEQ_OK;
}

/* ---- combine ------------------------------------------------------------- */

static void set_views(moeq_ep *ep, unsigned char *out, const int64_t *out_first, const int64_t *out_count,
                      unsigned char *in, const int64_t *in_first, const int64_t *in_count, size_t wire) {
    for (int r = 0; r < ep->params.n_ranks; r++) {
        ep->msg_send[r] = out + (size_t)out_first[r] * wire, ep->len_send[r] = (size_t)out_count[r] * wire;
        ep->msg_recv[r] = in + (size_t)in_first[r] * wire, ep->len_recv[r] = (size_t)in_count[r] * wire;
    }
}

/*
 * Rows go back in the order each source sent them; the source knows each
 * one's slot. Rows to self skip the transport: in f32 they are copied from y
 * to out directly, otherwise through the codec (the bits the wire would give).
 */
/*
 * The exchange of combine: every grouped row back to its source, in the order it came. rows[s] then points
 * at slot s's expert output: in the receive region (f32 from a peer), in y (f32 from this rank's experts),
 * decoded into x (bf16, fp8: the bits the wire gives, for self rows too), or at zeros (a masked slot).
 */
moeq_err moeq_ep_combine_rows(moeq_ep *ep, const float *y, const float **rows, char *errstr, size_t n) {
    if ((ep->n_recv > 0 && !y) || (ep->T > 0 && !rows))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: combine without rows");
    size_t H = (size_t)ep->params.hidden;
    int me = ep->params.rank, direct = self_direct(ep);
    int64_t self_a = ep->recv_first[me], self_n = ep->recv_count[me], self_j = ep->send_first[me];
    for (int64_t a = 0; a < ep->n_recv; a++)
        if (!direct || a < self_a || a >= self_a + self_n)
            row_put(ep, ep->recvbuf + (size_t)a * ep->row_bytes, y + (size_t)ep->grouped_of[a] * H);
    set_views(ep, ep->recvbuf, ep->recv_first, ep->recv_count, ep->sendbuf, ep->send_first, ep->send_count,
              ep->row_bytes);
    ep->len_send[me] = ep->len_recv[me] = 0;
    moeq_err err = exchange(ep, errstr, n);
    if (err) return err;
    int64_t S = ep->T * ep->params.top_k, sent = 0;
    for (int r = 0; r < ep->params.n_ranks; r++) sent += ep->send_count[r];
    for (int64_t s = 0; s < S; s++)
        if (ep->dest_rank[s] < 0) rows[s] = ep->zero;
    for (int64_t j = 0; j < sent; j++) {
        int64_t slot = ep->send_slot[j], a = self_a + (j - self_j);
        int remote = j < self_j || j >= self_j + self_n;
        const unsigned char *wire = remote ? ep->sendbuf + (size_t)j * ep->row_bytes
                                           : ep->recvbuf + (size_t)a * ep->row_bytes;
        if (direct) rows[slot] = remote ? (const float *)(const void *)wire : y + (size_t)ep->grouped_of[a] * H;
        else row_get(ep, ep->x + (size_t)slot * H, wire), rows[slot] = ep->x + (size_t)slot * H;
    }
    return MOEQ_OK;
}

/* The same exchange, each slot's row copied out (one copy more than combine_rows). */
moeq_err moeq_ep_combine(moeq_ep *ep, const float *y, float *out, char *errstr, size_t n) {
    if (ep->T > 0 && !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep: combine without rows");
    const float **rows = ep->row; /* (n_ranks * max_slots) >= T * top_k: free once the experts ran */
    moeq_err err = moeq_ep_combine_rows(ep, y, rows, errstr, n);
    if (err) return err;
    size_t H = (size_t)ep->params.hidden;
    for (int64_t s = 0; s < ep->T * ep->params.top_k; s++)
        memcpy(out + (size_t)s * H, rows[s], H * sizeof(float));
    return MOEQ_OK;
}
