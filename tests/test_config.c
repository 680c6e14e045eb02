/*
 * test_config.c — one configuration vocabulary for every process: the same
 * keys in the coordinator and the worker (allowed result topics, job limits),
 * the same precedence (file < MOEQ_* < flags) in every role, one file for
 * every role, --print-config everywhere, and the CLI traps (`moeq cancel
 * --help`, `moeq status`'s Redis default). The CLI cases run the moeq binary
 * (MOEQ_BUILD_DIR/cli/moeq) with --print-config: nothing is contacted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moeq/config.h"
#include "moeq/job.h"
#include "moeq/redis.h"
#include "params.h"
#include "worker.h"

static char g_moeq[512];

static const char *write_file(const char *name, const char *text) {
    static char path[4][128];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 128, "/tmp/moeq-test-config-%d-%s", (int)getpid(), name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

/* Run `moeq <args>` through sh; stdout (and stderr when want_err) into out. Returns the exit status. */
static int run(const char *args, char *out, size_t size, int want_err) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s %s", g_moeq, args, want_err ? "2>&1" : "2>/dev/null");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The value of `key = value` in --print-config output (quotes stripped), or "" when absent. */
static const char *value_of(const char *text, const char *key, char *out, size_t size) {
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s = ", key);
    char buf[1 << 16];
    snprintf(buf, sizeof buf, "\n%s", text);
    const char *p = strstr(buf, pat);
    out[0] = 0;
    if (!p) return out;
    p += strlen(pat);
    if (*p == '"') p++;
    size_t n = strcspn(p, "\"\n");
    snprintf(out, size, "%.*s", (int)(n < size - 1 ? n : size - 1), p);
    return out;
}

static void load_shared(const char *path, moeq_coordinator_params *cp, moeq_worker_params *wp) {
    char err[512] = "";
    *cp = moeq_coordinator_default_params();
    assert_int_equal(moeq_worker_default_params(wp, err, sizeof err), MOEQ_OK);
    const moeq_prop *coord_others[] = {moeq_worker_config_props(), NULL};
    const moeq_prop *worker_others[] = {moeq_coordinator_props(), NULL};
    moeq_config_src cs = {moeq_coordinator_props(), cp, NULL, NULL, coord_others};
    moeq_config_src ws = {moeq_worker_config_props(), wp, NULL, NULL, worker_others};
    assert_int_equal(moeq_config_load_file(&cs, path, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_config_load_file(&ws, path, err, sizeof err), MOEQ_OK);
}

/* Why: `results_allowed_topics` (coordinator) vs `allowed_topics` (worker): a reply_to allowed on the
 * coordinator only went silently to moeq.results. */
static void a_reply_to_allowed_by_the_shared_allowed_topics_key_reaches_that_topic(void **state) {
    (void)state;
    const char *path = write_file("allowed.conf", "results_allowed_topics = team.results\n");
    moeq_coordinator_params cp;
    moeq_worker_params wp;
    load_shared(path, &cp, &wp);
    assert_true(moeq_coordinator_reply_allowed(&cp, "team.results"));
    assert_true(moeq_worker_topic_allowed(&wp, "team.results")); /* the worker publishes there too */
    assert_false(moeq_worker_topic_allowed(&wp, "other.results"));
    /* the worker's old name still works, under the one name */
    path = write_file("allowed-old.conf", "allowed_topics = old.results\n");
    load_shared(path, &cp, &wp);
    assert_true(moeq_worker_topic_allowed(&wp, "old.results"));
    assert_true(moeq_coordinator_reply_allowed(&cp, "old.results"));
    unlink(path);
}

static void print_config(const char *role, const char *args, char *out, size_t size) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --print-config %s", role, args);
    assert_int_equal(run(cmd, out, size, 0), 0);
}

