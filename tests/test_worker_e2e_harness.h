/*
 * test_worker_e2e_harness.h — the whole pipeline as processes for the
 * end-to-end and chaos tests: `moeq coordinator` and `moeq worker` children
 * against the `services` fixture's Kafka and Redis, a results consumer that
 * counts results per job id and checks that duplicates are identical
 * (status, finish reason, text, tokens: timings and worker differ by design).
 * Header-only, tests only.
 */
#ifndef MOEQ_TESTS_WORKER_E2E_HARNESS_H
#define MOEQ_TESTS_WORKER_E2E_HARNESS_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moeq/kafka.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/util.h"
#include "services_env.h"

typedef struct e2e_job {
    char id[128];
    int n_results;
    uint64_t ident;          /* FNV-1a of the first result's identity                 */
    char status[16], finish[16];
    int32_t *tokens;         /* the first result's tokens (owned)                    */
    int n_tokens;
    char worker[64];         /* the first result's worker id ("" when absent)        */
    void *user;              /* the test's                                           */
} e2e_job;

typedef struct e2e {
    char kafka[128], redis[128], model[512], moeq[512], logdir[512];
    char ns[96], jobs_topic[160], results_topic[160];
    moeq_kafka_consumer *results;
    e2e_job *jobs;           /* open addressing by id                                */
    size_t cap, n_jobs;
    long long duplicates, results_seen, mismatches;
} e2e;

static inline uint64_t e2e_fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* The job with this id (created when absent). */
static inline e2e_job *e2e_job_get(e2e *t, const char *id) {
    if (2 * (t->n_jobs + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        e2e_job *jobs = calloc(cap, sizeof *jobs);
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->jobs[i].id[0]) continue;
            size_t k = e2e_fnv(t->jobs[i].id, strlen(t->jobs[i].id), 14695981039346656037ULL) % cap;
            while (jobs[k].id[0]) k = (k + 1) % cap;
            jobs[k] = t->jobs[i];
        }
        free(t->jobs);
        t->jobs = jobs;
        t->cap = cap;
    }
    size_t k = e2e_fnv(id, strlen(id), 14695981039346656037ULL) % t->cap;
    while (t->jobs[k].id[0] && strcmp(t->jobs[k].id, id)) k = (k + 1) % t->cap;
    if (!t->jobs[k].id[0]) {
        snprintf(t->jobs[k].id, sizeof t->jobs[k].id, "%s", id);
        t->n_jobs++;
    }
    return &t->jobs[k];
}

static inline e2e_job *e2e_job_find(e2e *t, const char *id) {
    if (!t->cap) return NULL;
    size_t k = e2e_fnv(id, strlen(id), 14695981039346656037ULL) % t->cap;
    while (t->jobs[k].id[0] && strcmp(t->jobs[k].id, id)) k = (k + 1) % t->cap;
    return t->jobs[k].id[0] ? &t->jobs[k] : NULL;
}

/* Subscribe a fresh group to topic and wait until it has partitions (so nothing produced later is missed). */
static inline moeq_kafka_consumer *e2e_subscribe(const e2e *t, const char *topic, const char *tag) {
    char group[256], err[512];
    snprintf(group, sizeof group, "%s.%s", t->ns, tag);
    /* make sure the topic exists before subscribing: a produce auto-creates it */
    moeq_kafka_producer *prod = NULL;
    moeq_kafka_producer_params pp = {.brokers = t->kafka};
    if (moeq_kafka_producer_new(&pp, NULL, &prod, err, sizeof err)) return NULL;
    moeq_kafka_out m = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = "init", .key_len = 4,
                        .value = "init", .value_len = 4};
    moeq_kafka_produce(prod, &m, err, sizeof err);
    moeq_kafka_producer_flush(prod, 30000, err, sizeof err);
    moeq_kafka_producer_destroy(prod);
    const char *topics[] = {topic};
    moeq_kafka_consumer_params cp = {.brokers = t->kafka, .group_id = group, .topics = topics, .n_topics = 1};
    moeq_kafka_consumer *c = NULL;
    if (moeq_kafka_consumer_new(&cp, NULL, &c, err, sizeof err)) return NULL;
    for (int i = 0; i < 300; i++) {
        moeq_kafka_msg *msg = NULL;
        moeq_kafka_consumer_poll(c, 100, &msg, err, sizeof err);
        moeq_kafka_msg_destroy(msg); /* only "init" can be there yet */
        moeq_kafka_partition *parts = NULL;
        size_t n = 0;
        moeq_kafka_consumer_assignment(c, &parts, &n, err, sizeof err);
        free(parts);
        if (n) break;
    }
    return c;
}

/* 0, or MOEQ_TEST_SKIP without services. Builds the tiny model when missing. */
static inline int e2e_open(e2e *t, const char *tag) {
    memset(t, 0, sizeof *t);
    if (moeq_test_service("MOEQ_TEST_KAFKA", t->kafka, sizeof t->kafka) ||
        moeq_test_service("MOEQ_TEST_REDIS", t->redis, sizeof t->redis))
        return MOEQ_TEST_SKIP;
    const char *build = getenv("MOEQ_BUILD_DIR");
    snprintf(t->moeq, sizeof t->moeq, "%s/cli/moeq", build ? build : ".");
    snprintf(t->model, sizeof t->model, "%s/test-worker-model", build ? build : "/tmp");
    snprintf(t->logdir, sizeof t->logdir, "%s", build ? build : "/tmp");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "test -f %s/config.json || %s gen-model --preset tiny --out %s >/dev/null", t->model,
             t->moeq, t->model);
    if (system(cmd) != 0) return -1;
    char u[96];
    moeq_test_unique_name(u, sizeof u, tag);
    for (char *p = u; *p; p++) if (*p == '.') *p = '_';
    snprintf(t->ns, sizeof t->ns, "%s", u);
    snprintf(t->jobs_topic, sizeof t->jobs_topic, "%s.jobs", u);
    snprintf(t->results_topic, sizeof t->results_topic, "%s.results", u);
    t->results = e2e_subscribe(t, t->results_topic, "results");
    return t->results ? 0 : -1;
}

