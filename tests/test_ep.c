/* test_ep.c — unit tests of the ep library on one rank: placement tables and files, layout, local transport. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_test_util.h"
#include "moeq/ep.h"
#include "moeq/ep_plan.h"

static char err[512];

static void identity_placement_puts_experts_in_contiguous_blocks(void **state) {
    (void)state;
    moeq_ep_placement *pl = NULL;
    assert_int_equal(moeq_ep_placement_new_identity(10, 4, &pl, err, sizeof err), MOEQ_OK);
    int want[10] = {0, 0, 0, 1, 1, 2, 2, 2, 3, 3};
    for (int e = 0; e < 10; e++) {
        assert_int_equal(moeq_ep_placement_n_replicas(pl, e), 1);
        assert_int_equal(moeq_ep_placement_replica(pl, e, 0), want[e]);
    }
    assert_int_equal(moeq_ep_placement_n_local(pl, 2), 3);
    assert_int_equal(moeq_ep_placement_local_expert(pl, 2, 1), 6);
    assert_int_equal(moeq_ep_placement_local_index(pl, 2, 7), 2);
    assert_int_equal(moeq_ep_placement_local_index(pl, 1, 7), -1);
    moeq_ep_placement_destroy(pl);
}

static void permuted_placement_is_a_deterministic_permutation_of_the_blocks(void **state) {
    (void)state;
    moeq_ep_placement *a = NULL, *b = NULL, *id = NULL;
    assert_int_equal(moeq_ep_placement_new_permuted(16, 4, 7, &a, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_ep_placement_new_permuted(16, 4, 7, &b, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_ep_placement_new_identity(16, 4, &id, err, sizeof err), MOEQ_OK);
    int differ = 0;
    for (int e = 0; e < 16; e++) {
        assert_int_equal(moeq_ep_placement_replica(a, e, 0), moeq_ep_placement_replica(b, e, 0));
        differ += moeq_ep_placement_replica(a, e, 0) != moeq_ep_placement_replica(id, e, 0);
    }
    assert_true(differ > 0);
    for (int r = 0; r < 4; r++) assert_int_equal(moeq_ep_placement_n_local(a, r), 4);
    moeq_ep_placement_destroy(a), moeq_ep_placement_destroy(b), moeq_ep_placement_destroy(id);
}

static void replicated_placement_adds_a_replica_on_the_next_rank(void **state) {
    (void)state;
    moeq_ep_placement *pl = NULL;
    assert_int_equal(moeq_ep_placement_new_replicated(8, 2, 3, &pl, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_ep_placement_n_replicas(pl, 0), 2);
    assert_int_equal(moeq_ep_placement_replica(pl, 0, 1), 1);
    assert_int_equal(moeq_ep_placement_n_replicas(pl, 3), 1);
    assert_int_equal(moeq_ep_placement_n_local(pl, 1), 7); /* 4 own + experts 0, 1, 2 */
    assert_int_equal(moeq_ep_placement_local_index(pl, 1, 2), 2);
    assert_int_equal(moeq_ep_placement_local_index(pl, 1, 4), 3);
    moeq_ep_placement_destroy(pl);
}

