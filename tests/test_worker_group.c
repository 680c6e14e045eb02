/*
 * test_worker_group.c — the worker as a rank of an expert-parallel group
 * (docs/EP.md), against the `services` fixture's real Kafka and Redis:
 *   - the Redis rendezvous (moeq:ep:<group>) hands out addresses of the
 *     current generation only, and a rank that restarts waits for the next;
 *   - a 2-rank group (UCX over tcp, a replicated placement file) behind the
 *     real coordinator answers every job once, equal to `moeq generate` alone;
 *   - kill -9 of one rank during a run of 300 jobs: the survivor fails its
 *     step within ep.timeout_ms, exits naming the dead rank and leaves its
 *     batches pending; both ranks restarted (a supervisor's job) form the
 *     group again under a new generation, and every job ends with a result
 *     (duplicates identical, none of a job the survivor answered: finished
 *     jobs are marked done as they are delivered);
 *     SIGSTOP of one rank: the survivor
 *     names it after ep.timeout_ms, and again no job is lost;
 *   - two "hosts": rank 1 in a network namespace of its own, joined to the
 *     host's by a veth pair, the ranks' UCX traffic over that link (tcp), the
 *     namespace reaching Kafka and Redis through a forwarder; every result
 *     equals generate alone (skipped, with the reason, where `ip netns` fails).
 * Skips (77) without the services or without UCX.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setns */
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include "ep_rendezvous_redis.h"
#include "moeq/engine.h"
#include "moeq/ep_placement.h"
#include "moeq/ep_plan.h"
#include "moeq/job.h"
#include "moeq/tokenizer.h"
#include "http_client.h"
#include "test_worker_e2e_harness.h"
#include "worker.h"

static e2e g_t;
static moeq_model *g_mdl;
static moeq_tokenizer *g_tok;
static moeq_engine *g_engine;
static pid_t g_pids[16]; /* every process started, killed in teardown should a test fail midway */
static int g_n_pids;

static pid_t track(pid_t pid) {
    if (g_n_pids < 16) g_pids[g_n_pids++] = pid;
    return pid;
}

