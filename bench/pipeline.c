/*
 * bench/pipeline.c — the worker pipeline end to end on the tiny model:
 * batch entries in Redis (as the coordinator writes them) -> `moeq worker`
 * processes -> results on Kafka, read back here.
 *
 *   throughput: a backlog of jobs pre-filled in the streams, then 1 and 2
 *               workers started; jobs/s and generated tokens/s from the first
 *               worker start to the last result;
 *   shared prefix: every prompt starts with the same long instruction; one
 *               worker with prefix sharing off, then on (prefix_share_min);
 *   overhead:   one job at a time through one warm worker; end-to-end time
 *               (XADD -> result consumed) minus the engine time the result
 *               reports (prefill_ms + decode_ms), p50 and p99;
 *   shared_instruction: the document pipeline of issue 15 on the `small`
 *               preset (tiny's context is 256): every job is one 2,000-token
 *               instruction + a 100-400-token document (token ids in the
 *               batch entry, as the coordinator sends them), 64 new tokens,
 *               greedy; prefix cache off (prefix_cache=off,
 *               prefix_share_min=0) and on, one and two workers: jobs/s and
 *               prompt tokens prefilled per job (the workers' /metrics).
 *               --scale S multiplies the instruction and document lengths.
 *
 *   prefix_affinity: two workers with small caches, 6 instructions taking
 *               turns, a batch of 2 every --pace-ms (800): prompt tokens
 *               prefilled per job with prefix_affinity off and on.
 *
 *   kv_admission: shared_instruction's jobs on one worker whose KV cache
 *               (kv_cache_tokens 10,240) holds 4 of them whole: kv_admission
 *               whole (every job's length reserved) against shared (blocks
 *               that jobs share counted once), alternated --rounds times:
 *               jobs/s, the most jobs that ran at once, the ratio.
 *
 * Usage: bench-pipeline [--jobs N] [--moeq PATH] [--model DIR]
 *        [--workload all|shared_instruction|prefix_affinity|kv_admission] [--si-jobs N] [--scale S] [--si-model DIR]
 *        [--rounds R]
 *        [--pace-ms MS]. Prints JSON.
 *
 * Needs Kafka and Redis: MOEQ_TEST_KAFKA / MOEQ_TEST_REDIS, or the file named
 * by MOEQ_TEST_ENV_FILE (scripts/test-services.sh start DIR writes DIR/env).
 * Coordinator throughput has its own benchmark (bench/coordinator).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moeq/batch_entry.h"
#include "moeq/kafka.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/util.h"

static char g_kafka[128], g_redis[128], g_moeq[512] = "build/cli/moeq", g_model[512] = "build/bench-model";
static moeq_redis *g_rd;

static int env_get(const char *key, char *out, size_t size) {
    const char *v = getenv(key);
    if (v && *v) return snprintf(out, size, "%s", v), 0;
    const char *path = getenv("MOEQ_TEST_ENV_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return -1;
    char line[512];
    int rc = -1;
    while (rc && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)) && line[strlen(key)] == '=') {
            line[strcspn(line, "\r\n")] = 0;
            snprintf(out, size, "%s", line + strlen(key) + 1);
            rc = 0;
        }
    fclose(f);
    return rc;
}

static void die(const char *what, const char *err) {
    fprintf(stderr, "bench-pipeline: %s: %s\n", what, err);
    exit(1);
}

static void cmd(int argc, const char **argv, const size_t *lens) {
    char err[256];
    if (moeq_redis_command_argv(g_rd, argc, argv, lens, NULL, err, sizeof err)) die(argv[0], err);
}

typedef struct run {
    char ns[96], prefix[128], topic[96];
    moeq_kafka_consumer *consumer;
} run;

static void run_open(run *r, const char *tag) {
    char err[256];
    snprintf(r->ns, sizeof r->ns, "bench.%s.%d.%lld", tag, (int)getpid(), (long long)moeq_now_ms());
    snprintf(r->prefix, sizeof r->prefix, "%s:batches:p", r->ns);
    snprintf(r->topic, sizeof r->topic, "bench.%s.%d.%lld.results", tag, (int)getpid(), (long long)moeq_now_ms());
    for (int p = 0; p < 4; p++) {
        char s[256];
        snprintf(s, sizeof s, "%s%d", r->prefix, p);
        const char *a[] = {"XGROUP", "CREATE", s, "workers", "0", "MKSTREAM"};
        cmd(6, a, NULL);
    }
    moeq_kafka_producer *prod = NULL;
    moeq_kafka_producer_params pp = {.brokers = g_kafka};
    if (moeq_kafka_producer_new(&pp, NULL, &prod, err, sizeof err)) die("producer", err);
    moeq_kafka_out m = {.topic = r->topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .value = "init", .value_len = 4};
    moeq_kafka_produce(prod, &m, err, sizeof err);
    moeq_kafka_producer_flush(prod, 30000, err, sizeof err);
    moeq_kafka_producer_destroy(prod);
    char group[256];
    snprintf(group, sizeof group, "%s.g", r->topic);
    const char *topics[] = {r->topic};
    moeq_kafka_consumer_params cp = {.brokers = g_kafka, .group_id = group, .topics = topics, .n_topics = 1};
    if (moeq_kafka_consumer_new(&cp, NULL, &r->consumer, err, sizeof err)) die("consumer", err);
}

/* A long instruction shared by every prompt of the shared-prefix runs (~200 tokens on tiny). */
static const char SHARED_LEAD[] =
    "You are a careful analyst. Read the document below and answer in one sentence: what changed, by how much, "
    "and why. Quote numbers exactly, name the period they cover, and do not speculate beyond the text. If the "
    "document gives no reason, say so. Ignore formatting. Document: ";

