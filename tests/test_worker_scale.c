/*
 * test_worker_scale.c — a worker added mid-run joins by starting: it takes
 * batches from the shared consumer group while the first worker keeps going,
 * and every job still gets exactly one result. (How much throughput a second
 * worker adds is a number for bench-pipeline, not a test assertion.)
 * Needs the `services` fixture (skips with 77 without it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_worker_e2e_harness.h"

#define N_JOBS 600

static e2e g_t;

static void on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    if (d->err) ++*(int *)opaque;
}

/* Token jobs `scale-<from>` .. `scale-<to - 1>` on the jobs topic, acknowledged by the broker. */
static void produce_jobs(int from, int to) {
    int failed = 0;
    char err[512];
    moeq_kafka_producer_params pp = {.brokers = g_t.kafka, .on_delivery = on_delivery, .cb_opaque = &failed};
    moeq_kafka_producer *p = NULL;
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &p, err, sizeof err), MOEQ_OK);
    for (int i = from; i < to; i++) {
        char id[32], job[256];
        snprintf(id, sizeof id, "scale-%d", i);
        int n = snprintf(job, sizeof job,
                         "{\"v\":1,\"id\":\"%s\",\"tokens\":[%d,%d,%d,%d],\"max_new_tokens\":12,\"temperature\":0}", id,
                         3 + i % 50, 7 + i % 31, 11 + i % 17, 5 + i % 13);
        moeq_kafka_out m = {.topic = g_t.jobs_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = id,
                            .key_len = strlen(id), .value = job, .value_len = (size_t)n};
        assert_int_equal(moeq_kafka_produce(p, &m, err, sizeof err), MOEQ_OK);
    }
    assert_int_equal(moeq_kafka_producer_flush(p, 30000, err, sizeof err), MOEQ_OK);
    moeq_kafka_producer_destroy(p);
    assert_int_equal(failed, 0);
}

/* Wait until worker_id's heartbeat key exists: it is in its loop and reads batches. */
static void wait_heartbeat(const char *worker_id, int timeout_ms) {
    moeq_redis_params rp;
    moeq_redis *r = NULL;
    char err[512], key[256];
    assert_int_equal(moeq_redis_params_parse(g_t.redis, NULL, &rp, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&rp, &r, err, sizeof err), MOEQ_OK);
    snprintf(key, sizeof key, "%s:worker:%s", g_t.ns, worker_id);
    int found = 0;
    for (int waited = 0; !found && waited < timeout_ms; waited += 50) {
        const char *argv[] = {"EXISTS", key};
        moeq_redis_reply *rep = NULL;
        if (moeq_redis_command_argv(r, 2, argv, NULL, &rep, err, sizeof err) == MOEQ_OK)
            found = moeq_redis_reply_int(rep) == 1;
        moeq_redis_reply_free(rep);
        if (!found) usleep(50 * 1000);
    }
    moeq_redis_destroy(r);
    assert_true(found);
}

/* How many job records name this worker. */
static int jobs_run_by(const char *worker_id) {
    moeq_redis_params rp;
    moeq_redis *r = NULL;
    char err[512];
    assert_int_equal(moeq_redis_params_parse(g_t.redis, NULL, &rp, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&rp, &r, err, sizeof err), MOEQ_OK);
    int n = 0;
    for (int i = 0; i < N_JOBS; i++) {
        char key[256];
        snprintf(key, sizeof key, "%s:job:scale-%d", g_t.ns, i);
        const char *argv[] = {"HGET", key, "worker"};
        moeq_redis_reply *rep = NULL;
        if (moeq_redis_command_argv(r, 3, argv, NULL, &rep, err, sizeof err) == MOEQ_OK) {
            const char *w = moeq_redis_reply_str(rep, NULL);
            n += w && !strcmp(w, worker_id);
        }
        moeq_redis_reply_free(rep);
    }
    moeq_redis_destroy(r);
    return n;
}

static void a_worker_started_mid_run_takes_batches_and_nothing_is_lost(void **state) {
    (void)state;
    pid_t coord = e2e_start_coordinator(&g_t, NULL);
    pid_t w1 = e2e_start_worker(&g_t, "scale-w1", NULL);
    produce_jobs(0, N_JOBS / 2);
    /* the run is under way on one worker ... */
    size_t have = e2e_collect(&g_t, 40, 60000);
    assert_true(have >= 40);
    /* ... when a second one starts: nothing to configure, it joins the group. The second half
     * of the jobs is sent once it runs, so that on a loaded machine the first worker cannot
     * have drained everything before the second is up (the test is about joining, not speed). */
    pid_t w2 = e2e_start_worker(&g_t, "scale-w2", NULL);
    wait_heartbeat("scale-w2", 60000);
    produce_jobs(N_JOBS / 2, N_JOBS);
    have = e2e_collect(&g_t, N_JOBS, 180000);
    e2e_collect(&g_t, N_JOBS + 1, 1000); /* late duplicates, if any */
    int by_w1 = jobs_run_by("scale-w1"), by_w2 = jobs_run_by("scale-w2");
    assert_int_equal(e2e_term(w2, 20000), 0);
    assert_int_equal(e2e_term(w1, 20000), 0);
    e2e_term(coord, 20000);
    print_message("scale: %zu of %d results; worker 1 ran %d jobs, worker 2 (started after 40 results) ran %d; "
                  "%lld duplicates\n", have, N_JOBS, by_w1, by_w2, g_t.duplicates);
    assert_int_equal(have, N_JOBS);
    assert_int_equal(g_t.mismatches, 0);
    assert_true(by_w2 > 0);
    assert_true(by_w1 > 0);
    assert_int_equal(by_w1 + by_w2, N_JOBS);
}

static int group_setup(void **state) {
    (void)state;
    int rc = e2e_open(&g_t, "wkscale");
    if (rc == MOEQ_TEST_SKIP) exit(MOEQ_TEST_SKIP);
    return rc ? -1 : 0;
}

static int group_teardown(void **state) {
    (void)state;
    e2e_close(&g_t);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_worker_started_mid_run_takes_batches_and_nothing_is_lost),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
