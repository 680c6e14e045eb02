/*
 * test_worker_acks.c — the worker's side of a batch's lifetime in Redis,
 * through a real `moeq coordinator` and `moeq worker`:
 *
 * - an acknowledgement that Redis did not take (the connection drops right
 *   when the record updates + XACK are sent: tests/redis_proxy.h) is retried
 *   until it is taken; no batch runs twice, no record stays `running`, and
 *   nothing stays pending;
 * - a worker restarted with the same worker_id takes the entries still
 *   pending for its consumer name at once (not after visibility_timeout_ms),
 *   and an entry delivered too often is still dead-lettered;
 * - a batch that runs longer than visibility_timeout_ms stays with its live
 *   worker (each heartbeat resets the idle time of what it holds).
 *
 * Needs the `services` fixture (skips with 77 without it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "redis_proxy.h"
#include "test_worker_e2e_harness.h"

static e2e g_t;

static void on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    if (d->err) ++*(int *)opaque;
}

static void produce_jobs_of(const char *tag, int from, int to, int priority, int max_new_tokens, int min_tokens);

/* Jobs <tag>-<i> for i in [from, to) at one priority, acknowledged by the broker. */
static void produce_jobs(const char *tag, int from, int to, int priority) {
    produce_jobs_of(tag, from, to, priority, 4, 0);
}

/* The same, with max_new_tokens and min_tokens (long jobs). */
static void produce_jobs_of(const char *tag, int from, int to, int priority, int max_new_tokens, int min_tokens) {
    int failed = 0;
    char err[512];
    moeq_kafka_producer_params pp = {.brokers = g_t.kafka, .on_delivery = on_delivery, .cb_opaque = &failed};
    moeq_kafka_producer *p = NULL;
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &p, err, sizeof err), MOEQ_OK);
    for (int i = from; i < to; i++) {
        char id[64], job[256];
        snprintf(id, sizeof id, "%s-%d", tag, i);
        int n = snprintf(job, sizeof job,
                         "{\"v\":1,\"id\":\"%s\",\"tokens\":[%d,%d,%d],\"max_new_tokens\":%d,\"min_tokens\":%d,"
                         "\"temperature\":0,\"priority\":%d}", id, 3 + i % 50, 7 + i % 31, 11 + i % 17, max_new_tokens,
                         min_tokens, priority);
        moeq_kafka_out m = {.topic = g_t.jobs_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = id,
                            .key_len = strlen(id), .value = job, .value_len = (size_t)n};
        assert_int_equal(moeq_kafka_produce(p, &m, err, sizeof err), MOEQ_OK);
    }
    assert_int_equal(moeq_kafka_producer_flush(p, 30000, err, sizeof err), MOEQ_OK);
    moeq_kafka_producer_destroy(p);
    assert_int_equal(failed, 0);
}

static moeq_redis *redis_open(void) {
    moeq_redis_params rp;
    moeq_redis *r = NULL;
    char err[512];
    assert_int_equal(moeq_redis_params_parse(g_t.redis, NULL, &rp, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&rp, &r, err, sizeof err), MOEQ_OK);
    return r;
}

static moeq_redis_reply *redis_do(moeq_redis *r, int argc, const char **argv) {
    moeq_redis_reply *rep = NULL;
    char err[512];
    moeq_err e = moeq_redis_command_argv(r, argc, argv, NULL, &rep, err, sizeof err);
    if (e) fprintf(stderr, "redis %s: %s\n", argv[0], err);
    assert_int_equal(e, MOEQ_OK);
    return rep;
}

static void stream_key(int p, char *out, size_t size) { snprintf(out, size, "%s:batches:p%d", g_t.ns, p); }

/* Entries pending in the group `workers`, over the four streams. */
static long long pending_total(moeq_redis *r) {
    long long n = 0;
    for (int p = 0; p < 4; p++) {
        char key[256];
        stream_key(p, key, sizeof key);
        const char *argv[] = {"XPENDING", key, "workers"};
        moeq_redis_reply *rep = redis_do(r, 3, argv);
        n += moeq_redis_reply_int(moeq_redis_reply_at(rep, 0));
        moeq_redis_reply_free(rep);
    }
    return n;
}

