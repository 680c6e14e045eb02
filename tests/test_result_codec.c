/*
 * test_result_codec.c — results encode and decode in both formats, are read
 * by independent decoders (msgpack-c, cJSON), echo job metadata, and never
 * become unpublishable because of engine text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/job.h"
#include "moeq/result.h"

static moeq_result full_result(void) {
    static int32_t tokens[] = {1, 200, 70000};
    moeq_result res;
    memset(&res, 0, sizeof res);
    res.id = "doc-1";
    res.status = MOEQ_RESULT_OK;
    res.text = "The cat \"sat\".\n\xe2\x9c\x93";
    res.tokens = tokens;
    res.n_tokens = 3;
    res.finish_reason = MOEQ_FINISH_STOP_TOKEN;
    res.usage.prompt_tokens = 12;
    res.usage.completion_tokens = 3;
    res.timings.queued_ms = 5;
    res.timings.batched_ms = 6;
    res.timings.prefill_ms = 7;
    res.timings.decode_ms = 8;
    res.timings.total_ms = 4000000000LL;
    res.model = "deepseek-v3-tiny";
    res.worker = "gpu-0";
    res.has_mtp = 1;
    res.mtp.drafted = 10;
    res.mtp.accepted = 7;
    return res;
}

static void check_same(const moeq_result *a, const moeq_result *b) {
    assert_string_equal(a->id, b->id);
    assert_int_equal(a->status, b->status);
    if (a->text) assert_string_equal(a->text, b->text);
    else assert_null(b->text);
    assert_int_equal(a->n_tokens, b->n_tokens);
    if (a->n_tokens) assert_memory_equal(a->tokens, b->tokens, a->n_tokens * sizeof(int32_t));
    assert_int_equal(a->finish_reason, b->finish_reason);
    assert_memory_equal(&a->usage, &b->usage, sizeof a->usage);
    assert_memory_equal(&a->timings, &b->timings, sizeof a->timings);
    if (a->model) assert_string_equal(a->model, b->model);
    if (a->worker) assert_string_equal(a->worker, b->worker);
    if (a->error.code) {
        assert_string_equal(a->error.code, b->error.code);
        assert_string_equal(a->error.message, b->error.message);
    } else {
        assert_null(b->error.code);
    }
    assert_int_equal(a->has_mtp, b->has_mtp);
    assert_memory_equal(&a->mtp, &b->mtp, sizeof a->mtp);
}

static void a_result_round_trips_through_both_formats(void **state) {
    (void)state;
    moeq_result res = full_result();
    for (int f = MOEQ_WIRE_MSGPACK; f <= MOEQ_WIRE_JSON; f++) {
        moeq_buf buf = {0};
        char errstr[256] = "";
        assert_int_equal(moeq_result_encode(&res, (moeq_wire_format)f, &buf, errstr, sizeof errstr), MOEQ_OK);
        moeq_result back;
        moeq_err err = moeq_result_decode(buf.data, buf.len, moeq_wire_content_type((moeq_wire_format)f), 0, &back,
                                          errstr, sizeof errstr);
        if (err != MOEQ_OK) fail_msg("%s", errstr);
        check_same(&res, &back);
        moeq_result_free(&back);
        moeq_buf_free(&buf);
    }
}

static void an_error_result_for_a_rejected_job_round_trips(void **state) {
    (void)state;
    const char *text = "{\"v\":1,\"id\":\"j7\",\"prompt\":\"x\",\"top_p\":0,\"metadata\":{\"t\":1}}";
    moeq_job job;
    moeq_job_reject rej;
    assert_int_equal(moeq_job_decode(text, strlen(text), NULL, NULL, &job, &rej), MOEQ_ERR_FORMAT);
    moeq_result res;
    memset(&res, 0, sizeof res);
    res.id = rej.id;
    res.status = MOEQ_RESULT_ERROR;
    res.error.code = (char *)moeq_job_reject_code_name(rej.code);
    res.error.message = rej.message;
    moeq_buf buf = {0};
    assert_int_equal(moeq_result_encode(&res, rej.format, &buf, NULL, 0), MOEQ_OK);
    assert_string_equal((char *)buf.data, "{\"v\":1,\"id\":\"j7\",\"status\":\"error\",\"usage\":{\"prompt_tokens\":0,"
                                          "\"completion_tokens\":0},\"error\":{\"code\":\"out_of_range\",\"message\":"
                                          "\"field 'top_p': 0 is outside (0, 1]\"}}");
    moeq_result back;
    assert_int_equal(moeq_result_decode(buf.data, buf.len, NULL, 0, &back, NULL, 0), MOEQ_OK);
    check_same(&res, &back);
    moeq_result_free(&back);
    moeq_buf_free(&buf);
}

static void msgpack_c_reads_what_we_encode(void **state) {
    (void)state;
    moeq_result res = full_result();
    moeq_buf buf = {0};
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_MSGPACK, &buf, NULL, 0), MOEQ_OK);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, (const char *)buf.data, buf.len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, buf.len);
    msgpack_object o = up.data;
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    int seen = 0;
    for (uint32_t i = 0; i < o.via.map.size; i++) {
        msgpack_object_kv *kv = &o.via.map.ptr[i];
        assert_int_equal(kv->key.type, MSGPACK_OBJECT_STR);
        if (kv->key.via.str.size == 2 && !memcmp(kv->key.via.str.ptr, "id", 2)) {
            assert_int_equal(kv->val.type, MSGPACK_OBJECT_STR);
            assert_memory_equal(kv->val.via.str.ptr, "doc-1", 5);
            seen++;
        }
        if (kv->key.via.str.size == 7 && !memcmp(kv->key.via.str.ptr, "timings", 7)) {
            assert_int_equal(kv->val.type, MSGPACK_OBJECT_MAP);
            assert_int_equal(kv->val.via.map.ptr[4].val.via.u64, 4000000000ULL);
            seen++;
        }
        if (kv->key.via.str.size == 3 && !memcmp(kv->key.via.str.ptr, "mtp", 3)) { /* 7 of 10 drafts kept */
            assert_int_equal(kv->val.via.map.size, 3);
            assert_int_equal(kv->val.via.map.ptr[2].val.type, MSGPACK_OBJECT_FLOAT64);
            assert_true(kv->val.via.map.ptr[2].val.via.f64 == 0.7);
            seen++;
        }
    }
    assert_int_equal(seen, 3);
    msgpack_unpacked_destroy(&up);
    moeq_buf_free(&buf);
}

