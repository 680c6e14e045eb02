/*
 * test_decode_proc.c — the decoding controls of issue 17 below the corpus test: penalties against a
 * reference implementation written here (vLLM's repetition penalty, OpenAI's presence/frequency), min_tokens
 * and stop ids masked until allowed, end-of-sequence allowed only where the grammar is complete, logprobs
 * equal to a float64 log-softmax, and the scheduler's ends: a job's stop_token_ids (finish_reason stop_token)
 * and a completed grammar (finish_reason stop); the logprobs a device's logits record gives
 * (moeq_logits_record_logprobs) equal the processor's from the whole row wherever the record decides.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/logits_reduce.h"
#include "decode_proc.h"
#include "moeq/engine.h"
#include "scheduler.h"

#define V 64
#define EOS 63

static void random_row(float *row, unsigned seed) {
    for (int i = 0; i < V; i++) {
        seed = seed * 1103515245u + 12345u;
        row[i] = (float)((int)(seed >> 16 & 0x7fff) - 16384) / 2048.0f; /* [-8, 8), both signs */
    }
}

static moeq_decode_proc *make(const moeq_decode_proc_params *p) {
    moeq_decode_proc *d = NULL;
    char err[256] = "";
    assert_int_equal(moeq_decode_proc_new(p, V, &d, err, sizeof err), MOEQ_OK);
    return d;
}

/* process (into work) and accept token t, as the sampler does around a draw. */
static void draw(moeq_decode_proc *d, const float *raw, float *work, int32_t t) {
    moeq_sampler_hook h = moeq_decode_proc_hook(d);
    memcpy(work, raw, sizeof(float) * V);
    h.process(h.ctx, raw, work, V);
    h.accept(h.ctx, raw, t);
}

static void penalties_match_a_reference_implementation(void **state) {
    (void)state;
    const int32_t prompt[] = {3, 4, 4, 9};
    const int32_t out[] = {5, 9, 5, 5, 12, 3, 40};
    moeq_decode_proc_params p = {.max_new_tokens = 32, .repetition_penalty = 1.3, .presence_penalty = 0.4,
                                 .frequency_penalty = 0.7, .prompt = prompt, .n_prompt = 4};
    moeq_decode_proc *d = make(&p);
    float raw[V], work[V];
    for (int step = 0; step <= 7; step++) {
        random_row(raw, 77u + (unsigned)step);
        moeq_sampler_hook h = moeq_decode_proc_hook(d);
        memcpy(work, raw, sizeof work);
        h.process(h.ctx, raw, work, V);
        for (int t = 0; t < V; t++) { /* the reference: vLLM apply_penalties, in double */
            int count = 0, seen = 0;
            for (int i = 0; i < step; i++) count += out[i] == t;
            for (int i = 0; i < 4; i++) seen |= prompt[i] == t;
            seen |= count > 0;
            double x = raw[t];
            if (seen) x = x > 0 ? x / 1.3 : x * 1.3;
            x -= 0.7 * count + (count > 0 ? 0.4 : 0.0);
            if (fabs(x - work[t]) > 1e-5 * (1 + fabs(x))) print_error("step %d token %d: %g vs %g\n", step, t, work[t], x);
            assert_true(fabs(x - work[t]) <= 1e-5 * (1 + fabs(x)));
        }
        if (step < 7) h.accept(h.ctx, raw, out[step]);
    }
    moeq_decode_proc_destroy(d);
}

static void min_tokens_masks_end_of_sequence_and_stop_ids_until_reached(void **state) {
    (void)state;
    const int32_t eos = EOS, stops[] = {7, 8};
    moeq_decode_proc_params p = {.eos_ids = &eos, .n_eos = 1, .stop_token_ids = stops, .n_stop_token_ids = 2,
                                 .max_new_tokens = 10, .min_tokens = 3};
    moeq_decode_proc *d = make(&p);
    float raw[V], work[V];
    random_row(raw, 5);
    for (int step = 0; step < 5; step++) {
        draw(d, raw, work, 1);
        int masked = step < 3;
        assert_int_equal(work[EOS] == -INFINITY, masked);
        assert_int_equal(work[7] == -INFINITY, masked);
        assert_int_equal(work[8] == -INFINITY, masked);
        assert_true(work[1] == raw[1] && work[9] == raw[9]); /* nothing else changes */
    }
    moeq_decode_proc_destroy(d);
}

/* ids 0..255 are bytes; grammar vocab of V ids: 'a' 'b' 'c' as ids 10, 11, 12, the rest unusable. */
static int tiny_bytes(void *ctx, int32_t id, const char **bytes, size_t *len) {
    static const char abc[] = "abc";
    (void)ctx;
    if (id < 10 || id > 12) return -1;
    *bytes = abc + (id - 10);
    *len = 1;
    return 0;
}

