/*
 * test_backend_cuda_gpu.c (label gpu) — the CUDA backend against the CPU
 * backend: every op on the same inputs, then whole models through the
 * engine, then batch invariance on the device. Models are written here with
 * the genmodel library (no CLI needed: the GPU check builds only the engine).
 * Without a device: `SKIP test_backend_cuda_gpu: <reason>`, exit 77. With --cpu-standin (ctest
 * test_backend_cuda_gpu_harness, label unit) every case runs against the CPU backend dressed as a device
 * (not host_visible, no route scratch), on every machine: the harness is checked before a device sees it.
 *
 * Tolerances (docs/CUDA.md): same bits for the ops whose kernels run the
 * CPU's order (matmul NT and NN in batch-invariant mode, embed, rmsnorm,
 * rope_cos_sin, mla_rope, silu_mul, add, gather, combine); route: equal ids
 * and finite flags, weights rtol 1e-6 (the device's expf); attention
 * (split-KV): 2e-6 abs + 2e-6 rel; naive attention 1e-4 of the largest
 * output; cuBLAS SGEMM: 1e-4 of the largest |y|; whole-model logits against
 * the CPU engine: 1e-4 of the largest |logit| (invariant) and 1e-3
 * (cuBLAS), equal greedy choices where the CPU's top-1 margin exceeds that;
 * logits records: equal argmax, flags and candidates, sums within
 * moeq_logits_sum_bound.
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

#include "backend.h"
#include "expert_hold.h"
#include "model.h"
#include "moe.h"
#include "moeq/cuda_kernels.h"
#include "moeq/engine.h"
#include "moeq/genmodel.h"
#include "rope.h"

#define SKIP_CODE 77
#define MOEQ_CU_ROUTE_EXPERTS_CAP 256 /* the device router's most experts: moe_experts' jobs on the CPU */

static char model_root[256];
/* the three the op and whole-model cases run, tiny-mtp for MTP, then small (rows of 256: whole groups of the few-token
 * kernels' loads, which tiny's 64 never fill) in bf16 and f8 for the matmuls */
static moeq_model *models[6];
static const char *const model_names[6] = {"tiny bf16", "tiny f8", "tiny-v2 bf16", "tiny-mtp bf16", "small bf16",
                                           "small f8"};

/* The backend under test: "cuda", or with --cpu-standin the CPU backend behind the device's contract (not
 * host_visible, no route scratch), so that the harness itself is checked on every machine (label unit): a
 * device run then fails only for what the device does. */
static const char *gpu_name = "cuda";
static void (*standin_cpu_route)(moeq_backend *, const moeq_route_params *);
static float standin_scratch[4 * 1024];

static void standin_route(moeq_backend *b, const moeq_route_params *p) {
    moeq_route_params q = *p;
    if (!q.scratch) q.scratch = standin_scratch; /* a device needs none: the tests pass NULL */
    standin_cpu_route(b, &q);
}

/* The stand-in holds the routed experts map_experts gives it, as the device does: a product on another fails the
 * backend naming the tensor (the device's "no device copy"), and every later op is void. One stand-in at a time
 * holds a set (the map_experts case); the others hold every expert. */
static expert_hold standin_hold;
static char standin_fault[256];
static void (*standin_cpu_matmul)(moeq_backend *, const moeq_mm_job *, int);
static moeq_err (*standin_cpu_map_experts)(moeq_backend *, const moeq_model *, const uint8_t *, char *, size_t);

static void standin_matmul(moeq_backend *b, const moeq_mm_job *jobs, int n) {
    for (int i = 0; i < n && !standin_fault[0]; i++)
        if (!expert_hold_has(&standin_hold, jobs[i].w))
            snprintf(standin_fault, sizeof standin_fault, "tensor %s has no device copy", jobs[i].w->name);
    if (!standin_fault[0]) standin_cpu_matmul(b, jobs, n);
}

static moeq_err standin_map_experts(moeq_backend *b, const moeq_model *m, const uint8_t *resident, char *err,
                                    size_t n) {
    expert_hold_set(&standin_hold, m, resident);
    return standin_cpu_map_experts(b, m, resident, err, n);
}

static moeq_err standin_status(const moeq_backend *b, char *errstr, size_t errstr_size) {
    (void)b;
    return standin_fault[0] ? moeq_errf(MOEQ_ERR_INTERNAL, errstr, errstr_size, "%s", standin_fault) : MOEQ_OK;
}

static moeq_err standin_new(const moeq_backend_config *config, moeq_backend **out, char *errstr, size_t errstr_size) {
    moeq_backend *b = *out = moeq_backend_cpu_new(config);
    if (!b) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "cpu stand-in");
    standin_cpu_route = b->route;
    b->route = standin_route;
    standin_cpu_matmul = b->matmul, standin_cpu_map_experts = b->map_experts;
    b->matmul = standin_matmul, b->map_experts = standin_map_experts, b->status = standin_status;
    expert_hold_reset(&standin_hold, config->experts_deferred);
    standin_fault[0] = 0;
    b->host_visible = 0; /* the engine's device path: lm_head into the arena, rows back by download */
    return MOEQ_OK;
}

static uint64_t rng_state = 0x51ed2701f00dull;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
}

static moeq_model *gen(const char *preset, moeq_genmodel_dtype dt, const char *name) {
    char dir[400], err[512] = "";
    snprintf(dir, sizeof dir, "%s/%s", model_root, name);
    moeq_model_config c;
    moeq_genmodel_params gp = moeq_genmodel_default_params();
    gp.dtype = dt;
    gp.mtp_agree = moeq_genmodel_preset_mtp_agree(preset); /* as gen-model writes tiny-mtp */
    if (moeq_genmodel_preset(preset, &c, &gp.min_shards, err, sizeof err)) {
        fprintf(stderr, "genmodel %s: %s\n", preset, err);
        return NULL;
    }
    /* the tiny presets hold 256 positions: batch invariance needs contexts past one split-KV partition */
    c.max_position_embeddings = 4096;
    if (moeq_genmodel_write(dir, &c, &gp, NULL, err, sizeof err)) {
        fprintf(stderr, "genmodel %s: %s\n", preset, err);
        return NULL;
    }
    moeq_model *m = NULL;
    if (moeq_model_load(dir, NULL, &m, err, sizeof err)) fprintf(stderr, "load %s: %s\n", dir, err);
    return m;
}

/* ---- two backends side by side --------------------------------------------------------------------------- */

typedef struct pair {
    moeq_backend *cpu, *gpu;
    void *bufs[64];
    int n_bufs;
} pair;

static int g_lanes_only; /* cuda_matrix = lanes for the next pair_new (the 16-lane kernels at every size) */

static void pair_new(pair *p, const moeq_model *m, int invariant) {
    memset(p, 0, sizeof *p);
    moeq_backend_config bc = {.n_threads = 4, .batch_invariant = invariant, .blas_min_tokens = 16, .max_k = 8192,
                              .max_ctx = 4096, .max_jobs = 2 * MOEQ_CU_ROUTE_EXPERTS_CAP + 8, .max_tokens = 256,
                              .device = 0, .cuda_few_token = !g_lanes_only};
    char err[512] = "";
    assert_int_equal(moeq_backend_new("cpu", &bc, &p->cpu, err, sizeof err), MOEQ_OK);
    if (moeq_backend_new(gpu_name, &bc, &p->gpu, err, sizeof err)) fail_msg("%s", err);
    if (p->cpu->map_weights(p->cpu, m, err, sizeof err) || p->gpu->map_weights(p->gpu, m, err, sizeof err))
        fail_msg("map_weights: %s", err);
}

