/*
 * test_logits_reduce.c — the logits records a device backend sends back
 * instead of whole rows (moeq/engine.h moeq_logits_record):
 *   - the CPU backend's op (the reference) against a plain C reference that
 *     sorts the whole row, over many row lengths and awkward rows (NaN first
 *     or inside, inf, ties, all equal, -0 beside +0);
 *   - the CUDA kernels' blocks (engine/cuda/logits_reduce.cuh's helpers, every
 *     thread of every partition's block and the merging block emulated in the
 *     kernels' order) against the CPU op over row lengths x block sizes x
 *     candidate counts x partition lengths: the same record, the sums within
 *     moeq_logits_sum_bound;
 *   - drawing from a record = drawing from the row (same seed, same draws)
 *     for greedy, temperature, top-k and top-p, also with sum_t moved to the
 *     edge of its bound (another device's order), and the fallback
 *     (MOEQ_SAMPLE_INSUFFICIENT) taken exactly where the record cannot decide.
 * No GPU needed; test_backend_cuda_gpu compares the kernel itself.
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

#include "cpu/logits_reduce.h"
#include "logits_reduce.cuh"
#include "moeq/engine.h"
#include "sampler.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float frand(void) { return (float)(urand() & 0xFFFFFF) / (float)(1 << 23) - 1.0f; } /* [-1, 1) */

/* ---- rows ---------------------------------------------------------------------------------------------------- */

enum { ROW_RANDOM, ROW_PEAKED, ROW_TIES, ROW_EQUAL, ROW_NAN_FIRST, ROW_NAN_INSIDE, ROW_INF, ROW_NEG_INF, ROW_ZEROS,
       ROW_ASCENDING, ROW_KINDS };

/* Row kind k of n values (a language model's rows are ROW_PEAKED: a few values well above the rest). */
static void make_row(float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case ROW_PEAKED: x[i] = 4.0f * frand() + (urand() % 97 == 0 ? 12.0f * (1 + frand()) : 0.0f); break;
        case ROW_TIES: x[i] = (float)(urand() % 5) * 0.5f; break;
        case ROW_EQUAL: x[i] = 1.25f; break;
        case ROW_ZEROS: x[i] = urand() & 1 ? 0.0f : -0.0f; break;
        case ROW_ASCENDING: x[i] = (float)i * 1e-3f; break;
        default: x[i] = 8.0f * frand(); break;
        }
    }
    if (kind == ROW_NAN_FIRST) x[0] = NAN;
    if (kind == ROW_NAN_INSIDE) x[n / 2] = NAN, x[n - 1] = -NAN;
    if (kind == ROW_INF) x[n / 3] = INFINITY;
    if (kind == ROW_NEG_INF) x[n / 4] = -INFINITY, x[n - 1] = -INFINITY;
}

/* ---- the plain reference: sort the whole row ------------------------------------------------------------------ */

static const float *g_row;
static int rank_cmp(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float xa = g_row[a], xb = g_row[b];
    int na = isnan(xa), nb = isnan(xb);
    if (na != nb) return na ? 1 : -1; /* NaN last */
    if (!na && xa != xb) return xa > xb ? -1 : 1;
    return a < b ? -1 : 1;
}

static void reference(const float *x, int64_t n, double temperature, int c, moeq_logits_record *r) {
    memset(r, 0, sizeof *r);
    int32_t *idx = malloc((size_t)n * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) idx[i] = i;
    g_row = x;
    qsort(idx, (size_t)n, sizeof(int32_t), rank_cmp);
    r->finite = 1;
    for (int64_t i = 0; i < n; i++) r->finite &= isfinite(x[i]) != 0;
    r->argmax = isnan(x[0]) ? 0 : idx[0];
    r->max = x[r->argmax];
    r->n_top = n < c ? (int)n : c;
    for (int i = 0; i < r->n_top; i++) r->top_id[i] = idx[i], r->top_logit[i] = x[idx[i]];
    if (r->finite) {
        for (int64_t i = 0; i < n; i++) r->sum_1 += exp((double)x[i] - r->max);
        if (temperature > 0) {
            for (int64_t i = 0; i < n; i++) r->sum_t += (float)exp(((double)x[i] - r->max) * (1.0 / temperature));
            r->temperature = temperature;
        }
    }
    free(idx);
}

