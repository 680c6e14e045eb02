/*
 * store.h — the coordinator's Redis hand-off: write a batch atomically with
 * its job records and the dedupe guard, cancel a job, measure the backlog,
 * read a job record. A thin shell over moeq/redis.h; the decisions (which
 * jobs, which stream) are made by the caller.
 *
 * Atomicity: one Lua script (EVALSHA) checks every job's record, and only
 * when none exists does it XADD the batch entry and create the records
 * (state=batched, batch=<entry id>). Redis runs a script as one unit, so a
 * batch and its records are written together or not at all, and a job id
 * that has a record is never enqueued again (see docs/COORDINATOR.md for
 * why a script rather than MULTI/EXEC). The same script refuses a job whose
 * id an earlier job of the same write carries, so one batch never holds an
 * id twice. When some job is refused, nothing is written: the caller settles
 * those jobs (moeq_store_dup says what the earlier job was) and writes the
 * rest.
 *
 * Keys (prefix default "moeq"): <prefix>:batches:p0..p3 (streams, consumer
 * group `workers` created at id 0 by moeq_store_prepare), <prefix>:job:<id>
 * (hash: id, state, batch, stream, priority, batched_ms, attempts, hash (the
 * job's content hash), src (topic/partition/offset it was consumed from),
 * kafka_ts; cancel, cancel_ms when cancellation was asked). Records live
 * dedupe_window_s from when they are written (and again from when a worker
 * finishes the job).
 *
 * One thread at a time (it owns one Redis connection).
 */
#ifndef MOEQ_STORE_H
#define MOEQ_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/batch_entry.h"
#include "moeq/config.h"
#include "moeq/err.h"
#include "moeq/job.h"
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOEQ_STORE_GROUP "workers"

typedef struct moeq_store moeq_store;

/* Connect (url + redis.* list). MOEQ_ERR_TRANSIENT when Redis cannot be reached yet. */
moeq_err moeq_store_new(const moeq_coordinator_params *params, const moeq_kvlist *redis, moeq_store **out,
                        char *errstr, size_t errstr_size);
void moeq_store_destroy(moeq_store *store); /* NULL is safe */

/*
 * Load the scripts, create the streams' consumer groups (at id 0, so no
 * batch written before a worker starts is skipped), and check durability:
 * with durability=fsync_always, *warning receives a message when the server
 * reports appendonly no or appendfsync other than always (CONFIG may be
 * disabled: then nothing is said). warning may be NULL.
 */
moeq_err moeq_store_prepare(moeq_store *store, char *warning, size_t warning_size, char *errstr,
                            size_t errstr_size);

/* What a job's existing record says, when the batch write found one. */
typedef enum moeq_store_dup_kind {
    MOEQ_STORE_NEW = 0,       /* no record: the job is in the written batch */
    MOEQ_STORE_DUP_ENQUEUED,  /* already enqueued (any state but cancelled-before-batching) */
    MOEQ_STORE_DUP_CANCELLED, /* cancelled before it was batched: answer `cancelled` */
} moeq_store_dup_kind;

/* A refused job and what is known of the earlier job with its id ("" / -1: unknown). */
typedef struct moeq_store_dup {
    moeq_store_dup_kind kind;
    int in_batch;                  /* the earlier job is in this same write, not in Redis */
    int64_t batched_ms;            /* when the earlier job was batched                    */
    int64_t kafka_ts_ms;           /* its Kafka timestamp                                 */
    char hash[MOEQ_JOB_HASH_SIZE]; /* its content hash                                    */
    char src[320];                 /* topic/partition/offset it was consumed from        */
} moeq_store_dup;

/*
 * 1 when the refused job is the earlier one delivered again, to be settled
 * silently: the same source topic/partition/offset (a consumer redelivery:
 * a coordinator restarted before its commit, a re-fetch). Also 1 when the
 * record predates sources and hashes (nothing to compare: silent, as then).
 * 0: the id was reused — answer with a `duplicate` dead letter, which says
 * whether the content was the same. Identical bytes at another offset are a
 * deliberate re-send, or a retry of a producer without idempotence: the two
 * cannot be told apart (the Kafka timestamp does not help: two sends within
 * one millisecond share it), so both are told, "same content: true".
 */
int moeq_store_dup_is_redelivery(const moeq_store_dup *dup, const char *src);

/*
 * Write one batch. jobs[0..n) are encoded into the entry (batch_entry.h);
 * sources[i] (may be NULL, or hold NULLs) is job i's "topic/partition/offset",
 * kept in its record with its content hash and Kafka timestamp.
 * On MOEQ_OK: *written is 1 and entry_id holds the stream entry id when the
 * batch was written; or *written is 0 and dup[i].kind tells which jobs were
 * refused (nothing was written). dup has n slots.
 * MOEQ_ERR_TRANSIENT / TIMEOUT: Redis unreachable; the batch may or may not
 * have been written — write it again: the guard makes that safe.
 * With durability=waitaof, also waits for the local AOF fsync (WAITAOF).
 */
moeq_err moeq_store_write_batch(moeq_store *store, int priority, const moeq_batch_entry_job *jobs,
                                const char *const *sources, size_t n, int32_t shared_prefix, int64_t closed_ms,
                                int64_t now_ms, int *written, char entry_id[64], moeq_store_dup *dup, char *errstr,
                                size_t errstr_size);

/*
 * The same, pipelined: append queues one batch write (no I/O; the
 * arguments are copied), read_batch reads the replies in the order the
 * batches were appended — call it exactly once per append, even after an
 * error (a lost connection fails every unread reply with TRANSIENT). With
 * `appendfsync always` the server fsyncs once per event-loop pass, so the
 * batches of one pipeline share one fsync (group commit). After the last
 * read, moeq_store_sync performs WAITAOF when durability=waitaof (no-op
 * otherwise) and must succeed before the batches count as durable.
 */
moeq_err moeq_store_append_batch(moeq_store *store, int priority, const moeq_batch_entry_job *jobs,
                                 const char *const *sources, size_t n, int32_t shared_prefix, int64_t closed_ms,
                                 int64_t now_ms, char *errstr, size_t errstr_size);
moeq_err moeq_store_read_batch(moeq_store *store, size_t n, int *written, char entry_id[64], moeq_store_dup *dup,
                               char *errstr, size_t errstr_size);
moeq_err moeq_store_sync(moeq_store *store, char *errstr, size_t errstr_size);

/*
 * Cancel job id wherever it is in Redis: no record yet -> a `cancelled`
 * record is written (the job will be refused when it arrives); batched or
 * running -> `cancel=1` is set for the worker to stop it. state_out
 * receives the state found ("absent", "batched", "running", "done", ...).
 */
moeq_err moeq_store_cancel(moeq_store *store, const char *id, int64_t now_ms, char *state_out,
                           size_t state_size, char *errstr, size_t errstr_size);

/* Batches written but not yet acknowledged by workers: Σ over streams (group pending + lag). */
moeq_err moeq_store_pending_batches(moeq_store *store, int64_t *pending, char *errstr, size_t errstr_size);

/*
 * Print the job's record as `key=value` lines to out (for `moeq status --job`).
 * MOEQ_ERR_NOT_FOUND when there is none.
 */
moeq_err moeq_store_print_job(moeq_store *store, const char *id, void *file, char *errstr, size_t errstr_size);

/* Stream key of a class and record key of a job, into out. */
void moeq_store_stream_key(const moeq_store *store, int priority, char *out, size_t out_size);

#ifdef __cplusplus
}
#endif
#endif
