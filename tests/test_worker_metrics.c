/* test_worker_metrics.c — Prometheus rendering of the worker's counters (no server). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "worker_metrics.h"

static void counters_and_the_latency_histogram_render_as_prometheus_text(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    atomic_store(&m.batches_taken, 3);
    atomic_store(&m.batches_dead_lettered, 1);
    moeq_worker_metrics_observe_latency(&m, 40);   /* <= 50      */
    moeq_worker_metrics_observe_latency(&m, 700);  /* <= 1000    */
    moeq_worker_metrics_observe_latency(&m, 1e7);  /* +Inf only  */
    char buf[16384];
    size_t n = moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_true(n > 0 && n < sizeof buf);
    assert_non_null(strstr(buf, "# TYPE moeq_worker_batches_taken_total counter\n"));
    assert_non_null(strstr(buf, "moeq_worker_batches_taken_total{worker=\"w1\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_dead_lettered_total{worker=\"w1\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_job_latency_ms_bucket{worker=\"w1\",le=\"50\"} 1\n"));
    assert_non_null(strstr(buf, "moeq_worker_job_latency_ms_bucket{worker=\"w1\",le=\"1000\"} 2\n"));
    assert_non_null(strstr(buf, "moeq_worker_job_latency_ms_bucket{worker=\"w1\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_job_latency_ms_count{worker=\"w1\"} 3\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_acceptance_rate{worker=\"w1\"} 0.0000\n")); /* nothing drafted */
    /* a small buffer truncates, never overflows */
    char tiny[64];
    size_t t = moeq_worker_metrics_render(&m, "w1", tiny, sizeof tiny);
    assert_true(t < sizeof tiny);
    assert_int_equal(strlen(tiny), t);
}

static void mtp_totals_and_the_acceptance_rate_are_rendered(void **state) {
    (void)state;
    static moeq_worker_metrics m;
    memset(&m, 0, sizeof m);
    atomic_store(&m.mtp_rounds, 5);
    atomic_store(&m.mtp_drafted, 8);
    atomic_store(&m.mtp_accepted, 6);
    char buf[16384];
    moeq_worker_metrics_render(&m, "w1", buf, sizeof buf);
    assert_non_null(strstr(buf, "moeq_worker_mtp_rounds_total{worker=\"w1\"} 5\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_drafted_total{worker=\"w1\"} 8\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_accepted_total{worker=\"w1\"} 6\n"));
    assert_non_null(strstr(buf, "# TYPE moeq_worker_mtp_acceptance_rate gauge\n"));
    assert_non_null(strstr(buf, "moeq_worker_mtp_acceptance_rate{worker=\"w1\"} 0.7500\n"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counters_and_the_latency_histogram_render_as_prometheus_text),
        cmocka_unit_test(mtp_totals_and_the_acceptance_rate_are_rendered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
