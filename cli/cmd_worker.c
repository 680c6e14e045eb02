/*
 * cmd_worker.c — `moeq worker` (run a worker) and `moeq status` (workers,
 * streams, pending batches; `--job ID` for one job's record). Thin shells
 * over worker/, moeq/kafka.h and moeq/redis.h. (`moeq submit` is
 * cli/cmd_submit.c.)
 *
 * Until the worker shell is built (it waits for the engine and the adapters,
 * see worker/CMakeLists.txt) the two commands say so and exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MOEQ_WORKER_SHELL
#include <signal.h>
#include <unistd.h>

#include "cli.h"
#include "moeq/config.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/redis.h"
#include "moeq/util.h"
#include "worker.h"
#endif

int moeq_cmd_worker(int argc, char **argv);
int moeq_cmd_status(int argc, char **argv);

#ifndef MOEQ_WORKER_SHELL
static int not_built(const char *cmd) {
    fprintf(stderr, "moeq %s: this build has no worker shell yet (see worker/CMakeLists.txt)\n", cmd);
    return 1;
}
int moeq_cmd_worker(int argc, char **argv) { (void)argc, (void)argv; return not_built("worker"); }
int moeq_cmd_status(int argc, char **argv) { (void)argc, (void)argv; return not_built("status"); }
#else

/* ---- moeq worker ------------------------------------------------------------- */

/* SIGTERM during start-up (model load, connecting) must still mean "stop cleanly". */
static volatile sig_atomic_t g_early_stop;
static void early_signal(int sig) {
    (void)sig;
    g_early_stop = 1;
}

int moeq_cmd_worker(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: moeq worker [--config FILE] [--key=value ...] [--kafka.X=V] [--redis.X=V]\n"
               "       moeq worker --print-config [...]   (the effective configuration, as a file)\n\n"
               "Takes batches from Redis, runs them on the engine, publishes results to Kafka.\n"
               "Keys (file < MOEQ_<KEY> env < flags; docs/CONFIGURATION.md lists every role's):\n\n");
        moeq_props_print_help(moeq_worker_config_props(), stdout);
        return 0;
    }
    char err[512] = "";
    moeq_worker_params params;
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    moeq_worker *w = NULL;
    int rc = 1;
    moeq_err e = moeq_worker_default_params(&params, err, sizeof err);
    int rest = 0, printed = 0;
    signal(SIGTERM, early_signal);
    signal(SIGINT, early_signal);
    if (!e && moeq_cli_load("worker", moeq_worker_config_props(), &params, kafka, redis, argc, argv, &rest, &printed)) {
        rc = 2;
        goto done;
    }
    if (!e && printed) {
        rc = 0;
        goto done;
    }
    if (!e && rest > 1) e = moeq_errf(MOEQ_ERR_INVALID_ARG, err, sizeof err, "unexpected argument '%s'", argv[1]);
    moeq_log_level level;
    if (!e && moeq_log_parse_level(params.log_level, &level)) moeq_log_set_level(level);
    if (!e) e = moeq_worker_new(&params, kafka, redis, &w, err, sizeof err);
    if (e) {
        fprintf(stderr, "moeq worker: %s: %s\n", moeq_err_str(e), err);
        goto done;
    }
    moeq_worker_install_signals(w);
    if (g_early_stop) moeq_worker_stop(w);
    e = moeq_worker_run(w, err, sizeof err);
    if (e) fprintf(stderr, "moeq worker: %s: %s\n", moeq_err_str(e), err);
    rc = e ? 1 : 0;
done:
    moeq_worker_destroy(w);
    moeq_kvlist_destroy(kafka);
    moeq_kvlist_destroy(redis);
    return rc;
}

/* ---- moeq status ------------------------------------------------------------------ */

static void status_job(moeq_redis *redis, const char *prefix, const char *id) {
    char key[700];
    snprintf(key, sizeof key, "%s:job:%s", prefix, id);
    const char *argv[] = {"HGETALL", key};
    moeq_redis_reply *r = NULL;
    char err[256];
    if (moeq_redis_command_argv(redis, 2, argv, NULL, &r, err, sizeof err)) {
        fprintf(stderr, "moeq status: %s\n", err);
        return;
    }
    if (moeq_redis_reply_len(r) == 0) printf("job %s: no record\n", id);
    for (size_t i = 0; i + 1 < moeq_redis_reply_len(r); i += 2)
        printf("%-12s %s\n", moeq_redis_reply_str(moeq_redis_reply_at(r, i), NULL),
               moeq_redis_reply_str(moeq_redis_reply_at(r, i + 1), NULL));
    moeq_redis_reply_free(r);
}