static void same_bits_f(float a, float b, const char *what, int64_t n, int kind) {
    if (memcmp(&a, &b, 4) && !(isnan(a) && isnan(b)))
        fail_msg("%s: n %lld kind %d: %.9g vs %.9g", what, (long long)n, kind, a, b);
}

/* got == want field by field; the sums bit for bit (exact) or within moeq_logits_sum_bound. */
static void records_equal(const moeq_logits_record *got, const moeq_logits_record *want, int64_t n, int kind,
                          int exact_sums, const char *what) {
    if (got->argmax != want->argmax || got->finite != want->finite || got->n_top != want->n_top)
        fail_msg("%s: n %lld kind %d: argmax %d/%d finite %d/%d n_top %d/%d", what, (long long)n, kind, got->argmax,
                 want->argmax, got->finite, want->finite, got->n_top, want->n_top);
    same_bits_f(got->max, want->max, what, n, kind);
    for (int i = 0; i < want->n_top; i++) {
        if (got->top_id[i] != want->top_id[i])
            fail_msg("%s: n %lld kind %d: candidate %d: id %d vs %d", what, (long long)n, kind, i, got->top_id[i],
                     want->top_id[i]);
        same_bits_f(got->top_logit[i], want->top_logit[i], what, n, kind);
    }
    if (got->temperature != want->temperature) fail_msg("%s: temperature", what);
    if (exact_sums) {
        if (memcmp(&got->sum_t, &want->sum_t, 8) || memcmp(&got->sum_1, &want->sum_1, 8))
            fail_msg("%s: n %lld kind %d: sums %.17g %.17g vs %.17g %.17g", what, (long long)n, kind, got->sum_t,
                     got->sum_1, want->sum_t, want->sum_1);
    } else if (fabs(got->sum_t - want->sum_t) > moeq_logits_sum_bound(want->sum_t, n) ||
               fabs(got->sum_1 - want->sum_1) > moeq_logits_sum1_bound(want->sum_1, n)) {
        fail_msg("%s: n %lld kind %d: sums %.17g %.17g vs %.17g %.17g beyond the bound", what, (long long)n, kind,
                 got->sum_t, got->sum_1, want->sum_t, want->sum_1);
    }
}

static const int64_t lengths[] = {1, 2, 3, 31, 63, 64, 65, 100, 127, 129, 255, 256, 257, 1000, 1021, 4097, 16411,
                                  129280};
#define N_LENGTHS (int)(sizeof lengths / sizeof lengths[0])

static void the_cpu_op_equals_a_full_sort_of_the_row(void **state) {
    (void)state;
    static const int cs[] = {1, 2, 7, 63, MOEQ_LOGITS_TOP};
    float *x = malloc(129280 * sizeof(float));
    int cases = 0;
    for (int li = 0; li < N_LENGTHS; li++)
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            int64_t n = lengths[li];
            if (n > 20000 && kind != ROW_PEAKED && kind != ROW_TIES && kind != ROW_NAN_INSIDE) continue;
            make_row(x, n, kind);
            for (int ci = 0; ci < 5; ci++) {
                double temp = ci == 0 ? 0.0 : ci == 1 ? 1.0 : 0.7;
                moeq_logits_record got, want;
                moeq_cpu_logits_reduce_row(x, n, temp, cs[ci], &got);
                reference(x, n, temp, cs[ci], &want);
                records_equal(&got, &want, n, kind, 1, "cpu op vs full sort");
                /* the op's argmax is the sampler's, NaNs and all */
                assert_int_equal(got.argmax, moeq_sampler_argmax(x, (int)n));
                assert_int_equal(got.finite, moeq_sampler_finite(x, n));
                cases++;
            }
        }
    /* the op itself: rows with a stride, each at its own temperature */
    int64_t V = 1000, ld = 1003;
    float *rows = malloc((size_t)(3 * ld) * sizeof(float));
    for (int r = 0; r < 3; r++) make_row(rows + r * ld, V, r == 1 ? ROW_TIES : ROW_PEAKED);
    double temps[3] = {0.0, 0.5, 1.5};
    moeq_logits_record out[3], want;
    moeq_cpu_logits_reduce(rows, ld, 3, V, temps, out);
    for (int r = 0; r < 3; r++) {
        reference(rows + r * ld, V, temps[r], MOEQ_LOGITS_TOP, &want);
        records_equal(&out[r], &want, V, r, 1, "cpu op over strided rows");
    }
    print_message("cpu op = full sort: %d rows x candidate counts\n", cases);
    free(rows);
    free(x);
}

