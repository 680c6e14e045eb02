/*
 * bench/coordinator.c — coordinator throughput: jobs/s from a pre-filled
 * topic to batches durably in Redis, with the prompts tokenized (DeepSeek-V3
 * tokenizer when available, else the tiny one) and with tokenization
 * excluded (no `model`: lengths estimated), plus CPU time per job. Prints
 * one JSON object per mode.
 *
 *   bench-coordinator [--kafka HOST:PORT] [--redis HOST:PORT] [--jobs N]
 *                     [--mode tokenized|excluded|both] [--prompt-bytes B]
 *
 * Brokers default to $MOEQ_TEST_KAFKA / $MOEQ_TEST_REDIS (e.g. from
 * scripts/test-services.sh start DIR; see DIR/env). The coordinator runs
 * in-process on one thread (librdkafka's own threads come on top: reported
 * separately as process CPU). Redis durability is whatever the server runs
 * (the test server: appendfsync always).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coordinator.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"

static const char *const words[] = {
    "the", "model", "reads", "a", "long", "document", "about", "distributed", "systems", "and", "writes", "summary",
    "of", "its", "main", "points", "queue", "batch", "worker", "latency", "throughput", "tokens", "expert", "mixture",
    "Kafka", "Redis", "stream", "offset", "commit", "partition", "consumer", "group", "durable", "never", "lost",
    "Please", "summarise", "following", "text", "in", "three", "sentences:", "with", "care,", "precision."};

static size_t make_prompt(char *out, size_t target, uint64_t *rng) {
    size_t o = 0;
    while (o + 16 < target) {
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        const char *w = words[*rng % (sizeof(words) / sizeof(words[0]))];
        o += (size_t)snprintf(out + o, target - o, "%s%s", o ? " " : "", w);
    }
    return o;
}

static int prefill(const char *kafka, const char *topic, int n, size_t prompt_bytes, char *err, size_t errn) {
    moeq_kafka_producer_params pp = {.brokers = kafka, .client_id = "bench-coordinator"};
    moeq_kafka_producer *p = NULL;
    if (moeq_kafka_producer_new(&pp, NULL, &p, err, errn)) return -1;
    uint64_t rng = 88172645463325252ULL;
    char *prompt = malloc(2 * prompt_bytes + 64), *job = malloc(2 * prompt_bytes + 256), key[32];
    for (int i = 0; i < n; i++) {
        size_t target = prompt_bytes - prompt_bytes / 10 + (size_t)(rng % (prompt_bytes / 5 + 1));
        make_prompt(prompt, target, &rng);
        int len = snprintf(job, 2 * prompt_bytes + 256, "{\"v\":1,\"id\":\"bench-%d\",\"priority\":%d,\"max_new_tokens\":128,\"prompt\":\"%s\"}",
                           i, (int)(rng % 4), prompt);
        snprintf(key, sizeof key, "bench-%d", i);
        moeq_kafka_out m = {.topic = topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = key, .key_len = strlen(key),
                            .value = job, .value_len = (size_t)len};
        moeq_err e;
        while ((e = moeq_kafka_produce(p, &m, err, errn)) == MOEQ_ERR_TRANSIENT) moeq_kafka_producer_poll(p, 10);
        if (e) break;
    }
    int rc = moeq_kafka_producer_flush(p, 120000, err, errn) ? -1 : 0;
    moeq_kafka_producer_destroy(p);
    free(prompt);
    free(job);
    return rc;
}

typedef struct runner {
    moeq_coordinator *coord;
    volatile sig_atomic_t stop;
    double cpu_s;
    moeq_err err;
} runner;

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double process_cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static void *run_thread(void *arg) {
    runner *r = arg;
    char err[256];
    double t0 = thread_cpu();
    r->err = moeq_coordinator_run(r->coord, &r->stop, err, sizeof err);
    r->cpu_s = thread_cpu() - t0;
    return NULL;
}

static int bench_mode(const char *kafka, const char *redis, const char *mode, const char *model_dir, int n,
                      size_t prompt_bytes) {
    char err[512], topic[128], group[128], prefix[64];
    long tag = (long)(moeq_now_ms() % 100000000);
    snprintf(topic, sizeof topic, "bench.%s.%ld.jobs", mode, tag);
    snprintf(group, sizeof group, "bench.%s.%ld", mode, tag);
    snprintf(prefix, sizeof prefix, "bench%s%ld", mode, tag);
    if (prefill(kafka, topic, n, prompt_bytes, err, sizeof err)) {
        fprintf(stderr, "bench-coordinator: prefill: %s\n", err);
        return 1;
    }
    moeq_coordinator_params p = moeq_coordinator_default_params();
    snprintf(p.kafka_brokers, sizeof p.kafka_brokers, "%s", kafka);
    snprintf(p.redis_url, sizeof p.redis_url, "%s", redis);
    snprintf(p.job_topics, sizeof p.job_topics, "%s", topic);
    snprintf(p.group_id, sizeof p.group_id, "%s", group);
    snprintf(p.redis_prefix, sizeof p.redis_prefix, "%s", prefix);
    snprintf(p.cancel_topic, sizeof p.cancel_topic, "%s", "");
    snprintf(p.model, sizeof p.model, "%s", model_dir ? model_dir : "");
    p.http_port = -1; /* no endpoint: the bench measures the loop */
    p.max_pending_batches = 100000000;
    p.resume_pending_batches = 0;
    moeq_coordinator *c = NULL;
    if (moeq_coordinator_new(&p, NULL, NULL, &c, err, sizeof err)) {
        fprintf(stderr, "bench-coordinator: %s\n", err);
        return 1;
    }
    runner r = {.coord = c};
    pthread_t th;
    double pcpu0 = process_cpu();
    pthread_create(&th, NULL, run_thread, &r);
    moeq_coord_stats st;
    int64_t t_first = 0, t_end = 0, deadline = moeq_now_ms() + 600000;
    for (;;) {
        moeq_coordinator_stats(c, &st);
        int64_t now = moeq_now_ms();
        if (!t_first && st.jobs_consumed > 0) t_first = now;
        if (st.batch_jobs >= n) { t_end = now; break; }
        if (now > deadline) break;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    double pcpu = process_cpu() - pcpu0;
    r.stop = 1;
    pthread_join(th, NULL);
    moeq_coordinator_stats(c, &st);
    double wall = t_end && t_first ? (double)(t_end - t_first) / 1000.0 : 0;
    int64_t batches = 0;
    for (int i = 0; i < MOEQ_BATCHER_CLASSES; i++) batches += st.batches_written[i];
    printf("{\"bench\":\"coordinator\",\"mode\":\"%s\",\"tokenizer\":\"%s\",\"jobs\":%d,\"prompt_bytes\":%zu,"
           "\"complete\":%s,\"wall_s\":%.3f,\"jobs_per_s\":%.0f,\"loop_cpu_us_per_job\":%.1f,"
           "\"process_cpu_us_per_job\":%.1f,\"batches\":%lld,\"fill_ratio\":%.3f,\"prompt_tokens_per_job\":%.1f,"
           "\"queue_wait_ms_mean\":%.1f}\n",
           mode, model_dir ? "exact (model tokenizer)" : "none (estimated lengths)", n, prompt_bytes, t_end ? "true" : "false", wall,
           wall > 0 ? n / wall : 0.0, r.cpu_s * 1e6 / n, pcpu * 1e6 / n, (long long)batches,
           st.batch_job_slots ? (double)st.batch_jobs / (double)st.batch_job_slots : 0.0,
           st.batch_jobs ? (double)st.batch_prompt_tokens / (double)st.batch_jobs : 0.0,
           st.queue_wait_count ? (double)st.queue_wait_ms_sum / (double)st.queue_wait_count : 0.0);
    fflush(stdout);
    moeq_coordinator_destroy(c);
    return t_end ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *kafka = getenv("MOEQ_TEST_KAFKA"), *redis = getenv("MOEQ_TEST_REDIS"), *mode = "both";
    int n = 20000;
    size_t prompt_bytes = 1024;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kafka")) kafka = argv[i + 1];
        else if (!strcmp(argv[i], "--redis")) redis = argv[i + 1];
        else if (!strcmp(argv[i], "--jobs")) n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt-bytes")) prompt_bytes = (size_t)atol(argv[i + 1]);
    }
    if (!kafka || !redis || n < 1 || prompt_bytes < 64) {
        fprintf(stderr, "usage: bench-coordinator --kafka HOST:PORT --redis HOST:PORT [--jobs N] [--mode tokenized|excluded|both]\n"
                        "(or MOEQ_TEST_KAFKA / MOEQ_TEST_REDIS; scripts/test-services.sh start DIR writes them to DIR/env)\n");
        return 2;
    }
    moeq_log_set_level(MOEQ_LOG_WARN);
    int rc = 0;
    if (!strcmp(mode, "both") || !strcmp(mode, "excluded")) rc |= bench_mode(kafka, redis, "excluded", NULL, n, prompt_bytes);
    if (!strcmp(mode, "both") || !strcmp(mode, "tokenized")) {
        char dir[] = "/tmp/moeq-bench-tokenizer-XXXXXX", err[512];
        if (!mkdtemp(dir)) return 1;
        const char *which = "deepseek_v3";
        if (moeq_tokenizer_export(dir, 129280, err, sizeof err)) { /* no DeepSeek files: the tiny tokenizer */
            which = "tiny";
            if (moeq_tokenizer_export(dir, 1024, err, sizeof err)) {
                fprintf(stderr, "bench-coordinator: %s\n", err);
                return 1;
            }
        }
        fprintf(stderr, "bench-coordinator: tokenizer %s\n", which);
        rc |= bench_mode(kafka, redis, "tokenized", dir, n, prompt_bytes);
        char path[128];
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        unlink(path);
        rmdir(dir);
    }
    return rc;
}
