/*
 * kafka.c — the Kafka adapter (moeq/kafka.h); with kafka_mock.c (the tests'
 * mock cluster, moeq/kafka_mock.h) the only files that include librdkafka.
 *
 * A thin shell: configuration layering with two guarded keys, a delivery
 * callback that hands back the caller's per-message opaque, a cooperative
 * rebalance callback, offset storage per partition. No policy: when to store
 * or commit, and what to do with a failed delivery, is the caller's choice.
 *
 * Not here: payload decoding, topic administration, retries above librdkafka's,
 * the mock cluster (kafka_mock.c, its own library that only tests link).
 */
#include "moeq/kafka.h"

#include "kafka_internal.h"

#include <librdkafka/rdkafka.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/log.h"
#include "moeq/util.h"

/* ---- errors ------------------------------------------------------------- */

moeq_err moeq_kafka_err_map(int rd_kafka_err) {
    switch ((rd_kafka_resp_err_t)rd_kafka_err) {
    case RD_KAFKA_RESP_ERR_NO_ERROR: return MOEQ_OK;
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
    case RD_KAFKA_RESP_ERR__WAIT_COORD:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
    case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS: return MOEQ_ERR_TRANSIENT;
    case RD_KAFKA_RESP_ERR__TIMED_OUT: return MOEQ_ERR_TIMEOUT;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE: return MOEQ_ERR_LIMIT;
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__NOENT:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART: return MOEQ_ERR_NOT_FOUND;
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_INVALID_CONFIG: return MOEQ_ERR_INVALID_ARG;
    case RD_KAFKA_RESP_ERR__FATAL: return MOEQ_ERR_INTERNAL;
    default: return MOEQ_ERR_IO;
    }
}

static moeq_err rd_errf(rd_kafka_resp_err_t rerr, char *errstr, size_t n, const char *what) {
    return moeq_errf(moeq_kafka_err_map(rerr), errstr, n, "kafka %s: %s", what, rd_kafka_err2str(rerr));
}

/* ---- configuration ------------------------------------------------------ */

typedef struct kv_default {
    const char *key, *value;
} kv_default;

static const kv_default producer_defaults[] = {
    {"enable.idempotence", "true"}, /* guarded: acks=all, no duplicates or reordering on retry */
    {"linger.ms", "5"},
    {NULL, NULL},
};

static const kv_default consumer_defaults[] = {
    {"partition.assignment.strategy", "cooperative-sticky"},
    {"enable.auto.offset.store", "false"}, /* guarded: the caller stores after Redis acked */
    {"enable.auto.commit", "false"},
    {"auto.offset.reset", "earliest"},
    /* A subscribed topic created after start-up (a producer's auto-creation) joins the subscription at the next
     * metadata refresh: librdkafka's own 5 minutes left a coordinator's job topic unread that long once another
     * subscribed topic (the cancel topic) had partitions. */
    {"topic.metadata.refresh.interval.ms", "5000"},
    {NULL, NULL},
};

/* The keys that carry the delivery promise: moeq sets them, users may not change them. */
static const kv_default *guarded(moeq_kafka_role role) {
    static const kv_default producer_guard = {"enable.idempotence", "true"};
    static const kv_default consumer_guard = {"enable.auto.offset.store", "false"};
    return role == MOEQ_KAFKA_PRODUCER ? &producer_guard : &consumer_guard;
}

static moeq_err conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, const char *origin,
                         char *errstr, size_t n) {
    char rd_err[256];
    if (rd_kafka_conf_set(conf, key, value, rd_err, sizeof rd_err) != RD_KAFKA_CONF_OK)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s%s: %s", origin, key, rd_err);
    return MOEQ_OK;
}

/* Check the guarded key still has moeq's value once the user list is applied. */
static moeq_err conf_check_guard(rd_kafka_conf_t *conf, moeq_kafka_role role, char *errstr, size_t n) {
    const kv_default *g = guarded(role);
    char value[32];
    size_t size = sizeof value;
    if (rd_kafka_conf_get(conf, g->key, value, &size) != RD_KAFKA_CONF_OK)
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "kafka.%s: cannot read back", g->key);
    const char *why = role == MOEQ_KAFKA_PRODUCER ? "retries must never duplicate or reorder a message"
                                                  : "moeq stores an offset only after Redis acknowledged the batch";
    if (strcmp(value, g->value) != 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka.%s: must be %s (%s)", g->key, g->value, why);
    return MOEQ_OK;
}

/* moeq's defaults, then brokers/client.id, then every kafka.* key unchanged, then the guard. */
static moeq_err conf_build(moeq_kafka_role role, const char *brokers, const char *client_id,
                           const moeq_kvlist *kafka, rd_kafka_conf_t **out, char *errstr, size_t n) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    moeq_err err = MOEQ_OK;
    const kv_default *d = role == MOEQ_KAFKA_PRODUCER ? producer_defaults : consumer_defaults;
    for (; d->key && !err; d++) err = conf_set(conf, d->key, d->value, "default ", errstr, n);
    if (!err) err = conf_set(conf, "client.id", client_id ? client_id : "moeq", "", errstr, n);
    if (!err && brokers) err = conf_set(conf, "bootstrap.servers", brokers, "brokers: ", errstr, n);
    for (size_t i = 0; kafka && i < moeq_kvlist_count(kafka) && !err; i++) {
        const char *key, *value;
        moeq_kvlist_at(kafka, i, &key, &value);
        err = conf_set(conf, key, value, "kafka.", errstr, n);
    }
    if (!err) err = conf_check_guard(conf, role, errstr, n);
    if (err) {
        rd_kafka_conf_destroy(conf);
        return err;
    }
    *out = conf;
    return MOEQ_OK;
}

