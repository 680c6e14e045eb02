/*
 * test_coordinator_batcher.c — unit tests for the bucketing/batching policy:
 * length tolerance, closing rules, aging, shared-prefix grouping, cancel, and
 * property tests over random job streams driven by an injected clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"

static moeq_batcher *make(const moeq_batcher_params *p) {
    moeq_batcher *b = NULL;
    char err[256] = "";
    assert_int_equal(moeq_batcher_new(p, &b, err, sizeof(err)), MOEQ_OK);
    return b;
}

static moeq_batcher_job job(uint64_t h, int prio, int32_t len, int32_t max_new) {
    moeq_batcher_job j = {.handle = h, .priority = prio, .prompt_len = len, .max_new_tokens = max_new};
    return j;
}

static void add(moeq_batcher *b, moeq_batcher_job j, int64_t now) {
    char err[256] = "";
    moeq_err e = moeq_batcher_add(b, &j, now, err, sizeof(err));
    if (e) fail_msg("add %llu: %s", (unsigned long long)j.handle, err);
}

/* Take every ready batch; returns how many; handles of batch i go to out rows. */
static int batch_has(const moeq_batch_plan *p, uint64_t h) {
    for (size_t i = 0; i < p->n_jobs; i++)
        if (p->jobs[i].handle == h) return 1;
    return 0;
}

static void release_all(moeq_batcher *b) {
    const moeq_batch_plan *p;
    while ((p = moeq_batcher_next(b))) moeq_batcher_release(b, p);
}

static void a_job_joins_a_bucket_whose_mean_is_within_ten_percent(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.length_slack_tokens = 0;
    moeq_batcher *b = make(&p);
    add(b, job(1, 0, 100, 10), 0);
    add(b, job(2, 0, 108, 10), 0); /* |108-100| = 8 <= 10.8 */
    add(b, job(3, 0, 125, 10), 0); /* far from mean 104 */
    add(b, job(4, 0, 90, 10), 0);  /* |90-104| = 14 > 9 */
    assert_int_equal(moeq_batcher_open_buckets(b), 3);
    assert_int_equal(moeq_batcher_flush(b, 5), 3);
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_non_null(x);
    assert_int_equal(x->n_jobs, 2);
    assert_true(batch_has(x, 1) && batch_has(x, 2));
    assert_int_equal(x->min_prompt_len, 100);
    assert_int_equal(x->max_prompt_len, 108);
    assert_int_equal(x->pad_tokens, 8);
    assert_int_equal(x->prompt_tokens, 208);
    assert_int_equal(x->budget_tokens, 228);
    assert_int_equal(x->reason, MOEQ_BATCH_CLOSE_FLUSH);
    assert_string_equal(moeq_batch_close_str(x->reason), "flush");
    moeq_batcher_release(b, x);
    release_all(b);
    moeq_batcher_destroy(b);
}

static void short_prompts_share_a_bucket_within_the_token_slack(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.length_slack_tokens = 8;
    moeq_batcher *b = make(&p);
    for (int i = 0; i < 8; i++) add(b, job((uint64_t)i, 1, 3 + i, 0), 0); /* lengths 3..10 */
    assert_int_equal(moeq_batcher_open_buckets(b), 1);
    moeq_batcher_destroy(b);
}

static void a_batch_closes_at_max_batch_jobs(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_batch_jobs = 4;
    moeq_batcher *b = make(&p);
    for (int i = 0; i < 9; i++) add(b, job((uint64_t)i, 0, 200, 50), 0);
    assert_int_equal(moeq_batcher_ready_batches(b), 2);
    assert_int_equal(moeq_batcher_open_jobs(b), 1);
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_int_equal(x->n_jobs, 4);
    assert_int_equal(x->reason, MOEQ_BATCH_CLOSE_FULL_JOBS);
    for (uint64_t h = 0; h < 4; h++) assert_int_equal(x->jobs[h].handle, h); /* join order kept */
    moeq_batcher_release(b, x);
    release_all(b);
    moeq_batcher_destroy(b);
}

