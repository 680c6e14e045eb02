/*
 * test_job_vectors.c — every golden vector in schemas/vectors/manifest.json
 * decodes to its documented outcome: valid ones to the listed fields,
 * invalid ones to the listed reject code and field. Also: every proper
 * prefix of a valid vector is rejected cleanly (truncation never crashes or
 * half-decodes).
 *
 * Reads files under $MOEQ_SOURCE_DIR (set by moeq_add_test). The manifest is
 * parsed with cJSON, independently of the decoder under test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/job.h"
#include "moeq/result.h"
#include "moeq/util.h"

static char *source_path(const char *rel) {
    const char *root = getenv("MOEQ_SOURCE_DIR");
    static char path[4096];
    snprintf(path, sizeof path, "%s/schemas/vectors/%s", root ? root : ".", rel);
    return path;
}

static cJSON *load_manifest(void) {
    char *text = NULL;
    size_t len = 0;
    char errstr[256];
    moeq_err err = moeq_read_file(source_path("manifest.json"), 16 << 20, &text, &len, errstr, sizeof errstr);
    if (err != MOEQ_OK) fail_msg("%s", errstr);
    cJSON *m = cJSON_ParseWithLength(text, len);
    free(text);
    assert_non_null(m);
    return m;
}

static int load_vector(const cJSON *v, char **bytes, size_t *len) {
    const char *file = cJSON_GetObjectItem(v, "file")->valuestring;
    char errstr[256];
    if (moeq_read_file(source_path(file), 64 << 20, bytes, len, errstr, sizeof errstr) != MOEQ_OK) {
        print_error("%s\n", errstr);
        return -1;
    }
    return 0;
}

static moeq_job_limits vector_limits(const cJSON *v) {
    moeq_job_limits limits = moeq_job_default_limits();
    const cJSON *over = cJSON_GetObjectItem(v, "limits"), *o;
    cJSON_ArrayForEach(o, over) {
        char value[32];
        snprintf(value, sizeof value, "%.0f", o->valuedouble);
        assert_int_equal(moeq_props_set(moeq_job_limits_props, &limits, o->string, value, NULL, 0), MOEQ_OK);
    }
    return limits;
}

static const char *str_or_null(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItem(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* Compare a decoded job with the manifest's expectation; print and count mismatches. */
#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            print_error("%s: ", name);                                                                                 \
            print_error(__VA_ARGS__);                                                                                  \
            print_error("\n");                                                                                         \
            bad++;                                                                                                     \
        }                                                                                                              \
    } while (0)