moeq_err moeq_kafka_conf_validate(const moeq_kvlist *kafka, moeq_kafka_role role, char *errstr, size_t n) {
    rd_kafka_conf_t *conf = NULL;
    moeq_err err = conf_build(role, NULL, NULL, kafka, &conf, errstr, n);
    if (!err) rd_kafka_conf_destroy(conf);
    return err;
}

/* librdkafka's log lines go to moeq's logfmt stream (syslog levels). */
static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    char q[1024];
    moeq_log_level l = level <= 3 ? MOEQ_LOG_ERROR : level == 4 ? MOEQ_LOG_WARN
                     : level <= 6 ? MOEQ_LOG_INFO : MOEQ_LOG_DEBUG;
    moeq_log(l, "kafka", "librdkafka", "client=%s fac=%s msg=%s", rd_kafka_name(rk), fac,
             moeq_log_quote(buf, q, sizeof q));
}

/* Global errors (all brokers down, fatal idempotence errors): logged; fatal ones stick. */
static void error_cb(rd_kafka_t *rk, int rerr, const char *reason, void *opaque) {
    (void)opaque;
    char q[1024], fatal[512];
    if (rerr == RD_KAFKA_RESP_ERR__FATAL) {
        rd_kafka_fatal_error(rk, fatal, sizeof fatal);
        reason = fatal;
    }
    moeq_log(rerr == RD_KAFKA_RESP_ERR__FATAL ? MOEQ_LOG_ERROR : MOEQ_LOG_WARN, "kafka", "error",
             "client=%s code=%s reason=%s", rd_kafka_name(rk), rd_kafka_err2name(rerr),
             moeq_log_quote(reason, q, sizeof q));
}

static void conf_common_cbs(rd_kafka_conf_t *conf, void *opaque) {
    rd_kafka_conf_set_opaque(conf, opaque);
    rd_kafka_conf_set_log_cb(conf, log_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
}

/* ---- producer ----------------------------------------------------------- */

struct moeq_kafka_producer {
    rd_kafka_t *rk;
    moeq_kafka_delivery_fn on_delivery;
    void *cb_opaque;
};

static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque) {
    (void)rk;
    moeq_kafka_producer *producer = opaque;
    if (!producer->on_delivery) return;
    moeq_kafka_delivery delivery = {
        .err = moeq_kafka_err_map(rkm->err),
        .errstr = rkm->err ? rd_kafka_err2str(rkm->err) : NULL,
        .topic = rd_kafka_topic_name(rkm->rkt),
        .partition = rkm->partition,
        .offset = rkm->err ? -1 : rkm->offset,
        .opaque = rkm->_private,
    };
    producer->on_delivery(&delivery, producer->cb_opaque);
}

moeq_err moeq_kafka_producer_new(const moeq_kafka_producer_params *params, const moeq_kvlist *kafka,
                                 moeq_kafka_producer **out, char *errstr, size_t n) {
    if (!params || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka producer: NULL argument");
    *out = NULL;
    moeq_kafka_producer *producer = calloc(1, sizeof *producer);
    if (!producer) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "kafka producer: out of memory");
    producer->on_delivery = params->on_delivery;
    producer->cb_opaque = params->cb_opaque;

    rd_kafka_conf_t *conf = NULL;
    moeq_err err = conf_build(MOEQ_KAFKA_PRODUCER, params->brokers, params->client_id, kafka, &conf, errstr, n);
    if (err) goto free_producer;
    conf_common_cbs(conf, producer);
    rd_kafka_conf_set_dr_msg_cb(conf, dr_msg_cb);

    char rd_err[512];
    producer->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, rd_err, sizeof rd_err);
    if (!producer->rk) {
        rd_kafka_conf_destroy(conf); /* not taken over on failure */
        err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka producer: %s", rd_err);
        goto free_producer;
    }
    *out = producer;
    return MOEQ_OK;

free_producer:
    free(producer);
    return err;
}

static rd_kafka_headers_t *headers_new(const moeq_kafka_header *headers, size_t n_headers) {
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(n_headers);
    for (size_t i = 0; i < n_headers; i++)
        rd_kafka_header_add(hdrs, headers[i].name, -1, headers[i].value, (ssize_t)headers[i].value_len);
    return hdrs;
}

moeq_err moeq_kafka_produce(moeq_kafka_producer *producer, const moeq_kafka_out *msg, char *errstr, size_t n) {
    if (!producer || !msg || !msg->topic)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka produce: NULL producer, message or topic");
    char fatal[512];
    if (rd_kafka_fatal_error(producer->rk, fatal, sizeof fatal))
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "kafka produce: producer failed fatally: %s", fatal);

    rd_kafka_headers_t *hdrs = msg->n_headers ? headers_new(msg->headers, msg->n_headers) : NULL;
    rd_kafka_resp_err_t rerr = rd_kafka_producev(
        producer->rk, RD_KAFKA_V_TOPIC(msg->topic), RD_KAFKA_V_PARTITION(msg->partition),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY((void *)msg->key, msg->key_len),
        RD_KAFKA_V_VALUE((void *)msg->value, msg->value_len), RD_KAFKA_V_HEADERS(hdrs),
        RD_KAFKA_V_OPAQUE(msg->opaque), RD_KAFKA_V_END);
    if (rerr) {
        if (hdrs) rd_kafka_headers_destroy(hdrs); /* taken over only on success */
        return moeq_errf(moeq_kafka_err_map(rerr), errstr, n, "kafka produce to %s: %s", msg->topic,
                         rd_kafka_err2str(rerr));
    }
    return MOEQ_OK;
}

