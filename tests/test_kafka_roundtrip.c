/*
 * test_kafka_roundtrip.c — the Kafka adapter against the real broker of the
 * `services` fixture: keyed messages with headers go out through the
 * idempotent producer (one delivery report each, with its opaque), come back
 * through a cooperative-sticky group consumer, offsets are stored and
 * committed by hand, pause holds messages back, and a later member of the
 * same group starts after the commit; consumer lag is the distance from the
 * committed offset to the high watermark.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/kafka.h"
#include "moeq/util.h"
#include "services_env.h"

#define N_MESSAGES 200
#define MAX_PARTITIONS 16

static char brokers[128];

typedef struct sent {
    int index;
    int reports;      /* must end at exactly 1 */
    moeq_err err;
    int32_t partition;
    int64_t offset;
} sent;

static void on_delivery(const moeq_kafka_delivery *delivery, void *cb_opaque) {
    int *total = cb_opaque;
    sent *s = delivery->opaque;
    s->reports++;
    s->err = delivery->err;
    s->partition = delivery->partition;
    s->offset = delivery->offset;
    (*total)++;
}

static moeq_kafka_producer *new_producer(int *total) {
    moeq_kafka_producer_params params = {.brokers = brokers, .client_id = "moeq-test", .on_delivery = on_delivery,
                                         .cb_opaque = total};
    moeq_kafka_producer *producer = NULL;
    char errstr[512];
    if (moeq_kafka_producer_new(&params, NULL, &producer, errstr, sizeof errstr)) fail_msg("producer: %s", errstr);
    return producer;
}

static void produce(moeq_kafka_producer *producer, const char *topic, sent *s) {
    char key[32], value[64], seq[16];
    snprintf(key, sizeof key, "job-%d", s->index);
    snprintf(value, sizeof value, "{\"v\":1,\"id\":\"job-%d\"}", s->index);
    snprintf(seq, sizeof seq, "%d", s->index);
    moeq_kafka_header headers[] = {
        {"content-type", "application/json", 16},
        {"moeq-seq", seq, strlen(seq)},
    };
    moeq_kafka_out msg = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = key, .key_len = strlen(key),
                          .value = value, .value_len = strlen(value), .headers = headers, .n_headers = 2, .opaque = s};
    char errstr[512];
    moeq_err err;
    while ((err = moeq_kafka_produce(producer, &msg, errstr, sizeof errstr)) == MOEQ_ERR_TRANSIENT)
        moeq_kafka_producer_poll(producer, 10); /* local queue full: serve reports, retry */
    if (err) fail_msg("produce: %s", errstr);
}

typedef struct group_state {
    int assigned, revoked;
} group_state;

static void on_rebalance(moeq_kafka_rebalance kind, const moeq_kafka_partition *parts, size_t n, void *cb_opaque) {
    group_state *g = cb_opaque;
    (void)parts;
    if (kind == MOEQ_KAFKA_ASSIGNED) g->assigned += (int)n;
    else g->revoked += (int)n;
}

static moeq_kafka_consumer *new_consumer(const char *topic, const char *group, group_state *g) {
    const char *topics[] = {topic};
    moeq_kafka_consumer_params params = {.brokers = brokers, .group_id = group, .client_id = "moeq-test",
                                         .topics = topics, .n_topics = 1, .on_rebalance = on_rebalance, .cb_opaque = g};
    moeq_kafka_consumer *consumer = NULL;
    moeq_kvlist *kafka = moeq_kvlist_new(); /* a pass-through key, as a config file would give */
    moeq_kvlist_set(kafka, "session.timeout.ms", "10000");
    char errstr[512];
    if (moeq_kafka_consumer_new(&params, kafka, &consumer, errstr, sizeof errstr)) fail_msg("consumer: %s", errstr);
    moeq_kvlist_destroy(kafka);
    return consumer;
}

