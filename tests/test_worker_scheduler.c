/*
 * test_worker_scheduler.c — the continuous-batching policy, decision by
 * decision: an injected clock and a fake engine (tokens are computed from
 * what each slot was fed), no model, no I/O.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/util.h"
#include "scheduler.h"

/* ---- a fake detokenizer: ids < 256 are bytes, 300 = "ab", 301 = special ---- */

#define TOK_AB 300
#define TOK_SPECIAL 301
#define TOK_EOS 1000

typedef struct fake_job {
    char key[32];
    char held[8];  /* incomplete UTF-8 tail */
    size_t n_held;
    char out[16];
    int flushes;
    int pushes;    /* tokens detokenized */
} fake_job;

static size_t fake_detok(void *ctx, void *user, int32_t token, const char **bytes) {
    (void)ctx;
    fake_job *fj = user;
    char buf[16];
    size_t n = 0;
    if (token == MOEQ_SCHED_DETOK_FLUSH) {
        fj->flushes++;
        memcpy(fj->out, fj->held, fj->n_held);
        n = fj->n_held;
        fj->n_held = 0;
        *bytes = fj->out;
        return n;
    }
    assert_true(token != TOK_EOS);
    fj->pushes++;
    if (token < 256) buf[n++] = (char)token;
    else if (token == TOK_AB) { buf[n++] = 'a'; buf[n++] = 'b'; }
    memcpy(fj->held + fj->n_held, buf, n);
    fj->n_held += n;
    size_t done = moeq_utf8_complete_prefix(fj->held, fj->n_held);
    memcpy(fj->out, fj->held, done);
    memmove(fj->held, fj->held + done, fj->n_held - done);
    fj->n_held -= done;
    *bytes = fj->out;
    return done;
}

/* The tests' parameters: 4-token cache blocks, TOK_EOS as the stop id; the rest as given or default. */
static moeq_sched_params test_params(int max_seqs, int max_step_tokens, int64_t kv_tokens) {
    static const int32_t eos[] = {TOK_EOS};
    moeq_sched_params p = moeq_sched_default_params();
    p.max_seqs = max_seqs;
    p.max_step_tokens = max_step_tokens;
    p.kv_cache_tokens = kv_tokens;
    p.kv_block_tokens = 4;
    p.stop_ids = eos;
    p.n_stop_ids = 1;
    return p;
}

static moeq_sched *new_sched_with(const moeq_sched_params *p) {
    moeq_sched *s = NULL;
    char err[256];
    assert_int_equal(moeq_sched_new(p, fake_detok, NULL, &s, err, sizeof err), MOEQ_OK);
    return s;
}

static moeq_sched *new_sched(int max_seqs, int max_step_tokens, int64_t kv_tokens) {
    moeq_sched_params p = test_params(max_seqs, max_step_tokens, kv_tokens);
    return new_sched_with(&p);
}

static const int32_t PROMPT[64] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};

static moeq_sched_job_spec spec(fake_job *fj, const char *key, int n_prompt, int max_new) {
    snprintf(fj->key, sizeof fj->key, "%s", key);
    return (moeq_sched_job_spec){.key = fj->key, .user = fj, .priority = 2, .prompt = PROMPT,
                                 .n_prompt = n_prompt, .max_new_tokens = max_new};
}

static void add(moeq_sched *s, void *batch, moeq_sched_job_spec *jobs, size_t n, int64_t now) {
    char err[256];
    assert_int_equal(moeq_sched_add_batch(s, batch, jobs, n, now, err, sizeof err), MOEQ_OK);
}

/* Run one plan, sampling `tok` for every item that samples. Returns n_items. */
static int step(moeq_sched *s, int64_t now, int32_t tok, moeq_sched_step *out) {
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, now, &plan), MOEQ_OK);
    if (out) *out = plan;
    if (plan.n_items == 0) return 0;
    int32_t sampled[64];
    for (int i = 0; i < plan.n_items; i++) sampled[i] = tok;
    assert_int_equal(moeq_sched_commit(s, sampled, now), MOEQ_OK);
    return plan.n_items;
}

/* ---- tests ---------------------------------------------------------------------- */

static void a_job_prefills_then_decodes_one_token_per_step(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 64, 0);
    fake_job fj = {0};
    moeq_sched_job_spec j = spec(&fj, "j1", 5, 3);
    add(s, (void *)1, &j, 1, 100);

    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 101, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 1);
    assert_int_equal(plan.items[0].new_seq, 1);
    assert_int_equal(plan.items[0].n_tokens, 5);
    assert_int_equal(plan.items[0].sample, 1);
    assert_ptr_equal(plan.items[0].user, &fj);
    assert_int_equal(plan.n_prefill_tokens, 5);
    int32_t t = 'x';
    assert_int_equal(moeq_sched_commit(s, &t, 102), MOEQ_OK);

    assert_int_equal(moeq_sched_plan(s, 103, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 1);
    assert_int_equal(plan.items[0].new_seq, 0);
    assert_int_equal(plan.items[0].n_tokens, 1);
    assert_int_equal(plan.items[0].tokens[0], 'x'); /* the sampled token is fed back */
    assert_int_equal(plan.n_decode_tokens, 1);
    t = 'y';
    assert_int_equal(moeq_sched_commit(s, &t, 104), MOEQ_OK);
    assert_int_equal(step(s, 105, 'z', NULL), 1);

    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "j1");
    assert_int_equal(fin.status, MOEQ_RESULT_OK);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_LENGTH);
    assert_string_equal(fin.text, "xyz");
    assert_int_equal(fin.n_tokens, 3);
    assert_int_equal(fin.n_prompt, 5);
    assert_int_equal(fin.added_ms, 100);
    assert_int_equal(fin.admitted_ms, 101);
    assert_int_equal(fin.first_token_ms, 102);
    assert_int_equal(fin.finished_ms, 105);
    assert_int_equal(fj.flushes, 1);
    assert_int_equal(moeq_sched_next_finished(s, &fin), 0);

    assert_int_equal(moeq_sched_plan(s, 106, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 0);
    assert_int_equal(plan.n_released, 1); /* the slot is handed back to free the engine sequence */
    moeq_sched_destroy(s);
}

/* Issue 11, "NaN crashes the engine": a job whose logits held NaN (the worker samples -1) ends alone with
 * numerical_error; its batch-mate goes on to its normal result. */
static void nan_crashes_the_engine_no_more_only_the_poisoned_job_ends_with_numerical_error(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 64, 0);
    fake_job a = {0}, b = {0};
    moeq_sched_job_spec j[2] = {spec(&a, "poisoned", 5, 3), spec(&b, "healthy", 6, 3)};
    add(s, NULL, j, 2, 0);
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 1, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 2);
    int32_t sampled[2];
    for (int i = 0; i < 2; i++) sampled[i] = plan.items[i].user == &a ? -1 : 'x';
    for (int i = 0; i < 2; i++)
        if (plan.items[i].user == &a) moeq_sched_note_nonfinite_layer(s, plan.items[i].job, 1);
    assert_int_equal(moeq_sched_commit(s, sampled, 2), MOEQ_OK);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "poisoned");
    assert_int_equal(fin.status, MOEQ_RESULT_ERROR);
    assert_string_equal(fin.error_code, "numerical_error");
    assert_non_null(strstr(fin.error_message, "NaN"));
    assert_non_null(strstr(fin.error_message, "first seen by the router of layer 1"));
    assert_int_equal(fin.n_tokens, 0);
    assert_int_equal(moeq_sched_delivered(s, fin.job, 1), MOEQ_OK);
    assert_int_equal(step(s, 3, 'y', NULL), 1);
    assert_int_equal(step(s, 4, 'z', NULL), 1);
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "healthy");
    assert_int_equal(fin.status, MOEQ_RESULT_OK);
    assert_string_equal(fin.text, "xyz");
    moeq_sched_destroy(s);
}

/* Issue 11, "No context-length check": the worker refuses what does not fit the model's context. */
static void no_context_length_check_a_job_past_max_model_len_gets_prompt_too_long(void **state) {
    (void)state;
    moeq_sched_params p = test_params(4, 64, 0);
    p.max_model_len = 16;
    moeq_sched *s = new_sched_with(&p);
    fake_job a = {0}, b = {0};
    moeq_sched_job_spec j[2] = {spec(&a, "long", 10, 7), spec(&b, "fits", 10, 6)}; /* 17 > 16, 16 fits */
    add(s, NULL, j, 2, 0);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "long");
    assert_int_equal(fin.status, MOEQ_RESULT_ERROR);
    assert_string_equal(fin.error_code, "prompt_too_long");
    assert_non_null(strstr(fin.error_message, "10 tokens"));
    assert_non_null(strstr(fin.error_message, "context of 16"));
    assert_int_equal(moeq_sched_next_finished(s, &fin), 0);
    assert_int_equal(step(s, 1, 'x', NULL), 1); /* the other one runs */
    moeq_sched_destroy(s);
}

