/* test_worker_params.c — the worker's property table and pure param helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "moeq/engine.h"
#include "worker.h"

static void defaults_are_the_documented_names(void **state) {
    (void)state;
    moeq_worker_params p;
    assert_int_equal(moeq_worker_default_params(&p, NULL, 0), MOEQ_OK);
    assert_string_equal(p.group, "workers");
    assert_string_equal(p.results_topic, "moeq.results");
    assert_string_equal(p.dlq_topic, "moeq.dlq");
    char name[64];
    moeq_worker_stream_name(&p, 0, name, sizeof name);
    assert_string_equal(name, "moeq:batches:p0");
    moeq_worker_stream_name(&p, 3, name, sizeof name);
    assert_string_equal(name, "moeq:batches:p3");
    assert_true(p.max_deliveries >= 1);
}

/*
 * Every engine key can be set on the worker, under the same name, type and (for the engine's choices) default, but
 * for those the worker decides itself: batch_invariant (a job's result never depends on its batch-mates: always
 * on) and expert_weights (group exactly when ep.group is set). A key added to the engine and not to the worker
 * fails here.
 */
static void every_engine_key_is_a_worker_key_or_the_workers_own_choice(void **state) {
    (void)state;
    static const char *const own[] = {"batch_invariant", "expert_weights"};
    for (const moeq_prop *e = moeq_engine_params_props; e->name; e++) {
        int decided = 0;
        for (size_t i = 0; i < sizeof own / sizeof *own; i++) decided |= !strcmp(e->name, own[i]);
        const moeq_prop *w = moeq_worker_props;
        while (w->name && strcmp(w->name, e->name)) w++;
        if (decided) {
            assert_null(w->name); /* the worker's own choice: not a key */
            continue;
        }
        if (!w->name) fail_msg("engine key %s is not a worker key", e->name);
        assert_int_equal(w->type, e->type);
        if (e->type == MOEQ_PROP_STR && strcmp(e->name, "backend")) assert_string_equal(w->def, e->def);
    }
}

static void params_check_names_the_key_at_fault(void **state) {
    (void)state;
    moeq_worker_params p;
    char err[256];
    moeq_worker_default_params(&p, NULL, 0);
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "model"));
    strcpy(p.model, "/m");
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_OK);
    p.max_step_tokens = 4;
    p.max_seqs = 8;
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_step_tokens"));
    p.max_step_tokens = 512;
    p.visibility_timeout_ms = 1000;
    p.heartbeat_interval_ms = 2000;
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "visibility_timeout_ms"));
    p.visibility_timeout_ms = 30000;
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "kv_admission", "whole", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "kv_admission", "all", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "kv_admission: 'all' is neither shared nor whole"));
    strcpy(p.kv_admission, "shared");
    p.visibility_timeout_ms = 1000;
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "max_deliveries", "0", err, sizeof err),
                     MOEQ_ERR_INVALID_ARG);
    p.visibility_timeout_ms = 30000;
    strcpy(p.ep_group, "docs-a.1:x_y"); /* a Redis key part and a JSON string: no quote, blank or slash */
    strcpy(p.ep.transport, "ucx");
    p.ep.n_ranks = 2;
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_OK);
    strcpy(p.ep_group, "a\"b");
    assert_int_equal(moeq_worker_params_check(&p, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "ep.group"));
}

static void mtp_k_defaults_to_auto_and_stays_within_zero_to_three(void **state) {
    (void)state;
    moeq_worker_params p;
    char err[256];
    moeq_worker_default_params(&p, NULL, 0);
    assert_int_equal(p.mtp_k, MOEQ_PROP_AUTO);
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_k", "0", err, sizeof err), MOEQ_OK);
    assert_int_equal(p.mtp_k, 0);
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_k", "3", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_k", "4", err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "mtp_k"));
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_k", "-1", err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_k", "many", err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "not an integer or auto"));
}