/* ---- the kernel's block, emulated ------------------------------------------------------------------------------- */

/* backend_cuda.cu's lr_segment over x[0, n) with nt threads and c candidates, step for step: the c best (key,
 * index + id0) in rank order, and the segment's best. */
static void emulate_segment(const float *x, int64_t n, int64_t id0, int nt, int c, uint32_t *key_out, int32_t *id_out,
                            moeq_cu_lr_best *best_out) {
    uint32_t hist[MOEQ_CU_LR_BUCKETS], prefix = 0, k_left = (uint32_t)c;
    moeq_cu_lr_best *best = malloc((size_t)nt * sizeof *best);
    for (int t = 0; t < nt; t++) best[t] = (moeq_cu_lr_best){0u, (int32_t)n, 0};
    for (int pass = 0; pass < MOEQ_CU_LR_PASSES; pass++) {
        memset(hist, 0, sizeof hist);
        for (int t = nt - 1; t >= 0; t--) /* threads in any order: counts commute */
            moeq_cu_lr_pass_thread(x, n, nt, t, pass, prefix, hist, &best[t]);
        uint32_t b = moeq_cu_lr_pick(hist, k_left, &k_left);
        prefix |= b << (24 - 8 * pass);
    }
    for (int s = nt / 2; s > 0; s >>= 1) /* the kernel's tree */
        for (int t = 0; t < s; t++) best[t] = moeq_cu_lr_best_merge(best[t], best[t + s]);
    uint32_t thr = prefix, n_eq = k_left, n_gt = (uint32_t)c - n_eq, gt_base = 0, eq_base = 0;
    uint32_t c_key[MOEQ_LOGITS_TOP];
    int32_t c_id[MOEQ_LOGITS_TOP];
    int filled = 0;
    for (int64_t j = 0; j < moeq_cu_lr_tiles(n, nt); j++) {
        uint32_t gt_before = 0, eq_before = 0; /* the block scan: counts of the tile's lower threads */
        for (int t = 0; t < nt; t++) {
            int64_t i = j * nt + t;
            uint32_t key = i < n ? moeq_cu_lr_key(x[i]) : 0u;
            int gt = i < n && key > thr, eq = i < n && key == thr;
            int slot = i < n ? moeq_cu_lr_slot(key, thr, gt_base + gt_before, eq_base + eq_before, n_gt, n_eq) : -1;
            if (slot >= 0) {
                assert_true(slot < c);
                c_key[slot] = key, c_id[slot] = (int32_t)i, filled++;
            }
            gt_before += (uint32_t)gt, eq_before += (uint32_t)eq;
        }
        gt_base += gt_before, eq_base += eq_before;
        if (gt_base >= n_gt && eq_base >= n_eq) break;
    }
    assert_int_equal(filled, c); /* every slot written exactly once (slots are distinct by construction) */
    for (int i = 0; i < c; i++) {
        int rank = moeq_cu_lr_rank(c_key, c_id, c, i);
        key_out[rank] = c_key[i], id_out[rank] = (int32_t)(c_id[i] + id0);
    }
    *best_out = (moeq_cu_lr_best){best[0].key, (int32_t)(best[0].id + id0), best[0].nonfinite};
    free(best);
}

/*
 * backend_cuda.cu's logits_select_kernel and logits_sum_kernel for one row with nt threads, partitions of S
 * values (the kernels take moeq_cu_lr_part_len) and c candidates: each partition's segment, the union's
 * selection in (partition, rank) order by the last block, the sums per partition added in partition order.
 */