static void add_batch_lead(run *r, int first, int n, const char *tag, const char *lead) {
    static char ids[64][64], json[64][1024];
    moeq_batch_entry_job bj[64];
    for (int i = 0; i < n; i++) {
        int k = first + i;
        snprintf(ids[i], sizeof ids[i], "%s-%d-%lld", tag, k, (long long)moeq_now_ms());
        snprintf(json[i], sizeof json[i],
                 "{\"v\":1,\"id\":\"%s\",\"prompt\":\"%sSummarise document %d: the quarterly report shows growth.\","
                 "\"max_new_tokens\":32,\"temperature\":0.7,\"seed\":%d}",
                 ids[i], lead, k, k);
        bj[i] = (moeq_batch_entry_job){.id = ids[i], .id_len = strlen(ids[i]), .job = json[i],
                                       .job_len = strlen(json[i]), .kafka_ts_ms = moeq_now_ms(),
                                       .arrival_ms = moeq_now_ms()};
    }
    moeq_buf blob = {0};
    if (moeq_batch_entry_encode_jobs(bj, (size_t)n, &blob)) die("encode", "batch");
    char s[256], nn[16], closed[24];
    snprintf(s, sizeof s, "%s2", r->prefix);
    snprintf(nn, sizeof nn, "%d", n);
    snprintf(closed, sizeof closed, "%lld", (long long)moeq_now_ms());
    const char *a[] = {"XADD", s, "*", "v", "1", "priority", "2", "n", nn, "prefix", "0", "closed_ms", closed, "jobs",
                       (const char *)blob.data};
    size_t lens[15];
    for (int i = 0; i < 14; i++) lens[i] = strlen(a[i]);
    lens[14] = blob.len;
    cmd(15, a, lens);
    moeq_buf_free(&blob);
}

static void add_batch(run *r, int first, int n, const char *tag) { add_batch_lead(r, first, n, tag, ""); }

