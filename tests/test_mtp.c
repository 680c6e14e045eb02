/*
 * test_mtp.c — speculative decoding with the MTP layer (engine/mtp*.c) on
 * checkpoints written by the built `moeq gen-model`: tiny (random MTP layer:
 * drafts almost always rejected), tiny-mtp (MTP layer agreeing with the main
 * model by construction: most drafts accepted) and small.
 *
 * Greedy output equals plain decoding token for token (batch 1 and mixed
 * batches, k = 1..3); rollback leaves both caches bit-identical to a
 * sequence that never drafted; sampling in exact mode (the sequence's own
 * sampler) equals plain seeded sampling token for token; rejection-mode
 * sampling follows the model's distribution (chi-square, stated
 * significance); errors change nothing.
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
#include "kv_cache.h"
#include "moeq/engine.h"
#include "mtp.h"
#include "sampler.h"

static char g_dir[256];
static moeq_model *g_tiny, *g_agree, *g_small, *g_v2;

static moeq_model *gen_and_load(const char *preset, const char *name) {
    const char *build = getenv("MOEQ_BUILD_DIR");
    char cmd[1024], path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    snprintf(cmd, sizeof(cmd), "'%s/cli/moeq' gen-model --preset %s --out '%s' >/dev/null 2>&1", build ? build : ".",
             preset, path);
    if (system(cmd) != 0) {
        fprintf(stderr, "gen-model failed: %s\n", cmd);
        return NULL;
    }
    moeq_model *m = NULL;
    if (moeq_model_load(path, NULL, &m, err, sizeof(err)) != MOEQ_OK) fprintf(stderr, "load %s: %s\n", path, err);
    return m;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/moeq-test-mtp-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    g_tiny = gen_and_load("tiny", "tiny");
    g_agree = gen_and_load("tiny-mtp", "tiny-mtp");
    g_small = gen_and_load("small", "small");
    g_v2 = gen_and_load("tiny-v2", "tiny-v2");
    return g_tiny && g_agree && g_small && g_v2 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    moeq_model_destroy(g_tiny);
    moeq_model_destroy(g_agree);
    moeq_model_destroy(g_small);
    moeq_model_destroy(g_v2);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static moeq_engine *engine_for_draft(const moeq_model *m, int max_step_tokens, const char *mtp_draft) {
    moeq_engine_params p = moeq_engine_default_params();
    if (mtp_draft) snprintf(p.mtp_draft, sizeof p.mtp_draft, "%s", mtp_draft);
    p.n_threads = 2;
    p.max_seqs = 16;
    p.max_step_tokens = max_step_tokens;
    p.kv_cache_tokens = 2048;
    p.kv_block_tokens = 4; /* small blocks: rollbacks cross block edges */
    moeq_engine *e = NULL;
    char err[256] = "";
    moeq_err rc = moeq_engine_new(m, &p, &e, err, sizeof(err));
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, MOEQ_OK);
    return e;
}

static moeq_engine *engine_for(const moeq_model *m, int max_step_tokens) { return engine_for_draft(m, max_step_tokens, NULL); }

static int V(const moeq_model *m) { return moeq_model_get_config(m)->vocab_size; }

static void prompt(int32_t *ids, int n, int salt, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + salt * 101 + 5) % vocab);
}

static void generate_mode(moeq_engine *e, const int32_t *ids, int n, int k, int rejection, moeq_sampling_params sp,
                          int max_new, int32_t **out, int *n_out, moeq_generate_stats *stats) {
    moeq_generate_params gp = {.sampling = sp, .max_new_tokens = max_new, .mtp_k = k, .mtp_rejection = rejection,
                               .stats = stats};
    char err[256] = "";
    moeq_err rc = moeq_generate(e, ids, n, &gp, out, n_out, err, sizeof(err));
    if (rc) fprintf(stderr, "generate: %s\n", err);
    assert_int_equal(rc, MOEQ_OK);
}

/* moeq_generate in its default (exact) mode. */
static void generate(moeq_engine *e, const int32_t *ids, int n, int k, moeq_sampling_params sp, int max_new,
                     int32_t **out, int *n_out, moeq_generate_stats *stats) {
    generate_mode(e, ids, n, k, 0, sp, max_new, out, n_out, stats);
}

static void greedy_with_mtp_gives_the_same_tokens_as_without(void **state) {
    (void)state;
    const moeq_model *models[3] = {g_tiny, g_agree, g_small};
    const char *names[3] = {"tiny", "tiny-mtp", "small"};
    for (int mi = 0; mi < 3; mi++) {
        moeq_engine *e = engine_for(models[mi], 64);
        int64_t drafted = 0, accepted = 0, max_new = mi == 2 ? 24 : 48;
        for (int salt = 0; salt < (mi == 2 ? 2 : 4); salt++) {
            int32_t ids[20], *plain = NULL;
            int n_plain = 0, n_p = 3 + 5 * salt;
            prompt(ids, n_p, salt, V(models[mi]));
            generate(e, ids, n_p, 0, moeq_sampling_default_params(), (int)max_new, &plain, &n_plain, NULL);
            for (int k = 1; k <= 3; k++) {
                int32_t *spec = NULL;
                int n_spec = 0;
                moeq_generate_stats st = {0};
                generate(e, ids, n_p, k, moeq_sampling_default_params(), (int)max_new, &spec, &n_spec, &st);
                assert_int_equal(n_spec, n_plain);
                assert_memory_equal(spec, plain, (size_t)n_plain * sizeof(int32_t));
                assert_true(st.accepted <= st.drafted && st.rounds >= (n_plain - 1) / (k + 1));
                drafted += st.drafted, accepted += st.accepted;
                free(spec);
            }
            free(plain);
        }
        print_message("%s: greedy, k = 1..3: %lld of %lld drafts accepted\n", names[mi], (long long)accepted,
                      (long long)drafted);
        if (models[mi] == g_agree) assert_true(accepted * 10 > drafted * 6); /* the agreeing checkpoint agrees */
        moeq_engine_destroy(e);
    }
}

/*
 * Eight sequences with prompts of different lengths and k = 0..3 (k changes
 * every round) in one decoder: each must produce exactly what plain greedy
 * decoding produces alone, although the sequences accept different numbers
 * of tokens in the same rounds.
 */
static void mixed_batches_accept_different_counts_and_match_plain_decoding(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_agree, g_tiny};
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = models[mi];
        enum { S = 8, N = 40 };
        int vocab = V(m);
        moeq_engine *e = engine_for(m, 256);
        /* a sequence past N keeps decoding (up to k + 1 = 4 tokens a round) until the slowest reaches N */
        int32_t ids[S][24], *plain[S], got[S][4 * N + 8];
        int n_plain[S], n_got[S], lens[S];
        moeq_spec_seq seqs[S];
        moeq_step_item items[S];
        for (int i = 0; i < S; i++) {
            lens[i] = 1 + (i * 7) % 20;
            prompt(ids[i], lens[i], 20 + i, vocab);
            generate(e, ids[i], lens[i], 0, moeq_sampling_default_params(), N, &plain[i], &n_plain[i], NULL);
        }
        float *logits = malloc((size_t)S * vocab * sizeof(float));
        for (int i = 0; i < S; i++) {
            memset(&seqs[i], 0, sizeof seqs[i]);
            seqs[i].sampling = moeq_sampling_default_params();
            assert_int_equal(moeq_engine_seq_new(e, &seqs[i].seq_id), MOEQ_OK);
            assert_int_equal(moeq_engine_seq_set_mtp(e, seqs[i].seq_id, 1), MOEQ_OK);
            items[i] = (moeq_step_item){seqs[i].seq_id, ids[i], lens[i], 0};
        }
        assert_int_equal(moeq_engine_step(e, items, S, logits, S, NULL, 0), MOEQ_OK); /* one batched prefill */
        for (int i = 0; i < S; i++) {
            int best = 0;
            for (int v = 1; v < vocab; v++) best = logits[(size_t)i * vocab + v] > logits[(size_t)i * vocab + best] ? v : best;
            seqs[i].next_token = best;
            got[i][0] = best;
            n_got[i] = 1;
        }
        moeq_mtp_decoder *dec = NULL;
        assert_int_equal(moeq_mtp_decoder_new(e, S, 3, &dec, NULL, 0), MOEQ_OK);
        int differing_rounds = 0;
        for (int round = 0; round < N; round++) {
            for (int i = 0; i < S; i++) seqs[i].k = (i + round) % 4;
            char err[256] = "";
            moeq_err rc = moeq_mtp_decode_step(dec, seqs, S, err, sizeof err);
            if (rc) fprintf(stderr, "round %d: %s\n", round, err);
            assert_int_equal(rc, MOEQ_OK);
            int first = seqs[0].n_out, differ = 0;
            for (int i = 0; i < S; i++) {
                differ |= seqs[i].n_out != first;
                for (int j = 0; j < seqs[i].n_out; j++) got[i][n_got[i]++] = seqs[i].out[j];
                assert_int_equal(moeq_engine_seq_len(e, seqs[i].seq_id), lens[i] + n_got[i] - 1);
                assert_int_equal(moeq_engine_mtp_seq_len(e, seqs[i].seq_id), lens[i] + n_got[i] - 2);
            }
            differing_rounds += differ;
            int done = 1;
            for (int i = 0; i < S; i++) done &= n_got[i] >= N;
            if (done) break;
        }
        for (int i = 0; i < S; i++) {
            assert_true(n_got[i] >= N);
            assert_memory_equal(got[i], plain[i], (size_t)N * sizeof(int32_t));
            free(plain[i]);
            moeq_engine_seq_free(e, seqs[i].seq_id);
        }
        if (m == g_agree) assert_true(differing_rounds > 0);
        moeq_mtp_decoder_destroy(dec);
        free(logits);
        moeq_engine_destroy(e);
    }
}

