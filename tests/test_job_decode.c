/*
 * test_job_decode.c — behaviour of moeq_job_decode / moeq_job_encode that
 * the golden vectors do not show on their own: the id carried by rejects,
 * configurable limits, format detection, reject names, encode->decode.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/job.h"

/* Decode a NUL-terminated JSON text with default limits. */
static moeq_err decode_json(const char *text, moeq_job *job, moeq_job_reject *rej) {
    return moeq_job_decode(text, strlen(text), "application/json", NULL, job, rej);
}

static void a_rejected_job_carries_its_id_when_it_could_be_read(void **state) {
    (void)state;
    moeq_job job;
    moeq_job_reject rej;
    assert_int_equal(decode_json("{\"v\":1,\"id\":\"doc-9\",\"prompt\":\"x\",\"max_new_tokens\":100000}", &job, &rej),
                     MOEQ_ERR_FORMAT);
    assert_int_equal(rej.code, MOEQ_JOB_REJECT_OUT_OF_RANGE);
    assert_true(rej.has_id);
    assert_string_equal(rej.id, "doc-9");
    assert_string_equal(rej.field, "max_new_tokens");
    assert_string_equal(rej.message, "field 'max_new_tokens': 100000 exceeds the cap 8192");
    assert_int_equal(rej.format, MOEQ_WIRE_JSON);
    /* the id is carried even when the document breaks after it */
    assert_int_equal(decode_json("{\"v\":1,\"id\":\"doc-9\",\"prompt\":\"x\"", &job, &rej), MOEQ_ERR_PARSE);
    assert_int_equal(rej.code, MOEQ_JOB_REJECT_MALFORMED);
    assert_true(rej.has_id);
    assert_string_equal(rej.id, "doc-9");
}

static void a_reject_carries_no_id_it_could_not_trust(void **state) {
    (void)state;
    moeq_job job;
    moeq_job_reject rej;
    decode_json("{\"v\":1,\"prompt\":\"x\"", &job, &rej); /* broken before any id */
    assert_false(rej.has_id);
    decode_json("{\"v\":1,\"id\":\"\",\"prompt\":\"x\"}", &job, &rej); /* empty */
    assert_false(rej.has_id);
    decode_json("{\"v\":1,\"id\":\"a\\tb\",\"prompt\":\"x\"}", &job, &rej); /* control character */
    assert_false(rej.has_id);
    assert_int_equal(rej.code, MOEQ_JOB_REJECT_INVALID_VALUE);
    decode_json("{\"v\":1,\"id\":7,\"prompt\":\"x\"}", &job, &rej);
    assert_false(rej.has_id);
}

