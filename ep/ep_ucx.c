/*
 * ep_ucx.c — the UCX transport: UCP tag messages between every pair of ranks.
 *
 * One UCP worker per rank, one endpoint per peer, created from the peers'
 * worker addresses found through the rendezvous hook. UCX picks the wire from
 * UCX_TLS (tcp, shared memory, verbs): the code is the same. An exchange posts
 * every receive (tag = exchange number << 16 | source rank, exact match, into
 * the caller's buffer: of the known size, or of a capacity for exchange_any,
 * where the message's length comes back with it), then every send, then
 * progresses the worker until all complete. Large messages go by UCX's
 * rendezvous protocol straight into the posted buffer (zero-copy where the
 * transport allows). Endpoints use peer error handling, so a rank that
 * dies fails the exchange naming it; one that stops answering fails it after
 * timeout_ms. No thread: progress happens only inside an exchange.
 */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

#include "ep_int.h"
#include "moeq/util.h"

typedef struct ucx_peer {
    struct moeq_ep_tp *tp;
    int rank;
    ucp_ep_h ep;
    ucs_status_t failed; /* UCS_OK until the error handler fires                        */
    int peer_mode;       /* 1: UCX reports this peer's failure; 0: only the timeout does */
} ucx_peer;

struct moeq_ep_tp {
    int rank, n_ranks, timeout_ms;
    int no_peer_mode; /* the transports cannot report peer failure                   */
    int broken; /* an exchange failed: close without waiting long for flushes */
    uint64_t seq;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucx_peer *peers;
    void **send_req, **recv_req;   /* (n_ranks) requests in flight          */
    ucp_tag_recv_info_t *info;     /* (n_ranks) what each receive delivered */
    ucs_status_t *send_failed;     /* (n_ranks) a send of this exchange that failed */
};

#define TAG_MASK (~(ucp_tag_t)0)

static ucp_tag_t tag_of(uint64_t seq, int src) { return (ucp_tag_t)((seq << 16) | (uint64_t)src); }

static void on_peer_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    ((ucx_peer *)arg)->failed = status;
}

static moeq_err ucx_fail(ucs_status_t st, const char *what, char *errstr, size_t n) {
    return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep ucx: %s: %s", what, ucs_status_string(st));
}

/*
 * Messages below this go eagerly (one send, copied once on arrival), above it
 * by rendezvous (a handshake, then zero-copy). UCX's tcp default (8 KB) makes
 * even a one-token dispatch of DeepSeek-V3's rows (28 KB in f32) a
 * rendezvous: three messages where one would do (~240 us against ~10 us on
 * the development machine). UCX_RNDV_THRESH, when set, wins.
 */
#define EP_UCX_RNDV_THRESH "65536"

static moeq_err open_worker(moeq_ep_tp *tp, char *errstr, size_t n) {
    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) return ucx_fail(st, "ucp_config_read", errstr, n);
    if (!getenv("UCX_RNDV_THRESH") && (st = ucp_config_modify(cfg, "RNDV_THRESH", EP_UCX_RNDV_THRESH)) != UCS_OK) {
        ucp_config_release(cfg);
        return ucx_fail(st, "ucp_config_modify RNDV_THRESH", errstr, n);
    }
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    st = ucp_init(&pp, cfg, &tp->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return ucx_fail(st, "ucp_init", errstr, n);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    st = ucp_worker_create(tp->ctx, &wp, &tp->worker);
    return st == UCS_OK ? MOEQ_OK : ucx_fail(st, "ucp_worker_create", errstr, n);
}

static moeq_err publish_self(moeq_ep_tp *tp, const moeq_ep_rendezvous *rv, char *errstr, size_t n) {
    ucp_address_t *addr = NULL;
    size_t len = 0;
    ucs_status_t st = ucp_worker_get_address(tp->worker, &addr, &len);
    if (st != UCS_OK) return ucx_fail(st, "ucp_worker_get_address", errstr, n);
    moeq_err err = rv->publish(rv->ctx, tp->rank, addr, len, errstr, n);
    ucp_worker_release_address(tp->worker, addr);
    return err;
}

