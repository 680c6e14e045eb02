/*
 * test_engine_model.c — the forward pass on tiny checkpoints written by the
 * built `moeq gen-model` ($MOEQ_BUILD_DIR/cli/moeq) into a temporary
 * directory: absorbed vs naive MLA, batch invariance, prefill == decode,
 * cache rollback, MoE gather vs a per-token loop, bf16 and f8 checkpoints,
 * generation and step limits.
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
#include <unistd.h>

#include "forward.h"
#include "moe_layer.h"
#include "cpu/cpu_tuning.h"
#include "cpu/moe_route.h"
#include "moeq/engine.h"
#include "moeq/ep_plan.h"
#include "engine_test_util.h"

static char g_dir[256];
static moeq_model *g_tiny, *g_tiny_f8, *g_tiny_v2;

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/moeq-test-engine-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    g_tiny = moeq_test_gen_and_load(g_dir, "tiny", "bf16", "tiny");
    g_tiny_f8 = moeq_test_gen_and_load(g_dir, "tiny", "f8", "tiny-f8");
    g_tiny_v2 = moeq_test_gen_and_load(g_dir, "tiny-v2", "bf16", "tiny-v2");
    return g_tiny && g_tiny_f8 && g_tiny_v2 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    moeq_model_destroy(g_tiny);
    moeq_model_destroy(g_tiny_f8);
    moeq_model_destroy(g_tiny_v2);
    return moeq_test_remove_dir(g_dir);
}

static moeq_engine *engine_for(const moeq_model *m, int n_threads, int max_step_tokens) {
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = n_threads;
    p.max_seqs = 16;
    p.max_step_tokens = max_step_tokens;
    p.kv_cache_tokens = 1024;
    p.kv_block_tokens = 4; /* small blocks: sequences cross many */
    moeq_engine *e = NULL;
    char err[256] = "";
    moeq_err rc = moeq_engine_new(m, &p, &e, err, sizeof(err));
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, MOEQ_OK);
    return e;
}

/* Prefill `n` tokens of seq in one step, all logits into out (n, vocab). */
static void run_all(moeq_engine *e, int seq, const int32_t *ids, int n, float *out, int vocab) {
    moeq_step_item it = {seq, ids, n, 1};
    char err[256] = "";
    moeq_err rc = moeq_engine_step(e, &it, 1, out, (size_t)n, err, sizeof(err));
    if (rc) fprintf(stderr, "step: %s\n", err);
    assert_int_equal(rc, MOEQ_OK);
    (void)vocab;
}

/*
 * cpu_matrix: an unknown name is refused naming the choices; "amx" where the CPU has none is refused
 * naming why; where it has AMX, the tile path and the float32 lanes give logits within the reference
 * tolerance of each other (1e-4 of the largest) on BF16 and F8, each path its own bits.
 */
static void cpu_matrix_is_checked_and_both_paths_agree_within_tolerance(void **state) {
    (void)state;
    moeq_engine_params p = moeq_engine_default_params();
    p.kv_cache_tokens = 256, p.max_seqs = 2, p.max_step_tokens = 64;
    moeq_engine *e = NULL;
    char err[256] = "";
    snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "tiles");
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "auto, lanes and amx"));
    snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "auto");
    snprintf(p.cuda_matrix, sizeof p.cuda_matrix, "tiles"); /* the CUDA backend's key is checked on every backend */
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "cuda_matrix \"tiles\": the choices are auto and lanes"));
    snprintf(p.cuda_matrix, sizeof p.cuda_matrix, "auto");
    snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "amx");
    if (!moeq_engine_cpu_amx()) {
        assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_ERR_UNSUPPORTED);
        assert_non_null(strstr(err, moeq_engine_cpu_amx_describe()));
        print_message("SKIP the AMX comparison (no AMX on this CPU): %s\n", moeq_engine_cpu_amx_describe());
        return;
    }
    const moeq_model *models[2] = {g_tiny, g_tiny_f8};
    for (int m = 0; m < 2; m++) {
        int vocab = moeq_test_vocab(models[m]), n = 24;
        int32_t ids[24];
        moeq_test_prompt(ids, n, 7, vocab);
        float *l[2];
        for (int path = 0; path < 2; path++) {
            snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "%s", path ? "lanes" : "amx");
            assert_int_equal(moeq_engine_new(models[m], &p, &e, err, sizeof err), MOEQ_OK);
            assert_non_null(strstr(moeq_engine_backend_info(e), path ? "float32 lanes" : "amx_bf16 tiles"));
            int seq = -1;
            assert_int_equal(moeq_engine_seq_new(e, &seq), MOEQ_OK);
            l[path] = malloc((size_t)n * vocab * sizeof(float));
            run_all(e, seq, ids, n, l[path], vocab);
            moeq_engine_destroy(e);
        }
        float big = 0, diff = 0;
        for (size_t i = 0; i < (size_t)n * vocab; i++) {
            if (fabsf(l[1][i]) > big) big = fabsf(l[1][i]);
            if (fabsf(l[0][i] - l[1][i]) > diff) diff = fabsf(l[0][i] - l[1][i]);
        }
        print_message("%s: amx vs lanes, largest logit difference %.3g of %.3g\n", m ? "f8" : "bf16", diff, big);
        assert_true(diff <= 1e-4f * big);
        assert_true(diff > 0); /* two paths, two orders */
        free(l[0]), free(l[1]);
    }
}