static void limits_are_configurable_through_the_property_table(void **state) {
    (void)state;
    moeq_job_limits limits = moeq_job_default_limits();
    assert_int_equal(limits.max_new_tokens, 8192);
    assert_int_equal(limits.max_depth, 32);
    assert_int_equal(moeq_props_set(moeq_job_limits_props, &limits, "max_new_tokens", "16", NULL, 0), MOEQ_OK);
    const char *text = "{\"v\":1,\"id\":\"a\",\"prompt\":\"x\",\"max_new_tokens\":17}";
    moeq_job job;
    moeq_job_reject rej;
    assert_int_equal(moeq_job_decode(text, strlen(text), NULL, &limits, &job, &rej), MOEQ_ERR_FORMAT);
    assert_string_equal(rej.message, "field 'max_new_tokens': 17 exceeds the cap 16");
    assert_int_equal(moeq_props_set(moeq_job_limits_props, &limits, "max_new_tokens", "17", NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_job_decode(text, strlen(text), NULL, &limits, &job, &rej), MOEQ_OK);
    assert_int_equal(job.max_new_tokens, 17);
    moeq_job_free(&job);
}

static void unusable_limits_are_refused_naming_the_limit(void **state) {
    (void)state;
    moeq_job_limits limits = moeq_job_default_limits();
    char errstr[128];
    assert_int_equal(moeq_job_limits_check(&limits, errstr, sizeof errstr), MOEQ_OK);
    limits.max_depth = MOEQ_JOB_DEPTH_HARD_MAX + 1;
    assert_int_equal(moeq_job_limits_check(&limits, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "max_depth"));
    moeq_job job;
    assert_int_equal(moeq_job_decode("{}", 2, NULL, &limits, &job, NULL), MOEQ_ERR_INVALID_ARG);
    limits = moeq_job_default_limits();
    limits.max_id_bytes = 0;
    assert_int_equal(moeq_job_decode("{}", 2, NULL, &limits, &job, NULL), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_job_decode(NULL, 2, NULL, NULL, &job, NULL), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_job_decode("{}", 2, NULL, NULL, NULL, NULL), MOEQ_ERR_INVALID_ARG);
}

static void every_reject_code_has_a_stable_name_that_maps_back(void **state) {
    (void)state;
    static const char *const names[] = {"none",         "malformed",     "not_a_map",    "unsupported_version",
                                        "missing_field", "wrong_type",   "out_of_range", "too_large",
                                        "invalid_utf8", "too_deep",      "conflicting_input", "duplicate_key",
                                        "invalid_value"};
    assert_int_equal(sizeof names / sizeof names[0], MOEQ_JOB_REJECT__COUNT);
    for (int c = 0; c < MOEQ_JOB_REJECT__COUNT; c++) {
        assert_string_equal(moeq_job_reject_code_name((moeq_job_reject_code)c), names[c]);
        assert_int_equal(moeq_job_reject_code_from_name(names[c]), c);
    }
    assert_string_equal(moeq_job_reject_code_name(MOEQ_JOB_REJECT__COUNT), "unknown");
    assert_int_equal(moeq_job_reject_code_from_name("nope"), MOEQ_JOB_REJECT_NONE);
    assert_int_equal(moeq_job_reject_err(MOEQ_JOB_REJECT_TOO_DEEP), MOEQ_ERR_LIMIT);
    assert_int_equal(moeq_job_reject_err(MOEQ_JOB_REJECT_UNSUPPORTED_VERSION), MOEQ_ERR_UNSUPPORTED);
}

static void the_content_type_header_wins_over_sniffing(void **state) {
    (void)state;
    assert_int_equal(moeq_wire_detect("{", 1, NULL), MOEQ_WIRE_JSON);
    assert_int_equal(moeq_wire_detect(" \n{", 3, NULL), MOEQ_WIRE_JSON);
    assert_int_equal(moeq_wire_detect("\x81", 1, NULL), MOEQ_WIRE_MSGPACK);
    assert_int_equal(moeq_wire_detect("\xde\x00\x01", 3, NULL), MOEQ_WIRE_MSGPACK);
    assert_int_equal(moeq_wire_detect("[", 1, NULL), MOEQ_WIRE_UNKNOWN);
    assert_int_equal(moeq_wire_detect("{", 1, "application/msgpack"), MOEQ_WIRE_MSGPACK);
    assert_int_equal(moeq_wire_detect("\x81", 1, " application/JSON ;charset=utf-8"), MOEQ_WIRE_JSON);
    assert_int_equal(moeq_wire_detect("\x81", 1, "application/jsonx"), MOEQ_WIRE_MSGPACK); /* unknown: sniffed */
    assert_int_equal(moeq_wire_detect(NULL, 0, NULL), MOEQ_WIRE_UNKNOWN);
}

static moeq_job sample_job(moeq_job_input input) {
    static char *stops[] = {"\n\n", "END"};
    static int32_t tokens[] = {0, 5, 70000, 2147483647};
    static moeq_job_message msgs[] = {{"system", "be brief", 8}, {"user", "h\xc3\xa9llo \"q\" \\ \x01", 13}};
    for (int i = 0; i < 2; i++) msgs[i].content_len = strlen(msgs[i].content);
    moeq_job job;
    memset(&job, 0, sizeof job);
    job.id = "job-\xe2\x9c\x93";
    job.priority = 1;
    job.input = input;
    job.prompt = "line1\nline2\t\xf0\x9f\x98\x80";
    job.prompt_len = strlen(job.prompt);
    job.messages = msgs;
    job.n_messages = 2;
    job.tokens = tokens;
    job.n_tokens = 4;
    job.max_new_tokens = 77;
    job.temperature = 0.7;
    job.top_p = 0.95;
    job.top_k = 50;
    job.has_seed = 1;
    job.seed = UINT64_MAX;
    job.stop = stops;
    job.n_stop = 2;
    job.deadline_ms = 1767225600123;
    job.reply_to = "team.results";
    job.mtp = 0;
    return job;
}

static void an_encoded_job_decodes_to_the_same_job_in_both_formats(void **state) {
    (void)state;
    for (int f = MOEQ_WIRE_MSGPACK; f <= MOEQ_WIRE_JSON; f++) {
        for (int in = MOEQ_JOB_INPUT_PROMPT; in <= MOEQ_JOB_INPUT_TOKENS; in++) {
            moeq_job job = sample_job((moeq_job_input)in);
            moeq_buf buf = {0};
            assert_int_equal(moeq_job_encode(&job, (moeq_wire_format)f, &buf), MOEQ_OK);
            moeq_job back;
            moeq_job_reject rej;
            moeq_err err = moeq_job_decode(buf.data, buf.len, NULL, NULL, &back, &rej);
            if (err != MOEQ_OK) fail_msg("%s: %s", moeq_job_reject_code_name(rej.code), rej.message);
            assert_int_equal(back.format, f);
            assert_string_equal(back.id, job.id);
            assert_int_equal(back.input, in);
            if (in == MOEQ_JOB_INPUT_PROMPT) assert_string_equal(back.prompt, job.prompt);
            if (in == MOEQ_JOB_INPUT_MESSAGES) {
                assert_int_equal(back.n_messages, 2);
                assert_string_equal(back.messages[1].role, "user");
                assert_string_equal(back.messages[1].content, job.messages[1].content);
            }
            if (in == MOEQ_JOB_INPUT_TOKENS) assert_memory_equal(back.tokens, job.tokens, sizeof(int32_t) * 4);
            assert_int_equal(back.priority, 1);
            assert_int_equal(back.max_new_tokens, 77);
            assert_true(back.temperature == 0.7 && back.top_p == 0.95);
            assert_int_equal(back.top_k, 50);
            assert_true(back.has_seed && back.seed == UINT64_MAX);
            assert_int_equal(back.n_stop, 2);
            assert_string_equal(back.stop[0], "\n\n");
            assert_int_equal(back.deadline_ms, 1767225600123);
            assert_string_equal(back.reply_to, "team.results");
            assert_int_equal(back.mtp, 0);
            moeq_job_free(&back);
            moeq_buf_free(&buf);
        }
    }
}

static void metadata_comes_back_byte_for_byte(void **state) {
    (void)state;
    const char *text = "{\"v\":1,\"id\":\"a\",\"metadata\": { \"k\" : [1, 2.50, \"\\u00e9\"] } ,\"prompt\":\"x\"}";
    moeq_job job;
    assert_int_equal(decode_json(text, &job, NULL), MOEQ_OK);
    const char *want = "{ \"k\" : [1, 2.50, \"\\u00e9\"] }";
    assert_int_equal(job.metadata_len, strlen(want));
    assert_memory_equal(job.metadata, want, strlen(want));
    moeq_buf buf = {0};
    assert_int_equal(moeq_job_encode(&job, MOEQ_WIRE_JSON, &buf), MOEQ_OK);
    assert_non_null(strstr((char *)buf.data, want));
    /* metadata cannot be written into the other format by the job encoder */
    assert_int_equal(moeq_job_encode(&job, MOEQ_WIRE_MSGPACK, &buf), MOEQ_ERR_INVALID_ARG);
    moeq_buf_free(&buf);
    moeq_job_free(&job);
}

static void defaults_apply_to_absent_fields(void **state) {
    (void)state;
    moeq_job job;
    assert_int_equal(decode_json("{\"v\":1,\"id\":\"a\",\"tokens\":[1]}", &job, NULL), MOEQ_OK);
    assert_int_equal(job.priority, MOEQ_JOB_DEFAULT_PRIORITY);
    assert_int_equal(job.max_new_tokens, MOEQ_JOB_DEFAULT_MAX_NEW_TOKENS);
    assert_true(job.temperature == 1.0 && job.top_p == 1.0);
    assert_int_equal(job.top_k, 0);
    assert_false(job.has_seed);
    assert_null(job.stop);
    assert_null(job.reply_to);
    assert_null(job.metadata);
    assert_int_equal(job.deadline_ms, 0);
    assert_int_equal(job.mtp, 1);
    moeq_job_free(&job);
    moeq_job_free(&job); /* a zeroed job is safe to free again */
    moeq_job_free(NULL);
}

static void a_nul_in_the_middle_of_json_cannot_hide_the_rest(void **state) {
    (void)state;
    /* a raw NUL byte is a control character in a JSON string */
    const char text[] = "{\"v\":1,\"id\":\"a\",\"prompt\":\"x\0y\"}";
    moeq_job job;
    moeq_job_reject rej;
    assert_int_equal(moeq_job_decode(text, sizeof text - 1, NULL, NULL, &job, &rej), MOEQ_ERR_PARSE);
    assert_int_equal(rej.code, MOEQ_JOB_REJECT_MALFORMED);
    assert_string_equal(rej.field, "prompt");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_rejected_job_carries_its_id_when_it_could_be_read),
        cmocka_unit_test(a_reject_carries_no_id_it_could_not_trust),
        cmocka_unit_test(limits_are_configurable_through_the_property_table),
        cmocka_unit_test(unusable_limits_are_refused_naming_the_limit),
        cmocka_unit_test(every_reject_code_has_a_stable_name_that_maps_back),
        cmocka_unit_test(the_content_type_header_wins_over_sniffing),
        cmocka_unit_test(an_encoded_job_decodes_to_the_same_job_in_both_formats),
        cmocka_unit_test(metadata_comes_back_byte_for_byte),
        cmocka_unit_test(defaults_apply_to_absent_fields),
        cmocka_unit_test(a_nul_in_the_middle_of_json_cannot_hide_the_rest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
