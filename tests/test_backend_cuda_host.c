/*
 * test_backend_cuda_host.c — the CUDA backend's index and split-KV arithmetic
 * (engine/cuda/backend_index.cuh, the inline functions its kernels call)
 * driven on the host against the CPU backend over many shapes, with the
 * kernels' grids emulated (every block and thread a launch would run, the
 * butterfly by its host form); and the backend's error paths. No GPU needed:
 * on a machine without one, creating the cuda backend must fail with the
 * reason, never crash. test_backend_cuda_gpu runs the kernels themselves.
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
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/logits_reduce.h"
#include "engine_state.h"
#include "kv_paged.h"
#include "moe_layer.h"
#include "moeq/ep_placement.h"
#include "moeq/engine.h"
#include "moeq/genmodel.h"
#include "tensor.h"

#include "backend_index.cuh"
#include "graph_index.cuh"
#include "moe_index.cuh"
#ifdef MOEQ_HAVE_CUDA_BACKEND
#include "cuda/backend_cuda.h"
#include "moeq/cuda_kernels.h"
#endif

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float frand(void) { return (float)(urand() & 0xFFFFFF) / (float)(1 << 23) - 1.0f; } /* [-1, 1) */

static void assert_same_bits(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) && !(isnan(got[i]) && isnan(want[i])))
            fail_msg("%s: element %zu: helper %.9g vs cpu %.9g", what, i, got[i], want[i]);
}

static moeq_backend *cpu_backend(int64_t max_ctx) {
    moeq_backend_config c = {.n_threads = 2, .batch_invariant = 1, .blas_min_tokens = 16, .max_k = 4096,
                             .max_ctx = max_ctx, .max_jobs = 64};
    moeq_backend *b = moeq_backend_cpu_new(&c);
    assert_non_null(b);
    return b;
}

/* ---- a paged cache on the host: random block ids, random entries ------------------------------------------ */

typedef struct fake_cache {
    moeq_kv_paged kv;
    int32_t *table;
    float *pool;
    int n_seqs;
    int64_t max_len;
} fake_cache;

/* n_seqs sequences of up to max_len positions; blocks shuffled over the pool; 2 layers, layer 1 described. */
static void fake_cache_make(fake_cache *c, int n_seqs, int64_t max_len, int block_tokens, int entry_floats) {
    int64_t per_seq = moeq_cu_kv_blocks(max_len, block_tokens), n_blocks = per_seq * n_seqs;
    size_t block_floats = (size_t)2 * (size_t)block_tokens * (size_t)entry_floats;
    c->table = malloc((size_t)n_blocks * sizeof(int32_t));
    c->pool = malloc((size_t)n_blocks * block_floats * sizeof(float));
    for (int64_t i = 0; i < n_blocks; i++) c->table[i] = (int32_t)i;
    for (int64_t i = n_blocks - 1; i > 0; i--) { /* Fisher-Yates: block ids out of order */
        int64_t j = urand() % (uint32_t)(i + 1);
        int32_t tmp = c->table[i];
        c->table[i] = c->table[j];
        c->table[j] = tmp;
    }
    for (size_t i = 0; i < (size_t)n_blocks * block_floats; i++) c->pool[i] = frand();
    c->kv = (moeq_kv_paged){c->pool, c->table, per_seq, block_floats, (size_t)block_tokens * entry_floats,
                            block_tokens, entry_floats};
    c->n_seqs = n_seqs;
    c->max_len = max_len;
}

static void fake_cache_free(fake_cache *c) { free(c->table), free(c->pool); }

/* A step of T tokens: runs of one sequence (a prefill chunk) and single tokens, positions below max_len. */
static void random_step(const fake_cache *c, int64_t T, int32_t *seq, int64_t *pos) {
    for (int64_t t = 0; t < T;) {
        int s = (int)(urand() % (uint32_t)c->n_seqs);
        int64_t run = 1 + urand() % 6, p0 = urand() % (uint32_t)c->max_len;
        for (int64_t k = 0; k < run && t < T; k++, t++) {
            seq[t] = s;
            pos[t] = p0 + k < c->max_len ? p0 + k : c->max_len - 1;
        }
    }
}

static void compact_tables_address_every_entry_as_the_engines_block_tables(void **state) {
    (void)state;
    const int bts[] = {1, 3, 16, 64}, efs[] = {1, 9, 288};
    for (int bi = 0; bi < 4; bi++)
        for (int ei = 0; ei < 3; ei++) {
            fake_cache c;
            fake_cache_make(&c, 5, 300, bts[bi], efs[ei]);
            for (int rep = 0; rep < 20; rep++) {
                int64_t T = 1 + urand() % 40, cap = 0;
                int32_t seq[40], row_off[40];
                int64_t pos[40];
                random_step(&c, T, seq, pos);
                for (int64_t t = 0; t < T; t++) cap += moeq_cu_kv_blocks(pos[t] + 1, bts[bi]);
                int32_t *ctab = malloc((size_t)cap * sizeof(int32_t));
                int64_t used = moeq_cu_kv_compact(c.table, c.kv.table_stride, seq, pos, T, bts[bi], row_off, ctab, cap);
                assert_true(used > 0 && used <= cap);
                assert_int_equal(used, moeq_cu_kv_compact_entries(seq, pos, T, bts[bi])); /* what is staged */
                for (int64_t t = 0; t < T; t++)
                    for (int64_t p = 0; p <= pos[t]; p++) { /* every entry the token's attention reads */
                        size_t off = moeq_cu_kv_entry_offset(ctab + row_off[t], p, bts[bi], c.kv.block_floats,
                                                             c.kv.layer_offset, efs[ei]);
                        assert_ptr_equal(c.pool + off, moeq_kv_paged_entry(&c.kv, seq[t], p));
                    }
                if (used > 1) /* too small a bound is refused, not overrun */
                    assert_int_equal(moeq_cu_kv_compact(c.table, c.kv.table_stride, seq, pos, T, bts[bi], row_off,
                                                        ctab, used - 1), -1);
                free(ctab);
            }
            fake_cache_free(&c);
        }
}

/* A prefill chunk late in a long context stages one row of blocks, not one per token (2048 x ~3700 blocks). */
static void a_long_prefill_chunk_stages_one_row_of_blocks(void **state) {
    (void)state;
    int64_t T = 2048, *pos = malloc((size_t)T * sizeof(int64_t));
    int32_t *seq = malloc((size_t)T * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) seq[t] = 3, pos[t] = 58000 + t;
    assert_int_equal(moeq_cu_kv_compact_entries(seq, pos, T, 16), (58000 + 2048 + 15) / 16);
    seq[T - 1] = 4, pos[T - 1] = 10; /* a decode token of another sequence after it: a second row */
    assert_int_equal(moeq_cu_kv_compact_entries(seq, pos, T, 16), (58000 + 2047 + 15) / 16 + 1);
    free(pos), free(seq);
}

static void split_partitions_cover_each_context_once_and_depend_only_on_its_length(void **state) {
    (void)state;
    for (int64_t n = 1; n <= 200000; n += n < 3000 ? 1 : 997) {
        int parts = moeq_cu_split_parts(n);
        assert_true(parts >= 1 && parts <= moeq_cu_split_max_parts(200000));
        int64_t next = 0;
        for (int p = 0; p < parts; p++) {
            int64_t j0, j1;
            moeq_cu_split_range(n, parts, p, &j0, &j1);
            assert_int_equal(j0, next);                             /* contiguous, in order */
            assert_true(j1 > j0 && j1 - j0 <= MOEQ_CU_SPLIT_MAX_ROWS); /* never empty, fits the kernel */
            next = j1;
        }
        assert_int_equal(next, n);
        if (n <= MOEQ_CU_SPLIT_ROWS) assert_int_equal(parts, 1);
        assert_true(moeq_cu_split_parts(n) <= moeq_cu_split_parts(n + 1)); /* monotone: the workspace bound holds */
    }
    /* the plan of a call: tokens in order, each token's slots contiguous, its partitions from its length alone */
    int64_t pos[6] = {0, 255, 256, 4095, 70000, 3};
    moeq_cu_split_item items[256];
    int32_t first[6], count[6];
    int64_t n = moeq_cu_split_plan(pos, 0, 6, items, first, count, 256);
    assert_true(n > 6);
    for (int t = 0; t < 6; t++) {
        assert_int_equal(count[t], moeq_cu_split_parts(pos[t] + 1));
        for (int p = 0; p < count[t]; p++) {
            const moeq_cu_split_item *it = &items[first[t] + p];
            int64_t j0, j1;
            moeq_cu_split_range(pos[t] + 1, count[t], p, &j0, &j1);
            assert_true(it->t == t && it->slot == first[t] + p && it->j0 == j0 && it->j1 == j1);
        }
    }
    assert_int_equal(moeq_cu_split_plan(pos, 0, 6, items, first, count, n - 1), -1);
}

/*
 * The kernels' arithmetic for one (token, head), emulated: attn_partial_kernel per partition (scores by
 * half-warps of 16 lanes and the butterfly, the max, exp, the sum's 16 lanes and butterfly, the output
 * chain), then attn_merge_kernel.
 */
static void emulate_split_attention(const moeq_mla_params *a, const int32_t *row_off, const int32_t *ctab, int64_t t,
                                    int h, float *out) {
    int L = a->kv_lora, R = a->rope, H = a->n_heads;
    int64_t n_ctx = a->pos[t] + 1;
    int P = moeq_cu_split_parts(n_ctx);
    float *o = malloc((size_t)P * L * sizeof(float)), m[4096], l[4096], sc[MOEQ_CU_SPLIT_MAX_ROWS], sc_[4096];
    const float *ql = a->q_lat + (t * H + h) * L, *qp = a->q_pe + (t * H + h) * R;
    assert_true(P <= 4096);
    for (int p = 0; p < P; p++) {
        int64_t j0, j1;
        moeq_cu_split_range(n_ctx, P, p, &j0, &j1);
        int n = (int)(j1 - j0);
        for (int j = 0; j < n; j++) {
            const float *e = a->kv.pool + moeq_cu_kv_entry_offset(ctab + row_off[t], j0 + j, a->kv.block_tokens,
                                                                  a->kv.block_floats, a->kv.layer_offset,
                                                                  a->kv.entry_floats);
            float lanes[MOEQ_CU_LANES];
            for (int lane = 0; lane < MOEQ_CU_LANES; lane++) lanes[lane] = moeq_cu_score_lane(ql, qp, e, L, R, lane);
            moeq_cu_butterfly16(lanes);
            sc[j] = lanes[0] * a->scale;
        }
        m[p] = moeq_cu_split_max(sc, n);
        for (int j = 0; j < n; j++) sc[j] = moeq_cu_exp_nonpos(sc[j] - m[p]);
        float lanes[MOEQ_CU_LANES];
        for (int lane = 0; lane < MOEQ_CU_LANES; lane++) lanes[lane] = moeq_cu_split_sum_lane(sc, n, lane);
        moeq_cu_butterfly16(lanes);
        l[p] = lanes[0];
        for (int d = 0; d < L; d++) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++) {
                const float *e = a->kv.pool + moeq_cu_kv_entry_offset(ctab + row_off[t], j0 + j, a->kv.block_tokens,
                                                                      a->kv.block_floats, a->kv.layer_offset,
                                                                      a->kv.entry_floats);
                acc = fmaf(sc[j], e[d], acc);
            }
            o[(int64_t)p * L + d] = acc;
        }
    }
    float Lsum = moeq_cu_split_merge_scales(m, l, P, sc_);
    for (int d = 0; d < L; d++) out[d] = moeq_cu_split_merge_elem(o, L, sc_, P, Lsum, d);
    free(o);
}

static void split_kv_partials_merged_equal_the_cpu_attention(void **state) {
    (void)state;
    typedef struct shape {
        int H, L, R, bt;
        int64_t max_len;
    } shape;
    const shape shapes[] = {{1, 16, 8, 16, 40}, {3, 64, 32, 7, 700}, {16, 100, 64, 16, 2100}, {2, 512, 64, 64, 5000},
                            {4, 32, 16, 1, 300}};
    moeq_backend *cpu = cpu_backend(5000);
    double worst = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        fake_cache c;
        fake_cache_make(&c, 3, sh->max_len, sh->bt, sh->L + sh->R);
        int64_t T = 6;
        int32_t seq[6], row_off[6];
        int64_t pos[6], cap = 0;
        random_step(&c, T, seq, pos);
        pos[0] = sh->max_len - 1; /* the longest context: the most partitions */
        for (int64_t t = 0; t < T; t++) cap += moeq_cu_kv_blocks(pos[t] + 1, sh->bt);
        int32_t *ctab = malloc((size_t)cap * sizeof(int32_t));
        assert_true(moeq_cu_kv_compact(c.table, c.kv.table_stride, seq, pos, T, sh->bt, row_off, ctab, cap) > 0);
        size_t nq = (size_t)(T * sh->H);
        float *ql = malloc(nq * sh->L * sizeof(float)), *qp = malloc(nq * sh->R * sizeof(float));
        float *want = malloc(nq * sh->L * sizeof(float)), *got = malloc((size_t)sh->L * sizeof(float));
        for (size_t i = 0; i < nq * sh->L; i++) ql[i] = frand() * 0.3f;
        for (size_t i = 0; i < nq * sh->R; i++) qp[i] = frand() * 0.3f;
        moeq_mla_params a = {c.kv, T, seq, pos, sh->H, sh->L, sh->R, ql, qp, want, 0.125f};
        cpu->attention(cpu, &a);
        for (int64_t t = 0; t < T; t++)
            for (int h = 0; h < sh->H; h++) {
                emulate_split_attention(&a, row_off, ctab, t, h, got);
                const float *w = want + (t * sh->H + h) * sh->L;
                for (int d = 0; d < sh->L; d++) {
                    double e = fabs((double)got[d] - w[d]);
                    worst = e > worst ? e : worst;
                    if (e > 2e-6 + 2e-6 * fabs(w[d]))
                        fail_msg("H %d L %d R %d bt %d: token %lld (ctx %lld, %d parts) head %d [%d]: "
                                 "split %.9g cpu %.9g",
                                 sh->H, sh->L, sh->R, sh->bt, (long long)t, (long long)pos[t] + 1,
                                 moeq_cu_split_parts(pos[t] + 1), h, d, got[d], w[d]);
                }
            }
        free(ql), free(qp), free(want), free(got), free(ctab);
        fake_cache_free(&c);
    }
    print_message("split-KV vs cpu attention: worst abs difference %.3g\n", worst);
    moeq_backend_destroy(cpu);
}

/* The merge alone over random partials (every partition's max, sum, output) against float64. */
static void split_merge_of_random_partials_equals_the_float64_softmax(void **state) {
    (void)state;
    for (int rep = 0; rep < 300; rep++) {
        int P = 1 + (int)(urand() % 40), D = 1 + (int)(urand() % 17);
        float m[40], l[40], a[40], o[40 * 17];
        for (int p = 0; p < P; p++) {
            m[p] = frand() * 30.0f;
            l[p] = 1.0f + (frand() + 1.0f) * 100.0f; /* a partition's sum holds its max's exp(0) = 1 */
            for (int d = 0; d < D; d++) o[p * D + d] = frand() * l[p];
        }
        float L = moeq_cu_split_merge_scales(m, l, P, a);
        double M = -INFINITY, Ld = 0;
        for (int p = 0; p < P; p++) M = m[p] > M ? m[p] : M;
        for (int p = 0; p < P; p++) Ld += exp((double)m[p] - M) * l[p];
        assert_true(fabs(L - Ld) <= 1e-5 * Ld);
        for (int d = 0; d < D; d++) {
            double want = 0;
            for (int p = 0; p < P; p++) want += exp((double)m[p] - M) * o[p * D + d];
            want /= Ld;
            float got = moeq_cu_split_merge_elem(o, D, a, P, L, d);
            if (fabs(got - want) > 1e-5 * (1 + fabs(want)))
                fail_msg("P %d d %d: merge %.9g float64 %.9g", P, d, got, want);
        }
    }
}

