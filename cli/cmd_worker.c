/*
 * cmd_worker.c — `moeq worker` (run a worker), `moeq submit` (produce a file
 * of jobs, wait for their results) and `moeq status` (workers, streams,
 * pending batches; `--job ID` for one job's record). Thin shells over
 * worker/, moeq/kafka.h and moeq/redis.h.
 *
 * Until the worker shell is built (it waits for the engine and the adapters,
 * see worker/CMakeLists.txt) the three commands say so and exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MOEQ_WORKER_SHELL
#include <signal.h>
#include <unistd.h>

#include "moeq/config.h"
#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/util.h"
#include "worker.h"
#endif

int moeq_cmd_worker(int argc, char **argv);
int moeq_cmd_submit(int argc, char **argv);
int moeq_cmd_status(int argc, char **argv);

#ifndef MOEQ_WORKER_SHELL
static int not_built(const char *cmd) {
    fprintf(stderr, "moeq %s: this build has no worker shell yet (see worker/CMakeLists.txt)\n", cmd);
    return 1;
}
int moeq_cmd_worker(int argc, char **argv) { (void)argc, (void)argv; return not_built("worker"); }
int moeq_cmd_submit(int argc, char **argv) { (void)argc, (void)argv; return not_built("submit"); }
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
        printf("usage: moeq worker [--config FILE] [--key=value ...] [--kafka.X=V] [--redis.X=V]\n\n"
               "Takes batches from Redis, runs them on the engine, publishes results to Kafka.\n"
               "Keys (file < MOEQ_<KEY> env < flags):\n\n");
        moeq_props_print_help(moeq_worker_props, stdout);
        return 0;
    }
    char err[512] = "";
    moeq_worker_params params;
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    moeq_worker *w = NULL;
    int rc = 1;
    moeq_err e = moeq_worker_default_params(&params, err, sizeof err);
    moeq_config_src src = {moeq_worker_props, &params, kafka, redis};
    int rest = 0;
    signal(SIGTERM, early_signal);
    signal(SIGINT, early_signal);
    if (!e) e = moeq_config_apply_env(&src, err, sizeof err);
    if (!e) e = moeq_config_apply_args(&src, argc, argv, &rest, err, sizeof err);
    if (!e && rest > 1) e = moeq_errf(MOEQ_ERR_INVALID_ARG, err, sizeof err, "unexpected argument '%s'", argv[1]);
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

/* ---- moeq submit --------------------------------------------------------------- */

typedef struct submit_job {
    char *id;
    int done;
} submit_job;

typedef struct submit_state {
    submit_job *jobs;
    size_t n, cap, n_done, n_acked, n_failed;
    FILE *out;
    volatile sig_atomic_t stop;
} submit_state;

static submit_state *g_submit;

static void submit_signal(int sig) {
    (void)sig;
    if (g_submit) g_submit->stop = 1;
}

static int cmp_job(const void *a, const void *b) {
    return strcmp(((const submit_job *)a)->id, ((const submit_job *)b)->id);
}

static submit_job *find_job(submit_state *s, const char *id) {
    submit_job key = {(char *)id, 0};
    return bsearch(&key, s->jobs, s->n, sizeof *s->jobs, cmp_job);
}

static void on_submit_delivery(const moeq_kafka_delivery *d, void *opaque) {
    submit_state *s = opaque;
    if (d->err) {
        s->n_failed++;
        fprintf(stderr, "moeq submit: a job was not accepted by the broker: %s\n", d->errstr ? d->errstr : "");
    } else {
        s->n_acked++;
    }
}

static void progress(const submit_state *s, int64_t t0, int final) {
    if (!isatty(2)) return;
    double el = (double)(moeq_now_ms() - t0) / 1000.0;
    double rate = el > 0 ? (double)s->n_done / el : 0;
    double eta = rate > 0 ? (double)(s->n - s->n_done) / rate : 0;
    int width = 30, fill = s->n ? (int)((double)width * (double)s->n_done / (double)s->n) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %zu/%zu  %.1f jobs/s  ETA %.0fs   %s", bar, s->n_done, s->n, rate, eta, final ? "\n" : "");
}