static void absorbed_and_naive_mla_agree(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_tiny, g_tiny_v2};
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = models[mi];
        int n = 40, vocab = moeq_test_vocab(m), a, b;
        int32_t ids[40];
        moeq_test_prompt(ids, n, 1, vocab);
        float *la = malloc((size_t)n * vocab * 4), *lb = malloc((size_t)n * vocab * 4);
        moeq_engine *e = engine_for(m, 2, 64);
        assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
        run_all(e, a, ids, n, la, vocab);
        moeq_engine_set_naive_attention(e, 1);
        assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
        run_all(e, b, ids, n, lb, vocab);
        float maxabs = 0, maxdiff = 0;
        for (int i = 0; i < n * vocab; i++) {
            maxabs = fmaxf(maxabs, fabsf(la[i]));
            maxdiff = fmaxf(maxdiff, fabsf(la[i] - lb[i]));
        }
        assert_true(maxdiff <= 1e-4f * fmaxf(1, maxabs));
        moeq_engine_destroy(e);
        free(la), free(lb);
    }
}

static void prefill_equals_token_by_token_decode_bit_for_bit(void **state) {
    (void)state;
    int n = 30, vocab = moeq_test_vocab(g_tiny), a, b, c;
    int32_t ids[30];
    moeq_test_prompt(ids, n, 2, vocab);
    float *pre = malloc((size_t)n * vocab * 4), *dec = malloc((size_t)n * vocab * 4), *chk = malloc((size_t)n * vocab * 4);
    moeq_engine *e = engine_for(g_tiny, 2, 64);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    run_all(e, a, ids, n, pre, vocab);
    assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
    for (int i = 0; i < n; i++) run_all(e, b, ids + i, 1, dec + (size_t)i * vocab, vocab);
    assert_memory_equal(pre, dec, (size_t)n * vocab * 4);
    assert_int_equal(moeq_engine_seq_new(e, &c), MOEQ_OK); /* chunks of 7 */
    for (int i = 0; i < n; i += 7) run_all(e, c, ids + i, n - i < 7 ? n - i : 7, chk + (size_t)i * vocab, vocab);
    assert_memory_equal(pre, chk, (size_t)n * vocab * 4);
    moeq_engine_destroy(e);
    free(pre), free(dec), free(chk);
}

/*
 * Sequence A (prefill 9, then 4 decode steps) alone, then inside steps with
 * 0..9 other sequences whose items are prefill chunks of various lengths or
 * decode tokens; A's logits must be bit-identical every time.
 */
static void logits_are_bit_identical_alone_and_in_mixed_batches(void **state) {
    (void)state;
    int vocab = moeq_test_vocab(g_tiny), na = 9, steps = 4;
    int32_t a_ids[13];
    moeq_test_prompt(a_ids, na + steps, 3, vocab);
    size_t row = (size_t)vocab;
    float *ref = malloc((1 + steps) * row * 4 * na), *got = malloc(64 * row * 4);
    moeq_engine *e = engine_for(g_tiny, 2, 128);
    int a;
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    run_all(e, a, a_ids, na, ref, vocab); /* na rows */
    for (int s = 0; s < steps; s++) run_all(e, a, a_ids + na + s, 1, ref + (na + s) * row, vocab);
    moeq_engine_seq_free(e, a);
    for (int others = 0; others <= 9; others++) {
        int seqs[10];
        int32_t other_ids[10][64];
        assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
        for (int o = 0; o < others; o++) {
            assert_int_equal(moeq_engine_seq_new(e, &seqs[o]), MOEQ_OK);
            moeq_test_prompt(other_ids[o], 64, 10 + o, vocab);
            if (o % 2) run_all(e, seqs[o], other_ids[o], 3 + o, got, vocab); /* odd ones are already decoding */
        }
        for (int s = 0; s <= steps; s++) {
            moeq_step_item items[11];
            int n = 0, a_row = 0, rows = 0;
            for (int o = 0; o < others; o++) { /* others first half, A in the middle, others after */
                if (o == others / 2) {
                    a_row = rows;
                    items[n++] = (moeq_step_item){a, s == 0 ? a_ids : a_ids + na + s - 1, s == 0 ? na : 1, 1};
                    rows += s == 0 ? na : 1;
                }
                int len = (o % 2) ? 1 : 2 + (o + s) % 5, pos = moeq_engine_seq_len(e, seqs[o]);
                items[n++] = (moeq_step_item){seqs[o], other_ids[o] + pos, len, o % 3 == 0};
                rows += o % 3 == 0 ? len : 1;
            }
            if (others == 0) {
                items[n++] = (moeq_step_item){a, s == 0 ? a_ids : a_ids + na + s - 1, s == 0 ? na : 1, 1};
                rows += s == 0 ? na : 1;
            }
            char err[256] = "";
            assert_int_equal(moeq_engine_step(e, items, n, got, 64, err, sizeof(err)), MOEQ_OK);
            if (s == 0) assert_memory_equal(got + a_row * row, ref, na * row * 4);
            else assert_memory_equal(got + a_row * row, ref + (na + s - 1) * row, row * 4);
        }
        moeq_engine_seq_free(e, a);
        for (int o = 0; o < others; o++) moeq_engine_seq_free(e, seqs[o]);
    }
    moeq_engine_destroy(e);
    free(ref), free(got);
}

