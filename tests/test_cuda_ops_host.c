/*
 * test_cuda_ops_host.c — the CUDA kernels' arithmetic and index math
 * (engine/cuda/ops.cuh, the same inline functions the kernels call) run on
 * the host against the CPU engine's ops, bit for bit, over many shapes. The
 * kernels' thread grids are emulated here: every (block, thread) a launch
 * would run, the 16-lane butterfly by its host form. No GPU needed; what it
 * cannot show (the device compiler's code) test_kernels_gpu checks on a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "moe_route.h"
#include "ops.h"
#include "ops_exp.h"
#include "ops_lanes.h"
#include "ops_matmul.h"
#include "rope.h"

#include "ops.cuh"

_Static_assert(MOEQ_CU_DTYPE_F32 == MOEQ_DTYPE_F32 && MOEQ_CU_DTYPE_BF16 == MOEQ_DTYPE_BF16 &&
                   MOEQ_CU_DTYPE_F16 == MOEQ_DTYPE_F16 && MOEQ_CU_DTYPE_F8_E4M3 == MOEQ_DTYPE_F8_E4M3 &&
                   MOEQ_CU_F8_BLOCK == MOEQ_F8_BLOCK,
               "ops.cuh numbers the engine's dtypes");
_Static_assert(MOEQ_MOE_GREEDY == 0 && MOEQ_MOE_GROUP_LIMITED_GREEDY == 1 && MOEQ_MOE_NOAUX_TC == 2,
               "moeq_cu_router.method numbers the engine's methods");

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
}
static float *rand_floats(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

/* The same bits, or both NaN (a NaN's payload is no promise of the engine's). */
static void assert_same_bits(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a != b && !(isnan(got[i]) && isnan(want[i])))
            fail_msg("%s: element %zu: helper %.9g (0x%08x) vs engine %.9g (0x%08x)", what, i, got[i], a, want[i], b);
    }
}

/* ops.cuh compiled as C++ (test_cuda_ops_cxx.cpp) */
float moeq_cu_cxx_silu_mul(float g, float u);
float moeq_cu_cxx_exp_nonpos(float x);
void moeq_cu_cxx_rope_pair(const float *x, float cs, float sn, int64_t i, int64_t half, float *out);
float moeq_cu_cxx_rmsnorm(float sumsq, int64_t n, float eps, float x, float w);
float moeq_cu_cxx_dot_lane(const float *a, const float *b, int64_t n, int lane);
float moeq_cu_cxx_widen(int dtype, const void *W, const float *scale_inv, int64_t cols, int64_t row, int64_t k);

/* ---- the 16-lane reduction ---------------------------------------------------------- */

static void the_device_butterfly_is_the_engines_reduction_tree(void **state) {
    (void)state;
    for (int rep = 0; rep < 2000; rep++) {
        float lanes[16], v[16];
        for (int i = 0; i < 16; i++) {
            float s = ldexpf(1.0f, (int)(frand() * 40)); /* magnitudes far apart: the order shows in the bits */
            lanes[i] = rep % 7 == 0 && i % 3 == 0 ? -0.0f : frand() * s;
        }
        memcpy(v, lanes, sizeof v);
        moeq_cu_butterfly16(v);
        float want = moeq_tree16(lanes);
        for (int i = 0; i < 16; i++) assert_same_bits(&v[i], &want, 1, "butterfly lane");
    }
}

static float dot_by_lanes(const float *a, const float *b, int64_t n) {
    float v[16];
    for (int l = 0; l < 16; l++) v[l] = moeq_cu_dot_lane(a, b, n, l);
    moeq_cu_butterfly16(v);
    return v[0];
}

static void dot_lanes_give_moeq_dot_f32_bits_for_every_length(void **state) {
    (void)state;
    for (int64_t n = 1; n <= 1100; n += n < 70 ? 1 : 37) {
        float *a = rand_floats((size_t)n, 3.0f), *b = rand_floats((size_t)n, 1e3f);
        float got = dot_by_lanes(a, b, n), want = moeq_dot_f32(a, b, n),
              scalar = moeq_dot_f32_isa(MOEQ_MM_ISA_SCALAR, a, b, n);
        assert_same_bits(&got, &want, 1, "dot");
        assert_same_bits(&got, &scalar, 1, "dot (scalar)");
        free(a), free(b);
    }
}

