/*
 * test_health.c — health that tells the truth, for the coordinator and the
 * worker (each runs as the `moeq` child process): /readyz (and /healthz)
 * fail while the broker is down or Redis is down and recover when they come
 * back, a wrong broker address is never ready, and /livez stays up through
 * all of it (the loop runs). The broker is librdkafka's mock cluster in this
 * process (moeq/kafka.h's mock section: a broker taken down and up); Redis
 * is a private redis-server killed and restarted (as in
 * test_coordinator_redis_restart); the `services` fixture's Redis serves the
 * broker cases.
 *
 * Why: `/healthz` answered 200 with a wrong broker address or Kafka down
 * (every process), and on the coordinator while Redis was down.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator_harness.h"
#include "moeq/kafka_mock.h"

typedef enum role { COORDINATOR, WORKER } role;

static char g_model[600];

typedef struct hrun {
    harness h;
    moeq_kafka_mock *mock;
    char kafka[128];
    int port;
    pid_t pid;
} hrun;

/* Wait up to ms until GET path answers want; 1 when it did. */
static int wait_status(int port, const char *path, int want, long ms) {
    int64_t end = moeq_now_ms() + ms;
    for (;;) {
        if (h_http_status(port, path) == want) return 1;
        if (moeq_now_ms() >= end) return 0;
        h_sleep_ms(250);
    }
}

