/*
 * test_worker_chaos.c — crashes during a run. MOEQ_CHAOS_JOBS (default
 * 5,000) short jobs go through a real `moeq coordinator` and two
 * `moeq worker` processes while the test, every MOEQ_CHAOS_PERIOD_MS
 * (default 2,500 ms), kills with -9 a random worker or the coordinator and
 * starts a fresh one; once, it kills redis-server with -9 and restarts it on
 * the same data directory and port (AOF, appendfsync always: see
 * scripts/services.sh). Afterwards every job must have a result, all results
 * for one id must be identical (status, finish reason, text, tokens), and the
 * number of duplicates is printed — the at-least-once promise of
 * docs/WORKER.md, measured.
 *
 * Restarting Redis disturbs every test sharing the fixture: the test runs
 * alone (RUN_SERIAL). Needs the `services` fixture (skips with 77 without it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libgen.h>

#include "test_worker_e2e_harness.h"

static e2e g_t;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : dflt;
}

static void on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    if (d->err) (*(int *)opaque)++;
}

/* Produce jobs [from, to) as JSON (ids chaos-<ns>-<i>), some seeded, some not. */
static void produce_jobs(moeq_kafka_producer *p, int from, int to) {
    static const char *docs[] = {"Kafka stores records.", "Redis streams hold entries.", "A worker runs batches.",
                                 "Translate: good night", "List two colours."};
    for (int i = from; i < to; i++) {
        char id[160], json[768], err[256];
        snprintf(id, sizeof id, "chaos-%s-%d", g_t.ns, i);
        int n = snprintf(json, sizeof json, "{\"v\":1,\"id\":\"%s\",\"prompt\":\"%s (%d)\",\"priority\":%d,"
                         "\"max_new_tokens\":%d,\"temperature\":%s", id, docs[i % 5], i, i % 4, 2 + i % 5,
                         i % 2 ? "0.8" : "0.0");
        if (i % 3) n += snprintf(json + n, sizeof json - (size_t)n, ",\"seed\":%d", i);
        snprintf(json + n, sizeof json - (size_t)n, "}");
        moeq_kafka_header h = {"content-type", "application/json", 16};
        moeq_kafka_out m = {.topic = g_t.jobs_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = id,
                            .key_len = strlen(id), .value = json, .value_len = strlen(json), .headers = &h, .n_headers = 1};
        moeq_err e;
        while ((e = moeq_kafka_produce(p, &m, err, sizeof err)) == MOEQ_ERR_TRANSIENT) moeq_kafka_producer_poll(p, 10);
        assert_int_equal(e, MOEQ_OK);
        moeq_kafka_producer_poll(p, 0);
    }
}

/* kill -9 the fixture's redis-server and start it again on the same directory and port. */
static int restart_redis(void) {
    const char *envf = getenv("MOEQ_TEST_ENV_FILE");
    const char *src = getenv("MOEQ_SOURCE_DIR");
    if (!envf || !src || getenv("MOEQ_TEST_REDIS")) return -1; /* not the fixture's: leave it alone */
    char path[512], dir[600], pidfile[700], cmd[2048];
    snprintf(path, sizeof path, "%s", envf);
    snprintf(dir, sizeof dir, "%s/redis", dirname(path));
    snprintf(pidfile, sizeof pidfile, "%s/redis.pid", dir);
    FILE *f = fopen(pidfile, "r");
    int pid = 0;
    if (!f || fscanf(f, "%d", &pid) != 1 || pid <= 0) {
        if (f) fclose(f);
        return -1;
    }
    fclose(f);
    const char *port = strrchr(g_t.redis, ':');
    if (!port) return -1;
    kill(pid, SIGKILL);
    for (int t = 0; t < 100 && kill(pid, 0) == 0; t++) usleep(20000);
    unlink(pidfile);
    snprintf(cmd, sizeof cmd, "%s/scripts/services.sh redis-start %s %s >/dev/null", src, dir, port + 1);
    return system(cmd) == 0 ? 0 : -1;
}