static void cjson_reads_what_we_encode(void **state) {
    (void)state;
    moeq_result res = full_result();
    moeq_buf buf = {0};
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_JSON, &buf, NULL, 0), MOEQ_OK);
    cJSON *o = cJSON_ParseWithLength((const char *)buf.data, buf.len);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "text")->valuestring, res.text);
    assert_string_equal(cJSON_GetObjectItem(o, "finish_reason")->valuestring, "stop_token");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "tokens")), 3);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "mtp"), "accepted")->valueint, 7);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "mtp"), "acceptance")->valuedouble == 0.7);
    assert_non_null(strstr((const char *)buf.data, "\"acceptance\":0.7}")); /* the shortest exact form */
    res.mtp.drafted = 3, res.mtp.accepted = 2; /* rounded to 4 decimals; 0 when nothing was drafted */
    assert_true(moeq_result_mtp_acceptance(&res) == 0.6667);
    res.mtp.drafted = 0, res.mtp.accepted = 0;
    assert_true(moeq_result_mtp_acceptance(&res) == 0.0);
    cJSON_Delete(o);
    moeq_buf_free(&buf);
}

static void invalid_utf8_in_engine_text_becomes_replacement_characters(void **state) {
    (void)state;
    moeq_result res = full_result();
    res.text = "ok\xff\xe2\x82 end";
    res.tokens = NULL;
    res.n_tokens = 0;
    for (int f = MOEQ_WIRE_MSGPACK; f <= MOEQ_WIRE_JSON; f++) {
        moeq_buf buf = {0};
        assert_int_equal(moeq_result_encode(&res, (moeq_wire_format)f, &buf, NULL, 0), MOEQ_OK);
        moeq_result back;
        assert_int_equal(moeq_result_decode(buf.data, buf.len, NULL, 0, &back, NULL, 0), MOEQ_OK);
        assert_string_equal(back.text, "ok\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end");
        moeq_result_free(&back);
        moeq_buf_free(&buf);
    }
}

