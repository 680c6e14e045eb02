/*
 * test_worker_redis_bounded.c — Redis stays bounded: MOEQ_BOUNDED_JOBS
 * (default 5,000) short jobs go through a real `moeq coordinator` and two
 * `moeq worker` processes. First the coordinator alone enqueues them all
 * (what Redis holds per in-flight job: its share of a batch entry and its
 * record); then the workers run them. Once idle, the batch streams are empty
 * again (acknowledged entries are deleted; an entry an older worker
 * acknowledged without deleting it is trimmed), nothing is pending, every
 * job record has a TTL, the consumers of gone workers are forgotten, and
 * Redis's used_memory is back to where it started plus the retained records
 * (the dedupe window) — the per-job figures of
 * schemas/redis.md, measured and printed.
 *
 * It reads the server's global used_memory, so it runs alone (RUN_SERIAL).
 * Needs the `services` fixture (skips with 77 without it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_worker_e2e_harness.h"

static e2e g_t;
static moeq_redis *g_r;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : dflt;
}

static void on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    if (d->err) ++*(int *)opaque;
}

/* Jobs bounded-<i>, a prompt of 24 tokens each (job bytes ~200), 2 new tokens, acknowledged by the broker. */
static long long produce_jobs(int n_jobs) {
    long long bytes = 0;
    int failed = 0;
    char err[512];
    moeq_kafka_producer_params pp = {.brokers = g_t.kafka, .on_delivery = on_delivery, .cb_opaque = &failed};
    moeq_kafka_producer *p = NULL;
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &p, err, sizeof err), MOEQ_OK);
    for (int i = 0; i < n_jobs; i++) {
        char id[64], job[512];
        snprintf(id, sizeof id, "bounded-%d", i);
        int n = snprintf(job, sizeof job, "{\"v\":1,\"id\":\"%s\",\"tokens\":[", id);
        for (int k = 0; k < 24; k++) n += snprintf(job + n, sizeof job - (size_t)n, "%s%d", k ? "," : "", 3 + (i * 7 + k * 13) % 200);
        n += snprintf(job + n, sizeof job - (size_t)n, "],\"max_new_tokens\":2,\"temperature\":0,\"priority\":%d}", i % 4);
        moeq_kafka_out m = {.topic = g_t.jobs_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = id,
                            .key_len = strlen(id), .value = job, .value_len = (size_t)n};
        moeq_err e;
        while ((e = moeq_kafka_produce(p, &m, err, sizeof err)) == MOEQ_ERR_TRANSIENT) moeq_kafka_producer_poll(p, 10);
        assert_int_equal(e, MOEQ_OK);
        moeq_kafka_producer_poll(p, 0);
        bytes += n;
    }
    assert_int_equal(moeq_kafka_producer_flush(p, 60000, err, sizeof err), MOEQ_OK);
    moeq_kafka_producer_destroy(p);
    assert_int_equal(failed, 0);
    return bytes;
}

static moeq_redis_reply *redis_do(int argc, const char **argv) {
    moeq_redis_reply *rep = NULL;
    char err[512];
    moeq_err e = moeq_redis_command_argv(g_r, argc, argv, NULL, &rep, err, sizeof err);
    if (e) fprintf(stderr, "redis %s: %s\n", argv[0], err);
    assert_int_equal(e, MOEQ_OK);
    return rep;
}

static long long redis_int(int argc, const char **argv) {
    moeq_redis_reply *rep = redis_do(argc, argv);
    long long v = moeq_redis_reply_int(rep);
    moeq_redis_reply_free(rep);
    return v;
}

/* One numeric field of INFO memory (name with its colon). */
static long long info_memory(const char *field) {
    const char *argv[] = {"INFO", "memory"};
    moeq_redis_reply *rep = redis_do(2, argv);
    const char *s = moeq_redis_reply_str(rep, NULL), *f = s ? strstr(s, field) : NULL;
    long long v = f ? atoll(f + strlen(field)) : -1;
    moeq_redis_reply_free(rep);
    return v;
}

