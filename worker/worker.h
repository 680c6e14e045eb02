/*
 * worker.h — the moeq worker: batches from Redis Streams, the engine with
 * continuous batching, results to Kafka (`moeq worker --config FILE`).
 *
 * Delivery (see docs/WORKER.md): a batch is XACKed and its job records are
 * marked done only after the broker acknowledged every one of its results;
 * a worker that dies leaves its batches pending and a live worker reclaims
 * them (XAUTOCLAIM after visibility_timeout_ms; a worker restarted with the
 * same worker_id takes its own back at once), skipping jobs whose record
 * says done; an acknowledgement Redis did not take is retried until it is,
 * and an acknowledged entry is deleted; a batch delivered more than max_deliveries times is
 * dead-lettered with error results. Results are at-least-once, keyed by job
 * id; a duplicate is identical to the first (per-job seeded sampling, a
 * batch-invariant engine).
 *
 * This header holds the worker handle (the I/O shell, worker.c); the params
 * struct and its property table (pure) are in worker_params.h, included here.
 */
#ifndef MOEQ_WORKER_H
#define MOEQ_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/config.h"
#include "moeq/err.h"
#include "worker_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the shell ------------------------------------------------------------------ */

typedef struct moeq_worker moeq_worker;

/*
 * Load the model and tokenizer, connect to Redis and Kafka, create the
 * consumer group if missing. kafka / redis pass-through lists are borrowed
 * for the call. On error *out is NULL and errstr names the cause.
 */
moeq_err moeq_worker_new(const moeq_worker_params *params, const moeq_kvlist *kafka, const moeq_kvlist *redis,
                         moeq_worker **out, char *errstr, size_t errstr_size);

/*
 * Run until moeq_worker_stop (or SIGTERM/SIGINT when install_signals was
 * called): take batches, run them, publish, acknowledge; then drain within
 * drain_timeout_ms. MOEQ_OK after a clean drain.
 */
moeq_err moeq_worker_run(moeq_worker *worker, char *errstr, size_t errstr_size);

/* Ask run to stop taking batches and drain. Async-signal-safe. */
void moeq_worker_stop(moeq_worker *worker);

/* Route SIGTERM and SIGINT to moeq_worker_stop of this worker. */
void moeq_worker_install_signals(moeq_worker *worker);

void moeq_worker_destroy(moeq_worker *worker); /* NULL is safe */

#ifdef __cplusplus
}
#endif
#endif
