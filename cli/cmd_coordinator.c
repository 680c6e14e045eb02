/*
 * cmd_coordinator.c — `moeq coordinator --config FILE [--key=value ...]`
 * runs the coordinator until SIGINT/SIGTERM; `moeq cancel ID...` writes job
 * ids to the cancel topic. Options come from the coordinator's property
 * table (coordinator/params.h): file < MOEQ_* environment < flags.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

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
                 "       moeq coordinator --print-config   (Markdown table of every key)\n\n");
    moeq_props_print_help(moeq_coordinator_props(), out);
}

/*
 * Load --config FILE, then MOEQ_* environment, then the other flags (each
 * overriding the last) into params + pass-through lists. argv is compacted:
 * *left receives the count of arguments that were not options (argv[0]
 * included). Returns 0 or an exit code.
 */
static int load_config(int argc, char **argv, moeq_coordinator_params *p, moeq_kvlist *kafka, moeq_kvlist *redis,
                       int *left) {
    char err[512] = "";
    *p = moeq_coordinator_default_params();
    moeq_config_src src = {moeq_coordinator_props(), p, kafka, redis};
    const char *file = NULL;
    int m = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) file = argv[++i];
        else if (!strncmp(argv[i], "--config=", 9)) file = argv[i] + 9;
        else argv[m++] = argv[i];
    }
    argv[m] = NULL;
    moeq_err e = file ? moeq_config_load_file(&src, file, err, sizeof(err)) : MOEQ_OK;
    if (!e) e = moeq_config_apply_env(&src, err, sizeof(err));
    if (!e) e = moeq_config_apply_args(&src, m, argv, left, err, sizeof(err));
    if (!e) e = moeq_coordinator_params_check(p, err, sizeof(err));
    if (e) {
        fprintf(stderr, "moeq %s: %s\n", argv[0], err);
        return 2;
    }
    return 0;
}

int moeq_cmd_coordinator(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        if (!strcmp(argv[i], "--print-config")) { moeq_props_print_markdown(moeq_coordinator_props(), stdout); return 0; }
    }
    moeq_coordinator_params p;
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    int rest = 0, rc = load_config(argc, argv, &p, kafka, redis, &rest);
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
    return rc;
}

int moeq_cmd_cancel(int argc, char **argv) {
    moeq_coordinator_params p;
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    int rest = 0, rc = 0;
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(argc < 2 ? stderr : stdout, "usage: moeq cancel [--config FILE] [--key=value ...] JOB_ID...\n"
                                            "writes each id to cancel_topic (default moeq.cancel)\n");
        rc = argc < 2 ? 2 : 0;
    }
    if (!rc) rc = load_config(argc, argv, &p, kafka, redis, &rest);
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
    if (!rc && rest < 2) {
        fprintf(stderr, "moeq cancel: no job id given\n");
        rc = 2;
    }
    char **ids = argv; /* after load_config: argv[1..rest) are the ids */
    for (int i = 1; !rc && i < rest; i++) {
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
    return rc;
}