static void a_batch_never_exceeds_max_batch_tokens(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_batch_tokens = 1000;
    moeq_batcher *b = make(&p);
    /* budget 300 each: three fit (900), room 100 < average 300 -> closes full */
    for (int i = 0; i < 3; i++) add(b, job((uint64_t)i, 0, 200, 100), 0);
    assert_int_equal(moeq_batcher_ready_batches(b), 1);
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_int_equal(x->n_jobs, 3);
    assert_int_equal(x->budget_tokens, 900);
    assert_int_equal(x->reason, MOEQ_BATCH_CLOSE_FULL_TOKENS);
    moeq_batcher_release(b, x);
    /* a bucket with room but not for this job: the job opens another bucket */
    add(b, job(10, 0, 200, 0), 0);   /* 200 */
    add(b, job(11, 0, 200, 600), 0); /* 800: total 1000 fits exactly -> full */
    x = moeq_batcher_next(b);
    assert_non_null(x);
    assert_int_equal(x->budget_tokens, 1000);
    moeq_batcher_release(b, x);
    add(b, job(12, 0, 200, 100), 0); /* 300 */
    add(b, job(13, 0, 200, 750), 0); /* 950: would make 1250 */
    assert_int_equal(moeq_batcher_open_buckets(b), 1);   /* 950 alone closed at once (room 50 < 950) */
    assert_int_equal(moeq_batcher_ready_batches(b), 1);
    x = moeq_batcher_next(b);
    assert_int_equal(x->n_jobs, 1);
    assert_int_equal(x->jobs[0].handle, 13);
    moeq_batcher_release(b, x);
    moeq_batcher_destroy(b);
}

