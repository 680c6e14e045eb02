/*
 * test_worker_metrics.c — Prometheus rendering of the worker's counters (no
 * server), and the conventions docs/METRICS.md promises: seconds in
 * `_seconds` histograms, `_total` only on counters, no `_ms`, the set vLLM
 * users know (running / waiting, KV cache usage, prompt / generation tokens,
 * results by status and finish reason, build info).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_lint.h"
#include "moeq/util.h"
#include "worker_metrics.h"

static moeq_result result(moeq_result_status status, moeq_finish_reason fr, int64_t prompt, int64_t completion) {
    moeq_result r = {.id = "j", .status = status, .finish_reason = fr};
    r.usage.prompt_tokens = prompt;
    r.usage.completion_tokens = completion;
    r.timings.queued_ms = 30;
    r.timings.batched_ms = 10;     /* queue time 40 ms */
    r.timings.decode_ms = 90;      /* 3 tokens after the first: 30 ms each */
    r.timings.total_ms = 700;
    return r;
}

static void latency_histograms_render_in_seconds(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    atomic_store(&m.batches_taken, 3);
    atomic_store(&m.batches_dead_lettered, 1);
    moeq_result r = result(MOEQ_RESULT_OK, MOEQ_FINISH_LENGTH, 5, 4);
    moeq_worker_metrics_observe_result(&m, &r);
    r.timings.total_ms = 40;
    moeq_worker_metrics_observe_result(&m, &r);
    r.timings.total_ms = 10000000; /* beyond the last bound: +Inf only */
    moeq_worker_metrics_observe_result(&m, &r);
    moeq_worker_metrics_observe_ttft(&m, 120);
    char buf[65536];
    size_t n = moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_true(n > 0 && n < sizeof buf);
    assert_non_null(strstr(buf, "# TYPE moeq_worker_batches_taken_total counter\n"));
    assert_non_null(strstr(buf, "moeq_worker_batches_taken_total{worker=\"w1\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_dead_lettered_total{worker=\"w1\"} 1\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_e2e_request_latency_seconds histogram\n"));
    assert_non_null(strstr(buf, "moeq_worker_e2e_request_latency_seconds_bucket{worker=\"w1\",le=\"0.05\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_e2e_request_latency_seconds_bucket{worker=\"w1\",le=\"1\"} 2\n"));
    assert_non_null(strstr(buf, "moeq_worker_e2e_request_latency_seconds_bucket{worker=\"w1\",le=\"900\"} 2\n"));
    assert_non_null(strstr(buf, "moeq_worker_e2e_request_latency_seconds_bucket{worker=\"w1\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_e2e_request_latency_seconds_count{worker=\"w1\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_e2e_request_latency_seconds_sum{worker=\"w1\"} 10000.740000\n"));
    assert_non_null(strstr(buf, "moeq_worker_request_queue_time_seconds_bucket{worker=\"w1\",le=\"0.05\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_time_per_output_token_seconds_bucket{worker=\"w1\",le=\"0.025\"} 0\n"));
    assert_non_null(strstr(buf, "moeq_worker_time_per_output_token_seconds_bucket{worker=\"w1\",le=\"0.05\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_time_to_first_token_seconds_bucket{worker=\"w1\",le=\"0.1\"} 0\n"));
    assert_non_null(strstr(buf, "moeq_worker_time_to_first_token_seconds_bucket{worker=\"w1\",le=\"0.25\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_time_to_first_token_seconds_sum{worker=\"w1\"} 0.120000\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_acceptance_rate{worker=\"w1\"} 0.0000\n")); /* nothing drafted */
    /* a small buffer truncates, never overflows */
    char tiny[64];
    size_t t = moeq_worker_metrics_render(&m, "w1", tiny, sizeof tiny);
    assert_true(t < sizeof tiny);
    assert_int_equal(strlen(tiny), t);
}

static void engine_seconds_total_holds_seconds_not_nanoseconds(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    atomic_store(&m.engine_ns, 2500000000LL); /* 2.5 s */
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "moeq_worker_engine_seconds_total{worker=\"w1\"} 2.500000\n"));
}

