/*
 * test_submit_dialect.c — the decision code of `moeq submit` (submit/), no
 * broker: OpenAI Batch lines become moeq jobs (and what moeq cannot honour
 * is an error naming the field), results become OpenAI output or error
 * lines, skipped lines become errors-file lines, an earlier run's lines read
 * back for --resume, and the summary / exit-code rule. cJSON checks that
 * what is written is JSON with the fields OpenAI's Batch API writes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "batch_dialect.h"
#include "submit_tally.h"

static moeq_err parse(moeq_dialect d, const char *line, moeq_submit_line *out) {
    return moeq_submit_line_parse(d, line, strlen(line), NULL, out);
}

/* The job built, decoded by the moeq decoder. */
static void decode_job(const moeq_submit_line *l, moeq_job *job) {
    moeq_job_reject rej;
    assert_int_equal(moeq_job_decode(l->job, l->job_len, "application/json", NULL, job, &rej), MOEQ_OK);
}

static void an_openai_batch_file_is_detected_by_its_first_line(void **state) {
    (void)state;
    const char *oa = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}";
    const char *mq = "{\"v\":1,\"id\":\"a\",\"prompt\":\"x\"}";
    assert_int_equal(moeq_dialect_detect(oa, strlen(oa)), MOEQ_DIALECT_OPENAI);
    assert_int_equal(moeq_dialect_detect(mq, strlen(mq)), MOEQ_DIALECT_MOEQ);
    assert_int_equal(moeq_dialect_detect("not json", 8), MOEQ_DIALECT_MOEQ);
}

static void an_openai_chat_line_becomes_a_moeq_job(void **state) {
    (void)state;
    moeq_submit_line l;
    assert_int_equal(parse(MOEQ_DIALECT_OPENAI,
                           "{\"custom_id\":\"req-1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":"
                           "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},{\"type\":\"text\","
                           "\"text\":\"there\"}]}],\"max_completion_tokens\":16,\"temperature\":0.7,\"top_p\":0.9,"
                           "\"stop\":\"\\n\",\"seed\":42,\"n\":1,\"stream\":false,\"user\":\"u\",\"logprobs\":null}}",
                           &l),
                     MOEQ_OK);
    assert_string_equal(l.id, "req-1");
    assert_string_equal(l.model, "gpt-4o-mini");
    assert_int_equal(l.endpoint, MOEQ_OPENAI_CHAT);
    moeq_job job;
    decode_job(&l, &job);
    assert_string_equal(job.id, "req-1");
    assert_int_equal(job.n_messages, 2);
    assert_string_equal(job.messages[0].role, "system");
    assert_string_equal(job.messages[1].content, "Hi there");
    assert_int_equal(job.max_new_tokens, 16);
    assert_true(job.temperature > 0.69 && job.temperature < 0.71);
    assert_true(job.top_p > 0.89 && job.top_p < 0.91);
    assert_int_equal(job.n_stop, 1);
    assert_string_equal(job.stop[0], "\n");
    assert_true(job.has_seed);
    assert_int_equal(job.seed, 42);
    moeq_job_free(&job);
    moeq_submit_line_free(&l);
}

static void an_openai_completions_line_becomes_a_prompt_or_tokens_job(void **state) {
    (void)state;
    moeq_submit_line l;
    assert_int_equal(parse(MOEQ_DIALECT_OPENAI,
                           "{\"custom_id\":\"c-1\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":"
                           "{\"model\":\"m\",\"prompt\":[\"Once upon\"],\"max_tokens\":5,\"stop\":[\"a\",\"b\"]}}",
                           &l),
                     MOEQ_OK);
    assert_int_equal(l.endpoint, MOEQ_OPENAI_COMPLETIONS);
    moeq_job job;
    decode_job(&l, &job);
    assert_int_equal(job.input, MOEQ_JOB_INPUT_PROMPT);
    assert_string_equal(job.prompt, "Once upon");
    assert_int_equal(job.n_stop, 2);
    moeq_job_free(&job);
    moeq_submit_line_free(&l);
    assert_int_equal(parse(MOEQ_DIALECT_OPENAI,
                           "{\"custom_id\":\"c-2\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":[1,2,3]}}", &l),
                     MOEQ_OK);
    decode_job(&l, &job);
    assert_int_equal(job.input, MOEQ_JOB_INPUT_TOKENS);
    assert_int_equal(job.n_tokens, 3);
    moeq_job_free(&job);
    moeq_submit_line_free(&l);
}