/* ---- CUDA graphs: buckets, the device split plan, fixed tables, padding (graph_index.cuh) ------------------ */

static void decode_buckets_are_the_smallest_power_of_two_that_holds_the_step(void **state) {
    (void)state;
    int64_t sizes[MOEQ_CU_GRAPH_MAX_BUCKETS];
    int n = moeq_cu_graph_buckets(2048, sizes);
    assert_int_equal(n, 9);
    for (int i = 0; i < n; i++) assert_int_equal(sizes[i], (int64_t)1 << i);
    for (int64_t T = 1; T <= 256; T++) {
        int b = moeq_cu_graph_bucket(sizes, n, T);
        assert_true(b >= 0 && sizes[b] >= T);             /* holds the step ...        */
        assert_true(b == 0 || sizes[b - 1] < T);          /* ... and is the smallest   */
    }
    assert_int_equal(moeq_cu_graph_bucket(sizes, n, 257), -1); /* past the largest: eager */
    assert_int_equal(moeq_cu_graph_bucket(sizes, n, 0), -1);
    assert_int_equal(moeq_cu_graph_bucket(sizes, n, -3), -1);
    /* an engine whose steps hold fewer tokens gets no bucket it could not fill */
    n = moeq_cu_graph_buckets(100, sizes);
    assert_int_equal(n, 7);
    assert_int_equal(sizes[n - 1], 64);
    assert_int_equal(moeq_cu_graph_bucket(sizes, n, 65), -1);
    n = moeq_cu_graph_buckets(1, sizes);
    assert_true(n == 1 && sizes[0] == 1);
    assert_int_equal(moeq_cu_graph_bucket(sizes, n, 1), 0);
    assert_int_equal(moeq_cu_graph_bucket(sizes, n, 2), -1);
}

/* Positions of a decode step of T tokens in one of a few regimes (short, around the partition edges, long). */
static void random_positions(int64_t *pos, int64_t T, int64_t max_ctx, int regime) {
    for (int64_t t = 0; t < T; t++) {
        int64_t p;
        switch (regime) {
        case 0: p = urand() % 300; break;
        case 1: p = MOEQ_CU_SPLIT_ROWS * (int64_t)(urand() % 20) + (int64_t)(urand() % 3) - 1; break;
        case 2: p = MOEQ_CU_SPLIT_MAX_ROWS * (int64_t)(urand() % 40) + (int64_t)(urand() % 3) - 1; break;
        default: p = (int64_t)(((uint64_t)urand() << 16 ^ urand()) % (uint64_t)max_ctx); break;
        }
        pos[t] = p < 0 ? 0 : p >= max_ctx ? max_ctx - 1 : p;
    }
}

/* The capacity grid with the plan computed on the device finds, block by block, the host plan's items: same
 * tokens, rows, slots, first and count (so the merge reads the same partials in the same order), idle past the
 * last item, and the capacity holds every step of contexts up to max_ctx. */
static void the_device_split_plan_equals_the_host_plan_over_many_shapes(void **state) {
    (void)state;
    const int64_t Ts[] = {1, 2, 3, 7, 8, 16, 31, 64, 100, 128, 255, 256};
    const int64_t ctxs[] = {1, 256, 257, 4096, 4097, 32768, 163840};
    int64_t *pos = malloc(256 * sizeof(int64_t)), shapes = 0;
    int32_t *first = malloc(256 * sizeof(int32_t)), *count = malloc(256 * sizeof(int32_t));
    int32_t *hfirst = malloc(256 * sizeof(int32_t)), *hcount = malloc(256 * sizeof(int32_t));
    for (size_t ci = 0; ci < sizeof ctxs / sizeof ctxs[0]; ci++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (int regime = 0; regime < 4; regime++)
                for (int rep = 0; rep < 3; rep++, shapes++) {
                    int64_t T = Ts[ti], max_ctx = ctxs[ci];
                    random_positions(pos, T, max_ctx, regime);
                    int64_t cap = moeq_cu_split_item_cap(T, max_ctx, INT64_MAX);
                    moeq_cu_split_item *items = malloc((size_t)cap * sizeof(*items));
                    int64_t n = moeq_cu_split_plan(pos, 0, T, items, hfirst, hcount, cap);
                    assert_true(n >= T && n <= cap); /* the capacity holds any step up to max_ctx */
                    assert_int_equal(n, moeq_cu_split_items(pos, T));
                    int32_t total = -1;
                    moeq_cu_split_scan(pos, T, first, count, &total);
                    assert_int_equal(total, n);
                    assert_memory_equal(first, hfirst, (size_t)T * sizeof(int32_t));
                    assert_memory_equal(count, hcount, (size_t)T * sizeof(int32_t));
                    for (int64_t x = 0; x < cap; x++) {
                        moeq_cu_split_item it = {-1, -1, -1, -1};
                        int busy = moeq_cu_split_find(pos, first, count, T, total, x, &it);
                        assert_int_equal(busy, x < n);
                        if (busy && memcmp(&it, &items[x], sizeof it))
                            fail_msg("T %lld ctx %lld item %lld: device (%d, %d, %d..%d) host (%d, %d, %d..%d)",
                                     (long long)T, (long long)max_ctx, (long long)x, it.t, it.slot, it.j0, it.j1,
                                     items[x].t, items[x].slot, items[x].j0, items[x].j1);
                    }
                    free(items);
                }
    /* a workspace smaller than the bucket's need caps the grid; a step past it is the host's to run eagerly */
    assert_int_equal(moeq_cu_split_item_cap(256, 163840, 1000), 1000);
    assert_int_equal(moeq_cu_split_item_cap(4, 300, 1000), 4 * moeq_cu_split_max_parts(300));
    print_message("device split plan: %lld steps equal to the host plan\n", (long long)shapes);
    free(pos), free(first), free(count), free(hfirst), free(hcount);
}

/* Fixed-stride tables address every entry a token reads exactly as the engine's tables; padding rows read and
 * write only the scratch block's first entry. */
static void fixed_stride_tables_address_every_entry_as_the_engines_and_padding_the_scratch_block(void **state) {
    (void)state;
    const int bts[] = {1, 3, 16, 64}, efs[] = {1, 9, 288};
    for (int bi = 0; bi < 4; bi++)
        for (int ei = 0; ei < 3; ei++) {
            fake_cache c;
            fake_cache_make(&c, 5, 300, bts[bi], efs[ei]);
            int64_t stride = moeq_cu_kv_fixed_stride(300, bts[bi]);
            int32_t scratch = (int32_t)(moeq_cu_kv_blocks(300, bts[bi]) * 5 - 1); /* any block the test names */
            for (int rep = 0; rep < 20; rep++) {
                int64_t n_valid = 1 + urand() % 40, n_rows = n_valid + urand() % 9;
                int32_t seq[48], ids[48], row_off[48];
                int64_t pos[48];
                random_step(&c, n_valid, seq, pos);
                for (int64_t t = 0; t < n_valid; t++) ids[t] = 7;
                moeq_cu_graph_pad(ids, seq, pos, n_valid, n_rows, -1);
                int32_t *tab = malloc((size_t)(n_rows * stride) * sizeof(int32_t));
                for (int64_t i = 0; i < n_rows * stride; i++) tab[i] = -7; /* what no read may see */
                assert_int_equal(moeq_cu_kv_fixed_offsets(n_rows, stride, row_off), 0);
                assert_int_equal(moeq_cu_kv_fixed_fill(c.table, c.kv.table_stride, seq, pos, n_valid, n_rows,
                                                       bts[bi], stride, scratch, tab), 0);
                for (int64_t t = 0; t < n_rows; t++) {
                    assert_ptr_equal(tab + row_off[t], moeq_cu_kv_fixed_row(tab, stride, t));
                    if (t >= n_valid) { /* padding: id 0 at position 0 of the scratch block */
                        assert_true(ids[t] == 0 && pos[t] == 0 && seq[t] == -1);
                        assert_int_equal(moeq_cu_kv_entry_offset(tab + row_off[t], 0, bts[bi], c.kv.block_floats,
                                                                 c.kv.layer_offset, efs[ei]),
                                         (size_t)scratch * c.kv.block_floats + c.kv.layer_offset);
                        continue;
                    }
                    for (int64_t p = 0; p <= pos[t]; p++) {
                        size_t off = moeq_cu_kv_entry_offset(tab + row_off[t], p, bts[bi], c.kv.block_floats,
                                                             c.kv.layer_offset, efs[ei]);
                        assert_ptr_equal(c.pool + off, moeq_kv_paged_entry(&c.kv, seq[t], p));
                    }
                }
                free(tab);
            }
            /* a position past the stride is refused, not written past the row */
            int32_t seq1 = 0, tab1[400];
            int64_t pos1 = stride * bts[bi];
            assert_int_equal(moeq_cu_kv_fixed_fill(c.table, c.kv.table_stride, &seq1, &pos1, 1, 1, bts[bi], stride,
                                                   scratch, tab1), -1);
            fake_cache_free(&c);
        }
    int32_t off[4];
    assert_int_equal(moeq_cu_kv_fixed_offsets(4, (int64_t)1 << 30, off), -1); /* past int32: refused */
    assert_int_equal(moeq_cu_kv_fixed_offsets(2, (int64_t)1 << 30, off), 0);
}

/*
 * fixed_sync's bookkeeping played on the host: a "device" table, the host's mirror and each row's held entries,
 * over steps whose batches change (sequences come and go, positions advance, padding rows): after each sync every
 * entry a token reads on the device is the engine's block, a second sync of the same step uploads nothing, and a
 * decode step uploads only the rows that crossed into a new block or changed sequence.
 */
static void fixed_table_sync_uploads_only_changed_rows_and_keeps_the_device_right(void **state) {
    (void)state;
    const int bts[] = {1, 4, 16};
    for (int bi = 0; bi < 3; bi++) {
        int bt = bts[bi];
        fake_cache c;
        fake_cache_make(&c, 12, 400, bt, 3);
        int64_t S = moeq_cu_kv_fixed_stride(400, bt), R = 64;
        int32_t *dev = malloc((size_t)(R * S) * sizeof(int32_t)), *mirror = calloc((size_t)(R * S), sizeof(int32_t));
        int32_t *cand = calloc((size_t)(R * S), sizeof(int32_t)), scratch = 0, seq[64];
        int64_t *held = calloc((size_t)R, sizeof(int64_t)), pos[64], len[12] = {0}, uploaded_total = 0;
        uint8_t diff[64];
        for (int64_t i = 0; i < R * S; i++) dev[i] = -1; /* what no read may see */
        int64_t n_valid = 5;
        for (int s = 0; s < 11; s++) len[s] = urand() % 300;
        for (int step = 0; step < 60; step++) {
            if (step % 10 == 9) n_valid = 1 + urand() % 11; /* the batch changes now and then */
            int64_t n_rows = n_valid + (step % 3 == 0 ? (int64_t)(urand() % 4) : 0);
            for (int64_t t = 0; t < n_valid; t++) {
                seq[t] = (int32_t)((t + step / 10) % 11), pos[t] = len[seq[t]];
                if (len[seq[t]] < 398) len[seq[t]]++;
            }
            moeq_cu_graph_pad(NULL, seq, pos, n_valid, n_rows, 11);
            scratch = c.table[11 * c.kv.table_stride];
            for (int rep = 0; rep < 2; rep++) {
                assert_int_equal(moeq_cu_kv_fixed_fill(c.table, c.kv.table_stride, seq, pos, n_valid, n_rows, bt, S,
                                                       scratch, cand), 0);
                int64_t n_diff = moeq_cu_kv_fixed_diff(cand, mirror, held, pos, n_rows, bt, S, diff), t = 0, t0,
                        t1, rows = 0;
                if (rep) assert_int_equal(n_diff, 0); /* the same step again: nothing to upload */
                /* every other step the staging holds only `per` rows (0: less than one, taken as one): each run
                 * goes up in pieces, as fixed_sync does past the whole staging; the pieces cover it exactly */
                int64_t per = step % 2 ? (int64_t)(step / 2 % 4) : INT64_MAX;
                while (moeq_cu_kv_fixed_run(diff, n_rows, &t, &t0, &t1)) {
                    assert_true(t0 < t1 && diff[t0] && diff[t1 - 1] && (t1 == n_rows || !diff[t1]));
                    for (int64_t r0 = t0, r1; r0 < t1; r0 = r1) {
                        r1 = moeq_cu_kv_fixed_piece(r0, t1, per);
                        assert_true(r1 > r0 && r1 <= t1 && r1 - r0 <= (per > 0 ? per : 1));
                        memcpy(dev + r0 * S, cand + r0 * S, (size_t)((r1 - r0) * S) * sizeof(int32_t));
                        memcpy(mirror + r0 * S, cand + r0 * S, (size_t)((r1 - r0) * S) * sizeof(int32_t));
                        for (int64_t r = r0; r < r1; r++) held[r] = S;
                        rows += r1 - r0;
                    }
                }
                assert_int_equal(rows, n_diff);
                uploaded_total += rows;
            }
            for (int64_t t = 0; t < n_rows; t++) /* every entry the kernels read, through the device's rows */
                for (int64_t p = 0; p <= pos[t]; p++) {
                    size_t off = moeq_cu_kv_entry_offset(dev + t * S, p, bt, c.kv.block_floats, c.kv.layer_offset, 3);
                    if (t < n_valid) assert_ptr_equal(c.pool + off, moeq_kv_paged_entry(&c.kv, seq[t], p));
                    else assert_int_equal(off, (size_t)scratch * c.kv.block_floats + c.kv.layer_offset);
                }
        }
        /* uploads are rows that changed, far fewer than every row of every step (60 steps of up to 14 rows) */
        print_message("block %d: %lld rows uploaded over 60 steps\n", bt, (long long)uploaded_total);
        if (bt == 16) assert_true(uploaded_total < 200);
        free(dev), free(mirror), free(cand), free(held);
        fake_cache_free(&c);
    }
}

/*
 * A padded step through the capacity grid (the plan found on the device, fixed tables, padding rows on the
 * scratch block) gives every valid token the eager path's attention bit for bit (compact tables, the host
 * plan), whatever its bucket and batch-mates: the partial and merge kernels emulated on both.
 */
static void split_partials(const moeq_mla_params *a, const int32_t *row_off, const int32_t *ctab,
                           const moeq_cu_split_item *it, int h, float *o, float *m, float *l) {
    int L = a->kv_lora, R = a->rope, H = a->n_heads, n = it->j1 - it->j0;
    const float *ql = a->q_lat + ((int64_t)it->t * H + h) * L, *qp = a->q_pe + ((int64_t)it->t * H + h) * R;
    float *sc = malloc((size_t)n * sizeof(float));
    for (int j = 0; j < n; j++) {
        const float *e = a->kv.pool + moeq_cu_kv_entry_offset(ctab + row_off[it->t], it->j0 + j, a->kv.block_tokens,
                                                              a->kv.block_floats, a->kv.layer_offset,
                                                              a->kv.entry_floats);
        float lanes[MOEQ_CU_LANES];
        for (int lane = 0; lane < MOEQ_CU_LANES; lane++) lanes[lane] = moeq_cu_score_lane(ql, qp, e, L, R, lane);
        moeq_cu_butterfly16(lanes);
        sc[j] = lanes[0] * a->scale;
    }
    *m = moeq_cu_split_max(sc, n);
    for (int j = 0; j < n; j++) sc[j] = moeq_cu_exp_nonpos(sc[j] - *m);
    float lanes[MOEQ_CU_LANES];
    for (int lane = 0; lane < MOEQ_CU_LANES; lane++) lanes[lane] = moeq_cu_split_sum_lane(sc, n, lane);
    moeq_cu_butterfly16(lanes);
    *l = lanes[0];
    for (int d = 0; d < L; d++) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) {
            const float *e = a->kv.pool + moeq_cu_kv_entry_offset(ctab + row_off[it->t], it->j0 + j,
                                                                  a->kv.block_tokens, a->kv.block_floats,
                                                                  a->kv.layer_offset, a->kv.entry_floats);
            acc = fmaf(sc[j], e[d], acc);
        }
        o[d] = acc;
    }
    free(sc);
}