static void check_status(const pair *p, const char *what) {
    char err[512] = "";
    p->gpu->sync(p->gpu);
    if (moeq_backend_status(p->gpu, err, sizeof err)) fail_msg("%s: %s", what, err);
}

static void pair_free(pair *p) {
    for (int i = 0; i < p->n_bufs; i++) p->gpu->release(p->gpu, p->bufs[i]);
    moeq_backend_destroy(p->cpu);
    moeq_backend_destroy(p->gpu);
}

/* A device copy of host bytes (released with the pair). */
static void *dev(pair *p, const void *host, size_t bytes) {
    void *d = p->gpu->alloc(p->gpu, MOEQ_BUFFER_ARENA, bytes);
    assert_non_null(d);
    if (host) p->gpu->upload(p->gpu, d, host, bytes);
    assert_true(p->n_bufs < 64);
    p->bufs[p->n_bufs++] = d;
    return d;
}

static float *back(pair *p, const void *d, size_t n) {
    float *h = malloc(n * sizeof(float));
    p->gpu->download(p->gpu, h, d, n * sizeof(float));
    return h;
}

static float *rand_host(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

static void same_bits(const void *got, const void *want, size_t n, const char *what) {
    const float *g = got, *w = want;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&g[i], &w[i], 4) && !(isnan(g[i]) && isnan(w[i])))
            fail_msg("%s: element %zu: cuda %.9g cpu %.9g", what, i, g[i], w[i]);
}

static void close_to(const float *got, const float *want, size_t n, double abs_tol, double rel_tol, const char *what) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        worst = e > worst ? e : worst;
        if (!(e <= abs_tol + rel_tol * fabs(want[i])))
            fail_msg("%s: element %zu: cuda %.9g cpu %.9g", what, i, got[i], want[i]);
    }
    print_message("  %s: worst abs difference %.3g\n", what, worst);
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* ---- matmuls --------------------------------------------------------------------------------------------- */

static void matmul_case(pair *p, const moeq_tensor *w, int64_t row0, int64_t n_rows, int64_t T, int nn, int exact) {
    int64_t K = nn ? n_rows : moeq_tensor_cols(w), N = nn ? moeq_tensor_cols(w) : n_rows;
    float *x = rand_host((size_t)(T * K), 1.0f), *want = malloc((size_t)(T * N) * sizeof(float));
    float *dx = dev(p, x, (size_t)(T * K) * 4), *dy = dev(p, NULL, (size_t)(T * N) * 4);
    moeq_mm_job jc = {w, row0, n_rows, x, K, want, N, T}, jg = {w, row0, n_rows, dx, K, dy, N, T};
    if (nn) p->cpu->matmul_nn(p->cpu, &jc, 1), p->gpu->matmul_nn(p->gpu, &jg, 1);
    else p->cpu->matmul(p->cpu, &jc, 1), p->gpu->matmul(p->gpu, &jg, 1);
    check_status(p, w->name);
    float *got = back(p, dy, (size_t)(T * N));
    char what[200];
    snprintf(what, sizeof what, "%s %s rows %lld+%lld, %lld tokens", nn ? "NN" : "NT", w->name, (long long)row0,
             (long long)n_rows, (long long)T);
    if (exact) same_bits(got, want, (size_t)(T * N), what);
    else close_to(got, want, (size_t)(T * N), 1e-4 * max_abs(want, (size_t)(T * N)) + 1e-6, 0, what);
    free(x), free(want), free(got);
}

/*
 * map_experts (engine key expert_weights; a rank of an expert-parallel group holds its own experts only): a
 * backend made with experts_deferred holds no routed expert after map_weights, then exactly the flagged ones, whose
 * products give the CPU's bits, then all of them again; a product on an expert it does not hold fails the backend
 * naming the tensor (the engine never issues one: test_engine_group).
 */
static void map_experts_holds_exactly_the_flagged_experts(void **state) {
    (void)state;
    const moeq_model *m = models[1]; /* tiny f8: the experts' block scales move with them */
    int E = m->config.n_routed_experts, n_main = m->config.num_hidden_layers, l = 0;
    while (l < n_main && !m->layers[l].experts) l++;
    assert_true(l < n_main && E >= 2);
    uint8_t *even = calloc((size_t)n_main * (size_t)E, 1);
    for (int i = 0; i < n_main; i++)
        for (int x = 0; x < E; x += 2) even[(size_t)i * (size_t)E + (size_t)x] = 1;
    moeq_backend_config bc = {.n_threads = 4, .batch_invariant = 1, .blas_min_tokens = 16, .max_k = 8192,
                              .max_ctx = 4096, .max_jobs = 8, .max_tokens = 256, .device = 0, .experts_deferred = 1};
    pair p;
    memset(&p, 0, sizeof p);
    char err[512] = "", want[96];
    assert_int_equal(moeq_backend_new("cpu", &bc, &p.cpu, err, sizeof err), MOEQ_OK);
    if (moeq_backend_new(gpu_name, &bc, &p.gpu, err, sizeof err)) fail_msg("%s", err);
    if (p.cpu->map_weights(p.cpu, m, err, sizeof err) || p.gpu->map_weights(p.gpu, m, err, sizeof err))
        fail_msg("map_weights: %s", err);
    int64_t total = 0;
    for (int i = 0; i < n_main; i++) total += m->layers[i].experts ? E : 0;
    int device = !strcmp(gpu_name, "cuda"); /* the stand-in's describe is the CPU's */
    snprintf(want, sizeof want, "0 of %lld routed experts held", (long long)total);
    if (device) assert_non_null(strstr(p.gpu->describe(p.gpu), want));
    assert_non_null(p.gpu->map_experts);
    if (p.gpu->map_experts(p.gpu, m, even, err, sizeof err)) fail_msg("map_experts: %s", err);
    snprintf(want, sizeof want, "%lld of %lld routed experts held", (long long)(total + 1) / 2, (long long)total);
    if (device) assert_non_null(strstr(p.gpu->describe(p.gpu), want));
    const moeq_expert *ex = m->layers[l].experts;
    matmul_case(&p, ex[0].gate_proj, 0, moeq_tensor_rows(ex[0].gate_proj), 3, 0, 1);
    matmul_case(&p, ex[2 % E].down_proj, 0, moeq_tensor_rows(ex[2 % E].down_proj), 5, 0, 1);
    if (p.gpu->map_experts(p.gpu, m, NULL, err, sizeof err)) fail_msg("map_experts (all): %s", err);
    snprintf(want, sizeof want, "%lld of %lld routed experts held", (long long)total, (long long)total);
    if (device) assert_non_null(strstr(p.gpu->describe(p.gpu), want));
    matmul_case(&p, ex[1].up_proj, 0, moeq_tensor_rows(ex[1].up_proj), 2, 0, 1); /* held again */
    matmul_case(&p, ex[0].gate_proj, 0, moeq_tensor_rows(ex[0].gate_proj), 3, 0, 1);
    /* the odd experts given back: a product on one fails the backend, naming the tensor */
    if (p.gpu->map_experts(p.gpu, m, even, err, sizeof err)) fail_msg("map_experts: %s", err);
    int64_t K = moeq_tensor_cols(ex[1].up_proj), N = moeq_tensor_rows(ex[1].up_proj);
    float *x = rand_host((size_t)K, 1.0f), *dx = dev(&p, x, (size_t)K * 4), *dy = dev(&p, NULL, (size_t)N * 4);
    moeq_mm_job j = {ex[1].up_proj, 0, N, dx, K, dy, N, 1};
    p.gpu->matmul(p.gpu, &j, 1);
    p.gpu->sync(p.gpu);
    assert_int_not_equal(moeq_backend_status(p.gpu, err, sizeof err), MOEQ_OK);
    assert_non_null(strstr(err, ex[1].up_proj->name));
    free(x), free(even);
    pair_free(&p);
}

