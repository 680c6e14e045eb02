/*
 * test_engine_ops.c — the engine's parts that need no model: matrix kernels
 * (vs their scalar emulation, vs OpenBLAS, batch invariance, exact
 * widening, every instruction set against the emulation), the engine
 * params' property table, RoPE/YaRN, routing, the gather plan, the paged cache, the
 * sampler and the worker pool.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/config.h"
#include "moeq/engine.h"

#include "backend.h"
#include "attention.h"
#include "attention_amx.h"
#include "backend_pool.h"
#include "kv_blocks.h"
#include "kv_cache.h"
#include "moe.h"
#include "moe_route.h"
#include "ops.h"
#include "ops_amx.h"
#include "ops_draft.h"
#include "ops_matmul.h"
#include "cpu_tuning.h"
#include "rope.h"
#include "sampler.h"

/* ---- synthetic weights ----------------------------------------------------- */

typedef struct fake_weight {
    moeq_tensor t, scale;
    void *data;
    float *sdata;
    float *deq; /* rows*cols, through moeq_tensor_rows_to_f32 */
} fake_weight;

static uint64_t rng_state = 42;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
}

static void fake_weight_make(fake_weight *f, moeq_dtype dt, int rows, int cols) {
    memset(f, 0, sizeof(*f));
    size_t n = (size_t)rows * cols;
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = frand() * 0.5f;
    f->data = malloc(n * moeq_dtype_size(dt));
    f->t = (moeq_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = f->data,
                         .nbytes = n * moeq_dtype_size(dt)};
    int rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    if (dt == MOEQ_DTYPE_F8_E4M3) {
        f->sdata = malloc((size_t)rb * cb * sizeof(float));
        for (int i = 0; i < rb * cb; i++) f->sdata[i] = 0.5f / 448.0f * (1 + i % 3);
        f->scale = (moeq_tensor){.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {rb, cb},
                                 .data = f->sdata, .nbytes = (size_t)rb * cb * 4};
        f->t.scale_inv = &f->scale;
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            switch (dt) {
            case MOEQ_DTYPE_F32: ((float *)f->data)[i] = v[i]; break;
            case MOEQ_DTYPE_BF16: ((uint16_t *)f->data)[i] = moeq_f32_to_bf16(v[i]); break;
            case MOEQ_DTYPE_F16: ((uint16_t *)f->data)[i] = moeq_f32_to_f16(v[i]); break;
            case MOEQ_DTYPE_F8_E4M3:
                ((uint8_t *)f->data)[i] = moeq_f32_to_f8_e4m3(v[i] / f->sdata[(r / 128) * cb + c / 128]);
                break;
            case MOEQ_DTYPE_Q8R: break; /* made by moeq_tensor_q8r_copy, not here */
            }
        }
    free(v);
    f->deq = malloc(n * sizeof(float));
    moeq_tensor_rows_to_f32(&f->t, 0, rows, f->deq);
}

static void fake_weight_free(fake_weight *f) {
    free(f->data);
    free(f->sdata);
    free(f->deq);
}

static float *rand_floats(size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

static const moeq_dtype all_dtypes[] = {MOEQ_DTYPE_F32, MOEQ_DTYPE_BF16, MOEQ_DTYPE_F16, MOEQ_DTYPE_F8_E4M3};

/* ---- kernels ------------------------------------------------------------------ */

static void kernel_matches_its_scalar_emulation_bit_for_bit(void **state) {
    (void)state;
    for (int d = 0; d < 4; d++) {
        int rows = 133, cols = 301, T = 7; /* odd sizes: tails in every direction, F8 partial blocks */
        fake_weight f;
        fake_weight_make(&f, all_dtypes[d], rows, cols);
        float *x = rand_floats((size_t)T * cols), *y1 = calloc((size_t)T * rows, 4), *y2 = calloc((size_t)T * rows, 4);
        moeq_mm_job j = {&f.t, 0, rows, x, cols, y1, rows, T};
        moeq_mm_nt_block(&j, 0, rows, 0, T);
        j.y = y2;
        moeq_mm_nt_block_scalar(&j, 0, rows, 0, T);
        assert_memory_equal(y1, y2, (size_t)T * rows * 4);
        /* NN through 40 rows starting at row 9 */
        float *z1 = calloc((size_t)T * cols, 4), *z2 = calloc((size_t)T * cols, 4);
        moeq_mm_job n = {&f.t, 9, 40, x, cols, z1, cols, T};
        moeq_mm_nn_block(&n, 0, cols, 0, T);
        n.y = z2;
        moeq_mm_nn_block_scalar(&n, 0, cols, 0, T);
        assert_memory_equal(z1, z2, (size_t)T * cols * 4);
        free(x), free(y1), free(y2), free(z1), free(z2);
        fake_weight_free(&f);
    }
}

static void kernel_widens_weights_exactly_as_the_loader_does(void **state) {
    (void)state;
    for (int d = 0; d < 4; d++) {
        int rows = 130, cols = 260;
        fake_weight f;
        fake_weight_make(&f, all_dtypes[d], rows, cols);
        float *x = calloc((size_t)cols * cols, 4), *y = malloc((size_t)cols * rows * 4);
        for (int k = 0; k < cols; k++) x[(size_t)k * cols + k] = 1.0f; /* one-hot rows pick W[:, k] exactly */
        moeq_mm_job j = {&f.t, 0, rows, x, cols, y, rows, cols};
        moeq_mm_nt_block(&j, 0, rows, 0, cols);
        for (int k = 0; k < cols; k++)
            for (int r = 0; r < rows; r++) assert_true(y[(size_t)k * rows + r] == f.deq[(size_t)r * cols + k]);
        free(x), free(y);
        fake_weight_free(&f);
    }
}

static void kernel_matches_openblas_within_tolerance(void **state) {
    (void)state;
    for (int d = 0; d < 4; d++) {
        int rows = 257, cols = 515, T = 19;
        fake_weight f;
        fake_weight_make(&f, all_dtypes[d], rows, cols);
        float *x = rand_floats((size_t)T * cols), *y = malloc((size_t)T * rows * 4), *ref = malloc((size_t)T * rows * 4);
        moeq_mm_job j = {&f.t, 0, rows, x, cols, y, rows, T};
        moeq_mm_nt_block(&j, 0, rows, 0, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, rows, cols, 1.0f, x, cols, f.deq, cols, 0.0f, ref, rows);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < rows; r++) {
                double mag = 0;
                for (int k = 0; k < cols; k++) mag += fabs((double)x[t * cols + k] * f.deq[(size_t)r * cols + k]);
                assert_true(fabs((double)y[t * rows + r] - ref[t * rows + r]) <= 1e-6 * mag + 1e-7);
            }
        /* and the BLAS path of the backend agrees the same way */
        float *wbuf = malloc((size_t)128 * cols * 4), *yb = malloc((size_t)T * rows * 4);
        j.y = yb;
        moeq_mm_nt_blas_block(&j, 0, 128, wbuf);
        moeq_mm_nt_blas_block(&j, 128, 256, wbuf);
        moeq_mm_nt_blas_block(&j, 256, rows, wbuf);
        for (int i = 0; i < T * rows; i++) assert_true(fabsf(yb[i] - ref[i]) <= 1e-4f * (1 + fabsf(ref[i])));
        free(x), free(y), free(ref), free(wbuf), free(yb);
        fake_weight_free(&f);
    }
}

static void kernel_output_of_a_token_never_depends_on_the_other_tokens(void **state) {
    (void)state;
    int rows = 200, cols = 333, T = 37;
    fake_weight f;
    fake_weight_make(&f, MOEQ_DTYPE_BF16, rows, cols);
    float *x = rand_floats((size_t)T * cols), *all = malloc((size_t)T * rows * 4), *one = malloc((size_t)rows * 4);
    moeq_backend_cpu_params bp = {.n_threads = 3, .batch_invariant = 1, .max_k = cols, .max_ctx = 16, .max_jobs = 4};
    moeq_backend *b = moeq_backend_cpu_new(&bp);
    assert_non_null(b);
    moeq_mm_job j = {&f.t, 0, rows, x, cols, all, rows, T};
    b->matmul(b, &j, 1);
    for (int n_tok = 1; n_tok <= T; n_tok += 5) /* a token alone, or inside a smaller batch */
        for (int t = 0; t + n_tok <= T; t += n_tok) {
            float *y = malloc((size_t)n_tok * rows * 4);
            moeq_mm_job s = {&f.t, 0, rows, x + (size_t)t * cols, cols, y, rows, n_tok};
            b->matmul(b, &s, 1);
            assert_memory_equal(y, all + (size_t)t * rows, (size_t)n_tok * rows * 4);
            free(y);
        }
    moeq_backend_destroy(b);
    free(x), free(all), free(one);
    fake_weight_free(&f);
}

static const moeq_mm_isa all_isas[] = {MOEQ_MM_ISA_SCALAR, MOEQ_MM_ISA_AVX2, MOEQ_MM_ISA_AVX512};

/* NT, NN and dot on isa against the emulation, bit for bit, for every dtype and the tile shapes of 1..9 tokens. */
static void check_isa_against_emulation(moeq_mm_isa isa) {
    for (int d = 0; d < 4; d++) {
        int rows = 141, cols = 301; /* odd: K tails, partial tiles, F8 partial blocks, NN column tails */
        fake_weight f;
        fake_weight_make(&f, all_dtypes[d], rows, cols);
        for (int T = 1; T <= 9; T += (T < 5 ? 1 : 4)) {
            float *x = rand_floats((size_t)T * cols);
            float *y1 = calloc((size_t)T * rows, 4), *y2 = calloc((size_t)T * rows, 4);
            moeq_mm_job j = {&f.t, 0, rows, x, cols, y1, rows, T};
            moeq_mm_nt_block_isa(isa, &j, 0, rows, 0, T);
            j.y = y2;
            moeq_mm_nt_block_scalar(&j, 0, rows, 0, T);
            assert_memory_equal(y1, y2, (size_t)T * rows * 4);
            float *z1 = calloc((size_t)T * cols, 4), *z2 = calloc((size_t)T * cols, 4);
            moeq_mm_job n = {&f.t, 9, 131, x, cols, z1, cols, T}; /* NN through 131 rows from row 9 */
            moeq_mm_nn_block_isa(isa, &n, 0, cols, 0, T);
            n.y = z2;
            moeq_mm_nn_block_scalar(&n, 0, cols, 0, T);
            assert_memory_equal(z1, z2, (size_t)T * cols * 4);
            free(x), free(y1), free(y2), free(z1), free(z2);
        }
        fake_weight_free(&f);
    }
    for (int n = 0; n <= 70; n++) {
        float *a = rand_floats((size_t)n + 1), *b = rand_floats((size_t)n + 1);
        float u = moeq_dot_f32_isa(isa, a, b, n), v = moeq_dot_f32_isa(MOEQ_MM_ISA_SCALAR, a, b, n);
        assert_memory_equal(&u, &v, 4);
        free(a), free(b);
    }
}

static void every_instruction_set_this_cpu_runs_matches_the_emulation_bit_for_bit(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; i < 3; i++)
        if (moeq_mm_isa_supported(all_isas[i])) check_isa_against_emulation(all_isas[i]), ran++;
    assert_true(ran >= 1 && moeq_mm_isa_supported(moeq_mm_isa_best()));
    print_message("kernels checked on %d instruction sets; best here: %s\n", ran, moeq_mm_isa_name(moeq_mm_isa_best()));
}

/*
 * Blocks of many tokens take the K-blocked path (moeq_mm_nt_block_ws: accumulators carried in the workspace
 * between K steps; F8 rows widened once per step), blocks of 5-32 where this CPU's k_blocked choice says so
 * (both choices are run): the bits are the emulation's for every dtype, K shorter and longer than one step
 * (with a tail), any row offset (F8 blocks straddling 128-row scale blocks), token count and sub-block; a
 * workspace too small falls back to the direct tiles with the same bits.
 */