/* The capacity grid of one padded step: every block x < cap (idle past the plan), then the merge per token. */
static void emulate_graph_attention(const moeq_mla_params *a, const int32_t *row_off, const int32_t *tab,
                                    int64_t cap, float *out) {
    int64_t T = a->n_tok;
    int H = a->n_heads, L = a->kv_lora;
    int32_t *first = malloc((size_t)T * sizeof(int32_t)), *count = malloc((size_t)T * sizeof(int32_t)), total;
    float *ws_o = malloc((size_t)(cap * H * L) * sizeof(float)), *ws_ml = malloc((size_t)(cap * H * 2) * sizeof(float));
    moeq_cu_split_scan(a->pos, T, first, count, &total);
    assert_true(total <= cap);
    for (int64_t x = 0; x < cap; x++) {
        moeq_cu_split_item it;
        if (!moeq_cu_split_find(a->pos, first, count, T, total, x, &it)) continue;
        for (int h = 0; h < H; h++)
            split_partials(a, row_off, tab, &it, h, ws_o + ((int64_t)it.slot * H + h) * L,
                           &ws_ml[((int64_t)it.slot * H + h) * 2], &ws_ml[((int64_t)it.slot * H + h) * 2 + 1]);
    }
    for (int64_t t = 0; t < T; t++) /* attn_merge_kernel's block (t, h) */
        for (int h = 0; h < H; h++) {
            int f = first[t], P = count[t];
            float m[4096], l[4096], sa[4096];
            for (int p = 0; p < P; p++) m[p] = ws_ml[((int64_t)(f + p) * H + h) * 2],
                                        l[p] = ws_ml[((int64_t)(f + p) * H + h) * 2 + 1];
            float Ls = moeq_cu_split_merge_scales(m, l, P, sa);
            for (int d = 0; d < L; d++)
                out[(t * H + h) * L + d] =
                    moeq_cu_split_merge_elem(ws_o + ((int64_t)f * H + h) * L, (int64_t)H * L, sa, P, Ls, d);
        }
    free(first), free(count), free(ws_o), free(ws_ml);
}

static void a_padded_step_on_the_capacity_grid_gives_the_eager_bits_in_every_bucket(void **state) {
    (void)state;
    typedef struct shape {
        int H, L, R, bt;
        int64_t max_len;
    } shape;
    const shape shapes[] = {{1, 16, 8, 16, 40}, {3, 64, 32, 7, 700}, {2, 32, 16, 64, 5000}, {4, 32, 16, 1, 300}};
    int64_t sizes[MOEQ_CU_GRAPH_MAX_BUCKETS];
    int nb = moeq_cu_graph_buckets(64, sizes);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        fake_cache c;
        fake_cache_make(&c, 9, sh->max_len + 1, sh->bt, sh->L + sh->R); /* the last block of seq 8: scratch */
        int32_t scratch = c.table[8 * c.kv.table_stride + c.kv.table_stride - 1];
        int64_t stride = moeq_cu_kv_fixed_stride(sh->max_len, sh->bt);
        const int64_t valid[] = {1, 3, 5, 8}; /* sequences 0..7: 8 is the scratch */
        for (int vi = 0; vi < 4; vi++) {
            int64_t n_valid = valid[vi];
            int b = moeq_cu_graph_bucket(sizes, nb, n_valid);
            for (int bump = 0; bump < 2 && b + bump < nb; bump++) { /* its bucket, and the next one up */
                int64_t T = sizes[b + bump];
                int32_t seq[64], row_off[64], ids[64];
                int64_t pos[64];
                for (int64_t t = 0; t < n_valid; t++) /* one token per sequence: a decode step */
                    seq[t] = (int32_t)t, pos[t] = urand() % (uint32_t)sh->max_len;
                pos[0] = sh->max_len - 1;
                moeq_cu_graph_pad(ids, seq, pos, n_valid, T, 8);
                int32_t *tab = malloc((size_t)(T * stride) * sizeof(int32_t));
                assert_int_equal(moeq_cu_kv_fixed_offsets(T, stride, row_off), 0);
                assert_int_equal(moeq_cu_kv_fixed_fill(c.table, c.kv.table_stride, seq, pos, n_valid, T, sh->bt,
                                                       stride, scratch, tab), 0);
                size_t nq = (size_t)(T * sh->H);
                float *ql = malloc(nq * sh->L * sizeof(float)), *qp = malloc(nq * sh->R * sizeof(float));
                float *got = malloc(nq * sh->L * sizeof(float)), *want = malloc((size_t)sh->L * sizeof(float));
                for (size_t i = 0; i < nq * sh->L; i++) ql[i] = frand() * 0.3f;
                for (size_t i = 0; i < nq * sh->R; i++) qp[i] = frand() * 0.3f;
                moeq_mla_params a = {c.kv, T, seq, pos, sh->H, sh->L, sh->R, ql, qp, got, 0.125f};
                emulate_graph_attention(&a, row_off, tab, moeq_cu_split_item_cap(T, sh->max_len, INT64_MAX), got);
                /* the eager path: the valid tokens alone, compact tables */
                int32_t eoff[64], *ctab = malloc((size_t)(n_valid * stride) * sizeof(int32_t));
                assert_true(moeq_cu_kv_compact(c.table, c.kv.table_stride, seq, pos, n_valid, sh->bt, eoff, ctab,
                                               n_valid * stride) > 0);
                moeq_mla_params e = a;
                e.n_tok = n_valid;
                for (int64_t t = 0; t < n_valid; t++)
                    for (int h = 0; h < sh->H; h++) {
                        emulate_split_attention(&e, eoff, ctab, t, h, want);
                        assert_same_bits(got + (t * sh->H + h) * sh->L, want, (size_t)sh->L, "graph vs eager");
                    }
                free(ql), free(qp), free(got), free(want), free(tab), free(ctab);
            }
        }
        fake_cache_free(&c);
    }
}

static void gather_and_combine_grids_give_the_cpu_backends_bits(void **state) {
    (void)state;
    moeq_backend *cpu = cpu_backend(16);
    const int64_t Ts[] = {1, 5, 33}, Ks[] = {1, 2, 8}, Ds[] = {1, 17, 64};
    for (int ti = 0; ti < 3; ti++)
        for (int ki = 0; ki < 3; ki++)
            for (int di = 0; di < 3; di++) {
                int64_t T = Ts[ti], K = Ks[ki], D = Ds[di], S = T * K;
                float *x = malloc((size_t)(T * D) * sizeof(float)), *xg = malloc((size_t)(S * D) * sizeof(float));
                float *xg_cpu = malloc((size_t)(S * D) * sizeof(float)), *w = malloc((size_t)S * sizeof(float));
                float *sh = malloc((size_t)(T * D) * sizeof(float)), *out = malloc((size_t)(T * D) * sizeof(float));
                float *out_cpu = malloc((size_t)(T * D) * sizeof(float));
                int64_t *order = malloc((size_t)S * sizeof(int64_t)), *sr = malloc((size_t)S * sizeof(int64_t));
                int64_t *sr_cpu = malloc((size_t)S * sizeof(int64_t));
                for (int64_t i = 0; i < T * D; i++) x[i] = frand(), sh[i] = frand();
                for (int64_t i = 0; i < S; i++) order[i] = i, w[i] = frand();
                for (int64_t i = S - 1; i > 0; i--) {
                    int64_t j = urand() % (uint32_t)(i + 1), tmp = order[i];
                    order[i] = order[j], order[j] = tmp;
                }
                moeq_gather_params gp = {xg_cpu, sr_cpu, x, order, S, K, D};
                cpu->gather(cpu, &gp);
                for (int64_t idx = 0; idx < S * D; idx++) { /* gather_kernel's threads */
                    moeq_cu_gather_at at = moeq_cu_gather_index(idx, D);
                    xg[at.i * D + at.d] = x[moeq_cu_gather_src(order, at.i, K) * D + at.d];
                    if (at.d == 0) sr[order[at.i]] = at.i;
                }
                assert_same_bits(xg, xg_cpu, (size_t)(S * D), "gather rows");
                assert_memory_equal(sr, sr_cpu, (size_t)S * sizeof(int64_t));
                for (int with_shared = 0; with_shared < 2; with_shared++)
                    for (int via_map = 0; via_map < 2; via_map++) {
                        moeq_combine_params cp = {out_cpu, xg, via_map ? sr : NULL, w,
                                                  with_shared ? sh : NULL, T, K, D, NULL};
                        cpu->combine(cpu, &cp);
                        for (int64_t idx = 0; idx < T * D; idx++) /* combine_kernel's threads */
                            out[idx] = moeq_cu_combine_elem(xg, cp.slot_row, w, cp.shared, idx / D, K, D, idx % D);
                        assert_same_bits(out, out_cpu, (size_t)(T * D), "combine");
                    }
                free(x), free(xg), free(xg_cpu), free(w), free(sh), free(out), free(out_cpu), free(order), free(sr),
                    free(sr_cpu);
            }
    moeq_backend_destroy(cpu);
}

/* An F8 weight with partial 128-blocks; its block scales looked up by absolute row, as mm_nt_kernel and
 * mm_nn_kernel do for a job's row range, give moeq_tensor_rows_to_f32's values, and the NT/NN products the
 * CPU backend's bits. */
static void f8_block_scales_by_absolute_row_give_the_cpu_backends_products_for_row_ranges(void **state) {
    (void)state;
    const int64_t rows = 300, cols = 200;
    uint8_t *q = malloc((size_t)(rows * cols));
    int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
    float *scale = malloc((size_t)(rb * cb) * sizeof(float));
    for (int64_t i = 0; i < rb * cb; i++) scale[i] = (float)(1 + i) / 448.0f;
    for (int64_t i = 0; i < rows * cols; i++) q[i] = moeq_f32_to_f8_e4m3(frand() * 400.0f);
    moeq_tensor st = {.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {rb, cb}, .data = scale,
                      .nbytes = (size_t)(rb * cb) * 4};
    moeq_tensor w = {.name = "w", .dtype = MOEQ_DTYPE_F8_E4M3, .ndim = 2, .shape = {rows, cols}, .data = q,
                     .nbytes = (size_t)(rows * cols), .scale_inv = &st};
    moeq_backend *cpu = cpu_backend(16);
    const int64_t r0s[] = {0, 1, 127, 128, 129, 250}, T = 11;
    float *x = malloc((size_t)(T * rows) * sizeof(float)), *row = malloc((size_t)cols * sizeof(float));
    float *y = malloc((size_t)(T * rows) * sizeof(float)), *want = malloc((size_t)(T * rows) * sizeof(float));
    for (int64_t i = 0; i < T * rows; i++) x[i] = frand();
    for (int ri = 0; ri < 6; ri++) {
        int64_t r0 = r0s[ri], n = rows - r0 < 45 ? rows - r0 : 45;
        for (int64_t r = r0; r < r0 + n; r++) {
            moeq_tensor_rows_to_f32(&w, r, 1, row);
            for (int64_t k = 0; k < cols; k++) {
                float got = moeq_cu_widen(MOEQ_CU_DTYPE_F8_E4M3, q, scale, cols, r, k);
                assert_same_bits(&got, &row[k], 1, "f8 element");
            }
        }
        /* NT over rows [r0, r0 + n): mm_nt_kernel's grid with the weight row shifted by row0 */
        moeq_mm_job j = {&w, r0, n, x, cols, want, n, T};
        cpu->matmul(cpu, &j, 1);
        for (int64_t bx = 0; bx < moeq_cu_mm_grid_x(n); bx++)
            for (int64_t by = 0; by < moeq_cu_mm_grid_y(T); by++)
                for (int r = 0; r < MOEQ_CU_MM_ROWS; r++) { /* one half-warp: its 16 lanes, then the butterfly */
                    float acc[MOEQ_CU_LANES][MOEQ_CU_MM_TILE_T];
                    moeq_cu_mm_at a = moeq_cu_mm_index(bx, by, r * MOEQ_CU_LANES, T, n);
                    if (a.nt == 0) continue;
                    for (int lane = 0; lane < MOEQ_CU_LANES; lane++) {
                        moeq_cu_mm_at aw = moeq_cu_mm_index(bx, by, r * MOEQ_CU_LANES + lane, T, n);
                        aw.o += r0;
                        moeq_cu_mm_lanes(acc[lane], aw, x, cols, MOEQ_CU_DTYPE_F8_E4M3, q, scale, cols);
                    }
                    for (int jt = 0; jt < a.nt; jt++) {
                        float v[MOEQ_CU_LANES];
                        for (int lane = 0; lane < MOEQ_CU_LANES; lane++) v[lane] = acc[lane][jt];
                        moeq_cu_butterfly16(v);
                        y[(a.t0 + jt) * n + a.o] = v[0];
                    }
                }
        assert_same_bits(y, want, (size_t)(T * n), "f8 NT over a row range");
        /* NN through rows [r0, r0 + n): mm_nn_kernel's one chain per (token, column) */
        moeq_mm_job jn = {&w, r0, n, x, rows, want, cols, T};
        cpu->matmul_nn(cpu, &jn, 1);
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < cols; c++) {
                float acc = 0.0f;
                for (int64_t r = 0; r < n; r++)
                    acc = fmaf(x[t * rows + r], moeq_cu_widen(MOEQ_CU_DTYPE_F8_E4M3, q, scale, cols, r0 + r, c), acc);
                y[t * cols + c] = acc;
            }
        assert_same_bits(y, want, (size_t)(T * cols), "f8 NN over a row range");
    }
    free(q), free(scale), free(x), free(row), free(y), free(want);
    moeq_backend_destroy(cpu);
}

/* The few-token kernels (mv_nt_kernel, mv_grouped_kernel): two threads a weight row, 8 lanes each, 16-byte weight
 * loads in double-buffered groups of MOEQ_CU_MV_UNROLL chunks, the butterfly's first level across the pair. Played
 * on the host over K of only a tail, one group, a group and a tail, two groups (the double buffer's hand-over) and
 * many, rows past 128 with row0 (F8 scales by absolute row), 1..8 tokens in each tile size: the CPU backend's bits. */