static void truncate_then_reappend_gives_identical_logits(void **state) {
    (void)state;
    int vocab = moeq_test_vocab(g_tiny), n = 20, a;
    int32_t ids[20], junk[5] = {7, 8, 9, 10, 11};
    moeq_test_prompt(ids, n, 4, vocab);
    float *first = malloc((size_t)n * vocab * 4), *again = malloc((size_t)n * vocab * 4);
    moeq_engine *e = engine_for(g_tiny, 2, 64);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    run_all(e, a, ids, n, first, vocab);
    run_all(e, a, junk, 5, again, vocab); /* rejected draft tokens */
    assert_int_equal(moeq_engine_seq_len(e, a), 25);
    assert_int_equal(moeq_engine_seq_truncate(e, a, 13), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_len(e, a), 13);
    run_all(e, a, ids + 13, n - 13, again, vocab);
    assert_memory_equal(again, first + (size_t)13 * vocab, (size_t)(n - 13) * vocab * 4);
    moeq_engine_destroy(e);
    free(first), free(again);
}

/* Per-token loop in double with widened weights: route, each chosen expert's SwiGLU, weighted sum, + shared. */
static void mlp_ref(const moeq_expert *x, const float *h, int D, double w, double *acc) {
    int I = (int)moeq_tensor_rows(x->gate_proj);
    float *g = malloc((size_t)I * D * 4), *u = malloc((size_t)I * D * 4), *d = malloc((size_t)D * I * 4);
    moeq_tensor_rows_to_f32(x->gate_proj, 0, I, g);
    moeq_tensor_rows_to_f32(x->up_proj, 0, I, u);
    moeq_tensor_rows_to_f32(x->down_proj, 0, D, d);
    double *act = malloc((size_t)I * sizeof(double));
    for (int i = 0; i < I; i++) {
        double sg = 0, su = 0;
        for (int k = 0; k < D; k++) sg += (double)g[(size_t)i * D + k] * h[k], su += (double)u[(size_t)i * D + k] * h[k];
        act[i] = sg / (1 + exp(-sg)) * su;
    }
    for (int o = 0; o < D; o++) {
        double s = 0;
        for (int i = 0; i < I; i++) s += (double)d[(size_t)o * I + i] * act[i];
        acc[o] += w * s;
    }
    free(g), free(u), free(d), free(act);
}

static void moe_gather_scatter_equals_a_per_token_loop(void **state) {
    (void)state;
    moeq_engine *e = engine_for(g_tiny, 2, 64);
    const moeq_model_config *c = moeq_model_get_config(g_tiny);
    int layer = c->first_k_dense_replace, D = c->hidden_size, T = 23, E = c->n_routed_experts, K = c->num_experts_per_tok;
    const moeq_layer *L = &g_tiny->layers[layer];
    assert_true(L->is_moe);
    for (int i = 0; i < T * D; i++) e->s.h[i] = sinf((float)i * 0.37f) * 2.0f;
    moeq_forward_moe(e, layer, T);
    float *gate = malloc((size_t)E * D * 4), logits[64], w[16], scratch[256];
    int32_t ids[16];
    moeq_tensor_rows_to_f32(L->gate, 0, E, gate);
    double *acc = malloc((size_t)D * sizeof(double));
    for (int t = 0; t < T; t++) {
        const float *h = e->s.h + (size_t)t * D;
        for (int x = 0; x < E; x++) {
            double s = 0;
            for (int k = 0; k < D; k++) s += (double)gate[(size_t)x * D + k] * h[k];
            logits[x] = (float)s;
        }
        moeq_moe_route(&e->router, logits, e->vecs[layer].bias, ids, w, scratch);
        for (int o = 0; o < D; o++) acc[o] = 0;
        for (int k = 0; k < K; k++) mlp_ref(&L->experts[ids[k]], h, D, w[k], acc);
        if (L->shared.gate_proj) mlp_ref(&L->shared, h, D, 1.0, acc);
        for (int o = 0; o < D; o++) assert_true(fabs(e->s.tmp[(size_t)t * D + o] - acc[o]) <= 1e-4 * (1 + fabs(acc[o])));
    }
    free(gate), free(acc);
    moeq_engine_destroy(e);
}