/* How many of jobs <tag>-[0, n) have a record in state `state`. */
static int records_in_state(moeq_redis *r, const char *tag, int n, const char *state) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        char key[256];
        snprintf(key, sizeof key, "%s:job:%s-%d", g_t.ns, tag, i);
        const char *argv[] = {"HGET", key, "state"};
        moeq_redis_reply *rep = redis_do(r, 3, argv);
        const char *s = moeq_redis_reply_str(rep, NULL);
        k += s && !strcmp(s, state);
        moeq_redis_reply_free(rep);
    }
    return k;
}

/* A worker whose Redis is 127.0.0.1:redis_port rather than the fixture's. */
static pid_t start_worker_via(int redis_port, const char *worker_id, const char *flags) {
    e2e t = g_t;
    snprintf(t.redis, sizeof t.redis, "127.0.0.1:%d", redis_port);
    return e2e_start_worker(&t, worker_id, flags);
}

#define ACK_JOBS 24
#define ACK_VISIBILITY_MS 3000

static void a_failed_xack_is_retried_and_no_batch_runs_twice(void **state) {
    (void)state;
    const char *port = strrchr(g_t.redis, ':');
    assert_non_null(port);
    redis_proxy proxy;
    assert_int_equal(redis_proxy_start(&proxy, atoi(port + 1), 800), 0);
    atomic_store(&proxy.cuts_left, 3); /* the first three acknowledgements: dropped, Redis away 0.8 s each */
    char flags[256];
    snprintf(flags, sizeof flags, "--visibility_timeout_ms=%d --heartbeat_interval_ms=500 --max_batches_held=2",
             ACK_VISIBILITY_MS);
    pid_t coord = e2e_start_coordinator(&g_t, "--max_batch_jobs=4"); /* six batches */
    pid_t w = start_worker_via(proxy.port, "ack-w1", flags);
    produce_jobs("ack", 0, ACK_JOBS, 1);
    moeq_redis *r = redis_open();
    size_t have = 0;
    long long most_pending = 0; /* a batch waiting for its acknowledgement keeps its place in max_batches_held */
    for (int64_t until = moeq_now_ms() + 90000; have < ACK_JOBS && moeq_now_ms() < until;) {
        have = e2e_collect(&g_t, ACK_JOBS, 100);
        long long p = pending_total(r);
        if (p > most_pending) most_pending = p;
    }
    /* a batch whose acknowledgement was lost would be reclaimed after the visibility timeout and run again */
    e2e_collect(&g_t, ACK_JOBS + 1, 3 * ACK_VISIBILITY_MS);
    long long pending = pending_total(r);
    int done = records_in_state(r, "ack", ACK_JOBS, "done"), running = records_in_state(r, "ack", ACK_JOBS, "running");
    moeq_redis_destroy(r);
    assert_int_equal(e2e_term(w, 20000), 0);
    e2e_term(coord, 20000);
    redis_proxy_stop(&proxy);
    print_message("acks: %zu of %d results, %lld duplicates, %d acknowledgements dropped; records done %d, "
                  "running %d; %lld entries pending (at most %lld during the run)\n", have, ACK_JOBS, g_t.duplicates,
                  atomic_load(&proxy.cuts_done), done, running, pending, most_pending);
    assert_true(atomic_load(&proxy.cuts_done) >= 1);
    assert_int_equal(have, ACK_JOBS);
    assert_int_equal(g_t.duplicates, 0);
    assert_int_equal(running, 0);
    assert_int_equal(done, ACK_JOBS);
    assert_int_equal(pending, 0);
    assert_true(most_pending <= 2);
}

/* Wait until the coordinator wrote entries holding n jobs to stream p (XLEN > 0 and every job record exists). */
static void wait_enqueued(moeq_redis *r, const char *tag, int from, int to) {
    for (int t = 0; t < 600; t++) {
        int k = 0;
        for (int i = from; i < to; i++) {
            char key[256];
            snprintf(key, sizeof key, "%s:job:%s-%d", g_t.ns, tag, i);
            const char *argv[] = {"EXISTS", key};
            moeq_redis_reply *rep = redis_do(r, 2, argv);
            k += moeq_redis_reply_int(rep) == 1;
            moeq_redis_reply_free(rep);
        }
        if (k == to - from) return;
        usleep(100000);
    }
    fail_msg("jobs %s-[%d, %d) were not enqueued", tag, from, to);
}

