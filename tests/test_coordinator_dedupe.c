/*
 * test_coordinator_dedupe.c — one id, one job, against the real broker and
 * redis-server of the `services` fixture: an id sent twice within moments is
 * batched once and the second copy is dead-lettered `duplicate`; a reused id
 * is dead-lettered naming the first job (when it was batched, whether its
 * content was the same); a redelivery of the same message (kill -9 before
 * the offset commit) stays silent. No duplicate ever gets a result: on a
 * compacted results topic it would replace the first job's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator_harness.h"
#include "store.h"

/* A dead letter with the headers a `duplicate` carries. */
typedef struct dl {
    char key[128], code[64], same[16], of_source[320], of_ms[32], job_hash[32], reason[600];
} dl;

static void header(const moeq_kafka_msg *m, const char *name, char *out, size_t n) {
    const void *v;
    size_t len;
    out[0] = 0;
    if (moeq_kafka_msg_header(m, name, &v, &len) == MOEQ_OK) snprintf(out, n, "%.*s", (int)len, (const char *)v);
}

typedef struct dl_sink {
    dl *out;
    size_t cap;
} dl_sink;

static void keep_dead_letter(const moeq_kafka_msg *m, size_t index, void *opaque) {
    dl_sink *sink = opaque;
    if (index >= sink->cap) return;
    dl *o = &sink->out[index];
    size_t kl = 0;
    const char *k = moeq_kafka_msg_key(m, &kl);
    snprintf(o->key, sizeof o->key, "%.*s", (int)kl, k ? k : "");
    header(m, "moeq-reason-code", o->code, sizeof o->code);
    header(m, "moeq-duplicate-same-content", o->same, sizeof o->same);
    header(m, "moeq-duplicate-of-source", o->of_source, sizeof o->of_source);
    header(m, "moeq-duplicate-of-batched-ms", o->of_ms, sizeof o->of_ms);
    header(m, "moeq-job-hash", o->job_hash, sizeof o->job_hash);
    header(m, "moeq-reason", o->reason, sizeof o->reason);
}

/* Read topic from the start for timeout_ms (or until want messages); returns the count. */
static size_t collect(harness *h, const char *topic, const char *reader, size_t want, int timeout_ms, dl *out,
                      size_t cap) {
    dl_sink sink = {out, cap};
    return h_consume(h, topic, reader, want, timeout_ms, keep_dead_letter, &sink);
}

static void hget(harness *h, const char *id, const char *field, char *out, size_t n) {
    char key[256];
    snprintf(key, sizeof key, "%s:job:%s", h->prefix, id);
    const char *argv[] = {"HGET", key, field};
    moeq_redis_reply *r = NULL;
    out[0] = 0;
    if (moeq_redis_command_argv(h->redis, 3, argv, NULL, &r, NULL, 0) == MOEQ_OK && moeq_redis_reply_str(r, NULL))
        snprintf(out, n, "%s", moeq_redis_reply_str(r, NULL));
    moeq_redis_reply_free(r);
}

/* Batch entries carrying id (over every stream). */
static size_t batched(harness *h, const char *id) {
    h_walk w = {0};
    h_read_batches(h, &w);
    size_t n = 0;
    for (size_t i = 0; i < w.n_jobs; i++) n += !strcmp(w.jobs[i].id, id);
    free(w.jobs);
    free(w.batches);
    return n;
}

static int wait_batched(harness *h, const char *id, int timeout_ms) {
    int64_t end = moeq_now_ms() + timeout_ms;
    while (moeq_now_ms() < end) {
        if (batched(h, id) > 0) return 1;
        h_sleep_ms(100);
    }
    return 0;
}

static void produce_job(harness *h, const char *id, const char *text) {
    h_produce(h, h->jobs_topic, id, text, strlen(text));
}

