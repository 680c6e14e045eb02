/*
 * test_coordinator_e2e.c — `moeq coordinator` against the real broker and
 * redis-server of the `services` fixture: mixed jobs become batches that obey
 * every bound, invalid jobs are dead-lettered with reasons and answered with
 * error results, expired jobs are answered `expired`, cancelled jobs never
 * reach a batch.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "metrics_lint.h"
#include "coordinator_harness.h"
#include "moeq/result.h"

#define MAX_WAIT_MS 100
#define POLL_MS 10
#define MAX_JOBS 16
#define MAX_TOKENS 4096
#define JITTER_MS 200

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A `tokens` job: group >= 0 shares an 80-token instruction prefix. */
static size_t make_job(char *out, size_t cap, int i, int priority, int len, int max_new, int group) {
    size_t o = (size_t)snprintf(out, cap, "{\"v\":1,\"id\":\"job-%d\",\"priority\":%d,\"max_new_tokens\":%d,\"tokens\":[",
                                i, priority, max_new);
    for (int k = 0; k < len && o + 16 < cap; k++)
        o += (size_t)snprintf(out + o, cap - o, "%s%d", k ? "," : "", group >= 0 && k < 80 ? 1000 * group + k : (int)(rnd() % 30000));
    o += (size_t)snprintf(out + o, cap - o, "]}");
    return o;
}

static void mixed_jobs_become_batches_that_obey_every_bound(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_mixed");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    enum { N = 800 };
    char *buf = malloc(16384);
    static int prio[N];
    for (int i = 0; i < N; i++) {
        prio[i] = (int)(rnd() % 4);
        int group = rnd() % 3 == 0 ? (int)(rnd() % 3) : -1;
        int len = 20 + (int)(rnd() % 600);
        if (group >= 0 && len < 100) len = 100;
        size_t n = make_job(buf, 16384, i, prio[i], len, 1 + (int)(rnd() % 256), group);
        char key[32];
        snprintf(key, sizeof key, "job-%d", i);
        h_produce(&h, h.jobs_topic, key, buf, n);
        if (i % 100 == 0) moeq_kafka_producer_poll(h.producer, 0);
    }
    assert_int_equal(h_flush(&h), 0);
    char mw[64], pi[64], mj[64], mt[64];
    snprintf(mw, sizeof mw, "--max_wait_ms=%d", MAX_WAIT_MS);
    snprintf(pi, sizeof pi, "--poll_interval_ms=%d", POLL_MS);
    snprintf(mj, sizeof mj, "--max_batch_jobs=%d", MAX_JOBS);
    snprintf(mt, sizeof mt, "--max_batch_tokens=%d", MAX_TOKENS);
    int port = h_free_port();
    char hp[32];
    snprintf(hp, sizeof hp, "--http_port=%d", port);
    const char *extra[] = {mw, pi, mj, mt, "--aging_ms=0", "--kafka.topic.metadata.refresh.interval.ms=500", hp, NULL};
    pid_t pid = h_start(&h, extra);
    h_walk w = {0};
    int64_t end = moeq_now_ms() + 45000;
    while (moeq_now_ms() < end) {
        h_read_batches(&h, &w);
        if (w.n_jobs >= N) break;
        h_sleep_ms(200);
    }
    /* /healthz and /metrics while it runs (the counters are published once per tick) */
    static char page[65536];
    assert_true(h_http_get(port, "/healthz", page, sizeof page) > 0);
    assert_non_null(strstr(page, "200 OK"));
    h_sleep_ms(100);
    assert_true(h_http_get(port, "/metrics", page, sizeof page) > 0);
    char line[128];
    snprintf(line, sizeof line, "moeq_coordinator_batch_jobs_total %d", N);
    assert_non_null(strstr(page, line));
    assert_non_null(strstr(page, "moeq_coordinator_bucket_waste_ratio"));
    assert_non_null(strstr(page, "moeq_coordinator_queue_wait_seconds_count"));
    const char *body = strstr(page, "\r\n\r\n"); /* a running coordinator's page: the conventions, all documented */
    char why[512];
    assert_non_null(body);
    if (moeq_test_metrics_lint(body + 4, why, sizeof why)) fail_msg("%s", why);
    if (moeq_test_metrics_documented(body + 4, why, sizeof why)) fail_msg("%s", why);
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(h_read_batches(&h, &w), 0);
    assert_int_equal(w.n_jobs, N);
    qsort(w.jobs, w.n_jobs, sizeof(*w.jobs), h_cmp_id);
    for (size_t i = 1; i < w.n_jobs; i++)
        if (!strcmp(w.jobs[i].id, w.jobs[i - 1].id)) fail_msg("job %s is in two batches", w.jobs[i].id);
    int64_t worst_wait = 0;
    for (size_t i = 0; i < w.n_jobs; i++) {
        h_job *j = &w.jobs[i];
        assert_int_equal(j->stream, j->priority); /* aging off: the requested class */
        int64_t wait = j->closed_ms - j->arrival_ms;
        if (wait > worst_wait) worst_wait = wait;
    }
    size_t multi = 0, keyed = 0;
    for (size_t b = 0; b < w.n_batches; b++) {
        h_batch *x = &w.batches[b];
        assert_true(x->n >= 1 && x->n <= MAX_JOBS);
        assert_true(x->pkey == x->want_pkey); /* the prefix key names the batch's shared prefix */
        keyed += x->pkey != 0;
        assert_true(x->budget <= MAX_TOKENS);
        double allow = 0.1 * x->min_len > 8 ? 0.1 * x->min_len : 8;
        assert_true((double)(x->max_len - x->min_len) <= 2 * allow + 1e-9);
        multi += x->n > 1;
    }
    print_message("%zu jobs in %zu batches (%zu with several jobs); longest wait %lld ms\n", w.n_jobs, w.n_batches,
                  multi, (long long)worst_wait);
    /* The batcher closes on time (its property test proves max_wait + one poll interval
     * with an exact clock); end to end a close can also wait for one pipelined Redis
     * write (one fsync) and for the CPU on a loaded machine: JITTER_MS allows for that. */
    assert_true(worst_wait <= MAX_WAIT_MS + POLL_MS + JITTER_MS);
    assert_true(multi > 0);
    assert_true(keyed > 0); /* the prefix groups' batches carry a key */
    /* every job has its record, pointing at a batch */
    for (size_t i = 0; i < w.n_jobs; i += 7) {
        char key[160], err[256];
        snprintf(key, sizeof key, "%s:job:%s", h.prefix, w.jobs[i].id);
        const char *argv[] = {"HGET", key, "state"};
        moeq_redis_reply *r = NULL;
        assert_int_equal(moeq_redis_command_argv(h.redis, 3, argv, NULL, &r, err, sizeof err), MOEQ_OK);
        assert_string_equal(moeq_redis_reply_str(r, NULL), "batched");
        moeq_redis_reply_free(r);
    }
    /* a restart after a clean stop re-reads nothing: offsets were committed */
    pid = h_start(&h, extra);
    h_sleep_ms(4000);
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(h_read_batches(&h, &w), 0);
    assert_int_equal(w.n_jobs, N);
    free(w.jobs);
    free(w.batches);
    free(buf);
    h_destroy(&h);
}