static void results_are_counted_by_status_and_finish_reason_with_their_tokens(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    moeq_result r = result(MOEQ_RESULT_OK, MOEQ_FINISH_STOP_TOKEN, 10, 4);
    moeq_worker_metrics_observe_result(&m, &r);
    moeq_worker_metrics_observe_result(&m, &r);
    r = result(MOEQ_RESULT_ERROR, MOEQ_FINISH_NONE, 3, 0);
    moeq_worker_metrics_observe_result(&m, &r);
    r = result(MOEQ_RESULT_EXPIRED, MOEQ_FINISH_DEADLINE, 2, 1);
    moeq_worker_metrics_observe_result(&m, &r);
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "# TYPE moeq_worker_results_total counter\n"));
    assert_non_null(strstr(buf, "moeq_worker_results_total{worker=\"w1\",status=\"ok\",finish_reason=\"stop_token\"} 2\n"));
    assert_non_null(strstr(buf, "moeq_worker_results_total{worker=\"w1\",status=\"error\",finish_reason=\"none\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_results_total{worker=\"w1\",status=\"expired\",finish_reason=\"deadline\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_results_total{worker=\"w1\",status=\"cancelled\",finish_reason=\"none\"} 0\n"));
    assert_null(strstr(buf, "status=\"ok\",finish_reason=\"length\"")); /* a pair never seen is absent */
    assert_non_null(strstr(buf, "moeq_worker_prompt_tokens_total{worker=\"w1\"} 25\n"));
    assert_non_null(strstr(buf, "moeq_worker_generation_tokens_total{worker=\"w1\"} 9\n"));
}

static void running_and_waiting_jobs_and_kv_cache_usage_are_gauges(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    atomic_store(&m.sequences_active, 3); /* rendered as requests_running */
    atomic_store(&m.requests_waiting, 5);
    atomic_store(&m.kv_reserved_tokens, 4096);
    atomic_store(&m.kv_capacity_tokens, 16384);
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "# TYPE moeq_worker_requests_running gauge\nmoeq_worker_requests_running{worker=\"w1\"} 3\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_requests_waiting gauge\nmoeq_worker_requests_waiting{worker=\"w1\"} 5\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_kv_cache_usage_ratio gauge\n"));
    assert_non_null(strstr(buf, "moeq_worker_kv_cache_usage_ratio{worker=\"w1\"} 0.2500\n"));
    char want[128];
    snprintf(want, sizeof want, "moeq_worker_build_info{worker=\"w1\",version=\"%s\"} 1\n", moeq_version());
    assert_non_null(strstr(buf, want));
}

/* The device the engine runs on (issue 14): backend and ordinal, its memory, the latent cache pool. */
static void the_device_its_memory_and_the_kv_pool_are_gauges(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_null(strstr(buf, "moeq_worker_device_info")); /* before the engine exists: nothing claimed */
    snprintf(m.device_backend, sizeof m.device_backend, "cuda");
    m.device_ordinal = 3;
    atomic_store(&m.device_used_bytes, 5000000000LL);
    atomic_store(&m.device_total_bytes, 150000000000LL);
    atomic_store(&m.kv_pool_bytes, 603979776LL);
    atomic_store(&m.device_known, 1);
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "moeq_worker_device_info{worker=\"w1\",backend=\"cuda\",device=\"3\"} 1\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_device_memory_used_bytes gauge\n"
                                "moeq_worker_device_memory_used_bytes{worker=\"w1\"} 5000000000\n"));
    assert_non_null(strstr(buf, "moeq_worker_device_memory_total_bytes{worker=\"w1\"} 150000000000\n"));
    assert_non_null(strstr(buf, "moeq_worker_kv_pool_bytes{worker=\"w1\"} 603979776\n"));
}

static void every_worker_metric_follows_the_prometheus_conventions(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    snprintf(m.device_backend, sizeof m.device_backend, "cpu");
    atomic_store(&m.device_known, 1); /* the device families too */
    static atomic_llong slots[2 * 3];
    atomic_store(&slots[4], 7);
    m.expert_slots = slots, m.expert_layers = 2, m.expert_n = 3; /* and the expert load */
    atomic_store(&m.expert_known, 1);
    moeq_result r = result(MOEQ_RESULT_OK, MOEQ_FINISH_STOP, 1, 2);
    moeq_worker_metrics_observe_result(&m, &r);
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    char why[512];
    if (moeq_test_metrics_lint(buf, why, sizeof why)) fail_msg("%s", why);
    if (moeq_test_metrics_documented(buf, why, sizeof why)) fail_msg("%s", why);
    /* the lint itself: each kind of mistake the issue found is caught */
    assert_int_not_equal(moeq_test_metrics_lint("# TYPE a_total gauge\na_total 1\n", why, sizeof why), 0);
    assert_int_not_equal(moeq_test_metrics_lint("# TYPE a_count counter\na_count 1\n", why, sizeof why), 0);
    assert_int_not_equal(moeq_test_metrics_lint("# TYPE a_ms_sum counter\na_ms_sum 1\n", why, sizeof why), 0);
    assert_int_not_equal(moeq_test_metrics_lint("# TYPE a_seconds histogram\na_seconds_bucket{le=\"+Inf\"} 1\n"
                                                "a_seconds_sum 1\n", why, sizeof why), 0); /* no _count */
}

