/*
 * moeq/batch.h — the batch blob (v 1) the coordinator XADDs to a Redis
 * stream and a worker reads back: the jobs of one batch with their original
 * bytes, their input token ids and the shared prefix length. Format:
 * schemas/redis.md.
 *
 * Pure functions, no Redis calls; thread-safe on distinct arguments.
 */
#ifndef MOEQ_BATCH_H
#define MOEQ_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOEQ_BATCH_VERSION 1
#define MOEQ_BATCH_KIND "moeq.batch" /* the magic: value of the blob's "kind" key */
#define MOEQ_BATCH_MAX_JOBS 4096
#define MOEQ_BATCH_ID_MAX 128        /* bytes */

typedef struct moeq_batch_job {
    char *id;                /* the job id                                         */
    moeq_wire_format format; /* encoding of `job`                                  */
    uint8_t *job;            /* the original Kafka message value, verbatim         */
    size_t job_len;
    int32_t *tokens;         /* input token ids after the chat template            */
    size_t n_tokens;
    int64_t kafka_ms;        /* Kafka message timestamp                            */
    char *topic;             /* source topic; NULL = unknown                       */
    int32_t partition;
    int64_t offset;
} moeq_batch_job;

/*
 * Plain data. For encoding every pointer is borrowed; a decoded batch owns
 * all of them (moeq_batch_free).
 */
typedef struct moeq_batch {
    char *batch_id;        /* 1..MOEQ_BATCH_ID_MAX bytes                              */
    int priority;          /* 0..3                                                    */
    int64_t created_ms;
    uint32_t prefix_len;   /* leading tokens identical in every job                  */
    moeq_batch_job *jobs;  /* 1..MOEQ_BATCH_MAX_JOBS                                  */
    size_t n_jobs;
} moeq_batch;

/* Tokens shared at the start of every job's `tokens` (0 without jobs). */
uint32_t moeq_batch_common_prefix(const moeq_batch *batch);

/*
 * Append the blob to out. Checks what a decoder would refuse (counts,
 * priority, prefix_len <= moeq_batch_common_prefix). Returns MOEQ_OK,
 * MOEQ_ERR_INVALID_ARG (message names the field), MOEQ_ERR_NOMEM; on error
 * out->len is restored.
 */
moeq_err moeq_batch_encode(const moeq_batch *batch, moeq_buf *out, char *errstr, size_t errstr_size);

/*
 * Decode a blob of at most max_bytes (0 = 64 MiB). On MOEQ_OK the caller owns
 * *batch (moeq_batch_free). Errors: MOEQ_ERR_PARSE (not msgpack, truncated),
 * MOEQ_ERR_UNSUPPORTED (kind or v), MOEQ_ERR_FORMAT (a field wrong, incl. a
 * prefix_len the tokens do not share), MOEQ_ERR_LIMIT, MOEQ_ERR_NOMEM,
 * MOEQ_ERR_INVALID_ARG; *batch is left zeroed.
 */
moeq_err moeq_batch_decode(const void *bytes, size_t len, size_t max_bytes, moeq_batch *batch, char *errstr,
                           size_t errstr_size);

/* Free every member and zero the struct. NULL is safe. Only for decoded batches. */
void moeq_batch_free(moeq_batch *batch);

#ifdef __cplusplus
}
#endif
#endif