/* Issue 11, "Result text is cut at the first NUL byte": the text keeps a 0x00 byte and what follows it. */
static void result_text_is_cut_at_the_first_nul_byte_no_more_in_the_scheduler(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 64, 0);
    fake_job a = {0};
    moeq_sched_job_spec j = spec(&a, "nul", 3, 3);
    add(s, NULL, &j, 1, 0);
    int32_t toks[3] = {'a', 0, 'b'};
    for (int i = 0; i < 3; i++) assert_int_equal(step(s, 1 + i, toks[i], NULL), 1);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.text_len, 3);
    assert_memory_equal(fin.text, "a\0b", 3);
    moeq_sched_destroy(s);
}

static void a_long_prompt_is_prefilled_in_chunks_of_max_step_tokens(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 8, 0);
    fake_job fj = {0};
    moeq_sched_job_spec j = spec(&fj, "long", 20, 2);
    add(s, NULL, &j, 1, 0);
    int sizes[3] = {8, 8, 4};
    for (int k = 0; k < 3; k++) {
        moeq_sched_step plan;
        assert_int_equal(moeq_sched_plan(s, k, &plan), MOEQ_OK);
        assert_int_equal(plan.n_items, 1);
        assert_int_equal(plan.items[0].n_tokens, sizes[k]);
        assert_int_equal(plan.items[0].tokens[0], PROMPT[8 * k]);
        assert_int_equal(plan.items[0].new_seq, k == 0);
        assert_int_equal(plan.items[0].sample, k == 2);
        int32_t t = 'q';
        assert_int_equal(moeq_sched_commit(s, &t, k), MOEQ_OK);
    }
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.prefill_tokens, 20);
    moeq_sched_destroy(s);
}

static void decodes_go_first_and_prefills_fill_the_rest_of_the_step(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 6, 0);
    fake_job a = {0}, b = {0};
    moeq_sched_job_spec ja = spec(&a, "a", 3, 10);
    add(s, NULL, &ja, 1, 0);
    assert_int_equal(step(s, 1, 'x', NULL), 1); /* a prefilled */
    moeq_sched_job_spec jb = spec(&b, "b", 12, 10);
    add(s, NULL, &jb, 1, 2);
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 3, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 2);
    assert_ptr_equal(plan.items[0].user, &a); /* decode first */
    assert_int_equal(plan.items[0].n_tokens, 1);
    assert_ptr_equal(plan.items[1].user, &b);
    assert_int_equal(plan.items[1].n_tokens, 5); /* 6 - 1 decode */
    assert_int_equal(plan.n_tokens, 6);
    assert_int_equal(plan.items[1].sample, 0);
    moeq_sched_destroy(s);
}

static void jobs_of_the_next_batch_take_slots_as_they_free_up(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job f[4];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec b1[2] = {spec(&f[0], "a1", 2, 1), spec(&f[1], "a2", 2, 3)};
    moeq_sched_job_spec b2[2] = {spec(&f[2], "b1", 2, 2), spec(&f[3], "b2", 2, 2)};
    add(s, (void *)1, b1, 2, 0);
    add(s, (void *)2, b2, 2, 0);
    assert_int_equal(moeq_sched_free_capacity(s), -2);
    moeq_sched_step plan;
    assert_int_equal(step(s, 1, 'x', &plan), 2); /* a1 finishes at once (max_new 1) */
    assert_int_equal(plan.items[0].slot, 0);
    assert_int_equal(plan.items[1].slot, 1);
    assert_int_equal(moeq_sched_plan(s, 2, &plan), MOEQ_OK);
    assert_int_equal(plan.n_released, 1);
    assert_int_equal(plan.released[0], 0);
    assert_int_equal(plan.n_items, 2);
    /* a2 decodes, b1 takes the freed slot 0 with a fresh sequence */
    assert_ptr_equal(plan.items[0].user, &f[1]);
    assert_ptr_equal(plan.items[1].user, &f[2]);
    assert_int_equal(plan.items[1].slot, 0);
    assert_int_equal(plan.items[1].new_seq, 1);
    int32_t t[2] = {'y', 'y'};
    assert_int_equal(moeq_sched_commit(s, t, 2), MOEQ_OK);
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.running, 2);
    assert_int_equal(st.pending, 1);
    moeq_sched_destroy(s);
}

static void higher_priority_jobs_are_admitted_first(void **state) {
    (void)state;
    moeq_sched *s = new_sched(1, 64, 0);
    fake_job lo = {0}, hi = {0};
    moeq_sched_job_spec jl = spec(&lo, "lo", 2, 1);
    jl.priority = 3;
    moeq_sched_job_spec jh = spec(&hi, "hi", 2, 1);
    jh.priority = 0;
    add(s, NULL, &jl, 1, 0);
    add(s, NULL, &jh, 1, 1);
    moeq_sched_step plan;
    assert_int_equal(step(s, 2, 'x', &plan), 1);
    assert_ptr_equal(plan.items[0].user, &hi);
    assert_int_equal(step(s, 3, 'x', &plan), 1);
    assert_ptr_equal(plan.items[0].user, &lo);
    moeq_sched_destroy(s);
}

static void a_stop_id_ends_the_job_and_stays_out_of_the_text(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job fj = {0};
    moeq_sched_job_spec j = spec(&fj, "eos", 2, 10);
    add(s, NULL, &j, 1, 0);
    step(s, 1, 'h', NULL);
    step(s, 2, 'i', NULL);
    step(s, 3, TOK_EOS, NULL);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_STOP_TOKEN);
    assert_string_equal(fin.text, "hi");
    assert_int_equal(fin.n_tokens, 3);
    assert_int_equal(fin.tokens[2], TOK_EOS);
    moeq_sched_destroy(s);
}

static void run_tokens(moeq_sched *s, const int32_t *toks, int n) {
    for (int i = 0; i < n; i++) step(s, i + 1, toks[i], NULL);
}

static void a_stop_string_split_over_tokens_is_found_and_cut(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job fj = {0};
    const char *stops[] = {"zz", "bEN", ""};
    moeq_sched_job_spec j = spec(&fj, "stop", 2, 50);
    j.stop = stops;
    j.n_stop = 3;
    add(s, NULL, &j, 1, 0);
    /* text grows "x" "ab" "E" "N" -> "xabEN": "bEN" spans the "ab" token and two more */
    const int32_t toks[] = {'x', TOK_AB, 'E', 'N', 'y'};
    run_tokens(s, toks, 4);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_STOP);
    assert_string_equal(fin.text, "xa");
    assert_int_equal(fin.text_len, 2);
    assert_int_equal(fin.n_tokens, 4);
    assert_int_equal(fj.flushes, 0);
    moeq_sched_destroy(s);
}

static void the_earliest_of_several_stop_strings_wins(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job fj = {0};
    const char *stops[] = {"cd", "bcd"};
    moeq_sched_job_spec j = spec(&fj, "stop2", 2, 50);
    j.stop = stops;
    j.n_stop = 2;
    add(s, NULL, &j, 1, 0);
    const int32_t toks[] = {'a', 'b', 'c', 'd'};
    run_tokens(s, toks, 4);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.text, "a");
    moeq_sched_destroy(s);
}

static void a_character_split_over_tokens_is_held_until_complete(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job fj = {0};
    const char *stops[] = {"\xc3\xa9!"}; /* "é!" */
    moeq_sched_job_spec j = spec(&fj, "utf8", 2, 3);
    j.stop = stops;
    j.n_stop = 1;
    add(s, NULL, &j, 1, 0);
    const int32_t toks[] = {0xc3, 0xa9, 'x'};
    run_tokens(s, toks, 3);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_LENGTH);
    assert_string_equal(fin.text, "\xc3\xa9x");

    /* a job ending mid-character gets the held byte at flush */
    fake_job g = {0};
    moeq_sched_job_spec k = spec(&g, "cut", 2, 2);
    add(s, NULL, &k, 1, 10);
    const int32_t t2[] = {'o', 0xe2};
    run_tokens(s, t2, 2);
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.text_len, 2);
    assert_memory_equal(fin.text, "o\xe2", 2);
    moeq_sched_destroy(s);
}

