/*
 * test_worker_pipeline.c — the worker against a real Redis and Kafka and the
 * tiny model: batch entries are written to the streams as the coordinator
 * writes them (moeq/batch_entry.h), `moeq worker` processes run them,
 * results are read back from Kafka and compared with moeq_generate for each
 * job alone (same tokens, same seed).
 *
 *  - every job gets exactly the result generate gives, and the batch is
 *    acknowledged with its job records marked done;
 *  - a batch left pending by a dead consumer (and a worker killed with -9
 *    mid-batch) is reclaimed; every job gets a result, duplicates identical;
 *  - a batch delivered more than max_deliveries times is dead-lettered with
 *    error results;
 *  - SIGTERM drains: the worker exits 0 and nothing is lost.
 *
 * Needs the `services` fixture (skips with 77 without it).
 *
 * `test_worker_pipeline --backend cuda` (ctest test_worker_pipeline_on_cuda, label gpu): the workers run with
 * backend = cuda and the expectations come from generate on a CUDA engine in this process (batch invariance:
 * a job's tokens do not depend on the worker's batch-mates, on either backend); the first cases (results,
 * reclaim after a kill -9, SIGTERM drain) only. Without a device it prints the engine's reason and skips (77)
 * before it looks for the services. `--backend cpu-device` (ctest test_worker_pipeline_on_the_device_contract,
 * every machine): the same cases with the CPU behind a GPU's contract, so the worker's device paths (logits
 * records, rows downloaded only for the readers that need them) run end to end here too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "metrics_lint.h"
#include "moeq/batch_entry.h"
#include "moeq/engine.h"
#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"
#include "services_env.h"
#include "worker_test_util.h"

static char g_kafka[128], g_redis[128], g_model[512], g_moeq[512];
/* Workers started by this test, by id: their pid (0 once reaped) and where their log stood when they started. */
static struct {
    char id[32];
    pid_t pid;
    long log_from;
} g_started[64];
static int g_n_started;
static moeq_model *g_mdl;
static moeq_tokenizer *g_tok;
static moeq_engine *g_engine;
static const char *g_backend = "cpu"; /* --backend cuda: workers and expectations on the device */

#define MAX_JOBS 64
static int g_long_new = 400; /* max_new_tokens of make_jobs' long jobs */

typedef struct tjob {
    char id[192];
    char json[768];
    int32_t tokens[256];
    int n_tokens;
    int max_new, with_tokens;
    double temperature;
    uint64_t seed;
    int32_t expect[512];
    int n_expect;
    int n_results;
    char first[8192]; /* first result as JSON, duplicates must equal it modulo timings */
    char status[16], error_code[32];
    int32_t got[512];
    int n_got;
    size_t text_len;
    int n_result_tokens; /* of the first result, unclamped */
    char finish[16];
    char worker[64];     /* of the first result */
} tjob;

typedef struct scenario {
    char ns[128], prefix[160], results[160], group[160]; /* ns = the worker's redis_prefix */
    tjob jobs[MAX_JOBS];
    int n_jobs;
    moeq_redis *redis;
    moeq_kafka_consumer *consumer;
    int duplicates;
} scenario;

/* ---- set-up -------------------------------------------------------------------- */

static int run_cmd(const char *cmd) { return system(cmd) == 0 ? 0 : -1; }