static void metadata_is_echoed_verbatim_or_transcoded(void **state) {
    (void)state;
    const char *json_meta = "{ \"a\" : [1, -2, 2.5, true, null, \"\\u00e9\"], \"b\": {} }";
    moeq_result res = full_result();
    res.metadata = (uint8_t *)json_meta;
    res.metadata_len = strlen(json_meta);
    res.metadata_format = MOEQ_WIRE_JSON;
    /* same format: byte for byte */
    moeq_buf buf = {0};
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_JSON, &buf, NULL, 0), MOEQ_OK);
    assert_non_null(strstr((char *)buf.data, json_meta));
    /* JSON -> msgpack -> JSON: the same values */
    moeq_buf mp = {0};
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_MSGPACK, &mp, NULL, 0), MOEQ_OK);
    moeq_result back;
    assert_int_equal(moeq_result_decode(mp.data, mp.len, NULL, 0, &back, NULL, 0), MOEQ_OK);
    assert_int_equal(back.metadata_format, MOEQ_WIRE_MSGPACK);
    moeq_buf js = {0};
    assert_int_equal(moeq_result_encode(&back, MOEQ_WIRE_JSON, &js, NULL, 0), MOEQ_OK);
    assert_non_null(strstr((char *)js.data, "\"metadata\":{\"a\":[1,-2,2.5,true,null,\"\xc3\xa9\"],\"b\":{}}"));
    moeq_result_free(&back);
    moeq_buf_free(&js);
    moeq_buf_free(&mp);
    moeq_buf_free(&buf);
}

static void msgpack_metadata_without_a_json_form_fails_naming_metadata(void **state) {
    (void)state;
    static const uint8_t meta[] = {0x81, 0xa1, 'b', 0xc4, 0x01, 0x00}; /* {"b": bin(1)} */
    moeq_result res = full_result();
    res.metadata = (uint8_t *)meta;
    res.metadata_len = sizeof meta;
    res.metadata_format = MOEQ_WIRE_MSGPACK;
    moeq_buf buf = {0};
    assert_int_equal(moeq_buf_append(&buf, "keep", 4), MOEQ_OK);
    char errstr[256];
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_JSON, &buf, errstr, sizeof errstr), MOEQ_ERR_FORMAT);
    assert_non_null(strstr(errstr, "metadata"));
    assert_int_equal(buf.len, 4); /* nothing half-written */
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_MSGPACK, &buf, errstr, sizeof errstr), MOEQ_OK);
    moeq_buf_free(&buf);
}

static void bad_results_are_refused_with_a_reason(void **state) {
    (void)state;
    moeq_result res = full_result();
    moeq_buf buf = {0};
    char errstr[256];
    res.id = NULL;
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_JSON, &buf, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(errstr, "'id'"));
    res = full_result();
    res.status = (moeq_result_status)9;
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_JSON, &buf, errstr, sizeof errstr), MOEQ_ERR_INVALID_ARG);
    moeq_result back;
    const char *v2 = "{\"v\":2,\"id\":\"a\",\"status\":\"ok\"}";
    assert_int_equal(moeq_result_decode(v2, strlen(v2), NULL, 0, &back, errstr, sizeof errstr), MOEQ_ERR_UNSUPPORTED);
    const char *bad_status = "{\"v\":1,\"id\":\"a\",\"status\":\"great\"}";
    assert_int_equal(moeq_result_decode(bad_status, strlen(bad_status), NULL, 0, &back, errstr, sizeof errstr),
                     MOEQ_ERR_FORMAT);
    assert_non_null(strstr(errstr, "'status'"));
    const char *no_id = "{\"v\":1,\"status\":\"ok\"}";
    assert_int_equal(moeq_result_decode(no_id, strlen(no_id), NULL, 0, &back, errstr, sizeof errstr), MOEQ_ERR_FORMAT);
    assert_int_equal(moeq_result_decode("{\"v\":1", 6, NULL, 0, &back, errstr, sizeof errstr), MOEQ_ERR_PARSE);
    assert_int_equal(moeq_result_decode("{}", 2, NULL, 1, &back, errstr, sizeof errstr), MOEQ_ERR_LIMIT);
    moeq_buf_free(&buf);
}