/* Read every new entry of stream p as consumer `consumer` (a worker that then dies); returns how many. */
static int take_as(moeq_redis *r, int p, const char *consumer, char ids[][48], int cap) {
    char key[256];
    stream_key(p, key, sizeof key);
    const char *argv[] = {"XREADGROUP", "GROUP", "workers", consumer, "COUNT", "100", "STREAMS", key, ">"};
    moeq_redis_reply *rep = redis_do(r, 9, argv);
    const moeq_redis_reply *entries = moeq_redis_reply_at(moeq_redis_reply_at(rep, 0), 1);
    int n = 0;
    for (size_t i = 0; i < moeq_redis_reply_len(entries) && n < cap; i++)
        snprintf(ids[n++], 48, "%s", moeq_redis_reply_str(moeq_redis_reply_at(moeq_redis_reply_at(entries, i), 0), NULL));
    moeq_redis_reply_free(rep);
    return n;
}

#define OWN_JOBS 6
#define POISON_JOBS 3

static void a_restarted_worker_with_the_same_id_takes_its_pending_batches_at_once(void **state) {
    (void)state;
    for (size_t i = 0; i < g_t.cap; i++) free(g_t.jobs[i].tokens);
    memset(g_t.jobs, 0, g_t.cap * sizeof *g_t.jobs), g_t.n_jobs = 0, g_t.duplicates = 0;
    pid_t coord = e2e_start_coordinator(&g_t, NULL);
    moeq_redis *r = redis_open();
    /* a worker `own-w` took these batches and died (kill -9: nothing acknowledged, nothing handed back) */
    produce_jobs("own", 0, OWN_JOBS, 1);
    wait_enqueued(r, "own", 0, OWN_JOBS);
    char ids[16][48];
    assert_true(take_as(r, 1, "own-w", ids, 16) >= 1);
    /* ... and these were delivered 30 times already: poison, whoever takes them must dead-letter them */
    produce_jobs("poison", 0, POISON_JOBS, 2);
    wait_enqueued(r, "poison", 0, POISON_JOBS);
    int n_poison = take_as(r, 2, "own-w", ids, 16);
    assert_true(n_poison >= 1);
    char key[256];
    stream_key(2, key, sizeof key);
    for (int i = 0; i < n_poison; i++) {
        const char *argv[] = {"XCLAIM", key, "workers", "own-w", "0", ids[i], "RETRYCOUNT", "30", "JUSTID"};
        moeq_redis_reply_free(redis_do(r, 9, argv));
    }
    /* the same id comes back; the visibility timeout (60 s) is far longer than the test waits */
    int64_t t0 = moeq_now_ms();
    pid_t w = e2e_start_worker(&g_t, "own-w", "--visibility_timeout_ms=60000 --max_deliveries=5");
    size_t have = e2e_collect(&g_t, OWN_JOBS + POISON_JOBS, 30000);
    int64_t took = moeq_now_ms() - t0;
    e2e_collect(&g_t, OWN_JOBS + POISON_JOBS + 1, 1000);
    int ok = 0, dead = 0;
    for (int i = 0; i < OWN_JOBS; i++) {
        char id[64];
        snprintf(id, sizeof id, "own-%d", i);
        e2e_job *j = e2e_job_find(&g_t, id);
        ok += j && j->n_results && !strcmp(j->status, "ok");
    }
    for (int i = 0; i < POISON_JOBS; i++) {
        char id[64];
        snprintf(id, sizeof id, "poison-%d", i);
        e2e_job *j = e2e_job_find(&g_t, id);
        dead += j && j->n_results && !strcmp(j->status, "error");
    }
    /* a batch is acknowledged once the broker has its results: a result may be read a moment before that */
    long long pending = pending_total(r);
    for (int64_t until = moeq_now_ms() + 10000; pending > 0 && moeq_now_ms() < until; pending = pending_total(r))
        usleep(50000);
    moeq_redis_destroy(r);
    assert_int_equal(e2e_term(w, 20000), 0);
    e2e_term(coord, 20000);
    print_message("restart: %zu of %d results in %lld ms (visibility timeout 60000 ms); %d ok, %d dead-lettered; "
                  "%lld pending\n", have, OWN_JOBS + POISON_JOBS, (long long)took, ok, dead, pending);
    assert_int_equal(have, OWN_JOBS + POISON_JOBS);
    assert_int_equal(ok, OWN_JOBS);
    assert_int_equal(dead, POISON_JOBS);
    assert_int_equal(g_t.duplicates, 0);
    assert_int_equal(pending, 0);
}