static int group_setup(void **state) {
    (void)state;
    const char *build = getenv("MOEQ_BUILD_DIR");
    snprintf(g_moeq, sizeof g_moeq, "%s/cli/moeq", build ? build : ".");
    /* the tiny model with a context for the long jobs (400, 3000 tokens): the engine refuses past it */
    snprintf(g_model, sizeof g_model, "%s/test-worker-model-long", build ? build : "/tmp");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "test -f %s/config.json || %s gen-model --preset tiny --max-position-embeddings 8192 --out %s >/dev/null",
             g_model, g_moeq, g_model);
    if (run_cmd(cmd)) return -1;
    char err[512];
    if (moeq_model_load(g_model, NULL, &g_mdl, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    if (moeq_tokenizer_load(g_model, &g_tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    moeq_engine_params p = moeq_engine_default_params();
    snprintf(p.backend, sizeof p.backend, "%s", g_backend);
    p.max_seqs = 1;
    p.n_threads = 1;
    p.kv_cache_tokens = 4096;
    p.max_step_tokens = 512;
    if (moeq_engine_new(g_mdl, &p, &g_engine, err, sizeof err)) {
        if (strstr(err, "no usable CUDA device")) {
            printf("SKIP test_worker_pipeline --backend %s: %s\n", g_backend, err);
            exit(MOEQ_TEST_SKIP);
        }
        return fprintf(stderr, "%s\n", err), -1;
    }
    if (moeq_test_service("MOEQ_TEST_KAFKA", g_kafka, sizeof g_kafka) ||
        moeq_test_service("MOEQ_TEST_REDIS", g_redis, sizeof g_redis))
        exit(MOEQ_TEST_SKIP);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    for (int i = 0; i < g_n_started; i++) /* workers of a failed test (already reaped ones: ESRCH) */
        if (g_started[i].pid > 0 && kill(g_started[i].pid, SIGKILL) == 0) waitpid(g_started[i].pid, NULL, 0);
    moeq_engine_destroy(g_engine);
    moeq_tokenizer_destroy(g_tok);
    moeq_model_destroy(g_mdl);
    return 0;
}

/* Jobs with varied prompts, lengths and sampling; expectations from generate alone. */
/* Jobs from long_from on generate 400 tokens (slow enough to be killed mid-batch); -1: none. */
static void make_jobs(scenario *s, int n, const char *tag_in, int long_from) {
    char tag[512];
    snprintf(tag, sizeof tag, "%s.%s", tag_in, s->prefix); /* ids unique per run: records outlive runs */
    char *colon = strchr(tag, ':');
    if (colon) *colon = 0;
    static const char *docs[] = {"The quick brown fox jumps over the lazy dog.", "Summarise: sales rose 4% in May.",
                                 "Translate to French: good morning", "List three prime numbers.",
                                 "Kafka stores records in partitions; Redis streams hold entries."};
    s->n_jobs = n;
    for (int i = 0; i < n; i++) {
        tjob *j = &s->jobs[i];
        memset(j, 0, sizeof *j);
        snprintf(j->id, sizeof j->id, "%.150s-%d", tag, i);
        j->max_new = long_from >= 0 && i >= long_from ? g_long_new : 4 + (i * 7) % 20;
        j->temperature = i % 3 == 0 ? 0.0 : 0.9;
        j->seed = 1000 + (uint64_t)i;
        j->with_tokens = i % 5 != 4; /* some jobs come without ids: the worker tokenizes */
        char prompt[256];
        snprintf(prompt, sizeof prompt, "%s (%d)", docs[i % 5], i);
        snprintf(j->json, sizeof j->json,
                 "{\"v\":1,\"id\":\"%s\",\"prompt\":\"%s\",\"max_new_tokens\":%d,\"temperature\":%.1f,\"seed\":%llu}",
                 j->id, prompt, j->max_new, j->temperature, (unsigned long long)j->seed);
        moeq_tokens t = {0};
        char err[256];
        unsigned flags = moeq_tokenizer_add_bos(g_tok) ? MOEQ_TOKENIZE_ADD_BOS : 0;
        assert_int_equal(moeq_tokenizer_encode(g_tok, prompt, strlen(prompt), flags, &t, err, sizeof err), MOEQ_OK);
        assert_true(t.n < 256);
        memcpy(j->tokens, t.ids, t.n * sizeof *t.ids);
        j->n_tokens = (int)t.n;
        moeq_tokens_free(&t);
        int32_t eos = moeq_tokenizer_eos_id(g_tok);
        moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = j->max_new,
                                   .stop_ids = &eos, .n_stop_ids = eos >= 0};
        gp.sampling.temperature = j->temperature;
        gp.sampling.seed = j->seed;
        int32_t *out = NULL;
        int n_out = 0;
        assert_int_equal(moeq_generate(g_engine, j->tokens, j->n_tokens, &gp, &out, &n_out, err, sizeof err), MOEQ_OK);
        memcpy(j->expect, out, (size_t)(n_out < 512 ? n_out : 512) * sizeof *out); /* long jobs: the first 512 */
        j->n_expect = n_out;
        free(out);
    }
}

static void scenario_open(scenario *s, const char *tag) {
    char name[96];
    moeq_test_unique_name(name, sizeof name, tag);
    snprintf(s->ns, sizeof s->ns, "%s", name);
    snprintf(s->prefix, sizeof s->prefix, "%s:batches:p", name);
    snprintf(s->results, sizeof s->results, "%s.results", name);
    snprintf(s->group, sizeof s->group, "%s.g", name);
    s->redis = wt_open_streams(g_redis, s->prefix);
    /* joined before any result, so results are seen as they come (the kill tests time on them) */
    s->consumer = wt_results_consumer(g_kafka, s->results, s->group);
}

static void scenario_close(scenario *s) {
    moeq_kafka_consumer_destroy(s->consumer);
    moeq_redis_destroy(s->redis);
}

/* XADD jobs[from..to) as one batch entry on priority p; returns the entry id in id_out. */
static void add_batch(scenario *s, int p, int from, int to, char *id_out, size_t id_size) {
    moeq_batch_entry_job bj[MAX_JOBS];
    for (int i = from; i < to; i++) {
        tjob *j = &s->jobs[i];
        bj[i - from] = (moeq_batch_entry_job){.id = j->id, .id_len = strlen(j->id), .content_type = "application/json",
                                              .content_type_len = 16, .job = j->json, .job_len = strlen(j->json),
                                              .kafka_ts_ms = moeq_now_ms(), .arrival_ms = moeq_now_ms(),
                                              .tokens = j->with_tokens ? j->tokens : NULL,
                                              .n_tokens = j->with_tokens ? (size_t)j->n_tokens : 0};
    }
    wt_add_batch(s->redis, s->prefix, p, bj, (size_t)(to - from), id_out, id_size);
}

static void worker_log_path(const char *id, char *path, size_t size) {
    snprintf(path, size, "%s/worker-%s.log", getenv("MOEQ_BUILD_DIR") ? getenv("MOEQ_BUILD_DIR") : "/tmp", id);
}

static int started_index(const char *id) {
    for (int i = g_n_started - 1; i >= 0; i--)
        if (!strcmp(g_started[i].id, id)) return i;
    return -1;
}

/* What this run of worker id has logged so far (the log is appended to across runs), NUL-terminated, or "". */
static void worker_log_since_start(const char *id, char *out, size_t cap) {
    char path[512];
    worker_log_path(id, path, sizeof path);
    int i = started_index(id);
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    if (i >= 0) fseek(f, g_started[i].log_from, SEEK_SET);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
}

static pid_t start_worker(const scenario *s, const char *id, const char *extra) {
    char cmd[4096], log[512];
    worker_log_path(id, log, sizeof log);
    snprintf(cmd, sizeof cmd,
             "exec %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
             "--worker_id=%s --max_seqs=4 --max_step_tokens=64 --kv_cache_tokens=4096 --n_threads=1 "
             "--visibility_timeout_ms=3000 --heartbeat_interval_ms=500 --block_ms=100 --http_port=0 --backend=%s %s "
             "2>>%s",
             g_moeq, g_model, g_redis, g_kafka, s->ns, s->results, id, g_backend, extra ? extra : "", log);
    long log_from = wt_file_size(log);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    assert_true(g_n_started < 64);
    snprintf(g_started[g_n_started].id, sizeof g_started[g_n_started].id, "%s", id);
    g_started[g_n_started].pid = pid;
    g_started[g_n_started++].log_from = log_from;
    return pid;
}

/*
 * A worker is up once its heartbeat key exists (signals before that kill it by default). One that exits first
 * fails the test at once with what it logged; the wait is long because the suite runs many tests side by side
 * on two cores.
 */
static void wait_heartbeat(scenario *s, const char *worker_id) {
    static char log[8192];
    char key[512], err[256];
    snprintf(key, sizeof key, "%s:worker:%s", s->ns, worker_id);
    int i = started_index(worker_id);
    for (int t = 0; t < 1200; t++) {
        const char *argv[] = {"EXISTS", key};
        moeq_redis_reply *r = NULL;
        assert_int_equal(moeq_redis_command_argv(s->redis, 2, argv, NULL, &r, err, sizeof err), MOEQ_OK);
        long long v = moeq_redis_reply_int(r);
        moeq_redis_reply_free(r);
        if (v == 1) return;
        int st;
        if (i >= 0 && g_started[i].pid > 0 && waitpid(g_started[i].pid, &st, WNOHANG) == g_started[i].pid) {
            g_started[i].pid = 0;
            worker_log_since_start(worker_id, log, sizeof log);
            fail_msg("worker %s exited (%s %d) before its first heartbeat; it logged:\n%s", worker_id,
                     WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), log);
        }
        usleep(50000);
    }
    worker_log_since_start(worker_id, log, sizeof log);
    fail_msg("worker %s sent no heartbeat within 60 s; it logged:\n%s", worker_id, log);
}

/* The port a worker started with http_port = 0 listens on (wt_worker_http_port: from this run's log). */
static int worker_http_port(const char *worker_id) {
    char path[512];
    worker_log_path(worker_id, path, sizeof path);
    int i = started_index(worker_id);
    return wt_worker_http_port(path, i >= 0 ? g_started[i].log_from : 0, 10000);
}

static void forget_pid(pid_t pid) {
    for (int i = 0; i < g_n_started; i++)
        if (g_started[i].pid == pid) g_started[i].pid = 0;
}

static int wait_exit(pid_t pid, int timeout_ms) {
    forget_pid(pid);
    for (int t = 0; t < timeout_ms; t += 20) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static tjob *find(scenario *s, const char *id) {
    for (int i = 0; i < s->n_jobs; i++)
        if (!strcmp(s->jobs[i].id, id)) return &s->jobs[i];
    return NULL;
}

/* Read results until every job has one (or timeout). Returns the count of jobs with results. */
static int collect(scenario *s, int timeout_ms) {
    int64_t deadline = moeq_now_ms() + timeout_ms;
    int have = 0;
    for (int i = 0; i < s->n_jobs; i++) have += s->jobs[i].n_results > 0;
    while (have < s->n_jobs && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        char err[256];
        assert_int_equal(moeq_kafka_consumer_poll(s->consumer, 100, &m, err, sizeof err), MOEQ_OK);
        if (!m) continue;
        size_t len = 0;
        const void *v = moeq_kafka_msg_value(m, &len);
        moeq_result r;
        if (v && moeq_result_decode(v, len, NULL, 0, &r, err, sizeof err) == MOEQ_OK) {
            tjob *j = find(s, r.id);
            assert_non_null(j);
            char hash[MOEQ_JOB_HASH_SIZE]; /* every result says which job it answers */
            moeq_job_content_hash(j->json, strlen(j->json), hash);
            assert_non_null(r.job_hash);
            assert_string_equal(r.job_hash, hash);
            /* the identity of a result: status, tokens, text (timings and worker differ by design) */
            char ident[8192];
            int off = snprintf(ident, sizeof ident, "%s|%s|%s|", moeq_result_status_name(r.status),
                               moeq_finish_reason_name(r.finish_reason), r.text ? r.text : "");
            for (size_t k = 0; k < r.n_tokens && off < 8000; k++) off += snprintf(ident + off, sizeof ident - off, "%d,", r.tokens[k]);
            if (j->n_results == 0) {
                snprintf(j->first, sizeof j->first, "%s", ident);
                snprintf(j->status, sizeof j->status, "%s", moeq_result_status_name(r.status));
                snprintf(j->error_code, sizeof j->error_code, "%s", r.error.code ? r.error.code : "");
                j->n_got = (int)(r.n_tokens < 512 ? r.n_tokens : 512);
                j->text_len = r.text ? strlen(r.text) : 0;
                j->n_result_tokens = (int)r.n_tokens;
                snprintf(j->finish, sizeof j->finish, "%s", moeq_finish_reason_name(r.finish_reason));
                snprintf(j->worker, sizeof j->worker, "%s", r.worker ? r.worker : "");
                if (j->n_got) memcpy(j->got, r.tokens, (size_t)j->n_got * sizeof *r.tokens);
                have++;
            } else {
                assert_string_equal(ident, j->first); /* a duplicate is identical to the first */
                s->duplicates++;
            }
            j->n_results++;
            moeq_result_free(&r);
        }
        moeq_kafka_msg_destroy(m);
    }
    return have;
}

static void assert_results_equal_generate(scenario *s) {
    for (int i = 0; i < s->n_jobs; i++) {
        tjob *j = &s->jobs[i];
        assert_string_equal(j->status, "ok");
        if (j->n_got != j->n_expect) fail_msg("job %s: %d tokens, generate gave %d", j->id, j->n_got, j->n_expect);
        assert_memory_equal(j->got, j->expect, (size_t)j->n_expect * sizeof *j->expect);
    }
}

static long long pending_count(scenario *s) {
    long long total = 0;
    for (int p = 0; p < 4; p++) {
        char stream[512], err[256];
        snprintf(stream, sizeof stream, "%s%d", s->prefix, p);
        const char *argv[] = {"XPENDING", stream, "workers"};
        moeq_redis_reply *r = NULL;
        assert_int_equal(moeq_redis_command_argv(s->redis, 3, argv, NULL, &r, err, sizeof err), MOEQ_OK);
        total += moeq_redis_reply_int(moeq_redis_reply_at(r, 0));
        moeq_redis_reply_free(r);
    }
    return total;
}

static void wait_no_pending(scenario *s, int timeout_ms) {
    int64_t deadline = moeq_now_ms() + timeout_ms;
    while (pending_count(s) > 0 && moeq_now_ms() < deadline) usleep(50000);
    assert_int_equal(pending_count(s), 0);
}

static void assert_record_state(scenario *s, const char *id, const char *want) {
    char key[512], err[256];
    snprintf(key, sizeof key, "%s:job:%s", s->ns, id);
    const char *argv[] = {"HGET", key, "state"};
    moeq_redis_reply *r = NULL;
    assert_int_equal(moeq_redis_command_argv(s->redis, 3, argv, NULL, &r, err, sizeof err), MOEQ_OK);
    const char *st = moeq_redis_reply_str(r, NULL);
    assert_non_null(st);
    assert_string_equal(st, want);
    moeq_redis_reply_free(r);
}

/* ---- tests ---------------------------------------------------------------------- */

static void every_job_gets_what_generate_gives_alone_and_the_batch_is_acked(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-e2e");
    make_jobs(&s, 24, "e2e", -1);
    add_batch(&s, 2, 0, 10, NULL, 0);
    add_batch(&s, 0, 10, 17, NULL, 0);
    add_batch(&s, 3, 17, 24, NULL, 0);
    pid_t w = start_worker(&s, "e2e-w1", NULL);
    assert_int_equal(collect(&s, 45000), s.n_jobs);
    assert_results_equal_generate(&s);
    wait_no_pending(&s, 10000);
    assert_record_state(&s, s.jobs[0].id, "done");
    assert_record_state(&s, s.jobs[23].id, "done");
    wait_heartbeat(&s, "e2e-w1");
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    assert_int_equal(s.duplicates, 0);
    scenario_close(&s);
}

static void a_batch_left_by_a_dead_worker_is_reclaimed_and_finished(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-reclaim");
    make_jobs(&s, 12, "rc", 6);
    add_batch(&s, 1, 0, 6, NULL, 0);
    /* a consumer takes it and dies without a trace: the entry stays pending */
    char stream[512], err[256];
    snprintf(stream, sizeof stream, "%s1", s.prefix);
    const char *rd[] = {"XREADGROUP", "GROUP", "workers", "ghost", "COUNT", "1", "STREAMS", stream, ">"};
    assert_int_equal(moeq_redis_command_argv(s.redis, 9, rd, NULL, NULL, err, sizeof err), MOEQ_OK);
    /* a real worker killed with -9 mid-run */
    add_batch(&s, 2, 6, 12, NULL, 0);
    pid_t w1 = start_worker(&s, "rc-w1", "--max_seqs=1");
    /* kill it as soon as it has taken its batch (records say running), before any ack */
    int64_t deadline = moeq_now_ms() + 20000;
    for (;;) {
        char key[512];
        snprintf(key, sizeof key, "%s:job:%s", s.ns, s.jobs[6].id);
        const char *hg[] = {"HGET", key, "state"};
        moeq_redis_reply *r = NULL;
        assert_int_equal(moeq_redis_command_argv(s.redis, 3, hg, NULL, &r, err, sizeof err), MOEQ_OK);
        int running = moeq_redis_reply_str(r, NULL) && !strcmp(moeq_redis_reply_str(r, NULL), "running");
        moeq_redis_reply_free(r);
        if (running || moeq_now_ms() > deadline) break;
        usleep(2000);
    }
    kill(w1, SIGKILL);
    waitpid(w1, NULL, 0);
    forget_pid(w1);
    /* an engine key outside its choices: the worker refuses to start, naming it (its batch stays pending) */
    static char log[8192];
    pid_t bad = start_worker(&s, "rc-bad", "--cpu_k_blocked=maybe");
    assert_int_not_equal(wait_exit(bad, 30000), 0);
    worker_log_since_start("rc-bad", log, sizeof log);
    assert_non_null(strstr(log, "cpu_k_blocked \"maybe\": the choices are auto, off and on"));
    /* the worker that finishes runs the CPU kernels' other choices and every logits row whole: the same tokens
     * (none of them changes a bit; docs/CONFIGURATION.md) */
    pid_t w2 = start_worker(&s, "rc-w2",
                            "--cpu_prefetch=l1 --cpu_f8_widen=f16 --cpu_k_blocked=on --head_screen=off");
    assert_int_equal(collect(&s, 45000), s.n_jobs);
    assert_results_equal_generate(&s);
    wait_no_pending(&s, 15000);
    wait_heartbeat(&s, "rc-w2");
    kill(w2, SIGTERM);
    assert_int_equal(wait_exit(w2, 15000), 0);
    print_message("reclaim: %d duplicate results (identical)\n", s.duplicates);
    scenario_close(&s);
}

static void a_batch_delivered_too_often_is_dead_lettered_with_error_results(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-dlq");
    make_jobs(&s, 3, "dl", -1);
    char id[64], stream[512], err[256];
    add_batch(&s, 0, 0, 3, id, sizeof id);
    snprintf(stream, sizeof stream, "%s0", s.prefix);
    const char *rd[] = {"XREADGROUP", "GROUP", "workers", "ghost", "COUNT", "1", "STREAMS", stream, ">"};
    assert_int_equal(moeq_redis_command_argv(s.redis, 9, rd, NULL, NULL, err, sizeof err), MOEQ_OK);
    for (int k = 0; k < 3; k++) { /* three more deliveries that all "crashed" */
        const char *cl[] = {"XCLAIM", stream, "workers", "ghost", "0", id};
        assert_int_equal(moeq_redis_command_argv(s.redis, 6, cl, NULL, NULL, err, sizeof err), MOEQ_OK);
    }
    pid_t w = start_worker(&s, "dl-w1", "--max_deliveries=3 --visibility_timeout_ms=1500");
    assert_int_equal(collect(&s, 30000), s.n_jobs);
    for (int i = 0; i < s.n_jobs; i++) {
        assert_string_equal(s.jobs[i].status, "error");
        assert_string_equal(s.jobs[i].error_code, "dead_letter");
    }
    wait_no_pending(&s, 10000);
    assert_record_state(&s, s.jobs[0].id, "failed");
    wait_heartbeat(&s, "dl-w1");
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    scenario_close(&s);
}

static void a_job_cancelled_in_its_record_gets_a_cancelled_result(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-cancel");
    make_jobs(&s, 3, "cx", -1);
    add_batch(&s, 2, 0, 3, NULL, 0);
    /* what `moeq cancel` does for a batched job: the record gets cancel=1 */
    char key[512], err[256];
    snprintf(key, sizeof key, "%s:job:%s", s.ns, s.jobs[1].id);
    const char *argv[] = {"HSET", key, "state", "batched", "cancel", "1"};
    assert_int_equal(moeq_redis_command_argv(s.redis, 6, argv, NULL, NULL, err, sizeof err), MOEQ_OK);
    pid_t w = start_worker(&s, "cx-w1", NULL);
    assert_int_equal(collect(&s, 30000), s.n_jobs);
    assert_string_equal(s.jobs[0].status, "ok");
    assert_string_equal(s.jobs[1].status, "cancelled");
    assert_string_equal(s.jobs[2].status, "ok");
    wait_no_pending(&s, 10000);
    wait_heartbeat(&s, "cx-w1");
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    scenario_close(&s);
}

static void sigterm_drains_without_losing_a_job(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-drain");
    make_jobs(&s, 16, "dr", -1);
    for (int b = 0; b < 4; b++) add_batch(&s, 2, 4 * b, 4 * b + 4, NULL, 0);
    pid_t w1 = start_worker(&s, "dr-w1", "--max_batches_held=2 --max_seqs=1");
    int64_t deadline = moeq_now_ms() + 20000;
    while (collect(&s, 50) == 0 && moeq_now_ms() < deadline) {}
    wait_heartbeat(&s, "dr-w1");
    int64_t t0 = moeq_now_ms();
    kill(w1, SIGTERM);
    assert_int_equal(wait_exit(w1, 25000), 0);
    print_message("drain: exited 0 after %lld ms\n", (long long)(moeq_now_ms() - t0));
    pid_t w2 = start_worker(&s, "dr-w2", NULL);
    assert_int_equal(collect(&s, 45000), s.n_jobs);
    assert_results_equal_generate(&s);
    wait_no_pending(&s, 10000);
    wait_heartbeat(&s, "dr-w2");
    kill(w2, SIGTERM);
    assert_int_equal(wait_exit(w2, 15000), 0);
    scenario_close(&s);
}

/* Create a topic with a small max.message.bytes (the C adapter creates no topics: Python's admin client does). */
static void create_small_topic(const char *topic, int max_bytes) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import sys; from confluent_kafka.admin import AdminClient, NewTopic; "
             "a = AdminClient({'bootstrap.servers': sys.argv[1]}); "
             "[f.result(30) for f in a.create_topics([NewTopic(sys.argv[2], 1, 1, config={'max.message.bytes': sys.argv[3]})]).values()]\" "
             "%s %s %d",
             g_kafka, topic, max_bytes);
    if (run_cmd(cmd)) skip(); /* no python3-confluent-kafka: scripts/setup.sh installs it */
}

