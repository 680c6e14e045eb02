/*
 * worker_io.h — the worker's Redis side: the batch streams (take, reclaim,
 * acknowledge, hand back), job records and heartbeats, as thin functions
 * over moeq/redis.h, plus the decoding of one batch entry.
 *
 * Keys (see docs/WORKER.md): streams <redis_prefix>:batches:p0..3 with
 * consumer group `group`; job record hash <redis_prefix>:job:<id> (fields
 * `state`, `cancel`); heartbeat string <redis_prefix>:worker:<id> (JSON,
 * expires after 3 intervals).
 *
 * Not thread-safe: one connection, the worker loop's.
 */
#ifndef MOEQ_WORKER_IO_H
#define MOEQ_WORKER_IO_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/job.h"
#include "moeq/redis.h"
#include "worker_params.h"

/* One job of a taken batch entry. */
typedef struct worker_entry_job {
    moeq_job job;              /* decoded job (owned)                                */
    int32_t *tokens;           /* prompt ids from the entry (owned), NULL: tokenize  */
    int n_tokens;
    int64_t created_ms;        /* Kafka append time, 0 = unknown                     */
    uint8_t *raw;              /* the job's original bytes (owned), for the DLQ       */
    size_t raw_len;
    char *bad;                 /* non-NULL: the job could not be decoded (why)       */
    const char *bad_code;      /* with bad: the job reject code (schemas/job.md), the result's error.code */
    char id_fallback[64];
} worker_entry_job;

/* A taken batch entry. */
typedef struct worker_entry {
    char stream[96];
    char id[48];               /* stream entry id                                    */
    int64_t batched_ms;        /* when the coordinator wrote it (from the id)        */
    int deliveries;            /* times delivered, this one included                 */
    uint64_t prefix_key;       /* the entry's pkey, else computed from its prefix and
                                  first job's tokens; 0 = none (affinity)             */
    int prefix_tokens;         /* the leading tokens the key covers (its `prefix`, at most
                                  MOEQ_BATCH_PREFIX_KEY_TOKENS, rounded down to 16)    */
    worker_entry_job *jobs;
    size_t n_jobs;
} worker_entry;

void worker_entry_free(worker_entry *entry);

/*
 * Decode a stream entry (moeq/batch_entry.h: v, n, closed_ms and the
 * `jobs` blob) into *out (zeroed first). A job that fails to decode is kept
 * with `bad` set so it gets an error result. Pure.
 */
moeq_err worker_entry_decode(const moeq_redis_entry *entry, const char *stream, const moeq_job_limits *limits,
                             worker_entry *out, char *errstr, size_t errstr_size);

/* XGROUP CREATE ... MKSTREAM on every priority stream (BUSYGROUP is fine). */
moeq_err worker_io_ensure_groups(moeq_redis *redis, const moeq_worker_params *params, char *errstr,
                                 size_t errstr_size);

/*
 * Take up to max new entries, highest priority first (non-blocking pass
 * over p0..p3, then when block_ms > 0 and nothing came one blocking read on
 * all four). Appends to out[*n] (capacity cap).
 */
moeq_err worker_io_take(moeq_redis *redis, const moeq_worker_params *params, int block_ms, worker_entry *out,
                        size_t cap, size_t *n, char *errstr, size_t errstr_size);

/*
 * Reclaim at most one entry pending longer than visibility_timeout_ms on any
 * stream (XAUTOCLAIM), highest priority first, with its delivery count
 * (XPENDING). Entries deleted from the stream are acknowledged away.
 * *n is 0 or 1.
 */
moeq_err worker_io_reclaim(moeq_redis *redis, const moeq_worker_params *params, worker_entry *out, size_t *n,
                           char *errstr, size_t errstr_size);

/*
 * Entries still pending for this worker's own consumer name — a previous
 * process with the same worker_id died holding them — read back at once
 * (XREADGROUP ... STREAMS <stream> <cursor>: the consumer's own pending
 * list; Redis counts it as a delivery) rather than after the visibility
 * timeout, highest priority first, each with its delivery count (XPENDING).
 * cursors[p] starts at "0" and advances past every entry read; it becomes ""
 * once stream p has nothing more, so a worker reads its history once.
 * Entries deleted from the stream are acknowledged away. Appends to out[*n]
 * (capacity cap).
 *
 * sweep = 1 (the affinity's hand-off sweep, every heartbeat): the pending
 * entries are listed with XPENDING and read with XRANGE instead, which Redis
 * does not count as deliveries, and those held(held_ctx, stream, id) says run
 * here already are not read at all.
 */
moeq_err worker_io_take_own(moeq_redis *redis, const moeq_worker_params *params, char cursors[4][48], int sweep,
                            int (*held)(void *ctx, const char *stream, const char *id), void *held_ctx,
                            worker_entry *out, size_t cap, size_t *n, char *errstr, size_t errstr_size);

/*
 * Job record states for ids[0..n) (pipelined HMGET <prefix>:job:<id> state and
 * cancel): states[i] receives 'D' done/failed, 'C' cancelled, '-' other or
 * none.
 */
moeq_err worker_io_job_states(moeq_redis *redis, const char *prefix, const char *const *ids, size_t n, char *states, char *errstr,
                              size_t errstr_size);

/* Mark ids running on this worker (pipelined HSET). */
moeq_err worker_io_mark_running(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                                const char *const *ids, size_t n, char *errstr, size_t errstr_size);