static void matmuls_give_the_cpu_backends_bits_and_cublas_is_close(void **state) {
    (void)state;
    /* batch-invariant twice: cuda_matrix = auto (few-token kernels below 9 tokens) and lanes (16-lane kernels) */
    static const int mis[] = {0, 1, 2, 4, 5};
    for (int k = 0; k < 5; k++)
        for (int run = 0; run < 3; run++) {
            int mi = mis[k];
            int inv = run < 2;
            const moeq_model *m = models[mi];
            const moeq_model_config *c = &m->config;
            pair p;
            g_lanes_only = run == 1;
            pair_new(&p, m, inv);
            g_lanes_only = 0;
            print_message("%s, batch_invariant %d%s\n", model_names[mi], inv, run == 1 ? ", cuda_matrix = lanes" : "");
            const moeq_layer *L = &m->layers[c->num_hidden_layers - 1];
            const int64_t Ts[] = {1, 7, 40};
            for (int ti = 0; ti < 3; ti++) {
                int exact = inv || Ts[ti] < 16; /* below blas_min_tokens the own kernels run in both modes */
                matmul_case(&p, m->lm_head, 0, moeq_tensor_rows(m->lm_head), Ts[ti], 0, exact);
                matmul_case(&p, L->kv_a_proj_with_mqa, 0, moeq_tensor_rows(L->kv_a_proj_with_mqa), Ts[ti], 0, exact);
                int64_t nope = c->qk_nope_head_dim, V = c->v_head_dim;
                matmul_case(&p, L->kv_b_proj, nope + V, nope, Ts[ti], 1, exact);     /* W_UK of head 1 */
                matmul_case(&p, L->kv_b_proj, nope + V + nope, V, Ts[ti], 0, exact); /* W_UV of head 1 */
                if (L->is_moe) matmul_case(&p, L->experts[1].down_proj, 0, c->hidden_size, Ts[ti], 0, exact);
            }
            pair_free(&p);
        }
}

/* ---- the per-row ops ----------------------------------------------------------------------------------------- */

static void row_ops_give_the_cpu_backends_bits(void **state) {
    (void)state;
    const moeq_model *m = models[0];
    const moeq_model_config *c = &m->config;
    pair p;
    pair_new(&p, m, 1);
    int64_t T = 37, D = c->hidden_size;
    int32_t ids[37];
    int64_t rows[37], pos[37];
    for (int t = 0; t < T; t++) ids[t] = (t * 7919) % c->vocab_size, rows[t] = (t * 5) % T, pos[t] = 3 * t + 1;
    /* embed */
    float *want = malloc((size_t)(T * D) * 4), *dx = dev(&p, NULL, (size_t)(T * D) * 4), *got;
    p.cpu->embed(p.cpu, m->embed_tokens, ids, T, want);
    p.gpu->embed(p.gpu, m->embed_tokens, ids, T, dx);
    check_status(&p, "embed");
    same_bits(got = back(&p, dx, (size_t)(T * D)), want, (size_t)(T * D), "embed");
    free(got);
    /* rmsnorm with a row map, in place too */
    float *w = rand_host((size_t)D, 1.0f), *dw = dev(&p, w, (size_t)D * 4), *out = malloc((size_t)(T * D) * 4);
    float *dout = dev(&p, NULL, (size_t)(T * D) * 4);
    moeq_rmsnorm_params rc = {out, D, want, D, rows, T, D, w, 1e-6f}, rg = {dout, D, dx, D, rows, T, D, dw, 1e-6f};
    p.cpu->rmsnorm(p.cpu, &rc), p.gpu->rmsnorm(p.gpu, &rg);
    moeq_rmsnorm_params ic = {want, D, want, D, NULL, T, D, w, 1e-6f}, ig = {dx, D, dx, D, NULL, T, D, dw, 1e-6f};
    p.cpu->rmsnorm(p.cpu, &ic), p.gpu->rmsnorm(p.gpu, &ig);
    check_status(&p, "rmsnorm");
    same_bits(got = back(&p, dout, (size_t)(T * D)), out, (size_t)(T * D), "rmsnorm (rows)"), free(got);
    same_bits(got = back(&p, dx, (size_t)(T * D)), want, (size_t)(T * D), "rmsnorm (in place)"), free(got);
    /* silu_mul (out aliasing gate), add */
    float *g = rand_host((size_t)(T * D), 30.0f), *u = rand_host((size_t)(T * D), 2.0f);
    float *dg = dev(&p, g, (size_t)(T * D) * 4), *du = dev(&p, u, (size_t)(T * D) * 4);
    p.cpu->silu_mul(p.cpu, g, g, u, T * D), p.gpu->silu_mul(p.gpu, dg, dg, du, T * D);
    p.cpu->add(p.cpu, g, u, T * D), p.gpu->add(p.gpu, dg, du, T * D);
    check_status(&p, "silu_mul, add");
    same_bits(got = back(&p, dg, (size_t)(T * D)), g, (size_t)(T * D), "silu_mul then add"), free(got);
    /* rope_cos_sin */
    moeq_rope rope;
    char err[256];
    assert_int_equal(moeq_rope_init(&rope, c, err, sizeof err), MOEQ_OK);
    int64_t half = rope.dim / 2;
    float *cs = malloc((size_t)(T * half) * 4), *sn = malloc((size_t)(T * half) * 4);
    float *dcs = dev(&p, NULL, (size_t)(T * half) * 4), *dsn = dev(&p, NULL, (size_t)(T * half) * 4);
    p.cpu->rope_cos_sin(p.cpu, &rope, pos, T, cs, sn), p.gpu->rope_cos_sin(p.gpu, &rope, pos, T, dcs, dsn);
    check_status(&p, "rope_cos_sin");
    same_bits(got = back(&p, dcs, (size_t)(T * half)), cs, (size_t)(T * half), "cos"), free(got);
    same_bits(got = back(&p, dsn, (size_t)(T * half)), sn, (size_t)(T * half), "sin"), free(got);
    free(want), free(w), free(out), free(g), free(u), free(cs), free(sn);
    pair_free(&p);
}

/* ---- the cache: mla_rope's write, then attention over it ------------------------------------------------------- */

