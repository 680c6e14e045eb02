/*
 * test_submit.c — "results answer this submission", through the whole
 * pipeline (`moeq coordinator`, one `moeq worker` on the tiny model, the
 * fixture's broker and Redis) and `moeq submit` as a user runs it: an id
 * sent twice within moments gets one result and one `duplicate` dead
 * letter; an edited file re-submitted with the same ids is told which jobs
 * were not run and which results are stale, instead of being handed the old
 * results; a file with an id on two lines is refused before anything is
 * sent. And issue 16's bullets: an OpenAI Batch file (chat and completions)
 * end to end with its output and errors files; bad lines under
 * --skip-invalid; an all-error run exits non-zero with counts; kafka.* keys
 * from the environment are read (and a bad one refused), a SASL_SSL
 * listener is reached with them (a wrong password fails fast); an unreachable
 * broker fails in seconds naming it; --resume sends only what --out does not
 * answer and waits for a job an earlier run sent. Needs the `services`
 * fixture (skips with 77 without it).
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

/* The value of key=N in the summary line of stderr, or -1. */
static long summary_count(const char *err, const char *key) {
    const char *sum = strstr(err, "summary ");
    if (!sum) return -1;
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(sum, pat);
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
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
    if (count(err, "skipped a stale result") != 0 || count(err, "was not run") != 2 || !strstr(err, " stale=0 "))
        fail_msg("stderr: %s", err);
    free(err);
    free(out);
}

static void submit_runs_an_openai_batch_file_end_to_end(void **state) {
    (void)state;
    char in[700], errors[720];
    snprintf(in, sizeof in, "%s/openai.jsonl", g_dir);
    snprintf(errors, sizeof errors, "%s/openai.jsonl.out.errors.jsonl", g_dir); /* --out is <in>.out */
    write_file(in,
               "{\"custom_id\":\"oa-chat\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":"
               "\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
               "\"Say hi\"}],\"max_completion_tokens\":4,\"temperature\":0}}\n"
               "{\"custom_id\":\"oa-comp\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"tiny\","
               "\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"seed\":7}}\n");
    char *err = NULL, *out = NULL;
    int rc = submit(in, NULL, &err, &out);
    if (rc != 0) fail_msg("exit %d, stderr: %s", rc, err);
    assert_int_equal(count(out, "\n"), 2);
    assert_int_equal(count(out, "\"custom_id\":\"oa-chat\""), 1);
    assert_int_equal(count(out, "\"object\":\"chat.completion\""), 1);
    assert_int_equal(count(out, "\"object\":\"text_completion\""), 1);
    assert_int_equal(count(out, "\"status_code\":200"), 2);
    assert_int_equal(count(out, "\"total_tokens\":"), 2);
    assert_int_equal(count(out, "\"error\":null"), 2);
    assert_int_equal(summary_count(err, "ok"), 2);
    assert_int_equal(summary_count(err, "error"), 0);
    assert_int_equal(access(errors, F_OK), -1); /* no failed request, no errors file */
    free(err);
    free(out);
    /* a custom_id on two lines: refused before sending, naming the lines */
    snprintf(in, sizeof in, "%s/openai-dup.jsonl", g_dir);
    write_file(in, "{\"custom_id\":\"oa-d\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"a\"}}\n"
                   "{\"custom_id\":\"oa-d\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"b\"}}\n");
    int64_t t0 = moeq_now_ms();
    assert_int_equal(submit(in, NULL, &err, NULL), 2);
    if (!strstr(err, "'oa-d' is on lines 1, 2")) fail_msg("stderr: %s", err);
    assert_true(moeq_now_ms() - t0 < 10000);
    free(err);
}

