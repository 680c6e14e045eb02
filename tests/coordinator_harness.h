/*
 * coordinator_harness.h — helpers for the coordinator's integration tests:
 * run `moeq coordinator` as a child process against the fixture's broker and
 * server, produce jobs, read back every batch entry from the streams, and
 * collect messages from result/dead-letter topics. Header-only, tests only.
 */
#ifndef MOEQ_TESTS_COORDINATOR_HARNESS_H
#define MOEQ_TESTS_COORDINATOR_HARNESS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "moeq/batch_entry.h"
#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/redis.h"
#include "moeq/util.h"
#include "services_env.h"

typedef struct harness {
    char kafka[128], redis_addr[128];
    char jobs_topic[160], results_topic[160], dlq_topic[160], cancel_topic[160], group[160], prefix[64];
    char moeq_bin[512], log_path[512];
    moeq_redis *redis;
    moeq_kafka_producer *producer;
    int delivered, failed;
} harness;

static void h_on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    harness *h = opaque;
    if (d->err) h->failed++;
    else h->delivered++;
}

/* 0 on success; MOEQ_TEST_SKIP when the services are not there. */
static inline int h_init(harness *h, const char *name) {
    memset(h, 0, sizeof(*h));
    if (moeq_test_service("MOEQ_TEST_KAFKA", h->kafka, sizeof h->kafka) ||
        moeq_test_service("MOEQ_TEST_REDIS", h->redis_addr, sizeof h->redis_addr))
        return MOEQ_TEST_SKIP;
    char u[128];
    moeq_test_unique_name(u, sizeof u, name);
    snprintf(h->jobs_topic, sizeof h->jobs_topic, "%s.jobs", u);
    snprintf(h->results_topic, sizeof h->results_topic, "%s.results", u);
    snprintf(h->dlq_topic, sizeof h->dlq_topic, "%s.dlq", u);
    snprintf(h->cancel_topic, sizeof h->cancel_topic, "%s.cancel", u);
    snprintf(h->group, sizeof h->group, "%s.group", u);
    snprintf(h->prefix, sizeof h->prefix, "t%ld%ld", (long)getpid(), (long)(moeq_mono_ns() % 1000000000));
    const char *bd = getenv("MOEQ_BUILD_DIR");
    snprintf(h->moeq_bin, sizeof h->moeq_bin, "%s/cli/moeq", bd ? bd : ".");
    snprintf(h->log_path, sizeof h->log_path, "%s/%s.log", bd ? bd : "/tmp", name);
    char err[512];
    moeq_redis_params rp;
    if (moeq_redis_params_parse(h->redis_addr, NULL, &rp, err, sizeof err) || moeq_redis_new(&rp, &h->redis, err, sizeof err)) {
        fprintf(stderr, "redis: %s\n", err);
        return -1;
    }
    moeq_kafka_producer_params pp = {.brokers = h->kafka, .client_id = "moeq-test", .on_delivery = h_on_delivery,
                                     .cb_opaque = h};
    if (moeq_kafka_producer_new(&pp, NULL, &h->producer, err, sizeof err)) {
        fprintf(stderr, "producer: %s\n", err);
        return -1;
    }
    return 0;
}

static inline void h_destroy(harness *h) {
    moeq_kafka_producer_destroy(h->producer);
    moeq_redis_destroy(h->redis);
}

static inline void h_produce(harness *h, const char *topic, const char *key, const void *value, size_t len) {
    moeq_kafka_out m = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = key,
                        .key_len = key ? strlen(key) : 0, .value = value, .value_len = len};
    char err[256];
    moeq_err e;
    while ((e = moeq_kafka_produce(h->producer, &m, err, sizeof err)) == MOEQ_ERR_TRANSIENT)
        moeq_kafka_producer_poll(h->producer, 10);
    if (e) fprintf(stderr, "produce: %s\n", err);
}

static inline int h_flush(harness *h) {
    char err[256];
    return moeq_kafka_producer_flush(h->producer, 60000, err, sizeof err) == MOEQ_OK && h->failed == 0 ? 0 : -1;
}