static moeq_redis *redis_connect(void) {
    moeq_redis_params rp;
    moeq_redis *r = NULL;
    char err[256];
    assert_int_equal(moeq_redis_params_parse(g_t.redis, NULL, &rp, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_redis_new(&rp, &r, err, sizeof err), MOEQ_OK);
    return r;
}

static void the_redis_rendezvous_hands_out_the_current_generation_only(void **state) {
    (void)state;
    moeq_redis *redis = redis_connect();
    char group[128], err[512];
    snprintf(group, sizeof group, "%s-rv", g_t.ns);
    worker_ep_rv *r0 = NULL, *r1 = NULL, *late = NULL;
    assert_int_equal(worker_ep_rv_new(redis, g_t.ns, group, 0, 2, 2000, &r0, err, sizeof err), MOEQ_OK);
    assert_int_equal(worker_ep_rv_new(redis, g_t.ns, group, 1, 2, 2000, &r1, err, sizeof err), MOEQ_OK);
    int64_t gen = worker_ep_rv_generation(r0);
    assert_true(gen >= 1);
    assert_int_equal(worker_ep_rv_generation(r1), gen);
    moeq_ep_rendezvous h0 = worker_ep_rv_hook(r0), h1 = worker_ep_rv_hook(r1);
    const unsigned char a0[] = {0, 1, 2, 0xff, 0}, a1[] = {9, 0, 8};
    assert_int_equal(h0.publish(h0.ctx, 0, a0, sizeof a0, err, sizeof err), MOEQ_OK);
    assert_int_equal(h1.publish(h1.ctx, 1, a1, sizeof a1, err, sizeof err), MOEQ_OK);
    void *got = NULL;
    size_t len = 0;
    assert_int_equal(h1.lookup(h1.ctx, 0, 1000, &got, &len, err, sizeof err), MOEQ_OK); /* binary-safe */
    assert_int_equal(len, sizeof a0);
    assert_memory_equal(got, a0, sizeof a0);
    free(got);
    assert_int_equal(worker_ep_rv_formed(r0, err, sizeof err), MOEQ_OK);
    assert_int_equal(worker_ep_rv_formed(r1, err, sizeof err), MOEQ_OK);

    /* a rank that restarts now must not join the generation that formed: it waits for rank 0 to open one */
    assert_int_equal(worker_ep_rv_new(redis, g_t.ns, group, 1, 2, 300, &late, err, sizeof err), MOEQ_ERR_TIMEOUT);
    assert_non_null(strstr(err, "rank 0 opened no new generation"));

    /* rank 0 restarts: a new generation, the old addresses gone; the old rank's lookup fails at once */
    worker_ep_rv *n0 = NULL, *n1 = NULL;
    assert_int_equal(worker_ep_rv_new(redis, g_t.ns, group, 0, 2, 2000, &n0, err, sizeof err), MOEQ_OK);
    assert_int_equal(worker_ep_rv_generation(n0), gen + 1);
    int64_t t0 = moeq_now_ms();
    assert_int_equal(h1.lookup(h1.ctx, 0, 5000, &got, &len, err, sizeof err), MOEQ_ERR_IO);
    assert_true(moeq_now_ms() - t0 < 2000);
    assert_non_null(strstr(err, "re-formed under generation"));
    assert_int_equal(worker_ep_rv_new(redis, g_t.ns, group, 1, 2, 2000, &n1, err, sizeof err), MOEQ_OK);
    moeq_ep_rendezvous g1 = worker_ep_rv_hook(n1);
    assert_int_equal(g1.lookup(g1.ctx, 0, 200, &got, &len, err, sizeof err), MOEQ_ERR_TIMEOUT); /* a0 is stale */
    assert_non_null(strstr(err, "rank 0 did not publish"));

    /* the key expires by itself (a day after its last write) */
    char key[256];
    snprintf(key, sizeof key, "%s:ep:%s", g_t.ns, group);
    moeq_redis_reply *r = NULL;
    assert_int_equal(moeq_redis_command(redis, &r, err, sizeof err, "PTTL %s", key), MOEQ_OK);
    assert_true(moeq_redis_reply_int(r) > 0 && moeq_redis_reply_int(r) <= WORKER_EP_RV_TTL_MS);
    moeq_redis_reply_free(r);
    worker_ep_rv_destroy(r0), worker_ep_rv_destroy(r1), worker_ep_rv_destroy(n0), worker_ep_rv_destroy(n1);
    moeq_redis_destroy(redis);
}

/* Job i: ids grp-<ns>-<tag>-<i>, greedy or sampled, some seeded; JSON into out (returns its length). */
static int g_long_every; /* > 0: all but every g_long_every-th job ask for LONG_TOKENS (a batch that runs long) */
enum { LONG_TOKENS = 220 }; /* the test model's context is 256 tokens */

/* Put before every prompt: a long shared instruction makes later jobs fork a running job's cache. */
static const char *g_instruction = "";

static int job_json(const char *tag, int i, char *out, size_t size) {
    static const char *docs[] = {"Kafka stores records.", "Redis streams hold entries.", "A worker runs batches.",
                                 "Translate: good night", "List two colours."};
    int is_long = g_long_every > 0 && i % g_long_every != 0, tokens = is_long ? LONG_TOKENS : 2 + i % 6;
    int n = snprintf(out, size, "{\"v\":1,\"id\":\"grp-%s-%s-%d\",\"prompt\":\"%s%s (%d)\",\"max_new_tokens\":%d,"
                     "\"temperature\":%s", g_t.ns, tag, i, g_instruction, docs[i % 5], i, tokens,
                     i % 2 ? "0.8" : "0.0");
    if (is_long) n += snprintf(out + n, size - (size_t)n, ",\"min_tokens\":%d", LONG_TOKENS);
    if (i % 3) n += snprintf(out + n, size - (size_t)n, ",\"seed\":%d", i);
    n += snprintf(out + n, size - (size_t)n, "}");
    return n;
}

static void produce(const char *tag, int n_jobs) {
    char err[512];
    moeq_kafka_producer *prod = NULL;
    moeq_kafka_producer_params pp = {.brokers = g_t.kafka};
    assert_int_equal(moeq_kafka_producer_new(&pp, NULL, &prod, err, sizeof err), MOEQ_OK);
    for (int i = 0; i < n_jobs; i++) {
        char json[1536], id[160];
        int len = job_json(tag, i, json, sizeof json);
        snprintf(id, sizeof id, "grp-%s-%s-%d", g_t.ns, tag, i);
        moeq_kafka_header h = {"content-type", "application/json", 16};
        moeq_kafka_out m = {.topic = g_t.jobs_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = id,
                            .key_len = strlen(id), .value = json, .value_len = (size_t)len, .headers = &h,
                            .n_headers = 1};
        moeq_err e;
        while ((e = moeq_kafka_produce(prod, &m, err, sizeof err)) == MOEQ_ERR_TRANSIENT)
            moeq_kafka_producer_poll(prod, 10);
        assert_int_equal(e, MOEQ_OK);
    }
    assert_int_equal(moeq_kafka_producer_flush(prod, 30000, err, sizeof err), MOEQ_OK);
    moeq_kafka_producer_destroy(prod);
}

/* 0 when the job's result equals generate alone (ok, same tokens). */
static int check_job(const char *tag, int i, const e2e_job *r) {
    char json[1536], err[256];
    int len = job_json(tag, i, json, sizeof json);
    moeq_job job;
    moeq_job_reject rej;
    assert_int_equal(moeq_job_decode(json, (size_t)len, "application/json", NULL, &job, &rej), MOEQ_OK);
    moeq_tokens t = {0};
    unsigned flags = moeq_tokenizer_add_bos(g_tok) ? MOEQ_TOKENIZE_ADD_BOS : 0;
    assert_int_equal(moeq_tokenizer_encode(g_tok, job.prompt, job.prompt_len, flags, &t, err, sizeof err), MOEQ_OK);
    int32_t eos = moeq_tokenizer_eos_id(g_tok);
    moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = job.max_new_tokens,
                               .stop_ids = &eos, .n_stop_ids = eos >= 0};
    gp.sampling.temperature = job.temperature;
    gp.sampling.seed = job.has_seed ? job.seed : moeq_worker_seed_for_id(job.id, job.id_len);
    int32_t *out = NULL;
    int n_out = 0;
    assert_int_equal(moeq_generate(g_engine, t.ids, (int)t.n, &gp, &out, &n_out, err, sizeof err), MOEQ_OK);
    int bad = strcmp(r->status, "ok") != 0 || r->n_tokens != n_out ||
              memcmp(r->tokens, out, (size_t)n_out * sizeof *out) != 0;
    if (bad) fprintf(stderr, "group: %s: %s, %d tokens; generate gave %d\n", job.id, r->status, r->n_tokens, n_out);
    free(out);
    moeq_tokens_free(&t);
    moeq_job_free(&job);
    return bad;
}