static void deadlines_expire_pending_and_running_jobs_with_partial_text(void **state) {
    (void)state;
    moeq_sched *s = new_sched(1, 64, 0);
    fake_job a = {0}, b = {0};
    moeq_sched_job_spec ja = spec(&a, "run", 2, 100);
    ja.deadline_ms = 50;
    moeq_sched_job_spec jb = spec(&b, "wait", 2, 100);
    jb.deadline_ms = 30;
    add(s, NULL, &ja, 1, 0);
    add(s, NULL, &jb, 1, 0);
    step(s, 10, 'p', NULL);
    step(s, 20, 'q', NULL);
    moeq_sched_step plan;
    assert_int_equal(step(s, 30, 'r', &plan), 1); /* "wait" expires while pending */
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "wait");
    assert_int_equal(fin.status, MOEQ_RESULT_EXPIRED);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_DEADLINE);
    assert_int_equal(fin.admitted_ms, 0);
    assert_int_equal(fin.text_len, 0);
    assert_int_equal(step(s, 50, 's', &plan), 0); /* "run" expires at its deadline, within one step */
    assert_int_equal(plan.n_released, 1);
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "run");
    assert_int_equal(fin.status, MOEQ_RESULT_EXPIRED);
    assert_string_equal(fin.text, "pqr");
    moeq_sched_destroy(s);
}

static void a_cancelled_job_stops_within_one_step_with_its_partial_text(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job a = {0}, b = {0};
    moeq_sched_job_spec j[2] = {spec(&a, "keep", 2, 5), spec(&b, "drop", 2, 5)};
    add(s, NULL, j, 2, 0);
    step(s, 1, 'a', NULL);
    step(s, 2, 'b', NULL);
    assert_int_equal(moeq_sched_cancel(s, "drop"), MOEQ_OK);
    assert_int_equal(moeq_sched_cancel(s, "nobody"), MOEQ_ERR_NOT_FOUND);
    moeq_sched_step plan;
    assert_int_equal(step(s, 3, 'c', &plan), 1);
    assert_ptr_equal(plan.items[0].user, &a);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "drop");
    assert_int_equal(fin.status, MOEQ_RESULT_CANCELLED);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_CANCELLED);
    assert_string_equal(fin.text, "ab");
    assert_int_equal(moeq_sched_cancel(s, "drop"), MOEQ_ERR_NOT_FOUND); /* its result is fixed */
    moeq_sched_destroy(s);
}

static void a_batch_is_ackable_only_after_every_result_was_delivered(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 64, 0);
    fake_job f[3];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec j[3] = {spec(&f[0], "x", 2, 1), spec(&f[1], "y", 2, 1), spec(&f[2], "z", 2, 2)};
    add(s, (void *)7, j, 3, 0);
    step(s, 1, 'a', NULL);
    moeq_sched_finished fx, fy;
    assert_int_equal(moeq_sched_next_finished(s, &fx), 1);
    assert_int_equal(moeq_sched_next_finished(s, &fy), 1);
    assert_ptr_equal(fx.batch_user, (void *)7);
    void *b = NULL;
    assert_int_equal(moeq_sched_delivered(s, fx.job, 1), MOEQ_OK);
    assert_int_equal(moeq_sched_delivered(s, fx.job, 1), MOEQ_ERR_INVALID_ARG); /* not handed out */
    assert_int_equal(moeq_sched_delivered(s, fy.job, 0), MOEQ_OK);           /* broker failed it: again */
    assert_int_equal(moeq_sched_next_ackable(s, &b), 0);
    step(s, 2, 'b', NULL);
    moeq_sched_finished f1, f2;
    assert_int_equal(moeq_sched_next_finished(s, &f1), 1);
    assert_string_equal(f1.key, "y"); /* the retried one first */
    assert_int_equal(moeq_sched_next_finished(s, &f2), 1);
    assert_string_equal(f2.key, "z");
    assert_int_equal(moeq_sched_delivered(s, f1.job, 1), MOEQ_OK);
    assert_int_equal(moeq_sched_next_ackable(s, &b), 0);
    assert_false(moeq_sched_idle(s));
    assert_int_equal(moeq_sched_delivered(s, f2.job, 1), MOEQ_OK);
    assert_int_equal(moeq_sched_next_ackable(s, &b), 1);
    assert_ptr_equal(b, (void *)7);
    assert_int_equal(moeq_sched_next_ackable(s, &b), 0);
    assert_true(moeq_sched_idle(s));
    moeq_sched_destroy(s);
}

static void an_empty_batch_is_ackable_at_once(void **state) {
    (void)state;
    moeq_sched *s = new_sched(1, 8, 0);
    add(s, (void *)9, NULL, 0, 0);
    void *b = NULL;
    assert_int_equal(moeq_sched_next_ackable(s, &b), 1);
    assert_ptr_equal(b, (void *)9);
    moeq_sched_destroy(s);
}

static void jobs_that_cannot_run_get_results_without_a_slot(void **state) {
    (void)state;
    moeq_sched *s = new_sched(1, 8, 16);
    fake_job f[3];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec j[3] = {spec(&f[0], "empty", 0, 4), spec(&f[1], "zero", 2, 0), spec(&f[2], "huge", 10, 10)};
    add(s, NULL, j, 3, 0);
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 1, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 0);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.status, MOEQ_RESULT_ERROR);
    assert_string_equal(fin.error_code, "invalid_value"); /* a documented code (was invalid_input) */
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.status, MOEQ_RESULT_OK);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_LENGTH);
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_string_equal(fin.key, "huge");
    assert_string_equal(fin.error_code, "prompt_too_long"); /* a documented code (was too_long) */
    moeq_sched_destroy(s);
}

static void dead_lettered_and_cancelled_jobs_finish_without_running(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 8, 0);
    fake_job f[2];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec j[2] = {spec(&f[0], "poison", 2, 4), spec(&f[1], "gone", 2, 4)};
    j[0].error_code = "dead_letter";
    j[0].error_message = "delivered 4 times";
    j[1].cancelled = 1;
    add(s, (void *)3, j, 2, 0);
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 1, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 0);
    moeq_sched_finished a, b;
    assert_int_equal(moeq_sched_next_finished(s, &a), 1);
    assert_int_equal(a.status, MOEQ_RESULT_ERROR);
    assert_string_equal(a.error_code, "dead_letter");
    assert_string_equal(a.error_message, "delivered 4 times");
    assert_int_equal(moeq_sched_next_finished(s, &b), 1);
    assert_int_equal(b.status, MOEQ_RESULT_CANCELLED);
    assert_int_equal(moeq_sched_delivered(s, a.job, 1), MOEQ_OK);
    assert_int_equal(moeq_sched_delivered(s, b.job, 1), MOEQ_OK);
    void *batch = NULL;
    assert_int_equal(moeq_sched_next_ackable(s, &batch), 1);
    assert_ptr_equal(batch, (void *)3);
    moeq_sched_destroy(s);
}

static void the_kv_cache_reservation_bounds_admission(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 64, 24); /* block 4: each 5+6 job reserves 12 */
    fake_job f[3];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec j[3] = {spec(&f[0], "a", 5, 6), spec(&f[1], "b", 5, 6), spec(&f[2], "c", 5, 6)};
    add(s, NULL, j, 3, 0);
    moeq_sched_step plan;
    assert_int_equal(step(s, 1, 'x', &plan), 2);
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.kv_reserved_tokens, 24);
    assert_int_equal(st.pending, 1);
    moeq_sched_destroy(s);
}

/* The engine's blocks as a test sets them (moeq_sched_kv): one pool (no MTP), every open sequence's remaining
 * growth, and the prompt blocks live sequences hold. */
typedef struct fake_kv {
    int64_t takeable, total, grow, held;
} fake_kv;

static void fkv_pool(void *ctx, int mtp, int64_t *takeable, int64_t *total) {
    const fake_kv *k = ctx;
    *takeable = mtp ? 0 : k->takeable;
    *total = mtp ? 0 : k->total;
}

static int64_t fkv_grow(void *ctx, int slot, int mtp, int64_t n_tokens) {
    (void)slot, (void)mtp, (void)n_tokens;
    return ((const fake_kv *)ctx)->grow;
}

static int64_t fkv_held(void *ctx, const int32_t *prompt, int n_prompt, int mtp) {
    (void)prompt, (void)n_prompt, (void)mtp;
    return ((const fake_kv *)ctx)->held;
}

static int no_prefix(void *ctx, const int32_t *prompt, int n_prompt, int mtp) {
    (void)ctx, (void)prompt, (void)n_prompt, (void)mtp;
    return 0;
}

/*
 * With the engine's blocks injected, admission counts what running jobs may still take, not their whole
 * lengths: a job not yet fed counts its whole length (3 blocks of 4 for 5 + 6 tokens) less the prompt blocks
 * live sequences hold, an open one what the engine says it still needs (blocks it shares count nothing).
 */