static int read_jobs(const char *path, submit_state *s, char ***lines_out) {
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) return fprintf(stderr, "moeq submit: cannot open %s\n", path), -1;
    char *line = NULL, **lines = NULL;
    size_t cap = 0, lcap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        moeq_job job;
        moeq_job_reject rej;
        if (moeq_job_decode(line, (size_t)len, "application/json", NULL, &job, &rej)) {
            fprintf(stderr, "moeq submit: %s line %zu: %s\n", path, s->n + 1, rej.message);
            rc = -1;
            break;
        }
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 256;
            s->jobs = realloc(s->jobs, s->cap * sizeof *s->jobs);
        }
        if (s->n >= lcap) {
            lcap = s->cap;
            lines = realloc(lines, lcap * sizeof *lines);
        }
        s->jobs[s->n] = (submit_job){strdup(job.id), 0};
        lines[s->n] = strdup(line);
        s->n++;
        moeq_job_free(&job);
    }
    free(line);
    if (f != stdin) fclose(f);
    *lines_out = lines;
    return rc;
}

static void write_result(submit_state *s, const void *value, size_t len, const char *ct) {
    moeq_result r;
    char err[256];
    if (moeq_result_decode(value, len, ct, 0, &r, err, sizeof err)) return;
    submit_job *job = find_job(s, r.id);
    if (job && !job->done) {
        job->done = 1;
        s->n_done++;
        moeq_buf buf = {0};
        if (moeq_result_encode(&r, MOEQ_WIRE_JSON, &buf, err, sizeof err) == MOEQ_OK) {
            fwrite(buf.data, 1, buf.len, s->out);
            fputc('\n', s->out);
        }
        moeq_buf_free(&buf);
    }
    moeq_result_free(&r);
}

int moeq_cmd_submit(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *brokers = getenv("MOEQ_KAFKA_BROKERS"), *topic = "moeq.jobs",
               *results = "moeq.results";
    int64_t timeout_s = 600;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            printf("usage: moeq submit --in jobs.jsonl --out results.jsonl [--brokers H:P] [--topic moeq.jobs]\n"
                   "                   [--results-topic moeq.results] [--timeout-s 600]\n\n"
                   "Produces each line (a JSON job) keyed by its id, waits for one result per id,\n"
                   "writes them as JSON lines. Exit 0 when every job has a result.\n");
            return 0;
        }
        if (!v) return fprintf(stderr, "moeq submit: %s needs a value\n", k), 2;
        i++;
        if (!strcmp(k, "--in")) in = v;
        else if (!strcmp(k, "--out")) out = v;
        else if (!strcmp(k, "--brokers")) brokers = v;
        else if (!strcmp(k, "--topic")) topic = v;
        else if (!strcmp(k, "--results-topic")) results = v;
        else if (!strcmp(k, "--timeout-s")) timeout_s = strtoll(v, NULL, 10);
        else return fprintf(stderr, "moeq submit: unknown option %s\n", k), 2;
    }
    if (!in || !out) return fprintf(stderr, "moeq submit: --in and --out are required\n"), 2;
    if (!brokers) brokers = "localhost:9092";
    submit_state s = {0};
    char **lines = NULL;
    int rc = 1;
    char err[512] = "";
    moeq_kafka_producer *producer = NULL;
    moeq_kafka_consumer *consumer = NULL;
    if (read_jobs(in, &s, &lines)) goto done;
    s.out = fopen(out, "w");
    if (!s.out) {
        fprintf(stderr, "moeq submit: cannot write %s\n", out);
        goto done;
    }
    /* subscribe first, so no result can slip past between produce and subscribe */
    char group[96];
    snprintf(group, sizeof group, "moeq-submit-%d-%lld", (int)getpid(), (long long)moeq_now_ms());
    const char *topics[] = {results};
    moeq_kafka_consumer_params cp = {.brokers = brokers, .group_id = group, .topics = topics, .n_topics = 1};
    moeq_kafka_producer_params pp = {.brokers = brokers, .client_id = "moeq-submit", .on_delivery = on_submit_delivery,
                                     .cb_opaque = &s};
    moeq_err e = moeq_kafka_consumer_new(&cp, NULL, &consumer, err, sizeof err);
    if (!e) e = moeq_kafka_producer_new(&pp, NULL, &producer, err, sizeof err);
    if (e) {
        fprintf(stderr, "moeq submit: kafka: %s: %s\n", moeq_err_str(e), err);
        goto done;
    }
    g_submit = &s;
    signal(SIGINT, submit_signal);
    signal(SIGTERM, submit_signal);
    int64_t t0 = moeq_now_ms();
    moeq_kafka_header h = {"content-type", "application/json", 16};
    for (size_t i = 0; i < s.n && !s.stop; i++) {
        moeq_kafka_out msg = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = s.jobs[i].id,
                              .key_len = strlen(s.jobs[i].id), .value = lines[i], .value_len = strlen(lines[i]),
                              .headers = &h, .n_headers = 1};
        while ((e = moeq_kafka_produce(producer, &msg, err, sizeof err)) == MOEQ_ERR_TRANSIENT)
            moeq_kafka_producer_poll(producer, 50);
        if (e) {
            fprintf(stderr, "moeq submit: produce: %s\n", err);
            goto done;
        }
    }
    qsort(s.jobs, s.n, sizeof *s.jobs, cmp_job);
    if (moeq_kafka_producer_flush(producer, 30000, err, sizeof err) || s.n_failed) {
        fprintf(stderr, "moeq submit: not every job reached the broker (%zu failed)\n", s.n_failed);
        goto done;
    }
    int64_t deadline = t0 + timeout_s * 1000, last = 0;
    while (s.n_done < s.n && !s.stop && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        if (moeq_kafka_consumer_poll(consumer, 100, &m, err, sizeof err)) break;
        if (m) {
            size_t len = 0;
            const void *v = moeq_kafka_msg_value(m, &len);
            const void *ctv = NULL;
            size_t ctl = 0;
            char ct[64] = "";
            if (moeq_kafka_msg_header(m, "content-type", &ctv, &ctl) == MOEQ_OK && ctv)
                snprintf(ct, sizeof ct, "%.*s", (int)(ctl < 63 ? ctl : 63), (const char *)ctv);
            if (v) write_result(&s, v, len, ct[0] ? ct : NULL);
            moeq_kafka_msg_destroy(m);
        }
        if (moeq_now_ms() - last > 200) {
            progress(&s, t0, 0);
            last = moeq_now_ms();
        }
    }
    progress(&s, t0, 1);
    double el = (double)(moeq_now_ms() - t0) / 1000.0;
    fprintf(stderr, "moeq submit: %zu/%zu results in %.1fs -> %s\n", s.n_done, s.n, el, out);
    rc = s.n_done == s.n ? 0 : 1;