static pid_t start_worker_args(const run *r, int k, const char *extra) {
    char c[2048];
    snprintf(c, sizeof c,
             "exec %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
             "--worker_id=bench-%d-%d --max_seqs=16 --max_step_tokens=256 --kv_cache_tokens=16384 --n_threads=1 "
             "--block_ms=20 --http_port=0 %s 2>/dev/null",
             g_moeq, g_model, g_redis, g_kafka, r->ns, r->topic, (int)getpid(), k, extra);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", c, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static pid_t start_worker(const run *r, int k) { return start_worker_args(r, k, ""); }

static void stop_workers(pid_t *pids, int n) {
    for (int i = 0; i < n; i++) kill(pids[i], SIGTERM);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
}

/* Consume up to want results; returns how many; sums tokens; optional per-result engine ms. */
static int consume(run *r, int want, int timeout_ms, long long *tokens, int64_t *engine_ms) {
    int got = 0;
    int64_t deadline = moeq_now_ms() + timeout_ms;
    while (got < want && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        char err[256];
        if (moeq_kafka_consumer_poll(r->consumer, 20, &m, err, sizeof err)) die("poll", err);
        if (!m) continue;
        size_t len;
        const void *v = moeq_kafka_msg_value(m, &len);
        moeq_result res;
        if (v && moeq_result_decode(v, len, NULL, 0, &res, err, sizeof err) == MOEQ_OK) {
            got++;
            if (tokens) *tokens += (long long)res.n_tokens;
            if (engine_ms) *engine_ms = res.timings.prefill_ms + res.timings.decode_ms;
            moeq_result_free(&res);
        }
        moeq_kafka_msg_destroy(m);
    }
    return got;
}

static void throughput(int n_workers, int n_jobs) {
    run r;
    run_open(&r, n_workers == 1 ? "t1" : "t2");
    for (int j = 0; j < n_jobs; j += 16) add_batch(&r, j, n_jobs - j < 16 ? n_jobs - j : 16, r.topic);
    pid_t pids[2];
    int64_t t0 = moeq_now_ms();
    for (int k = 0; k < n_workers; k++) pids[k] = start_worker(&r, k);
    long long tokens = 0;
    int got = consume(&r, n_jobs, 300000, &tokens, NULL);
    double s = (double)(moeq_now_ms() - t0) / 1000.0;
    stop_workers(pids, n_workers);
    printf("  \"workers_%d\": {\"jobs\": %d, \"results\": %d, \"seconds\": %.2f, \"jobs_per_s\": %.1f, "
           "\"tokens_per_s\": %.1f},\n",
           n_workers, n_jobs, got, s, got / s, (double)tokens / s);
    fflush(stdout);
    moeq_kafka_consumer_destroy(r.consumer);
}

/*
 * Every prompt starts with SHARED_LEAD: one worker with prefix sharing off and on (prefix_share_min 0 / 16),
 * jobs/s and the prompt tokens the worker did not prefill (its /metrics counter is not read here: the
 * difference in prefill work shows in the throughput).
 */
static void shared_prefix(int n_jobs, int share, int last) {
    run r;
    run_open(&r, share ? "s1" : "s0");
    for (int j = 0; j < n_jobs; j += 16) add_batch_lead(&r, j, n_jobs - j < 16 ? n_jobs - j : 16, r.topic, SHARED_LEAD);
    int64_t t0 = moeq_now_ms();
    pid_t pid = start_worker_args(&r, share ? 11 : 10, share ? "--prefix_share_min=16" : "--prefix_share_min=0");
    long long tokens = 0;
    int got = consume(&r, n_jobs, 300000, &tokens, NULL);
    double s = (double)(moeq_now_ms() - t0) / 1000.0;
    stop_workers(&pid, 1);
    printf("    \"%s\": {\"jobs\": %d, \"results\": %d, \"seconds\": %.2f, \"jobs_per_s\": %.1f}%s\n",
           share ? "sharing_on" : "sharing_off", n_jobs, got, s, got / s, last ? "" : ",");
    fflush(stdout);
    moeq_kafka_consumer_destroy(r.consumer);
}

/* ---- shared_instruction (issue 15) ------------------------------------------------- */

static char g_si_model[512] = "build/bench-model-small";

/* Job k's prompt: instruction `instr` (the same n_instr ids for every job with it), then its own n_doc ids. */
static int si_prompt(int32_t *ids, int k, int instr, int n_instr, int n_doc) {
    for (int i = 0; i < n_instr; i++) ids[i] = (int32_t)(10 + (i * 7919 + 13 + instr * 1000003) % 120000);
    for (int i = 0; i < n_doc; i++) ids[n_instr + i] = (int32_t)(10 + ((k + 1) * 104729 + i * 6007) % 120000);
    return n_instr + n_doc;
}

/* Jobs first .. first + n - 1 with instruction instr as one batch; pkey: write the prefix key field. */
static void si_add_batch_instr(run *r, int first, int n, double scale, int instr, int pkey) {
    static char ids[16][64], json[16][256];
    static int32_t toks[16][2100 * 4 + 400 * 4];
    moeq_batch_entry_job bj[16];
    int n_instr = (int)(2000 * scale);
    for (int i = 0; i < n; i++) {
        int k = first + i, n_doc = (int)((100 + (k * 37) % 301) * scale); /* 100..400 */
        if (n_instr < 1) n_instr = 1;
        if (n_doc < 1) n_doc = 1;
        int n_tok = si_prompt(toks[i], k, instr, n_instr, n_doc);
        snprintf(ids[i], sizeof ids[i], "si-%d-%lld", k, (long long)moeq_now_ms());
        snprintf(json[i], sizeof json[i],
                 "{\"v\":1,\"id\":\"%s\",\"prompt\":\"document %d\",\"max_new_tokens\":64,\"temperature\":0}", ids[i], k);
        bj[i] = (moeq_batch_entry_job){.id = ids[i], .id_len = strlen(ids[i]), .job = json[i],
                                       .job_len = strlen(json[i]), .kafka_ts_ms = moeq_now_ms(),
                                       .arrival_ms = moeq_now_ms(), .tokens = toks[i], .n_tokens = (size_t)n_tok};
    }
    moeq_buf blob = {0};
    if (moeq_batch_entry_encode_jobs(bj, (size_t)n, &blob)) die("encode", "batch");
    char st[256], nn[16], closed[24], pre[16];
    snprintf(st, sizeof st, "%s2", r->prefix);
    snprintf(nn, sizeof nn, "%d", n);
    snprintf(pre, sizeof pre, "%d", n_instr);
    snprintf(closed, sizeof closed, "%lld", (long long)moeq_now_ms());
    char key[24];
    snprintf(key, sizeof key, "%016llx", (unsigned long long)moeq_batch_entry_prefix_key(toks[0], (size_t)n_instr));
    const char *a[] = {"XADD", st, "*", "v", "1", "priority", "2", "n", nn, "prefix", pre, "closed_ms", closed, "jobs",
                       (const char *)blob.data, "pkey", key};
    size_t lens[17];
    for (int i = 0; i < 17; i++) lens[i] = strlen(a[i]);
    lens[14] = blob.len;
    cmd(pkey ? 17 : 15, a, lens);
    moeq_buf_free(&blob);
}

static void si_add_batch(run *r, int first, int n, double scale) { si_add_batch_instr(r, first, n, scale, 0, 1); }

/* The sample `name{worker=...}` of the worker's /metrics on port, or -1. */
static double metric_at(int port, const char *name) {
    char c[256], line[512];
    snprintf(c, sizeof c, "curl -s http://127.0.0.1:%d/metrics", port);
    FILE *f = popen(c, "r");
    double v = -1;
    if (!f) return -1;
    size_t n = strlen(name);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == '{') v = atof(strchr(line, '}') + 1);
    pclose(f);
    return v;
}