/* Messages on topic (from the start) whose key is one of the scenario's job ids and that carry moeq-reason. */
static int count_dlq(scenario *s, const char *topic, int want, int timeout_ms, char *reason, size_t reason_size) {
    char group[192], err[256];
    snprintf(group, sizeof group, "%s.dlq", s->group);
    const char *topics[] = {topic};
    moeq_kafka_consumer_params cp = {.brokers = g_kafka, .group_id = group, .topics = topics, .n_topics = 1};
    moeq_kafka_consumer *c = NULL;
    assert_int_equal(moeq_kafka_consumer_new(&cp, NULL, &c, err, sizeof err), MOEQ_OK);
    int n = 0;
    int64_t deadline = moeq_now_ms() + timeout_ms;
    while (n < want && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        assert_int_equal(moeq_kafka_consumer_poll(c, 100, &m, err, sizeof err), MOEQ_OK);
        if (!m) continue;
        size_t klen = 0, rlen = 0;
        const char *key = moeq_kafka_msg_key(m, &klen);
        const void *rv = NULL;
        char id[192];
        snprintf(id, sizeof id, "%.*s", (int)(klen < 191 ? klen : 191), key ? key : "");
        if (find(s, id) && moeq_kafka_msg_header(m, "moeq-reason", &rv, &rlen) == MOEQ_OK) {
            n++;
            if (reason) snprintf(reason, reason_size, "%.*s", (int)rlen, (const char *)rv);
        }
        moeq_kafka_msg_destroy(m);
    }
    moeq_kafka_consumer_destroy(c);
    return n;
}

