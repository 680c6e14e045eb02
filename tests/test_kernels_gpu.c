/*
 * test_kernels_gpu.c — every CUDA kernel of engine/cuda against the CPU
 * engine's op on the same inputs. Exact (the same bits) for RMSNorm, the
 * SiLU product, RoPE and the bf16 matmul (batch-invariant too); the router's
 * expert ids exact and its weights within 8 ulp-ish (rtol 1e-6: the engine's
 * sigmoid and softmax call libm's expf, the device has its own). Without a
 * CUDA device the test prints why and exits 77, which ctest reports as
 * skipped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/cuda_kernels.h"

#include "moe.h"
#include "moe_route.h"
#include "ops.h"
#include "ops_matmul.h"
#include "rope.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static float *rand_floats(size_t n, float scale) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}
static void *to_dev(const void *h, size_t bytes) {
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static void from_dev(void *h, const void *d, size_t bytes) {
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}
/* The same bits, or both NaN. */
static void assert_same_bits(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a != b && !(isnan(got[i]) && isnan(want[i])))
            fail_msg("%s: element %zu: gpu %.9g (0x%08x) vs cpu %.9g (0x%08x)", what, i, got[i], a, want[i], b);
    }
}

static void rmsnorm_kernel_gives_the_cpu_engines_bits(void **state) {
    (void)state;
    const int64_t dims[] = {1, 17, 1000, 7168};
    for (size_t d = 0; d < 4; d++) {
        int64_t T = 7, D = dims[d];
        size_t n = (size_t)(T * D);
        float *x = rand_floats(n, 3.0f), *w = rand_floats((size_t)D, 1.0f), *want = malloc(n * 4), *got = malloc(n * 4);
        for (int64_t i = 0; i < D; i++) x[6 * D + i] = 1e20f; /* a row whose sum of squares overflows: NaN */
        for (int64_t t = 0; t < T; t++) moeq_ops_rmsnorm(want + t * D, x + t * D, w, D, 1e-6f);
        float *dx = to_dev(x, n * 4), *dw = to_dev(w, (size_t)D * 4), *dout = to_dev(x, n * 4);
        assert_int_equal(moeq_cuda_rmsnorm(dout, dx, dw, T, D, 1e-6f, NULL), MOEQ_OK);
        from_dev(got, dout, n * 4);
        assert_same_bits(got, want, n, "rmsnorm");
        cudaFree(dx), cudaFree(dw), cudaFree(dout);
        free(x), free(w), free(want), free(got);
    }
}

static void silu_product_kernel_gives_the_cpu_engines_bits(void **state) {
    (void)state;
    int64_t n = 1 << 20;
    float *g = malloc((size_t)n * 4), *u = rand_floats((size_t)n, 2.0f), *want = malloc((size_t)n * 4),
          *got = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) g[i] = -120.0f + 240.0f * (float)i / (float)(n - 1);
    g[0] = -0.0f, g[1] = INFINITY, g[2] = -INFINITY, g[3] = NAN, g[4] = 1e-40f;
    moeq_ops_silu_mul(want, g, u, n);
    float *dg = to_dev(g, (size_t)n * 4), *du = to_dev(u, (size_t)n * 4);
    assert_int_equal(moeq_cuda_silu_mul(dg, dg, du, n, NULL), MOEQ_OK); /* out aliases gate, as forward.c does */
    from_dev(got, dg, (size_t)n * 4);
    assert_same_bits(got, want, (size_t)n, "silu_mul");
    cudaFree(dg), cudaFree(du);
    free(g), free(u), free(want), free(got);
}

static void bf16_matmul_kernel_gives_the_cpu_kernels_bits_at_every_batch(void **state) {
    (void)state;
    int64_t T = 37, K = 7168, O = 515, ldx = K + 3, ldy = O + 1;
    uint16_t *W = malloc((size_t)(O * K) * 2);
    for (int64_t i = 0; i < O * K; i++) W[i] = moeq_f32_to_bf16(frand() * 0.1f);
    float *x = rand_floats((size_t)(T * ldx), 1.0f), *want = calloc((size_t)(T * ldy), 4),
          *got = calloc((size_t)(T * ldy), 4), *one = calloc((size_t)ldy, 4);
    moeq_tensor w = {.name = "w", .dtype = MOEQ_DTYPE_BF16, .ndim = 2, .shape = {O, K}, .data = W,
                     .nbytes = (size_t)(O * K) * 2};
    moeq_mm_job job = {&w, 0, O, x, ldx, want, ldy, T};
    moeq_mm_nt_block(&job, 0, O, 0, T);
    float *dx = to_dev(x, (size_t)(T * ldx) * 4), *dy = to_dev(got, (size_t)(T * ldy) * 4);
    uint16_t *dW = to_dev(W, (size_t)(O * K) * 2);
    assert_int_equal(moeq_cuda_matmul_bf16(dy, ldy, dx, ldx, dW, T, K, O, NULL), MOEQ_OK);
    from_dev(got, dy, (size_t)(T * ldy) * 4);
    assert_same_bits(got, want, (size_t)(T * ldy), "matmul_bf16");
    /* token 13 alone: the same bits as inside the batch */
    assert_int_equal(moeq_cuda_matmul_bf16(dy, ldy, dx + 13 * ldx, ldx, dW, 1, K, O, NULL), MOEQ_OK);
    from_dev(one, dy, (size_t)O * 4);
    assert_same_bits(one, want + 13 * ldy, (size_t)O, "matmul_bf16 (one token)");
    cudaFree(dx), cudaFree(dy), cudaFree(dW);
    free(W), free(x), free(want), free(got), free(one);
}

