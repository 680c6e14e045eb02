/*
 * test_coordinator_broker_restart.c — the coordinator keeps its promise
 * through a broker crash: a private single-node Kafka broker (scripts/kafka.sh,
 * its own data dir) is killed with SIGKILL while jobs flow and restarted on
 * the same data; jobs produced before, during and after all end up in exactly
 * one batch (Redis from the `services` fixture). Labelled slow: a broker
 * start takes a while on a small machine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator_harness.h"

#define N_JOBS 3000
#define N_CHUNKS 3

static char kafka_dir[] = "/tmp/moeq-coord-kafka-XXXXXX";
static char kafka_sh[600];

static int kafka(const char *verb, int port, int cport) {
    char cmd[1024];
    if (!strcmp(verb, "start"))
        snprintf(cmd, sizeof cmd, "%s start %s %d %d > %s/start.log 2>&1", kafka_sh, kafka_dir, port, cport, kafka_dir);
    else
        snprintf(cmd, sizeof cmd, "%s stop %s > /dev/null 2>&1", kafka_sh, kafka_dir);
    return system(cmd);
}

static void kill9_broker(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/kafka.pid", kafka_dir);
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1) pid = 0;
        fclose(f);
    }
    if (pid > 0) kill((pid_t)pid, SIGKILL);
    for (int i = 0; i < 100 && pid > 0 && kill((pid_t)pid, 0) == 0; i++) h_sleep_ms(100);
}

static void produce_chunk(harness *h, int from, int to) {
    char buf[256], key[32];
    for (int i = from; i < to; i++) {
        int n = snprintf(buf, sizeof buf, "{\"v\":1,\"id\":\"br-%d\",\"priority\":%d,\"tokens\":[%d,%d,%d]}", i, i % 4, i,
                         i + 1, i + 2);
        snprintf(key, sizeof key, "br-%d", i);
        h_produce(h, h->jobs_topic, key, buf, (size_t)n);
    }
    moeq_kafka_producer_poll(h->producer, 0);
}

static void no_job_is_lost_or_doubled_when_the_broker_crashes_and_restarts(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_broker_restart");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    const char *src = getenv("MOEQ_SOURCE_DIR");
    snprintf(kafka_sh, sizeof kafka_sh, "%s/scripts/kafka.sh", src ? src : ".");
    if (access(kafka_sh, X_OK)) skip();
    assert_non_null(mkdtemp(kafka_dir));
    int port = h_free_port(), cport = h_free_port();
    if (kafka("start", port, cport)) {
        print_message("private broker did not start (see %s/start.log): skipped\n", kafka_dir);
        skip();
    }
    /* the harness producer and the coordinator talk to the private broker */
    moeq_kafka_producer_destroy(h.producer);
    snprintf(h.kafka, sizeof h.kafka, "127.0.0.1:%d", port);
    char err[256];
    moeq_kafka_producer_params pp = {.brokers = h.kafka, .client_id = "moeq-test", .on_delivery = h_on_delivery,
                                     .cb_opaque = &h};
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &h.producer, err, sizeof err), MOEQ_OK);
    const char *extra[] = {"--max_wait_ms=20", "--commit_interval_ms=200", "--kafka.topic.metadata.refresh.interval.ms=500",
                           "--kafka.reconnect.backoff.max.ms=500", NULL};
    produce_chunk(&h, 0, N_JOBS / N_CHUNKS);
    assert_int_equal(h_flush(&h), 0);
    pid_t pid = h_start(&h, extra);
    produce_chunk(&h, N_JOBS / N_CHUNKS, 2 * N_JOBS / N_CHUNKS);
    assert_int_equal(h_flush(&h), 0);
    h_sleep_ms(300);
    kill9_broker(); /* mid-run: fetches, commits and the group coordinator vanish */
    h_sleep_ms(2000);
    int restarted = kafka("start", port, cport) == 0;
    assert_true(restarted);
    produce_chunk(&h, 2 * N_JOBS / N_CHUNKS, N_JOBS);
    assert_int_equal(h_flush(&h), 0);
    h_walk w = {0};
    int64_t end = moeq_now_ms() + 90000;
    while (moeq_now_ms() < end) {
        assert_int_equal(h_read_batches(&h, &w), 0);
        if (w.n_jobs >= N_JOBS) break;
        h_sleep_ms(500);
    }
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(h_read_batches(&h, &w), 0);
    size_t doubled = h_sort_count_doubled(&w);
    print_message("%zu job entries in %zu batches across a broker crash, %zu doubled\n", w.n_jobs, w.n_batches, doubled);
    assert_int_equal(doubled, 0);
    assert_int_equal(w.n_jobs, N_JOBS);
    free(w.jobs);
    free(w.batches);
    h_destroy(&h);
}

static int cleanup(void **state) {
    (void)state;
    if (kafka_sh[0] && strncmp(kafka_dir, "/tmp/moeq-coord-kafka-", 22) == 0 && !strstr(kafka_dir, "XXXXXX")) {
        kafka("stop", 0, 0);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf %s", kafka_dir);
        if (system(cmd)) return 0;
    }
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_job_is_lost_or_doubled_when_the_broker_crashes_and_restarts),
    };
    return cmocka_run_group_tests(tests, NULL, cleanup);
}
