/*
 * cmd_coordinator.c — `moeq coordinator --config FILE [--key=value ...]`
 * runs the coordinator until SIGINT/SIGTERM; `moeq cancel ID...` writes job
 * ids to the cancel topic. Options come from the coordinator's property
 * table (coordinator/params.h): file < MOEQ_* environment < flags.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "coordinator.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "params.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *out) {
    fprintf(out, "usage: moeq coordinator [--config FILE] [--key=value ...] [--kafka.<prop>=v] [--redis.<key>=v]\n"
                 "       moeq coordinator --print-config [...]   (the effective configuration, as a file)\n"
                 "Keys (file < MOEQ_<KEY> env < flags; docs/CONFIGURATION.md lists every role's):\n\n");
    moeq_props_print_help(moeq_coordinator_props(), out);
}

/*
 * Load --config FILE, then MOEQ_* environment, then the other flags (each
 * overriding the last) into params + pass-through lists. argv is compacted:
 * *left receives the count of arguments that were not options (argv[0]
 * included). Returns 0 or an exit code.
 */
static int load_config(int argc, char **argv, moeq_coordinator_params *p, moeq_kvlist *kafka, moeq_kvlist *redis,
                       int *left, int *printed) {
    char err[512] = "";
    *p = moeq_coordinator_default_params();
    int rc = moeq_cli_load(argv[0], moeq_coordinator_props(), p, kafka, redis, argc, argv, left, printed);
    if (rc || *printed) return rc;
    if (moeq_coordinator_params_check(p, err, sizeof(err))) {
        fprintf(stderr, "moeq %s: %s\n", argv[0], err);
        return 2;
    }
    return 0;
}

int moeq_cmd_coordinator(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
    moeq_coordinator_params p;
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    int rest = 0, printed = 0, rc = load_config(argc, argv, &p, kafka, redis, &rest, &printed);
    if (printed) rc = rc ? rc : -1;
    if (!rc && rest > 1) {
        fprintf(stderr, "moeq coordinator: unexpected argument '%s' (see --help)\n", argv[1]);
        rc = 2;
    }
    moeq_log_level level;
    if (!rc && moeq_log_parse_level(p.log_level, &level)) moeq_log_set_level(level);
    moeq_coordinator *c = NULL;
    char err[512];
    if (!rc) {
        moeq_err e = moeq_coordinator_new(&p, kafka, redis, &c, err, sizeof(err));
        if (e) {
            fprintf(stderr, "moeq coordinator: %s\n", err);
            rc = 1;
        }
    }
    if (!rc) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
        if (moeq_coordinator_run(c, &stop_flag, err, sizeof(err))) {
            fprintf(stderr, "moeq coordinator: %s\n", err);
            rc = 1;
        }
    }
    moeq_coordinator_destroy(c);
    moeq_kvlist_destroy(kafka);
    moeq_kvlist_destroy(redis);
    return rc < 0 ? 0 : rc;
}

static void cancel_usage(FILE *out) {
    fprintf(out, "usage: moeq cancel [--config FILE] [--key=value ...] [--print-config] JOB_ID...\n"
                 "writes each id to cancel_topic (default moeq.cancel); an argument starting with '-' is\n"
                 "never an id (put ids after `--` when one must start with '-')\n");
}

/* The ids: argv[1..rest) after load_config; before `--` none may start with '-'. Returns 0 or 2. */
static int cancel_ids(int rest, char **argv, char **ids, int *n) {
    int dashdash = 0;
    *n = 0;
    for (int i = 1; i < rest; i++) {
        if (!dashdash && !strcmp(argv[i], "--")) { dashdash = 1; continue; }
        if (!dashdash && argv[i][0] == '-') {
            fprintf(stderr, "moeq cancel: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
        ids[(*n)++] = argv[i];
    }
    return 0;
}

int moeq_cmd_cancel(int argc, char **argv) {
    moeq_coordinator_params p;
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    int rest = 0, rc = 0, printed = 0, n_ids = 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            cancel_usage(stdout);
            rc = -1;
        }
    if (!rc && argc < 2) {
        cancel_usage(stderr);
        rc = 2;
    }
    if (!rc) rc = load_config(argc, argv, &p, kafka, redis, &rest, &printed);
    if (!rc && printed) rc = -1;
    char **ids = argc > 0 ? calloc((size_t)argc, sizeof *ids) : NULL;
    if (!rc && !ids) rc = 1;
    if (!rc) rc = cancel_ids(rest, argv, ids, &n_ids);
    moeq_kafka_producer *prod = NULL;
    char err[512];
    if (!rc && !p.cancel_topic[0]) {
        fprintf(stderr, "moeq cancel: cancel_topic is empty (cancellation is off)\n");
        rc = 2;
    }
    if (!rc) {
        moeq_kafka_producer_params pp = {.brokers = p.kafka_brokers, .client_id = "moeq-cancel"};
        if (moeq_kafka_producer_new(&pp, kafka, &prod, err, sizeof(err))) {
            fprintf(stderr, "moeq cancel: %s\n", err);
            rc = 1;
        }
    }
    if (!rc && n_ids == 0) {
        fprintf(stderr, "moeq cancel: no job id given\n");
        rc = 2;
    }
    for (int i = 0; !rc && i < n_ids; i++) {
        moeq_kafka_out out = {.topic = p.cancel_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = ids[i],
                              .key_len = strlen(ids[i]), .value = ids[i], .value_len = strlen(ids[i])};
        if (moeq_kafka_produce(prod, &out, err, sizeof(err))) {
            fprintf(stderr, "moeq cancel: %s: %s\n", ids[i], err);
            rc = 1;
        }
    }
    if (!rc && moeq_kafka_producer_flush(prod, 30000, err, sizeof(err))) {
        fprintf(stderr, "moeq cancel: %s\n", err);
        rc = 1;
    }
    moeq_kafka_producer_destroy(prod);
    moeq_kvlist_destroy(kafka);
    moeq_kvlist_destroy(redis);
    free(ids);
    return rc < 0 ? 0 : rc;
}