static void bf16_and_f8_checkpoints_both_run(void **state) {
    (void)state;
    int vocab = moeq_test_vocab(g_tiny), n = 16, a;
    int32_t ids[16];
    moeq_test_prompt(ids, n, 5, vocab);
    float *lb = malloc((size_t)n * vocab * 4), *l8 = malloc((size_t)n * vocab * 4);
    moeq_engine *e = engine_for(g_tiny, 2, 64), *e8 = engine_for(g_tiny_f8, 2, 64);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    run_all(e, a, ids, n, lb, vocab);
    assert_int_equal(moeq_engine_seq_new(e8, &a), MOEQ_OK);
    run_all(e8, a, ids, n, l8, vocab);
    int same_argmax = 0;
    for (int t = 0; t < n; t++) {
        int bb = 0, b8 = 0;
        for (int i = 0; i < vocab; i++) {
            assert_true(isfinite(lb[t * vocab + i]) && isfinite(l8[t * vocab + i]));
            bb = lb[t * vocab + i] > lb[t * vocab + bb] ? i : bb;
            b8 = l8[t * vocab + i] > l8[t * vocab + b8] ? i : b8;
        }
        same_argmax += bb == b8;
    }
    print_message("bf16 vs f8 argmax agreement: %d/%d\n", same_argmax, n);
    moeq_engine_destroy(e);
    moeq_engine_destroy(e8);
    free(lb), free(l8);
}

static void greedy_generation_follows_argmax_and_stops(void **state) {
    (void)state;
    int vocab = moeq_test_vocab(g_tiny), a;
    int32_t ids[8];
    moeq_test_prompt(ids, 8, 6, vocab);
    moeq_engine *e = engine_for(g_tiny, 2, 64);
    moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = 6};
    int32_t *out = NULL;
    int n_out = 0;
    assert_int_equal(moeq_generate(e, ids, 8, &gp, &out, &n_out, NULL, 0), MOEQ_OK);
    assert_int_equal(n_out, 6);
    float *l = malloc((size_t)8 * vocab * 4);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    moeq_step_item it = {a, ids, 8, 0};
    assert_int_equal(moeq_engine_step(e, &it, 1, l, 1, NULL, 0), MOEQ_OK);
    for (int i = 0; i < n_out; i++) {
        int best = 0;
        for (int v = 1; v < vocab; v++) best = l[v] > l[best] ? v : best;
        assert_int_equal(out[i], best);
        it = (moeq_step_item){a, &out[i], 1, 0};
        assert_int_equal(moeq_engine_step(e, &it, 1, l, 1, NULL, 0), MOEQ_OK);
    }
    int32_t stop = out[2];
    gp.stop_ids = &stop;
    gp.n_stop_ids = 1;
    int32_t *out2 = NULL;
    assert_int_equal(moeq_generate(e, ids, 8, &gp, &out2, &n_out, NULL, 0), MOEQ_OK);
    assert_true(n_out <= 3 && out2[n_out - 1] == stop);
    free(out), free(out2), free(l);
    moeq_engine_destroy(e);
}

static void a_step_that_does_not_fit_appends_nothing(void **state) {
    (void)state;
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = 1;
    p.max_step_tokens = 16;
    p.kv_cache_tokens = 24;
    p.kv_block_tokens = 8;
    moeq_engine *e = NULL;
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_engine_kv_bytes_per_token(e),
                     (size_t)3 * (32 + 8) * sizeof(float)); /* layers x (kv_lora + rope) floats */
    int a, b;
    int32_t ids[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    float *l = malloc((size_t)16 * moeq_test_vocab(g_tiny) * 4);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
    moeq_step_item it[2] = {{a, ids, 16, 0}, {b, ids, 9, 0}};
    char err[256] = "";
    assert_int_equal(moeq_engine_step(e, it, 1, l, 16, err, sizeof(err)), MOEQ_OK);
    it[0].n_tokens = 1;
    assert_int_equal(moeq_engine_step(e, it, 2, l, 16, err, sizeof(err)), MOEQ_ERR_LIMIT); /* needs 3 blocks, 1 free */
    assert_int_equal(moeq_engine_seq_len(e, a), 16);
    assert_int_equal(moeq_engine_seq_len(e, b), 0);
    moeq_step_item big = {b, ids, 16, 0};
    moeq_step_item two[2] = {{a, ids, 1, 0}, big};
    assert_int_equal(moeq_engine_step(e, two, 2, l, 16, err, sizeof(err)), MOEQ_ERR_LIMIT); /* 17 > max_step_tokens */
    free(l);
    moeq_engine_destroy(e);
}

/* Issue 11, "No context-length check": `moeq generate` ran 2,602 positions on a 256-position model. */
static void no_context_length_check_the_engine_refuses_a_step_past_its_context(void **state) {
    (void)state;
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = 1;
    p.max_seqs = 2;
    p.kv_cache_tokens = 1024; /* the cache would hold more: the context is what stops it */
    p.max_step_tokens = 256;
    moeq_engine *e = NULL;
    char err[256] = "";
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_max_model_len(e), 256); /* tiny's max_position_embeddings */
    int a;
    int32_t ids[256], one = 5;
    moeq_test_prompt(ids, 256, 1, moeq_test_vocab(g_tiny));
    float *l = malloc((size_t)moeq_test_vocab(g_tiny) * 4);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    moeq_step_item fill = {a, ids, 256, 0}, next = {a, &one, 1, 0};
    assert_int_equal(moeq_engine_step(e, &fill, 1, l, 1, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_step(e, &next, 1, l, 1, err, sizeof err), MOEQ_ERR_LIMIT); /* position 256 */
    assert_non_null(strstr(err, "exceeds the model's context of 256 tokens"));
    assert_int_equal(moeq_engine_seq_len(e, a), 256); /* nothing appended */
    moeq_engine_destroy(e);
    p.max_model_len = 8; /* a configured context below the model's */
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_max_model_len(e), 8);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    moeq_step_item nine = {a, ids, 9, 0};
    assert_int_equal(moeq_engine_step(e, &nine, 1, l, 1, err, sizeof err), MOEQ_ERR_LIMIT);
    nine.n_tokens = 8;
    assert_int_equal(moeq_engine_step(e, &nine, 1, l, 1, err, sizeof err), MOEQ_OK);
    moeq_engine_destroy(e);
    p.max_model_len = 257; /* above the model's: refused at creation */
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "max_model_len 257 exceeds the model's max_position_embeddings 256"));
    free(l);
}

