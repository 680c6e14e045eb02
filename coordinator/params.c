/*
 * params.c — the coordinator's property table and cross-field checks.
 * Defaults live only in the table (text), so the docs cannot disagree.
 */
#include "params.h"

#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/redis.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define P_STR(f, def, doc) \
    {#f, MOEQ_PROP_STR, offsetof(moeq_coordinator_params, f), sizeof(((moeq_coordinator_params *)0)->f), 0, 0, def, doc}
#define P_INT(f, lo, hi, def, doc) \
    {#f, MOEQ_PROP_INT, offsetof(moeq_coordinator_params, f), sizeof(int64_t), lo, hi, def, doc}
#define P_DBL(f, lo, hi, def, doc) \
    {#f, MOEQ_PROP_DOUBLE, offsetof(moeq_coordinator_params, f), sizeof(double), lo, hi, def, doc}

static const moeq_prop own_props[] = {
    P_STR(kafka_brokers, MOEQ_KAFKA_BROKERS_DEFAULT, "Kafka bootstrap servers, host:port[,host:port...]"),
    P_STR(group_id, "moeq-coordinator", "consumer group shared by every coordinator"),
    P_STR(group_instance_id, "auto",
          "static group membership id (group.instance.id): a restarted coordinator gets its partitions back at once; "
          "auto = <hostname>.<slot>, the lowest slot free on this host (lock files in run_dir); empty = dynamic"),
    P_STR(run_dir, "/tmp", "directory of this host's lock files (the static member slots of group_instance_id = auto)"),
    P_STR(job_topics, "moeq.jobs", "comma-separated topics jobs are read from"),
    P_STR(results_topic, "moeq.results", "topic for error/expired/cancelled results of jobs without reply_to"),
    P_STR(results_allowed_topics, "", "comma-separated topics a job's reply_to may name (results_topic always may)"),
    P_STR(dlq_topic, "moeq.dlq", "dead-letter topic: original bytes, reason in headers"),
    P_STR(cancel_topic, "moeq.cancel", "topic of job ids to cancel; empty = off"),
    P_STR(redis_url, MOEQ_REDIS_URL_DEFAULT, "Redis: host:port, redis://[user:password@]host:port or unix:/path (the stack of scripts/services.sh)"),
    P_STR(redis_prefix, "moeq", "prefix of every Redis key (moeq:batches:p0, moeq:job:<id>)"),
    P_STR(durability, "fsync_always",
          "fsync_always (server runs appendfsync always), waitaof (WAITAOF after each write round, Redis >= 7.2) or none"),
    P_INT(waitaof_timeout_ms, 1, 60000, "1000", "WAITAOF timeout when durability = waitaof, ms"),
    P_INT(dedupe_window_s, 0, 31536000, "604800",
          "the dedupe window, one key for every process: a job record (moeq:job:<id>) lives this long after it is "
          "written and again after its job finishes; while it lives, a job with its id is not run again (a "
          "`duplicate` dead letter), s; 0 = forever"),
    P_STR(model, "", "model directory (its tokenizer.json gives exact prompt token ids); empty = lengths estimated as bytes/4, no ids"),
    P_INT(max_model_len, 0, 1073741824, "0", "context: a job whose prompt + max_new_tokens exceeds it gets error prompt_too_long; 0 = the model's max_position_embeddings (config.json), which it may not exceed; without a model, 0 = unchecked"),
    P_INT(max_batch_jobs, 1, 4096, "64", "jobs per batch"),
    P_INT(max_batch_tokens, 1, 16777216, "65536", "sum of prompt_len + max_new_tokens per batch, tokens"),
    P_INT(max_wait_ms, 0, 600000, "50", "a batch closes when its oldest job has waited this long, ms"),
    P_DBL(length_tolerance, 0, 1, "0.1", "a job joins a bucket whose mean prompt length is within this fraction of its own"),
    P_INT(length_slack_tokens, 0, 65536, "8", "absolute length allowance for short prompts, tokens"),
    P_INT(min_shared_prefix, 1, 1048576, "64", "tokens two prompts must share to be kept together as a prefix group"),
    P_INT(aging_ms, 0, 86400000, "30000", "a job this old (producer time) moves up one priority class per step, ms; 0 = off"),
    P_INT(poll_interval_ms, 1, 1000, "10", "loop tick: Kafka poll timeout and bucket deadline checks, ms"),
    P_INT(max_pending_batches, 1, 100000000, "1000", "pause consumption when the batch streams hold more pending batches"),
    P_INT(resume_pending_batches, 0, 100000000, "500", "resume consumption at or below this many pending batches"),
    P_INT(max_open_jobs, 1, 100000000, "100000", "pause consumption when this many consumed jobs are not yet durable"),
    P_INT(pending_check_ms, 10, 60000, "500", "how often the streams' pending batches are measured, ms"),
    P_INT(commit_interval_ms, 10, 60000, "1000", "how often stored offsets are committed, ms"),
    P_INT(http_port, -1, 65535, "9464", "port of /metrics, /livez, /readyz and /healthz; 0 = ephemeral (the port is logged), -1 = off"),
    P_STR(http_addr, "0.0.0.0", "IPv4 bind address of /metrics and the health routes"),
    P_INT(livez_stall_ms, 1000, 86400000, "60000", "/livez fails when the loop has not ticked for this long, ms"),
    P_STR(log_level, "info", "debug, info, warn or error"),
};

#define N_OWN (sizeof(own_props) / sizeof(own_props[0]))
#define N_LIMITS_MAX 32

static moeq_prop table[N_OWN + N_LIMITS_MAX + 1];

const moeq_prop *moeq_coordinator_props(void) {
    if (table[0].name) return table;
    size_t n = 0;
    moeq_props_append(table, &n, N_OWN + N_LIMITS_MAX, own_props, N_OWN, 0);
    return moeq_props_append(table, &n, N_OWN + N_LIMITS_MAX, moeq_job_limits_props, 0,
                             offsetof(moeq_coordinator_params, limits));
}

moeq_coordinator_params moeq_coordinator_default_params(void) {
    moeq_coordinator_params p;
    memset(&p, 0, sizeof(p));
    moeq_props_defaults(moeq_coordinator_props(), &p, NULL, 0); /* table defaults are in range */
    return p;
}

static const char *const durability_names[] = {"fsync_always", "waitaof", "none"};

moeq_durability moeq_coordinator_durability(const moeq_coordinator_params *p) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(p->durability, durability_names[i])) return (moeq_durability)i;
    return MOEQ_DURABILITY_FSYNC_ALWAYS;
}

static int valid_topic(const char *t) { /* Kafka: [a-zA-Z0-9._-], 1..249 */
    size_t n = strlen(t);
    if (n == 0 || n > 249) return 0;
    for (const char *c = t; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' && *c != '-') return 0;
    return 1;
}

static moeq_err check_topic_list(const char *key, const char *value, int may_be_empty, char *errstr, size_t n) {
    char buf[1024], *items[64];
    snprintf(buf, sizeof(buf), "%s", value);
    size_t k = moeq_coordinator_split_list(buf, items, 64);
    if (k > 64) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: more than 64 topics", key);
    if (k == 0 && !may_be_empty) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: no topic given", key);
    for (size_t i = 0; i < k; i++)
        if (!valid_topic(items[i]))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: '%s' is not a valid topic name", key, items[i]);
    return MOEQ_OK;
}

moeq_err moeq_coordinator_params_check(const moeq_coordinator_params *p, char *errstr, size_t n) {
    moeq_err err;
    if (!p) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "params: NULL");
    if (!p->kafka_brokers[0]) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "kafka_brokers: empty");
    if (!p->group_id[0]) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "group_id: empty");
    if ((err = check_topic_list("job_topics", p->job_topics, 0, errstr, n))) return err;
    if ((err = check_topic_list("results_topic", p->results_topic, 0, errstr, n))) return err;
    if ((err = check_topic_list("results_allowed_topics", p->results_allowed_topics, 1, errstr, n))) return err;
    if ((err = check_topic_list("dlq_topic", p->dlq_topic, 0, errstr, n))) return err;
    if ((err = check_topic_list("cancel_topic", p->cancel_topic, 1, errstr, n))) return err;
    if (!p->redis_url[0]) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis_url: empty");
    if (!p->redis_prefix[0] || strpbrk(p->redis_prefix, " {}:"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis_prefix: '%s' must be non-empty without ' {}:'",
                         p->redis_prefix);
    int known = 0;
    for (int i = 0; i < 3; i++) known |= !strcmp(p->durability, durability_names[i]);
    if (!known)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "durability: '%s' is not fsync_always, waitaof or none",
                         p->durability);
    if (p->resume_pending_batches >= p->max_pending_batches)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n,
                         "resume_pending_batches: %lld must be below max_pending_batches %lld",
                         (long long)p->resume_pending_batches, (long long)p->max_pending_batches);
    moeq_log_level level;
    if (!moeq_log_parse_level(p->log_level, &level))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "log_level: '%s' is not debug, info, warn or error",
                         p->log_level);
    if ((err = moeq_job_limits_check(&p->limits, errstr, n))) return err;
    moeq_batcher_params bp = moeq_coordinator_batcher_params(p);
    if (bp.max_batch_tokens < 2)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "max_batch_tokens: must allow at least one token of prompt and one of output");
    return MOEQ_OK;
}