static void cache_ops_match_the_cpu_backend(void **state) {
    (void)state;
    const moeq_model *m = models[0];
    const moeq_model_config *c = &m->config;
    pair p;
    pair_new(&p, m, 1);
    int H = c->num_attention_heads, Lr = c->kv_lora_rank, R = c->qk_rope_head_dim, nope = c->qk_nope_head_dim;
    int bt = 16, n_seqs = 3, ef = Lr + R;
    int64_t max_len = 1200, per_seq = (max_len + bt - 1) / bt, nb = per_seq * n_seqs;
    size_t block_floats = (size_t)bt * ef, pool_n = (size_t)nb * block_floats;
    int32_t *table = malloc((size_t)nb * 4);
    for (int64_t i = 0; i < nb; i++) table[i] = (int32_t)((i * 7) % nb); /* 7 and nb coprime below */
    if (nb % 7 == 0) for (int64_t i = 0; i < nb; i++) table[i] = (int32_t)(nb - 1 - i);
    float *pool = rand_host(pool_n, 1.0f), *dpool = dev(&p, pool, pool_n * 4);
    moeq_kv_paged kc = {pool, table, per_seq, block_floats, 0, bt, ef}, kg = kc;
    kg.pool = dpool;
    /* mla_rope for T tokens: a prefill chunk of seq 0 and decode tokens of 1 and 2 */
    int64_t T = 19;
    int32_t seq[19];
    int64_t pos[19];
    for (int t = 0; t < T; t++) seq[t] = t < 17 ? 0 : t - 16, pos[t] = t < 17 ? 1100 + t : 300 * (t - 16) + 5;
    moeq_rope rope;
    char err[256];
    assert_int_equal(moeq_rope_init(&rope, c, err, sizeof err), MOEQ_OK);
    float *cs = malloc((size_t)(T * R / 2) * 4), *sn = malloc((size_t)(T * R / 2) * 4);
    p.cpu->rope_cos_sin(p.cpu, &rope, pos, T, cs, sn);
    float *kva = rand_host((size_t)(T * (Lr + R)), 1.0f), *q = rand_host((size_t)(T * H * (nope + R)), 1.0f);
    float *norm = rand_host((size_t)Lr, 1.0f), *qpe = malloc((size_t)(T * H * R) * 4);
    float *dkva = dev(&p, kva, (size_t)(T * (Lr + R)) * 4), *dq = dev(&p, q, (size_t)(T * H * (nope + R)) * 4);
    float *dnorm = dev(&p, norm, (size_t)Lr * 4), *dqpe = dev(&p, NULL, (size_t)(T * H * R) * 4);
    float *dcs = dev(&p, cs, (size_t)(T * R / 2) * 4), *dsn = dev(&p, sn, (size_t)(T * R / 2) * 4);
    moeq_mla_rope_params rc = {kc, T, seq, pos, kva, norm, 1e-6f, q, qpe, H, nope, Lr, cs, sn, &rope};
    moeq_mla_rope_params rg = {kg, T, seq, pos, dkva, dnorm, 1e-6f, dq, dqpe, H, nope, Lr, dcs, dsn, &rope};
    p.cpu->mla_rope(p.cpu, &rc), p.gpu->mla_rope(p.gpu, &rg);
    check_status(&p, "mla_rope");
    float *got = back(&p, dpool, pool_n);
    same_bits(got, pool, pool_n, "cache pool after mla_rope (written entries and the untouched rest)"), free(got);
    same_bits(got = back(&p, dqpe, (size_t)(T * H * R)), qpe, (size_t)(T * H * R), "q_pe"), free(got);
    /* attention (absorbed, split-KV) and naive */
    float *ql = rand_host((size_t)(T * H * Lr), 0.3f), *dql = dev(&p, ql, (size_t)(T * H * Lr) * 4);
    float *ol = malloc((size_t)(T * H * Lr) * 4), *dol = dev(&p, NULL, (size_t)(T * H * Lr) * 4);
    moeq_mla_params ac = {kc, T, seq, pos, H, Lr, R, ql, qpe, ol, 0.125f};
    moeq_mla_params ag = {kg, T, seq, pos, H, Lr, R, dql, dqpe, dol, 0.125f};
    p.cpu->attention(p.cpu, &ac), p.gpu->attention(p.gpu, &ag);
    check_status(&p, "attention");
    close_to(got = back(&p, dol, (size_t)(T * H * Lr)), ol, (size_t)(T * H * Lr), 2e-6, 2e-6, "attention (split-KV)");
    free(got);
    const moeq_layer *L0 = &m->layers[0];
    int V = c->v_head_dim;
    int64_t Tn = 2; /* the naive form is slow: the decode tokens only */
    float *ov = malloc((size_t)(Tn * H * V) * 4), *dov = dev(&p, NULL, (size_t)(Tn * H * V) * 4);
    moeq_mla_naive_params nc = {kc, Tn, seq + 17, pos + 17, L0->kv_b_proj, H, nope, V, Lr, R, 0.125f,
                                q + 17 * H * (nope + R), qpe + 17 * H * R, ov};
    moeq_mla_naive_params ng = {kg, Tn, seq + 17, pos + 17, L0->kv_b_proj, H, nope, V, Lr, R, 0.125f,
                                dq + 17 * H * (nope + R), dqpe + 17 * H * R, dov};
    p.cpu->attention_naive(p.cpu, &nc), p.gpu->attention_naive(p.gpu, &ng);
    check_status(&p, "attention_naive");
    size_t nv = (size_t)(Tn * H * V);
    close_to(got = back(&p, dov, nv), ov, nv, 1e-4 * max_abs(ov, nv), 0, "attention_naive"), free(got);
    free(table), free(pool), free(cs), free(sn), free(kva), free(q), free(norm), free(qpe), free(ql), free(ol);
    free(ov);
    pair_free(&p);
}

/* ---- MoE: route, gather, combine ------------------------------------------------------------------------------ */

static void moe_ops_route_like_the_cpu_and_permute_exactly(void **state) {
    (void)state;
    for (int mi = 0; mi < 3; mi += 2) {
        const moeq_model *m = models[mi];
        const moeq_model_config *c = &m->config;
        pair p;
        pair_new(&p, m, 1);
        moeq_moe_router r;
        char err[256];
        assert_int_equal(moeq_moe_router_init(&r, c, err, sizeof err), MOEQ_OK);
        int64_t T = 50, E = r.n_experts, K = r.top_k, D = c->hidden_size, S = T * K;
        float *lg = rand_host((size_t)(T * E), 4.0f), *bias = rand_host((size_t)E, 0.1f);
        lg[3 * E + 1] = NAN; /* a token with a non-finite logit */
        float *dlg = dev(&p, lg, (size_t)(T * E) * 4), *dbias = dev(&p, bias, (size_t)E * 4);
        int32_t *ids_c = malloc((size_t)S * 4), *ids_g = malloc((size_t)S * 4);
        float *wc = malloc((size_t)S * 4), *dw = dev(&p, NULL, (size_t)S * 4);
        uint8_t fin_c[50], fin_g[50];
        float *scratch = malloc((size_t)moeq_moe_route_scratch(&r) * 4);
        int64_t *off_c = malloc((size_t)(E + 1) * 8), *off_g = malloc((size_t)(E + 1) * 8);
        int64_t *ord_c = malloc((size_t)S * 8), *ord_g = malloc((size_t)S * 8);
        const float *b = m->layers[c->num_hidden_layers - 1].e_score_correction_bias ? bias : NULL;
        moeq_route_params pc = {&r, T, lg, b, ids_c, wc, fin_c, scratch, off_c, ord_c, 0};
        moeq_route_params pg = {&r, T, dlg, b ? dbias : NULL, ids_g, dw, fin_g, NULL, off_g, ord_g, 0};
        p.cpu->route(p.cpu, &pc), p.gpu->route(p.gpu, &pg);
        check_status(&p, "route");
        assert_memory_equal(ids_g, ids_c, (size_t)S * 4);
        assert_memory_equal(fin_g, fin_c, (size_t)T);
        assert_memory_equal(off_g, off_c, (size_t)(E + 1) * 8);
        assert_memory_equal(ord_g, ord_c, (size_t)S * 8);
        float *got = back(&p, dw, (size_t)S);
        for (int64_t i = 0; i < S; i++)
            if (!(fabsf(got[i] - wc[i]) <= 1e-6f * fabsf(wc[i]) + 1e-30f) && !(isnan(got[i]) && isnan(wc[i])))
                fail_msg("route weight %lld: cuda %.9g cpu %.9g", (long long)i, got[i], wc[i]);
        free(got);
        /* gather by the plan's order, combine through the slot map */
        float *x = rand_host((size_t)(T * D), 1.0f), *dxx = dev(&p, x, (size_t)(T * D) * 4);
        float *xg = malloc((size_t)(S * D) * 4), *dxg = dev(&p, NULL, (size_t)(S * D) * 4);
        int64_t *sr = malloc((size_t)S * 8), *dsr = dev(&p, NULL, (size_t)S * 8);
        moeq_gather_params gc = {xg, sr, x, ord_c, S, K, D}, gg = {dxg, dsr, dxx, ord_c, S, K, D};
        p.cpu->gather(p.cpu, &gc), p.gpu->gather(p.gpu, &gg);
        float *sh = rand_host((size_t)(T * D), 1.0f), *dsh = dev(&p, sh, (size_t)(T * D) * 4);
        float *out = malloc((size_t)(T * D) * 4), *dout = dev(&p, NULL, (size_t)(T * D) * 4);
        moeq_combine_params cc = {out, xg, sr, wc, sh, T, K, D, NULL}, cg = {dout, dxg, dsr, dw, dsh, T, K, D, NULL};
        p.gpu->upload(p.gpu, dw, wc, (size_t)S * 4); /* the CPU's weights: the combine alone is compared */
        p.cpu->combine(p.cpu, &cc), p.gpu->combine(p.gpu, &cg);
        check_status(&p, "gather, combine");
        same_bits(got = back(&p, dxg, (size_t)(S * D)), xg, (size_t)(S * D), "gather"), free(got);
        int64_t *srg = malloc((size_t)S * 8);
        p.gpu->download(p.gpu, srg, dsr, (size_t)S * 8);
        assert_memory_equal(srg, sr, (size_t)S * 8);
        same_bits(got = back(&p, dout, (size_t)(T * D)), out, (size_t)(T * D), "combine"), free(got);
        free(lg), free(bias), free(ids_c), free(ids_g), free(wc), free(scratch), free(off_c), free(off_g), free(ord_c),
            free(ord_g), free(x), free(xg), free(sr), free(sh), free(out), free(srg);
        pair_free(&p);
    }
}