/* ---- exp, RMSNorm, SiLU --------------------------------------------------------------- */

static void the_fixed_polynomial_exp_matches_the_engines(void **state) {
    (void)state;
    for (int i = 0; i <= 200000; i++) {
        float x = -100.0f * (float)i / 200000.0f, got = moeq_cu_exp_nonpos(x), want = moeq_exp_nonpos(x);
        assert_same_bits(&got, &want, 1, "exp");
    }
    const float special[] = {-0.0f, 0.0f, -INFINITY, NAN, -87.0f, -86.99999f, -1e-30f, -1e-45f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        float got = moeq_cu_exp_nonpos(special[i]), want = moeq_exp_nonpos(special[i]);
        assert_same_bits(&got, &want, 1, "exp (special)");
    }
}

/* The rmsnorm kernel's work for one row: 16 lane threads, the butterfly, every thread's elements. */
static void rmsnorm_emulated(float *out, const float *x, const float *w, int64_t D, float eps) {
    float v[16];
    for (int l = 0; l < 16; l++) v[l] = moeq_cu_dot_lane(x, x, D, l);
    moeq_cu_butterfly16(v);
    float r = moeq_cu_rmsnorm_factor(v[0], D, eps);
    for (int64_t i = 0; i < D; i++) out[i] = moeq_cu_rmsnorm_elem(x[i], w[i], r);
}

static void rmsnorm_helpers_give_the_engines_bits_over_many_shapes(void **state) {
    (void)state;
    const int64_t dims[] = {1, 2, 15, 16, 17, 31, 100, 512, 1000, 1536, 7168};
    const float scales[] = {1e-3f, 1.0f, 30.0f, 1e20f /* the sum of squares overflows: NaN rows */};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            int64_t D = dims[d];
            float *x = rand_floats((size_t)D, scales[s]), *w = rand_floats((size_t)D, 2.0f);
            float *got = malloc((size_t)D * 4), *want = malloc((size_t)D * 4);
            rmsnorm_emulated(got, x, w, D, 1e-6f);
            moeq_ops_rmsnorm(want, x, w, D, 1e-6f);
            assert_same_bits(got, want, (size_t)D, "rmsnorm");
            free(x), free(w), free(got), free(want);
        }
}

static void silu_product_helper_gives_the_engines_bits(void **state) {
    (void)state;
    int64_t n = 300001;
    float *g = malloc((size_t)n * 4), *u = rand_floats((size_t)n, 4.0f);
    for (int64_t i = 0; i < n; i++) g[i] = -120.0f + 240.0f * (float)i / (float)(n - 1); /* past exp's -87 */
    g[0] = -0.0f, g[1] = 0.0f, g[2] = INFINITY, g[3] = -INFINITY, g[4] = NAN, g[5] = 1e-40f, g[6] = -1e-40f;
    float *got = malloc((size_t)n * 4), *want = malloc((size_t)n * 4), *scalar = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) got[i] = moeq_cu_silu_mul(g[i], u[i]);
    moeq_ops_silu_mul(want, g, u, n);
    moeq_ops_silu_mul_scalar(scalar, g, u, n);
    assert_same_bits(got, want, (size_t)n, "silu_mul");
    assert_same_bits(got, scalar, (size_t)n, "silu_mul (scalar)");
    free(g), free(u), free(got), free(want), free(scalar);
}

/* ---- RoPE -------------------------------------------------------------------------------- */

