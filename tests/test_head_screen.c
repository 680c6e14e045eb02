/*
 * test_head_screen.c — the screened lm_head (engine/head_screen.h, engine key head_screen): its bound holds
 * for every exact path and weight dtype, its candidates always hold the exact argmax (near-ties, outliers,
 * non-finite weights and activations), and through the engine a greedy row's record is the whole row's argmax
 * and value, bit for bit, at every batch size and mix of row readers, on BF16, F8 and V2 checkpoints.
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

#include "backend.h"
#include "engine_test_util.h"
#include "head_screen.h"
#include "moeq/engine.h"
#include "ops_amx.h"
#include "ops_draft.h"
#include "sampler.h"
#include "tensor.h"

static uint64_t rng_state = 7;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
}

/* A head of rows x cols values v in dtype (F8: block scales of 1/448 .. 3/448), data owned by the caller. */
typedef struct head {
    moeq_tensor t, scale;
    void *data;
    float *sdata;
} head;

static void head_make(head *h, moeq_dtype dt, int rows, int cols, const float *v) {
    memset(h, 0, sizeof *h);
    size_t n = (size_t)rows * cols;
    int rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    h->data = malloc(n * moeq_dtype_size(dt));
    h->t = (moeq_tensor){.name = "lm_head.weight", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = h->data,
                         .nbytes = n * moeq_dtype_size(dt)};
    if (dt == MOEQ_DTYPE_F8_E4M3) {
        h->sdata = malloc((size_t)rb * cb * sizeof(float));
        for (int i = 0; i < rb * cb; i++) h->sdata[i] = 1.0f / 448.0f * (float)(1 + i % 3);
        h->scale = (moeq_tensor){.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {rb, cb},
                                 .data = h->sdata, .nbytes = (size_t)rb * cb * 4};
        h->t.scale_inv = &h->scale;
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            switch (dt) {
            case MOEQ_DTYPE_F32: ((float *)h->data)[i] = v[i]; break;
            case MOEQ_DTYPE_BF16: ((uint16_t *)h->data)[i] = moeq_f32_to_bf16(v[i]); break;
            case MOEQ_DTYPE_F16: ((uint16_t *)h->data)[i] = moeq_f32_to_f16(v[i]); break;
            case MOEQ_DTYPE_F8_E4M3:
                ((uint8_t *)h->data)[i] = moeq_f32_to_f8_e4m3(v[i] / h->sdata[(r / 128) * cb + c / 128]);
                break;
            case MOEQ_DTYPE_Q8R: break;
            }
        }
}

static void head_free(head *h) {
    free(h->data);
    free(h->sdata);
}

static moeq_backend *cpu(int amx, int cols) {
    moeq_backend_cpu_params bp = {.n_threads = 2, .batch_invariant = 1, .max_k = cols, .max_ctx = 16,
                                  .max_jobs = 8, .amx = amx};
    moeq_backend *b = moeq_backend_cpu_new(&bp);
    assert_non_null(b);
    return b;
}

/* Tokens of several kinds: uniform, outlier channels (x300), one huge value, tiny values, a constant row. */
static float *tokens(int T, int cols) {
    float *x = malloc((size_t)T * cols * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < cols; k++) {
            float v = frand();
            switch (t % 5) {
            case 1: v *= k % 61 == 3 ? 300.0f : 1.0f; break;
            case 2: v = k == 7 ? 5e4f : v; break;
            case 3: v *= 1e-25f; break;
            case 4: v = 0.75f; break;
            }
            x[(size_t)t * cols + k] = v;
        }
    return x;
}

/* |approx - exact| <= the bound, for every row, token, weight dtype and exact path (the float32 lanes, and
 * AMX tiles where the CPU has them), in both passes (the hi codes alone, and the split codes); the worst
 * ratio is printed (how loose Cauchy-Schwarz leaves it). */