/*
 * Batches that run longer than visibility_timeout_ms stay with the live worker running them: each heartbeat
 * resets the idle time of what it holds (and it owns), so the other worker's reclaim never takes them and no job
 * runs twice. Before, a batch longer than the timeout was taken over while it ran (a CI run saw it in
 * test_worker_group: both ranks answered one batch).
 */
static void a_batch_longer_than_the_visibility_timeout_stays_with_its_worker(void **state) {
    (void)state;
    enum { N = 192 };
    for (size_t i = 0; i < g_t.cap; i++) free(g_t.jobs[i].tokens);
    memset(g_t.jobs, 0, g_t.cap * sizeof *g_t.jobs), g_t.n_jobs = 0, g_t.duplicates = 0;
    pid_t coord = e2e_start_coordinator(&g_t, "--max_batch_jobs=192"); /* one batch: ~40,000 tokens */
    /* one sequence at a time and 200 tokens a job: a batch takes seconds; the timeout is 1 s (the least allowed) */
    const char *flags = "--max_seqs=1 --visibility_timeout_ms=1000 --heartbeat_interval_ms=200";
    pid_t w1 = e2e_start_worker(&g_t, "long-w1", flags), w2 = e2e_start_worker(&g_t, "long-w2", flags);
    produce_jobs_of("long", 0, N, 2, 200, 200);
    /* while they run, the idle time of every pending entry (XPENDING's extended form) stays below the timeout */
    moeq_redis *r = redis_open();
    size_t have = 0;
    long long max_idle = 0;
    for (int64_t until = moeq_now_ms() + 120000; have < N && moeq_now_ms() < until;) {
        have = e2e_collect(&g_t, N, 100);
        for (int pr = 0; pr < 4; pr++) {
            char key[256];
            stream_key(pr, key, sizeof key);
            const char *argv[] = {"XPENDING", key, "workers", "-", "+", "16"};
            moeq_redis_reply *rep = redis_do(r, 6, argv);
            for (size_t e = 0; e < moeq_redis_reply_len(rep); e++) {
                long long idle = moeq_redis_reply_int(moeq_redis_reply_at(moeq_redis_reply_at(rep, e), 2));
                if (idle > max_idle) max_idle = idle;
            }
            moeq_redis_reply_free(rep);
        }
    }
    moeq_redis_destroy(r);
    e2e_collect(&g_t, N + 1, 1500); /* late duplicates */
    assert_int_equal(e2e_term(w1, 20000), 0);
    assert_int_equal(e2e_term(w2, 20000), 0);
    e2e_term(coord, 20000);
    /* the longest batch, from the workers' batch_acked lines: it must have outlasted the timeout */
    char cmd[2560]; /* four log paths of up to 512 + 160 bytes */
    snprintf(cmd, sizeof cmd, "grep -ho 'event=batch_acked .* ms=[0-9]*' '%s/%s-long-w1.log' '%s/%s-long-w2.log' "
                              "| sed 's/.* ms=//' | sort -n | tail -1", g_t.logdir, g_t.ns, g_t.logdir, g_t.ns);
    FILE *f = popen(cmd, "r");
    long longest = 0;
    if (f && fscanf(f, "%ld", &longest) != 1) longest = 0;
    if (f) pclose(f);
    snprintf(cmd, sizeof cmd, "grep -q 'reclaimed=1\\|batch_reclaimed_by_another' '%s/%s-long-w1.log' "
                              "'%s/%s-long-w2.log'", g_t.logdir, g_t.ns, g_t.logdir, g_t.ns);
    int reclaimed = system(cmd) == 0;
    print_message("long batches: %zu of %d results, the longest batch %ld ms (visibility timeout 1000 ms), the "
                  "most idle a pending entry was %lld ms, %lld duplicates, reclaimed: %s\n", have, N, longest, max_idle,
                  g_t.duplicates, reclaimed ? "yes" : "no");
    assert_int_equal(have, N);
    assert_true(longest > 2000);
    assert_true(max_idle < 1000);
    assert_false(reclaimed);
    assert_int_equal(g_t.duplicates, 0);
}

static int group_setup(void **state) {
    (void)state;
    int rc = e2e_open(&g_t, "wkacks");
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
        cmocka_unit_test(a_failed_xack_is_retried_and_no_batch_runs_twice),
        cmocka_unit_test(a_restarted_worker_with_the_same_id_takes_its_pending_batches_at_once),
        cmocka_unit_test(a_batch_longer_than_the_visibility_timeout_stays_with_its_worker),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