static void rope_helpers_give_the_engines_halves_layout_over_many_shapes(void **state) {
    (void)state;
    const int dims[] = {2, 8, 64, 128};
    const int64_t heads[] = {1, 3, 16}, toks[] = {1, 5};
    for (size_t di = 0; di < 4; di++)
        for (size_t hi = 0; hi < 3; hi++)
            for (size_t ti = 0; ti < 2; ti++) {
                int dim = dims[di], half = dim / 2, max_pos = 70;
                int64_t H = heads[hi], T = toks[ti], ldx = dim + 7, ldo = dim + 3;
                moeq_rope rope = {.dim = dim, .mscale = 1.2345};
                for (int i = 0; i < half; i++) rope.inv_freq[i] = pow(10000.0, -2.0 * i / dim) / (i % 3 ? 1.0 : 40.0);
                float *cs = malloc((size_t)max_pos * half * 4), *sn = malloc((size_t)max_pos * half * 4);
                for (int p = 0; p < max_pos; p++) moeq_rope_cos_sin(&rope, p, cs + p * half, sn + p * half);
                int32_t pos[5] = {0, 69, 1, 33, 2};
                float *x = rand_floats((size_t)(T * H * ldx), 2.0f);
                size_t on = (size_t)(T * H * ldo);
                float *got = malloc(on * 4), *want = malloc(on * 4);
                for (size_t i = 0; i < on; i++) got[i] = want[i] = -7.0f; /* what no thread may touch stays */
                for (int64_t idx = 0; idx < T * H * half; idx++) { /* the kernel's grid, one thread each */
                    moeq_cu_rope_at a = moeq_cu_rope_index(idx, H, half);
                    int64_t row = (int64_t)pos[a.t] * half + a.i;
                    moeq_cu_rope_pair(x + (a.t * H + a.h) * ldx, cs[row], sn[row], a.i, half,
                                      got + (a.t * H + a.h) * ldo);
                }
                for (int64_t t = 0; t < T; t++)
                    for (int64_t h = 0; h < H; h++)
                        moeq_rope_apply(&rope, x + (t * H + h) * ldx, cs + pos[t] * half, sn + pos[t] * half,
                                        want + (t * H + h) * ldo);
                assert_same_bits(got, want, on, "rope");
                free(cs), free(sn), free(x), free(got), free(want);
            }
}

/* ---- bf16 matmul ---------------------------------------------------------------------------- */

/* Every (block, thread) of a launch: each half-warp's 16 lane threads, the butterfly, lane 0 stores.
 * dtype < 0: the bf16 kernel's helper. */
static void matmul_emulated(float *y, int64_t ldy, const float *x, int64_t ldx, int dtype, const void *W,
                            const float *scale_inv, int64_t T, int64_t K, int64_t O, int *writes) {
    for (int64_t bx = 0; bx < moeq_cu_mm_grid_x(O); bx++)
        for (int64_t by = 0; by < moeq_cu_mm_grid_y(T); by++)
            for (int r = 0; r < MOEQ_CU_MM_ROWS; r++) {
                float acc[16][MOEQ_CU_MM_TILE_T];
                moeq_cu_mm_at at[16];
                for (int l = 0; l < 16; l++) {
                    at[l] = moeq_cu_mm_index(bx, by, r * 16 + l, T, O);
                    assert_int_equal(at[l].lane, l);
                    if (at[l].nt > 0 && dtype < 0) moeq_cu_mm_bf16_lanes(acc[l], at[l], x, ldx, W, K);
                    else if (at[l].nt > 0) moeq_cu_mm_lanes(acc[l], at[l], x, ldx, dtype, W, scale_inv, K);
                }
                for (int j = 0; j < at[0].nt; j++) {
                    float v[16];
                    for (int l = 0; l < 16; l++) v[l] = acc[l][j];
                    moeq_cu_butterfly16(v);
                    y[(at[0].t0 + j) * ldy + at[0].o] = v[0];
                    writes[(at[0].t0 + j) * O + at[0].o]++;
                }
            }
}

