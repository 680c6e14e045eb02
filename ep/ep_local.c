/*
 * ep_local.c — the one-rank transport: every message goes to self, a copy.
 * The reference the other transports are compared with, bit for bit.
 */
#include <stdlib.h>
#include <string.h>

#include "ep_int.h"

struct moeq_ep_tp {
    int unused;
};

static moeq_err local_open(const moeq_ep_params *params, const moeq_ep_rendezvous *rv, size_t max_msg,
                           moeq_ep_tp **out, char *errstr, size_t n) {
    (void)rv, (void)max_msg;
    if (params->n_ranks != 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep.transport local: one rank only (ep.ranks = %d)",
                         params->n_ranks);
    *out = calloc(1, sizeof **out);
    return *out ? MOEQ_OK : MOEQ_ERR_NOMEM;
}

static void local_close(moeq_ep_tp *tp) { free(tp); }

static moeq_err local_exchange(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                               const size_t *recv_len, char *errstr, size_t n) {
    (void)tp;
    if (send_len[0] != recv_len[0])
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "ep local: sending %zu bytes, expecting %zu", send_len[0],
                         recv_len[0]);
    if (send_len[0]) memmove(recv[0], send[0], send_len[0]);
    return MOEQ_OK;
}

static moeq_err local_exchange_any(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                                   const size_t *recv_cap, size_t *got, char *errstr, size_t n) {
    (void)tp;
    if (send_len[0] > recv_cap[0] && send_len[0])
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "ep local: sending %zu bytes into %zu", send_len[0], recv_cap[0]);
    if (send_len[0]) memmove(recv[0], send[0], send_len[0]);
    got[0] = send_len[0];
    return MOEQ_OK;
}

const moeq_ep_transport moeq_ep_transport_local = {"local", local_open, local_close, local_exchange,
                                                   local_exchange_any};