static void with_the_engines_blocks_admission_counts_shared_blocks_once(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 64, 24);
    int calls = 0;
    moeq_sched_set_prefix_lookup(s, no_prefix, &calls);
    fake_kv kv = {.takeable = 7, .total = 7, .grow = 3, .held = 0};
    moeq_sched_set_kv(s, &(moeq_sched_kv){fkv_pool, fkv_grow, fkv_held, &kv});
    fake_job f[4];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec j[4] = {spec(&f[0], "a", 5, 6), spec(&f[1], "b", 5, 6), spec(&f[2], "c", 5, 6),
                                spec(&f[3], "d", 5, 6)};
    add(s, NULL, j, 4, 0);
    moeq_sched_step plan;
    moeq_sched_stats st;
    assert_int_equal(step(s, 1, 'x', &plan), 2); /* 3 + 3 of 7: the third would need 9 */
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.running, 2);
    kv.grow = 1;                                  /* a and b took one block each; the rest is shared */
    kv.takeable = 5;
    assert_int_equal(step(s, 2, 'x', &plan), 3); /* 1 + 1 + c's 3 = 5 */
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.running, 3);
    assert_int_equal(st.pending, 1);
    assert_int_equal(st.kv_reserved_tokens, (7 - 5 + 1 + 1 + 3) * 4); /* held 2 blocks + 5 promised */
    kv.held = 2;                                  /* d's prompt: 2 of its 3 blocks are held by live sequences */
    kv.grow = 0;
    kv.takeable = 1;
    assert_int_equal(step(s, 3, 'x', &plan), 4); /* 0 + 0 + 0 + d's 3 - 2 = 1 */
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.running, 4);
    assert_int_equal(st.running_max, 4);
    moeq_sched_destroy(s);
}

/* A job whose whole length the pool cannot promise while others run is admitted once nothing runs. */
static void a_job_admitted_while_nothing_runs_takes_the_pool_alone(void **state) {
    (void)state;
    moeq_sched *s = new_sched(4, 64, 24);
    fake_kv kv = {.takeable = 2, .total = 6, .grow = 3, .held = 0}; /* 4 blocks still held by released ones */
    moeq_sched_set_kv(s, &(moeq_sched_kv){fkv_pool, fkv_grow, fkv_held, &kv});
    fake_job f[2];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec j[2] = {spec(&f[0], "a", 5, 6), spec(&f[1], "b", 5, 6)};
    add(s, NULL, j, 2, 0);
    moeq_sched_step plan;
    assert_int_equal(step(s, 1, 'x', &plan), 1); /* a alone (3 > 2 takeable, but nothing runs); b waits */
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.running, 1);
    assert_int_equal(st.pending, 1);
    moeq_sched_destroy(s);
}

static void an_engine_failure_fails_the_jobs_of_the_step(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job a = {0};
    moeq_sched_job_spec j = spec(&a, "boom", 2, 5);
    add(s, NULL, &j, 1, 0);
    step(s, 1, 'a', NULL);
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 2, &plan), MOEQ_OK);
    assert_int_equal(moeq_sched_plan(s, 2, &plan), MOEQ_ERR_INVALID_ARG); /* commit or abort first */
    moeq_sched_abort(s, "engine", "cache full", 3);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.status, MOEQ_RESULT_ERROR);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_ERROR);
    assert_string_equal(fin.error_code, "engine");
    assert_string_equal(fin.error_message, "cache full");
    assert_string_equal(fin.text, "a");
    moeq_sched_destroy(s);
}

static void bad_params_are_rejected_with_the_field_named(void **state) {
    (void)state;
    moeq_sched_params p = moeq_sched_default_params();
    p.max_step_tokens = 8;
    p.max_seqs = 16;
    moeq_sched *s = NULL;
    char err[256];
    assert_int_equal(moeq_sched_new(&p, NULL, NULL, &s, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_step_tokens"));
    assert_null(s);
}

/* ---- speculative rounds (MTP) ------------------------------------------------------ */

static moeq_sched_job_spec mtp_spec(fake_job *fj, const char *key, int max_new, int mtp_k) {
    moeq_sched_job_spec j = spec(fj, key, 2, max_new);
    j.mtp_k = mtp_k;
    return j;
}

/* Plan: expect exactly one round (and no step items) of k drafts after next_token. */
static void expect_round(moeq_sched *s, int64_t now, int32_t next_token, int k) {
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, now, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 0);
    assert_int_equal(plan.n_rounds, 1);
    assert_int_equal(plan.rounds[0].next_token, next_token);
    assert_int_equal(plan.rounds[0].k, k);
    assert_int_equal(plan.n_round_tokens, k + 1);
}

static void commit_round(moeq_sched *s, int64_t now, const int32_t *toks, int n, int drafted, int accepted) {
    moeq_sched_round_out o = {toks, n, drafted, accepted};
    assert_int_equal(moeq_sched_commit_mtp(s, NULL, &o, now), MOEQ_OK);
}

static void a_stop_id_inside_an_accepted_run_ends_the_job_there_and_frees_the_sequence(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job fj = {0};
    moeq_sched_job_spec j = mtp_spec(&fj, "mtp-eos", 10, 3);
    add(s, NULL, &j, 1, 0);
    moeq_sched_step plan;
    assert_int_equal(step(s, 1, 'h', &plan), 1); /* the prompt goes through an ordinary step */
    assert_int_equal(plan.items[0].mtp, 1);      /* so the worker marks the new sequence */
    assert_int_equal(plan.items[0].new_seq, 1);
    expect_round(s, 2, 'h', 3);
    const int32_t run[] = {'i', TOK_EOS, 'x', 'y'}; /* all 3 drafts accepted, EOS is the 2nd token */
    commit_round(s, 3, run, 4, 3, 3);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_STOP_TOKEN);
    assert_string_equal(fin.text, "hi");
    assert_int_equal(fin.n_tokens, 3); /* h i EOS: x and y are dropped */
    assert_int_equal(fin.tokens[2], TOK_EOS);
    assert_int_equal(fj.pushes, 2);    /* x and y never reached the detokenizer */
    assert_int_equal(fin.mtp, 1);
    assert_int_equal(fin.mtp_drafted, 3);
    assert_int_equal(fin.mtp_accepted, 3);
    /* the sequence holds tokens past the stop: its slot is released, never decoded again */
    assert_int_equal(moeq_sched_plan(s, 4, &plan), MOEQ_OK);
    assert_int_equal(plan.n_released, 1);
    assert_int_equal(plan.n_items + plan.n_rounds, 0);
    moeq_sched_destroy(s);
}

static void a_stop_string_completed_inside_an_accepted_run_cuts_the_text_there(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job fj = {0};
    const char *stops[] = {"ab"};
    moeq_sched_job_spec j = mtp_spec(&fj, "mtp-stop", 20, 3);
    j.stop = stops;
    j.n_stop = 1;
    add(s, NULL, &j, 1, 0);
    step(s, 1, 'x', NULL);
    expect_round(s, 2, 'x', 3);
    const int32_t run[] = {'a', 'b', 'c'}; /* 2 of 3 drafts accepted; "ab" completes at the 2nd */
    commit_round(s, 3, run, 3, 3, 2);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_STOP);
    assert_string_equal(fin.text, "x");
    assert_int_equal(fin.n_tokens, 3); /* x a b, as single-token decoding would stop */
    assert_int_equal(fj.pushes, 3);
    assert_int_equal(fj.flushes, 0);
    moeq_sched_destroy(s);
}