static void a_job_id_sent_twice_within_moments_runs_once(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_dedupe_twice");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    const char *job = "{\"v\":1,\"id\":\"twice-1\",\"prompt\":\"hello there\",\"max_new_tokens\":4}";
    produce_job(&h, "twice-1", job); /* back to back: both land in one bucket */
    produce_job(&h, "twice-1", job);
    produce_job(&h, "other-1", "{\"v\":1,\"id\":\"other-1\",\"prompt\":\"hello there\",\"max_new_tokens\":4}");
    assert_int_equal(h_flush(&h), 0);
    const char *extra[] = {"--max_wait_ms=300", "--kafka.topic.metadata.refresh.interval.ms=500", NULL};
    pid_t pid = h_start(&h, extra);
    dl d[4];
    size_t n = collect(&h, h.dlq_topic, "dlq", 1, 30000, d, 4);
    assert_true(wait_batched(&h, "other-1", 10000));
    size_t results = collect(&h, h.results_topic, "results", 1, 2000, d + 2, 2);
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(n, 1);
    assert_string_equal(d[0].key, "twice-1");
    assert_string_equal(d[0].code, "duplicate");
    assert_string_equal(d[0].same, "true"); /* a deliberate re-send: same bytes, another offset */
    char hash[MOEQ_JOB_HASH_SIZE], rec_hash[32], rec_src[320];
    moeq_job_content_hash(job, strlen(job), hash);
    assert_string_equal(d[0].job_hash, hash);
    hget(&h, "twice-1", "hash", rec_hash, sizeof rec_hash);
    hget(&h, "twice-1", "src", rec_src, sizeof rec_src);
    assert_string_equal(rec_hash, hash);
    assert_string_equal(d[0].of_source, rec_src);
    assert_non_null(strstr(d[0].reason, "twice-1"));
    assert_int_equal(batched(&h, "twice-1"), 1);
    assert_int_equal(results, 0); /* never a result for a duplicate */
    h_destroy(&h);
}

static void a_reused_id_with_other_content_gets_a_duplicate_dead_letter_naming_the_first(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_dedupe_reused");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    const char *first = "{\"v\":1,\"id\":\"reused-1\",\"prompt\":\"version one\",\"max_new_tokens\":4}";
    const char *edited = "{\"v\":1,\"id\":\"reused-1\",\"prompt\":\"version two, edited\",\"max_new_tokens\":4}";
    produce_job(&h, "reused-1", first);
    assert_int_equal(h_flush(&h), 0);
    const char *extra[] = {"--kafka.topic.metadata.refresh.interval.ms=500", NULL};
    pid_t pid = h_start(&h, extra);
    assert_true(wait_batched(&h, "reused-1", 30000));
    produce_job(&h, "reused-1", edited);
    assert_int_equal(h_flush(&h), 0);
    dl d[4];
    size_t n = collect(&h, h.dlq_topic, "dlq", 1, 30000, d, 4);
    size_t results = collect(&h, h.results_topic, "results", 1, 2000, d + 2, 2);
    assert_int_equal(h_stop(pid), 0);
    assert_int_equal(n, 1);
    assert_string_equal(d[0].code, "duplicate");
    assert_string_equal(d[0].same, "false");
    char h1[MOEQ_JOB_HASH_SIZE], h2[MOEQ_JOB_HASH_SIZE], rec_ms[32], rec_src[320];
    moeq_job_content_hash(first, strlen(first), h1);
    moeq_job_content_hash(edited, strlen(edited), h2);
    assert_string_equal(d[0].job_hash, h2);
    hget(&h, "reused-1", "batched_ms", rec_ms, sizeof rec_ms);
    hget(&h, "reused-1", "src", rec_src, sizeof rec_src);
    assert_string_equal(d[0].of_ms, rec_ms); /* names the first: when it was batched, from where */
    assert_string_equal(d[0].of_source, rec_src);
    assert_non_null(strstr(d[0].reason, h1));
    assert_non_null(strstr(d[0].reason, h2));
    assert_non_null(strstr(d[0].reason, "batched at "));
    assert_int_equal(batched(&h, "reused-1"), 1);
    assert_int_equal(results, 0);
    h_destroy(&h);
}

static void a_byte_identical_redelivery_stays_silent(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_dedupe_redelivery");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    produce_job(&h, "redo-1", "{\"v\":1,\"id\":\"redo-1\",\"prompt\":\"again\",\"max_new_tokens\":4}");
    assert_int_equal(h_flush(&h), 0);
    /* no commit within the test: the restarted coordinator reads the job again from the same offset */
    const char *extra[] = {"--commit_interval_ms=60000", "--kafka.topic.metadata.refresh.interval.ms=500", NULL};
    pid_t pid = h_start(&h, extra);
    assert_true(wait_batched(&h, "redo-1", 30000));
    h_kill9(pid);
    long before = 0;
    FILE *log = fopen(h.log_path, "r");
    if (log) {
        fseek(log, 0, SEEK_END);
        before = ftell(log);
        fclose(log);
    }
    pid = h_start(&h, extra);
    int seen = 0;
    for (int64_t end = moeq_now_ms() + 30000; !seen && moeq_now_ms() < end; h_sleep_ms(200)) {
        char line[2048];
        log = fopen(h.log_path, "r");
        if (!log) continue;
        fseek(log, before, SEEK_SET);
        while (fgets(line, sizeof line, log))
            seen |= strstr(line, "event=job_duplicate") && strstr(line, "id=redo-1") && strstr(line, "why=redelivery");
        fclose(log);
    }
    dl d[2];
    size_t n = collect(&h, h.dlq_topic, "dlq", 1, 2000, d, 2);
    assert_int_equal(h_stop(pid), 0);
    assert_true(seen);
    assert_int_equal(n, 0);
    assert_int_equal(batched(&h, "redo-1"), 1);
    h_destroy(&h);
}

static moeq_batch_entry_job entry_job(const char *id, const char *bytes) {
    moeq_batch_entry_job j = {.id = id, .id_len = strlen(id), .job = bytes, .job_len = strlen(bytes),
                              .kafka_ts_ms = 1000, .arrival_ms = 2000};
    return j;
}

/* The store alone: two copies of one id in one write are refused, and the refusal names the first. */
static void the_store_refuses_a_second_copy_of_an_id_inside_one_batch_write(void **state) {
    (void)state;
    harness h;
    int rc = h_init(&h, "coord_dedupe_store");
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    moeq_coordinator_params p = moeq_coordinator_default_params();
    snprintf(p.redis_url, sizeof p.redis_url, "%s", h.redis_addr);
    snprintf(p.redis_prefix, sizeof p.redis_prefix, "%s", h.prefix);
    snprintf(p.durability, sizeof p.durability, "none");
    moeq_store *st = NULL;
    char err[256] = "", entry[64];
    assert_int_equal(moeq_store_new(&p, NULL, &st, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_store_prepare(st, NULL, 0, err, sizeof err), MOEQ_OK);
    const char *a = "{\"v\":1,\"id\":\"a\",\"prompt\":\"x\"}", *a2 = "{\"v\":1,\"id\":\"a\",\"prompt\":\"y\"}";
    const char *b = "{\"v\":1,\"id\":\"b\",\"prompt\":\"x\"}";
    moeq_batch_entry_job jobs[3] = {entry_job("a", a), entry_job("a", a2), entry_job("b", b)};
    const char *src[3] = {"t/0/5", "t/0/6", "t/0/7"};
    moeq_store_dup dup[3];
    int written = -1;
    assert_int_equal(moeq_store_write_batch(st, 0, jobs, src, 3, 0, 1, 12345, &written, entry, dup, err, sizeof err),
                     MOEQ_OK);
    assert_int_equal(written, 0); /* nothing written: the caller settles the copy and writes the rest */
    assert_int_equal(dup[0].kind, MOEQ_STORE_NEW);
    assert_int_equal(dup[1].kind, MOEQ_STORE_DUP_ENQUEUED);
    assert_int_equal(dup[1].in_batch, 1);
    assert_string_equal(dup[1].src, "t/0/5");
    char ha[MOEQ_JOB_HASH_SIZE];
    moeq_job_content_hash(a, strlen(a), ha);
    assert_string_equal(dup[1].hash, ha);
    assert_int_equal(dup[2].kind, MOEQ_STORE_NEW);
    assert_false(moeq_store_dup_is_redelivery(&dup[1], src[1])); /* another offset: an id reused */
    assert_true(moeq_store_dup_is_redelivery(&dup[1], "t/0/5"));  /* the same offset: a redelivery */
    jobs[1] = jobs[2];
    src[1] = src[2];
    assert_int_equal(moeq_store_write_batch(st, 0, jobs, src, 2, 0, 1, 12345, &written, entry, dup, err, sizeof err),
                     MOEQ_OK);
    assert_int_equal(written, 1);
    jobs[0] = entry_job("a", a2);
    assert_int_equal(moeq_store_write_batch(st, 0, jobs, src + 1, 1, 0, 1, 23456, &written, entry, dup, err, sizeof err),
                     MOEQ_OK);
    assert_int_equal(written, 0);
    assert_int_equal(dup[0].kind, MOEQ_STORE_DUP_ENQUEUED);
    assert_int_equal(dup[0].in_batch, 0);
    assert_int_equal(dup[0].batched_ms, 12345);
    assert_int_equal(dup[0].kafka_ts_ms, 1000);
    assert_string_equal(dup[0].hash, ha);
    assert_string_equal(dup[0].src, "t/0/5");
    moeq_store_dup legacy = {.kind = MOEQ_STORE_DUP_ENQUEUED, .batched_ms = -1}; /* a record from before hashes */
    assert_true(moeq_store_dup_is_redelivery(&legacy, "t/0/9"));
    moeq_store_destroy(st);
    h_destroy(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_job_id_sent_twice_within_moments_runs_once),
        cmocka_unit_test(a_reused_id_with_other_content_gets_a_duplicate_dead_letter_naming_the_first),
        cmocka_unit_test(a_byte_identical_redelivery_stays_silent),
        cmocka_unit_test(the_store_refuses_a_second_copy_of_an_id_inside_one_batch_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