static void emulate_partitioned(const float *x, int64_t V, double temperature, int nt, int64_t S, int c_max,
                                moeq_logits_record *r) {
    memset(r, 0, sizeof *r);
    int c = V < c_max ? (int)V : c_max, P = (int)((V + S - 1) / S);
    uint32_t *u_key = malloc((size_t)P * MOEQ_LOGITS_TOP * sizeof *u_key);
    int32_t *u_id = malloc((size_t)P * MOEQ_LOGITS_TOP * sizeof *u_id);
    moeq_cu_lr_best best = {0u, (int32_t)V, 0};
    int n = 0;
    for (int p = P - 1; p >= 0; p--) { /* the partitions' blocks in any order: each writes its own region */
        int64_t lo = (int64_t)p * S, L = V - lo < S ? V - lo : S;
        int cp = L < c ? (int)L : c;
        moeq_cu_lr_best pb;
        emulate_segment(x + lo, L, lo, nt, cp, u_key + (size_t)p * MOEQ_LOGITS_TOP, u_id + (size_t)p * MOEQ_LOGITS_TOP,
                        &pb);
        best = moeq_cu_lr_best_merge(best, pb); /* a total order: the same in partition order */
    }
    for (int p = 0; p < P; p++) { /* the union, compacted in (partition, rank) order */
        int64_t L = V - (int64_t)p * S < S ? V - (int64_t)p * S : S;
        int cp = L < c ? (int)L : c;
        memmove(u_key + n, u_key + (size_t)p * MOEQ_LOGITS_TOP, (size_t)cp * sizeof *u_key);
        memmove(u_id + n, u_id + (size_t)p * MOEQ_LOGITS_TOP, (size_t)cp * sizeof *u_id);
        n += cp;
    }
    uint32_t hist[MOEQ_CU_LR_BUCKETS], prefix = 0, k_left = (uint32_t)c;
    for (int pass = 0; pass < MOEQ_CU_LR_PASSES; pass++) {
        memset(hist, 0, sizeof hist);
        for (int t = nt - 1; t >= 0; t--) moeq_cu_lr_key_pass_thread(u_key, n, nt, t, pass, prefix, hist);
        uint32_t b = moeq_cu_lr_pick(hist, k_left, &k_left);
        prefix |= b << (24 - 8 * pass);
    }
    uint32_t thr = prefix, n_eq = k_left, n_gt = (uint32_t)c - n_eq, gt_base = 0, eq_base = 0;
    uint32_t c_key[MOEQ_LOGITS_TOP];
    int32_t c_id[MOEQ_LOGITS_TOP];
    int filled = 0;
    for (int j = 0; j < (n + nt - 1) / nt; j++) {
        uint32_t gt_before = 0, eq_before = 0;
        for (int t = 0; t < nt; t++) {
            int i = j * nt + t;
            uint32_t key = i < n ? u_key[i] : 0u;
            int gt = i < n && key > thr, eq = i < n && key == thr;
            int slot = i < n ? moeq_cu_lr_slot(key, thr, gt_base + gt_before, eq_base + eq_before, n_gt, n_eq) : -1;
            if (slot >= 0) c_key[slot] = key, c_id[slot] = u_id[i], filled++;
            gt_before += (uint32_t)gt, eq_before += (uint32_t)eq;
        }
        gt_base += gt_before, eq_base += eq_before;
        if (gt_base >= n_gt && eq_base >= n_eq) break;
    }
    assert_int_equal(filled, c);
    for (int i = 0; i < c; i++) {
        int rank = moeq_cu_lr_rank(c_key, c_id, c, i);
        r->top_id[rank] = c_id[i], r->top_logit[rank] = x[c_id[i]];
    }
    int32_t argmax = moeq_cu_lr_argmax(x, best.id);
    int finite = !best.nonfinite;
    r->argmax = argmax, r->finite = finite, r->max = x[argmax], r->n_top = c;
    if (finite) {
        double top = (double)x[argmax], inv_t = temperature > 0 ? 1.0 / temperature : 0.0, st = 0.0, s1 = 0.0;
        double *pt = calloc((size_t)nt, sizeof(double)), *p1 = calloc((size_t)nt, sizeof(double));
        for (int p = 0; p < P; p++) {
            int64_t lo = (int64_t)p * S, L = V - lo < S ? V - lo : S;
            for (int t = 0; t < nt; t++) moeq_cu_lr_sum_thread(x + lo, L, nt, t, top, inv_t, &pt[t], &p1[t]);
            for (int s = nt / 2; s > 0; s >>= 1)
                for (int t = 0; t < s; t++) pt[t] += pt[t + s], p1[t] += p1[t + s];
            st += pt[0], s1 += p1[0];
        }
        free(pt), free(p1);
        r->temperature = temperature > 0 ? temperature : 0.0;
        r->sum_t = temperature > 0 ? st : 0.0;
        r->sum_1 = s1;
    }
    free(u_key), free(u_id);
}