static void matmul_tiles_give_the_cpu_kernels_bits_and_cover_every_output(void **state) {
    (void)state;
    const int64_t Ts[] = {1, 2, 7, 8, 9, 33}, Ks[] = {1, 15, 16, 17, 301, 1024}, Os[] = {1, 7, 8, 9, 133};
    for (size_t ti = 0; ti < 6; ti++)
        for (size_t ki = 0; ki < 6; ki++)
            for (size_t oi = 0; oi < 5; oi++) {
                int64_t T = Ts[ti], K = Ks[ki], O = Os[oi], ldx = K + 5, ldy = O + 2;
                uint16_t *W = malloc((size_t)(O * K) * 2);
                for (int64_t i = 0; i < O * K; i++) W[i] = moeq_f32_to_bf16(frand() * 0.5f);
                float *x = rand_floats((size_t)(T * ldx), 1.0f);
                float *got = calloc((size_t)(T * ldy), 4), *want = calloc((size_t)(T * ldy), 4),
                      *scalar = calloc((size_t)(T * ldy), 4);
                int *writes = calloc((size_t)(T * O), sizeof(int));
                matmul_emulated(got, ldy, x, ldx, -1, W, NULL, T, K, O, writes);
                for (int64_t i = 0; i < T * O; i++) assert_int_equal(writes[i], 1);
                moeq_tensor w = {.name = "w", .dtype = MOEQ_DTYPE_BF16, .ndim = 2, .shape = {O, K}, .data = W,
                                 .nbytes = (size_t)(O * K) * 2};
                moeq_mm_job job = {&w, 0, O, x, ldx, want, ldy, T};
                moeq_mm_nt_block(&job, 0, O, 0, T);
                job.y = scalar;
                moeq_mm_nt_block_scalar(&job, 0, O, 0, T);
                assert_same_bits(got, want, (size_t)(T * ldy), "matmul_bf16");
                assert_same_bits(got, scalar, (size_t)(T * ldy), "matmul_bf16 (scalar)");
                free(W), free(x), free(got), free(want), free(scalar), free(writes);
            }
}

/* A [rows, cols] weight of dtype dt with values in [-0.5, 0.5) (F8: with block scales, partial blocks). */
typedef struct fake_weight {
    moeq_tensor t, scale;
    void *data;
    float *sdata;
} fake_weight;

static void fake_weight_make(fake_weight *f, moeq_dtype dt, int64_t rows, int64_t cols) {
    memset(f, 0, sizeof(*f));
    size_t n = (size_t)(rows * cols);
    f->data = malloc(n * moeq_dtype_size(dt));
    f->t = (moeq_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = f->data,
                         .nbytes = n * moeq_dtype_size(dt)};
    int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    if (dt == MOEQ_DTYPE_F8_E4M3) {
        f->sdata = malloc((size_t)(rb * cb) * sizeof(float));
        for (int64_t i = 0; i < rb * cb; i++) f->sdata[i] = 0.5f / 448.0f * (float)(1 + i % 3);
        f->scale = (moeq_tensor){.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {rb, cb},
                                 .data = f->sdata, .nbytes = (size_t)(rb * cb) * 4};
        f->t.scale_inv = &f->scale;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            size_t i = (size_t)(r * cols + c);
            float v = frand() * 0.5f;
            if (i % 97 == 5) v = ldexpf(v, -20); /* small values: F16 and F8 subnormals */
            switch (dt) {
            case MOEQ_DTYPE_F32: ((float *)f->data)[i] = v; break;
            case MOEQ_DTYPE_BF16: ((uint16_t *)f->data)[i] = moeq_f32_to_bf16(v); break;
            case MOEQ_DTYPE_F16: ((uint16_t *)f->data)[i] = moeq_f32_to_f16(v); break;
            case MOEQ_DTYPE_F8_E4M3:
                ((uint8_t *)f->data)[i] = moeq_f32_to_f8_e4m3(v / f->sdata[(r / 128) * cb + c / 128]);
                break;
            case MOEQ_DTYPE_Q8R: break; /* made by moeq_tensor_q8r_copy, not here */
            }
        }
}

