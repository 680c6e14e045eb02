/*
 * test_coordinator_redis_restart.c — a private redis-server (AOF,
 * appendfsync always) is killed with SIGKILL twice while jobs flow and
 * restarted from its AOF; the coordinator (default durability=fsync_always)
 * rides it out: at the end every job is in exactly one batch. A batch whose
 * offsets were committed after Redis acknowledged it cannot be missing —
 * Kafka would not deliver it again — so a lost acknowledged write shows up
 * here as a missing job. Also exercises reconnecting and reloading the Lua
 * scripts the restarted server no longer has (NOSCRIPT).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/stat.h>

#include "coordinator_harness.h"

#define N_JOBS 3000
#define N_CHUNKS 6

static void produce_chunk(harness *h, int from, int to) {
    char buf[256], key[32];
    for (int i = from; i < to; i++) {
        int n = snprintf(buf, sizeof buf, "{\"v\":1,\"id\":\"rr-%d\",\"priority\":%d,\"tokens\":[%d,%d,%d,%d]}", i, i % 4,
                         i, i + 1, i + 2, i + 3);
        snprintf(key, sizeof key, "rr-%d", i);
        h_produce(h, h->jobs_topic, key, buf, (size_t)n);
    }
    moeq_kafka_producer_poll(h->producer, 0);
}

static int redis_up(int port) {
    char addr[64], err[256];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    moeq_redis_params rp;
    moeq_redis *r = NULL;
    if (moeq_redis_params_parse(addr, NULL, &rp, err, sizeof err) || moeq_redis_new(&rp, &r, err, sizeof err)) return 0;
    moeq_redis_reply *rep = NULL;
    const char *argv[] = {"PING"};
    int ok = moeq_redis_command_argv(r, 1, argv, NULL, &rep, err, sizeof err) == MOEQ_OK;
    moeq_redis_reply_free(rep);
    moeq_redis_destroy(r);
    return ok;
}

static pid_t start_and_wait(const char *dir, int port) {
    pid_t pid = h_redis_start(dir, port);
    for (int i = 0; i < 100 && !redis_up(port); i++) h_sleep_ms(100);
    return pid;
}

static void acknowledged_batches_survive_a_redis_crash_and_restart(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_redis_restart");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    char dir[] = "/tmp/moeq-coord-redis-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int port = h_free_port();
    pid_t redis = start_and_wait(dir, port);
    assert_true(redis_up(port));
    /* point the harness (reader) and the coordinator at the private server */
    moeq_redis_destroy(h.redis);
    snprintf(h.redis_addr, sizeof h.redis_addr, "127.0.0.1:%d", port);
    char err[256];
    moeq_redis_params rp;
    assert_int_equal(moeq_redis_params_parse(h.redis_addr, NULL, &rp, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&rp, &h.redis, err, sizeof err), MOEQ_OK);
    const char *extra[] = {"--max_wait_ms=20", "--max_batch_jobs=16", "--commit_interval_ms=50",
                           "--kafka.topic.metadata.refresh.interval.ms=500", NULL};
    produce_chunk(&h, 0, N_JOBS / N_CHUNKS);
    pid_t pid = h_start(&h, extra);
    for (int c = 1; c < N_CHUNKS; c++) {
        int crash = c == 2 || c == 4;
        if (crash) { /* Redis dies; this chunk arrives while it is down; it restarts from its AOF */
            kill(redis, SIGKILL);
            waitpid(redis, NULL, 0);
        }
        produce_chunk(&h, c * (N_JOBS / N_CHUNKS), (c + 1) * (N_JOBS / N_CHUNKS));
        h_flush(&h);
        h_sleep_ms(1500);
        if (crash) {
            redis = start_and_wait(dir, port);
            assert_true(redis_up(port));
        }
    }
    assert_int_equal(h_flush(&h), 0);
    h_walk w = {0};
    int64_t end = moeq_now_ms() + 60000;
    while (moeq_now_ms() < end) {
        h_read_batches(&h, &w); /* the reader reconnects by itself after the restart */
        if (w.n_jobs >= N_JOBS) break;
        h_sleep_ms(300);
    }
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(h_read_batches(&h, &w), 0);
    size_t doubled = h_sort_count_doubled(&w);
    print_message("%zu job entries in %zu batches after two Redis crashes, %zu doubled\n", w.n_jobs, w.n_batches, doubled);
    assert_int_equal(doubled, 0);
    assert_int_equal(w.n_jobs, N_JOBS);
    kill(redis, SIGTERM);
    waitpid(redis, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    free(w.jobs);
    free(w.batches);
    h_destroy(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(acknowledged_batches_survive_a_redis_crash_and_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
