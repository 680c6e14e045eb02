/*
 * test_coordinator_offsets.c — the per-partition low-water tracker: the
 * committable offset never passes a job that is not yet durable, whatever
 * order jobs become durable in.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "offsets.h"

static void nothing_tracked_means_nothing_to_commit(void **state) {
    (void)state;
    moeq_offsets *o = moeq_offsets_new();
    assert_int_equal(moeq_offsets_committable(o, "moeq.jobs", 0), -1);
    moeq_offset_commit c[4];
    assert_int_equal(moeq_offsets_collect(o, c, 4), 0);
    assert_int_equal(moeq_offsets_done(o, "moeq.jobs", 0, 5), MOEQ_ERR_NOT_FOUND);
    moeq_offsets_destroy(o);
    moeq_offsets_destroy(NULL);
}

static void the_committed_offset_never_passes_a_job_not_yet_durable(void **state) {
    (void)state;
    moeq_offsets *o = moeq_offsets_new();
    for (int64_t off = 100; off < 110; off++) assert_int_equal(moeq_offsets_track(o, "t", 3, off), MOEQ_OK);
    assert_int_equal(moeq_offsets_committable(o, "t", 3), 100);
    assert_int_equal(moeq_offsets_done(o, "t", 3, 105), MOEQ_OK);
    assert_int_equal(moeq_offsets_done(o, "t", 3, 101), MOEQ_OK);
    assert_int_equal(moeq_offsets_committable(o, "t", 3), 100);
    assert_int_equal(moeq_offsets_done(o, "t", 3, 100), MOEQ_OK);
    assert_int_equal(moeq_offsets_committable(o, "t", 3), 102);
    assert_int_equal(moeq_offsets_in_flight(o), 7);
    assert_int_equal(moeq_offsets_partition_in_flight(o, "t", 3), 7);
    for (int64_t off = 102; off < 110; off++)
        if (off != 105) assert_int_equal(moeq_offsets_done(o, "t", 3, off), MOEQ_OK);
    assert_int_equal(moeq_offsets_committable(o, "t", 3), 110); /* one past the last: next to read */
    assert_int_equal(moeq_offsets_in_flight(o), 0);
    moeq_offsets_destroy(o);
}

static void done_twice_or_unknown_is_not_found(void **state) {
    (void)state;
    moeq_offsets *o = moeq_offsets_new();
    assert_int_equal(moeq_offsets_track(o, "t", 0, 1), MOEQ_OK);
    assert_int_equal(moeq_offsets_track(o, "t", 0, 2), MOEQ_OK);
    assert_int_equal(moeq_offsets_done(o, "t", 0, 2), MOEQ_OK);
    assert_int_equal(moeq_offsets_done(o, "t", 0, 2), MOEQ_ERR_NOT_FOUND);
    assert_int_equal(moeq_offsets_done(o, "t", 0, 7), MOEQ_ERR_NOT_FOUND);
    assert_int_equal(moeq_offsets_done(o, "t", 1, 1), MOEQ_ERR_NOT_FOUND);
    assert_int_equal(moeq_offsets_in_flight(o), 1);
    moeq_offsets_destroy(o);
}

static void offsets_must_increase_within_a_partition(void **state) {
    (void)state;
    moeq_offsets *o = moeq_offsets_new();
    assert_int_equal(moeq_offsets_track(o, "t", 0, 10), MOEQ_OK);
    assert_int_equal(moeq_offsets_track(o, "t", 0, 10), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_offsets_track(o, "t", 0, 9), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_offsets_track(o, "t", 0, -1), MOEQ_ERR_INVALID_ARG);
    /* after a drop (rebalance, seek back) the partition starts over */
    moeq_offsets_drop(o, "t", 0);
    assert_int_equal(moeq_offsets_committable(o, "t", 0), -1);
    assert_int_equal(moeq_offsets_track(o, "t", 0, 3), MOEQ_OK);
    assert_int_equal(moeq_offsets_committable(o, "t", 0), 3);
    moeq_offsets_destroy(o);
}

static void gaps_in_offsets_are_skipped(void **state) {
    (void)state; /* compacted topics and transaction markers leave holes */
    moeq_offsets *o = moeq_offsets_new();
    int64_t offs[] = {10, 12, 15, 40};
    for (int i = 0; i < 4; i++) moeq_offsets_track(o, "t", 0, offs[i]);
    moeq_offsets_done(o, "t", 0, 10);
    assert_int_equal(moeq_offsets_committable(o, "t", 0), 12);
    moeq_offsets_done(o, "t", 0, 15);
    moeq_offsets_done(o, "t", 0, 12);
    assert_int_equal(moeq_offsets_committable(o, "t", 0), 40);
    moeq_offsets_done(o, "t", 0, 40);
    assert_int_equal(moeq_offsets_committable(o, "t", 0), 41);
    moeq_offsets_destroy(o);
}

