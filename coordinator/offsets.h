/*
 * offsets.h — per-partition low-water marks for committing Kafka offsets.
 *
 * The coordinator consumes a partition in offset order, but the jobs of one
 * partition sit in different buckets and become durable (in Redis, or
 * answered with an error/expired result acknowledged by the broker) out of
 * order. A partition's committed offset must never pass a job that is not
 * yet durable, so what may be committed is the lowest offset still in
 * flight — or, when nothing is in flight, one past the highest offset seen
 * (Kafka commits name the next offset to read).
 *
 * Usage: moeq_offsets_track() each message as it is consumed (offsets of one
 * partition must increase), moeq_offsets_done() when it is durable,
 * moeq_offsets_committable() or moeq_offsets_collect() to learn what to
 * store/commit. moeq_offsets_drop() forgets a revoked partition.
 *
 * No I/O. Not thread-safe.
 */
#ifndef MOEQ_OFFSETS_H
#define MOEQ_OFFSETS_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Topic names up to this many bytes (Kafka allows 249). */
#define MOEQ_OFFSETS_TOPIC_MAX 256

typedef struct moeq_offsets moeq_offsets;

typedef struct moeq_offset_commit {
    const char *topic;   /* borrowed from the tracker, valid until drop/destroy */
    int32_t partition;
    int64_t offset;      /* the next offset to read: commit this */
} moeq_offset_commit;

moeq_offsets *moeq_offsets_new(void);
void moeq_offsets_destroy(moeq_offsets *offsets); /* NULL is safe */

/*
 * A message was consumed and is now in flight. MOEQ_ERR_INVALID_ARG when
 * offset is not above the partition's last tracked offset (the caller must
 * drop the partition before re-reading it from an earlier offset).
 */
moeq_err moeq_offsets_track(moeq_offsets *offsets, const char *topic, int32_t partition, int64_t offset);

/* The message is durable. MOEQ_ERR_NOT_FOUND when it is not in flight (e.g. dropped). */
moeq_err moeq_offsets_done(moeq_offsets *offsets, const char *topic, int32_t partition, int64_t offset);

/*
 * The offset that may be committed for a partition (next to read), or -1
 * when nothing of the partition was ever tracked (or it was dropped).
 */
int64_t moeq_offsets_committable(const moeq_offsets *offsets, const char *topic, int32_t partition);

/* Messages tracked but not yet done, over all partitions / for one. */
size_t moeq_offsets_in_flight(const moeq_offsets *offsets);
size_t moeq_offsets_partition_in_flight(const moeq_offsets *offsets, const char *topic, int32_t partition);

/*
 * Fill out[0..cap) with the partitions whose committable offset moved since
 * the last collect that reported them; returns how many were written. Those
 * are then remembered as reported (call again after the commit failed with
 * moeq_offsets_uncollect()).
 */
size_t moeq_offsets_collect(moeq_offsets *offsets, moeq_offset_commit *out, size_t cap);

/* Forget what collect reported for a partition, so the next collect reports it again. */
void moeq_offsets_uncollect(moeq_offsets *offsets, const char *topic, int32_t partition);

/* Forget a partition (revoked, or to be re-read from an earlier offset). */
void moeq_offsets_drop(moeq_offsets *offsets, const char *topic, int32_t partition);

#ifdef __cplusplus
}
#endif
#endif