static void the_bound_holds_on_every_exact_path_and_dtype(void **state) {
    (void)state;
    static const moeq_dtype dts[] = {MOEQ_DTYPE_F32, MOEQ_DTYPE_BF16, MOEQ_DTYPE_F16, MOEQ_DTYPE_F8_E4M3};
    static const int colss[] = {64, 1000, 2048};
    const int rows = 300, T = 10;
    for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
        int cols = colss[ci];
        float *v = malloc((size_t)rows * cols * sizeof(float));
        for (size_t i = 0; i < (size_t)rows * cols; i++) v[i] = frand() * 0.05f;
        for (int k = 0; k < cols; k++) v[5 * cols + k] *= 40.0f;       /* a row of large weights */
        for (int k = 0; k < cols; k += 17) v[9 * cols + k] = 1.5f;     /* a row with spikes */
        float *x = tokens(T, cols), *ya = malloc((size_t)T * rows * 4), *ye = malloc((size_t)T * rows * 4);
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            head h;
            head_make(&h, dts[di], rows, cols, v);
            moeq_head_screen *s = NULL;
            char err[128];
            assert_int_equal(moeq_head_screen_new(&h.t, &s, err, sizeof err), MOEQ_OK);
            for (int pass = 0; pass < 2 * (1 + moeq_amx_supported()); pass++) {
                const int amx = pass / 2, hi_only = pass % 2;
                moeq_backend *b = cpu(amx, cols);
                moeq_mm_job ja = {moeq_head_screen_codes(s, hi_only), 0, rows, x, cols, ya, rows, T};
                moeq_mm_job je = {&h.t, 0, rows, x, cols, ye, rows, T};
                b->matmul(b, &ja, 1);
                b->matmul(b, &je, 1);
                double worst = 0;
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < rows; r++) {
                        double bound = moeq_head_screen_bound(s, x + (size_t)t * cols, r, hi_only);
                        double e = fabs((double)ya[t * rows + r] - (double)ye[t * rows + r]);
                        if (!(e <= bound))
                            fail_msg("dtype %s cols %d amx %d hi_only %d token %d row %d: |%g - %g| = %g > %g",
                                     moeq_dtype_name(dts[di]), cols, amx, hi_only, t, r, ya[t * rows + r],
                                     ye[t * rows + r], e, bound);
                        worst = e / bound > worst ? e / bound : worst;
                    }
                print_message("%s, %d columns, %s, %s: worst error %.3f of the bound\n", moeq_dtype_name(dts[di]),
                              cols, amx ? "amx" : "lanes", hi_only ? "hi codes alone" : "split codes", worst);
                moeq_backend_destroy(b);
            }
            moeq_head_screen_destroy(s);
            head_free(&h);
        }
        free(v), free(x), free(ya), free(ye);
    }
}

/* The exact argmax of a token: the lowest id of the highest value. */
static int32_t exact_argmax(const float *row, int n) { return moeq_sampler_argmax(row, n); }

/* The exact argmax (over the finite rows: not nan_row) and every row tied with it, and nan_row, are in ids. */
static void assert_holds_the_argmax(const int32_t *ids, int64_t n, const float *exact, int rows, int nan_row) {
    float best = -INFINITY;
    for (int r = 0; r < rows; r++)
        if (r != nan_row && exact[r] > best) best = exact[r];
    int has_nan_row = 0;
    for (int r = 0; r < rows; r++) {
        int in = 0;
        for (int64_t c = 0; c < n && !in; c++) in = ids[c] == r;
        if (r == nan_row) has_nan_row = in;
        else if (exact[r] == best) assert_true(in);
    }
    assert_true(has_nan_row);
    for (int64_t c = 1; c < n; c++) assert_true(ids[c] > ids[c - 1]);
}

/*
 * Near-ties: rows that are copies of one row with a few weights nudged by one BF16 step, so the exact values
 * differ by less than the int8 copy can see. Whatever the token, the candidates hold the exact argmax and
 * every row tied with it, in each pass: the first (hi codes alone), the split codes over every row, and the
 * split codes among the first pass's candidates (refine, as the engine runs them); rows with a NaN weight are
 * always candidates; a NaN or infinite activation, or more candidates than the cap, gives 0 (the row is then
 * made whole).
 */
