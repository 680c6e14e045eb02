/*
 * test_coordinator_intake.c — the pure per-message decisions (accept with
 * exact token ids, reject with a stable code, expire) and the batch entry
 * codec the workers read.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/batch_entry.h"
#include "coord_metrics.h"
#include "intake.h"
#include "moeq/result.h"
#include "metrics_lint.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"

static moeq_tokenizer *tiny;
static moeq_coordinator_params params;

static int setup(void **state) {
    (void)state;
    char err[256];
    params = moeq_coordinator_default_params();
    snprintf(params.results_allowed_topics, sizeof(params.results_allowed_topics), "team.results");
    return moeq_tokenizer_load_tiny(&tiny, err, sizeof(err)) == MOEQ_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    moeq_tokenizer_destroy(tiny);
    return 0;
}

static moeq_schema_check *g_schemas; /* the intake's response_format check, where a case sets it */

static moeq_intake decide(const moeq_tokenizer *tok, const char *json, int64_t now) {
    moeq_intake_ctx ctx = {&params, tok, g_schemas};
    moeq_intake in;
    memset(&in, 0, sizeof(in));
    assert_int_equal(moeq_intake_job(&ctx, json, strlen(json), NULL, now, &in), MOEQ_OK);
    return in;
}

static void a_prompt_job_is_accepted_with_its_exact_token_ids(void **state) {
    (void)state;
    moeq_intake in = decide(tiny, "{\"v\":1,\"id\":\"j1\",\"prompt\":\"hello world, hello moeq\",\"priority\":1,"
                                  "\"max_new_tokens\":16}", 1000);
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
    moeq_tokens ref = {0};
    char err[256];
    unsigned flags = moeq_tokenizer_add_bos(tiny) ? MOEQ_TOKENIZE_ADD_BOS : 0;
    assert_int_equal(moeq_tokenizer_encode(tiny, "hello world, hello moeq", 23, flags, &ref, err, sizeof(err)), MOEQ_OK);
    assert_int_equal(in.prompt_len, (int32_t)ref.n);
    assert_memory_equal(in.prompt, ref.ids, ref.n * sizeof(int32_t));
    assert_int_equal(in.job.priority, 1);
    assert_int_equal(in.job.max_new_tokens, 16);
    assert_string_equal(moeq_intake_id(&in), "j1");
    moeq_intake_ctx ctx = {&params, tiny, NULL};
    assert_string_equal(moeq_intake_result_topic(&ctx, &in), "moeq.results");
    moeq_tokens_free(&ref);
    moeq_intake_free(&in);
}