/*
 * moe_experts (a one-rank MoE layer's experts from backend ids) on the device against the CPU backend's op
 * (the composed path), bit for bit: the first MoE layer of each model (bf16, F8, V2), token counts around the
 * grouped kernel's tiles, ids from the CPU's router (experts without tokens among them); the expert counts
 * added to stats and the slot map equal too.
 */
static void moe_experts_on_cuda_equals_the_cpu_op(void **state) {
    (void)state;
    static const int mis[] = {0, 1, 2, 4, 5}; /* small: experts' rows of 256, whole groups of the few-token loads */
    for (int k = 0; k < 5; k++) {
        int mi = mis[k];
        const moeq_model *m = models[mi];
        const moeq_model_config *c = &m->config;
        const moeq_layer *L = NULL;
        for (int l = 0; l < c->num_hidden_layers && !L; l++) L = m->layers[l].is_moe ? &m->layers[l] : NULL;
        assert_non_null(L);
        pair p;
        pair_new(&p, m, 1);
        moeq_moe_router r;
        char err[256];
        assert_int_equal(moeq_moe_router_init(&r, c, err, sizeof err), MOEQ_OK);
        int E = r.n_experts;
        int64_t MT = 64, K = r.top_k, D = c->hidden_size, MI = c->moe_intermediate_size, S = MT * K;
        int64_t SI = L->shared.gate_proj ? moeq_tensor_rows(L->shared.gate_proj) : 0;
        size_t gu = (size_t)(S * MI + MT * SI), dn = (size_t)((S + MT) * D), pl = (size_t)MOEQ_MOE_PLAN_LEN(E, S);
        float *x = malloc((size_t)(MT * D) * 4), *w = malloc((size_t)S * 4), *out = malloc((size_t)(MT * D) * 4);
        float *xg = malloc((size_t)(S * D) * 4), *g = malloc(gu * 4), *u = malloc(gu * 4), *down = malloc(dn * 4);
        int64_t *sr = malloc((size_t)S * 8), *plan = malloc(pl * 8), *sr_g = malloc((size_t)S * 8);
        int32_t *ids = malloc((size_t)S * 4);
        uint64_t *st = calloc((size_t)E, 8), *st_g = malloc((size_t)E * 8);
        float *scratch = malloc((size_t)moeq_moe_route_scratch(&r) * 4), *lg = malloc((size_t)(MT * E) * 4);
        uint8_t fin[64];
        float *dx = dev(&p, NULL, (size_t)(MT * D) * 4), *dw = dev(&p, NULL, (size_t)S * 4);
        float *dout = dev(&p, NULL, (size_t)(MT * D) * 4), *dxg = dev(&p, NULL, (size_t)(S * D) * 4);
        float *dg = dev(&p, NULL, gu * 4), *du = dev(&p, NULL, gu * 4), *ddown = dev(&p, NULL, dn * 4);
        int64_t *dsr = dev(&p, NULL, (size_t)S * 8), *dplan = dev(&p, NULL, pl * 8);
        int32_t *dids = dev(&p, NULL, (size_t)S * 4);
        uint64_t *dst = dev(&p, st, (size_t)E * 8);
        const int64_t Ts[] = {1, 2, 7, 8, 9, 33, 64};
        for (int ti = 0; ti < 7; ti++) {
            int64_t T = Ts[ti];
            for (int64_t i = 0; i < T * D; i++) x[i] = frand();
            for (int64_t i = 0; i < T * E; i++) lg[i] = frand() * 4.0f;
            moeq_route_params rp = {&r, T, lg, NULL, ids, w, fin, scratch, NULL, NULL, 0};
            p.cpu->route(p.cpu, &rp);
            p.gpu->upload(p.gpu, dx, x, (size_t)(T * D) * 4);
            p.gpu->upload(p.gpu, dw, w, (size_t)(T * K) * 4);
            p.gpu->upload(p.gpu, dids, ids, (size_t)(T * K) * 4);
            moeq_moe_experts_params pc = {L->experts, &L->shared, E, T, K, D, MI, x, ids, w, out, xg, g, u, down,
                                          sr, plan, st, MT};
            moeq_moe_experts_params pg = {L->experts, &L->shared, E, T, K, D, MI, dx, dids, dw, dout, dxg, dg, du,
                                          ddown, dsr, dplan, dst, MT};
            p.cpu->moe_experts(p.cpu, &pc);
            p.gpu->moe_experts(p.gpu, &pg);
            check_status(&p, "moe_experts");
            float *got = back(&p, dout, (size_t)(T * D));
            char what[96];
            snprintf(what, sizeof what, "moe_experts %s, %lld tokens", model_names[mi], (long long)T);
            same_bits(got, out, (size_t)(T * D), what);
            free(got);
            p.gpu->download(p.gpu, sr_g, dsr, (size_t)(T * K) * 8);
            assert_memory_equal(sr_g, sr, (size_t)(T * K) * 8);
            p.gpu->download(p.gpu, st_g, dst, (size_t)E * 8);
            assert_memory_equal(st_g, st, (size_t)E * 8);
        }
        print_message("  moe_experts %s: the cpu op's bits at 1..64 tokens\n", model_names[mi]);
        free(x), free(w), free(out), free(xg), free(g), free(u), free(down), free(sr), free(plan), free(sr_g);
        free(ids), free(st), free(st_g), free(scratch), free(lg);
        pair_free(&p);
    }
}

/* ---- whole models through the engine ------------------------------------------------------------------------- */

/* Row r of a logits_reduce case: random, ties, all equal, a NaN first or inside, inf, -0 beside +0. */
static void logits_row(float *x, int64_t V, int r) {
    for (int64_t i = 0; i < V; i++) {
        float v = frand() * 8.0f;
        x[i] = r == 1 ? (float)((int)(v + 8.0f) / 4) : r == 2 ? 0.5f : r == 6 ? (i & 1 ? 0.0f : -0.0f) : v;
    }
    if (r == 3) x[0] = NAN;
    if (r == 4) x[V / 2] = NAN;
    if (r == 5) x[V - 1] = INFINITY;
}