static inline void e2e_close(e2e *t) {
    moeq_kafka_consumer_destroy(t->results);
    for (size_t i = 0; i < t->cap; i++) free(t->jobs[i].tokens);
    free(t->jobs);
}

static inline pid_t e2e_spawn(const e2e *t, const char *cmd, const char *log) {
    char full[4096];
    snprintf(full, sizeof full, "exec %s 2>>%s/%s.log", cmd, t->logdir, log);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static inline pid_t e2e_start_coordinator(const e2e *t, const char *extra) {
    char cmd[3072];
    snprintf(cmd, sizeof cmd,
             "%s coordinator --kafka_brokers=%s --redis_url=%s --model=%s --job_topics=%s --results_topic=%s "
             "--dlq_topic=%s.dlq --redis_prefix=%s --group_id=%s.coord --max_wait_ms=50 --http_port=0 "
             "--kafka.session.timeout.ms=6000 %s",
             t->moeq, t->kafka, t->redis, t->model, t->jobs_topic, t->results_topic, t->ns, t->ns, t->ns,
             extra ? extra : "");
    char log[160];
    snprintf(log, sizeof log, "%s-coordinator", t->ns);
    return e2e_spawn(t, cmd, log);
}

static inline pid_t e2e_start_worker(const e2e *t, const char *worker_id, const char *extra) {
    char cmd[3072];
    snprintf(cmd, sizeof cmd,
             "%s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
             "--dlq_topic=%s.dlq --worker_id=%s --max_seqs=16 --max_step_tokens=256 --kv_cache_tokens=16384 "
             "--n_threads=1 --block_ms=100 --http_port=0 %s",
             t->moeq, t->model, t->redis, t->kafka, t->ns, t->results_topic, t->ns, worker_id, extra ? extra : "");
    char log[256];
    snprintf(log, sizeof log, "%s-%s", t->ns, worker_id);
    return e2e_spawn(t, cmd, log);
}

static inline void e2e_kill9(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* SIGTERM, wait up to timeout_ms, then SIGKILL. Returns the exit status, or -1 when it had to be killed. */
static inline int e2e_term(pid_t pid, int timeout_ms) {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    for (int t = 0; t < timeout_ms; t += 20) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(20000);
    }
    e2e_kill9(pid);
    return -1;
}

/*
 * Read results for up to wait_ms (returns early once `want` distinct ids have
 * one). Results for ids not seen before are added; a duplicate must be
 * identical to the first (else t->mismatches grows).
 */
static inline size_t e2e_collect(e2e *t, size_t want, int wait_ms) {
    int64_t deadline = moeq_now_ms() + wait_ms;
    size_t have = 0;
    for (size_t i = 0; i < t->cap; i++) have += t->jobs[i].n_results > 0;
    while (have < want && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        char err[512];
        if (moeq_kafka_consumer_poll(t->results, 100, &m, err, sizeof err) || !m) continue;
        size_t len = 0;
        const void *v = moeq_kafka_msg_value(m, &len);
        moeq_result r;
        if (v && len > 4 && moeq_result_decode(v, len, NULL, 0, &r, err, sizeof err) == MOEQ_OK) {
            t->results_seen++;
            uint64_t h = 14695981039346656037ULL;
            const char *st = moeq_result_status_name(r.status), *fr = moeq_finish_reason_name(r.finish_reason);
            h = e2e_fnv(st, strlen(st) + 1, h);
            h = e2e_fnv(fr, strlen(fr) + 1, h);
            if (r.text) h = e2e_fnv(r.text, strlen(r.text) + 1, h);
            if (r.error.code) h = e2e_fnv(r.error.code, strlen(r.error.code) + 1, h);
            h = e2e_fnv(r.tokens, r.n_tokens * sizeof *r.tokens, h);
            e2e_job *j = e2e_job_get(t, r.id);
            if (j->n_results == 0) {
                j->ident = h;
                snprintf(j->status, sizeof j->status, "%s", st);
                snprintf(j->finish, sizeof j->finish, "%s", fr);
                j->tokens = malloc((r.n_tokens ? r.n_tokens : 1) * sizeof *r.tokens);
                if (r.n_tokens) memcpy(j->tokens, r.tokens, r.n_tokens * sizeof *r.tokens);
                j->n_tokens = (int)r.n_tokens;
                snprintf(j->worker, sizeof j->worker, "%s", r.worker ? r.worker : "");
                have++;
            } else {
                t->duplicates++;
                if (j->ident != h) {
                    t->mismatches++;
                    fprintf(stderr, "e2e: duplicate result for %s differs from the first\n", r.id);
                }
            }
            j->n_results++;
            moeq_result_free(&r);
        }
        moeq_kafka_msg_destroy(m);
    }
    return have;
}

#endif