static int same_str(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

static int check_input(const char *name, const moeq_job *job, const cJSON *want) {
    int bad = 0;
    const char *input = str_or_null(want, "input");
    static const char *const kinds[] = {"none", "prompt", "messages", "tokens"};
    EXPECT(input && strcmp(kinds[job->input], input) == 0, "input %s, want %s", kinds[job->input], input);
    if (job->input == MOEQ_JOB_INPUT_PROMPT) {
        EXPECT(same_str(job->prompt, str_or_null(want, "prompt")), "prompt '%s'", job->prompt);
        EXPECT(job->prompt && job->prompt_len == strlen(job->prompt), "prompt_len %zu", job->prompt_len);
    }
    if (job->input == MOEQ_JOB_INPUT_MESSAGES) {
        const cJSON *msgs = cJSON_GetObjectItem(want, "messages");
        EXPECT((size_t)cJSON_GetArraySize(msgs) == job->n_messages, "n_messages %zu", job->n_messages);
        for (size_t i = 0; i < job->n_messages && i < (size_t)cJSON_GetArraySize(msgs); i++) {
            const cJSON *m = cJSON_GetArrayItem(msgs, (int)i);
            EXPECT(same_str(job->messages[i].role, cJSON_GetArrayItem(m, 0)->valuestring), "role %zu", i);
            EXPECT(same_str(job->messages[i].content, cJSON_GetArrayItem(m, 1)->valuestring), "content %zu", i);
        }
    }
    if (job->input == MOEQ_JOB_INPUT_TOKENS) {
        const cJSON *toks = cJSON_GetObjectItem(want, "tokens");
        EXPECT((size_t)cJSON_GetArraySize(toks) == job->n_tokens, "n_tokens %zu", job->n_tokens);
        for (size_t i = 0; i < job->n_tokens && i < (size_t)cJSON_GetArraySize(toks); i++)
            EXPECT(job->tokens[i] == (int32_t)cJSON_GetArrayItem(toks, (int)i)->valuedouble, "token %zu", i);
    }
    return bad;
}

/* response_format: type, name, strict, schema (as parsed JSON, compared by value), pattern, choices. */
static int check_response_format(const char *name, const moeq_response_format *rf, const cJSON *want) {
    static const char *const types[] = {"text", "json_object", "json_schema", "regex", "choice"};
    int bad = 0;
    if (!cJSON_IsObject(want)) {
        EXPECT(rf->type == MOEQ_RESPONSE_TEXT, "response_format type %s, want absent", types[rf->type]);
        return bad;
    }
    EXPECT(same_str(types[rf->type], str_or_null(want, "type")), "response_format.type %s", types[rf->type]);
    EXPECT(same_str(rf->name, str_or_null(want, "name")), "response_format name");
    EXPECT(rf->strict == cJSON_IsTrue(cJSON_GetObjectItem(want, "strict")), "strict %d", rf->strict);
    EXPECT(same_str(rf->pattern, str_or_null(want, "pattern")), "pattern");
    const cJSON *schema = cJSON_GetObjectItem(want, "schema");
    EXPECT(!schema == !rf->schema, "schema presence");
    if (schema && rf->schema) {
        cJSON *got = cJSON_Parse(rf->schema);
        EXPECT(got && cJSON_Compare(got, schema, 1), "schema %s", rf->schema);
        EXPECT(strlen(rf->schema) == rf->schema_len, "schema_len");
        cJSON_Delete(got);
    }
    const cJSON *ch = cJSON_GetObjectItem(want, "choices");
    EXPECT((size_t)cJSON_GetArraySize(ch) == rf->n_choices, "n_choices %zu", rf->n_choices);
    for (size_t i = 0; i < rf->n_choices && i < (size_t)cJSON_GetArraySize(ch); i++)
        EXPECT(same_str(rf->choices[i], cJSON_GetArrayItem(ch, (int)i)->valuestring), "choice %zu", i);
    return bad;
}

static int check_controls(const char *name, const moeq_job *job, const cJSON *want) {
    int bad = check_response_format(name, &job->response_format, cJSON_GetObjectItem(want, "response_format"));
    EXPECT(job->logprobs == cJSON_IsTrue(cJSON_GetObjectItem(want, "logprobs")), "logprobs %d", job->logprobs);
    EXPECT(job->top_logprobs == cJSON_GetObjectItem(want, "top_logprobs")->valueint, "top_logprobs %d",
           job->top_logprobs);
    const cJSON *ids = cJSON_GetObjectItem(want, "stop_token_ids");
    EXPECT((size_t)cJSON_GetArraySize(ids) == job->n_stop_token_ids, "n_stop_token_ids %zu", job->n_stop_token_ids);
    for (size_t i = 0; i < job->n_stop_token_ids && i < (size_t)cJSON_GetArraySize(ids); i++)
        EXPECT(job->stop_token_ids[i] == (int32_t)cJSON_GetArrayItem(ids, (int)i)->valuedouble, "stop_token_id %zu", i);
    EXPECT(job->min_tokens == cJSON_GetObjectItem(want, "min_tokens")->valueint, "min_tokens %d", job->min_tokens);
    EXPECT(job->repetition_penalty == cJSON_GetObjectItem(want, "repetition_penalty")->valuedouble,
           "repetition_penalty %g", job->repetition_penalty);
    EXPECT(job->presence_penalty == cJSON_GetObjectItem(want, "presence_penalty")->valuedouble, "presence_penalty %g",
           job->presence_penalty);
    EXPECT(job->frequency_penalty == cJSON_GetObjectItem(want, "frequency_penalty")->valuedouble,
           "frequency_penalty %g", job->frequency_penalty);
    return bad;
}

static int check_job(const char *name, const moeq_job *job, const cJSON *want) {
    int bad = check_input(name, job, want);
    EXPECT(same_str(job->id, str_or_null(want, "id")), "id '%s'", job->id);
    EXPECT(job->id && job->id_len == strlen(job->id), "id_len");
    EXPECT(strcmp(moeq_wire_format_name(job->format), str_or_null(want, "format")) == 0, "format");
    EXPECT(job->priority == cJSON_GetObjectItem(want, "priority")->valueint, "priority %d", job->priority);
    EXPECT(job->max_new_tokens == cJSON_GetObjectItem(want, "max_new_tokens")->valueint, "max_new_tokens %d",
           job->max_new_tokens);
    EXPECT(job->temperature == cJSON_GetObjectItem(want, "temperature")->valuedouble, "temperature %g",
           job->temperature);
    EXPECT(job->top_p == cJSON_GetObjectItem(want, "top_p")->valuedouble, "top_p %g", job->top_p);
    EXPECT(job->top_k == cJSON_GetObjectItem(want, "top_k")->valueint, "top_k %d", job->top_k);
    const cJSON *seed = cJSON_GetObjectItem(want, "seed");
    EXPECT(job->has_seed == !cJSON_IsNull(seed), "has_seed %d", job->has_seed);
    if (!cJSON_IsNull(seed)) /* doubles cannot hold 2^64-1 exactly: compare as printed */
        EXPECT(fabs((double)job->seed - seed->valuedouble) <= seed->valuedouble * 1e-15, "seed %llu",
               (unsigned long long)job->seed);
    const cJSON *stop = cJSON_GetObjectItem(want, "stop");
    EXPECT((size_t)cJSON_GetArraySize(stop) == job->n_stop, "n_stop %zu", job->n_stop);
    for (size_t i = 0; i < job->n_stop && i < (size_t)cJSON_GetArraySize(stop); i++)
        EXPECT(same_str(job->stop[i], cJSON_GetArrayItem(stop, (int)i)->valuestring), "stop %zu", i);
    EXPECT((double)job->deadline_ms == cJSON_GetObjectItem(want, "deadline_ms")->valuedouble, "deadline_ms");
    EXPECT(same_str(job->reply_to, str_or_null(want, "reply_to")), "reply_to");
    EXPECT(job->mtp == cJSON_IsTrue(cJSON_GetObjectItem(want, "mtp")), "mtp %d", job->mtp);
    bad += check_controls(name, job, want);
    const char *hex = str_or_null(want, "metadata_hex");
    EXPECT(!hex == !job->metadata, "metadata presence");
    if (hex && job->metadata) {
        EXPECT(strlen(hex) == 2 * job->metadata_len, "metadata_len %zu", job->metadata_len);
        for (size_t i = 0; i < job->metadata_len && 2 * i + 1 < strlen(hex); i++) {
            unsigned byte;
            sscanf(hex + 2 * i, "%2x", &byte);
            if (byte != job->metadata[i]) {
                EXPECT(0, "metadata differs at byte %zu", i);
                break;
            }
        }
    }
    return bad;
}

static int check_reject(const char *name, moeq_err err, const moeq_job *job, const moeq_job_reject *rej,
                        const cJSON *v) {
    int bad = 0;
    const char *code = str_or_null(v, "code"), *field = str_or_null(v, "field");
    EXPECT(strcmp(moeq_job_reject_code_name(rej->code), code) == 0, "code %s, want %s (%s)",
           moeq_job_reject_code_name(rej->code), code, rej->message);
    EXPECT(err == moeq_job_reject_err(rej->code) && err != MOEQ_OK, "err %s", moeq_err_str(err));
    EXPECT(strcmp(rej->field, field) == 0, "field '%s', want '%s' (%s)", rej->field, field, rej->message);
    EXPECT(rej->message[0] != 0, "empty message");
    if (field[0]) {
        char quoted[80];
        snprintf(quoted, sizeof quoted, "'%s'", field);
        EXPECT(strstr(rej->message, quoted) != NULL, "message does not name the field: %s", rej->message);
    }
    static const moeq_job zero;
    EXPECT(memcmp(job, &zero, sizeof zero) == 0, "job not zeroed after a reject");
    return bad;
}

static void every_vector_yields_its_documented_outcome(void **state) {
    (void)state;
    cJSON *m = load_manifest();
    const cJSON *v;
    int bad = 0, n = 0;
    int codes_seen[MOEQ_JOB_REJECT__COUNT] = {0};
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(m, "vectors")) {
        const char *name = str_or_null(v, "file");
        char *bytes;
        size_t len;
        if (load_vector(v, &bytes, &len) < 0) {
            bad++;
            continue;
        }
        /* an exact-size copy, so ASan catches any read past the end */
        char *exact = malloc(len ? len : 1);
        memcpy(exact, bytes, len);
        free(bytes);
        moeq_job_limits limits = vector_limits(v);
        moeq_job job;
        moeq_job_reject rej;
        moeq_err err = moeq_job_decode(exact, len, str_or_null(v, "content_type"), &limits, &job, &rej);
        if (strcmp(str_or_null(v, "expect"), "ok") == 0) {
            EXPECT(err == MOEQ_OK, "rejected: %s: %s", moeq_job_reject_code_name(rej.code), rej.message);
            if (err == MOEQ_OK) bad += check_job(name, &job, cJSON_GetObjectItem(v, "job"));
        } else {
            bad += check_reject(name, err, &job, &rej, v);
            codes_seen[moeq_job_reject_code_from_name(str_or_null(v, "code"))] = 1;
        }
        moeq_job_free(&job);
        free(exact);
        n++;
    }
    for (int c = 1; c < MOEQ_JOB_REJECT__COUNT; c++)
        if (!codes_seen[c]) {
            print_error("no vector covers reject code %s\n", moeq_job_reject_code_name((moeq_job_reject_code)c));
            bad++;
        }
    cJSON_Delete(m);
    print_message("%d vectors checked\n", n);
    assert_true(n > 100);
    assert_int_equal(bad, 0);
}