static ucs_status_t create_ep(moeq_ep_tp *tp, ucx_peer *p, const void *addr, ucp_err_handling_mode_t mode) {
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = addr,
        .err_mode = mode,
    };
    if (mode == UCP_ERR_HANDLING_MODE_PEER) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler = (ucp_err_handler_t){.cb = on_peer_error, .arg = p};
    }
    p->peer_mode = mode == UCP_ERR_HANDLING_MODE_PEER;
    return ucp_ep_create(tp->worker, &ep, &p->ep);
}

/*
 * Whether to ask for peer failure reports. UCX 1.13's shared-memory transports
 * have none, and asking makes ucp_ep_create fail with a log line that UCX
 * writes to stdout (where our JSON goes). So when UCX_TLS names only
 * shared-memory or self transports, endpoints go without; any other list (or
 * none) asks, and an "unreachable" answer still falls back (see connect_peer).
 */
static int tls_may_report_failures(void) {
    const char *tls = getenv("UCX_TLS");
    if (!tls || !*tls || tls[0] == '^') return 1;
    static const char *const shm_only[] = {"shm", "posix", "sysv", "self", "cma", "knem", "xpmem", "sm", NULL};
    char buf[256];
    snprintf(buf, sizeof buf, "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int is_shm = 0;
        for (int i = 0; shm_only[i]; i++) is_shm |= !strcmp(t, shm_only[i]);
        if (!is_shm) return 1;
    }
    return 0;
}

static moeq_err connect_peer(moeq_ep_tp *tp, const moeq_ep_rendezvous *rv, int r, char *errstr, size_t n) {
    void *addr = NULL;
    size_t len = 0;
    moeq_err err = rv->lookup(rv->ctx, r, tp->timeout_ms, &addr, &len, errstr, n);
    if (err) return err;
    ucx_peer *p = &tp->peers[r];
    /*
     * UCX 1.13's shared-memory transports cannot report a dead peer (UCX logs "no peer failure
     * handler" once): then every endpoint goes without, and only the timeout detects a failure.
     */
    ucs_status_t st = create_ep(tp, p, addr, tp->no_peer_mode ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER);
    if (st == UCS_ERR_UNREACHABLE && !tp->no_peer_mode)
        tp->no_peer_mode = 1, st = create_ep(tp, p, addr, UCP_ERR_HANDLING_MODE_NONE);
    free(addr);
    if (st != UCS_OK)
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep ucx: cannot reach rank %d: %s", r, ucs_status_string(st));
    return MOEQ_OK;
}

static void ucx_close(moeq_ep_tp *tp);

static moeq_err ucx_open(const moeq_ep_params *params, const moeq_ep_rendezvous *rv, size_t max_msg,
                         moeq_ep_tp **out, char *errstr, size_t n) {
    (void)max_msg;
    if (params->n_ranks > 1 && (!rv || !rv->publish || !rv->lookup))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep ucx: %d ranks need a rendezvous", params->n_ranks);
    moeq_ep_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return MOEQ_ERR_NOMEM;
    int R = params->n_ranks;
    tp->rank = params->rank, tp->n_ranks = R, tp->timeout_ms = params->timeout_ms;
    tp->peers = calloc((size_t)R, sizeof *tp->peers);
    tp->send_req = calloc((size_t)R, sizeof(void *)), tp->recv_req = calloc((size_t)R, sizeof(void *));
    tp->info = calloc((size_t)R, sizeof *tp->info), tp->send_failed = calloc((size_t)R, sizeof *tp->send_failed);
    moeq_err err = tp->peers && tp->send_req && tp->recv_req && tp->info && tp->send_failed ? MOEQ_OK : MOEQ_ERR_NOMEM;
    for (int r = 0; r < R && tp->peers; r++) tp->peers[r] = (ucx_peer){tp, r, NULL, UCS_OK, 0};
    tp->no_peer_mode = !tls_may_report_failures();
    if (!err) err = open_worker(tp, errstr, n);
    if (!err && R > 1) err = publish_self(tp, rv, errstr, n);
    for (int r = 0; r < R && !err; r++)
        if (r != tp->rank) err = connect_peer(tp, rv, r, errstr, n);
    if (err) {
        ucx_close(tp);
        return err;
    }
    *out = tp;
    return MOEQ_OK;
}

