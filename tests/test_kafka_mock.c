/*
 * test_kafka_mock.c — the Kafka adapter against librdkafka's mock cluster
 * (`test.mock.num.brokers`, moeq/kafka.h's last section): consumer lag is the
 * distance from the committed offset to the high watermark; injected Produce
 * errors, slow answers and a broker going down and up still give every
 * message exactly one successful delivery and one copy in the log. Needs no
 * external service: the brokers live in this process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moeq/kafka.h"
#include "moeq/kafka_mock.h"
#include "moeq/util.h"

#define N_PER_PARTITION 50
#define N_PARTITIONS 2
#define N_MESSAGES (N_PER_PARTITION * N_PARTITIONS)

typedef struct reports {
    int ok, failed;
    int per_message[N_MESSAGES];
} reports;

static void on_delivery(const moeq_kafka_delivery *d, void *cb_opaque) {
    reports *r = cb_opaque;
    int i = (int)(intptr_t)d->opaque;
    if (d->err) r->failed++;
    else r->ok++;
    if (i >= 0 && i < N_MESSAGES) r->per_message[i]++;
}

static moeq_kafka_producer *new_producer(const char *brokers, reports *r) {
    moeq_kafka_producer_params pp = {.brokers = brokers, .client_id = "moeq-test", .on_delivery = on_delivery,
                                     .cb_opaque = r};
    moeq_kafka_producer *producer = NULL;
    char err[256];
    moeq_kvlist *kv = moeq_kvlist_new();
    moeq_kvlist_set(kv, "retry.backoff.ms", "50");
    moeq_kvlist_set(kv, "reconnect.backoff.max.ms", "200");
    if (moeq_kafka_producer_new(&pp, kv, &producer, err, sizeof err)) fail_msg("producer: %s", err);
    moeq_kvlist_destroy(kv);
    return producer;
}

/* Message i goes to partition i % N_PARTITIONS. */
static void produce_all(moeq_kafka_producer *producer, const char *topic) {
    char err[256], value[32];
    for (int i = 0; i < N_MESSAGES; i++) {
        int n = snprintf(value, sizeof value, "m-%d", i);
        moeq_kafka_out out = {.topic = topic, .partition = i % N_PARTITIONS, .value = value, .value_len = (size_t)n,
                              .opaque = (void *)(intptr_t)i};
        assert_int_equal(moeq_kafka_produce(producer, &out, err, sizeof err), MOEQ_OK);
    }
}

static moeq_kafka_consumer *new_consumer(const char *brokers, const char *topic, const char *group) {
    const char *topics[] = {topic};
    moeq_kafka_consumer_params cp = {.brokers = brokers, .group_id = group, .client_id = "moeq-test",
                                     .topics = topics, .n_topics = 1};
    moeq_kafka_consumer *consumer = NULL;
    char err[256];
    if (moeq_kafka_consumer_new(&cp, NULL, &consumer, err, sizeof err)) fail_msg("consumer: %s", err);
    return consumer;
}

static int64_t total_lag(moeq_kafka_consumer *consumer, size_t want_parts, moeq_kafka_lag *copy) {
    moeq_kafka_lag *lags = NULL;
    size_t n = 0;
    char err[256];
    assert_int_equal(moeq_kafka_consumer_lag(consumer, 5000, &lags, &n, err, sizeof err), MOEQ_OK);
    assert_int_equal(n, want_parts);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(lags[i].lag >= 0);
        assert_int_equal(lags[i].high, N_PER_PARTITION);
        total += lags[i].lag;
        if (copy && lags[i].partition >= 0 && lags[i].partition < N_PARTITIONS) copy[lags[i].partition] = lags[i];
    }
    free(lags);
    return total;
}