/* Each line must fail naming param, with the message containing want. */
static void expect_error(const char *line, const char *param, const char *want) {
    moeq_submit_line l;
    assert_int_not_equal(parse(MOEQ_DIALECT_OPENAI, line, &l), MOEQ_OK);
    if (strcmp(l.param, param) || !strstr(l.message, want))
        fail_msg("line %s: param '%s' message '%s' (want '%s', '%s')", line, l.param, l.message, param, want);
    assert_null(l.job);
    moeq_submit_line_free(&l);
}

static void an_unsupported_openai_field_or_url_is_an_error_naming_it(void **state) {
    (void)state;
    expect_error("{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":\"x\"}}",
                 "url", "'/v1/embeddings' is not supported");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],\"logit_bias\":{\"1\":2}}}",
                 "body.logit_bias", "not supported");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],\"n\":3}}",
                 "body.n", "only its default");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],\"max_tokens\":100000}}",
                 "body.max_tokens", "exceeds the cap");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\"}}", "body.messages",
                 "required");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/completions\",\"body\":{\"messages\":[]}}", "body.messages",
                 "belongs to /v1/chat/completions");
    expect_error("{\"custom_id\":\"e\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}",
                 "method", "only POST");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"},\"extra\":1}", "extra",
                 "not a field of an OpenAI Batch request");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\","
                 "\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}}",
                 "body.messages[0].content", "not type image_url");
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"a\\u0000b\"}}", "",
                 "\\u0000");
    expect_error("{\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}", "custom_id", "required");
}

static void a_moeq_line_is_judged_by_the_job_decoder(void **state) {
    (void)state;
    moeq_submit_line l;
    const char *good = "{\"v\":1,\"id\":\"m-1\",\"prompt\":\"hi\"}";
    assert_int_equal(parse(MOEQ_DIALECT_MOEQ, good, &l), MOEQ_OK);
    assert_string_equal(l.job, good); /* sent exactly as written */
    moeq_submit_line_free(&l);
    assert_int_not_equal(parse(MOEQ_DIALECT_MOEQ, "{\"v\":1,\"id\":\"m-2\"}", &l), MOEQ_OK);
    assert_string_equal(l.code, "missing_field");
    moeq_submit_line_free(&l);
}

static moeq_result ok_result(const char *id, const char *text) {
    moeq_result r = {.id = (char *)id, .status = MOEQ_RESULT_OK, .text = (char *)text,
                     .finish_reason = MOEQ_FINISH_STOP_TOKEN, .model = "tiny"};
    r.text_len = strlen(text);
    r.usage.prompt_tokens = 7;
    r.usage.completion_tokens = 3;
    return r;
}

static cJSON *result_json(moeq_dialect d, const moeq_submit_line *req, const moeq_result *r, int *to_errors) {
    moeq_buf b = {0};
    char err[256];
    assert_int_equal(moeq_submit_result_line(d, req, r, "00ff00ff00ff00ff", 1767225600, &b, to_errors, err, sizeof err),
                     MOEQ_OK);
    cJSON *j = cJSON_ParseWithLength((const char *)b.data, b.len);
    if (!j) fail_msg("not JSON: %.*s", (int)b.len, (const char *)b.data);
    moeq_buf_free(&b);
    return j;
}