int moeq_kafka_producer_poll(moeq_kafka_producer *producer, int timeout_ms) {
    return producer ? rd_kafka_poll(producer->rk, timeout_ms) : 0;
}

moeq_err moeq_kafka_producer_flush(moeq_kafka_producer *producer, int timeout_ms, char *errstr, size_t n) {
    if (!producer) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka flush: NULL producer");
    rd_kafka_resp_err_t rerr = rd_kafka_flush(producer->rk, timeout_ms);
    if (rerr == RD_KAFKA_RESP_ERR__TIMED_OUT)
        return moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n, "kafka flush: %d messages undelivered after %d ms",
                         rd_kafka_outq_len(producer->rk), timeout_ms);
    return rerr ? rd_errf(rerr, errstr, n, "flush") : MOEQ_OK;
}

size_t moeq_kafka_producer_outq_len(moeq_kafka_producer *producer) {
    return producer ? (size_t)rd_kafka_outq_len(producer->rk) : 0;
}

void moeq_kafka_producer_destroy(moeq_kafka_producer *producer) {
    if (!producer) return;
    if (rd_kafka_flush(producer->rk, 10 * 1000) == RD_KAFKA_RESP_ERR__TIMED_OUT) {
        /* Every accepted message gets its report, even an unsent one. */
        rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(producer->rk, 1000);
    }
    rd_kafka_destroy(producer->rk);
    free(producer);
}

/* ---- consumer ----------------------------------------------------------- */

struct moeq_kafka_consumer {
    rd_kafka_t *rk;
    moeq_kafka_rebalance_fn on_rebalance;
    void *cb_opaque;
    int64_t start_ms; /* > 0: assigned partitions start at this time (params.start_ms) */
    int closed;
    /* Failed commits reported by offset_commit_cb (served from consumer_poll): an
     * async commit returns before the broker answers, so this is how a caller
     * learns that the offsets it thought committed are still to be committed. */
    uint64_t commit_failures;
};

/* Hand a partition list to the caller's callback as plain structs. */
static void notify_rebalance(moeq_kafka_consumer *consumer, moeq_kafka_rebalance kind,
                             const rd_kafka_topic_partition_list_t *list) {
    if (!consumer->on_rebalance || list->cnt == 0) return;
    moeq_kafka_partition *parts = calloc((size_t)list->cnt, sizeof *parts);
    if (!parts) {
        moeq_log(MOEQ_LOG_ERROR, "kafka", "rebalance_dropped", "reason=out_of_memory partitions=%d", list->cnt);
        return;
    }
    for (int i = 0; i < list->cnt; i++)
        parts[i] = (moeq_kafka_partition){list->elems[i].topic, list->elems[i].partition};
    consumer->on_rebalance(kind, parts, (size_t)list->cnt, consumer->cb_opaque);
    free(parts);
}

static void log_rd_error(rd_kafka_error_t *error, const char *event) {
    if (!error) return;
    char q[512];
    moeq_log(MOEQ_LOG_ERROR, "kafka", event, "reason=%s", moeq_log_quote(rd_kafka_error_string(error), q, sizeof q));
    rd_kafka_error_destroy(error);
}

/*
 * Cooperative rebalancing adds and removes partitions incrementally; the
 * eager protocol (a user may configure range/roundrobin) replaces the whole
 * assignment. The caller hears of additions after they happen and of
 * revocations before, so it can store and commit while it still may.
 */
/* list with each partition's offset at start_ms (a copy to destroy), or NULL: the broker did not say. */
static rd_kafka_topic_partition_list_t *offsets_at(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *list,
                                                   int64_t start_ms) {
    rd_kafka_topic_partition_list_t *at = rd_kafka_topic_partition_list_copy(list);
    for (int i = 0; i < at->cnt; i++) at->elems[i].offset = start_ms;
    rd_kafka_resp_err_t rerr = rd_kafka_offsets_for_times(rk, at, 10000);
    for (int i = 0; !rerr && i < at->cnt; i++) rerr = at->elems[i].err;
    /* offset -1 (none that late) would mean the logical end, resolved only when fetching starts: a message
     * produced between the assignment and then would be skipped. The end as of now is what was asked for. */
    for (int i = 0; !rerr && i < at->cnt; i++) {
        int64_t lo = 0, hi = 0;
        if (at->elems[i].offset >= 0) continue;
        rerr = rd_kafka_query_watermark_offsets(rk, at->elems[i].topic, at->elems[i].partition, &lo, &hi, 10000);
        at->elems[i].offset = hi;
    }
    if (!rerr) return at;
    moeq_log(MOEQ_LOG_WARN, "kafka", "offsets_for_times_failed", "code=%s start_ms=%lld", rd_kafka_err2name(rerr),
             (long long)start_ms);
    rd_kafka_topic_partition_list_destroy(at);
    return NULL;
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t rerr, rd_kafka_topic_partition_list_t *list,
                         void *opaque) {
    moeq_kafka_consumer *consumer = opaque;
    int cooperative = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    if (rerr == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        rd_kafka_topic_partition_list_t *at = consumer->start_ms > 0 ? offsets_at(rk, list, consumer->start_ms) : NULL;
        if (cooperative) log_rd_error(rd_kafka_incremental_assign(rk, at ? at : list), "assign_failed");
        else rd_kafka_assign(rk, at ? at : list);
        if (at) rd_kafka_topic_partition_list_destroy(at);
        notify_rebalance(consumer, MOEQ_KAFKA_ASSIGNED, list);
    } else if (rerr == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        notify_rebalance(consumer, rd_kafka_assignment_lost(rk) ? MOEQ_KAFKA_LOST : MOEQ_KAFKA_REVOKED, list);
        if (cooperative) log_rd_error(rd_kafka_incremental_unassign(rk, list), "unassign_failed");
        else rd_kafka_assign(rk, NULL);
    } else {
        moeq_log(MOEQ_LOG_ERROR, "kafka", "rebalance_failed", "code=%s", rd_kafka_err2name(rerr));
        notify_rebalance(consumer, MOEQ_KAFKA_LOST, list);
        if (cooperative) log_rd_error(rd_kafka_incremental_unassign(rk, list), "unassign_failed");
        else rd_kafka_assign(rk, NULL);
    }
}

