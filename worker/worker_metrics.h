/*
 * worker_metrics.h — the worker's counters and the /metrics + /healthz endpoint
 * (Prometheus text format over libmicrohttpd, its own thread).
 *
 * Counters are updated by the worker loop with relaxed atomics and read by
 * the HTTP thread; rendering (moeq_worker_metrics_render) is pure and tested
 * without a server.
 */
#ifndef MOEQ_WORKER_METRICS_H
#define MOEQ_WORKER_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/health.h"

#define WORKER_LAT_BUCKETS 12

typedef struct moeq_worker_metrics {
    atomic_llong batches_taken, batches_acked, batches_reclaimed, batches_dead_lettered, batches_handed_back;
    atomic_llong jobs_finished, jobs_skipped_done, results_failed;
    atomic_llong ack_failures;                    /* acknowledgements Redis did not take (retried) */
    atomic_llong prefill_tokens, decode_tokens, steps;
    atomic_llong prefix_tokens_shared;            /* prompt tokens forked from a running job */
    atomic_llong prefix_lookups, prefix_hits;     /* prefix cache: jobs that looked, that hit    */
    atomic_llong prefix_lookup_tokens, prefix_hit_tokens; /* prompt tokens they could take / took */
    atomic_llong prefix_cached_blocks, prefix_evictions, prefix_collisions;
    atomic_llong affinity_handed, affinity_received; /* batches handed to / taken from a peer's hand-off */
    atomic_llong sequences_active, slots_free;
    atomic_llong engine_ns;                       /* time inside engine steps            */
    atomic_llong ttft_ms_sum, ttft_count;         /* queue (batch taken) to first token  */
    atomic_llong mtp_rounds, mtp_drafted, mtp_accepted; /* speculative decoding (MTP)     */
    atomic_llong latency_bucket[WORKER_LAT_BUCKETS + 1]; /* job latency, ms, cumulative at render */
    atomic_llong latency_ms_sum, latency_count;
    atomic_int healthy;                           /* 0 while Redis/Kafka are unreachable */
    atomic_int draining;
} moeq_worker_metrics;

/* Upper bounds (ms) of the latency histogram buckets; +Inf follows. */
extern const int64_t moeq_worker_latency_bounds[WORKER_LAT_BUCKETS];

void moeq_worker_metrics_observe_latency(moeq_worker_metrics *m, int64_t ms);

/* Prometheus text into buf (NUL-terminated, truncated at size). Returns bytes written. */
size_t moeq_worker_metrics_render(const moeq_worker_metrics *m, const char *worker_id, char *buf, size_t size);

typedef struct moeq_worker_http moeq_worker_http;

/*
 * Serve /metrics, /livez, /readyz and /healthz (= ready, "draining" while
 * draining) on addr:port; port 0 = ephemeral, the bound port logged.
 * Borrows m, worker_id and health for the server's life. A taken port is
 * MOEQ_ERR_IO naming http_port.
 */
moeq_err moeq_worker_http_start(moeq_worker_metrics *m, const char *worker_id, moeq_health *health, const char *addr,
                                int port, moeq_worker_http **out, char *errstr, size_t errstr_size);
void moeq_worker_http_stop(moeq_worker_http *http); /* NULL is safe */

#endif