static e2e_job *result_of(const char *tag, int i) {
    char id[160];
    snprintf(id, sizeof id, "grp-%s-%s-%d", g_t.ns, tag, i);
    return e2e_job_find(&g_t, id);
}

/* Jobs of tag [0, n) with a result. */
static int answered(const char *tag, int n) {
    int have = 0;
    for (int i = 0; i < n; i++) {
        e2e_job *r = result_of(tag, i);
        have += r && r->n_results > 0;
    }
    return have;
}

/* Collect results until `want` jobs of tag have one, or wait_ms passed; returns how many have one. */
static int collect_tag(const char *tag, int n, int want, int wait_ms) {
    int64_t deadline = moeq_now_ms() + wait_ms;
    int have = answered(tag, n);
    while (have < want && moeq_now_ms() < deadline) {
        e2e_collect(&g_t, g_t.n_jobs + 1, 200);
        have = answered(tag, n);
    }
    return have;
}

/* Rank r of a 2-rank group named after tag; worker id <ns>-<tag>-r<r> (the same across restarts). */
static pid_t start_rank(const char *tag, int r, const char *extra) {
    char wid[160], flags[1024];
    snprintf(wid, sizeof wid, "%s-r%d", tag, r);
    snprintf(flags, sizeof flags,
             "--ep.group=%s-%s --ep.ranks=2 --ep.rank=%d --ep.transport=ucx --ep.timeout_ms=3000 "
             "--ep.join_timeout_ms=60000 --visibility_timeout_ms=3000 --heartbeat_interval_ms=500 %s",
             g_t.ns, tag, r, extra ? extra : "");
    return track(e2e_start_worker(&g_t, wid, flags));
}

/*
 * Each rank wrote the load of its own tokens at exit (expert_stats_path): every token adds
 * top_k slots in each MoE layer, the MTP layer counted drafts, and `moeq ep-plan` plans from the two
 * files summed.
 */
static void each_rank_wrote_its_expert_load(const char *f0, const char *f1) {
    const moeq_model_config *c = moeq_model_get_config(g_mdl);
    const char *files[2] = {f0, f1};
    int64_t total = 0;
    for (int r = 0; r < 2; r++) {
        int64_t *counts = NULL, sum = 0;
        int E = 0;
        char err[256] = "";
        moeq_err rc = moeq_ep_stats_load(files[r], &counts, &E, err, sizeof err);
        if (rc) fprintf(stderr, "rank %d's expert stats: %s\n", r, err);
        assert_int_equal(rc, MOEQ_OK);
        assert_int_equal(E, c->n_routed_experts);
        for (int x = 0; x < E; x++) sum += counts[x];
        free(counts);
        assert_int_equal(sum % c->num_experts_per_tok, 0); /* whole tokens only (drafts add MTP-layer slots) */
        total += sum;
    }
    char cmd[3072];
    snprintf(cmd, sizeof cmd, "'%s' ep-plan --stats '%s' --stats '%s' --ranks 2 --replicas 2 --json > '%s.plan'",
             g_t.moeq, f0, f1, f0);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -q '\"max_over_mean\"' '%s.plan'", f0);
    assert_int_equal(system(cmd), 0);
    assert_true(total > 0); /* a rank that took no batch wrote zeros */
    /* the MTP layer (after the main ones) routed draft tokens: the group ran speculative rounds */
    snprintf(cmd, sizeof cmd, "cat '%s' '%s' | grep -q '^# layer %d:'", f0, f1, c->num_hidden_layers);
    assert_int_equal(system(cmd), 0);
}