static void a_placement_file_round_trips_through_print_and_parse(void **state) {
    (void)state;
    moeq_ep_placement *pl = NULL, *back = NULL;
    assert_int_equal(moeq_ep_placement_new_replicated(6, 3, 2, &pl, err, sizeof err), MOEQ_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_int_equal(moeq_ep_placement_print(pl, f), MOEQ_OK);
    fclose(f);
    assert_int_equal(moeq_ep_placement_parse(text, len, &back, err, sizeof err), MOEQ_OK);
    for (int e = 0; e < 6; e++) {
        assert_int_equal(moeq_ep_placement_n_replicas(back, e), moeq_ep_placement_n_replicas(pl, e));
        for (int i = 0; i < moeq_ep_placement_n_replicas(pl, e); i++)
            assert_int_equal(moeq_ep_placement_replica(back, e, i), moeq_ep_placement_replica(pl, e, i));
    }
    free(text);
    moeq_ep_placement_destroy(pl), moeq_ep_placement_destroy(back);
}

static void a_bad_placement_file_is_an_error_naming_the_line(void **state) {
    (void)state;
    moeq_ep_placement *pl = NULL;
    const char *twice = "# two ranks\nmoeq-ep-placement 1 experts=2 ranks=2\n0 0\n0 1\n";
    assert_int_equal(moeq_ep_placement_parse(twice, strlen(twice), &pl, err, sizeof err), MOEQ_ERR_FORMAT);
    assert_non_null(strstr(err, "line 4"));
    const char *far = "moeq-ep-placement 1 experts=2 ranks=2\n0 0\n1 2\n";
    assert_int_equal(moeq_ep_placement_parse(far, strlen(far), &pl, err, sizeof err), MOEQ_ERR_FORMAT);
    assert_non_null(strstr(err, "line 3"));
    const char *missing = "moeq-ep-placement 1 experts=2 ranks=2\n0 0 1\n";
    assert_int_equal(moeq_ep_placement_parse(missing, strlen(missing), &pl, err, sizeof err), MOEQ_ERR_FORMAT);
    assert_non_null(strstr(err, "expert 1"));
    const char *dup = "moeq-ep-placement 1 experts=1 ranks=2\n0 1 1\n";
    assert_int_equal(moeq_ep_placement_parse(dup, strlen(dup), &pl, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_null(pl);
}

static void layout_counts_rows_per_rank_and_picks_replicas_by_token_index(void **state) {
    (void)state;
    moeq_ep_placement *pl = NULL;
    assert_int_equal(moeq_ep_placement_new_replicated(4, 2, 1, &pl, err, sizeof err), MOEQ_OK);
    int32_t ids[8] = {0, 3, 0, 2, 1, -1, 0, 1}, rank[8], local[8];
    int64_t count[2];
    assert_int_equal(moeq_ep_layout(pl, 0, 4, 2, ids, rank, local, count, err, sizeof err), MOEQ_OK);
    /* expert 0 lives on ranks 0 and 1: replica (t + k + src) % 2 */
    assert_int_equal(rank[0], 0), assert_int_equal(rank[2], 1), assert_int_equal(rank[4], 0), assert_int_equal(rank[6], 1);
    assert_int_equal(rank[1], 1), assert_int_equal(local[1], 2);  /* rank 1 holds 0, 2, 3 */
    assert_int_equal(rank[5], -1);
    assert_int_equal(count[0] + count[1], 7);
    int32_t bad[2] = {0, 4};
    assert_int_equal(moeq_ep_layout(pl, 0, 1, 2, bad, rank, local, count, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "slot 1"));
    moeq_ep_placement_destroy(pl);
}

static moeq_ep_params params_of(int E, int H, int T, int K, const char *payload) {
    moeq_ep_params p = moeq_ep_default_params();
    p.n_experts = E, p.hidden = H, p.max_tokens = T, p.top_k = K;
    snprintf(p.payload, sizeof p.payload, "%s", payload);
    return p;
}

static void local_dispatch_and_combine_return_every_slots_expert_row(void **state) {
    (void)state;
    enum { E = 16, H = 24, T = 40, K = 4 };
    moeq_ep_params p = params_of(E, H, T, K, "f32");
    moeq_ep *ep = NULL;
    assert_int_equal(moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err), MOEQ_OK);
    assert_string_equal(moeq_ep_transport_name(ep), "local");
    static int32_t ids[T * K];
    static float x[T * H], y[T * K * H], out[T * K * H];
    ept_inputs(1, T, K, E, H, 1, ids, x);
    moeq_ep_recv r;
    assert_int_equal(moeq_ep_dispatch(ep, T, ids, x, &r, err, sizeof err), MOEQ_OK);
    int64_t live = 0;
    for (int s = 0; s < T * K; s++) live += ids[s] >= 0;
    assert_int_equal(r.n_rows, live);
    assert_int_equal(r.n_local, E);
    for (int l = 0; l < E; l++)
        for (int64_t i = r.expert_offset[l]; i < r.expert_offset[l + 1]; i++) {
            assert_int_equal(ids[r.src_slot[i]], l);
            assert_memory_equal(r.x + i * H, x + (r.src_slot[i] / K) * H, H * sizeof(float));
            if (i > r.expert_offset[l]) assert_true(r.src_slot[i] > r.src_slot[i - 1]);
        }
    ept_experts(&r, H, y);
    assert_int_equal(moeq_ep_combine(ep, y, out, err, sizeof err), MOEQ_OK);
    for (int s = 0; s < T * K; s++)
        for (int h = 0; h < H; h++) {
            float want = ids[s] < 0 ? 0.0f : x[(s / K) * H + h] * (float)(ids[s] + 1) + (float)ids[s];
            assert_true(memcmp(&out[s * H + h], &want, 4) == 0);
        }
    moeq_ep_destroy(ep);
}

static void a_rank_with_zero_tokens_still_exchanges(void **state) {
    (void)state;
    moeq_ep_params p = params_of(4, 8, 4, 2, "f32");
    moeq_ep *ep = NULL;
    assert_int_equal(moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err), MOEQ_OK);
    moeq_ep_recv r;
    assert_int_equal(moeq_ep_dispatch(ep, 0, NULL, NULL, &r, err, sizeof err), MOEQ_OK);
    assert_int_equal(r.n_rows, 0);
    assert_int_equal(moeq_ep_combine(ep, NULL, NULL, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_ep_barrier(ep, err, sizeof err), MOEQ_OK);
    int64_t all[1] = {0};
    assert_int_equal(moeq_ep_allgather(ep, -12345678901LL, all, err, sizeof err), MOEQ_OK);
    assert_int_equal(all[0], -12345678901LL);
    moeq_ep_destroy(ep);
}

static void bf16_payload_stays_within_bf16_rounding_of_f32(void **state) {
    (void)state;
    enum { E = 8, H = 64, T = 32, K = 2 };
    moeq_ep_params pf = params_of(E, H, T, K, "f32"), pb = params_of(E, H, T, K, "bf16");
    static int32_t ids[T * K];
    static float x[T * H], of[T * K * H], ob[T * K * H];
    ept_inputs(2, T, K, E, H, 0, ids, x);
    assert_int_equal(ept_reference(&pf, T, ids, x, of, err, sizeof err), MOEQ_OK);
    assert_int_equal(ept_reference(&pb, T, ids, x, ob, err, sizeof err), MOEQ_OK);
    int differ = 0;
    for (int i = 0; i < T * K * H; i++) {
        /* two roundings (row, then expert output), each <= 2^-9 relative, on |y| <= 2 * 8 + 7 */
        assert_true(fabsf(ob[i] - of[i]) <= 2.0f * 0x1p-8f * (fabsf(of[i]) + 8.0f));
        differ += ob[i] != of[i];
    }
    assert_true(differ > 0);
    assert_int_equal(moeq_ep_bf16_to_f32(moeq_ep_f32_to_bf16(1.0f + 0x1p-8f)), 1.0f); /* ties to even */
    assert_true(isnan(moeq_ep_bf16_to_f32(moeq_ep_f32_to_bf16(NAN))));
}

static void every_e4m3_code_decodes_and_encodes_back_to_itself(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        float v = moeq_ep_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            assert_true(isnan(v));
            continue;
        }
        assert_int_equal(moeq_ep_f32_to_e4m3(v), c);
    }
    assert_true(moeq_ep_e4m3_to_f32(0x7e) == 448.0f);
    assert_int_equal(moeq_ep_f32_to_e4m3(1e9f), 0x7e);         /* saturates, no infinity */
    assert_int_equal(moeq_ep_f32_to_e4m3(1.0625f), 0x38);      /* 1 + 1/16: a tie, to even (1.0) */
    assert_int_equal(moeq_ep_f32_to_e4m3(1.1875f), 0x3a);      /* 1 + 3/16: a tie, to even (1.25) */
    assert_int_equal(moeq_ep_f32_to_e4m3(-0x1p-10f), 0x80);    /* half the smallest subnormal: to even (-0) */
}

