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

#include "cli.h"
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

/* ---- moeq submit --------------------------------------------------------------- */

/*
 * Results answer this submission: the results (and dead-letter) readers
 * start at the first message produced from shortly before the first job was
 * sent (offsets_for_times), and a result whose job_hash is not the hash of
 * the line sent answers an earlier job with the same id: it is reported as
 * stale and not taken. A `duplicate` dead letter for one of our jobs (its id
 * was already accepted) settles that job at once, reported, not waited for.
 */
enum { JOB_WAITING = 0, JOB_DONE, JOB_DUPLICATE };

typedef struct submit_job {
    char *id;
    char *line;                    /* the job as sent */
    size_t lineno;                 /* 1-based line of the input file */
    char hash[MOEQ_JOB_HASH_SIZE]; /* moeq_job_content_hash of line */
    int state;                     /* JOB_* */
    int stale_seen;
} submit_job;

typedef struct submit_state {
    submit_job *jobs;              /* file order */
    submit_job **by_id;            /* sorted by id, for lookups */
    size_t n, cap, n_done, n_dup, n_stale, n_acked, n_failed;
    FILE *out;
    volatile sig_atomic_t stop;
} submit_state;

static submit_state *g_submit;

static void submit_signal(int sig) {
    (void)sig;
    if (g_submit) g_submit->stop = 1;
}

static int cmp_job(const void *a, const void *b) {
    return strcmp((*(submit_job *const *)a)->id, (*(submit_job *const *)b)->id);
}

/* By id, then line: a repeated id's lines are reported in file order. */
static int cmp_job_line(const void *a, const void *b) {
    int c = cmp_job(a, b);
    if (c) return c;
    size_t la = (*(submit_job *const *)a)->lineno, lb = (*(submit_job *const *)b)->lineno;
    return la < lb ? -1 : la > lb;
}

static submit_job *find_job(submit_state *s, const char *id) {
    submit_job key = {.id = (char *)id}, *kp = &key;
    submit_job **hit = bsearch(&kp, s->by_id, s->n, sizeof *s->by_id, cmp_job);
    return hit ? *hit : NULL;
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

static int add_job(submit_state *s, const char *id, const char *line, size_t len, size_t lineno) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        submit_job *v = realloc(s->jobs, cap * sizeof *v);
        if (!v) return -1;
        s->jobs = v;
        s->cap = cap;
    }
    submit_job *j = &s->jobs[s->n];
    memset(j, 0, sizeof *j);
    j->id = strdup(id);
    j->line = strdup(line);
    j->lineno = lineno;
    if (!j->id || !j->line) {
        free(j->id);
        free(j->line);
        return -1;
    }
    moeq_job_content_hash(line, len, j->hash);
    s->n++;
    return 0;
}

static int read_jobs(const char *path, submit_state *s) {
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) return fprintf(stderr, "moeq submit: cannot open %s\n", path), -1;
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        moeq_job job;
        moeq_job_reject rej;
        if (moeq_job_decode(line, (size_t)len, "application/json", NULL, &job, &rej)) {
            fprintf(stderr, "moeq submit: %s line %zu: %s\n", path, lineno, rej.message);
            rc = -1;
            break;
        }
        if (add_job(s, job.id, line, (size_t)len, lineno)) {
            fprintf(stderr, "moeq submit: out of memory\n");
            rc = -1;
        }
        moeq_job_free(&job);
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

/* Index the jobs by id; an id on two lines is an error naming them (nothing is sent). */
static int index_jobs(const char *path, submit_state *s) {
    s->by_id = malloc((s->n ? s->n : 1) * sizeof *s->by_id);
    if (!s->by_id) return fprintf(stderr, "moeq submit: out of memory\n"), -1;
    for (size_t i = 0; i < s->n; i++) s->by_id[i] = &s->jobs[i];
    qsort(s->by_id, s->n, sizeof *s->by_id, cmp_job_line);
    int dups = 0;
    for (size_t i = 0; i < s->n;) {
        size_t k = i + 1;
        while (k < s->n && !strcmp(s->by_id[k]->id, s->by_id[i]->id)) k++;
        if (k - i > 1) {
            char lines[256];
            int off = 0;
            for (size_t j = i; j < k && off < 200; j++)
                off += snprintf(lines + off, sizeof lines - (size_t)off, "%s%zu", j > i ? ", " : "", s->by_id[j]->lineno);
            fprintf(stderr, "moeq submit: %s: job id '%s' is on lines %s: one id, one job (nothing was sent)\n", path,
                    s->by_id[i]->id, lines);
            dups++;
        }
        i = k;
    }
    return dups ? -1 : 0;
}

