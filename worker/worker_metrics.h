/*
 * worker_metrics.h — the worker's counters and the /metrics + /healthz endpoint
 * (Prometheus text format over libmicrohttpd, its own thread). Every metric
 * is listed in docs/METRICS.md: seconds in `_seconds`, `_total` only on
 * counters.
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

#include "moeq/result.h"

/*
 * A latency histogram, rendered in seconds (Prometheus convention): buckets
 * by the bounds of its family (worker_metrics.c), observations in
 * microseconds, the sum kept in microseconds and rendered divided.
 */
#define MOEQ_WORKER_HIST_BUCKETS 16
typedef struct moeq_worker_hist {
    atomic_llong bucket[MOEQ_WORKER_HIST_BUCKETS + 1]; /* per bucket, made cumulative when rendered */
    atomic_llong sum_us, count;
} moeq_worker_hist;

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
    atomic_llong sequences_active_max;            /* the most jobs that held slots at once          */
    atomic_llong engine_ns;                       /* time inside engine steps (rendered in seconds) */
    atomic_llong mtp_rounds, mtp_drafted, mtp_accepted; /* speculative decoding (MTP)     */
    /* The screened head (moeq_engine_head_screen_stats, copied by the loop after each step): greedy rows it
     * decided, the candidates they computed exactly, rows it could not decide (whole), rows that took its
     * second pass, the int8 copy's bytes, and 1 while it is on (the log says why when it is not). */
    atomic_llong screen_rows, screen_candidates, screen_fallbacks, screen_refined, screen_bytes;
    atomic_int screen_on;
    atomic_int healthy;                           /* 0 while Redis/Kafka are unreachable */
    atomic_int draining;
    /* The set vLLM users know (docs/METRICS.md), from the heartbeat's scheduler stats and each result;
     * sequences_active above is rendered as requests_running. */
    atomic_llong requests_waiting;                /* gauge: jobs taken, waiting for a slot          */
    atomic_llong kv_reserved_tokens, kv_capacity_tokens; /* gauges: kv_cache_usage_ratio = reserved / capacity */
    atomic_llong prompt_tokens, generation_tokens; /* results' usage                                */
    /* The device the engine runs on: memory in use and in all (0/0 unknown), the latent cache pool's bytes;
     * device_label holds the backend name and ordinal once device_known is 1 (set once the engine exists). */
    atomic_llong device_used_bytes, device_total_bytes, kv_pool_bytes;
    atomic_int device_known;
    char device_backend[16];
    int device_ordinal;
    /* The routed experts' load: expert_slots[l * expert_n + x], the engine's counts (moeq_engine_expert_counts)
     * copied by the loop each heartbeat; the array and its shape are set before expert_known becomes 1. */
    atomic_llong *expert_slots;
    int expert_layers, expert_n;
    atomic_int expert_known;
    atomic_llong results[MOEQ_RESULT_STATUS__COUNT][MOEQ_FINISH__COUNT]; /* by status, finish reason */
    moeq_worker_hist ttft;                        /* batch taken -> first token                    */
    moeq_worker_hist tpot;                        /* decode time / (completion tokens - 1)         */
    moeq_worker_hist queue_time;                  /* Kafka append -> taken by a worker             */
    moeq_worker_hist e2e_latency;                 /* Kafka append -> result produced               */
} moeq_worker_metrics;

/* The first token of a job, ms after its batch was taken. Thread-safe (relaxed atomics). */
void moeq_worker_metrics_observe_ttft(moeq_worker_metrics *m, int64_t ms);

/*
 * A result produced: counted by status and finish reason, its usage added to
 * the token totals, its timings observed (queue time, end-to-end latency,
 * time per output token when it generated more than one). Thread-safe.
 */
void moeq_worker_metrics_observe_result(moeq_worker_metrics *m, const moeq_result *r);

/* Prometheus text into buf (NUL-terminated, truncated at size). Returns bytes written. */
/* Bytes that always hold the rendering (the fixed families plus the expert ones, a line per expert and layer). */
size_t moeq_worker_metrics_render_size(const moeq_worker_metrics *m);
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