static void status_and_finish_reason_names_are_stable(void **state) {
    (void)state;
    assert_string_equal(moeq_result_status_name(MOEQ_RESULT_EXPIRED), "expired");
    assert_string_equal(moeq_result_status_name(MOEQ_RESULT_CANCELLED), "cancelled");
    assert_string_equal(moeq_finish_reason_name(MOEQ_FINISH_STOP_TOKEN), "stop_token");
    assert_string_equal(moeq_finish_reason_name(MOEQ_FINISH_DEADLINE), "deadline");
    assert_string_equal(moeq_finish_reason_name(MOEQ_FINISH__COUNT), "unknown");
}

/* Results answer this submission: the job's content hash travels in the result and back. */
static void a_result_carries_the_hash_of_the_job_it_answers(void **state) {
    (void)state;
    char h[MOEQ_JOB_HASH_SIZE];
    moeq_job_content_hash("", 0, h);
    assert_string_equal(h, "cbf29ce484222325"); /* FNV-1a 64 offset basis */
    const char *job = "{\"v\":1,\"id\":\"j5\",\"prompt\":\"hi\"}";
    moeq_job_content_hash(job, strlen(job), h);
    assert_string_equal(h, "bd8bc653a297ca7f"); /* as schemas/tools/gen_vectors.py computes it */
    moeq_result res = full_result();
    res.job_hash = h;
    for (int f = MOEQ_WIRE_MSGPACK; f <= MOEQ_WIRE_JSON; f++) {
        moeq_buf buf = {0};
        assert_int_equal(moeq_result_encode(&res, (moeq_wire_format)f, &buf, NULL, 0), MOEQ_OK);
        moeq_result back;
        assert_int_equal(moeq_result_decode(buf.data, buf.len, NULL, 0, &back, NULL, 0), MOEQ_OK);
        assert_non_null(back.job_hash);
        assert_string_equal(back.job_hash, h);
        moeq_result_free(&back);
        moeq_buf_free(&buf);
    }
    res.job_hash = NULL; /* absent: decoded as NULL (results of older writers) */
    moeq_buf buf = {0};
    assert_int_equal(moeq_result_encode(&res, MOEQ_WIRE_JSON, &buf, NULL, 0), MOEQ_OK);
    assert_null(strstr((char *)buf.data, "job_hash"));
    moeq_buf_free(&buf);
}

/* Issue 11: an 18-token result had text ' bre' because the encoder took strlen of text with a 0x00 byte. */
static void result_text_is_cut_at_the_first_nul_byte_no_more(void **state) {
    (void)state;
    static const char text[] = " bre\0ad\0 and \xff more"; /* NULs, then invalid UTF-8 after them */
    static const char want[] = " bre\0ad\0 and \xef\xbf\xbd more";
    moeq_result res = full_result();
    res.text = (char *)text;
    res.text_len = sizeof text - 1;
    const moeq_wire_format fmts[] = {MOEQ_WIRE_MSGPACK, MOEQ_WIRE_JSON};
    for (int f = 0; f < 2; f++) {
        moeq_buf buf = {0};
        char err[256];
        assert_int_equal(moeq_result_encode(&res, fmts[f], &buf, err, sizeof err), MOEQ_OK);
        if (fmts[f] == MOEQ_WIRE_JSON) assert_non_null(strstr((char *)buf.data, "\" bre\\u0000ad\\u0000 and "));
        moeq_result back;
        assert_int_equal(moeq_result_decode(buf.data, buf.len, NULL, 0, &back, err, sizeof err), MOEQ_OK);
        assert_int_equal(back.text_len, sizeof want - 1);
        assert_memory_equal(back.text, want, sizeof want - 1);
        moeq_result_free(&back);
        moeq_buf_free(&buf);
    }
}