/*
 * Acknowledge a finished entry in one round trip: job records -> `state`
 * (done, failed per job: states[i] 'F' failed else done), finished_ms,
 * worker; EXPIRE dedupe_window_s; then XACK and XDEL of the entry in one
 * MULTI/EXEC (the records, not the entries, are the dedupe guard: an
 * acknowledged entry is of no further use and holds every job's bytes).
 * Idempotent: call it again until it returns MOEQ_OK.
 */
moeq_err worker_io_ack(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                       const worker_entry *entry, const char *states, char *errstr, size_t errstr_size);

/*
 * Only the records: HSET state done|failed (states as for worker_io_ack),
 * finished_ms, worker, EXPIRE, for the jobs with pick[i] set; the entry stays
 * pending. For a batch that will run again elsewhere (a group that failed):
 * its jobs whose results went out are then skipped, as after a crash
 * (admit_entry reads 'D'), rather than answered twice.
 */
moeq_err worker_io_mark_finished(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                                 const worker_entry *entry, const char *states, const char *pick, char *errstr,
                                 size_t errstr_size);

/*
 * The sweep of one stream (one atomic script): XTRIM MINID below the
 * group's oldest pending entry — or, with nothing pending, up to and
 * including its last delivered one — so entries acknowledged but never
 * deleted (by an older
 * worker, or dropped from the group by hand) go too; pending entries are
 * never touched. Then consumers of the group with nothing pending, idle
 * longer than forget_idle_ms and not named keep are deleted (XGROUP
 * DELCONSUMER: every restart of a worker with a fresh worker_id leaves one).
 * Assumes the group is the stream's only reader. *trimmed and *forgotten
 * count what went.
 */
moeq_err worker_io_sweep(moeq_redis *redis, const moeq_worker_params *params, int priority, int64_t forget_idle_ms,
                         const char *keep, long long *trimmed, long long *forgotten, char *errstr, size_t errstr_size);

/* Reset a held entry's idle time while this consumer owns it (*still_ours 0: another took it meanwhile). */
moeq_err worker_io_refresh_claim(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                                 const worker_entry *entry, int *still_ours, char *errstr, size_t errstr_size);

/* Hand an entry back: XCLAIM to ourselves with IDLE = visibility timeout, so the next reclaim takes it at once. */
moeq_err worker_io_hand_back(moeq_redis *redis, const moeq_worker_params *params, const char *worker_id,
                             const worker_entry *entry, char *errstr, size_t errstr_size);

/*
 * Cancel notices: the coordinator appends `id <job id>` to the stream
 * <prefix>:cancels (after setting the record's cancel flag, in the same
 * script) for every job it cancels while batched or running. Read the
 * entries after *cursor (XREAD COUNT 256, never blocking), call fn for each
 * job id, and advance the cursor (at least 48 bytes). An empty cursor is
 * first set to the stream's last id (XREVRANGE + - COUNT 1, "0-0" when the
 * stream is empty) without reporting anything: cancels written before that
 * are in the job records, which admission reads. One round trip.
 */
#define WORKER_IO_CANCELS_KEY "cancels"
typedef void (*worker_io_cancel_fn)(const char *job_id, void *opaque);
moeq_err worker_io_cancels(moeq_redis *redis, const char *prefix, char *cursor, size_t cursor_size,
                           worker_io_cancel_fn fn, void *opaque, char *errstr, size_t errstr_size);

/*
 * How to treat a failed delivery of a message (the Kafka adapter's moeq_err):
 * 1 when the broker refuses this message for good — too large (LIMIT),
 * unknown topic (NOT_FOUND), forbidden or invalid (INVALID_ARG, FORMAT,
 * PARSE, UNSUPPORTED), or an unclassified broker error (IO: invalid record,
 * policy violation, ...) seen `failures` >= WORKER_DELIVERY_MAX_UNCLASSIFIED
 * times; 0 when it should be produced again (TRANSIENT, TIMEOUT, and
 * everything else: a fatal producer state is not the message's fault).
 * Pure.
 */
#define WORKER_DELIVERY_MAX_UNCLASSIFIED 3
int worker_delivery_is_permanent(moeq_err err, int failures);

/*
 * Affinity (worker/affinity.h): XCLAIM the entry to consumer `to` with min
 * idle 0 and JUSTID: it is pending on `to` now, its idle clock restarted, its
 * delivery count unchanged; `to` takes it from its own pending list, and if
 * `to` is gone any worker reclaims it after the visibility timeout.
 */
moeq_err worker_io_hand_to(moeq_redis *redis, const moeq_worker_params *params, const worker_entry *entry,
                           const char *to, char *errstr, size_t errstr_size);

/* Every live heartbeat under prefix (SCAN <prefix>:worker:*, then GET each): fn(ctx, json, len), NUL-terminated. */
typedef void (*worker_io_heartbeat_fn)(void *ctx, const char *json, size_t len);
moeq_err worker_io_heartbeats(moeq_redis *redis, const char *prefix, worker_io_heartbeat_fn fn, void *ctx,
                              char *errstr, size_t errstr_size);

/* SET <prefix>:worker:<id> json PX ttl_ms; DEL when json is NULL. */
moeq_err worker_io_heartbeat(moeq_redis *redis, const char *prefix, const char *worker_id, const char *json, int64_t ttl_ms,
                             char *errstr, size_t errstr_size);

#endif