static void many_token_blocked_path_matches_the_emulation_bit_for_bit(void **state) {
    (void)state;
    int k_blocked = moeq_cpu_k_blocked(); /* this CPU's choice (cpu_tuning.h), restored at the end: both run */
    static const int colss[] = {301, 2500};
    static const int toks[] = {5, 8, 13, 70};
    static const int blocks[][2] = {{0, 290}, {7, 77}, {120, 140}, {250, 290}};
    int rows = 300;
    for (int d = 0; d < 4; d++)
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
            int cols = colss[ci];
            fake_weight f;
            fake_weight_make(&f, all_dtypes[d], rows, cols);
            size_t ws_bytes = moeq_mm_nt_ws_bytes(cols);
            void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                int T = toks[ti];
                float *x = rand_floats((size_t)T * cols);
                float *want = malloc((size_t)T * rows * 4), *got = malloc((size_t)T * rows * 4);
                for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                    moeq_mm_job j = {&f.t, 5, 290, x, cols, want, rows, T}; /* rows 5..294 of the weight */
                    int n0 = blocks[bi][0], n1 = blocks[bi][1], t0 = T > 10 ? 3 : 0;
                    memset(want, 0, (size_t)T * rows * 4);
                    memset(got, 0, (size_t)T * rows * 4);
                    moeq_mm_nt_block_scalar(&j, n0, n1, t0, T);
                    j.y = got;
                    for (int kb = 0; kb < 2; kb++) { /* K-blocked or not (F8 decides by its own rule) */
                        moeq_cpu_set_k_blocked(kb);
                        memset(got, 0, (size_t)T * rows * 4);
                        moeq_mm_nt_block_ws(&j, n0, n1, t0, T, ws, ws_bytes);
                        assert_memory_equal(got, want, (size_t)T * rows * 4);
                    }
                    memset(got, 0, (size_t)T * rows * 4);
                    moeq_mm_nt_block_ws(&j, n0, n1, t0, T, ws, ws_bytes - 1); /* too small: the direct tiles */
                    assert_memory_equal(got, want, (size_t)T * rows * 4);
                }
                free(x), free(want), free(got);
            }
            free(ws);
            fake_weight_free(&f);
        }
    moeq_cpu_set_k_blocked(k_blocked);
}

/*
 * Blocks of few tokens (decode) read a tile's rows one from each of several stretches of the block, each
 * stretch a sequential stream (nt_streams512); the rows the stretches leave over take adjacent-row tiles.
 * The bits are the emulation's for every dtype and instruction set, for 1-16 tokens (4-, 6- and 8-row tiles;
 * 5-6 tokens in one pass of 4-row tiles),
 * blocks whose length leaves 0 to 7 rows over, blocks too short to split, F8 blocks cut at 128-row scale
 * edges (the weight starts at row 5, so no block is aligned to them), and K with and without a tail.
 */
static void few_token_stream_tiles_match_the_emulation_bit_for_bit(void **state) {
    (void)state;
    int stream_l2 = moeq_cpu_stream_l2(); /* this CPU's choice, restored at the end */
    static const int colss[] = {256, 301};
    static const int toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};
    static const int blocks[][2] = {{0, 290}, {0, 31}, {3, 40}, {7, 77}, {100, 262}, {120, 140}, {250, 290}};
    int rows = 300;
    for (int d = 0; d < 4; d++)
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
            int cols = colss[ci];
            fake_weight f;
            fake_weight_make(&f, all_dtypes[d], rows, cols);
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                int T = toks[ti];
                float *x = rand_floats((size_t)T * cols);
                float *want = malloc((size_t)T * rows * 4), *got = malloc((size_t)T * rows * 4);
                for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
                    for (int i = 0; i < 3 * 2; i++) { /* each isa with its weight prefetches into L1, then L2 */
                        if (!moeq_mm_isa_supported(all_isas[i / 2])) continue;
                        moeq_cpu_set_stream_l2(i % 2);
                        moeq_mm_job j = {&f.t, 5, 290, x, cols, want, rows, T}; /* rows 5..294 of the weight */
                        int n0 = blocks[bi][0], n1 = blocks[bi][1];
                        memset(want, 0, (size_t)T * rows * 4);
                        memset(got, 0xff, (size_t)T * rows * 4);
                        moeq_mm_nt_block_scalar(&j, n0, n1, 0, T);
                        j.y = got;
                        moeq_mm_nt_block_isa(all_isas[i / 2], &j, n0, n1, 0, T);
                        for (int t = 0; t < T; t++) /* the block's elements, and nothing outside it written */
                            for (int r = 0; r < rows; r++) {
                                float w = r >= n0 && r < n1 ? want[t * rows + r] : 0.0f;
                                uint32_t gb, wb;
                                memcpy(&gb, &got[t * rows + r], 4), memcpy(&wb, &w, 4);
                                if (r < n0 || r >= n1) assert_int_equal(gb, 0xffffffffu);
                                else assert_int_equal(gb, wb);
                            }
                    }
                free(x), free(want), free(got);
            }
            fake_weight_free(&f);
        }
    moeq_cpu_set_stream_l2(stream_l2);
}

/*
 * F8's direct tiles (blocks of up to 32 tokens; 40 take the staged path) take activations scaled once per 128-row
 * scale block, and widen the weights through float16 or (cpu_tuning.h) straight into float32 bits, q * 2^-120
 * against activations 2^112 larger. Both must give the emulation's bits for every e4m3 byte (subnormals, zeros,
 * 0x7f), with and without the workspace, for
 * activations so small that x * 256 * scale is a float32 denormal (the 2^112 must then be exact) and so large
 * that it would overflow (the block falls back to the float16 form), and with an infinite activation.
 */
static void f8_few_token_tiles_match_the_emulation_in_both_widenings(void **state) {
    (void)state;
    int widen32 = moeq_cpu_f8_widen32(), stream_l2 = moeq_cpu_stream_l2(); /* this CPU's choices, restored */
    const int rows = 300, cols = 301, rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    fake_weight f;
    fake_weight_make(&f, MOEQ_DTYPE_F8_E4M3, rows, cols);
    for (int i = 0; i < rows * cols; i++) ((uint8_t *)f.data)[i] = (uint8_t)(i * 7 + i / 256); /* every byte */
    static const float scales[] = {0.5f / 448.0f, 3.0f, 1e-3f, 1e6f, 2e-4f, 1.0f, 0.25f, 7e-3f, 1e-30f};
    for (int i = 0; i < rb * cb; i++) f.sdata[i] = scales[i % (sizeof scales / sizeof scales[0])];
    size_t ws_bytes = moeq_mm_nt_ws_bytes(cols);
    void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
    static const int toks[] = {1, 2, 3, 4, 5, 6, 7, 12, 16, 32, 40};
    for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
        int T = toks[ti];
        float *x = rand_floats((size_t)T * cols);
        if (T > 1)
            for (int k = 0; k < cols; k++) x[cols + k] *= 1e-38f; /* token 1: x * 256 * scale denormal */
        if (T > 2) x[2 * cols + 200] = 1e30f;                   /* token 2: past the float32 form's range */
        if (T > 3) x[3 * cols + 17] = INFINITY;
        float *want = malloc((size_t)T * rows * 4), *got = malloc((size_t)T * rows * 4);
        moeq_mm_job j = {&f.t, 5, 290, x, cols, want, rows, T}; /* rows 5..294: no block aligned to 128 */
        static const int blocks[][2] = {{0, 290}, {3, 40}, {120, 140}};
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
            int n0 = blocks[bi][0], n1 = blocks[bi][1];
            j.y = want;
            moeq_mm_nt_block_scalar(&j, n0, n1, 0, T);
            for (int v = 0; v < 8; v++) { /* widening x prefetch level x workspace */
                for (int isa = 0; isa < 3; isa++) {
                    if (!moeq_mm_isa_supported(all_isas[isa])) continue;
                    moeq_cpu_set_f8_widen32(v & 1), moeq_cpu_set_stream_l2(v >> 1 & 1);
                    memset(got, 0, (size_t)T * rows * 4);
                    j.y = got;
                    if (v & 4) moeq_mm_nt_block_ws_isa(all_isas[isa], &j, n0, n1, 0, T, ws, ws_bytes);
                    else moeq_mm_nt_block_isa(all_isas[isa], &j, n0, n1, 0, T);
                    for (int t = 0; t < T; t++)
                        for (int r = n0; r < n1; r++) {
                            uint32_t gb, wb;
                            memcpy(&gb, &got[t * rows + r], 4), memcpy(&wb, &want[t * rows + r], 4);
                            if (gb != wb)
                                fail_msg("T %d token %d row %d isa %s variant %d: %08x, the emulation %08x", T, t, r,
                                         moeq_mm_isa_name(all_isas[isa]), v, gb, wb);
                        }
                }
            }
        }
        free(x), free(want), free(got);
    }
    free(ws);
    fake_weight_free(&f);
    moeq_cpu_set_f8_widen32(widen32), moeq_cpu_set_stream_l2(stream_l2);
}

/* An element's bits do not depend on the sub-block it is computed in (row tiles of 4 or 8, token tiles, tails). */
static void kernel_output_of_an_element_never_depends_on_its_block(void **state) {
    (void)state;
    int rows = 77, cols = 1030, T = 11;
    fake_weight f;
    fake_weight_make(&f, MOEQ_DTYPE_F8_E4M3, rows, cols);
    float *x = rand_floats((size_t)T * cols), *all = malloc((size_t)T * rows * 4), *y = malloc((size_t)T * rows * 4);
    for (int i = 0; i < 3; i++) {
        if (!moeq_mm_isa_supported(all_isas[i])) continue;
        moeq_mm_job j = {&f.t, 0, rows, x, cols, all, rows, T};
        moeq_mm_nt_block_isa(MOEQ_MM_ISA_SCALAR, &j, 0, rows, 0, T);
        j.y = y;
        static const int cuts[][2] = {{1, 1}, {3, 2}, {13, 1}, {5, 3}, {30, 11}, {77, 4}, {9, 7}};
        for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
            memset(y, 0xff, (size_t)T * rows * 4);
            for (int n0 = 0; n0 < rows; n0 += cuts[c][0])
                for (int t0 = 0; t0 < T; t0 += cuts[c][1])
                    moeq_mm_nt_block_isa(all_isas[i], &j, n0, n0 + cuts[c][0] < rows ? n0 + cuts[c][0] : rows, t0,
                                         t0 + cuts[c][1] < T ? t0 + cuts[c][1] : T);
            assert_memory_equal(y, all, (size_t)T * rows * 4);
        }
    }
    free(x), free(all), free(y);
    fake_weight_free(&f);
}

/* Tokens [0, T) of x through b in batches of n_tok = 1, 1 + step, ... (each batch alone): every output equals
 * ref's (T x rows), whatever shares the call. */
static void assert_batches_give_ref(moeq_backend *b, const moeq_tensor *w, const float *x, int cols, int rows, int T,
                                    int step, const float *ref) {
    for (int n_tok = 1; n_tok <= T; n_tok += step)
        for (int t = 0; t + n_tok <= T; t += n_tok) {
            float *y = malloc((size_t)n_tok * rows * 4);
            moeq_mm_job s = {w, 0, rows, x + (size_t)t * cols, cols, y, rows, n_tok};
            b->matmul(b, &s, 1);
            assert_memory_equal(y, ref + (size_t)t * rows, (size_t)n_tok * rows * 4);
            free(y);
        }
}

/* ---- the draft products (ops_draft.h): Q8R copies, int8 sums; every CPU (the emulation where VNNI is missing) ---- */

/* A Q8R copy of an F32 weight of rows x cols values v (row 1 all zero, row 2 with a NaN when nan_row). */
static moeq_tensor *q8r_of(int rows, int cols, int nan_row, float **deq) {
    fake_weight f;
    fake_weight_make(&f, MOEQ_DTYPE_F32, rows, cols);
    float *v = f.data;
    for (int c = 0; c < cols; c++) v[1 * cols + c] = 0.0f;
    if (nan_row) v[2 * cols + cols / 2] = NAN;
    moeq_tensor *q = moeq_tensor_q8r_copy(&f.t);
    assert_non_null(q);
    if (deq) {
        *deq = malloc((size_t)rows * cols * sizeof(float));
        moeq_tensor_rows_to_f32(q, 0, rows, *deq);
    }
    /* each code is the value over its row's scale rounded to nearest: within half a step */
    const float *sc = q->scale_inv->data;
    for (int r = 0; r < rows; r++) {
        if (r == 1) assert_true(sc[r] == 0.0f);
        if (r == 2 && nan_row) {
            assert_true(isnan(sc[r]));
            continue;
        }
        for (int c = 0; c < cols; c++) {
            int code = ((const uint8_t *)q->data)[moeq_q8r_at(cols, r, c)] - 128;
            assert_true(code >= -127 && code <= 127);
            assert_true(fabsf((float)code * sc[r] - v[(size_t)r * cols + c]) <= 0.5001f * sc[r]);
        }
    }
    fake_weight_free(&f);
    return q;
}

/*
 * The kernel gives the emulation's bits for K a multiple of 64 or not, 1-17 tokens (passes of 8, partial ones),
 * rows cut anywhere (register blocks of stretches and the rows left over, a job at a row offset), every
 * workspace size down to none; tokens that are all zero, hold a NaN or an infinity, or are tiny; a NaN row of
 * the weight gives NaN and an all-zero row 0. Nothing outside the block is written. Both elements: hi and lo
 * codes, and the hi codes alone (q8r_hi_only: the screened head's first pass, other register blocks).
 */
