/*
 * fuzz_job_decode.c — libFuzzer target for moeq_job_decode.
 *
 * Properties checked beyond "no crash, no leak, no unbounded allocation"
 * (ASan/UBSan and -rss_limit_mb do those):
 *   - a reject always has a code, an err matching it, and a message;
 *   - an accepted job re-encodes (moeq_job_encode, its own format) and
 *     decodes again to the same fields;
 *   - its metadata can be echoed in a result in both formats (transcoding).
 * The first input byte picks the content-type header (none/msgpack/json).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/job.h"
#include "moeq/result.h"

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "fuzz_job_decode: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                  \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

static int same_job(const moeq_job *a, const moeq_job *b) {
    if (strcmp(a->id, b->id) || a->priority != b->priority || a->input != b->input) return 0;
    if (a->max_new_tokens != b->max_new_tokens || a->temperature != b->temperature || a->top_p != b->top_p) return 0;
    if (a->top_k != b->top_k || a->has_seed != b->has_seed || a->seed != b->seed || a->n_stop != b->n_stop) return 0;
    if (a->deadline_ms != b->deadline_ms || a->mtp != b->mtp || !a->reply_to != !b->reply_to) return 0;
    if (a->metadata_len != b->metadata_len || (a->metadata_len && memcmp(a->metadata, b->metadata, a->metadata_len)))
        return 0;
    if (a->input == MOEQ_JOB_INPUT_PROMPT)
        return a->prompt_len == b->prompt_len && memcmp(a->prompt, b->prompt, a->prompt_len) == 0;
    if (a->input == MOEQ_JOB_INPUT_TOKENS)
        return a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(int32_t)) == 0;
    if (a->n_messages != b->n_messages) return 0;
    for (size_t i = 0; i < a->n_messages; i++)
        if (strcmp(a->messages[i].role, b->messages[i].role) || strcmp(a->messages[i].content, b->messages[i].content))
            return 0;
    return 1;
}

static void echo_metadata(const moeq_job *job) {
    moeq_result res;
    memset(&res, 0, sizeof res);
    res.id = job->id;
    res.status = MOEQ_RESULT_OK;
    res.metadata = job->metadata;
    res.metadata_len = job->metadata_len;
    res.metadata_format = job->format;
    for (int f = MOEQ_WIRE_MSGPACK; f <= MOEQ_WIRE_JSON; f++) {
        moeq_buf buf = {0};
        moeq_err err = moeq_result_encode(&res, (moeq_wire_format)f, &buf, NULL, 0);
        /* same format: always; across: only msgpack bin/ext/non-string keys/NaN may fail */
        CHECK(err == MOEQ_OK || (err == MOEQ_ERR_FORMAT && (moeq_wire_format)f != job->format));
        if (err == MOEQ_OK) {
            moeq_result back;
            CHECK(moeq_result_decode(buf.data, buf.len, NULL, 0, &back, NULL, 0) == MOEQ_OK);
            CHECK(strcmp(back.id, job->id) == 0);
            CHECK(!back.metadata == !job->metadata);
            moeq_result_free(&back);
        }
        moeq_buf_free(&buf);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const types[] = {NULL, "application/msgpack", "application/json", "text/plain"};
    const char *ct = size ? types[data[0] & 3] : NULL;
    if (size) data++, size--;

    moeq_job_limits limits = moeq_job_default_limits();
    moeq_job job;
    moeq_job_reject rej;
    moeq_err err = moeq_job_decode(data, size, ct, &limits, &job, &rej);
    if (err != MOEQ_OK) {
        CHECK(rej.code != MOEQ_JOB_REJECT_NONE && err == moeq_job_reject_err(rej.code) && rej.message[0]);
        CHECK(!rej.has_id || strlen(rej.id) <= (size_t)limits.max_id_bytes);
        return 0;
    }
    moeq_buf buf = {0};
    CHECK(moeq_job_encode(&job, job.format, &buf) == MOEQ_OK);
    moeq_job again;
    err = moeq_job_decode(buf.data, buf.len, NULL, &limits, &again, &rej);
    if (err != MOEQ_OK) fprintf(stderr, "re-decode: %s: %s\n", moeq_job_reject_code_name(rej.code), rej.message);
    /* re-encoding may only grow past max_job_bytes (wider number forms); anything else must decode */
    CHECK(err == MOEQ_OK || rej.code == MOEQ_JOB_REJECT_TOO_LARGE);
    if (err == MOEQ_OK) CHECK(same_job(&job, &again));
    moeq_job_free(&again);
    moeq_buf_free(&buf);
    echo_metadata(&job);
    moeq_job_free(&job);
    return 0;
}