/* A sequence whose numbers go NaN names the first MoE layer whose router saw it; its batch-mate's logits keep
 * their bits (batch invariance). */
static void nan_crashes_the_engine_no_more_a_poisoned_sequence_is_flagged_and_its_batch_mate_keeps_its_bits(
    void **state) {
    (void)state;
    moeq_engine *e = engine_for(g_tiny, 1, 64);
    int vocab = moeq_test_vocab(g_tiny), a, b, c;
    int32_t ids[6] = {5, 9, 11, 13, 17, 19};
    float *alone = malloc((size_t)vocab * 4), *both = malloc((size_t)2 * vocab * 4);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    moeq_step_item it = {a, ids, 6, 0};
    char err[256] = "";
    assert_int_equal(moeq_engine_step(e, &it, 1, alone, 1, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_nonfinite_layer(e, a), -1);
    /* poison the residual stream of one sequence: a hidden-state NaN as a NaN weight would leave it */
    moeq_tensor *embed = (moeq_tensor *)g_tiny->embed_tokens;
    const void *keep = embed->data;
    size_t row = (size_t)moeq_model_get_config(g_tiny)->hidden_size * 2;
    uint8_t *copy = malloc(embed->nbytes);
    memcpy(copy, keep, embed->nbytes);
    copy[row * 3 + 1] = 0x7f, copy[row * 3] = 0xc0; /* row 3, element 0: BF16 NaN (0x7fc0) */
    embed->data = copy;
    int32_t bad[2] = {3, 9};
    assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(e, &c), MOEQ_OK);
    moeq_step_item two[2] = {{b, bad, 2, 0}, {c, ids, 6, 0}};
    assert_int_equal(moeq_engine_step(e, two, 2, both, 2, err, sizeof err), MOEQ_OK); /* no crash */
    embed->data = keep;
    assert_int_equal(moeq_engine_seq_nonfinite_layer(e, b), moeq_model_get_config(g_tiny)->first_k_dense_replace);
    assert_int_equal(moeq_engine_seq_nonfinite_layer(e, c), -1);
    moeq_sampler *s = NULL;
    assert_int_equal(moeq_sampler_new(NULL, vocab, &s), MOEQ_OK);
    assert_int_equal(moeq_sampler_sample(s, both), -1);
    assert_memory_equal(both + vocab, alone, (size_t)vocab * 4);
    moeq_sampler_destroy(s);
    free(copy);
    free(alone);
    free(both);
    moeq_engine_destroy(e);
}

/*
 * Issue 18: cpu_prefetch, cpu_f8_widen and cpu_k_blocked. A value outside the choices is refused naming them; an
 * engine created with a value sets the process's choice (cpu_tuning.h) and the kernels' description follows it;
 * "auto" leaves the process's choice as it is. On BF16 and F8, a prefill and single-token steps (the few-token
 * tiles that widen F8) give the same bits under all 8 combinations, on the float32 lanes.
 */