/* Above mtp_max_seqs decoding sequences a plan has no rounds (one token each); at or below it, rounds again. */
static void rounds_pause_while_more_sequences_decode_than_mtp_max_seqs(void **state) {
    (void)state;
    moeq_sched_params p = test_params(4, 64, 0);
    p.mtp_max_seqs = 2;
    moeq_sched *s = new_sched_with(&p);
    char err[256];
    fake_job fj[3];
    memset(fj, 0, sizeof fj);
    moeq_sched_job_spec j[3] = {mtp_spec(&fj[0], "a", 2, 1), mtp_spec(&fj[1], "b", 20, 1), mtp_spec(&fj[2], "c", 20, 1)};
    add(s, NULL, j, 3, 0);
    moeq_sched_step plan;
    assert_int_equal(step(s, 1, 'x', &plan), 3); /* three prompts */
    assert_int_equal(moeq_sched_plan(s, 2, &plan), MOEQ_OK); /* three decoding > 2: no rounds */
    assert_int_equal(plan.n_rounds, 0);
    assert_int_equal(plan.n_items, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(plan.items[i].mtp, 1); /* still marked */
    int32_t t[3] = {'y', 'y', 'y'};
    assert_int_equal(moeq_sched_commit(s, t, 3), MOEQ_OK); /* job a reaches max_new_tokens 2 */
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(moeq_sched_plan(s, 4, &plan), MOEQ_OK); /* two decoding: rounds again */
    assert_int_equal(plan.n_items, 0);
    assert_int_equal(plan.n_rounds, 2);
    p.mtp_max_seqs = -1;
    moeq_sched *bad = NULL;
    assert_int_equal(moeq_sched_new(&p, fake_detok, NULL, &bad, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "mtp_max_seqs"));
    moeq_sched_destroy(s);
}

/* Run plans of one job until it has n_out tokens; count the plans that were rounds. Rounds accept `acc` of 1. */
static int drive(moeq_sched *s, int64_t *now, int until, int acc) {
    int rounds = 0;
    for (;;) {
        moeq_sched_step plan;
        assert_int_equal(moeq_sched_plan(s, (*now)++, &plan), MOEQ_OK);
        if (plan.n_rounds + plan.n_items == 0) return rounds;
        if (plan.n_rounds) {
            assert_int_equal(plan.rounds[0].k, 1);
            const int32_t run[] = {'r', 'r'};
            moeq_sched_round_out o = {run, 1 + acc, 1, acc};
            assert_int_equal(moeq_sched_commit_mtp(s, NULL, &o, *now), MOEQ_OK);
            rounds++;
        } else {
            int32_t t = 'p';
            assert_int_equal(moeq_sched_commit(s, &t, *now), MOEQ_OK);
        }
        moeq_sched_stats st;
        moeq_sched_get_stats(s, &st);
        if (st.decode_tokens >= until) return rounds;
    }
}

/*
 * One plan of mtp_auto: rounds of the job whose user is good accept every draft, the others none; items
 * sample 'p'; the plan's time is noted as 10 ms + per_token a token of the main step (the worker times it).
 * k_of[0] / k_of[1]: the good job's / the other's drafts this plan (0: it decoded plainly; -1: neither).
 */
static void auto_plan(moeq_sched *s, int64_t *now, const fake_job *good, double per_token, int *k_of) {
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, (*now)++, &plan), MOEQ_OK);
    int32_t sampled[16];
    for (int i = 0; i < 16; i++) sampled[i] = 'p';
    static int32_t run[8][MOEQ_SCHED_MAX_MTP_K + 1];
    moeq_sched_round_out o[8];
    k_of[0] = k_of[1] = -1;
    for (int i = 0; i < plan.n_items; i++) k_of[plan.items[i].user == good ? 0 : 1] = 0;
    for (int r = 0; r < plan.n_rounds; r++) {
        int k = plan.rounds[r].k, ok = plan.rounds[r].user == good;
        for (int t = 0; t <= k; t++) run[r][t] = 'r';
        o[r] = (moeq_sched_round_out){run[r], ok ? k + 1 : 1, k, ok ? k : 0};
        k_of[ok ? 0 : 1] = k;
    }
    moeq_sched_note_step_seconds(s, 0.010 + per_token * (plan.n_tokens + plan.n_round_tokens), -1);
    assert_int_equal(moeq_sched_commit_mtp(s, sampled, o, *now), MOEQ_OK);
}

/* Params of an mtp_auto scheduler with 4 slots and steps of max_step_tokens; a draft pass costs 5 % of a step. */
static moeq_sched_params auto_params(int max_step_tokens) {
    moeq_sched_params p = test_params(4, max_step_tokens, 0);
    p.mtp_auto = 1;
    p.mtp_draft_share = 0.05;
    return p;
}

/* mtp_auto: on a step where a token costs 8 % of it, the job whose drafts are accepted gets 3 a round and
 * the one whose drafts are rejected decodes plainly, side by side; the plain one tries again later. */
static void mtp_auto_drafts_deep_for_the_accepting_job_and_not_for_the_rejecting_one(void **state) {
    (void)state;
    moeq_sched_params p = auto_params(64);
    moeq_sched *s = new_sched_with(&p);
    fake_job fj[2];
    memset(fj, 0, sizeof fj);
    moeq_sched_job_spec j[2] = {mtp_spec(&fj[0], "good", 2000, 3), mtp_spec(&fj[1], "bad", 2000, 3)};
    add(s, NULL, j, 2, 0);
    int64_t now = 1;
    int k_of[2], bad_rounds = 0;
    for (int i = 0; i < 100; i++) {
        auto_plan(s, &now, &fj[0], 0.0008, k_of);
        bad_rounds += k_of[1] > 0;
    }
    print_message("after 100 plans: good job k %d, bad job k %d (it drafted in %d plans)\n", k_of[0], k_of[1],
                  bad_rounds);
    assert_int_equal(k_of[0], 3);
    assert_int_equal(k_of[1], 0);
    assert_true(bad_rounds >= 2 && bad_rounds < 20);
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    assert_true(st.mtp_accepted > 0 && st.mtp_accepted < st.mtp_drafted);
    moeq_sched_destroy(s);

    p.mtp_draft_share = 1.5;
    moeq_sched *bad = NULL;
    char err[256];
    assert_int_equal(moeq_sched_new(&p, fake_detok, NULL, &bad, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "mtp_draft_share"));
}

/* mtp_auto: while a waiting prompt fills the step, a speculative job decodes plainly (a draft there would
 * take a prompt token's place); once the prompt is in, it drafts again. */
static void mtp_auto_gives_no_drafts_while_a_prompt_fills_the_step(void **state) {
    (void)state;
    moeq_sched_params p = auto_params(16);
    moeq_sched *s = new_sched_with(&p);
    fake_job fj[2];
    memset(fj, 0, sizeof fj);
    moeq_sched_job_spec j = mtp_spec(&fj[0], "spec", 2000, 3);
    add(s, NULL, &j, 1, 0);
    int64_t now = 1;
    int k_of[2];
    auto_plan(s, &now, &fj[0], 0.0008, k_of); /* its prompt */
    auto_plan(s, &now, &fj[0], 0.0008, k_of); /* a look at the plain step of one token */
    auto_plan(s, &now, &fj[0], 0.0008, k_of);
    assert_int_equal(k_of[0], 3);
    moeq_sched_job_spec long_prompt = spec(&fj[1], "long", 60, 4); /* 60 tokens: the 15 left in each step */
    add(s, NULL, &long_prompt, 1, now);
    for (int i = 0; i < 4; i++) {
        auto_plan(s, &now, &fj[0], 0.0008, k_of);
        assert_int_equal(k_of[0], 0);
    }
    auto_plan(s, &now, &fj[0], 0.0008, k_of); /* the rest of the prompt */
    auto_plan(s, &now, &fj[0], 0.0008, k_of); /* room again */
    assert_true(k_of[0] > 0);
    moeq_sched_destroy(s);
}

/* Poor acceptance pauses drafting for 32 tokens, then 64 (doubling), a good window resets the pause. */
static void a_job_with_poor_acceptance_pauses_drafting_and_looks_again(void **state) {
    (void)state;
    moeq_sched_params p = test_params(2, 64, 0);
    p.mtp_min_acceptance = 0.5;
    moeq_sched *s = new_sched_with(&p);
    char err[256];
    fake_job fj = {0};
    moeq_sched_job_spec j = mtp_spec(&fj, "poor", 400, 1);
    add(s, NULL, &j, 1, 0);
    int64_t now = 1;
    step(s, now++, 'x', NULL); /* prompt + first token */
    assert_int_equal(drive(s, &now, 16, 0), 16);      /* a window of 16 rejected drafts: 16 rounds */
    assert_int_equal(drive(s, &now, 16 + 32, 0), 0);  /* then 32 plain tokens */
    assert_int_equal(drive(s, &now, 64, 0), 16);      /* drafting again: another poor window */
    assert_int_equal(drive(s, &now, 64 + 64, 0), 0);  /* the pause doubled */
    assert_int_equal(drive(s, &now, 128 + 32, 1), 16); /* a good window (16 rounds of 2 tokens)... */
    assert_int_equal(drive(s, &now, 160 + 16, 0), 16); /* ...resets the pause: the next poor one gets 32 */
    assert_int_equal(drive(s, &now, 176 + 32, 0), 0);
    assert_int_equal(drive(s, &now, 208 + 1, 0), 1);
    p.mtp_min_acceptance = 1.5;
    moeq_sched *bad = NULL;
    assert_int_equal(moeq_sched_new(&p, fake_detok, NULL, &bad, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "mtp_min_acceptance"));
    moeq_sched_destroy(s);
}

