/* test_common.c — unit tests for errors, config tables, UTF-8 and logging helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moeq/config.h"
#include "moeq/health.h"
#include "moeq/log.h"
#include "moeq/util.h"

typedef struct demo_params {
    int64_t max_jobs;
    double tolerance;
    int verbose;
    char topic[32];
} demo_params;

static const moeq_prop demo_props[] = {
    {"max_jobs", MOEQ_PROP_INT, offsetof(demo_params, max_jobs), sizeof(int64_t), 1, 1000, "64", "jobs per batch"},
    {"tolerance", MOEQ_PROP_DOUBLE, offsetof(demo_params, tolerance), sizeof(double), 0, 1, "0.1", "relative"},
    {"verbose", MOEQ_PROP_BOOL, offsetof(demo_params, verbose), sizeof(int), 0, 1, "false", "chatty"},
    {"topic", MOEQ_PROP_STR, offsetof(demo_params, topic), 32, 0, 0, "moeq.jobs", "job topic"},
    MOEQ_PROP_END,
};

static void defaults_come_from_the_table(void **state) {
    (void)state;
    demo_params p;
    assert_int_equal(moeq_props_defaults(demo_props, &p, NULL, 0), MOEQ_OK);
    assert_int_equal(p.max_jobs, 64);
    assert_true(p.tolerance == 0.1);
    assert_int_equal(p.verbose, 0);
    assert_string_equal(p.topic, "moeq.jobs");
}

static void out_of_range_values_are_rejected_with_the_key_named(void **state) {
    (void)state;
    demo_params p;
    char err[256];
    moeq_props_defaults(demo_props, &p, NULL, 0);
    assert_int_equal(moeq_props_set(demo_props, &p, "max_jobs", "5000", err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_jobs"));
    assert_int_equal(moeq_props_set(demo_props, &p, "max_jobs", "12x", err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_props_set(demo_props, &p, "verbose", "maybe", err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_props_set(demo_props, &p, "nope", "1", err, sizeof err), MOEQ_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "nope"));
    assert_int_equal(p.max_jobs, 64);
}

static void file_then_env_then_flags_override_in_order(void **state) {
    (void)state;
    char path[] = "/tmp/moeq-test-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "# comment\nmax_jobs = 10\n  tolerance=0.2  \ntopic = \"a.b\"\nkafka.bootstrap.servers = h:1\n"
                       "redis.password = s3cret\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);

    demo_params p;
    moeq_props_defaults(demo_props, &p, NULL, 0);
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    moeq_config_src src = {demo_props, &p, kafka, redis, NULL};
    char err[256];
    assert_int_equal(moeq_config_load_file(&src, path, err, sizeof err), MOEQ_OK);
    assert_int_equal(p.max_jobs, 10);
    assert_string_equal(p.topic, "a.b");
    assert_string_equal(moeq_kvlist_get(kafka, "bootstrap.servers"), "h:1");
    assert_string_equal(moeq_kvlist_get(redis, "password"), "s3cret");

    setenv("MOEQ_MAX_JOBS", "20", 1);
    setenv("MOEQ_KAFKA__SASL__MECHANISM", "PLAIN", 1);
    assert_int_equal(moeq_config_apply_env(&src, err, sizeof err), MOEQ_OK);
    assert_int_equal(p.max_jobs, 20);
    assert_string_equal(moeq_kvlist_get(kafka, "sasl.mechanism"), "PLAIN");
    unsetenv("MOEQ_MAX_JOBS");
    unsetenv("MOEQ_KAFKA__SASL__MECHANISM");

    char a0[] = "moeq", a1[] = "--max-jobs=30", a2[] = "positional", a3[] = "--verbose", a4[] = "yes";
    char *argv[] = {a0, a1, a2, a3, a4, NULL};
    int rest = 0;
    assert_int_equal(moeq_config_apply_args(&src, 5, argv, &rest, err, sizeof err), MOEQ_OK);
    assert_int_equal(p.max_jobs, 30);
    assert_int_equal(p.verbose, 1);
    assert_int_equal(rest, 2);
    assert_string_equal(argv[1], "positional");

    moeq_kvlist_destroy(kafka);
    moeq_kvlist_destroy(redis);
    unlink(path);
}

static void a_bad_config_line_names_file_and_line(void **state) {
    (void)state;
    char path[] = "/tmp/moeq-test-config-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "max_jobs = 10\nthis line has no equals\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    demo_params p;
    moeq_props_defaults(demo_props, &p, NULL, 0);
    moeq_config_src src = {demo_props, &p, NULL, NULL, NULL};
    char err[512];
    assert_int_equal(moeq_config_load_file(&src, path, err, sizeof err), MOEQ_ERR_PARSE);
    assert_non_null(strstr(err, ":2:"));
    unlink(path);
}

static void utf8_validation_follows_rfc3629(void **state) {
    (void)state;
    size_t off = 0;
    assert_true(moeq_utf8_valid("hello \xe4\xb8\xad \xf0\x9f\x98\x80", 14, NULL));
    assert_false(moeq_utf8_valid("ab\xc0\xaf", 4, &off)); /* overlong '/' */
    assert_int_equal(off, 2);
    assert_false(moeq_utf8_valid("\xed\xa0\x80", 3, NULL));     /* surrogate */
    assert_false(moeq_utf8_valid("\xf4\x90\x80\x80", 4, NULL)); /* > U+10FFFF */
    assert_false(moeq_utf8_valid("\xe4\xb8", 2, NULL));         /* truncated */
    assert_int_equal(moeq_utf8_complete_prefix("a\xe4\xb8", 3), 1);
    assert_int_equal(moeq_utf8_complete_prefix("a\xe4\xb8\xad", 4), 4);
    assert_int_equal(moeq_utf8_complete_prefix("\xf0\x9f\x98", 3), 0);
}