static void few_token_nt_threads_give_the_cpu_backends_bits(void **state) {
    (void)state;
    const int64_t Ks[] = {16, 112, 128, 144, 256, 272, 1040}, rows = 300, r0s[] = {0, 3, 130};
    moeq_backend *cpu = cpu_backend(16);
    for (int dt = 0; dt < 2; dt++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            int64_t K = Ks[ki], rb = (rows + 127) / 128, kb = (K + 127) / 128;
            int f8 = dt == 1;
            void *q = malloc((size_t)(rows * K) * (f8 ? 1 : 2));
            float *scale = malloc((size_t)(rb * kb) * sizeof(float));
            for (int64_t i = 0; i < rb * kb; i++) scale[i] = (float)(1 + i) / 448.0f;
            for (int64_t i = 0; i < rows * K; i++) {
                if (f8) ((uint8_t *)q)[i] = moeq_f32_to_f8_e4m3(frand() * 400.0f);
                else ((uint16_t *)q)[i] = (uint16_t)(moeq_cu_f32_bits(frand() * 0.5f) >> 16);
            }
            moeq_tensor st = {.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {rb, kb}, .data = scale,
                              .nbytes = (size_t)(rb * kb) * 4};
            moeq_tensor w = {.name = "w", .dtype = f8 ? MOEQ_DTYPE_F8_E4M3 : MOEQ_DTYPE_BF16, .ndim = 2,
                             .shape = {rows, K}, .data = q, .nbytes = (size_t)(rows * K) * (f8 ? 1 : 2),
                             .scale_inv = f8 ? &st : NULL};
            int dtype = f8 ? MOEQ_CU_DTYPE_F8_E4M3 : MOEQ_CU_DTYPE_BF16;
            const float *sc = f8 ? scale : NULL;
            for (int64_t T = 1; T <= MOEQ_CU_MV_MAX_TOK; T++)
                for (int ri = 0; ri < 3; ri++) {
                    int64_t r0 = r0s[ri], n = rows - r0 < 150 ? rows - r0 : 150, ldx = K + 4 * (T & 1);
                    float *x = malloc((size_t)(T * ldx) * sizeof(float));
                    float *y = malloc((size_t)(T * n) * sizeof(float)), *want = malloc((size_t)(T * n) * sizeof(float));
                    for (int64_t i = 0; i < T * ldx; i++) x[i] = frand();
                    moeq_mm_job j = {&w, r0, n, x, ldx, want, n, T};
                    cpu->matmul(cpu, &j, 1);
                    int NT = moeq_cu_mv_tile(T);
                    for (int64_t o = 0; o < n; o++) {
                        float acc[2][MOEQ_CU_MV_MAX_TOK * 8];
                        for (int h = 0; h < 2; h++)
                            moeq_cu_mv_lanes(acc[h], NT, (int)T, h, r0 + o, 0, x, ldx, dtype, q, sc, K);
                        for (int64_t t = 0; t < T; t++)
                            y[t * n + o] = moeq_cu_mv_reduce(acc[0] + t * 8, acc[1] + t * 8);
                    }
                    assert_same_bits(y, want, (size_t)(T * n), f8 ? "few-token NT, f8" : "few-token NT, bf16");
                    free(x), free(y), free(want);
                }
            free(q), free(scale);
        }
    moeq_backend_destroy(cpu);
}

/* ---- moe_experts: the plan, the work list, the grouped GEMM (moe_index.cuh) ------------------------------------ */

/* ids (T, K): distinct experts per token; mode 0 random, 1 every token's first choice is expert e0 (one
 * expert takes every token), 2 only experts 0..K-1 (the others get nothing). */
static void moe_ids(int32_t *ids, int64_t T, int K, int E, int mode) {
    int e0 = (int)(urand() % (uint32_t)E);
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int32_t x;
            int again;
            do {
                x = mode == 2 ? (int32_t)(urand() % (uint32_t)K) : (int32_t)(urand() % (uint32_t)E);
                if (mode == 1 && k == 0) x = e0;
                again = 0;
                for (int j = 0; j < k; j++) again |= ids[t * K + j] == x;
            } while (again);
            ids[t * K + k] = x;
        }
}

/* The device plan as its threads run it: thread e counts, one thread scans, thread e places (here in reverse
 * order of experts: the result cannot depend on which thread goes first). */
static void moe_plan_emulated(const int32_t *ids, int64_t S, int E, int64_t tile, int64_t *counts, int64_t *offsets,
                              int64_t *tile_first, int64_t *order, int64_t *slot_row) {
    for (int e = 0; e < E; e++) counts[e] = moeq_cu_moe_count(ids, S, e);
    moeq_cu_moe_scan(counts, E, tile, offsets, tile_first);
    for (int e = E - 1; e >= 0; e--) moeq_cu_moe_place(ids, S, e, offsets[e], order, slot_row);
}

/*
 * Over experts with zero tokens, one expert taking every token, top_k 1..8, 1..300 tokens and tile sizes
 * 1..64: the emulated plan is moeq_moe_plan's (the host layout the composed path uses) with slot_row its
 * inverse, and the work list is the plain enumeration of (expert, token tile) in expert order: every item
 * found by its y, none past the last, all within the capacity the launch is sized by, the items' rows an
 * exact cover of the permuted rows.
 */