static void draft_products_match_their_emulation_bit_for_bit(void **state) {
    (void)state;
    if (!moeq_draft_supported())
        print_message("draft kernels: %s (checking the emulation alone)\n", moeq_draft_describe());
    static const int colss[] = {32, 100, 1088};
    static const int toks[] = {1, 2, 3, 5, 8, 9, 16, 17, 33}; /* 16+: AMX-INT8 blocks where the CPU has them */
    static const int blocks[][2] = {{0, 295}, {0, 1}, {0, 7}, {3, 77}, {120, 140}, {280, 295}};
    int rows = 300;
    for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
        int cols = colss[ci];
        moeq_tensor *w = q8r_of(rows, cols, 1, NULL);
        for (size_t hti = 0; hti < 2 * sizeof toks / sizeof toks[0]; hti++) {
            int T = toks[hti / 2];
            w->q8r_hi_only = (int)(hti % 2);
            float *x = rand_floats((size_t)T * cols);
            if (T > 2) memset(x + cols, 0, (size_t)cols * 4);                  /* token 1: zeros */
            if (T > 3) x[2 * cols + 5] = NAN, x[3 * cols + 1] = INFINITY;      /* tokens 2, 3 */
            if (T > 5) for (int k = 0; k < cols; k++) x[4 * cols + k] *= 1e-30f; /* token 4: tiny */
            float *want = malloc((size_t)T * rows * 4), *got = malloc((size_t)T * rows * 4);
            moeq_mm_job j = {w, 1, rows - 1, x, cols, want, rows, T}; /* rows 1.. of the weight: 1 zero, 2 NaN */
            moeq_draft_nt_block_ref(&j, 0, rows - 1, 0, T);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < rows - 1; r++) {
                    float v = want[t * rows + r];
                    if ((T > 3 && (t == 2 || t == 3)) || r == 1) assert_true(isnan(v));
                    else if ((T > 2 && t == 1) || r == 0) assert_true(v == 0.0f);
                    else assert_true(isfinite(v));
                }
            size_t wsb = moeq_draft_ws_bytes(cols), sizes[] = {wsb, wsb / 3, 200 + 2 * (size_t)cols, 0};
            void *ws = aligned_alloc(64, (wsb + 63) / 64 * 64);
            for (size_t z = 0; z < 4; z++)
                for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
                    int n0 = blocks[b][0], n1 = blocks[b][1];
                    memset(got, 0xff, (size_t)T * rows * 4);
                    j.y = got;
                    moeq_draft_nt_block(&j, n0, n1, 0, T, sizes[z] ? ws : NULL, sizes[z], z == 0 ? 7 : 0);
                    for (int t = 0; t < T; t++)
                        for (int r = 0; r < rows; r++) {
                            uint32_t gb, wb;
                            memcpy(&gb, &got[t * rows + r], 4), memcpy(&wb, &want[t * rows + r], 4);
                            if (r < n0 || r >= n1) assert_int_equal(gb, 0xffffffffu);
                            else assert_int_equal(gb, wb);
                        }
                }
            free(ws), free(x), free(want), free(got);
        }
        free(w);
    }
}

/* Against float64 on the copy's own values: the activation split leaves at most max|x| / (127 * 508) per
 * value (the hi codes alone max|x| / 254), the float32 steps 1e-6 of the magnitude sum. */
static void draft_tolerance_of(int hi_only) {
    int rows = 130, cols = 2048, T = 11;
    float *deq;
    moeq_tensor *w = q8r_of(rows, cols, 0, &deq);
    w->q8r_hi_only = hi_only;
    float *x = rand_floats((size_t)T * cols), *y = malloc((size_t)T * rows * 4);
    for (int k = 0; k < cols; k += 97) x[k] *= 300.0f; /* an outlier channel in token 0 */
    size_t wsb = moeq_draft_ws_bytes(cols);
    void *ws = aligned_alloc(64, (wsb + 63) / 64 * 64);
    moeq_mm_job j = {w, 0, rows, x, cols, y, rows, T};
    moeq_draft_nt_block(&j, 0, rows, 0, T, ws, wsb, 0);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double amax = 0;
        for (int k = 0; k < cols; k++) amax = fmax(amax, fabs((double)x[t * cols + k]));
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0, wsum = 0;
            for (int k = 0; k < cols; k++) {
                double p = (double)x[t * cols + k] * deq[(size_t)r * cols + k];
                ref += p, mag += fabs(p), wsum += fabs((double)deq[(size_t)r * cols + k]);
            }
            double bound = wsum * amax / (127.0 * (hi_only ? 2.0 : 508.0)) + 1e-6 * mag + 1e-30;
            double e = fabs((double)y[t * rows + r] - ref);
            if (e / bound > worst) worst = e / bound;
            assert_true(e <= bound);
        }
    }
    print_message("draft products%s: worst error %.3g of the bound\n", hi_only ? " (hi codes alone)" : "", worst);
    free(ws), free(x), free(y), free(deq), free(w);
}

static void draft_products_are_within_the_int8_tolerance(void **state) {
    (void)state;
    draft_tolerance_of(0);
    draft_tolerance_of(1);
}

/* Through the backend (three threads, amx where the CPU has it): a token's draft outputs do not depend on
 * the tokens sharing the call, nor on a BF16 job beside it taking another path. */
static void draft_backend_output_of_a_token_never_depends_on_the_other_tokens(void **state) {
    (void)state;
    int rows = 200, cols = 352, T = 37;
    moeq_tensor *w = q8r_of(rows, cols, 0, NULL);
    fake_weight fb;
    fake_weight_make(&fb, MOEQ_DTYPE_BF16, rows, cols);
    float *x = rand_floats((size_t)T * cols), *all = malloc((size_t)2 * T * rows * 4);
    moeq_backend_cpu_params bp = {.n_threads = 3, .batch_invariant = 1, .max_k = cols, .max_ctx = 16, .max_jobs = 8,
                                  .amx = moeq_amx_supported()};
    moeq_backend *b = moeq_backend_cpu_new(&bp);
    assert_non_null(b);
    float *ref = malloc((size_t)T * rows * 4);
    for (int hi_only = 0; hi_only < 2; hi_only++) { /* both elements (the screened head's first pass: hi alone) */
        w->q8r_hi_only = hi_only;
        moeq_mm_job j2[2] = {{w, 0, rows, x, cols, all, rows, T},
                             {&fb.t, 0, rows, x, cols, all + (size_t)T * rows, rows, T}};
        b->matmul(b, j2, 2);
        moeq_mm_job jr = {w, 0, rows, x, cols, ref, rows, T};
        moeq_draft_nt_block_ref(&jr, 0, rows, 0, T);
        assert_memory_equal(all, ref, (size_t)T * rows * 4);
        assert_batches_give_ref(b, w, x, cols, rows, T, 4, ref);
    }
    moeq_backend_destroy(b);
    free(x), free(all), free(ref), free(w);
    fake_weight_free(&fb);
}

/* ---- the AMX tile path (ops_amx.h): run where the CPU has AMX, else skipped with the reason ---- */

static int amx_or_skip(void) {
    if (moeq_amx_supported()) return 1;
    print_message("SKIP (no AMX on this CPU): %s\n", moeq_amx_describe());
    return 0;
}

/* got equals want bit for bit in rows [n0, n1) of tokens [t0, T) and is untouched (all ones) elsewhere. */
static void assert_block_bits(const float *got, const float *want, int T, int rows, int n0, int n1, int t0) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            uint32_t gb, wb;
            memcpy(&gb, &got[t * rows + r], 4), memcpy(&wb, &want[t * rows + r], 4);
            if (r < n0 || r >= n1 || t < t0) assert_int_equal(gb, 0xffffffffu);
            else assert_int_equal(gb, wb);
        }
}

/* The F8 widening's byte tables against the scalar decoder, for every E4M3 byte at every position of a
 * 64-value block and in a tail: the exact value (E4M3 has 4 significant bits), subnormals and signed zero
 * included; 0x7f and 0xff as the quiet NaN 0x7fc0 with their sign. */
static void amx_f8_widening_is_exact_for_every_byte(void **state) {
    (void)state;
    if (!amx_or_skip()) return;
    enum { N = 256 * 3 + 37 };
    uint8_t in[N];
    uint16_t out[N];
    for (int i = 0; i < N; i++) in[i] = (uint8_t)(i * 7 + i / 256); /* each byte at many lanes */
    for (int n = N - 37; n <= N; n += 37) { /* with and without a tail */
        memset(out, 0xa5, sizeof out);
        moeq_amx_widen_f8(in, out, (size_t)n);
        for (int i = 0; i < N; i++) {
            if (i >= n) {
                assert_int_equal(out[i], 0xa5a5);
                continue;
            }
            float v = moeq_f8_e4m3_to_f32(in[i]);
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t want = (in[i] & 0x7f) == 0x7f ? (uint16_t)(0x7fc0 | (in[i] & 0x80) << 8) : (uint16_t)(u >> 16);
            assert_int_equal(u & 0xffff, 0);
            assert_int_equal(out[i], want);
        }
    }
}

/*
 * The kernel's tiles give each element the emulation's chain (one element per tile, built with scalar code):
 * BF16 and F8 (K with and without a partial 128-column scale block), 1-50 tokens (one or two 16-token groups,
 * partial groups), blocks of rows cut anywhere (one or two 16-row tiles, partial tiles, the weight's last rows
 * through a padded copy, F8 strips straddling 128-row scale blocks), a job reading its tokens at an offset
 * into a bigger pack; nothing outside the block is written.
 */
static void amx_tiles_match_their_emulation_bit_for_bit(void **state) {
    (void)state;
    if (!amx_or_skip()) skip();
    static const int colss[] = {32, 96, 416};
    /* 150 tokens: F8 blocks of up to four strips keep their widened strips over sub-blocks of 64 tokens, the last
     * of 17 (from token 5) or 6 (from 16) */
    static const int toks[] = {1, 2, 15, 16, 17, 33, 50, 150};
    static const int blocks[][2] = {{0, 295}, {0, 16}, {0, 17}, {7, 77}, {120, 140}, {250, 295}, {280, 283},
                                    {0, 128}, {100, 228}};
    const moeq_dtype dts[] = {MOEQ_DTYPE_BF16, MOEQ_DTYPE_F8_E4M3};
    int rows = 300;
    for (int d = 0; d < 2; d++)
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++) {
            int cols = colss[ci];
            fake_weight f;
            fake_weight_make(&f, dts[d], rows, cols);
            size_t wsb = (moeq_amx_ws_bytes(cols) + 63) / 64 * 64;
            void *ws = aligned_alloc(64, wsb);
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                int T = toks[ti], off = 3, n = T + off + 4; /* the job's tokens are rows 3..3+T of a pack of n */
                float *xr = rand_floats((size_t)n * cols);
                uint32_t *pack = aligned_alloc(64, (moeq_amx_pack_bytes(n, cols) + 63) / 64 * 64);
                for (int64_t g = 0; g < moeq_amx_pack_groups(n); g++) moeq_amx_pack_group(xr, cols, n, cols, pack, g);
                /* the row layout (a job reading its tokens at an offset into a bigger pack) and, from 16 tokens,
                 * the panel layout (its own region; token blocks from multiples of 16) */
                uint32_t *panel = NULL;
                if (T >= 16) {
                    panel = aligned_alloc(64, (moeq_amx_panel_bytes(T, cols) + 63) / 64 * 64);
                    for (int64_t g = 0; g < moeq_amx_pack_groups(T); g++)
                        moeq_amx_pack_panel(xr + (size_t)off * cols, cols, T, cols, panel, g);
                }
                const moeq_amx_xview views[2] = {{pack, moeq_amx_pack_cols(n), off, 0}, {panel, 0, 0, 1}};
                const int first_tok[2] = {T > 20 ? 5 : 0, T > 20 ? 16 : 0};
                float *want = malloc((size_t)T * rows * 4), *got = malloc((size_t)T * rows * 4);
                moeq_mm_job j = {&f.t, 5, 295, xr + (size_t)off * cols, cols, want, rows, T}; /* rows 5..299 */
                moeq_amx_nt_block_ref(&j, 0, 295, 0, T);
                for (int v = 0; v < (panel ? 2 : 1); v++)
                    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                        int n0 = blocks[bi][0], n1 = blocks[bi][1], t0 = first_tok[v];
                        memset(got, 0xff, (size_t)T * rows * 4);
                        j.y = got;
                        /* every other block is told its thread's next block (here rows 200.. of the weight) */
                        const int64_t rb = (int64_t)cols * (dts[d] == MOEQ_DTYPE_BF16 ? 2 : 1);
                        const moeq_amx_then then = {(const uint8_t *)f.t.data + 200 * rb, rb, rb};
                        moeq_amx_nt_block(&j, &views[v], n0, n1, t0, T, bi % 2 ? &then : NULL, ws, wsb);
                        assert_block_bits(got, want, T, rows, n0, n1, t0);
                    }
                free(panel);
                free(xr), free(pack), free(want), free(got);
            }
            free(ws);
            fake_weight_free(&f);
        }
}

/* The tiles against float64: the split activations (16 bits) and float32 sums stay within 1e-6 of the
 * magnitude sum (the float32 lanes' bound), on BF16 and F8 weights. */