static void partitions_and_topics_are_independent(void **state) {
    (void)state;
    moeq_offsets *o = moeq_offsets_new();
    moeq_offsets_track(o, "a", 0, 5);
    moeq_offsets_track(o, "a", 1, 7);
    moeq_offsets_track(o, "b", 0, 9);
    moeq_offsets_done(o, "a", 1, 7);
    assert_int_equal(moeq_offsets_committable(o, "a", 0), 5);
    assert_int_equal(moeq_offsets_committable(o, "a", 1), 8);
    assert_int_equal(moeq_offsets_committable(o, "b", 0), 9);
    moeq_offsets_drop(o, "a", 0);
    assert_int_equal(moeq_offsets_in_flight(o), 1);
    assert_int_equal(moeq_offsets_committable(o, "b", 0), 9);
    assert_int_equal(moeq_offsets_committable(o, "a", 1), 8);
    moeq_offsets_destroy(o);
}

static void collect_reports_each_partition_once_per_move(void **state) {
    (void)state;
    moeq_offsets *o = moeq_offsets_new();
    moeq_offset_commit c[8];
    moeq_offsets_track(o, "t", 0, 0);
    moeq_offsets_track(o, "t", 1, 0);
    size_t n = moeq_offsets_collect(o, c, 8); /* committable 0: nothing consumed durably, still reportable */
    assert_int_equal(n, 2);
    assert_int_equal(moeq_offsets_collect(o, c, 8), 0);
    moeq_offsets_done(o, "t", 1, 0);
    n = moeq_offsets_collect(o, c, 8);
    assert_int_equal(n, 1);
    assert_string_equal(c[0].topic, "t");
    assert_int_equal(c[0].partition, 1);
    assert_int_equal(c[0].offset, 1);
    moeq_offsets_uncollect(o, "t", 1); /* the commit failed: report again */
    assert_int_equal(moeq_offsets_collect(o, c, 8), 1);
    assert_int_equal(moeq_offsets_collect(o, c, 1), 0);
    moeq_offsets_destroy(o);
}

static void long_topic_names_are_refused(void **state) {
    (void)state;
    char topic[MOEQ_OFFSETS_TOPIC_MAX + 10];
    memset(topic, 'x', sizeof(topic) - 1);
    topic[sizeof(topic) - 1] = 0;
    moeq_offsets *o = moeq_offsets_new();
    assert_int_not_equal(moeq_offsets_track(o, topic, 0, 1), MOEQ_OK);
    moeq_offsets_destroy(o);
}

/* Model check: random interleavings of track/done against a brute-force oracle. */
static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void random_completion_orders_match_a_brute_force_model(void **state) {
    (void)state;
    enum { P = 3, N = 5000 };
    for (int round = 0; round < 20; round++) {
        moeq_offsets *o = moeq_offsets_new();
        static int64_t offs[P][N];
        static int done[P][N];
        int n_tracked[P] = {0};
        int64_t next_off[P] = {0};
        memset(done, 0, sizeof(done));
        for (int step = 0; step < 4 * N; step++) {
            int p = (int)(rnd() % P);
            if (rnd() % 2 && n_tracked[p] < N) {
                next_off[p] += 1 + (int64_t)(rnd() % 3 == 0); /* some gaps */
                offs[p][n_tracked[p]++] = next_off[p];
                assert_int_equal(moeq_offsets_track(o, "jobs", p, next_off[p]), MOEQ_OK);
            } else if (n_tracked[p]) {
                /* mostly recent ones finish first (small buckets flush fast), sometimes old ones */
                int k = rnd() % 4 ? n_tracked[p] - 1 - (int)(rnd() % (uint64_t)(n_tracked[p] < 64 ? n_tracked[p] : 64))
                                  : (int)(rnd() % (uint64_t)n_tracked[p]);
                moeq_err e = moeq_offsets_done(o, "jobs", p, offs[p][k]);
                assert_int_equal(e, done[p][k] ? MOEQ_ERR_NOT_FOUND : MOEQ_OK);
                done[p][k] = 1;
            }
            /* oracle: the lowest not-done offset, else one past the last tracked */
            int64_t expect = -1;
            if (n_tracked[p]) {
                expect = offs[p][n_tracked[p] - 1] + 1;
                for (int k = 0; k < n_tracked[p]; k++)
                    if (!done[p][k]) { expect = offs[p][k]; break; }
            }
            assert_int_equal(moeq_offsets_committable(o, "jobs", p), expect);
        }
        size_t pending = 0;
        for (int p = 0; p < P; p++)
            for (int k = 0; k < n_tracked[p]; k++) pending += !done[p][k];
        assert_int_equal(moeq_offsets_in_flight(o), pending);
        moeq_offsets_destroy(o);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nothing_tracked_means_nothing_to_commit),
        cmocka_unit_test(the_committed_offset_never_passes_a_job_not_yet_durable),
        cmocka_unit_test(done_twice_or_unknown_is_not_found),
        cmocka_unit_test(offsets_must_increase_within_a_partition),
        cmocka_unit_test(gaps_in_offsets_are_skipped),
        cmocka_unit_test(partitions_and_topics_are_independent),
        cmocka_unit_test(collect_reports_each_partition_once_per_move),
        cmocka_unit_test(long_topic_names_are_refused),
        cmocka_unit_test(random_completion_orders_match_a_brute_force_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