static void matmul_lanes_widen_every_stored_dtype_as_the_cpu_kernels(void **state) {
    (void)state;
    const moeq_dtype dts[] = {MOEQ_DTYPE_F32, MOEQ_DTYPE_BF16, MOEQ_DTYPE_F16, MOEQ_DTYPE_F8_E4M3};
    const int64_t shapes[][3] = {{7, 301, 133}, {1, 128, 128}, {9, 257, 129}, {3, 17, 300}}; /* T, K, O */
    for (size_t d = 0; d < 4; d++)
        for (size_t s = 0; s < 4; s++) {
            int64_t T = shapes[s][0], K = shapes[s][1], O = shapes[s][2];
            fake_weight f;
            fake_weight_make(&f, dts[d], O, K);
            float *x = rand_floats((size_t)(T * K), 1.0f), *got = calloc((size_t)(T * O), 4),
                  *want = calloc((size_t)(T * O), 4);
            int *writes = calloc((size_t)(T * O), sizeof(int));
            matmul_emulated(got, O, x, K, (int)dts[d], f.data, f.sdata, T, K, O, writes);
            moeq_mm_job job = {&f.t, 0, O, x, K, want, O, T};
            moeq_mm_nt_block(&job, 0, O, 0, T);
            assert_same_bits(got, want, (size_t)(T * O), moeq_dtype_name(dts[d]));
            /* every element widened alone, against the engine's own widening */
            float *row = malloc((size_t)K * 4);
            for (int64_t r = 0; r < O; r += 37) {
                moeq_tensor_rows_to_f32(&f.t, r, 1, row);
                for (int64_t k = 0; k < K; k++) {
                    float v = moeq_cu_widen((int)dts[d], f.data, f.sdata, K, r, k);
                    assert_same_bits(&v, &row[k], 1, "widen");
                }
            }
            free(row), free(x), free(got), free(want), free(writes), free(f.data), free(f.sdata);
        }
}

static void a_tile_past_the_matrix_computes_nothing(void **state) {
    (void)state;
    /* O = 9: block 1's half-warps 1..7 are past the last row; T = 9: tile 1 holds one token */
    assert_int_equal(moeq_cu_mm_index(1, 0, 1 * 16 + 3, 9, 9).nt, 0);
    assert_int_equal(moeq_cu_mm_index(1, 0, 0 * 16 + 3, 9, 9).nt, 8);
    assert_int_equal(moeq_cu_mm_index(0, 1, 5, 9, 9).nt, 1);
    assert_int_equal(moeq_cu_mm_index(0, 2, 5, 9, 9).nt, 0);
}

/* ---- router ------------------------------------------------------------------------------------ */

static moeq_cu_router cu_router_of(const moeq_moe_router *r) {
    moeq_cu_router c = {.n_experts = r->n_experts, .top_k = r->top_k, .n_group = r->n_group,
                        .topk_group = r->topk_group, .sigmoid = r->sigmoid, .method = (int)r->method,
                        .norm_topk_prob = r->norm_topk_prob, .scale_always = r->scale_always,
                        .scaling = r->scaling};
    return c;
}

/* backend_cuda.cu's route_warp_kernel for one token, its 32 lanes played in turn between its warp barriers (lane
 * loops stand for the lanes' strided loops, a tree of moeq_cu_pick_better for the shuffles' butterfly). */