/* Wait until the worker on port answers /readyz with 200 (model loaded, Redis and Kafka reachable). */
static void wait_ready(int port) {
    char c[256];
    snprintf(c, sizeof c, "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/readyz | grep -q 200", port);
    for (int64_t deadline = moeq_now_ms() + 120000; moeq_now_ms() < deadline; usleep(50000))
        if (system(c) == 0) return;
    die("worker", "not ready within 120 s");
}

typedef struct si_result {
    double jobs_per_s, prefill_per_job, unused;
} si_result;

static si_result shared_instruction(int n_workers, int cache_on, int n_jobs, double scale, int last) {
    run r;
    char tag[16];
    snprintf(tag, sizeof tag, "si%d%d", n_workers, cache_on);
    run_open(&r, tag);
    pid_t pids[2];
    int ports[2];
    for (int k = 0; k < n_workers; k++) {
        char c[2048], extra[256];
        ports[k] = 31000 + (int)(getpid() % 500) * 8 + n_workers * 2 + k;
        snprintf(extra, sizeof extra, "%s --http_port=%d",
                 cache_on ? "--prefix_cache=on" : "--prefix_cache=off --prefix_share_min=0", ports[k]);
        snprintf(c, sizeof c,
                 "exec %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
                 "--worker_id=si-%d-%d --max_seqs=32 --max_batches_held=4 --max_step_tokens=1024 --kv_cache_tokens=131072 "
                 "--visibility_timeout_ms=600000 "
                 "--n_threads=1 "
                 "--block_ms=20 %s 2>/dev/null",
                 g_moeq, g_si_model, g_redis, g_kafka, r.ns, r.topic, (int)getpid(), k, extra);
        pids[k] = fork();
        if (pids[k] == 0) {
            execl("/bin/sh", "sh", "-c", c, (char *)NULL);
            _exit(127);
        }
    }
    for (int k = 0; k < n_workers; k++) wait_ready(ports[k]); /* timed from the first batch, not the model load */
    int64_t t0 = moeq_now_ms();
    for (int j = 0; j < n_jobs; j += 8) si_add_batch(&r, j, n_jobs - j < 8 ? n_jobs - j : 8, scale);
    long long tokens = 0;
    int got = consume(&r, n_jobs, 900000, &tokens, NULL);
    double secs = (double)(moeq_now_ms() - t0) / 1000.0, prefill = 0, hit = 0, forked = 0;
    for (int k = 0; k < n_workers; k++) {
        prefill += metric_at(ports[k], "moeq_worker_prefill_tokens_total");
        hit += metric_at(ports[k], "moeq_worker_prefix_cache_hit_tokens_total");
        forked += metric_at(ports[k], "moeq_worker_prefix_tokens_shared_total");
    }
    stop_workers(pids, n_workers);
    si_result out = {got / secs, got ? prefill / got : 0, 0};
    printf("    \"workers_%d_cache_%s\": {\"jobs\": %d, \"results\": %d, \"seconds\": %.2f, \"jobs_per_s\": %.2f, "
           "\"tokens_per_s\": %.1f, \"prefill_tokens_per_job\": %.1f, \"cache_hit_tokens_per_job\": %.1f, "
           "\"forked_tokens_per_job\": %.1f}%s\n",
           n_workers, cache_on ? "on" : "off", n_jobs, got, secs, out.jobs_per_s, (double)tokens / secs,
           out.prefill_per_job, got ? hit / got : 0, got ? forked / got : 0, last ? "" : ",");
    fflush(stdout);
    moeq_kafka_consumer_destroy(r.consumer);
    return out;
}