static void invalid_jobs_are_dead_lettered_with_reasons_and_answered(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_invalid");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    struct {
        const char *key, *value, *code; /* code NULL: not dead-lettered */
        int result;                     /* 1: an error/expired result is expected */
    } cases[] = {
        {"m", "{\"v\":1,\"id\":", "malformed", 0},
        {"n", "[1,2,3]", "malformed", 0}, /* sniffed: neither a JSON object nor a msgpack map */
        {"v2", "{\"v\":2,\"id\":\"v2\",\"prompt\":\"x\"}", "unsupported_version", 1},
        {"mf", "{\"v\":1,\"prompt\":\"x\"}", "missing_field", 0},
        {"wt", "{\"v\":1,\"id\":\"wt\",\"prompt\":7}", "wrong_type", 1},
        {"or", "{\"v\":1,\"id\":\"or\",\"prompt\":\"x\",\"temperature\":9}", "out_of_range", 1},
        {"ci", "{\"v\":1,\"id\":\"ci\",\"prompt\":\"x\",\"tokens\":[1]}", "conflicting_input", 1},
        {"dk", "{\"v\":1,\"id\":\"dk\",\"id\":\"dk\",\"prompt\":\"x\"}", "duplicate_key", 0},
        {"rt", "{\"v\":1,\"id\":\"rt\",\"prompt\":\"x\",\"reply_to\":\"not.allowed\"}", "reply_to_not_allowed", 1},
        {"tl", "{\"v\":1,\"id\":\"tl\",\"tokens\":[1,2,3],\"max_new_tokens\":4000}", "too_large", 1},
        {"ex", "{\"v\":1,\"id\":\"ex\",\"prompt\":\"x\",\"deadline_ms\":1}", NULL, 1},
        {"ok", "{\"v\":1,\"id\":\"ok\",\"tokens\":[1,2,3],\"max_new_tokens\":8}", NULL, 0},
    };
    size_t n_cases = sizeof cases / sizeof cases[0], want_dlq = 0, want_results = 0;
    for (size_t i = 0; i < n_cases; i++) {
        h_produce(&h, h.jobs_topic, cases[i].key, cases[i].value, strlen(cases[i].value));
        want_dlq += cases[i].code != NULL;
        want_results += cases[i].result;
    }
    assert_int_equal(h_flush(&h), 0);
    const char *extra[] = {"--max_batch_tokens=1000", "--max_wait_ms=20", "--kafka.topic.metadata.refresh.interval.ms=500", NULL};
    pid_t pid = h_start(&h, extra);
    static h_msg dlq[32], res[32];
    size_t n_dlq = h_collect(&h, h.dlq_topic, want_dlq, 40000, dlq);
    size_t n_res = h_collect(&h, h.results_topic, want_results, 20000, res);
    h_walk w = {0};
    int64_t end = moeq_now_ms() + 10000;
    while (moeq_now_ms() < end && (h_read_batches(&h, &w), w.n_jobs < 1)) h_sleep_ms(100);
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(n_dlq, want_dlq);
    for (size_t i = 0; i < n_cases; i++) {
        if (!cases[i].code) continue;
        int found = 0;
        for (size_t k = 0; k < n_dlq; k++)
            if (!strcmp(dlq[k].key, cases[i].key)) {
                found = 1;
                assert_string_equal(dlq[k].code, cases[i].code);
                assert_string_equal(dlq[k].value, cases[i].value); /* the original bytes */
            }
        if (!found) fail_msg("no dead letter for %s", cases[i].key);
    }
    assert_int_equal(n_res, want_results);
    for (size_t k = 0; k < n_res; k++) {
        moeq_result r;
        char err[256];
        assert_int_equal(moeq_result_decode(res[k].value, res[k].len, NULL, 0, &r, err, sizeof err), MOEQ_OK);
        if (!strcmp(r.id, "ex")) assert_int_equal(r.status, MOEQ_RESULT_EXPIRED);
        else assert_int_equal(r.status, MOEQ_RESULT_ERROR);
        moeq_result_free(&r);
    }
    assert_int_equal(w.n_jobs, 1); /* only the valid one was batched */
    assert_string_equal(w.jobs[0].id, "ok");
    for (size_t k = 0; k < n_dlq; k++) free(dlq[k].value);
    for (size_t k = 0; k < n_res; k++) free(res[k].value);
    free(w.jobs);
    free(w.batches);
    h_destroy(&h);
}