/*
 * FP8 rows: each rounding is within 2^-4 of |v| plus half a subnormal step of
 * its block's scale (max |v| / 448 * 2^-10), once on x (dispatch) and once on
 * y = x' (e + 1) + e (combine).
 */
static void fp8_payload_stays_within_two_e4m3_roundings_of_f32(void **state) {
    (void)state;
    enum { E = 8, H = 200, T = 16, K = 2 }; /* 200: one full block of 128 and a partial one */
    moeq_ep_params pf = params_of(E, H, T, K, "f32"), p8 = params_of(E, H, T, K, "fp8");
    static int32_t ids[T * K];
    static float x[T * H], of[T * K * H], o8[T * K * H];
    ept_inputs(3, T, K, E, H, 0, ids, x);
    assert_int_equal(ept_reference(&pf, T, ids, x, of, err, sizeof err), MOEQ_OK);
    assert_int_equal(ept_reference(&p8, T, ids, x, o8, err, sizeof err), MOEQ_OK);
    double worst = 0;
    for (int s = 0; s < T * K; s++)
        for (int b0 = 0; b0 < H; b0 += 128) {
            int b1 = b0 + 128 < H ? b0 + 128 : H;
            float ax = 0, ay = 0, e1 = (float)ids[s] + 1;
            for (int h = b0; h < b1; h++) ax = fmaxf(ax, fabsf(x[(s / K) * H + h]));
            for (int h = b0; h < b1; h++) ay = fmaxf(ay, fabsf(of[s * H + h]));
            ay *= 1.0f + 0x1p-3f; /* y's block max after x's rounding */
            for (int h = b0; h < b1; h++) {
                float xv = fabsf(x[(s / K) * H + h]), ex = 0x1p-4f * xv + ax / 448 * 0x1p-10f;
                float bound = e1 * ex + 0x1p-4f * (fabsf(of[s * H + h]) + e1 * ex) + ay / 448 * 0x1p-10f;
                float d = fabsf(o8[s * H + h] - of[s * H + h]);
                assert_true(d <= bound * 1.0001f);
                worst = d / bound > worst ? d / bound : worst;
            }
        }
    print_message("fp8: worst error / bound %.3f\n", worst);
    assert_true(worst > 0.1); /* the bound is not vacuous */
}

