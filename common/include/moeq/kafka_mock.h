/*
 * moeq/kafka_mock.h — for tests only: librdkafka's built-in mock cluster
 * behind moeq's names (library moeq_kafka_mock; production code never links
 * it). Clients are the adapter's own (moeq/kafka.h), pointed at the mock's
 * bootstraps or created with kafka.test.mock.num.brokers.
 */
#ifndef MOEQ_KAFKA_MOCK_H
#define MOEQ_KAFKA_MOCK_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/kafka.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- mock cluster (tests only) ------------------------------------------- */

/*
 * librdkafka's built-in mock cluster (`test.mock.num.brokers`): N brokers
 * inside this process, listening on loopback ports that any client — here or
 * in a child process — reaches through moeq_kafka_mock_bootstraps. Requests
 * can be made to fail, be delayed, or find their broker down. It speaks
 * enough of the protocol for the idempotent producer, consumer groups and
 * offset commits; librdkafka marks the API experimental, so only tests use it.
 * Topics are not auto-created for consumers: create them first.
 * The cluster lives as long as the handle that owns it.
 */
typedef struct moeq_kafka_mock moeq_kafka_mock;

/* Kafka protocol request types (ApiKey; wire values). */
typedef enum moeq_kafka_api {
    MOEQ_KAFKA_API_PRODUCE = 0,
    MOEQ_KAFKA_API_FETCH = 1,
    MOEQ_KAFKA_API_LIST_OFFSETS = 2,
    MOEQ_KAFKA_API_METADATA = 3,
    MOEQ_KAFKA_API_OFFSET_COMMIT = 8,
    MOEQ_KAFKA_API_OFFSET_FETCH = 9,
    MOEQ_KAFKA_API_FIND_COORDINATOR = 10,
    MOEQ_KAFKA_API_JOIN_GROUP = 11,
    MOEQ_KAFKA_API_HEARTBEAT = 12,
    MOEQ_KAFKA_API_LEAVE_GROUP = 13,
    MOEQ_KAFKA_API_SYNC_GROUP = 14,
    MOEQ_KAFKA_API_INIT_PRODUCER_ID = 22,
} moeq_kafka_api;

/* What a mock broker answers instead (Kafka protocol error codes), or a dropped connection. */
typedef enum moeq_kafka_fault {
    MOEQ_KAFKA_FAULT_DISCONNECT = -1,    /* the broker closes the connection instead of answering */
    MOEQ_KAFKA_FAULT_NONE = 0,           /* answer normally (with a delay: see broker_push_faults) */
    MOEQ_KAFKA_FAULT_UNKNOWN_TOPIC_OR_PART = 3,
    MOEQ_KAFKA_FAULT_LEADER_NOT_AVAILABLE = 5,
    MOEQ_KAFKA_FAULT_NOT_LEADER = 6,
    MOEQ_KAFKA_FAULT_REQUEST_TIMED_OUT = 7,
    MOEQ_KAFKA_FAULT_COORDINATOR_LOADING = 14,
    MOEQ_KAFKA_FAULT_COORDINATOR_NOT_AVAILABLE = 15,
    MOEQ_KAFKA_FAULT_NOT_COORDINATOR = 16,
    MOEQ_KAFKA_FAULT_NOT_ENOUGH_REPLICAS = 19,
    MOEQ_KAFKA_FAULT_NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20,
    MOEQ_KAFKA_FAULT_REBALANCE_IN_PROGRESS = 27,
} moeq_kafka_fault;

/*
 * Start a mock cluster of n_brokers (1..32; broker ids 1..n) owned by a
 * private client handle. On error *out is NULL. Destroy it after every
 * client that talks to it.
 */
moeq_err moeq_kafka_mock_new(int n_brokers, moeq_kafka_mock **out, char *errstr, size_t errstr_size);

/* Stop the cluster and its owning handle. NULL is safe. Only for moeq_kafka_mock_new's. */
void moeq_kafka_mock_destroy(moeq_kafka_mock *mock);

/*
 * The mock cluster of a producer/consumer created with
 * kafka.test.mock.num.brokers (that client then talks only to it); NULL
 * otherwise. Borrowed: valid while the client lives; never destroy it.
 */
moeq_kafka_mock *moeq_kafka_producer_mock(moeq_kafka_producer *producer);
moeq_kafka_mock *moeq_kafka_consumer_mock(moeq_kafka_consumer *consumer);

/* "127.0.0.1:port,..." of the mock brokers; borrowed from mock. */
const char *moeq_kafka_mock_bootstraps(const moeq_kafka_mock *mock);

/* Create a topic (replication 1..n_brokers). */
moeq_err moeq_kafka_mock_topic_create(moeq_kafka_mock *mock, const char *topic, int partitions, int replication,
                                      char *errstr, size_t errstr_size);

/* Make broker_id lead a partition (-1: leaderless). Creates the topic when absent. */
moeq_err moeq_kafka_mock_partition_set_leader(moeq_kafka_mock *mock, const char *topic, int32_t partition,
                                              int32_t broker_id, char *errstr, size_t errstr_size);

/* Make broker_id the group coordinator of group. */
moeq_err moeq_kafka_mock_group_coordinator_set(moeq_kafka_mock *mock, const char *group, int32_t broker_id,
                                               char *errstr, size_t errstr_size);

/*
 * The next n_faults requests of type api, to any broker, are answered with
 * faults[0], faults[1], ... in turn (cluster-wide; a broker's own faults
 * come first). Faults already queued for api stay queued before these.
 */
moeq_err moeq_kafka_mock_push_faults(moeq_kafka_mock *mock, moeq_kafka_api api, const moeq_kafka_fault *faults,
                                     size_t n_faults, char *errstr, size_t errstr_size);

/* The same for one broker, each answer delayed rtt_ms (a fault may be NONE: a slow answer). */
moeq_err moeq_kafka_mock_broker_push_faults(moeq_kafka_mock *mock, int32_t broker_id, moeq_kafka_api api,
                                            const moeq_kafka_fault *faults, size_t n_faults, int rtt_ms,
                                            char *errstr, size_t errstr_size);

/* Faults still queued on broker_id for api (so a test can wait until they were all hit). */
moeq_err moeq_kafka_mock_broker_faults_left(moeq_kafka_mock *mock, int32_t broker_id, moeq_kafka_api api,
                                            size_t *left, char *errstr, size_t errstr_size);

/* Drop the cluster-wide faults still queued for api. */
void moeq_kafka_mock_clear_faults(moeq_kafka_mock *mock, moeq_kafka_api api);

/*
 * Take a broker down (its connections are closed and new ones refused;
 * leadership does not move) or bring it back. broker_id -1: every broker.
 */
moeq_err moeq_kafka_mock_broker_down(moeq_kafka_mock *mock, int32_t broker_id, char *errstr, size_t errstr_size);
moeq_err moeq_kafka_mock_broker_up(moeq_kafka_mock *mock, int32_t broker_id, char *errstr, size_t errstr_size);

/* Delay every answer of a broker (-1: all) by rtt_ms (0: none). */
moeq_err moeq_kafka_mock_broker_set_rtt(moeq_kafka_mock *mock, int32_t broker_id, int rtt_ms, char *errstr,
                                        size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