static void amx_tiles_are_within_the_float64_tolerance(void **state) {
    (void)state;
    if (!amx_or_skip()) skip();
    const moeq_dtype dts[] = {MOEQ_DTYPE_BF16, MOEQ_DTYPE_F8_E4M3};
    int rows = 130, cols = 2048, T = 19;
    double worst = 0;
    for (int d = 0; d < 2; d++) {
        fake_weight f;
        fake_weight_make(&f, dts[d], rows, cols);
        float *x = rand_floats((size_t)T * cols), *y = malloc((size_t)T * rows * 4);
        moeq_mm_job j = {&f.t, 0, rows, x, cols, y, rows, T};
        assert_int_equal(moeq_amx_nt_job(&j), 0);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < rows; r++) {
                double ref = 0, mag = 0;
                for (int k = 0; k < cols; k++) {
                    ref += (double)x[t * cols + k] * f.deq[(size_t)r * cols + k];
                    mag += fabs((double)x[t * cols + k] * f.deq[(size_t)r * cols + k]);
                }
                double e = fabs((double)y[t * rows + r] - ref) / mag;
                if (e > worst) worst = e;
                assert_true(fabs((double)y[t * rows + r] - ref) <= 1e-6 * mag + 1e-7);
            }
        free(x), free(y);
        fake_weight_free(&f);
    }
    print_message("AMX tiles: worst error %.3g of the magnitude sum\n", worst);
}

/*
 * Through the backend (amx = 1, three threads): a token's outputs do not depend on how many tokens share
 * the call, nor on sharing a pack with other jobs (gate and up of one x; expert-like jobs reading slices
 * of one array); F32 and F16 weights take the float32 lanes in the same call.
 */
static void amx_backend_output_of_a_token_never_depends_on_the_other_tokens(void **state) {
    (void)state;
    if (!amx_or_skip()) skip();
    int rows = 200, cols = 352, T = 37;
    fake_weight fb, f8, f16;
    fake_weight_make(&fb, MOEQ_DTYPE_BF16, rows, cols);
    fake_weight_make(&f8, MOEQ_DTYPE_F8_E4M3, rows, cols);
    fake_weight_make(&f16, MOEQ_DTYPE_F16, rows, cols);
    float *x = rand_floats((size_t)T * cols), *all = malloc((size_t)3 * T * rows * 4);
    moeq_backend_cpu_params bp = {.n_threads = 3, .batch_invariant = 1, .max_k = cols, .max_ctx = 16, .max_jobs = 8,
                                  .amx = 1};
    moeq_backend *b = moeq_backend_cpu_new(&bp);
    assert_non_null(b);
    moeq_mm_job j3[3] = {{&fb.t, 0, rows, x, cols, all, rows, T},
                         {&f8.t, 0, rows, x, cols, all + (size_t)T * rows, rows, T},
                         {&f16.t, 0, rows, x, cols, all + (size_t)2 * T * rows, rows, T}};
    b->matmul(b, j3, 3);
    /* the F16 job took the lanes: the emulation's bits */
    float *lanes = malloc((size_t)T * rows * 4);
    moeq_mm_job jl = {&f16.t, 0, rows, x, cols, lanes, rows, T};
    moeq_mm_nt_block_scalar(&jl, 0, rows, 0, T);
    assert_memory_equal(lanes, all + (size_t)2 * T * rows, (size_t)T * rows * 4);
    for (int w = 0; w < 2; w++) {
        const moeq_tensor *wt = w ? &f8.t : &fb.t;
        const float *ref = all + (size_t)w * T * rows;
        assert_batches_give_ref(b, wt, x, cols, rows, T, 6, ref); /* alone or in smaller batches */
        /* experts: consecutive slices of x, two jobs per slice, one pack */
        static const int cuts[] = {0, 3, 4, 20, 37};
        moeq_mm_job ex[8];
        float *y = malloc((size_t)2 * T * rows * 4);
        int nj = 0;
        for (int c = 0; c + 1 < 5; c++) {
            int t0 = cuts[c], n = cuts[c + 1] - cuts[c];
            ex[nj++] = (moeq_mm_job){wt, 0, rows, x + (size_t)t0 * cols, cols, y + (size_t)t0 * rows, rows, n};
            ex[nj++] = (moeq_mm_job){wt, 0, rows, x + (size_t)t0 * cols, cols, y + (size_t)(T + t0) * rows, rows, n};
        }
        b->matmul(b, ex, nj);
        assert_memory_equal(y, ref, (size_t)T * rows * 4);
        assert_memory_equal(y + (size_t)T * rows, ref, (size_t)T * rows * 4);
        free(y);
    }
    moeq_backend_destroy(b);
    free(x), free(all), free(lanes);
    fake_weight_free(&fb), fake_weight_free(&f8), fake_weight_free(&f16);
}

/* Decode-sized calls (tasks of ~256 KiB of weights) give the bits of prefill-sized ones (32 rows, 64 columns). */
static void backend_task_split_for_few_tokens_keeps_the_bits(void **state) {
    (void)state;
    int rows = 1500, cols = 1030, T = 40;
    for (int d = 1; d < 4; d += 2) { /* BF16, F8 */
        fake_weight f;
        fake_weight_make(&f, all_dtypes[d], rows, cols);
        float *x = rand_floats((size_t)T * cols);
        float *all = malloc((size_t)T * rows * 4), *y = malloc((size_t)T * rows * 4);
        moeq_backend_cpu_params bp = {
            .n_threads = 3, .batch_invariant = 1, .max_k = cols, .max_ctx = 16, .max_jobs = 4};
        moeq_backend *b = moeq_backend_cpu_new(&bp);
        assert_non_null(b);
        moeq_mm_job j = {&f.t, 0, rows, x, cols, all, rows, T};
        b->matmul(b, &j, 1);
        float *nall = malloc((size_t)T * cols * 4), *ny = malloc((size_t)T * cols * 4);
        /* NN through 200 rows: 2 tasks of columns at T <= 16 */
        moeq_mm_job nn = {&f.t, 100, 200, x, cols, nall, cols, T};
        b->matmul_nn(b, &nn, 1);
        static const int sizes[] = {1, 2, 3, 16, 17};
        for (int s = 0; s < 5; s++)
            for (int t = 0; t + sizes[s] <= T; t += sizes[s] + 5) {
                moeq_mm_job one = {&f.t, 0, rows, x + (size_t)t * cols, cols, y, rows, sizes[s]};
                b->matmul(b, &one, 1);
                assert_memory_equal(y, all + (size_t)t * rows, (size_t)sizes[s] * rows * 4);
                moeq_mm_job none = {&f.t, 100, 200, x + (size_t)t * cols, cols, ny, cols, sizes[s]};
                b->matmul_nn(b, &none, 1);
                assert_memory_equal(ny, nall + (size_t)t * cols, (size_t)sizes[s] * cols * 4);
            }
        free(nall), free(ny);
        moeq_backend_destroy(b);
        free(x), free(all), free(y);
        fake_weight_free(&f);
    }
}

/* ---- engine params table --------------------------------------------------------- */



/* A field of the params as the table describes it (offset, size). */
static long long prop_field(const moeq_prop *p, const void *params) {
    const char *f = (const char *)params + p->offset;
    if (p->size == sizeof(int64_t)) return (long long)*(const int64_t *)f;
    return (long long)*(const int *)f;
}

static void engine_params_table_defaults_equal_the_default_params(void **state) {
    (void)state;
    moeq_engine_params want = moeq_engine_default_params();
    enum { N_PARAMS = 20 };
    int n = 0, seen[N_PARAMS] = {0};
    static const char *const names[N_PARAMS] = {"max_seqs",  "max_step_tokens", "kv_block_tokens", "kv_cache_tokens",
                                                "n_threads", "batch_invariant", "max_model_len",   "backend",
                                                "device", "prefix_cache", "prefix_cache_share", "cpu_matrix",
                                                "mtp_draft", "cuda_graphs", "cuda_matrix", "head_screen",
                                                "cpu_prefetch", "cpu_f8_widen", "cpu_k_blocked",
                                                "expert_weights"};
    for (const moeq_prop *p = moeq_engine_params_props; p->name; p++, n++) {
        assert_true(p->doc && p->doc[0] && p->def && p->min <= p->max); /* a meaning/unit and a range */
        assert_true(p->offset + p->size <= sizeof(moeq_engine_params));
        for (int i = 0; i < N_PARAMS; i++) seen[i] += !strcmp(p->name, names[i]);
        if (p->type == MOEQ_PROP_STR) { /* the backend's name, cpu_matrix, cuda_graphs */
            assert_string_equal(p->def, (const char *)&want + p->offset);
            continue;
        }
        if (p->type == MOEQ_PROP_DOUBLE) {
            double d = strtod(p->def, NULL);
            assert_true(d >= p->min && d <= p->max);
            assert_true(d == *(const double *)((const char *)&want + p->offset));
            continue;
        }
        long long def = p->type == MOEQ_PROP_BOOL ? !strcmp(p->def, "true") : strtoll(p->def, NULL, 0);
        assert_true(p->type == MOEQ_PROP_BOOL || !strcmp(p->def, "0") || def != 0);
        assert_true((double)def >= p->min && (double)def <= p->max);
        assert_int_equal(def, prop_field(p, &want)); /* the table's default is moeq_engine_default_params()'s */
    }
    assert_int_equal(n, N_PARAMS);
    for (int i = 0; i < N_PARAMS; i++) assert_int_equal(seen[i], 1);
}

/* Regression: an int field set through the table must not spill into its neighbour (config.c stored 8 bytes). */
static void setting_one_engine_param_leaves_the_others_alone(void **state) {
    (void)state;
    for (const moeq_prop *p = moeq_engine_params_props; p->name; p++) {
        moeq_engine_params want = moeq_engine_default_params(), got = want;
        char err[256] = "", out[32];
        const char *v = p->type == MOEQ_PROP_BOOL ? "false" : p->type == MOEQ_PROP_DOUBLE ? "0.5" : "3";
        assert_int_equal(moeq_props_set(moeq_engine_params_props, &got, p->name, v, err, sizeof(err)), MOEQ_OK);
        assert_int_equal(moeq_props_get(moeq_engine_params_props, &got, p->name, out, sizeof(out)), MOEQ_OK);
        assert_string_equal(out, v);
        memcpy((char *)&want + p->offset, (const char *)&got + p->offset, p->size);
        assert_memory_equal(&want, &got, sizeof(want));
    }
    moeq_engine_params d;
    memset(&d, 0x5a, sizeof(d));
    assert_int_equal(moeq_props_defaults(moeq_engine_params_props, &d, NULL, 0), MOEQ_OK);
    moeq_engine_params want = moeq_engine_default_params();
    assert_true(d.max_seqs == want.max_seqs && d.max_step_tokens == want.max_step_tokens &&
                d.kv_block_tokens == want.kv_block_tokens && d.kv_cache_tokens == want.kv_cache_tokens &&
                d.n_threads == want.n_threads && d.batch_invariant == want.batch_invariant);
}

/* ---- rope, ops ---------------------------------------------------------------- */

static void yarn_mscale_and_frequencies_follow_the_formulas(void **state) {
    (void)state;
    assert_true(moeq_rope_yarn_mscale(1.0, 1.0) == 1.0);
    assert_true(fabs(moeq_rope_yarn_mscale(40.0, 1.0) - (0.1 * log(40.0) + 1.0)) < 1e-15);
    moeq_model_config c = {0};
    c.qk_rope_head_dim = 64;
    c.qk_nope_head_dim = 128;
    c.rope_theta = 10000;
    strcpy(c.rope_scaling_type, "yarn");
    c.rope_factor = 40;
    c.rope_original_max_position_embeddings = 4096;
    c.rope_beta_fast = 32;
    c.rope_beta_slow = 1;
    c.rope_mscale = 1;
    c.rope_mscale_all_dim = 1;
    moeq_rope r;
    assert_int_equal(moeq_rope_init(&r, &c, NULL, 0), MOEQ_OK);
    double m = 0.1 * log(40.0) + 1.0;
    assert_true(fabs(r.softmax_scale - m * m / sqrt(192.0)) < 1e-12);
    assert_true(fabs(r.mscale - 1.0) < 1e-15);            /* mscale == mscale_all_dim */
    assert_true(fabs(r.inv_freq[0] - 1.0) < 1e-15);        /* high frequencies kept     */
    assert_true(fabs(r.inv_freq[31] - pow(10000.0, -62.0 / 64) / 40) < 1e-18); /* low ones interpolated */
}

static void rope_rotates_interleaved_pairs_into_halves(void **state) {
    (void)state;
    moeq_model_config c = {0};
    c.qk_rope_head_dim = 8;
    c.rope_theta = 10000;
    moeq_rope r;
    assert_int_equal(moeq_rope_init(&r, &c, NULL, 0), MOEQ_OK);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8], cs[4], sn[4];
    moeq_rope_cos_sin(&r, 3, cs, sn);
    moeq_rope_apply(&r, x, cs, sn, out);
    for (int i = 0; i < 4; i++) { /* (x[2i] + i x[2i+1]) * e^{i pos f_i} */
        double f = 3 * pow(10000.0, -2.0 * i / 8);
        assert_true(fabs(out[i] - (x[2 * i] * cos(f) - x[2 * i + 1] * sin(f))) < 1e-5);
        assert_true(fabs(out[i + 4] - (x[2 * i + 1] * cos(f) + x[2 * i] * sin(f))) < 1e-5);
    }
}

