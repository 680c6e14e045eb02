/*
 * cmd_topics.c — `moeq topics`: create the Kafka topics a moeq deployment
 * uses, with the partitions, retention and cleanup policy docs/SERVICES.md
 * recommends, through the broker's admin API. Topic names and the broker
 * come from the coordinator's keys (job_topics, results_topic, dlq_topic,
 * cancel_topic, kafka_brokers, kafka.*), so the command reads the same
 * configuration file as every process. A topic that exists is left alone
 * (reported); nothing is ever deleted or altered.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moeq/kafka.h"
#include "params.h"

#define DAY_MS "86400000"
#define WEEK_MS "604800000"
#define MONTH_MS "2592000000"

/*
 * Why these values: jobs are kept a week (the default dedupe_window_s: a replay
 * after an outage still finds them); results are compacted by job id (a late
 * reader still finds every job's last result) and deleted after a week (so
 * millions of ids do not grow the log for ever), with an hour before
 * compaction so live readers see every record; dead letters a month (time to
 * look at them); cancels a day (they matter only while a job runs).
 */
static const char *const jobs_configs[] = {"cleanup.policy", "delete", "retention.ms", WEEK_MS, NULL};
static const char *const results_configs[] = {"cleanup.policy", "compact,delete", "retention.ms", WEEK_MS,
                                              "min.compaction.lag.ms", "3600000", NULL};
static const char *const dlq_configs[] = {"cleanup.policy", "delete", "retention.ms", MONTH_MS, NULL};
static const char *const cancel_configs[] = {"cleanup.policy", "delete", "retention.ms", DAY_MS, NULL};

#define MAX_TOPICS 40

static void usage(FILE *out) {
    fprintf(out,
            "usage: moeq topics [--config FILE] [--key=value ...] [--kafka.<prop>=v]\n"
            "                   [--partitions N] [--replication-factor R] [--dry-run] [--timeout-ms MS]\n\n"
            "Creates job_topics (N partitions: the most coordinators that share work), results_topic (N,\n"
            "compact + a week), dlq_topic (N, a month) and cancel_topic (N, a day) on kafka_brokers, with\n"
            "the kafka.* keys of every other process (TLS, SASL). Topics that exist are left alone.\n"
            "One JSON line per topic; exit 0 when every topic exists afterwards.\n\n"
            "  --partitions N          partitions of each topic (default 12)\n"
            "  --replication-factor R  replicas (default -1: the broker's default.replication.factor; use 3)\n"
            "  --dry-run               the broker validates the requests, creates nothing\n"
            "  --timeout-ms MS         admin request timeout (default 15000)\n");
}

static int add_spec(moeq_kafka_topic_spec *specs, int n, const char *name, int partitions, int rf,
                    const char *const *configs) {
    if (!name[0] || n >= MAX_TOPICS) return n;
    for (int i = 0; i < n; i++)
        if (!strcmp(specs[i].name, name)) return n;
    specs[n] = (moeq_kafka_topic_spec){.name = name, .partitions = partitions, .replication_factor = rf,
                                       .configs = configs};
    return n + 1;
}

static int int_arg(const char *flag, const char *v, long min, long max, int *out) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < min || x > max) {
        fprintf(stderr, "moeq topics: %s needs an integer in [%ld, %ld]\n", flag, min, max);
        return 2;
    }
    *out = (int)x;
    return 0;
}

/* Our own flags out of argv (the rest goes to the configuration loader). */
static int own_flags(int *argc, char **argv, int *partitions, int *rf, int *dry_run, int *timeout_ms) {
    int w = 1, rc = 0;
    for (int i = 1; i < *argc && !rc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--partitions")) rc = int_arg(a, i + 1 < *argc ? argv[++i] : NULL, 1, 10000, partitions);
        else if (!strcmp(a, "--replication-factor")) rc = int_arg(a, i + 1 < *argc ? argv[++i] : NULL, -1, 32, rf);
        else if (!strcmp(a, "--timeout-ms")) rc = int_arg(a, i + 1 < *argc ? argv[++i] : NULL, 100, 600000, timeout_ms);
        else if (!strcmp(a, "--dry-run")) *dry_run = 1;
        else argv[w++] = argv[i];
    }
    if (!rc && *rf == 0) {
        fprintf(stderr, "moeq topics: --replication-factor 0 is not a replica count (-1 = the broker's default)\n");
        rc = 2;
    }
    *argc = w;
    return rc;
}

static void print_result(const moeq_kafka_topic_spec *s, moeq_kafka_topic_outcome o, const char *msg, int dry) {
    static const char *names[] = {"created", "exists", "failed"};
    printf("{\"topic\":\"%s\",\"outcome\":\"%s\",\"partitions\":%d,\"replication_factor\":%d,\"configs\":{", s->name,
           o == MOEQ_KAFKA_TOPIC_CREATED && dry ? "valid" : names[o], s->partitions, s->replication_factor);
    for (const char *const *c = s->configs; c && c[0]; c += 2) printf("%s\"%s\":\"%s\"", c == s->configs ? "" : ",", c[0], c[1]);
    printf("}");
    if (msg[0]) {
        printf(",\"message\":\"");
        for (const char *p = msg; *p; p++) {
            if (*p == '"' || *p == '\\') putchar('\\');
            putchar((unsigned char)*p < 0x20 ? ' ' : *p);
        }
        printf("\"");
    }
    printf("}\n");
}

int moeq_cmd_topics(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
    int partitions = 12, rf = -1, dry_run = 0, timeout_ms = 15000;
    int rc = own_flags(&argc, argv, &partitions, &rf, &dry_run, &timeout_ms);
    if (rc) return rc;
    moeq_coordinator_params p = moeq_coordinator_default_params();
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    int rest = 0, printed = 0;
    rc = moeq_cli_load(argv[0], moeq_coordinator_props(), &p, kafka, redis, argc, argv, &rest, &printed);
    if (!rc && !printed && rest > 1) {
        fprintf(stderr, "moeq topics: unexpected argument '%s' (see --help)\n", argv[1]);
        rc = 2;
    }
    if (rc || printed) goto done;

    moeq_kafka_topic_spec specs[MAX_TOPICS];
    int n = 0;
    char topics[sizeof p.job_topics];
    snprintf(topics, sizeof topics, "%s", p.job_topics);
    for (char *save = NULL, *t = strtok_r(topics, ",", &save); t; t = strtok_r(NULL, ",", &save))
        n = add_spec(specs, n, t, partitions, rf, jobs_configs);
    n = add_spec(specs, n, p.results_topic, partitions, rf, results_configs);
    n = add_spec(specs, n, p.dlq_topic, partitions, rf, dlq_configs);
    n = add_spec(specs, n, p.cancel_topic, partitions, rf, cancel_configs);

    moeq_kafka_topic_outcome outcome[MAX_TOPICS];
    char message[MAX_TOPICS][256];
    char err[512];
    if (moeq_kafka_create_topics(p.kafka_brokers, kafka, specs, n, dry_run, timeout_ms, outcome, message, err,
                                 sizeof err)) {
        fprintf(stderr, "moeq topics: %s\n", err);
        rc = 1;
        goto done;
    }
    for (int i = 0; i < n; i++) {
        print_result(&specs[i], outcome[i], message[i], dry_run);
        if (outcome[i] == MOEQ_KAFKA_TOPIC_FAILED) rc = 1;
    }
done:
    moeq_kvlist_destroy(kafka);
    moeq_kvlist_destroy(redis);
    return rc;
}
