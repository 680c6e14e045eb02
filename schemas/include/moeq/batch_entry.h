/*
 * moeq/batch_entry.h — the Redis Stream entry that carries one batch from the
 * coordinator to the workers (pure encode/decode, no I/O).
 *
 * An entry in stream `<prefix>:batches:p<priority>` has these fields:
 *
 *   v          "1"                      entry format version
 *   priority   "0".."3"                 the stream's class (after aging)
 *   n          decimal job count
 *   prefix     decimal shared prefix length, tokens (the worker's prefix cache)
 *   pkey       optional: 16 hex digits, moeq_batch_entry_prefix_key of the shared
 *              prefix ("0" or absent: none); workers prefer batches whose key
 *              they hold (docs/PREFIX_CACHE.md, affinity). Readers ignore fields
 *              they do not know, so old workers read new entries and new
 *              workers compute the key from the jobs when it is absent.
 *   closed_ms  decimal ms since the epoch when the batch closed
 *   jobs       binary, little-endian:
 *                magic "MQB1", u32 n, then n times:
 *                  u32 id_len, id bytes,
 *                  u32 content_type_len, content type bytes (0 = none),
 *                  u32 job_len, the job exactly as the producer wrote it,
 *                  i64 kafka_ts_ms (-1 unknown), i64 arrival_ms,
 *                  u32 n_tokens, n_tokens x i32 prompt token ids
 *
 * Field count is fixed whatever the batch size, so the Lua enqueue script
 * never unpacks a variable number of arguments (Lua's stack is limited).
 * The job bytes are kept verbatim: the worker decodes them with the schemas
 * codec and so sees every sampling option, stop string, reply_to and the
 * metadata without a second schema for batches.
 */
#ifndef MOEQ_BATCH_ENTRY_H
#define MOEQ_BATCH_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOEQ_BATCH_ENTRY_VERSION 1
#define MOEQ_BATCH_ENTRY_MAGIC "MQB1"

/* One job of a batch; every pointer borrowed (from the caller, or from the decoded blob). */
typedef struct moeq_batch_entry_job {
    const char *id;
    size_t id_len;
    const char *content_type; /* may be NULL */
    size_t content_type_len;
    const void *job;          /* the job bytes as produced */
    size_t job_len;
    int64_t kafka_ts_ms;
    int64_t arrival_ms;
    const int32_t *tokens;    /* decoded: may be unaligned-safe copy, see decode */
    size_t n_tokens;
} moeq_batch_entry_job;

/* Append the `jobs` blob for jobs[0..n) to out. MOEQ_ERR_LIMIT when a length exceeds u32. */
moeq_err moeq_batch_entry_encode_jobs(const moeq_batch_entry_job *jobs, size_t n, moeq_buf *out);

/*
 * Decode a `jobs` blob. On MOEQ_OK *jobs_out is a malloc'd array of *n_out
 * jobs (free() it) whose pointers borrow from blob, except tokens, which
 * point into one malloc'd, aligned array in *tokens_out (free() it too).
 * MOEQ_ERR_FORMAT with a message naming the job index on any inconsistency.
 */
moeq_err moeq_batch_entry_decode_jobs(const void *blob, size_t len, moeq_batch_entry_job **jobs_out,
                                      size_t *n_out, int32_t **tokens_out, char *errstr, size_t errstr_size);

/* Leading tokens a batch's prefix key covers at most (rounded down to MOEQ_BATCH_PREFIX_KEY_ROUND). */
#define MOEQ_BATCH_PREFIX_KEY_TOKENS 256
#define MOEQ_BATCH_PREFIX_KEY_ROUND 16

/*
 * The affinity key of a batch whose jobs share their first n_shared prompt
 * tokens (tokens: any job's prompt): a 64-bit hash (FNV-1a) of the first
 * min(n_shared, 256) tokens rounded down to a multiple of 16, so batches of
 * one instruction get one key whatever their documents share beyond it.
 * 0 (no key) below 16 shared tokens. Coordinator and workers compute it alike.
 */
uint64_t moeq_batch_entry_prefix_key(const int32_t *tokens, size_t n_shared);

#ifdef __cplusplus
}
#endif
#endif