static void offset_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t rerr, rd_kafka_topic_partition_list_t *offsets,
                             void *opaque) {
    (void)offsets;
    if (rerr && rerr != RD_KAFKA_RESP_ERR__NO_OFFSET) {
        moeq_kafka_consumer *consumer = opaque;
        if (consumer) consumer->commit_failures++;
    }
    if (rerr && rerr != RD_KAFKA_RESP_ERR__NO_OFFSET)
        moeq_log(MOEQ_LOG_WARN, "kafka", "commit_failed", "client=%s code=%s", rd_kafka_name(rk),
                 rd_kafka_err2name(rerr));
}

static moeq_err consumer_subscribe(moeq_kafka_consumer *consumer, const moeq_kafka_consumer_params *params,
                                   char *errstr, size_t n) {
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new((int)params->n_topics);
    for (size_t i = 0; i < params->n_topics; i++)
        rd_kafka_topic_partition_list_add(topics, params->topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t rerr = rd_kafka_subscribe(consumer->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    return rerr ? rd_errf(rerr, errstr, n, "subscribe") : MOEQ_OK;
}

static moeq_err consumer_check_params(const moeq_kafka_consumer_params *params, char *errstr, size_t n) {
    if (!params) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka consumer: NULL params");
    if (!params->group_id || !*params->group_id)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka consumer: group_id is required");
    if (!params->topics || params->n_topics == 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka consumer: at least one topic is required");
    for (size_t i = 0; i < params->n_topics; i++)
        if (!params->topics[i] || !*params->topics[i])
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka consumer: topic %zu is empty", i);
    return MOEQ_OK;
}

moeq_err moeq_kafka_consumer_new(const moeq_kafka_consumer_params *params, const moeq_kvlist *kafka,
                                 moeq_kafka_consumer **out, char *errstr, size_t n) {
    if (!out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka consumer: NULL out");
    *out = NULL;
    moeq_err err = consumer_check_params(params, errstr, n);
    if (err) return err;
    moeq_kafka_consumer *consumer = calloc(1, sizeof *consumer);
    if (!consumer) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "kafka consumer: out of memory");
    consumer->on_rebalance = params->on_rebalance;
    consumer->cb_opaque = params->cb_opaque;
    consumer->start_ms = params->start_ms;

    rd_kafka_conf_t *conf = NULL;
    err = conf_build(MOEQ_KAFKA_CONSUMER, params->brokers, params->client_id, kafka, &conf, errstr, n);
    if (!err) err = conf_set(conf, "group.id", params->group_id, "group_id: ", errstr, n);
    if (err) goto free_conf;
    conf_common_cbs(conf, consumer);
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(conf, offset_commit_cb);

    char rd_err[512];
    consumer->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, rd_err, sizeof rd_err);
    if (!consumer->rk) {
        err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka consumer: %s", rd_err);
        goto free_conf;
    }
    rd_kafka_poll_set_consumer(consumer->rk); /* one queue: messages, rebalances, commits, errors */
    err = consumer_subscribe(consumer, params, errstr, n);
    if (err) {
        consumer->closed = 1;
        moeq_kafka_consumer_destroy(consumer);
        return err;
    }
    *out = consumer;
    return MOEQ_OK;

free_conf:
    if (conf) rd_kafka_conf_destroy(conf);
    free(consumer);
    return err;
}

moeq_err moeq_kafka_consumer_poll(moeq_kafka_consumer *consumer, int timeout_ms, moeq_kafka_msg **msg,
                                  char *errstr, size_t n) {
    if (!consumer || !msg) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka poll: NULL argument");
    *msg = NULL;
    rd_kafka_message_t *rkm = rd_kafka_consumer_poll(consumer->rk, timeout_ms);
    if (!rkm) return MOEQ_OK;
    if (!rkm->err) {
        *msg = (moeq_kafka_msg *)rkm;
        return MOEQ_OK;
    }
    rd_kafka_resp_err_t rerr = rkm->err;
    char q[512], fatal[512];
    if (rerr != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        moeq_log(MOEQ_LOG_WARN, "kafka", "consumer_error", "code=%s topic=%s reason=%s", rd_kafka_err2name(rerr),
                 rkm->rkt ? rd_kafka_topic_name(rkm->rkt) : "-",
                 moeq_log_quote(rd_kafka_message_errstr(rkm), q, sizeof q));
    rd_kafka_message_destroy(rkm);
    if (rd_kafka_fatal_error(consumer->rk, fatal, sizeof fatal))
        return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "kafka consumer failed fatally: %s", fatal);
    return MOEQ_OK;
}

/* A one-partition list; the caller destroys it. */
static rd_kafka_topic_partition_list_t *one_partition(const char *topic, int32_t partition, int64_t offset) {
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic, partition)->offset = offset;
    return list;
}

moeq_err moeq_kafka_consumer_store(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                   int64_t next_offset, char *errstr, size_t n) {
    if (!consumer || !topic || partition < 0 || next_offset < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka store: bad argument (topic %s, partition %d, "
                         "offset %lld)", topic ? topic : "NULL", (int)partition, (long long)next_offset);
    rd_kafka_topic_partition_list_t *list = one_partition(topic, partition, next_offset);
    rd_kafka_resp_err_t rerr = rd_kafka_offsets_store(consumer->rk, list);
    if (!rerr) rerr = list->elems[0].err;
    rd_kafka_topic_partition_list_destroy(list);
    if (rerr == RD_KAFKA_RESP_ERR__STATE)
        return moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, n, "kafka store: %s [%d] is not assigned to this consumer",
                         topic, (int)partition);
    return rerr ? rd_errf(rerr, errstr, n, "store") : MOEQ_OK;
}

moeq_err moeq_kafka_consumer_commit(moeq_kafka_consumer *consumer, int async, char *errstr, size_t n) {
    if (!consumer) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka commit: NULL consumer");
    rd_kafka_resp_err_t rerr = rd_kafka_commit(consumer->rk, NULL, async);
    if (rerr == RD_KAFKA_RESP_ERR__NO_OFFSET) return MOEQ_OK;
    return rerr ? rd_errf(rerr, errstr, n, "commit") : MOEQ_OK;
}

uint64_t moeq_kafka_consumer_commit_failures(const moeq_kafka_consumer *consumer) {
    return consumer ? consumer->commit_failures : 0;
}

moeq_err moeq_kafka_consumer_committed(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                       int timeout_ms, int64_t *offset, char *errstr, size_t n) {
    if (!consumer || !topic || !offset) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka committed: NULL argument");
    rd_kafka_topic_partition_list_t *list = one_partition(topic, partition, RD_KAFKA_OFFSET_INVALID);
    rd_kafka_resp_err_t rerr = rd_kafka_committed(consumer->rk, list, timeout_ms);
    if (!rerr) rerr = list->elems[0].err;
    *offset = list->elems[0].offset >= 0 ? list->elems[0].offset : -1;
    rd_kafka_topic_partition_list_destroy(list);
    return rerr ? rd_errf(rerr, errstr, n, "committed") : MOEQ_OK;
}

static moeq_err pause_resume(moeq_kafka_consumer *consumer, const char *topic, int32_t partition, int pause,
                             char *errstr, size_t n) {
    const char *what = pause ? "pause" : "resume";
    if (!consumer) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka %s: NULL consumer", what);
    rd_kafka_topic_partition_list_t *list = NULL;
    rd_kafka_resp_err_t rerr = RD_KAFKA_RESP_ERR_NO_ERROR;
    if (topic) list = one_partition(topic, partition, RD_KAFKA_OFFSET_INVALID);
    else rerr = rd_kafka_assignment(consumer->rk, &list);
    if (!rerr)
        rerr = pause ? rd_kafka_pause_partitions(consumer->rk, list) : rd_kafka_resume_partitions(consumer->rk, list);
    if (list) rd_kafka_topic_partition_list_destroy(list);
    return rerr ? rd_errf(rerr, errstr, n, what) : MOEQ_OK;
}

moeq_err moeq_kafka_consumer_pause(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                   char *errstr, size_t n) {
    return pause_resume(consumer, topic, partition, 1, errstr, n);
}

moeq_err moeq_kafka_consumer_resume(moeq_kafka_consumer *consumer, const char *topic, int32_t partition,
                                    char *errstr, size_t n) {
    return pause_resume(consumer, topic, partition, 0, errstr, n);
}

/* One allocation: the array, then the topic strings it points into. */
static moeq_kafka_partition *partitions_copy(const rd_kafka_topic_partition_list_t *list) {
    size_t bytes = (size_t)list->cnt * sizeof(moeq_kafka_partition) + 1;
    for (int i = 0; i < list->cnt; i++) bytes += strlen(list->elems[i].topic) + 1;
    moeq_kafka_partition *parts = malloc(bytes);
    if (!parts) return NULL;
    char *strings = (char *)(parts + list->cnt);
    for (int i = 0; i < list->cnt; i++) {
        size_t len = strlen(list->elems[i].topic) + 1;
        memcpy(strings, list->elems[i].topic, len);
        parts[i] = (moeq_kafka_partition){strings, list->elems[i].partition};
        strings += len;
    }
    return parts;
}

moeq_err moeq_kafka_consumer_assignment(moeq_kafka_consumer *consumer, moeq_kafka_partition **parts,
                                        size_t *n_parts, char *errstr, size_t n) {
    if (!consumer || !parts || !n_parts)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka assignment: NULL argument");
    rd_kafka_topic_partition_list_t *list = NULL;
    rd_kafka_resp_err_t rerr = rd_kafka_assignment(consumer->rk, &list);
    if (rerr) return rd_errf(rerr, errstr, n, "assignment");
    *parts = partitions_copy(list);
    *n_parts = *parts ? (size_t)list->cnt : 0;
    rd_kafka_topic_partition_list_destroy(list);
    return *parts ? MOEQ_OK : moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "kafka assignment: out of memory");
}