static void moe_plan_and_work_list_helpers_match_a_plain_c_model_over_many_shapes(void **state) {
    (void)state;
    const int Es[] = {1, 2, 3, 8, 64, 256};
    const int64_t Ts[] = {1, 2, 3, 7, 8, 9, 16, 31, 64, 129, 300}, tiles[] = {1, 2, 8, 16, 64};
    int64_t maxS = 300 * 8, n_checked = 0;
    int32_t *ids = malloc((size_t)maxS * sizeof(int32_t));
    int64_t *order = malloc((size_t)maxS * sizeof(int64_t)), *want_order = malloc((size_t)maxS * sizeof(int64_t));
    int64_t *slot_row = malloc((size_t)maxS * sizeof(int64_t)), *covered = malloc((size_t)maxS * sizeof(int64_t));
    int64_t counts[257], offsets[257], want_off[257], tile_first[257];
    int64_t *items_e = malloc((size_t)maxS * sizeof(int64_t)), *items_j = malloc((size_t)maxS * sizeof(int64_t));
    for (size_t ei = 0; ei < sizeof Es / sizeof *Es; ei++)
        for (int K = 1; K <= 8 && K <= Es[ei]; K++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
                for (int mode = 0; mode < 3; mode++)
                    for (size_t tl = 0; tl < sizeof tiles / sizeof *tiles; tl++) {
                        int E = Es[ei];
                        int64_t T = Ts[ti], S = T * K, tile = tiles[tl];
                        moe_ids(ids, T, K, E, mode);
                        moe_plan_emulated(ids, S, E, tile, counts, offsets, tile_first, order, slot_row);
                        moeq_moe_plan(ids, T, K, E, want_off, want_order);
                        assert_memory_equal(offsets, want_off, (size_t)(E + 1) * sizeof(int64_t));
                        assert_memory_equal(order, want_order, (size_t)S * sizeof(int64_t));
                        for (int64_t i = 0; i < S; i++) assert_int_equal(slot_row[order[i]], i);
                        /* the model's work list: experts in order, each one's tiles in order */
                        int64_t n = 0;
                        for (int e = 0; e < E; e++)
                            for (int64_t j = 0; j * tile < counts[e]; j++) items_e[n] = e, items_j[n] = j, n++;
                        int64_t cap = moeq_cu_moe_tile_cap(S, E, tile), cap_big = moeq_cu_moe_tile_cap(maxS, E, tile);
                        assert_int_equal(tile_first[E], n);
                        assert_true(n <= cap && cap <= cap_big);
                        for (int64_t i = 0; i < S; i++) covered[i] = 0;
                        for (int64_t y = 0; y < cap_big; y++) {
                            int64_t j = -1;
                            int e = moeq_cu_moe_item(tile_first, E, y, &j);
                            if (y >= n) {
                                assert_int_equal(e, -1);
                                continue;
                            }
                            assert_int_equal(e, items_e[y]);
                            assert_int_equal(j, items_j[y]);
                            int64_t cnt = offsets[e + 1] - offsets[e];
                            for (int r = 0; r < MOEQ_CU_MM_ROWS * MOEQ_CU_LANES; r += MOEQ_CU_LANES) {
                                moeq_cu_mm_at a = moeq_cu_mm_index(0, j, r, cnt, MOEQ_CU_MM_ROWS);
                                if (tile == MOEQ_CU_MM_TILE_T && r == 0)
                                    for (int jt = 0; jt < a.nt; jt++) covered[offsets[e] + a.t0 + jt]++;
                            }
                        }
                        if (tile == MOEQ_CU_MM_TILE_T)
                            for (int64_t i = 0; i < S; i++) assert_int_equal(covered[i], 1);
                        n_checked++;
                    }
    print_message("%lld plans and work lists checked\n", (long long)n_checked);
    free(ids), free(order), free(want_order), free(slot_row), free(covered), free(items_e), free(items_j);
}

/* The grouped NT kernel's grid over (row tiles of O, the capacity's items), on the host: half-warps, lanes,
 * the butterfly. w[e] is expert e's [O, Kd] weight; x and y are the permuted rows (strides Kd and O). */
static void grouped_nt_emulated(const moeq_tensor *const *w, const int64_t *offsets, const int64_t *tile_first, int E,
                                int64_t cap, const float *x, int64_t Kd, float *y, int64_t O) {
    for (int64_t bx = 0; bx < moeq_cu_mm_grid_x(O); bx++)
        for (int64_t by = 0; by < cap; by++) {
            int64_t j;
            int e = moeq_cu_moe_item(tile_first, E, by, &j);
            if (e < 0) continue;
            int64_t cnt = offsets[e + 1] - offsets[e];
            const float *xe = x + offsets[e] * Kd;
            for (int r = 0; r < MOEQ_CU_MM_ROWS; r++) {
                float acc[MOEQ_CU_LANES][MOEQ_CU_MM_TILE_T];
                moeq_cu_mm_at a = moeq_cu_mm_index(bx, j, r * MOEQ_CU_LANES, cnt, O);
                if (a.nt == 0) continue;
                for (int lane = 0; lane < MOEQ_CU_LANES; lane++) {
                    moeq_cu_mm_at al = moeq_cu_mm_index(bx, j, r * MOEQ_CU_LANES + lane, cnt, O);
                    moeq_cu_mm_lanes(acc[lane], al, xe, Kd, (int)w[e]->dtype, w[e]->data, NULL, Kd);
                }
                for (int jt = 0; jt < a.nt; jt++) {
                    float v[MOEQ_CU_LANES];
                    for (int lane = 0; lane < MOEQ_CU_LANES; lane++) v[lane] = acc[lane][jt];
                    moeq_cu_butterfly16(v);
                    y[(offsets[e] + a.t0 + jt) * O + a.o] = v[0];
                }
            }
        }
}

static moeq_tensor bf16_tensor(int64_t rows, int64_t cols) {
    uint16_t *d = malloc((size_t)(rows * cols) * sizeof(uint16_t));
    for (int64_t i = 0; i < rows * cols; i++) d[i] = (uint16_t)(moeq_cu_f32_bits(frand() * 0.5f) >> 16);
    return (moeq_tensor){.name = "w", .dtype = MOEQ_DTYPE_BF16, .ndim = 2, .shape = {rows, cols}, .data = d,
                         .nbytes = (size_t)(rows * cols) * 2};
}

/* One block of backend_cuda.cu's mt_tile on the host: stages into the two shared arrays (all 256 threads, in
 * reverse order: the order does not matter), each thread's chunks, then each half-warp's butterfly; y as mt_tile
 * writes it. */
static void mt_tile_emulated(float *y, int64_t ldy, int64_t ycol0, const float *x, int64_t ldx, int dtype,
                             const void *W, const float *scale, int64_t K, int64_t o0, int64_t o_end, int64_t t0,
                             int64_t t_end) {
    static float ws[MOEQ_CU_MT_ROWS * MOEQ_CU_MT_LD], xs[MOEQ_CU_MT_TOK * MOEQ_CU_MT_LD];
    static float acc[MOEQ_CU_MT_THREADS][64];
    memset(acc, 0, sizeof acc);
    for (int64_t c0 = 0, nc = moeq_cu_chunks(K); c0 < nc; c0 += MOEQ_CU_MT_CH) {
        for (int i = 0; i < MOEQ_CU_MT_ROWS * MOEQ_CU_MT_LD; i++) ws[i] = xs[i] = NAN; /* padding is never read */
        for (int tid = MOEQ_CU_MT_THREADS - 1; tid >= 0; tid--)
            moeq_cu_mt_stage(ws, xs, tid, MOEQ_CU_MT_THREADS, dtype, W, scale, K, o0, o_end, x, ldx, t0, t_end, c0);
        for (int tid = 0; tid < MOEQ_CU_MT_THREADS; tid++) {
            int g = tid / MOEQ_CU_LANES;
            moeq_cu_mt_compute(acc[tid], ws, xs, tid % MOEQ_CU_LANES, g % 4, g / 4, moeq_cu_mt_stage_chunks(K, c0));
        }
    }
    for (int g = 0; g < MOEQ_CU_MT_THREADS / MOEQ_CU_LANES; g++)
        for (int q = 0; q < 64; q++) {
            float v[MOEQ_CU_LANES];
            for (int l = 0; l < MOEQ_CU_LANES; l++) v[l] = acc[g * MOEQ_CU_LANES + l][q];
            moeq_cu_butterfly16(v);
            int64_t o = o0 + (g % 4) * 8 + q / 8, t = t0 + (g / 4) * 8 + q % 8;
            if (o < o_end && t < t_end) y[t * ldy + (o - ycol0)] = v[0];
        }
}

/* The many-token kernels (mt_nt_kernel, mt_grouped_kernel): 32 x 32 tiles, 256 threads each keeping one lane of an
 * 8 x 8 block of outputs, operands staged 8 chunks at a time into shared memory (F8 weights as q / 256,
 * activations scaled by the tile's block scale), zeros past K. Played on the host over K of one partial chunk, a
 * stage's tail, stages and a tail, 1,024; partial tiles of rows and tokens; row0 at multiples of 32 (F8: rows past
 * 128 with other scales); BF16, F8 and F32: the CPU backend's bits. Then a grouped call's 32-token items
 * (moeq_cu_mt_item) over experts of 0..70 rows against the CPU's per-expert products. */
static void many_token_nt_tiles_give_the_cpu_backends_bits(void **state) {
    (void)state;
    const int64_t Ks[] = {1, 15, 17, 128, 200, 1024}, rows = 300, Ts[] = {9, 32, 45}, r0s[] = {0, 32, 160};
    moeq_backend *cpu = cpu_backend(16);
    for (int dt = 0; dt < 3; dt++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            int64_t K = Ks[ki], rb = (rows + 127) / 128, kb = (K + 127) / 128;
            int dtype = dt == 0 ? MOEQ_CU_DTYPE_BF16 : dt == 1 ? MOEQ_CU_DTYPE_F8_E4M3 : MOEQ_CU_DTYPE_F32;
            size_t es = dt == 0 ? 2 : dt == 1 ? 1 : 4;
            void *q = malloc((size_t)(rows * K) * es);
            float *scale = malloc((size_t)(rb * kb) * sizeof(float));
            for (int64_t i = 0; i < rb * kb; i++) scale[i] = (float)(1 + i) / 448.0f;
            for (int64_t i = 0; i < rows * K; i++) {
                if (dt == 0) ((uint16_t *)q)[i] = (uint16_t)(moeq_cu_f32_bits(frand() * 0.5f) >> 16);
                else if (dt == 1) ((uint8_t *)q)[i] = moeq_f32_to_f8_e4m3(frand() * 400.0f);
                else ((float *)q)[i] = frand();
            }
            moeq_tensor st = {.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {rb, kb}, .data = scale,
                              .nbytes = (size_t)(rb * kb) * 4};
            moeq_tensor w = {.name = "w", .dtype = dt == 0 ? MOEQ_DTYPE_BF16 : dt == 1 ? MOEQ_DTYPE_F8_E4M3
                                                                                         : MOEQ_DTYPE_F32,
                             .ndim = 2, .shape = {rows, K}, .data = q, .nbytes = (size_t)(rows * K) * es,
                             .scale_inv = dt == 1 ? &st : NULL};
            const float *sc = dt == 1 ? scale : NULL;
            for (int ti = 0; ti < 3; ti++)
                for (int ri = 0; ri < 3; ri++) {
                    int64_t T = Ts[ti], r0 = r0s[ri], n = rows - r0 < 70 ? rows - r0 : 70, ldx = K + 3;
                    float *x = malloc((size_t)(T * ldx) * sizeof(float));
                    float *y = malloc((size_t)(T * n) * sizeof(float)), *want = malloc((size_t)(T * n) * sizeof(float));
                    for (int64_t i = 0; i < T * ldx; i++) x[i] = frand();
                    moeq_mm_job j = {&w, r0, n, x, ldx, want, n, T};
                    cpu->matmul(cpu, &j, 1);
                    for (int64_t i = 0; i < T * n; i++) y[i] = NAN;
                    for (int64_t bx = 0; bx * MOEQ_CU_MT_ROWS < n; bx++) /* mt_nt_kernel's grid */
                        for (int64_t by = 0; by * MOEQ_CU_MT_TOK < T; by++)
                            mt_tile_emulated(y, n, r0, x, ldx, dtype, q, sc, K, r0 + bx * MOEQ_CU_MT_ROWS, r0 + n,
                                             by * MOEQ_CU_MT_TOK, T);
                    char what[80];
                    snprintf(what, sizeof what, "many-token NT, dtype %d, K %lld, T %lld, row0 %lld", dtype,
                             (long long)K, (long long)T, (long long)r0);
                    assert_same_bits(y, want, (size_t)(T * n), what);
                    free(x), free(y), free(want);
                }
            free(q), free(scale);
        }
    /* grouped: experts of 0, 1, 31, 32, 33, 70 rows, each [O, Kd] bf16; the items in expert order */
    enum { E = 6, O = 40, Kd = 48 };
    const int64_t cnt[E] = {0, 1, 31, 32, 33, 70};
    int64_t offsets[E + 1] = {0};
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + cnt[e];
    int64_t S = offsets[E];
    moeq_tensor t[E];
    float *x = malloc((size_t)(S * Kd) * sizeof(float)), *y = malloc((size_t)(S * O) * sizeof(float));
    float *want = malloc((size_t)(S * O) * sizeof(float));
    for (int64_t i = 0; i < S * Kd; i++) x[i] = frand();
    for (int e = 0; e < E; e++) {
        t[e] = bf16_tensor(O, Kd);
        if (cnt[e] == 0) continue;
        moeq_mm_job j = {&t[e], 0, O, x + offsets[e] * Kd, Kd, want + offsets[e] * O, O, cnt[e]};
        cpu->matmul(cpu, &j, 1);
    }
    for (int64_t i = 0; i < S * O; i++) y[i] = NAN;
    int64_t cap = moeq_cu_moe_tile_cap(S, E, MOEQ_CU_MT_TOK), items = 0;
    for (int64_t by = 0; by < cap; by++) { /* mt_grouped_kernel's grid */
        int64_t jt = -1;
        int e = moeq_cu_mt_item(offsets, E, by, &jt);
        if (e < 0) continue;
        items++;
        assert_true(jt * MOEQ_CU_MT_TOK < cnt[e]);
        for (int64_t bx = 0; bx * MOEQ_CU_MT_ROWS < O; bx++)
            mt_tile_emulated(y + offsets[e] * O, O, 0, x + offsets[e] * Kd, Kd, MOEQ_CU_DTYPE_BF16, t[e].data, NULL,
                             Kd, bx * MOEQ_CU_MT_ROWS, O, jt * MOEQ_CU_MT_TOK, cnt[e]);
    }
    assert_int_equal(items, 0 + 1 + 1 + 1 + 2 + 3); /* every expert's tiles, each once, within the capacity */
    assert_same_bits(y, want, (size_t)(S * O), "many-token grouped");
    for (int e = 0; e < E; e++) free((void *)t[e].data);
    free(x), free(y), free(want);
    moeq_backend_destroy(cpu);
}

/*
 * The whole CUDA moe_experts op played on the host (the plan, the gather's index, the grouped GEMMs over the
 * capacity's items, the shared expert as a plain matmul grid, SiLU, the combine) against the CPU backend's
 * op, bit for bit, bf16 experts, over token counts, top_k and experts without tokens; the CPU op's expert
 * counts land in stats.
 */
static void moe_experts_grids_emulated_give_the_cpu_ops_bits(void **state) {
    (void)state;
    enum { E = 6, D = 40, MI = 24, SI = 16, MAXT = 40 };
    moeq_tensor t[3 * E + 3];
    moeq_expert ex[E], sh;
    for (int e = 0; e < E; e++) {
        t[3 * e] = bf16_tensor(MI, D), t[3 * e + 1] = bf16_tensor(MI, D), t[3 * e + 2] = bf16_tensor(D, MI);
        ex[e] = (moeq_expert){&t[3 * e], &t[3 * e + 1], &t[3 * e + 2]};
    }
    t[3 * E] = bf16_tensor(SI, D), t[3 * E + 1] = bf16_tensor(SI, D), t[3 * E + 2] = bf16_tensor(D, SI);
    sh = (moeq_expert){&t[3 * E], &t[3 * E + 1], &t[3 * E + 2]};
    const moeq_tensor *wg[E], *wu[E], *wd[E];
    for (int e = 0; e < E; e++) wg[e] = ex[e].gate_proj, wu[e] = ex[e].up_proj, wd[e] = ex[e].down_proj;
    moeq_backend *cpu = cpu_backend(16);
    size_t S_MAX = (size_t)MAXT * 4, rows = S_MAX + MAXT;
    float *x = malloc((size_t)MAXT * D * 4), *w = malloc(S_MAX * 4), *out = malloc((size_t)MAXT * D * 4);
    float *xg = malloc(S_MAX * D * 4), *g = malloc(rows * MI * 4), *u = malloc(rows * MI * 4);
    float *down = malloc(rows * D * 4), *want = malloc((size_t)MAXT * D * 4);
    float *eg = malloc(rows * MI * 4), *eu = malloc(rows * MI * 4), *ed = malloc(rows * D * 4);
    float *exg = malloc(S_MAX * D * 4);
    int64_t *slot_row = malloc(S_MAX * 8), *plan = malloc((size_t)MOEQ_MOE_PLAN_LEN(E, S_MAX) * 8);
    int64_t counts[E], offsets[E + 1], tile_first[E + 1], *order = malloc(S_MAX * 8), *srow = malloc(S_MAX * 8);
    int32_t *ids = malloc(S_MAX * 4);
    uint64_t stats[E];
    const int64_t Ts[] = {1, 2, 5, 9, 17, 40};
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
        for (int K = 1; K <= 4; K++)
            for (int mode = 0; mode < 3; mode++) {
                int64_t T = Ts[ti], S = T * K;
                for (int64_t i = 0; i < T * D; i++) x[i] = frand();
                for (int64_t i = 0; i < S; i++) w[i] = frand();
                moe_ids(ids, T, K, E, mode);
                memset(stats, 0, sizeof stats);
                moeq_moe_experts_params p = {ex, &sh, E, T, K, D, MI, x, ids, w, want, xg, g, u, down,
                                             slot_row, plan, stats, MAXT};
                cpu->moe_experts(cpu, &p);
                /* the device's order of work */
                int64_t cap = moeq_cu_moe_tile_cap(S_MAX, E, MOEQ_CU_MM_TILE_T);
                moe_plan_emulated(ids, S, E, MOEQ_CU_MM_TILE_T, counts, offsets, tile_first, order, srow);
                for (int e = 0; e < E; e++) assert_int_equal(stats[e], (uint64_t)counts[e]);
                for (int64_t idx = 0; idx < S * D; idx++) {
                    moeq_cu_gather_at a = moeq_cu_gather_index(idx, D);
                    exg[a.i * D + a.d] = x[moeq_cu_gather_src(order, a.i, K) * D + a.d];
                }
                grouped_nt_emulated(wg, offsets, tile_first, E, cap, exg, D, eg, MI);
                grouped_nt_emulated(wu, offsets, tile_first, E, cap, exg, D, eu, MI);
                /* the shared expert: one expert of every token (the plain matmul's grid is this with one item per
                 * tile of T) */
                int64_t one_off[2] = {0, T}, one_tiles[2] = {0, moeq_cu_moe_tiles(T, MOEQ_CU_MM_TILE_T)};
                const moeq_tensor *sg[1] = {sh.gate_proj}, *su[1] = {sh.up_proj}, *sd[1] = {sh.down_proj};
                grouped_nt_emulated(sg, one_off, one_tiles, 1, one_tiles[1], x, D, eg + S * MI, SI);
                grouped_nt_emulated(su, one_off, one_tiles, 1, one_tiles[1], x, D, eu + S * MI, SI);
                for (int64_t i = 0; i < S * MI + T * SI; i++) eg[i] = moeq_cu_silu_mul(eg[i], eu[i]);
                grouped_nt_emulated(wd, offsets, tile_first, E, cap, eg, MI, ed, D);
                grouped_nt_emulated(sd, one_off, one_tiles, 1, one_tiles[1], eg + S * MI, SI, ed + S * D, D);
                for (int64_t tt = 0; tt < T; tt++)
                    for (int64_t d = 0; d < D; d++)
                        out[tt * D + d] = moeq_cu_combine_elem(ed, srow, w, ed + S * D, tt, K, D, d);
                assert_same_bits(out, want, (size_t)(T * D), "moe_experts emulated");
            }
    moeq_backend_destroy(cpu);
    for (int i = 0; i < 3 * E + 3; i++) free((void *)t[i].data);
    free(x), free(w), free(out), free(xg), free(g), free(u), free(down), free(want), free(eg), free(eu), free(ed);
    free(exg), free(slot_row), free(plan), free(order), free(srow), free(ids);
}

/* ---- the engine's device path, played on the CPU ----------------------------------------------------------------- */

/* One step of two sequences (23 tokens with every row's logits, and 4) and a decode step, into logits. */
static void two_steps(moeq_engine *e, int vocab, float *logits, float *hidden) {
    int a, b;
    char err[256] = "";
    assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
    int32_t pa[23], pb[4], next[2] = {7, 9};
    for (int i = 0; i < 23; i++) pa[i] = (int32_t)((i * 37 + 5) % vocab);
    for (int i = 0; i < 4; i++) pb[i] = (int32_t)((i * 53 + 2) % vocab);
    moeq_step_item first[2] = {{a, pa, 23, 1}, {b, pb, 4, 0}};
    if (moeq_engine_step_hidden(e, first, 2, logits, 24, hidden, 24, err, sizeof err)) fail_msg("%s", err);
    moeq_step_item second[2] = {{a, &next[0], 1, 0}, {b, &next[1], 1, 0}};
    if (moeq_engine_step(e, second, 2, logits + (size_t)24 * vocab, 2, err, sizeof err)) fail_msg("%s", err);
}

/*
 * forward.c's path for a backend that is not host_visible (the CUDA backend's): the lm_head writes chunks of
 * rows into the arena and download brings each into the caller's buffer. Played here on the CPU backend with
 * the flag cleared and a 5-row chunk (so 24 rows take 5 chunks): the same bits as the direct path.
 */
static void logits_through_download_in_chunks_equal_the_direct_logits(void **state) {
    (void)state;
    char dir[] = "/tmp/moeq-cuda-host-XXXXXX", err[512] = "";
    assert_non_null(mkdtemp(dir));
    moeq_model_config c;
    moeq_genmodel_params gp = moeq_genmodel_default_params();
    assert_int_equal(moeq_genmodel_preset("tiny", &c, &gp.min_shards, err, sizeof err), MOEQ_OK);
    gp.write_tokenizer = 0;
    if (moeq_genmodel_write(dir, &c, &gp, NULL, err, sizeof err)) fail_msg("%s", err);
    moeq_model *m = NULL;
    if (moeq_model_load(dir, NULL, &m, err, sizeof err)) fail_msg("%s", err);
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = 2;
    p.max_seqs = 4;
    p.kv_cache_tokens = 512;
    moeq_engine *direct = NULL, *staged = NULL;
    assert_int_equal(moeq_engine_new(m, &p, &direct, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_engine_new(m, &p, &staged, err, sizeof err), MOEQ_OK);
    assert_true(direct->backend->host_visible && direct->s.logits == NULL); /* the CPU: no buffer of its own */
    staged->backend->host_visible = 0;
    staged->s.logits_rows = 5;
    staged->s.logits = staged->backend->alloc(staged->backend, MOEQ_BUFFER_ARENA,
                                              (size_t)5 * c.vocab_size * sizeof(float));
    assert_non_null(staged->s.logits);
    size_t n = (size_t)26 * c.vocab_size, nh = (size_t)24 * c.hidden_size;
    float *want = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float));
    float *hw = calloc(nh, sizeof(float)), *hg = calloc(nh, sizeof(float));
    two_steps(direct, c.vocab_size, want, hw);
    two_steps(staged, c.vocab_size, got, hg);
    assert_same_bits(got, want, n, "logits through download");
    assert_same_bits(hg, hw, nh, "hidden rows");
    staged->backend->release(staged->backend, staged->s.logits);
    moeq_engine_destroy(direct);
    moeq_engine_destroy(staged);
    moeq_model_destroy(m);
    free(want), free(got), free(hw), free(hg);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}


/* ---- a backend whose buffers the host cannot touch between ops ----------------------------------------------- */

/*
 * "guarded": the CPU backend behind a table whose buffers are mmapped pages kept PROT_NONE except while one of
 * its own calls runs (every op, upload, download, copy), and host_visible = 0 — what the engine sees of a
 * device. A host read or write of backend memory anywhere else in the engine (forward.c, moe_layer.c, mtp.c,
 * kv_cache.c) faults, and every pointer an op computes on is checked to be backend memory (a device could
 * not read a host pointer): an engine run on it shows both directions of the device contract.
 */
#define GUARD_MAX 512
typedef struct guarded {
    moeq_backend base;
    moeq_backend *cpu;
    void *buf[GUARD_MAX];
    size_t len[GUARD_MAX];
    moeq_buffer_kind kind[GUARD_MAX];
} guarded;

/* What came back from the guarded backends since the last reset: bytes through download from the arena,
 * records; downloads from state buffers (the MoE layer's router flags, counts) apart; round trips: calls
 * that copy to the host and wait (downloads, logits_reduce, a route with host ids). */
static size_t g_down_bytes, g_records, g_state_bytes, g_round_trips, g_host_routes, g_moe_ops;
static int g_no_moe_op; /* 1: moe_experts unsupported (the composed path, host ids) */

static void guard_set(guarded *g, int prot) {
    for (int i = 0; i < GUARD_MAX; i++)
        if (g->buf[i]) assert_int_equal(mprotect(g->buf[i], g->len[i], prot), 0);
}
#define G(b) ((guarded *)(b))
#define OPEN(b) guard_set(G(b), PROT_READ | PROT_WRITE)
#define SHUT(b) guard_set(G(b), PROT_NONE)

static void *g_alloc(moeq_backend *b, moeq_buffer_kind kind, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + page - 1) / page * page + (bytes == 0) * page;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* cudaMalloc does not zero: every float of a fresh buffer is a NaN, so an op or an engine path that reads
     * what nothing wrote shows in the logits (mmap's zero pages would hide it) */
    memset(p, 0xff, len);
    assert_int_equal(mprotect(p, len, PROT_NONE), 0);
    for (int i = 0; i < GUARD_MAX; i++)
        if (!G(b)->buf[i]) {
            G(b)->buf[i] = p, G(b)->len[i] = len, G(b)->kind[i] = kind;
            return p;
        }
    munmap(p, len);
    return NULL;
}
static void g_release(moeq_backend *b, void *p) {
    for (int i = 0; p && i < GUARD_MAX; i++)
        if (G(b)->buf[i] == p) munmap(p, G(b)->len[i]), G(b)->buf[i] = NULL;
}
static int g_supports(const moeq_backend *b, moeq_backend_op op, moeq_dtype dt) {
    if (op == MOEQ_BACKEND_OP_MOE_EXPERTS && g_no_moe_op) return 0;
    return G(b)->cpu->supports(G(b)->cpu, op, dt);
}
static moeq_err g_map(moeq_backend *b, const moeq_model *m, char *e, size_t n) {
    return G(b)->cpu->map_weights(G(b)->cpu, m, e, n);
}
static void g_sync(moeq_backend *b) { G(b)->cpu->sync(G(b)->cpu); }
/* Every pointer an op computes on must be backend memory (a device could not read anything else). */
static int in_buf(const guarded *g, const void *p) {
    const char *c = p;
    for (int i = 0; i < GUARD_MAX; i++) {
        const char *lo = g->buf[i];
        if (lo && c >= lo && c < lo + g->len[i]) return 1;
    }
    return 0;
}
static void dev_check(const moeq_backend *b, const void *p, const char *fn, const char *what) {
    if (p && !in_buf((const guarded *)b, p)) fail_msg("%s: %s is not backend memory", fn, what);
}
#define DEV(b, p, what) dev_check((b), (p), __func__, (what))