/*
 * Exact mode (moeq_spec_seq.sampler set): sampled decoding with MTP gives the
 * plain seeded sampler's tokens, token for token — four sequences with
 * different seeds, temperatures 0.8..1.5 and top-k/top-p in one decoder,
 * k = 1..3, on tiny (drafts mostly rejected) and tiny-mtp (mostly accepted).
 */
static void sampled_decoding_with_mtp_in_exact_mode_gives_the_plain_samplers_tokens(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_tiny, g_agree};
    const char *names[2] = {"tiny", "tiny-mtp"};
    enum { S = 4, N = 40 };
    const moeq_sampling_params sps[S] = {{0.8, 0, 1.0, 1}, {1.0, 8, 1.0, 42}, {1.2, 0, 0.9, 7}, {1.5, 16, 0.8, 9001}};
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = models[mi];
        int vocab = V(m);
        moeq_engine *e = engine_for(m, 64);
        float *logits = malloc((size_t)S * vocab * sizeof(float));
        int64_t drafted = 0, accepted = 0;
        for (int k = 1; k <= 3; k++) {
            int32_t ids[S][16], *plain[S], got[S][N + MOEQ_MTP_MAX_K + 1];
            int n_plain[S], n_got[S], lens[S];
            moeq_spec_seq seqs[S];
            moeq_sampler *samplers[S];
            moeq_step_item items[S];
            for (int i = 0; i < S; i++) {
                lens[i] = 2 + 3 * i + k;
                prompt(ids[i], lens[i], 60 + 10 * k + i, vocab);
                generate(e, ids[i], lens[i], 0, sps[i], N, &plain[i], &n_plain[i], NULL);
                assert_int_equal(n_plain[i], N);
                int32_t *via = NULL; /* moeq_generate (and `moeq generate --mtp`) runs the same exact mode */
                int n_via = 0;
                generate(e, ids[i], lens[i], k, sps[i], N, &via, &n_via, NULL);
                assert_int_equal(n_via, N);
                assert_memory_equal(via, plain[i], (size_t)N * sizeof(int32_t));
                free(via);
                memset(&seqs[i], 0, sizeof seqs[i]);
                seqs[i].sampling = sps[i];
                assert_int_equal(moeq_sampler_new(&sps[i], vocab, &samplers[i]), MOEQ_OK);
                seqs[i].sampler = samplers[i];
                assert_int_equal(moeq_engine_seq_new(e, &seqs[i].seq_id), MOEQ_OK);
                assert_int_equal(moeq_engine_seq_set_mtp(e, seqs[i].seq_id, 1), MOEQ_OK);
                items[i] = (moeq_step_item){seqs[i].seq_id, ids[i], lens[i], 0};
            }
            assert_int_equal(moeq_engine_step(e, items, S, logits, S, NULL, 0), MOEQ_OK);
            for (int i = 0; i < S; i++) {
                got[i][0] = seqs[i].next_token = moeq_sampler_sample(samplers[i], logits + (size_t)i * vocab);
                n_got[i] = 1;
            }
            moeq_mtp_decoder *dec = NULL;
            assert_int_equal(moeq_mtp_decoder_new(e, S, k, &dec, NULL, 0), MOEQ_OK);
            for (int done = 0; !done;) {
                for (int i = 0; i < S; i++) seqs[i].k = n_got[i] < N ? k : 0;
                char err[256] = "";
                moeq_err rc = moeq_mtp_decode_step(dec, seqs, S, err, sizeof err);
                if (rc) fprintf(stderr, "round: %s\n", err);
                assert_int_equal(rc, MOEQ_OK);
                done = 1;
                for (int i = 0; i < S; i++) {
                    for (int j = 0; j < seqs[i].n_out && n_got[i] < N; j++) got[i][n_got[i]++] = seqs[i].out[j];
                    done &= n_got[i] >= N;
                }
            }
            for (int i = 0; i < S; i++) {
                assert_memory_equal(got[i], plain[i], (size_t)N * sizeof(int32_t));
                assert_int_equal(seqs[i].draws, 0); /* exact mode draws from the sampler, not the counter */
                drafted += seqs[i].drafted, accepted += seqs[i].accepted;
                free(plain[i]);
                moeq_sampler_destroy(samplers[i]);
                moeq_engine_seq_free(e, seqs[i].seq_id);
            }
            moeq_mtp_decoder_destroy(dec);
        }
        print_message("%s: exact sampling, k = 1..3: %lld of %lld drafts accepted\n", names[mi],
                      (long long)accepted, (long long)drafted);
        assert_true(drafted > 0);
        if (m == g_agree) assert_true(accepted > 0);
        free(logits);
        moeq_engine_destroy(e);
    }
}

/* Every main-cache entry (all layers) and MTP-cache entry of a and b, bit for bit. */
static void assert_caches_equal(moeq_engine *e, int a, int b) {
    const moeq_model_config *c = e->cfg;
    size_t ef = (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * sizeof(float);
    int len = moeq_engine_seq_len(e, a), mlen = moeq_engine_mtp_seq_len(e, a);
    assert_int_equal(len, moeq_engine_seq_len(e, b));
    assert_int_equal(mlen, moeq_engine_mtp_seq_len(e, b));
    assert_int_equal(mlen, len - 1);
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int p = 0; p < len; p++)
            assert_memory_equal(moeq_kv_cache_entry(e->cache, a, l, p), moeq_kv_cache_entry(e->cache, b, l, p), ef);
    for (int p = 0; p < mlen; p++) assert_memory_equal(moeq_mtp_cache_entry(e, a, p), moeq_mtp_cache_entry(e, b, p), ef);
}

/*
 * Sequence a decodes speculatively (k = 3, rejections happen); sequence b
 * gets the same tokens one plain step at a time and never drafts. After
 * every round both caches — main (all layers) and MTP — hold the same bits,
 * and the next step's logits and draft logits are identical.
 */