static void a_job_that_can_never_fit_is_rejected_with_limit(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_batch_tokens = 1000;
    moeq_batcher *b = make(&p);
    moeq_batcher_job j = job(1, 0, 900, 101);
    char err[256] = "";
    assert_int_equal(moeq_batcher_add(b, &j, 0, err, sizeof(err)), MOEQ_ERR_LIMIT);
    assert_non_null(strstr(err, "max_batch_tokens"));
    j = job(2, 4, 10, 1);
    assert_int_equal(moeq_batcher_add(b, &j, 0, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "priority"));
    j = job(3, 0, 0, 1);
    assert_int_equal(moeq_batcher_add(b, &j, 0, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_batcher_open_jobs(b), 0);
    moeq_batcher_destroy(b);
}

static void a_batch_closes_when_its_oldest_job_waited_max_wait_ms(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_wait_ms = 50;
    moeq_batcher *b = make(&p);
    assert_true(moeq_batcher_next_deadline(b) == INT64_MAX);
    add(b, job(1, 2, 100, 0), 1000);
    add(b, job(2, 2, 101, 0), 1030);
    assert_int_equal(moeq_batcher_next_deadline(b), 1050);
    assert_int_equal(moeq_batcher_poll(b, 1049), 0);
    assert_int_equal(moeq_batcher_poll(b, 1050), 1);
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_int_equal(x->n_jobs, 2);
    assert_int_equal(x->priority, 2);
    assert_int_equal(x->oldest_ms, 1000);
    assert_int_equal(x->closed_ms, 1050);
    assert_int_equal(x->reason, MOEQ_BATCH_CLOSE_MAX_WAIT);
    assert_int_equal(x->jobs[1].arrival_ms, 1030);
    moeq_batcher_release(b, x);
    assert_null(moeq_batcher_next(b));
    assert_true(moeq_batcher_next_deadline(b) == INT64_MAX);
    moeq_batcher_destroy(b);
}

static void max_wait_zero_closes_every_bucket_at_the_next_poll(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_wait_ms = 0;
    moeq_batcher *b = make(&p);
    add(b, job(1, 0, 100, 0), 7);
    add(b, job(2, 0, 100, 0), 7);
    assert_int_equal(moeq_batcher_poll(b, 7), 1);
    moeq_batcher_destroy(b); /* destroy frees batches never taken */
}

static void priority_classes_never_share_a_batch(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    moeq_batcher *b = make(&p);
    for (int i = 0; i < 8; i++) add(b, job((uint64_t)i, i % 4, 100, 0), 0);
    assert_int_equal(moeq_batcher_open_buckets(b), 4);
    moeq_batcher_flush(b, 1);
    const moeq_batch_plan *x;
    while ((x = moeq_batcher_next(b))) {
        for (size_t k = 0; k < x->n_jobs; k++) assert_int_equal(x->jobs[k].priority, x->priority);
        moeq_batcher_release(b, x);
    }
    moeq_batcher_destroy(b);
}

static void low_priority_jobs_age_into_higher_classes(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.aging_ms = 1000;
    moeq_batcher *b = make(&p);
    moeq_batcher_job j = job(1, 3, 100, 0);
    j.created_ms = 100000;
    assert_int_equal(moeq_batcher_effective_priority(b, &j, 100999), 3);
    assert_int_equal(moeq_batcher_effective_priority(b, &j, 101000), 2);
    assert_int_equal(moeq_batcher_effective_priority(b, &j, 102500), 1);
    assert_int_equal(moeq_batcher_effective_priority(b, &j, 190000), 0);
    j.created_ms = 0; /* unknown producer time: no aging */
    assert_int_equal(moeq_batcher_effective_priority(b, &j, 190000), 3);
    j.created_ms = 200000; /* producer clock ahead of ours: no aging, no overflow */
    assert_int_equal(moeq_batcher_effective_priority(b, &j, 190000), 3);

    j.created_ms = 100000;
    add(b, j, 102000); /* aged two classes: lands in class 1 with a fresh class-1 job */
    add(b, job(2, 1, 100, 0), 102000);
    assert_int_equal(moeq_batcher_open_buckets(b), 1);
    moeq_batcher_flush(b, 102001);
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_int_equal(x->priority, 1);
    assert_int_equal(x->n_jobs, 2);
    assert_int_equal(x->jobs[0].priority, 3); /* requested class kept for the record */
    moeq_batcher_release(b, x);

    p.aging_ms = 0; /* off */
    moeq_batcher *b0 = make(&p);
    assert_int_equal(moeq_batcher_effective_priority(b0, &j, 10000000), 3);
    moeq_batcher_destroy(b0);
    moeq_batcher_destroy(b);
}

/* Token ids: a shared 100-token instruction then a document of doc_len tokens. */
static int32_t *prompt(int shared_id, int32_t shared_len, int doc_id, int32_t doc_len) {
    int32_t *t = malloc((size_t)(shared_len + doc_len) * sizeof(int32_t));
    for (int32_t i = 0; i < shared_len; i++) t[i] = 1000 * shared_id + i;
    for (int32_t i = 0; i < doc_len; i++) t[shared_len + i] = 500000 + 1000 * doc_id + i;
    return t;
}

static void jobs_sharing_a_long_prefix_are_kept_together(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.min_shared_prefix = 64;
    moeq_batcher *b = make(&p);
    int32_t *toks[12];
    /* interleave: instruction A on docs, unrelated prompts, instruction B on docs; all ~200 tokens */
    for (int i = 0; i < 12; i++) {
        int kind = i % 3;
        int32_t doc = 100 + (i * 7) % 11;
        toks[i] = kind == 0 ? prompt(1, 100, i, doc) : kind == 1 ? prompt(50 + i, 0, i, 100 + doc) : prompt(2, 100, i, doc);
        moeq_batcher_job j = job((uint64_t)i, 0, 100 + doc, 16);
        j.tokens = toks[i];
        add(b, j, i);
    }
    moeq_batcher_flush(b, 100);
    const moeq_batch_plan *x;
    int seen_a = 0, seen_b = 0;
    while ((x = moeq_batcher_next(b))) {
        int kind0 = (int)(x->jobs[0].handle % 3);
        for (size_t k = 0; k < x->n_jobs; k++) assert_int_equal((int)(x->jobs[k].handle % 3), kind0);
        if (kind0 == 0) { seen_a++; assert_int_equal(x->n_jobs, 4); assert_true(x->shared_prefix_len >= 100); }
        if (kind0 == 2) { seen_b++; assert_int_equal(x->n_jobs, 4); assert_true(x->shared_prefix_len >= 100); }
        if (kind0 == 1) assert_true(x->shared_prefix_len < 64);
        moeq_batcher_release(b, x);
    }
    assert_int_equal(seen_a, 1);
    assert_int_equal(seen_b, 1);
    for (int i = 0; i < 12; i++) free(toks[i]);
    moeq_batcher_destroy(b);
}

static void prefix_grouping_never_overrides_the_length_tolerance(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.length_slack_tokens = 0;
    moeq_batcher *b = make(&p);
    int32_t *t1 = prompt(1, 100, 1, 20), *t2 = prompt(1, 100, 2, 200); /* 120 vs 300 tokens */
    moeq_batcher_job a = job(1, 0, 120, 0), c = job(2, 0, 300, 0);
    a.tokens = t1;
    c.tokens = t2;
    add(b, a, 0);
    add(b, c, 0);
    assert_int_equal(moeq_batcher_open_buckets(b), 2);
    moeq_batcher_destroy(b);
    free(t1);
    free(t2);
}

static void a_single_job_batch_reports_no_shared_prefix(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    moeq_batcher *b = make(&p);
    int32_t *t = prompt(1, 100, 1, 20);
    moeq_batcher_job a = job(1, 0, 120, 0);
    a.tokens = t;
    add(b, a, 0);
    moeq_batcher_flush(b, 1);
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_int_equal(x->shared_prefix_len, 0);
    moeq_batcher_release(b, x);
    moeq_batcher_destroy(b);
    free(t);
}

static void a_cancelled_job_leaves_its_bucket(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_wait_ms = 100;
    moeq_batcher *b = make(&p);
    add(b, job(1, 0, 100, 0), 0);
    add(b, job(2, 0, 104, 0), 10);
    add(b, job(3, 1, 100, 0), 20);
    moeq_batcher_job out;
    assert_int_equal(moeq_batcher_cancel(b, 1, &out), MOEQ_OK);
    assert_int_equal(out.handle, 1);
    assert_int_equal(moeq_batcher_open_jobs(b), 2);
    assert_int_equal(moeq_batcher_next_deadline(b), 110); /* oldest is now job 2 */
    assert_int_equal(moeq_batcher_cancel(b, 3, NULL), MOEQ_OK);
    assert_int_equal(moeq_batcher_open_buckets(b), 1);
    assert_int_equal(moeq_batcher_cancel(b, 3, NULL), MOEQ_ERR_NOT_FOUND);
    moeq_batcher_poll(b, 110);
    assert_int_equal(moeq_batcher_cancel(b, 2, NULL), MOEQ_ERR_NOT_FOUND); /* already batched */
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_int_equal(x->n_jobs, 1);
    assert_int_equal(x->prompt_tokens, 104);
    moeq_batcher_release(b, x);
    moeq_batcher_destroy(b);
}

static void invalid_params_are_rejected_naming_the_field(void **state) {
    (void)state;
    char err[256];
    moeq_batcher *b = NULL;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_batch_jobs = 0;
    assert_int_equal(moeq_batcher_new(&p, &b, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_batch_jobs"));
    assert_null(b);
    p = moeq_batcher_default_params();
    p.length_tolerance = 1.5;
    assert_int_equal(moeq_batcher_new(&p, &b, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "length_tolerance"));
    p = moeq_batcher_default_params();
    p.max_wait_ms = -1;
    assert_int_equal(moeq_batcher_new(&p, &b, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    moeq_batcher_destroy(NULL);
}

/* ---- property tests ------------------------------------------------------ */

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}
static int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

typedef struct sim_job {
    moeq_batcher_job j;
    int32_t *tokens;
    int64_t arrival;
    int cls;
    int seen;
} sim_job;

static double allowance(const moeq_batcher_params *p, double x) {
    double r = p->length_tolerance * x;
    return r > (double)p->length_slack_tokens ? r : (double)p->length_slack_tokens;
}

static void check_plan(const moeq_batcher_params *p, const moeq_batch_plan *x, sim_job *jobs, size_t n_jobs,
                       int64_t poll_interval, int64_t *max_wait_seen) {
    assert_true(x->n_jobs >= 1 && (int64_t)x->n_jobs <= p->max_batch_jobs);
    assert_true(x->budget_tokens <= p->max_batch_tokens);
    int64_t sp = 0, sb = 0, pad = 0;
    int32_t lo = INT32_MAX, hi = 0;
    for (size_t k = 0; k < x->n_jobs; k++) {
        const moeq_batcher_job *j = &x->jobs[k];
        assert_true(j->handle < n_jobs);
        sim_job *s = &jobs[j->handle];
        assert_int_equal(s->seen, 0); /* in exactly one batch */
        s->seen = 1;
        assert_int_equal(s->cls, x->priority);
        int64_t wait = x->closed_ms - s->arrival;
        assert_true(wait >= 0);
        if (x->reason != MOEQ_BATCH_CLOSE_FLUSH) {
            if (wait > p->max_wait_ms + poll_interval)
                fail_msg("job %llu waited %lld ms > %lld + %lld", (unsigned long long)j->handle, (long long)wait,
                         (long long)p->max_wait_ms, (long long)poll_interval);
        }
        if (wait > *max_wait_seen) *max_wait_seen = wait;
        sp += j->prompt_len;
        sb += j->prompt_len + j->max_new_tokens;
        if (j->prompt_len < lo) lo = j->prompt_len;
        if (j->prompt_len > hi) hi = j->prompt_len;
    }
    for (size_t k = 0; k < x->n_jobs; k++) pad += hi - x->jobs[k].prompt_len;
    assert_int_equal(x->prompt_tokens, sp);
    assert_int_equal(x->budget_tokens, sb);
    assert_int_equal(x->pad_tokens, pad);
    assert_int_equal(x->min_prompt_len, lo);
    assert_int_equal(x->max_prompt_len, hi);
    assert_true((double)(hi - lo) <= 2.0 * allowance(p, lo) + 1e-9);
    /* the recorded shared prefix is exactly the common prefix of all prompts */
    int all_tokens = 1;
    for (size_t k = 0; k < x->n_jobs; k++) all_tokens &= x->jobs[k].tokens != NULL;
    if (x->n_jobs >= 2 && all_tokens) {
        int32_t lcp = x->jobs[0].prompt_len;
        for (size_t k = 1; k < x->n_jobs; k++) {
            int32_t i = 0, lim = lcp < x->jobs[k].prompt_len ? lcp : x->jobs[k].prompt_len;
            while (i < lim && x->jobs[0].tokens[i] == x->jobs[k].tokens[i]) i++;
            lcp = i;
        }
        assert_int_equal(x->shared_prefix_len, lcp);
    } else {
        assert_int_equal(x->shared_prefix_len, 0);
    }
}

static void drain(moeq_batcher *b, const moeq_batcher_params *p, sim_job *jobs, size_t n, int64_t poll_interval,
                  size_t *batches, int64_t *max_wait_seen) {
    const moeq_batch_plan *x;
    while ((x = moeq_batcher_next(b))) {
        check_plan(p, x, jobs, n, poll_interval, max_wait_seen);
        (*batches)++;
        moeq_batcher_release(b, x);
    }
}

static void run_random_stream(uint64_t seed) {
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_batch_jobs = rnd_in(1, 48);
    p.max_batch_tokens = rnd_in(2048, 40000);
    p.max_wait_ms = rnd_in(0, 200);
    p.length_tolerance = (double)rnd_in(0, 30) / 100.0;
    p.length_slack_tokens = rnd_in(0, 16);
    p.min_shared_prefix = rnd_in(8, 64);
    p.aging_ms = rnd_in(0, 1) ? rnd_in(100, 2000) : 0;
    const int64_t poll_interval = rnd_in(1, 25);
    const size_t n = (size_t)rnd_in(200, 3000);
    const int n_instructions = (int)rnd_in(1, 4);
    moeq_batcher *b = make(&p);
    sim_job *jobs = calloc(n, sizeof(*jobs));
    int64_t now = 1700000000000LL, next_poll = now + poll_interval, max_wait_seen = 0;
    size_t batches = 0, cancelled = 0;
    for (size_t i = 0; i < n; i++) {
        now += rnd_in(0, 3) == 0 ? rnd_in(0, 60) : 0; /* bursts and gaps */
        while (next_poll <= now) {                    /* the loop's poll ticks */
            moeq_batcher_poll(b, next_poll);
            drain(b, &p, jobs, n, poll_interval, &batches, &max_wait_seen);
            next_poll += poll_interval;
        }
        sim_job *s = &jobs[i];
        int32_t max_new = (int32_t)rnd_in(0, 512);
        int32_t shared = rnd_in(0, 1) ? (int32_t)rnd_in(p.min_shared_prefix, 300) : 0;
        int32_t len = shared + (int32_t)rnd_in(1, 1500);
        if (len + max_new > p.max_batch_tokens) max_new = 0;
        if (len > p.max_batch_tokens) len = (int32_t)p.max_batch_tokens;
        if (shared > len) shared = len;
        s->tokens = prompt((int)rnd_in(1, n_instructions), shared, (int)i, len - shared);
        s->j = job(i, (int)rnd_in(0, 3), len, max_new);
        s->j.tokens = rnd_in(0, 9) ? s->tokens : NULL; /* some jobs without token ids */
        s->j.created_ms = now - rnd_in(0, 3000);
        s->arrival = now;
        s->cls = moeq_batcher_effective_priority(b, &s->j, now);
        add(b, s->j, now);
        drain(b, &p, jobs, n, poll_interval, &batches, &max_wait_seen);
        if (i > 10 && rnd_in(0, 99) == 0) { /* cancel a random earlier job */
            uint64_t h = (uint64_t)rnd_in(0, (int64_t)i);
            if (!jobs[h].seen && moeq_batcher_cancel(b, h, NULL) == MOEQ_OK) {
                jobs[h].seen = 2;
                cancelled++;
            }
        }
    }
    /* keep ticking until everything closed by time, never by flush */
    while (moeq_batcher_open_jobs(b)) {
        moeq_batcher_poll(b, next_poll);
        drain(b, &p, jobs, n, poll_interval, &batches, &max_wait_seen);
        next_poll += poll_interval;
    }
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].seen == 0) fail_msg("seed %llu: job %zu in no batch", (unsigned long long)seed, i);
        free(jobs[i].tokens);
    }
    assert_true(max_wait_seen <= p.max_wait_ms + poll_interval);
    assert_int_equal(moeq_batcher_ready_batches(b), 0);
    assert_int_equal(moeq_batcher_open_buckets(b), 0);
    (void)cancelled;
    free(jobs);
    moeq_batcher_destroy(b);
}

static void random_streams_put_every_job_in_exactly_one_batch_within_every_bound(void **state) {
    (void)state;
    for (uint64_t seed = 1; seed <= 200; seed++) run_random_stream(seed);
}

/* Many equal-length jobs fill batches: the fill ratio under load is high. */
static void under_steady_load_batches_are_full(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    p.max_batch_jobs = 32;
    moeq_batcher *b = make(&p);
    rng_state = 42;
    size_t full = 0, total = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        add(b, job(i, 0, (int32_t)rnd_in(950, 1050), 128), (int64_t)(i / 100)); /* 100 jobs/ms */
        moeq_batcher_poll(b, (int64_t)(i / 100));
        const moeq_batch_plan *x;
        while ((x = moeq_batcher_next(b))) {
            total++;
            full += x->reason == MOEQ_BATCH_CLOSE_FULL_JOBS;
            moeq_batcher_release(b, x);
        }
    }
    assert_true(full * 10 >= total * 9);
    moeq_batcher_destroy(b);
}