static void g_upload(moeq_backend *b, void *d, const void *h, size_t n) {
    DEV(b, d, "dst");
    OPEN(b), G(b)->cpu->upload(G(b)->cpu, d, h, n), SHUT(b);
}
static int buf_kind(const guarded *g, const void *p) {
    for (int i = 0; i < GUARD_MAX; i++)
        if (g->buf[i] && (const char *)p >= (const char *)g->buf[i] && (const char *)p < (char *)g->buf[i] + g->len[i])
            return (int)g->kind[i];
    return -1;
}
static void g_download(moeq_backend *b, void *h, const void *d, size_t n) {
    DEV(b, d, "src");
    if (buf_kind(G(b), d) == MOEQ_BUFFER_STATE) g_state_bytes += n;
    else g_down_bytes += n;
    g_round_trips++;
    OPEN(b), G(b)->cpu->download(G(b)->cpu, h, d, n), SHUT(b);
}
static void g_copy(moeq_backend *b, void *d, const void *s, size_t n) {
    DEV(b, d, "dst"), DEV(b, s, "src");
    OPEN(b), G(b)->cpu->copy(G(b)->cpu, d, s, n), SHUT(b);
}
static void g_attention(moeq_backend *b, const moeq_mla_params *p) {
    DEV(b, p->kv.pool, "kv.pool"), DEV(b, p->q_lat, "q_lat"), DEV(b, p->q_pe, "q_pe"), DEV(b, p->out_lat, "out_lat");
    OPEN(b), G(b)->cpu->attention(G(b)->cpu, p), SHUT(b);
}
static void g_attention_naive(moeq_backend *b, const moeq_mla_naive_params *p) {
    DEV(b, p->kv.pool, "kv.pool"), DEV(b, p->q, "q"), DEV(b, p->q_pe, "q_pe"), DEV(b, p->out_v, "out_v");
    OPEN(b), G(b)->cpu->attention_naive(G(b)->cpu, p), SHUT(b);
}
static void g_rmsnorm(moeq_backend *b, const moeq_rmsnorm_params *p) {
    DEV(b, p->out, "out"), DEV(b, p->x, "x"), DEV(b, p->w, "w");
    OPEN(b), G(b)->cpu->rmsnorm(G(b)->cpu, p), SHUT(b);
}
static void g_mla_rope(moeq_backend *b, const moeq_mla_rope_params *p) {
    DEV(b, p->kv.pool, "kv.pool"), DEV(b, p->kva, "kva"), DEV(b, p->kv_norm, "kv_norm"), DEV(b, p->q, "q");
    DEV(b, p->q_pe, "q_pe"), DEV(b, p->cos_v, "cos_v"), DEV(b, p->sin_v, "sin_v");
    OPEN(b), G(b)->cpu->mla_rope(G(b)->cpu, p), SHUT(b);
}
static void g_route(moeq_backend *b, const moeq_route_params *p) {
    DEV(b, p->logits, "logits"), DEV(b, p->bias, "bias"), DEV(b, p->weights, "weights");
    if (p->on_backend) DEV(b, p->ids, "ids"), DEV(b, p->finite, "finite");
    else if (in_buf(G(b), p->ids) || in_buf(G(b), p->finite)) fail_msg("route: ids and finite must be host memory");
    if (!p->on_backend) g_host_routes++, g_round_trips++; /* a device copies the ids back and waits */
    OPEN(b), G(b)->cpu->route(G(b)->cpu, p), SHUT(b);
}
static void g_moe_experts(moeq_backend *b, const moeq_moe_experts_params *p) {
    DEV(b, p->x, "x"), DEV(b, p->ids, "ids"), DEV(b, p->weights, "weights"), DEV(b, p->out, "out");
    DEV(b, p->xg, "xg"), DEV(b, p->g, "g"), DEV(b, p->u, "u"), DEV(b, p->down, "down");
    DEV(b, p->slot_row, "slot_row"), DEV(b, p->plan, "plan"), DEV(b, p->stats, "stats");
    g_moe_ops++;
    OPEN(b), G(b)->cpu->moe_experts(G(b)->cpu, p), SHUT(b);
}
static void g_gather(moeq_backend *b, const moeq_gather_params *p) {
    DEV(b, p->xg, "xg"), DEV(b, p->slot_row, "slot_row"), DEV(b, p->x, "x");
    OPEN(b), G(b)->cpu->gather(G(b)->cpu, p), SHUT(b);
}
static void g_combine(moeq_backend *b, const moeq_combine_params *p) {
    DEV(b, p->out, "out"), DEV(b, p->rows, "rows"), DEV(b, p->slot_row, "slot_row"), DEV(b, p->weights, "weights");
    DEV(b, p->shared, "shared");
    OPEN(b), G(b)->cpu->combine(G(b)->cpu, p), SHUT(b);
}
static void mm_check(moeq_backend *b, const moeq_mm_job *j, int n) {
    for (int i = 0; i < n; i++) DEV(b, j[i].x, "job x"), DEV(b, j[i].y, "job y");
}
static void g_matmul(moeq_backend *b, const moeq_mm_job *j, int n) {
    mm_check(b, j, n);
    OPEN(b), G(b)->cpu->matmul(G(b)->cpu, j, n), SHUT(b);
}
static void g_matmul_nn(moeq_backend *b, const moeq_mm_job *j, int n) {
    mm_check(b, j, n);
    OPEN(b), G(b)->cpu->matmul_nn(G(b)->cpu, j, n), SHUT(b);
}
static void g_embed(moeq_backend *b, const moeq_tensor *t, const int32_t *ids, int64_t n, float *out) {
    DEV(b, out, "out");
    OPEN(b), G(b)->cpu->embed(G(b)->cpu, t, ids, n, out), SHUT(b);
}
static void g_rope_cos_sin(moeq_backend *b, const moeq_rope *r, const int64_t *pos, int64_t n, float *c, float *s) {
    DEV(b, c, "cos_v"), DEV(b, s, "sin_v");
    OPEN(b), G(b)->cpu->rope_cos_sin(G(b)->cpu, r, pos, n, c, s), SHUT(b);
}
static void g_silu_mul(moeq_backend *b, float *o, const float *g, const float *u, int64_t n) {
    DEV(b, o, "out"), DEV(b, g, "gate"), DEV(b, u, "up");
    OPEN(b), G(b)->cpu->silu_mul(G(b)->cpu, o, g, u, n), SHUT(b);
}
static void g_add(moeq_backend *b, float *x, const float *y, int64_t n) {
    DEV(b, x, "x"), DEV(b, y, "y");
    OPEN(b), G(b)->cpu->add(G(b)->cpu, x, y, n), SHUT(b);
}
static void g_logits_reduce(moeq_backend *b, const float *x, int64_t ld, int64_t n, int64_t V, const double *t,
                            moeq_logits_record *out) {
    DEV(b, x, "logits");
    if (in_buf(G(b), out) || in_buf(G(b), t)) fail_msg("logits_reduce: temperatures and records are host memory");
    g_records += (size_t)n, g_round_trips++;
    OPEN(b), G(b)->cpu->logits_reduce(G(b)->cpu, x, ld, n, V, t, out), SHUT(b);
}
static void g_destroy(moeq_backend *b) {
    for (int i = 0; i < GUARD_MAX; i++) g_release(b, G(b)->buf[i]);
    moeq_backend_destroy(G(b)->cpu);
    free(b);
}

static moeq_err guarded_new(const moeq_backend_config *config, moeq_backend **out, char *errstr, size_t errstr_size) {
    guarded *g = calloc(1, sizeof *g);
    if (!g || !(g->cpu = moeq_backend_cpu_new(config)))
        return free(g), moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "guarded backend");
    g->base = (moeq_backend){.name = "guarded", .host_visible = 0, .supports = g_supports, .alloc = g_alloc,
                             .release = g_release, .upload = g_upload, .download = g_download, .copy = g_copy,
                             .map_weights = g_map, .sync = g_sync, .matmul = g_matmul, .matmul_nn = g_matmul_nn,
                             .attention = g_attention, .attention_naive = g_attention_naive, .embed = g_embed,
                             .rmsnorm = g_rmsnorm, .rope_cos_sin = g_rope_cos_sin, .mla_rope = g_mla_rope,
                             .silu_mul = g_silu_mul, .add = g_add, .route = g_route, .gather = g_gather,
                             .combine = g_combine, .moe_experts = g_moe_experts, .logits_reduce = g_logits_reduce,
                             .destroy = g_destroy};
    *out = &g->base;
    return MOEQ_OK;
}

static moeq_model *gen_model(const char *preset, char *dir) {
    char err[512] = "";
    assert_non_null(mkdtemp(dir));
    moeq_model_config c;
    moeq_genmodel_params gp = moeq_genmodel_default_params();
    assert_int_equal(moeq_genmodel_preset(preset, &c, &gp.min_shards, err, sizeof err), MOEQ_OK);
    gp.mtp_agree = moeq_genmodel_preset_mtp_agree(preset);
    gp.write_tokenizer = 0;
    if (moeq_genmodel_write(dir, &c, &gp, NULL, err, sizeof err)) fail_msg("%s", err);
    moeq_model *m = NULL;
    if (moeq_model_load(dir, NULL, &m, err, sizeof err)) fail_msg("%s", err);
    return m;
}

static void rm_dir(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static moeq_engine *engine_on(const moeq_model *m, const char *backend) {
    moeq_engine_params p = moeq_engine_default_params();
    snprintf(p.backend, sizeof p.backend, "%s", backend);
    snprintf(p.mtp_draft, sizeof p.mtp_draft, "exact"); /* f8 draft copies exist on host backends only */
    snprintf(p.head_screen, sizeof p.head_screen, "off"); /* the CPU reference: every row whole */
    p.n_threads = 2, p.max_seqs = 4, p.kv_cache_tokens = 512, p.max_step_tokens = 256;
    moeq_engine *e = NULL;
    char err[512] = "";
    if (moeq_engine_new(m, &p, &e, err, sizeof err)) fail_msg("engine on %s: %s", backend, err);
    return e;
}

/* two_steps, then a fork of the first sequence at 10 tokens (a partial block copied: backend copy) and a step
 * of the fork: 27 rows of logits. */
static void run_steps(moeq_engine *e, int vocab, float *logits) {
    two_steps(e, vocab, logits, NULL);
    int f;
    char err[256] = "";
    if (moeq_engine_seq_fork(e, 0, 10, 0, 0, &f, err, sizeof err)) fail_msg("%s", err);
    int32_t tok = 11;
    moeq_step_item it = {f, &tok, 1, 0};
    if (moeq_engine_step(e, &it, 1, logits + (size_t)26 * vocab, 1, err, sizeof err)) fail_msg("%s", err);
}

static void an_engine_touches_backend_memory_only_through_ops(void **state) {
    (void)state;
    static int registered;
    if (!registered++) assert_int_equal(moeq_backend_register("guarded", guarded_new), MOEQ_OK);
    const char *presets[] = {"tiny", "tiny-v2"};
    for (int i = 0; i < 2; i++) {
        char dir[] = "/tmp/moeq-guard-XXXXXX";
        moeq_model *m = gen_model(presets[i], dir);
        int V = moeq_model_get_config(m)->vocab_size;
        moeq_engine *cpu = engine_on(m, "cpu"), *g = engine_on(m, "guarded");
        size_t n = (size_t)27 * V;
        float *want = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float));
        run_steps(cpu, V, want);
        run_steps(g, V, got); /* a host touch of a guarded buffer would fault here */
        assert_same_bits(got, want, n, presets[i]);
        moeq_engine_destroy(cpu), moeq_engine_destroy(g);
        moeq_model_destroy(m);
        free(want), free(got);
        rm_dir(dir);
    }
}

/* MoE layers of the model (main layers; the decode steps run no MTP). */
static int moe_layers(const moeq_model *m) {
    int n = 0;
    for (int l = 0; l < moeq_model_get_config(m)->num_hidden_layers; l++) n += m->layers[l].is_moe;
    return n;
}

/* Round trips of one decode step of the two sequences two_steps left (tokens `next`), its logits into out. */
static size_t decode_round_trips(moeq_engine *e, const int32_t next[2], float *out) {
    char err[256] = "";
    moeq_step_item it[2] = {{0, &next[0], 1, 0}, {1, &next[1], 1, 0}};
    g_round_trips = 0, g_host_routes = 0, g_moe_ops = 0;
    if (moeq_engine_step(e, it, 2, out, 2, err, sizeof err)) fail_msg("%s", err);
    return g_round_trips;
}

/*
 * A one-rank engine on the guarded backend runs each MoE layer through moe_experts: route leaves ids and
 * flags in backend memory and nothing comes back inside a layer. A decode step's round trips: the logits
 * (one download) and the pass's router flags (one download of a state buffer), where the composed path
 * (moe_experts unsupported) adds one wait per MoE layer (route's ids). Logits equal the CPU engine's bit for
 * bit on both paths (so do the greedy tokens), and so do the expert counts (downloaded only when asked).
 */
static void a_decode_step_on_one_rank_makes_no_round_trip_inside_moe_layers(void **state) {
    (void)state;
    static int registered;
    if (!registered++) (void)moeq_backend_register("guarded", guarded_new);
    char dir[] = "/tmp/moeq-guard-moe-XXXXXX";
    moeq_model *m = gen_model("tiny", dir);
    int V = moeq_model_get_config(m)->vocab_size, n_moe = moe_layers(m);
    assert_true(n_moe > 0);
    moeq_engine *cpu = engine_on(m, "cpu"), *g = engine_on(m, "guarded");
    g_no_moe_op = 1;
    moeq_engine *gc = engine_on(m, "guarded");
    g_no_moe_op = 0;
    size_t n = (size_t)28 * V;
    float *want = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float)), *got_c = calloc(n, sizeof(float));
    two_steps(cpu, V, want, NULL);
    two_steps(g, V, got, NULL);
    g_no_moe_op = 1, two_steps(gc, V, got_c, NULL), g_no_moe_op = 0;
    int32_t tok[2] = {3, 5};
    for (int step = 0; step < 3; step++) {
        float *w = want + (size_t)26 * V, *o = got + (size_t)26 * V, *oc = got_c + (size_t)26 * V;
        (void)decode_round_trips(cpu, tok, w);
        size_t rt = decode_round_trips(g, tok, o);
        assert_int_equal(g_host_routes, 0);
        assert_int_equal(g_moe_ops, n_moe);
        assert_int_equal(rt, 2); /* logits + the pass's router flags */
        g_no_moe_op = 1;
        size_t rt_c = decode_round_trips(gc, tok, oc);
        g_no_moe_op = 0;
        assert_int_equal(g_host_routes, n_moe);
        assert_int_equal(g_moe_ops, 0);
        assert_int_equal(rt_c, 1 + (size_t)n_moe);
        if (!step)
            print_message("  decode step of 2 tokens: %zu round trips with moe_experts, %zu composed (%d MoE layers)\n",
                          rt, rt_c, n_moe);
        for (int r = 0; r < 2; r++) { /* the greedy token of each row, from the same bits */
            int32_t best = 0;
            for (int v = 1; v < V; v++) best = w[(size_t)r * V + v] > w[(size_t)r * V + best] ? v : best;
            tok[r] = best;
        }
    }
    assert_same_bits(got, want, n, "moe_experts on the guarded backend");
    assert_same_bits(got_c, want, n, "composed path on the guarded backend");
    int nl[3], ne[3];
    const uint64_t *c0 = moeq_engine_expert_counts(cpu, &nl[0], &ne[0]);
    size_t nc = (size_t)nl[0] * (size_t)ne[0];
    uint64_t *c_cpu = malloc(nc * sizeof(uint64_t));
    memcpy(c_cpu, c0, nc * sizeof(uint64_t));
    g_state_bytes = 0;
    const uint64_t *c1 = moeq_engine_expert_counts(g, &nl[1], &ne[1]);
    assert_true(g_state_bytes > 0); /* brought back when asked */
    assert_memory_equal(c1, c_cpu, nc * sizeof(uint64_t));
    const uint64_t *c2 = moeq_engine_expert_counts(gc, &nl[2], &ne[2]);
    assert_memory_equal(c2, c_cpu, nc * sizeof(uint64_t));
    uint64_t total = 0;
    for (size_t i = 0; i < nc; i++) total += c_cpu[i];
    assert_true(total > 0);
    moeq_engine_destroy(cpu), moeq_engine_destroy(g), moeq_engine_destroy(gc);
    moeq_model_destroy(m);
    free(want), free(got), free(got_c), free(c_cpu);
    rm_dir(dir);
}