static void router_kernel_picks_the_cpu_engines_experts(void **state) {
    (void)state;
    moeq_moe_router r = {.n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4, .sigmoid = 1,
                         .method = MOEQ_MOE_NOAUX_TC, .norm_topk_prob = 1, .scale_always = 1, .scaling = 2.5f};
    moeq_cu_router c = {.n_experts = 256, .top_k = 8, .n_group = 8, .topk_group = 4, .sigmoid = 1, .method = 2,
                        .norm_topk_prob = 1, .scale_always = 1, .scaling = 2.5f};
    int64_t T = 300, E = 256, K = 8;
    float *logits = rand_floats((size_t)(T * E), 4.0f), *bias = rand_floats((size_t)E, 0.1f);
    logits[3 * E + 5] = NAN;
    int32_t *ids = malloc((size_t)(T * K) * 4), *gids = malloc((size_t)(T * K) * 4), *fin = malloc((size_t)T * 4);
    float *w = malloc((size_t)(T * K) * 4), *gw = malloc((size_t)(T * K) * 4),
          *scratch = malloc((size_t)moeq_moe_route_scratch(&r) * 4);
    int ok[300];
    for (int64_t t = 0; t < T; t++) ok[t] = moeq_moe_route(&r, logits + t * E, bias, ids + t * K, w + t * K, scratch);
    float *dl = to_dev(logits, (size_t)(T * E) * 4), *db = to_dev(bias, (size_t)E * 4), *dw = to_dev(w, (size_t)(T * K) * 4);
    int32_t *di = to_dev(ids, (size_t)(T * K) * 4), *df = to_dev(fin, (size_t)T * 4);
    assert_int_equal(moeq_cuda_moe_route(di, dw, df, dl, db, T, c, NULL), MOEQ_OK);
    from_dev(gids, di, (size_t)(T * K) * 4);
    from_dev(gw, dw, (size_t)(T * K) * 4);
    from_dev(fin, df, (size_t)T * 4);
    for (int64_t t = 0; t < T; t++) {
        assert_int_equal(fin[t], ok[t]);
        if (!ok[t]) continue; /* a flagged token's weights may be NaN */
        assert_memory_equal(gids + t * K, ids + t * K, (size_t)K * 4);
        for (int64_t s = 0; s < K; s++)
            if (!(fabsf(gw[t * K + s] - w[t * K + s]) <= 1e-6f * fabsf(w[t * K + s])))
                fail_msg("token %lld slot %lld: gpu weight %.9g vs cpu %.9g", (long long)t, (long long)s,
                         gw[t * K + s], w[t * K + s]);
    }
    cudaFree(dl), cudaFree(db), cudaFree(dw), cudaFree(di), cudaFree(df);
    free(logits), free(bias), free(ids), free(gids), free(fin), free(w), free(gw), free(scratch);
}

static void rope_kernel_writes_the_cpu_engines_halves_layout(void **state) {
    (void)state;
    int dim = 64, half = 32, max_pos = 4096;
    int64_t T = 9, H = 16, ldx = 192, ldo = 64;
    moeq_rope rope = {.dim = dim, .mscale = 1.2};
    for (int i = 0; i < half; i++) rope.inv_freq[i] = pow(10000.0, -2.0 * i / dim);
    float *cs = malloc((size_t)max_pos * half * 4), *sn = malloc((size_t)max_pos * half * 4);
    for (int p = 0; p < max_pos; p++) moeq_rope_cos_sin(&rope, p, cs + p * half, sn + p * half);
    int32_t pos[9] = {0, 1, 2, 3, 10, 200, 4000, 4094, 4095};
    size_t nx = (size_t)(T * H * ldx), no = (size_t)(T * H * ldo);
    float *x = rand_floats(nx, 1.0f), *want = calloc(no, 4), *got = calloc(no, 4);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            moeq_rope_apply(&rope, x + (t * H + h) * ldx + 128, cs + pos[t] * half, sn + pos[t] * half,
                            want + (t * H + h) * ldo);
    float *dx = to_dev(x, nx * 4), *dout = to_dev(want, no * 4), *dc = to_dev(cs, (size_t)max_pos * half * 4),
          *ds = to_dev(sn, (size_t)max_pos * half * 4);
    assert_int_equal(cudaMemset(dout, 0, no * 4), cudaSuccess);
    int32_t *dp = to_dev(pos, sizeof pos);
    assert_int_equal(moeq_cuda_rope(dout, ldo, dx + 128, ldx, dp, dc, ds, T, H, dim, NULL), MOEQ_OK);
    from_dev(got, dout, no * 4);
    assert_same_bits(got, want, no, "rope");
    cudaFree(dx), cudaFree(dout), cudaFree(dc), cudaFree(ds), cudaFree(dp);
    free(x), free(want), free(got), free(cs), free(sn);
}

int main(void) {
    char why[256];
    if (moeq_cuda_device_count(why, sizeof why) == 0) {
        printf("SKIP test_kernels_gpu: %s\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rmsnorm_kernel_gives_the_cpu_engines_bits),
        cmocka_unit_test(silu_product_kernel_gives_the_cpu_engines_bits),
        cmocka_unit_test(bf16_matmul_kernel_gives_the_cpu_kernels_bits_at_every_batch),
        cmocka_unit_test(router_kernel_picks_the_cpu_engines_experts),
        cmocka_unit_test(rope_kernel_writes_the_cpu_engines_halves_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
