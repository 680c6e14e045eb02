/*
 * test_worker_e2e.c — the whole pipeline, as a user runs it: the example
 * producers of examples/ (Python + msgpack, Node + msgpack, kcat + JSON)
 * put MOEQ_E2E_JOBS (default 1,000) jobs on Kafka; a real `moeq coordinator`
 * batches them into Redis; two `moeq worker` processes run them on the tiny
 * model; the results come back on Kafka. Every job must get exactly one
 * result, equal token for token to moeq_generate for that job alone with the
 * same seed (the job's, else the worker's FNV-1a of the id) — a job that
 * ended on one of its stop strings gets the generate tokens up to there.
 *
 * The jobs are read back from the jobs topic (the producers choose the
 * ids), decoded with the C codec and tokenized as `moeq generate` does.
 * Needs the `services` fixture (skips with 77 without it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "moeq/engine.h"
#include "moeq/job.h"
#include "moeq/tokenizer.h"
#include "test_worker_e2e_harness.h"
#include "worker.h"

static e2e g_t;
static moeq_model *g_mdl;
static moeq_tokenizer *g_tok;
static moeq_engine *g_engine;

static int run_producer(const char *fmt, const char *topic, int count) {
    char cmd[2048];
    const char *src = getenv("MOEQ_SOURCE_DIR");
    snprintf(cmd, sizeof cmd, fmt, src ? src : ".", g_t.kafka, topic, count);
    return system(cmd) == 0 ? 0 : -1;
}

/* The prompt ids `moeq generate` would run for this job. */
static void job_prompt(const moeq_job *job, moeq_tokens *t) {
    char err[256];
    memset(t, 0, sizeof *t);
    if (job->input == MOEQ_JOB_INPUT_TOKENS) {
        t->ids = malloc(sizeof *t->ids * (job->n_tokens ? job->n_tokens : 1));
        memcpy(t->ids, job->tokens, sizeof *t->ids * job->n_tokens);
        t->n = job->n_tokens;
    } else if (job->input == MOEQ_JOB_INPUT_PROMPT) {
        unsigned flags = moeq_tokenizer_add_bos(g_tok) ? MOEQ_TOKENIZE_ADD_BOS : 0;
        assert_int_equal(moeq_tokenizer_encode(g_tok, job->prompt, job->prompt_len, flags, t, err, sizeof err), MOEQ_OK);
    } else {
        moeq_chat_message m[16];
        assert_true(job->n_messages <= 16);
        for (size_t i = 0; i < job->n_messages; i++) m[i] = (moeq_chat_message){job->messages[i].role, job->messages[i].content};
        assert_int_equal(moeq_tokenizer_apply_chat(g_tok, m, job->n_messages, 1, t, err, sizeof err), MOEQ_OK);
    }
}

/* 0 when the job's result equals generate alone (up to a stop string the result ended on). */
static int check_job(const moeq_job *job, const e2e_job *r) {
    moeq_tokens t;
    job_prompt(job, &t);
    int32_t eos = moeq_tokenizer_eos_id(g_tok);
    moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = job->max_new_tokens,
                               .stop_ids = &eos, .n_stop_ids = eos >= 0};
    gp.sampling.temperature = job->temperature;
    gp.sampling.top_k = job->top_k;
    gp.sampling.top_p = job->top_p;
    gp.sampling.seed = job->has_seed ? job->seed : moeq_worker_seed_for_id(job->id, job->id_len);
    int32_t *out = NULL;
    int n_out = 0;
    char err[256];
    assert_int_equal(moeq_generate(g_engine, t.ids, (int)t.n, &gp, &out, &n_out, err, sizeof err), MOEQ_OK);
    moeq_tokens_free(&t);
    int bad = strcmp(r->status, "ok") != 0 || r->n_tokens > n_out ||
              memcmp(r->tokens, out, (size_t)r->n_tokens * sizeof *out) != 0 ||
              (r->n_tokens < n_out && !(job->n_stop > 0 && !strcmp(r->finish, "stop")));
    if (bad)
        fprintf(stderr, "e2e: %s: %s/%s, %d tokens; generate gave %d (first %d vs %d)\n", r->id, r->status, r->finish,
                r->n_tokens, n_out, r->n_tokens ? r->tokens[0] : -1, n_out ? out[0] : -1);
    free(out);
    return bad;
}