static void a_two_rank_group_answers_every_job_once_as_moeq_generate_alone(void **state) {
    (void)state;
    enum { N = 40 };
    char path[640], flags[1500];
    snprintf(path, sizeof path, "%s/%s-placement.txt", g_t.logdir, g_t.ns);
    moeq_ep_placement *pl = NULL;
    int n_experts = moeq_model_get_config(g_mdl)->n_routed_experts;
    assert_int_equal(moeq_ep_placement_new_replicated(n_experts, 2, 6, &pl, NULL, 0), MOEQ_OK);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(moeq_ep_placement_print(pl, f), MOEQ_OK);
    fclose(f);
    moeq_ep_placement_destroy(pl);
    char stats[2][700], flags1[1500];
    for (int r = 0; r < 2; r++) snprintf(stats[r], sizeof stats[r], "%s/%s-eq-r%d.stats", g_t.logdir, g_t.ns, r);
    /* MTP rounds in the group (drafts on the rank; never paused for low acceptance: tiny's drafts are poor), and
     * forks of running jobs' prompts (the prefix cache off, so that the shared instruction is forked, not cached) */
    int port[2] = {h_free_port(), h_free_port()};
    const char *common = "--mtp_k=2 --mtp_min_acceptance=0 --prefix_cache=off --prefix_share_min=8";
    snprintf(flags, sizeof flags, "--ep.placement=%s --expert_stats_path=%s --http_port=%d %s", path, stats[0], port[0],
             common);
    snprintf(flags1, sizeof flags1, "--ep.placement=%s --expert_stats_path=%s --http_port=%d %s", path, stats[1],
             port[1], common);
    g_instruction = "You are a careful analyst. Read the document below, then answer in one short line, "
                    "plainly and without any preamble. Document: ";
    pid_t coord = track(e2e_start_coordinator(&g_t, NULL));
    pid_t r0 = start_rank("eq", 0, flags), r1 = start_rank("eq", 1, flags1);
    produce("eq", N);
    int have = collect_tag("eq", N, N, 120000);
    e2e_collect(&g_t, g_t.n_jobs + 1, 1000); /* late duplicates, if any */
    long long shared = 0;
    for (int r = 0; r < 2; r++) { /* prompt tokens taken from a running job's cache, on either rank */
        static char page[262144];
        const char *at = h_http_page(port[r], "/metrics", page, sizeof page) == 200
                             ? strstr(page, "\nmoeq_worker_prefix_tokens_shared_total{") : NULL;
        at = at ? strchr(at, '}') : NULL;
        if (at) shared += atoll(at + 1);
    }
    fprintf(stderr, "group: %lld prompt tokens forked from running jobs\n", shared);
    /* SIGTERM to one rank drains the whole group: both end cleanly */
    int64_t t0 = moeq_now_ms();
    kill(r1, SIGTERM);
    int st0 = -1, st1 = -1;
    while (moeq_now_ms() - t0 < 20000 && (st0 < 0 || st1 < 0)) {
        int st;
        if (st0 < 0 && waitpid(r0, &st, WNOHANG) == r0) st0 = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (st1 < 0 && waitpid(r1, &st, WNOHANG) == r1) st1 = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(20000);
    }
    if (st0 < 0) e2e_kill9(r0);
    if (st1 < 0) e2e_kill9(r1);
    e2e_term(coord, 20000);
    assert_int_equal(have, N);
    assert_int_equal(st0, 0); /* rank 0 got no signal: it drained because rank 1 did */
    assert_int_equal(st1, 0);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        e2e_job *r = result_of("eq", i);
        assert_non_null(r);
        bad += r->n_results != 1;
        bad += check_job("eq", i, r);
    }
    g_instruction = "";
    assert_int_equal(bad, 0);
    assert_true(shared > 0); /* forks ran in the group, and every result is still generate's */
    each_rank_wrote_its_expert_load(stats[0], stats[1]);
    /* each rank held only its own experts (6 of them on both ranks): local x MoE layers of all, none before */
    for (int r = 0; r < 2; r++) {
        char cmd[1024], line[1024] = "";
        snprintf(cmd, sizeof cmd, "grep -o 'local_experts=[0-9]* .*experts_held=[0-9]*/[0-9]* expert_bytes=[0-9]*' "
                 "'%s/%s-eq-r%d.log' | head -1", g_t.logdir, g_t.ns, r);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        if (!fgets(line, sizeof line, p)) line[0] = 0;
        pclose(p);
        long long local = -1, held = -1, total = -1, bytes = -1;
        const char *h = strstr(line, "experts_held="), *b = strstr(line, "expert_bytes=");
        assert_true(sscanf(line, "local_experts=%lld", &local) == 1 && h && b);
        assert_true(sscanf(h, "experts_held=%lld/%lld", &held, &total) == 2 && sscanf(b, "expert_bytes=%lld", &bytes) == 1);
        fprintf(stderr, "rank %d: %lld local experts, held %lld of %lld (layer, expert) pairs, %lld bytes\n", r, local,
                held, total, bytes);
        assert_true(local > 0 && local < n_experts && total % n_experts == 0 && total > 0);
        assert_int_equal(held, local * (total / n_experts));
        assert_true(bytes > 0);
    }
}

/*
 * A rank serves nothing until its whole group formed: its /readyz says so (503, naming the group and the wait)
 * while it waits for rank 1, and turns 200 once rank 1 joined; the heartbeat then names the group, its
 * generation and the rank.
 */