static const cJSON *at(const cJSON *j, const char *path) { /* "a.b.0.c" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && j; tok = strtok(NULL, "."))
        j = (*tok >= '0' && *tok <= '9') ? cJSON_GetArrayItem(j, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(j, tok);
    return j;
}

static void openai_response_format_penalties_and_logprobs_map_to_the_job_fields(void **state) {
    (void)state;
    moeq_submit_line l;
    assert_int_equal(parse(MOEQ_DIALECT_OPENAI,
                           "{\"custom_id\":\"s-1\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{"
                           "\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
                           "\"json_schema\":{\"name\":\"r\",\"strict\":true,\"schema\":{\"type\":\"object\","
                           "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}},"
                           "\"presence_penalty\":0.5,\"frequency_penalty\":-0.25,\"logprobs\":true,\"top_logprobs\":3}}",
                           &l),
                     MOEQ_OK);
    assert_true(l.logprobs);
    moeq_job job;
    decode_job(&l, &job);
    assert_int_equal(job.response_format.type, MOEQ_RESPONSE_JSON_SCHEMA);
    assert_string_equal(job.response_format.name, "r");
    assert_non_null(strstr(job.response_format.schema, "\"required\":[\"a\"]"));
    assert_true(job.presence_penalty == 0.5 && job.frequency_penalty == -0.25);
    assert_true(job.logprobs);
    assert_int_equal(job.top_logprobs, 3);
    moeq_job_free(&job);
    moeq_submit_line_free(&l);
    /* the legacy completions API counts alternatives in logprobs itself */
    assert_int_equal(parse(MOEQ_DIALECT_OPENAI,
                           "{\"custom_id\":\"s-2\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\","
                           "\"logprobs\":2,\"response_format\":{\"type\":\"text\"}}}",
                           &l),
                     MOEQ_OK);
    decode_job(&l, &job);
    assert_true(job.logprobs);
    assert_int_equal(job.top_logprobs, 2);
    assert_int_equal(job.response_format.type, MOEQ_RESPONSE_TEXT);
    moeq_job_free(&job);
    moeq_submit_line_free(&l);
    expect_error("{\"custom_id\":\"e\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}}",
                 "body.response_format.type", "'xml' is not supported");
}

static void result_logprobs_are_written_in_openais_shape_with_token_ids(void **state) {
    (void)state;
    moeq_submit_line chat = {.endpoint = MOEQ_OPENAI_CHAT, .logprobs = 1};
    moeq_submit_line comp = {.endpoint = MOEQ_OPENAI_COMPLETIONS, .logprobs = 1};
    moeq_result r = ok_result("req-1", "ab");
    int32_t top[2] = {7, 9};
    double top_lp[2] = {-0.5, -1.5};
    moeq_result_logprob lps[2] = {{.token = 7, .logprob = -0.5, .n_top = 2, .top_tokens = top, .top_logprobs = top_lp},
                                  {.token = 9, .logprob = -0.25}};
    r.logprobs = lps;
    r.n_logprobs = 2;
    int to_errors = 1;
    cJSON *j = result_json(MOEQ_DIALECT_OPENAI, &chat, &r, &to_errors);
    assert_string_equal(at(j, "response.body.choices.0.logprobs.content.0.token")->valuestring, "token_id:7");
    assert_true(at(j, "response.body.choices.0.logprobs.content.1.logprob")->valuedouble == -0.25);
    assert_string_equal(at(j, "response.body.choices.0.logprobs.content.0.top_logprobs.1.token")->valuestring,
                        "token_id:9");
    cJSON_Delete(j);
    j = result_json(MOEQ_DIALECT_OPENAI, &comp, &r, &to_errors);
    assert_string_equal(at(j, "response.body.choices.0.logprobs.tokens.1")->valuestring, "token_id:9");
    assert_true(at(j, "response.body.choices.0.logprobs.token_logprobs.0")->valuedouble == -0.5);
    assert_true(at(j, "response.body.choices.0.logprobs.top_logprobs.0.token_id:9")->valuedouble == -1.5);
    cJSON_Delete(j);
    chat.logprobs = 0; /* not asked: null, as OpenAI writes it */
    j = result_json(MOEQ_DIALECT_OPENAI, &chat, &r, &to_errors);
    assert_true(cJSON_IsNull(at(j, "response.body.choices.0.logprobs")));
    cJSON_Delete(j);
}

