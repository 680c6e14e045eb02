/*
 * ep_int.h — what a transport implements for ep.c: one collective exchange of
 * byte messages whose sizes both sides already know (ep.c sends the counts
 * first, as 8-byte messages, through the same call). Transports know nothing of
 * rows, experts or dtypes.
 */
#ifndef MOEQ_EP_INT_H
#define MOEQ_EP_INT_H

#include <stddef.h>

#include "moeq/ep.h"

typedef struct moeq_ep_tp moeq_ep_tp;

typedef struct moeq_ep_transport {
    const char *name;
    /* max_msg: the largest message one rank sends another (receive buffers sized from it). */
    moeq_err (*open)(const moeq_ep_params *params, const moeq_ep_rendezvous *rv, size_t max_msg, moeq_ep_tp **out,
                     char *errstr, size_t errstr_size);
    void (*close)(moeq_ep_tp *tp);
    /*
     * Collective: send[d] (send_len[d] bytes) to every rank d, including self;
     * receive from every rank s into recv[s] exactly recv_len[s] bytes. A
     * zero-length message is not sent at all (both sides know it). Errors name
     * the rank at fault.
     */
    moeq_err (*exchange)(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                         const size_t *recv_len, char *errstr, size_t errstr_size);
} moeq_ep_transport;

extern const moeq_ep_transport moeq_ep_transport_local;
/* NULL when the library was built without UCX. */
extern const moeq_ep_transport *const moeq_ep_transport_ucx;

#endif