static void rollback_leaves_both_caches_as_if_rejected_tokens_were_never_drafted(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_tiny, g_agree};
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = models[mi];
        int vocab = V(m), a, b, n_p = 11;
        moeq_engine *e = engine_for(m, 64);
        int32_t ids[11];
        prompt(ids, n_p, 7, vocab);
        float *la = malloc((size_t)2 * vocab * 4), *lb = malloc((size_t)2 * vocab * 4);
        assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, a, 1), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, b, 1), MOEQ_OK);
        moeq_step_item both[2] = {{a, ids, n_p, 0}, {b, ids, 5, 0}}; /* b: its prompt in two chunks */
        assert_int_equal(moeq_engine_step(e, both, 2, la, 2, NULL, 0), MOEQ_OK);
        moeq_step_item rest = {b, ids + 5, n_p - 5, 0};
        assert_int_equal(moeq_engine_step(e, &rest, 1, lb, 1, NULL, 0), MOEQ_OK);
        moeq_spec_seq sa = {.seq_id = a, .next_token = 3, .k = 3, .sampling = moeq_sampling_default_params()};
        moeq_mtp_decoder *dec = NULL;
        assert_int_equal(moeq_mtp_decoder_new(e, 1, 3, &dec, NULL, 0), MOEQ_OK);
        int32_t pending = 3;
        for (int round = 0; round < 12; round++) {
            assert_int_equal(moeq_mtp_decode_step(dec, &sa, 1, NULL, 0), MOEQ_OK);
            for (int j = 0; j < sa.n_out; j++) { /* b: pending, then all but the last new token */
                moeq_step_item it = {b, &pending, 1, 0};
                assert_int_equal(moeq_engine_step(e, &it, 1, lb, 1, NULL, 0), MOEQ_OK);
                pending = sa.out[j];
            }
            assert_caches_equal(e, a, b);
        }
        assert_true(sa.accepted < sa.drafted); /* some rejections were rolled back */
        moeq_mtp_item ma = {a, pending}, mb = {b, pending};
        assert_int_equal(moeq_engine_mtp_step(e, &ma, 1, la, 1, NULL, 0), MOEQ_OK);
        assert_int_equal(moeq_engine_mtp_step(e, &mb, 1, lb, 1, NULL, 0), MOEQ_OK);
        assert_memory_equal(la, lb, (size_t)vocab * 4);
        moeq_step_item ia = {a, &pending, 1, 0}, ib = {b, &pending, 1, 0};
        assert_int_equal(moeq_engine_step(e, &ia, 1, la, 1, NULL, 0), MOEQ_OK);
        assert_int_equal(moeq_engine_step(e, &ib, 1, lb, 1, NULL, 0), MOEQ_OK);
        assert_memory_equal(la, lb, (size_t)vocab * 4);
        assert_caches_equal(e, a, b);
        print_message("%s: %lld of %lld drafts accepted\n", mi ? "tiny-mtp" : "tiny", (long long)sa.accepted,
                      (long long)sa.drafted);
        moeq_mtp_decoder_destroy(dec);
        free(la), free(lb);
        moeq_engine_destroy(e);
    }
}

/* ---- sampling ------------------------------------------------------------- */

/* Upper alpha = 0.001 point of chi-square with df degrees (Wilson-Hilferty). */
static double chi2_critical_001(int df) {
    double z = 3.0902, a = 2.0 / (9.0 * df), t = 1.0 - a + z * sqrt(a);
    return df * t * t * t;
}

/*
 * Two-sample chi-square homogeneity test of counts x and y over n_bins
 * (bins with fewer than 10 observations in total are pooled). Returns
 * statistic / critical value at alpha = 0.001 (< 1: same distribution).
 */
static double two_sample_chi2_ratio(const int *x, const int *y, int n_bins, const char *what) {
    double nx = 0, ny = 0, stat = 0, px = 0, py = 0;
    for (int i = 0; i < n_bins; i++) nx += x[i], ny += y[i];
    int df = -1;
    for (int i = 0; i <= n_bins; i++) {
        double a = i < n_bins ? x[i] : px, b = i < n_bins ? y[i] : py;
        if (i < n_bins && a + b < 10) {
            px += a, py += b;
            continue;
        }
        if (a + b == 0) continue;
        double ea = (a + b) * nx / (nx + ny), eb = (a + b) * ny / (nx + ny);
        stat += (a - ea) * (a - ea) / ea + (b - eb) * (b - eb) / eb;
        df++;
    }
    double ratio = df > 0 ? stat / chi2_critical_001(df) : 0;
    print_message("%s: chi2 %.2f, df %d, critical (alpha 0.001) %.2f\n", what, stat, df,
                  df > 0 ? chi2_critical_001(df) : 0);
    return ratio;
}

/*
 * 1500 seeded generations of 4 tokens with MTP (k = 2: one round of two drafts) against 1500 without,
 * at temperature 2 with top-k 4 (a handful of plausible tokens per step) and
 * at temperature 1.5 with top-p 0.9: the second and third tokens (the ones
 * drafts decide) have the same distribution at significance 0.001, on the
 * agreeing checkpoint (most drafts accepted) and on tiny (most rejected:
 * the residual max(0, p - q) path).
 */
static void sampling_with_mtp_follows_the_model_distribution(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_agree, g_tiny};
    moeq_sampling_params cases[2] = {{.temperature = 2.0, .top_k = 4, .top_p = 1.0},
                                     {.temperature = 1.5, .top_k = 0, .top_p = 0.9}};
    for (int mi = 0; mi < 2; mi++)
        for (int ci = 0; ci < 2; ci++) {
            const moeq_model *m = models[mi];
            int vocab = V(m), runs = 1500;
            moeq_engine *e = engine_for(m, 64);
            int32_t ids[6];
            prompt(ids, 6, 9, vocab);
            int *cnt[2][2];
            for (int s = 0; s < 2; s++)
                for (int pos = 0; pos < 2; pos++) cnt[s][pos] = calloc((size_t)vocab, sizeof(int));
            int64_t drafted = 0, accepted = 0;
            for (int s = 0; s < 2; s++)
                for (int r = 0; r < runs; r++) {
                    moeq_sampling_params sp = cases[ci];
                    sp.seed = (uint64_t)(s * runs + r + 1);
                    int32_t *out = NULL;
                    int n_out = 0;
                    moeq_generate_stats st = {0};
                    generate_mode(e, ids, 6, s ? 0 : 2, 1, sp, 4, &out, &n_out, &st);
                    assert_int_equal(n_out, 4);
                    cnt[s][0][out[1]]++;
                    cnt[s][1][out[2]]++;
                    drafted += st.drafted, accepted += st.accepted;
                    free(out);
                }
            char what[96];
            for (int pos = 0; pos < 2; pos++) {
                snprintf(what, sizeof what, "%s, case %d, token %d (drafts: %lld/%lld accepted)",
                         mi ? "tiny" : "tiny-mtp", ci, pos + 2, (long long)accepted, (long long)drafted);
                assert_true(two_sample_chi2_ratio(cnt[0][pos], cnt[1][pos], vocab, what) < 1.0);
            }
            for (int s = 0; s < 2; s++)
                for (int pos = 0; pos < 2; pos++) free(cnt[s][pos]);
            moeq_engine_destroy(e);
        }
}

/* The test of the test: a sampler with the wrong temperature is caught. */
static void the_chi_square_check_rejects_a_different_distribution(void **state) {
    (void)state;
    int vocab = V(g_agree), runs = 1500;
    moeq_engine *e = engine_for(g_agree, 64);
    int32_t ids[6];
    prompt(ids, 6, 9, vocab);
    int *x = calloc((size_t)vocab, sizeof(int)), *y = calloc((size_t)vocab, sizeof(int));
    for (int s = 0; s < 2; s++)
        for (int r = 0; r < runs; r++) {
            moeq_sampling_params sp = {.temperature = s ? 2.0 : 1.2, .top_k = 4, .top_p = 1.0,
                                       .seed = (uint64_t)(s * runs + r + 1)};
            int32_t *out = NULL;
            int n_out = 0;
            generate_mode(e, ids, 6, s ? 0 : 2, 1, sp, 3, &out, &n_out, NULL);
            (s ? y : x)[out[1]]++;
            free(out);
        }
    assert_true(two_sample_chi2_ratio(x, y, vocab, "temperature 1.2 vs 2.0") > 1.0);
    free(x), free(y);
    moeq_engine_destroy(e);
}

/* ---- errors --------------------------------------------------------------- */

/*
 * Rounds that carry other sequences' ordinary items in their verify step (moeq_mtp_decode_step_with): the
 * speculative sequences get the tokens of rounds alone, the ordinary ones (a prompt prefilled in chunks, then
 * plain decode tokens) the logits of steps of their own, bit for bit; a bad extra item is refused untouched.
 */