/* used_memory, after a moment for lazy frees; the breakdown goes to the test's output. */
static long long used_memory(const char *when) {
    usleep(300000);
    print_message("bounded: %s: used_memory %lld = dataset %lld + overhead %lld (clients %lld, aof buffer %lld, "
                  "scripts %lld)\n", when, info_memory("\nused_memory:"), info_memory("used_memory_dataset:"),
                  info_memory("used_memory_overhead:"), info_memory("mem_clients_normal:"),
                  info_memory("mem_aof_buffer:"), info_memory("used_memory_scripts:"));
    return info_memory("\nused_memory:");
}

static long long memory_usage(const char *key) {
    const char *argv[] = {"MEMORY", "USAGE", key, "SAMPLES", "0"};
    return redis_int(5, argv);
}

static void stream_key(int p, char *out, size_t size) { snprintf(out, size, "%s:batches:p%d", g_t.ns, p); }

typedef struct footprint {
    long long streams, stream_entries, pending, records, record_bytes, no_ttl;
} footprint;

/* What our prefix holds: the four batch streams and every job record (SCAN <prefix>:job:*). */
static footprint measure(void) {
    footprint f = {0};
    for (int p = 0; p < 4; p++) {
        char key[256];
        stream_key(p, key, sizeof key);
        f.streams += memory_usage(key);
        const char *xlen[] = {"XLEN", key};
        f.stream_entries += redis_int(2, xlen);
        const char *xp[] = {"XPENDING", key, "workers"};
        moeq_redis_reply *rep = redis_do(3, xp);
        f.pending += moeq_redis_reply_int(moeq_redis_reply_at(rep, 0));
        moeq_redis_reply_free(rep);
    }
    char match[256], cursor[32] = "0";
    snprintf(match, sizeof match, "%s:job:*", g_t.ns);
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", match, "COUNT", "1000"};
        moeq_redis_reply *rep = redis_do(6, argv);
        snprintf(cursor, sizeof cursor, "%s", moeq_redis_reply_str(moeq_redis_reply_at(rep, 0), NULL));
        const moeq_redis_reply *keys = moeq_redis_reply_at(rep, 1);
        for (size_t i = 0; i < moeq_redis_reply_len(keys); i++) {
            const char *key = moeq_redis_reply_str(moeq_redis_reply_at(keys, i), NULL);
            const char *ttl[] = {"TTL", key};
            f.records++;
            f.record_bytes += memory_usage(key);
            f.no_ttl += redis_int(2, ttl) < 0;
        }
        moeq_redis_reply_free(rep);
    } while (strcmp(cursor, "0"));
    return f;
}

/*
 * What an older worker leaves: an entry it acknowledged without deleting it, and its consumer (worker_id
 * host-pid: a fresh one per restart) with nothing pending.
 */
static void leave_leftovers(void) {
    char key[256];
    stream_key(3, key, sizeof key);
    const char *create[] = {"XGROUP", "CREATE", key, "workers", "0", "MKSTREAM"};
    moeq_redis_reply *rep = NULL;
    char err[256];
    moeq_redis_command_argv(g_r, 6, create, NULL, &rep, err, sizeof err); /* BUSYGROUP is fine */
    moeq_redis_reply_free(rep);
    const char *xadd[] = {"XADD", key, "*", "v", "0"};
    moeq_redis_reply_free(redis_do(5, xadd));
    const char *read[] = {"XREADGROUP", "GROUP", "workers", "old-w", "COUNT", "1", "STREAMS", key, ">"};
    rep = redis_do(9, read);
    const char *id = moeq_redis_reply_str(
        moeq_redis_reply_at(moeq_redis_reply_at(moeq_redis_reply_at(moeq_redis_reply_at(rep, 0), 1), 0), 0), NULL);
    assert_non_null(id);
    const char *ack[] = {"XACK", key, "workers", id};
    assert_int_equal(redis_int(4, ack), 1);
    moeq_redis_reply_free(rep);
}

/* Consumers of the group on stream p. */
static long long consumers(int p) {
    char key[256];
    stream_key(p, key, sizeof key);
    const char *argv[] = {"XINFO", "CONSUMERS", key, "workers"};
    moeq_redis_reply *rep = redis_do(4, argv);
    long long n = (long long)moeq_redis_reply_len(rep);
    moeq_redis_reply_free(rep);
    return n;
}

