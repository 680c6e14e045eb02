/*
 * coordinator.h — the coordinator process: Kafka job topics in, batches in
 * Redis streams out, offsets committed only up to what is durable.
 *
 * This is the I/O shell around the pure modules (intake, batcher, offsets,
 * batch_entry): it owns a Kafka consumer and producer (moeq/kafka.h), one
 * Redis connection (store.h), the tokenizer, and the /metrics + /healthz
 * HTTP endpoint. See docs/COORDINATOR.md for the delivery argument.
 *
 * One thread runs the loop (moeq_coordinator_run); the HTTP endpoint reads a
 * snapshot of the counters from its own thread.
 */
#ifndef MOEQ_COORDINATOR_H
#define MOEQ_COORDINATOR_H

#include <signal.h>
#include <stddef.h>

#include "coord_metrics.h"
#include "moeq/config.h"
#include "moeq/err.h"
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moeq_coordinator moeq_coordinator;

/*
 * Validate params, load the tokenizer (when `model` is set), connect to
 * Redis (prepare streams and scripts), create the producer and the group
 * consumer, start the HTTP endpoint (http_port > 0). kafka / redis are the
 * pass-through lists (borrowed for the call). On error *out is NULL.
 */
moeq_err moeq_coordinator_new(const moeq_coordinator_params *params, const moeq_kvlist *kafka,
                              const moeq_kvlist *redis, moeq_coordinator **out, char *errstr,
                              size_t errstr_size);

/*
 * Run until *stop becomes nonzero (a signal handler sets it), then flush:
 * close every open bucket, write the batches, wait for deliveries, commit,
 * leave the group. Returns MOEQ_OK after a clean stop, or the fatal error.
 */
moeq_err moeq_coordinator_run(moeq_coordinator *coord, volatile sig_atomic_t *stop, char *errstr,
                              size_t errstr_size);

/* Copy of the counters as of the last loop tick. Thread-safe. */
void moeq_coordinator_stats(moeq_coordinator *coord, moeq_coord_stats *out);

void moeq_coordinator_destroy(moeq_coordinator *coord); /* NULL is safe */

#ifdef __cplusplus
}
#endif
#endif