static void mtp_totals_and_the_acceptance_rate_are_rendered(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    atomic_store(&m.mtp_rounds, 5);
    atomic_store(&m.mtp_drafted, 8);
    atomic_store(&m.mtp_accepted, 6);
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "moeq_worker_mtp_rounds_total{worker=\"w1\"} 5\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_drafted_total{worker=\"w1\"} 8\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_accepted_total{worker=\"w1\"} 6\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_mtp_acceptance_rate gauge\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_acceptance_rate{worker=\"w1\"} 0.7500\n"));
}

/* The screened head's counters (the loop copies moeq_engine_head_screen_stats after each step). */
static void the_screened_heads_counters_are_rendered(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "moeq_worker_head_screen_on{worker=\"w1\"} 0\n")); /* before any greedy row */
    atomic_store(&m.screen_on, 1);
    atomic_store(&m.screen_rows, 40);
    atomic_store(&m.screen_candidates, 760);
    atomic_store(&m.screen_fallbacks, 1);
    atomic_store(&m.screen_refined, 3);
    atomic_store(&m.screen_bytes, 16973824);
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "# TYPE moeq_worker_head_screen_on gauge\n"));
    assert_non_null(strstr(buf, "moeq_worker_head_screen_on{worker=\"w1\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_head_screen_rows_total{worker=\"w1\"} 40\n"));
    assert_non_null(strstr(buf, "moeq_worker_head_screen_candidates_total{worker=\"w1\"} 760\n"));
    assert_non_null(strstr(buf, "moeq_worker_head_screen_fallbacks_total{worker=\"w1\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_head_screen_refined_total{worker=\"w1\"} 3\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_head_screen_bytes gauge\n"));
    assert_non_null(strstr(buf, "moeq_worker_head_screen_bytes{worker=\"w1\"} 16973824\n"));
}

/* The routed experts' load (issue 13's planner input): slots per expert over layers, max / mean per layer. */
static void the_experts_load_is_a_counter_per_expert_and_an_imbalance_per_layer(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    char buf[65536];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_null(strstr(buf, "expert_slots_total")); /* before the engine exists: nothing */
    static atomic_llong slots[3 * 4];                /* 3 layers x 4 experts; layer 0 dense */
    const long long v[12] = {0, 0, 0, 0, 6, 2, 0, 0, 1, 1, 1, 1};
    for (int i = 0; i < 12; i++) atomic_store(&slots[i], v[i]);
    m.expert_slots = slots, m.expert_layers = 3, m.expert_n = 4;
    atomic_store(&m.expert_known, 1);
    assert_true(moeq_worker_metrics_render_size(&m) >= 65536 + 7 * 80);
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "# TYPE moeq_worker_expert_slots_total counter\n"));
    assert_non_null(strstr(buf, "moeq_worker_expert_slots_total{worker=\"w1\",expert=\"0\"} 7\n"));
    assert_non_null(strstr(buf, "moeq_worker_expert_slots_total{worker=\"w1\",expert=\"3\"} 1\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_expert_load_imbalance gauge\n"));
    assert_non_null(strstr(buf, "moeq_worker_expert_load_imbalance{worker=\"w1\",layer=\"1\"} 3.0000\n"));
    assert_non_null(strstr(buf, "moeq_worker_expert_load_imbalance{worker=\"w1\",layer=\"2\"} 1.0000\n"));
    assert_null(strstr(buf, "layer=\"0\"")); /* a layer without routed slots is absent */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(latency_histograms_render_in_seconds),
        cmocka_unit_test(engine_seconds_total_holds_seconds_not_nanoseconds),
        cmocka_unit_test(results_are_counted_by_status_and_finish_reason_with_their_tokens),
        cmocka_unit_test(running_and_waiting_jobs_and_kv_cache_usage_are_gauges),
        cmocka_unit_test(the_device_its_memory_and_the_kv_pool_are_gauges),
        cmocka_unit_test(every_worker_metric_follows_the_prometheus_conventions),
        cmocka_unit_test(mtp_totals_and_the_acceptance_rate_are_rendered),
        cmocka_unit_test(the_screened_heads_counters_are_rendered),
        cmocka_unit_test(the_experts_load_is_a_counter_per_expert_and_an_imbalance_per_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
