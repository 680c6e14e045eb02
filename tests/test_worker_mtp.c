/*
 * test_worker_mtp.c — MTP speculative decoding inside the worker's continuous
 * batching, against a real Redis and Kafka: `moeq worker` processes run
 * batches of mixed jobs (greedy with mtp on and off, sampled, stop strings
 * that complete inside an accepted run, max_new_tokens 1..40) on the
 * `tiny-mtp` preset (an MTP layer that mostly agrees with the model) and on
 * `tiny` (a random MTP layer: nearly every draft rejected), each with the
 * worker's mtp_k on and off. Every result must carry exactly the tokens
 * moeq_generate gives for that job alone without MTP (same seed), cut where
 * its stop string completes — sampled jobs too, although with mtp they
 * decode speculatively (the engine's exact mode); mtp jobs, greedy and
 * sampled, report drafted/accepted (> 0 on tiny-mtp, for the sampled ones
 * too), others report none; /metrics has the worker's totals. Half the
 * prompts share a long instruction, so jobs start as forks of running
 * jobs' cached prefixes (prefix_share_min) — the results are checked with
 * that in play.
 *
 * Needs the `services` fixture (skips with 77 without it).
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
#include <sys/wait.h>
#include <unistd.h>

#include "moeq/batch_entry.h"
#include "moeq/engine.h"
#include "moeq/kafka.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"
#include "services_env.h"
#include "worker_test_util.h"

#define N_JOBS 16

static char g_kafka[128], g_redis[128], g_moeq[512], g_build[512];

typedef struct model_ref {
    const char *preset;
    char dir[512];
    moeq_model *model;
    moeq_tokenizer *tok;
    moeq_engine *engine; /* one sequence, for moeq_generate alone */
} model_ref;

static model_ref g_models[2] = {{.preset = "tiny-mtp"}, {.preset = "tiny"}};

typedef struct tjob {
    char id[160];
    char json[768];
    int32_t prompt[128];
    int n_prompt;
    int max_new, greedy, mtp;
    char stop[8];            /* "" = none                                     */
    int32_t expect[64];
    int n_expect;
    int got_result, n_got, has_mtp;
    int32_t got[64];
    long long drafted, accepted;
    char status[16], finish[16];
} tjob;

typedef struct scenario {
    char ns[96], prefix[128], results[128];
    tjob jobs[N_JOBS];
    moeq_redis *redis;
    moeq_kafka_consumer *consumer;
} scenario;

/* ---- set-up -------------------------------------------------------------------- */

/* --backend NAME: the workers' backend (cpu-device: the CPU behind a GPU's contract, the same tokens as cpu) */
static const char *g_backend = "cpu";