/* ---- one id, one job ------------------------------------------------------ */

static moeq_batcher_job job_id(uint64_t h, const char *id, int32_t len) {
    moeq_batcher_job j = job(h, 0, len, 8);
    j.id = id;
    j.id_len = strlen(id);
    return j;
}

/* "The same id sent twice within moments runs twice": the batcher refuses the second. */
static void a_job_id_sent_twice_within_moments_is_batched_once(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    moeq_batcher *b = make(&p);
    char err[256] = "";
    add(b, job_id(1, "doc-1", 100), 0);
    uint64_t h = 0;
    assert_int_equal(moeq_batcher_holder(b, "doc-1", 5, &h), MOEQ_OK);
    assert_int_equal(h, 1);
    moeq_batcher_job again = job_id(2, "doc-1", 100);
    assert_int_equal(moeq_batcher_add(b, &again, 1, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "doc-1"));
    moeq_batcher_job other_length = job_id(3, "doc-1", 900); /* another bucket: still refused */
    assert_int_equal(moeq_batcher_add(b, &other_length, 1, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    add(b, job_id(4, "doc-2", 100), 1);
    assert_int_equal(moeq_batcher_open_jobs(b), 2);
    assert_int_equal(moeq_batcher_flush(b, 2), 1);
    const moeq_batch_plan *x = moeq_batcher_next(b);
    assert_int_equal(x->n_jobs, 2);
    /* taken but not released (not yet durable in Redis): the id is still held */
    assert_int_equal(moeq_batcher_holder(b, "doc-1", 5, NULL), MOEQ_OK);
    moeq_batcher_release(b, x);
    assert_int_equal(moeq_batcher_holder(b, "doc-1", 5, NULL), MOEQ_ERR_NOT_FOUND);
    assert_int_equal(moeq_batcher_holder(b, "doc-2", 5, NULL), MOEQ_ERR_NOT_FOUND);
    add(b, job_id(5, "doc-1", 100), 3); /* after release the store's guard answers for it */
    moeq_batcher_destroy(b);
}

static void a_cancelled_job_no_longer_holds_its_id(void **state) {
    (void)state;
    moeq_batcher_params p = moeq_batcher_default_params();
    moeq_batcher *b = make(&p);
    add(b, job_id(1, "x", 100), 0);
    assert_int_equal(moeq_batcher_cancel(b, 1, NULL), MOEQ_OK);
    assert_int_equal(moeq_batcher_holder(b, "x", 1, NULL), MOEQ_ERR_NOT_FOUND);
    add(b, job_id(2, "x", 100), 0);
    moeq_batcher_destroy(b);
}

/*
 * Model-based: ids from a small pool, random adds, polls, late releases and
 * cancels. The batcher's holder always agrees with a model of held ids, no
 * batch carries an id twice, and no two unreleased batches share one.
 */
static void random_streams_with_reused_ids_never_batch_one_id_twice(void **state) {
    (void)state;
    enum { POOL = 300, STEPS = 20000, KEEP = 8 };
    static char ids[POOL][16];
    for (int i = 0; i < POOL; i++) snprintf(ids[i], sizeof(ids[i]), "id-%d", i);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        rng_state = seed * 0x9E3779B97F4A7C15ULL + 7;
        moeq_batcher_params p = moeq_batcher_default_params();
        p.max_batch_jobs = rnd_in(1, 32);
        p.max_wait_ms = rnd_in(0, 50);
        moeq_batcher *b = make(&p);
        int64_t holder[POOL]; /* model: handle holding id i, or -1 */
        for (int i = 0; i < POOL; i++) holder[i] = -1;
        const moeq_batch_plan *taken[KEEP];
        size_t n_taken = 0;
        int64_t now = 0;
        for (uint64_t h = 1; h <= STEPS; h++) {
            now += rnd_in(0, 2);
            int i = (int)rnd_in(0, POOL - 1);
            uint64_t got = 0;
            moeq_err e = moeq_batcher_holder(b, ids[i], strlen(ids[i]), &got);
            assert_int_equal(e == MOEQ_OK, holder[i] >= 0);
            if (e == MOEQ_OK) assert_int_equal(got, (uint64_t)holder[i]);
            moeq_batcher_job j = job_id(h, ids[i], (int32_t)rnd_in(1, 300));
            char err[256];
            e = moeq_batcher_add(b, &j, now, err, sizeof(err));
            assert_int_equal(e, holder[i] >= 0 ? MOEQ_ERR_INVALID_ARG : MOEQ_OK);
            if (e == MOEQ_OK) holder[i] = (int64_t)h;
            if (rnd_in(0, 49) == 0) { /* cancel the holder of a random id, when still open */
                int c = (int)rnd_in(0, POOL - 1);
                if (holder[c] >= 0 && moeq_batcher_cancel(b, (uint64_t)holder[c], NULL) == MOEQ_OK) holder[c] = -1;
            }
            moeq_batcher_poll(b, now);
            const moeq_batch_plan *x;
            while ((x = moeq_batcher_next(b))) {
                for (size_t k = 0; k < x->n_jobs; k++) {
                    int id = atoi(x->jobs[k].id + 3);
                    assert_int_equal(holder[id], (int64_t)x->jobs[k].handle); /* the only holder */
                }
                if (n_taken == KEEP || rnd_in(0, 1)) { /* release the oldest taken batch */
                    const moeq_batch_plan *old = n_taken ? taken[0] : x;
                    for (size_t k = 0; k < old->n_jobs; k++) holder[atoi(old->jobs[k].id + 3)] = -1;
                    moeq_batcher_release(b, old);
                    if (n_taken) {
                        memmove(taken, taken + 1, (n_taken - 1) * sizeof(taken[0]));
                        taken[n_taken - 1] = x;
                    }
                } else {
                    taken[n_taken++] = x;
                }
            }
        }
        moeq_batcher_destroy(b); /* frees the batches still taken */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_job_joins_a_bucket_whose_mean_is_within_ten_percent),
        cmocka_unit_test(short_prompts_share_a_bucket_within_the_token_slack),
        cmocka_unit_test(a_batch_closes_at_max_batch_jobs),
        cmocka_unit_test(a_batch_never_exceeds_max_batch_tokens),
        cmocka_unit_test(a_job_that_can_never_fit_is_rejected_with_limit),
        cmocka_unit_test(a_batch_closes_when_its_oldest_job_waited_max_wait_ms),
        cmocka_unit_test(max_wait_zero_closes_every_bucket_at_the_next_poll),
        cmocka_unit_test(priority_classes_never_share_a_batch),
        cmocka_unit_test(low_priority_jobs_age_into_higher_classes),
        cmocka_unit_test(jobs_sharing_a_long_prefix_are_kept_together),
        cmocka_unit_test(prefix_grouping_never_overrides_the_length_tolerance),
        cmocka_unit_test(a_single_job_batch_reports_no_shared_prefix),
        cmocka_unit_test(a_cancelled_job_leaves_its_bucket),
        cmocka_unit_test(invalid_params_are_rejected_naming_the_field),
        cmocka_unit_test(random_streams_put_every_job_in_exactly_one_batch_within_every_bound),
        cmocka_unit_test(under_steady_load_batches_are_full),
        cmocka_unit_test(a_job_id_sent_twice_within_moments_is_batched_once),
        cmocka_unit_test(a_cancelled_job_no_longer_holds_its_id),
        cmocka_unit_test(random_streams_with_reused_ids_never_batch_one_id_twice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
