/*
 * test_worker_mtp_auto.c — mtp_k = auto's choice of drafts (worker/mtp_auto.h): it drafts deep where steps
 * are memory bound and drafts are accepted, not at all where they are rejected, where steps are compute
 * bound or where a draft would take a prompt token's place; it tries a dropped depth again; its cost table
 * reads between and beyond the step sizes it saw. Pure logic: no engine, no clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "mtp_auto.h"

static moeq_mtp_auto *make(int max_tokens, double share) {
    moeq_mtp_auto *a = NULL;
    char err[256] = "";
    assert_int_equal(moeq_mtp_auto_new(max_tokens, share, &a, err, sizeof err), MOEQ_OK);
    assert_non_null(a);
    return a;
}

/* Steps of t tokens take base + per_token * t seconds, for every t in [lo, hi], each seen `times` times. */
static void teach_line(moeq_mtp_auto *a, int lo, int hi, double base, double per_token, int times) {
    for (int r = 0; r < times; r++)
        for (int t = lo; t <= hi; t++) moeq_mtp_auto_note_step(a, t, NULL, 0, base + per_token * t, -1);
}

/* One plan of a lone job (base 1 token, room for 60 drafts), timed as 10 ms + 0.8 ms a main-step token +
 * 0.5 ms a draft pass, its drafts not timed apart. */
static void one_job_plan(moeq_mtp_auto *a, moeq_mtp_auto_job *job) {
    moeq_mtp_auto_choose(a, job, 1, 1, 60);
    int passes[3] = {job->k > 0, job->k > 1, job->k > 2};
    moeq_mtp_auto_note_step(a, 1 + job->k, passes, 3, 0.010 + 0.0008 * (1 + job->k) + 0.0005 * job->k, -1);
}