/* The `small` preset the shared-instruction workloads run on (tiny's context is 256), written once. */
static void si_model_ready(void) {
    char c[2048];
    snprintf(c, sizeof c, "test -f %s/config.json || %s gen-model --preset small --out %s >/dev/null", g_si_model,
             g_moeq, g_si_model);
    if (system(c) != 0) die("gen-model", g_si_model);
}

/* kv_admission: one worker, a cache of 10,240 tokens, the shared-instruction jobs, admission mode `mode`. */
static si_result kv_admission_run(const char *mode, int n_jobs, double scale, int round, int *most) {
    run r;
    char tag[16];
    snprintf(tag, sizeof tag, "kv%c%d", mode[0], round);
    run_open(&r, tag);
    int port = 31000 + (int)(getpid() % 500) * 8 + 7;
    char c[2048];
    snprintf(c, sizeof c,
             "exec %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
             "--worker_id=kv-%d --max_seqs=32 --max_batches_held=8 --max_step_tokens=1024 --kv_cache_tokens=10240 "
             "--kv_admission=%s --visibility_timeout_ms=600000 --n_threads=1 --block_ms=20 --http_port=%d 2>/dev/null",
             g_moeq, g_si_model, g_redis, g_kafka, r.ns, r.topic, (int)getpid(), mode, port);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", c, (char *)NULL);
        _exit(127);
    }
    wait_ready(port);
    int64_t t0 = moeq_now_ms();
    for (int j = 0; j < n_jobs; j += 8) si_add_batch(&r, j, n_jobs - j < 8 ? n_jobs - j : 8, scale);
    long long tokens = 0;
    int got = consume(&r, n_jobs, 900000, &tokens, NULL);
    double secs = (double)(moeq_now_ms() - t0) / 1000.0;
    *most = (int)metric_at(port, "moeq_worker_requests_running_max");
    stop_workers(&pid, 1);
    moeq_kafka_consumer_destroy(r.consumer);
    if (got < n_jobs) die("kv_admission", "results missing");
    return (si_result){got / secs, 0, 0};
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void kv_admission_all(int n_jobs, double scale, int rounds) {
    si_model_ready();
    printf("  \"kv_admission\": {\"model\": \"small\", \"instruction_tokens\": %d, \"document_tokens\": [%d, %d], "
           "\"max_new_tokens\": 64, \"kv_cache_tokens\": 10240, \"max_seqs\": 32, \"jobs\": %d, \"rounds\": [\n",
           (int)(2000 * scale), (int)(100 * scale), (int)(400 * scale), n_jobs);
    double ratio[16];
    for (int k = 0; k < rounds && k < 16; k++) { /* alternated, the order swapped each round */
        int most_w = 0, most_s = 0;
        si_result w, s;
        if (k % 2 == 0) {
            w = kv_admission_run("whole", n_jobs, scale, k, &most_w);
            s = kv_admission_run("shared", n_jobs, scale, k, &most_s);
        } else {
            s = kv_admission_run("shared", n_jobs, scale, k, &most_s);
            w = kv_admission_run("whole", n_jobs, scale, k, &most_w);
        }
        ratio[k] = s.jobs_per_s / w.jobs_per_s;
        printf("    {\"whole\": {\"jobs_per_s\": %.3f, \"running_max\": %d}, \"shared\": {\"jobs_per_s\": %.3f, "
               "\"running_max\": %d}, \"shared_vs_whole\": %.3f}%s\n",
               w.jobs_per_s, most_w, s.jobs_per_s, most_s, ratio[k], k + 1 < rounds && k + 1 < 16 ? "," : "");
        fflush(stdout);
    }
    int n = rounds < 16 ? rounds : 16;
    qsort(ratio, (size_t)n, sizeof *ratio, cmp_double);
    printf("  ], \"shared_vs_whole_median\": %.3f}", n % 2 ? ratio[n / 2] : (ratio[n / 2 - 1] + ratio[n / 2]) / 2);
}

