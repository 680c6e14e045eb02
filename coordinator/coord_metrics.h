/*
 * coord_metrics.h — the coordinator's counters and their Prometheus text
 * rendering (pure). The loop owns a moeq_coord_stats and publishes a copy
 * for the HTTP thread once per tick (coordinator.c), so the hot path takes
 * no lock per job. Consumer lag is measured by the HTTP thread itself when
 * scraped (it asks the broker) and rendered from plain moeq_kafka_lag rows.
 */
#ifndef MOEQ_COORD_METRICS_H
#define MOEQ_COORD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "batcher.h"
#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Upper bounds (ms) of the queue wait histogram (rendered in seconds); +Inf follows. */
#define MOEQ_COORD_WAIT_BUCKETS 12
extern const int64_t moeq_coord_wait_bounds_ms[MOEQ_COORD_WAIT_BUCKETS];

typedef struct moeq_coord_stats {
    int64_t jobs_consumed;                           /* job messages read                      */
    int64_t jobs_accepted;                           /* handed to the batcher                  */
    int64_t jobs_rejected[MOEQ_JOB_REJECT__COUNT];   /* by reason code                          */
    int64_t jobs_expired, jobs_cancelled, jobs_duplicate;
    int64_t batches_written[MOEQ_BATCHER_CLASSES];
    int64_t batches_closed[MOEQ_BATCH_CLOSE__COUNT]; /* by closing reason                      */
    int64_t batch_jobs;                              /* Σ jobs over written batches             */
    int64_t batch_job_slots;                         /* Σ max_batch_jobs: fill = jobs / slots   */
    int64_t batch_prompt_tokens;                     /* Σ prompt tokens                         */
    int64_t batch_padded_tokens;                     /* Σ max_prompt_len * n: waste = pad / padded */
    int64_t batch_pad_tokens;
    int64_t batch_shared_prefix_tokens;              /* Σ shared_prefix_len * n                 */
    int64_t queue_wait_ms_sum, queue_wait_count, queue_wait_ms_max; /* consume -> durable   */
    int64_t queue_wait_bucket[MOEQ_COORD_WAIT_BUCKETS + 1];        /* by moeq_coord_wait_bounds_ms, +Inf */
    int64_t pending_batches;                         /* gauge: streams' backlog                 */
    int64_t open_jobs;                               /* gauge: consumed, not yet durable        */
    int64_t paused;                                  /* gauge: 1 while partitions are paused    */
    int64_t redis_errors, kafka_errors, commits;
    int64_t last_tick_ms;                            /* wall clock of the last loop tick        */
} moeq_coord_stats;

/* One job's wait from consumed to durably batched, ms: the sum, count, max and histogram. */
void moeq_coord_stats_observe_wait(moeq_coord_stats *s, int64_t ms);

/* Append the Prometheus text exposition of s to out (docs/METRICS.md lists each family). */
moeq_err moeq_coord_metrics_render(const moeq_coord_stats *s, moeq_buf *out);

/*
 * Append the consumer's position against the broker, per assigned partition:
 * consumer_lag{topic,partition} (high watermark - committed offset),
 * high_watermark, committed_offset, and consumer_lag_assigned (a gauge: the
 * sum of the known lags) with consumer_lag_unknown (partitions that could not be
 * measured: left out of the sum). lags as moeq_kafka_consumer_lag gives them.
 */
moeq_err moeq_coord_metrics_render_lag(const moeq_kafka_lag *lags, size_t n_lags, moeq_buf *out);

#ifdef __cplusplus
}
#endif
#endif