static void bad_params_and_unknown_transports_are_errors_naming_them(void **state) {
    (void)state;
    moeq_ep *ep = NULL;
    moeq_ep_params p = params_of(4, 8, 4, 2, "f16");
    assert_int_equal(moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "ep.payload"));
    p = params_of(4, 8, 4, 2, "f32");
    strcpy(p.transport, "carrier-pigeon");
    assert_int_equal(moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "carrier-pigeon"));
    strcpy(p.transport, "nccl"); /* this test does not link moeq_ep_nccl */
    assert_int_equal(moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err), MOEQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "not built in"));
    strcpy(p.transport, "local");
    p.n_ranks = 2;
    assert_int_equal(moeq_ep_new(&p, NULL, NULL, &ep, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "one rank"));
    p.n_ranks = 1;
    moeq_ep_placement *pl = NULL;
    assert_int_equal(moeq_ep_placement_new_identity(5, 1, &pl, err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_ep_new(&p, pl, NULL, &ep, err, sizeof err), MOEQ_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "ep.placement"));
    assert_null(ep);
    moeq_ep_placement_destroy(pl);
    moeq_ep_destroy(NULL);
}

static void the_property_table_sets_the_params(void **state) {
    (void)state;
    moeq_ep_params p = moeq_ep_default_params();
    assert_string_equal(p.transport, "local");
    assert_int_equal(p.timeout_ms, 10000);
    assert_int_equal(moeq_props_set(moeq_ep_props, &p, "ep.timeout_ms", "250", err, sizeof err), MOEQ_OK);
    assert_int_equal(moeq_props_set(moeq_ep_props, &p, "ep.ranks", "4", err, sizeof err), MOEQ_OK);
    assert_int_equal(p.timeout_ms, 250);
    assert_int_equal(p.n_ranks, 4);
}

/* Zipf-like counts (exponent 1.5, hottest experts scattered): the hottest carries several ranks' mean load. */
static void skewed_counts(int64_t *c, int E) {
    for (int e = 0; e < E; e++) c[e] = (int64_t)(1e6 / pow(1 + ((e * 7) % E), 1.5));
}

static double plan_ratio(const int64_t *c, int E, int R, int reps, moeq_ep_placement **keep) {
    moeq_ep_placement *pl = NULL;
    assert_int_equal(moeq_ep_plan(c, E, R, reps, &pl, err, sizeof err), MOEQ_OK);
    double max, mean;
    moeq_ep_plan_predict(pl, c, NULL, &max, &mean);
    int P = 0;
    for (int e = 0; e < E; e++) P += moeq_ep_placement_n_replicas(pl, e);
    int cap = (P + R - 1) / R;
    assert_true(P <= E + reps);
    for (int r = 0; r < R; r++) assert_true(moeq_ep_placement_n_local(pl, r) <= cap);
    if (keep) *keep = pl;
    else moeq_ep_placement_destroy(pl);
    return max / mean;
}