static void a_rank_is_not_ready_until_its_group_formed_and_its_heartbeat_names_the_group(void **state) {
    (void)state;
    int port = h_free_port();
    char flags[128], page[4096], want[256];
    snprintf(flags, sizeof flags, "--http_port=%d", port);
    pid_t r0 = start_rank("ready", 0, flags), r1 = -1;
    int64_t t0 = moeq_now_ms();
    int code = -1;
    while (moeq_now_ms() - t0 < 60000 && !((code = h_http_page(port, "/readyz", page, sizeof page)) == 503 &&
                                             strstr(page, "waiting for the other ranks")))
        usleep(100000);
    snprintf(want, sizeof want, "expert-parallel group %s-ready: rank 0 of 2", g_t.ns);
    int waited = code == 503 && strstr(page, want) != NULL;
    if (!waited) fprintf(stderr, "group: /readyz while alone: %d %s\n", code, page);
    r1 = start_rank("ready", 1, NULL);
    t0 = moeq_now_ms();
    while (moeq_now_ms() - t0 < 60000 && (code = h_http_page(port, "/readyz", page, sizeof page)) != 200) usleep(100000);
    int ready_ms = (int)(moeq_now_ms() - t0);
    moeq_redis *redis = redis_connect();
    char key[256], err[256];
    snprintf(key, sizeof key, "%s:worker:ready-r0", g_t.ns);
    moeq_redis_reply *r = NULL;
    const char *hb = NULL;
    for (int i = 0; i < 50 && !(hb && strstr(hb, "\"ep_rank\":0")); i++) {
        moeq_redis_reply_free(r), r = NULL, hb = NULL;
        if (moeq_redis_command(redis, &r, err, sizeof err, "GET %s", key) == MOEQ_OK)
            hb = moeq_redis_reply_str(r, NULL);
        if (!(hb && strstr(hb, "\"ep_rank\":0"))) usleep(100000);
    }
    snprintf(want, sizeof want, "\"ep_group\":\"%s-ready\",\"ep_generation\":", g_t.ns);
    int hb_ok = hb && strstr(hb, want) && strstr(hb, "\"ep_rank\":0,\"ep_ranks\":2");
    if (!hb_ok) fprintf(stderr, "group: heartbeat %s\n", hb ? hb : "(none)");
    moeq_redis_reply_free(r);
    moeq_redis_destroy(redis);
    kill(r0, SIGTERM);
    e2e_term(r0, 20000), e2e_term(r1, 20000);
    fprintf(stderr, "group: rank 0 not ready alone: %s; ready %d ms after rank 1 started\n", waited ? "yes" : "no",
            ready_ms);
    assert_true(waited);
    assert_int_equal(code, 200);
    assert_true(hb_ok);
}

static int log_has(const char *tag, int r, const char *needle) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "grep -q '%s' '%s/%s-%s-r%d.log'", needle, g_t.logdir, g_t.ns, tag, r);
    return system(cmd) == 0;
}

static void killing_one_rank_with_sigkill_loses_no_job_and_the_group_forms_again(void **state) {
    (void)state;
    int n = getenv("MOEQ_GROUP_JOBS") ? atoi(getenv("MOEQ_GROUP_JOBS")) : 300;
    pid_t coord = track(e2e_start_coordinator(&g_t, NULL));
    pid_t r0 = start_rank("kill", 0, NULL), r1 = start_rank("kill", 1, NULL);
    produce("kill", n);
    int before = collect_tag("kill", n, n / 4, 120000);
    assert_true(before >= n / 4 && before < n);
    e2e_kill9(r1);
    int64_t t_kill = moeq_now_ms();
    int st = 0, exited = 0;
    while (moeq_now_ms() - t_kill < 3000 + 10000)
        if (waitpid(r0, &st, WNOHANG) == r0) {
            exited = 1;
            break;
        } else {
            usleep(20000);
        }
    int64_t ms = moeq_now_ms() - t_kill;
    if (!exited) e2e_kill9(r0);
    assert_true(exited);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1); /* an error exit, for the supervisor to restart */
    assert_true(log_has("kill", 0, "ep_group_failed"));
    assert_true(log_has("kill", 0, "rank 1"));
    print_message("group: rank 1 killed after %d results; rank 0 exited after %lld ms naming it\n", before,
                  (long long)ms);
    /*
     * What the survivor answered before it exited (its results flushed on the way out): those jobs were marked
     * done in their records, so the restarted group must skip them, never answer them again.
     */
    e2e_collect(&g_t, g_t.n_jobs + 1, 1500);
    int *survivor_had = calloc((size_t)n, sizeof *survivor_had), n_survivor = 0;
    assert_non_null(survivor_had);
    for (int i = 0; i < n; i++) {
        e2e_job *r = result_of("kill", i);
        if (r && r->n_results && strstr(r->worker, "kill-r0")) survivor_had[i] = r->n_results, n_survivor++;
    }
    /* the supervisor: both ranks again, the same worker ids; the group forms under a new generation */
    r0 = start_rank("kill", 0, NULL), r1 = start_rank("kill", 1, NULL);
    int have = collect_tag("kill", n, n, 180000);
    e2e_collect(&g_t, g_t.n_jobs + 1, 1500); /* late duplicates */
    assert_int_equal(e2e_term(r0, 20000), 0);
    assert_int_equal(e2e_term(r1, 20000), 0);
    e2e_term(coord, 20000);
    assert_true(log_has("kill", 0, "generation=2") || log_has("kill", 1, "generation=2"));
    int missing = 0;
    for (int i = 0; i < n; i++) {
        e2e_job *r = result_of("kill", i);
        if (!r || !r->n_results) missing++;
    }
    int survivor_again = 0, dup_first[3] = {0, 0, 0}; /* duplicated jobs by their first result's worker: r0, r1, ? */
    for (int i = 0; i < n; i++) {
        e2e_job *r = result_of("kill", i);
        if (survivor_had[i] && r && r->n_results > survivor_had[i]) survivor_again++;
        if (r && r->n_results > 1) dup_first[strstr(r->worker, "kill-r0") ? 0 : strstr(r->worker, "kill-r1") ? 1 : 2]++;
    }
    print_message("group: duplicated jobs first answered by rank 0: %d, rank 1: %d, unknown: %d\n", dup_first[0],
                  dup_first[1], dup_first[2]);
    free(survivor_had);
    print_message("group: %d jobs, %d with a result, %lld results, %lld duplicates (all identical: %s); "
                  "of %d jobs the survivor answered, %d answered again\n", n, have, g_t.results_seen, g_t.duplicates,
                  g_t.mismatches ? "NO" : "yes", n_survivor, survivor_again);
    assert_int_equal(missing, 0);
    assert_int_equal(g_t.mismatches, 0);
    assert_int_equal(survivor_again, 0);
    /*
     * No bound on the killed rank's duplicates: its jobs are marked done as their delivery reports arrive, but
     * here a batch's jobs finish together and the test kills as soon as it sees their results, inside the few
     * milliseconds before those reports (0 to 256 duplicates over runs, as before the marking).
     */
}