static void candidates_always_hold_the_exact_argmax(void **state) {
    (void)state;
    const int rows = 700, cols = 256, T = 40;
    float *v = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) v[i] = frand() * 0.1f;
    for (int r = 100; r < 164; r++) /* a block of 64 near-copies of row 99 */
        for (int k = 0; k < cols; k++)
            v[(size_t)r * cols + k] = v[99 * cols + k] * (k == r % cols ? 1.0078125f : 1.0f);
    for (int k = 0; k < cols; k++) v[300 * cols + k] = v[99 * cols + k]; /* an exact tie with row 99 */
    v[400 * cols + 3] = NAN;
    head h;
    head_make(&h, MOEQ_DTYPE_BF16, rows, cols, v);
    moeq_head_screen *s = NULL;
    char err[128];
    assert_int_equal(moeq_head_screen_new(&h.t, &s, err, sizeof err), MOEQ_OK);
    moeq_backend *b = cpu(moeq_amx_supported(), cols);
    float *x = tokens(T, cols), *ya = malloc((size_t)T * rows * 4), *ye = malloc((size_t)T * rows * 4);
    for (int t = 0; t < T; t += 2) /* every other token points at row 99's block */
        for (int k = 0; k < cols; k++) x[(size_t)t * cols + k] = moeq_bf16_to_f32(((uint16_t *)h.data)[99 * cols + k]);
    float *yh = malloc((size_t)T * rows * 4), *yr = malloc((size_t)rows * 4);
    moeq_mm_job ja = {moeq_head_screen_codes(s, 0), 0, rows, x, cols, ya, rows, T};
    moeq_mm_job jh = {moeq_head_screen_codes(s, 1), 0, rows, x, cols, yh, rows, T};
    moeq_mm_job je = {&h.t, 0, rows, x, cols, ye, rows, T};
    b->matmul(b, &ja, 1);
    b->matmul(b, &jh, 1);
    b->matmul(b, &je, 1);
    int32_t ids[512], first[rows], refined[512];
    int decided = 0, decided_first = 0;
    int64_t n_split = 0, n_first = 0, n_refined = 0;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * cols, *et = ye + (size_t)t * rows;
        int64_t n = moeq_head_screen_candidates(s, xt, ya + (size_t)t * rows, ids, 512, 0);
        if (n) assert_holds_the_argmax(ids, n, et, rows, 400), decided++, n_split += n;
        int64_t nf = moeq_head_screen_candidates(s, xt, yh + (size_t)t * rows, first, rows, 1);
        if (!nf) continue;
        decided_first++;
        assert_holds_the_argmax(first, nf, et, rows, 400);
        for (int64_t c = 0; c < nf; c++) yr[c] = ya[(size_t)t * rows + first[c]]; /* the split codes' values */
        int64_t nr = moeq_head_screen_refine(s, xt, first, yr, nf, refined, 512);
        assert_true(nr > 0 && nr <= nf);
        assert_holds_the_argmax(refined, nr, et, rows, 400);
        n_first += nf, n_refined += nr;
    }
    print_message("near-ties: %d of %d tokens decided within 512 candidates (%.1f a token); hi codes alone: %d "
                  "(%.1f a token, %.1f after refining)\n", decided, T, (double)n_split / decided, decided_first,
                  (double)n_first / decided_first, (double)n_refined / decided_first);
    assert_true(decided >= T / 2 && decided_first >= T / 2);
    /* more candidates than the cap (the block of 64 near-copies): undecided */
    assert_int_equal(moeq_head_screen_candidates(s, x, ya, ids, 8, 0), 0);
    assert_int_equal(moeq_head_screen_candidates(s, x, yh, ids, 8, 1), 0);
    int64_t nf = moeq_head_screen_candidates(s, x, yh, first, rows, 1);
    for (int64_t c = 0; c < nf; c++) yr[c] = ya[first[c]];
    assert_int_equal(moeq_head_screen_refine(s, x, first, yr, nf, refined, 8), 0);
    for (int hi_only = 0; hi_only < 2; hi_only++) {
        x[3] = NAN;
        assert_int_equal(moeq_head_screen_candidates(s, x, hi_only ? yh : ya, ids, 512, hi_only), 0);
        assert_int_equal(moeq_head_screen_refine(s, x, first, yr, nf, refined, 512), 0);
        x[3] = INFINITY;
        assert_int_equal(moeq_head_screen_candidates(s, x, hi_only ? yh : ya, ids, 512, hi_only), 0);
    }
    free(yh), free(yr);
    (void)exact_argmax;
    moeq_backend_destroy(b);
    moeq_head_screen_destroy(s);
    head_free(&h);
    free(v), free(x), free(ya), free(ye);
}

/* ---- through the engine ---------------------------------------------------- */