static void the_planners_predicted_max_over_mean_load_falls_as_replicas_are_added(void **state) {
    (void)state;
    enum { E = 32, R = 8 };
    int64_t c[E];
    skewed_counts(c, E);
    moeq_ep_placement *id = NULL;
    assert_int_equal(moeq_ep_placement_new_identity(E, R, &id, err, sizeof err), MOEQ_OK);
    double max, mean;
    moeq_ep_plan_predict(id, c, NULL, &max, &mean);
    double prev = max / mean;
    int reps[] = {0, 1, 2, 4};
    for (int i = 0; i < 4; i++) {
        double ratio = plan_ratio(c, E, R, reps[i], NULL);
        print_message("replicas %d: max/mean %.4f\n", reps[i], ratio);
        assert_true(reps[i] == 0 ? ratio <= prev : ratio < prev);
        prev = ratio;
    }
    assert_true(prev < 1.5);
    assert_true(plan_ratio(c, E, R, 16, NULL) <= prev);
    moeq_ep_placement_destroy(id);
}

static void the_plan_is_deterministic_and_replicas_sit_on_distinct_ranks(void **state) {
    (void)state;
    enum { E = 32, R = 4 };
    int64_t c[E];
    skewed_counts(c, E);
    moeq_ep_placement *a = NULL, *b = NULL;
    plan_ratio(c, E, R, 6, &a);
    plan_ratio(c, E, R, 6, &b);
    for (int e = 0; e < E; e++) {
        assert_int_equal(moeq_ep_placement_n_replicas(a, e), moeq_ep_placement_n_replicas(b, e));
        for (int i = 0; i < moeq_ep_placement_n_replicas(a, e); i++)
            assert_int_equal(moeq_ep_placement_replica(a, e, i), moeq_ep_placement_replica(b, e, i));
    }
    assert_true(moeq_ep_placement_n_replicas(a, 0) > 1); /* the hottest expert is replicated */
    moeq_ep_placement_destroy(a), moeq_ep_placement_destroy(b);
    int64_t *counts = NULL;
    int n = 0;
    const char *text = "# layer 3\n10, 20 30\n 40\n";
    assert_int_equal(moeq_ep_stats_parse(text, strlen(text), &counts, &n, err, sizeof err), MOEQ_OK);
    assert_int_equal(n, 4);
    assert_int_equal(counts[3], 40);
    free(counts);
    assert_int_equal(moeq_ep_stats_parse("1 x", 3, &counts, &n, err, sizeof err), MOEQ_ERR_PARSE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(identity_placement_puts_experts_in_contiguous_blocks),
        cmocka_unit_test(permuted_placement_is_a_deterministic_permutation_of_the_blocks),
        cmocka_unit_test(replicated_placement_adds_a_replica_on_the_next_rank),
        cmocka_unit_test(a_placement_file_round_trips_through_print_and_parse),
        cmocka_unit_test(a_bad_placement_file_is_an_error_naming_the_line),
        cmocka_unit_test(layout_counts_rows_per_rank_and_picks_replicas_by_token_index),
        cmocka_unit_test(local_dispatch_and_combine_return_every_slots_expert_row),
        cmocka_unit_test(a_rank_with_zero_tokens_still_exchanges),
        cmocka_unit_test(bf16_payload_stays_within_bf16_rounding_of_f32),
        cmocka_unit_test(every_e4m3_code_decodes_and_encodes_back_to_itself),
        cmocka_unit_test(fp8_payload_stays_within_two_e4m3_roundings_of_f32),
        cmocka_unit_test(bad_params_and_unknown_transports_are_errors_naming_them),
        cmocka_unit_test(the_property_table_sets_the_params),
        cmocka_unit_test(the_planners_predicted_max_over_mean_load_falls_as_replicas_are_added),
        cmocka_unit_test(the_plan_is_deterministic_and_replicas_sit_on_distinct_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