static void the_kernels_blocks_give_the_cpu_ops_record_for_every_shape(void **state) {
    (void)state;
    static const int nts[] = {32, 64, MOEQ_CU_LR_THREADS, 1024};
    static const int cs[] = {1, 5, 64};
    float *x = malloc(129280 * sizeof(float));
    int cases = 0, many = 0;
    double worst = 0;
    for (int li = 0; li < N_LENGTHS; li++)
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            int64_t n = lengths[li];
            if (n > 20000 && kind != ROW_PEAKED && kind != ROW_TIES) continue;
            make_row(x, n, kind);
            for (int ti = 0; ti < 4; ti++)
                for (int ci = 0; ci < 3; ci++) {
                    if (n > 20000 && (ti != 2 || ci != 2)) continue; /* V3's vocabulary: the shipped shape */
                    double temp = (ti + ci) % 3 == 0 ? 0.0 : 0.8;
                    moeq_logits_record got, want;
                    moeq_cpu_logits_reduce_row(x, n, temp, cs[ci], &want);
                    /* the shipped partitions, and short ones: many partitions, ties across their edges */
                    int64_t parts[2] = {moeq_cu_lr_part_len(n, nts[ti]), 2 * nts[ti]};
                    for (int pi = 0; pi < 2; pi++) {
                        if (pi == 1 && (n + parts[1] - 1) / parts[1] > 512) continue;
                        emulate_partitioned(x, n, temp, nts[ti], parts[pi], cs[ci], &got);
                        records_equal(&got, &want, n, kind, 0, "kernel blocks vs cpu op");
                        if (want.sum_1 > 0) {
                            double e = fabs(got.sum_1 - want.sum_1) / want.sum_1;
                            worst = e > worst ? e : worst;
                        }
                        cases++;
                        many += (n + parts[pi] - 1) / parts[pi] > 1;
                    }
                }
        }
    assert_true(many > cases / 5); /* many shapes went through the union of several partitions */
    print_message("kernel blocks = cpu op: %d shapes (%d of several partitions); sums' worst relative difference "
                  "%.3g\n", cases, many, worst);
    free(x);
}

static void radix_keys_order_floats_as_the_sampler_compares_them(void **state) {
    (void)state;
    float v[] = {-INFINITY, -3e38f, -1.0f, -1e-45f, -0.0f, 0.0f, 1e-45f, 1.0f, 3e38f, INFINITY};
    for (int i = 0; i < 10; i++)
        for (int j = 0; j < 10; j++) {
            uint32_t ki = moeq_cu_lr_key(v[i]), kj = moeq_cu_lr_key(v[j]);
            assert_int_equal(ki > kj, v[i] > v[j]);
            assert_int_equal(ki == kj, v[i] == v[j]);
        }
    assert_int_equal(moeq_cu_lr_key(NAN), 0);
    assert_int_equal(moeq_cu_lr_key(-NAN), 0);
    assert_true(moeq_cu_lr_key(-INFINITY) > 0);
    uint32_t hist[MOEQ_CU_LR_BUCKETS] = {0}, k;
    hist[200] = 3, hist[100] = 5, hist[0] = 9;
    assert_int_equal(moeq_cu_lr_pick(hist, 3, &k), 200), assert_int_equal(k, 3);
    assert_int_equal(moeq_cu_lr_pick(hist, 4, &k), 100), assert_int_equal(k, 1);
    assert_int_equal(moeq_cu_lr_pick(hist, 9, &k), 0), assert_int_equal(k, 1);
}