/* Issue 11: codes in schemas/result.md differed from what was sent (reply_to_not_allowed, deadline, invalid_job). */
static int md_has_code(const char *md, const char *code) {
    char want[80];
    snprintf(want, sizeof want, "`%s`", code);
    return strstr(md, want) != NULL;
}

static void the_error_codes_in_result_md_are_exactly_the_codes_sent(void **state) {
    (void)state;
    const char *root = getenv("MOEQ_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/schemas/result.md", root ? root : ".");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char md[1 << 16];
    size_t len = fread(md, 1, sizeof md - 1, f);
    fclose(f);
    md[len] = 0;
    char *sec = strstr(md, "## Error codes"), *end = sec ? strstr(sec + 3, "\n## ") : NULL;
    assert_non_null(sec);
    if (end) *end = 0;
    size_t n;
    const char *const *codes = moeq_result_error_codes(&n);
    for (size_t i = 0; i < n; i++) {
        if (!md_has_code(sec, codes[i])) fail_msg("code %s is sent but not in result.md", codes[i]);
        assert_true(moeq_result_code_known(codes[i]));
    }
    for (int c = MOEQ_JOB_REJECT_NONE + 1; c < MOEQ_JOB_REJECT__COUNT; c++)
        if (!md_has_code(sec, moeq_job_reject_code_name((moeq_job_reject_code)c)))
            fail_msg("reject code %s is not in result.md", moeq_job_reject_code_name((moeq_job_reject_code)c));
    /* and back: every code in the table's first column is one the processes send */
    int rows = 0;
    for (char *line = strstr(sec, "\n| `"); line; line = strstr(line + 1, "\n| `")) {
        char *cell_end = strstr(line + 3, " |");
        assert_non_null(cell_end);
        for (char *p = strchr(line + 3, '`'); p && p < cell_end; p = strchr(p + 1, '`')) {
            char *q = strchr(p + 1, '`');
            assert_non_null(q);
            char code[80];
            snprintf(code, sizeof code, "%.*s", (int)(q - p - 1), p + 1);
            if (!moeq_result_code_known(code)) fail_msg("result.md lists %s, which no process sends", code);
            rows++;
            p = q;
        }
    }
    assert_int_equal(rows, (int)n + MOEQ_JOB_REJECT__COUNT - 1);
    assert_false(moeq_result_code_known("invalid_job"));
    assert_false(moeq_result_code_known("expired")); /* the status; its code is deadline */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_result_round_trips_through_both_formats),
        cmocka_unit_test(an_error_result_for_a_rejected_job_round_trips),
        cmocka_unit_test(msgpack_c_reads_what_we_encode),
        cmocka_unit_test(cjson_reads_what_we_encode),
        cmocka_unit_test(invalid_utf8_in_engine_text_becomes_replacement_characters),
        cmocka_unit_test(metadata_is_echoed_verbatim_or_transcoded),
        cmocka_unit_test(msgpack_metadata_without_a_json_form_fails_naming_metadata),
        cmocka_unit_test(bad_results_are_refused_with_a_reason),
        cmocka_unit_test(status_and_finish_reason_names_are_stable),
        cmocka_unit_test(a_result_carries_the_hash_of_the_job_it_answers),
        cmocka_unit_test(result_text_is_cut_at_the_first_nul_byte_no_more),
        cmocka_unit_test(the_error_codes_in_result_md_are_exactly_the_codes_sent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