moeq_batcher_params moeq_coordinator_batcher_params(const moeq_coordinator_params *p) {
    moeq_batcher_params b = {
        .max_batch_jobs = p->max_batch_jobs,
        .max_batch_tokens = p->max_batch_tokens,
        .max_wait_ms = p->max_wait_ms,
        .length_tolerance = p->length_tolerance,
        .length_slack_tokens = p->length_slack_tokens,
        .min_shared_prefix = p->min_shared_prefix,
        .aging_ms = p->aging_ms,
    };
    return b;
}

size_t moeq_coordinator_split_list(char *buf, char **out, size_t cap) {
    size_t k = 0;
    char *s = buf;
    while (s && *s) {
        char *comma = strchr(s, ',');
        if (comma) *comma = 0;
        while (isspace((unsigned char)*s)) s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
        if (*s) {
            if (k < cap) out[k] = s;
            k++;
        }
        s = comma ? comma + 1 : NULL;
    }
    return k;
}

moeq_err moeq_coordinator_context(const moeq_coordinator_params *p, int model_context, int64_t *out, char *errstr,
                                  size_t n) {
    *out = p->max_model_len;
    if (model_context <= 0) return MOEQ_OK;
    if (p->max_model_len > model_context)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "max_model_len: %lld exceeds the model's max_position_embeddings %d",
                         (long long)p->max_model_len, model_context);
    if (!*out) *out = model_context;
    return MOEQ_OK;
}

int moeq_coordinator_reply_allowed(const moeq_coordinator_params *p, const char *topic) {
    if (!topic || !*topic) return 0;
    if (!strcmp(topic, p->results_topic)) return 1;
    char buf[1024], *items[64];
    snprintf(buf, sizeof(buf), "%s", p->results_allowed_topics);
    size_t k = moeq_coordinator_split_list(buf, items, 64);
    for (size_t i = 0; i < k && i < 64; i++)
        if (!strcmp(items[i], topic)) return 1;
    return 0;
}