static void ordinary_items_in_the_verify_step_give_the_bits_of_separate_steps(void **state) {
    (void)state;
    const moeq_model *m = g_agree;
    int v = V(m), n_rounds = 12;
    moeq_engine *a = engine_for(m, 64), *b = engine_for(m, 64);
    moeq_mtp_decoder *da = NULL, *db = NULL;
    char err[256] = "";
    assert_int_equal(moeq_mtp_decoder_new(a, 2, 2, &da, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_mtp_decoder_new(b, 2, 2, &db, err, sizeof err), MOEQ_OK);
    moeq_spec_seq sa[2], sb[2];
    float *la = malloc((size_t)4 * v * sizeof(float)), *lb = malloc((size_t)4 * v * sizeof(float));
    int32_t ids[24];
    for (int i = 0; i < 2; i++) { /* two speculative sequences, same prompts on both engines */
        moeq_engine *e[2] = {a, b};
        moeq_spec_seq *ss[2] = {sa, sb};
        prompt(ids, 5 + 4 * i, i, v);
        for (int x = 0; x < 2; x++) {
            moeq_spec_seq *q = &ss[x][i];
            memset(q, 0, sizeof *q);
            assert_int_equal(moeq_engine_seq_new(e[x], &q->seq_id), MOEQ_OK);
            assert_int_equal(moeq_engine_seq_set_mtp(e[x], q->seq_id, 1), MOEQ_OK);
            moeq_step_item it = {q->seq_id, ids, 5 + 4 * i, 0};
            assert_int_equal(moeq_engine_step(e[x], &it, 1, la, 4, err, sizeof err), MOEQ_OK);
            q->next_token = moeq_sampler_argmax(la, v);
            q->sampling = moeq_sampling_default_params();
        }
    }
    int oa, ob; /* the ordinary sequence: a 20-token prompt in chunks of 7, then decode tokens */
    assert_int_equal(moeq_engine_seq_new(a, &oa), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(b, &ob), MOEQ_OK);
    prompt(ids, 20, 9, v);
    int fed = 0;
    int32_t next = 0;
    for (int r = 0; r < n_rounds; r++) {
        for (int i = 0; i < 2; i++) sa[i].k = sb[i].k = 1 + (r + i) % 2;
        const int32_t *toks = fed < 20 ? ids + fed : &next;
        int n = fed < 20 ? (20 - fed < 7 ? 20 - fed : 7) : 1;
        moeq_step_item ia = {oa, toks, n, 0}, ib = {ob, toks, n, 0};
        assert_int_equal(moeq_mtp_decode_step_with(da, sa, 2, &ia, 1, la, 1, err, sizeof err), MOEQ_OK);
        assert_int_equal(moeq_mtp_decode_step(db, sb, 2, err, sizeof err), MOEQ_OK);
        assert_int_equal(moeq_engine_step(b, &ib, 1, lb, 1, err, sizeof err), MOEQ_OK);
        assert_memory_equal(la, lb, (size_t)v * sizeof(float));
        for (int i = 0; i < 2; i++) {
            assert_int_equal(sa[i].n_out, sb[i].n_out);
            assert_memory_equal(sa[i].out, sb[i].out, (size_t)sa[i].n_out * sizeof(int32_t));
        }
        fed += n;
        next = moeq_sampler_argmax(la, v);
    }
    assert_true(sa[0].accepted > 0);
    moeq_step_item bad = {oa, &next, 1, 1}; /* all_logits: refused before anything runs */
    int len = moeq_engine_seq_len(a, oa), len0 = moeq_engine_seq_len(a, sa[0].seq_id);
    assert_int_equal(moeq_mtp_decode_step_with(da, sa, 2, &bad, 1, la, 1, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_int_equal(moeq_engine_seq_len(a, oa), len);
    assert_int_equal(moeq_engine_seq_len(a, sa[0].seq_id), len0);
    free(la), free(lb);
    moeq_mtp_decoder_destroy(da), moeq_mtp_decoder_destroy(db);
    moeq_engine_destroy(a), moeq_engine_destroy(b);
}

/*
 * mtp_draft = f8 (the default) drafts with 8-bit copies of the MTP layer's projections and head (int8 rows where
 * the CPU has the draft kernels, else F8 E4M3), e4m3 with F8 E4M3 copies everywhere: the emitted tokens are the
 * plain greedy ones in every mode, the copies hold about half the bytes of the BF16 weights they stand for, and
 * on the agreeing checkpoint both kinds of copies are accepted about as often as the exact weights.
 */
static void f8_drafts_emit_the_plain_tokens_and_are_accepted_like_exact_ones(void **state) {
    (void)state;
    const char *modes[3] = {"exact", "f8", "e4m3"};
    int64_t drafted[3] = {0}, accepted[3] = {0};
    for (int mi = 0; mi < 3; mi++) {
        moeq_engine *e = engine_for_draft(g_agree, 64, modes[mi]);
        assert_int_equal(moeq_mtp_draft_f8(e), mi > 0);
        assert_int_equal(moeq_mtp_draft_f8_bytes(e), 0); /* made by the first marked sequence */
        for (int salt = 0; salt < 4; salt++) {
            int32_t ids[20], *plain = NULL, *spec = NULL;
            int n_plain = 0, n_spec = 0, n_p = 3 + 5 * salt;
            prompt(ids, n_p, 100 + salt, V(g_agree));
            generate(e, ids, n_p, 0, moeq_sampling_default_params(), 48, &plain, &n_plain, NULL);
            for (int k = 1; k <= 3; k++) {
                moeq_generate_stats st = {0};
                generate(e, ids, n_p, k, moeq_sampling_default_params(), 48, &spec, &n_spec, &st);
                assert_int_equal(n_spec, n_plain);
                assert_memory_equal(spec, plain, (size_t)n_plain * sizeof(int32_t));
                drafted[mi] += st.drafted, accepted[mi] += st.accepted;
                free(spec);
            }
            free(plain);
        }
        size_t f8 = moeq_mtp_draft_f8_bytes(e);
        if (mi) assert_true(f8 > 0 && f8 < moeq_model_mtp_active_bytes_per_token(g_agree));
        else assert_int_equal(f8, 0);
        moeq_engine_destroy(e);
    }
    double ax = (double)accepted[0] / (double)drafted[0], a8 = (double)accepted[1] / (double)drafted[1];
    double ae = (double)accepted[2] / (double)drafted[2];
    print_message("tiny-mtp: exact drafts %.3f accepted, f8 drafts %.3f (%s), e4m3 drafts %.3f\n", ax, a8,
                  moeq_engine_cpu_draft() ? "int8 rows" : "F8 E4M3", ae);
    assert_true(a8 > ax - 0.05);
    assert_true(ae > ax - 0.05);
}

/* gen-model writes the MTP head as a copy of lm_head, as DeepSeek-V3 ships it: exact drafts read lm_head itself
 * (mtp_draft = f8 drafts through the head's F8 copy instead). */
static void an_mtp_head_that_copies_lm_head_is_not_read_twice(void **state) {
    (void)state;
    moeq_engine *e = engine_for_draft(g_agree, 64, "exact");
    assert_true(moeq_mtp_head_is_lm_head(e));
    moeq_engine_destroy(e);
    e = engine_for_draft(g_agree, 64, "f8");
    assert_true(moeq_mtp_head_is_lm_head(e)); /* no copy before the first marked sequence */
    int seq;
    assert_int_equal(moeq_engine_seq_new(e, &seq), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_set_mtp(e, seq, 1), MOEQ_OK);
    assert_false(moeq_mtp_head_is_lm_head(e));
    moeq_engine_destroy(e);
}

/*
 * Where the screened head applies (int8 kernels, head_screen = auto), int8 drafts through lm_head read the screen's
 * int8 copy instead of making the same bytes again: the draft copies are smaller by exactly that copy than with
 * head_screen = off, and the drafts, so every count of drafted and accepted tokens, are the same.
 */
static void int8_drafts_share_the_screened_heads_copy_and_draft_the_same_tokens(void **state) {
    (void)state;
    if (!moeq_engine_cpu_draft()) {
        print_message("SKIP: no int8 draft kernels on this CPU (%s)\n", moeq_engine_cpu_draft_describe());
        return;
    }
    size_t bytes[2], copy = 0;
    moeq_generate_stats st[2] = {{0}, {0}};
    int32_t *tokens[2], ids[12];
    int n_tokens[2];
    prompt(ids, 12, 7, V(g_agree));
    for (int off = 0; off < 2; off++) {
        moeq_engine_params p = moeq_engine_default_params();
        p.n_threads = 2, p.max_seqs = 16, p.max_step_tokens = 64, p.kv_cache_tokens = 2048, p.kv_block_tokens = 4;
        snprintf(p.head_screen, sizeof p.head_screen, "%s", off ? "off" : "auto");
        moeq_engine *e = NULL;
        char err[256] = "";
        assert_int_equal(moeq_engine_new(g_agree, &p, &e, err, sizeof err), MOEQ_OK);
        generate(e, ids, 12, 2, moeq_sampling_default_params(), 40, &tokens[off], &n_tokens[off], &st[off]);
        bytes[off] = moeq_mtp_draft_f8_bytes(e);
        const moeq_tensor *codes = moeq_forward_head_codes(e); /* NULL with head_screen = off */
        if (!off) {
            assert_non_null(codes);
            assert_ptr_equal(moeq_mtp_draft_head(e), codes);
            copy = codes->nbytes + codes->scale_inv->nbytes;
        } else {
            assert_null(codes);
            assert_non_null(moeq_mtp_draft_head(e));
            assert_false(moeq_mtp_head_is_lm_head(e)); /* its own int8 copy */
        }
        moeq_engine_destroy(e);
    }
    assert_true(copy > 0);
    assert_int_equal(bytes[1] - bytes[0], copy);
    assert_true(st[0].drafted > 0);
    assert_int_equal(st[0].drafted, st[1].drafted);
    assert_int_equal(st[0].accepted, st[1].accepted);
    assert_int_equal(n_tokens[0], n_tokens[1]);
    assert_memory_equal(tokens[0], tokens[1], (size_t)n_tokens[0] * sizeof(int32_t));
    free(tokens[0]);
    free(tokens[1]);
}

/* What one draft reads: more than the head alone, less than a main step (tiny: 3 main blocks, 1 MTP block). */
static void draft_bytes_count_the_mtp_block_and_its_head(void **state) {
    (void)state;
    const moeq_model_config *c = moeq_model_get_config(g_tiny);
    size_t head = (size_t)c->vocab_size * (size_t)c->hidden_size * 2; /* bf16 */
    size_t draft = moeq_model_mtp_active_bytes_per_token(g_tiny), step = moeq_model_active_bytes_per_token(g_tiny);
    assert_true(draft > head + (size_t)2 * c->hidden_size * c->hidden_size * 2); /* head + eh_proj + the block */
    assert_true(draft < step);
    assert_int_equal(moeq_model_mtp_active_bytes_per_token(NULL), 0);
    print_message("tiny: a draft reads %zu bytes, a step %zu (%.2f)\n", draft, step, (double)draft / (double)step);
}

static void mtp_calls_fail_cleanly_without_state_or_layer(void **state) {
    (void)state;
    moeq_engine *e = engine_for(g_v2, 64); /* tiny-v2 has no MTP layer */
    int a;
    assert_int_equal(moeq_engine_mtp_available(e), 0);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_set_mtp(e, a, 1), MOEQ_ERR_UNSUPPORTED);
    moeq_mtp_decoder *dec = NULL;
    assert_int_equal(moeq_mtp_decoder_new(e, 1, 1, &dec, NULL, 0), MOEQ_ERR_UNSUPPORTED);
    int32_t ids[3] = {1, 2, 3}, *out = NULL;
    int n_out = 0;
    moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = 4, .mtp_k = 1};
    assert_int_equal(moeq_generate(e, ids, 3, &gp, &out, &n_out, NULL, 0), MOEQ_ERR_UNSUPPORTED);
    moeq_engine_destroy(e);

    e = engine_for(g_tiny, 64);
    assert_int_equal(moeq_engine_mtp_available(e), 1);
    float *l = malloc((size_t)V(g_tiny) * 4);
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    moeq_step_item it = {a, ids, 3, 0};
    assert_int_equal(moeq_engine_step(e, &it, 1, l, 1, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_set_mtp(e, a, 1), MOEQ_ERR_INVALID_ARG); /* only before the first token */
    moeq_mtp_item mi = {a, 4};
    char err[256] = "";
    assert_int_equal(moeq_engine_mtp_step(e, &mi, 1, l, 1, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    int b;
    assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_set_mtp(e, b, 1), MOEQ_OK);
    moeq_step_item ib = {b, ids, 3, 0};
    assert_int_equal(moeq_engine_step(e, &ib, 1, l, 1, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_engine_mtp_seq_len(e, b), 2);
    assert_int_equal(moeq_engine_seq_truncate(e, b, 1), MOEQ_OK); /* below the last step's first token: no h_0 */
    mi.seq_id = b;
    assert_int_equal(moeq_engine_mtp_step(e, &mi, 1, l, 1, err, sizeof err), MOEQ_OK); /* h_0 is retained */
    assert_int_equal(moeq_engine_seq_truncate(e, b, 0), MOEQ_OK);
    assert_int_equal(moeq_engine_mtp_seq_len(e, b), 0);
    free(l);
    moeq_engine_destroy(e);
}

/* ---- cost and lazy entries ------------------------------------------------ */

/*
 * Regression (bench-mtp 1.52x): a round used to run the MTP block twice per
 * sequence — over all k + 1 verified positions inside the verify step, and
 * again for the drafts. Now a round's MTP work is the previous round's
 * accepted tokens (their entries were pending) plus the k drafts: nothing
 * on rejected positions, nothing twice.
 */
static void a_round_runs_the_mtp_block_once_per_accepted_token_and_draft(void **state) {
    (void)state;
    enum { S = 4, ROUNDS = 12 };
    int vocab = V(g_agree);
    moeq_engine *e = engine_for(g_agree, 64);
    moeq_spec_seq seqs[S];
    moeq_step_item items[S];
    int32_t ids[S][12];
    float *logits = malloc((size_t)S * vocab * sizeof(float));
    for (int i = 0; i < S; i++) {
        memset(&seqs[i], 0, sizeof seqs[i]);
        seqs[i].sampling = moeq_sampling_default_params();
        prompt(ids[i], 4 + i, 40 + i, vocab); /* shorter than the ring: nothing computed in the step */
        assert_int_equal(moeq_engine_seq_new(e, &seqs[i].seq_id), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, seqs[i].seq_id, 1), MOEQ_OK);
        items[i] = (moeq_step_item){seqs[i].seq_id, ids[i], 4 + i, 0};
    }
    assert_int_equal(moeq_engine_step(e, items, S, logits, S, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_mtp_rows_run(e), 0); /* a step only keeps rows: its entries are pending */
    for (int i = 0; i < S; i++) seqs[i].next_token = 1 + i;
    moeq_mtp_decoder *dec = NULL;
    assert_int_equal(moeq_mtp_decoder_new(e, S, 3, &dec, NULL, 0), MOEQ_OK);
    int64_t rejected = 0, prev_accepted[S];
    for (int round = 0; round < ROUNDS; round++) {
        int64_t expect = 0, before = moeq_mtp_rows_run(e);
        for (int i = 0; i < S; i++) {
            seqs[i].k = 1 + (i + round) % 3;
            /* pending: the prompt's entries 0 .. len - 2 in round 0, then the accepted drafts */
            expect += (round == 0 ? moeq_engine_seq_len(e, seqs[i].seq_id) - 1 : prev_accepted[i]) + seqs[i].k;
        }
        assert_int_equal(moeq_mtp_decode_step(dec, seqs, S, NULL, 0), MOEQ_OK);
        assert_int_equal(moeq_mtp_rows_run(e) - before, expect);
        for (int i = 0; i < S; i++) {
            prev_accepted[i] = seqs[i].n_out - 1;
            rejected += seqs[i].k - (seqs[i].n_out - 1);
        }
    }
    assert_true(rejected > 0); /* rejected positions were never run through the MTP block */
    moeq_mtp_decoder_destroy(dec);
    free(logits);
    moeq_engine_destroy(e);
}

/*
 * A draft keeps its first entry (true hidden, pending token) for the next
 * step; when that step appends another token the entry must be recomputed:
 * caches and the next draft equal a sequence that never drafted.
 */
static void a_draft_entry_is_recomputed_when_the_step_appends_another_token(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_agree, g_tiny};
    for (int mi = 0; mi < 2; mi++) {
        int vocab = V(models[mi]), a, b;
        moeq_engine *e = engine_for(models[mi], 64);
        int32_t ids[7], y = 11, x = 12;
        prompt(ids, 7, 3, vocab);
        float *la = malloc((size_t)2 * vocab * 4), *lb = malloc((size_t)vocab * 4);
        assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, a, 1), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, b, 1), MOEQ_OK);
        moeq_step_item both[2] = {{a, ids, 7, 0}, {b, ids, 7, 0}};
        assert_int_equal(moeq_engine_step(e, both, 2, la, 2, NULL, 0), MOEQ_OK);
        for (int round = 0; round < 3; round++) {
            moeq_mtp_item ma = {a, x};
            assert_int_equal(moeq_engine_mtp_step(e, &ma, 1, la, 1, NULL, 0), MOEQ_OK); /* drafted with x */
            ma.token = 13;
            assert_int_equal(moeq_engine_mtp_step(e, &ma, 1, la, 1, NULL, 0), MOEQ_OK); /* and chained */
            moeq_step_item sa = {a, &y, 1, 0}, sb = {b, &y, 1, 0};                       /* but y comes */
            assert_int_equal(moeq_engine_step(e, &sa, 1, la, 1, NULL, 0), MOEQ_OK);
            assert_int_equal(moeq_engine_step(e, &sb, 1, lb, 1, NULL, 0), MOEQ_OK);
            assert_memory_equal(la, lb, (size_t)vocab * 4);
            assert_caches_equal(e, a, b);
        }
        moeq_mtp_item ma = {a, x}, mb = {b, x};
        assert_int_equal(moeq_engine_mtp_step(e, &ma, 1, la, 1, NULL, 0), MOEQ_OK);
        assert_int_equal(moeq_engine_mtp_step(e, &mb, 1, lb, 1, NULL, 0), MOEQ_OK);
        assert_memory_equal(la, lb, (size_t)vocab * 4);
        free(la), free(lb);
        moeq_engine_destroy(e);
    }
}