static int route_warp_emulated(const moeq_cu_router *r, const float *lg, const float *bias, int32_t *id, float *wt) {
    enum { W = MOEQ_CU_WARP };
    int n = r->n_experts, fin = 1;
    float scores[MOEQ_CU_ROUTE_MAX_EXPERTS], choice[MOEQ_CU_ROUTE_MAX_EXPERTS], gscore[MOEQ_CU_ROUTE_MAX_EXPERTS];
    for (int lane = 0; lane < W; lane++)
        for (int i = lane; i < n; i += W) fin &= isfinite(lg[i]) != 0, scores[i] = moeq_cu_route_score(r, lg[i]);
    if (!r->sigmoid) moeq_cu_softmax(scores, n);
    for (int lane = 0; lane < W; lane++)
        for (int i = lane; i < n; i += W) choice[i] = scores[i] + (bias && r->method == 2 ? bias[i] : 0.0f);
    if (r->method != 0 && r->n_group > 1) {
        int size = n / r->n_group;
        for (int lane = W - 1; lane >= 0; lane--) /* any lane order */
            for (int g = lane; g < r->n_group; g += W) gscore[g] = moeq_cu_group_score(r, choice + g * size, size);
        for (int kept = 0; kept < r->topk_group; kept++) {
            int g = moeq_cu_argmax_first(gscore, r->n_group);
            if (g < 0) break;
            gscore[g] = NAN;
        }
        for (int i = 0; i < n; i++)
            if (!isnan(gscore[i / size])) choice[i] = -INFINITY;
    }
    float sum = 0.0f;
    for (int s = 0; s < r->top_k; s++) {
        moeq_cu_pick p[W];
        for (int lane = 0; lane < W; lane++) p[lane] = moeq_cu_pick_lane(choice, n, lane);
        for (int m = W / 2; m > 0; m >>= 1) { /* the xor butterfly: every lane ends with the same pick */
            moeq_cu_pick q[W];
            for (int lane = 0; lane < W; lane++) q[lane] = moeq_cu_pick_better(p[lane], p[lane ^ m]);
            memcpy(p, q, sizeof p);
        }
        for (int lane = 1; lane < W; lane++) assert_int_equal(p[lane].i, p[0].i);
        int e = p[0].i >= 0 ? p[0].i : moeq_cu_first_unpicked(id, s);
        choice[e] = -INFINITY;
        id[s] = e, wt[s] = scores[e], sum += scores[e];
    }
    moeq_cu_route_weights(r, wt, sum);
    return fin;
}

static void router_helper_routes_as_the_engine_for_every_method(void **state) {
    (void)state;
    const moeq_moe_router routers[] = {
        /* DeepSeek-V3: sigmoid, noaux_tc, 8 groups keep 4, top-8, normalised then scaled */
        {.n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4, .sigmoid = 1, .method = MOEQ_MOE_NOAUX_TC,
         .norm_topk_prob = 1, .scale_always = 1, .scaling = 2.5f},
        {.n_experts = 64, .top_k = 6, .n_group = 8, .topk_group = 3, .sigmoid = 1, .method = MOEQ_MOE_NOAUX_TC,
         .norm_topk_prob = 1, .scale_always = 1, .scaling = 1.5f},
        /* V2-Lite: softmax, greedy, not normalised, scaled */
        {.n_experts = 64, .top_k = 6, .n_group = 1, .topk_group = 1, .sigmoid = 0, .method = MOEQ_MOE_GREEDY,
         .norm_topk_prob = 0, .scale_always = 0, .scaling = 1.0f},
        /* V2: group-limited greedy (group score = max), normalised */
        {.n_experts = 160, .top_k = 6, .n_group = 8, .topk_group = 3, .sigmoid = 0,
         .method = MOEQ_MOE_GROUP_LIMITED_GREEDY, .norm_topk_prob = 1, .scale_always = 0, .scaling = 16.0f},
        /* one expert per group, top-1 */
        {.n_experts = 8, .top_k = 1, .n_group = 8, .topk_group = 2, .sigmoid = 1, .method = MOEQ_MOE_NOAUX_TC,
         .norm_topk_prob = 1, .scale_always = 1, .scaling = 2.0f},
    };
    for (size_t ri = 0; ri < sizeof routers / sizeof routers[0]; ri++)
        for (int use_bias = 0; use_bias < 2; use_bias++) {
            const moeq_moe_router *r = &routers[ri];
            moeq_cu_router c = cu_router_of(r);
            int E = r->n_experts, K = r->top_k, T = 64;
            float *logits = rand_floats((size_t)T * E, 4.0f), *bias = rand_floats((size_t)E, 0.1f);
            for (int e = 0; e < E; e++) logits[1 * E + e] = (float)(e % 5) * 0.25f; /* ties everywhere */
            logits[2 * E + 3] = NAN, logits[3 * E + 0] = INFINITY, logits[4 * E + 7] = -INFINITY;
            for (int e = 0; e < E; e++) logits[5 * E + e] = NAN;
            float *scratch = malloc((size_t)moeq_moe_route_scratch(r) * 4), cscratch[3 * MOEQ_CU_ROUTE_MAX_EXPERTS];
            for (int t = 0; t < T; t++) {
                int32_t ids[8], cids[8];
                float w[8], cw[8];
                const float *l = logits + (size_t)t * E, *b = use_bias ? bias : NULL;
                int ok = moeq_moe_route(r, l, b, ids, w, scratch), cok = moeq_cu_route(&c, l, b, cids, cw, cscratch);
                assert_int_equal(cok, ok);
                assert_memory_equal(cids, ids, (size_t)K * 4);
                assert_same_bits(cw, w, (size_t)K, "router weights");
                int32_t wids[8];
                float ww[8];
                assert_int_equal(route_warp_emulated(&c, l, b, wids, ww), ok);
                assert_memory_equal(wids, ids, (size_t)K * 4);
                assert_same_bits(ww, w, (size_t)K, "router weights, a warp a token");
            }
            free(logits), free(bias), free(scratch);
        }
}