/* Close every endpoint, flushing what is in flight unless the peer failed; bounded by timeout_ms. */
static void close_eps(moeq_ep_tp *tp) {
    int64_t deadline = moeq_now_ms() + (tp->broken ? 200 : tp->timeout_ms);
    for (int r = 0; r < tp->n_ranks; r++) {
        ucx_peer *p = &tp->peers[r];
        if (!p->ep) continue;
        int force = p->peer_mode && (tp->broken || p->failed != UCS_OK);
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
        void *req = ucp_ep_close_nbx(p->ep, &rp);
        while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS && moeq_now_ms() < deadline)
            ucp_worker_progress(tp->worker);
        if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
        p->ep = NULL;
    }
}

static void ucx_close(moeq_ep_tp *tp) {
    if (!tp) return;
    if (tp->worker && tp->peers) close_eps(tp);
    if (tp->worker) ucp_worker_destroy(tp->worker);
    if (tp->ctx) ucp_cleanup(tp->ctx);
    free(tp->peers), free(tp->send_req), free(tp->recv_req), free(tp->info), free(tp->send_failed);
    free(tp);
}

/* ---- one exchange ------------------------------------------------------- */

/*
 * Always a request (no immediate completion): UCX 1.13 completes a receive
 * that matches an eager message already there without filling recv_info, so
 * its length would be unknown; the request's test gives it.
 */
static moeq_err post_recv(moeq_ep_tp *tp, int s, void *buf, size_t len, char *errstr, size_t n) {
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL};
    void *req = ucp_tag_recv_nbx(tp->worker, buf, len, tag_of(tp->seq, s), TAG_MASK, &rp);
    if (UCS_PTR_IS_ERR(req))
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep ucx: receive from rank %d: %s", s,
                         ucs_status_string(UCS_PTR_STATUS(req)));
    tp->recv_req[s] = req;
    return MOEQ_OK;
}

static moeq_err post_send(moeq_ep_tp *tp, int d, const void *buf, size_t len, char *errstr, size_t n) {
    ucp_request_param_t rp = {.op_attr_mask = 0};
    void *req = ucp_tag_send_nbx(tp->peers[d].ep, buf, len, tag_of(tp->seq, tp->rank), &rp);
    if (UCS_PTR_IS_ERR(req))
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep ucx: send to rank %d: %s", d,
                         ucs_status_string(UCS_PTR_STATUS(req)));
    tp->send_req[d] = req;
    return MOEQ_OK;
}

/* Poll one request: 1 while in flight; 0 when done (freed), with its status in *st. */
static int in_flight(void **slot, int is_recv, ucp_tag_recv_info_t *info, ucs_status_t *st) {
    *st = UCS_OK;
    if (!*slot) return 0;
    *st = is_recv ? ucp_tag_recv_request_test(*slot, info) : ucp_request_check_status(*slot);
    if (*st == UCS_INPROGRESS) return 1;
    ucp_request_free(*slot);
    *slot = NULL;
    return 0;
}

/*
 * One peer's state in this exchange. *pending: bit 0 a send in flight, bit 1 a
 * receive in flight. A failure that leaves this rank's data from the peer
 * missing is returned at once. One that does not (the peer sent everything,
 * then went away, e.g. after seeing another rank die) is *deferred. It fails
 * the exchange only once nothing more is awaited, so the error names the rank
 * whose data is missing whenever there is one.
 */
static moeq_err poll_peer(moeq_ep_tp *tp, int r, size_t want, size_t *got, int *pending, int *deferred, char *errstr,
                          size_t n) {
    ucs_status_t st;
    *pending = 0, *deferred = 0;
    if (in_flight(&tp->send_req[r], 0, NULL, &st)) *pending |= 1;
    else if (st != UCS_OK) tp->send_failed[r] = st;
    *deferred = tp->send_failed[r] != UCS_OK;
    int was = tp->recv_req[r] != NULL;
    if (in_flight(&tp->recv_req[r], 1, &tp->info[r], &st)) *pending |= 2;
    else if (st == UCS_ERR_MESSAGE_TRUNCATED)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "ep ucx: rank %d sent a message over %zu bytes", r, want);
    else if (st != UCS_OK)
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep ucx: receive from rank %d: %s", r, ucs_status_string(st));
    else if (got && was)
        got[r] = tp->info[r].length;
    else if (was && tp->info[r].length != want)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "ep ucx: rank %d sent %zu bytes, %zu expected", r,
                         tp->info[r].length, want);
    if (tp->peers[r].failed != UCS_OK) {
        if (*pending & 2)
            return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep ucx: rank %d failed: %s", r,
                             ucs_status_string(tp->peers[r].failed));
        *deferred = 1;
    }
    return MOEQ_OK;
}

