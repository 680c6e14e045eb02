/*
 * kafka_internal.h — what the Kafka adapter (kafka.c) lends the mock module
 * (kafka_mock.c): a client's librdkafka handle and three helpers. Not
 * installed; nothing outside common/kafka*.c includes it.
 */
#ifndef MOEQ_KAFKA_INTERNAL_H
#define MOEQ_KAFKA_INTERNAL_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>

#include "moeq/err.h"
#include "moeq/kafka.h"

/* The handle under a client (borrowed; NULL for NULL). */
rd_kafka_t *moeq_kafka_producer_rk(moeq_kafka_producer *producer);
rd_kafka_t *moeq_kafka_consumer_rk(moeq_kafka_consumer *consumer);

/* rd_kafka_conf_set with moeq's message ("<origin><key>: <why>", MOEQ_ERR_INVALID_ARG). */
moeq_err moeq_kafka_conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, const char *origin,
                             char *errstr, size_t n);

/* moeq's log and error callbacks (logfmt through moeq/log.h) and opaque on conf. */
void moeq_kafka_conf_common_cbs(rd_kafka_conf_t *conf, void *opaque);

/* A librdkafka error as a moeq_err with "kafka <what>: <librdkafka's text>". */
moeq_err moeq_kafka_rd_errf(int rd_kafka_err, char *errstr, size_t n, const char *what);

#endif