static void an_ok_result_becomes_an_openai_output_line(void **state) {
    (void)state;
    moeq_submit_line chat = {.endpoint = MOEQ_OPENAI_CHAT}, comp = {.endpoint = MOEQ_OPENAI_COMPLETIONS};
    moeq_result r = ok_result("req-1", "Hello \"you\"");
    int to_errors = 1;
    cJSON *j = result_json(MOEQ_DIALECT_OPENAI, &chat, &r, &to_errors);
    assert_int_equal(to_errors, 0);
    assert_string_equal(at(j, "id")->valuestring, "batch_req_00ff00ff00ff00ff");
    assert_string_equal(at(j, "custom_id")->valuestring, "req-1");
    assert_true(cJSON_IsNull(at(j, "error")));
    assert_int_equal(at(j, "response.status_code")->valueint, 200);
    assert_non_null(at(j, "response.request_id"));
    assert_string_equal(at(j, "response.body.object")->valuestring, "chat.completion");
    assert_int_equal(at(j, "response.body.created")->valueint, 1767225600);
    assert_string_equal(at(j, "response.body.model")->valuestring, "tiny");
    assert_string_equal(at(j, "response.body.choices.0.message.role")->valuestring, "assistant");
    assert_string_equal(at(j, "response.body.choices.0.message.content")->valuestring, "Hello \"you\"");
    assert_string_equal(at(j, "response.body.choices.0.finish_reason")->valuestring, "stop");
    assert_int_equal(at(j, "response.body.usage.total_tokens")->valueint, 10);
    cJSON_Delete(j);
    r.finish_reason = MOEQ_FINISH_LENGTH;
    j = result_json(MOEQ_DIALECT_OPENAI, &comp, &r, &to_errors);
    assert_string_equal(at(j, "response.body.object")->valuestring, "text_completion");
    assert_string_equal(at(j, "response.body.choices.0.text")->valuestring, "Hello \"you\"");
    assert_string_equal(at(j, "response.body.choices.0.finish_reason")->valuestring, "length");
    cJSON_Delete(j);
}

static void a_failed_expired_or_cancelled_result_goes_to_the_openai_errors_file(void **state) {
    (void)state;
    moeq_submit_line chat = {.endpoint = MOEQ_OPENAI_CHAT};
    moeq_result r = {.id = "req-2", .status = MOEQ_RESULT_ERROR};
    r.error.code = "prompt_too_long";
    r.error.message = "prompt 900 + max_new_tokens 200 > context 1024";
    int to_errors = 0;
    cJSON *j = result_json(MOEQ_DIALECT_OPENAI, &chat, &r, &to_errors);
    assert_int_equal(to_errors, 1);
    assert_int_equal(at(j, "response.status_code")->valueint, 400);
    assert_string_equal(at(j, "response.body.error.type")->valuestring, "invalid_request_error");
    assert_string_equal(at(j, "response.body.error.code")->valuestring, "prompt_too_long");
    cJSON_Delete(j);
    r.error.code = "engine";
    j = result_json(MOEQ_DIALECT_OPENAI, &chat, &r, &to_errors);
    assert_int_equal(at(j, "response.status_code")->valueint, 500);
    cJSON_Delete(j);
    r.status = MOEQ_RESULT_EXPIRED;
    j = result_json(MOEQ_DIALECT_OPENAI, &chat, &r, &to_errors);
    assert_int_equal(to_errors, 1);
    assert_true(cJSON_IsNull(at(j, "response")));
    assert_string_equal(at(j, "error.code")->valuestring, "batch_expired");
    cJSON_Delete(j);
    r.status = MOEQ_RESULT_CANCELLED;
    j = result_json(MOEQ_DIALECT_OPENAI, &chat, &r, &to_errors);
    assert_string_equal(at(j, "error.code")->valuestring, "batch_cancelled");
    cJSON_Delete(j);
    /* moeq dialect: every result to --out, as schemas/result.md */
    j = result_json(MOEQ_DIALECT_MOEQ, &chat, &r, &to_errors);
    assert_int_equal(to_errors, 0);
    assert_string_equal(at(j, "status")->valuestring, "cancelled");
    cJSON_Delete(j);
}