static void write_result(submit_state *s, const void *value, size_t len, const char *ct) {
    moeq_result r;
    char err[256];
    if (moeq_result_decode(value, len, ct, 0, &r, err, sizeof err)) return;
    submit_job *job = find_job(s, r.id);
    if (!job || job->state == JOB_DONE) goto done;
    if (r.job_hash && strcmp(r.job_hash, job->hash)) { /* results of older writers carry no hash: taken */
        if (!job->stale_seen)
            fprintf(stderr, "moeq submit: job %s: skipped a stale result: it answers an earlier job with this id "
                    "(job_hash %s; line %zu sent %s)\n", job->id, r.job_hash, job->lineno, job->hash);
        s->n_stale += !job->stale_seen;
        job->stale_seen = 1;
        goto done;
    }
    if (job->state != JOB_WAITING) goto done;
    job->state = JOB_DONE;
    s->n_done++;
    moeq_buf buf = {0};
    if (moeq_result_encode(&r, MOEQ_WIRE_JSON, &buf, err, sizeof err) == MOEQ_OK) {
        fwrite(buf.data, 1, buf.len, s->out);
        fputc('\n', s->out);
    }
    moeq_buf_free(&buf);
done:
    moeq_result_free(&r);
}

static void header_str(const moeq_kafka_msg *m, const char *name, char *out, size_t n) {
    const void *v = NULL;
    size_t len = 0;
    out[0] = 0;
    if (moeq_kafka_msg_header(m, name, &v, &len) == MOEQ_OK && v)
        snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), (const char *)v);
}

/* A dead letter: a `duplicate` of one of our jobs (by id, and by hash when it says one) settles it. */
static void read_dead_letter(submit_state *s, const moeq_kafka_msg *m) {
    char code[32], hash[32], reason[640], id[MOEQ_JOB_ID_HARD_MAX + 1];
    header_str(m, "moeq-reason-code", code, sizeof code);
    if (strcmp(code, "duplicate")) return; /* other dead letters come with an error result */
    size_t kl = 0;
    const char *k = moeq_kafka_msg_key(m, &kl);
    if (!k || kl > MOEQ_JOB_ID_HARD_MAX) return;
    snprintf(id, sizeof id, "%.*s", (int)kl, k);
    submit_job *job = find_job(s, id);
    header_str(m, "moeq-job-hash", hash, sizeof hash);
    if (!job || job->state != JOB_WAITING || (hash[0] && strcmp(hash, job->hash))) return;
    header_str(m, "moeq-reason", reason, sizeof reason);
    fprintf(stderr, "moeq submit: job %s (line %zu) was not run: %s\n", id, job->lineno, reason);
    job->state = JOB_DUPLICATE;
    s->n_dup++;
}

static void read_result_msg(submit_state *s, const moeq_kafka_msg *m) {
    size_t len = 0;
    const void *v = moeq_kafka_msg_value(m, &len);
    char ct[64];
    header_str(m, "content-type", ct, sizeof ct);
    if (v) write_result(s, v, len, ct[0] ? ct : NULL);
}

static void submit_usage(void) {
    printf("usage: moeq submit --in jobs.jsonl --out results.jsonl [--brokers H:P] [--topic moeq.jobs]\n"
           "                   [--results-topic moeq.results] [--dlq-topic moeq.dlq] [--timeout-s 600]\n"
           "                   [--clock-skew-s 60]\n\n"
           "Produces each line (a JSON job) keyed by its id, waits for one result per id,\n"
           "writes them as JSON lines. Reads only results produced since it started (less\n"
           "--clock-skew-s, for workers whose clocks lag), and takes a result only when its\n"
           "job_hash is the hash of the line sent (others answer an earlier job with the same\n"
           "id: reported as stale). A job whose id was already accepted is dead-lettered\n"
           "`duplicate` by the coordinator: reported, not waited for. An id on two lines is\n"
           "an error before anything is sent. Exit 0 when every job has its result.\n");
}