static void submit_skip_invalid_sends_the_good_lines_and_lists_the_bad_ones(void **state) {
    (void)state;
    char in[700], errors[720];
    snprintf(in, sizeof in, "%s/bad-lines.jsonl", g_dir);
    snprintf(errors, sizeof errors, "%s/bad-lines.jsonl.out.errors.jsonl", g_dir); /* --out is <in>.out */
    write_file(in, "{\"v\":1,\"id\":\"bl-1\",\"prompt\":\"good one\",\"max_new_tokens\":2}\n"
                   "{\"v\":1,\"id\":\"bl-2\",\"prompt\":\"bad temperature\",\"temperature\":9}\n"
                   "{\"v\":1,\"id\":\"bl-3\",\"prompt\":\"good two\",\"max_new_tokens\":2}\n"
                   "not json at all\n");
    char *err = NULL, *out = NULL;
    /* without --skip-invalid: every bad line named, nothing sent */
    assert_int_equal(submit(in, NULL, &err, NULL), 2);
    if (!strstr(err, "line 2: field 'temperature'") || !strstr(err, "line 4:") || !strstr(err, "nothing was sent"))
        fail_msg("stderr: %s", err);
    free(err);
    int rc = submit(in, "--skip-invalid", &err, &out);
    if (rc != 1) fail_msg("exit %d, stderr: %s", rc, err); /* the good ones ran; the skipped lines make it not ok */
    assert_int_equal(count(out, "\"status\":\"ok\""), 2);
    assert_int_equal(summary_count(err, "ok"), 2);
    assert_int_equal(summary_count(err, "invalid"), 2);
    char *bad = read_file(errors);
    assert_int_equal(count(bad, "\n"), 2);
    assert_non_null(strstr(bad, "{\"line\":2,\"id\":\"bl-2\",\"error\":{\"code\":\"out_of_range\",\"field\":\"temperature\""));
    assert_non_null(strstr(bad, "{\"line\":4,\"id\":null,\"error\":{\"code\":\"malformed\""));
    free(bad);
    free(err);
    free(out);
}

static void an_all_error_run_exits_non_zero_and_counts_each_status(void **state) {
    (void)state;
    char in[700];
    snprintf(in, sizeof in, "%s/all-error.jsonl", g_dir);
    /* reply_to not allowed: an error result from the coordinator; a deadline already passed: expired */
    write_file(in, "{\"v\":1,\"id\":\"ae-1\",\"prompt\":\"x\",\"reply_to\":\"not.allowed.topic\"}\n"
                   "{\"v\":1,\"id\":\"ae-2\",\"prompt\":\"y\",\"reply_to\":\"not.allowed.topic\"}\n"
                   "{\"v\":1,\"id\":\"ae-3\",\"prompt\":\"z\",\"deadline_ms\":1}\n");
    char *err = NULL, *out = NULL;
    int rc = submit(in, NULL, &err, &out);
    if (rc != 1) fail_msg("exit %d, stderr: %s", rc, err);
    assert_int_equal(summary_count(err, "ok"), 0);
    assert_int_equal(summary_count(err, "error"), 2);
    assert_int_equal(summary_count(err, "expired"), 1);
    assert_int_equal(summary_count(err, "no_result"), 0);
    assert_int_equal(count(out, "\n"), 3);
    free(err);
    free(out);
}

static void submit_reads_kafka_keys_from_the_environment_like_the_other_roles(void **state) {
    (void)state;
    char cmd[2048], path[700];
    snprintf(path, sizeof path, "%s/env.out", g_dir);
    snprintf(cmd, sizeof cmd,
             "MOEQ_KAFKA__CLIENT__RACK=rack-7 MOEQ_KAFKA_BROKERS=example:9 %s submit --print-config >%s 2>&1", g_t.moeq,
             path);
    assert_int_equal(system(cmd), 0);
    char *text = read_file(path);
    if (!strstr(text, "kafka.client.rack = \"rack-7\"") || !strstr(text, "kafka_brokers = \"example:9\""))
        fail_msg("--print-config: %s", text);
    free(text);
    /* a bad value is refused at once, naming the key (it used to be ignored) */
    char in[700];
    snprintf(in, sizeof in, "%s/env.jsonl", g_dir);
    write_file(in, "{\"v\":1,\"id\":\"env-1\",\"prompt\":\"x\"}\n");
    setenv("MOEQ_KAFKA__SECURITY__PROTOCOL", "bogus", 1);
    char *err = NULL;
    int rc = submit(in, NULL, &err, NULL);
    unsetenv("MOEQ_KAFKA__SECURITY__PROTOCOL");
    if (rc != 2 || !strstr(err, "kafka.security.protocol")) fail_msg("exit %d, stderr: %s", rc, err);
    free(err);
}