static void every_truncation_of_a_valid_vector_is_rejected_cleanly(void **state) {
    (void)state;
    cJSON *m = load_manifest();
    const cJSON *v;
    int bad = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(m, "vectors")) {
        if (strcmp(str_or_null(v, "expect"), "ok") != 0) continue;
        const char *name = str_or_null(v, "file");
        char *bytes = NULL;
        size_t len = 0;
        if (load_vector(v, &bytes, &len) < 0 || len > 4096) { /* the big edge vectors add only time */
            free(bytes);
            continue;
        }
        moeq_job_limits limits = vector_limits(v);
        /* JSON may legitimately end in trailing whitespace, which a prefix can drop */
        size_t end = len;
        while (end > 0 && strchr(" \t\r\n", bytes[end - 1])) end--;
        for (size_t cut = 0; cut + 1 < end; cut++) {
            char *prefix = malloc(cut ? cut : 1);
            memcpy(prefix, bytes, cut);
            moeq_job job;
            moeq_job_reject rej;
            moeq_err err = moeq_job_decode(prefix, cut, str_or_null(v, "content_type"), &limits, &job, &rej);
            EXPECT(err != MOEQ_OK && rej.code != MOEQ_JOB_REJECT_NONE, "prefix of %zu bytes accepted", cut);
            moeq_job_free(&job);
            free(prefix);
        }
        free(bytes);
    }
    cJSON_Delete(m);
    assert_int_equal(bad, 0);
}