static int open_model(model_ref *m) {
    char cmd[2048], err[512];
    snprintf(m->dir, sizeof m->dir, "%.400s/test-worker-mtp-%s", g_build, m->preset);
    snprintf(cmd, sizeof cmd, "test -f %s/config.json || %s gen-model --preset %s --out %s >/dev/null", m->dir,
             g_moeq, m->preset, m->dir);
    if (system(cmd) != 0) return -1;
    if (moeq_model_load(m->dir, NULL, &m->model, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    if (moeq_tokenizer_load(m->dir, &m->tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    moeq_engine_params p = moeq_engine_default_params();
    p.max_seqs = 1;
    p.n_threads = 1;
    p.kv_cache_tokens = 4096;
    p.max_step_tokens = 512;
    if (moeq_engine_new(m->model, &p, &m->engine, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    return 0;
}

static int group_setup(void **state) {
    (void)state;
    if (moeq_test_service("MOEQ_TEST_KAFKA", g_kafka, sizeof g_kafka) ||
        moeq_test_service("MOEQ_TEST_REDIS", g_redis, sizeof g_redis))
        exit(MOEQ_TEST_SKIP);
    const char *build = getenv("MOEQ_BUILD_DIR");
    snprintf(g_build, sizeof g_build, "%s", build ? build : ".");
    snprintf(g_moeq, sizeof g_moeq, "%.480s/cli/moeq", g_build);
    for (int i = 0; i < 2; i++)
        if (open_model(&g_models[i])) return -1;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        moeq_engine_destroy(g_models[i].engine);
        moeq_tokenizer_destroy(g_models[i].tok);
        moeq_model_destroy(g_models[i].model);
    }
    return 0;
}

/* ---- expectations: moeq_generate alone, MTP off, then the worker's stop-string rule ---- */

/* A 2-character stop string of plain characters from the middle of text, or "" when there is none. */
static void pick_stop(const char *text, size_t len, char *stop) {
    stop[0] = 0;
    for (size_t p = len / 2; p + 2 <= len; p++) {
        unsigned char a = (unsigned char)text[p], b = (unsigned char)text[p + 1];
        if (a < 0x80 && b < 0x80 && a > ' ' && b > ' ' && a != '"' && b != '"' && a != '\\' && b != '\\') {
            stop[0] = (char)a, stop[1] = (char)b, stop[2] = 0;
            return;
        }
    }
}

/*
 * Detokenize tokens as the worker does (streaming, special tokens skipped,
 * the stop id never pushed). With stop == NULL: pick a stop string from the
 * text. Else: the number of tokens up to the one whose text completes stop
 * (n when it never does).
 */
static int detok_until(const model_ref *m, const int32_t *tokens, int n, char *stop_pick, const char *stop) {
    moeq_tokenizer_stream *st = moeq_tokenizer_stream_new(m->tok, MOEQ_DECODE_SKIP_SPECIAL);
    assert_non_null(st);
    char text[4096];
    size_t len = 0;
    int32_t eos = moeq_tokenizer_eos_id(m->tok);
    int cut = n;
    for (int i = 0; i < n && tokens[i] != eos; i++) {
        const char *bytes = NULL;
        size_t nb = 0;
        assert_int_equal(moeq_tokenizer_stream_push(st, tokens[i], &bytes, &nb, NULL, 0), MOEQ_OK);
        if (len + nb >= sizeof text) break;
        memcpy(text + len, bytes, nb);
        len += nb;
        text[len] = 0;
        if (stop && strstr(text, stop)) {
            cut = i + 1;
            break;
        }
    }
    moeq_tokenizer_stream_destroy(st);
    if (!stop) pick_stop(text, len, stop_pick);
    return cut;
}

static void expect_job(const model_ref *m, tjob *j, uint64_t seed, double temperature) {
    int32_t eos = moeq_tokenizer_eos_id(m->tok);
    moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = j->max_new,
                               .stop_ids = &eos, .n_stop_ids = eos >= 0};
    gp.sampling.temperature = temperature;
    gp.sampling.seed = seed;
    int32_t *out = NULL;
    int n_out = 0;
    char err[256];
    assert_int_equal(moeq_generate(m->engine, j->prompt, j->n_prompt, &gp, &out, &n_out, err, sizeof err), MOEQ_OK);
    assert_true(n_out <= 64);
    memcpy(j->expect, out, (size_t)n_out * sizeof *out);
    j->n_expect = n_out;
    free(out);
}

/*
 * Jobs: i % 4 == 3 sampled (T 0.9 or 1.3, mtp on), else greedy; every 5th greedy job with
 * mtp off; every 3rd greedy job with a stop string taken from the middle of
 * its own output, so it completes inside a run; lengths 1..40.
 */
static void make_jobs(scenario *s, const model_ref *m, const char *tag) {
    static const char *docs[] = {"The quick brown fox jumps over the lazy dog.", "Summarise: sales rose 4% in May.",
                                 "Translate to French: good morning", "List three prime numbers.",
                                 "Kafka stores records in partitions; Redis streams hold entries."};
    static const int lens[] = {40, 1, 2, 3, 24, 17, 33, 9, 40, 12, 5, 28, 36, 7, 21, 40};
    for (int i = 0; i < N_JOBS; i++) {
        tjob *j = &s->jobs[i];
        memset(j, 0, sizeof *j);
        snprintf(j->id, sizeof j->id, "%s.%s-%d", tag, s->ns, i);
        j->max_new = lens[i];
        j->greedy = i % 4 != 3;
        j->mtp = !(j->greedy && i % 5 == 4);
        double temperature = j->greedy ? 0.0 : i % 8 == 3 ? 0.9 : 1.3;
        uint64_t seed = 500 + (uint64_t)i;
        char prompt[256]; /* even jobs share a long instruction: the worker forks a running one's prefix */
        snprintf(prompt, sizeof prompt, "%s%s (%d)",
                 i % 2 ? "" : "Instructions: read the document below, then answer in one short sentence. Document: ",
                 docs[i % 5], i);
        moeq_tokens t = {0};
        char err[256];
        unsigned flags = moeq_tokenizer_add_bos(m->tok) ? MOEQ_TOKENIZE_ADD_BOS : 0;
        assert_int_equal(moeq_tokenizer_encode(m->tok, prompt, strlen(prompt), flags, &t, err, sizeof err), MOEQ_OK);
        assert_true(t.n < 128);
        memcpy(j->prompt, t.ids, t.n * sizeof *t.ids);
        j->n_prompt = (int)t.n;
        moeq_tokens_free(&t);
        expect_job(m, j, seed, temperature);
        if (j->greedy && i % 3 == 0) {
            detok_until(m, j->expect, j->n_expect, j->stop, NULL);
            if (j->stop[0]) j->n_expect = detok_until(m, j->expect, j->n_expect, NULL, j->stop);
        }
        char stop_json[32] = "";
        if (j->stop[0]) snprintf(stop_json, sizeof stop_json, ",\"stop\":[\"%s\"]", j->stop);
        snprintf(j->json, sizeof j->json,
                 "{\"v\":1,\"id\":\"%s\",\"prompt\":\"%s\",\"max_new_tokens\":%d,\"temperature\":%.1f,\"seed\":%llu,"
                 "\"mtp\":%s%s}",
                 j->id, prompt, j->max_new, temperature, (unsigned long long)seed, j->mtp ? "true" : "false",
                 stop_json);
    }
}

/* ---- services ---------------------------------------------------------------------- */

static void scenario_open(scenario *s, const char *tag) {
    char group[160];
    moeq_test_unique_name(s->ns, sizeof s->ns, tag);
    snprintf(s->prefix, sizeof s->prefix, "%s:batches:p", s->ns);
    snprintf(s->results, sizeof s->results, "%s.results", s->ns);
    snprintf(group, sizeof group, "%s.g", s->ns);
    s->redis = wt_open_streams(g_redis, s->prefix);
    s->consumer = wt_results_consumer(g_kafka, s->results, group); /* joined before any result is produced */
}

static void scenario_close(scenario *s) {
    moeq_kafka_consumer_destroy(s->consumer);
    moeq_redis_destroy(s->redis);
}

/* XADD jobs[from..to) as one batch entry on priority 2, as the coordinator writes it. */
static void add_batch(scenario *s, int from, int to) {
    moeq_batch_entry_job bj[N_JOBS];
    for (int i = from; i < to; i++) {
        tjob *j = &s->jobs[i];
        bj[i - from] = (moeq_batch_entry_job){.id = j->id, .id_len = strlen(j->id), .content_type = "application/json",
                                              .content_type_len = 16, .job = j->json, .job_len = strlen(j->json),
                                              .kafka_ts_ms = moeq_now_ms(), .arrival_ms = moeq_now_ms(),
                                              .tokens = j->prompt, .n_tokens = (size_t)j->n_prompt};
    }
    wt_add_batch(s->redis, s->prefix, 2, bj, (size_t)(to - from), NULL, 0);
}

#define MTP_AUTO (-1) /* run_jobs / start_worker: --mtp_k=auto */

static pid_t g_worker; /* the running test's worker: a failed check leaves it for the teardown to stop */

/* The worker, on an ephemeral http port (wt_worker_http_port reads it from the log into *port). */
static pid_t start_worker(const scenario *s, const model_ref *m, int mtp_k, int *port) {
    char cmd[4096], k[16], log[1024];
    if (mtp_k == MTP_AUTO) snprintf(k, sizeof k, "auto");
    else snprintf(k, sizeof k, "%d", mtp_k);
    snprintf(log, sizeof log, "%s/worker-%s.log", g_build, s->ns);
    snprintf(cmd, sizeof cmd,
             "exec %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
             "--worker_id=%s-w --max_seqs=4 --max_step_tokens=64 --kv_cache_tokens=4096 --n_threads=1 "
             "--visibility_timeout_ms=3000 --heartbeat_interval_ms=500 --block_ms=100 --mtp_k=%s "
             "--http_port=0 --backend=%s 2>>%s",
             g_moeq, m->dir, g_redis, g_kafka, s->ns, s->results, s->ns, k, g_backend, log);
    long log_from = wt_file_size(log);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    g_worker = pid;
    *port = wt_worker_http_port(log, log_from, 60000);
    return pid;
}

static int stop_worker(pid_t pid) {
    if (pid == g_worker) g_worker = 0;
    kill(pid, SIGTERM);
    for (int t = 0; t < 15000; t += 20) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Read results until every job has one (or the timeout). */
static void collect(scenario *s, int timeout_ms) {
    int64_t deadline = moeq_now_ms() + timeout_ms;
    int have = 0;
    while (have < N_JOBS && moeq_now_ms() < deadline) {
        moeq_kafka_msg *msg = NULL;
        char err[256];
        assert_int_equal(moeq_kafka_consumer_poll(s->consumer, 100, &msg, err, sizeof err), MOEQ_OK);
        if (!msg) continue;
        size_t len = 0;
        const void *v = moeq_kafka_msg_value(msg, &len);
        moeq_result r;
        if (v && moeq_result_decode(v, len, NULL, 0, &r, err, sizeof err) == MOEQ_OK) {
            tjob *j = NULL;
            for (int i = 0; i < N_JOBS; i++)
                if (!strcmp(s->jobs[i].id, r.id)) j = &s->jobs[i];
            assert_non_null(j);
            if (!j->got_result) {
                j->got_result = 1;
                have++;
                j->n_got = (int)(r.n_tokens < 64 ? r.n_tokens : 64);
                if (j->n_got) memcpy(j->got, r.tokens, (size_t)j->n_got * sizeof *r.tokens);
                j->has_mtp = r.has_mtp;
                j->drafted = r.mtp.drafted;
                j->accepted = r.mtp.accepted;
                snprintf(j->status, sizeof j->status, "%s", moeq_result_status_name(r.status));
                snprintf(j->finish, sizeof j->finish, "%s", moeq_finish_reason_name(r.finish_reason));
            }
            moeq_result_free(&r);
        }
        moeq_kafka_msg_destroy(msg);
    }
    if (have < N_JOBS) fail_msg("%d of %d results within %d ms", have, N_JOBS, timeout_ms);
}

/* GET /metrics; returns the value of the sample `name{worker=...}` or -1. */
static double metric(int port, const char *name) {
    char cmd[256], line[512];
    snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/metrics", port);
    FILE *f = popen(cmd, "r");
    double v = -1;
    if (!f) return -1;
    size_t n = strlen(name);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == '{') v = atof(strchr(line, '}') + 1);
    pclose(f);
    return v;
}

/* ---- the runs ------------------------------------------------------------------------ */

/* Every job on model m through one worker with --mtp_k=mtp_k; results checked against generate. */
static void run_jobs(model_ref *m, int mtp_k, int expect_accepts) {
    static scenario s;
    memset(&s, 0, sizeof s);
    char tag[64];
    snprintf(tag, sizeof tag, "wk-mtp-%s-%d", m->preset, mtp_k);
    scenario_open(&s, tag);
    make_jobs(&s, m, "mtp");
    add_batch(&s, 0, 6); /* three batches: jobs of the next one join as sequences finish */
    add_batch(&s, 6, 11);
    add_batch(&s, 11, N_JOBS);
    int port;
    pid_t w = start_worker(&s, m, mtp_k, &port);
    collect(&s, 60000);
    long long drafted = 0, accepted = 0, sampled_drafted = 0;
    int stopped = 0;
    for (int i = 0; i < N_JOBS; i++) {
        tjob *j = &s.jobs[i];
        assert_string_equal(j->status, "ok");
        if (j->n_got != j->n_expect || memcmp(j->got, j->expect, (size_t)j->n_expect * sizeof *j->expect))
            fail_msg("%s mtp_k %d job %d (greedy %d, mtp %d, stop \"%s\", max %d): %d tokens, generate alone %d%s",
                     m->preset, mtp_k, i, j->greedy, j->mtp, j->stop, j->max_new, j->n_got, j->n_expect,
                     j->n_got == j->n_expect ? " (different ids)" : "");
        if (j->stop[0] && j->n_expect < j->max_new) {
            assert_string_equal(j->finish, "stop");
            stopped++;
        }
        int speculative = mtp_k != 0 && j->mtp; /* sampled jobs too: exact mode, the plain sampler's tokens */
        assert_int_equal(j->has_mtp, speculative);
        if (!speculative) continue;
        assert_true(j->accepted <= j->drafted);
        if (mtp_k > 0 && j->n_got > mtp_k + 1) assert_true(j->drafted > 0); /* auto may choose none for a job */
        drafted += j->drafted, accepted += j->accepted;
        if (!j->greedy) sampled_drafted += j->drafted;
    }
    print_message("%s mtp_k %d: drafted %lld (sampled jobs %lld) accepted %lld (%.0f%%), %d jobs ended by a stop "
                  "string\n", m->preset, mtp_k, drafted, sampled_drafted, accepted,
                  drafted ? 100.0 * (double)accepted / (double)drafted : 0.0, stopped);
    assert_true(stopped >= 2);
    if (mtp_k > 0) assert_true(drafted > 0 && sampled_drafted > 0);
    if (expect_accepts) assert_true(accepted > 0 && accepted * 2 > drafted);
    double m_drafted = metric(port, "moeq_worker_mtp_drafted_total");
    if (m_drafted >= 0) { /* curl reached it */
        assert_true(m_drafted == (double)drafted);
        assert_true(metric(port, "moeq_worker_mtp_accepted_total") == (double)accepted);
        double rate = metric(port, "moeq_worker_mtp_acceptance_rate");
        assert_true(rate >= 0 && rate <= 1);
        double shared = metric(port, "moeq_worker_prefix_tokens_shared_total");
        print_message("/metrics: drafted %.0f, acceptance rate %.4f, prompt tokens forked %.0f\n", m_drafted, rate,
                      shared);
        assert_true(shared > 0); /* the results above were checked with forks in play */
    }
    assert_int_equal(stop_worker(w), 0);
    scenario_close(&s);
}

/* Every result of s carries generate's tokens (the check of run_jobs, without the MTP bookkeeping). */
static void expect_tokens(scenario *s, const char *round) {
    for (int i = 0; i < N_JOBS; i++) {
        tjob *j = &s->jobs[i];
        assert_string_equal(j->status, "ok");
        if (j->n_got != j->n_expect || memcmp(j->got, j->expect, (size_t)j->n_expect * sizeof *j->expect))
            fail_msg("%s round: job %d: %d tokens, generate alone %d", round, i, j->n_got, j->n_expect);
    }
}

/*
 * The same prompts twice through one worker (new job ids the second time), MTP on: the second round finds
 * the first round's blocks (prefix cache, plain and MTP entries) and still gives generate's tokens; /metrics
 * shows the hits.
 */
static void a_second_round_of_the_same_prompts_hits_the_prefix_cache_and_gives_the_same_tokens(void **state) {
    (void)state;
    static scenario s;
    memset(&s, 0, sizeof s);
    model_ref *m = &g_models[0];
    scenario_open(&s, "wk-prefix");
    make_jobs(&s, m, "pc1");
    add_batch(&s, 0, N_JOBS);
    int port;
    pid_t w = start_worker(&s, m, 2, &port);
    collect(&s, 60000);
    expect_tokens(&s, "first");
    double hits0 = metric(port, "moeq_worker_prefix_cache_hit_tokens_total");
    make_jobs(&s, m, "pc2");
    add_batch(&s, 0, 8);
    add_batch(&s, 8, N_JOBS);
    collect(&s, 60000);
    expect_tokens(&s, "second");
    double hits = metric(port, "moeq_worker_prefix_cache_hit_tokens_total");
    if (hits >= 0) { /* curl reached it */
        double lookups = metric(port, "moeq_worker_prefix_cache_lookups_total");
        double rate = metric(port, "moeq_worker_prefix_cache_hit_rate");
        print_message("/metrics: prefix cache lookups %.0f, hit tokens %.0f (first round %.0f), hit rate %.3f, "
                      "cached blocks %.0f\n", lookups, hits, hits0, rate,
                      metric(port, "moeq_worker_prefix_cache_cached_blocks"));
        assert_true(lookups >= N_JOBS);
        assert_true(hits - hits0 >= 16 * (N_JOBS / 2)); /* at least a block of each instruction-led prompt */
        assert_true(rate > 0 && rate <= 1);
    }
    assert_int_equal(stop_worker(w), 0);
    scenario_close(&s);
}

static void tiny_mtp_with_mtp_gives_what_generate_alone_gives_and_reports_accepted_drafts(void **state) {
    (void)state;
    run_jobs(&g_models[0], 2, 1);
}

/* mtp_k = auto: each plan chooses every job's drafts (0-3) from its acceptance and the measured steps; the
 * tokens are still generate's, job by job. (On tiny-mtp a draft pass costs 0.6 of a step, so auto soon stops
 * drafting at its ~0.66 acceptance: which choices pay is bench-mtp's and the unit tests' to show.) */
static void tiny_mtp_with_mtp_k_auto_gives_what_generate_alone_gives(void **state) {
    (void)state;
    run_jobs(&g_models[0], MTP_AUTO, 0);
}

static void tiny_with_a_random_mtp_layer_and_mtp_k_auto_gives_the_same_tokens(void **state) {
    (void)state;
    run_jobs(&g_models[1], MTP_AUTO, 0); /* drafts rejected: auto learns to stop, the tokens do not change */
}

static void tiny_mtp_without_mtp_gives_the_same_tokens(void **state) {
    (void)state;
    run_jobs(&g_models[0], 0, 0);
}

static void tiny_with_a_random_mtp_layer_gives_the_same_tokens_with_mtp_on(void **state) {
    (void)state;
    run_jobs(&g_models[1], 3, 0); /* nearly every draft rejected: the rejection path */
}

static void tiny_without_mtp_gives_the_same_tokens(void **state) {
    (void)state;
    run_jobs(&g_models[1], 0, 0);
}

/* After each test: a worker that a failed check left running is stopped, so the next test's (on the same
 * port) can start. */
static int stop_left_worker(void **state) {
    (void)state;
    if (g_worker > 0) stop_worker(g_worker);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--backend")) g_backend = argv[2]; /* the workers' (expectations: cpu) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(tiny_mtp_with_mtp_gives_what_generate_alone_gives_and_reports_accepted_drafts,
                                  stop_left_worker),
        cmocka_unit_test_teardown(tiny_mtp_with_mtp_k_auto_gives_what_generate_alone_gives, stop_left_worker),
        cmocka_unit_test_teardown(tiny_with_a_random_mtp_layer_and_mtp_k_auto_gives_the_same_tokens,
                                  stop_left_worker),
        cmocka_unit_test_teardown(tiny_mtp_without_mtp_gives_the_same_tokens, stop_left_worker),
        cmocka_unit_test_teardown(tiny_with_a_random_mtp_layer_gives_the_same_tokens_with_mtp_on, stop_left_worker),
        cmocka_unit_test_teardown(tiny_without_mtp_gives_the_same_tokens, stop_left_worker),
        cmocka_unit_test_teardown(a_second_round_of_the_same_prompts_hits_the_prefix_cache_and_gives_the_same_tokens,
                                  stop_left_worker),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