/*
 * prefix_affinity: two workers whose caches hold about 3 instructions each besides their running jobs
 * (kv_cache_tokens 16384 = 1,024 blocks, 4 sequences of ~154 blocks running), 6 instructions taking turns
 * batch by batch, a batch of 2 every pace_ms (so a holder has room: affinity never idles one worker to use
 * the other's cache). Without affinity each worker sees all 6 and its LRU cycles them out; with it each
 * instruction tends to stay on one worker, 3 each: they fit.
 */
enum { AF_INSTR = 6, AF_BATCH = 2 };
static void affinity_run(int on, int n_batches, double scale, int pace_ms, int last) {
    run r;
    run_open(&r, on ? "af1" : "af0");
    pid_t pids[2];
    int ports[2];
    for (int k = 0; k < 2; k++) {
        char c[2048];
        ports[k] = 31000 + (int)(getpid() % 500) * 8 + 6 + k;
        snprintf(c, sizeof c,
                 "exec %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
                 "--worker_id=af-%d-%d --max_seqs=4 --max_batches_held=4 --max_step_tokens=1024 --kv_cache_tokens=16384 "
                 "--visibility_timeout_ms=600000 --heartbeat_interval_ms=250 --n_threads=1 --block_ms=20 "
                 "--prefix_cache=on --prefix_affinity=%s --http_port=%d 2>/dev/null",
                 g_moeq, g_si_model, g_redis, g_kafka, r.ns, r.topic, (int)getpid(), k, on ? "on" : "off", ports[k]);
        pids[k] = fork();
        if (pids[k] == 0) {
            execl("/bin/sh", "sh", "-c", c, (char *)NULL);
            _exit(127);
        }
    }
    for (int k = 0; k < 2; k++) wait_ready(ports[k]);
    int64_t t0 = moeq_now_ms();
    long long tokens = 0;
    int got = 0;
    for (int b = 0; b < n_batches; b++) {
        si_add_batch_instr(&r, AF_BATCH * b, AF_BATCH, scale, b % AF_INSTR, 1);
        got += consume(&r, AF_BATCH * n_batches - got, pace_ms, &tokens, NULL); /* the pause between batches */
    }
    got += consume(&r, AF_BATCH * n_batches - got, 900000, &tokens, NULL);
    double secs = (double)(moeq_now_ms() - t0) / 1000.0, prefill = 0, hit = 0, forked = 0, handed = 0;
    for (int k = 0; k < 2; k++) {
        prefill += metric_at(ports[k], "moeq_worker_prefill_tokens_total");
        hit += metric_at(ports[k], "moeq_worker_prefix_cache_hit_tokens_total");
        forked += metric_at(ports[k], "moeq_worker_prefix_tokens_shared_total");
        handed += metric_at(ports[k], "moeq_worker_affinity_handed_total");
    }
    stop_workers(pids, 2);
    printf("    \"affinity_%s\": {\"jobs\": %d, \"results\": %d, \"seconds\": %.2f, \"prefill_tokens_per_job\": %.1f, "
           "\"cache_hit_tokens_per_job\": %.1f, \"forked_tokens_per_job\": %.1f, \"batches_handed\": %.0f}%s\n",
           on ? "on" : "off", AF_BATCH * n_batches, got, secs, got ? prefill / got : 0, got ? hit / got : 0,
           got ? forked / got : 0, handed, last ? "" : ",");
    fflush(stdout);
    moeq_kafka_consumer_destroy(r.consumer);
}