/* Check one consumed message against what was sent; returns its index. */
static int check_message(const moeq_kafka_msg *msg, const char *topic) {
    size_t key_len = 0, value_len = 0, seq_len = 0, ct_len = 0;
    const char *key = moeq_kafka_msg_key(msg, &key_len);
    const char *value = moeq_kafka_msg_value(msg, &value_len);
    const void *seq = NULL, *ct = NULL;
    assert_string_equal(moeq_kafka_msg_topic(msg), topic);
    assert_non_null(key);
    assert_int_equal(moeq_kafka_msg_header(msg, "moeq-seq", &seq, &seq_len), MOEQ_OK);
    assert_int_equal(moeq_kafka_msg_header(msg, "content-type", &ct, &ct_len), MOEQ_OK);
    assert_int_equal(ct_len, 16);
    assert_memory_equal(ct, "application/json", 16);
    assert_int_equal(moeq_kafka_msg_header_count(msg), 2);
    assert_int_equal(moeq_kafka_msg_header(msg, "absent", NULL, NULL), MOEQ_ERR_NOT_FOUND);
    assert_true(moeq_kafka_msg_timestamp_ms(msg) > 0);
    char buf[64];
    snprintf(buf, sizeof buf, "%.*s", (int)seq_len, (const char *)seq);
    int index = atoi(buf);
    char want_key[32], want_value[64];
    snprintf(want_key, sizeof want_key, "job-%d", index);
    snprintf(want_value, sizeof want_value, "{\"v\":1,\"id\":\"job-%d\"}", index);
    assert_int_equal(key_len, strlen(want_key));
    assert_memory_equal(key, want_key, key_len);
    assert_int_equal(value_len, strlen(want_value));
    assert_memory_equal(value, want_value, value_len);
    return index;
}

typedef struct consumed {
    int seen[N_MESSAGES + 1];
    int count;
    int64_t next_offset[MAX_PARTITIONS]; /* last consumed + 1, per partition */
} consumed;

/* Poll until want messages arrived or deadline_ms passed; stores each offset as it goes. */
static void consume(moeq_kafka_consumer *consumer, const char *topic, consumed *c, int want, int64_t deadline_ms) {
    char errstr[512];
    while (c->count < want && moeq_now_ms() < deadline_ms) {
        moeq_kafka_msg *msg = NULL;
        assert_int_equal(moeq_kafka_consumer_poll(consumer, 200, &msg, errstr, sizeof errstr), MOEQ_OK);
        if (!msg) continue;
        int index = check_message(msg, topic);
        int32_t partition = moeq_kafka_msg_partition(msg);
        assert_true(index >= 0 && index <= N_MESSAGES);
        assert_true(partition >= 0 && partition < MAX_PARTITIONS);
        c->seen[index]++;
        c->count++;
        c->next_offset[partition] = moeq_kafka_msg_offset(msg) + 1;
        assert_int_equal(moeq_kafka_consumer_store(consumer, topic, partition, c->next_offset[partition], errstr,
                                                   sizeof errstr), MOEQ_OK);
        moeq_kafka_msg_destroy(msg);
    }
}