#define N_MODELS 4
static char g_dir[256];
static moeq_model *g_models[N_MODELS];
static const char *g_names[N_MODELS] = {"tiny bf16", "tiny f8", "tiny-v2 bf16", "tiny bf16, outlier channel"};
static moeq_tensor g_norm; /* the last model's final norm: channel 5 x 300 */
static uint16_t *g_norm_data;

/*
 * The outlier model: one channel of the final norm 300x the others', so every token's normed state has one
 * value far above the rest. The hi codes' step (max |x| / 127) then dwarfs the other values and the first
 * pass leaves most rows as candidates: the engine's second pass (the split codes on those rows) decides.
 */
static int outlier_norm(moeq_model *m) {
    const moeq_tensor *n = m->norm;
    if (!n || n->dtype != MOEQ_DTYPE_BF16) return -1;
    int64_t D = n->shape[0];
    if (!(g_norm_data = malloc((size_t)D * 2))) return -1;
    memcpy(g_norm_data, n->data, (size_t)D * 2);
    g_norm_data[5] = moeq_f32_to_bf16(moeq_bf16_to_f32(g_norm_data[5]) * 300.0f);
    g_norm = *n;
    g_norm.data = g_norm_data;
    m->norm = &g_norm;
    return 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/moeq-test-screen-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    g_models[0] = moeq_test_gen_and_load(g_dir, "tiny", "bf16", "tiny");
    g_models[1] = moeq_test_gen_and_load(g_dir, "tiny", "f8", "tiny-f8");
    g_models[2] = moeq_test_gen_and_load(g_dir, "tiny-v2", "bf16", "tiny-v2");
    g_models[3] = moeq_test_gen_and_load(g_dir, "tiny", "bf16", "tiny-outlier");
    for (int i = 0; i < N_MODELS; i++)
        if (!g_models[i]) return -1;
    return outlier_norm(g_models[3]);
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < N_MODELS; i++) moeq_model_destroy(g_models[i]);
    free(g_norm_data);
    return moeq_test_remove_dir(g_dir);
}

static moeq_engine *engine_with(const moeq_model *m, const char *screen) {
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = 2;
    p.max_seqs = 48;
    p.kv_cache_tokens = 4096;
    snprintf(p.head_screen, sizeof p.head_screen, "%s", screen);
    moeq_engine *e = NULL;
    char err[256] = "";
    moeq_err rc = moeq_engine_new(m, &p, &e, err, sizeof err);
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, MOEQ_OK);
    return e;
}

/*
 * B sequences stepped together (prompts of 1-5 tokens, then greedy decode steps), once with head_screen = auto
 * and records, once with every row whole: row r's reader is, by r % 4, nobody (records only), a greedy sampler,
 * a sampler at temperature 0.8 (needs the row) or use.full. An argmax-only row comes back as a record (the CPU
 * has the int8 kernels) whose argmax, finiteness and max are the whole row's, bit for bit; every other row is
 * whole and equal. Batches of 1, 7, 32 and 45 (past the screen's 32-row chunk).
 */