static pid_t spawn(hrun *r, const char *cmd) {
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen(r->h.log_path, "a");
        if (f) {
            dup2(fileno(f), 1);
            dup2(fileno(f), 2);
        }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Start the role against r->kafka and r->h.redis_addr, its health on r->port. */
static void start_role(hrun *r, role which) {
    char cmd[4096];
    r->port = h_free_port();
    const char *kafka_flags = "--kafka.reconnect.backoff.max.ms=500 --kafka.socket.timeout.ms=3000 "
                              "--kafka.topic.metadata.refresh.interval.ms=500";
    if (which == COORDINATOR)
        snprintf(cmd, sizeof cmd,
                 "exec %s coordinator --kafka_brokers=%s --redis_url=%s --job_topics=%s --results_topic=%s "
                 "--dlq_topic=%s --cancel_topic=%s --group_id=%s --redis_prefix=%s --http_port=%d "
                 "--kafka.session.timeout.ms=6000 %s",
                 r->h.moeq_bin, r->kafka, r->h.redis_addr, r->h.jobs_topic, r->h.results_topic, r->h.dlq_topic,
                 r->h.cancel_topic, r->h.group, r->h.prefix, r->port, kafka_flags);
    else
        snprintf(cmd, sizeof cmd,
                 "exec %s worker --model=%s --kafka_brokers=%s --redis_url=%s --redis_prefix=%s --results_topic=%s "
                 "--dlq_topic=%s --worker_id=%s-w --max_seqs=2 --max_step_tokens=32 --kv_cache_tokens=1024 "
                 "--n_threads=1 --block_ms=100 --http_port=%d %s",
                 r->h.moeq_bin, g_model, r->kafka, r->h.redis_addr, r->h.prefix, r->h.results_topic, r->h.dlq_topic,
                 r->h.prefix, r->port, kafka_flags);
    r->pid = spawn(r, cmd);
}

static int open_run(hrun *r, const char *name, int with_mock) {
    memset(r, 0, sizeof *r);
    int rc = h_init(&r->h, name);
    if (rc) return rc;
    snprintf(r->kafka, sizeof r->kafka, "%s", r->h.kafka);
    if (!with_mock) return 0;
    char err[256];
    if (moeq_kafka_mock_new(1, &r->mock, err, sizeof err)) fail_msg("mock: %s", err);
    snprintf(r->kafka, sizeof r->kafka, "%s", moeq_kafka_mock_bootstraps(r->mock));
    const char *topics[] = {r->h.jobs_topic, r->h.results_topic, r->h.dlq_topic, r->h.cancel_topic};
    for (int i = 0; i < 4; i++)
        if (moeq_kafka_mock_topic_create(r->mock, topics[i], 1, 1, err, sizeof err)) fail_msg("mock topic: %s", err);
    return 0;
}

static void close_run(hrun *r) {
    if (r->pid > 0) {
        kill(r->pid, SIGTERM);
        int64_t end = moeq_now_ms() + 20000;
        while (waitpid(r->pid, NULL, WNOHANG) == 0 && moeq_now_ms() < end) h_sleep_ms(100);
        if (moeq_now_ms() >= end) h_kill9(r->pid);
    }
    moeq_kafka_mock_destroy(r->mock);
    h_destroy(&r->h);
}

static void broker_stopped_and_recovers(role which, const char *name) {
    hrun r;
    int rc = open_run(&r, name, 1);
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    start_role(&r, which);
    assert_true(wait_status(r.port, "/readyz", 200, 90000)); /* the worker loads its model first */
    assert_int_equal(h_http_status(r.port, "/healthz"), 200);
    char err[256];
    assert_int_equal(moeq_kafka_mock_broker_down(r.mock, 1, err, sizeof err), MOEQ_OK);
    assert_true(wait_status(r.port, "/readyz", 503, 20000));
    assert_int_equal(h_http_status(r.port, "/healthz"), 503);
    assert_int_equal(h_http_status(r.port, "/livez"), 200); /* the loop runs: no restart wanted, just no traffic */
    assert_int_equal(moeq_kafka_mock_broker_up(r.mock, 1, err, sizeof err), MOEQ_OK);
    assert_true(wait_status(r.port, "/readyz", 200, 30000));
    assert_int_equal(h_http_status(r.port, "/livez"), 200);
    close_run(&r);
}

static int redis_up(int port) {
    char addr[64], err[256];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    moeq_redis_params rp;
    moeq_redis *c = NULL;
    if (moeq_redis_params_parse(addr, NULL, &rp, err, sizeof err) || moeq_redis_new(&rp, &c, err, sizeof err)) return 0;
    moeq_redis_reply *rep = NULL;
    const char *argv[] = {"PING"};
    int ok = moeq_redis_command_argv(c, 1, argv, NULL, &rep, err, sizeof err) == MOEQ_OK;
    moeq_redis_reply_free(rep);
    moeq_redis_destroy(c);
    return ok;
}

static pid_t redis_start(const char *dir, int port) {
    pid_t pid = h_redis_start(dir, port);
    for (int i = 0; i < 100 && !redis_up(port); i++) h_sleep_ms(100);
    return pid;
}

static void redis_stopped_and_recovers(role which, const char *name) {
    hrun r;
    int rc = open_run(&r, name, 0);
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    char dir[] = "/tmp/moeq-health-redis-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int rport = h_free_port();
    pid_t redis = redis_start(dir, rport);
    assert_true(redis_up(rport));
    snprintf(r.h.redis_addr, sizeof r.h.redis_addr, "127.0.0.1:%d", rport);
    start_role(&r, which);
    assert_true(wait_status(r.port, "/readyz", 200, 90000));
    kill(redis, SIGKILL);
    waitpid(redis, NULL, 0);
    assert_true(wait_status(r.port, "/readyz", 503, 20000));
    assert_int_equal(h_http_status(r.port, "/healthz"), 503);
    assert_int_equal(h_http_status(r.port, "/livez"), 200);
    redis = redis_start(dir, rport);
    assert_true(redis_up(rport));
    assert_true(wait_status(r.port, "/readyz", 200, 30000));
    close_run(&r);
    kill(redis, SIGTERM);
    waitpid(redis, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void wrong_broker_is_not_ready(role which, const char *name) {
    hrun r;
    int rc = open_run(&r, name, 0);
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    snprintf(r.kafka, sizeof r.kafka, "127.0.0.1:%d", h_free_port()); /* nothing listens there */
    start_role(&r, which);
    assert_true(wait_status(r.port, "/livez", 200, 90000));
    h_sleep_ms(3000); /* past the first probe round and its cache */
    assert_int_equal(h_http_status(r.port, "/readyz"), 503);
    assert_int_equal(h_http_status(r.port, "/healthz"), 503);
    char page[4096];
    assert_true(h_http_get(r.port, "/readyz", page, sizeof page) > 0);
    assert_non_null(strstr(page, "kafka")); /* the reason names the dependency */
    close_run(&r);
}

static void readyz_fails_while_the_broker_is_stopped_and_recovers_coordinator(void **state) {
    (void)state;
    broker_stopped_and_recovers(COORDINATOR, "health_broker_c");
}
static void readyz_fails_while_the_broker_is_stopped_and_recovers_worker(void **state) {
    (void)state;
    broker_stopped_and_recovers(WORKER, "health_broker_w");
}
static void readyz_fails_while_redis_is_stopped_and_recovers_coordinator(void **state) {
    (void)state;
    redis_stopped_and_recovers(COORDINATOR, "health_redis_c");
}
static void readyz_fails_while_redis_is_stopped_and_recovers_worker(void **state) {
    (void)state;
    redis_stopped_and_recovers(WORKER, "health_redis_w");
}
static void a_wrong_broker_address_is_not_ready_coordinator(void **state) {
    (void)state;
    wrong_broker_is_not_ready(COORDINATOR, "health_wrong_c");
}
static void a_wrong_broker_address_is_not_ready_worker(void **state) {
    (void)state;
    wrong_broker_is_not_ready(WORKER, "health_wrong_w");
}

/* A taken port is a clear start-up error naming the key. */
static void a_taken_http_port_is_a_start_up_error_naming_the_key(void **state) {
    (void)state;
    hrun r;
    int rc = open_run(&r, "health_taken", 0);
    if (rc == MOEQ_TEST_SKIP) skip();
    assert_int_equal(rc, 0);
    start_role(&r, COORDINATOR);
    assert_true(wait_status(r.port, "/livez", 200, 30000));
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd,
             "%s coordinator --kafka_brokers=%s --redis_url=%s --job_topics=%s --group_id=%s-2 --redis_prefix=%s "
             "--http_port=%d 2>&1",
             r.h.moeq_bin, r.kafka, r.h.redis_addr, r.h.jobs_topic, r.h.group, r.h.prefix, r.port);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    assert_non_null(strstr(out, "http_port"));
    close_run(&r);
}

int main(void) {
    const char *bd = getenv("MOEQ_BUILD_DIR");
    snprintf(g_model, sizeof g_model, "%s/test-health-model", bd ? bd : "/tmp");
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "test -f %s/config.json || %s/cli/moeq gen-model --preset tiny --out %s >/dev/null",
             g_model, bd ? bd : ".", g_model);
    if (system(cmd)) return fprintf(stderr, "cannot build the tiny model\n"), 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(readyz_fails_while_the_broker_is_stopped_and_recovers_coordinator),
        cmocka_unit_test(readyz_fails_while_the_broker_is_stopped_and_recovers_worker),
        cmocka_unit_test(readyz_fails_while_redis_is_stopped_and_recovers_coordinator),
        cmocka_unit_test(readyz_fails_while_redis_is_stopped_and_recovers_worker),
        cmocka_unit_test(a_wrong_broker_address_is_not_ready_coordinator),
        cmocka_unit_test(a_wrong_broker_address_is_not_ready_worker),
        cmocka_unit_test(a_taken_http_port_is_a_start_up_error_naming_the_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