/* Rewrite a job's JSON with a reply_to topic. */
static void set_reply_to(tjob *j, const char *topic) {
    char json[sizeof j->json];
    snprintf(json, sizeof json, "{\"reply_to\":\"%s\",%s", topic, j->json + 1);
    snprintf(j->json, sizeof j->json, "%s", json);
}

static void dead_letter_copies_are_on_the_dlq_when_the_batch_is_acked(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-dlqcopy");
    make_jobs(&s, 3, "dq", -1);
    char id[64], stream[512], err[256], dlq[256], extra[512];
    snprintf(dlq, sizeof dlq, "%s.dlq", s.ns);
    add_batch(&s, 0, 0, 3, id, sizeof id);
    snprintf(stream, sizeof stream, "%s0", s.prefix);
    const char *rd[] = {"XREADGROUP", "GROUP", "workers", "ghost", "COUNT", "1", "STREAMS", stream, ">"};
    assert_int_equal(moeq_redis_command_argv(s.redis, 9, rd, NULL, NULL, err, sizeof err), MOEQ_OK);
    for (int k = 0; k < 2; k++) {
        const char *cl[] = {"XCLAIM", stream, "workers", "ghost", "0", id};
        assert_int_equal(moeq_redis_command_argv(s.redis, 6, cl, NULL, NULL, err, sizeof err), MOEQ_OK);
    }
    snprintf(extra, sizeof extra, "--max_deliveries=2 --visibility_timeout_ms=1500 --dlq_topic=%s", dlq);
    pid_t w = start_worker(&s, "dq-w1", extra);
    assert_int_equal(collect(&s, 30000), s.n_jobs);
    wait_no_pending(&s, 10000);
    /* acknowledged: so every copy was acknowledged by the broker before, and is there to read */
    char reason[256] = "";
    assert_int_equal(count_dlq(&s, dlq, 3, 20000, reason, sizeof reason), 3);
    assert_non_null(strstr(reason, "delivered"));
    for (int i = 0; i < s.n_jobs; i++) assert_string_equal(s.jobs[i].error_code, "dead_letter");
    wait_heartbeat(&s, "dq-w1");
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    scenario_close(&s);
}