/*
 * A batch whose short jobs are answered while its long ones still run (four sequences at a time): each answered
 * job's record is marked done once its result is delivered, so after kill -9 of the rank that answered them
 * (its batch still pending: the restart reclaims it) the restarted group skips them. Before the marking, every
 * one of them ran again (8 of 8).
 */
static void jobs_answered_before_a_kill_are_not_run_again(void **state) {
    (void)state;
    enum { N = 64 };
    g_long_every = 4; /* 48 long jobs and 16 short ones */
    pid_t coord = track(e2e_start_coordinator(&g_t, NULL));
    const char *slow = "--max_seqs=4"; /* four at a time: the long jobs keep the batch running for seconds */
    pid_t r0 = start_rank("mark", 0, slow), r1 = start_rank("mark", 1, slow);
    produce("mark", N);
    int before = collect_tag("mark", N, N / 8, 120000); /* some short ones */
    int had[N] = {0}, n_had = 0, long_done = 0, by_r1 = 0;
    for (int i = 0; i < N; i++) {
        e2e_job *r = result_of("mark", i);
        if (r && r->n_results) had[i] = r->n_results, n_had++, long_done += i % g_long_every != 0;
        by_r1 += had[i] && strstr(r->worker, "mark-r1") != NULL;
    }
    /* What the test saw was delivered; its delivery reports, then its marks, come within a loop turn of the rank,
     * which can outlast a fixed wait on a busy machine (a 300 ms sleep once saw none of 8 marks). Wait for the
     * marks themselves (the records' state "done"), at most 10 s: if they never come, `again` below says so. */
    moeq_redis *redis = redis_connect();
    for (int64_t t0 = moeq_now_ms(), marked = 0; marked < n_had && moeq_now_ms() - t0 < 10000; usleep(50000)) {
        marked = 0;
        for (int i = 0; i < N; i++) {
            if (!had[i]) continue;
            char key[256], err[256];
            snprintf(key, sizeof key, "%s:job:grp-%s-mark-%d", g_t.ns, g_t.ns, i);
            moeq_redis_reply *r = NULL;
            if (moeq_redis_command(redis, &r, err, sizeof err, "HGET %s state", key) == MOEQ_OK) {
                const char *st = moeq_redis_reply_str(r, NULL);
                marked += st && strcmp(st, "done") == 0;
            }
            moeq_redis_reply_free(r);
        }
    }
    moeq_redis_destroy(redis);
    /* the rank that answered them dies: it marks nothing on the way out, only what it marked before counts */
    int victim = 2 * by_r1 >= n_had ? 1 : 0;
    pid_t dead = victim ? r1 : r0, survivor = victim ? r0 : r1;
    e2e_kill9(dead);
    int st = 0;
    for (int64_t t0 = moeq_now_ms(); moeq_now_ms() - t0 < 13000 && waitpid(survivor, &st, WNOHANG) != survivor;)
        usleep(20000);
    if (kill(survivor, 0) == 0) e2e_kill9(survivor);
    r0 = start_rank("mark", 0, NULL), r1 = start_rank("mark", 1, NULL);
    int have = collect_tag("mark", N, N, 240000);
    int pending = log_has("mark", victim, "reclaimed=1"); /* the kill came while its batch ran */
    e2e_collect(&g_t, g_t.n_jobs + 1, 1500); /* late duplicates */
    assert_int_equal(e2e_term(r0, 20000), 0);
    assert_int_equal(e2e_term(r1, 20000), 0);
    e2e_term(coord, 20000);
    int again = 0;
    for (int i = 0; i < N; i++) {
        e2e_job *r = result_of("mark", i);
        again += had[i] && r && r->n_results > had[i];
    }
    print_message("group: rank %d killed; %d of %d jobs answered before (%d results when it began waiting, %d long "
                  "ones); %d of them answered again; %d with a result in the end\n", victim, n_had, N, before, long_done,
                  again, have);
    assert_int_equal(have, N);
    assert_true(pending);
    g_long_every = 0;
    assert_int_equal(again, 0);
}

