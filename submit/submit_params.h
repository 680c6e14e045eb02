/*
 * submit_params.h — what `moeq submit` reads from configuration: the same
 * vocabulary as the other roles (kafka_brokers, results_topic, dlq_topic, the
 * job limits; kafka.* / redis.* pass through), file < MOEQ_<KEY> < flags.
 * The input and output paths and the two switches (--skip-invalid,
 * --resume) are command-line arguments, not keys: they describe one run.
 */
#ifndef MOEQ_SUBMIT_PARAMS_H
#define MOEQ_SUBMIT_PARAMS_H

#include <stdint.h>

#include "moeq/config.h"
#include "moeq/job.h"

typedef struct moeq_submit_params {
    char kafka_brokers[1024];   /* bootstrap servers; default localhost:9092                      */
    char job_topic[256];        /* topic jobs are produced to; default moeq.jobs                   */
    char results_topic[256];    /* results are read from here; default moeq.results                */
    char dlq_topic[256];        /* `duplicate` dead letters are read from here; default moeq.dlq   */
    int64_t timeout_s;          /* wait at most this long for every result, s; default 600        */
    int64_t clock_skew_s;       /* read results produced from this long before the start, s; 60    */
    int64_t connect_timeout_s;  /* the broker must answer a metadata request within this, s; 10    */
    char log_level[16];         /* debug, info, warn, error                                        */
    moeq_job_limits limits;     /* the jobs are checked with these before sending (schemas/job.md) */
} moeq_submit_params;

/* The property table (static storage; built on the first call, not thread-safe then). */
const moeq_prop *moeq_submit_props(void);

/* Every field at its table default. */
moeq_submit_params moeq_submit_default_params(void);

/* Cross-field checks (topic names, limits); the message names the key. */
moeq_err moeq_submit_params_check(const moeq_submit_params *p, char *errstr, size_t errstr_size);

#endif
