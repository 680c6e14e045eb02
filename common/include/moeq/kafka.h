/*
 * moeq/kafka.h — the Kafka adapter: a producer with idempotence and delivery
 * reports, and a group consumer with cooperative-sticky assignment and
 * manual offset storage. common/kafka.c is the only file that includes
 * librdkafka.
 *
 * What it promises the coordinator and the worker:
 *   - produce() never blocks; every accepted message gets exactly one
 *     delivery report (from poll/flush/destroy) carrying the caller's
 *     per-message opaque, its partition and offset, or the error.
 *   - the consumer never stores or commits an offset on its own: the caller
 *     stores (topic, partition, next offset) when the work up to there is
 *     safe (e.g. Redis acknowledged the batch), then commits.
 *
 * What it deliberately does not do: decode payloads (schemas/), retry
 * failed deliveries (the caller decides; librdkafka already retries within
 * message.timeout.ms), create topics, or run its own threads beyond
 * librdkafka's.
 *
 * Configuration: params name the few things moeq itself needs; every other
 * setting is a `kafka.*` key (prefix stripped, see moeq/config.h) passed to
 * rd_kafka_conf_set unchanged after moeq's defaults, so SASL, TLS and tuning
 * need no code. Two keys guard the delivery promise and may not be changed:
 * the producer's enable.idempotence (true) and the consumer's
 * enable.auto.offset.store (false); setting them otherwise is an error.
 *
 * Also here: consumer lag (watermarks against committed offsets, for
 * /metrics). Not here: the tests' mock cluster (moeq/kafka_mock.h, its own
 * library).
 */
#ifndef MOEQ_KAFKA_H
#define MOEQ_KAFKA_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/config.h"
#include "moeq/err.h"

/* Every role's default kafka_brokers: the broker of scripts/services.sh. */
#define MOEQ_KAFKA_BROKERS_DEFAULT "localhost:9092"