/*
 * A job topic that a producer creates after the coordinator started, while another subscribed topic (the cancel
 * topic) already has partitions: the coordinator reads it within seconds (no refresh override here; librdkafka's
 * own default refreshed the subscription's metadata only every 5 minutes).
 */
static void a_job_topic_created_after_start_up_is_read_within_seconds(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_late_topic");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    h_produce(&h, h.cancel_topic, "nobody", "nobody", 6); /* the cancel topic exists before start-up */
    assert_int_equal(h_flush(&h), 0);
    const char *extra[] = {"--max_wait_ms=20", NULL};
    pid_t pid = h_start(&h, extra);
    h_sleep_ms(3000); /* subscribed, the cancel topic's partition assigned, the job topic still missing */
    const char *job = "{\"v\":1,\"id\":\"late\",\"tokens\":[1,2,3]}";
    int64_t t0 = moeq_now_ms();
    h_produce(&h, h.jobs_topic, "late", job, strlen(job));
    assert_int_equal(h_flush(&h), 0);
    h_walk w = {0};
    int64_t end = t0 + 30000;
    while (moeq_now_ms() < end && (h_read_batches(&h, &w), w.n_jobs < 1)) h_sleep_ms(100);
    int64_t took = moeq_now_ms() - t0;
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(w.n_jobs, 1);
    assert_string_equal(w.jobs[0].id, "late");
    print_message("a job on a topic created after start-up was batched after %lld ms\n", (long long)took);
    free(w.jobs);
    free(w.batches);
    h_destroy(&h);
}

