/*
 * test_submit.c — "results answer this submission", through the whole
 * pipeline (`moeq coordinator`, one `moeq worker` on the tiny model, the
 * fixture's broker and Redis) and `moeq submit` as a user runs it: an id
 * sent twice within moments gets one result and one `duplicate` dead
 * letter; an edited file re-submitted with the same ids is told which jobs
 * were not run and which results are stale, instead of being handed the old
 * results; a file with an id on two lines is refused before anything is
 * sent. Needs the `services` fixture (skips with 77 without it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "moeq/job.h"
#include "test_worker_e2e_harness.h"

static e2e g_t;
static pid_t g_coord, g_worker;
static char g_dir[640];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return calloc(1, 1);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)n + 1);
    if (n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    fclose(f);
    return s;
}

static size_t count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Run `moeq submit` on `in`; returns its exit status, stderr in *err_out (free it), results in *out_out. */
static int submit(const char *in, const char *extra, char **err_out, char **out_out) {
    char cmd[4096], out[700], err[700];
    snprintf(out, sizeof out, "%s.out", in);
    snprintf(err, sizeof err, "%s.err", in);
    snprintf(cmd, sizeof cmd,
             "%s submit --in %s --out %s --brokers %s --topic %s --results-topic %s --dlq-topic %s.dlq "
             "--timeout-s 120 %s 2>%s",
             g_t.moeq, in, out, g_t.kafka, g_t.jobs_topic, g_t.results_topic, g_t.ns, extra ? extra : "", err);
    int st = system(cmd);
    *err_out = read_file(err);
    if (out_out) *out_out = read_file(out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void submit_refuses_an_input_file_with_a_duplicate_id(void **state) {
    (void)state;
    char in[700];
    snprintf(in, sizeof in, "%s/dup-ids.jsonl", g_dir);
    write_file(in, "{\"v\":1,\"id\":\"d-1\",\"prompt\":\"a\"}\n"
                   "{\"v\":1,\"id\":\"d-2\",\"prompt\":\"b\"}\n"
                   "\n"
                   "{\"v\":1,\"id\":\"d-1\",\"prompt\":\"c\"}\n");
    char *err = NULL;
    int64_t t0 = moeq_now_ms();
    assert_int_not_equal(submit(in, NULL, &err, NULL), 0);
    if (!strstr(err, "'d-1' is on lines 1, 4")) fail_msg("stderr: %s", err);
    assert_true(moeq_now_ms() - t0 < 10000); /* refused up front, no waiting */
    free(err);
    /* nothing was sent: no job with these ids reaches the results */
    assert_int_equal(e2e_collect(&g_t, 1, 3000), 0);
}

static void a_job_id_sent_twice_within_moments_gets_one_result_and_one_duplicate_dead_letter(void **state) {
    (void)state;
    char dlq_topic[200];
    snprintf(dlq_topic, sizeof dlq_topic, "%s.dlq", g_t.ns);
    moeq_kafka_consumer *dlq = e2e_subscribe(&g_t, dlq_topic, "dlq1");
    assert_non_null(dlq);
    moeq_kafka_producer *prod = NULL;
    char err[512];
    moeq_kafka_producer_params pp = {.brokers = g_t.kafka};
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &prod, err, sizeof err), MOEQ_OK);
    const char *job = "{\"v\":1,\"id\":\"twice-e2e\",\"prompt\":\"once only\",\"max_new_tokens\":4,\"temperature\":0.9}";
    moeq_kafka_out m = {.topic = g_t.jobs_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = "twice-e2e",
                        .key_len = 9, .value = job, .value_len = strlen(job)};
    assert_int_equal(moeq_kafka_produce(prod, &m, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_produce(prod, &m, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_kafka_producer_flush(prod, 30000, err, sizeof err), MOEQ_OK);
    moeq_kafka_producer_destroy(prod);
    int dead = 0;
    for (int64_t end = moeq_now_ms() + 30000; !dead && moeq_now_ms() < end;) {
        moeq_kafka_msg *msg = NULL;
        if (moeq_kafka_consumer_poll(dlq, 100, &msg, err, sizeof err) || !msg) continue;
        const void *v;
        size_t n;
        if (moeq_kafka_msg_header(msg, "moeq-reason-code", &v, &n) == MOEQ_OK && n == 9 && !memcmp(v, "duplicate", 9))
            dead++;
        moeq_kafka_msg_destroy(msg);
    }
    moeq_kafka_consumer_destroy(dlq);
    assert_int_equal(dead, 1);
    e2e_collect(&g_t, g_t.n_jobs + 1, 30000);
    e2e_collect(&g_t, g_t.n_jobs + 2, 2000); /* a second result, if any, would come within moments */
    e2e_job *r = e2e_job_find(&g_t, "twice-e2e");
    assert_non_null(r);
    assert_int_equal(r->n_results, 1);
    assert_string_equal(r->status, "ok");
}

static void submit_reports_stale_results_and_reads_only_its_own(void **state) {
    (void)state;
    char v1[700], v2[700];
    snprintf(v1, sizeof v1, "%s/v1.jsonl", g_dir);
    snprintf(v2, sizeof v2, "%s/v2.jsonl", g_dir);
    write_file(v1, "{\"v\":1,\"id\":\"s-1\",\"prompt\":\"first version\",\"max_new_tokens\":4}\n"
                   "{\"v\":1,\"id\":\"s-2\",\"prompt\":\"first version too\",\"max_new_tokens\":4}\n");
    write_file(v2, "{\"v\":1,\"id\":\"s-1\",\"prompt\":\"edited version\",\"max_new_tokens\":4}\n"
                   "{\"v\":1,\"id\":\"s-2\",\"prompt\":\"edited version too\",\"max_new_tokens\":4}\n");
    char *err = NULL, *out = NULL;
    assert_int_equal(submit(v1, NULL, &err, &out), 0);
    char hash[MOEQ_JOB_HASH_SIZE];
    const char *line1 = "{\"v\":1,\"id\":\"s-1\",\"prompt\":\"first version\",\"max_new_tokens\":4}";
    moeq_job_content_hash(line1, strlen(line1), hash);
    assert_non_null(strstr(out, hash)); /* each result says which job it answers */
    assert_int_equal(count(out, "\"job_hash\""), 2);
    free(err);
    free(out);
    /* the edited file: the old results are within reach (clock skew margin), but stale */
    int64_t t0 = moeq_now_ms();
    assert_int_equal(submit(v2, NULL, &err, &out), 1);
    /* the old results are read as soon as the reader is assigned, before the new jobs are dead-lettered:
     * normally both are reported; the duplicates settling first is allowed (it ends the wait) */
    if (count(err, "skipped a stale result") < 1 || count(err, "was not run") != 2) fail_msg("stderr: %s", err);
    assert_non_null(strstr(err, "already accepted"));
    assert_string_equal(out, ""); /* no old result handed over as this submission's */
    assert_true(moeq_now_ms() - t0 < 60000); /* the duplicates settle it, not the 120 s timeout */
    free(err);
    free(out);
    /* with no margin it reads only what was produced after it started: not even the stale ones */
    assert_int_equal(submit(v2, "--clock-skew-s 0", &err, &out), 1);
    if (count(err, "stale") != 0 || count(err, "was not run") != 2) fail_msg("stderr: %s", err);
    free(err);
    free(out);
}

static int group_setup(void **state) {
    (void)state;
    int rc = e2e_open(&g_t, "submit");
    if (rc == MOEQ_TEST_SKIP) exit(MOEQ_TEST_SKIP);
    if (rc) return -1;
    snprintf(g_dir, sizeof g_dir, "%s/%s-files", g_t.logdir, g_t.ns);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd)) return -1;
    g_coord = e2e_start_coordinator(&g_t, NULL);
    g_worker = e2e_start_worker(&g_t, "submit-w1", NULL);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    e2e_term(g_worker, 20000);
    e2e_term(g_coord, 20000);
    e2e_close(&g_t);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(submit_refuses_an_input_file_with_a_duplicate_id),
        cmocka_unit_test(a_job_id_sent_twice_within_moments_gets_one_result_and_one_duplicate_dead_letter),
        cmocka_unit_test(submit_reports_stale_results_and_reads_only_its_own),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