static void the_helpers_compiled_as_cxx_give_the_c_builds_bits(void **state) {
    (void)state;
    for (int rep = 0; rep < 100000; rep++) {
        float a = frand() * 50.0f, b = frand() * 3.0f, c = frand(), d = frand(), got, want;
        got = moeq_cu_cxx_silu_mul(a, b), want = moeq_cu_silu_mul(a, b);
        assert_same_bits(&got, &want, 1, "silu_mul (C++)");
        got = moeq_cu_cxx_exp_nonpos(-fabsf(a)), want = moeq_cu_exp_nonpos(-fabsf(a));
        assert_same_bits(&got, &want, 1, "exp (C++)");
        got = moeq_cu_cxx_rmsnorm(fabsf(a) * 1e3f, 7168, 1e-6f, b, c), want = moeq_cu_rmsnorm_elem(b, c,
                                                                          moeq_cu_rmsnorm_factor(fabsf(a) * 1e3f, 7168, 1e-6f));
        assert_same_bits(&got, &want, 1, "rmsnorm (C++)");
        float x[2] = {a, b}, o1[2], o2[2];
        moeq_cu_cxx_rope_pair(x, c, d, 0, 1, o1);
        moeq_cu_rope_pair(x, c, d, 0, 1, o2);
        assert_same_bits(o1, o2, 2, "rope (C++)");
    }
    float *va = rand_floats(1000, 5.0f), *vb = rand_floats(1000, 5.0f);
    for (int l = 0; l < 16; l++) {
        float got = moeq_cu_cxx_dot_lane(va, vb, 1000, l), want = moeq_cu_dot_lane(va, vb, 1000, l);
        assert_same_bits(&got, &want, 1, "dot lane (C++)");
    }
    fake_weight f;
    fake_weight_make(&f, MOEQ_DTYPE_F8_E4M3, 130, 260);
    for (int64_t k = 0; k < 260; k++) {
        float got = moeq_cu_cxx_widen(MOEQ_CU_DTYPE_F8_E4M3, f.data, f.sdata, 260, 129, k),
              want = moeq_cu_widen(MOEQ_CU_DTYPE_F8_E4M3, f.data, f.sdata, 260, 129, k);
        assert_same_bits(&got, &want, 1, "widen (C++)");
    }
    free(va), free(vb), free(f.data), free(f.sdata);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_device_butterfly_is_the_engines_reduction_tree),
        cmocka_unit_test(dot_lanes_give_moeq_dot_f32_bits_for_every_length),
        cmocka_unit_test(the_fixed_polynomial_exp_matches_the_engines),
        cmocka_unit_test(rmsnorm_helpers_give_the_engines_bits_over_many_shapes),
        cmocka_unit_test(silu_product_helper_gives_the_engines_bits),
        cmocka_unit_test(rope_helpers_give_the_engines_halves_layout_over_many_shapes),
        cmocka_unit_test(matmul_tiles_give_the_cpu_kernels_bits_and_cover_every_output),
        cmocka_unit_test(matmul_lanes_widen_every_stored_dtype_as_the_cpu_kernels),
        cmocka_unit_test(a_tile_past_the_matrix_computes_nothing),
        cmocka_unit_test(router_helper_routes_as_the_engine_for_every_method),
        cmocka_unit_test(the_helpers_compiled_as_cxx_give_the_c_builds_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