static void cpu_kernel_choices_are_engine_keys_and_change_no_bits(void **state) {
    (void)state;
    const int mine[3] = {moeq_cpu_stream_l2(), moeq_cpu_f8_widen32(), moeq_cpu_k_blocked()}; /* restored at the end */
    moeq_engine_params p = moeq_engine_default_params();
    p.kv_cache_tokens = 256, p.max_seqs = 2, p.max_step_tokens = 64, p.n_threads = 2;
    snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "lanes");
    moeq_engine *e = NULL;
    char err[256] = "";
    static const char *const keys[3] = {"cpu_prefetch", "cpu_f8_widen", "cpu_k_blocked"};
    static const char *const values[3][2] = {{"l1", "l2"}, {"f16", "f32"}, {"off", "on"}};
    for (int k = 0; k < 3; k++) {
        moeq_engine_params bad = p;
        assert_int_equal(moeq_props_set(moeq_engine_params_props, &bad, keys[k], "fast", err, sizeof err), MOEQ_OK);
        assert_int_equal(moeq_engine_new(g_tiny, &bad, &e, err, sizeof err), MOEQ_ERR_INVALID_ARG);
        assert_null(e);
        char want[96];
        snprintf(want, sizeof want, "%s \"fast\": the choices are auto, %s and %s", keys[k], values[k][0],
                 values[k][1]);
        assert_non_null(strstr(err, want));
    }
    int avx512 = !strncmp(moeq_engine_cpu_kernels(), "avx512 ", 7);
    const moeq_model *models[2] = {g_tiny, g_tiny_f8};
    int vocab = moeq_test_vocab(g_tiny), n = 7, steps = 3;
    int32_t ids[10];
    moeq_test_prompt(ids, n + steps, 9, vocab);
    size_t floats = (size_t)(n + steps) * vocab;
    float *first = malloc(floats * 4), *got = malloc(floats * 4);
    for (int m = 0; m < 2; m++)
        for (int combo = 0; combo < 8; combo++) {
            for (int k = 0; k < 3; k++)
                assert_int_equal(moeq_props_set(moeq_engine_params_props, &p, keys[k], values[k][combo >> k & 1], err,
                                                sizeof err), MOEQ_OK);
            assert_int_equal(moeq_engine_new(models[m], &p, &e, err, sizeof err), MOEQ_OK);
            assert_int_equal(moeq_cpu_stream_l2(), combo & 1);
            assert_int_equal(moeq_cpu_f8_widen32(), combo >> 1 & 1);
            assert_int_equal(moeq_cpu_k_blocked(), combo >> 2 & 1);
            const char *kernels = moeq_engine_cpu_kernels();
            assert_int_equal(strstr(kernels, "prefetched into L2") != NULL, avx512 && (combo & 1));
            assert_int_equal(strstr(kernels, "widened straight to float32") != NULL, avx512 && (combo >> 1 & 1));
            assert_int_equal(strstr(kernels, "unblocked in K") != NULL, avx512 && !(combo >> 2 & 1));
            int seq;
            assert_int_equal(moeq_engine_seq_new(e, &seq), MOEQ_OK);
            run_all(e, seq, ids, n, got, vocab);
            for (int t = 0; t < steps; t++) run_all(e, seq, ids + n + t, 1, got + (size_t)(n + t) * vocab, vocab);
            moeq_engine_destroy(e);
            if (combo == 0) memcpy(first, got, floats * 4);
            else assert_memory_equal(got, first, floats * 4);
        }
    for (int k = 0; k < 3; k++) /* the last combination holds; auto keeps it */
        assert_int_equal(moeq_props_set(moeq_engine_params_props, &p, keys[k], "auto", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_OK);
    assert_true(moeq_cpu_stream_l2() && moeq_cpu_f8_widen32() && moeq_cpu_k_blocked());
    moeq_engine_destroy(e);
    moeq_cpu_set_stream_l2(mine[0]);
    moeq_cpu_set_f8_widen32(mine[1]);
    moeq_cpu_set_k_blocked(mine[2]);
    free(first);
    free(got);
}

/*
 * expert_weights = group: an engine maps no routed expert until it joins a group (test_engine_group: then only
 * its own); one that runs a step alone first maps them all, and gives the logits of expert_weights = all. Any
 * other value is refused, naming the choices.
 */
static void expert_weights_group_maps_every_expert_at_a_lone_engines_first_step(void **state) {
    (void)state;
    moeq_engine_params p = moeq_engine_default_params();
    p.kv_cache_tokens = 256, p.max_seqs = 2, p.max_step_tokens = 64, p.n_threads = 1;
    char err[256] = "";
    moeq_engine *e = NULL;
    assert_int_equal(moeq_props_set(moeq_engine_params_props, &p, "expert_weights", "some", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "expert_weights \"some\": the choices are all and group"));
    int vocab = moeq_test_vocab(g_tiny), n = 6;
    int32_t ids[7];
    moeq_test_prompt(ids, n + 1, 5, vocab);
    float *want = malloc((size_t)(n + 1) * vocab * 4), *got = malloc((size_t)(n + 1) * vocab * 4);
    int64_t held[2], total[2];
    size_t bytes[2];
    for (int g = 0; g < 2; g++) {
        snprintf(p.expert_weights, sizeof p.expert_weights, "%s", g ? "group" : "all");
        assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof err), MOEQ_OK);
        moeq_engine_expert_residency(e, &held[0], &total[0], &bytes[0]);
        int seq;
        assert_int_equal(moeq_engine_seq_new(e, &seq), MOEQ_OK);
        run_all(e, seq, ids, n, g ? got : want, vocab);
        run_all(e, seq, ids + n, 1, (g ? got : want) + (size_t)n * vocab, vocab);
        moeq_engine_expert_residency(e, &held[1], &total[1], &bytes[1]);
        moeq_engine_destroy(e);
        assert_true(total[0] > 0 && total[1] == total[0] && held[1] == total[1] && bytes[1] > 0);
        assert_int_equal(held[0], g ? 0 : total[0]); /* group: none before the first step */
        assert_int_equal(bytes[0], g ? 0 : bytes[1]);
    }
    assert_memory_equal(got, want, (size_t)(n + 1) * vocab * 4);
    free(want), free(got);
}