static void log_values_with_spaces_are_quoted(void **state) {
    (void)state;
    char buf[64];
    assert_string_equal(moeq_log_quote("plain", buf, sizeof buf), "plain");
    assert_string_equal(moeq_log_quote("two words \"q\"", buf, sizeof buf), "\"two words \\\"q\\\"\"");
    assert_string_equal(moeq_err_str(MOEQ_ERR_PARSE), "parse");
    assert_true(moeq_err_is_retriable(MOEQ_ERR_TRANSIENT));
    assert_false(moeq_err_is_retriable(MOEQ_ERR_FORMAT));
}

typedef struct fake_dep {
    int up, calls;
} fake_dep;

static moeq_err fake_probe(void *opaque, char *errstr, size_t n) {
    fake_dep *d = opaque;
    d->calls++;
    if (d->up) return MOEQ_OK;
    snprintf(errstr, n, "down");
    return MOEQ_ERR_TRANSIENT;
}

static void readiness_is_every_probe_cached_and_liveness_is_the_loop_ticking(void **state) {
    (void)state;
    moeq_health *h = NULL;
    assert_int_equal(moeq_health_new(2000, 10000, &h), MOEQ_OK);
    fake_dep broker = {1, 0}, redis = {1, 0};
    assert_int_equal(moeq_health_add_probe(h, "kafka", fake_probe, &broker), MOEQ_OK);
    assert_int_equal(moeq_health_add_probe(h, "redis", fake_probe, &redis), MOEQ_OK);
    char body[256];
    assert_int_equal(moeq_health_route(h, "/livez", 1000, body, sizeof body), 200); /* starting: live */
    moeq_health_tick(h, 1000);
    assert_int_equal(moeq_health_route(h, "/readyz", 1000, body, sizeof body), 200);
    redis.up = 0;
    assert_int_equal(moeq_health_route(h, "/readyz", 1500, body, sizeof body), 200); /* cached for 2 s */
    assert_int_equal(broker.calls, 1);
    assert_int_equal(moeq_health_route(h, "/healthz", 3000, body, sizeof body), 503);
    assert_non_null(strstr(body, "redis: down"));
    redis.up = 1;
    assert_int_equal(moeq_health_route(h, "/readyz", 5000, body, sizeof body), 200);
    assert_int_equal(moeq_health_route(h, "/livez", 10999, body, sizeof body), 200);
    assert_int_equal(moeq_health_route(h, "/livez", 11000, body, sizeof body), 503); /* the loop stalled */
    assert_non_null(strstr(body, "livez_stall_ms"));
    assert_int_equal(moeq_health_route(h, "/readyz", 11000, body, sizeof body), 503);
    assert_int_equal(moeq_health_route(h, "/metrics", 11000, body, sizeof body), 0);
    moeq_health_destroy(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_come_from_the_table),
        cmocka_unit_test(readiness_is_every_probe_cached_and_liveness_is_the_loop_ticking),
        cmocka_unit_test(out_of_range_values_are_rejected_with_the_key_named),
        cmocka_unit_test(file_then_env_then_flags_override_in_order),
        cmocka_unit_test(a_bad_config_line_names_file_and_line),
        cmocka_unit_test(utf8_validation_follows_rfc3629),
        cmocka_unit_test(log_values_with_spaces_are_quoted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