static void a_result_the_broker_refuses_for_good_becomes_an_error_result_and_a_dead_letter(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-toolarge");
    char small[256], dlq[256], extra[1024];
    snprintf(small, sizeof small, "%s.small", s.ns);
    snprintf(dlq, sizeof dlq, "%s.dlq", s.ns);
    create_small_topic(small, 512);
    g_long_new = 200;
    make_jobs(&s, 3, "tl", 2); /* jobs 0, 1: short results to results; job 2: 200 tokens to the small topic */
    g_long_new = 400;
    assert_true(s.jobs[2].n_expect >= 100); /* a result well over 512 bytes */
    set_reply_to(&s.jobs[2], small);
    add_batch(&s, 1, 0, 3, NULL, 0);
    snprintf(extra, sizeof extra, "--allowed_topics=%s --dlq_topic=%s", small, dlq);
    pid_t w = start_worker(&s, "tl-w1", extra);
    assert_int_equal(collect(&s, 60000), s.n_jobs);
    assert_string_equal(s.jobs[0].status, "ok");
    assert_string_equal(s.jobs[1].status, "ok");
    assert_string_equal(s.jobs[2].status, "error");
    assert_string_equal(s.jobs[2].error_code, "result_undeliverable");
    wait_no_pending(&s, 20000); /* the batch is not held forever */
    assert_record_state(&s, s.jobs[2].id, "failed");
    assert_record_state(&s, s.jobs[0].id, "done");
    char reason[256] = "";
    assert_int_equal(count_dlq(&s, dlq, 1, 20000, reason, sizeof reason), 1);
    assert_non_null(strstr(reason, small));
    wait_heartbeat(&s, "tl-w1");
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    assert_int_equal(s.duplicates, 0);
    scenario_close(&s);
}

