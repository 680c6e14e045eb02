/*
 * ep_nccl.c — the NCCL transport (a separate object target, moeq_ep_nccl,
 * built when the CUDA toolkit and NCCL are found; a program that links it gets
 * ep.transport = nccl).
 *
 * This first cut stages through the device: ep.c packs rows in host memory,
 * each message is copied to a device buffer sized at creation, moved with
 * grouped ncclSend/ncclRecv, and copied back. That is the exchange's contract
 * (ep_int.h) on GPUs. It is not yet the device-resident path, where rows
 * never leave the GPU and pack/unpack are kernels; that comes with the CUDA
 * backend. The communicator is non-blocking, so a peer that dies or stops
 * answering fails the exchange after timeout_ms (ncclCommAbort) instead of
 * hanging. NCCL does not say which peer, so the message lists the ranks
 * waited on. Device: rank mod the visible device count.
 */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ep_int.h"
#include "moeq/util.h"

struct moeq_ep_tp {
    int rank, n_ranks, timeout_ms, broken;
    size_t max_msg;
    ncclComm_t comm;
    cudaStream_t stream;
    unsigned char *d_send, *d_recv; /* (n_ranks * max_msg) each, device          */
    unsigned char *h_send, *h_recv; /* the same, pinned host: copies that never block */
};

/* Wait for a non-blocking communicator call; abort it after timeout_ms. */
static moeq_err nccl_wait(moeq_ep_tp *tp, const char *what, char *errstr, size_t n) {
    int64_t deadline = moeq_now_ms() + tp->timeout_ms;
    ncclResult_t st;
    while (ncclCommGetAsyncError(tp->comm, &st) == ncclSuccess && st == ncclInProgress) {
        if (moeq_now_ms() >= deadline) {
            tp->broken = 1;
            return moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n, "ep nccl: %s did not complete within %d ms", what,
                             tp->timeout_ms);
        }
        sched_yield();
    }
    if (st != ncclSuccess) {
        tp->broken = 1;
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep nccl: %s: %s", what, ncclGetErrorString(st));
    }
    return MOEQ_OK;
}

static moeq_err unique_id(const moeq_ep_params *p, const moeq_ep_rendezvous *rv, ncclUniqueId *id, char *errstr,
                          size_t n) {
    if (p->rank == 0) {
        ncclResult_t st = ncclGetUniqueId(id);
        if (st != ncclSuccess) return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep nccl: ncclGetUniqueId: %s", ncclGetErrorString(st));
        return p->n_ranks > 1 ? rv->publish(rv->ctx, 0, id, sizeof *id, errstr, n) : MOEQ_OK;
    }
    void *addr = NULL;
    size_t len = 0;
    moeq_err err = rv->lookup(rv->ctx, 0, p->timeout_ms, &addr, &len, errstr, n);
    if (!err && len != sizeof *id) err = moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "ep nccl: rank 0 published %zu bytes", len);
    if (!err) memcpy(id, addr, sizeof *id);
    free(addr);
    return err;
}

static moeq_err open_device(moeq_ep_tp *tp, char *errstr, size_t n) {
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count < 1)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, n, "ep nccl: no CUDA device (%s)",
                         ce != cudaSuccess ? cudaGetErrorString(ce) : "none visible");
    size_t bytes = (size_t)tp->n_ranks * tp->max_msg;
    if ((ce = cudaSetDevice(tp->rank % count)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&tp->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaMalloc((void **)&tp->d_send, bytes)) != cudaSuccess ||
        (ce = cudaMalloc((void **)&tp->d_recv, bytes)) != cudaSuccess ||
        (ce = cudaMallocHost((void **)&tp->h_send, bytes)) != cudaSuccess ||
        (ce = cudaMallocHost((void **)&tp->h_recv, bytes)) != cudaSuccess)
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep nccl: device %d, buffers of %zu bytes: %s", tp->rank % count,
                         bytes, cudaGetErrorString(ce));
    return MOEQ_OK;
}

static void nccl_close(moeq_ep_tp *tp) {
    if (!tp) return;
    if (tp->comm) {
        char ignored[64];
        if (!tp->broken && (ncclCommFinalize(tp->comm), nccl_wait(tp, "finalize", ignored, sizeof ignored)))
            tp->broken = 1;
        if (tp->broken) ncclCommAbort(tp->comm);
        else ncclCommDestroy(tp->comm);
    }
    if (tp->d_send) cudaFree(tp->d_send);
    if (tp->d_recv) cudaFree(tp->d_recv);
    if (tp->h_send) cudaFreeHost(tp->h_send);
    if (tp->h_recv) cudaFreeHost(tp->h_recv);
    if (tp->stream) cudaStreamDestroy(tp->stream);
    free(tp);
}

