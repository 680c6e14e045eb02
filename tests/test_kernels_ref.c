/* test_kernels_ref.c — the kernels' plain-C references on hand-checked cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "moeq/kernels.h"

static moeq_bf16 to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (moeq_bf16)(u >> 16); /* exact for the values used here */
}

static void rmsnorm_scales_a_row_to_unit_rms(void **state) {
    (void)state;
    float x[4] = {1, -1, 1, -1}, w[4] = {1, 2, 3, 4}, out[4];
    moeq_ref_rmsnorm(out, x, w, 1, 4, 0.0f);
    assert_float_equal(out[0], 1.0f, 1e-6);
    assert_float_equal(out[1], -2.0f, 1e-6);
    assert_float_equal(out[3], -4.0f, 1e-6);
}

static void matmul_bf16_is_a_plain_dot_product(void **state) {
    (void)state;
    float x[2 * 3] = {1, 2, 3, -1, 0, 1}, y[2 * 2];
    moeq_bf16 W[2 * 3] = {to_bf16(1), to_bf16(0), to_bf16(0.5f), to_bf16(-2), to_bf16(1), to_bf16(1)};
    moeq_ref_matmul_bf16(y, x, W, 2, 3, 2);
    assert_float_equal(y[0], 2.5f, 1e-6);
    assert_float_equal(y[1], 3.0f, 1e-6);
    assert_float_equal(y[2], -0.5f, 1e-6);
    assert_float_equal(y[3], 3.0f, 1e-6);
}

/* With 2 groups of 2 experts and topk_group 1, the best single expert can be excluded
 * when its group's top-2 sum is lower: group-limited routing is visible. */
static void group_limited_routing_can_exclude_the_best_single_expert(void **state) {
    (void)state;
    float logits[4] = {3.0f, -3.0f, 1.5f, 1.5f}; /* group 0: {3,-3}, group 1: {1.5,1.5} */
    int32_t ids[1];
    float w[1];
    moeq_ref_moe_route(ids, w, logits, NULL, 1, 4, 1, 1, 1, 1, 1.0f);
    assert_int_equal(ids[0], 0); /* ungrouped: expert 0 */
    moeq_ref_moe_route(ids, w, logits, NULL, 1, 4, 2, 1, 1, 1, 1.0f);
    assert_true(ids[0] == 2 || ids[0] == 3); /* grouped: group 1 wins (sum of top-2) */
    assert_float_equal(w[0], 1.0f, 1e-6);    /* normalised single weight */
}

static void routing_bias_changes_the_choice_but_not_the_weights(void **state) {
    (void)state;
    float logits[4] = {2.0f, 1.0f, 0.0f, -1.0f}, bias[4] = {0, 0, 0, 5.0f};
    int32_t ids[2];
    float w[2];
    moeq_ref_moe_route(ids, w, logits, bias, 1, 4, 1, 1, 2, 0, 2.5f);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 0);
    assert_float_equal(w[0], 2.5f / (1.0f + expf(1.0f)), 1e-6); /* unbiased sigmoid(-1) x scale */
    assert_float_equal(w[1], 2.5f / (1.0f + expf(-2.0f)), 1e-6);
}

static void rope_rotates_interleaved_pairs(void **state) {
    (void)state;
    float x[4] = {1, 0, 0, 1};
    int32_t pos[1] = {1};
    float cs[2 * 2] = {1, 1, 0, 1}, sn[2 * 2] = {0, 0, 1, 0}; /* pos 1: pair 0 by 90 deg, pair 1 by 0 */
    moeq_ref_rope(x, pos, cs, sn, 1, 1, 4, 0, 4);
    assert_float_equal(x[0], 0.0f, 1e-7);
    assert_float_equal(x[1], 1.0f, 1e-7);
    assert_float_equal(x[2], 0.0f, 1e-7);
    assert_float_equal(x[3], 1.0f, 1e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rmsnorm_scales_a_row_to_unit_rms),
        cmocka_unit_test(matmul_bf16_is_a_plain_dot_product),
        cmocka_unit_test(group_limited_routing_can_exclude_the_best_single_expert),
        cmocka_unit_test(routing_bias_changes_the_choice_but_not_the_weights),
        cmocka_unit_test(rope_rotates_interleaved_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