/* The sample `name{...}` of the worker's /metrics. */
static long long worker_metric(int port, const char *name) {
    int fd = -1;
    for (int t = 0; t < 100 && fd < 0; t++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            fd = -1;
            usleep(50000);
        }
    }
    assert_true(fd >= 0);
    const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    static char buf[65536];
    size_t len = 0;
    ssize_t r;
    while (len + 1 < sizeof buf && (r = read(fd, buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
    buf[len] = 0;
    const char *body = strstr(buf, "\r\n\r\n"); /* a running worker's page: the conventions, all documented */
    char why[512];
    assert_non_null(body);
    if (moeq_test_metrics_lint(body + 4, why, sizeof why)) fail_msg("%s", why);
    if (moeq_test_metrics_documented(body + 4, why, sizeof why)) fail_msg("%s", why);
    close(fd);
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s{", name);
    const char *p = strstr(buf, pat);
    assert_non_null(p);
    p = strchr(p, '}');
    return strtoll(p + 1, NULL, 10);
}

/* steps_total from the worker's /metrics. */
static long long worker_steps(int port) { return worker_metric(port, "moeq_worker_steps_total"); }

/*
 * What the coordinator does to cancel a batched or running job: the record's
 * cancel flag, then a notice on <prefix>:cancels (docs/WORKER.md).
 */
static void cancel_job(scenario *s, const char *id) {
    char key[512], stream[512], err[256];
    snprintf(key, sizeof key, "%s:job:%s", s->ns, id);
    snprintf(stream, sizeof stream, "%s:cancels", s->ns);
    const char *hs[] = {"HSET", key, "cancel", "1"};
    assert_int_equal(moeq_redis_command_argv(s->redis, 4, hs, NULL, NULL, err, sizeof err), MOEQ_OK);
    const char *xa[] = {"XADD", stream, "MAXLEN", "~", "10000", "*", "id", id};
    assert_int_equal(moeq_redis_command_argv(s->redis, 8, xa, NULL, NULL, err, sizeof err), MOEQ_OK);
}

static void a_running_job_cancelled_stops_within_one_engine_step_with_its_partial_text(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-cxrun");
    g_long_new = 3000;
    make_jobs(&s, 4, "cr", 0);
    g_long_new = 400;
    int longest = 0; /* the one that runs longest before the model's eos (seeds are fixed: always the same) */
    for (int i = 1; i < s.n_jobs; i++)
        if (s.jobs[i].n_expect > s.jobs[longest].n_expect) longest = i;
    assert_true(s.jobs[longest].n_expect >= 1000);
    if (longest) memcpy(&s.jobs[0], &s.jobs[longest], sizeof s.jobs[0]);
    s.n_jobs = 1;
    pid_t w = start_worker(&s, "cr-w1", "--kv_cache_tokens=8192 --cancel_poll_ms=600000");
    wait_heartbeat(&s, "cr-w1");
    int port = worker_http_port("cr-w1");
    long long before = worker_steps(port);
    add_batch(&s, 1, 0, 1, NULL, 0);
    /* let it run for a while */
    int64_t deadline = moeq_now_ms() + 20000;
    while (worker_steps(port) - before < 50 && moeq_now_ms() < deadline) usleep(20000);
    cancel_job(&s, s.jobs[0].id);
    long long at_cancel = worker_steps(port) - before; /* read after the cancel was written */
    assert_int_equal(collect(&s, 20000), 1);
    tjob *j = &s.jobs[0];
    assert_string_equal(j->status, "cancelled");
    assert_string_equal(j->finish, "cancelled");
    assert_true(j->n_got > 0 && j->text_len > 0);
    /* the partial tokens are generate's, and at most the one step in flight ran after the cancel */
    assert_true(j->n_result_tokens < j->n_expect);
    assert_memory_equal(j->got, j->expect, (size_t)j->n_got * sizeof *j->got);
    print_message("cancel: %lld steps when cancelled, %d tokens in the cancelled result\n", at_cancel,
                  j->n_result_tokens);
    assert_true(j->n_result_tokens <= at_cancel + 1);
    wait_no_pending(&s, 10000);
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    scenario_close(&s);
}

/* ---- prefix affinity (docs/PREFIX_CACHE.md) ---------------------------------------- */

#define AFF_KEY "00000000000abcde"

/* Every job's prompt starts with the same n_lead token ids (an instruction); expected results again. */
/*
 * A batch that runs through many heartbeats is still on its first delivery: the affinity's hand-off sweep
 * reads this worker's pending list every heartbeat, and a history XREADGROUP would count as a delivery each
 * time (a restart then dead-lettered every batch that had run a few seconds). Killed mid-run and restarted,
 * the worker runs the batch to generate's result instead.
 */
static void a_batch_running_through_many_heartbeats_is_not_counted_as_redelivered(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-hbcount");
    g_long_new = 3000;
    make_jobs(&s, 4, "hb", 0);
    g_long_new = 400;
    int longest = 0;
    for (int i = 1; i < s.n_jobs; i++)
        if (s.jobs[i].n_expect > s.jobs[longest].n_expect) longest = i;
    assert_true(s.jobs[longest].n_expect >= 1000);
    if (longest) memcpy(&s.jobs[0], &s.jobs[longest], sizeof s.jobs[0]);
    s.n_jobs = 1;
    const char *extra = "--kv_cache_tokens=8192 --heartbeat_interval_ms=100 --max_deliveries=3";
    pid_t w = start_worker(&s, "hb-w1", extra);
    wait_heartbeat(&s, "hb-w1");
    int port = worker_http_port("hb-w1");
    char id[64];
    add_batch(&s, 1, 0, 1, id, sizeof id);
    int64_t t0 = moeq_now_ms();
    long long before = worker_steps(port);
    while ((moeq_now_ms() - t0 < 1500 || worker_steps(port) - before < 20) && moeq_now_ms() - t0 < 20000)
        usleep(20000); /* 15 heartbeats or more while the batch runs */
    char stream[512], err[256];
    snprintf(stream, sizeof stream, "%s1", s.prefix);
    const char *argv[] = {"XPENDING", stream, "workers", id, id, "1"};
    moeq_redis_reply *r = NULL;
    assert_int_equal(moeq_redis_command_argv(s.redis, 6, argv, NULL, &r, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_reply_len(r), 1); /* still running: pending */
    long long deliveries = moeq_redis_reply_int(moeq_redis_reply_at(moeq_redis_reply_at(r, 0), 3));
    moeq_redis_reply_free(r);
    print_message("heartbeats: after %lld ms of running the batch has %lld delivery\n",
                  (long long)(moeq_now_ms() - t0), deliveries);
    assert_int_equal(deliveries, 1);
    kill(w, SIGKILL);
    assert_true(wait_exit(w, 10000) >= 0);
    w = start_worker(&s, "hb-w1", extra); /* the same id: it takes its pending batch back at once */
    assert_int_equal(collect(&s, 60000), 1);
    assert_string_equal(s.jobs[0].status, "ok");
    /* generate's tokens: all of them counted, the first 512 compared (what the scenario keeps) */
    assert_int_equal(s.jobs[0].n_result_tokens, s.jobs[0].n_expect);
    assert_memory_equal(s.jobs[0].got, s.jobs[0].expect, 512 * sizeof *s.jobs[0].expect);
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    scenario_close(&s);
}

static void lead_jobs(scenario *s, int n_lead) {
    for (int i = 0; i < s->n_jobs; i++) {
        tjob *j = &s->jobs[i];
        assert_true(j->n_tokens + n_lead <= 256);
        memmove(j->tokens + n_lead, j->tokens, (size_t)j->n_tokens * sizeof *j->tokens);
        for (int k = 0; k < n_lead; k++) j->tokens[k] = (int32_t)(100 + (k * 37) % 800);
        j->n_tokens += n_lead;
        int32_t eos = moeq_tokenizer_eos_id(g_tok);
        moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = j->max_new,
                                   .stop_ids = &eos, .n_stop_ids = eos >= 0};
        gp.sampling.temperature = j->temperature;
        gp.sampling.seed = j->seed;
        int32_t *out = NULL;
        int n_out = 0;
        char err[256];
        assert_int_equal(moeq_generate(g_engine, j->tokens, j->n_tokens, &gp, &out, &n_out, err, sizeof err), MOEQ_OK);
        memcpy(j->expect, out, (size_t)(n_out < 512 ? n_out : 512) * sizeof *out);
        j->n_expect = n_out;
        free(out);
    }
}

/* add_batch with the entry's prefix key field, as the coordinator writes it. */
static void add_batch_key(scenario *s, int p, int from, int to, const char *pkey) {
    moeq_batch_entry_job bj[MAX_JOBS];
    for (int i = from; i < to; i++) {
        tjob *j = &s->jobs[i];
        bj[i - from] = (moeq_batch_entry_job){.id = j->id, .id_len = strlen(j->id), .job = j->json,
                                              .job_len = strlen(j->json), .kafka_ts_ms = moeq_now_ms(),
                                              .arrival_ms = moeq_now_ms(), .tokens = j->tokens,
                                              .n_tokens = (size_t)j->n_tokens};
    }
    moeq_buf blob = {0};
    assert_int_equal(moeq_batch_entry_encode_jobs(bj, (size_t)(to - from), &blob), MOEQ_OK);
    char stream[512], count[16], closed[24], pr[4], err[256];
    snprintf(stream, sizeof stream, "%s%d", s->prefix, p);
    snprintf(count, sizeof count, "%d", to - from);
    snprintf(closed, sizeof closed, "%lld", (long long)moeq_now_ms());
    snprintf(pr, sizeof pr, "%d", p);
    const char *argv[] = {"XADD", stream, "*", "v", "1", "priority", pr, "n", count, "prefix", "32", "closed_ms",
                          closed, "jobs", (const char *)blob.data, "pkey", pkey};
    size_t lens[17];
    for (int i = 0; i < 17; i++) lens[i] = strlen(argv[i]);
    lens[14] = blob.len;
    assert_int_equal(moeq_redis_command_argv(s->redis, 17, argv, lens, NULL, err, sizeof err), MOEQ_OK);
    moeq_buf_free(&blob);
}

/*
 * A peer advertised the batch's prefix key (with room) and died: its heartbeat is still there, so the
 * worker hands the fresh batch to it (XCLAIM, its visibility clock restarted). Nobody runs it there; the
 * worker reclaims it after visibility_timeout_ms (3 s here) and every job gets generate's result.
 */
static void a_batch_handed_to_a_worker_that_is_gone_is_taken_by_another_within_the_visibility_timeout(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-aff-gone");
    make_jobs(&s, 4, "ag", -1);
    char key[512], err[256];
    snprintf(key, sizeof key, "%s:worker:aff-ghost", s.ns);
    const char *set[] = {"SET", key, "{\"id\":\"aff-ghost\",\"free_slots\":8,\"pending\":0,\"prefix_keys\":[\"" AFF_KEY "\"]}",
                         "PX", "60000"};
    assert_int_equal(moeq_redis_command_argv(s.redis, 5, set, NULL, NULL, err, sizeof err), MOEQ_OK);
    pid_t w = start_worker(&s, "aff-w1", NULL);
    wait_heartbeat(&s, "aff-w1"); /* its first heartbeat read the peer's */
    int port = worker_http_port("aff-w1");
    int64_t t0 = moeq_now_ms();
    add_batch_key(&s, 2, 0, 4, AFF_KEY);
    assert_int_equal(collect(&s, 30000), 4);
    int64_t took = moeq_now_ms() - t0;
    assert_results_equal_generate(&s);
    long long handed = worker_metric(port, "moeq_worker_affinity_handed_total");
    long long reclaimed = worker_metric(port, "moeq_worker_reclaims_total");
    print_message("affinity: handed %lld to the dead peer, reclaimed %lld, all results after %lld ms\n", handed,
                  reclaimed, (long long)took);
    assert_int_equal(handed, 1);
    assert_true(reclaimed >= 1);
    assert_true(took >= 2500 && took < 20000); /* the visibility timeout, then the run */
    wait_no_pending(&s, 10000);
    kill(w, SIGTERM);
    assert_int_equal(wait_exit(w, 15000), 0);
    scenario_close(&s);
}

/*
 * Worker A runs a batch with the key (its jobs share a 40-token instruction); B starts and sees A
 * advertise it (A's cache still holds the prefix). A is then paused (SIGSTOP) while a
 * fresh batch with the key arrives (after A's blocking read timed out on the server, so B is the only
 * reader): B hands it to A, A (resumed) takes it
 * from its pending list at its next heartbeat and runs it. Three times; every job ran on A with generate's
 * result.
 */
static void fresh_batches_with_a_prefix_key_run_on_the_worker_that_holds_it(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    scenario_open(&s, "wk-aff-hold");
    make_jobs(&s, 16, "ah", -1);
    lead_jobs(&s, 40); /* what A's cache keeps: the 32 tokens the key covers are two blocks */
    pid_t a = start_worker(&s, "aff-a", NULL);
    wait_heartbeat(&s, "aff-a");
    int port_a = worker_http_port("aff-a");
    s.n_jobs = 4;
    add_batch_key(&s, 2, 0, 4, AFF_KEY);
    assert_int_equal(collect(&s, 30000), 4);
    pid_t b = start_worker(&s, "aff-b", NULL);
    wait_heartbeat(&s, "aff-b");
    int port_b = worker_http_port("aff-b");
    for (int k = 1; k < 4; k++) {
        usleep(1200 * 1000); /* two heartbeats: A advertises the key with its slots free, B has read it */
        long long handed = worker_metric(port_b, "moeq_worker_affinity_handed_total");
        kill(a, SIGSTOP);
        usleep(250 * 1000); /* past A's XREADGROUP BLOCK (block_ms 100): only B waits on the stream now */
        s.n_jobs = 4 * (k + 1);
        add_batch_key(&s, 2, 4 * k, 4 * (k + 1), AFF_KEY);
        for (int t = 0; t < 100 && worker_metric(port_b, "moeq_worker_affinity_handed_total") == handed; t++)
            usleep(20000);
        kill(a, SIGCONT);
        assert_int_equal(collect(&s, 30000), s.n_jobs);
    }
    assert_results_equal_generate(&s);
    for (int i = 0; i < s.n_jobs; i++) assert_string_equal(s.jobs[i].worker, "aff-a");
    long long handed = worker_metric(port_b, "moeq_worker_affinity_handed_total");
    long long received = worker_metric(port_a, "moeq_worker_affinity_received_total");
    print_message("affinity: B handed %lld batches to A, A received %lld\n", handed, received);
    assert_int_equal(handed, 3);
    assert_int_equal(received, 3);
    wait_no_pending(&s, 10000);
    kill(a, SIGTERM);
    kill(b, SIGTERM);
    assert_int_equal(wait_exit(a, 15000), 0);
    assert_int_equal(wait_exit(b, 15000), 0);
    scenario_close(&s);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--backend")) g_backend = argv[2];
    const struct CMUnitTest on_device[] = {
        cmocka_unit_test(every_job_gets_what_generate_gives_alone_and_the_batch_is_acked),
        cmocka_unit_test(a_batch_left_by_a_dead_worker_is_reclaimed_and_finished),
        cmocka_unit_test(sigterm_drains_without_losing_a_job),
    };
    if (strcmp(g_backend, "cpu")) return cmocka_run_group_tests(on_device, group_setup, group_teardown);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_job_gets_what_generate_gives_alone_and_the_batch_is_acked),
        cmocka_unit_test(a_batch_left_by_a_dead_worker_is_reclaimed_and_finished),
        cmocka_unit_test(a_batch_delivered_too_often_is_dead_lettered_with_error_results),
        cmocka_unit_test(a_job_cancelled_in_its_record_gets_a_cancelled_result),
        cmocka_unit_test(sigterm_drains_without_losing_a_job),
        cmocka_unit_test(dead_letter_copies_are_on_the_dlq_when_the_batch_is_acked),
        cmocka_unit_test(a_result_the_broker_refuses_for_good_becomes_an_error_result_and_a_dead_letter),
        cmocka_unit_test(a_running_job_cancelled_stops_within_one_engine_step_with_its_partial_text),
        cmocka_unit_test(a_batch_running_through_many_heartbeats_is_not_counted_as_redelivered),
        cmocka_unit_test(a_batch_handed_to_a_worker_that_is_gone_is_taken_by_another_within_the_visibility_timeout),
        cmocka_unit_test(fresh_batches_with_a_prefix_key_run_on_the_worker_that_holds_it),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