static void a_tokens_job_needs_no_tokenizer_but_is_checked_against_the_vocabulary(void **state) {
    (void)state;
    moeq_intake in = decide(NULL, "{\"v\":1,\"id\":\"t\",\"tokens\":[1,2,3,5000]}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
    assert_int_equal(in.prompt_len, 4);
    assert_int_equal(in.prompt[3], 5000);
    moeq_intake_free(&in);
    in = decide(tiny, "{\"v\":1,\"id\":\"t\",\"tokens\":[1,2,3,5000]}", 0); /* tiny has 1024 ids */
    assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
    assert_int_equal(in.reject.code, MOEQ_JOB_REJECT_OUT_OF_RANGE);
    assert_string_equal(in.reject.field, "tokens[3]");
    moeq_intake_free(&in);
}

static void without_a_tokenizer_prompt_lengths_are_estimated(void **state) {
    (void)state;
    moeq_intake in = decide(NULL, "{\"v\":1,\"id\":\"e\",\"prompt\":\"0123456789abcdef0\"}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
    assert_null(in.prompt);
    assert_int_equal(in.prompt_len, 5); /* ceil(17 / 4) */
    moeq_intake_free(&in);
}

static void malformed_bytes_are_rejected_without_an_id(void **state) {
    (void)state;
    moeq_intake in = decide(tiny, "{\"v\":1,\"id\":", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
    assert_int_equal(in.reject.code, MOEQ_JOB_REJECT_MALFORMED);
    assert_null(moeq_intake_id(&in));
    moeq_buf out = {0};
    char err[128];
    assert_int_equal(moeq_intake_result_encode(&in, MOEQ_RESULT_ERROR, NULL, 0, &out, err, sizeof(err)),
                     MOEQ_ERR_NOT_FOUND); /* dead letter only */
    moeq_buf_free(&out);
    moeq_intake_free(&in);
}

static void invalid_jobs_get_an_error_result_naming_the_reason(void **state) {
    (void)state;
    moeq_intake in = decide(tiny, "{\"v\":1,\"id\":\"bad\",\"prompt\":\"x\",\"temperature\":7}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
    assert_int_equal(in.reject.code, MOEQ_JOB_REJECT_OUT_OF_RANGE);
    moeq_buf out = {0};
    char err[128];
    assert_int_equal(moeq_intake_result_encode(&in, MOEQ_RESULT_ERROR, NULL, 0, &out, err, sizeof(err)), MOEQ_OK);
    moeq_result r;
    assert_int_equal(moeq_result_decode(out.data, out.len, NULL, 0, &r, err, sizeof(err)), MOEQ_OK);
    assert_string_equal(r.id, "bad");
    assert_int_equal(r.status, MOEQ_RESULT_ERROR);
    assert_string_equal(r.error.code, "out_of_range");
    assert_non_null(strstr(r.error.message, "temperature"));
    moeq_result_free(&r);
    moeq_buf_free(&out);
    moeq_intake_free(&in);
}

/* Results answer this submission: the coordinator's results carry the hash of the job's bytes too. */
/* A response_format outside the grammar's subset is refused at intake with the worker's code and message
 * (error result unsupported_schema, dead letter), before it is batched; a schema over a limit is the worker's to
 * judge (its limits are its own keys); verdicts are kept by content. */
static void a_response_format_outside_the_subset_is_refused_at_intake(void **state) {
    (void)state;
    assert_int_equal(moeq_schema_check_new(4, &g_schemas), MOEQ_OK);
    static const char *const bad[] = {
        "{\"v\":1,\"id\":\"s1\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"name\":\"n\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}}}}",
        "{\"v\":1,\"id\":\"s2\",\"prompt\":\"x\",\"response_format\":{\"type\":\"regex\",\"pattern\":\"a(?=b)\"}}",
        "{\"v\":1,\"id\":\"s3\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}}}}", /* s1's schema again */
    };
    static const char *const why[] = {"'not' is not supported at /properties/a", "lookaround",
                                      "'not' is not supported at /properties/a"};
    for (int i = 0; i < 3; i++) {
        moeq_intake in = decide(tiny, bad[i], 0);
        assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
        assert_string_equal(moeq_intake_code(&in), "unsupported_schema");
        moeq_buf out = {0};
        char err[128];
        assert_int_equal(moeq_intake_result_encode(&in, MOEQ_RESULT_ERROR, NULL, 0, &out, err, sizeof(err)), MOEQ_OK);
        moeq_result r;
        assert_int_equal(moeq_result_decode(out.data, out.len, NULL, 0, &r, err, sizeof(err)), MOEQ_OK);
        assert_string_equal(r.error.code, "unsupported_schema");
        if (!strstr(r.error.message, why[i])) print_error("%s\n", r.error.message);
        assert_non_null(strstr(r.error.message, why[i]));
        moeq_result_free(&r);
        moeq_buf_free(&out);
        moeq_intake_free(&in);
    }
    static const char *const good[] = {
        "{\"v\":1,\"id\":\"g1\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}}",
        /* over max_string_chars even at the largest a worker may set: left to the worker */
        "{\"v\":1,\"id\":\"g2\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
        "{\"schema\":{\"type\":\"string\",\"maxLength\":100000}}}}",
        "{\"v\":1,\"id\":\"g3\",\"prompt\":\"x\",\"response_format\":{\"type\":\"choice\",\"choices\":[\"a\"]}}",
    };
    for (int i = 0; i < 3; i++) {
        moeq_intake in = decide(tiny, good[i], 0);
        assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
        moeq_intake_free(&in);
    }
    int64_t hits, misses;
    moeq_schema_check_counts(g_schemas, &hits, &misses);
    assert_int_equal(hits, 1);   /* s3 */
    assert_int_equal(misses, 4); /* s1, s2, g1, g2 (choice needs no compile) */
    moeq_schema_check_destroy(g_schemas);
    g_schemas = NULL;
}

static void coordinator_results_carry_the_hash_of_the_job_they_answer(void **state) {
    (void)state;
    const char *json = "{\"v\":1,\"id\":\"bad\",\"prompt\":\"x\",\"temperature\":7}";
    moeq_intake in = decide(tiny, json, 0);
    moeq_buf out = {0};
    char err[128], want[MOEQ_JOB_HASH_SIZE];
    assert_int_equal(moeq_intake_result_encode(&in, MOEQ_RESULT_ERROR, NULL, 0, &out, err, sizeof(err)), MOEQ_OK);
    moeq_result r;
    assert_int_equal(moeq_result_decode(out.data, out.len, NULL, 0, &r, err, sizeof(err)), MOEQ_OK);
    moeq_job_content_hash(json, strlen(json), want);
    assert_non_null(r.job_hash);
    assert_string_equal(r.job_hash, want);
    moeq_result_free(&r);
    moeq_buf_free(&out);
    moeq_intake_free(&in);
}

/* Issue 11: a 4,402-token prompt on a model with max_position_embeddings 256 came back ok. */
static void no_context_length_check_prompt_and_max_new_tokens_past_the_context_get_prompt_too_long(void **state) {
    (void)state;
    params.max_model_len = 16; /* what moeq_coordinator_new resolves from config.json / max_model_len */
    moeq_intake in = decide(NULL, "{\"v\":1,\"id\":\"t\",\"tokens\":[1,2,3,4,5,6],\"max_new_tokens\":11}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
    assert_string_equal(moeq_intake_code(&in), "prompt_too_long");
    assert_string_equal(in.reject.field, "tokens");
    assert_non_null(strstr(in.reject.message, "6 prompt tokens + max_new_tokens 11"));
    assert_non_null(strstr(in.reject.message, "context of 16 tokens"));
    moeq_buf buf = {0};
    char err[256];
    assert_int_equal(moeq_intake_result_encode(&in, MOEQ_RESULT_ERROR, NULL, 0, &buf, err, sizeof err), MOEQ_OK);
    moeq_result r;
    assert_int_equal(moeq_result_decode(buf.data, buf.len, NULL, 0, &r, err, sizeof err), MOEQ_OK);
    assert_string_equal(r.error.code, "prompt_too_long");
    moeq_result_free(&r);
    moeq_buf_free(&buf);
    moeq_intake_free(&in);
    in = decide(NULL, "{\"v\":1,\"id\":\"t\",\"tokens\":[1,2,3,4,5,6],\"max_new_tokens\":10}", 0); /* 16 fits */
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
    moeq_intake_free(&in);
    in = decide(tiny, "{\"v\":1,\"id\":\"p\",\"prompt\":\"hello world, hello moeq\",\"max_new_tokens\":15}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT); /* exact ids from the tokenizer, plus 15 */
    assert_string_equal(moeq_intake_code(&in), "prompt_too_long");
    assert_string_equal(in.reject.field, "prompt");
    moeq_intake_free(&in);
    in = decide(NULL, "{\"v\":1,\"id\":\"e\",\"prompt\":\"hello world, hello moeq\",\"max_new_tokens\":15}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT); /* an estimate is no ground to refuse: the worker checks */
    moeq_intake_free(&in);
    params.max_model_len = 0;
}

static void reply_to_outside_the_allow_list_is_rejected(void **state) {
    (void)state;
    moeq_intake_ctx ctx = {&params, tiny, NULL};
    moeq_intake in = decide(tiny, "{\"v\":1,\"id\":\"r\",\"prompt\":\"x\",\"reply_to\":\"evil.topic\"}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
    assert_int_equal(in.reject.code, MOEQ_JOB_REJECT_INVALID_VALUE);
    assert_string_equal(in.reject.field, "reply_to");
    assert_string_equal(moeq_intake_result_topic(&ctx, &in), "moeq.results"); /* never the unlisted topic */
    moeq_intake_free(&in);
    in = decide(tiny, "{\"v\":1,\"id\":\"r\",\"prompt\":\"x\",\"reply_to\":\"team.results\"}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
    assert_string_equal(moeq_intake_result_topic(&ctx, &in), "team.results");
    moeq_intake_free(&in);
}

static void a_job_past_its_deadline_is_answered_expired(void **state) {
    (void)state;
    moeq_intake in = decide(tiny, "{\"v\":1,\"id\":\"x\",\"prompt\":\"hi\",\"deadline_ms\":5000,"
                                  "\"metadata\":{\"k\":\"v\"}}", 5000);
    assert_int_equal(in.verdict, MOEQ_INTAKE_EXPIRED);
    moeq_buf out = {0};
    char err[128];
    assert_int_equal(moeq_intake_result_encode(&in, MOEQ_RESULT_EXPIRED, NULL, 12, &out, err, sizeof(err)), MOEQ_OK);
    moeq_result r;
    assert_int_equal(moeq_result_decode(out.data, out.len, NULL, 0, &r, err, sizeof(err)), MOEQ_OK);
    assert_int_equal(r.status, MOEQ_RESULT_EXPIRED);
    assert_string_equal(r.error.code, "deadline"); /* the documented code (it was sent as "expired") */
    assert_non_null(r.metadata); /* echoed */
    moeq_result_free(&r);
    moeq_buf_free(&out);
    moeq_intake_free(&in);
    in = decide(tiny, "{\"v\":1,\"id\":\"x\",\"prompt\":\"hi\",\"deadline_ms\":5001}", 5000);
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
    moeq_intake_free(&in);
}

static void a_job_longer_than_a_batch_is_rejected_too_large(void **state) {
    (void)state;
    int64_t keep = params.max_batch_tokens;
    params.max_batch_tokens = 100;
    moeq_intake in = decide(NULL, "{\"v\":1,\"id\":\"big\",\"tokens\":[1,2,3],\"max_new_tokens\":98}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
    assert_int_equal(in.reject.code, MOEQ_JOB_REJECT_TOO_LARGE);
    assert_string_equal(in.reject.field, "tokens");
    moeq_intake_free(&in);
    in = decide(NULL, "{\"v\":1,\"id\":\"fits\",\"tokens\":[1,2,3],\"max_new_tokens\":97}", 0);
    assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
    moeq_intake_free(&in);
    params.max_batch_tokens = keep;
}

static void chat_messages_are_rendered_or_rejected_when_the_model_has_no_chat_format(void **state) {
    (void)state;
    moeq_intake in = decide(tiny, "{\"v\":1,\"id\":\"c\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 0);
    if (moeq_tokenizer_chat_format(tiny) == MOEQ_CHAT_FORMAT_NONE) {
        assert_int_equal(in.verdict, MOEQ_INTAKE_REJECT);
        assert_string_equal(in.reject.field, "messages");
    } else {
        assert_int_equal(in.verdict, MOEQ_INTAKE_ACCEPT);
        assert_true(in.prompt_len > 1);
    }
    moeq_intake_free(&in);
}

/* The batch's prefix key (pkey): one instruction, one key, whatever the documents share past 256 tokens. */
static void a_batch_prefix_key_names_the_first_256_shared_tokens_rounded_to_16(void **state) {
    (void)state;
    int32_t a[300], b[300];
    for (int i = 0; i < 300; i++) a[i] = b[i] = i * 7 + 1;
    b[280] = 5; /* differs past the window */
    assert_true(moeq_batch_entry_prefix_key(a, 15) == 0); /* below 16 shared tokens: no key */
    assert_true(moeq_batch_entry_prefix_key(a, 16) != 0);
    assert_true(moeq_batch_entry_prefix_key(a, 300) == moeq_batch_entry_prefix_key(b, 290));
    assert_true(moeq_batch_entry_prefix_key(a, 40) == moeq_batch_entry_prefix_key(a, 47)); /* rounded to 32 */
    assert_true(moeq_batch_entry_prefix_key(a, 40) != moeq_batch_entry_prefix_key(a, 48));
    b[3] = 9;
    assert_true(moeq_batch_entry_prefix_key(a, 64) != moeq_batch_entry_prefix_key(b, 64));
}

static void batch_entries_round_trip(void **state) {
    (void)state;
    int32_t t1[] = {1, 2, 3, -1, 2147483647}, t2[] = {9};
    moeq_batch_entry_job jobs[3] = {
        {.id = "a", .id_len = 1, .job = "{\"v\":1}", .job_len = 7, .kafka_ts_ms = 5, .arrival_ms = 6, .tokens = t1, .n_tokens = 5},
        {.id = "bb", .id_len = 2, .content_type = "application/msgpack", .content_type_len = 19, .job = "\x81", .job_len = 1,
         .kafka_ts_ms = -1, .arrival_ms = 7, .tokens = t2, .n_tokens = 1},
        {.id = "c", .id_len = 1, .job = "x", .job_len = 1},
    };
    moeq_buf buf = {0};
    assert_int_equal(moeq_batch_entry_encode_jobs(jobs, 3, &buf), MOEQ_OK);
    moeq_batch_entry_job *out;
    size_t n;
    int32_t *toks;
    char err[128];
    assert_int_equal(moeq_batch_entry_decode_jobs(buf.data, buf.len, &out, &n, &toks, err, sizeof(err)), MOEQ_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(out[1].id, "bb", 2);
    assert_int_equal(out[1].content_type_len, 19);
    assert_null(out[0].content_type);
    assert_memory_equal(out[0].job, "{\"v\":1}", 7);
    assert_int_equal(out[1].kafka_ts_ms, -1);
    assert_int_equal(out[1].arrival_ms, 7);
    assert_int_equal(out[0].n_tokens, 5);
    assert_memory_equal(out[0].tokens, t1, sizeof(t1));
    assert_int_equal(out[1].tokens[0], 9);
    assert_int_equal(out[2].n_tokens, 0);
    free(out);
    free(toks);
    /* every truncation is refused, never read past the end */
    for (size_t cut = 0; cut < buf.len; cut++) {
        moeq_err e = moeq_batch_entry_decode_jobs(buf.data, cut, &out, &n, &toks, err, sizeof(err));
        assert_int_equal(e, MOEQ_ERR_FORMAT);
        assert_null(out);
    }
    uint8_t extra[512];
    memcpy(extra, buf.data, buf.len);
    extra[buf.len] = 0;
    assert_int_equal(moeq_batch_entry_decode_jobs(extra, buf.len + 1, &out, &n, &toks, err, sizeof(err)), MOEQ_ERR_FORMAT);
    extra[0] = 'X';
    assert_int_equal(moeq_batch_entry_decode_jobs(extra, buf.len, &out, &n, &toks, err, sizeof(err)), MOEQ_ERR_FORMAT);
    moeq_buf_reset(&buf);
    assert_int_equal(moeq_batch_entry_encode_jobs(NULL, 0, &buf), MOEQ_OK);
    assert_int_equal(moeq_batch_entry_decode_jobs(buf.data, buf.len, &out, &n, &toks, err, sizeof(err)), MOEQ_OK);
    assert_int_equal(n, 0);
    free(out);
    free(toks);
    moeq_buf_free(&buf);
}

static void metrics_render_as_prometheus_text(void **state) {
    (void)state;
    moeq_coord_stats st;
    memset(&st, 0, sizeof(st));
    st.jobs_consumed = 10;
    st.jobs_rejected[MOEQ_JOB_REJECT_MALFORMED] = 2;
    st.batches_written[3] = 4;
    st.batch_jobs = 8;
    st.batch_job_slots = 16;
    st.batch_pad_tokens = 5;
    st.batch_padded_tokens = 100;
    moeq_buf out = {0};
    assert_int_equal(moeq_coord_metrics_render(&st, &out), MOEQ_OK);
    const char *t = (const char *)out.data;
    assert_non_null(strstr(t, "# TYPE moeq_coordinator_jobs_consumed_total counter\nmoeq_coordinator_jobs_consumed_total 10\n"));
    assert_non_null(strstr(t, "moeq_coordinator_jobs_rejected_total{reason=\"malformed\"} 2\n"));
    assert_non_null(strstr(t, "moeq_coordinator_batches_written_total{priority=\"3\"} 4\n"));
    assert_non_null(strstr(t, "moeq_coordinator_batch_fill_ratio 0.5000\n"));
    assert_non_null(strstr(t, "moeq_coordinator_bucket_waste_ratio 0.0500\n"));
    /* every sample line is `name[{labels}] value` */
    for (const char *line = t; *line; line = strchr(line, '\n') + 1) {
        if (*line != '#') assert_true(strncmp(line, "moeq_coordinator_", 17) == 0);
        if (!strchr(line, '\n')) break;
    }
    moeq_buf_free(&out);
}

static void coordinator_metrics_follow_the_prometheus_conventions(void **state) {
    (void)state;
    moeq_coord_stats st;
    memset(&st, 0, sizeof(st));
    moeq_coord_stats_observe_wait(&st, 3);    /* <= 5 ms  */
    moeq_coord_stats_observe_wait(&st, 700);  /* <= 1 s   */
    moeq_coord_stats_observe_wait(&st, 1e6);  /* +Inf     */
    moeq_kafka_lag lags[2] = {{.topic = "moeq.jobs", .partition = 0, .high = 10, .committed = 4, .lag = 6},
                              {.topic = "moeq.jobs", .partition = 1, .high = 3, .committed = 3, .lag = 0}};
    moeq_buf out = {0};
    assert_int_equal(moeq_coord_metrics_render(&st, &out), MOEQ_OK);
    assert_int_equal(moeq_coord_metrics_render_lag(lags, 2, &out), MOEQ_OK);
    assert_int_equal(moeq_buf_append(&out, "", 1), MOEQ_OK); /* NUL */
    const char *t = (const char *)out.data;
    char why[512];
    if (moeq_test_metrics_lint(t, why, sizeof why)) fail_msg("%s", why);
    if (moeq_test_metrics_documented(t, why, sizeof why)) fail_msg("%s", why);
    assert_non_null(strstr(t, "# TYPE moeq_coordinator_queue_wait_seconds histogram\n"));
    assert_non_null(strstr(t, "moeq_coordinator_queue_wait_seconds_bucket{le=\"0.005\"} 1\n"));
    assert_non_null(strstr(t, "moeq_coordinator_queue_wait_seconds_bucket{le=\"1\"} 2\n"));
    assert_non_null(strstr(t, "moeq_coordinator_queue_wait_seconds_bucket{le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(t, "moeq_coordinator_queue_wait_seconds_count 3\n"));
    assert_non_null(strstr(t, "moeq_coordinator_queue_wait_max_seconds 1000.000\n"));
    /* the lag summed over partitions is a gauge, named without _total */
    assert_non_null(strstr(t, "# TYPE moeq_coordinator_consumer_lag_assigned gauge\nmoeq_coordinator_consumer_lag_assigned 6\n"));
    assert_null(strstr(t, "consumer_lag_total"));
    char want[128];
    snprintf(want, sizeof want, "moeq_coordinator_build_info{version=\"%s\"} 1\n", moeq_version());
    assert_non_null(strstr(t, want));
    moeq_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_prompt_job_is_accepted_with_its_exact_token_ids),
        cmocka_unit_test(a_tokens_job_needs_no_tokenizer_but_is_checked_against_the_vocabulary),
        cmocka_unit_test(without_a_tokenizer_prompt_lengths_are_estimated),
        cmocka_unit_test(malformed_bytes_are_rejected_without_an_id),
        cmocka_unit_test(invalid_jobs_get_an_error_result_naming_the_reason),
        cmocka_unit_test(a_response_format_outside_the_subset_is_refused_at_intake),
        cmocka_unit_test(reply_to_outside_the_allow_list_is_rejected),
        cmocka_unit_test(a_job_past_its_deadline_is_answered_expired),
        cmocka_unit_test(a_job_longer_than_a_batch_is_rejected_too_large),
        cmocka_unit_test(chat_messages_are_rendered_or_rejected_when_the_model_has_no_chat_format),
        cmocka_unit_test(no_context_length_check_prompt_and_max_new_tokens_past_the_context_get_prompt_too_long),
        cmocka_unit_test(batch_entries_round_trip),
        cmocka_unit_test(a_batch_prefix_key_names_the_first_256_shared_tokens_rounded_to_16),
        cmocka_unit_test(coordinator_results_carry_the_hash_of_the_job_they_answer),
        cmocka_unit_test(metrics_render_as_prometheus_text),
        cmocka_unit_test(coordinator_metrics_follow_the_prometheus_conventions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