static void consumer_lag_is_the_distance_from_the_committed_offset_to_the_high_watermark(void **state) {
    moeq_kafka_mock *mock = *state;
    const char *brokers = moeq_kafka_mock_bootstraps(mock);
    char err[256];
    assert_int_equal(moeq_kafka_mock_topic_create(mock, "lag", N_PARTITIONS, 1, err, sizeof err), MOEQ_OK);
    reports r = {0};
    moeq_kafka_producer *producer = new_producer(brokers, &r);
    produce_all(producer, "lag");
    assert_int_equal(moeq_kafka_producer_flush(producer, 10000, err, sizeof err), MOEQ_OK);
    assert_int_equal(r.ok, N_MESSAGES);

    moeq_kafka_consumer *consumer = new_consumer(brokers, "lag", "lag-group");
    /* Nothing assigned yet: nothing to report. */
    moeq_kafka_lag *lags = (moeq_kafka_lag *)1;
    size_t n = 7;
    assert_int_equal(moeq_kafka_consumer_lag(consumer, 100, &lags, &n, err, sizeof err), MOEQ_OK);
    assert_null(lags);
    assert_int_equal(n, 0);

    /* Consume 30 messages, storing nothing: the lag counts from the committed offset, so it is all N. */
    int64_t next[N_PARTITIONS] = {0};
    int got = 0;
    int64_t end = moeq_now_ms() + 15000;
    while (got < 30 && moeq_now_ms() < end) {
        moeq_kafka_msg *m = NULL;
        assert_int_equal(moeq_kafka_consumer_poll(consumer, 100, &m, err, sizeof err), MOEQ_OK);
        if (!m) continue;
        next[moeq_kafka_msg_partition(m)] = moeq_kafka_msg_offset(m) + 1;
        got++;
        moeq_kafka_msg_destroy(m);
    }
    assert_int_equal(got, 30);
    moeq_kafka_lag by_part[N_PARTITIONS];
    assert_int_equal(total_lag(consumer, N_PARTITIONS, by_part), N_MESSAGES);
    for (int p = 0; p < N_PARTITIONS; p++) {
        assert_int_equal(by_part[p].committed, -1); /* never committed */
        assert_int_equal(by_part[p].low, 0);
        assert_int_equal(by_part[p].position, next[p] ? next[p] : -1);
    }

    /* Store and commit what was consumed: the lag is what is left. */
    for (int p = 0; p < N_PARTITIONS; p++)
        if (next[p]) assert_int_equal(moeq_kafka_consumer_store(consumer, "lag", p, next[p], err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_consumer_commit(consumer, 0, err, sizeof err), MOEQ_OK);
    assert_int_equal(total_lag(consumer, N_PARTITIONS, by_part), N_MESSAGES - got);
    for (int p = 0; p < N_PARTITIONS; p++) {
        assert_int_equal(by_part[p].committed, next[p] ? next[p] : -1);
        assert_int_equal(by_part[p].lag, N_PER_PARTITION - next[p]);
    }

    /* No time to ask the broker: cached watermarks only, the lag is unknown. */
    assert_int_equal(moeq_kafka_consumer_lag(consumer, 0, &lags, &n, err, sizeof err), MOEQ_OK);
    assert_int_equal(n, N_PARTITIONS);
    for (size_t i = 0; i < n; i++) assert_int_equal(lags[i].lag, -1);
    free(lags);
    moeq_kafka_consumer_destroy(consumer);
    moeq_kafka_producer_destroy(producer);
}

static void consume_count(const char *brokers, const char *topic, int *seen, int want) {
    moeq_kafka_consumer *consumer = new_consumer(brokers, topic, "count-group");
    char err[256];
    int got = 0;
    int64_t end = moeq_now_ms() + 15000;
    while (got < want && moeq_now_ms() < end) {
        moeq_kafka_msg *m = NULL;
        assert_int_equal(moeq_kafka_consumer_poll(consumer, 100, &m, err, sizeof err), MOEQ_OK);
        if (!m) continue;
        size_t len = 0;
        const char *v = moeq_kafka_msg_value(m, &len);
        char buf[32];
        snprintf(buf, sizeof buf, "%.*s", (int)len, v);
        int i = atoi(buf + 2);
        assert_true(i >= 0 && i < N_MESSAGES);
        seen[i]++;
        got++;
        moeq_kafka_msg_destroy(m);
    }
    /* and nothing more arrives */
    for (int k = 0; k < 5; k++) {
        moeq_kafka_msg *m = NULL;
        assert_int_equal(moeq_kafka_consumer_poll(consumer, 100, &m, err, sizeof err), MOEQ_OK);
        if (m) got++;
        moeq_kafka_msg_destroy(m);
    }
    assert_int_equal(got, want);
    moeq_kafka_consumer_destroy(consumer);
}

static void injected_produce_errors_and_a_broker_outage_still_deliver_each_message_once(void **state) {
    moeq_kafka_mock *mock = *state;
    const char *brokers = moeq_kafka_mock_bootstraps(mock);
    char err[256];
    assert_int_equal(moeq_kafka_mock_topic_create(mock, "faults", N_PARTITIONS, 1, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_mock_partition_set_leader(mock, "faults", 0, 2, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_mock_partition_set_leader(mock, "faults", 1, 3, err, sizeof err), MOEQ_OK);
    moeq_kafka_fault cluster[] = {MOEQ_KAFKA_FAULT_NOT_ENOUGH_REPLICAS, MOEQ_KAFKA_FAULT_REQUEST_TIMED_OUT};
    assert_int_equal(moeq_kafka_mock_push_faults(mock, MOEQ_KAFKA_API_PRODUCE, cluster, 2, err, sizeof err), MOEQ_OK);
    moeq_kafka_fault on_two[] = {MOEQ_KAFKA_FAULT_NOT_LEADER, MOEQ_KAFKA_FAULT_DISCONNECT, MOEQ_KAFKA_FAULT_NONE};
    assert_int_equal(moeq_kafka_mock_broker_push_faults(mock, 2, MOEQ_KAFKA_API_PRODUCE, on_two, 3, 100, err, sizeof err),
                     MOEQ_OK);
    size_t left = 0;
    assert_int_equal(moeq_kafka_mock_broker_faults_left(mock, 2, MOEQ_KAFKA_API_PRODUCE, &left, err, sizeof err), MOEQ_OK);
    assert_int_equal(left, 3);
    moeq_kafka_fault bogus[] = {(moeq_kafka_fault)12345};
    assert_int_equal(moeq_kafka_mock_push_faults(mock, MOEQ_KAFKA_API_PRODUCE, bogus, 1, err, sizeof err),
                     MOEQ_ERR_INVALID_ARG);

    /* broker 3 (leader of partition 1) is down while the messages are produced */
    assert_int_equal(moeq_kafka_mock_broker_down(mock, 3, err, sizeof err), MOEQ_OK);
    reports r = {0};
    moeq_kafka_producer *producer = new_producer(brokers, &r);
    produce_all(producer, "faults");
    int64_t until = moeq_now_ms() + 1500;
    while (moeq_now_ms() < until) moeq_kafka_producer_poll(producer, 50);
    assert_true(r.ok <= N_PER_PARTITION); /* partition 1 waits for its leader */
    assert_int_equal(moeq_kafka_mock_broker_up(mock, 3, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_producer_flush(producer, 20000, err, sizeof err), MOEQ_OK);
    assert_int_equal(r.ok, N_MESSAGES);
    assert_int_equal(r.failed, 0);
    for (int i = 0; i < N_MESSAGES; i++) assert_int_equal(r.per_message[i], 1);
    assert_int_equal(moeq_kafka_mock_broker_faults_left(mock, 2, MOEQ_KAFKA_API_PRODUCE, &left, err, sizeof err), MOEQ_OK);
    assert_int_equal(left, 0); /* every injected answer was given */
    moeq_kafka_producer_destroy(producer);

    static int seen[N_MESSAGES];
    consume_count(brokers, "faults", seen, N_MESSAGES);
    for (int i = 0; i < N_MESSAGES; i++) assert_int_equal(seen[i], 1);
}

static void a_client_configured_with_test_mock_num_brokers_owns_its_cluster(void **state) {
    (void)state;
    moeq_kvlist *kv = moeq_kvlist_new();
    moeq_kvlist_set(kv, "test.mock.num.brokers", "1");
    moeq_kafka_producer_params pp = {.brokers = NULL, .client_id = "moeq-test"};
    moeq_kafka_producer *producer = NULL;
    char err[256];
    assert_int_equal(moeq_kafka_producer_new(&pp, kv, &producer, err, sizeof err), MOEQ_OK);
    moeq_kvlist_destroy(kv);
    moeq_kafka_mock *mock = moeq_kafka_producer_mock(producer);
    assert_non_null(mock);
    assert_non_null(strstr(moeq_kafka_mock_bootstraps(mock), "127.0.0.1:"));
    assert_int_equal(moeq_kafka_mock_broker_set_rtt(mock, -1, 10, err, sizeof err), MOEQ_OK);
    moeq_kafka_out out = {.topic = "own", .partition = MOEQ_KAFKA_PARTITION_ANY, .value = "x", .value_len = 1};
    assert_int_equal(moeq_kafka_produce(producer, &out, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_producer_flush(producer, 10000, err, sizeof err), MOEQ_OK);
    moeq_kafka_producer_destroy(producer);

    /* a plain client has none */
    pp.brokers = "127.0.0.1:1";
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &producer, err, sizeof err), MOEQ_OK);
    assert_null(moeq_kafka_producer_mock(producer));
    moeq_kafka_producer_destroy(producer);
    moeq_kafka_mock *none = NULL;
    assert_int_equal(moeq_kafka_mock_new(0, &none, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_null(none);
    moeq_kafka_mock_destroy(NULL);
}

static int mock_up(void **state) {
    moeq_kafka_mock *mock = NULL;
    char err[256];
    if (moeq_kafka_mock_new(3, &mock, err, sizeof err)) {
        fprintf(stderr, "mock cluster: %s\n", err);
        return -1;
    }
    *state = mock;
    return 0;
}

static int mock_down(void **state) {
    moeq_kafka_mock_destroy(*state);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(consumer_lag_is_the_distance_from_the_committed_offset_to_the_high_watermark,
                                        mock_up, mock_down),
        cmocka_unit_test_setup_teardown(injected_produce_errors_and_a_broker_outage_still_deliver_each_message_once,
                                        mock_up, mock_down),
        cmocka_unit_test(a_client_configured_with_test_mock_num_brokers_owns_its_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