moeq_err moeq_kafka_consumer_close(moeq_kafka_consumer *consumer, char *errstr, size_t n) {
    if (!consumer) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka close: NULL consumer");
    if (consumer->closed) return MOEQ_OK;
    consumer->closed = 1;
    rd_kafka_resp_err_t rerr = rd_kafka_consumer_close(consumer->rk);
    return rerr ? rd_errf(rerr, errstr, n, "close") : MOEQ_OK;
}

void moeq_kafka_consumer_destroy(moeq_kafka_consumer *consumer) {
    if (!consumer) return;
    if (!consumer->closed) moeq_kafka_consumer_close(consumer, NULL, 0);
    rd_kafka_destroy(consumer->rk);
    free(consumer);
}

/* ---- consumer lag ---------------------------------------------------------- */

static int64_t offset_or_unknown(int64_t offset) { return offset >= 0 ? offset : -1; }

/* Position (local) and, time allowing, the group's committed offsets (one OffsetFetch) into lags. */
static void positions_and_commits(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *list, moeq_kafka_lag *lags,
                                  int64_t end_ms, int *none_committed) {
    if (rd_kafka_position(rk, list) == RD_KAFKA_RESP_ERR_NO_ERROR)
        for (int i = 0; i < list->cnt; i++) lags[i].position = offset_or_unknown(list->elems[i].offset);
    int64_t left = end_ms - moeq_now_ms();
    if (left <= 0) return;
    for (int i = 0; i < list->cnt; i++) list->elems[i].offset = RD_KAFKA_OFFSET_INVALID;
    if (rd_kafka_committed(rk, list, (int)left)) return;
    for (int i = 0; i < list->cnt; i++) {
        lags[i].committed = list->elems[i].err ? -1 : offset_or_unknown(list->elems[i].offset);
        none_committed[i] = !list->elems[i].err && lags[i].committed < 0;
    }
}