/* ---- drawing from a record ------------------------------------------------------------------------------------ */

typedef struct draw_stats {
    int64_t draws, insufficient, insufficient_needed;
} draw_stats;

/* The position of the host sampler's draw in the row's candidate order and whether it lies within margin of a
 * boundary the record cannot see exactly (the total's bound): what makes an insufficient answer necessary. */
static int host_needs_row(const moeq_sampling_params *p, const float *x, int V, const moeq_logits_record *rec,
                          double u) {
    if (p->temperature <= 0) return 0;
    int k = p->top_k <= 0 || p->top_k > V ? V : p->top_k;
    if (k <= rec->n_top) return 0;
    if (k < V) return 1; /* candidates past the record */
    int32_t *cand = malloc((size_t)V * sizeof(int32_t));
    float *w = malloc((size_t)V * sizeof(float));
    double sum;
    int m = moeq_sampler_weights(p, x, V, 1, cand, w, &sum);
    double e = 4 * moeq_logits_sum_bound(rec->sum_t, V), acc = 0;
    int need = 0;
    if (p->top_p < 1.0) { /* the nucleus: past the record, or its edge within the bound */
        need = m > rec->n_top;
        for (int i = 0; i < rec->n_top && !need && i < m; i++) {
            acc += w[i];
            need |= fabs(acc - p->top_p * rec->sum_t) <= p->top_p * e;
        }
    } else {
        double target = u * sum;
        int i = 0;
        for (acc = 0; i < m; i++) {
            acc += w[i];
            if (fabs(acc - target) <= e) need = 1;
            if (target < acc) break;
        }
        need |= i >= rec->n_top;
    }
    free(cand), free(w);
    return need;
}

/* n draws of two samplers of params on row x: one on the row, one on its record (falling back to the row when
 * insufficient); the same tokens and the same draw counts. rec_sum_scale moves sum_t (another device's order). */
static void draws_agree(const moeq_sampling_params *p, const float *x, int V, double rec_sum_scale, int n,
                        draw_stats *st) {
    moeq_sampler *a = NULL, *b = NULL;
    assert_int_equal(moeq_sampler_new(p, V, &a), MOEQ_OK);
    assert_int_equal(moeq_sampler_new(p, V, &b), MOEQ_OK);
    moeq_logits_record rec;
    moeq_cpu_logits_reduce_row(x, V, p->temperature, MOEQ_LOGITS_TOP, &rec);
    rec.sum_t *= rec_sum_scale;
    for (int d = 0; d < n; d++) {
        double u = moeq_sampler_uniform(p->seed, (uint64_t)d);
        int decides = moeq_sampler_record_decides(b, &rec, 0);
        int32_t want = moeq_sampler_sample(a, x), got = moeq_sampler_sample_record(b, &rec);
        assert_int_equal(decides, got != MOEQ_SAMPLE_INSUFFICIENT);
        st->draws++;
        if (got == MOEQ_SAMPLE_INSUFFICIENT) {
            st->insufficient++;
            st->insufficient_needed += host_needs_row(p, x, V, &rec, u);
            got = moeq_sampler_sample(b, x); /* the caller's fallback: the whole row */
        }
        if (got != want)
            fail_msg("draw %d (T %.2f top_k %d top_p %.2f): record %d, row %d", d, p->temperature, p->top_k,
                     p->top_p, got, want);
    }
    /* both made the same number of draws: the next draws agree too */
    assert_int_equal(moeq_sampler_sample(a, x), moeq_sampler_sample(b, x));
    moeq_sampler_destroy(a), moeq_sampler_destroy(b);
}

