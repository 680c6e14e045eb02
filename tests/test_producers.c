/*
 * test_producers.c — cross-language proof: each example producer (Python +
 * msgpack, Node + msgpack, kcat + JSON) writes jobs to a fresh topic on the
 * real broker of the `services` fixture, and the C codec (moeq_job_decode)
 * accepts every one of them, by content-type header and by sniffing alike.
 *
 * The producers are the files in examples/, run as a user would run them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/util.h"
#include "services_env.h"

#define N_JOBS 6 /* two of each input kind: prompt, messages, tokens */

static char brokers[128];
static const char *source_dir;

typedef struct producer {
    const char *name;        /* topic prefix and message label          */
    const char *command;     /* printf format: source dir, brokers, topic, count */
    const char *id_prefix;   /* ids look like <prefix>-<run>-<i>        */
    const char *content_type;
    moeq_wire_format format;
} producer;

static const producer python = {"python", "/usr/bin/python3 %s/examples/python/producer.py --brokers %s --topic %s --count %d",
                                "py-", "application/msgpack", MOEQ_WIRE_MSGPACK};
static const producer node = {"node", "node %s/examples/node/producer.js --brokers %s --topic %s --count %d",
                              "node-", "application/msgpack", MOEQ_WIRE_MSGPACK};
static const producer kcat = {"kcat", "%s/examples/kcat/produce.sh --brokers %s --topic %s --count %d",
                              "kcat-", "application/json", MOEQ_WIRE_JSON};

static void run_producer(const producer *p, const char *topic) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, p->command, source_dir, brokers, topic, N_JOBS);
    int status = system(cmd);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("%s producer failed (status %d): %s — did scripts/setup.sh run (npm packages, python3-msgpack)?",
                 p->name, status, cmd);
}

static moeq_kafka_consumer *subscribe(const char *topic) {
    char group[160], errstr[512];
    moeq_test_unique_name(group, sizeof group, "moeq-test-producers");
    const char *topics[] = {topic};
    moeq_kafka_consumer_params params = {.brokers = brokers, .group_id = group, .topics = topics, .n_topics = 1};
    moeq_kafka_consumer *consumer = NULL;
    if (moeq_kafka_consumer_new(&params, NULL, &consumer, errstr, sizeof errstr)) fail_msg("consumer: %s", errstr);
    return consumer;
}

/* Decode one message the way the coordinator will; check it against what the example writes. */
static void check_job(const producer *p, const moeq_kafka_msg *msg, int *seen_kinds) {
    size_t len = 0, key_len = 0, ct_len = 0;
    const void *value = moeq_kafka_msg_value(msg, &len);
    const char *key = moeq_kafka_msg_key(msg, &key_len);
    const void *ct = NULL;
    assert_int_equal(moeq_kafka_msg_header(msg, "content-type", &ct, &ct_len), MOEQ_OK);
    char content_type[64];
    snprintf(content_type, sizeof content_type, "%.*s", (int)ct_len, (const char *)ct);
    assert_string_equal(content_type, p->content_type);

    moeq_job job;
    moeq_job_reject reject;
    moeq_err err = moeq_job_decode(value, len, content_type, NULL, &job, &reject);
    if (err) fail_msg("%s job rejected: %s (%s)", p->name, reject.message, moeq_job_reject_code_name(reject.code));
    assert_int_equal(job.version, 1);
    assert_int_equal(job.format, p->format);
    assert_int_equal(strncmp(job.id, p->id_prefix, strlen(p->id_prefix)), 0);
    assert_int_equal(key_len, job.id_len); /* keyed by id */
    assert_memory_equal(key, job.id, key_len);
    assert_int_equal(job.max_new_tokens, 64);
    assert_true(job.priority >= 0 && job.priority <= 3);
    assert_non_null(job.metadata);
    assert_true(job.input >= MOEQ_JOB_INPUT_PROMPT && job.input <= MOEQ_JOB_INPUT_TOKENS);
    seen_kinds[job.input]++;
    moeq_job_free(&job);

    /* Without the header the codec sniffs the same format. */
    err = moeq_job_decode(value, len, NULL, NULL, &job, &reject);
    if (err) fail_msg("%s job rejected when sniffed: %s", p->name, reject.message);
    assert_int_equal(job.format, p->format);
    moeq_job_free(&job);
}

static void check_producer(const producer *p) {
    char topic[160], errstr[512];
    moeq_test_unique_name(topic, sizeof topic, "moeq.test.producers");
    run_producer(p, topic);
    moeq_kafka_consumer *consumer = subscribe(topic);
    int count = 0, seen_kinds[4] = {0};
    int64_t deadline = moeq_now_ms() + 60000;
    while (count < N_JOBS && moeq_now_ms() < deadline) {
        moeq_kafka_msg *msg = NULL;
        assert_int_equal(moeq_kafka_consumer_poll(consumer, 200, &msg, errstr, sizeof errstr), MOEQ_OK);
        if (!msg) continue;
        check_job(p, msg, seen_kinds);
        moeq_kafka_msg_destroy(msg);
        count++;
    }
    moeq_kafka_consumer_destroy(consumer);
    assert_int_equal(count, N_JOBS);
    assert_int_equal(seen_kinds[MOEQ_JOB_INPUT_PROMPT], N_JOBS / 3);
    assert_int_equal(seen_kinds[MOEQ_JOB_INPUT_MESSAGES], N_JOBS / 3);
    assert_int_equal(seen_kinds[MOEQ_JOB_INPUT_TOKENS], N_JOBS / 3);
}

static void python_producer_writes_msgpack_jobs_the_c_codec_accepts(void **state) {
    (void)state;
    check_producer(&python);
}

static void node_producer_writes_msgpack_jobs_the_c_codec_accepts(void **state) {
    (void)state;
    check_producer(&node);
}

static void kcat_producer_writes_json_jobs_the_c_codec_accepts(void **state) {
    (void)state;
    check_producer(&kcat);
}

int main(void) {
    if (moeq_test_service("MOEQ_TEST_KAFKA", brokers, sizeof brokers)) return MOEQ_TEST_SKIP;
    source_dir = getenv("MOEQ_SOURCE_DIR");
    if (!source_dir) {
        fprintf(stderr, "MOEQ_SOURCE_DIR is not set (ctest sets it)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(python_producer_writes_msgpack_jobs_the_c_codec_accepts),
        cmocka_unit_test(node_producer_writes_msgpack_jobs_the_c_codec_accepts),
        cmocka_unit_test(kcat_producer_writes_json_jobs_the_c_codec_accepts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
