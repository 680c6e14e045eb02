/*
 * kafka_mock.c — librdkafka's mock cluster for tests (moeq/kafka_mock.h): it
 * wraps the experimental rdkafka_mock.h so no test includes librdkafka. Its
 * own library (moeq_kafka_mock), linked only by tests: the production
 * adapter (kafka.c) carries no test double. It reaches a client's librdkafka
 * handle through kafka_internal.h.
 */
#include "moeq/kafka_mock.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h> /* after rdkafka.h */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kafka_internal.h"

/* ---- mock cluster (tests only) ------------------------------------------------
 * A moeq_kafka_mock is an rd_kafka_mock_cluster_t. moeq_kafka_mock_new's is
 * created by `test.mock.num.brokers` on a private producer handle, so
 * destroying that handle stops the cluster.
 */

static rd_kafka_mock_cluster_t *mc_of(const moeq_kafka_mock *mock) { return (rd_kafka_mock_cluster_t *)mock; }

moeq_err moeq_kafka_mock_new(int n_brokers, moeq_kafka_mock **out, char *errstr, size_t n) {
    if (!out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock: NULL out");
    *out = NULL;
    if (n_brokers < 1 || n_brokers > 32)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock: %d brokers (1..32)", n_brokers);
    char count[16], rd_err[512];
    snprintf(count, sizeof count, "%d", n_brokers);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    moeq_err err = moeq_kafka_conf_set(conf, "test.mock.num.brokers", count, "mock ", errstr, n);
    if (!err) err = moeq_kafka_conf_set(conf, "client.id", "moeq-mock", "mock ", errstr, n);
    if (err) {
        rd_kafka_conf_destroy(conf);
        return err;
    }
    moeq_kafka_conf_common_cbs(conf, NULL);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, rd_err, sizeof rd_err);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "kafka mock: %s", rd_err);
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(rk);
    if (!mc) {
        rd_kafka_destroy(rk);
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "kafka mock: librdkafka built without the mock cluster");
    }
    *out = (moeq_kafka_mock *)mc;
    return MOEQ_OK;
}

void moeq_kafka_mock_destroy(moeq_kafka_mock *mock) {
    if (mock) rd_kafka_destroy(rd_kafka_mock_cluster_handle(mc_of(mock)));
}

moeq_kafka_mock *moeq_kafka_producer_mock(moeq_kafka_producer *producer) {
    return producer ? (moeq_kafka_mock *)rd_kafka_handle_mock_cluster(moeq_kafka_producer_rk(producer)) : NULL;
}

moeq_kafka_mock *moeq_kafka_consumer_mock(moeq_kafka_consumer *consumer) {
    return consumer ? (moeq_kafka_mock *)rd_kafka_handle_mock_cluster(moeq_kafka_consumer_rk(consumer)) : NULL;
}

const char *moeq_kafka_mock_bootstraps(const moeq_kafka_mock *mock) {
    return mock ? rd_kafka_mock_cluster_bootstraps(mc_of(mock)) : NULL;
}

static moeq_err mock_result(rd_kafka_resp_err_t rerr, char *errstr, size_t n, const char *what) {
    return rerr ? moeq_kafka_rd_errf(rerr, errstr, n, what) : MOEQ_OK;
}

moeq_err moeq_kafka_mock_topic_create(moeq_kafka_mock *mock, const char *topic, int partitions, int replication,
                                      char *errstr, size_t n) {
    if (!mock || !topic || partitions < 1 || replication < 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock topic: bad argument");
    return mock_result(rd_kafka_mock_topic_create(mc_of(mock), topic, partitions, replication), errstr, n,
                       "mock topic_create");
}

moeq_err moeq_kafka_mock_partition_set_leader(moeq_kafka_mock *mock, const char *topic, int32_t partition,
                                              int32_t broker_id, char *errstr, size_t n) {
    if (!mock || !topic) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock leader: NULL argument");
    return mock_result(rd_kafka_mock_partition_set_leader(mc_of(mock), topic, partition, broker_id), errstr, n,
                       "mock partition_set_leader");
}

moeq_err moeq_kafka_mock_group_coordinator_set(moeq_kafka_mock *mock, const char *group, int32_t broker_id,
                                               char *errstr, size_t n) {
    if (!mock || !group) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock coordinator: NULL argument");
    return mock_result(rd_kafka_mock_coordinator_set(mc_of(mock), "group", group, broker_id), errstr, n,
                       "mock coordinator_set");
}

/* A fault as librdkafka's error code; 0 with *ok 0 for a value outside the enum. */
static rd_kafka_resp_err_t fault_err(moeq_kafka_fault fault, int *ok) {
    *ok = 1;
    switch (fault) {
    case MOEQ_KAFKA_FAULT_DISCONNECT: return RD_KAFKA_RESP_ERR__TRANSPORT;
    case MOEQ_KAFKA_FAULT_NONE: return RD_KAFKA_RESP_ERR_NO_ERROR;
    case MOEQ_KAFKA_FAULT_UNKNOWN_TOPIC_OR_PART: return RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
    case MOEQ_KAFKA_FAULT_LEADER_NOT_AVAILABLE: return RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE;
    case MOEQ_KAFKA_FAULT_NOT_LEADER: return RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION;
    case MOEQ_KAFKA_FAULT_REQUEST_TIMED_OUT: return RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT;
    case MOEQ_KAFKA_FAULT_COORDINATOR_LOADING: return RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS;
    case MOEQ_KAFKA_FAULT_COORDINATOR_NOT_AVAILABLE: return RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE;
    case MOEQ_KAFKA_FAULT_NOT_COORDINATOR: return RD_KAFKA_RESP_ERR_NOT_COORDINATOR;
    case MOEQ_KAFKA_FAULT_NOT_ENOUGH_REPLICAS: return RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS;
    case MOEQ_KAFKA_FAULT_NOT_ENOUGH_REPLICAS_AFTER_APPEND: return RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND;
    case MOEQ_KAFKA_FAULT_REBALANCE_IN_PROGRESS: return RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS;
    }
    *ok = 0;
    return RD_KAFKA_RESP_ERR_NO_ERROR;
}

static moeq_err faults_check(const moeq_kafka_mock *mock, const moeq_kafka_fault *faults, size_t n_faults,
                             rd_kafka_resp_err_t *errs, char *errstr, size_t n) {
    if (!mock || (!faults && n_faults))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock faults: NULL argument");
    for (size_t i = 0; i < n_faults; i++) {
        int ok;
        errs[i] = fault_err(faults[i], &ok);
        if (!ok) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock faults: fault %zu (%d) unknown", i,
                                  (int)faults[i]);
    }
    return MOEQ_OK;
}