#ifdef __cplusplus
extern "C" {
#endif

/* Let the partitioner choose (by key hash, librdkafka's default "consistent_random"). */
#define MOEQ_KAFKA_PARTITION_ANY (-1)

typedef enum moeq_kafka_role {
    MOEQ_KAFKA_PRODUCER,
    MOEQ_KAFKA_CONSUMER,
} moeq_kafka_role;

/*
 * Check a kafka.* list without connecting: every key must be a librdkafka
 * property valid for role, and the guarded keys must keep moeq's values.
 * Returns MOEQ_ERR_INVALID_ARG with a message naming `kafka.<key>`.
 * Pure (no I/O); thread-safe.
 */
moeq_err moeq_kafka_conf_validate(const moeq_kvlist *kafka, moeq_kafka_role role, char *errstr,
                                  size_t errstr_size);

/* Map a librdkafka error code (rd_kafka_resp_err_t as int) to moeq_err. */
moeq_err moeq_kafka_err_map(int rd_kafka_err);

/* One message header. The name is NUL-terminated; value may be NULL (a null header). */
typedef struct moeq_kafka_header {
    const char *name;
    const void *value;
    size_t value_len;
} moeq_kafka_header;

/* ---- producer ----------------------------------------------------------- */

/* The outcome of one produced message, handed to the delivery callback. */
typedef struct moeq_kafka_delivery {
    moeq_err err;          /* MOEQ_OK when the broker acknowledged it (acks=all) */
    const char *errstr;    /* why, when err != MOEQ_OK; borrowed for the callback */
    const char *topic;     /* borrowed for the callback */
    int32_t partition;
    int64_t offset;        /* -1 when unknown (failed)                         */
    void *opaque;          /* the msg_opaque given to moeq_kafka_produce         */
} moeq_kafka_delivery;

typedef void (*moeq_kafka_delivery_fn)(const moeq_kafka_delivery *delivery, void *cb_opaque);

typedef struct moeq_kafka_producer_params {
    const char *brokers;               /* "host:port,..."; a kafka.bootstrap.servers key overrides it */
    const char *client_id;             /* NULL: "moeq"                                    */
    moeq_kafka_delivery_fn on_delivery; /* may be NULL; called from poll/flush/destroy    */
    void *cb_opaque;                   /* passed to on_delivery                           */
} moeq_kafka_producer_params;

/* A message to produce. Key, value and headers are copied: the caller's memory may be reused at once. */
typedef struct moeq_kafka_out {
    const char *topic;
    int32_t partition;                 /* MOEQ_KAFKA_PARTITION_ANY to partition by key */
    const void *key;                   /* may be NULL */
    size_t key_len;
    const void *value;                 /* may be NULL (a tombstone) */
    size_t value_len;
    const moeq_kafka_header *headers;  /* may be NULL */
    size_t n_headers;
    void *opaque;                      /* returned in the delivery report */
} moeq_kafka_out;

typedef struct moeq_kafka_producer moeq_kafka_producer;

/*
 * Create a producer: idempotence on (acks=all, no reordering or duplicates
 * on retry), linger.ms=5, then the kafka list. Connects lazily. kafka may be
 * NULL; it is borrowed. On error *out is NULL and errstr names the key or cause.
 */
moeq_err moeq_kafka_producer_new(const moeq_kafka_producer_params *params, const moeq_kvlist *kafka,
                                 moeq_kafka_producer **out, char *errstr, size_t errstr_size);

/*
 * Queue one message; never blocks. Returns MOEQ_ERR_TRANSIENT when the local
 * queue is full (poll, then retry), MOEQ_ERR_LIMIT when the message is larger
 * than message.max.bytes, MOEQ_ERR_INTERNAL after a fatal producer error (the
 * producer must be recreated). On success exactly one delivery report follows.
 * Thread-safe.
 */
moeq_err moeq_kafka_produce(moeq_kafka_producer *producer, const moeq_kafka_out *msg, char *errstr,
                            size_t errstr_size);

/* Serve delivery reports for up to timeout_ms (0: non-blocking). Returns the number of events served. */
int moeq_kafka_producer_poll(moeq_kafka_producer *producer, int timeout_ms);

/*
 * Wait until every queued message has a delivery report (reports are served
 * meanwhile). MOEQ_ERR_TIMEOUT when some are still outstanding after timeout_ms.
 */
moeq_err moeq_kafka_producer_flush(moeq_kafka_producer *producer, int timeout_ms, char *errstr,
                                   size_t errstr_size);

/* Messages queued or in flight (not yet reported). */
size_t moeq_kafka_producer_outq_len(moeq_kafka_producer *producer);

/*
 * Readiness: ask a broker for metadata (no topics), waiting up to timeout_ms.
 * MOEQ_OK when one answered with at least one broker; MOEQ_ERR_TRANSIENT
 * (errstr: librdkafka's reason) when none did. Thread-safe.
 */
moeq_err moeq_kafka_producer_ping(moeq_kafka_producer *producer, int timeout_ms, char *errstr, size_t errstr_size);

/*
 * Flush for up to 10 s, then destroy; undelivered messages are reported with
 * an error. NULL is safe. Not thread-safe with other calls on the producer.
 */
void moeq_kafka_producer_destroy(moeq_kafka_producer *producer);

/* ---- consumer ----------------------------------------------------------- */

typedef struct moeq_kafka_partition {
    const char *topic;  /* borrowed */
    int32_t partition;
} moeq_kafka_partition;

typedef enum moeq_kafka_rebalance {
    MOEQ_KAFKA_ASSIGNED, /* these partitions were added to this consumer            */
    MOEQ_KAFKA_REVOKED,  /* about to be taken away: store and commit what is safe now */
    MOEQ_KAFKA_LOST,     /* already taken away (session lost): commits will fail     */
} moeq_kafka_rebalance;

/* Called from moeq_kafka_consumer_poll/close; parts are borrowed for the call. */
typedef void (*moeq_kafka_rebalance_fn)(moeq_kafka_rebalance kind, const moeq_kafka_partition *parts,
                                        size_t n_parts, void *cb_opaque);

typedef struct moeq_kafka_consumer_params {
    const char *brokers;          /* "host:port,..."; a kafka.bootstrap.servers key overrides it */
    const char *group_id;         /* required                                              */
    const char *client_id;        /* NULL: "moeq"                                           */
    const char *const *topics;    /* subscribed at creation; at least one                  */
    size_t n_topics;
    moeq_kafka_rebalance_fn on_rebalance; /* may be NULL */
    void *cb_opaque;
    int64_t start_ms;             /* > 0: each partition, when assigned, starts at its first message
                                     with a timestamp >= start_ms (offsets_for_times; when there is
                                     none, the high watermark read at the assignment, so nothing
                                     produced after it is missed), not at the committed offset or
                                     auto.offset.reset: a reader of what is produced from then on.
                                     Should the broker not answer, the usual start applies (logged) */
} moeq_kafka_consumer_params;

typedef struct moeq_kafka_consumer moeq_kafka_consumer;

/*
 * Create a group consumer and subscribe: partition.assignment.strategy
 * cooperative-sticky, enable.auto.offset.store=false (guarded),
 * enable.auto.commit=false, auto.offset.reset=earliest, then the kafka list.
 */
moeq_err moeq_kafka_consumer_new(const moeq_kafka_consumer_params *params, const moeq_kvlist *kafka,
                                 moeq_kafka_consumer **out, char *errstr, size_t errstr_size);

/* A consumed message: opaque, read through the accessors below. */
typedef struct moeq_kafka_msg moeq_kafka_msg;

/*
 * Wait up to timeout_ms for a message. MOEQ_OK with *msg NULL on timeout.
 * The caller owns *msg (moeq_kafka_msg_destroy). Rebalance callbacks run in
 * here. Errors the client recovers from itself (a broker briefly down) are
 * logged, not returned; MOEQ_ERR_INTERNAL means the consumer is unusable.
 * Call from one thread.
 */
moeq_err moeq_kafka_consumer_poll(moeq_kafka_consumer *consumer, int timeout_ms, moeq_kafka_msg **msg,
                                  char *errstr, size_t errstr_size);

/*
 * Record next_offset (the offset of the first message NOT yet safe, i.e.
 * last safe + 1) for a partition, to be sent by the next commit.
 * MOEQ_ERR_NOT_FOUND when the partition is no longer assigned to this consumer.
 */
moeq_err moeq_kafka_consumer_store(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                   int64_t next_offset, char *errstr, size_t errstr_size);

/*
 * Commit every stored offset (nothing stored is not an error). Synchronous
 * unless async; an async commit's failure is only logged.
 */
moeq_err moeq_kafka_consumer_commit(moeq_kafka_consumer *consumer, int async, char *errstr,
                                    size_t errstr_size);

/*
 * Commits (sync or async) the broker refused so far, as reported to the
 * offset-commit callback during moeq_kafka_consumer_poll. A caller that sees
 * it grow must commit again even when it has stored nothing new.
 */
uint64_t moeq_kafka_consumer_commit_failures(const moeq_kafka_consumer *consumer);

/* The group's committed offset of a partition, -1 when none (asks the broker). */
moeq_err moeq_kafka_consumer_committed(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                       int timeout_ms, int64_t *offset, char *errstr, size_t errstr_size);

/*
 * Stop (pause) or restart (resume) fetching a partition — backpressure while
 * Redis is unavailable. topic NULL means every partition assigned now.
 */
moeq_err moeq_kafka_consumer_pause(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                   char *errstr, size_t errstr_size);
moeq_err moeq_kafka_consumer_resume(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                    char *errstr, size_t errstr_size);

/* Partitions assigned now; the caller frees *parts (one allocation, strings inside). */
moeq_err moeq_kafka_consumer_assignment(moeq_kafka_consumer *consumer, moeq_kafka_partition **parts,
                                        size_t *n_parts, char *errstr, size_t errstr_size);

/*
 * Leave the group (revoke callbacks run; commit in them what is safe). Idempotent;
 * destroy closes too. Messages still held by the caller stay valid until destroyed.
 */
moeq_err moeq_kafka_consumer_close(moeq_kafka_consumer *consumer, char *errstr, size_t errstr_size);

/* Close if needed and free. NULL is safe. Destroy every moeq_kafka_msg first. */
void moeq_kafka_consumer_destroy(moeq_kafka_consumer *consumer);

/* As moeq_kafka_producer_ping, over the consumer's connection. Thread-safe. */
moeq_err moeq_kafka_consumer_ping(moeq_kafka_consumer *consumer, int timeout_ms, char *errstr, size_t errstr_size);

/* ---- consumer lag -------------------------------------------------------- */

/* Where this consumer stands on one assigned partition. Offsets are -1 when unknown. */
typedef struct moeq_kafka_lag {
    const char *topic;  /* inside the array's allocation */
    int32_t partition;
    int64_t low, high;  /* watermarks: first offset kept, next offset to be written   */
    int64_t position;   /* next offset the application will receive (last polled + 1) */
    int64_t committed;  /* the group's committed offset; -1 when none or not asked     */
    int64_t lag;        /* high - committed, or high - low when the group never committed
                           (auto.offset.reset=earliest, moeq's default); -1 when unknown */
} moeq_kafka_lag;

/*
 * For every partition assigned now: watermarks, position, committed offset,
 * lag. Asks the broker: the group's committed offsets (one OffsetFetch to
 * the group coordinator), the high watermarks (one ListOffsets per partition
 * leader), and the low ones of partitions the group never committed (a second
 * ListOffsets). Where an answer is missing or the time is spent, the values
 * cached from the last fetch response are used. A ListOffsets waits behind
 * the consumer's own Fetch long-poll on that connection (up to
 * fetch.wait.max.ms, 500 by default), so this blocks for up to about
 * timeout_ms: never call it from the poll loop (the coordinator calls it
 * from its HTTP threads); timeout_ms 0 asks nothing (cached watermarks only,
 * committed and lag -1). The caller frees *lags (one
 * allocation, strings inside; NULL when nothing is assigned). Thread-safe
 * with moeq_kafka_consumer_poll.
 */
moeq_err moeq_kafka_consumer_lag(moeq_kafka_consumer *consumer, int timeout_ms, moeq_kafka_lag **lags,
                                 size_t *n_lags, char *errstr, size_t errstr_size);

/* Accessors; results are borrowed from msg, valid until moeq_kafka_msg_destroy. */
const char *moeq_kafka_msg_topic(const moeq_kafka_msg *msg);
int32_t moeq_kafka_msg_partition(const moeq_kafka_msg *msg);
int64_t moeq_kafka_msg_offset(const moeq_kafka_msg *msg);
int64_t moeq_kafka_msg_timestamp_ms(const moeq_kafka_msg *msg); /* -1 when absent */
const void *moeq_kafka_msg_key(const moeq_kafka_msg *msg, size_t *len);   /* NULL when absent */
const void *moeq_kafka_msg_value(const moeq_kafka_msg *msg, size_t *len); /* NULL when absent */
/* Value of the LAST header called name (Kafka allows repeats); MOEQ_ERR_NOT_FOUND when absent. */
moeq_err moeq_kafka_msg_header(const moeq_kafka_msg *msg, const char *name, const void **value,
                               size_t *value_len);
size_t moeq_kafka_msg_header_count(const moeq_kafka_msg *msg);
moeq_err moeq_kafka_msg_header_at(const moeq_kafka_msg *msg, size_t i, moeq_kafka_header *header);
void moeq_kafka_msg_destroy(moeq_kafka_msg *msg); /* NULL is safe */

/* ---- topics (admin) ------------------------------------------------------ */

/* One topic to create: its partitions, replication and topic configs. */
typedef struct moeq_kafka_topic_spec {
    const char *name;
    int partitions;              /* >= 1                                             */
    int replication_factor;      /* >= 1, or -1 for the broker's default.replication.factor */
    const char *const *configs;  /* key, value, key, value, ..., NULL (may be NULL)   */
} moeq_kafka_topic_spec;

typedef enum moeq_kafka_topic_outcome {
    MOEQ_KAFKA_TOPIC_CREATED = 0,  /* created (or, validate_only, would be)            */
    MOEQ_KAFKA_TOPIC_EXISTS,       /* already there: left as it is                     */
    MOEQ_KAFKA_TOPIC_FAILED,       /* the broker refused it: message says why           */
} moeq_kafka_topic_outcome;

/*
 * Create topics through the broker's admin API (CreateTopics), with the
 * kafka.* pass-through keys (TLS, SASL) of every other client. outcome[i] and
 * message[i] (each 256 bytes, "" when created) per spec. validate_only: the
 * broker checks the request and creates nothing. Returns MOEQ_OK when every
 * request got an answer (look at outcome), or the error that stopped all of
 * them (a bad kafka.* key: INVALID_ARG; no broker answered in timeout_ms: TIMEOUT).
 */
moeq_err moeq_kafka_create_topics(const char *brokers, const moeq_kvlist *kafka, const moeq_kafka_topic_spec *specs,
                                  int n_specs, int validate_only, int timeout_ms, moeq_kafka_topic_outcome *outcome,
                                  char (*message)[256], char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