/*
 * Pending entries pile up across steps (prompts in chunks, longer than the
 * ring of kept rows), and a draft of many such sequences has more rows than
 * max_step_tokens: it runs in several passes. Every draft row equals the
 * same sequence's draft made alone after a one-step prefill.
 */
static void drafts_with_many_pending_entries_match_drafts_after_a_plain_prefill(void **state) {
    (void)state;
    enum { S = 5 };
    int vocab = V(g_agree);
    moeq_engine *e = engine_for(g_agree, 12), *ref = engine_for(g_agree, 64);
    int lens[S] = {3, 9, 11, 20, 31}, seq[S], rseq[S];
    int32_t ids[S][31];
    float *logits = malloc((size_t)S * vocab * 4), *one = malloc((size_t)vocab * 4);
    moeq_mtp_item items[S];
    for (int i = 0; i < S; i++) {
        prompt(ids[i], lens[i], 60 + i, vocab);
        assert_int_equal(moeq_engine_seq_new(e, &seq[i]), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, seq[i], 1), MOEQ_OK);
        for (int t = 0, n; t < lens[i]; t += n) { /* chunks of 1..5 tokens */
            n = 1 + (t + i) % 5 < lens[i] - t ? 1 + (t + i) % 5 : lens[i] - t;
            moeq_step_item it = {seq[i], ids[i] + t, n, 0};
            assert_int_equal(moeq_engine_step(e, &it, 1, logits, 1, NULL, 0), MOEQ_OK);
        }
        assert_int_equal(moeq_engine_mtp_seq_len(e, seq[i]), lens[i] - 1);
        items[i] = (moeq_mtp_item){seq[i], 100 + i};
        assert_int_equal(moeq_engine_seq_new(ref, &rseq[i]), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(ref, rseq[i], 1), MOEQ_OK);
        moeq_step_item it = {rseq[i], ids[i], lens[i], 0};
        assert_int_equal(moeq_engine_step(ref, &it, 1, one, 1, NULL, 0), MOEQ_OK);
    }
    char err[256] = "";
    moeq_err rc = moeq_engine_mtp_step(e, items, S, logits, S, err, sizeof err);
    if (rc) fprintf(stderr, "mtp step: %s\n", err);
    assert_int_equal(rc, MOEQ_OK);
    for (int i = 0; i < S; i++) {
        moeq_mtp_item r = {rseq[i], 100 + i};
        assert_int_equal(moeq_engine_mtp_step(ref, &r, 1, one, 1, NULL, 0), MOEQ_OK);
        assert_memory_equal(logits + (size_t)i * vocab, one, (size_t)vocab * 4);
        assert_int_equal(moeq_engine_mtp_seq_len(e, seq[i]), lens[i]);
    }
    free(logits), free(one);
    moeq_engine_destroy(e);
    moeq_engine_destroy(ref);
}

