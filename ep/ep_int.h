/*
 * ep_int.h — what a transport implements for ep.c: one collective exchange of
 * byte messages, either of sizes both sides already know (exchange), or of
 * sizes only the sender knows, each received into a buffer of known capacity
 * (exchange_any: a dispatch is then one message per peer, its header carrying
 * the counts). A transport without exchange_any (nccl: ncclRecv needs the
 * count) gets the counts first, through exchange. Transports know nothing of
 * rows, experts or dtypes.
 */
#ifndef MOEQ_EP_INT_H
#define MOEQ_EP_INT_H

#include <stddef.h>
#include <stdint.h>

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
    /*
     * Optional (NULL: ep.c exchanges counts first). Like exchange, except that
     * every peer s != self sends exactly one message of 1..recv_cap[s] bytes,
     * and got[s] receives its length. A longer one is MOEQ_ERR_FORMAT naming s.
     * The message to self: send_len[self] bytes copied into recv[self] (0: none).
     */
    moeq_err (*exchange_any)(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                             const size_t *recv_cap, size_t *got, char *errstr, size_t errstr_size);
} moeq_ep_transport;

extern const moeq_ep_transport moeq_ep_transport_local;
/* NULL when the library was built without UCX. */
extern const moeq_ep_transport *const moeq_ep_transport_ucx;
/*
 * Defined by the moeq_ep_nccl object target (ep_nccl.c), which only programs
 * that want GPUs link: a weak reference, so moeq_ep itself never pulls in
 * NCCL or the CUDA runtime.
 */
extern const moeq_ep_transport moeq_ep_transport_nccl __attribute__((weak));

/* The FP8 row codec (ep_fp8.c): `hidden` E4M3 codes, then one float32 scale per 128 elements. */
size_t moeq_ep_fp8_row_bytes(int hidden);
void moeq_ep_fp8_put(unsigned char *dst, const float *src, int hidden);
/* table: the 256 decoded codes (moeq_ep_fp8_table), so decoding is a lookup. */
void moeq_ep_fp8_table(float table[256]);
void moeq_ep_fp8_get(float *dst, const unsigned char *src, int hidden, const float table[256]);

/*
 * Tests only: the next dispatch's messages to other ranks are malformed in the
 * given way, so the receivers' checks can be exercised over a real transport.
 */
typedef enum moeq_ep_mangle {
    MOEQ_EP_MANGLE_NONE,
    MOEQ_EP_MANGLE_TRUNCATED,   /* 8 bytes: half a header                         */
    MOEQ_EP_MANGLE_SHORT,       /* the header announces one more token row than sent */
    MOEQ_EP_MANGLE_HUGE,        /* the header announces more slots than max_slots  */
    MOEQ_EP_MANGLE_BAD_EXPERT,  /* the first slot names a local expert out of range */
    MOEQ_EP_MANGLE_ROWS_SHORT,  /* the rows sent apart (second exchange) are one row short */
} moeq_ep_mangle;
void moeq_ep_test_mangle(moeq_ep *ep, moeq_ep_mangle how);
/*
 * Tests only: every f32 dispatch to a peer sends its rows apart from x (a span
 * from its first token to its last, gaps and all), whatever its size or gaps,
 * so the second exchange runs at test sizes.
 */
void moeq_ep_test_apart_always(moeq_ep *ep);

#endif