/*
 * Ask the leaders for one watermark (which: RD_KAFKA_OFFSET_END, the high
 * one, or _BEGINNING, the low one) of the partitions marked in want[]: one
 * ListOffsets per leader for all of them (rd_kafka_offsets_for_times with
 * the protocol's special timestamps), instead of a round trip per partition
 * that would each queue behind the consumer's own Fetch long-poll. Answers
 * overwrite the cached values.
 */
static void list_offsets(rd_kafka_t *rk, moeq_kafka_lag *lags, size_t n, const int *want, int64_t which,
                         int64_t end_ms) {
    int64_t left = end_ms - moeq_now_ms();
    if (left <= 0) return;
    rd_kafka_topic_partition_list_t *q = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        if (want[i]) rd_kafka_topic_partition_list_add(q, lags[i].topic, lags[i].partition)->offset = which;
    if (q->cnt && rd_kafka_offsets_for_times(rk, q, (int)left) == RD_KAFKA_RESP_ERR_NO_ERROR)
        for (size_t i = 0; i < n; i++) {
            const rd_kafka_topic_partition_t *e = rd_kafka_topic_partition_list_find(q, lags[i].topic, lags[i].partition);
            if (!want[i] || !e || e->err || e->offset < 0) continue;
            if (which == RD_KAFKA_OFFSET_END) lags[i].high = e->offset;
            else lags[i].low = e->offset;
        }
    rd_kafka_topic_partition_list_destroy(q);
}

/* One allocation as partitions_copy's: the rows, then the topic strings; offsets -1, the cached watermarks. */
static moeq_kafka_lag *lags_new(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *list) {
    size_t bytes = (size_t)list->cnt * sizeof(moeq_kafka_lag);
    for (int i = 0; i < list->cnt; i++) bytes += strlen(list->elems[i].topic) + 1;
    moeq_kafka_lag *lags = malloc(bytes);
    if (!lags) return NULL;
    char *strings = (char *)(lags + list->cnt);
    for (int i = 0; i < list->cnt; i++) {
        size_t len = strlen(list->elems[i].topic) + 1;
        memcpy(strings, list->elems[i].topic, len);
        lags[i] = (moeq_kafka_lag){.topic = strings, .partition = list->elems[i].partition, .low = -1, .high = -1,
                                   .position = -1, .committed = -1, .lag = -1};
        int64_t lo = RD_KAFKA_OFFSET_INVALID, hi = RD_KAFKA_OFFSET_INVALID;
        rd_kafka_get_watermark_offsets(rk, strings, lags[i].partition, &lo, &hi); /* from the last fetch response */
        lags[i].low = offset_or_unknown(lo);
        lags[i].high = offset_or_unknown(hi);
        strings += len;
    }
    return lags;
}