static void jobs_from_three_languages_come_back_once_each_equal_to_generate_alone(void **state) {
    (void)state;
    int n_total = getenv("MOEQ_E2E_JOBS") ? atoi(getenv("MOEQ_E2E_JOBS")) : 1000;
    int n_py = n_total / 3, n_node = n_total / 3, n_kcat = n_total - n_py - n_node;
    int64_t t0 = moeq_now_ms();
    moeq_kafka_consumer *jobs_in = e2e_subscribe(&g_t, g_t.jobs_topic, "jobs");
    assert_non_null(jobs_in);
    pid_t coord = e2e_start_coordinator(&g_t, NULL);
    pid_t w1 = e2e_start_worker(&g_t, "e2e-w1", NULL), w2 = e2e_start_worker(&g_t, "e2e-w2", NULL);
    assert_int_equal(run_producer("/usr/bin/python3 %s/examples/python/producer.py --brokers %s --topic %s --count %d",
                                  g_t.jobs_topic, n_py), 0);
    assert_int_equal(run_producer("node %s/examples/node/producer.js --brokers %s --topic %s --count %d", g_t.jobs_topic,
                                  n_node), 0);
    assert_int_equal(run_producer("%s/examples/kcat/produce.sh --brokers %s --topic %s --count %d >/dev/null",
                                  g_t.jobs_topic, n_kcat), 0);
    int64_t t_produced = moeq_now_ms();

    /* the jobs as the producers wrote them */
    moeq_job *jobs = calloc((size_t)n_total, sizeof *jobs);
    int n_jobs = 0;
    int64_t deadline = moeq_now_ms() + 60000;
    while (n_jobs < n_total && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        char err[256];
        if (moeq_kafka_consumer_poll(jobs_in, 100, &m, err, sizeof err) || !m) continue;
        size_t len = 0, ct_len = 0;
        const void *v = moeq_kafka_msg_value(m, &len);
        const void *ct = NULL;
        char content_type[64] = "";
        if (moeq_kafka_msg_header(m, "content-type", &ct, &ct_len) == MOEQ_OK)
            snprintf(content_type, sizeof content_type, "%.*s", (int)ct_len, (const char *)ct);
        moeq_job_reject rej;
        if (v && len > 4 && moeq_job_decode(v, len, content_type[0] ? content_type : NULL, NULL, &jobs[n_jobs], &rej) == MOEQ_OK)
            n_jobs++;
        moeq_kafka_msg_destroy(m);
    }
    moeq_kafka_consumer_destroy(jobs_in);
    assert_int_equal(n_jobs, n_total);

    size_t have = e2e_collect(&g_t, (size_t)n_total, 240000);
    int64_t t_done = moeq_now_ms();
    e2e_collect(&g_t, (size_t)n_total + 1, 1000); /* late duplicates, if any */
    assert_int_equal(e2e_term(w1, 20000), 0);
    assert_int_equal(e2e_term(w2, 20000), 0);
    e2e_term(coord, 20000);
    print_message("e2e: %d jobs (python %d, node %d, kcat %d): produced in %lld ms, all results %lld ms later; "
                  "%lld results, %lld duplicates\n",
                  n_total, n_py, n_node, n_kcat, (long long)(t_produced - t0), (long long)(t_done - t_produced),
                  g_t.results_seen, g_t.duplicates);
    assert_int_equal(have, (size_t)n_total);
    int bad = 0;
    for (int i = 0; i < n_jobs; i++) {
        e2e_job *r = e2e_job_find(&g_t, jobs[i].id);
        if (!r || r->n_results == 0) {
            fprintf(stderr, "e2e: no result for %s\n", jobs[i].id);
            bad++;
            continue;
        }
        bad += r->n_results != 1;
        bad += check_job(&jobs[i], r);
        moeq_job_free(&jobs[i]);
    }
    free(jobs);
    print_message("e2e: checked against generate alone in %lld ms\n", (long long)(moeq_now_ms() - t_done));
    assert_int_equal(bad, 0);
    assert_int_equal(g_t.n_jobs, (size_t)n_total); /* no result for an id nobody sent */
}

static int group_setup(void **state) {
    (void)state;
    int rc = e2e_open(&g_t, "wke2e");
    if (rc == MOEQ_TEST_SKIP) exit(MOEQ_TEST_SKIP);
    if (rc) return -1;
    char err[512];
    if (moeq_model_load(g_t.model, NULL, &g_mdl, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    if (moeq_tokenizer_load(g_t.model, &g_tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    moeq_engine_params p = moeq_engine_default_params();
    p.max_seqs = 1;
    p.n_threads = 1;
    p.kv_cache_tokens = 4096;
    p.max_step_tokens = 512;
    if (moeq_engine_new(g_mdl, &p, &g_engine, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    moeq_engine_destroy(g_engine);
    moeq_tokenizer_destroy(g_tok);
    moeq_model_destroy(g_mdl);
    e2e_close(&g_t);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(jobs_from_three_languages_come_back_once_each_equal_to_generate_alone),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