#define MOCK_FAULTS_MAX 256

moeq_err moeq_kafka_mock_push_faults(moeq_kafka_mock *mock, moeq_kafka_api api, const moeq_kafka_fault *faults,
                                     size_t n_faults, char *errstr, size_t n) {
    rd_kafka_resp_err_t errs[MOCK_FAULTS_MAX];
    if (n_faults > MOCK_FAULTS_MAX)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, n, "kafka mock faults: %zu at once (max %d)", n_faults, MOCK_FAULTS_MAX);
    moeq_err err = faults_check(mock, faults, n_faults, errs, errstr, n);
    if (!err && n_faults) rd_kafka_mock_push_request_errors_array(mc_of(mock), (int16_t)api, n_faults, errs);
    return err;
}

moeq_err moeq_kafka_mock_broker_push_faults(moeq_kafka_mock *mock, int32_t broker_id, moeq_kafka_api api,
                                            const moeq_kafka_fault *faults, size_t n_faults, int rtt_ms,
                                            char *errstr, size_t n) {
    rd_kafka_resp_err_t errs[MOCK_FAULTS_MAX];
    if (n_faults > MOCK_FAULTS_MAX || rtt_ms < 0)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, n, "kafka mock faults: %zu at once (max %d), rtt %d ms", n_faults,
                         MOCK_FAULTS_MAX, rtt_ms);
    moeq_err err = faults_check(mock, faults, n_faults, errs, errstr, n);
    /* only a va-arg form exists: one (error, rtt) tuple per call, appended in order */
    for (size_t i = 0; !err && i < n_faults; i++)
        err = mock_result(rd_kafka_mock_broker_push_request_error_rtts(mc_of(mock), broker_id, (int16_t)api, 1,
                                                                        errs[i], rtt_ms),
                          errstr, n, "mock broker_push_request_error_rtts");
    return err;
}

moeq_err moeq_kafka_mock_broker_faults_left(moeq_kafka_mock *mock, int32_t broker_id, moeq_kafka_api api,
                                            size_t *left, char *errstr, size_t n) {
    if (!mock || !left) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock faults_left: NULL argument");
    *left = 0;
    return mock_result(rd_kafka_mock_broker_error_stack_cnt(mc_of(mock), broker_id, (int16_t)api, left), errstr, n,
                       "mock broker_error_stack_cnt");
}

void moeq_kafka_mock_clear_faults(moeq_kafka_mock *mock, moeq_kafka_api api) {
    if (mock) rd_kafka_mock_clear_request_errors(mc_of(mock), (int16_t)api);
}

moeq_err moeq_kafka_mock_broker_down(moeq_kafka_mock *mock, int32_t broker_id, char *errstr, size_t n) {
    if (!mock) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock: NULL mock");
    return mock_result(rd_kafka_mock_broker_set_down(mc_of(mock), broker_id), errstr, n, "mock broker_set_down");
}

moeq_err moeq_kafka_mock_broker_up(moeq_kafka_mock *mock, int32_t broker_id, char *errstr, size_t n) {
    if (!mock) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock: NULL mock");
    return mock_result(rd_kafka_mock_broker_set_up(mc_of(mock), broker_id), errstr, n, "mock broker_set_up");
}

moeq_err moeq_kafka_mock_broker_set_rtt(moeq_kafka_mock *mock, int32_t broker_id, int rtt_ms, char *errstr,
                                        size_t n) {
    if (!mock || rtt_ms < 0) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka mock rtt: bad argument");
    return mock_result(rd_kafka_mock_broker_set_rtt(mc_of(mock), broker_id, rtt_ms), errstr, n, "mock broker_set_rtt");
}