static void rounds_never_draft_past_max_new_tokens(void **state) {
    (void)state;
    moeq_sched *s = new_sched(2, 64, 0);
    fake_job fj = {0};
    moeq_sched_job_spec j = mtp_spec(&fj, "mtp-len", 4, 3);
    add(s, NULL, &j, 1, 0);
    step(s, 1, 'p', NULL);
    expect_round(s, 2, 'p', 2); /* 3 tokens left: at most 2 drafts + 1 */
    const int32_t bad[] = {'q', 'r', 's', 't'};
    moeq_sched_round_out o = {bad, 4, 2, 2}; /* more than k + 1 tokens: refused, the plan stays open */
    assert_int_equal(moeq_sched_commit_mtp(s, NULL, &o, 3), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_sched_commit(s, NULL, 3), MOEQ_ERR_INVALID_ARG); /* a plan with rounds needs them */
    commit_round(s, 3, bad, 2, 2, 1);
    /* 1 token left: no round, one plain decode token (the sequence stays marked) */
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 4, &plan), MOEQ_OK);
    assert_int_equal(plan.n_rounds, 0);
    assert_int_equal(plan.n_items, 1);
    assert_int_equal(plan.items[0].tokens[0], 'r');
    assert_int_equal(plan.items[0].mtp, 1);
    int32_t t = 'z';
    assert_int_equal(moeq_sched_commit(s, &t, 5), MOEQ_OK);
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_LENGTH);
    assert_string_equal(fin.text, "pqrz");
    assert_int_equal(fin.mtp_drafted, 2);
    assert_int_equal(fin.mtp_accepted, 1);
    moeq_sched_destroy(s);
}

/* Steps of 5 tokens; jobs m1, m2 (mtp_k 3) and plain, prompts of 2; after the first step (m1, m2 and half of
 * plain's prompt) m1 and m2 decode. */
static moeq_sched *two_speculative_and_one_plain(fake_job f[3]) {
    moeq_sched *s = new_sched(4, 5, 0);
    memset(f, 0, 3 * sizeof *f);
    moeq_sched_job_spec jobs[3] = {mtp_spec(&f[0], "m1", 20, 3), mtp_spec(&f[1], "m2", 20, 3),
                                   spec(&f[2], "plain", 2, 20)};
    add(s, NULL, jobs, 3, 0);
    step(s, 1, 'a', NULL);
    return s;
}

static void plain_and_speculative_jobs_share_a_plan_within_the_step_budget(void **state) {
    (void)state;
    fake_job f[3];
    moeq_sched *s = two_speculative_and_one_plain(f);
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 3, &plan), MOEQ_OK);
    /* one step of 5: a token for each of m1 and m2 first; of the 3 left, drafts get half while plain's prompt
     * waits (m1, the oldest, 1 draft) and plain's prefill the rest */
    assert_int_equal(plan.n_rounds, 1);
    assert_ptr_equal(plan.rounds[0].user, &f[0]);
    assert_int_equal(plan.rounds[0].k, 1);
    assert_int_equal(plan.n_items, 2);      /* m2 (the draft budget is spent: 1 plain token), plain's prefill */
    assert_ptr_equal(plan.items[0].user, &f[1]);
    assert_int_equal(plan.items[0].mtp, 1);
    assert_int_equal(plan.items[0].n_tokens, 1);
    assert_ptr_equal(plan.items[1].user, &f[2]);
    assert_int_equal(plan.items[1].mtp, 0);
    assert_int_equal(plan.items[1].n_tokens, 1); /* the last token of its prompt (the step has a token spare) */
    assert_int_equal(plan.n_round_tokens + plan.n_tokens, 4);
    int32_t sampled[2] = {'c', 'd'};
    const int32_t run[] = {'x'};
    moeq_sched_round_out o = {run, 1, 1, 0};
    assert_int_equal(moeq_sched_commit_mtp(s, sampled, &o, 4), MOEQ_OK);
    /* nothing waits now: 3 decoding, the 2 tokens left all go to drafts, oldest first */
    assert_int_equal(moeq_sched_plan(s, 5, &plan), MOEQ_OK);
    assert_int_equal(plan.n_rounds, 1);
    assert_int_equal(plan.rounds[0].k, 2);
    assert_int_equal(plan.n_round_tokens + plan.n_tokens, 5);
    moeq_sched_abort(s, "engine", "test", 5);
    int aborted = 0;
    moeq_sched_finished fin0;
    while (moeq_sched_next_finished(s, &fin0)) aborted++;
    assert_int_equal(aborted, 3);
    moeq_sched_destroy(s);
}

static void a_failed_round_fails_the_jobs_of_the_plan(void **state) {
    (void)state;
    fake_job f[3];
    moeq_sched *s = two_speculative_and_one_plain(f);
    moeq_sched_step plan;
    /* a failed round fails the jobs of the plan with their partial text */
    assert_int_equal(moeq_sched_plan(s, 5, &plan), MOEQ_OK);
    assert_true(plan.n_rounds >= 1);
    moeq_sched_abort(s, "engine", "mtp cache full", 6);
    moeq_sched_finished fin;
    int n = 0;
    while (moeq_sched_next_finished(s, &fin)) {
        assert_int_equal(fin.status, MOEQ_RESULT_ERROR);
        n++;
    }
    assert_int_equal(n, 3);
    moeq_sched_destroy(s);
}

/* ---- shared prompt prefixes ----------------------------------------------------------- */

/* The plan's item of the job whose spec.user is user (there must be one). */
static const moeq_sched_item *item_of(const moeq_sched_step *plan, const void *user) {
    for (int i = 0; i < plan->n_items; i++)
        if (plan->items[i].user == user) return &plan->items[i];
    fail_msg("no item for the job");
    return NULL;
}

/* A fake prefix cache: prompts starting with 1, 2, 3 have their first 8 tokens (two blocks of 4) cached. */
static int fake_prefix(void *ctx, const int32_t *prompt, int n_prompt, int mtp) {
    int *calls = ctx;
    (*calls)++;
    (void)mtp;
    return n_prompt > 8 && prompt[0] == 1 && prompt[1] == 2 && prompt[2] == 3 ? 8 : 0;
}

/*
 * With a prefix-cache lookup installed, a new job's first item starts after what the cache holds
 * (cached_tokens), asked once per job; a running job's fork wins only when it shares more.
 */