static void a_job_cancelled_before_it_arrives_never_reaches_a_batch(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_cancel");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    const char *extra[] = {"--max_wait_ms=20", "--kafka.topic.metadata.refresh.interval.ms=500", NULL};
    pid_t pid = h_start(&h, extra);
    h_produce(&h, h.cancel_topic, "c1", "c1", 2);
    assert_int_equal(h_flush(&h), 0);
    char key[160], err[256];
    snprintf(key, sizeof key, "%s:job:c1", h.prefix);
    int64_t end = moeq_now_ms() + 30000;
    int cancelled = 0;
    while (!cancelled && moeq_now_ms() < end) { /* wait for the tombstone */
        const char *argv[] = {"HGET", key, "state"};
        moeq_redis_reply *r = NULL;
        moeq_redis_command_argv(h.redis, 3, argv, NULL, &r, err, sizeof err);
        cancelled = r && moeq_redis_reply_str(r, NULL) && !strcmp(moeq_redis_reply_str(r, NULL), "cancelled");
        moeq_redis_reply_free(r);
        if (!cancelled) h_sleep_ms(100);
    }
    assert_true(cancelled);
    const char *j1 = "{\"v\":1,\"id\":\"c1\",\"tokens\":[1,2,3]}", *j2 = "{\"v\":1,\"id\":\"c2\",\"tokens\":[1,2,3]}";
    h_produce(&h, h.jobs_topic, "c1", j1, strlen(j1));
    h_produce(&h, h.jobs_topic, "c2", j2, strlen(j2));
    assert_int_equal(h_flush(&h), 0);
    static h_msg res[4];
    size_t n_res = h_collect(&h, h.results_topic, 1, 20000, res);
    h_walk w = {0};
    end = moeq_now_ms() + 10000;
    while (moeq_now_ms() < end && (h_read_batches(&h, &w), w.n_jobs < 1)) h_sleep_ms(100);
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(n_res, 1);
    moeq_result r;
    assert_int_equal(moeq_result_decode(res[0].value, res[0].len, NULL, 0, &r, err, sizeof err), MOEQ_OK);
    assert_string_equal(r.id, "c1");
    assert_int_equal(r.status, MOEQ_RESULT_CANCELLED);
    moeq_result_free(&r);
    assert_int_equal(w.n_jobs, 1);
    assert_string_equal(w.jobs[0].id, "c2");
    free(res[0].value);
    free(w.jobs);
    free(w.batches);
    h_destroy(&h);
}

/* HGET key field into out ("" when absent). */
static void hget(harness *h, const char *key, const char *field, char *out, size_t n) {
    const char *argv[] = {"HGET", key, field};
    moeq_redis_reply *r = NULL;
    char err[256];
    moeq_redis_command_argv(h->redis, 3, argv, NULL, &r, err, sizeof err);
    const char *v = r ? moeq_redis_reply_str(r, NULL) : NULL;
    snprintf(out, n, "%s", v ? v : "");
    moeq_redis_reply_free(r);
}

/* Regression: a cancel of an already batched job used to set only the record's
 * flag, which workers poll slowly; it must also be announced on <prefix>:cancels,
 * which workers read between engine steps. */
static void a_job_cancelled_after_batching_is_flagged_and_announced_to_workers(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_cancel_batched");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    const char *extra[] = {"--max_wait_ms=20", "--kafka.topic.metadata.refresh.interval.ms=500", NULL};
    pid_t pid = h_start(&h, extra);
    const char *j = "{\"v\":1,\"id\":\"b1\",\"tokens\":[1,2,3]}";
    h_produce(&h, h.jobs_topic, "b1", j, strlen(j));
    assert_int_equal(h_flush(&h), 0);
    char key[160], val[64];
    snprintf(key, sizeof key, "%s:job:b1", h.prefix);
    int64_t end = moeq_now_ms() + 30000;
    for (val[0] = 0; strcmp(val, "batched") && moeq_now_ms() < end; h_sleep_ms(100)) hget(&h, key, "state", val, sizeof val);
    assert_string_equal(val, "batched");

    h_produce(&h, h.cancel_topic, "b1", "b1", 2);
    assert_int_equal(h_flush(&h), 0);
    end = moeq_now_ms() + 30000;
    for (val[0] = 0; strcmp(val, "1") && moeq_now_ms() < end; h_sleep_ms(100)) hget(&h, key, "cancel", val, sizeof val);
    assert_string_equal(val, "1");

    char stream[160], err[256];
    snprintf(stream, sizeof stream, "%s:cancels", h.prefix);
    const char *argv[] = {"XRANGE", stream, "-", "+"};
    moeq_redis_reply *r = NULL;
    assert_int_equal(moeq_redis_command_argv(h.redis, 4, argv, NULL, &r, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_reply_len(r), 1);                     /* one entry ... */
    const moeq_redis_reply *fields = moeq_redis_reply_at(moeq_redis_reply_at(r, 0), 1);
    assert_string_equal(moeq_redis_reply_str(moeq_redis_reply_at(fields, 0), NULL), "id");
    assert_string_equal(moeq_redis_reply_str(moeq_redis_reply_at(fields, 1), NULL), "b1"); /* ... naming the job */
    moeq_redis_reply_free(r);
    assert_int_equal(h_stop(pid), 0);
    h_destroy(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_job_cancelled_after_batching_is_flagged_and_announced_to_workers),
        cmocka_unit_test(mixed_jobs_become_batches_that_obey_every_bound),
        cmocka_unit_test(invalid_jobs_are_dead_lettered_with_reasons_and_answered),
        cmocka_unit_test(a_job_cancelled_before_it_arrives_never_reaches_a_batch),
        cmocka_unit_test(a_job_topic_created_after_start_up_is_read_within_seconds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