static moeq_err nccl_open(const moeq_ep_params *p, const moeq_ep_rendezvous *rv, size_t max_msg, moeq_ep_tp **out,
                          char *errstr, size_t n) {
    if (p->n_ranks > 1 && (!rv || !rv->publish || !rv->lookup))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep nccl: %d ranks need a rendezvous", p->n_ranks);
    moeq_ep_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return MOEQ_ERR_NOMEM;
    tp->rank = p->rank, tp->n_ranks = p->n_ranks, tp->timeout_ms = p->timeout_ms, tp->max_msg = max_msg;
    ncclUniqueId id;
    moeq_err err = open_device(tp, errstr, n);
    if (!err) err = unique_id(p, rv, &id, errstr, n);
    if (!err) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t st = ncclCommInitRankConfig(&tp->comm, p->n_ranks, id, p->rank, &cfg);
        if (st != ncclSuccess && st != ncclInProgress)
            err = moeq_errf(MOEQ_ERR_IO, errstr, n, "ep nccl: ncclCommInitRankConfig: %s", ncclGetErrorString(st));
        else err = nccl_wait(tp, "communicator set-up", errstr, n);
    }
    if (err) {
        tp->broken = 1;
        nccl_close(tp);
        return err;
    }
    *out = tp;
    return MOEQ_OK;
}

static moeq_err post_group(moeq_ep_tp *tp, const size_t *send_len, const size_t *recv_len, char *errstr, size_t n) {
    ncclResult_t st = ncclGroupStart();
    for (int r = 0; r < tp->n_ranks && st == ncclSuccess; r++) {
        if (r == tp->rank) continue;
        if (send_len[r]) st = ncclSend(tp->d_send + (size_t)r * tp->max_msg, send_len[r], ncclUint8, r, tp->comm, tp->stream);
        if (st == ncclSuccess && recv_len[r])
            st = ncclRecv(tp->d_recv + (size_t)r * tp->max_msg, recv_len[r], ncclUint8, r, tp->comm, tp->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    if (st == ncclSuccess) st = end;
    if (st != ncclSuccess && st != ncclInProgress) {
        tp->broken = 1;
        return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep nccl: send/recv: %s", ncclGetErrorString(st));
    }
    /* non-blocking: the kernels are still being issued; the stream takes the copies after them */
    return st == ncclInProgress ? nccl_wait(tp, "send/recv launch", errstr, n) : MOEQ_OK;
}

/* Wait for the stream (copies and the group), failing after timeout_ms. */
static moeq_err wait_stream(moeq_ep_tp *tp, char *errstr, size_t n) {
    int64_t deadline = moeq_now_ms() + tp->timeout_ms;
    for (;;) {
        cudaError_t ce = cudaStreamQuery(tp->stream);
        if (ce == cudaSuccess) return MOEQ_OK;
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(tp->comm, &st);
        if ((ce != cudaErrorNotReady) || (st != ncclSuccess && st != ncclInProgress)) {
            tp->broken = 1;
            return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep nccl: exchange failed: %s / %s", cudaGetErrorString(ce),
                             ncclGetErrorString(st));
        }
        if (moeq_now_ms() >= deadline) {
            tp->broken = 1;
            return moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n,
                             "ep nccl: exchange did not complete within %d ms (a peer of rank %d of %d stopped)",
                             tp->timeout_ms, tp->rank, tp->n_ranks);
        }
        sched_yield();
    }
}

/*
 * Copies go through pinned host buffers: a copy from or to pageable memory may
 * wait for the stream on the calling thread, and a dead peer would then hang
 * it past the timeout.
 */
static moeq_err nccl_exchange(moeq_ep_tp *tp, const void *const *send, const size_t *send_len, void *const *recv,
                              const size_t *recv_len, char *errstr, size_t n) {
    if (tp->broken) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "ep nccl: the communicator failed before");
    int me = tp->rank;
    for (int r = 0; r < tp->n_ranks; r++) {
        size_t off = (size_t)r * tp->max_msg;
        if (r == me || !send_len[r]) continue;
        memcpy(tp->h_send + off, send[r], send_len[r]);
        cudaMemcpyAsync(tp->d_send + off, tp->h_send + off, send_len[r], cudaMemcpyHostToDevice, tp->stream);
    }
    moeq_err err = post_group(tp, send_len, recv_len, errstr, n);
    for (int r = 0; r < tp->n_ranks && !err; r++) {
        size_t off = (size_t)r * tp->max_msg;
        if (r != me && recv_len[r])
            cudaMemcpyAsync(tp->h_recv + off, tp->d_recv + off, recv_len[r], cudaMemcpyDeviceToHost, tp->stream);
    }
    if (send_len[me]) memmove(recv[me], send[me], send_len[me]);
    if (!err) err = wait_stream(tp, errstr, n);
    for (int r = 0; r < tp->n_ranks && !err; r++)
        if (r != me && recv_len[r]) memcpy(recv[r], tp->h_recv + (size_t)r * tp->max_msg, recv_len[r]);
    return err;
}

/* No exchange_any: ncclRecv needs its count, so ep.c sends every message's length first. */
const moeq_ep_transport moeq_ep_transport_nccl = {"nccl", nccl_open, nccl_close, nccl_exchange, NULL};