/* Pull "key":<number or string> out of a flat JSON object (heartbeats are written by worker.c). */
static void json_field(const char *json, const char *key, char *out, size_t size) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    out[0] = 0;
    if (!p) return;
    p += strlen(pat);
    if (*p == '"') p++;
    size_t n = 0;
    while (p[n] && p[n] != '"' && p[n] != ',' && p[n] != '}' && n + 1 < size) n++;
    memcpy(out, p, n);
    out[n] = 0;
}

static void status_workers(moeq_redis *redis, const char *prefix) {
    char cursor[32] = "0", err[256], match[96];
    snprintf(match, sizeof match, "%s:worker:*", prefix);
    printf("%-28s %-16s %6s %6s %7s %7s %10s %8s\n", "WORKER", "MODEL", "SLOTS", "FREE", "RUNNING", "BATCHES",
           "TOKENS/S", "DONE");
    int n = 0;
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", match, "COUNT", "200"};
        moeq_redis_reply *r = NULL;
        if (moeq_redis_command_argv(redis, 6, argv, NULL, &r, err, sizeof err)) break;
        snprintf(cursor, sizeof cursor, "%s", moeq_redis_reply_str(moeq_redis_reply_at(r, 0), NULL));
        const moeq_redis_reply *keys = moeq_redis_reply_at(r, 1);
        for (size_t i = 0; i < moeq_redis_reply_len(keys); i++) {
            const char *k = moeq_redis_reply_str(moeq_redis_reply_at(keys, i), NULL);
            const char *g[] = {"GET", k};
            moeq_redis_reply *v = NULL;
            if (moeq_redis_command_argv(redis, 2, g, NULL, &v, err, sizeof err) == MOEQ_OK &&
                moeq_redis_reply_str(v, NULL)) {
                const char *json = moeq_redis_reply_str(v, NULL);
                char id[128], model[64], slots[16], free_[16], running[16], batches[16], tps[24], done[24];
                json_field(json, "id", id, sizeof id);
                json_field(json, "model", model, sizeof model);
                json_field(json, "max_seqs", slots, sizeof slots);
                json_field(json, "free_slots", free_, sizeof free_);
                json_field(json, "running", running, sizeof running);
                json_field(json, "batches", batches, sizeof batches);
                json_field(json, "tokens_per_s", tps, sizeof tps);
                json_field(json, "jobs_finished", done, sizeof done);
                printf("%-28s %-16s %6s %6s %7s %7s %10s %8s\n", id, model, slots, free_, running, batches, tps, done);
                n++;
            }
            moeq_redis_reply_free(v);
        }
        moeq_redis_reply_free(r);
    } while (strcmp(cursor, "0") != 0);
    if (!n) printf("(no live workers)\n");
}

static long long int_reply(moeq_redis *redis, int argc, const char **argv) {
    moeq_redis_reply *r = NULL;
    char err[256];
    long long v = -1;
    if (moeq_redis_command_argv(redis, argc, argv, NULL, &r, err, sizeof err) == MOEQ_OK) v = moeq_redis_reply_int(r);
    moeq_redis_reply_free(r);
    return v;
}