static void drawing_from_a_record_equals_drawing_from_the_row(void **state) {
    (void)state;
    static const double temps[] = {0.0, 0.3, 0.7, 1.0, 1.6};
    static const int top_ks[] = {0, 1, 5, 50, 64, 65, 200};
    static const double top_ps[] = {1.0, 0.99, 0.9, 0.5};
    static const int Vs[] = {40, 1000, 5003};
    draw_stats st = {0}, by_kind[3] = {{0}};
    float *x = malloc(5003 * sizeof(float));
    for (int vi = 0; vi < 3; vi++)
        for (int kind = 0; kind < 3; kind++) { /* peaked, random, ties */
            int V = Vs[vi];
            make_row(x, V, kind == 0 ? ROW_PEAKED : kind == 1 ? ROW_RANDOM : ROW_TIES);
            for (int ti = 0; ti < 5; ti++)
                for (int ki = 0; ki < 7; ki++)
                    for (int pi = 0; pi < 4; pi++) {
                        if (ti == 0 && (ki || pi)) continue;
                        uint64_t seed = (uint64_t)(vi * 131 + ki * 7 + pi);
                        moeq_sampling_params p = {temps[ti], top_ks[ki], top_ps[pi], seed};
                        draw_stats one = {0};
                        draws_agree(&p, x, V, 1.0, 12, &one);
                        int all_in = p.temperature <= 0 || V <= MOEQ_LOGITS_TOP ||
                                     (p.top_k > 0 && p.top_k <= MOEQ_LOGITS_TOP);
                        if (all_in) assert_int_equal(one.insufficient, 0); /* every candidate in the record */
                        if (!all_in && p.top_k > MOEQ_LOGITS_TOP && p.top_k < V)
                            assert_int_equal(one.insufficient, one.draws); /* candidates past the record */
                        st.draws += one.draws, st.insufficient += one.insufficient;
                        st.insufficient_needed += one.insufficient_needed;
                        by_kind[kind].draws += one.draws, by_kind[kind].insufficient += one.insufficient;
                    }
        }
    /* every fallback was needed: the draw or the nucleus left the record, or sat on the total's bound */
    assert_int_equal(st.insufficient_needed, st.insufficient);
    print_message("record draws: %lld, fallbacks %lld (peaked rows %lld of %lld, random %lld of %lld, ties %lld of "
                  "%lld)\n", (long long)st.draws, (long long)st.insufficient, (long long)by_kind[0].insufficient,
                  (long long)by_kind[0].draws, (long long)by_kind[1].insufficient, (long long)by_kind[1].draws,
                  (long long)by_kind[2].insufficient, (long long)by_kind[2].draws);
    free(x);
}

/* A device's sum_t in another order, up to its bound either way: every decided draw is still the row's. */
static void a_sum_at_the_edge_of_its_bound_never_changes_a_decided_draw(void **state) {
    (void)state;
    float *x = malloc(20000 * sizeof(float));
    draw_stats st = {0};
    for (int rep = 0; rep < 6; rep++) {
        int V = rep < 3 ? 20000 : 777;
        make_row(x, V, rep % 2 ? ROW_PEAKED : ROW_RANDOM);
        moeq_logits_record rec;
        moeq_cpu_logits_reduce_row(x, V, 0.9, MOEQ_LOGITS_TOP, &rec);
        double rel = moeq_logits_sum_bound(rec.sum_t, V) / rec.sum_t;
        for (int side = -1; side <= 1; side += 2)
            for (int pi = 0; pi < 3; pi++) {
                moeq_sampling_params p = {0.9, 0, pi == 0 ? 1.0 : pi == 1 ? 0.95 : 0.6, (uint64_t)(rep * 10 + pi)};
                draws_agree(&p, x, V, 1.0 + side * rel * 0.999, 40, &st);
            }
    }
    print_message("sum_t moved to its bound: %lld draws, %lld fallbacks, all equal to the row's\n",
                  (long long)st.draws, (long long)st.insufficient);
    free(x);
}

static void keep_row(void *ctx, const float *raw, float *work, int vocab) {
    (void)ctx, (void)raw, (void)work, (void)vocab;
}

/* top_p set so that the nucleus ends exactly where a prefix's mass meets top_p * total: the decision then lies
 * inside the total's bound, so a record with sum_t anywhere in its bound must leave it to the row. */