/* ---- forks (moeq_engine_seq_fork) ---------------------------------------- */

enum { FORK_P = 23 }; /* prompt length: with blocks of 4, forks at block edges and inside blocks */

/* Step seq with toks[0..n) and check success; logits: the last row. */
static void step_ok(moeq_engine *e, int seq, const int32_t *toks, int n, float *logits) {
    char err[256] = "";
    moeq_step_item it = {seq, toks, n, 0};
    moeq_err rc = moeq_engine_step(e, &it, 1, logits, 1, err, sizeof err);
    if (rc) fprintf(stderr, "step of seq %d: %s\n", seq, err);
    assert_int_equal(rc, MOEQ_OK);
}

static int fork_ok(moeq_engine *e, int src, int n, int mtp, int32_t next_token) {
    char err[256] = "";
    int dst = -1;
    moeq_err rc = moeq_engine_seq_fork(e, src, n, mtp, next_token, &dst, err, sizeof err);
    if (rc) fprintf(stderr, "fork of seq %d at %d: %s\n", src, n, err);
    assert_int_equal(rc, MOEQ_OK);
    return dst;
}

/* own: src's first `shared` tokens, then another prompt's. */
static void fork_prompt(int32_t *own, const int32_t *src, int shared, int vocab) {
    prompt(own, FORK_P, 2, vocab);
    memcpy(own, src, (size_t)shared * sizeof(int32_t));
}

/* a and b step the same greedy tokens `steps` times from next; every step's logits equal bit for bit. */
static void decode_alike(moeq_engine *e, int a, int b, int32_t next, int steps, float *la, float *lb, int vocab) {
    for (int i = 0; i < steps; i++) {
        step_ok(e, a, &next, 1, la);
        step_ok(e, b, &next, 1, lb);
        assert_memory_equal(la, lb, (size_t)vocab * sizeof(float));
        next = moeq_sampler_argmax(la, vocab);
    }
}

/*
 * Unmarked forks of a 23-token prompt at n = 1, 4, 7, 8, 16, 22, 23 (block
 * edges and partial blocks): the fork steps the rest of its own prompt and
 * decodes; its logits equal a sequence prefilled with that prompt, bit for
 * bit. src is unchanged by the forks and by the forks' writes; src truncated
 * into a shared block and regrown (and the fork likewise) leaves the other
 * untouched; freeing returns every block.
 */
