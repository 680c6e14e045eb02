/*
 * test_worker_numerics.c — issue 11's numbers, contexts and text through a
 * real `moeq worker` (Redis and Kafka from the `services` fixture), on a
 * tiny checkpoint whose embedding row POISON holds a NaN:
 *
 *  - NaN crashes the engine: the job whose prompt reads the poisoned row
 *    gets error numerical_error; its batch-mate, in the same engine steps,
 *    gets exactly what moeq_generate gives it alone (the worker published
 *    `ok` with tokens [0,0,...] for the poisoned one);
 *  - no context-length check: a job whose prompt + max_new_tokens exceeds
 *    max_position_embeddings (256) gets prompt_too_long, as does one past a
 *    configured max_model_len;
 *  - result text is cut at the first NUL byte: a job whose output decodes to
 *    a 0x00 byte gets every byte of its text, in JSON and in msgpack.
 *
 * Skips with 77 without the services.
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
#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/redis.h"
#include "moeq/result.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"
#include "services_env.h"
#include "worker_test_util.h"

#define POISON 7 /* the embedding row holding a NaN */
#define MAX_JOBS 8

static char g_kafka[128], g_redis[128], g_good[512], g_nan[512], g_moeq[512], g_logs[512];
static moeq_model *g_mdl;
static moeq_tokenizer *g_tok;
static moeq_engine *g_engine;

typedef struct njob {
    const char *name;
    int32_t tokens[8];
    int n_tokens, max_new, msgpack;
    char id[160];
    moeq_buf bytes;           /* the job as sent                        */
    int n_results;
    char status[16], code[32], message[512];
    int32_t got[64];
    int n_got;
    char text[512];           /* the result's text, every byte         */
    size_t text_len;
} njob;