static void rmsnorm_and_softmax_are_right(void **state) {
    (void)state;
    float x[5] = {1, -2, 3, -4, 5}, w[5] = {1, 1, 2, 1, 1}, out[5];
    moeq_ops_rmsnorm(out, x, w, 5, 0.0f);
    float r = 1.0f / sqrtf(55.0f / 5.0f);
    assert_true(fabsf(out[2] - 6 * r) < 1e-6f);
    moeq_ops_softmax(x, 5);
    float s = 0;
    for (int i = 0; i < 5; i++) s += x[i];
    assert_true(fabsf(s - 1) < 1e-6f && x[4] > x[2]);
}

/* ---- routing -------------------------------------------------------------------- */

static moeq_moe_router v3_router(int n, int k, int groups, int topk_group) {
    moeq_model_config c = {0};
    strcpy(c.model_type, "deepseek_v3");
    strcpy(c.scoring_func, "sigmoid");
    strcpy(c.topk_method, "noaux_tc");
    c.n_routed_experts = n;
    c.num_experts_per_tok = k;
    c.n_group = groups;
    c.topk_group = topk_group;
    c.norm_topk_prob = 1;
    c.routed_scaling_factor = 2.5;
    moeq_moe_router r;
    assert_int_equal(moeq_moe_router_init(&r, &c, NULL, 0), MOEQ_OK);
    return r;
}

static float logit_of(float p) { return logf(p / (1 - p)); }

static void v3_routing_chooses_with_bias_and_weighs_without_it(void **state) {
    (void)state;
    moeq_moe_router r = v3_router(8, 2, 1, 1);
    float logits[8], bias[8] = {0}, w[2], scratch[32];
    int32_t ids[2];
    for (int i = 0; i < 8; i++) logits[i] = logit_of(0.1f + 0.1f * i); /* expert 7 best, then 6 */
    bias[0] = 1.0f;                                                      /* expert 0 chosen first */
    moeq_moe_route(&r, logits, bias, ids, w, scratch);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 7);
    float s0 = 0.1f, s7 = 0.8f;
    assert_true(fabsf(w[0] - s0 / (s0 + s7) * 2.5f) < 1e-5f);
    assert_true(fabsf(w[1] - s7 / (s0 + s7) * 2.5f) < 1e-5f);
}

static void v3_groups_are_ranked_by_their_top_two_sum(void **state) {
    (void)state;
    moeq_moe_router r = v3_router(8, 2, 4, 1); /* groups {0,1} {2,3} {4,5} {6,7}, keep one */
    float p[8] = {0.95f, 0.05f, 0.7f, 0.7f, 0.1f, 0.1f, 0.2f, 0.2f}, logits[8], w[2], scratch[32];
    for (int i = 0; i < 8; i++) logits[i] = logit_of(p[i]);
    int32_t ids[2];
    moeq_moe_route(&r, logits, NULL, ids, w, scratch);
    /* group {2,3} (sum 1.4) beats group {0,1} (sum 1.0) although expert 0 is the best single expert */
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
}

/* Regression (issue 11, "NaN crashes the engine"): all-NaN scores made argmax return -1 and the plan index
 * offsets[-1]. Now the ids stay distinct valid experts and the token is flagged. */
static void nan_crashes_the_engine_no_more_router_scores_that_are_nan_still_give_valid_experts(void **state) {
    (void)state;
    moeq_moe_router r = v3_router(8, 2, 4, 2); /* grouped: the group pass sees NaN too */
    float logits[8], bias[8] = {0}, w[2], scratch[32];
    int32_t ids[2];
    for (int i = 0; i < 8; i++) logits[i] = NAN;
    assert_int_equal(moeq_moe_route(&r, logits, bias, ids, w, scratch), 0);
    assert_true(ids[0] >= 0 && ids[0] < 8 && ids[1] >= 0 && ids[1] < 8 && ids[0] != ids[1]);
    int64_t off[9], order[2];
    moeq_moe_plan(ids, 1, 2, 8, off, order);
    assert_int_equal(off[8], 2);
    logits[3] = INFINITY; /* one inf among NaN, and one NaN among finite values: flagged, valid ids */
    assert_int_equal(moeq_moe_route(&r, logits, bias, ids, w, scratch), 0);
    assert_true(ids[0] >= 0 && ids[0] < 8 && ids[1] >= 0 && ids[1] < 8 && ids[0] != ids[1]);
    for (int i = 0; i < 8; i++) logits[i] = logit_of(0.1f + 0.1f * i);
    logits[2] = NAN;
    assert_int_equal(moeq_moe_route(&r, logits, bias, ids, w, scratch), 0);
    assert_true(ids[0] >= 0 && ids[0] < 8 && ids[1] >= 0 && ids[1] < 8 && ids[0] != ids[1]);
    logits[2] = logit_of(0.3f);
    assert_int_equal(moeq_moe_route(&r, logits, bias, ids, w, scratch), 1);
}

/* Issue 11: BF16 weights of 3.4e38 gave `ok` garbage: an overflowed sum of squares made RMSNorm's scale 0 and
 * the row finite zeros, so nothing downstream could tell. */
static void overflow_gives_silent_garbage_no_more_an_overflowed_rmsnorm_row_is_nan(void **state) {
    (void)state;
    float x[64], w[64], out[64];
    for (int i = 0; i < 64; i++) x[i] = 3.3895e38f, w[i] = 1.0f; /* finite; x^2 overflows */
    moeq_ops_rmsnorm(out, x, w, 64, 1e-6f);
    for (int i = 0; i < 64; i++) assert_true(isnan(out[i]));
    for (int i = 0; i < 64; i++) x[i] = 1e18f; /* large but the sum of squares fits: a number */
    moeq_ops_rmsnorm(out, x, w, 64, 1e-6f);
    for (int i = 0; i < 64; i++) assert_true(fabsf(out[i] - 1.0f) < 1e-5f);
}

static void a_logits_row_with_nan_or_inf_gives_no_token(void **state) {
    (void)state;
    enum { n = 1000 };
    static float l[n];
    for (int i = 0; i < n; i++) l[i] = (float)(i % 37) - 3.0f;
    assert_true(moeq_ops_finite(l, n));
    moeq_sampling_params greedy = moeq_sampling_default_params(), hot = greedy;
    hot.temperature = 0.8;
    moeq_sampler *a = NULL, *b = NULL;
    assert_int_equal(moeq_sampler_new(&greedy, n, &a), MOEQ_OK);
    assert_int_equal(moeq_sampler_new(&hot, n, &b), MOEQ_OK);
    assert_true(moeq_sampler_sample(a, l) >= 0 && moeq_sampler_sample(b, l) >= 0);
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++)
        for (int at = 0; at < n; at += 333) {
            float keep = l[at];
            l[at] = bad[k];
            assert_false(moeq_ops_finite(l, n));
            assert_int_equal(moeq_sampler_sample(a, l), -1);
            assert_int_equal(moeq_sampler_sample(b, l), -1);
            l[at] = keep;
        }
    l[5] = 3.4e38f; /* large but finite is a number */
    assert_true(moeq_ops_finite(l, n));
    moeq_sampler_destroy(a);
    moeq_sampler_destroy(b);
}

static void v2_applies_the_scaling_factor_only_when_not_normalising(void **state) {
    (void)state;
    moeq_model_config c = {0};
    strcpy(c.model_type, "deepseek_v2");
    strcpy(c.scoring_func, "softmax");
    strcpy(c.topk_method, "greedy");
    c.n_routed_experts = 4;
    c.num_experts_per_tok = 2;
    c.routed_scaling_factor = 16;
    float logits[4] = {0, 1, 2, 3}, w[2], scratch[16], sm[4] = {0, 1, 2, 3};
    moeq_ops_softmax(sm, 4);
    int32_t ids[2];
    moeq_moe_router r;
    assert_int_equal(moeq_moe_router_init(&r, &c, NULL, 0), MOEQ_OK);
    moeq_moe_route(&r, logits, NULL, ids, w, scratch);
    assert_int_equal(ids[0], 3);
    assert_true(fabsf(w[0] - sm[3] * 16) < 1e-5f);
    c.norm_topk_prob = 1;
    assert_int_equal(moeq_moe_router_init(&r, &c, NULL, 0), MOEQ_OK);
    moeq_moe_route(&r, logits, NULL, ids, w, scratch);
    assert_true(fabsf(w[0] - sm[3] / (sm[3] + sm[2])) < 1e-6f);
}

static void gather_plan_groups_slots_by_expert_in_token_order(void **state) {
    (void)state;
    int32_t ids[] = {2, 0, 1, 2, 0, 1}; /* 3 tokens x top-2 */
    int64_t off[4], order[6];
    moeq_moe_plan(ids, 3, 2, 3, off, order);
    int64_t want_off[4] = {0, 2, 4, 6}, want_order[6] = {1, 4, 2, 5, 0, 3};
    assert_memory_equal(off, want_off, sizeof(want_off));
    assert_memory_equal(order, want_order, sizeof(want_order));
}

/* ---- cache ----------------------------------------------------------------------- */

static void kv_cache_pages_truncates_and_refuses_when_full(void **state) {
    (void)state;
    moeq_kv_cache_params p = {.n_layers = 2, .entry_floats = 40, .block_tokens = 4, .capacity_tokens = 16, .max_seqs = 2};
    moeq_kv_cache *c;
    assert_int_equal(moeq_kv_cache_new(&p, &c, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_bytes_per_token(c), 2 * 40 * 4);
    int a, b, x;
    assert_int_equal(moeq_kv_cache_seq_new(c, &a), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_seq_new(c, &b), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_seq_new(c, &x), MOEQ_ERR_LIMIT);
    assert_int_equal(moeq_kv_cache_grow(c, a, 9), MOEQ_OK); /* 3 blocks */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 1);
    assert_int_equal(moeq_kv_cache_grow(c, b, 5), MOEQ_ERR_LIMIT);
    assert_int_equal(moeq_kv_cache_seq_len(c, b), 0);
    moeq_kv_cache_entry(c, a, 1, 8)[39] = 7.0f;
    assert_true(moeq_kv_cache_entry(c, a, 1, 8) != moeq_kv_cache_entry(c, a, 0, 8));
    assert_int_equal(moeq_kv_cache_truncate(c, a, 4), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_free_blocks(c), 3);
    assert_int_equal(moeq_kv_cache_grow(c, b, 12), MOEQ_OK);
    moeq_kv_cache_seq_free(c, a);
    assert_int_equal(moeq_kv_cache_free_blocks(c), 1);
    assert_int_equal(moeq_kv_cache_seq_new(c, &x), MOEQ_OK);
    moeq_kv_cache_destroy(c);
}

/* Every float of the entries [from, to) of seq, all layers: base + 100 * layer + pos. */
static void kv_fill(moeq_kv_cache *c, int seq, int from, int to, float base) {
    for (int l = 0; l < 2; l++)
        for (int pos = from; pos < to; pos++)
            for (int j = 0; j < 3; j++) moeq_kv_cache_entry(c, seq, l, pos)[j] = base + 100.0f * l + (float)pos;
}

/* 1 when the entries [from, to) of seq, all layers, hold what kv_fill(base) wrote. */
static int kv_holds(moeq_kv_cache *c, int seq, int from, int to, float base) {
    for (int l = 0; l < 2; l++)
        for (int pos = from; pos < to; pos++)
            for (int j = 0; j < 3; j++)
                if (moeq_kv_cache_entry(c, seq, l, pos)[j] != base + 100.0f * l + (float)pos) return 0;
    return 1;
}

/*
 * Forks share the full blocks below n (no block taken), copy a partial last
 * block (one block taken); a truncated sequence growing into a shared block
 * copies it first, so the other sequences' entries stay untouched; blocks go
 * back to the free stack only when their last sequence drops them.
 */