static void an_unmarked_fork_continues_like_a_sequence_prefilled_itself(void **state) {
    (void)state;
    const moeq_model *m = g_tiny;
    int vocab = V(m), src, ref, t = 7;
    moeq_engine *e = engine_for(m, 64);
    int32_t src_ids[FORK_P], own[FORK_P];
    prompt(src_ids, FORK_P, 1, vocab);
    float *l_src = malloc((size_t)vocab * 4), *l_t = malloc((size_t)vocab * 4), *la = malloc((size_t)vocab * 4),
          *lb = malloc((size_t)vocab * 4), *l_own = malloc((size_t)vocab * 4);
    assert_int_equal(moeq_engine_seq_new(e, &ref), MOEQ_OK); /* src's logits after token t, for later */
    step_ok(e, ref, src_ids, FORK_P, l_src);
    step_ok(e, ref, (int32_t[]){t}, 1, l_t);
    moeq_engine_seq_free(e, ref);
    assert_int_equal(moeq_engine_seq_new(e, &src), MOEQ_OK);
    step_ok(e, src, src_ids, FORK_P, la);
    assert_memory_equal(la, l_src, (size_t)vocab * 4);
    int64_t free0 = moeq_kv_cache_free_blocks(e->cache);
    const int ns[] = {1, 4, 7, 8, 16, 22, 23};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        int n = ns[i];
        fork_prompt(own, src_ids, n, vocab);
        int f = fork_ok(e, src, n, 0, 0);
        assert_int_equal(moeq_engine_seq_len(e, f), n);
        /* only a partial last block is copied */
        assert_int_equal(moeq_kv_cache_free_blocks(e->cache), free0 - (n % 4 ? 1 : 0));
        assert_int_equal(moeq_engine_seq_new(e, &ref), MOEQ_OK);
        step_ok(e, ref, own, FORK_P, l_own);
        if (n < FORK_P) step_ok(e, f, own + n, FORK_P - n, la);
        else memcpy(la, l_src, (size_t)vocab * 4);
        assert_memory_equal(la, l_own, (size_t)vocab * 4);
        decode_alike(e, f, ref, moeq_sampler_argmax(l_own, vocab), 3, la, lb, vocab);

        step_ok(e, src, (int32_t[]){t}, 1, la); /* src as before the fork */
        assert_memory_equal(la, l_t, (size_t)vocab * 4);
        /* src truncated into a block the fork shares (when n is a block edge) writes another token there */
        int32_t other[2] = {(src_ids[n - 1] + 1) % vocab, 3};
        assert_int_equal(moeq_engine_seq_truncate(e, src, n - 1), MOEQ_OK);
        step_ok(e, src, other, 2, la);
        decode_alike(e, f, ref, moeq_sampler_argmax(lb, vocab), 1, la, lb, vocab); /* the fork unchanged */
        assert_int_equal(moeq_engine_seq_truncate(e, src, n - 1), MOEQ_OK);
        step_ok(e, src, src_ids + n - 1, FORK_P - n + 1, la);
        assert_memory_equal(la, l_src, (size_t)vocab * 4);

        other[0] = (own[n - 1] + 1) % vocab; /* the fork's side likewise: src unchanged */
        assert_int_equal(moeq_engine_seq_truncate(e, f, n - 1), MOEQ_OK);
        step_ok(e, f, other, 2, la);
        step_ok(e, src, (int32_t[]){t}, 1, la);
        assert_memory_equal(la, l_t, (size_t)vocab * 4);
        assert_int_equal(moeq_engine_seq_truncate(e, src, FORK_P), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_truncate(e, f, n - 1), MOEQ_OK);
        step_ok(e, f, own + n - 1, FORK_P - n + 1, la);
        assert_memory_equal(la, l_own, (size_t)vocab * 4);
        moeq_engine_seq_free(e, f);
        moeq_engine_seq_free(e, ref);
        assert_int_equal(moeq_kv_cache_free_blocks(e->cache), free0); /* nothing leaked, nothing freed twice */
    }
    free(l_src), free(l_t), free(la), free(lb), free(l_own);
    moeq_engine_destroy(e);
}

/*
 * Greedy MTP rounds on a (seq, ref) pair in one decoder until each has n_tokens new tokens: the tokens are
 * `plain`'s, and after every round both caches (main and MTP) hold the same bits.
 */
static void spec_rounds_alike(moeq_engine *e, moeq_spec_seq pair[2], const int32_t *plain, int n_tokens, int k0) {
    moeq_mtp_decoder *dec = NULL;
    assert_int_equal(moeq_mtp_decoder_new(e, 2, 3, &dec, NULL, 0), MOEQ_OK);
    int got = 1; /* next_token is plain[0] */
    for (int round = 0; got < n_tokens; round++) {
        pair[0].k = pair[1].k = 1 + (k0 + round) % 3;
        char err[256] = "";
        moeq_err rc = moeq_mtp_decode_step(dec, pair, 2, err, sizeof err);
        if (rc) fprintf(stderr, "round %d: %s\n", round, err);
        assert_int_equal(rc, MOEQ_OK);
        assert_int_equal(pair[0].n_out, pair[1].n_out);
        for (int j = 0; j < pair[0].n_out && got < n_tokens; j++, got++) {
            assert_int_equal(pair[0].out[j], plain[got]);
            assert_int_equal(pair[1].out[j], plain[got]);
        }
        assert_caches_equal(e, pair[0].seq_id, pair[1].seq_id);
    }
    moeq_mtp_decoder_destroy(dec);
}

/*
 * Marked forks (mtp = 1) at n = 1 .. 22 of a marked 23-token prompt whose
 * entries 14..21 are still pending (computed by the fork): the fork steps
 * the rest of its own prompt (the token at n is src's), its caches equal a
 * fresh marked sequence prefilled with that prompt, and greedy MTP rounds
 * (k = 1..3) give plain greedy decoding's tokens with both caches equal
 * after every round. Then src, truncated into an MTP block a fork still
 * shares, writes other entries there and is regrown: both sides stay equal
 * to their references.
 */
static void a_marked_fork_drafts_like_a_sequence_prefilled_itself(void **state) {
    (void)state;
    const moeq_model *models[2] = {g_agree, g_tiny};
    enum { N = 14 };
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = models[mi];
        int vocab = V(m), src, src_ref, keep_f = -1, keep_r = -1;
        moeq_engine *e = engine_for(m, 64);
        int32_t src_ids[FORK_P], own[FORK_P], *plain = NULL;
        int n_plain = 0;
        prompt(src_ids, FORK_P, 1, vocab);
        float *la = malloc((size_t)vocab * 4), *lb = malloc((size_t)vocab * 4);
        assert_int_equal(moeq_engine_seq_new(e, &src), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, src, 1), MOEQ_OK);
        step_ok(e, src, src_ids, FORK_P, la);
        const int ns[] = {1, 4, 7, 8, 14, 16, 21, 22};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            int n = ns[i], ref;
            fork_prompt(own, src_ids, n + 1, vocab); /* the token at n is src's: next_token */
            generate(e, own, FORK_P, 0, moeq_sampling_default_params(), N, &plain, &n_plain, NULL);
            int f = fork_ok(e, src, n, 1, own[n]);
            assert_int_equal(moeq_engine_mtp_seq_len(e, f), n);
            assert_int_equal(moeq_engine_mtp_seq_len(e, src), FORK_P - 1);
            assert_int_equal(moeq_engine_seq_new(e, &ref), MOEQ_OK);
            assert_int_equal(moeq_engine_seq_set_mtp(e, ref, 1), MOEQ_OK);
            step_ok(e, f, own + n, FORK_P - n, la);
            step_ok(e, ref, own, FORK_P, lb);
            assert_memory_equal(la, lb, (size_t)vocab * 4);
            assert_int_equal(moeq_sampler_argmax(la, vocab), plain[0]);
            assert_caches_equal(e, f, ref);
            moeq_sampling_params greedy = moeq_sampling_default_params();
            moeq_spec_seq pair[2] = {{.seq_id = f, .next_token = plain[0], .sampling = greedy},
                                     {.seq_id = ref, .next_token = plain[0], .sampling = greedy}};
            spec_rounds_alike(e, pair, plain, N, n);
            free(plain);
            if (n == 16) { /* kept: it shares src's MTP blocks 0..3 */
                keep_f = f, keep_r = ref;
                continue;
            }
            moeq_engine_seq_free(e, f);
            moeq_engine_seq_free(e, ref);
        }
        assert_int_equal(moeq_engine_seq_new(e, &src_ref), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, src_ref, 1), MOEQ_OK);
        step_ok(e, src_ref, src_ids, FORK_P, lb);
        assert_caches_equal(e, src, src_ref); /* the forks changed nothing in src */
        /* src's MTP entries truncated to 14, inside block 3 that the n = 16 fork shares; entries 14, 15 are
           then computed from other tokens (moeq_mtp_cache_entry computes pending entries) */
        int32_t other[2] = {(src_ids[15] + 1) % vocab, 5};
        assert_int_equal(moeq_engine_seq_truncate(e, src, 15), MOEQ_OK);
        step_ok(e, src, other, 2, la);
        assert_non_null(moeq_mtp_cache_entry(e, src, 15));
        assert_caches_equal(e, keep_f, keep_r);
        assert_int_equal(moeq_engine_seq_truncate(e, src, 15), MOEQ_OK);
        step_ok(e, src, src_ids + 15, FORK_P - 15, la);
        assert_memory_equal(la, lb, (size_t)vocab * 4);
        assert_caches_equal(e, src, src_ref); /* computes entries 14.. into the copied block */
        assert_caches_equal(e, keep_f, keep_r);
        generate(e, src_ids, FORK_P, 0, moeq_sampling_default_params(), N, &plain, &n_plain, NULL);
        moeq_sampling_params greedy = moeq_sampling_default_params();
        moeq_spec_seq pair[2] = {{.seq_id = src, .next_token = plain[0], .sampling = greedy},
                                 {.seq_id = src_ref, .next_token = plain[0], .sampling = greedy}};
        spec_rounds_alike(e, pair, plain, N, 0);
        free(plain);
        free(la), free(lb);
        moeq_engine_destroy(e);
    }
}