static void result_text_with_nul_is_written_escaped(void **state) {
    (void)state;
    moeq_submit_line comp = {.endpoint = MOEQ_OPENAI_COMPLETIONS};
    moeq_result r = ok_result("n", "a");
    r.text = "a\0b";
    r.text_len = 3;
    moeq_buf b = {0};
    int to_errors;
    char err[128];
    assert_int_equal(moeq_submit_result_line(MOEQ_DIALECT_OPENAI, &comp, &r, "1", 0, &b, &to_errors, err, sizeof err),
                     MOEQ_OK);
    assert_non_null(strstr((const char *)b.data, "\"text\":\"a\\u0000b\""));
    moeq_buf_free(&b);
}

static void a_skipped_line_is_an_errors_file_line_naming_its_line_and_field(void **state) {
    (void)state;
    moeq_submit_line l;
    assert_int_not_equal(parse(MOEQ_DIALECT_OPENAI,
                               "{\"custom_id\":\"s\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\",\"suffix\":\"y\"}}",
                               &l),
                         MOEQ_OK);
    moeq_buf b = {0};
    assert_int_equal(moeq_submit_invalid_line(MOEQ_DIALECT_OPENAI, 7, &l, &b), MOEQ_OK);
    cJSON *j = cJSON_ParseWithLength((const char *)b.data, b.len);
    assert_non_null(j);
    assert_string_equal(at(j, "custom_id")->valuestring, "s");
    assert_true(cJSON_IsNull(at(j, "response")));
    assert_int_equal(at(j, "error.line")->valueint, 7);
    assert_string_equal(at(j, "error.param")->valuestring, "body.suffix");
    /* read back by --resume, it is not an answer: the line is not a job that ran */
    char id[MOEQ_JOB_ID_HARD_MAX + 1];
    moeq_result_status st;
    assert_int_equal(moeq_submit_answer_parse(MOEQ_DIALECT_OPENAI, (const char *)b.data, b.len, id, sizeof id, &st), 0);
    cJSON_Delete(j);
    moeq_buf_free(&b);
    moeq_submit_line_free(&l);
    assert_int_not_equal(parse(MOEQ_DIALECT_MOEQ, "{\"v\":1,\"id\":\"q\",\"prompt\":\"\"}", &l), MOEQ_OK);
    assert_int_equal(moeq_submit_invalid_line(MOEQ_DIALECT_MOEQ, 3, &l, &b), MOEQ_OK);
    j = cJSON_ParseWithLength((const char *)b.data, b.len);
    assert_int_equal(at(j, "line")->valueint, 3);
    assert_string_equal(at(j, "id")->valuestring, "q"); /* the id, when the decoder could read it */
    assert_string_equal(at(j, "error.field")->valuestring, "prompt");
    assert_int_equal(moeq_submit_answer_parse(MOEQ_DIALECT_MOEQ, (const char *)b.data, b.len, id, sizeof id, &st), 0);
    cJSON_Delete(j);
    moeq_buf_free(&b);
    moeq_submit_line_free(&l);
}