static void a_rank_that_stops_answering_is_named_within_the_timeout_and_no_job_is_lost(void **state) {
    (void)state;
    enum { N = 80 };
    pid_t coord = track(e2e_start_coordinator(&g_t, NULL));
    pid_t r0 = start_rank("stop", 0, NULL), r1 = start_rank("stop", 1, NULL);
    produce("stop", N);
    int before = collect_tag("stop", N, N / 4, 120000);
    assert_true(before >= N / 4);
    kill(r1, SIGSTOP); /* alive, silent: only the timeout (ep.timeout_ms = 3000) can tell */
    int64_t t_stop = moeq_now_ms();
    int st = 0, exited = 0;
    while (!exited && moeq_now_ms() - t_stop < 3000 + 10000)
        if (waitpid(r0, &st, WNOHANG) == r0) exited = 1;
        else usleep(20000);
    int64_t ms = moeq_now_ms() - t_stop;
    e2e_kill9(r1);
    if (!exited) e2e_kill9(r0);
    assert_true(exited);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_true(ms >= 2500); /* not before the timeout (TCP says nothing about a stopped peer) */
    assert_true(log_has("stop", 0, "rank 1 did not answer"));
    print_message("group: rank 1 stopped after %d results; rank 0 exited after %lld ms naming it\n", before,
                  (long long)ms);
    r0 = start_rank("stop", 0, NULL), r1 = start_rank("stop", 1, NULL);
    int have = collect_tag("stop", N, N, 120000);
    e2e_collect(&g_t, g_t.n_jobs + 1, 1000);
    assert_int_equal(e2e_term(r0, 20000), 0);
    assert_int_equal(e2e_term(r1, 20000), 0);
    e2e_term(coord, 20000);
    assert_int_equal(have, N);
    assert_int_equal(g_t.mismatches, 0);
}

/* ---- two "hosts": a network namespace and a veth pair ------------------------------- */

#define NS_NAME "moeq-epg-b"
#define VETH_A "moeq-epg-a0" /* the host's end, 10.199.77.1 */
#define VETH_B "moeq-epg-b0" /* the namespace's end, 10.199.77.2 */

static int sh(const char *cmd) { return system(cmd) == 0 ? 0 : -1; }

static void netns_down(void) {
    if (system("ip netns del " NS_NAME " 2>/dev/null; ip link del " VETH_A " 2>/dev/null") != 0) { /* may not exist */ }
}

/* 0, or -1 with why set (not root, no netns support). */
static int netns_up(char *why, size_t n) {
    netns_down();
    const char *steps[] = {"ip netns add " NS_NAME, "ip link add " VETH_A " type veth peer name " VETH_B,
                           "ip link set " VETH_B " netns " NS_NAME, "ip addr add 10.199.77.1/24 dev " VETH_A,
                           "ip link set " VETH_A " up",
                           "ip netns exec " NS_NAME " ip addr add 10.199.77.2/24 dev " VETH_B,
                           "ip netns exec " NS_NAME " ip link set " VETH_B " up",
                           "ip netns exec " NS_NAME " ip link set lo up"};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s 2>/dev/null", steps[i]);
        if (sh(cmd)) {
            snprintf(why, n, "`%s` failed (needs root and network namespaces)", steps[i]);
            netns_down();
            return -1;
        }
    }
    return 0;
}

static int listen_on(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64)) return -1;
    return fd;
}

/*
 * The namespace reaches the host's Kafka and Redis (bound to 127.0.0.1) as if they ran there: listening
 * sockets made inside the namespace on the same ports, connections made back in the host's namespace (a
 * socket keeps the namespace it was made in). A child process; killed by the test.
 */
static pid_t start_forwarder(const uint16_t *ports, int n_ports) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    int host = open("/proc/self/ns/net", O_RDONLY), ns = open("/var/run/netns/" NS_NAME, O_RDONLY);
    if (host < 0 || ns < 0 || setns(ns, CLONE_NEWNET)) _exit(2);
    enum { MAXC = 128 };
    struct pollfd pf[2 * MAXC + 4];
    int lst[4], peer[2 * MAXC + 4], n = 0;
    for (int i = 0; i < n_ports; i++)
        if ((lst[i] = listen_on(ports[i])) < 0) _exit(3);
    if (setns(host, CLONE_NEWNET)) _exit(4);
    for (int i = 0; i < n_ports; i++) pf[i] = (struct pollfd){lst[i], POLLIN, 0};
    n = n_ports;
    for (;;) {
        if (poll(pf, (nfds_t)n, -1) < 0) continue;
        for (int i = 0; i < n; i++) {
            if (!pf[i].revents) continue;
            if (i < n_ports) {
                int c = accept(lst[i], NULL, NULL), d = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ports[i]),
                                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                if (c < 0 || d < 0 || n + 2 > 2 * MAXC + 4 || connect(d, (struct sockaddr *)&a, sizeof a)) {
                    if (c >= 0) close(c);
                    if (d >= 0) close(d);
                    continue;
                }
                pf[n] = (struct pollfd){c, POLLIN, 0}, peer[n++] = d;
                pf[n] = (struct pollfd){d, POLLIN, 0}, peer[n++] = c;
                continue;
            }
            char buf[65536];
            ssize_t got = read(pf[i].fd, buf, sizeof buf), off = 0;
            while (got > 0 && off < got) {
                ssize_t w = write(peer[i], buf + off, (size_t)(got - off));
                if (w <= 0) break;
                off += w;
            }
            if (got <= 0 || off < got) { /* one side closed: close both, drop the pair */
                int lo = n_ports + (i - n_ports) / 2 * 2; /* a pair sits at lo, lo + 1 */
                close(pf[lo].fd), close(pf[lo + 1].fd);
                pf[lo] = pf[n - 2], peer[lo] = peer[n - 2], pf[lo + 1] = pf[n - 1], peer[lo + 1] = peer[n - 1];
                n -= 2;
                break; /* the array changed: poll again */
            }
        }
    }
}

