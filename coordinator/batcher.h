/*
 * batcher.h — the coordinator's bucketing and batching policy.
 *
 * Jobs arrive one at a time with a priority class and an exact prompt length;
 * the batcher groups them into batches that a GPU worker runs efficiently:
 *
 *  - per priority class, jobs are bucketed by prompt length with a relative
 *    tolerance: a job joins an open bucket whose mean prompt length is within
 *    `length_tolerance` of its own length (or within `length_slack_tokens`,
 *    whichever is larger, so very short prompts are not each alone), and only
 *    when the bucket's spread stays within twice that allowance;
 *  - a bucket closes (becomes a batch) when it holds `max_batch_jobs` jobs,
 *    when its token budget (sum of prompt_len + max_new_tokens) has less room
 *    left than its average job needs, or when its oldest job has waited
 *    `max_wait_ms` (checked by moeq_batcher_poll);
 *  - lower priorities age: a job already `aging_ms` old when it reaches the
 *    batcher (by its producer timestamp) is promoted one class per `aging_ms`,
 *    so a backlog of low-priority jobs cannot be starved behind fresh
 *    high-priority ones;
 *  - one id, one job: a job whose id is held by a job already in the
 *    batcher (in an open bucket, or in a closed batch not yet released) is
 *    refused, so no bucket, and no two unreleased batches, carry one id
 *    twice. moeq_batcher_holder says which job holds an id, so the caller
 *    can settle the newcomer (a duplicate) before adding it;
 *  - jobs whose prompts share a common token prefix of at least
 *    `min_shared_prefix` tokens are preferred together, but only among the
 *    buckets the length tolerance admits (prefix grouping never costs more
 *    padding than the tolerance); a bucket whose jobs share such a prefix is
 *    not joined by a job that would break it. Each batch records the length
 *    of the prefix all its prompts share.
 *
 * Time is injected: every call takes `now_ms`, so tests are deterministic.
 * The batcher does no I/O and allocates only when it needs more buckets than
 * it ever had before (buckets are pooled and reused).
 *
 * Not thread-safe: one batcher per coordinator loop.
 */
#ifndef MOEQ_BATCHER_H
#define MOEQ_BATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Priority classes 0 (most urgent) .. MOEQ_BATCHER_CLASSES-1; one stream each. */
#define MOEQ_BATCHER_CLASSES 4

typedef struct moeq_batcher_params {
    int64_t max_batch_jobs;      /* jobs per batch; [1, 4096]; default 64                        */
    int64_t max_batch_tokens;    /* Σ prompt_len + max_new_tokens per batch; [1, 2^24]; 65536      */
    int64_t max_wait_ms;         /* a bucket closes when its oldest job waited this; [0, 600000]; 50 */
    double length_tolerance;     /* relative distance of a job to a bucket mean; [0, 1]; 0.10      */
    int64_t length_slack_tokens; /* absolute allowance floor for short prompts; [0, 65536]; 8      */
    int64_t min_shared_prefix;   /* tokens two prompts must share to count as a prefix group; 64   */
    int64_t aging_ms;            /* promote one class per this much producer-side age; 0 = off; 30000 */
} moeq_batcher_params;

/* Documented defaults (see the comments above). */
moeq_batcher_params moeq_batcher_default_params(void);

/* One job as the batcher sees it. Copied in; tokens are borrowed (below). */
typedef struct moeq_batcher_job {
    uint64_t handle;          /* the caller's job handle; opaque here, unique among open jobs */
    int priority;             /* requested class, 0 .. MOEQ_BATCHER_CLASSES-1 */
    int32_t prompt_len;       /* exact prompt length in tokens, >= 1 */
    int32_t max_new_tokens;   /* generation budget, >= 0 */
    const int32_t *tokens;    /* prompt token ids (prompt_len of them) or NULL (no prefix
                                 grouping); borrowed until the job leaves in a released batch */
    int64_t created_ms;       /* producer timestamp (ms since epoch) for aging; <= 0 = unknown */
    const char *id;           /* the job id (id_len bytes) or NULL (no dedupe); borrowed like tokens,
                                 and must not move while borrowed */
    size_t id_len;
    int64_t arrival_ms;       /* set by the batcher: now_ms of moeq_batcher_add */
    uint64_t id_hash;         /* set by the batcher: hash of id (its index key)  */
} moeq_batcher_job;