/* The example results decode to their listed fields, and re-encode to the same bytes. */
static void every_result_vector_decodes_to_its_fields(void **state) {
    (void)state;
    cJSON *m = load_manifest();
    const cJSON *v;
    int bad = 0, n = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(m, "results")) {
        const char *name = str_or_null(v, "file");
        char *bytes;
        size_t len;
        if (load_vector(v, &bytes, &len) < 0) {
            bad++;
            continue;
        }
        const cJSON *want = cJSON_GetObjectItem(v, "result");
        moeq_result res;
        char errstr[256];
        moeq_err err = moeq_result_decode(bytes, len, NULL, 0, &res, errstr, sizeof errstr);
        EXPECT(err == MOEQ_OK, "%s", errstr);
        if (err == MOEQ_OK) {
            EXPECT(same_str(res.id, str_or_null(want, "id")), "id");
            EXPECT(!strcmp(moeq_result_status_name(res.status), str_or_null(want, "status")), "status");
            const char *hex = str_or_null(v, "text_hex"); /* text with U+0000: cJSON cannot hold it */
            if (hex) {
                size_t n = strlen(hex) / 2;
                char *exact = malloc(n + 1);
                for (size_t i = 0; exact && i < n; i++) sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&exact[i]);
                EXPECT(exact && res.text && res.text_len == n && memcmp(res.text, exact, n) == 0,
                       "text: %zu bytes, want %zu (cut at a NUL?)", res.text_len, n);
                free(exact);
            } else {
                EXPECT(same_str(res.text, str_or_null(want, "text")), "text");
                EXPECT(!res.text || res.text_len == strlen(res.text), "text_len");
            }
            const char *fr = str_or_null(want, "finish_reason");
            EXPECT(!strcmp(moeq_finish_reason_name(res.finish_reason), fr ? fr : "none"), "finish_reason");
            const cJSON *usage = cJSON_GetObjectItem(want, "usage");
            EXPECT(res.usage.completion_tokens == cJSON_GetObjectItem(usage, "completion_tokens")->valueint, "usage");
            const cJSON *error = cJSON_GetObjectItem(want, "error");
            EXPECT(same_str(res.error.code, str_or_null(error, "code")), "error.code");
            EXPECT(!res.metadata == !cJSON_GetObjectItem(want, "metadata"), "metadata");
            EXPECT(res.has_mtp == (cJSON_GetObjectItem(want, "mtp") != NULL), "mtp");
            EXPECT(same_str(res.job_hash, str_or_null(want, "job_hash")), "job_hash");
            /* our encoder writes the same fields in the same order, so the same bytes */
            moeq_buf buf = {0};
            EXPECT(moeq_result_encode(&res, moeq_wire_detect(bytes, len, NULL), &buf, NULL, 0) == MOEQ_OK, "encode");
            EXPECT(buf.len == len && memcmp(buf.data, bytes, len) == 0, "re-encoded bytes differ: %s", buf.data);
            moeq_buf_free(&buf);
        }
        moeq_result_free(&res);
        free(bytes);
        n++;
    }
    cJSON_Delete(m);
    assert_true(n >= 10);
    assert_int_equal(bad, 0);
}

