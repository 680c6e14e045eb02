/* submit_params.c — `moeq submit`'s property table (defaults live only here, as text). */
#include "submit_params.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define P_STR(f, def, doc) \
    {#f, MOEQ_PROP_STR, offsetof(moeq_submit_params, f), sizeof(((moeq_submit_params *)0)->f), 0, 0, def, doc}
#define P_INT(f, lo, hi, def, doc) {#f, MOEQ_PROP_INT, offsetof(moeq_submit_params, f), sizeof(int64_t), lo, hi, def, doc}

static const moeq_prop own_props[] = {
    P_STR(kafka_brokers, "localhost:9092", "Kafka bootstrap servers, host:port[,host:port...] (alias --brokers)"),
    P_STR(job_topic, "moeq.jobs", "topic the jobs are produced to: one of the coordinator's job_topics (alias --topic)"),
    P_STR(results_topic, "moeq.results", "topic the results are read from (the workers' results_topic)"),
    P_STR(dlq_topic, "moeq.dlq", "dead-letter topic: a `duplicate` there settles a job (its id was already accepted)"),
    P_INT(timeout_s, 1, 31536000, "600", "wait at most this long for every result, s; jobs without one are counted no_result"),
    P_INT(clock_skew_s, 0, 86400, "60", "read results produced from this long before the start (workers whose clocks lag), s"),
    P_INT(connect_timeout_s, 1, 3600, "10", "the broker must answer a metadata request within this, or submit stops (exit 3), s"),
    P_STR(log_level, "warn", "debug, info, warn or error (librdkafka's own messages and the config warnings)"),
};

#define N_OWN (sizeof(own_props) / sizeof(own_props[0]))
#define N_LIMITS_MAX 32

static moeq_prop table[N_OWN + N_LIMITS_MAX + 1];

const moeq_prop *moeq_submit_props(void) {
    if (table[0].name) return table;
    size_t n = 0;
    for (size_t i = 0; i < N_OWN; i++) table[n++] = own_props[i];
    for (const moeq_prop *p = moeq_job_limits_props; p->name && n < N_OWN + N_LIMITS_MAX; p++) {
        table[n] = *p;
        table[n++].offset += offsetof(moeq_submit_params, limits);
    }
    memset(&table[n], 0, sizeof table[n]);
    return table;
}

moeq_submit_params moeq_submit_default_params(void) {
    moeq_submit_params p;
    memset(&p, 0, sizeof p);
    moeq_props_defaults(moeq_submit_props(), &p, NULL, 0); /* table defaults are in range */
    return p;
}

static int valid_topic(const char *t) { /* Kafka: [a-zA-Z0-9._-], 1..249 */
    size_t n = strlen(t);
    if (n == 0 || n > 249) return 0;
    for (const char *c = t; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' && *c != '-') return 0;
    return 1;
}

moeq_err moeq_submit_params_check(const moeq_submit_params *p, char *errstr, size_t n) {
    if (!p->kafka_brokers[0]) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka_brokers: empty");
    const char *names[] = {"job_topic", "results_topic", "dlq_topic"};
    const char *topics[] = {p->job_topic, p->results_topic, p->dlq_topic};
    for (int i = 0; i < 3; i++)
        if (!valid_topic(topics[i]))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: '%s' is not a valid topic name", names[i], topics[i]);
    return moeq_job_limits_check(&p->limits, errstr, n);
}