/* logits_reduce: the record of every row equal to the CPU op's (the sums within moeq_logits_sum_bound). */
static void logits_records_on_cuda_equal_the_cpu_ops(void **state) {
    (void)state;
    static const int64_t Vs[] = {1, 63, 64, 65, 1000, 4097, 129280};
    pair p;
    pair_new(&p, models[0], 1);
    for (int vi = 0; vi < 7; vi++) {
        int64_t V = Vs[vi], ld = V + 3, R = 7;
        float *x = malloc((size_t)(R * ld) * sizeof(float));
        double temp[7] = {0.0, 1.0, 0.7, 1.0, 0.9, 1.3, 2.0};
        for (int r = 0; r < R; r++) logits_row(x + r * ld, V, r);
        float *dx = dev(&p, x, (size_t)(R * ld) * sizeof(float));
        moeq_logits_record got[7], want[7];
        p.cpu->logits_reduce(p.cpu, x, ld, R, V, temp, want);
        p.gpu->logits_reduce(p.gpu, dx, ld, R, V, temp, got);
        check_status(&p, "logits_reduce");
        for (int r = 0; r < R; r++) {
            const moeq_logits_record *g = &got[r], *w = &want[r];
            if (g->argmax != w->argmax || g->finite != w->finite || g->n_top != w->n_top ||
                memcmp(&g->max, &w->max, 4) || g->temperature != w->temperature)
                fail_msg("V %lld row %d: argmax %d/%d finite %d/%d n_top %d/%d", (long long)V, r, g->argmax,
                         w->argmax, g->finite, w->finite, g->n_top, w->n_top);
            for (int i = 0; i < w->n_top; i++)
                if (g->top_id[i] != w->top_id[i] || memcmp(&g->top_logit[i], &w->top_logit[i], 4))
                    fail_msg("V %lld row %d: candidate %d: %d vs %d", (long long)V, r, i, g->top_id[i], w->top_id[i]);
            if (fabs(g->sum_t - w->sum_t) > moeq_logits_sum_bound(w->sum_t, V) ||
                fabs(g->sum_1 - w->sum_1) > moeq_logits_sum1_bound(w->sum_1, V))
                fail_msg("V %lld row %d: sums %.17g %.17g vs %.17g %.17g", (long long)V, r, g->sum_t, g->sum_1,
                         w->sum_t, w->sum_1);
        }
        free(x);
    }
    pair_free(&p);
}

static const char *g_cuda_matrix; /* the engine key cuda_matrix for params_on (NULL: its default) */

/* Engine parameters on backend with the cases' sizes (the rest as moeq_engine_default_params). */
static moeq_engine_params params_on(const char *backend, int invariant, int max_seqs, int64_t kv_cache_tokens) {
    moeq_engine_params p = moeq_engine_default_params();
    snprintf(p.backend, sizeof p.backend, "%s", backend);
    if (g_cuda_matrix) snprintf(p.cuda_matrix, sizeof p.cuda_matrix, "%s", g_cuda_matrix);
    p.batch_invariant = invariant;
    p.max_seqs = max_seqs;
    p.kv_cache_tokens = kv_cache_tokens;
    return p;
}

/* The engine for p, or the case fails naming the backend, its graphs setting and the engine's reason. */
static moeq_engine *engine_or_fail(const moeq_model *m, const moeq_engine_params *p) {
    moeq_engine *e = NULL;
    char err[512] = "";
    if (moeq_engine_new(m, p, &e, err, sizeof err))
        fail_msg("engine (%s, cuda_graphs %s): %s", p->backend, p->cuda_graphs, err);
    return e;
}

/* The largest of x[0, n) other than x[best]: best's margin over it says whether another backend may choose otherwise. */
static float runner_up(const float *x, int n, int best) {
    float second = -INFINITY;
    for (int i = 0; i < n; i++) second = i != best && x[i] > second ? x[i] : second;
    return second;
}

