/*
 * params.h — every knob of `moeq coordinator`, as one params struct and one
 * property table (name, type, range, default, doc). The table drives the
 * defaults, `--config FILE`, MOEQ_* environment overrides, --flags, --help
 * and the configuration section of docs/COORDINATOR.md.
 *
 * The job codec's limits (moeq_job_limits_props: max_job_bytes, ...) are
 * part of the table under their own names, so one file configures both.
 * `kafka.*` and `redis.*` keys are not in the table: moeq_config passes them
 * through to librdkafka and the Redis connection unchanged.
 *
 * No I/O except what moeq_config itself does when asked to load a file.
 */
#ifndef MOEQ_COORDINATOR_PARAMS_H
#define MOEQ_COORDINATOR_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "batcher.h"
#include "moeq/config.h"
#include "moeq/err.h"
#include "moeq/job.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moeq_durability {
    MOEQ_DURABILITY_FSYNC_ALWAYS = 0, /* trust the server's `appendfsync always` (default)      */
    MOEQ_DURABILITY_WAITAOF,          /* WAITAOF 1 0 after each batch (Redis >= 7.2)            */
    MOEQ_DURABILITY_NONE,             /* trust whatever the server does (tests, benchmarks)      */
} moeq_durability;

typedef struct moeq_coordinator_params {
    /* Kafka */
    char kafka_brokers[512];          /* bootstrap servers "host:port[,...]"                    */
    char group_id[128];               /* consumer group shared by all coordinators               */
    char group_instance_id[128];      /* static membership id; "auto" = <host>.<slot>; "" = dynamic */
    char run_dir[512];                /* lock files of the auto instance slots; "/tmp"           */
    char job_topics[1024];            /* comma-separated job topics                             */
    char results_topic[256];          /* default result topic                                   */
    char results_allowed_topics[1024];/* comma list a job's reply_to may name (results_topic always) */
    char dlq_topic[256];              /* dead-letter topic: original bytes + reason headers     */
    char cancel_topic[256];           /* job ids to cancel; "" = off                            */
    /* Redis */
    char redis_url[512];              /* host:port, redis://[user:pass@]host:port or unix:/path  */
    char redis_prefix[64];            /* key prefix ("moeq" -> moeq:batches:p0, moeq:job:{id})    */
    char durability[16];              /* fsync_always | waitaof | none                          */
    int64_t waitaof_timeout_ms;       /* WAITAOF timeout, ms; [1, 60000]; 1000                   */
    int64_t dedupe_window_s;          /* TTL of moeq:job:<id> (the dedupe guard), s; 0 = forever; 604800 */
    /* Tokenizer */
    char model[1024];                 /* model dir (tokenizer.json); "" = only `tokens` jobs      */
    int64_t max_model_len;            /* context: prompt + max_new_tokens at most; 0 = the model's
                                         max_position_embeddings (never more; moeq_coordinator_new
                                         resolves it); 0 without a model = unchecked; [0, 2^30]; 0 */
    /* Batching (see batcher.h) */
    int64_t max_batch_jobs;           /* [1, 4096]; 64                                           */
    int64_t max_batch_tokens;         /* Σ prompt + max_new_tokens; [1, 16777216]; 65536          */
    int64_t max_wait_ms;              /* [0, 600000]; 50                                         */
    double length_tolerance;          /* [0, 1]; 0.10                                            */
    int64_t length_slack_tokens;      /* [0, 65536]; 8                                           */
    int64_t min_shared_prefix;        /* [1, 1048576]; 64                                        */
    int64_t aging_ms;                 /* [0, 86400000]; 30000; 0 = off                           */
    int64_t poll_interval_ms;         /* loop tick: Kafka poll timeout, bucket checks; [1, 1000]; 10 */
    /* Back-pressure and offsets */
    int64_t max_pending_batches;      /* pause partitions above this many pending batches; 1000  */
    int64_t resume_pending_batches;   /* resume at or below this; < max_pending_batches; 500     */
    int64_t max_open_jobs;            /* pause when this many consumed jobs are not yet durable; 100000 */
    int64_t pending_check_ms;         /* how often stream backlogs are measured, ms; 500          */
    int64_t commit_interval_ms;       /* how often stored offsets are committed, ms; 1000        */
    /* Observability */
    int64_t http_port;                /* /metrics, /livez, /readyz, /healthz; 0 = ephemeral, -1 = off; 9464 */
    char http_addr[64];               /* IPv4 bind address; "0.0.0.0"                            */
    int64_t livez_stall_ms;           /* /livez fails after the loop stalls this long, ms; 60000  */
    char log_level[16];               /* debug | info | warn | error                             */
    /* Job codec limits (schemas/include/moeq/job.h) */
    moeq_job_limits limits;
} moeq_coordinator_params;

/*
 * The property table (built on first use from this module's keys plus
 * moeq_job_limits_props; not thread-safe on that first call). Terminated by
 * MOEQ_PROP_END.
 */
const moeq_prop *moeq_coordinator_props(void);

/* All table defaults. */
moeq_coordinator_params moeq_coordinator_default_params(void);

/*
 * Cross-field checks the table cannot express (resume < pause, a known
 * durability, non-empty topics, ...); message names the key.
 */
moeq_err moeq_coordinator_params_check(const moeq_coordinator_params *params, char *errstr, size_t errstr_size);

/* The durability setting as an enum (params must have passed the check). */
moeq_durability moeq_coordinator_durability(const moeq_coordinator_params *params);

/* The batcher's part of the params. */
moeq_batcher_params moeq_coordinator_batcher_params(const moeq_coordinator_params *params);

/*
 * Split a comma-separated list (job_topics, results_allowed_topics) into
 * out[0..cap) pointers into buf (a copy the caller provides, modified in
 * place: whitespace trimmed, empty items skipped). Returns the count, or
 * more than cap when it did not fit (only cap written).
 */
size_t moeq_coordinator_split_list(char *buf, char **out, size_t cap);

/*
 * The context jobs must fit (prompt + max_new_tokens), from max_model_len and
 * the model's max_position_embeddings (model_context; 0 = no model or no
 * config.json: max_model_len alone, 0 = unchecked). INVALID_ARG, naming
 * max_model_len, when it exceeds the model's.
 */
moeq_err moeq_coordinator_context(const moeq_coordinator_params *params, int model_context, int64_t *out,
                                  char *errstr, size_t errstr_size);

/* 1 when topic may receive results: results_topic or one of results_allowed_topics. */
int moeq_coordinator_reply_allowed(const moeq_coordinator_params *params, const char *topic);

#ifdef __cplusplus
}
#endif
#endif
