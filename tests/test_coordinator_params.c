/*
 * test_coordinator_params.c — the coordinator's property table: defaults,
 * config file < env < flags, pass-through keys, ranges and cross-field checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "params.h"

static void defaults_are_documented_and_valid(void **state) {
    (void)state;
    moeq_coordinator_params p = moeq_coordinator_default_params();
    char err[256] = "";
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_OK);
    assert_string_equal(p.job_topics, "moeq.jobs");
    assert_string_equal(p.results_topic, "moeq.results");
    assert_string_equal(p.dlq_topic, "moeq.dlq");
    assert_string_equal(p.cancel_topic, "moeq.cancel");
    assert_string_equal(p.durability, "fsync_always");
    assert_int_equal(moeq_coordinator_durability(&p), MOEQ_DURABILITY_FSYNC_ALWAYS);
    assert_int_equal(p.max_batch_jobs, 64);
    assert_int_equal(p.max_wait_ms, 50);
    assert_true(p.length_tolerance == 0.1);
    assert_int_equal(p.limits.max_job_bytes, moeq_job_default_limits().max_job_bytes);
    /* the batcher's defaults and the table's agree */
    moeq_batcher_params a = moeq_coordinator_batcher_params(&p), b = moeq_batcher_default_params();
    assert_memory_equal(&a, &b, sizeof(a));
    /* every property has a doc line and a default that parses */
    for (const moeq_prop *q = moeq_coordinator_props(); q->name; q++) {
        assert_non_null(q->doc);
        assert_true(strlen(q->doc) > 5);
        assert_non_null(q->def);
    }
}

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/moeq-coord-test-%d.conf", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void file_then_env_then_flags_each_override_the_last(void **state) {
    (void)state;
    moeq_coordinator_params p = moeq_coordinator_default_params();
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    moeq_config_src src = {moeq_coordinator_props(), &p, kafka, redis, NULL};
    char *path = write_tmp("# coordinator\nmax_batch_jobs = 16\nmax_wait_ms = 20\nlength_tolerance = 0.2\n"
                           "kafka.security.protocol = SASL_SSL\nredis.user = moeq\nmax_job_bytes = 4096\n"
                           "job_topics = \"a.jobs, b.jobs\"\n");
    char err[512] = "";
    assert_int_equal(moeq_config_load_file(&src, path, err, sizeof(err)), MOEQ_OK);
    setenv("MOEQ_MAX_WAIT_MS", "30", 1);
    setenv("MOEQ_KAFKA__SASL__MECHANISM", "PLAIN", 1);
    assert_int_equal(moeq_config_apply_env(&src, err, sizeof(err)), MOEQ_OK);
    unsetenv("MOEQ_MAX_WAIT_MS");
    unsetenv("MOEQ_KAFKA__SASL__MECHANISM");
    char *argv[] = {"coordinator", "--max-batch-jobs=8", "--kafka.client.id", "c1", "extra", NULL};
    int argc = 5, rest = 0;
    assert_int_equal(moeq_config_apply_args(&src, argc, argv, &rest, err, sizeof(err)), MOEQ_OK);
    assert_int_equal(rest, 2);
    assert_string_equal(argv[1], "extra");
    assert_int_equal(p.max_batch_jobs, 8);
    assert_int_equal(p.max_wait_ms, 30);
    assert_true(p.length_tolerance == 0.2);
    assert_int_equal(p.limits.max_job_bytes, 4096);
    assert_string_equal(moeq_kvlist_get(kafka, "security.protocol"), "SASL_SSL");
    assert_string_equal(moeq_kvlist_get(kafka, "sasl.mechanism"), "PLAIN");
    assert_string_equal(moeq_kvlist_get(kafka, "client.id"), "c1");
    assert_string_equal(moeq_kvlist_get(redis, "user"), "moeq");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_OK);
    char buf[1024], *items[4];
    snprintf(buf, sizeof(buf), "%s", p.job_topics);
    assert_int_equal(moeq_coordinator_split_list(buf, items, 4), 2);
    assert_string_equal(items[0], "a.jobs");
    assert_string_equal(items[1], "b.jobs");
    unlink(path);
    moeq_kvlist_destroy(kafka);
    moeq_kvlist_destroy(redis);
}