typedef struct submit_opts {
    const char *in, *out, *brokers, *topic, *results, *dlq;
    int64_t timeout_s, skew_s;
} submit_opts;

static int submit_args(int argc, char **argv, submit_opts *o) {
    const char *env = getenv("MOEQ_KAFKA_BROKERS");
    *o = (submit_opts){.brokers = env ? env : "localhost:9092", .topic = "moeq.jobs", .results = "moeq.results",
                       .dlq = "moeq.dlq", .timeout_s = 600, .skew_s = 60};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) return submit_usage(), 0;
        if (!v) return fprintf(stderr, "moeq submit: %s needs a value\n", k), 2;
        i++;
        if (!strcmp(k, "--in")) o->in = v;
        else if (!strcmp(k, "--out")) o->out = v;
        else if (!strcmp(k, "--brokers")) o->brokers = v;
        else if (!strcmp(k, "--topic")) o->topic = v;
        else if (!strcmp(k, "--results-topic")) o->results = v;
        else if (!strcmp(k, "--dlq-topic")) o->dlq = v;
        else if (!strcmp(k, "--timeout-s")) o->timeout_s = strtoll(v, NULL, 10);
        else if (!strcmp(k, "--clock-skew-s")) o->skew_s = strtoll(v, NULL, 10);
        else return fprintf(stderr, "moeq submit: unknown option %s\n", k), 2;
    }
    if (!o->in || !o->out) return fprintf(stderr, "moeq submit: --in and --out are required\n"), 2;
    return -1; /* go on */
}

static moeq_err open_reader(const char *brokers, const char *topic, const char *role, int64_t start_ms,
                            moeq_kafka_consumer **out, char *err, size_t n) {
    char group[128];
    snprintf(group, sizeof group, "moeq-submit-%s-%d-%lld", role, (int)getpid(), (long long)moeq_now_ms());
    const char *topics[] = {topic};
    moeq_kafka_consumer_params cp = {.brokers = brokers, .group_id = group, .topics = topics, .n_topics = 1,
                                     .start_ms = start_ms};
    moeq_kvlist *kv = moeq_kvlist_new(); /* the dead-letter topic may appear only later: notice it soon */
    if (kv) moeq_kvlist_set(kv, "topic.metadata.refresh.interval.ms", "1000");
    moeq_err e = moeq_kafka_consumer_new(&cp, kv, out, err, n);
    moeq_kvlist_destroy(kv);
    return e;
}

/*
 * Wait (bounded) until the results reader has partitions, reading what comes
 * meanwhile: results already there (stale ones) are then read before our new
 * jobs can be dead-lettered. Nothing depends on it (readers start at `since`
 * whenever assigned); it only makes the report complete.
 */
static void wait_assigned(submit_state *s, moeq_kafka_consumer *c, int timeout_ms) {
    char err[256];
    for (int64_t end = moeq_now_ms() + timeout_ms; moeq_now_ms() < end;) {
        moeq_kafka_msg *m = NULL;
        moeq_kafka_partition *parts = NULL;
        size_t n = 0;
        if (moeq_kafka_consumer_poll(c, 100, &m, err, sizeof err)) return;
        if (m) read_result_msg(s, m);
        moeq_kafka_msg_destroy(m);
        moeq_kafka_consumer_assignment(c, &parts, &n, err, sizeof err);
        free(parts);
        if (n) return;
    }
}