static void bad_arguments_are_refused_with_a_reason(void **state) {
    (void)state;
    moeq_mtp_auto *a = NULL;
    char err[256] = "";
    assert_int_equal(moeq_mtp_auto_new(0, 0.1, &a, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_step_tokens"));
    assert_int_equal(moeq_mtp_auto_new(64, 1.5, &a, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "draft share"));
    assert_null(a);
    moeq_mtp_auto_destroy(NULL);
}

/* The first plan looks at the plain step (no drafts: nothing timed yet); once that is timed, the optimistic
 * prior drafts every depth it may, within each job's k_max. */
static void a_new_worker_drafts_as_deep_as_each_job_allows(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(256, 0.05);
    moeq_mtp_depths d[3];
    memset(d, 0, sizeof d);
    moeq_mtp_auto_job jobs[3] = {{&d[0], 3, -1}, {&d[1], 1, -1}, {&d[2], 0, -1}};
    moeq_mtp_auto_choose(a, jobs, 3, 3, 200);
    for (int i = 0; i < 3; i++) assert_int_equal(jobs[i].k, 0);
    moeq_mtp_auto_note_step(a, 3, NULL, 0, 0.010, -1);
    moeq_mtp_auto_choose(a, jobs, 3, 3, 200);
    assert_int_equal(jobs[0].k, 3);
    assert_int_equal(jobs[1].k, 1);
    assert_int_equal(jobs[2].k, 0);
    moeq_mtp_auto_destroy(a);
}

/* Depth j + 1 is judged only when the j drafts before it were accepted. */
static void acceptance_by_depth_counts_only_the_judged_drafts(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(64, 0.05);
    moeq_mtp_depths d;
    memset(&d, 0, sizeof d);
    moeq_mtp_auto_note_round(a, &d, 3, 1); /* depth 1 accepted, depth 2 rejected, depth 3 never judged */
    assert_true(d.reached[0] == 1 && d.accepted[0] == 1);
    assert_true(d.reached[1] == 1 && d.accepted[1] == 0);
    assert_true(d.reached[2] == 0 && d.accepted[2] == 0);
    moeq_mtp_auto_note_round(a, &d, 2, 2); /* both accepted; the older round weighs a little less */
    assert_true(fabsf(d.reached[0] - 1.97f) < 1e-6f && fabsf(d.accepted[0] - 1.97f) < 1e-6f);
    assert_true(fabsf(d.reached[1] - 1.97f) < 1e-6f && fabsf(d.accepted[1] - 1.0f) < 1e-6f);
    assert_true(d.reached[2] == 0);
    assert_true(moeq_mtp_auto_acceptance(a, &d, 1) > moeq_mtp_auto_acceptance(a, &d, 2));
    assert_true(moeq_mtp_auto_acceptance(a, &d, 0) == 0 && moeq_mtp_auto_acceptance(a, &d, 99) == 0);
    moeq_mtp_auto_destroy(a);
}

/* Each plan after the first few looks at the plain step again whenever no step of about its size was timed
 * for 64 plans (so the table knows what drafts add), and every 16th drafts a depth less than it chose (so
 * it knows the sizes between); between looks it drafts 3 deep. */
static void the_plain_step_is_timed_again_every_64_plans(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(256, 0.05);
    moeq_mtp_depths d;
    memset(&d, 0, sizeof d);
    moeq_mtp_auto_job job = {&d, 3, 0};
    int looks[8], n_looks = 0, shallower = 0;
    for (int plan = 0; plan < 300; plan++) {
        one_job_plan(a, &job);
        if (job.k == 0 && n_looks < 8) looks[n_looks++] = plan;
        shallower += job.k == 2;
        if (job.k) moeq_mtp_auto_note_round(a, &d, job.k, job.k);
    }
    print_message("plain plans at %d, %d, %d, %d, %d (of %d)\n", looks[0], looks[1], looks[2], looks[3], looks[4],
                  n_looks);
    assert_int_equal(n_looks, 5);
    assert_int_equal(looks[0], 0);
    for (int i = 1; i < 5; i++) assert_int_equal(looks[i] - looks[i - 1], 64);
    print_message("%d plans a depth shallower\n", shallower);
    assert_true(shallower >= 300 / 16 - 5 && shallower <= 300 / 16 + 1);
    moeq_mtp_auto_destroy(a);
}

/* A memory-bound machine (a step of t tokens: 10 ms + 0.8 ms a token): a job whose drafts are accepted
 * drafts 3 deep, one whose drafts are all rejected stops drafting, in the same plan. (Where a token costs
 * ~1 % of a step, a draft accepted 1 time in 20 would still pay, and is drafted.) */
static void drafts_go_to_the_job_that_accepts_them(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(256, 0.05);
    teach_line(a, 1, 16, 0.010, 0.0008, 2); /* a token costs 8 % of a step: the CPU lanes on a Zen 5 */
    moeq_mtp_depths good, poor;
    memset(&good, 0, sizeof good);
    memset(&poor, 0, sizeof poor);
    moeq_mtp_auto_job jobs[2] = {{&good, 3, 0}, {&poor, 3, 0}};
    for (int plan = 0; plan < 40; plan++) {
        moeq_mtp_auto_choose(a, jobs, 2, 2, 200);
        if (jobs[0].k) moeq_mtp_auto_note_round(a, &good, jobs[0].k, jobs[0].k);
        if (jobs[1].k) moeq_mtp_auto_note_round(a, &poor, jobs[1].k, 0);
    }
    moeq_mtp_auto_choose(a, jobs, 2, 2, 200);
    print_message("memory bound: accepting job k %d, rejecting job k %d (its depth-1 acceptance %.3f)\n",
                  jobs[0].k, jobs[1].k, moeq_mtp_auto_acceptance(a, &poor, 1));
    assert_int_equal(jobs[0].k, 3);
    assert_int_equal(jobs[1].k, 0);
    moeq_mtp_auto_destroy(a);
}

/* A compute-bound machine (a step's time grows with its tokens from nothing: 1 ms a token): at batch 32 no
 * draft pays even at 0.9 acceptance; at batch 1 on a memory-bound one the same job drafts. */
static void a_compute_bound_step_gets_no_drafts(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(256, 0.05);
    teach_line(a, 1, 128, 0.0, 0.001, 2);
    moeq_mtp_depths d[32];
    moeq_mtp_auto_job jobs[32];
    memset(d, 0, sizeof d);
    for (int i = 0; i < 32; i++) {
        for (int r = 0; r < 20; r++) moeq_mtp_auto_note_round(a, &d[i], 1, (r % 10) != 0); /* 0.9 */
        jobs[i] = (moeq_mtp_auto_job){&d[i], 3, -1};
    }
    moeq_mtp_auto_choose(a, jobs, 32, 32, 200);
    for (int i = 0; i < 32; i++) assert_int_equal(jobs[i].k, 0);
    moeq_mtp_auto_destroy(a);

    a = make(256, 0.05);
    teach_line(a, 1, 8, 0.020, 0.0005, 2); /* memory bound: a token costs 1/40 of a step */
    moeq_mtp_auto_choose(a, jobs, 1, 1, 200);
    print_message("one sequence, memory bound, 0.9 acceptance: k %d\n", jobs[0].k);
    assert_true(jobs[0].k >= 2);
    moeq_mtp_auto_destroy(a);
}

/* With no room beside the waiting prompts (free_tokens 0) nothing drafts; drafts never exceed the room. */
static void drafts_never_take_a_prompt_tokens_place(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(256, 0.05);
    teach_line(a, 1, 8, 0.010, 0.0002, 1);
    moeq_mtp_depths d[4];
    memset(d, 0, sizeof d);
    moeq_mtp_auto_job jobs[4];
    for (int i = 0; i < 4; i++) jobs[i] = (moeq_mtp_auto_job){&d[i], 3, -1};
    moeq_mtp_auto_choose(a, jobs, 4, 256, 0);
    for (int i = 0; i < 4; i++) assert_int_equal(jobs[i].k, 0);
    moeq_mtp_auto_choose(a, jobs, 4, 4, 5);
    int sum = 0;
    for (int i = 0; i < 4; i++) sum += jobs[i].k;
    assert_true(sum > 0 && sum <= 5);
    moeq_mtp_auto_destroy(a);
}

/* A job that stopped drafting (every draft rejected) tries again after 32 plans without, then after 64 or
 * more (a try that the worker's figures, learnt from the same rejections, do not turn, waits for the next). */
static void a_job_that_stopped_drafting_tries_again_ever_later(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(64, 0.05);
    teach_line(a, 1, 8, 0.010, 0.0008, 2);
    moeq_mtp_depths d;
    memset(&d, 0, sizeof d);
    moeq_mtp_auto_job job = {&d, 3, 0};
    int plan = 0, last_draft = -1, gaps[3], n_gaps = 0, drafts = 0;
    for (; plan < 2000 && n_gaps < 3; plan++) {
        one_job_plan(a, &job);
        if (job.k == 0) continue;
        drafts++;
        if (last_draft >= 0 && plan - last_draft > 1) gaps[n_gaps++] = plan - last_draft - 1;
        last_draft = plan;
        moeq_mtp_auto_note_round(a, &d, job.k, 0);
    }
    print_message("%d rounds in %d plans; plans without drafts between tries: %d, %d, %d\n", drafts, plan,
                  gaps[0], gaps[1], gaps[2]);
    assert_int_equal(n_gaps, 3);
    assert_true(gaps[0] >= 32);                          /* not at once ...                       */
    assert_true(gaps[1] >= gaps[0] && gaps[2] > gaps[1]); /* ... and ever later   */
    assert_true(drafts < 40); /* each try costs a few rounds, not a stretch of them */
    moeq_mtp_auto_destroy(a);
}

/* Drafts timed apart (the engine's moeq_mtp_decoder_last_draft_ns) fill the draft table: where a pass over
 * one sequence costs 1.5 steps (a launch-bound draft, say), not the 5 % the weights' share says, the job
 * stops drafting, though its drafts are accepted 9 times in 10 (a round of k would yield 1 + 0.9 k tokens
 * for 1 + 1.5 k steps). */
static void drafts_timed_apart_are_learnt_and_dear_ones_are_not_drafted(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(64, 0.05);
    teach_line(a, 1, 16, 0.010, 0.0002, 2);
    moeq_mtp_depths d;
    memset(&d, 0, sizeof d);
    for (int r = 0; r < 30; r++) moeq_mtp_auto_note_round(a, &d, 3, r % 10 ? 3 : 0);
    moeq_mtp_auto_job job = {&d, 3, 0};
    moeq_mtp_auto_choose(a, &job, 1, 1, 60);
    assert_int_equal(job.k, 3);
    assert_true(fabs(moeq_mtp_auto_draft_cost(a, 1) - 0.05 * moeq_mtp_auto_step_cost(a, 1)) < 1e-12);
    int passes[3] = {1, 1, 1};
    for (int i = 0; i < 8; i++) moeq_mtp_auto_note_step(a, 4, passes, 3, 0.0108 + 3 * 0.015, 3 * 0.015);
    print_message("a pass over one sequence: %.4f s learnt (the weights' share said %.4f); main step of 4: %.4f\n",
                  moeq_mtp_auto_draft_cost(a, 1), 0.05 * moeq_mtp_auto_step_cost(a, 1),
                  moeq_mtp_auto_step_cost(a, 4));
    assert_true(fabs(moeq_mtp_auto_draft_cost(a, 1) - 0.015) < 1e-9);
    assert_true(fabs(moeq_mtp_auto_step_cost(a, 4) - 0.0108) < 1e-9);
    moeq_mtp_auto_choose(a, &job, 1, 1, 60);
    print_message("dear drafts: k %d\n", job.k);
    assert_int_equal(job.k, 0);
    moeq_mtp_auto_destroy(a);
}

/* The table: a straight line between two seen sizes, at least the prior's slope beyond the last, the
 * draft passes' share taken off a plan's time, never falling with the tokens, a stall clamped. */
static void the_cost_table_reads_between_and_beyond_what_it_saw(void **state) {
    (void)state;
    moeq_mtp_auto *a = make(64, 0.1);
    assert_true(moeq_mtp_auto_step_cost(a, 1) == 1.0); /* nothing seen: relative to one token */
    moeq_mtp_auto_note_step(a, 1, NULL, 0, 1.0, -1);
    moeq_mtp_auto_note_step(a, 9, NULL, 0, 1.8, -1);
    assert_true(fabs(moeq_mtp_auto_step_cost(a, 5) - 1.4) < 1e-9);
    assert_true(moeq_mtp_auto_step_cost(a, 20) >= 1.8 + 11 * 0.1 - 1e-9); /* the line's own slope, 0.1 */
    assert_true(moeq_mtp_auto_step_cost(a, 64) <= moeq_mtp_auto_step_cost(a, 65));
    moeq_mtp_auto_note_step(a, 0, NULL, 0, 5.0, -1);  /* ignored: no tokens */
    moeq_mtp_auto_note_step(a, 65, NULL, 0, 5.0, -1); /* ignored: beyond the table */
    moeq_mtp_auto_note_step(a, 3, NULL, 0, -1, -1);   /* ignored: no time */
    assert_true(fabs(moeq_mtp_auto_step_cost(a, 3) - 1.2) < 1e-9);
    /* a plan of 2 tokens with one draft pass over 1 sequence: the pass's estimated share is taken off */
    int passes[1] = {1};
    moeq_mtp_auto_note_step(a, 2, passes, 1, 1.2, -1);
    double est = 1.1, pass = 0.1 * 1.0;
    assert_true(fabs(moeq_mtp_auto_step_cost(a, 2) - 1.2 * est / (est + pass)) < 1e-9);
    /* an established entry: one stall of 100x moves it by at most an eighth of doubling */
    for (int i = 0; i < 8; i++) moeq_mtp_auto_note_step(a, 7, NULL, 0, 1.0, -1);
    moeq_mtp_auto_note_step(a, 7, NULL, 0, 100.0, -1);
    assert_true(moeq_mtp_auto_step_cost(a, 7) <= 1.0 + 1.0 / 8 + 1e-9);
    moeq_mtp_auto_destroy(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_arguments_are_refused_with_a_reason),
        cmocka_unit_test(a_new_worker_drafts_as_deep_as_each_job_allows),
        cmocka_unit_test(acceptance_by_depth_counts_only_the_judged_drafts),
        cmocka_unit_test(the_plain_step_is_timed_again_every_64_plans),
        cmocka_unit_test(drafts_go_to_the_job_that_accepts_them),
        cmocka_unit_test(a_compute_bound_step_gets_no_drafts),
        cmocka_unit_test(drafts_never_take_a_prompt_tokens_place),
        cmocka_unit_test(a_job_that_stopped_drafting_tries_again_ever_later),
        cmocka_unit_test(drafts_timed_apart_are_learnt_and_dear_ones_are_not_drafted),
        cmocka_unit_test(the_cost_table_reads_between_and_beyond_what_it_saw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