/* Issue 12: `backend = cpu` picks the CPU backend from the registry; any other name fails creation, naming it. */
static void the_cpu_backend_is_chosen_by_name_and_an_unknown_name_is_a_clear_error(void **state) {
    (void)state;
    moeq_engine_params p = moeq_engine_default_params();
    char err[256] = "";
    assert_string_equal(p.backend, "cpu");
    p.n_threads = 1;
    assert_int_equal(moeq_props_set(moeq_engine_params_props, &p, "backend", "cpu", err, sizeof(err)), MOEQ_OK);
    moeq_engine *e = NULL;
    assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof(err)), MOEQ_OK);
    assert_string_equal(e->backend->name, "cpu");
    for (int op = 0; op < MOEQ_BACKEND_OP_COUNT; op++) /* the reference backend runs every op */
        assert_true(e->backend->supports(e->backend, (moeq_backend_op)op, MOEQ_DTYPE_BF16));
    moeq_engine_destroy(e);
    static const char *const bad[] = {"cuda9", "", "CPU"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(moeq_props_set(moeq_engine_params_props, &p, "backend", bad[i], err, sizeof(err)), MOEQ_OK);
        static char sentinel;
        e = (moeq_engine *)&sentinel; /* must come back NULL */
        err[0] = 0;
        assert_int_equal(moeq_engine_new(g_tiny, &p, &e, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
        assert_null(e);
        char want[64];
        snprintf(want, sizeof(want), "backend \"%s\" is unknown", bad[i]);
        assert_non_null(strstr(err, want));
        assert_non_null(strstr(err, "known: cpu"));
    }
    moeq_backend *b = NULL;
    moeq_backend_config bc = {.n_threads = 1, .batch_invariant = 1, .max_k = 64, .max_ctx = 16, .max_jobs = 4};
    assert_int_equal(moeq_backend_new("cpu", &bc, &b, err, sizeof(err)), MOEQ_OK);
    assert_string_equal(b->name, "cpu");
    moeq_backend_destroy(b);
    assert_int_equal(moeq_backend_new("metal", &bc, &b, err, sizeof(err)), MOEQ_ERR_INVALID_ARG);
    assert_null(b);
}

/*
 * Issue 12: three sequences (a prefill, then mixed steps of decode tokens and a chunk) through the MoE layer
 * on the ep handle's local transport, then in the default in-place layout of one rank, then again with every rank of other placements played in this process: experts
 * permuted over 3 ranks, the identity over 4 ranks with half the experts replicated, every expert on two
 * ranks in reverse order. Expert GEMMs see other rows, each token's sum is formed once in slot order: the
 * logits are the same bits.
 */
static void run_script(const moeq_model *m, int set, const moeq_ep_placement *pl, float *out) {
    moeq_engine *e = engine_for(m, 2, 64);
    char err[256] = "";
    if (set) assert_int_equal(moeq_moe_layer_set_placement(e, pl, err, sizeof(err)), MOEQ_OK); /* NULL: the handle */
    int vocab = moeq_test_vocab(m), seq[3];
    int32_t ids[40];
    moeq_test_prompt(ids, 40, 5, vocab);
    for (int i = 0; i < 3; i++) assert_int_equal(moeq_engine_seq_new(e, &seq[i]), MOEQ_OK);
    moeq_step_item first[2] = {{seq[0], ids, 13, 1}, {seq[1], ids + 13, 5, 1}};
    assert_int_equal(moeq_engine_step(e, first, 2, out, 18, err, sizeof(err)), MOEQ_OK);
    out += (size_t)18 * vocab;
    for (int r = 0; r < 4; r++) {
        moeq_step_item mixed[3] = {{seq[0], ids + 20 + r, 1, 0}, {seq[2], ids + 24 + 3 * r, 3, 1},
                                   {seq[1], ids + 36 + r, 1, 0}};
        assert_int_equal(moeq_engine_step(e, mixed, 3, out, 5, err, sizeof(err)), MOEQ_OK);
        out += (size_t)5 * vocab;
    }
    moeq_engine_destroy(e);
}

static void the_whole_model_through_the_moe_layer_with_permuted_and_replicated_placements_gives_the_same_bits(
    void **state) {
    (void)state;
    const moeq_model *models[2] = {g_tiny, g_tiny_v2};
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = models[mi];
        int E = m->config.n_routed_experts;
        size_t n = (size_t)(18 + 4 * 5) * moeq_test_vocab(m);
        float *want = malloc(n * 4), *got = malloc(n * 4);
        run_script(m, 1, NULL, want); /* through the ep handle's local transport */
        run_script(m, 0, NULL, got);  /* the default: one rank's identity layout in place */
        assert_memory_equal(want, got, n * 4);
        moeq_ep_placement *pl[3] = {NULL, NULL, NULL};
        assert_int_equal(moeq_ep_placement_new_permuted(E, 3, 7, &pl[0], NULL, 0), MOEQ_OK);
        assert_int_equal(moeq_ep_placement_new_replicated(E, 4, E / 2, &pl[1], NULL, 0), MOEQ_OK);
        int n_rep[64], two[64][2];
        const int *ranks_of[64];
        for (int x = 0; x < E; x++) n_rep[x] = 2, two[x][0] = 1, two[x][1] = 0, ranks_of[x] = two[x];
        assert_int_equal(moeq_ep_placement_new_table(E, 2, n_rep, ranks_of, &pl[2], NULL, 0), MOEQ_OK);
        for (int p = 0; p < 3; p++) {
            memset(got, 0xff, n * 4);
            run_script(m, 1, pl[p], got);
            assert_memory_equal(want, got, n * 4);
            moeq_ep_placement_destroy(pl[p]);
        }
        free(want), free(got);
    }
}