static void end_of_sequence_is_allowed_only_where_the_grammar_is_complete(void **state) {
    (void)state;
    moeq_grammar_vocab *v = NULL;
    moeq_grammar *g = NULL;
    assert_int_equal(moeq_grammar_vocab_new(V, tiny_bytes, NULL, &v, NULL, 0), MOEQ_OK);
    moeq_grammar_spec spec = {MOEQ_GRAMMAR_REGEX, "ab|abc", 6, NULL, 0};
    assert_int_equal(moeq_grammar_compile(&spec, v, NULL, &g, NULL, 0), MOEQ_OK);
    const int32_t eos = EOS;
    moeq_decode_proc_params p = {.grammar = g, .eos_ids = &eos, .n_eos = 1, .max_new_tokens = 8, .logprobs = 1,
                                 .top_logprobs = 3};
    moeq_decode_proc *d = make(&p);
    moeq_grammar_release(g); /* the processor holds its own reference */
    float raw[V], work[V];
    random_row(raw, 9);
    draw(d, raw, work, 10); /* at the start only a */
    for (int t = 0; t < V; t++) assert_int_equal(work[t] != -INFINITY, t == 10);
    draw(d, raw, work, 11); /* after "a" only b */
    for (int t = 0; t < V; t++) assert_int_equal(work[t] != -INFINITY, t == 11);
    assert_int_equal(moeq_decode_proc_complete_at(d), 0); /* "ab" may go on with c */
    draw(d, raw, work, 12);                                /* after "ab": c or the end */
    for (int t = 0; t < V; t++) assert_int_equal(work[t] != -INFINITY, t == 12 || t == EOS);
    assert_int_equal(moeq_decode_proc_complete_at(d), 3); /* "abc": nothing may follow */
    /* logprobs: the model's log-softmax in float64, top ids best first */
    for (int i = 0; i < 3; i++) {
        moeq_logprob lp;
        assert_int_equal(moeq_decode_proc_logprob(d, i, &lp), 0);
        double mx = raw[0], s = 0;
        for (int t = 1; t < V; t++) mx = raw[t] > mx ? raw[t] : mx;
        for (int t = 0; t < V; t++) s += exp((double)raw[t] - mx);
        double lse = mx + log(s);
        assert_true(fabs(lp.logprob - (raw[lp.token] - lse)) < 1e-5);
        assert_int_equal(lp.n_top, 3);
        for (int k = 0; k < 3; k++) {
            assert_true(fabs(lp.top_logprobs[k] - (raw[lp.top_tokens[k]] - lse)) < 1e-5);
            if (k) assert_true(raw[lp.top_tokens[k - 1]] >= raw[lp.top_tokens[k]]);
            int better = 0;
            for (int t = 0; t < V; t++) better += raw[t] > raw[lp.top_tokens[k]];
            assert_int_equal(better, k);
        }
    }
    moeq_decode_proc_destroy(d);
    moeq_grammar_vocab_destroy(v);
}

static void a_grammar_that_outgrows_its_limits_is_reported_not_left_unconstrained(void **state) {
    (void)state;
    moeq_grammar_vocab *v = NULL;
    moeq_grammar *g = NULL;
    assert_int_equal(moeq_grammar_vocab_new(V, tiny_bytes, NULL, &v, NULL, 0), MOEQ_OK);
    moeq_grammar_limits lim = moeq_grammar_default_limits();
    lim.max_dfa_states = 3;
    moeq_grammar_spec spec = {MOEQ_GRAMMAR_REGEX, "abcabcabc", 9, NULL, 0};
    assert_int_equal(moeq_grammar_compile(&spec, v, &lim, &g, NULL, 0), MOEQ_OK);
    const int32_t eos = EOS;
    moeq_decode_proc_params p = {.grammar = g, .eos_ids = &eos, .n_eos = 1, .max_new_tokens = 9};
    moeq_decode_proc *d = make(&p);
    moeq_grammar_release(g);
    float raw[V], work[V];
    random_row(raw, 3);
    static const int32_t walk[] = {10, 11, 12, 10, 11, 12};
    int failed_at = -1;
    for (int i = 0; i < 6 && failed_at < 0; i++) {
        draw(d, raw, work, walk[i]);
        if (moeq_decode_proc_error(d)) failed_at = i;
    }
    assert_true(failed_at >= 0);
    assert_int_equal(moeq_decode_proc_error(d), MOEQ_ERR_LIMIT);
    int finite = 0;
    for (int t = 0; t < V; t++) finite += work[t] != -INFINITY;
    assert_int_equal(finite, 1); /* something to draw, nothing it means: the worker ends the job */
    moeq_decode_proc_destroy(d);
    moeq_grammar_vocab_destroy(v);
}

/* ---- the scheduler's ends ---------------------------------------------------------------------------- */