static void submit_fails_fast_naming_the_broker_when_it_is_unreachable(void **state) {
    (void)state;
    char in[700], cmd[4096], errp[720];
    snprintf(in, sizeof in, "%s/nobroker.jsonl", g_dir);
    snprintf(errp, sizeof errp, "%s.err", in);
    write_file(in, "{\"v\":1,\"id\":\"nb-1\",\"prompt\":\"x\"}\n");
    snprintf(cmd, sizeof cmd, "%s submit --in %s --out %s.out --brokers 127.0.0.1:1 --connect_timeout_s=3 2>%s",
             g_t.moeq, in, in, errp);
    int64_t t0 = moeq_now_ms();
    int st = system(cmd);
    int64_t took = moeq_now_ms() - t0;
    char *err = read_file(errp);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 3 || !strstr(err, "kafka broker 127.0.0.1:1 did not answer within 3s"))
        fail_msg("status %d, stderr: %s", st, err);
    assert_true(took < 15000); /* not librdkafka's delivery timeout */
    assert_int_equal(summary_count(err, "no_result"), 1);
    free(err);
}

/* The fixture's SASL_SSL listener (same broker, other port): kafka.* keys from MOEQ_KAFKA__* reach librdkafka. */
static void submit_reaches_a_sasl_ssl_listener_with_kafka_keys_from_the_environment(void **state) {
    (void)state;
    char sasl[128], user[128], pass[256], ca[700];
    if (moeq_test_service("MOEQ_TEST_KAFKA_SASL_SSL", sasl, sizeof sasl) ||
        moeq_test_service("MOEQ_TEST_KAFKA_USER", user, sizeof user) ||
        moeq_test_service("MOEQ_TEST_KAFKA_PASSWORD", pass, sizeof pass) ||
        moeq_test_service("MOEQ_TEST_KAFKA_CA", ca, sizeof ca)) {
        fprintf(stderr, "SKIP the fixture has no SASL_SSL listener\n");
        skip();
    }
    char in[700], cmd[8192], errp[720];
    snprintf(in, sizeof in, "%s/sasl.jsonl", g_dir);
    snprintf(errp, sizeof errp, "%s.err", in);
    write_file(in, "{\"v\":1,\"id\":\"sasl-1\",\"prompt\":\"over tls\",\"max_new_tokens\":2}\n"
                   "{\"v\":1,\"id\":\"sasl-2\",\"prompt\":\"and scram\",\"max_new_tokens\":2}\n");
    for (int wrong = 0; wrong < 2; wrong++) {
        snprintf(cmd, sizeof cmd,
                 "MOEQ_KAFKA__SECURITY__PROTOCOL=SASL_SSL MOEQ_KAFKA__SASL__MECHANISM=SCRAM-SHA-512 "
                 "MOEQ_KAFKA__SASL__USERNAME='%s' MOEQ_KAFKA__SASL__PASSWORD='%s%s' MOEQ_KAFKA__SSL__CA__LOCATION='%s' "
                 "%s submit --in %s --out %s.out --brokers %s --topic %s --results-topic %s --dlq-topic %s.dlq "
                 "--timeout-s 120 --connect_timeout_s=5 2>%s",
                 user, pass, wrong ? "-wrong" : "", ca, g_t.moeq, in, in, sasl, g_t.jobs_topic, g_t.results_topic,
                 g_t.ns, errp);
        int64_t t0 = moeq_now_ms();
        int st = system(cmd);
        char *err = read_file(errp);
        int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (!wrong && (rc != 0 || summary_count(err, "ok") != 2)) fail_msg("exit %d, stderr: %s", rc, err);
        if (wrong && (rc != 3 || !strstr(err, sasl) || !strstr(err, "SASL authentication") ||
                      moeq_now_ms() - t0 > 20000)) /* refused, named (broker and why, in librdkafka's line), in seconds */
            fail_msg("wrong password: exit %d after %lld ms, stderr: %s", rc, (long long)(moeq_now_ms() - t0), err);
        free(err);
    }
}

/* Wait up to wait_ms for the results consumer to have seen a result for id. */
static int result_seen(const char *id, int wait_ms) {
    for (int64_t end = moeq_now_ms() + wait_ms; moeq_now_ms() < end;) {
        e2e_job *j = e2e_job_find(&g_t, id);
        if (j && j->n_results) return 1;
        e2e_collect(&g_t, g_t.n_jobs + 1, 200);
    }
    return 0;
}