static void a_nucleus_edge_inside_the_bound_is_left_to_the_row(void **state) {
    (void)state;
    int V = 3000;
    float *x = malloc((size_t)V * sizeof(float)), *w = malloc((size_t)V * sizeof(float));
    int32_t *cand = malloc((size_t)V * sizeof(int32_t));
    draw_stats st = {0};
    make_row(x, V, ROW_PEAKED);
    moeq_sampling_params p = {1.0, 0, 1.0, 9};
    double total;
    moeq_sampler_weights(&p, x, V, 1, cand, w, &total);
    moeq_logits_record rec;
    moeq_cpu_logits_reduce_row(x, V, 1.0, MOEQ_LOGITS_TOP, &rec);
    double rel = moeq_logits_sum_bound(rec.sum_t, V) / rec.sum_t, acc = 0;
    for (int j = 0; j < 30; j++) {
        acc += w[j];
        p.top_p = acc / total;
        if (!(p.top_p < 1.0)) break;
        for (int side = -1; side <= 1; side++) {
            draw_stats one = {0};
            draws_agree(&p, x, V, 1.0 + side * rel * 0.999, 8, &one);
            assert_int_equal(one.insufficient, one.draws); /* never decided from the record */
            st.draws += one.draws, st.insufficient += one.insufficient;
        }
    }
    print_message("nucleus edges on the bound: %lld draws, all left to the row\n", (long long)st.draws);
    free(x), free(w), free(cand);
}

/* A hook reads the whole row: a record never decides; a non-finite row is -1 with its draw used, as the row's. */
static void hooks_and_non_finite_rows_follow_the_samplers_rules(void **state) {
    (void)state;
    float x[100];
    make_row(x, 100, ROW_NAN_INSIDE);
    moeq_sampling_params p = {0.8, 10, 1.0, 5};
    moeq_sampler *a = NULL, *b = NULL;
    assert_int_equal(moeq_sampler_new(&p, 100, &a), MOEQ_OK);
    assert_int_equal(moeq_sampler_new(&p, 100, &b), MOEQ_OK);
    moeq_logits_record rec;
    moeq_cpu_logits_reduce_row(x, 100, 0.8, MOEQ_LOGITS_TOP, &rec);
    assert_true(moeq_sampler_record_decides(b, &rec, 0));
    assert_int_equal(moeq_sampler_sample_record(b, &rec), -1);
    assert_int_equal(moeq_sampler_sample(a, x), -1);
    make_row(x, 100, ROW_PEAKED);
    moeq_cpu_logits_reduce_row(x, 100, 0.8, MOEQ_LOGITS_TOP, &rec);
    assert_int_equal(moeq_sampler_sample_record(b, &rec), moeq_sampler_sample(a, x)); /* draw 1 on both */
    moeq_sampler_hook h = {.ctx = NULL, .process = NULL};
    moeq_sampler_set_hook(b, &h); /* no process: still decided */
    assert_true(moeq_sampler_record_decides(b, &rec, 0));
    h.process = keep_row;
    moeq_sampler_set_hook(b, &h); /* a processor: never, and no draw is used */
    assert_false(moeq_sampler_record_decides(b, &rec, 0));
    assert_int_equal(moeq_sampler_sample_record(b, &rec), MOEQ_SAMPLE_INSUFFICIENT);
    assert_int_equal(moeq_sampler_sample(b, x), moeq_sampler_sample(a, x));
    moeq_sampler_destroy(a), moeq_sampler_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_cpu_op_equals_a_full_sort_of_the_row),
        cmocka_unit_test(radix_keys_order_floats_as_the_sampler_compares_them),
        cmocka_unit_test(the_kernels_blocks_give_the_cpu_ops_record_for_every_shape),
        cmocka_unit_test(drawing_from_a_record_equals_drawing_from_the_row),
        cmocka_unit_test(a_sum_at_the_edge_of_its_bound_never_changes_a_decided_draw),
        cmocka_unit_test(a_nucleus_edge_inside_the_bound_is_left_to_the_row),
        cmocka_unit_test(hooks_and_non_finite_rows_follow_the_samplers_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
