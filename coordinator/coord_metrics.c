/* coord_metrics.c — Prometheus text format (version 0.0.4) for moeq_coord_stats. */
#include "coord_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "moeq/util.h"

const int64_t moeq_coord_wait_bounds_ms[MOEQ_COORD_WAIT_BUCKETS] = {5,    10,   25,   50,    100,   250,
                                                                    500, 1000, 2500, 5000, 10000, 60000};

void moeq_coord_stats_observe_wait(moeq_coord_stats *s, int64_t ms) {
    int b = 0;
    while (b < MOEQ_COORD_WAIT_BUCKETS && ms > moeq_coord_wait_bounds_ms[b]) b++;
    s->queue_wait_bucket[b]++;
    s->queue_wait_ms_sum += ms;
    s->queue_wait_count++;
    if (ms > s->queue_wait_ms_max) s->queue_wait_ms_max = ms;
}

static moeq_err put(moeq_buf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static moeq_err put(moeq_buf *out, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0) return MOEQ_ERR_INTERNAL;
    return moeq_buf_append(out, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

static moeq_err one(moeq_buf *out, const char *name, const char *type, const char *help, int64_t v) {
    moeq_err e = put(out, "# HELP moeq_coordinator_%s %s\n# TYPE moeq_coordinator_%s %s\n", name, help, name, type);
    return e ? e : put(out, "moeq_coordinator_%s %lld\n", name, (long long)v);
}

/* Consumed to durably batched: a histogram in seconds, and the longest seen. */
static moeq_err queue_wait(const moeq_coord_stats *s, moeq_buf *out) {
    moeq_err e = put(out, "# HELP moeq_coordinator_queue_wait_seconds Consumed to durably batched, s.\n"
                          "# TYPE moeq_coordinator_queue_wait_seconds histogram\n");
    int64_t cum = 0;
    for (int b = 0; b < MOEQ_COORD_WAIT_BUCKETS && !e; b++) {
        cum += s->queue_wait_bucket[b];
        e = put(out, "moeq_coordinator_queue_wait_seconds_bucket{le=\"%g\"} %lld\n",
                (double)moeq_coord_wait_bounds_ms[b] / 1000.0, (long long)cum);
    }
    cum += s->queue_wait_bucket[MOEQ_COORD_WAIT_BUCKETS];
    e = e ? e : put(out, "moeq_coordinator_queue_wait_seconds_bucket{le=\"+Inf\"} %lld\n"
                         "moeq_coordinator_queue_wait_seconds_sum %.3f\nmoeq_coordinator_queue_wait_seconds_count %lld\n",
                    (long long)cum, (double)s->queue_wait_ms_sum / 1000.0, (long long)s->queue_wait_count);
    e = e ? e : put(out, "# HELP moeq_coordinator_queue_wait_max_seconds Longest queue wait seen, s.\n"
                         "# TYPE moeq_coordinator_queue_wait_max_seconds gauge\nmoeq_coordinator_queue_wait_max_seconds %.3f\n",
                    (double)s->queue_wait_ms_max / 1000.0);
    return e;
}

moeq_err moeq_coord_metrics_render(const moeq_coord_stats *s, moeq_buf *out) {
    moeq_err e = put(out, "# HELP moeq_coordinator_build_info The build this coordinator runs (always 1).\n"
                          "# TYPE moeq_coordinator_build_info gauge\nmoeq_coordinator_build_info{version=\"%s\"} 1\n",
                     moeq_version());
    e = e ? e : one(out, "jobs_consumed_total", "counter", "Job messages consumed.", s->jobs_consumed);
    e = e ? e : one(out, "jobs_accepted_total", "counter", "Jobs accepted for batching.", s->jobs_accepted);
    e = e ? e : put(out, "# HELP moeq_coordinator_jobs_rejected_total Jobs rejected (dead-lettered), by reason.\n"
                         "# TYPE moeq_coordinator_jobs_rejected_total counter\n");
    for (int c = 1; !e && c < MOEQ_JOB_REJECT__COUNT; c++)
        e = put(out, "moeq_coordinator_jobs_rejected_total{reason=\"%s\"} %lld\n",
                moeq_job_reject_code_name((moeq_job_reject_code)c), (long long)s->jobs_rejected[c]);
    e = e ? e : one(out, "jobs_expired_total", "counter", "Jobs answered as expired.", s->jobs_expired);
    e = e ? e : one(out, "jobs_cancelled_total", "counter", "Jobs cancelled before batching.", s->jobs_cancelled);
    e = e ? e : one(out, "jobs_duplicate_total", "counter", "Redelivered jobs the dedupe guard refused.",
                    s->jobs_duplicate);
    e = e ? e : put(out, "# HELP moeq_coordinator_batches_written_total Batches written to Redis, by priority stream.\n"
                         "# TYPE moeq_coordinator_batches_written_total counter\n");
    for (int p = 0; !e && p < MOEQ_BATCHER_CLASSES; p++)
        e = put(out, "moeq_coordinator_batches_written_total{priority=\"%d\"} %lld\n", p, (long long)s->batches_written[p]);
    e = e ? e : put(out, "# HELP moeq_coordinator_batches_closed_total Batches closed, by reason.\n"
                         "# TYPE moeq_coordinator_batches_closed_total counter\n");
    for (int r = 0; !e && r < MOEQ_BATCH_CLOSE__COUNT; r++)
        e = put(out, "moeq_coordinator_batches_closed_total{reason=\"%s\"} %lld\n",
                moeq_batch_close_str((moeq_batch_close)r), (long long)s->batches_closed[r]);
    e = e ? e : one(out, "batch_jobs_total", "counter", "Jobs in written batches.", s->batch_jobs);
    e = e ? e : one(out, "batch_job_slots_total", "counter",
                    "max_batch_jobs summed over written batches; fill ratio = batch_jobs_total / this.", s->batch_job_slots);
    e = e ? e : put(out, "# HELP moeq_coordinator_batch_fill_ratio Mean jobs per batch over max_batch_jobs.\n"
                         "# TYPE moeq_coordinator_batch_fill_ratio gauge\nmoeq_coordinator_batch_fill_ratio %.4f\n",
                    s->batch_job_slots ? (double)s->batch_jobs / (double)s->batch_job_slots : 0.0);
    e = e ? e : one(out, "batch_prompt_tokens_total", "counter", "Prompt tokens in written batches.", s->batch_prompt_tokens);
    e = e ? e : one(out, "batch_pad_tokens_total", "counter", "Padding to the longest prompt in written batches.",
                    s->batch_pad_tokens);
    e = e ? e : put(out, "# HELP moeq_coordinator_bucket_waste_ratio Padding tokens over padded prompt tokens.\n"
                         "# TYPE moeq_coordinator_bucket_waste_ratio gauge\nmoeq_coordinator_bucket_waste_ratio %.4f\n",
                    s->batch_padded_tokens ? (double)s->batch_pad_tokens / (double)s->batch_padded_tokens : 0.0);
    e = e ? e : one(out, "batch_shared_prefix_tokens_total", "counter", "Shared prefix tokens x jobs in written batches.",
                    s->batch_shared_prefix_tokens);
    e = e ? e : queue_wait(s, out);
    e = e ? e : one(out, "pending_batches", "gauge", "Batches in the streams not yet acknowledged by workers.",
                    s->pending_batches);
    e = e ? e : one(out, "open_jobs", "gauge", "Jobs consumed but not yet durable (lag inside the coordinator).",
                    s->open_jobs);
    e = e ? e : one(out, "paused", "gauge", "1 while consumption is paused by back-pressure.", s->paused);
    e = e ? e : one(out, "redis_errors_total", "counter", "Failed Redis calls (retried).", s->redis_errors);
    e = e ? e : one(out, "kafka_errors_total", "counter", "Failed Kafka calls or deliveries.", s->kafka_errors);
    e = e ? e : one(out, "commits_total", "counter", "Offset commits issued.", s->commits);
    return e;
}

/* A label value with \, " and newline escaped (topic names never need it; a misconfigured one must not break the page). */
static const char *label(const char *v, char *out, size_t cap) {
    size_t k = 0;
    for (; *v && k + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') out[k++] = '\\';
        if (*v == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
            continue;
        }
        out[k++] = *v;
    }
    out[k] = 0;
    return out;
}

enum { LAG, HIGH, COMMITTED };

static int64_t lag_field(const moeq_kafka_lag *l, int which) {
    return which == LAG ? l->lag : which == HIGH ? l->high : l->committed;
}

/* One gauge family over the partitions whose value is known (>= 0). */
static moeq_err per_partition(moeq_buf *out, const char *name, const char *help, const moeq_kafka_lag *lags,
                              size_t n, int which) {
    moeq_err e = put(out, "# HELP moeq_coordinator_%s %s\n# TYPE moeq_coordinator_%s gauge\n", name, help, name);
    for (size_t i = 0; !e && i < n; i++) {
        int64_t v = lag_field(&lags[i], which);
        if (v < 0) continue;
        char t[256];
        e = put(out, "moeq_coordinator_%s{topic=\"%s\",partition=\"%d\"} %lld\n", name,
                label(lags[i].topic, t, sizeof t), (int)lags[i].partition, (long long)v);
    }
    return e;
}

moeq_err moeq_coord_metrics_render_lag(const moeq_kafka_lag *lags, size_t n, moeq_buf *out) {
    int64_t total = 0, unknown = 0;
    for (size_t i = 0; i < n; i++) {
        if (lags[i].lag >= 0) total += lags[i].lag;
        else unknown++;
    }
    moeq_err e = per_partition(out, "consumer_lag", "Messages between the committed offset and the high watermark.",
                               lags, n, LAG);
    e = e ? e : per_partition(out, "consumer_high_watermark", "Next offset the broker will write.", lags, n, HIGH);
    e = e ? e : per_partition(out, "consumer_committed_offset", "The group's committed offset.", lags, n, COMMITTED);
    e = e ? e : one(out, "consumer_lag_assigned", "gauge", "Sum of consumer_lag over the assigned partitions.", total);
    e = e ? e : one(out, "consumer_lag_unknown", "gauge", "Assigned partitions whose lag could not be measured.",
                    unknown);
    return e;
}