static void submit_resume_sends_only_what_out_does_not_answer(void **state) {
    (void)state;
    char first[700], all[700], out_first[720], out_all[720];
    snprintf(first, sizeof first, "%s/resume-first.jsonl", g_dir);
    snprintf(all, sizeof all, "%s/resume.jsonl", g_dir);
    snprintf(out_first, sizeof out_first, "%s.out", first);
    snprintf(out_all, sizeof out_all, "%s.out", all);
    const char *l1 = "{\"v\":1,\"id\":\"rs-1\",\"prompt\":\"one\",\"max_new_tokens\":2}";
    const char *l4 = "{\"v\":1,\"id\":\"rs-4\",\"prompt\":\"four\",\"max_new_tokens\":2}";
    char text[1024];
    snprintf(text, sizeof text, "%s\n", l1);
    write_file(first, text);
    char *err = NULL, *out = NULL;
    assert_int_equal(submit(first, NULL, &err, &out), 0); /* an earlier run: rs-1 answered */
    free(err);
    free(out);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp %s %s", out_first, out_all);
    assert_int_equal(system(cmd), 0);
    /* rs-4 was sent by that earlier run, which was gone before its result came */
    moeq_kafka_producer *prod = NULL;
    char kerr[512];
    moeq_kafka_producer_params pp = {.brokers = g_t.kafka};
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &prod, kerr, sizeof kerr), MOEQ_OK);
    moeq_kafka_header h = {"content-type", "application/json", 16};
    moeq_kafka_out m = {.topic = g_t.jobs_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = "rs-4", .key_len = 4,
                        .value = l4, .value_len = strlen(l4), .headers = &h, .n_headers = 1};
    assert_int_equal(moeq_kafka_produce(prod, &m, kerr, sizeof kerr), MOEQ_OK);
    assert_int_equal(moeq_kafka_producer_flush(prod, 30000, kerr, sizeof kerr), MOEQ_OK);
    moeq_kafka_producer_destroy(prod);
    assert_true(result_seen("rs-4", 60000));
    char dlq_topic[200];
    snprintf(dlq_topic, sizeof dlq_topic, "%s.dlq", g_t.ns);
    moeq_kafka_consumer *dlq = e2e_subscribe(&g_t, dlq_topic, "resume-dlq");
    assert_non_null(dlq);
    snprintf(text, sizeof text,
             "%s\n{\"v\":1,\"id\":\"rs-2\",\"prompt\":\"two\",\"max_new_tokens\":2}\n"
             "{\"v\":1,\"id\":\"rs-3\",\"prompt\":\"three\",\"max_new_tokens\":2}\n%s\n",
             l1, l4);
    write_file(all, text);
    /* --out is the copy, written before rs-4's result: no clock margin needed to find that result */
    int rc = submit(all, "--resume --clock-skew-s 0", &err, &out);
    if (rc != 0) fail_msg("exit %d, stderr: %s", rc, err);
    if (!strstr(err, "1 of 4 jobs already answered")) fail_msg("stderr: %s", err);
    assert_int_equal(summary_count(err, "ok"), 4);
    assert_int_equal(summary_count(err, "resumed"), 1);
    assert_int_equal(count(out, "\"id\":\"rs-1\""), 1); /* kept, not written again */
    assert_int_equal(count(out, "\"id\":\"rs-4\""), 1);
    assert_int_equal(count(out, "\n"), 4);
    /* rs-1 was not sent again: no duplicate dead letter for it (rs-4 has one when it was sent again: unless its
     * result was read before sending, which settles it too) */
    int dup_rs1 = 0, dup_rs4 = 0;
    for (int64_t end = moeq_now_ms() + 3000; moeq_now_ms() < end;) {
        moeq_kafka_msg *msg = NULL;
        if (moeq_kafka_consumer_poll(dlq, 100, &msg, kerr, sizeof kerr) || !msg) continue;
        size_t kl = 0;
        const char *k = moeq_kafka_msg_key(msg, &kl);
        dup_rs1 += k && kl == 4 && !memcmp(k, "rs-1", 4);
        dup_rs4 += k && kl == 4 && !memcmp(k, "rs-4", 4);
        moeq_kafka_msg_destroy(msg);
    }
    moeq_kafka_consumer_destroy(dlq);
    assert_int_equal(dup_rs1, 0);
    assert_true(dup_rs4 <= 1);
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
        cmocka_unit_test(submit_runs_an_openai_batch_file_end_to_end),
        cmocka_unit_test(submit_skip_invalid_sends_the_good_lines_and_lists_the_bad_ones),
        cmocka_unit_test(an_all_error_run_exits_non_zero_and_counts_each_status),
        cmocka_unit_test(submit_reads_kafka_keys_from_the_environment_like_the_other_roles),
        cmocka_unit_test(submit_fails_fast_naming_the_broker_when_it_is_unreachable),
        cmocka_unit_test(submit_reaches_a_sasl_ssl_listener_with_kafka_keys_from_the_environment),
        cmocka_unit_test(submit_resume_sends_only_what_out_does_not_answer),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