moeq_err moeq_kafka_consumer_lag(moeq_kafka_consumer *consumer, int timeout_ms, moeq_kafka_lag **lags,
                                 size_t *n_lags, char *errstr, size_t n) {
    if (!consumer || !lags || !n_lags || timeout_ms < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka lag: NULL argument or negative timeout");
    *lags = NULL;
    *n_lags = 0;
    int64_t end = moeq_now_ms() + timeout_ms;
    rd_kafka_topic_partition_list_t *list = NULL;
    rd_kafka_resp_err_t rerr = rd_kafka_assignment(consumer->rk, &list);
    if (rerr) return rd_errf(rerr, errstr, n, "lag");
    size_t cnt = (size_t)list->cnt;
    moeq_kafka_lag *out = cnt ? lags_new(consumer->rk, list) : NULL;
    int *none_committed = calloc(cnt + 1, sizeof(int)), *all = calloc(cnt + 1, sizeof(int));
    if ((cnt && !out) || !none_committed || !all) {
        free(out), free(none_committed), free(all);
        rd_kafka_topic_partition_list_destroy(list);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "kafka lag: out of memory");
    }
    if (cnt) {
        positions_and_commits(consumer->rk, list, out, end, none_committed);
        for (size_t i = 0; i < cnt; i++) all[i] = 1;
        list_offsets(consumer->rk, out, cnt, all, RD_KAFKA_OFFSET_END, end);
        list_offsets(consumer->rk, out, cnt, none_committed, RD_KAFKA_OFFSET_BEGINNING, end);
    }
    for (size_t i = 0; i < cnt; i++) {
        moeq_kafka_lag *l = &out[i];
        int64_t base = l->committed >= 0 ? l->committed : none_committed[i] ? l->low : -1;
        if (l->high >= 0 && base >= 0) l->lag = l->high > base ? l->high - base : 0;
    }
    free(none_committed);
    free(all);
    rd_kafka_topic_partition_list_destroy(list);
    *lags = out;
    *n_lags = cnt;
    return MOEQ_OK;
}

/* ---- consumed messages: a moeq_kafka_msg is an rd_kafka_message_t ------- */

static const rd_kafka_message_t *rkm_of(const moeq_kafka_msg *msg) { return (const rd_kafka_message_t *)msg; }

const char *moeq_kafka_msg_topic(const moeq_kafka_msg *msg) { return rd_kafka_topic_name(rkm_of(msg)->rkt); }
int32_t moeq_kafka_msg_partition(const moeq_kafka_msg *msg) { return rkm_of(msg)->partition; }
int64_t moeq_kafka_msg_offset(const moeq_kafka_msg *msg) { return rkm_of(msg)->offset; }

int64_t moeq_kafka_msg_timestamp_ms(const moeq_kafka_msg *msg) {
    rd_kafka_timestamp_type_t type;
    int64_t ts = rd_kafka_message_timestamp(rkm_of(msg), &type);
    return type == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? -1 : ts;
}

const void *moeq_kafka_msg_key(const moeq_kafka_msg *msg, size_t *len) {
    if (len) *len = rkm_of(msg)->key_len;
    return rkm_of(msg)->key;
}

const void *moeq_kafka_msg_value(const moeq_kafka_msg *msg, size_t *len) {
    if (len) *len = rkm_of(msg)->len;
    return rkm_of(msg)->payload;
}

/* Headers are parsed lazily by librdkafka; a message without any has none. */
static rd_kafka_headers_t *msg_headers(const moeq_kafka_msg *msg) {
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(rkm_of(msg), &hdrs)) return NULL;
    return hdrs;
}

moeq_err moeq_kafka_msg_header(const moeq_kafka_msg *msg, const char *name, const void **value,
                               size_t *value_len) {
    rd_kafka_headers_t *hdrs = msg_headers(msg);
    const void *v = NULL;
    size_t len = 0;
    if (!hdrs || rd_kafka_header_get_last(hdrs, name, &v, &len)) return MOEQ_ERR_NOT_FOUND;
    if (value) *value = v;
    if (value_len) *value_len = len;
    return MOEQ_OK;
}

size_t moeq_kafka_msg_header_count(const moeq_kafka_msg *msg) {
    rd_kafka_headers_t *hdrs = msg_headers(msg);
    return hdrs ? rd_kafka_header_cnt(hdrs) : 0;
}

moeq_err moeq_kafka_msg_header_at(const moeq_kafka_msg *msg, size_t i, moeq_kafka_header *header) {
    rd_kafka_headers_t *hdrs = msg_headers(msg);
    if (!hdrs || !header) return MOEQ_ERR_NOT_FOUND;
    if (rd_kafka_header_get_all(hdrs, i, &header->name, &header->value, &header->value_len))
        return MOEQ_ERR_NOT_FOUND;
    return MOEQ_OK;
}

void moeq_kafka_msg_destroy(moeq_kafka_msg *msg) {
    if (msg) rd_kafka_message_destroy((rd_kafka_message_t *)msg);
}

/* ---- readiness ------------------------------------------------------------ */

static moeq_err ping(rd_kafka_t *rk, int timeout_ms, char *errstr, size_t n) {
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t rerr = rd_kafka_metadata(rk, 0, NULL, &md, timeout_ms);
    if (rerr) return moeq_errf(MOEQ_ERR_TRANSIENT, errstr, n, "kafka metadata: %s", rd_kafka_err2str(rerr));
    int brokers = md->broker_cnt;
    rd_kafka_metadata_destroy(md);
    if (brokers < 1) return moeq_errf(MOEQ_ERR_TRANSIENT, errstr, n, "kafka metadata: no broker listed");
    return MOEQ_OK;
}

moeq_err moeq_kafka_producer_ping(moeq_kafka_producer *producer, int timeout_ms, char *errstr, size_t n) {
    return ping(producer->rk, timeout_ms, errstr, n);
}

moeq_err moeq_kafka_consumer_ping(moeq_kafka_consumer *consumer, int timeout_ms, char *errstr, size_t n) {
    return ping(consumer->rk, timeout_ms, errstr, n);
}

/* ---- for the mock module (kafka_internal.h) ------------------------------- */

