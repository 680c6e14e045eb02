/*
 * test_kafka_config.c — the Kafka adapter's configuration layering, without
 * a broker: every kafka.* key reaches librdkafka unchanged, bad ones are
 * rejected naming the key, and the two keys that carry the delivery promise
 * cannot be switched off.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "moeq/kafka.h"

static moeq_err validate(moeq_kafka_role role, const char *key, const char *value, char *errstr, size_t n) {
    moeq_kvlist *kv = moeq_kvlist_new();
    assert_non_null(kv);
    if (key) assert_int_equal(moeq_kvlist_set(kv, key, value), MOEQ_OK);
    moeq_err err = moeq_kafka_conf_validate(kv, role, errstr, n);
    moeq_kvlist_destroy(kv);
    return err;
}

static void kafka_config_accepts_tuning_and_security_keys_unchanged(void **state) {
    (void)state;
    char errstr[256] = "";
    moeq_kvlist *kv = moeq_kvlist_new();
    moeq_kvlist_set(kv, "bootstrap.servers", "broker-a:9092,broker-b:9092");
    moeq_kvlist_set(kv, "message.timeout.ms", "30000");
    moeq_kvlist_set(kv, "compression.codec", "lz4");
    moeq_kvlist_set(kv, "security.protocol", "plaintext");
    moeq_kvlist_set(kv, "statistics.interval.ms", "0");
    assert_int_equal(moeq_kafka_conf_validate(kv, MOEQ_KAFKA_PRODUCER, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(moeq_kafka_conf_validate(kv, MOEQ_KAFKA_CONSUMER, errstr, sizeof errstr), MOEQ_OK);
    moeq_kvlist_destroy(kv);
    assert_int_equal(moeq_kafka_conf_validate(NULL, MOEQ_KAFKA_PRODUCER, errstr, sizeof errstr), MOEQ_OK);
}

static void kafka_config_rejects_an_unknown_key_naming_it(void **state) {
    (void)state;
    char errstr[256] = "";
    assert_int_equal(validate(MOEQ_KAFKA_PRODUCER, "linger.msec", "5", errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "kafka.linger.msec"));
}

static void kafka_config_rejects_a_bad_value_naming_the_key(void **state) {
    (void)state;
    char errstr[256] = "";
    assert_int_equal(validate(MOEQ_KAFKA_CONSUMER, "session.timeout.ms", "soon", errstr, sizeof errstr),
                     MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "kafka.session.timeout.ms"));
}

static void kafka_config_keeps_the_producer_idempotent(void **state) {
    (void)state;
    char errstr[256] = "";
    assert_int_equal(validate(MOEQ_KAFKA_PRODUCER, "enable.idempotence", "false", errstr, sizeof errstr),
                     MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "kafka.enable.idempotence"));
    assert_int_equal(validate(MOEQ_KAFKA_PRODUCER, "enable.idempotence", "true", errstr, sizeof errstr), MOEQ_OK);
}

static void kafka_config_never_lets_the_consumer_store_offsets_itself(void **state) {
    (void)state;
    char errstr[256] = "";
    assert_int_equal(validate(MOEQ_KAFKA_CONSUMER, "enable.auto.offset.store", "true", errstr, sizeof errstr),
                     MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "kafka.enable.auto.offset.store"));
    /* Periodic auto-commit of offsets the caller stored is allowed. */
    assert_int_equal(validate(MOEQ_KAFKA_CONSUMER, "enable.auto.commit", "true", errstr, sizeof errstr), MOEQ_OK);
}

static void kafka_producer_new_fails_on_a_bad_key_before_any_io(void **state) {
    (void)state;
    char errstr[256] = "";
    moeq_kvlist *kv = moeq_kvlist_new();
    moeq_kvlist_set(kv, "no.such.property", "1");
    moeq_kafka_producer_params params = {.brokers = "127.0.0.1:1"};
    moeq_kafka_producer *producer = (moeq_kafka_producer *)&params; /* must be reset to NULL */
    assert_int_equal(moeq_kafka_producer_new(&params, kv, &producer, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_null(producer);
    assert_non_null(strstr(errstr, "kafka.no.such.property"));
    moeq_kvlist_destroy(kv);
    moeq_kafka_producer_destroy(NULL);
}

static void kafka_consumer_new_requires_a_group_and_a_topic(void **state) {
    (void)state;
    char errstr[256] = "";
    moeq_kafka_consumer *consumer = NULL;
    const char *topics[] = {"moeq.jobs"};
    moeq_kafka_consumer_params params = {.brokers = "127.0.0.1:1", .topics = topics, .n_topics = 1};
    assert_int_equal(moeq_kafka_consumer_new(&params, NULL, &consumer, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "group_id"));
    params.group_id = "g", params.n_topics = 0;
    assert_int_equal(moeq_kafka_consumer_new(&params, NULL, &consumer, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_null(consumer);
    moeq_kafka_consumer_destroy(NULL);
}

static void kafka_error_codes_split_retriable_from_fatal(void **state) {
    (void)state;
    assert_int_equal(moeq_kafka_err_map(0), MOEQ_OK);
    /* librdkafka's numbering is stable ABI: -184 _QUEUE_FULL, -192 _MSG_TIMED_OUT, 10 MSG_SIZE_TOO_LARGE, -150 _FATAL. */
    assert_true(moeq_err_is_retriable(moeq_kafka_err_map(-184)));
    assert_true(moeq_err_is_retriable(moeq_kafka_err_map(-192)));
    assert_int_equal(moeq_kafka_err_map(10), MOEQ_ERR_LIMIT);
    assert_int_equal(moeq_kafka_err_map(-150), MOEQ_ERR_INTERNAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kafka_config_accepts_tuning_and_security_keys_unchanged),
        cmocka_unit_test(kafka_config_rejects_an_unknown_key_naming_it),
        cmocka_unit_test(kafka_config_rejects_a_bad_value_naming_the_key),
        cmocka_unit_test(kafka_config_keeps_the_producer_idempotent),
        cmocka_unit_test(kafka_config_never_lets_the_consumer_store_offsets_itself),
        cmocka_unit_test(kafka_producer_new_fails_on_a_bad_key_before_any_io),
        cmocka_unit_test(kafka_consumer_new_requires_a_group_and_a_topic),
        cmocka_unit_test(kafka_error_codes_split_retriable_from_fatal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