static void affinity_all(int n_batches, double scale, int pace_ms) {
    printf("  \"prefix_affinity\": {\"model\": \"small\", \"instructions\": %d, \"instruction_tokens\": %d, "
           "\"batch_jobs\": %d, \"pace_ms\": %d, \"workers\": 2, \"max_seqs\": 4, \"kv_cache_tokens\": 16384,\n",
           AF_INSTR, (int)(2000 * scale), AF_BATCH, pace_ms);
    affinity_run(0, n_batches, scale, pace_ms, 0);
    affinity_run(1, n_batches, scale, pace_ms, 1);
    printf("  }");
}

static void shared_instruction_all(int n_jobs, double scale) {
    si_model_ready();
    printf("  \"shared_instruction\": {\"model\": \"small\", \"instruction_tokens\": %d, \"document_tokens\": "
           "[%d, %d], \"max_new_tokens\": 64, \"scale\": %.3f, \"max_seqs\": 32, \"n_threads_per_worker\": 1,\n",
           (int)(2000 * scale), (int)(100 * scale), (int)(400 * scale), scale);
    si_result off1 = shared_instruction(1, 0, n_jobs, scale, 0), on1 = shared_instruction(1, 1, n_jobs, scale, 0);
    si_result off2 = shared_instruction(2, 0, n_jobs, scale, 0), on2 = shared_instruction(2, 1, n_jobs, scale, 0);
    printf("    \"ratios\": {\"cache_on_vs_off_1_worker\": %.2f, \"cache_on_vs_off_2_workers\": %.2f, "
           "\"two_workers_vs_one_cache_on\": %.2f, \"two_workers_vs_one_cache_off\": %.2f}\n  }",
           on1.jobs_per_s / off1.jobs_per_s, on2.jobs_per_s / off2.jobs_per_s, on2.jobs_per_s / on1.jobs_per_s,
           off2.jobs_per_s / off1.jobs_per_s);
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void overhead(int n) {
    run r;
    run_open(&r, "o1");
    pid_t pid = start_worker(&r, 9);
    add_batch(&r, 0, 1, "warm");
    consume(&r, 1, 60000, NULL, NULL); /* model loaded, group joined */
    int64_t *over = calloc((size_t)n, sizeof *over);
    int m = 0;
    for (int i = 0; i < n; i++) {
        int64_t t0 = moeq_now_ms(), engine = 0;
        add_batch(&r, i + 1, 1, "o");
        if (consume(&r, 1, 30000, NULL, &engine) != 1) break;
        over[m++] = moeq_now_ms() - t0 - engine;
    }
    stop_workers(&pid, 1);
    qsort(over, (size_t)m, sizeof *over, cmp64);
    printf("  \"overhead_ms\": {\"jobs\": %d, \"p50\": %lld, \"p99\": %lld, \"max\": %lld}\n", m,
           m ? (long long)over[m / 2] : -1, m ? (long long)over[(m * 99) / 100 < m ? (m * 99) / 100 : m - 1] : -1,
           m ? (long long)over[m - 1] : -1);
    free(over);
    moeq_kafka_consumer_destroy(r.consumer);
}

int main(int argc, char **argv) {
    int n_jobs = 256, si_jobs = 64, pace_ms = 800, rounds = 1;
    double scale = 1.0;
    const char *workload = "all";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--jobs")) n_jobs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--workload")) workload = argv[i + 1];
        else if (!strcmp(argv[i], "--si-jobs")) si_jobs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--scale")) scale = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--pace-ms")) pace_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--si-model")) snprintf(g_si_model, sizeof g_si_model, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--moeq")) snprintf(g_moeq, sizeof g_moeq, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--model")) snprintf(g_model, sizeof g_model, "%s", argv[i + 1]);
    }
    if (env_get("MOEQ_TEST_KAFKA", g_kafka, sizeof g_kafka) || env_get("MOEQ_TEST_REDIS", g_redis, sizeof g_redis))
        die("services", "set MOEQ_TEST_KAFKA/MOEQ_TEST_REDIS or MOEQ_TEST_ENV_FILE (scripts/test-services.sh start DIR)");
    char c[2048];
    snprintf(c, sizeof c, "test -f %s/config.json || %s gen-model --preset tiny --out %s >/dev/null", g_model, g_moeq,
             g_model);
    if (system(c) != 0) die("gen-model", g_model);
    moeq_redis_params rp;
    char err[256];
    if (moeq_redis_params_parse(g_redis, NULL, &rp, err, sizeof err) || moeq_redis_new(&rp, &g_rd, err, sizeof err))
        die("redis", err);
    if (scale <= 0 || scale > 4 || si_jobs < 1) die("arguments", "--scale in (0, 4], --si-jobs >= 1");
    if (rounds < 1) die("arguments", "--rounds >= 1");
    if (!strcmp(workload, "shared_instruction") || !strcmp(workload, "prefix_affinity") ||
        !strcmp(workload, "kv_admission")) {
        printf("{\n");
        if (workload[0] == 's') shared_instruction_all(si_jobs, scale);
        else if (workload[0] == 'k') kv_admission_all(si_jobs, scale, rounds);
        else affinity_all(si_jobs / AF_BATCH > 0 ? si_jobs / AF_BATCH : 1, scale, pace_ms);
        printf("\n}\n");
        moeq_redis_destroy(g_rd);
        return 0;
    }
    if (strcmp(workload, "all")) die("--workload", "all, shared_instruction, prefix_affinity or kv_admission");
    printf("{\n  \"model\": \"tiny\", \"max_new_tokens\": 32, \"max_seqs\": 16, \"n_threads_per_worker\": 1,\n");
    throughput(1, n_jobs);
    throughput(2, n_jobs);
    printf("  \"shared_prefix\": {\"lead_chars\": %zu,\n", sizeof SHARED_LEAD - 1);
    shared_prefix(n_jobs, 0, 0);
    shared_prefix(n_jobs, 1, 1);
    printf("  },\n");
    overhead(100);
    printf(",\n");
    shared_instruction_all(si_jobs, scale);
    printf(",\n");
    affinity_all(si_jobs / AF_BATCH > 0 ? si_jobs / AF_BATCH : 1, scale, pace_ms);
    printf("\n}\n");
    moeq_redis_destroy(g_rd);
    return 0;
}