static void kv_cache_fork_shares_blocks_and_copies_before_writing_into_them(void **state) {
    (void)state;
    moeq_kv_cache_params p = {
        .n_layers = 2, .entry_floats = 3, .block_tokens = 4, .capacity_tokens = 32, .max_seqs = 4};
    moeq_kv_cache *c;
    assert_int_equal(moeq_kv_cache_new(&p, &c, NULL, 0), MOEQ_OK);
    int a, b, d, x;
    assert_int_equal(moeq_kv_cache_seq_new(c, &a), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_seq_new(c, &b), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_seq_new(c, &d), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_grow(c, a, 10), MOEQ_OK); /* blocks 0, 1 full, 2 partial */
    kv_fill(c, a, 0, 10, 0.0f);
    assert_int_equal(moeq_kv_cache_free_blocks(c), 5);

    assert_int_equal(moeq_kv_cache_fork_blocks_needed(c, 10), 1);
    assert_int_equal(moeq_kv_cache_seq_fork(c, a, 10, b), MOEQ_OK); /* shares 2, copies the partial one */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 4);
    assert_int_equal(moeq_kv_cache_seq_len(c, b), 10);
    assert_true(kv_holds(c, b, 0, 10, 0.0f));
    assert_ptr_equal(moeq_kv_cache_entry(c, b, 1, 7), moeq_kv_cache_entry(c, a, 1, 7));
    assert_ptr_not_equal(moeq_kv_cache_entry(c, b, 1, 8), moeq_kv_cache_entry(c, a, 1, 8));
    assert_int_equal(moeq_kv_cache_fork_blocks_needed(c, 8), 0);
    assert_int_equal(moeq_kv_cache_seq_fork(c, a, 8, d), MOEQ_OK); /* on a block edge: nothing copied */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 4);
    assert_int_equal(moeq_kv_cache_seq_fork(c, a, 4, d), MOEQ_ERR_INVALID_ARG); /* d is not empty */
    assert_int_equal(moeq_kv_cache_seq_fork(c, a, 11, 3), MOEQ_ERR_INVALID_ARG); /* past a; 3 not open */

    /* b writes after its copied block, a's own block is untouched */
    assert_int_equal(moeq_kv_cache_blocks_needed(c, b, 12), 0);
    assert_int_equal(moeq_kv_cache_grow(c, b, 12), MOEQ_OK);
    kv_fill(c, b, 8, 12, 1000.0f);
    assert_true(kv_holds(c, a, 0, 10, 0.0f));

    /* d truncated into block 1 (held by a, b, d), then grown: copies it first */
    assert_int_equal(moeq_kv_cache_truncate(c, d, 6), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_free_blocks(c), 4); /* block 1 still held by a and b */
    assert_int_equal(moeq_kv_cache_blocks_needed(c, d, 7), 1);
    assert_int_equal(moeq_kv_cache_blocks_needed(c, d, 9), 2);
    assert_int_equal(moeq_kv_cache_grow(c, d, 8), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_free_blocks(c), 3);
    assert_true(kv_holds(c, d, 0, 6, 0.0f)); /* the copy kept d's entries */
    kv_fill(c, d, 6, 8, 2000.0f);
    assert_true(kv_holds(c, a, 0, 10, 0.0f) && kv_holds(c, b, 0, 8, 0.0f));

    /* the source side: a truncated into block 1 (held by a and b) and regrown */
    assert_int_equal(moeq_kv_cache_truncate(c, a, 5), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_free_blocks(c), 4); /* a's block 2 was its own */
    /* b truncated to 5 frees only its own block 2 (block 1 is shared), which then serves the copy of block 1 */
    assert_int_equal(moeq_kv_cache_blocks_needed_after(c, b, 5, 8), 0);
    assert_int_equal(moeq_kv_cache_blocks_needed_after(c, b, 5, 12), 1);
    assert_int_equal(moeq_kv_cache_grow(c, a, 8), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_free_blocks(c), 3);
    kv_fill(c, a, 5, 8, 3000.0f);
    assert_true(kv_holds(c, b, 0, 8, 0.0f) && kv_holds(c, b, 8, 12, 1000.0f));
    assert_true(kv_holds(c, d, 0, 6, 0.0f) && kv_holds(c, d, 6, 8, 2000.0f));
    assert_true(kv_holds(c, a, 0, 5, 0.0f) && kv_holds(c, a, 5, 8, 3000.0f));

    /* block 0 is held by all three: it returns only with the last */
    moeq_kv_cache_seq_free(c, a); /* its block 1 copy */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 4);
    moeq_kv_cache_seq_free(c, d); /* its block 1 copy */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 5);
    assert_true(kv_holds(c, b, 0, 8, 0.0f) && kv_holds(c, b, 8, 12, 1000.0f));
    moeq_kv_cache_seq_free(c, b); /* blocks 0, 1 and its copy */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 8);
    assert_int_equal(moeq_kv_cache_seq_new(c, &x), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_grow(c, x, 32), MOEQ_OK); /* every block is free again, each once */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 0);
    moeq_kv_cache_destroy(c);
}

/* Issue 12: the bookkeeping alone (block ids, no storage) forks, shares and asks for exactly the copies it needs. */
typedef struct copy_log {
    int n;
    int32_t dst[8], src[8];
} copy_log;

static void log_copy(void *ctx, int32_t dst, int32_t src) {
    copy_log *l = ctx;
    assert_true(l->n < 8);
    l->dst[l->n] = dst, l->src[l->n] = src, l->n++;
}

static void kv_blocks_share_fork_and_copy_on_write_by_block_id_without_storage(void **state) {
    (void)state;
    copy_log log = {0};
    moeq_kv_blocks_params p = {.block_tokens = 4, .capacity_tokens = 32, .max_seqs = 3, .copy = log_copy,
                               .copy_ctx = &log};
    moeq_kv_blocks *b = NULL;
    assert_int_equal(moeq_kv_blocks_new(&p, &b, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_count(b), 8);
    int a, c;
    assert_int_equal(moeq_kv_blocks_seq_new(b, &a), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_grow(b, a, 10), MOEQ_OK); /* blocks 0, 1, 2 */
    assert_int_equal(moeq_kv_blocks_seq_new(b, &c), MOEQ_OK);
    assert_int_equal(moeq_kv_blocks_seq_fork(b, a, 6, c), MOEQ_OK); /* shares 0, copies 1 into 3 */
    assert_int_equal(log.n, 1);
    assert_int_equal(log.src[0], 1);
    assert_int_equal(log.dst[0], 3);
    const int32_t *t = moeq_kv_blocks_tables(b);
    int64_t stride = moeq_kv_blocks_table_stride(b);
    assert_int_equal(t[c * stride], 0);
    assert_int_equal(t[c * stride + 1], 3);
    assert_int_equal(moeq_kv_blocks_refs(b, 0), 2);
    assert_int_equal(moeq_kv_blocks_free(b), 4);
    assert_int_equal(moeq_kv_blocks_truncate(b, a, 2), MOEQ_OK); /* a's block 0 now partial and shared */
    assert_int_equal(moeq_kv_blocks_needed(b, a, 3), 1);
    assert_int_equal(moeq_kv_blocks_grow(b, a, 3), MOEQ_OK); /* copy-on-write of block 0 */
    assert_int_equal(log.n, 2);
    assert_int_equal(log.src[1], 0);
    assert_int_equal(moeq_kv_blocks_refs(b, 0), 1);
    moeq_kv_blocks_seq_free(b, a);
    moeq_kv_blocks_seq_free(b, c);
    assert_int_equal(moeq_kv_blocks_free(b), 8);
    moeq_kv_blocks_destroy(b);
}

static void kv_cache_fork_and_copy_on_write_refuse_without_a_free_block(void **state) {
    (void)state;
    moeq_kv_cache_params p = {.n_layers = 2, .entry_floats = 3, .block_tokens = 4, .capacity_tokens = 8, .max_seqs = 2};
    moeq_kv_cache *c;
    assert_int_equal(moeq_kv_cache_new(&p, &c, NULL, 0), MOEQ_OK);
    int a, b;
    assert_int_equal(moeq_kv_cache_seq_new(c, &a), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_seq_new(c, &b), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_grow(c, a, 6), MOEQ_OK); /* both blocks */
    kv_fill(c, a, 0, 6, 0.0f);
    assert_int_equal(moeq_kv_cache_seq_fork(c, a, 6, b), MOEQ_ERR_LIMIT); /* no block for the partial copy */
    assert_int_equal(moeq_kv_cache_seq_len(c, b), 0);
    assert_int_equal(moeq_kv_cache_seq_fork(c, a, 4, b), MOEQ_OK); /* a full block: shared */
    assert_int_equal(moeq_kv_cache_truncate(c, b, 3), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_blocks_needed(c, b, 4), 1);
    assert_int_equal(moeq_kv_cache_grow(c, b, 4), MOEQ_ERR_LIMIT); /* the copy has no block */
    assert_int_equal(moeq_kv_cache_seq_len(c, b), 3);
    moeq_kv_cache_seq_free(c, a); /* block 1 returns, block 0 is b's alone now */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 1);
    assert_int_equal(moeq_kv_cache_blocks_needed(c, b, 4), 0);
    assert_int_equal(moeq_kv_cache_grow(c, b, 4), MOEQ_OK); /* writes in place: nothing to copy */
    assert_int_equal(moeq_kv_cache_free_blocks(c), 1);
    assert_true(kv_holds(c, b, 0, 3, 0.0f));
    moeq_kv_cache_destroy(c);
}

/* ---- attention ----------------------------------------------------------------------- */

/* A cache of one sequence with n_ctx random entries per layer, and random queries for T tokens ending at n_ctx - 1. */
typedef struct attn_case {
    moeq_kv_cache *cache;
    int seq, H, L, R, T;
    int32_t seqs[8];
    int64_t pos[8];
    float *ql, *qp, *out;
} attn_case;

static void attn_case_make(attn_case *c, int H, int L, int R, int n_ctx, int block_tokens, int T) {
    *c = (attn_case){.H = H, .L = L, .R = R, .T = T};
    moeq_kv_cache_params p = {.n_layers = 2, .entry_floats = L + R, .block_tokens = block_tokens,
                              .capacity_tokens = n_ctx + 64, .max_seqs = 2};
    assert_int_equal(moeq_kv_cache_new(&p, &c->cache, NULL, 0), MOEQ_OK);
    int other;
    assert_int_equal(moeq_kv_cache_seq_new(c->cache, &other), MOEQ_OK); /* so the sequence's blocks are not the first */
    assert_int_equal(moeq_kv_cache_grow(c->cache, other, 3), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_seq_new(c->cache, &c->seq), MOEQ_OK);
    assert_int_equal(moeq_kv_cache_grow(c->cache, c->seq, n_ctx), MOEQ_OK);
    for (int layer = 0; layer < 2; layer++)
        for (int j = 0; j < n_ctx; j++) {
            float *e = moeq_kv_cache_entry(c->cache, c->seq, layer, j);
            for (int d = 0; d < L + R; d++) e[d] = frand() * 2;
        }
    for (int t = 0; t < T; t++) c->seqs[t] = c->seq, c->pos[t] = n_ctx - T + t;
    c->ql = rand_floats((size_t)T * H * L);
    c->qp = rand_floats((size_t)T * H * R);
    c->out = calloc((size_t)T * H * L, sizeof(float));
}

static void attn_case_free(attn_case *c) {
    moeq_kv_cache_destroy(c->cache);
    free(c->ql), free(c->qp), free(c->out);
}

static moeq_attn_args attn_args(const attn_case *c) {
    return (moeq_attn_args){c->cache, 1, c->T, c->seqs, c->pos, c->H, c->L, c->R, c->ql, c->qp, c->out, 0.17f};
}

/* Every instruction set, every head split, against the emulation: latent/rope tails, partial tiles, block edges. */
static void attention_on_every_instruction_set_matches_the_emulation_bit_for_bit(void **state) {
    (void)state;
    static const int shapes[][5] = {/* H, L, R, n_ctx, block_tokens */
                                    {4, 32, 8, 2, 16},   {4, 32, 8, 37, 16},   {8, 64, 16, 50, 16},
                                    {16, 256, 32, 83, 16}, {5, 40, 24, 19, 5},   {3, 17, 3, 9, 4},
                                    {16, 512, 64, 130, 16}, {8, 64, 16, 300, 7}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        attn_case c;
        int H = shapes[s][0], L = shapes[s][1];
        attn_case_make(&c, H, L, shapes[s][2], shapes[s][3], shapes[s][4], 2);
        moeq_attn_args a = attn_args(&c);
        float *ref = malloc((size_t)c.T * H * L * 4), *scores = malloc((size_t)H * (shapes[s][3] + 1) * 4);
        for (int t = 0; t < c.T; t++) moeq_attention_absorbed_block_isa(MOEQ_MM_ISA_SCALAR, &a, t, 0, H, scores);
        memcpy(ref, c.out, (size_t)c.T * H * L * 4);
        for (int i = 0; i < 3; i++) {
            if (!moeq_mm_isa_supported(all_isas[i])) continue;
            for (int hb = 1; hb <= H; hb += (hb < 4 ? 1 : 3)) { /* head blocks of 1, 2, 3, 4, 7, ... */
                memset(c.out, 0xff, (size_t)c.T * H * L * 4);
                for (int t = 0; t < c.T; t++)
                    for (int h0 = 0; h0 < H; h0 += hb)
                        moeq_attention_absorbed_block_isa(all_isas[i], &a, t, h0, h0 + hb < H ? h0 + hb : H, scores);
                assert_memory_equal(c.out, ref, (size_t)c.T * H * L * 4);
            }
        }
        free(ref), free(scores);
        attn_case_free(&c);
    }
}