/* One step per token (decode shape), or the whole prompt in one step (prefill shape), then 3 greedy tokens. */
static void count_script(moeq_engine *e, const int32_t *ids, int n, int one_by_one, int vocab) {
    int seq = -1;
    assert_int_equal(moeq_engine_seq_new(e, &seq), MOEQ_OK);
    float *logits = malloc((size_t)n * vocab * sizeof(float));
    char err[256] = "";
    for (int i = 0; i < n; i += one_by_one ? 1 : n) {
        moeq_step_item it = {seq, ids + i, one_by_one ? 1 : n, 0};
        assert_int_equal(moeq_engine_step(e, &it, 1, logits, (size_t)n, err, sizeof err), MOEQ_OK);
    }
    free(logits);
    moeq_engine_seq_free(e, seq);
}

static void the_engine_counts_each_routed_slot_by_layer_and_expert_whatever_the_batching(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_tiny, g_tiny_v2};
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = models[mi];
        const moeq_model_config *c = &m->config;
        int vocab = moeq_test_vocab(m), n = 13, L = 0, E = 0, L2 = 0, E2 = 0;
        int32_t ids[13];
        moeq_test_prompt(ids, n, 5, vocab);
        moeq_engine *a = engine_for(m, 2, 64), *b = engine_for(m, 1, 64);
        const uint64_t *ca = moeq_engine_expert_counts(a, &L, &E), *cb = moeq_engine_expert_counts(b, &L2, &E2);
        assert_non_null(ca);
        assert_int_equal(E, c->n_routed_experts);
        assert_int_equal(L, c->num_hidden_layers + c->num_nextn_predict_layers);
        for (int i = 0; i < L * E; i++) assert_int_equal(ca[i], 0); /* nothing ran yet */
        count_script(a, ids, n, 0, vocab);
        count_script(b, ids, n, 1, vocab);
        assert_int_equal(L2, L);
        assert_memory_equal(ca, cb, (size_t)L * E * sizeof(uint64_t)); /* the same routes, prefill or decode */
        int64_t *parsed = NULL;
        int parsed_E = 0;
        for (int l = 0; l < L; l++) {
            uint64_t sum = 0;
            for (int x = 0; x < E; x++) sum += ca[(size_t)l * E + x];
            int moe = l < c->num_hidden_layers && l >= c->first_k_dense_replace && (l % c->moe_layer_freq) == 0;
            assert_int_equal(sum, moe ? (uint64_t)n * c->num_experts_per_tok : 0); /* MTP: no draft ran */
        }
        /* the stats file round-trips: its one parsed line is the per-expert sum over layers */
        char *text = NULL, err[256] = "";
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        assert_non_null(mem);
        assert_int_equal(moeq_ep_stats_print(ca, L, E, "a test", mem, err, sizeof err), MOEQ_OK);
        assert_int_equal(fclose(mem), 0);
        assert_int_equal(moeq_ep_stats_parse(text, len, &parsed, &parsed_E, err, sizeof err), MOEQ_OK);
        assert_int_equal(parsed_E, E);
        for (int x = 0; x < E; x++) {
            uint64_t sum = 0;
            for (int l = 0; l < L; l++) sum += ca[(size_t)l * E + x];
            assert_int_equal(parsed[x], (int64_t)sum);
        }
        assert_non_null(strstr(text, "# a test\n"));
        free(text), free(parsed);
        moeq_engine_destroy(a), moeq_engine_destroy(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(absorbed_and_naive_mla_agree),
        cmocka_unit_test(cpu_matrix_is_checked_and_both_paths_agree_within_tolerance),
        cmocka_unit_test(prefill_equals_token_by_token_decode_bit_for_bit),
        cmocka_unit_test(logits_are_bit_identical_alone_and_in_mixed_batches),
        cmocka_unit_test(truncate_then_reappend_gives_identical_logits),
        cmocka_unit_test(moe_gather_scatter_equals_a_per_token_loop),
        cmocka_unit_test(bf16_and_f8_checkpoints_both_run),
        cmocka_unit_test(greedy_generation_follows_argmax_and_stops),
        cmocka_unit_test(a_step_that_does_not_fit_appends_nothing),
        cmocka_unit_test(no_context_length_check_the_engine_refuses_a_step_past_its_context),
        cmocka_unit_test(nan_crashes_the_engine_no_more_a_poisoned_sequence_is_flagged_and_its_batch_mate_keeps_its_bits),
        cmocka_unit_test(the_cpu_backend_is_chosen_by_name_and_an_unknown_name_is_a_clear_error),
        cmocka_unit_test(cpu_kernel_choices_are_engine_keys_and_change_no_bits),
        cmocka_unit_test(expert_weights_group_maps_every_expert_at_a_lone_engines_first_step),
        cmocka_unit_test(the_whole_model_through_the_moe_layer_with_permuted_and_replicated_placements_gives_the_same_bits),
        cmocka_unit_test(the_engine_counts_each_routed_slot_by_layer_and_expert_whatever_the_batching),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