/* Three sequences: prefill (two chunks for seq 0), then 4 decode steps; every step's logits rows appended. */
static float *run_engine(const moeq_model *m, const char *backend, int invariant, int *n_rows_out) {
    moeq_engine_params p = params_on(backend, invariant, 4, 4096);
    p.n_threads = 4;
    moeq_engine *e = engine_or_fail(m, &p);
    char err[512] = "";
    int V = m->config.vocab_size, seq[3], rows = 0;
    float *all = malloc((size_t)64 * V * sizeof(float));
    int32_t prompt[3][40];
    for (int s = 0; s < 3; s++) {
        assert_int_equal(moeq_engine_seq_new(e, &seq[s]), MOEQ_OK);
        for (int i = 0; i < 40; i++) prompt[s][i] = (int32_t)((i * 37 + s * 101 + 5) % V);
    }
    moeq_step_item first[3] = {{seq[0], prompt[0], 25, 0}, {seq[1], prompt[1], 9, 1}, {seq[2], prompt[2], 1, 0}};
    if (moeq_engine_step(e, first, 3, all, 64, err, sizeof err)) fail_msg("step (%s): %s", backend, err);
    rows += 1 + 9 + 1;
    moeq_step_item second = {seq[0], prompt[0] + 25, 15, 0};
    if (moeq_engine_step(e, &second, 1, all + (size_t)rows * V, 64 - rows, err, sizeof err)) fail_msg("%s", err);
    rows += 1;
    for (int k = 0; k < 4; k++) {
        int32_t tok[3] = {(int32_t)((k * 11 + 3) % V), (int32_t)((k * 13 + 7) % V), (int32_t)((k * 17 + 1) % V)};
        moeq_step_item d[3] = {{seq[0], &tok[0], 1, 0}, {seq[1], &tok[1], 1, 0}, {seq[2], &tok[2], 1, 0}};
        if (moeq_engine_step(e, d, 3, all + (size_t)rows * V, 64 - rows, err, sizeof err)) fail_msg("%s", err);
        rows += 3;
    }
    moeq_engine_destroy(e);
    *n_rows_out = rows;
    return all;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

static void whole_model_logits_on_cuda_match_the_cpu_engine(void **state) {
    (void)state;
    for (int mi = 0; mi < 3; mi++)
        for (int inv = 1; inv >= 0; inv--) {
            const moeq_model *m = models[mi];
            int V = m->config.vocab_size, rc = 0, rg = 0;
            float *want = run_engine(m, "cpu", inv, &rc), *got = run_engine(m, gpu_name, inv, &rg);
            assert_int_equal(rc, rg);
            double scale = max_abs(want, (size_t)rc * V), tol = (inv ? 1e-4 : 1e-3) * scale;
            char what[120];
            snprintf(what, sizeof what, "%s logits, batch_invariant %d", model_names[mi], inv);
            close_to(got, want, (size_t)rc * V, tol, 0, what);
            for (int r = 0; r < rc; r++) { /* greedy choices agree wherever the CPU's margin is clear */
                const float *w = want + (size_t)r * V;
                int best = argmax(w, V);
                if (w[best] - runner_up(w, V, best) > 4 * tol) assert_int_equal(argmax(got + (size_t)r * V, V), best);
            }
            /* either cuda_matrix gives the same bits: the few-token kernels run the 16-lane kernels' chains (checked
             * in the batch-invariant mode: the other's cuBLAS products promise no run-to-run bits) */
            for (int auto_matrix = 0; auto_matrix < 2 * inv; auto_matrix++) {
                g_cuda_matrix = auto_matrix ? "auto" : "lanes";
                int rm = 0;
                float *other = run_engine(m, gpu_name, inv, &rm);
                g_cuda_matrix = NULL;
                assert_int_equal(rm, rg);
                snprintf(what, sizeof what, "%s logits, batch_invariant %d, cuda_matrix %s vs the default",
                         model_names[mi], inv, auto_matrix ? "auto" : "lanes");
                same_bits(other, got, (size_t)rg * V, what);
                free(other);
            }
            free(want), free(got);
        }
}

/*
 * Greedy decoding of 32 tokens, one sequence at a time, on `backend`: the tokens and, at each step, the margin
 * between the chosen logit and the runner-up (which says whether another backend may choose otherwise).
 */
static void greedy_run(const moeq_model *m, const char *backend, int invariant, const int32_t *prompt, int n_prompt,
                       int32_t *tokens, float *margins, float *scale) {
    moeq_engine_params p = params_on(backend, invariant, 1, 1024);
    p.n_threads = 4;
    moeq_engine *e = engine_or_fail(m, &p);
    char err[512] = "";
    int V = m->config.vocab_size, seq;
    float *row = malloc((size_t)V * sizeof(float));
    assert_int_equal(moeq_engine_seq_new(e, &seq), MOEQ_OK);
    moeq_step_item it = {seq, prompt, n_prompt, 0};
    *scale = 0;
    for (int t = 0; t < 32; t++) {
        if (moeq_engine_step(e, &it, 1, row, 1, err, sizeof err)) fail_msg("step %d (%s): %s", t, backend, err);
        int best = argmax(row, V);
        for (int i = 0; i < V; i++) *scale = fmaxf(*scale, fabsf(row[i]));
        tokens[t] = best;
        margins[t] = row[best] - runner_up(row, V, best);
        it = (moeq_step_item){seq, &tokens[t], 1, 0};
    }
    free(row);
    moeq_engine_destroy(e);
}

/*
 * The device's greedy continuations are the CPU engine's, 32 tokens of three prompts on every model and in
 * both modes, wherever the CPU's top-1 margin is clear: the two backends' logits differ by at most the
 * whole-model tolerance (1e-4 / 1e-3 of the largest |logit|), so a step whose CPU margin is below twice that may
 * go either way; the continuations are compared up to such a step (which must be the first difference, if any),
 * and at least 24 of each 32 steps must be compared in all.
 */
static void greedy_continuations_of_32_tokens_equal_the_cpu_engines(void **state) {
    (void)state;
    for (int mi = 0; mi < 3; mi++)
        for (int inv = 1; inv >= 0; inv--) {
            const moeq_model *m = models[mi];
            int V = m->config.vocab_size, compared = 0, runs = 0;
            const int lengths[3] = {5, 40, 200};
            for (int pi = 0; pi < 3; pi++, runs++) {
                int32_t prompt[200], want[32], got[32];
                float want_margin[32], got_margin[32], scale, got_scale;
                for (int i = 0; i < lengths[pi]; i++) prompt[i] = (int32_t)((i * 41 + pi * 13 + 2) % V);
                greedy_run(m, "cpu", inv, prompt, lengths[pi], want, want_margin, &scale);
                greedy_run(m, gpu_name, inv, prompt, lengths[pi], got, got_margin, &got_scale);
                double tol = (inv ? 1e-4 : 1e-3) * scale;
                int t = 0;
                while (t < 32 && got[t] == want[t]) t++;
                if (t < 32 && want_margin[t] > 2 * tol)
                    fail_msg("%s, batch_invariant %d, prompt of %d: step %d: device %d, CPU %d (CPU margin %.3g > %.3g)",
                             model_names[mi], inv, lengths[pi], t, got[t], want[t], want_margin[t], 2 * tol);
                compared += t;
                if (t < 32)
                    print_message("  %s, batch_invariant %d, prompt of %d: a near-tie at step %d (margin %.3g)\n",
                                  model_names[mi], inv, lengths[pi], t, want_margin[t]);
            }
            if (compared < 24 * runs)
                fail_msg("%s, batch_invariant %d: only %d of %d steps before near-ties", model_names[mi], inv, compared,
                         32 * runs);
        }
}

/*
 * MTP speculative decoding on the device gives the tokens of plain decoding on the device: greedy with k = 1..3
 * drafts, and sampled in the exact mode (the plain sampler's tokens), on tiny (a random MTP layer: few drafts
 * accepted) and tiny-mtp (the agreeing construction: most accepted, so verify steps of k+1 tokens run).
 */
static void mtp_on_gives_the_tokens_of_mtp_off_on_the_gpu(void **state) {
    (void)state;
    const moeq_model *ms[2] = {models[0], models[3]};
    const char *names[2] = {"tiny", "tiny-mtp"};
    for (int mi = 0; mi < 2; mi++) {
        const moeq_model *m = ms[mi];
        moeq_engine_params p = params_on(gpu_name, 1, 2, 2048);
        moeq_engine *e = engine_or_fail(m, &p);
        char err[512] = "";
        int V = m->config.vocab_size;
        long long drafted = 0, accepted = 0; /* greedy rounds */
        for (int salt = 0; salt < 3; salt++) {
            int32_t prompt[40];
            int n_prompt = 4 + 17 * salt;
            for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 37 + salt * 101 + 5) % V);
            for (int sampled = 0; sampled < 2; sampled++) {
                moeq_generate_params gp = {.sampling = moeq_sampling_default_params(), .max_new_tokens = 40};
                if (sampled) gp.sampling.temperature = 0.9, gp.sampling.seed = 77 + (uint64_t)salt;
                int32_t *plain = NULL, *spec = NULL;
                int n_plain = 0, n_spec = 0;
                if (moeq_generate(e, prompt, n_prompt, &gp, &plain, &n_plain, err, sizeof err)) fail_msg("%s", err);
                for (int k = 1; k <= 3; k++) {
                    moeq_generate_stats st = {0};
                    gp.mtp_k = k, gp.stats = &st;
                    if (moeq_generate(e, prompt, n_prompt, &gp, &spec, &n_spec, err, sizeof err))
                        fail_msg("%s, k %d: %s", names[mi], k, err);
                    if (n_spec != n_plain || memcmp(spec, plain, (size_t)n_plain * sizeof *plain))
                        fail_msg("%s, prompt %d, %s, k %d: MTP changed the tokens", names[mi], salt,
                                 sampled ? "sampled" : "greedy", k);
                    if (!sampled) drafted += st.drafted, accepted += st.accepted;
                    free(spec);
                    gp.mtp_k = 0, gp.stats = NULL;
                }
                free(plain);
            }
        }
        print_message("  %s: %lld of %lld greedy drafts accepted\n", names[mi], accepted, drafted);
        assert_true(drafted > 0);
        if (mi == 1) assert_true(accepted * 10 > drafted * 6); /* the agreeing checkpoint agrees on the device */
        moeq_engine_destroy(e);
    }
}

/* A sequence's logits on the device do not depend on its batch-mates, nor on prefill vs decode. */
static void batch_invariance_holds_on_the_gpu(void **state) {
    (void)state;
    const moeq_model *m = models[0];
    int V = m->config.vocab_size;
    moeq_engine_params p = params_on(gpu_name, 1, 8, 4096);
    moeq_engine *e = engine_or_fail(m, &p);
    char err[512] = "";
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = (int32_t)((i * 31 + 7) % V);
    float *alone = malloc((size_t)V * 4), *mates = malloc((size_t)8 * V * 4), *chunks = malloc((size_t)V * 4);
    int a, b, c, d;
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    moeq_step_item it = {a, prompt, 300, 0}; /* 300 tokens: contexts past one split-KV partition */
    if (moeq_engine_step(e, &it, 1, alone, 1, err, sizeof err)) fail_msg("%s", err);
    /* the same prompt beside batch-mates of other lengths */
    assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(e, &c), MOEQ_OK);
    moeq_step_item two[2] = {{b, prompt + 5, 40, 0}, {c, prompt, 300, 0}};
    if (moeq_engine_step(e, two, 2, mates, 8, err, sizeof err)) fail_msg("%s", err);
    same_bits(mates + V, alone, (size_t)V, "the same prompt with a batch-mate");
    /* prefill in chunks of 1, 7 and the rest == one prefill */
    assert_int_equal(moeq_engine_seq_new(e, &d), MOEQ_OK);
    int done = 0;
    const int sizes[] = {1, 7, 292};
    for (int k = 0; k < 3; k++) {
        moeq_step_item ch = {d, prompt + done, sizes[k], 0};
        if (moeq_engine_step(e, &ch, 1, chunks, 1, err, sizeof err)) fail_msg("%s", err);
        done += sizes[k];
    }
    same_bits(chunks, alone, (size_t)V, "chunked prefill vs one prefill");
    free(alone), free(mates), free(chunks);
    moeq_engine_destroy(e);
}