static void status_streams(moeq_redis *redis, const char *prefix, const char *group) {
    printf("\n%-20s %8s %8s %8s\n", "STREAM", "LENGTH", "PENDING", "LAG");
    for (int p = 0; p < 4; p++) {
        char stream[96];
        snprintf(stream, sizeof stream, "%s:batches:p%d", prefix, p);
        const char *xlen[] = {"XLEN", stream};
        long long len = int_reply(redis, 2, xlen);
        long long pending = -1, lag = -1;
        const char *xinfo[] = {"XINFO", "GROUPS", stream};
        moeq_redis_reply *r = NULL;
        char err[256];
        if (moeq_redis_command_argv(redis, 3, xinfo, NULL, &r, err, sizeof err) == MOEQ_OK) {
            for (size_t g = 0; g < moeq_redis_reply_len(r); g++) {
                const moeq_redis_reply *info = moeq_redis_reply_at(r, g);
                int ours = 0;
                for (size_t i = 0; i + 1 < moeq_redis_reply_len(info); i += 2) {
                    const char *k = moeq_redis_reply_str(moeq_redis_reply_at(info, i), NULL);
                    const moeq_redis_reply *v = moeq_redis_reply_at(info, i + 1);
                    if (!k) continue;
                    if (!strcmp(k, "name")) ours = moeq_redis_reply_str(v, NULL) && !strcmp(moeq_redis_reply_str(v, NULL), group);
                    if (!strcmp(k, "pending")) pending = moeq_redis_reply_int(v);
                    if (!strcmp(k, "lag")) /* nil when deletions hide it: length - pending (acked entries are deleted) */
                        lag = moeq_redis_reply_type_of(v) == MOEQ_REDIS_INTEGER ? moeq_redis_reply_int(v) : -2;
                }
                if (ours) break;
                pending = lag = -1;
            }
        }
        moeq_redis_reply_free(r);
        if (lag == -2) lag = len >= 0 && pending >= 0 && len > pending ? len - pending : 0;
        char lag_s[24];
        snprintf(lag_s, sizeof lag_s, lag >= 0 ? "%lld" : "-", lag);
        printf("%-20s %8lld %8lld %8s\n", stream, len < 0 ? 0 : len, pending < 0 ? 0 : pending, lag_s);
    }
}

/* status reads the worker's keys (redis_url, redis_prefix, group, redis.*): the same file, env and flags. */
static int status_args(int rest, char **argv, moeq_worker_params *p, const char **job) {
    for (int i = 1; i < rest; i++) {
        const char *k = argv[i], *v = i + 1 < rest ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "moeq status: %s needs a value (see --help)\n", k), 2;
        i++;
        if (!strcmp(k, "--job")) *job = v;
        else if (!strcmp(k, "--redis")) snprintf(p->redis_url, sizeof p->redis_url, "%s", v);
        else if (!strcmp(k, "--prefix")) snprintf(p->redis_prefix, sizeof p->redis_prefix, "%s", v);
        else return fprintf(stderr, "moeq status: unknown option %s (see --help)\n", k), 2;
    }
    return 0;
}

int moeq_cmd_status(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: moeq status [--config FILE] [--redis_url URL] [--redis_prefix moeq] [--group workers]\n"
                   "                   [--redis.<key>=v] [--job ID] [--print-config]\n\n"
                   "Live workers (heartbeats), batch streams (length, pending, lag) as a table;\n"
                   "--job ID prints that job's record (state, batch, worker, timestamps).\n"
                   "Reads the worker's keys (default redis_url %s), file < MOEQ_<KEY> env < flags.\n",
                   MOEQ_REDIS_URL_DEFAULT);
            return 0;
        }
    moeq_worker_params p;
    moeq_kvlist *rkv = moeq_kvlist_new();
    moeq_redis *redis = NULL;
    const char *job = NULL;
    char err[512];
    int rest = 0, printed = 0, rc = 1;
    moeq_redis_params rp;
    moeq_err e = moeq_worker_default_params(&p, err, sizeof err);
    if (e || !rkv) goto done;
    rc = moeq_cli_load("status", moeq_worker_config_props(), &p, NULL, rkv, argc, argv, &rest, &printed);
    if (!rc && !printed) rc = status_args(rest, argv, &p, &job);
    if (rc || printed) goto done;
    rc = 1;
    e = moeq_redis_params_parse(p.redis_url, rkv, &rp, err, sizeof err);
    if (!e) e = moeq_redis_new(&rp, &redis, err, sizeof err);
    if (e) {
        fprintf(stderr, "moeq status: redis %s: %s: %s\n", p.redis_url, moeq_err_str(e), err);
        goto done;
    }
    if (job) status_job(redis, p.redis_prefix, job);
    else {
        status_workers(redis, p.redis_prefix);
        status_streams(redis, p.redis_prefix, p.group);
    }
    rc = 0;
done:
    moeq_redis_destroy(redis);
    moeq_kvlist_destroy(rkv);
    return rc;
}
#endif