/*
 * Prefill's grouped attention (moeq_mla_group: up to 4 consecutive query tokens reading each cache row once)
 * gives the bits of one token at a time, for any split of the run into groups and any head block, across
 * output slabs (contexts past 128 rows) and latent/rope tails.
 */
static void grouped_attention_for_prefill_runs_gives_the_bits_of_one_token_at_a_time(void **state) {
    (void)state;
    static const int shapes[][5] = {/* H, L, R, n_ctx, block_tokens */
                                    {4, 32, 8, 4, 16}, {8, 64, 16, 50, 16}, {16, 256, 32, 300, 16},
                                    {5, 40, 24, 19, 5}, {3, 17, 3, 9, 4}, {8, 64, 16, 260, 7}};
    static const int splits[][4] = {{4, 0, 0, 0}, {2, 2, 0, 0}, {3, 1, 0, 0}, {1, 3, 0, 0}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        attn_case c;
        int H = shapes[s][0], L = shapes[s][1], T = 4;
        attn_case_make(&c, H, L, shapes[s][2], shapes[s][3], shapes[s][4], T);
        moeq_attn_args a = attn_args(&c);
        moeq_mla_params p = {moeq_kv_cache_paged(c.cache, a.layer), a.n_tok, a.seq, a.pos, a.n_heads, a.kv_lora,
                             a.rope, a.q_lat, a.q_pe, a.out_lat, a.scale};
        float *ref = malloc((size_t)T * H * L * 4), *scores = malloc((size_t)T * H * (shapes[s][3] + 1) * 4);
        for (int t = 0; t < T; t++) moeq_attention_absorbed_block_isa(MOEQ_MM_ISA_SCALAR, &a, t, 0, H, scores);
        memcpy(ref, c.out, (size_t)T * H * L * 4);
        for (size_t sp = 0; sp < sizeof(splits) / sizeof(splits[0]); sp++)
            for (int hb = 1; hb <= H; hb += (hb < 4 ? 3 : 4)) { /* head blocks of 1, 4, 8, ... */
                memset(c.out, 0xff, (size_t)T * H * L * 4);
                for (int g = 0, t0 = 0; g < 4 && splits[sp][g]; t0 += splits[sp][g], g++)
                    for (int h0 = 0; h0 < H; h0 += hb)
                        moeq_mla_group(&p, t0, splits[sp][g], h0, h0 + hb < H ? h0 + hb : H, scores);
                assert_memory_equal(c.out, ref, (size_t)T * H * L * 4);
            }
        free(ref), free(scores);
        attn_case_free(&c);
    }
}

/* The absorbed kernel against the same formula in float64 (scores, softmax with libm's exp, weighted latents). */
static void attention_matches_a_float64_computation(void **state) {
    (void)state;
    attn_case c;
    int H = 16, L = 256, R = 32, n_ctx = 200;
    attn_case_make(&c, H, L, R, n_ctx, 16, 1);
    moeq_attn_args a = attn_args(&c);
    float *scores = malloc((size_t)H * (n_ctx + 1) * 4);
    moeq_attention_absorbed_block(&a, 0, 0, H, scores);
    double *s = malloc((size_t)n_ctx * sizeof(double)), worst = 0;
    for (int h = 0; h < H; h++) {
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < n_ctx; j++) {
            const float *e = moeq_kv_cache_entry(c.cache, c.seq, 1, j);
            double acc = 0;
            for (int d = 0; d < L; d++) acc += (double)c.ql[h * L + d] * e[d];
            for (int d = 0; d < R; d++) acc += (double)c.qp[h * R + d] * e[L + d];
            s[j] = acc * 0.17f;
            m = s[j] > m ? s[j] : m;
        }
        for (int j = 0; j < n_ctx; j++) sum += (s[j] = exp(s[j] - m));
        for (int d = 0; d < L; d++) {
            double o = 0;
            for (int j = 0; j < n_ctx; j++) o += s[j] / sum * moeq_kv_cache_entry(c.cache, c.seq, 1, j)[d];
            double err = fabs(o - c.out[h * L + d]);
            worst = err > worst ? err : worst;
        }
    }
    print_message("attention: worst |error| %.3g against float64\n", worst);
    assert_true(worst < 1e-5);
    free(s), free(scores);
    attn_case_free(&c);
}

/*
 * AMX attention (cpu_matrix = amx): tokens in groups of 1-8 (prefill) and any head block give the bits of the
 * emulation run on each token alone (decode), across 32-row steps and 64-row slabs (groups whose tokens end
 * on either side of a step), latent/rope tails that are not multiples of 32, scattered blocks; nothing
 * outside the computed heads is written. Each with the rows split per task and split once for the sequence
 * (the backend's prefill; split slab by slab in reverse order, as threads may finish them).
 */
static void amx_attention_matches_its_emulation_bit_for_bit(void **state) {
    (void)state;
    if (!amx_or_skip()) return;
    static const int shapes[][5] = {/* H, L, R, n_ctx, block_tokens */
                                    {4, 32, 8, 4, 16},    {4, 32, 8, 33, 16},    {8, 64, 16, 66, 16},
                                    {16, 256, 32, 130, 16}, {5, 40, 24, 19, 5},  {3, 17, 3, 9, 4},
                                    {16, 512, 64, 97, 16}, {8, 64, 16, 300, 7}, {2, 16, 16, 1, 16}};
    static const int splits[][4] = {{8, 0, 0, 0}, {5, 3, 0, 0}, {4, 4, 0, 0}, {1, 7, 0, 0}, {2, 2, 3, 1}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int H = shapes[s][0], L = shapes[s][1], R = shapes[s][2], n_ctx = shapes[s][3];
        int T = n_ctx < 8 ? n_ctx : 8;
        attn_case c;
        attn_case_make(&c, H, L, R, n_ctx, shapes[s][4], T);
        moeq_attn_args a = attn_args(&c);
        moeq_mla_params p = {moeq_kv_cache_paged(c.cache, a.layer), a.n_tok, a.seq, a.pos, a.n_heads, a.kv_lora,
                             a.rope, a.q_lat, a.q_pe, a.out_lat, a.scale};
        size_t out_bytes = (size_t)T * H * L * 4, wsb = moeq_mla_amx_ws_bytes(L, R);
        float *ref = malloc(out_bytes), *scores = malloc((size_t)MOEQ_MLA_AMX_COLS * (n_ctx + 1) * 4);
        void *ws = aligned_alloc(64, wsb);
        for (int t = 0; t < T; t++) moeq_mla_block_amx_ref(&p, t, 0, H, scores);
        memcpy(ref, c.out, out_bytes);
        const int64_t n = p.pos[T - 1] + 1;
        void *sbuf = aligned_alloc(64, (moeq_mla_amx_split_bytes(L, R, n) + 63) / 64 * 64);
        moeq_mla_amx_split whole = moeq_mla_amx_split_at(L, R, p.seq[0], n, sbuf);
        for (int64_t k = moeq_mla_amx_split_slabs(n) - 1; k >= 0; k--) moeq_mla_amx_split_slab(&p, &whole, k);
        for (int pre = 0; pre < 2; pre++)
            for (size_t sp = 0; sp < sizeof(splits) / sizeof(splits[0]); sp++)
                for (int hb = 1; hb <= H; hb += (hb < 4 ? 3 : 5)) { /* head blocks of 1, 4, 9, ... */
                    if (splits[sp][0] > T) continue;
                    const moeq_mla_amx_split *spl = pre ? &whole : NULL;
                    memset(c.out, 0xff, out_bytes);
                    for (int g = 0, t0 = 0; g < 4 && splits[sp][g] && t0 < T; t0 += splits[sp][g], g++) {
                        int nt = t0 + splits[sp][g] <= T ? splits[sp][g] : T - t0;
                        for (int h0 = 0; h0 < H; h0 += hb) {
                            int h1 = h0 + hb < H ? h0 + hb : H;
                            if (nt * (h1 - h0) <= MOEQ_MLA_AMX_COLS)
                                moeq_mla_group_amx(&p, t0, nt, h0, h1, spl, scores, ws, wsb);
                            else
                                for (int i = 0; i < nt; i++)
                                    moeq_mla_group_amx(&p, t0 + i, 1, h0, h1, spl, scores, ws, wsb);
                        }
                    }
                    assert_memory_equal(c.out, ref, out_bytes);
                }
        free(sbuf);
        free(ref), free(scores), free(ws);
        attn_case_free(&c);
    }
}

/*
 * The AMX attention against the formula in float64, within a bound derived per element: every product of two
 * split operands is off by at most 2.5 * 2^-17 of |a b| (each operand's hi + lo is within 2^-17 of it, and
 * lo * lo is left out), float32 sums add at most n * 2^-24 of the magnitude sum, and a score error ds moves a
 * probability by at most 2 p ds (softmax's derivative), so
 *   |o[d] - o64[d]| <= (2.5 * 2^-17 + n_ctx * 2^-24 + 2 ds) * sum_j p_j |c_j[d]|,
 *   ds = (2.5 * 2^-17 + E * 2^-24) * scale * max_j sum_k |q_k c_jk|.
 * A lost part of a split (2^-9) breaks it at once.
 */
static void amx_attention_is_within_the_float64_tolerance(void **state) {
    (void)state;
    if (!amx_or_skip()) return;
    attn_case c;
    int H = 16, L = 256, R = 32, n_ctx = 200;
    attn_case_make(&c, H, L, R, n_ctx, 16, 1);
    moeq_attn_args a = attn_args(&c);
    moeq_mla_params p = {moeq_kv_cache_paged(c.cache, a.layer), a.n_tok, a.seq, a.pos, a.n_heads, a.kv_lora,
                         a.rope, a.q_lat, a.q_pe, a.out_lat, a.scale};
    size_t wsb = moeq_mla_amx_ws_bytes(L, R);
    float *scores = malloc((size_t)H * (n_ctx + 1) * 4);
    void *ws = aligned_alloc(64, wsb);
    moeq_mla_group_amx(&p, 0, 1, 0, H, NULL, scores, ws, wsb);
    const double split = 2.5 * ldexp(1, -17), sum32 = ldexp(1, -24);
    double *sd = malloc((size_t)n_ctx * sizeof(double)), worst = 0, worst_ratio = 0;
    for (int h = 0; h < H; h++) {
        double m = -INFINITY, sum = 0, mag = 0;
        for (int j = 0; j < n_ctx; j++) {
            const float *e = moeq_kv_cache_entry(c.cache, c.seq, 1, j);
            double acc = 0, am = 0;
            for (int d = 0; d < L; d++) acc += (double)c.ql[h * L + d] * e[d], am += fabs((double)c.ql[h * L + d] * e[d]);
            for (int d = 0; d < R; d++) acc += (double)c.qp[h * R + d] * e[L + d], am += fabs((double)c.qp[h * R + d] * e[L + d]);
            sd[j] = acc * 0.17f;
            m = sd[j] > m ? sd[j] : m;
            mag = am > mag ? am : mag;
        }
        double ds = (split + (L + R) * sum32) * 0.17f * mag;
        for (int j = 0; j < n_ctx; j++) sum += (sd[j] = exp(sd[j] - m));
        for (int d = 0; d < L; d++) {
            double o = 0, pc = 0;
            for (int j = 0; j < n_ctx; j++) {
                double cj = moeq_kv_cache_entry(c.cache, c.seq, 1, j)[d];
                o += sd[j] / sum * cj, pc += sd[j] / sum * fabs(cj);
            }
            double err = fabs(o - c.out[h * L + d]), bound = (split + n_ctx * sum32 + 2 * ds) * pc;
            worst = err > worst ? err : worst;
            worst_ratio = err / bound > worst_ratio ? err / bound : worst_ratio;
        }
    }
    print_message("amx attention: worst |error| %.3g against float64, %.2f of the bound\n", worst, worst_ratio);
    assert_true(worst_ratio <= 1.0);
    assert_true(worst < 4e-5); /* the bound is loose where scores are large: 1.5e-5 seen, float32 lanes 5e-7 */
    free(sd), free(scores), free(ws);
    attn_case_free(&c);
}

/* The softmax's exp: within 2 ulp of libm's over its whole range, exactly 1 at 0, 0 far below. */
static void attention_exp_is_within_two_ulp(void **state) {
    (void)state;
    assert_true(moeq_attention_exp(0.0f) == 1.0f);
    assert_true(moeq_attention_exp(-100.0f) == 0.0f && moeq_attention_exp(-INFINITY) == 0.0f);
    float worst = 0;
    for (float x = -86.9f; x <= 0.0f; x += 0.00731f) {
        double want = exp((double)x);
        float got = moeq_attention_exp(x);
        float ulp = nextafterf((float)want, INFINITY) - (float)want;
        float err = (float)(fabs(got - want) / ulp);
        worst = err > worst ? err : worst;
    }
    print_message("attention exp: worst %.2f ulp\n", worst);
    assert_true(worst <= 2.0f);
}