done:
    if (s.out) fclose(s.out);
    moeq_kafka_consumer_destroy(consumer);
    moeq_kafka_producer_destroy(producer);
    for (size_t i = 0; i < s.n; i++) {
        free(s.jobs[i].id);
        if (lines) free(lines[i]);
    }
    free(s.jobs);
    free(lines);
    g_submit = NULL;
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

int moeq_cmd_status(int argc, char **argv) {
    const char *url = getenv("MOEQ_REDIS_URL"), *job = NULL, *prefix = "moeq", *group = "workers";
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            printf("usage: moeq status [--redis URL] [--prefix moeq] [--group workers] [--job ID]\n\n"
                   "Live workers (heartbeats), batch streams (length, pending, lag) as a table;\n"
                   "--job ID prints that job's record (state, batch, worker, timestamps).\n");
            return 0;
        }
        if (!v) return fprintf(stderr, "moeq status: %s needs a value\n", k), 2;
        i++;
        if (!strcmp(k, "--redis") || !strcmp(k, "--redis-url")) url = v;
        else if (!strcmp(k, "--job")) job = v;
        else if (!strcmp(k, "--prefix")) prefix = v;
        else if (!strcmp(k, "--group")) group = v;
        else return fprintf(stderr, "moeq status: unknown option %s\n", k), 2;
    }
    moeq_redis_params rp;
    moeq_redis *redis = NULL;
    char err[512];
    moeq_err e = moeq_redis_params_parse(url ? url : "localhost:6379", NULL, &rp, err, sizeof err);
    if (!e) e = moeq_redis_new(&rp, &redis, err, sizeof err);
    if (e) return fprintf(stderr, "moeq status: redis: %s: %s\n", moeq_err_str(e), err), 1;
    if (job) status_job(redis, prefix, job);
    else {
        status_workers(redis, prefix);
        status_streams(redis, prefix, group);
    }
    moeq_redis_destroy(redis);
    return 0;
}
#endif