typedef enum moeq_batch_close {
    MOEQ_BATCH_CLOSE_FULL_JOBS = 0, /* reached max_batch_jobs                          */
    MOEQ_BATCH_CLOSE_FULL_TOKENS,   /* too little token budget left for another job    */
    MOEQ_BATCH_CLOSE_MAX_WAIT,      /* its oldest job waited max_wait_ms               */
    MOEQ_BATCH_CLOSE_FLUSH,         /* moeq_batcher_flush (shutdown, rebalance)        */
    MOEQ_BATCH_CLOSE__COUNT
} moeq_batch_close;

/* "full_jobs", "full_tokens", "max_wait", "flush". */
const char *moeq_batch_close_str(moeq_batch_close reason);

/* A closed batch. Plain data; owned by the batcher until moeq_batcher_release. */
typedef struct moeq_batch_plan {
    int priority;              /* stream class the batch goes to (after aging)        */
    size_t n_jobs;
    const moeq_batcher_job *jobs; /* n_jobs jobs, in the order they joined            */
    int64_t prompt_tokens;     /* Σ prompt_len                                         */
    int64_t budget_tokens;     /* Σ prompt_len + max_new_tokens (<= max_batch_tokens)  */
    int64_t pad_tokens;        /* Σ (max_prompt_len - prompt_len): padding waste       */
    int32_t min_prompt_len, max_prompt_len;
    int32_t shared_prefix_len; /* tokens every prompt shares; 0 for one job or no tokens */
    int64_t oldest_ms;         /* arrival of the oldest job                            */
    int64_t closed_ms;         /* now_ms when it closed                                */
    moeq_batch_close reason;
} moeq_batch_plan;

typedef struct moeq_batcher moeq_batcher;

/* Validates params (message names the field). *out receives the batcher. */
moeq_err moeq_batcher_new(const moeq_batcher_params *params, moeq_batcher **out, char *errstr,
                          size_t errstr_size);
/* Frees everything, including batches not yet released. NULL is safe. */
void moeq_batcher_destroy(moeq_batcher *batcher);

/*
 * Add a job at now_ms. It may close a bucket (full) onto the ready queue.
 * MOEQ_ERR_LIMIT: prompt_len + max_new_tokens exceeds max_batch_tokens (the
 * job can never be batched: the caller rejects it). MOEQ_ERR_INVALID_ARG:
 * priority out of range, prompt_len < 1 or max_new_tokens < 0, or its id is
 * already held (moeq_batcher_holder would have said so).
 */
moeq_err moeq_batcher_add(moeq_batcher *batcher, const moeq_batcher_job *job, int64_t now_ms,
                          char *errstr, size_t errstr_size);

/* Close every bucket whose oldest job has waited max_wait_ms. Returns how many closed. */
size_t moeq_batcher_poll(moeq_batcher *batcher, int64_t now_ms);

/* Close every open bucket (reason FLUSH). Returns how many closed. */
size_t moeq_batcher_flush(moeq_batcher *batcher, int64_t now_ms);

/*
 * The oldest closed batch not yet taken, or NULL. Borrowed: valid until
 * moeq_batcher_release(batcher, plan), which the caller must call once per
 * batch (after the batch is durable or dropped).
 */
const moeq_batch_plan *moeq_batcher_next(moeq_batcher *batcher);
void moeq_batcher_release(moeq_batcher *batcher, const moeq_batch_plan *plan);

/*
 * Remove a job that is still in an open bucket (cancellation). On success,
 * *out (may be NULL) receives the job, so the caller can free its tokens.
 * MOEQ_ERR_NOT_FOUND when no open bucket holds it (already batched or unknown).
 */
moeq_err moeq_batcher_cancel(moeq_batcher *batcher, uint64_t handle, moeq_batcher_job *out);

/*
 * Which job holds id (id_len bytes): MOEQ_OK and *handle (may be NULL) when
 * a job with that id was added and has not left (released with its batch,
 * or cancelled); MOEQ_ERR_NOT_FOUND otherwise.
 */
moeq_err moeq_batcher_holder(const moeq_batcher *batcher, const char *id, size_t id_len, uint64_t *handle);

/* Earliest now_ms at which poll will close a bucket; INT64_MAX when none is open. */
int64_t moeq_batcher_next_deadline(const moeq_batcher *batcher);

/* Jobs in open buckets, open buckets, and closed batches not yet taken by next. */
size_t moeq_batcher_open_jobs(const moeq_batcher *batcher);
size_t moeq_batcher_open_buckets(const moeq_batcher *batcher);
size_t moeq_batcher_ready_batches(const moeq_batcher *batcher);

/* The class a job goes to at now_ms after aging (exposed for tests and metrics). */
int moeq_batcher_effective_priority(const moeq_batcher *batcher, const moeq_batcher_job *job,
                                    int64_t now_ms);

#ifdef __cplusplus
}
#endif
#endif