static void out_of_range_and_unknown_keys_are_errors_naming_the_key(void **state) {
    (void)state;
    moeq_coordinator_params p = moeq_coordinator_default_params();
    moeq_config_src src = {moeq_coordinator_props(), &p, NULL, NULL, NULL};
    char err[512] = "";
    assert_int_equal(moeq_config_apply(&src, "max_batch_jobs", "0", err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_batch_jobs"));
    assert_int_equal(moeq_config_apply(&src, "length_tolerance", "2", err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_config_apply(&src, "max_batch_jobz", "3", err, sizeof(err)), MOEQ_ERR_NOT_FOUND);
    char *path = write_tmp("max_wait_ms = 10\nbogus = 1\n");
    assert_int_not_equal(moeq_config_load_file(&src, path, err, sizeof(err)), MOEQ_OK);
    assert_non_null(strstr(err, ":2:"));
    unlink(path);
}

static void cross_field_rules_are_checked(void **state) {
    (void)state;
    char err[512] = "";
    moeq_coordinator_params p = moeq_coordinator_default_params();
    p.resume_pending_batches = p.max_pending_batches;
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "resume_pending_batches"));
    p = moeq_coordinator_default_params();
    snprintf(p.durability, sizeof(p.durability), "sometimes");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "durability"));
    snprintf(p.durability, sizeof(p.durability), "waitaof");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_OK);
    assert_int_equal(moeq_coordinator_durability(&p), MOEQ_DURABILITY_WAITAOF);
    snprintf(p.job_topics, sizeof(p.job_topics), " , ");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "job_topics"));
    snprintf(p.job_topics, sizeof(p.job_topics), "ok,not ok");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    p = moeq_coordinator_default_params();
    snprintf(p.redis_prefix, sizeof(p.redis_prefix), "a:b");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    p = moeq_coordinator_default_params();
    snprintf(p.log_level, sizeof(p.log_level), "loud");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    p = moeq_coordinator_default_params();
    snprintf(p.cancel_topic, sizeof(p.cancel_topic), "%s", "");
    assert_int_equal(moeq_coordinator_params_check(&p, err, sizeof(err)), MOEQ_OK); /* cancel off */
}

static void reply_to_must_be_the_results_topic_or_allowed(void **state) {
    (void)state;
    moeq_coordinator_params p = moeq_coordinator_default_params();
    assert_true(moeq_coordinator_reply_allowed(&p, "moeq.results"));
    assert_false(moeq_coordinator_reply_allowed(&p, "team.results"));
    assert_false(moeq_coordinator_reply_allowed(&p, ""));
    snprintf(p.results_allowed_topics, sizeof(p.results_allowed_topics), "team.results, other");
    assert_true(moeq_coordinator_reply_allowed(&p, "team.results"));
    assert_true(moeq_coordinator_reply_allowed(&p, "other"));
    assert_false(moeq_coordinator_reply_allowed(&p, "team"));
}

static void help_and_markdown_list_every_key(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    moeq_props_print_markdown(moeq_coordinator_props(), f);
    fclose(f);
    for (const moeq_prop *q = moeq_coordinator_props(); q->name; q++) assert_non_null(strstr(buf, q->name));
    assert_non_null(strstr(buf, "max_job_bytes"));
    free(buf);
}

/* "Two record TTLs under two names; the shorter wins": one key, dedupe_window_s, as on the worker. */
static void the_dedupe_window_is_one_key_as_on_the_worker(void **state) {
    (void)state;
    moeq_coordinator_params p = moeq_coordinator_default_params();
    char err[256];
    assert_int_equal(p.dedupe_window_s, 604800);
    assert_int_equal(moeq_props_set(moeq_coordinator_props(), &p, "dedupe_window_s", "3600", err, sizeof err), MOEQ_OK);
    assert_int_equal(p.dedupe_window_s, 3600);
    moeq_config_src src = {.table = moeq_coordinator_props(), .params = &p};
    assert_int_equal(moeq_config_apply(&src, "job_record_ttl_s", "60", err, sizeof err), MOEQ_OK);
    assert_int_equal(p.dedupe_window_s, 60); /* the old name: a deprecated alias of the same field */
}

/* Issue 11, "No context-length check": the coordinator knows the model's context, or a smaller max_model_len. */
static void no_context_length_check_the_context_is_the_models_or_max_model_len_below_it(void **state) {
    (void)state;
    moeq_coordinator_params p = moeq_coordinator_default_params();
    int64_t ctx = -1;
    char err[256] = "";
    assert_int_equal(moeq_coordinator_context(&p, 256, &ctx, err, sizeof err), MOEQ_OK);
    assert_int_equal(ctx, 256);
    assert_int_equal(moeq_props_set(moeq_coordinator_props(), &p, "max_model_len", "100", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_coordinator_context(&p, 256, &ctx, err, sizeof err), MOEQ_OK);
    assert_int_equal(ctx, 100);
    assert_int_equal(moeq_coordinator_context(&p, 0, &ctx, err, sizeof err), MOEQ_OK); /* no config.json */
    assert_int_equal(ctx, 100);
    p.max_model_len = 300;
    assert_int_equal(moeq_coordinator_context(&p, 256, &ctx, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_model_len: 300 exceeds the model's max_position_embeddings 256"));
    p.max_model_len = 0;
    assert_int_equal(moeq_coordinator_context(&p, 0, &ctx, err, sizeof err), MOEQ_OK);
    assert_int_equal(ctx, 0); /* nothing known: unchecked here, the worker checks */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_are_documented_and_valid),
        cmocka_unit_test(file_then_env_then_flags_each_override_the_last),
        cmocka_unit_test(out_of_range_and_unknown_keys_are_errors_naming_the_key),
        cmocka_unit_test(cross_field_rules_are_checked),
        cmocka_unit_test(reply_to_must_be_the_results_topic_or_allowed),
        cmocka_unit_test(help_and_markdown_list_every_key),
        cmocka_unit_test(the_dedupe_window_is_one_key_as_on_the_worker),
        cmocka_unit_test(no_context_length_check_the_context_is_the_models_or_max_model_len_below_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