/* moeq_job_encode writes the structured-output fields so that they decode back to the same job. */
static void a_job_with_the_structured_output_fields_encodes_and_decodes_to_itself(void **state) {
    (void)state;
    char schema[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,\"x\",null]}},\"required\":[\"a\"]}";
    char *choices[] = {"yes", "no"};
    int32_t stops[] = {3, 99};
    moeq_job job = {.id = "rt", .input = MOEQ_JOB_INPUT_PROMPT, .prompt = "p", .prompt_len = 1, .max_new_tokens = 16,
                    .temperature = 1.0, .top_p = 1.0, .mtp = 1, .logprobs = 1, .top_logprobs = 5,
                    .stop_token_ids = stops, .n_stop_token_ids = 2, .min_tokens = 2, .repetition_penalty = 1.5,
                    .presence_penalty = -0.5, .frequency_penalty = 0.25};
    for (int kind = 0; kind < 3; kind++)
        for (int f = MOEQ_WIRE_MSGPACK; f <= MOEQ_WIRE_JSON; f++) {
            job.response_format = (moeq_response_format){0};
            if (kind == 0) job.response_format = (moeq_response_format){.type = MOEQ_RESPONSE_JSON_SCHEMA, .name = "n",
                                                                         .strict = 1, .schema = schema,
                                                                         .schema_len = strlen(schema)};
            if (kind == 1) job.response_format = (moeq_response_format){.type = MOEQ_RESPONSE_REGEX, .pattern = "a+"};
            if (kind == 2) job.response_format = (moeq_response_format){.type = MOEQ_RESPONSE_CHOICE,
                                                                         .choices = choices, .n_choices = 2};
            moeq_buf buf = {0};
            assert_int_equal(moeq_job_encode(&job, (moeq_wire_format)f, &buf), MOEQ_OK);
            moeq_job back;
            moeq_job_reject rej;
            assert_int_equal(moeq_job_decode(buf.data, buf.len, NULL, NULL, &back, &rej), MOEQ_OK);
            const moeq_response_format *a = &job.response_format, *b = &back.response_format;
            assert_int_equal(b->type, a->type);
            if (kind == 0) {
                cJSON *x = cJSON_Parse(a->schema), *y = cJSON_Parse(b->schema);
                assert_true(cJSON_Compare(x, y, 1));
                cJSON_Delete(x), cJSON_Delete(y);
                assert_string_equal(b->name, "n");
                assert_int_equal(b->strict, 1);
            }
            if (kind == 1) assert_string_equal(b->pattern, "a+");
            if (kind == 2) assert_true(b->n_choices == 2 && !strcmp(b->choices[1], "no"));
            assert_true(back.logprobs == 1 && back.top_logprobs == 5 && back.min_tokens == 2);
            assert_true(back.n_stop_token_ids == 2 && back.stop_token_ids[1] == 99);
            assert_true(back.repetition_penalty == 1.5 && back.presence_penalty == -0.5 &&
                        back.frequency_penalty == 0.25);
            moeq_job_free(&back);
            moeq_buf_free(&buf);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_vector_yields_its_documented_outcome),
        cmocka_unit_test(every_truncation_of_a_valid_vector_is_rejected_cleanly),
        cmocka_unit_test(every_result_vector_decodes_to_its_fields),
        cmocka_unit_test(a_job_with_the_structured_output_fields_encodes_and_decodes_to_itself),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