static void expect_fork_error(moeq_engine *e, int src, int n, int mtp, int32_t next_token, moeq_err want) {
    char err[256] = "";
    int dst = -7, probe;
    int64_t free0 = moeq_kv_cache_free_blocks(e->cache);
    assert_int_equal(moeq_engine_seq_fork(e, src, n, mtp, next_token, &dst, err, sizeof err), want);
    assert_true(err[0] != 0); /* names the cause */
    assert_int_equal(dst, -7);
    assert_int_equal(moeq_kv_cache_free_blocks(e->cache), free0);
    if (moeq_engine_seq_new(e, &probe) == MOEQ_OK) { /* no slot was kept */
        assert_int_equal(moeq_engine_seq_len(e, probe), 0);
        moeq_engine_seq_free(e, probe);
    }
}

/*
 * Bad forks are refused and change nothing: n out of range, mtp = 1 with n
 * = src's length, mtp = 1 of an unmarked sequence, a dead src, no free slot,
 * no block for the copy. A marked fork whose first step appends another
 * token than next_token is refused at that step, untouched, and then steps
 * with the right one like a sequence prefilled itself.
 */
static void forks_refuse_bad_arguments_and_change_nothing(void **state) {
    (void)state;
    const moeq_model *m = g_tiny;
    int vocab = V(m), plain, marked, f;
    moeq_engine *e = engine_for(m, 64);
    int32_t ids[6];
    prompt(ids, 6, 4, vocab);
    float *la = malloc((size_t)vocab * 4), *lb = malloc((size_t)vocab * 4);
    assert_int_equal(moeq_engine_seq_new(e, &plain), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(e, &marked), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_set_mtp(e, marked, 1), MOEQ_OK);
    step_ok(e, plain, ids, 6, la);
    step_ok(e, marked, ids, 6, lb);
    expect_fork_error(e, plain, 0, 0, 0, MOEQ_ERR_INVALID_ARG);
    expect_fork_error(e, plain, 7, 0, 0, MOEQ_ERR_INVALID_ARG);
    expect_fork_error(e, marked, 6, 1, ids[5], MOEQ_ERR_INVALID_ARG); /* no token at 6 for entry 5 */
    expect_fork_error(e, plain, 3, 1, ids[3], MOEQ_ERR_INVALID_ARG);  /* unmarked */
    expect_fork_error(e, marked, 3, 2, ids[3], MOEQ_ERR_INVALID_ARG);
    expect_fork_error(e, marked, 3, 1, vocab, MOEQ_ERR_INVALID_ARG);
    expect_fork_error(e, 9, 1, 0, 0, MOEQ_ERR_INVALID_ARG); /* not alive */
    assert_int_equal(moeq_engine_seq_fork(e, plain, 3, 0, 0, NULL, NULL, 0), MOEQ_ERR_INVALID_ARG);

    f = fork_ok(e, plain, 6, 0, 0); /* the whole of an unmarked src */
    moeq_engine_seq_free(e, f);
    f = fork_ok(e, marked, 4, 0, 0); /* mtp = 0: not marked, whatever src is */
    assert_false(moeq_mtp_seq_on(e, f));
    moeq_engine_seq_free(e, f);

    f = fork_ok(e, marked, 3, 1, ids[3]);
    int32_t wrong[3] = {(ids[3] + 1) % vocab, ids[4], ids[5]};
    char err[256] = "";
    int64_t free0 = moeq_kv_cache_free_blocks(e->cache);
    moeq_step_item it = {f, wrong, 3, 0};
    assert_int_equal(moeq_engine_step(e, &it, 1, la, 1, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "next_token"));
    assert_int_equal(moeq_engine_seq_len(e, f), 3);
    assert_int_equal(moeq_engine_mtp_seq_len(e, f), 3);
    assert_int_equal(moeq_kv_cache_free_blocks(e->cache), free0);
    step_ok(e, f, ids + 3, 3, la);
    assert_memory_equal(la, lb, (size_t)vocab * 4);
    assert_caches_equal(e, f, marked);
    moeq_engine_seq_free(e, f);

    int filler[16], n_fill = 0; /* every slot taken */
    while (moeq_engine_seq_new(e, &filler[n_fill]) == MOEQ_OK) n_fill++;
    expect_fork_error(e, plain, 3, 0, 0, MOEQ_ERR_LIMIT);
    for (int i = 0; i < n_fill; i++) moeq_engine_seq_free(e, filler[i]);
    free(la), free(lb);
    moeq_engine_destroy(e);

    moeq_engine_params p = moeq_engine_default_params(); /* a cache of two blocks */
    p.n_threads = 2, p.max_seqs = 4, p.kv_block_tokens = 4, p.kv_cache_tokens = 8;
    assert_int_equal(moeq_engine_new(m, &p, &e, NULL, 0), MOEQ_OK);
    la = malloc((size_t)vocab * 4);
    assert_int_equal(moeq_engine_seq_new(e, &plain), MOEQ_OK);
    step_ok(e, plain, ids, 6, la);
    expect_fork_error(e, plain, 5, 0, 0, MOEQ_ERR_LIMIT); /* no block for the copy of positions 4..5 */
    f = fork_ok(e, plain, 4, 0, 0);                       /* a full block: shared, nothing to copy */
    moeq_step_item grow = {f, ids + 4, 1, 0};
    assert_int_equal(moeq_engine_step(e, &grow, 1, la, 1, err, sizeof err), MOEQ_ERR_LIMIT); /* a new block */
    assert_int_equal(moeq_engine_seq_len(e, f), 4);
    free(la);
    moeq_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_with_mtp_gives_the_same_tokens_as_without),
        cmocka_unit_test(mixed_batches_accept_different_counts_and_match_plain_decoding),
        cmocka_unit_test(rollback_leaves_both_caches_as_if_rejected_tokens_were_never_drafted),
        cmocka_unit_test(sampled_decoding_with_mtp_in_exact_mode_gives_the_plain_samplers_tokens),
        cmocka_unit_test(sampling_with_mtp_follows_the_model_distribution),
        cmocka_unit_test(the_chi_square_check_rejects_a_different_distribution),
        cmocka_unit_test(mtp_calls_fail_cleanly_without_state_or_layer),
        cmocka_unit_test(draft_bytes_count_the_mtp_block_and_its_head),
        cmocka_unit_test(an_mtp_head_that_copies_lm_head_is_not_read_twice),
        cmocka_unit_test(int8_drafts_share_the_screened_heads_copy_and_draft_the_same_tokens),
        cmocka_unit_test(f8_drafts_emit_the_plain_tokens_and_are_accepted_like_exact_ones),
        cmocka_unit_test(ordinary_items_in_the_verify_step_give_the_bits_of_separate_steps),
        cmocka_unit_test(a_round_runs_the_mtp_block_once_per_accepted_token_and_draft),
        cmocka_unit_test(a_draft_entry_is_recomputed_when_the_step_appends_another_token),
        cmocka_unit_test(drafts_with_many_pending_entries_match_drafts_after_a_plain_prefill),
        cmocka_unit_test(an_unmarked_fork_continues_like_a_sequence_prefilled_itself),
        cmocka_unit_test(a_marked_fork_drafts_like_a_sequence_prefilled_itself),
        cmocka_unit_test(forks_refuse_bad_arguments_and_change_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