static void a_new_job_starts_its_prefill_after_the_tokens_the_prefix_cache_holds(void **state) {
    (void)state;
    static const int32_t eos[] = {TOK_EOS};
    static const int32_t pa[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    static const int32_t pb[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 99}; /* 11 shared with running a */
    static const int32_t pc[6] = {5, 6, 7, 8, 9, 10};                        /* nothing cached */
    moeq_sched_params p = moeq_sched_default_params();
    p.max_seqs = 8, p.max_step_tokens = 64, p.kv_block_tokens = 4, p.stop_ids = eos, p.n_stop_ids = 1;
    p.prefix_share_min = 4;
    moeq_sched *s = NULL;
    char err[256];
    int calls = 0;
    assert_int_equal(moeq_sched_new(&p, fake_detok, NULL, &s, err, sizeof err), MOEQ_OK);
    moeq_sched_set_prefix_lookup(s, fake_prefix, &calls);
    fake_job f[3];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec a = spec(&f[0], "a", 12, 50);
    a.prompt = pa;
    add(s, NULL, &a, 1, 0);
    moeq_sched_step plan;
    assert_int_equal(moeq_sched_plan(s, 1, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 1);
    assert_int_equal(plan.items[0].cached_tokens, 8);
    assert_int_equal(plan.items[0].fork_tokens, 0);
    assert_int_equal(plan.items[0].tokens[0], 9); /* prompt[8] on */
    assert_int_equal(plan.items[0].n_tokens, 4);
    assert_int_equal(plan.n_prefill_tokens, 4);
    int32_t t[2] = {'y', 'y'};
    assert_int_equal(moeq_sched_commit(s, t, 2), MOEQ_OK);
    moeq_sched_job_spec more[2] = {spec(&f[1], "b", 12, 5), spec(&f[2], "c", 6, 5)};
    more[0].prompt = pb, more[1].prompt = pc;
    add(s, NULL, more, 2, 3);
    assert_int_equal(moeq_sched_plan(s, 4, &plan), MOEQ_OK);
    const moeq_sched_item *ib = item_of(&plan, &f[1]), *ic = item_of(&plan, &f[2]);
    assert_int_equal(ib->fork_tokens, 11); /* the running a shares 11 > the cache's 8 */
    assert_int_equal(ib->cached_tokens, 0);
    assert_int_equal(ic->cached_tokens, 0);
    assert_int_equal(ic->n_tokens, 6);
    assert_int_equal(calls, 3); /* once per job */
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.prefix_tokens_cached, 8);
    assert_int_equal(st.prefix_tokens_shared, 11);
    moeq_sched_destroy(s);
}

/* A new job whose prompt starts like a running job's forks that job's sequence for the shared, fed part. */
static void a_new_job_forks_the_running_job_that_holds_its_prompt_prefix(void **state) {
    (void)state;
    static const int32_t eos[] = {TOK_EOS};
    static const int32_t pa[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    static const int32_t pb[11] = {1, 2, 3, 4, 5, 6, 7, 8, 90, 91, 92};   /* 8 shared with pa */
    static const int32_t pc[6] = {1, 2, 3, 4, 5, 6};                        /* all of it shared */
    static const int32_t pd[5] = {1, 2, 3, 70, 71};                         /* 3: below the minimum */
    moeq_sched_params p = moeq_sched_default_params();
    p.max_seqs = 8, p.max_step_tokens = 64, p.kv_block_tokens = 4, p.stop_ids = eos, p.n_stop_ids = 1;
    p.prefix_share_min = 4;
    moeq_sched *s = NULL;
    char err[256];
    assert_int_equal(moeq_sched_new(&p, fake_detok, NULL, &s, err, sizeof err), MOEQ_OK);
    fake_job f[6];
    memset(f, 0, sizeof f);
    moeq_sched_job_spec a = spec(&f[0], "a", 12, 50);
    a.prompt = pa;
    add(s, NULL, &a, 1, 0);
    moeq_sched_step plan;
    assert_int_equal(step(s, 1, 'x', &plan), 1); /* a's prompt, nothing to share yet */
    assert_int_equal(plan.items[0].fork_tokens, 0);
    moeq_sched_job_spec more[3] = {spec(&f[1], "b", 11, 5), spec(&f[2], "c", 6, 5), spec(&f[3], "d", 5, 5)};
    more[0].prompt = pb, more[1].prompt = pc, more[2].prompt = pd;
    add(s, NULL, more, 3, 2);
    assert_int_equal(moeq_sched_plan(s, 3, &plan), MOEQ_OK);
    assert_int_equal(plan.n_items, 4); /* a's decode token, then b, c, d */
    const moeq_sched_item *b = &plan.items[1], *c = &plan.items[2], *d = &plan.items[3];
    assert_int_equal(b->new_seq, 1);
    assert_int_equal(b->fork_slot, plan.items[0].slot);
    assert_int_equal(b->fork_tokens, 8);
    assert_int_equal(b->tokens[0], 90); /* prompt[8] on */
    assert_int_equal(b->n_tokens, 3);
    assert_int_equal(c->fork_tokens, 5); /* never its last prompt token: its logits give the first output */
    assert_int_equal(c->n_tokens, 1);
    assert_int_equal(d->fork_tokens, 0);
    assert_int_equal(d->n_tokens, 5);
    assert_int_equal(plan.n_prefill_tokens, 3 + 1 + 5);
    int32_t t[4] = {'y', 'y', 'y', 'y'};
    assert_int_equal(moeq_sched_commit(s, t, 4), MOEQ_OK);
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    assert_int_equal(st.prefix_tokens_shared, 13);
    assert_int_equal(st.prefill_tokens, 12 + 9);
    /* a speculative job needs a speculative source, and forks one token earlier */
    moeq_sched_job_spec e = spec(&f[4], "e", 11, 5);
    e.prompt = pb, e.mtp_k = 1;
    add(s, NULL, &e, 1, 5);
    assert_int_equal(moeq_sched_plan(s, 6, &plan), MOEQ_OK);
    const moeq_sched_item *ie = item_of(&plan, &f[4]);
    assert_int_equal(ie->fork_tokens, 0); /* a, b, c, d are not speculative */
    int32_t t2[8] = {'z', 'z', 'z', 'z', 'z', 'z', 'z', 'z'};
    assert_int_equal(moeq_sched_commit(s, t2, 7), MOEQ_OK);
    moeq_sched_job_spec g = spec(&f[5], "g", 11, 5);
    g.prompt = pb, g.mtp_k = 1;
    add(s, NULL, &g, 1, 8);
    assert_int_equal(moeq_sched_plan(s, 9, &plan), MOEQ_OK);
    const moeq_sched_item *ig = item_of(&plan, &f[5]);
    assert_int_equal(ig->fork_tokens, 9); /* from e (speculative, all 11 fed): 10 may be shared, minus 1 */
    assert_int_equal(ig->n_tokens, 2);
    p.prefix_share_min = -1;
    moeq_sched *bad = NULL;
    assert_int_equal(moeq_sched_new(&p, fake_detok, NULL, &bad, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    moeq_sched_abort(s, "test", "end", 10);
    moeq_sched_destroy(s);
}

/*
 * The fake engine: each slot keeps a hash of the token history it was fed
 * since its last new_seq; the sampled token is a function of that hash,
 * seeded by the job key. Run many jobs through few slots and compare each
 * with the job run alone: the scheduler must feed each sequence exactly its
 * own tokens, in order, whatever else shares the step.
 */
typedef struct sim_slot {
    uint64_t h;
    int live, mtp;
    int32_t hist[128]; /* what the slot's cache holds, in order */
    int n_hist;
} sim_slot;

static uint64_t key_hash(const char *key) {
    uint64_t h = 14695981039346656037ULL;
    for (; *key; key++) h = (h ^ (unsigned char)*key) * 1099511628211ULL;
    return h;
}

static int32_t sim_feed(sim_slot *sl, int32_t token) {
    sl->h = (sl->h ^ (uint64_t)token) * 1099511628211ULL;
    if (sl->n_hist < 128) sl->hist[sl->n_hist++] = token;
    return (int32_t)('a' + (sl->h >> 33) % 26);
}

/*
 * A speculative round on the fake engine: the main model's continuation
 * after next_token is computed token by token (as plain decoding would give
 * it); a pseudo-random number of the k drafts is "accepted", and the round
 * yields that many plus one. The slot's cache then holds next_token and the
 * accepted drafts, not the last token (it is fed next), as in the engine.
 */
static void sim_round(sim_slot *sl, const moeq_sched_round *r, uint64_t *rng, int32_t *out,
                      moeq_sched_round_out *o) {
    *rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
    int a = (int)((*rng >> 33) % (uint64_t)(r->k + 1));
    int32_t next = sim_feed(sl, r->next_token);
    for (int t = 0; t < a; t++) {
        out[t] = next;
        next = sim_feed(sl, next);
    }
    out[a] = next;
    *o = (moeq_sched_round_out){out, a + 1, r->k, a};
}

static void sim_run(moeq_sched *s, sim_slot *slots, int64_t *now, int max_step_tokens, int64_t *forked) {
    static int32_t round_tokens[64][MOEQ_SCHED_MAX_MTP_K + 1];
    moeq_sched_round_out outs[64];
    uint64_t rng = 7;
    for (int k = 0; k < 100000; k++) {
        moeq_sched_step plan;
        assert_int_equal(moeq_sched_plan(s, (*now)++, &plan), MOEQ_OK);
        for (int r = 0; r < plan.n_released; r++) {
            assert_true(slots[plan.released[r]].live);
            slots[plan.released[r]].live = 0;
        }
        if (plan.n_items == 0 && plan.n_rounds == 0) return;
        assert_true(plan.n_tokens <= max_step_tokens);
        assert_true(plan.n_round_tokens <= max_step_tokens);
        for (int i = 0; i < plan.n_rounds; i++) {
            const moeq_sched_round *r = &plan.rounds[i];
            assert_true(slots[r->slot].live);
            assert_true(r->k >= 1);
            sim_round(&slots[r->slot], r, &rng, round_tokens[i], &outs[i]);
        }
        int32_t sampled[256];
        for (int i = 0; i < plan.n_items; i++) {
            const moeq_sched_item *it = &plan.items[i];
            sim_slot *sl = &slots[it->slot];
            if (it->new_seq) {
                assert_false(sl->live); /* released before reuse */
                sl->h = key_hash(((const fake_job *)it->user)->key);
                sl->live = 1, sl->mtp = it->mtp, sl->n_hist = 0;
                if (it->fork_tokens > 0) { /* the source's cache must hold exactly the prompt's start */
                    const sim_slot *src = &slots[it->fork_slot];
                    const int32_t *prompt = it->tokens - it->fork_tokens;
                    assert_true(src != sl && src->live && src->n_hist >= it->fork_tokens);
                    assert_memory_equal(src->hist, prompt, (size_t)it->fork_tokens * sizeof(int32_t));
                    if (it->mtp) /* ... and the token after the fork point, for the MTP entry there */
                        assert_true(src->mtp && src->n_hist > it->fork_tokens && src->hist[it->fork_tokens] == prompt[it->fork_tokens]);
                    for (int t = 0; t < it->fork_tokens; t++) sim_feed(sl, prompt[t]);
                    forked[0] += it->fork_tokens;
                }
            }
            assert_true(sl->live);
            for (int t = 0; t < it->n_tokens; t++) sampled[i] = sim_feed(sl, it->tokens[t]);
        }
        assert_int_equal(moeq_sched_commit_mtp(s, sampled, outs, *now), MOEQ_OK);
    }
    fail_msg("simulation did not finish");
}

#define SIM_JOBS 60

/*
 * 60 jobs through 4 slots; with_mtp: jobs draft 0..3 tokens per round; share: jobs fork running jobs' prompt
 * prefixes (every prompt here is a start of PROMPT). Each must equal the job alone, plain.
 */
static void sim_compare_with_alone(int with_mtp, int share) {
    static fake_job jobs[SIM_JOBS], alone[SIM_JOBS];
    static char texts[SIM_JOBS][128];
    const char *stops[] = {"qq"};
    moeq_sched_job_spec specs[SIM_JOBS];
    uint64_t rng = 42;
    for (int i = 0; i < SIM_JOBS; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        char key[32];
        snprintf(key, sizeof key, "job-%d", i);
        specs[i] = spec(&jobs[i], key, 1 + (int)((rng >> 33) % 20), 1 + (int)((rng >> 45) % 30));
        specs[i].priority = (int)((rng >> 20) % 4);
        if (i % 3 == 0) {
            specs[i].stop = stops;
            specs[i].n_stop = 1;
        }
    }
    /* each job alone */
    for (int i = 0; i < SIM_JOBS; i++) {
        moeq_sched *s = new_sched(1, 7, 0);
        sim_slot slots[1] = {{0}};
        int64_t now = 0;
        moeq_sched_job_spec one = specs[i];
        snprintf(alone[i].key, sizeof alone[i].key, "%s", jobs[i].key);
        one.key = alone[i].key;
        one.user = &alone[i];
        add(s, NULL, &one, 1, 0);
        int64_t forked = 0;
        sim_run(s, slots, &now, 7, &forked);
        moeq_sched_finished fin;
        assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
        snprintf(texts[i], sizeof texts[i], "%s/%d/%d", fin.text, fin.n_tokens, (int)fin.finish_reason);
        moeq_sched_destroy(s);
    }
    /* all together, in batches of 7, through 4 slots and 16-token steps */
    for (int i = 0; i < SIM_JOBS && with_mtp; i++) specs[i].mtp_k = i % 4;
    moeq_sched_params p = test_params(4, 16, 0);
    p.prefix_share_min = share ? 2 : 0;
    moeq_sched *s = new_sched_with(&p);
    static sim_slot slots[4];
    memset(slots, 0, sizeof slots);
    int64_t now = 0, forked = 0;
    for (int i = 0; i < SIM_JOBS; i += 7) add(s, NULL, &specs[i], SIM_JOBS - i < 7 ? SIM_JOBS - i : 7, now);
    sim_run(s, slots, &now, 16, &forked);
    int seen = 0;
    moeq_sched_finished fin;
    while (moeq_sched_next_finished(s, &fin)) {
        int i = (int)((fake_job *)fin.user - jobs);
        char got[128];
        snprintf(got, sizeof got, "%s/%d/%d", fin.text, fin.n_tokens, (int)fin.finish_reason);
        assert_string_equal(got, texts[i]);
        assert_int_equal(fin.mtp, specs[i].mtp_k > 0);
        assert_true(fin.mtp_accepted <= fin.mtp_drafted);
        assert_int_equal(moeq_sched_delivered(s, fin.job, 1), MOEQ_OK);
        seen++;
    }
    assert_int_equal(seen, SIM_JOBS);
    int batches = 0;
    void *b;
    while (moeq_sched_next_ackable(s, &b)) batches++;
    assert_int_equal(batches, (SIM_JOBS + 6) / 7);
    assert_true(moeq_sched_idle(s));
    moeq_sched_stats st;
    moeq_sched_get_stats(s, &st);
    if (with_mtp) assert_true(st.mtp_rounds > 0 && st.mtp_drafted > st.mtp_accepted && st.mtp_accepted > 0);
    else assert_int_equal(st.mtp_rounds, 0);
    assert_int_equal(st.prefix_tokens_shared, forked);
    if (share) assert_true(forked > 0);
    else assert_int_equal(forked, 0);
    if (share) print_message("prefix sharing: %lld prompt tokens forked\n", (long long)forked);
    moeq_sched_destroy(s);
}

static void every_job_gets_the_tokens_it_would_get_alone(void **state) {
    (void)state;
    sim_compare_with_alone(0, 0);
}

static void speculative_jobs_in_a_mixed_batch_get_the_tokens_they_would_get_alone(void **state) {
    (void)state;
    sim_compare_with_alone(1, 0);
}

static void jobs_that_fork_a_running_jobs_prompt_prefix_get_the_tokens_they_would_get_alone(void **state) {
    (void)state;
    sim_compare_with_alone(0, 1);
    sim_compare_with_alone(1, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_job_prefills_then_decodes_one_token_per_step),
        cmocka_unit_test(a_long_prompt_is_prefilled_in_chunks_of_max_step_tokens),
        cmocka_unit_test(decodes_go_first_and_prefills_fill_the_rest_of_the_step),
        cmocka_unit_test(jobs_of_the_next_batch_take_slots_as_they_free_up),
        cmocka_unit_test(higher_priority_jobs_are_admitted_first),
        cmocka_unit_test(a_stop_id_ends_the_job_and_stays_out_of_the_text),
        cmocka_unit_test(a_stop_string_split_over_tokens_is_found_and_cut),
        cmocka_unit_test(the_earliest_of_several_stop_strings_wins),
        cmocka_unit_test(a_character_split_over_tokens_is_held_until_complete),
        cmocka_unit_test(deadlines_expire_pending_and_running_jobs_with_partial_text),
        cmocka_unit_test(a_cancelled_job_stops_within_one_step_with_its_partial_text),
        cmocka_unit_test(a_batch_is_ackable_only_after_every_result_was_delivered),
        cmocka_unit_test(an_empty_batch_is_ackable_at_once),
        cmocka_unit_test(jobs_that_cannot_run_get_results_without_a_slot),
        cmocka_unit_test(dead_lettered_and_cancelled_jobs_finish_without_running),
        cmocka_unit_test(the_kv_cache_reservation_bounds_admission),
        cmocka_unit_test(with_the_engines_blocks_admission_counts_shared_blocks_once),
        cmocka_unit_test(a_job_admitted_while_nothing_runs_takes_the_pool_alone),
        cmocka_unit_test(an_engine_failure_fails_the_jobs_of_the_step),
        cmocka_unit_test(bad_params_are_rejected_with_the_field_named),
        cmocka_unit_test(a_stop_id_inside_an_accepted_run_ends_the_job_there_and_frees_the_sequence),
        cmocka_unit_test(a_stop_string_completed_inside_an_accepted_run_cuts_the_text_there),
        cmocka_unit_test(rounds_never_draft_past_max_new_tokens),
        cmocka_unit_test(rounds_pause_while_more_sequences_decode_than_mtp_max_seqs),
        cmocka_unit_test(a_job_with_poor_acceptance_pauses_drafting_and_looks_again),
        cmocka_unit_test(mtp_auto_drafts_deep_for_the_accepting_job_and_not_for_the_rejecting_one),
        cmocka_unit_test(mtp_auto_gives_no_drafts_while_a_prompt_fills_the_step),
        cmocka_unit_test(a_new_job_forks_the_running_job_that_holds_its_prompt_prefix),
        cmocka_unit_test(a_new_job_starts_its_prefill_after_the_tokens_the_prefix_cache_holds),
        cmocka_unit_test(jobs_that_fork_a_running_jobs_prompt_prefix_get_the_tokens_they_would_get_alone),
        cmocka_unit_test(plain_and_speculative_jobs_share_a_plan_within_the_step_budget),
        cmocka_unit_test(a_failed_round_fails_the_jobs_of_the_plan),
        cmocka_unit_test(every_job_gets_the_tokens_it_would_get_alone),
        cmocka_unit_test(speculative_jobs_in_a_mixed_batch_get_the_tokens_they_would_get_alone),
        cmocka_unit_test(nan_crashes_the_engine_no_more_only_the_poisoned_job_ends_with_numerical_error),
        cmocka_unit_test(no_context_length_check_a_job_past_max_model_len_gets_prompt_too_long),
        cmocka_unit_test(result_text_is_cut_at_the_first_nul_byte_no_more_in_the_scheduler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