static size_t bytes_detok(void *ctx, void *user, int32_t token, const char **bytes) {
    static char b[2];
    (void)ctx, (void)user;
    if (token < 0) return 0;
    b[0] = (char)token;
    *bytes = b;
    return 1;
}

/* One job through the scheduler, committing tokens[i] at step i; note_complete_at > 0 is noted before the
 * commit of that token. Returns the finished record. */
static moeq_sched_finished run_job(moeq_sched **sp, const int32_t *tokens, int n, const int32_t *stop_ids,
                                   size_t n_stop_ids, int note_complete_at) {
    const int32_t eos = 1000;
    moeq_sched_params p = moeq_sched_default_params();
    p.max_seqs = 1, p.max_step_tokens = 8, p.stop_ids = &eos, p.n_stop_ids = 1;
    assert_int_equal(moeq_sched_new(&p, bytes_detok, NULL, sp, NULL, 0), MOEQ_OK);
    const int32_t prompt[] = {1, 2};
    moeq_sched_job_spec spec = {.key = "j", .prompt = prompt, .n_prompt = 2, .max_new_tokens = 10,
                                .stop_token_ids = stop_ids, .n_stop_token_ids = n_stop_ids};
    assert_int_equal(moeq_sched_add_batch(*sp, NULL, &spec, 1, 0, NULL, 0), MOEQ_OK);
    moeq_sched_finished fin;
    for (int i = 0; i < n; i++) {
        moeq_sched_step plan;
        assert_int_equal(moeq_sched_plan(*sp, i, &plan), MOEQ_OK);
        if (plan.n_items == 0) break;
        if (note_complete_at == i + 1) moeq_sched_note_complete(*sp, plan.items[0].job, note_complete_at);
        assert_int_equal(moeq_sched_commit(*sp, &tokens[i], i), MOEQ_OK);
        if (moeq_sched_next_finished(*sp, &fin)) return fin;
    }
    fail_msg("the job did not finish");
    return fin;
}

static void a_noted_error_ends_the_job_before_the_token_with_the_code(void **state) {
    (void)state;
    const int32_t eos = 1000;
    moeq_sched *s = NULL;
    moeq_sched_params p = moeq_sched_default_params();
    p.max_seqs = 1, p.max_step_tokens = 8, p.stop_ids = &eos, p.n_stop_ids = 1;
    assert_int_equal(moeq_sched_new(&p, bytes_detok, NULL, &s, NULL, 0), MOEQ_OK);
    const int32_t prompt[] = {1, 2}, toks[] = {'a', 'b'};
    moeq_sched_job_spec spec = {.key = "j", .prompt = prompt, .n_prompt = 2, .max_new_tokens = 10};
    assert_int_equal(moeq_sched_add_batch(s, NULL, &spec, 1, 0, NULL, 0), MOEQ_OK);
    moeq_sched_step plan;
    moeq_sched_finished fin;
    assert_int_equal(moeq_sched_plan(s, 0, &plan), MOEQ_OK);
    assert_int_equal(moeq_sched_commit(s, &toks[0], 0), MOEQ_OK);
    assert_int_equal(moeq_sched_plan(s, 1, &plan), MOEQ_OK);
    moeq_sched_note_error(s, plan.items[0].job, MOEQ_CODE_GRAMMAR_TOO_LARGE, "the grammar outgrew max_dfa_states");
    assert_int_equal(moeq_sched_commit(s, &toks[1], 1), MOEQ_OK);
    assert_int_equal(moeq_sched_next_finished(s, &fin), 1);
    assert_int_equal(fin.status, MOEQ_RESULT_ERROR);
    assert_string_equal(fin.error_code, MOEQ_CODE_GRAMMAR_TOO_LARGE);
    assert_int_equal(fin.n_tokens, 1);
    assert_string_equal(fin.text, "a");
    moeq_sched_destroy(s);
}

static void a_jobs_stop_token_ids_end_it_with_finish_reason_stop_token(void **state) {
    (void)state;
    moeq_sched *s;
    const int32_t stops[] = {77, 88};
    const int32_t toks[] = {'a', 'b', 88, 'c'};
    moeq_sched_finished fin = run_job(&s, toks, 4, stops, 2, 0);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_STOP_TOKEN);
    assert_int_equal(fin.n_tokens, 3); /* the stop id is in tokens */
    assert_string_equal(fin.text, "ab"); /* not in the text */
    moeq_sched_destroy(s);
}