/*
 * B sequences prefilled one by one (prompts of 1..290 tokens: one or two split-KV partitions; prefills run eagerly),
 * then 3 decode steps of all B (graphs of their bucket); every row's logits. info: the backend's description after
 * the run (its graphs' counts).
 */
static float *graph_run(const moeq_model *m, const char *graphs, int invariant, int B, int *n_rows_out,
                        char *info, size_t info_size) {
    moeq_engine_params p = params_on(gpu_name, invariant, B, (int64_t)B * 320);
    snprintf(p.cuda_graphs, sizeof p.cuda_graphs, "%s", graphs);
    moeq_engine *e = engine_or_fail(m, &p);
    char err[512] = "";
    int V = m->config.vocab_size, rows = 0, *seq = malloc((size_t)B * sizeof(int));
    float *all = malloc((size_t)4 * B * V * sizeof(float));
    int32_t *prompt = malloc(300 * sizeof(int32_t)), *tok = malloc((size_t)B * sizeof(int32_t));
    moeq_step_item *d = malloc((size_t)B * sizeof(moeq_step_item));
    for (int i = 0; i < 300; i++) prompt[i] = (int32_t)((i * 29 + 3) % V);
    for (int s = 0; s < B; s++) {
        assert_int_equal(moeq_engine_seq_new(e, &seq[s]), MOEQ_OK);
        moeq_step_item it = {seq[s], prompt + s % 7, 1 + (s * 53) % 290, 0};
        if (moeq_engine_step(e, &it, 1, all + (size_t)rows * V, 1, err, sizeof err)) fail_msg("prefill: %s", err);
        rows++;
    }
    for (int k = 0; k < 3; k++) {
        for (int s = 0; s < B; s++) {
            tok[s] = (int32_t)((k * 11 + s * 7 + 3) % V);
            d[s] = (moeq_step_item){seq[s], &tok[s], 1, 0};
        }
        if (moeq_engine_step(e, d, B, all + (size_t)rows * V, B, err, sizeof err)) fail_msg("decode: %s", err);
        rows += B;
    }
    snprintf(info, info_size, "%s", moeq_engine_backend_info(e));
    moeq_engine_destroy(e);
    free(seq), free(prompt), free(tok), free(d);
    *n_rows_out = rows;
    return all;
}

/*
 * cuda_graphs (steps padded to their bucket, captured once, replayed; the capacity grid, the device's split plan,
 * fixed-stride block tables) changes no value in batch-invariant mode: every row equals the eager path's, bit for
 * bit, at every batch size. With batch_invariant 0 a padded step's cuBLAS calls see more rows (another algorithm
 * may run): within the cuBLAS tolerance. On the device at least one capture must have held (batch-invariant).
 */
static void decode_with_graphs_equals_decode_without_bit_for_bit_at_several_batch_sizes(void **state) {
    (void)state;
    const int Bs[] = {1, 2, 5, 8, 33};
    for (int inv = 1; inv >= 0; inv--)
        for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++) {
            const moeq_model *m = models[0];
            int V = m->config.vocab_size, r_off = 0, r_on = 0;
            char info_off[1024], info_on[1024], what[120];
            float *off = graph_run(m, "off", inv, Bs[bi], &r_off, info_off, sizeof info_off);
            float *on = graph_run(m, "auto", inv, Bs[bi], &r_on, info_on, sizeof info_on);
            assert_int_equal(r_off, r_on);
            snprintf(what, sizeof what, "batch %d, batch_invariant %d: cuda_graphs auto vs off", Bs[bi], inv);
            if (inv) same_bits(on, off, (size_t)r_on * V, what);
            else close_to(on, off, (size_t)r_on * V, 1e-3 * max_abs(off, (size_t)r_off * V), 0, what);
            if (!strcmp(gpu_name, "cuda")) { /* the description says what ran */
                print_message("  batch %d, batch_invariant %d: %s\n", Bs[bi], inv, info_on);
                assert_non_null(strstr(info_off, "CUDA graphs: off"));
                assert_non_null(strstr(info_on, "CUDA graphs: on"));
                if (inv) assert_null(strstr(info_on, " 0 captured"));
            }
            free(off), free(on);
        }
}

int main(int argc, char **argv) {
    char why[256] = "";
    if (argc > 1 && !strcmp(argv[1], "--cpu-standin")) {
        gpu_name = "cuda-standin";
        if (moeq_backend_register(gpu_name, standin_new)) return fprintf(stderr, "register %s\n", gpu_name), 1;
    } else if (moeq_cuda_device_count(why, sizeof why) <= 0) {
        printf("SKIP test_backend_cuda_gpu: %s\n", why);
        return SKIP_CODE;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(model_root, sizeof model_root, "%s/moeq-cuda-gpu-XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(model_root)) return perror("mkdtemp"), 1;
    models[0] = gen("tiny", MOEQ_GENMODEL_BF16, "tiny-bf16");
    models[1] = gen("tiny", MOEQ_GENMODEL_F8, "tiny-f8");
    models[2] = gen("tiny-v2", MOEQ_GENMODEL_BF16, "tiny-v2-bf16");
    models[3] = gen("tiny-mtp", MOEQ_GENMODEL_BF16, "tiny-mtp-bf16");
    models[4] = gen("small", MOEQ_GENMODEL_BF16, "small-bf16");
    models[5] = gen("small", MOEQ_GENMODEL_F8, "small-f8");
    for (int i = 0; i < 6; i++)
        if (!models[i]) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matmuls_give_the_cpu_backends_bits_and_cublas_is_close),
        cmocka_unit_test(map_experts_holds_exactly_the_flagged_experts),
        cmocka_unit_test(row_ops_give_the_cpu_backends_bits),
        cmocka_unit_test(cache_ops_match_the_cpu_backend),
        cmocka_unit_test(moe_ops_route_like_the_cpu_and_permute_exactly),
        cmocka_unit_test(moe_experts_on_cuda_equals_the_cpu_op),
        cmocka_unit_test(logits_records_on_cuda_equal_the_cpu_ops),
        cmocka_unit_test(whole_model_logits_on_cuda_match_the_cpu_engine),
        cmocka_unit_test(greedy_continuations_of_32_tokens_equal_the_cpu_engines),
        cmocka_unit_test(mtp_on_gives_the_tokens_of_mtp_off_on_the_gpu),
        cmocka_unit_test(batch_invariance_holds_on_the_gpu),
        cmocka_unit_test(decode_with_graphs_equals_decode_without_bit_for_bit_at_several_batch_sizes),
    };
    /* MOEQ_TEST_FILTER runs the tests that match a pattern alone: a device fault is sticky for the process, so
     * after one, gpu-check.sh reruns each test on its own to learn which of the others pass */
    const char *only = getenv("MOEQ_TEST_FILTER");
    if (only && *only) cmocka_set_test_filter(only);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < 6; i++) moeq_model_destroy(models[i]);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", model_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", model_root);
    return rc;
}