/* Bytes through the host's end of the veth, both ways: only the ranks' UCX traffic crosses it. */
static long long veth_bytes(void) {
    long long total = 0;
    const char *files[] = {"/sys/class/net/" VETH_A "/statistics/rx_bytes",
                           "/sys/class/net/" VETH_A "/statistics/tx_bytes"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "r");
        long long v = 0;
        if (f && fscanf(f, "%lld", &v) == 1) total += v;
        if (f) fclose(f);
    }
    return total;
}

static uint16_t port_of(const char *hostport) {
    const char *c = strrchr(hostport, ':');
    return (uint16_t)(c ? atoi(c + 1) : 0);
}

static void a_group_across_two_network_namespaces_answers_every_job_as_moeq_generate_alone(void **state) {
    (void)state;
    enum { N = 24 };
    char why[256];
    if (netns_up(why, sizeof why)) {
        printf("SKIP %s\n", why);
        skip();
    }
    uint16_t ports[2] = {port_of(g_t.kafka), port_of(g_t.redis)};
    pid_t fwd = track(start_forwarder(ports, 2));
    char moeq[sizeof g_t.moeq];
    memcpy(moeq, g_t.moeq, sizeof moeq);
    pid_t coord = track(e2e_start_coordinator(&g_t, NULL));
    /* the ranks' program: rank 0 on the host's end of the veth, rank 1 inside the namespace on the other */
    snprintf(g_t.moeq, sizeof g_t.moeq, "env UCX_NET_DEVICES=" VETH_A " %.400s", moeq);
    pid_t r0 = start_rank("ns", 0, NULL);
    snprintf(g_t.moeq, sizeof g_t.moeq, "ip netns exec " NS_NAME " env UCX_NET_DEVICES=" VETH_B " %.400s", moeq);
    pid_t r1 = start_rank("ns", 1, NULL);
    memcpy(g_t.moeq, moeq, sizeof moeq);
    produce("ns", N);
    int have = collect_tag("ns", N, N, 120000);
    e2e_collect(&g_t, g_t.n_jobs + 1, 1000);
    int st0 = e2e_term(r0, 20000), st1 = e2e_term(r1, 20000);
    e2e_term(coord, 20000);
    e2e_kill9(fwd);
    long long crossed = veth_bytes();
    netns_down();
    print_message("group: two namespaces: %d jobs answered, %lld bytes over the veth pair\n", have, crossed);
    assert_true(crossed > 100000); /* the exchanges did cross the link */
    assert_int_equal(have, N);
    assert_int_equal(st0, 0);
    assert_int_equal(st1, 0);
    assert_true(log_has("ns", 1, "ep_group_formed"));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        e2e_job *r = result_of("ns", i);
        bad += r->n_results != 1;
        bad += check_job("ns", i, r);
    }
    assert_int_equal(bad, 0);
}

static int group_setup(void **state) {
    (void)state;
    int rc = e2e_open(&g_t, "wkgrp");
    if (rc == MOEQ_TEST_SKIP) exit(MOEQ_TEST_SKIP);
    if (rc) return -1;
    moeq_ep_params p = moeq_ep_default_params();
    strcpy(p.transport, "ucx");
    moeq_ep *ep = NULL;
    char err[512];
    if (moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err) == MOEQ_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", err);
        exit(MOEQ_TEST_SKIP);
    }
    moeq_ep_destroy(ep);
    setenv("UCX_TLS", "tcp", 1); /* the ranks' transport: tcp loopback */
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    if (moeq_model_load(g_t.model, NULL, &g_mdl, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    if (moeq_tokenizer_load(g_t.model, &g_tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    moeq_engine_params ep_ = moeq_engine_default_params();
    ep_.max_seqs = 1;
    ep_.n_threads = 1;
    ep_.kv_cache_tokens = 4096;
    ep_.max_step_tokens = 512;
    if (moeq_engine_new(g_mdl, &ep_, &g_engine, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    for (int i = 0; i < g_n_pids; i++)
        if (kill(g_pids[i], 0) == 0) e2e_kill9(g_pids[i]);
    netns_down();
    moeq_engine_destroy(g_engine);
    moeq_tokenizer_destroy(g_tok);
    moeq_model_destroy(g_mdl);
    e2e_close(&g_t);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_redis_rendezvous_hands_out_the_current_generation_only),
        cmocka_unit_test(a_two_rank_group_answers_every_job_once_as_moeq_generate_alone),
        cmocka_unit_test(a_rank_is_not_ready_until_its_group_formed_and_its_heartbeat_names_the_group),
        cmocka_unit_test(killing_one_rank_with_sigkill_loses_no_job_and_the_group_forms_again),
        cmocka_unit_test(jobs_answered_before_a_kill_are_not_run_again),
        cmocka_unit_test(a_rank_that_stops_answering_is_named_within_the_timeout_and_no_job_is_lost),
        cmocka_unit_test(a_group_across_two_network_namespaces_answers_every_job_as_moeq_generate_alone),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