/* The SiLU product: the vector form gives the scalar form's bits, and both are within 4 ulp of float64. */
static void silu_product_matches_its_scalar_form_and_float64(void **state) {
    (void)state;
    int n = 4099;
    float *g = malloc((size_t)n * 4), *u = malloc((size_t)n * 4), *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) g[i] = frand() * (i < 4000 ? 12.0f : 200.0f), u[i] = frand();
    g[0] = 0.0f, g[1] = -0.0f, g[2] = 100.0f, g[3] = -100.0f, g[4] = -87.5f, g[5] = 87.5f;
    moeq_ops_silu_mul(a, g, u, n);
    moeq_ops_silu_mul_scalar(b, g, u, n);
    assert_memory_equal(a, b, (size_t)n * 4);
    float worst = 0;
    for (int i = 0; i < n; i++) {
        double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        if (fabs(want) < 1e-30) continue;
        float ulp = nextafterf(fabsf((float)want), INFINITY) - fabsf((float)want);
        float err = (float)(fabs(a[i] - want) / ulp);
        worst = err > worst ? err : worst;
    }
    print_message("silu product: worst %.2f ulp\n", worst);
    assert_true(worst <= 4.0f);
    free(g), free(u), free(a), free(b);
}

/* ---- sampler ---------------------------------------------------------------------- */

#define VOCAB 300

static void fill_logits(float *l) {
    for (int i = 0; i < VOCAB; i++) l[i] = frand() * 3;
}

static void greedy_sampling_is_argmax(void **state) {
    (void)state;
    float l[VOCAB];
    moeq_sampler *s;
    assert_int_equal(moeq_sampler_new(NULL, VOCAB, &s), MOEQ_OK);
    for (int r = 0; r < 20; r++) {
        fill_logits(l);
        int best = 0;
        for (int i = 1; i < VOCAB; i++) best = l[i] > l[best] ? i : best;
        assert_int_equal(moeq_sampler_sample(s, l), best);
    }
    moeq_sampler_destroy(s);
}

/* The vectorised argmax is the first maximum, as the plain loop: ties, tails, signed zeros, -inf, NaN rows. */
static void argmax_is_the_first_maximum(void **state) {
    (void)state;
    float l[VOCAB];
    for (int r = 0; r < 400; r++) {
        int n = 1 + r % VOCAB;
        for (int i = 0; i < n; i++) l[i] = (float)(int)(frand() * 4); /* few values: many ties */
        if (r % 7 == 1) l[r % n] = 10.0f, l[(r * 3) % n] = 10.0f;
        if (r % 11 == 2)
            for (int i = 0; i < n; i++) l[i] = i % 2 ? 0.0f : -0.0f;
        if (r % 13 == 3)
            for (int i = 0; i < n; i++) l[i] = -INFINITY;
        if (r % 17 == 4) l[(r * 5) % n] = NAN;
        int best = 0;
        for (int i = 1; i < n; i++) best = l[i] > l[best] ? i : best;
        assert_int_equal(moeq_sampler_argmax(l, n), best);
    }
}

static void seeded_sampling_reproduces_and_seeds_differ(void **state) {
    (void)state;
    float l[VOCAB];
    fill_logits(l);
    moeq_sampling_params p = moeq_sampling_default_params();
    p.temperature = 1.5;
    p.seed = 7;
    moeq_sampler *a, *b, *c;
    assert_int_equal(moeq_sampler_new(&p, VOCAB, &a), MOEQ_OK);
    assert_int_equal(moeq_sampler_new(&p, VOCAB, &b), MOEQ_OK);
    p.seed = 8;
    assert_int_equal(moeq_sampler_new(&p, VOCAB, &c), MOEQ_OK);
    int differ = 0;
    for (int i = 0; i < 50; i++) {
        int32_t x = moeq_sampler_sample(a, l), y = moeq_sampler_sample(b, l), z = moeq_sampler_sample(c, l);
        assert_int_equal(x, y);
        differ += x != z;
    }
    assert_true(differ > 0);
    moeq_sampler_destroy(a), moeq_sampler_destroy(b), moeq_sampler_destroy(c);
}

static void top_k_and_top_p_never_pick_outside_the_allowed_set(void **state) {
    (void)state;
    float l[VOCAB];
    fill_logits(l);
    int order[VOCAB];
    for (int i = 0; i < VOCAB; i++) order[i] = i;
    for (int i = 0; i < VOCAB; i++) /* selection sort by logit desc */
        for (int j = i + 1; j < VOCAB; j++)
            if (l[order[j]] > l[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
    moeq_sampling_params p = moeq_sampling_default_params();
    p.temperature = 5.0; /* flat: without the filters, anything would come */
    p.top_k = 5;
    moeq_sampler *s;
    assert_int_equal(moeq_sampler_new(&p, VOCAB, &s), MOEQ_OK);
    for (int i = 0; i < 500; i++) {
        int32_t id = moeq_sampler_sample(s, l);
        int rank = 0;
        while (order[rank] != id) rank++;
        assert_true(rank < 5);
    }
    moeq_sampler_destroy(s);
    /* top-p: the allowed set is the shortest prefix reaching p of the mass */
    p.top_k = 0;
    p.top_p = 0.3;
    double mass[VOCAB], sum = 0;
    for (int i = 0; i < VOCAB; i++) sum += mass[i] = exp((l[order[i]] - l[order[0]]) / 5.0);
    int allowed = 0;
    for (double acc = 0; allowed < VOCAB && acc < 0.3 * sum;) acc += mass[allowed++];
    assert_int_equal(moeq_sampler_new(&p, VOCAB, &s), MOEQ_OK);
    int seen_beyond_first = 0;
    for (int i = 0; i < 500; i++) {
        int32_t id = moeq_sampler_sample(s, l);
        int rank = 0;
        while (order[rank] != id) rank++;
        assert_true(rank < allowed);
        seen_beyond_first |= rank > 0;
    }
    assert_true(allowed == 1 || seen_beyond_first);
    moeq_sampler_destroy(s);
}

/* ---- pool ---------------------------------------------------------------------------- */

static _Atomic int hits[1000];
static void count_task(void *ctx, int64_t task, int worker) {
    (void)ctx;
    (void)worker;
    atomic_fetch_add(&hits[task], 1);
}

static void pool_runs_every_task_exactly_once(void **state) {
    (void)state;
    moeq_pool *p = moeq_pool_new(3);
    assert_non_null(p);
    for (int round = 1; round <= 200; round++) moeq_pool_run(p, count_task, NULL, 1 + round % 1000 % 997);
    int64_t total = 0;
    for (int i = 0; i < 1000; i++) total += hits[i];
    int64_t want = 0;
    for (int round = 1; round <= 200; round++) want += 1 + round % 1000 % 997;
    assert_int_equal(total, want);
    moeq_pool_destroy(p);
}

/* What each worker ran, in order, and the next task the pool named while it ran it. */
static int64_t ran[3][1000], named[3][1000];
static int n_ran[3];
static void record_task(void *ctx, int64_t task, int worker) {
    ran[worker][n_ran[worker]] = task;
    named[worker][n_ran[worker]++] = moeq_pool_next_task(ctx, worker);
}

/* The AMX kernels fetch the weights of the task the pool names as a worker's next one (moeq_pool_run_ahead): the
 * name must be the task the worker runs next (or -1), every task still runs once, a pool of one names the following
 * task, and moeq_pool_run names none. */
static void pool_names_a_workers_next_task_truthfully(void **state) {
    (void)state;
    for (int threads = 1; threads <= 3; threads += 2) {
        moeq_pool *p = moeq_pool_new(threads);
        assert_non_null(p);
        int named_some = 0;
        for (int n_tasks = 1; n_tasks <= 1000; n_tasks = n_tasks * 3 + 1) {
            memset(n_ran, 0, sizeof n_ran);
            moeq_pool_run_ahead(p, record_task, p, n_tasks);
            static int seen[1000];
            memset(seen, 0, sizeof seen);
            for (int w = 0; w < threads; w++)
                for (int i = 0; i < n_ran[w]; i++) {
                    seen[ran[w][i]]++;
                    if (named[w][i] >= 0) {
                        assert_true(i + 1 < n_ran[w]);
                        assert_int_equal(named[w][i], ran[w][i + 1]);
                        named_some = 1;
                    }
                    if (threads == 1) assert_int_equal(named[w][i], i + 1 < n_tasks ? i + 1 : -1);
                }
            for (int t = 0; t < n_tasks; t++) assert_int_equal(seen[t], 1);
            assert_int_equal(moeq_pool_next_task(p, 0), -1); /* outside a task: none */
        }
        assert_true(named_some);
        memset(n_ran, 0, sizeof n_ran);
        moeq_pool_run(p, record_task, p, 100);
        for (int w = 0; w < threads; w++)
            for (int i = 0; i < n_ran[w]; i++) assert_int_equal(named[w][i], -1);
        moeq_pool_destroy(p);
    }
    assert_int_equal(moeq_pool_next_task(NULL, 0), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernel_matches_its_scalar_emulation_bit_for_bit),
        cmocka_unit_test(kernel_widens_weights_exactly_as_the_loader_does),
        cmocka_unit_test(kernel_matches_openblas_within_tolerance),
        cmocka_unit_test(kernel_output_of_a_token_never_depends_on_the_other_tokens),
        cmocka_unit_test(every_instruction_set_this_cpu_runs_matches_the_emulation_bit_for_bit),
        cmocka_unit_test(kernel_output_of_an_element_never_depends_on_its_block),
        cmocka_unit_test(many_token_blocked_path_matches_the_emulation_bit_for_bit),
        cmocka_unit_test(few_token_stream_tiles_match_the_emulation_bit_for_bit),
        cmocka_unit_test(f8_few_token_tiles_match_the_emulation_in_both_widenings),
        cmocka_unit_test(backend_task_split_for_few_tokens_keeps_the_bits),
        cmocka_unit_test(draft_products_match_their_emulation_bit_for_bit),
        cmocka_unit_test(draft_products_are_within_the_int8_tolerance),
        cmocka_unit_test(draft_backend_output_of_a_token_never_depends_on_the_other_tokens),
        cmocka_unit_test(amx_f8_widening_is_exact_for_every_byte),
        cmocka_unit_test(amx_tiles_match_their_emulation_bit_for_bit),
        cmocka_unit_test(amx_tiles_are_within_the_float64_tolerance),
        cmocka_unit_test(amx_backend_output_of_a_token_never_depends_on_the_other_tokens),
        cmocka_unit_test(engine_params_table_defaults_equal_the_default_params),
        cmocka_unit_test(setting_one_engine_param_leaves_the_others_alone),
        cmocka_unit_test(yarn_mscale_and_frequencies_follow_the_formulas),
        cmocka_unit_test(rope_rotates_interleaved_pairs_into_halves),
        cmocka_unit_test(rmsnorm_and_softmax_are_right),
        cmocka_unit_test(v3_routing_chooses_with_bias_and_weighs_without_it),
        cmocka_unit_test(v3_groups_are_ranked_by_their_top_two_sum),
        cmocka_unit_test(nan_crashes_the_engine_no_more_router_scores_that_are_nan_still_give_valid_experts),
        cmocka_unit_test(a_logits_row_with_nan_or_inf_gives_no_token),
        cmocka_unit_test(overflow_gives_silent_garbage_no_more_an_overflowed_rmsnorm_row_is_nan),
        cmocka_unit_test(v2_applies_the_scaling_factor_only_when_not_normalising),
        cmocka_unit_test(gather_plan_groups_slots_by_expert_in_token_order),
        cmocka_unit_test(kv_cache_pages_truncates_and_refuses_when_full),
        cmocka_unit_test(kv_cache_fork_shares_blocks_and_copies_before_writing_into_them),
        cmocka_unit_test(kv_cache_fork_and_copy_on_write_refuse_without_a_free_block),
        cmocka_unit_test(kv_blocks_share_fork_and_copy_on_write_by_block_id_without_storage),
        cmocka_unit_test(attention_on_every_instruction_set_matches_the_emulation_bit_for_bit),
        cmocka_unit_test(grouped_attention_for_prefill_runs_gives_the_bits_of_one_token_at_a_time),
        cmocka_unit_test(attention_matches_a_float64_computation),
        cmocka_unit_test(amx_attention_matches_its_emulation_bit_for_bit),
        cmocka_unit_test(amx_attention_is_within_the_float64_tolerance),
        cmocka_unit_test(attention_exp_is_within_two_ulp),
        cmocka_unit_test(silu_product_matches_its_scalar_form_and_float64),
        cmocka_unit_test(greedy_sampling_is_argmax),
        cmocka_unit_test(argmax_is_the_first_maximum),
        cmocka_unit_test(seeded_sampling_reproduces_and_seeds_differ),
        cmocka_unit_test(top_k_and_top_p_never_pick_outside_the_allowed_set),
        cmocka_unit_test(pool_runs_every_task_exactly_once),
        cmocka_unit_test(pool_names_a_workers_next_task_truthfully),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