static void keyed_messages_with_headers_make_a_full_round_trip_and_commits_stick(void **state) {
    (void)state;
    char topic[160], group[160], errstr[512];
    moeq_test_unique_name(topic, sizeof topic, "moeq.test.roundtrip");
    moeq_test_unique_name(group, sizeof group, "moeq-test-group");

    /* 1. Produce N keyed messages; each gets exactly one successful delivery report. */
    static sent sent_msgs[N_MESSAGES + 1];
    int reports = 0;
    moeq_kafka_producer *producer = new_producer(&reports);
    for (int i = 0; i < N_MESSAGES; i++) {
        sent_msgs[i] = (sent){.index = i, .offset = -1};
        produce(producer, topic, &sent_msgs[i]);
    }
    assert_int_equal(moeq_kafka_producer_flush(producer, 60000, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(reports, N_MESSAGES);
    assert_int_equal(moeq_kafka_producer_outq_len(producer), 0);
    for (int i = 0; i < N_MESSAGES; i++) {
        assert_int_equal(sent_msgs[i].reports, 1);
        assert_int_equal(sent_msgs[i].err, MOEQ_OK);
        assert_true(sent_msgs[i].offset >= 0);
    }

    /* 2. Consume them all in a group, storing offsets as they are handled. */
    group_state g = {0};
    moeq_kafka_consumer *consumer = new_consumer(topic, group, &g);
    static consumed c;
    memset(&c, 0, sizeof c);
    consume(consumer, topic, &c, N_MESSAGES, moeq_now_ms() + 60000);
    assert_int_equal(c.count, N_MESSAGES);
    for (int i = 0; i < N_MESSAGES; i++) assert_int_equal(c.seen[i], 1);
    assert_true(g.assigned >= 1);
    moeq_kafka_partition *parts = NULL;
    size_t n_parts = 0;
    assert_int_equal(moeq_kafka_consumer_assignment(consumer, &parts, &n_parts, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal((int)n_parts, g.assigned);
    assert_string_equal(parts[0].topic, topic);
    free(parts);

    /* 3. Paused, a new message is held back; resumed, it arrives. */
    assert_int_equal(moeq_kafka_consumer_pause(consumer, NULL, 0, errstr, sizeof errstr), MOEQ_OK);
    sent_msgs[N_MESSAGES] = (sent){.index = N_MESSAGES, .offset = -1};
    produce(producer, topic, &sent_msgs[N_MESSAGES]);
    assert_int_equal(moeq_kafka_producer_flush(producer, 30000, errstr, sizeof errstr), MOEQ_OK);
    consume(consumer, topic, &c, N_MESSAGES + 1, moeq_now_ms() + 1500);
    assert_int_equal(c.count, N_MESSAGES);
    assert_int_equal(moeq_kafka_consumer_resume(consumer, NULL, 0, errstr, sizeof errstr), MOEQ_OK);
    consume(consumer, topic, &c, N_MESSAGES + 1, moeq_now_ms() + 30000);
    assert_int_equal(c.count, N_MESSAGES + 1);
    assert_int_equal(c.seen[N_MESSAGES], 1);

    /* 4. Commit what was stored; the broker reports it per partition. */
    assert_int_equal(moeq_kafka_consumer_commit(consumer, 0, errstr, sizeof errstr), MOEQ_OK);
    for (int32_t p = 0; p < MAX_PARTITIONS; p++) {
        if (!c.next_offset[p]) continue;
        int64_t committed = -2;
        assert_int_equal(moeq_kafka_consumer_committed(consumer, topic, p, 10000, &committed, errstr, sizeof errstr),
                         MOEQ_OK);
        assert_int_equal(committed, c.next_offset[p]);
    }
    /* Storing for a partition this consumer does not own is refused. */
    assert_int_equal(moeq_kafka_consumer_store(consumer, topic, 99, 1, errstr, sizeof errstr), MOEQ_ERR_NOT_FOUND);
    assert_int_equal(moeq_kafka_consumer_close(consumer, errstr, sizeof errstr), MOEQ_OK);
    assert_true(g.revoked >= 1);
    moeq_kafka_consumer_destroy(consumer);

    /* 5. A new member of the group resumes after the commit: nothing is read twice. */
    group_state g2 = {0};
    consumer = new_consumer(topic, group, &g2);
    static consumed again;
    memset(&again, 0, sizeof again);
    int64_t deadline = moeq_now_ms() + 30000;
    while (!g2.assigned && moeq_now_ms() < deadline) consume(consumer, topic, &again, 1, moeq_now_ms() + 200);
    assert_true(g2.assigned >= 1);
    consume(consumer, topic, &again, 1, moeq_now_ms() + 2000);
    assert_int_equal(again.count, 0);
    moeq_kafka_consumer_destroy(consumer);
    moeq_kafka_producer_destroy(producer);
}

static void a_message_over_the_size_limit_is_refused_at_once(void **state) {
    (void)state;
    char topic[160], errstr[512];
    moeq_test_unique_name(topic, sizeof topic, "moeq.test.limit");
    int reports = 0;
    moeq_kafka_producer *producer = new_producer(&reports);
    size_t big = 2u << 20; /* over librdkafka's default message.max.bytes (1 MB) */
    char *value = calloc(1, big);
    moeq_kafka_out msg = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .value = value, .value_len = big};
    assert_int_equal(moeq_kafka_produce(producer, &msg, errstr, sizeof errstr), MOEQ_ERR_LIMIT);
    assert_non_null(strstr(errstr, topic));
    free(value);
    assert_int_equal(moeq_kafka_producer_flush(producer, 1000, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(reports, 0); /* refused messages get no report */
    moeq_kafka_producer_destroy(producer);
}

/* Consumer lag against the real broker: the distance from the committed offset to the high watermark. */
static void consumer_lag_counts_what_the_group_has_not_committed(void **state) {
    (void)state;
    enum { LAG_N = 40, LAG_READ = 15 };
    char topic[160], group[160], errstr[512];
    moeq_test_unique_name(topic, sizeof topic, "moeq.test.lag");
    moeq_test_unique_name(group, sizeof group, "moeq-test-lag");
    static sent msgs[LAG_N];
    int reports = 0;
    moeq_kafka_producer *producer = new_producer(&reports);
    for (int i = 0; i < LAG_N; i++) {
        msgs[i] = (sent){.index = i, .offset = -1};
        produce(producer, topic, &msgs[i]);
    }
    assert_int_equal(moeq_kafka_producer_flush(producer, 60000, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(reports, LAG_N);

    group_state g = {0};
    moeq_kafka_consumer *consumer = new_consumer(topic, group, &g);
    static consumed c;
    memset(&c, 0, sizeof c);
    consume(consumer, topic, &c, LAG_READ, moeq_now_ms() + 60000); /* offsets stored, not committed */
    assert_int_equal(c.count, LAG_READ);
    for (int round = 0; round < 2; round++) {
        if (round == 1) assert_int_equal(moeq_kafka_consumer_commit(consumer, 0, errstr, sizeof errstr), MOEQ_OK);
        moeq_kafka_lag *lags = NULL;
        size_t n = 0;
        assert_int_equal(moeq_kafka_consumer_lag(consumer, 10000, &lags, &n, errstr, sizeof errstr), MOEQ_OK);
        assert_int_equal((int)n, g.assigned);
        int64_t total = 0, high = 0;
        for (size_t i = 0; i < n; i++) {
            assert_string_equal(lags[i].topic, topic);
            assert_true(lags[i].lag >= 0 && lags[i].partition < MAX_PARTITIONS);
            int64_t next = c.next_offset[lags[i].partition];
            assert_int_equal(lags[i].committed, round == 1 && next ? next : -1);
            assert_int_equal(lags[i].position, next ? next : -1);
            total += lags[i].lag;
            high += lags[i].high;
        }
        free(lags);
        assert_int_equal(high, LAG_N);
        assert_int_equal(total, round == 0 ? LAG_N : LAG_N - LAG_READ); /* before and after the commit */
    }
    moeq_kafka_consumer_destroy(consumer);
    moeq_kafka_producer_destroy(producer);
}

int main(void) {
    if (moeq_test_service("MOEQ_TEST_KAFKA", brokers, sizeof brokers)) return MOEQ_TEST_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keyed_messages_with_headers_make_a_full_round_trip_and_commits_stick),
        cmocka_unit_test(a_message_over_the_size_limit_is_refused_at_once),
        cmocka_unit_test(consumer_lag_counts_what_the_group_has_not_committed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
