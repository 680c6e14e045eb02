/*
 * worker_test_util.h — what the worker's integration tests share: the
 * batch streams and consumer group a worker reads, a results consumer that
 * has joined its group before any result is produced, and one batch entry
 * written exactly as the coordinator writes it. Header-only, tests only.
 */
#ifndef MOEQ_TESTS_WORKER_TEST_UTIL_H
#define MOEQ_TESTS_WORKER_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "moeq/batch_entry.h"
#include "moeq/kafka.h"
#include "moeq/redis.h"
#include "moeq/util.h"

/* Bytes in the file at path (0 when there is none): where a worker's appended log starts for its next run. */
static inline long wt_file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    long n = 0;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (f) fclose(f);
    return n > 0 ? n : 0;
}

/*
 * The port of a worker started with http_port = 0, from the `http_listening ... port=N` line it logged into
 * log_path past offset log_from. A port picked free beforehand may be taken by a test running beside this one
 * (or by a client's ephemeral port) before the worker binds it; the worker then exits at start and its /metrics
 * answer nothing. Fails the test with what the worker logged when no such line comes within timeout_ms.
 */
static inline int wt_worker_http_port(const char *log_path, long log_from, int timeout_ms) {
    static char log[16384];
    for (int t = 0;; t += 50) {
        log[0] = 0;
        FILE *f = fopen(log_path, "rb");
        if (f) {
            fseek(f, log_from, SEEK_SET);
            log[fread(log, 1, sizeof log - 1, f)] = 0;
            fclose(f);
        }
        const char *at = strstr(log, "http_listening");
        const char *port = at ? strstr(at, " port=") : NULL;
        if (port) return atoi(port + 6);
        if (t >= timeout_ms) break;
        usleep(50000);
    }
    fail_msg("no http_listening line in %s within %d ms; the worker logged:\n%s", log_path, timeout_ms, log);
    return -1;
}

/* Connect to redis_url and create group `workers` on <stream_prefix>0..3. */
static inline moeq_redis *wt_open_streams(const char *redis_url, const char *stream_prefix) {
    char err[512];
    moeq_redis_params rp;
    moeq_redis *redis = NULL;
    assert_int_equal(moeq_redis_params_parse(redis_url, NULL, &rp, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&rp, &redis, err, sizeof err), MOEQ_OK);
    for (int p = 0; p < 4; p++) {
        char stream[512];
        snprintf(stream, sizeof stream, "%s%d", stream_prefix, p);
        const char *argv[] = {"XGROUP", "CREATE", stream, "workers", "0", "MKSTREAM"};
        assert_int_equal(moeq_redis_command_argv(redis, 6, argv, NULL, NULL, err, sizeof err), MOEQ_OK);
    }
    return redis;
}

/*
 * A consumer of `topic` in `group` that has its assignment before returning,
 * so results are seen as they come. The topic is created first (a produce
 * auto-creates it): a consumer does not see a topic created after it
 * subscribed until its next metadata refresh.
 */
static inline moeq_kafka_consumer *wt_results_consumer(const char *brokers, const char *topic, const char *group) {
    char err[512];
    moeq_kafka_producer *prod = NULL;
    moeq_kafka_producer_params pp = {.brokers = brokers};
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &prod, err, sizeof err), MOEQ_OK);
    moeq_kafka_out m = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = "init", .key_len = 4,
                        .value = "init", .value_len = 4};
    assert_int_equal(moeq_kafka_produce(prod, &m, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_producer_flush(prod, 30000, err, sizeof err), MOEQ_OK);
    moeq_kafka_producer_destroy(prod);
    const char *topics[] = {topic};
    moeq_kafka_consumer *consumer = NULL;
    moeq_kafka_consumer_params cp = {.brokers = brokers, .group_id = group, .topics = topics, .n_topics = 1};
    assert_int_equal(moeq_kafka_consumer_new(&cp, NULL, &consumer, err, sizeof err), MOEQ_OK);
    for (int t = 0; t < 300; t++) {
        moeq_kafka_msg *msg = NULL;
        assert_int_equal(moeq_kafka_consumer_poll(consumer, 100, &msg, err, sizeof err), MOEQ_OK);
        moeq_kafka_msg_destroy(msg);
        moeq_kafka_partition *parts = NULL;
        size_t n = 0;
        assert_int_equal(moeq_kafka_consumer_assignment(consumer, &parts, &n, err, sizeof err), MOEQ_OK);
        free(parts);
        if (n > 0) break;
    }
    return consumer;
}

/* XADD n jobs as one batch entry on <stream_prefix><p>, as the coordinator writes it; the entry id into id_out. */
static inline void wt_add_batch(moeq_redis *redis, const char *stream_prefix, int p, const moeq_batch_entry_job *jobs,
                                size_t n, char *id_out, size_t id_size) {
    moeq_buf blob = {0};
    assert_int_equal(moeq_batch_entry_encode_jobs(jobs, n, &blob), MOEQ_OK);
    char stream[512], count[16], closed[24], pr[4], err[256];
    snprintf(stream, sizeof stream, "%s%d", stream_prefix, p);
    snprintf(count, sizeof count, "%zu", n);
    snprintf(closed, sizeof closed, "%lld", (long long)moeq_now_ms());
    snprintf(pr, sizeof pr, "%d", p);
    const char *argv[] = {"XADD", stream, "*", "v", "1", "priority", pr, "n", count, "prefix", "0", "closed_ms", closed,
                          "jobs", (const char *)blob.data};
    size_t lens[15];
    for (int i = 0; i < 14; i++) lens[i] = strlen(argv[i]);
    lens[14] = blob.len;
    moeq_redis_reply *r = NULL;
    assert_int_equal(moeq_redis_command_argv(redis, 15, argv, lens, &r, err, sizeof err), MOEQ_OK);
    if (id_out) snprintf(id_out, id_size, "%s", moeq_redis_reply_str(r, NULL));
    moeq_redis_reply_free(r);
    moeq_buf_free(&blob);
}

#endif