/* The router flags left on the guarded backend come back once after the step and still name a poisoned
 * sequence's first MoE layer (a NaN in its embedding row), its batch-mate unflagged: the device path of
 * moeq_engine_seq_nonfinite_layer. */
static void router_flags_on_the_backend_still_name_the_first_non_finite_layer(void **state) {
    (void)state;
    static int registered;
    if (!registered++) (void)moeq_backend_register("guarded", guarded_new);
    char dir[] = "/tmp/moeq-guard-nan-XXXXXX", err[256] = "";
    moeq_model *m = gen_model("tiny", dir);
    const moeq_model_config *c = moeq_model_get_config(m);
    int V = c->vocab_size, b, d;
    moeq_engine *g = engine_on(m, "guarded");
    moeq_tensor *embed = (moeq_tensor *)m->embed_tokens;
    const void *keep = embed->data;
    size_t row = (size_t)c->hidden_size * 2;
    uint8_t *copy = malloc(embed->nbytes);
    memcpy(copy, keep, embed->nbytes);
    copy[row * 3 + 1] = 0x7f, copy[row * 3] = 0xc0; /* token 3, element 0: BF16 NaN */
    embed->data = copy;
    int32_t bad[2] = {3, 9}, good[3] = {5, 9, 11};
    float *l = malloc((size_t)2 * V * sizeof(float));
    assert_int_equal(moeq_engine_seq_new(g, &b), MOEQ_OK);
    assert_int_equal(moeq_engine_seq_new(g, &d), MOEQ_OK);
    moeq_step_item two[2] = {{b, bad, 2, 0}, {d, good, 3, 0}};
    g_state_bytes = 0, g_host_routes = 0;
    assert_int_equal(moeq_engine_step(g, two, 2, l, 2, err, sizeof err), MOEQ_OK);
    embed->data = keep;
    assert_int_equal(g_host_routes, 0);
    assert_true(g_state_bytes > 0); /* the flags, in one download */
    assert_int_equal(moeq_engine_seq_nonfinite_layer(g, b), c->first_k_dense_replace);
    assert_int_equal(moeq_engine_seq_nonfinite_layer(g, d), -1);
    moeq_engine_destroy(g);
    moeq_model_destroy(m);
    free(copy), free(l);
    rm_dir(dir);
}

/*
 * The CPU backend's moe_experts (the engine's one-rank path) against the composed path it replaced (the
 * same engine with its identity placement set by a test, which runs route with host ids, gather, the
 * jobs, combine): the same bits for prefill and decode steps, V3 and V2 routers.
 */
static void the_cpu_moe_experts_op_equals_the_composed_path_bit_for_bit(void **state) {
    (void)state;
    const char *presets[] = {"tiny", "tiny-v2"};
    for (int i = 0; i < 2; i++) {
        char dir[] = "/tmp/moeq-moe-op-XXXXXX", err[256] = "";
        moeq_model *m = gen_model(presets[i], dir);
        const moeq_model_config *c = moeq_model_get_config(m);
        int V = c->vocab_size;
        moeq_engine *op = engine_on(m, "cpu"), *composed = engine_on(m, "cpu");
        moeq_ep_placement *id = NULL;
        assert_int_equal(moeq_ep_placement_new_identity(c->n_routed_experts, 1, &id, err, sizeof err), MOEQ_OK);
        assert_int_equal(moeq_moe_layer_set_placement(composed, id, err, sizeof err), MOEQ_OK);
        moeq_ep_placement_destroy(id);
        size_t n = (size_t)27 * V;
        float *want = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float));
        run_steps(composed, V, want);
        run_steps(op, V, got);
        assert_same_bits(got, want, n, presets[i]);
        moeq_engine_destroy(op), moeq_engine_destroy(composed);
        moeq_model_destroy(m);
        free(want), free(got);
        rm_dir(dir);
    }
}

/* MTP rounds (draft, verify, accept) on the guarded backend: the same tokens and acceptance as on the CPU. */
static void mtp_rounds_touch_backend_memory_only_through_ops(void **state) {
    (void)state;
    static int registered;
    if (!registered++) (void)moeq_backend_register("guarded", guarded_new); /* taken already is fine */
    char dir[] = "/tmp/moeq-guard-mtp-XXXXXX", err[512] = "";
    moeq_model *m = gen_model("tiny-mtp", dir);
    int V = moeq_model_get_config(m)->vocab_size;
    int32_t toks[2][40];
    int64_t acc[2] = {0, 0};
    for (int run = 0; run < 2; run++) {
        moeq_engine *e = engine_on(m, run ? "guarded" : "cpu");
        assert_true(moeq_engine_mtp_available(e));
        moeq_mtp_decoder *d = NULL;
        assert_int_equal(moeq_mtp_decoder_new(e, 1, 2, &d, err, sizeof err), MOEQ_OK);
        int seq;
        assert_int_equal(moeq_engine_seq_new(e, &seq), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_set_mtp(e, seq, 1), MOEQ_OK);
        int32_t prompt[12];
        for (int i = 0; i < 12; i++) prompt[i] = (int32_t)((i * 37 + 5) % V);
        float *logits = malloc((size_t)V * sizeof(float));
        moeq_step_item it = {seq, prompt, 12, 0};
        if (moeq_engine_step(e, &it, 1, logits, 1, err, sizeof err)) fail_msg("%s", err);
        int best = 0;
        for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
        moeq_spec_seq sq = {.seq_id = seq, .next_token = best, .k = 2, .sampling = moeq_sampling_default_params()};
        int n = 0;
        g_down_bytes = 0;
        while (n < 30) {
            if (moeq_mtp_decode_step(d, &sq, 1, err, sizeof err)) fail_msg("%s", err);
            for (int k = 0; k < sq.n_out && n < 40; k++) toks[run][n++] = sq.out[k];
        }
        acc[run] = sq.accepted;
        if (run) assert_int_equal(g_down_bytes, 0); /* greedy drafts and verification: records only */
        free(logits);
        moeq_mtp_decoder_destroy(d);
        moeq_engine_destroy(e);
    }
    assert_memory_equal(toks[1], toks[0], 30 * sizeof(int32_t));
    assert_int_equal(acc[1], acc[0]);
    print_message("mtp on the guarded backend: 30 tokens, %lld drafts accepted, as on the cpu\n", (long long)acc[0]);
    moeq_model_destroy(m);
    rm_dir(dir);
}

/* ---- logits records: what comes back from a device -------------------------------------------------------------- */

/* moeq_generate of 24 tokens with sampling on e; *rows_back: whole rows that came back (download bytes / row). */
static void generate_on(moeq_engine *e, const moeq_sampling_params *sp, int mtp_k, int32_t *out, int V,
                        double *rows_back) {
    int32_t prompt[9];
    for (int i = 0; i < 9; i++) prompt[i] = (int32_t)((i * 53 + 7) % V);
    moeq_generate_params gp = {.sampling = *sp, .max_new_tokens = 24, .mtp_k = mtp_k};
    int32_t *ids = NULL;
    int n = 0;
    char err[512] = "";
    g_down_bytes = 0, g_records = 0;
    if (moeq_generate(e, prompt, 9, &gp, &ids, &n, err, sizeof err)) fail_msg("generate: %s", err);
    assert_int_equal(n, 24);
    memcpy(out, ids, 24 * sizeof(int32_t));
    free(ids);
    *rows_back = (double)g_down_bytes / ((double)V * sizeof(float));
}

/*
 * moeq generate's loop on a backend the host cannot read: the CPU engine's tokens, greedy and sampled, with
 * and without MTP drafts, and what came back: greedy and top-k <= MOEQ_LOGITS_TOP bring records only (no
 * byte through download); a full-vocabulary top-p draw brings a row only where its record cannot decide.
 */
static void generation_on_a_device_brings_back_records_and_the_cpus_tokens(void **state) {
    (void)state;
    static int registered;
    if (!registered++) (void)moeq_backend_register("guarded", guarded_new); /* taken already is fine */
    char dir[] = "/tmp/moeq-guard-rec-XXXXXX";
    moeq_model *m = gen_model("tiny-mtp", dir);
    int V = moeq_model_get_config(m)->vocab_size;
    assert_true(V > MOEQ_LOGITS_TOP); /* rows the record does not hold whole */
    moeq_engine *cpu = engine_on(m, "cpu"), *g = engine_on(m, "guarded");
    assert_false(moeq_engine_logits_on_device(cpu));
    assert_true(moeq_engine_logits_on_device(g));
    moeq_sampling_params sp[6] = {moeq_sampling_default_params(), {0.8, 40, 1.0, 11}, {0.7, 0, 0.9, 12},
                                  {1.0, 0, 1.0, 13}, {8.0, 0, 1.0, 14}, {1.0, 100, 1.0, 15}};
    const char *names[6] = {"greedy", "T 0.8 top_k 40", "T 0.7 top_p 0.9", "T 1 (whole vocabulary)",
                            "T 8 (flat: draws past the record)", "T 1 top_k 100 (past the record)"};
    for (int i = 0; i < 6; i++)
        for (int mtp_k = 0; mtp_k <= 2; mtp_k += 2) {
            int32_t want[24], got[24];
            double rows_cpu, rows_dev;
            generate_on(cpu, &sp[i], mtp_k, want, V, &rows_cpu);
            generate_on(g, &sp[i], mtp_k, got, V, &rows_dev);
            assert_memory_equal(got, want, sizeof want);
            assert_int_equal(g_down_bytes % ((size_t)V * sizeof(float)), 0); /* whole rows, nothing else */
            if (i < 2) assert_int_equal(g_down_bytes, 0);                    /* records decide every draw */
            assert_true(rows_dev <= (double)g_records);                      /* at most a row per record */
            if (i == 5 && mtp_k == 0) assert_true(rows_dev == 24);           /* every draw needs its row */
            if (i == 4) assert_true(rows_dev > 0);                           /* the fallback ran */
            print_message("  %s, mtp_k %d: the cpu's 24 tokens; %zu records (%zu bytes), %.0f whole rows back\n",
                          names[i], mtp_k, g_records, g_records * sizeof(moeq_logits_record), rows_dev);
        }
    moeq_engine_destroy(cpu), moeq_engine_destroy(g);
    moeq_model_destroy(m);
    rm_dir(dir);
}

/*
 * moeq_engine_step_out over two 64-row chunks (a 70-token prompt with every row's logits, and a decode token):
 * every record is the CPU op's on the CPU engine's row, bit for bit; exactly the rows asked whole (full, or
 * a draw its record cannot decide) come back, equal to the CPU's, and the others are left as they were.
 */
static void records_over_chunks_are_the_cpu_rows_records_and_only_needed_rows_come(void **state) {
    (void)state;
    static int registered;
    if (!registered++) (void)moeq_backend_register("guarded", guarded_new);
    char dir[] = "/tmp/moeq-guard-chunks-XXXXXX", err[512] = "";
    moeq_model *m = gen_model("tiny", dir);
    int V = moeq_model_get_config(m)->vocab_size, R = 71;
    moeq_engine *cpu = engine_on(m, "cpu"), *g = engine_on(m, "guarded");
    float *want = calloc((size_t)R * V, sizeof(float)), *got = malloc((size_t)R * V * sizeof(float));
    moeq_logits_record *rec = calloc((size_t)R, sizeof *rec);
    moeq_row_use *use = calloc((size_t)R, sizeof *use);
    uint8_t *have = calloc((size_t)R, 1);
    moeq_sampler *greedy = NULL, *wide = NULL;
    moeq_sampling_params wp = {1.0, 100, 1.0, 3}; /* top_k past the record: always a whole row */
    assert_int_equal(moeq_sampler_new(NULL, V, &greedy), MOEQ_OK);
    assert_int_equal(moeq_sampler_new(&wp, V, &wide), MOEQ_OK);
    for (int r = 0; r < R; r++)
        use[r] = r % 4 == 0 ? (moeq_row_use){NULL, 0, 1} : r % 4 == 1 ? (moeq_row_use){greedy, 0, 0}
               : r % 4 == 2 ? (moeq_row_use){wide, r % 3, 0} : (moeq_row_use){NULL, 0, 0};
    for (size_t i = 0; i < (size_t)R * V; i++) got[i] = -7.0f; /* what a row not brought keeps */
    int32_t prompt[70], tok = 5;
    for (int i = 0; i < 70; i++) prompt[i] = (int32_t)((i * 29 + 3) % V);
    for (int run = 0; run < 2; run++) {
        moeq_engine *e = run ? g : cpu;
        int a, b;
        assert_int_equal(moeq_engine_seq_new(e, &a), MOEQ_OK);
        assert_int_equal(moeq_engine_seq_new(e, &b), MOEQ_OK);
        moeq_step_item first = {a, &tok, 1, 0};
        float *scratch = malloc((size_t)V * sizeof(float));
        if (moeq_engine_step(e, &first, 1, scratch, 1, err, sizeof err)) fail_msg("%s", err); /* a has 1 token */
        free(scratch);
        moeq_step_item items[2] = {{b, prompt, 70, 1}, {a, &tok, 1, 0}};
        moeq_step_out out = {run ? got : want, (size_t)R, rec, use, have};
        g_down_bytes = 0;
        if (moeq_engine_step_out(e, items, 2, &out, err, sizeof err)) fail_msg("%s", err);
        for (int r = 0; r < R; r++) assert_int_equal(have[r], run ? use[r].full || use[r].sampler == wide : 1);
    }
    size_t whole = 0;
    for (int r = 0; r < R; r++) {
        moeq_logits_record ref;
        double temp = use[r].sampler ? moeq_sampler_temperature(use[r].sampler) : 0;
        moeq_cpu_logits_reduce_row(want + (size_t)r * V, V, temp, MOEQ_LOGITS_TOP, &ref);
        if (memcmp(&rec[r], &ref, sizeof ref)) /* the guarded run's record = the CPU op on the CPU's row */
            fail_msg("row %d: record argmax %d, the cpu row's %d", r, rec[r].argmax, ref.argmax);
        if (have[r]) {
            assert_same_bits(got + (size_t)r * V, want + (size_t)r * V, (size_t)V, "a row brought whole");
            whole++;
        } else {
            for (int i = 0; i < V; i++) assert_true(got[(size_t)r * V + i] == -7.0f);
        }
    }
    assert_int_equal(g_down_bytes, whole * (size_t)V * sizeof(float)); /* nothing else came through download */
    print_message("71 rows in 2 chunks: 71 records, %zu rows whole (the full and top_k 100 ones)\n", whole);
    moeq_sampler_destroy(greedy), moeq_sampler_destroy(wide);
    free(want), free(got), free(rec), free(use), free(have);
    moeq_engine_destroy(cpu), moeq_engine_destroy(g);
    moeq_model_destroy(m);
    rm_dir(dir);
}