/* mtp_k and mtp_max_batch take `auto` (stored as MOEQ_PROP_AUTO), read back as `auto`. */
static void mtp_k_and_mtp_max_batch_take_auto(void **state) {
    (void)state;
    moeq_worker_params p;
    char err[256], v[32];
    moeq_worker_default_params(&p, NULL, 0);
    assert_int_equal(p.mtp_max_batch, MOEQ_PROP_AUTO);
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_k", "auto", err, sizeof err), MOEQ_OK);
    assert_int_equal(p.mtp_k, MOEQ_PROP_AUTO);
    assert_int_equal(moeq_props_get(moeq_worker_props, &p, "mtp_k", v, sizeof v), MOEQ_OK);
    assert_string_equal(v, "auto");
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_max_batch", "AUTO", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "mtp_max_batch", "8", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_props_get(moeq_worker_props, &p, "mtp_max_batch", v, sizeof v), MOEQ_OK);
    assert_string_equal(v, "8");
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "http_port", "auto", err, sizeof err),
                     MOEQ_ERR_INVALID_ARG); /* a plain int does not */
}

static void reply_to_must_be_on_the_allow_list(void **state) {
    (void)state;
    moeq_worker_params p;
    moeq_worker_default_params(&p, NULL, 0);
    strcpy(p.results_allowed_topics, "team-a.results, team-b.results");
    assert_true(moeq_worker_topic_allowed(&p, "moeq.results"));
    assert_true(moeq_worker_topic_allowed(&p, "team-a.results"));
    assert_true(moeq_worker_topic_allowed(&p, "team-b.results"));
    assert_false(moeq_worker_topic_allowed(&p, "team-a"));
    assert_false(moeq_worker_topic_allowed(&p, "team-c.results"));
    assert_false(moeq_worker_topic_allowed(&p, ""));
}

static void the_default_seed_depends_only_on_the_id(void **state) {
    (void)state;
    uint64_t a = moeq_worker_seed_for_id("job-1", 5), b = moeq_worker_seed_for_id("job-1", 5);
    assert_true(a == b);
    assert_true(a != moeq_worker_seed_for_id("job-2", 5));
    assert_true(moeq_worker_seed_for_id("", 0) == 14695981039346656037ULL);
}

/* "Two record TTLs under two names; the shorter wins": one key, dedupe_window_s, as on the coordinator. */
static void the_dedupe_window_is_one_key_as_on_the_coordinator(void **state) {
    (void)state;
    moeq_worker_params p;
    char err[256];
    assert_int_equal(moeq_worker_default_params(&p, NULL, 0), MOEQ_OK);
    assert_int_equal(p.dedupe_window_s, 604800); /* the coordinator's default: 7 days, not 1 */
    assert_int_equal(moeq_props_set(moeq_worker_props, &p, "dedupe_window_s", "3600", err, sizeof err), MOEQ_OK);
    assert_int_equal(p.dedupe_window_s, 3600);
    moeq_config_src src = {.table = moeq_worker_props, .params = &p};
    assert_int_equal(moeq_config_apply(&src, "job_ttl_s", "60", err, sizeof err), MOEQ_OK);
    assert_int_equal(p.dedupe_window_s, 60); /* the old name: a deprecated alias of the same field */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_are_the_documented_names),
        cmocka_unit_test(every_engine_key_is_a_worker_key_or_the_workers_own_choice),
        cmocka_unit_test(params_check_names_the_key_at_fault),
        cmocka_unit_test(mtp_k_defaults_to_auto_and_stays_within_zero_to_three),
        cmocka_unit_test(mtp_k_and_mtp_max_batch_take_auto),
        cmocka_unit_test(reply_to_must_be_on_the_allow_list),
        cmocka_unit_test(the_default_seed_depends_only_on_the_id),
        cmocka_unit_test(the_dedupe_window_is_one_key_as_on_the_coordinator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