static void every_job_has_a_result_and_duplicates_are_identical_through_kills_and_a_redis_restart(void **state) {
    (void)state;
    int n_jobs = env_int("MOEQ_CHAOS_JOBS", 5000);
    int period = env_int("MOEQ_CHAOS_PERIOD_MS", 2500);
    int timeout_s = env_int("MOEQ_CHAOS_TIMEOUT_S", 420);
    unsigned seed = (unsigned)env_int("MOEQ_CHAOS_SEED", (int)(moeq_now_ms() % 100000));
    srand(seed);
    const char *wflags = "--visibility_timeout_ms=3000 --heartbeat_interval_ms=500 --max_deliveries=20";
    pid_t coord = e2e_start_coordinator(&g_t, NULL);
    pid_t workers[2];
    int generation = 0;
    char wid[64];
    for (int k = 0; k < 2; k++) {
        snprintf(wid, sizeof wid, "chaos-w%d-%d", k, generation++);
        workers[k] = e2e_start_worker(&g_t, wid, wflags);
    }
    char err[512];
    int failed = 0;
    moeq_kafka_producer *prod = NULL;
    moeq_kafka_producer_params pp = {.brokers = g_t.kafka, .on_delivery = on_delivery, .cb_opaque = &failed};
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &prod, err, sizeof err), MOEQ_OK);

    int64_t t0 = moeq_now_ms(), deadline = t0 + (int64_t)timeout_s * 1000;
    int produced = 0, chunk = n_jobs / 10 > 0 ? n_jobs / 10 : n_jobs;
    int kills_worker = 0, kills_coord = 0, redis_restarted = 0, actions = 0, max_actions = 12;
    size_t have = 0;
    while (have < (size_t)n_jobs && moeq_now_ms() < deadline) {
        if (produced < n_jobs) { /* the jobs arrive over the first part of the run */
            int to = produced + chunk < n_jobs ? produced + chunk : n_jobs;
            produce_jobs(prod, produced, to);
            produced = to;
        }
        have = e2e_collect(&g_t, (size_t)n_jobs, period);
        if (actions >= max_actions || have >= (size_t)n_jobs) continue;
        actions++;
        int what = rand() % 5;
        if (actions == max_actions / 3 && !redis_restarted) {
            assert_int_equal(restart_redis(), 0);
            redis_restarted = 1;
            print_message("chaos: %lld ms: redis-server killed and restarted (%zu results so far)\n",
                          (long long)(moeq_now_ms() - t0), have);
        } else if (what < 2) {
            e2e_kill9(coord);
            coord = e2e_start_coordinator(&g_t, NULL);
            kills_coord++;
        } else {
            int k = rand() % 2;
            e2e_kill9(workers[k]);
            snprintf(wid, sizeof wid, "chaos-w%d-%d", k, generation++);
            workers[k] = e2e_start_worker(&g_t, wid, wflags);
            kills_worker++;
        }
    }
    moeq_kafka_producer_flush(prod, 30000, err, sizeof err);
    moeq_kafka_producer_destroy(prod);
    int64_t t_done = moeq_now_ms();
    e2e_collect(&g_t, (size_t)n_jobs + 1, 2000); /* late duplicates */
    for (int k = 0; k < 2; k++) e2e_term(workers[k], 20000);
    e2e_term(coord, 20000);

    long long errors = 0;
    for (size_t i = 0; i < g_t.cap; i++)
        if (g_t.jobs[i].id[0] && strcmp(g_t.jobs[i].status, "ok")) errors++;
    print_message("chaos: %d jobs (seed %u) in %lld ms; %d worker and %d coordinator kill -9s, redis restarted %d; "
                  "%lld results for %zu ids: %lld duplicates (all identical: %s), %lld non-ok results\n",
                  n_jobs, seed, (long long)(t_done - t0), kills_worker, kills_coord, redis_restarted, g_t.results_seen,
                  g_t.n_jobs, g_t.duplicates, g_t.mismatches ? "NO" : "yes", errors);
    assert_int_equal(failed, 0);
    assert_int_equal(redis_restarted, 1);
    int missing = 0;
    for (int i = 0; i < n_jobs; i++) {
        char id[160];
        snprintf(id, sizeof id, "chaos-%s-%d", g_t.ns, i);
        e2e_job *j = e2e_job_find(&g_t, id);
        if (!j || !j->n_results) {
            if (missing++ < 10) fprintf(stderr, "chaos: no result for %s\n", id);
        }
    }
    assert_int_equal(missing, 0);
    assert_int_equal(g_t.mismatches, 0);
}

static int group_setup(void **state) {
    (void)state;
    int rc = e2e_open(&g_t, "wkchaos");
    if (rc == MOEQ_TEST_SKIP) exit(MOEQ_TEST_SKIP);
    return rc;
}

static int group_teardown(void **state) {
    (void)state;
    e2e_close(&g_t);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_job_has_a_result_and_duplicates_are_identical_through_kills_and_a_redis_restart),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