static void redis_stays_bounded_acknowledged_batch_entries_are_trimmed(void **state) {
    (void)state;
    int n_jobs = env_int("MOEQ_BOUNDED_JOBS", 5000);
    long long mem0 = used_memory("start");
    leave_leftovers();
    int64_t t0 = moeq_now_ms();
    pid_t coord = e2e_start_coordinator(&g_t, NULL);
    long long job_bytes = produce_jobs(n_jobs);
    footprint queued = {0};
    for (int t = 0; t < 1200 && queued.records < n_jobs; t++) {
        usleep(100000);
        queued = measure();
    }
    assert_int_equal(queued.records, n_jobs);
    long long mem_queued = used_memory("queued");
    pid_t w1 = e2e_start_worker(&g_t, "bounded-w1", NULL), w2 = e2e_start_worker(&g_t, "bounded-w2", NULL);
    size_t have = e2e_collect(&g_t, (size_t)n_jobs, 150000);
    int64_t t_done = moeq_now_ms();
    e2e_collect(&g_t, (size_t)n_jobs + 1, 1000);
    assert_int_equal(e2e_term(w1, 20000), 0);
    assert_int_equal(e2e_term(w2, 20000), 0);
    e2e_term(coord, 20000);
    /* a worker with a short visibility timeout forgets consumers idle for 10 of them with nothing pending */
    pid_t w3 = e2e_start_worker(&g_t, "bounded-w3", "--visibility_timeout_ms=1000 --heartbeat_interval_ms=300");
    for (int t = 0; t < 300 && consumers(3) > 1; t++) usleep(100000);
    long long consumers_left = consumers(3);
    assert_int_equal(e2e_term(w3, 20000), 0);
    footprint idle = measure();
    long long mem1 = used_memory("idle");
    print_message("bounded: %zu of %d results in %lld ms, %lld duplicates; jobs of %.0f B and 24 prompt tokens\n", have,
                  n_jobs, (long long)(t_done - t0), g_t.duplicates, (double)job_bytes / n_jobs);
    print_message("bounded: queued: %lld stream entries, streams %lld B (%.0f B/job), records %lld B (%.0f B/job); "
                  "used_memory +%lld B (%.0f B/job)\n", queued.stream_entries, queued.streams,
                  (double)queued.streams / n_jobs, queued.record_bytes, (double)queued.record_bytes / n_jobs,
                  mem_queued - mem0, (double)(mem_queued - mem0) / n_jobs);
    print_message("bounded: idle: %lld stream entries, %lld pending, streams %lld B; %lld records %lld B "
                  "(%.0f B/job), %lld without a TTL; used_memory %+lld B from the start (%.0f B/job)\n",
                  idle.stream_entries, idle.pending, idle.streams, idle.records, idle.record_bytes,
                  (double)idle.record_bytes / n_jobs, idle.no_ttl, mem1 - mem0, (double)(mem1 - mem0) / n_jobs);
    print_message("bounded: consumers on p3 after the sweep: %lld (old-w, bounded-w1 and -w2 forgotten)\n",
                  consumers_left);
    assert_int_equal(have, (size_t)n_jobs);
    assert_int_equal(consumers_left, 1);
    assert_int_equal(idle.stream_entries, 0);
    assert_int_equal(idle.pending, 0);
    assert_int_equal(idle.records, n_jobs);
    assert_int_equal(idle.no_ttl, 0);
    assert_true(idle.streams < 4 * 4096); /* four empty streams with their group and consumers */
    /* back to the start plus what the dedupe window keeps: the records and their keyspace entries (dict and
     * expires tables), measured at about 1.6 x the records' MEMORY USAGE; unbounded streams would add
     * queued.streams on top */
    assert_true(mem1 - mem0 < 2 * idle.record_bytes);
}

static int group_setup(void **state) {
    (void)state;
    int rc = e2e_open(&g_t, "wkbounded");
    if (rc == MOEQ_TEST_SKIP) exit(MOEQ_TEST_SKIP);
    if (rc) return -1;
    moeq_redis_params rp;
    char err[512];
    if (moeq_redis_params_parse(g_t.redis, NULL, &rp, err, sizeof err) || moeq_redis_new(&rp, &g_r, err, sizeof err))
        return -1;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    moeq_redis_destroy(g_r);
    e2e_close(&g_t);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(redis_stays_bounded_acknowledged_batch_entries_are_trimmed),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