/* Why: the worker let the config file override MOEQ_* variables (the docs and the coordinator say the reverse). */
static void env_overrides_the_file_and_flags_override_env_in_every_role(void **state) {
    (void)state;
    const char *path = write_file("prec.conf", "redis_prefix = fromfile\nmax_job_bytes = 1000\n");
    static const char *roles[] = {"coordinator", "worker", "status", "cancel"};
    char out[1 << 16], v[256], args[1024];
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "--config %s", path);
        print_config(roles[i], args, out, sizeof out);
        assert_string_equal(value_of(out, "redis_prefix", v, sizeof v), "fromfile");
        setenv("MOEQ_REDIS_PREFIX", "fromenv", 1);
        setenv("MOEQ_MAX_JOB_BYTES", "2000", 1);
        print_config(roles[i], args, out, sizeof out);
        assert_string_equal(value_of(out, "redis_prefix", v, sizeof v), "fromenv");
        if (strcmp(roles[i], "status")) assert_string_equal(value_of(out, "max_job_bytes", v, sizeof v), "2000");
        snprintf(args, sizeof args, "--redis_prefix=fromflag --config %s", path); /* order on the line is no matter */
        print_config(roles[i], args, out, sizeof out);
        assert_string_equal(value_of(out, "redis_prefix", v, sizeof v), "fromflag");
        unsetenv("MOEQ_REDIS_PREFIX");
        unsetenv("MOEQ_MAX_JOB_BYTES");
    }
    unlink(path);
}

/* Why: one shared file was rejected by whichever role lacked a key. */
static void one_config_file_serves_every_role(void **state) {
    (void)state;
    const char *path = write_file("shared.conf",
                                  "# every role\n"
                                  "kafka_brokers = 127.0.0.1:19092\nredis_url = 127.0.0.1:16380\n"
                                  "results_allowed_topics = team.results\nmax_job_bytes = 3000\n"
                                  "group_id = coord-group\njob_topics = a.jobs\n" /* coordinator only */
                                  "max_seqs = 4\ngroup = worker-group\n"         /* worker only */
                                  "kafka.client.id = shared\nredis.db = 2\n"
                                  "no_role_knows_this_key = 1\n");
    char out[1 << 16], v[256], args[1024];
    snprintf(args, sizeof args, "--print-config --config %s", path);
    static const char *roles[] = {"coordinator", "worker", "status", "cancel"};
    for (int i = 0; i < 4; i++) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "%s %s", roles[i], args);
        assert_int_equal(run(cmd, out, sizeof out, 1), 0);
        assert_non_null(strstr(out, "no_role_knows_this_key")); /* warned about, by name */
        assert_string_equal(value_of(out, "redis_url", v, sizeof v), "127.0.0.1:16380");
        assert_string_equal(value_of(out, "results_allowed_topics", v, sizeof v), "team.results");
        assert_string_equal(value_of(out, "redis.db", v, sizeof v), "2");
    }
    print_config("coordinator", args + strlen("--print-config"), out, sizeof out);
    assert_string_equal(value_of(out, "group_id", v, sizeof v), "coord-group");
    assert_string_equal(value_of(out, "max_job_bytes", v, sizeof v), "3000");
    print_config("worker", args + strlen("--print-config"), out, sizeof out);
    assert_string_equal(value_of(out, "max_seqs", v, sizeof v), "4");
    assert_string_equal(value_of(out, "group", v, sizeof v), "worker-group");
    assert_string_equal(value_of(out, "max_job_bytes", v, sizeof v), "3000");
    /* a malformed value of a known key is an error in every role, also the roles that do not use it */
    path = write_file("bad.conf", "max_seqs = lots\n");
    snprintf(args, sizeof args, "--print-config --config %s", path);
    for (int i = 0; i < 4; i++) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "%s %s", roles[i], args);
        assert_int_equal(run(cmd, out, sizeof out, 1), 2);
        assert_non_null(strstr(out, "max_seqs"));
        assert_non_null(strstr(out, ":1:"));
    }
    unlink(path);
}