static void greedy_records_are_the_whole_rows_argmax_and_value(void **state) {
    (void)state;
    static const int batches[] = {1, 7, 32, 45};
    for (int mi = 0; mi < N_MODELS; mi++) {
        const moeq_model *m = g_models[mi];
        int V = moeq_test_vocab(m);
        moeq_engine *es = engine_with(m, "auto"), *ew = engine_with(m, "off");
        moeq_sampling_params greedy = moeq_sampling_default_params(), hot = greedy;
        hot.temperature = 0.8, hot.seed = 3;
        moeq_sampler *sg = NULL, *sh = NULL;
        assert_int_equal(moeq_sampler_new(&greedy, V, &sg), MOEQ_OK);
        assert_int_equal(moeq_sampler_new(&hot, V, &sh), MOEQ_OK);
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            int B = batches[bi];
            int seq_s[48], seq_w[48];
            int32_t ids[48 * 5];
            moeq_step_item is[48], iw[48];
            float *ls = malloc((size_t)B * V * 4), *lw = malloc((size_t)B * V * 4);
            moeq_logits_record *rec = malloc((size_t)B * sizeof *rec);
            uint8_t have[48];
            moeq_row_use use[48];
            for (int r = 0; r < B; r++) {
                assert_int_equal(moeq_engine_seq_new(es, &seq_s[r]), MOEQ_OK);
                assert_int_equal(moeq_engine_seq_new(ew, &seq_w[r]), MOEQ_OK);
                int n = 1 + r % 5;
                moeq_test_prompt(ids + r * 5, n, r + 11 * (int)bi, V);
                is[r] = (moeq_step_item){seq_s[r], ids + r * 5, n, 0};
                iw[r] = (moeq_step_item){seq_w[r], ids + r * 5, n, 0};
                use[r] = (moeq_row_use){r % 4 == 1 ? sg : r % 4 == 2 ? sh : NULL, 0, r % 4 == 3};
            }
            for (int step = 0; step < 3; step++) {
                char err[256] = "";
                moeq_step_out out = {ls, (size_t)B, rec, use, have};
                assert_int_equal(moeq_engine_step_out(es, is, B, &out, err, sizeof err), MOEQ_OK);
                assert_int_equal(moeq_engine_step(ew, iw, B, lw, (size_t)B, err, sizeof err), MOEQ_OK);
                for (int r = 0; r < B; r++) {
                    const float *want = lw + (size_t)r * V;
                    int32_t am = moeq_sampler_argmax(want, V);
                    if (r % 4 <= 1 && moeq_engine_cpu_draft()) { /* read for the argmax alone: a record */
                        assert_int_equal(have[r], 0);
                        assert_int_equal(rec[r].argmax, am);
                        assert_int_equal(rec[r].finite, 1);
                        assert_int_equal(rec[r].n_top, 0);
                        assert_memory_equal(&rec[r].max, &want[am], sizeof(float));
                    } else {
                        assert_int_equal(have[r], 1);
                        assert_memory_equal(ls + (size_t)r * V, want, (size_t)V * sizeof(float));
                    }
                    ids[r * 5] = am; /* greedy: both engines go on with the whole row's argmax */
                    is[r] = (moeq_step_item){seq_s[r], ids + r * 5, 1, 0};
                    iw[r] = (moeq_step_item){seq_w[r], ids + r * 5, 1, 0};
                }
            }
            for (int r = 0; r < B; r++) moeq_engine_seq_free(es, seq_s[r]), moeq_engine_seq_free(ew, seq_w[r]);
            free(ls), free(lw), free(rec);
        }
        moeq_head_screen_stats st = moeq_engine_head_screen_stats(es), off = moeq_engine_head_screen_stats(ew);
        print_message("%s: %lld rows screened, %.2f candidates a row, %lld made whole, %lld refined, %zu bytes\n",
                      g_names[mi], (long long)st.rows, st.rows ? (double)st.candidates / (double)st.rows : 0.0,
                      (long long)st.fallbacks, (long long)st.refined, st.bytes);
        if (moeq_engine_cpu_draft()) {
            assert_true(st.rows > 0 && st.bytes > 0);
            assert_string_equal(st.state, "on");
            if (mi == 3) assert_true(st.refined > 0); /* the second pass ran, and its records were checked */
        } else {
            print_message("SKIP the screen itself (no int8 draft kernels here): %s\n",
                          moeq_engine_cpu_draft_describe());
            assert_non_null(strstr(st.state, "no int8 kernels"));
        }
        assert_true(off.rows == 0 && off.bytes == 0);
        assert_string_equal(off.state, "off (head_screen = off)");
        moeq_sampler_destroy(sg), moeq_sampler_destroy(sh);
        moeq_engine_destroy(es), moeq_engine_destroy(ew);
    }
}

/* An engine key that is neither auto nor off is refused at creation, naming the choices. */
static void an_unknown_head_screen_value_is_refused(void **state) {
    (void)state;
    moeq_engine_params p = moeq_engine_default_params();
    snprintf(p.head_screen, sizeof p.head_screen, "fast");
    moeq_engine *e = NULL;
    char err[256] = "";
    assert_int_equal(moeq_engine_new(g_models[0], &p, &e, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "auto and off"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_bound_holds_on_every_exact_path_and_dtype),
        cmocka_unit_test(candidates_always_hold_the_exact_argmax),
        cmocka_unit_test(greedy_records_are_the_whole_rows_argmax_and_value),
        cmocka_unit_test(an_unknown_head_screen_value_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