/* Progress until every request is done, a peer fails, or timeout_ms passes (naming the rank waited on). */
static moeq_err wait_all(moeq_ep_tp *tp, const size_t *recv_len, size_t *got, char *errstr, size_t n) {
    int64_t deadline = moeq_now_ms() + tp->timeout_ms;
    for (unsigned spins = 0;; spins++) {
        int waiting = -1, waiting_recv = 0, blamed = -1;
        for (int r = 0; r < tp->n_ranks; r++) {
            int pending = 0, deferred = 0;
            moeq_err err = r == tp->rank ? MOEQ_OK : poll_peer(tp, r, recv_len[r], got, &pending, &deferred, errstr, n);
            if (err) return err;
            if (deferred && blamed < 0) blamed = r;
            if (pending && (waiting < 0 || (!waiting_recv && (pending & 2))))
                waiting = r, waiting_recv = (pending & 2) != 0;
        }
        /*
         * Everything this rank awaited arrived: the exchange is whole here even
         * if a peer went away after sending (e.g. it refused the group at the
         * hello and left first); the next exchange fails on that peer.
         */
        if (waiting < 0) return MOEQ_OK;
        if (blamed >= 0 && !waiting_recv)
            return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep ucx: rank %d failed: %s", blamed,
                             ucs_status_string(tp->peers[blamed].failed != UCS_OK ? tp->peers[blamed].failed
                                                                                   : tp->send_failed[blamed]));
        if (!ucp_worker_progress(tp->worker) && (spins & 255) == 255) {
            if (moeq_now_ms() >= deadline)
                return moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n, "ep ucx: rank %d did not answer within %d ms (%s)",
                                 waiting, tp->timeout_ms, waiting_recv ? "nothing received" : "send not taken");
            sched_yield();
        }
    }
}

/* After a failure: cancel receives, let sends go; the handle is unusable afterwards anyway. */
static void drop_requests(moeq_ep_tp *tp) {
    for (int r = 0; r < tp->n_ranks; r++) {
        if (tp->recv_req[r]) ucp_request_cancel(tp->worker, tp->recv_req[r]), ucp_request_free(tp->recv_req[r]);
        if (tp->send_req[r]) ucp_request_free(tp->send_req[r]);
        tp->recv_req[r] = tp->send_req[r] = NULL;
    }
    tp->broken = 1;
}

/* got NULL: recv_len are exact sizes; otherwise capacities, and got[r] receives each length (see ep_int.h). */
static moeq_err run_exchange(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                             const size_t *recv_len, size_t *got, char *errstr, size_t n) {
    int me = tp->rank;
    tp->seq++;
    if (got ? send_len[me] > recv_len[me] : send_len[me] != recv_len[me])
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "ep ucx: %zu bytes to self, %zu expected", send_len[me],
                         recv_len[me]);
    moeq_err err = MOEQ_OK;
    for (int r = 0; r < tp->n_ranks; r++) tp->info[r].length = (size_t)-1, tp->send_failed[r] = UCS_OK;
    for (int r = 0; r < tp->n_ranks && !err; r++)
        if (r != me && recv_len[r]) err = post_recv(tp, r, recv[r], recv_len[r], errstr, n);
    for (int r = 0; r < tp->n_ranks && !err; r++)
        if (r != me && send_len[r]) err = post_send(tp, r, send[r], send_len[r], errstr, n);
    if (send_len[me]) memmove(recv[me], send[me], send_len[me]);
    if (got) got[me] = send_len[me];
    if (!err) err = wait_all(tp, recv_len, got, errstr, n);
    if (err) drop_requests(tp);
    return err;
}

static moeq_err ucx_exchange(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                             const size_t *recv_len, char *errstr, size_t n) {
    return run_exchange(tp, send, send_len, recv, recv_len, NULL, errstr, n);
}

static moeq_err ucx_exchange_any(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                                 const size_t *recv_cap, size_t *got, char *errstr, size_t n) {
    return run_exchange(tp, send, send_len, recv, recv_cap, got, errstr, n);
}

static const moeq_ep_transport ucx_transport = {"ucx", ucx_open, ucx_close, ucx_exchange, ucx_exchange_any};
const moeq_ep_transport *const moeq_ep_transport_ucx = &ucx_transport;