/* ---- error paths ---------------------------------------------------------------------------------------------- */

/* ---- cuda_graphs: the engine's padded, bracketed steps, played on the CPU ------------------------------------- */

/*
 * "padded-cpu": the CPU backend with the graph seam of the CUDA backend's contract: graph_rows answers the step's
 * bucket (graph_index.cuh), and inside a bracket the padding rows (past n_valid) run at position 0 of the scratch
 * block (a block table row of their own, as the device's fixed tables give them) and leave the expert counts
 * alone. One bucket's first bracket reports a failed capture: the engine must issue the step again, unpadded.
 */
static struct {
    void (*mla_rope)(moeq_backend *, const moeq_mla_rope_params *);
    void (*attention)(moeq_backend *, const moeq_mla_params *);
    void (*moe_experts)(moeq_backend *, const moeq_moe_experts_params *);
    int64_t sizes[MOEQ_CU_GRAPH_MAX_BUCKETS];
    int n_sizes, failed[MOEQ_CU_GRAPH_MAX_BUCKETS], fail_bucket;
    int in_bracket, doomed, brackets, failures;
    int64_t padded_rows;
    moeq_graph_step step;
} pg;

static int64_t pg_graph_rows(const moeq_backend *b, int64_t n_tok) {
    (void)b;
    int i = moeq_cu_graph_bucket(pg.sizes, pg.n_sizes, n_tok);
    return i < 0 || pg.failed[i] ? 0 : pg.sizes[i];
}

static void pg_graph_begin(moeq_backend *b, const moeq_graph_step *step) {
    (void)b;
    assert_false(pg.in_bracket);
    assert_true(step->n_valid >= 1 && step->n_valid <= step->n_rows && step->scratch_block >= 0);
    assert_int_equal(pg_graph_rows(b, step->n_valid), step->n_rows); /* the engine padded to the bucket */
    assert_true(step->block_table && step->table_stride > 0 && step->seq && step->pos);
    for (int64_t t = step->n_valid; t < step->n_rows; t++) assert_int_equal(step->pos[t], 0);
    pg.in_bracket = 1, pg.step = *step, pg.brackets++, pg.padded_rows += step->n_rows - step->n_valid;
    int i = moeq_cu_graph_bucket(pg.sizes, pg.n_sizes, step->n_rows);
    pg.doomed = i == pg.fail_bucket && !pg.failed[i]; /* a failed capture executes nothing: no lasting effect */
}

static int pg_graph_end(moeq_backend *b) {
    (void)b;
    assert_true(pg.in_bracket);
    pg.in_bracket = 0;
    if (pg.doomed) { /* its capture "failed": the cache and the counts untouched, the step must run again */
        pg.failed[pg.fail_bucket] = 1, pg.failures++, pg.doomed = 0;
        return 1;
    }
    return 0;
}

/* A call of the bracket's rows: the padding's sequence is a row of its own holding the scratch block. */
static int pg_padded(int64_t n_tok) { return pg.in_bracket && n_tok == pg.step.n_rows && pg.step.n_valid < n_tok; }

static int32_t *pg_table(const moeq_kv_paged *kv, const int32_t *seq, const int64_t *pos, int32_t *seq_out) {
    int64_t n_valid = pg.step.n_valid, rows = 0;
    for (int64_t t = 0; t < n_valid; t++) rows = seq[t] + 1 > rows ? seq[t] + 1 : rows;
    int32_t *tab = malloc((size_t)((rows + 1) * kv->table_stride) * sizeof(int32_t));
    memcpy(tab, kv->block_table, (size_t)(rows * kv->table_stride) * sizeof(int32_t));
    tab[rows * kv->table_stride] = pg.step.scratch_block;
    for (int64_t t = 0; t < pg.step.n_rows; t++) {
        seq_out[t] = t < n_valid ? seq[t] : (int32_t)rows;
        if (t >= n_valid) assert_int_equal(pos[t], 0); /* padding sits at position 0 */
    }
    return tab;
}

static void pg_mla_rope(moeq_backend *b, const moeq_mla_rope_params *p) {
    if (pg.doomed) return;
    if (!pg_padded(p->n_tok)) return pg.mla_rope(b, p);
    moeq_mla_rope_params q = *p;
    int32_t *seq = malloc((size_t)p->n_tok * sizeof(int32_t)), *tab = pg_table(&p->kv, p->seq, p->pos, seq);
    q.kv.block_table = tab, q.seq = seq;
    pg.mla_rope(b, &q);
    free(seq), free(tab);
}

static void pg_attention(moeq_backend *b, const moeq_mla_params *p) {
    if (pg.doomed) return;
    if (!pg_padded(p->n_tok)) return pg.attention(b, p);
    moeq_mla_params q = *p;
    int32_t *seq = malloc((size_t)p->n_tok * sizeof(int32_t)), *tab = pg_table(&p->kv, p->seq, p->pos, seq);
    q.kv.block_table = tab, q.seq = seq;
    pg.attention(b, &q);
    free(seq), free(tab);
}

/* The device counts the valid rows' slots only (moe_plan_kernel with n_valid): here, the padding's taken back. */
static void pg_moe_experts(moeq_backend *b, const moeq_moe_experts_params *p) {
    if (pg.doomed) return;
    pg.moe_experts(b, p);
    if (!pg_padded(p->n_tok) || !p->stats) return;
    for (int64_t s = pg.step.n_valid * p->top_k; s < p->n_tok * p->top_k; s++) p->stats[p->ids[s]]--;
}

static moeq_err padded_cpu_new(const moeq_backend_config *config, moeq_backend **out, char *errstr,
                               size_t errstr_size) {
    moeq_backend *b = *out = moeq_backend_cpu_new(config);
    if (!b) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "padded-cpu backend");
    assert_true(config->graphs);           /* cuda_graphs = auto reached the backend */
    assert_false(config->cuda_few_token);  /* and cuda_matrix's default, lanes */
    pg.mla_rope = b->mla_rope, pg.attention = b->attention, pg.moe_experts = b->moe_experts;
    b->mla_rope = pg_mla_rope, b->attention = pg_attention, b->moe_experts = pg_moe_experts;
    b->graph_rows = pg_graph_rows, b->graph_begin = pg_graph_begin, b->graph_end = pg_graph_end;
    pg.n_sizes = moeq_cu_graph_buckets(config->max_tokens, pg.sizes);
    return MOEQ_OK;
}

/* Prefill 5 sequences in one step (all 30 rows' logits), then decode steps of 5, 3, 5 (again), 1 and 5 tokens. */
static int padded_steps(moeq_engine *e, int V, float *logits) {
    int seq[5], rows = 0;
    char err[256] = "";
    int32_t prompt[5][12], tok[5];
    moeq_step_item it[5];
    for (int s = 0; s < 5; s++) {
        assert_int_equal(moeq_engine_seq_new(e, &seq[s]), MOEQ_OK);
        for (int i = 0; i < 12; i++) prompt[s][i] = (int32_t)((i * 41 + s * 17 + 3) % V);
        it[s] = (moeq_step_item){seq[s], prompt[s], 2 + 2 * s, 1};
    }
    if (moeq_engine_step(e, it, 5, logits, 30, err, sizeof err)) fail_msg("%s", err);
    rows += 2 + 4 + 6 + 8 + 10;
    const int batch[] = {5, 3, 5, 1, 5};
    for (int k = 0; k < 5; k++) {
        for (int s = 0; s < batch[k]; s++) {
            tok[s] = (int32_t)((k * 13 + s * 7 + 1) % V);
            it[s] = (moeq_step_item){seq[s], &tok[s], 1, 0};
        }
        if (moeq_engine_step(e, it, batch[k], logits + (size_t)rows * V, 5, err, sizeof err)) fail_msg("%s", err);
        rows += batch[k];
    }
    return rows;
}

static void padded_graph_steps_give_the_unpadded_logits_and_expert_counts(void **state) {
    (void)state;
    static int registered;
    if (!registered++) (void)moeq_backend_register("padded-cpu", padded_cpu_new);
    memset(&pg, 0, sizeof pg);
    pg.fail_bucket = 3; /* the bucket of 8: its first capture fails (the decode steps of 5) */
    char dir[] = "/tmp/moeq-graph-pad-XXXXXX", err[512] = "";
    moeq_model *m = gen_model("tiny", dir);
    int V = moeq_model_get_config(m)->vocab_size;
    moeq_engine *cpu = NULL, *pad = NULL;
    moeq_engine_params p = moeq_engine_default_params();
    snprintf(p.backend, sizeof p.backend, "padded-cpu");
    snprintf(p.cuda_graphs, sizeof p.cuda_graphs, "auto");
    p.n_threads = 2, p.max_seqs = 5, p.kv_cache_tokens = 512, p.max_step_tokens = 256;
    if (moeq_engine_new(m, &p, &pad, err, sizeof err)) fail_msg("%s", err);
    /* the same engine on the plain CPU backend, graphs off */
    snprintf(p.backend, sizeof p.backend, "cpu");
    snprintf(p.cuda_graphs, sizeof p.cuda_graphs, "off");
    if (moeq_engine_new(m, &p, &cpu, err, sizeof err)) fail_msg("%s", err);
    size_t n = (size_t)64 * V;
    float *want = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float));
    int rw = padded_steps(cpu, V, want), rg = padded_steps(pad, V, got);
    assert_int_equal(rw, rg);
    assert_same_bits(got, want, (size_t)rw * V, "padded graph steps vs the plain engine");
    /* the prefill is no decode step (eager); decode 5 -> 8 (its capture fails: issued again unpadded), 3 -> 4,
     * 5 -> eager (bucket 8 failed), 1 -> 1, 5 -> eager: 3 brackets, 3 + 1 padding rows */
    print_message("padded steps: %d brackets, %lld padding rows, %d failed capture issued again\n", pg.brackets,
                  (long long)pg.padded_rows, pg.failures);
    assert_int_equal(pg.brackets, 3);
    assert_int_equal(pg.padded_rows, 3 + 1);
    assert_int_equal(pg.failures, 1);
    int nl[2], ne[2];
    const uint64_t *c0 = moeq_engine_expert_counts(cpu, &nl[0], &ne[0]);
    const uint64_t *c1 = moeq_engine_expert_counts(pad, &nl[1], &ne[1]);
    assert_true(nl[0] == nl[1] && ne[0] == ne[1]);
    assert_memory_equal(c1, c0, (size_t)nl[0] * (size_t)ne[0] * sizeof(uint64_t)); /* no padding counted */
    moeq_engine_destroy(cpu), moeq_engine_destroy(pad);
    moeq_model_destroy(m);
    free(want), free(got);
    rm_dir(dir);
}

static void the_cuda_backend_without_a_device_or_without_cuda_is_a_clear_error(void **state) {
    (void)state;
    moeq_backend_config bc = {.n_threads = 1, .batch_invariant = 1, .max_k = 64, .max_ctx = 64, .max_jobs = 4};
    moeq_backend *b = NULL;
    char err[512] = "";
#ifdef MOEQ_HAVE_CUDA_BACKEND
    assert_string_equal(moeq_backend_names(), "cpu,cuda,cpu-device");
    char why[200] = "";
    int n = moeq_cuda_device_count(why, sizeof why);
    if (n > 0) bc.device = n; /* a machine with a GPU: an ordinal past the last one is the same path */
    assert_int_equal(moeq_backend_new("cuda", &bc, &b, err, sizeof err), MOEQ_ERR_UNSUPPORTED);
    assert_null(b);
    assert_non_null(strstr(err, "backend cuda"));
    assert_true(n > 0 ? strstr(err, "does not exist") != NULL : strstr(err, "device") != NULL);
    print_message("%s\n", err);
#else
    assert_int_equal(moeq_backend_new("cuda", &bc, &b, err, sizeof err), MOEQ_ERR_UNSUPPORTED);
    assert_null(b);
    assert_non_null(strstr(err, "this build has no CUDA backend"));
#endif
}

static void the_cuda_backend_refuses_what_it_cannot_run_by_name(void **state) {
    (void)state;
#ifdef MOEQ_HAVE_CUDA_BACKEND
    for (int op = 0; op < MOEQ_BACKEND_OP_COUNT; op++)
        for (int dt = MOEQ_DTYPE_F32; dt <= MOEQ_DTYPE_F8_E4M3; dt++)
            assert_true(moeq_backend_cuda_supports((moeq_backend_op)op, (moeq_dtype)dt));
    assert_false(moeq_backend_cuda_supports(MOEQ_BACKEND_OP_MATMUL, (moeq_dtype)(MOEQ_DTYPE_F8_E4M3 + 1)));
    assert_false(moeq_backend_cuda_supports(MOEQ_BACKEND_OP_COUNT, MOEQ_DTYPE_BF16));
    assert_false(moeq_backend_cuda_supports((moeq_backend_op)-1, MOEQ_DTYPE_BF16));
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(compact_tables_address_every_entry_as_the_engines_block_tables),
        cmocka_unit_test(a_long_prefill_chunk_stages_one_row_of_blocks),
        cmocka_unit_test(split_partitions_cover_each_context_once_and_depend_only_on_its_length),
        cmocka_unit_test(split_kv_partials_merged_equal_the_cpu_attention),
        cmocka_unit_test(split_merge_of_random_partials_equals_the_float64_softmax),
        cmocka_unit_test(decode_buckets_are_the_smallest_power_of_two_that_holds_the_step),
        cmocka_unit_test(the_device_split_plan_equals_the_host_plan_over_many_shapes),
        cmocka_unit_test(fixed_stride_tables_address_every_entry_as_the_engines_and_padding_the_scratch_block),
        cmocka_unit_test(fixed_table_sync_uploads_only_changed_rows_and_keeps_the_device_right),
        cmocka_unit_test(a_padded_step_on_the_capacity_grid_gives_the_eager_bits_in_every_bucket),
        cmocka_unit_test(gather_and_combine_grids_give_the_cpu_backends_bits),
        cmocka_unit_test(f8_block_scales_by_absolute_row_give_the_cpu_backends_products_for_row_ranges),
        cmocka_unit_test(few_token_nt_threads_give_the_cpu_backends_bits),
        cmocka_unit_test(many_token_nt_tiles_give_the_cpu_backends_bits),
        cmocka_unit_test(moe_plan_and_work_list_helpers_match_a_plain_c_model_over_many_shapes),
        cmocka_unit_test(moe_experts_grids_emulated_give_the_cpu_ops_bits),
        cmocka_unit_test(logits_through_download_in_chunks_equal_the_direct_logits),
        cmocka_unit_test(an_engine_touches_backend_memory_only_through_ops),
        cmocka_unit_test(mtp_rounds_touch_backend_memory_only_through_ops),
        cmocka_unit_test(a_decode_step_on_one_rank_makes_no_round_trip_inside_moe_layers),
        cmocka_unit_test(router_flags_on_the_backend_still_name_the_first_non_finite_layer),
        cmocka_unit_test(the_cpu_moe_experts_op_equals_the_composed_path_bit_for_bit),
        cmocka_unit_test(generation_on_a_device_brings_back_records_and_the_cpus_tokens),
        cmocka_unit_test(records_over_chunks_are_the_cpu_rows_records_and_only_needed_rows_come),
        cmocka_unit_test(padded_graph_steps_give_the_unpadded_logits_and_expert_counts),
        cmocka_unit_test(the_cuda_backend_without_a_device_or_without_cuda_is_a_clear_error),
        cmocka_unit_test(the_cuda_backend_refuses_what_it_cannot_run_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