static int group_setup(void **state) {
    (void)state;
    if (moeq_test_service("MOEQ_TEST_KAFKA", g_kafka, sizeof g_kafka) ||
        moeq_test_service("MOEQ_TEST_REDIS", g_redis, sizeof g_redis))
        exit(MOEQ_TEST_SKIP);
    const char *build = getenv("MOEQ_BUILD_DIR") ? getenv("MOEQ_BUILD_DIR") : ".";
    snprintf(g_moeq, sizeof g_moeq, "%s/cli/moeq", build);
    snprintf(g_good, sizeof g_good, "%s/test-numerics-model", build);
    snprintf(g_nan, sizeof g_nan, "%s/test-numerics-model-nan", build);
    snprintf(g_logs, sizeof g_logs, "%s", build);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s && %s gen-model --preset tiny --out %s >/dev/null", g_good, g_nan,
             g_moeq, g_good);
    if (system(cmd) != 0) return fprintf(stderr, "%s: failed\n", cmd), -1;
    char err[512];
    if (moeq_model_load(g_good, NULL, &g_mdl, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    if (moeq_tokenizer_load(g_good, &g_tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    moeq_engine_params p = moeq_engine_default_params();
    p.max_seqs = 1;
    p.n_threads = 1;
    p.kv_cache_tokens = 1024;
    if (moeq_engine_new(g_mdl, &p, &g_engine, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    moeq_engine_destroy(g_engine);
    moeq_tokenizer_destroy(g_tok);
    moeq_model_destroy(g_mdl);
    return 0;
}

/* The job as JSON, or as msgpack (the same job through the codec), with its prompt ids. */
static void make_job(njob *j, const char *ns) {
    snprintf(j->id, sizeof j->id, "%s-%s", ns, j->name);
    char json[512];
    int off = snprintf(json, sizeof json, "{\"v\":1,\"id\":\"%s\",\"tokens\":[", j->id);
    for (int i = 0; i < j->n_tokens; i++) off += snprintf(json + off, sizeof json - off, "%s%d", i ? "," : "", j->tokens[i]);
    snprintf(json + off, sizeof json - off, "],\"max_new_tokens\":%d,\"temperature\":0}", j->max_new);
    if (!j->msgpack) {
        assert_int_equal(moeq_buf_append(&j->bytes, json, strlen(json)), MOEQ_OK);
        return;
    }
    moeq_job_limits lim = moeq_job_default_limits();
    moeq_job job;
    moeq_job_reject rej;
    assert_int_equal(moeq_job_decode(json, strlen(json), "application/json", &lim, &job, &rej), MOEQ_OK);
    assert_int_equal(moeq_job_encode(&job, MOEQ_WIRE_MSGPACK, &j->bytes), MOEQ_OK);
    moeq_job_free(&job);
}

static void send_batch(moeq_redis *redis, const char *prefix, njob *jobs, int n) {
    moeq_batch_entry_job bj[MAX_JOBS];
    for (int i = 0; i < n; i++) {
        njob *j = &jobs[i];
        const char *ct = j->msgpack ? "application/msgpack" : "application/json";
        bj[i] = (moeq_batch_entry_job){.id = j->id, .id_len = strlen(j->id), .content_type = ct,
                                       .content_type_len = strlen(ct), .job = (const char *)j->bytes.data,
                                       .job_len = j->bytes.len, .kafka_ts_ms = moeq_now_ms(),
                                       .arrival_ms = moeq_now_ms(), .tokens = j->tokens,
                                       .n_tokens = (size_t)j->n_tokens};
    }
    wt_add_batch(redis, prefix, 1, bj, (size_t)n, NULL, 0);
}

static pid_t start_worker(const char *model, const char *ns, const char *results, const char *extra) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=%s --results_topic=%s "
             "--worker_id=%s-w --max_seqs=4 --max_step_tokens=64 --kv_cache_tokens=2048 --n_threads=1 "
             "--visibility_timeout_ms=3000 --heartbeat_interval_ms=500 --block_ms=100 %s 2>>%s/worker-%s.log",
             g_moeq, model, g_redis, g_kafka, ns, results, ns, extra, g_logs, ns);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    return pid;
}

static void take_result(njob *jobs, int n, const moeq_result *r) {
    for (int i = 0; i < n; i++) {
        njob *j = &jobs[i];
        if (strcmp(j->id, r->id) || j->n_results++) continue;
        snprintf(j->status, sizeof j->status, "%s", moeq_result_status_name(r->status));
        snprintf(j->code, sizeof j->code, "%s", r->error.code ? r->error.code : "");
        snprintf(j->message, sizeof j->message, "%s", r->error.message ? r->error.message : "");
        j->n_got = r->n_tokens < 64 ? (int)r->n_tokens : 64;
        if (j->n_got) memcpy(j->got, r->tokens, (size_t)j->n_got * sizeof *r->tokens);
        j->text_len = r->text && r->text_len < sizeof j->text ? r->text_len : 0;
        if (j->text_len) memcpy(j->text, r->text, j->text_len);
    }
}

/* Run the jobs through one worker on model; every job's first result lands in it. */
static void run(const char *tag, const char *model, const char *extra, njob *jobs, int n) {
    char ns[96], prefix[160], results[160], group[160];
    moeq_test_unique_name(ns, sizeof ns, tag);
    snprintf(prefix, sizeof prefix, "%s:batches:p", ns);
    snprintf(results, sizeof results, "%s.results", ns);
    snprintf(group, sizeof group, "%s.g", ns);
    moeq_redis *redis = wt_open_streams(g_redis, prefix);
    moeq_kafka_consumer *consumer = wt_results_consumer(g_kafka, results, group);
    for (int i = 0; i < n; i++) make_job(&jobs[i], ns);
    send_batch(redis, prefix, jobs, n);
    pid_t w = start_worker(model, ns, results, extra);
    int have = 0;
    for (int64_t deadline = moeq_now_ms() + 60000; have < n && moeq_now_ms() < deadline;) {
        moeq_kafka_msg *m = NULL;
        char err[256];
        assert_int_equal(moeq_kafka_consumer_poll(consumer, 100, &m, err, sizeof err), MOEQ_OK);
        size_t len = 0;
        const void *v = m ? moeq_kafka_msg_value(m, &len) : NULL;
        moeq_result r;
        if (v && moeq_result_decode(v, len, NULL, 0, &r, err, sizeof err) == MOEQ_OK) {
            take_result(jobs, n, &r);
            moeq_result_free(&r);
        }
        moeq_kafka_msg_destroy(m);
        have = 0;
        for (int i = 0; i < n; i++) have += jobs[i].n_results > 0;
    }
    int st = 0;
    int alive = waitpid(w, &st, WNOHANG) == 0; /* a crashed worker (SIGSEGV) has exited by now */
    kill(w, SIGTERM);
    waitpid(w, &st, 0);
    assert_true(alive);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    moeq_kafka_consumer_destroy(consumer);
    moeq_redis_destroy(redis);
    for (int i = 0; i < n; i++) {
        if (!jobs[i].n_results) fail_msg("job %s: no result", jobs[i].name);
        moeq_buf_free(&jobs[i].bytes);
    }
}

/* What moeq_generate gives the job alone on the clean checkpoint (greedy, the model's eos). */
static int generate_alone(const njob *j, int32_t *out, int cap) {
    int32_t eos = moeq_tokenizer_eos_id(g_tok), *ids = NULL;
    moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = j->max_new,
                               .stop_ids = &eos, .n_stop_ids = eos >= 0};
    int n = 0;
    char err[256];
    assert_int_equal(moeq_generate(g_engine, j->tokens, j->n_tokens, &gp, &ids, &n, err, sizeof err), MOEQ_OK);
    assert_true(n <= cap);
    memcpy(out, ids, (size_t)n * sizeof *ids);
    free(ids);
    return n;
}

static int contains(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/*
 * Three jobs in one batch on a checkpoint with two NaN embedding rows: POISON, read by one job's prompt
 * (prefill), and the third token the "late" job generates (read when that token is fed back: mid-decode, in an
 * MTP round since the worker drafts for tiny's MTP layer). The healthy job reads neither.
 */
static void nan_crashes_the_engine_only_the_poisoned_job_gets_numerical_error(void **state) {
    (void)state;
    njob jobs[3] = {{.name = "poisoned", .tokens = {5, POISON, 9}, .n_tokens = 3, .max_new = 8},
                    {.name = "healthy", .tokens = {5, 9, 11}, .n_tokens = 3, .max_new = 8},
                    {.name = "late", .tokens = {5, 13, 17}, .n_tokens = 3, .max_new = 8}};
    int32_t want[64], late[64];
    int n_want = generate_alone(&jobs[1], want, 64), n_late = generate_alone(&jobs[2], late, 64);
    assert_true(n_late >= 4);
    int32_t second = late[2];
    assert_false(contains(want, n_want, POISON) || contains(want, n_want, second)); /* it reads neither row */
    assert_false(contains(jobs[1].tokens, 3, second) || contains(jobs[2].tokens, 3, second) ||
                 contains(late, 2, second) || contains(late, n_late, POISON) || second == POISON);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && cp -r %s %s && python3 %s/tests/poke_weights.py %s model.embed_tokens.weight %d nan && "
             "python3 %s/tests/poke_weights.py %s model.embed_tokens.weight %d nan",
             g_nan, g_good, g_nan, MOEQ_SOURCE_DIR, g_nan, POISON, MOEQ_SOURCE_DIR, g_nan, (int)second);
    assert_int_equal(system(cmd), 0);
    run("wk-nan", g_nan, "", jobs, 3);
    for (int i = 0; i < 3; i += 2) {
        assert_string_equal(jobs[i].status, "error");
        assert_string_equal(jobs[i].code, "numerical_error");
        assert_non_null(strstr(jobs[i].message, "NaN"));
        assert_non_null(strstr(jobs[i].message, "first seen by the router of layer "));
    }
    assert_int_equal(jobs[0].n_got, 0);
    assert_true(jobs[2].n_got <= 3); /* the tokens before the poisoned one's logits, as generated alone */
    assert_memory_equal(jobs[2].got, late, (size_t)jobs[2].n_got * sizeof *late);
    assert_string_equal(jobs[1].status, "ok");
    assert_int_equal(jobs[1].n_got, n_want);
    assert_memory_equal(jobs[1].got, want, (size_t)n_want * sizeof *want);
}

static void no_context_length_check_prompt_too_long_is_answered_by_the_worker(void **state) {
    (void)state;
    njob model_ctx[2] = {{.name = "past", .tokens = {5, 9}, .n_tokens = 2, .max_new = 255},  /* 257 > 256 */
                         {.name = "fits", .tokens = {5, 9}, .n_tokens = 2, .max_new = 254}}; /* 256 */
    run("wk-ctx", g_good, "", model_ctx, 2);
    assert_string_equal(model_ctx[0].status, "error");
    assert_string_equal(model_ctx[0].code, "prompt_too_long");
    assert_non_null(strstr(model_ctx[0].message, "prompt of 2 tokens + max_new_tokens 255"));
    assert_non_null(strstr(model_ctx[0].message, "context of 256 tokens"));
    assert_string_equal(model_ctx[1].status, "ok");
    njob configured[2] = {{.name = "past", .tokens = {5, 9, 11}, .n_tokens = 3, .max_new = 30},  /* 33 > 32 */
                          {.name = "fits", .tokens = {5, 9, 11}, .n_tokens = 3, .max_new = 29}}; /* 32 */
    run("wk-ctx-len", g_good, "--max_model_len=32", configured, 2);
    assert_string_equal(configured[0].code, "prompt_too_long");
    assert_non_null(strstr(configured[0].message, "context of 32 tokens"));
    assert_string_equal(configured[1].status, "ok");
}

static void result_text_is_cut_at_the_first_nul_byte_no_more_in_json_or_msgpack(void **state) {
    (void)state;
    njob jobs[2] = {{.name = "nul-json", .tokens = {58, 59, 60}, .n_tokens = 3, .max_new = 24},
                    {.name = "nul-msgpack", .tokens = {58, 59, 60}, .n_tokens = 3, .max_new = 24, .msgpack = 1}};
    int32_t want[64];
    int n_want = generate_alone(&jobs[0], want, 64);
    int has_nul_token = 0;
    for (int i = 0; i < n_want; i++) has_nul_token |= want[i] == 3; /* id 3 decodes to byte 0x00 */
    assert_true(has_nul_token);
    char *text = NULL, err[256];
    size_t text_len = 0;
    assert_int_equal(moeq_tokenizer_decode(g_tok, want, (size_t)n_want, MOEQ_DECODE_SKIP_SPECIAL, &text, &text_len,
                                           err, sizeof err),
                     MOEQ_OK);
    assert_non_null(memchr(text, 0, text_len));
    run("wk-nul", g_good, "", jobs, 2);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(jobs[i].status, "ok");
        assert_int_equal(jobs[i].n_got, n_want);
        if (jobs[i].text_len != text_len)
            fail_msg("%s: text of %zu bytes, the tokens decode to %zu", jobs[i].name, jobs[i].text_len, text_len);
        assert_memory_equal(jobs[i].text, text, text_len);
    }
    free(text);
}

/* check_weights = on: a worker on a checkpoint with a NaN refuses to start, naming the tensor; a clean one starts. */
static void a_worker_with_check_weights_refuses_a_checkpoint_holding_nan(void **state) {
    (void)state;
    char bad[600], log[700], cmd[8192];
    snprintf(bad, sizeof bad, "%s-checked", g_nan);
    snprintf(log, sizeof log, "%s/worker-check-weights.log", g_logs);
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && cp -r %s %s && python3 %s/tests/poke_weights.py %s model.layers.2.mlp.experts.3.up_proj.weight "
             "5 inf && %s worker --model=%s --redis_url=%s --kafka_brokers=%s --redis_prefix=numerics-cw "
             "--check_weights=on --n_threads=1 2>%s",
             bad, g_good, bad, MOEQ_SOURCE_DIR, bad, g_moeq, bad, g_redis, g_kafka, log);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char text[8192] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    assert_non_null(strstr(text, "tensor=model.layers.2.mlp.experts.3.up_proj.weight nonfinite=1"));
    assert_non_null(strstr(text, "check_weights: 1 tensor(s) hold NaN, inf or huge values"));
    njob jobs[1] = {{.name = "checked", .tokens = {5, 9, 11}, .n_tokens = 3, .max_new = 4}};
    run("wk-checked", g_good, "--check_weights=on", jobs, 1); /* a clean checkpoint passes and serves */
    assert_string_equal(jobs[0].status, "ok");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nan_crashes_the_engine_only_the_poisoned_job_gets_numerical_error),
        cmocka_unit_test(no_context_length_check_prompt_too_long_is_answered_by_the_worker),
        cmocka_unit_test(result_text_is_cut_at_the_first_nul_byte_no_more_in_json_or_msgpack),
        cmocka_unit_test(a_worker_with_check_weights_refuses_a_checkpoint_holding_nan),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