rd_kafka_t *moeq_kafka_producer_rk(moeq_kafka_producer *producer) { return producer ? producer->rk : NULL; }
rd_kafka_t *moeq_kafka_consumer_rk(moeq_kafka_consumer *consumer) { return consumer ? consumer->rk : NULL; }

moeq_err moeq_kafka_conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, const char *origin,
                             char *errstr, size_t n) {
    return conf_set(conf, key, value, origin, errstr, n);
}

void moeq_kafka_conf_common_cbs(rd_kafka_conf_t *conf, void *opaque) { conf_common_cbs(conf, opaque); }

moeq_err moeq_kafka_rd_errf(int rd_kafka_err, char *errstr, size_t n, const char *what) {
    return rd_errf((rd_kafka_resp_err_t)rd_kafka_err, errstr, n, what);
}

/* ---- topics (admin) ------------------------------------------------------ */

static moeq_err topics_request(rd_kafka_t *rk, const moeq_kafka_topic_spec *specs, int n_specs, int validate_only,
                               int timeout_ms, rd_kafka_queue_t *q, char *errstr, size_t n) {
    rd_kafka_NewTopic_t **topics = calloc((size_t)n_specs, sizeof *topics);
    if (!topics) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "kafka create topics: out of memory");
    moeq_err err = MOEQ_OK;
    char rd_err[512];
    for (int i = 0; i < n_specs && !err; i++) {
        topics[i] = rd_kafka_NewTopic_new(specs[i].name, specs[i].partitions, specs[i].replication_factor, rd_err,
                                          sizeof rd_err);
        if (!topics[i]) {
            err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "topic %s: %s", specs[i].name, rd_err);
            break;
        }
        for (const char *const *c = specs[i].configs; c && c[0] && !err; c += 2)
            if (rd_kafka_NewTopic_set_config(topics[i], c[0], c[1]))
                err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "topic %s: config %s=%s refused", specs[i].name,
                                c[0], c[1]);
    }
    rd_kafka_AdminOptions_t *opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    if (!err && rd_kafka_AdminOptions_set_request_timeout(opts, timeout_ms, rd_err, sizeof rd_err))
        err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka create topics: %s", rd_err);
    if (!err && rd_kafka_AdminOptions_set_operation_timeout(opts, timeout_ms, rd_err, sizeof rd_err))
        err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka create topics: %s", rd_err);
    if (!err && rd_kafka_AdminOptions_set_validate_only(opts, validate_only, rd_err, sizeof rd_err))
        err = moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka create topics: %s", rd_err);
    if (!err) rd_kafka_CreateTopics(rk, topics, (size_t)n_specs, opts, q);
    rd_kafka_AdminOptions_destroy(opts);
    for (int i = 0; i < n_specs; i++)
        if (topics[i]) rd_kafka_NewTopic_destroy(topics[i]);
    free(topics);
    return err;
}

moeq_err moeq_kafka_create_topics(const char *brokers, const moeq_kvlist *kafka, const moeq_kafka_topic_spec *specs,
                                  int n_specs, int validate_only, int timeout_ms, moeq_kafka_topic_outcome *outcome,
                                  char (*message)[256], char *errstr, size_t n) {
    rd_kafka_conf_t *conf = NULL;
    moeq_err err = conf_build(MOEQ_KAFKA_PRODUCER, brokers, "moeq-topics", kafka, &conf, errstr, n);
    if (err) return err;
    conf_common_cbs(conf, NULL);
    char rd_err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, rd_err, sizeof rd_err);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka admin client: %s", rd_err);
    }
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    err = topics_request(rk, specs, n_specs, validate_only, timeout_ms, q, errstr, n);
    /* The admin result arrives on q; a little past the request's own timeout so that its error wins. */
    rd_kafka_event_t *ev = err ? NULL : rd_kafka_queue_poll(q, timeout_ms + 2000);
    if (!err && !ev)
        err = moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n, "kafka create topics: no answer from %s within %d ms", brokers,
                        timeout_ms);
    if (!err && rd_kafka_event_error(ev))
        err = moeq_errf(moeq_kafka_err_map(rd_kafka_event_error(ev)), errstr, n, "kafka create topics (%s): %s",
                        brokers, rd_kafka_event_error_string(ev));
    const rd_kafka_CreateTopics_result_t *res = err ? NULL : rd_kafka_event_CreateTopics_result(ev);
    size_t n_res = 0;
    const rd_kafka_topic_result_t **results = res ? rd_kafka_CreateTopics_result_topics(res, &n_res) : NULL;
    for (int i = 0; !err && i < n_specs; i++) {
        outcome[i] = MOEQ_KAFKA_TOPIC_FAILED;
        snprintf(message[i], 256, "no answer for this topic");
        for (size_t r = 0; r < n_res; r++) {
            if (strcmp(rd_kafka_topic_result_name(results[r]), specs[i].name)) continue;
            rd_kafka_resp_err_t e = rd_kafka_topic_result_error(results[r]);
            outcome[i] = e == RD_KAFKA_RESP_ERR_NO_ERROR             ? MOEQ_KAFKA_TOPIC_CREATED
                         : e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS ? MOEQ_KAFKA_TOPIC_EXISTS
                                                                      : MOEQ_KAFKA_TOPIC_FAILED;
            const char *why = rd_kafka_topic_result_error_string(results[r]);
            snprintf(message[i], 256, "%s", e ? (why ? why : rd_kafka_err2str(e)) : "");
        }
    }
    if (ev) rd_kafka_event_destroy(ev);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    return err;
}