/* Why: the worker had no --print-config; now every configurable subcommand has it. */
static void every_subcommand_prints_its_configuration(void **state) {
    (void)state;
    static const char *roles[] = {"coordinator", "worker", "status", "cancel"};
    char out[1 << 16], v[256];
    for (int i = 0; i < 4; i++) {
        print_config(roles[i], "", out, sizeof out);
        assert_string_equal(value_of(out, "redis_url", v, sizeof v), MOEQ_REDIS_URL_DEFAULT);
    }
    print_config("coordinator", "", out, sizeof out);
    assert_string_equal(value_of(out, "http_port", v, sizeof v), "9464");
    print_config("worker", "", out, sizeof out);
    assert_string_equal(value_of(out, "http_port", v, sizeof v), "9465");
}

/* Why (smaller): `moeq status` defaulted to port 6379 while the stack is on 6380. */
static void status_defaults_to_the_redis_of_the_other_roles(void **state) {
    (void)state;
    char out[1 << 16], v[256];
    print_config("status", "", out, sizeof out);
    assert_string_equal(value_of(out, "redis_url", v, sizeof v), MOEQ_REDIS_URL_DEFAULT);
    moeq_coordinator_params cp = moeq_coordinator_default_params();
    assert_string_equal(cp.redis_url, MOEQ_REDIS_URL_DEFAULT);
    assert_non_null(strstr(MOEQ_REDIS_URL_DEFAULT, ":6380"));
    print_config("status", "--redis.db=3 --redis_url=10.0.0.1:7000", out, sizeof out);
    assert_string_equal(value_of(out, "redis.db", v, sizeof v), "3");
    assert_string_equal(value_of(out, "redis_url", v, sizeof v), "10.0.0.1:7000");
}

/* Why (smaller): `moeq cancel --help` cancelled a job named `--help`. */
static void cancel_help_prints_help_and_cancels_nothing(void **state) {
    (void)state;
    char out[1 << 16];
    /* an unreachable broker: before the fix this tried to produce "--help" and failed after 30 s */
    time_t t0 = time(NULL);
    assert_int_equal(run("cancel --kafka_brokers=127.0.0.1:1 --help", out, sizeof out, 1), 0);
    assert_non_null(strstr(out, "usage: moeq cancel"));
    assert_int_equal(run("cancel --help --kafka_brokers=127.0.0.1:1", out, sizeof out, 1), 0);
    assert_int_equal(run("cancel --kafka_brokers=127.0.0.1:1 -h", out, sizeof out, 1), 0);
    assert_non_null(strstr(out, "usage: moeq cancel"));
    /* an argument starting with '-' is never an id */
    assert_int_equal(run("cancel --kafka_brokers=127.0.0.1:1 --bogus job-1", out, sizeof out, 1), 2);
    assert_non_null(strstr(out, "--bogus"));
    assert_int_equal(run("cancel --kafka_brokers=127.0.0.1:1 -v", out, sizeof out, 1), 2);
    assert_true(time(NULL) - t0 < 10);
}

int main(void) {
    const char *bd = getenv("MOEQ_BUILD_DIR");
    snprintf(g_moeq, sizeof g_moeq, "%s/cli/moeq", bd ? bd : ".");
    if (access(g_moeq, X_OK)) {
        fprintf(stderr, "%s: not built\n", g_moeq);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_reply_to_allowed_by_the_shared_allowed_topics_key_reaches_that_topic),
        cmocka_unit_test(env_overrides_the_file_and_flags_override_env_in_every_role),
        cmocka_unit_test(one_config_file_serves_every_role),
        cmocka_unit_test(every_subcommand_prints_its_configuration),
        cmocka_unit_test(status_defaults_to_the_redis_of_the_other_roles),
        cmocka_unit_test(cancel_help_prints_help_and_cancels_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