static void resume_reads_back_the_answers_an_earlier_run_wrote(void **state) {
    (void)state;
    moeq_submit_line chat = {.endpoint = MOEQ_OPENAI_CHAT};
    moeq_result r = ok_result("again-1", "x");
    const moeq_result_status all[] = {MOEQ_RESULT_OK, MOEQ_RESULT_ERROR, MOEQ_RESULT_EXPIRED, MOEQ_RESULT_CANCELLED};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 4; i++) {
            r.status = all[i];
            r.error.code = i ? "engine" : NULL;
            moeq_buf b = {0};
            int to_errors;
            char err[128], id[MOEQ_JOB_ID_HARD_MAX + 1];
            assert_int_equal(moeq_submit_result_line((moeq_dialect)d, &chat, &r, "ab", 0, &b, &to_errors, err, sizeof err),
                             MOEQ_OK);
            moeq_result_status st = MOEQ_RESULT_STATUS__COUNT;
            assert_int_equal(moeq_submit_answer_parse((moeq_dialect)d, (const char *)b.data, b.len, id, sizeof id, &st), 1);
            assert_string_equal(id, "again-1");
            assert_int_equal(st, all[i]);
            moeq_buf_free(&b);
        }
}

static void an_all_error_run_exits_non_zero(void **state) {
    (void)state;
    moeq_submit_tally t = {.jobs = 3};
    t.by_status[MOEQ_RESULT_ERROR] = 3;
    assert_int_equal(moeq_submit_exit_code(&t), MOEQ_SUBMIT_EXIT_NOT_OK);
    t.by_status[MOEQ_RESULT_ERROR] = 0;
    t.by_status[MOEQ_RESULT_OK] = 3;
    assert_int_equal(moeq_submit_exit_code(&t), MOEQ_SUBMIT_EXIT_OK);
    t.invalid = 1; /* a skipped line is not ok */
    assert_int_equal(moeq_submit_exit_code(&t), MOEQ_SUBMIT_EXIT_NOT_OK);
    t.by_status[MOEQ_RESULT_OK] = 2; /* one without a result: incomplete, --resume waits for it */
    assert_int_equal(moeq_submit_tally_no_result(&t), 1);
    assert_int_equal(moeq_submit_exit_code(&t), MOEQ_SUBMIT_EXIT_INCOMPLETE);
    t.broker_failed = 1;
    assert_int_equal(moeq_submit_exit_code(&t), MOEQ_SUBMIT_EXIT_BROKER);
}

static void the_summary_counts_ok_error_expired_and_cancelled(void **state) {
    (void)state;
    moeq_submit_tally t = {.jobs = 7, .not_run = 1, .invalid = 2, .resumed = 1};
    t.by_status[MOEQ_RESULT_OK] = 2;
    t.by_status[MOEQ_RESULT_ERROR] = 1;
    t.by_status[MOEQ_RESULT_EXPIRED] = 1;
    t.by_status[MOEQ_RESULT_CANCELLED] = 1;
    char line[512];
    moeq_submit_summary(&t, 1.25, line, sizeof line);
    assert_string_equal(line, "summary jobs=7 ok=2 error=1 expired=1 cancelled=1 not_run=1 no_result=1 invalid=2 "
                              "resumed=1 stale=0 seconds=1.2 exit=4");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_openai_batch_file_is_detected_by_its_first_line),
        cmocka_unit_test(an_openai_chat_line_becomes_a_moeq_job),
        cmocka_unit_test(an_openai_completions_line_becomes_a_prompt_or_tokens_job),
        cmocka_unit_test(an_unsupported_openai_field_or_url_is_an_error_naming_it),
        cmocka_unit_test(a_moeq_line_is_judged_by_the_job_decoder),
        cmocka_unit_test(openai_response_format_penalties_and_logprobs_map_to_the_job_fields),
        cmocka_unit_test(result_logprobs_are_written_in_openais_shape_with_token_ids),
        cmocka_unit_test(an_ok_result_becomes_an_openai_output_line),
        cmocka_unit_test(a_failed_expired_or_cancelled_result_goes_to_the_openai_errors_file),
        cmocka_unit_test(result_text_with_nul_is_written_escaped),
        cmocka_unit_test(a_skipped_line_is_an_errors_file_line_naming_its_line_and_field),
        cmocka_unit_test(resume_reads_back_the_answers_an_earlier_run_wrote),
        cmocka_unit_test(an_all_error_run_exits_non_zero),
        cmocka_unit_test(the_summary_counts_ok_error_expired_and_cancelled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