static void a_completed_grammar_ends_the_job_with_finish_reason_stop(void **state) {
    (void)state;
    moeq_sched *s;
    const int32_t toks[] = {'{', '}', 'x', 'y'};
    moeq_sched_finished fin = run_job(&s, toks, 4, NULL, 0, 2);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_STOP);
    assert_int_equal(fin.n_tokens, 2);
    assert_string_equal(fin.text, "{}");
    moeq_sched_destroy(s);
    const int32_t with_eos[] = {'{', '}', 1000}; /* complete, then the model ended it: stop as well */
    fin = run_job(&s, with_eos, 3, NULL, 0, 3);
    assert_int_equal(fin.finish_reason, MOEQ_FINISH_STOP);
    assert_string_equal(fin.text, "{}");
    moeq_sched_destroy(s);
}

/* Rows of nv values, the processor's logprobs of a token and its top alternatives from the row, and the same from
 * the row's record (the CPU op; sum_1 moved by scale within its bound as another device's order would). */
static void record_logprobs_case(int nv, int kind, int top, double scale, int *decided, int *cases) {
    float *raw = malloc(sizeof(float) * (size_t)nv);
    unsigned seed = (unsigned)(nv * 31 + kind);
    for (int i = 0; i < nv; i++) {
        seed = seed * 1103515245u + 12345u;
        float u = (float)((int)(seed >> 16 & 0x7fff) - 16384) / 2048.0f;
        raw[i] = kind == 0 ? u : kind == 1 ? u * 0.25f + (i % 211 == 7 ? 9.0f : 0.0f) : (float)((int)u / 2);
    }
    moeq_logits_record rec;
    moeq_cpu_logits_reduce_row(raw, nv, 0.0, MOEQ_LOGITS_TOP, &rec);
    rec.sum_1 *= scale;
    for (int pick = 0; pick < 3; pick++) { /* the best token, the 10th, one outside the record */
        int32_t t = pick == 0 ? rec.top_id[0] : pick == 1 ? rec.top_id[9] : -1;
        if (pick == 2)
            for (int32_t i = 0; i < nv && t < 0; i++) {
                int in = 0;
                for (int j = 0; j < rec.n_top; j++) in |= rec.top_id[j] == i;
                if (!in) t = i;
            }
        moeq_decode_proc_params p = {.max_new_tokens = 4, .logprobs = 1, .top_logprobs = top};
        moeq_decode_proc *d = NULL;
        char err[256] = "";
        assert_int_equal(moeq_decode_proc_new(&p, nv, &d, err, sizeof err), MOEQ_OK);
        moeq_sampler_hook h = moeq_decode_proc_hook(d);
        h.accept(h.ctx, raw, t);
        moeq_logprob want;
        assert_int_equal(moeq_decode_proc_logprob(d, 0, &want), 0);
        float lp, vals[20];
        int32_t ids[20];
        int rc = moeq_logits_record_logprobs(&rec, nv, t, top, &lp, ids, vals);
        (*cases)++;
        if (pick == 2) assert_int_equal(rc, MOEQ_SAMPLE_INSUFFICIENT); /* its value is not in the record */
        if (rc == 0) {
            (*decided)++;
            assert_memory_equal(&lp, &want.logprob, sizeof lp);
            assert_memory_equal(ids, want.top_tokens, (size_t)top * sizeof(int32_t));
            assert_memory_equal(vals, want.top_logprobs, (size_t)top * sizeof(float));
        }
        moeq_decode_proc_destroy(d);
    }
    free(raw);
}

static void logprobs_from_a_logits_record_equal_the_processors_from_the_row(void **state) {
    (void)state;
    int decided = 0, cases = 0;
    static const int nvs[] = {65, 1000, 5003, 129280};
    for (int vi = 0; vi < 4; vi++)
        for (int kind = 0; kind < 3; kind++)
            for (int top = 0; top <= 20; top += 5)
                for (int side = -1; side <= 1; side++) {
                    double scale = 1.0 + side * 0.999 * 0x1p-49; /* inside moeq_logits_sum1_bound */
                    record_logprobs_case(nvs[vi], kind, top, scale, &decided, &cases);
                }
    /* two of three picks are in the record; nearly all of those are decided (a value on a float boundary
     * within the bound is not) */
    assert_true(decided >= cases * 2 / 3 * 9 / 10);
    print_message("logprobs from records: %d of %d decided, every one the row's\n", decided, cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(penalties_match_a_reference_implementation),
        cmocka_unit_test(min_tokens_masks_end_of_sequence_and_stop_ids_until_reached),
        cmocka_unit_test(end_of_sequence_is_allowed_only_where_the_grammar_is_complete),
        cmocka_unit_test(a_grammar_that_outgrows_its_limits_is_reported_not_left_unconstrained),
        cmocka_unit_test(a_noted_error_ends_the_job_before_the_token_with_the_code),
        cmocka_unit_test(a_jobs_stop_token_ids_end_it_with_finish_reason_stop_token),
        cmocka_unit_test(a_completed_grammar_ends_the_job_with_finish_reason_stop),
        cmocka_unit_test(logprobs_from_a_logits_record_equal_the_processors_from_the_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