static moeq_err produce_jobs(submit_state *s, moeq_kafka_producer *producer, const char *topic, char *err, size_t n) {
    moeq_kafka_header h = {"content-type", "application/json", 16};
    moeq_err e = MOEQ_OK;
    for (size_t i = 0; i < s->n && !s->stop && !e; i++) {
        moeq_kafka_out msg = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = s->jobs[i].id,
                              .key_len = strlen(s->jobs[i].id), .value = s->jobs[i].line,
                              .value_len = strlen(s->jobs[i].line), .headers = &h, .n_headers = 1};
        while ((e = moeq_kafka_produce(producer, &msg, err, n)) == MOEQ_ERR_TRANSIENT) moeq_kafka_producer_poll(producer, 50);
    }
    return e;
}

int moeq_cmd_submit(int argc, char **argv) {
    submit_opts o;
    int arc = submit_args(argc, argv, &o);
    if (arc >= 0) return arc;
    submit_state s = {0};
    int rc = 1;
    char err[512] = "";
    moeq_kafka_producer *producer = NULL;
    moeq_kafka_consumer *consumer = NULL, *dlq = NULL;
    if (read_jobs(o.in, &s) || index_jobs(o.in, &s)) goto done;
    s.out = fopen(o.out, "w");
    if (!s.out) {
        fprintf(stderr, "moeq submit: cannot write %s\n", o.out);
        goto done;
    }
    int64_t t0 = moeq_now_ms(), since = t0 - o.skew_s * 1000;
    /* subscribed before producing; each reader starts at `since`, whenever its partitions are assigned */
    moeq_kafka_producer_params pp = {.brokers = o.brokers, .client_id = "moeq-submit", .on_delivery = on_submit_delivery,
                                     .cb_opaque = &s};
    moeq_err e = open_reader(o.brokers, o.results, "results", since, &consumer, err, sizeof err);
    if (!e) e = open_reader(o.brokers, o.dlq, "dlq", since, &dlq, err, sizeof err);
    if (!e) e = moeq_kafka_producer_new(&pp, NULL, &producer, err, sizeof err);
    if (e) {
        fprintf(stderr, "moeq submit: kafka: %s: %s\n", moeq_err_str(e), err);
        goto done;
    }
    g_submit = &s;
    signal(SIGINT, submit_signal);
    signal(SIGTERM, submit_signal);
    wait_assigned(&s, consumer, 5000);
    if ((e = produce_jobs(&s, producer, o.topic, err, sizeof err))) {
        fprintf(stderr, "moeq submit: produce: %s\n", err);
        goto done;
    }
    if (moeq_kafka_producer_flush(producer, 30000, err, sizeof err) || s.n_failed) {
        fprintf(stderr, "moeq submit: not every job reached the broker (%zu failed)\n", s.n_failed);
        goto done;
    }
    int64_t deadline = t0 + o.timeout_s * 1000, last = 0;
    while (s.n_done + s.n_dup < s.n && !s.stop && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        if (moeq_kafka_consumer_poll(consumer, 100, &m, err, sizeof err)) break;
        if (m) read_result_msg(&s, m);
        moeq_kafka_msg_destroy(m);
        m = NULL;
        if (moeq_kafka_consumer_poll(dlq, 0, &m, err, sizeof err)) break;
        if (m) read_dead_letter(&s, m);
        moeq_kafka_msg_destroy(m);
        if (moeq_now_ms() - last > 200) {
            progress(&s, t0, 0);
            last = moeq_now_ms();
        }
    }
    progress(&s, t0, 1);
    double el = (double)(moeq_now_ms() - t0) / 1000.0;
    fprintf(stderr, "moeq submit: %zu/%zu results in %.1fs -> %s", s.n_done, s.n, el, o.out);
    if (s.n_dup) fprintf(stderr, "; %zu not run (id already accepted)", s.n_dup);
    if (s.n_stale) fprintf(stderr, "; %zu stale results skipped", s.n_stale);
    fputc('\n', stderr);
    rc = s.n_done == s.n ? 0 : 1;
done:
    if (s.out) fclose(s.out);
    moeq_kafka_consumer_destroy(consumer);
    moeq_kafka_consumer_destroy(dlq);
    moeq_kafka_producer_destroy(producer);
    for (size_t i = 0; i < s.n; i++) {
        free(s.jobs[i].id);
        free(s.jobs[i].line);
    }
    free(s.jobs);
    free(s.by_id);
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