/* Start `moeq coordinator` with the harness's names plus extra flags (NULL-terminated). */
static inline pid_t h_start(harness *h, const char *const *extra) {
    const char *argv[64];
    char a[16][256];
    int n = 0, k = 0;
    argv[n++] = h->moeq_bin;
    argv[n++] = "coordinator";
#define FLAG(fmt, v) (snprintf(a[k], sizeof a[k], fmt, v), argv[n++] = a[k++])
    FLAG("--kafka_brokers=%s", h->kafka);
    FLAG("--redis_url=%s", h->redis_addr);
    FLAG("--job_topics=%s", h->jobs_topic);
    FLAG("--results_topic=%s", h->results_topic);
    FLAG("--dlq_topic=%s", h->dlq_topic);
    FLAG("--cancel_topic=%s", h->cancel_topic);
    FLAG("--group_id=%s", h->group);
    FLAG("--redis_prefix=%s", h->prefix);
#undef FLAG
    argv[n++] = "--http_port=0";
    argv[n++] = "--kafka.session.timeout.ms=6000";
    for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen(h->log_path, "a");
        if (f) {
            dup2(fileno(f), 1);
            dup2(fileno(f), 2);
        }
        execv(h->moeq_bin, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* SIGTERM and wait (clean shutdown); returns the exit status or -1. */
static inline int h_stop(pid_t pid) {
    int st = 0;
    kill(pid, SIGTERM);
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline void h_kill9(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static inline void h_sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One job as found in a batch entry. */
typedef struct h_job {
    char id[64];
    int stream;        /* priority stream index */
    size_t batch;      /* index of its batch in the walk */
    int32_t prompt_len;
    int32_t max_new;
    int priority;      /* requested */
    int64_t arrival_ms, closed_ms;
} h_job;

typedef struct h_batch {
    int stream;
    size_t n;
    int64_t budget, closed_ms;
    int32_t prefix, min_len, max_len;
    uint64_t pkey, want_pkey; /* the entry's prefix key; the one its prefix and first job's tokens give */
} h_batch;

typedef struct h_walk {
    h_job *jobs;
    size_t n_jobs, cap_jobs;
    h_batch *batches;
    size_t n_batches, cap_batches;
    int stream;
    int bad;
} h_walk;

static int h_entry_cb(const moeq_redis_entry *e, void *opaque) {
    h_walk *w = opaque;
    size_t blen = 0;
    const char *blob = moeq_redis_entry_get(e, "jobs", &blen);
    const char *closed = moeq_redis_entry_get(e, "closed_ms", NULL);
    const char *prefix = moeq_redis_entry_get(e, "prefix", NULL);
    moeq_batch_entry_job *jobs;
    size_t n;
    int32_t *toks;
    char err[256];
    if (!blob || moeq_batch_entry_decode_jobs(blob, blen, &jobs, &n, &toks, err, sizeof err)) {
        w->bad++;
        return 0;
    }
    if (w->n_batches == w->cap_batches) {
        w->cap_batches = w->cap_batches ? 2 * w->cap_batches : 256;
        w->batches = realloc(w->batches, w->cap_batches * sizeof(*w->batches));
    }
    h_batch *b = &w->batches[w->n_batches];
    memset(b, 0, sizeof(*b));
    b->stream = w->stream;
    b->n = n;
    b->closed_ms = closed ? atoll(closed) : 0;
    b->prefix = prefix ? atoi(prefix) : 0;
    const char *pkey = moeq_redis_entry_get(e, "pkey", NULL);
    b->pkey = pkey ? strtoull(pkey, NULL, 16) : 0;
    b->want_pkey = n && b->prefix > 0 ? moeq_batch_entry_prefix_key(jobs[0].tokens, (size_t)b->prefix) : 0;
    b->min_len = INT32_MAX;
    for (size_t i = 0; i < n; i++) {
        moeq_job job;
        memset(&job, 0, sizeof job);
        if (moeq_job_decode(jobs[i].job, jobs[i].job_len, NULL, NULL, &job, NULL)) {
            w->bad++;
            continue;
        }
        if (w->n_jobs == w->cap_jobs) {
            w->cap_jobs = w->cap_jobs ? 2 * w->cap_jobs : 1024;
            w->jobs = realloc(w->jobs, w->cap_jobs * sizeof(*w->jobs));
        }
        h_job *j = &w->jobs[w->n_jobs++];
        snprintf(j->id, sizeof j->id, "%.*s", (int)jobs[i].id_len, jobs[i].id);
        j->stream = w->stream;
        j->batch = w->n_batches;
        j->prompt_len = (int32_t)jobs[i].n_tokens;
        j->max_new = job.max_new_tokens;
        j->priority = job.priority;
        j->arrival_ms = jobs[i].arrival_ms;
        j->closed_ms = b->closed_ms;
        b->budget += j->prompt_len + j->max_new;
        if (j->prompt_len < b->min_len) b->min_len = j->prompt_len;
        if (j->prompt_len > b->max_len) b->max_len = j->prompt_len;
        moeq_job_free(&job);
    }
    w->n_batches++;
    free(jobs);
    free(toks);
    return 0;
}

/* Read every entry of the four streams (XRANGE - +). */
static inline int h_read_batches(harness *h, h_walk *w) {
    free(w->jobs);
    free(w->batches);
    memset(w, 0, sizeof(*w));
    for (int p = 0; p < 4; p++) {
        char key[128], err[256];
        snprintf(key, sizeof key, "%s:batches:p%d", h->prefix, p);
        const char *argv[] = {"XRANGE", key, "-", "+"};
        moeq_redis_reply *r = NULL;
        if (moeq_redis_command_argv(h->redis, 4, argv, NULL, &r, err, sizeof err)) {
            moeq_redis_reply_free(r);
            continue; /* no stream yet */
        }
        w->stream = p;
        moeq_redis_entries_foreach(r, MOEQ_REDIS_XRANGE, h_entry_cb, w, err, sizeof err);
        moeq_redis_reply_free(r);
    }
    return w->bad ? -1 : 0;
}

static int h_cmp_id(const void *a, const void *b) { return strcmp(((const h_job *)a)->id, ((const h_job *)b)->id); }

/* Sort w's job entries by id; returns how many repeat the id before them (entries for a job batched twice). */
static inline size_t h_sort_count_doubled(h_walk *w) {
    qsort(w->jobs, w->n_jobs, sizeof(*w->jobs), h_cmp_id);
    size_t doubled = 0;
    for (size_t i = 1; i < w->n_jobs; i++) doubled += !strcmp(w->jobs[i].id, w->jobs[i - 1].id);
    return doubled;
}

/* Collected messages of a topic (value + reason header). */
typedef struct h_msg {
    char key[128];
    char code[64];
    char *value;
    size_t len;
} h_msg;

/* Called for the index-th message consume_topic reads. */
typedef void (*h_on_msg)(const moeq_kafka_msg *m, size_t index, void *opaque);

/*
 * Read topic from the start in the consumer group <group>.<reader> until want
 * messages or timeout_ms, handing each to on_msg; returns the count.
 */
static inline size_t h_consume(harness *h, const char *topic, const char *reader, size_t want, int timeout_ms,
                               h_on_msg on_msg, void *opaque) {
    char group[400], err[256];
    snprintf(group, sizeof group, "%s.%s", h->group, reader);
    const char *topics[] = {topic};
    moeq_kafka_consumer_params cp = {.brokers = h->kafka, .group_id = group, .topics = topics, .n_topics = 1};
    moeq_kafka_consumer *c = NULL;
    moeq_kvlist *kv = moeq_kvlist_new(); /* the topic may not exist yet: notice it soon */
    moeq_kvlist_set(kv, "topic.metadata.refresh.interval.ms", "500");
    moeq_err e = moeq_kafka_consumer_new(&cp, kv, &c, err, sizeof err);
    moeq_kvlist_destroy(kv);
    if (e) return 0;
    size_t n = 0;
    int64_t end = moeq_now_ms() + timeout_ms;
    while (n < want && moeq_now_ms() < end) {
        moeq_kafka_msg *m = NULL;
        if (moeq_kafka_consumer_poll(c, 200, &m, err, sizeof err) || !m) continue;
        on_msg(m, n++, opaque);
        moeq_kafka_msg_destroy(m);
    }
    moeq_kafka_consumer_destroy(c);
    return n;
}

static inline void h_keep_msg(const moeq_kafka_msg *m, size_t index, void *opaque) {
    h_msg *o = &((h_msg *)opaque)[index];
    size_t kl = 0, vl = 0;
    const char *k = moeq_kafka_msg_key(m, &kl);
    const char *v = moeq_kafka_msg_value(m, &vl);
    memset(o, 0, sizeof(*o));
    snprintf(o->key, sizeof o->key, "%.*s", (int)kl, k ? k : "");
    const void *hv;
    size_t hl;
    if (moeq_kafka_msg_header(m, "moeq-reason-code", &hv, &hl) == MOEQ_OK)
        snprintf(o->code, sizeof o->code, "%.*s", (int)hl, (const char *)hv);
    o->value = malloc(vl + 1);
    memcpy(o->value, v ? v : "", vl);
    o->value[vl] = 0;
    o->len = vl;
}

/* Consume topic from the start until want messages or timeout_ms; returns the count. */
static inline size_t h_collect(harness *h, const char *topic, size_t want, int timeout_ms, h_msg *out) {
    char reader[200];
    snprintf(reader, sizeof reader, "reader.%s", topic);
    return h_consume(h, topic, reader, want, timeout_ms, h_keep_msg, out);
}

#endif

#include "http_client.h"

/* A private redis-server (AOF, appendfsync always) in dir on port; returns its pid. */
static inline pid_t h_redis_start(const char *dir, int port) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        if (devnull >= 0) dup2(devnull, 1);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--dir", dir, "--appendonly", "yes",
               "--appendfsync", "always", "--save", "", (char *)NULL);
        _exit(127);
    }
    return pid;
}
