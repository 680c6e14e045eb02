/*
 * test_model_units.c — pure parts of the loader: dtype conversions against
 * known values, config.json parsing (real DeepSeek configs, HF defaults,
 * errors naming the key), and safetensors header validation on hand-made bytes.
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

#include "model.h"
#include "safetensors.h"

/* ---- dtype ---------------------------------------------------------------- */

static void bf16_widening_gives_known_values(void **state) {
    (void)state;
    assert_true(moeq_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(moeq_bf16_to_f32(0xc000) == -2.0f);
    assert_true(moeq_bf16_to_f32(0x3f00) == 0.5f);
    assert_true(moeq_bf16_to_f32(0x0001) == 0x1p-133f); /* smallest subnormal */
    assert_true(isinf(moeq_bf16_to_f32(0x7f80)));
    assert_true(isnan(moeq_bf16_to_f32(0x7fc0)));
    uint16_t in[3] = {0x3f80, 0x4049, 0x8000};
    float out[3];
    moeq_bf16_to_f32_row(in, out, 3);
    assert_true(out[0] == 1.0f && out[1] == 3.140625f && out[2] == 0.0f && signbit(out[2]));
}

static void bf16_narrowing_rounds_to_nearest_even(void **state) {
    (void)state;
    assert_int_equal(moeq_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(moeq_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);  /* tie → even */
    assert_int_equal(moeq_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82); /* tie → even (up) */
    assert_int_equal(moeq_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_true(isnan(moeq_bf16_to_f32(moeq_f32_to_bf16(NAN))));
}

static void f16_conversions_give_known_values(void **state) {
    (void)state;
    assert_true(moeq_f16_to_f32(0x3c00) == 1.0f);
    assert_true(moeq_f16_to_f32(0xc000) == -2.0f);
    assert_true(moeq_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(moeq_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(moeq_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(isinf(moeq_f16_to_f32(0xfc00)) && moeq_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(moeq_f16_to_f32(0x7e00)));
    for (uint32_t h = 0; h < 0x10000; h++) { /* narrowing inverts widening for every non-NaN */
        float f = moeq_f16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(moeq_f32_to_f16(f), h);
    }
    assert_int_equal(moeq_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie → even */
    assert_int_equal(moeq_f32_to_f16(70000.0f), 0x7c00);
}

static void f8_e4m3fn_widening_gives_known_values(void **state) {
    (void)state;
    assert_true(moeq_f8_e4m3_to_f32(0x00) == 0.0f);
    assert_true(moeq_f8_e4m3_to_f32(0x01) == 0x1p-9f);     /* smallest subnormal */
    assert_true(moeq_f8_e4m3_to_f32(0x07) == 7 * 0x1p-9f); /* largest subnormal */
    assert_true(moeq_f8_e4m3_to_f32(0x08) == 0x1p-6f);     /* smallest normal */
    assert_true(moeq_f8_e4m3_to_f32(0x38) == 1.0f);
    assert_true(moeq_f8_e4m3_to_f32(0x3c) == 1.5f);
    assert_true(moeq_f8_e4m3_to_f32(0x40) == 2.0f);
    assert_true(moeq_f8_e4m3_to_f32(0x77) == 240.0f);
    assert_true(moeq_f8_e4m3_to_f32(0x7e) == 448.0f); /* max: no inf in E4M3FN */
    assert_true(moeq_f8_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(moeq_f8_e4m3_to_f32(0xb8) == -1.0f);
    assert_true(isnan(moeq_f8_e4m3_to_f32(0x7f)));
    assert_true(isnan(moeq_f8_e4m3_to_f32(0xff)));
    uint8_t in[2] = {0x38, 0xc0};
    float out[2];
    moeq_f8_e4m3_to_f32_row(in, 0.25f, out, 2);
    assert_true(out[0] == 0.25f && out[1] == -0.5f);
}

/* The narrowing by search: the nearest of the decoded codes 0..126, ties to the even code, saturating. */
static uint8_t f8_by_search(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    int best = 0;
    for (int c = 1; c <= 126; c++) {
        float dc = fabsf(moeq_f8_e4m3_to_f32((uint8_t)c) - a), db = fabsf(moeq_f8_e4m3_to_f32((uint8_t)best) - a);
        if (dc < db || (dc == db && !(c & 1))) best = c;
    }
    return sign | (uint8_t)best;
}

/* The bit-arithmetic narrowing equals the search at every code, every midpoint between codes and one float
 * either side of it, and on a million random floats over the whole range (and past 448). */
static void f8_narrowing_equals_a_search_of_the_codes(void **state) {
    (void)state;
    for (int c = 0; c < 126; c++) {
        float lo = moeq_f8_e4m3_to_f32((uint8_t)c), hi = moeq_f8_e4m3_to_f32((uint8_t)(c + 1)), mid = (lo + hi) / 2;
        float probes[] = {lo, hi, mid, nextafterf(mid, 0.0f), nextafterf(mid, 1e9f), -mid, -nextafterf(mid, 1e9f)};
        for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
            assert_int_equal(moeq_f32_to_f8_e4m3(probes[i]), f8_by_search(probes[i]));
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float f = ldexpf((float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f, (int)(x % 30) - 20);
        uint8_t want = f8_by_search(f);
        if (moeq_f32_to_f8_e4m3(f) != want) fail_msg("%a: %#x, the search says %#x", (double)f, moeq_f32_to_f8_e4m3(f), want);
    }
}

static void f8_narrowing_rounds_to_nearest_even_and_saturates(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        if (b == 0x7f || b == 0xff || b == 0x80) continue;
        assert_int_equal(moeq_f32_to_f8_e4m3(moeq_f8_e4m3_to_f32((uint8_t)b)), b);
    }
    assert_int_equal(moeq_f32_to_f8_e4m3(1.0625f), 0x38); /* halfway 1.0 / 1.125 → even */
    assert_int_equal(moeq_f32_to_f8_e4m3(1.1875f), 0x3a); /* halfway 1.125 / 1.25 → even */
    assert_int_equal(moeq_f32_to_f8_e4m3(1.05f), 0x38);
    assert_int_equal(moeq_f32_to_f8_e4m3(1.07f), 0x39);
    assert_int_equal(moeq_f32_to_f8_e4m3(1000.0f), 0x7e);
    assert_int_equal(moeq_f32_to_f8_e4m3(-1000.0f), 0xfe);
    assert_int_equal(moeq_f32_to_f8_e4m3(0x1p-11f), 0x00); /* below half the smallest subnormal */
}

static void f8_rows_apply_the_block_scale_of_their_block(void **state) {
    (void)state;
    /* a 2 x 130 weight: columns 0..127 in block 0, 128..129 in block 1 */
    uint8_t q[260];
    float scales[2] = {0.5f, 4.0f}, out[260];
    for (int i = 0; i < 260; i++) q[i] = 0x38; /* 1.0 */
    moeq_tensor s = {.name = "w_scale_inv", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {1, 2}, .data = scales};
    moeq_tensor w = {.name = "w", .dtype = MOEQ_DTYPE_F8_E4M3, .ndim = 2, .shape = {2, 130}, .data = q,
                     .scale_inv = &s};
    moeq_tensor_rows_to_f32(&w, 0, 2, out);
    assert_true(out[0] == 0.5f && out[127] == 0.5f && out[128] == 4.0f && out[129] == 4.0f);
    assert_true(out[130] == 0.5f && out[259] == 4.0f);
    moeq_tensor_rows_to_f32(&w, 1, 1, out);
    assert_true(out[0] == 0.5f && out[129] == 4.0f);
}

static void dtype_names_and_sizes_follow_safetensors(void **state) {
    (void)state;
    moeq_dtype d;
    assert_int_equal(moeq_dtype_from_name("F8_E4M3", &d), 0);
    assert_int_equal(d, MOEQ_DTYPE_F8_E4M3);
    assert_int_equal(moeq_dtype_size(MOEQ_DTYPE_BF16), 2);
    assert_string_equal(moeq_dtype_name(MOEQ_DTYPE_F16), "F16");
    assert_int_equal(moeq_dtype_from_name("F8_E5M2", &d), -1);
    assert_int_equal(moeq_dtype_from_name("I64", &d), -1);
}

/* ---- config.json ---------------------------------------------------------- */

static const char deepseek_v3_config[] =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"auto_map\": {\"AutoConfig\": \"configuration_deepseek.DeepseekV3Config\"}, \"bos_token_id\": 0,"
    " \"eos_token_id\": 1, \"ep_size\": 1, \"first_k_dense_replace\": 3, \"hidden_act\": \"silu\","
    " \"hidden_size\": 7168, \"initializer_range\": 0.02, \"intermediate_size\": 18432, \"kv_lora_rank\": 512,"
    " \"max_position_embeddings\": 163840, \"model_type\": \"deepseek_v3\", \"moe_intermediate_size\": 2048,"
    " \"moe_layer_freq\": 1, \"n_group\": 8, \"n_routed_experts\": 256, \"n_shared_experts\": 1,"
    " \"norm_topk_prob\": true, \"num_attention_heads\": 128, \"num_experts_per_tok\": 8,"
    " \"num_hidden_layers\": 61, \"num_key_value_heads\": 128, \"num_nextn_predict_layers\": 1,"
    " \"q_lora_rank\": 1536, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\","
    " \"weight_block_size\": [128, 128]}, \"rms_norm_eps\": 1e-06, \"rope_scaling\": {\"beta_fast\": 32,"
    " \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
    " \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"rope_theta\": 10000,"
    " \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\", \"tie_word_embeddings\": false,"
    " \"topk_group\": 4, \"topk_method\": \"noaux_tc\", \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.33.1\", \"use_cache\": true, \"v_head_dim\": 128, \"vocab_size\": 129280}";

static const char deepseek_v2_lite_config[] =
    "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"aux_loss_alpha\": 0.001, \"bos_token_id\": 100000,"
    " \"eos_token_id\": 100001, \"first_k_dense_replace\": 1, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
    " \"intermediate_size\": 10944, \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840,"
    " \"model_type\": \"deepseek_v2\", \"moe_intermediate_size\": 1408, \"moe_layer_freq\": 1, \"n_group\": 1,"
    " \"n_routed_experts\": 64, \"n_shared_experts\": 2, \"norm_topk_prob\": false, \"num_attention_heads\": 16,"
    " \"num_experts_per_tok\": 6, \"num_hidden_layers\": 27, \"num_key_value_heads\": 16, \"pretraining_tp\": 1,"
    " \"q_lora_rank\": null, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 0.707,"
    " \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"rope_theta\": 10000, \"routed_scaling_factor\": 1.0, \"scoring_func\": \"softmax\", \"seq_aux\": true,"
    " \"tie_word_embeddings\": false, \"topk_group\": 1, \"topk_method\": \"greedy\", \"v_head_dim\": 128,"
    " \"vocab_size\": 102400}";

static moeq_err parse(const char *json, moeq_model_config *c, char *errstr) {
    return moeq_model_config_parse(json, strlen(json), c, errstr, 256);
}

static void deepseek_v3_config_parses_with_every_field(void **state) {
    (void)state;
    moeq_model_config c;
    char errstr[256] = "";
    assert_int_equal(parse(deepseek_v3_config, &c, errstr), MOEQ_OK);
    assert_string_equal(c.model_type, "deepseek_v3");
    assert_int_equal(c.vocab_size, 129280);
    assert_int_equal(c.hidden_size, 7168);
    assert_int_equal(c.n_routed_experts, 256);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.n_group, 8);
    assert_int_equal(c.topk_group, 4);
    assert_int_equal(c.q_lora_rank, 1536);
    assert_int_equal(c.first_k_dense_replace, 3);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_true(c.routed_scaling_factor == 2.5);
    assert_string_equal(c.scoring_func, "sigmoid");
    assert_string_equal(c.topk_method, "noaux_tc");
    assert_string_equal(c.rope_scaling_type, "yarn");
    assert_true(c.rope_factor == 40.0);
    assert_int_equal(c.rope_original_max_position_embeddings, 4096);
    assert_true(c.rope_mscale_all_dim == 1.0);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_int_equal(c.num_nextn_predict_layers, 1);
}

static void deepseek_v2_lite_config_parses_with_null_q_lora_rank(void **state) {
    (void)state;
    moeq_model_config c;
    char errstr[256] = "";
    assert_int_equal(parse(deepseek_v2_lite_config, &c, errstr), MOEQ_OK);
    assert_string_equal(c.model_type, "deepseek_v2");
    assert_int_equal(c.q_lora_rank, 0);
    assert_string_equal(c.scoring_func, "softmax");
    assert_string_equal(c.topk_method, "greedy");
    assert_int_equal(c.n_shared_experts, 2);
    assert_int_equal(c.norm_topk_prob, 0);
    assert_true(c.rope_mscale == 0.707);
    assert_int_equal(c.num_nextn_predict_layers, 0);
    assert_int_equal(c.bos_token_id, 100000);
}

static void absent_keys_take_the_hf_defaults_of_their_model_type(void **state) {
    (void)state;
    moeq_model_config c;
    char errstr[256] = "";
    assert_int_equal(parse("{\"model_type\": \"deepseek_v3\"}", &c, errstr), MOEQ_OK);
    assert_int_equal(c.hidden_size, 7168);
    assert_int_equal(c.num_hidden_layers, 61);
    assert_int_equal(c.max_position_embeddings, 4096);
    assert_string_equal(c.topk_method, "noaux_tc");
    assert_int_equal(c.rope_scaling_type[0], 0);
    assert_true(c.rope_factor == 1.0);
    assert_int_equal(parse("{\"model_type\": \"deepseek_v2\", \"topk_method\": \"gready\"}", &c, errstr), MOEQ_OK);
    assert_int_equal(c.n_routed_experts, 0); /* V2's default is a dense model */
    assert_string_equal(c.topk_method, "greedy");
    assert_string_equal(c.scoring_func, "softmax");
    assert_int_equal(c.max_position_embeddings, 2048);
}

static void an_unsupported_model_type_is_named(void **state) {
    (void)state;
    moeq_model_config c;
    char errstr[256] = "";
    assert_int_equal(parse("{\"model_type\": \"llama\"}", &c, errstr), MOEQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(errstr, "llama"));
    assert_int_equal(parse("{\"hidden_size\": 64}", &c, errstr), MOEQ_ERR_FORMAT);
    assert_non_null(strstr(errstr, "model_type"));
}

typedef struct bad_config {
    const char *json;
    moeq_err err;
    const char *names;
} bad_config;

static void bad_config_values_are_rejected_naming_the_key(void **state) {
    (void)state;
    static const bad_config cases[] = {
        {"{\"model_type\": \"deepseek_v3\", \"hidden_size\": 0}", MOEQ_ERR_INVALID_ARG, "hidden_size"},
        {"{\"model_type\": \"deepseek_v3\", \"hidden_size\": \"big\"}", MOEQ_ERR_FORMAT, "hidden_size"},
        {"{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 2.5}", MOEQ_ERR_FORMAT, "num_hidden_layers"},
        {"{\"model_type\": \"deepseek_v3\", \"vocab_size\": -5}", MOEQ_ERR_INVALID_ARG, "vocab_size"},
        {"{\"model_type\": \"deepseek_v3\", \"topk_group\": 9}", MOEQ_ERR_INVALID_ARG, "topk_group"},
        {"{\"model_type\": \"deepseek_v3\", \"n_routed_experts\": 250}", MOEQ_ERR_INVALID_ARG, "n_group"},
        {"{\"model_type\": \"deepseek_v3\", \"num_experts_per_tok\": 300}", MOEQ_ERR_INVALID_ARG,
         "num_experts_per_tok"},
        {"{\"model_type\": \"deepseek_v3\", \"qk_rope_head_dim\": 7}", MOEQ_ERR_INVALID_ARG, "qk_rope_head_dim"},
        {"{\"model_type\": \"deepseek_v3\", \"rms_norm_eps\": 0}", MOEQ_ERR_INVALID_ARG, "rms_norm_eps"},
        {"{\"model_type\": \"deepseek_v3\", \"norm_topk_prob\": 1}", MOEQ_ERR_FORMAT, "norm_topk_prob"},
        {"{\"model_type\": \"deepseek_v3\", \"kv_lora_rank\": null}", MOEQ_ERR_FORMAT, "kv_lora_rank"},
        {"{\"model_type\": \"deepseek_v3\", \"scoring_func\": \"relu\"}", MOEQ_ERR_UNSUPPORTED, "scoring_func"},
        {"{\"model_type\": \"deepseek_v3\", \"topk_method\": \"random\"}", MOEQ_ERR_UNSUPPORTED, "topk_method"},
        {"{\"model_type\": \"deepseek_v3\", \"hidden_act\": \"gelu\"}", MOEQ_ERR_UNSUPPORTED, "hidden_act"},
        {"{\"model_type\": \"deepseek_v3\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}",
         MOEQ_ERR_UNSUPPORTED, "rope_scaling"},
        {"{\"model_type\": \"deepseek_v3\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0.5}}",
         MOEQ_ERR_INVALID_ARG, "rope_scaling.factor"},
        {"{\"model_type\": \"deepseek_v3\", \"eos_token_id\": 200000}", MOEQ_ERR_INVALID_ARG, "eos_token_id"},
        {"{\"model_type\": \"deepseek_v3\"", MOEQ_ERR_PARSE, "config.json"},
        {"[1, 2]", MOEQ_ERR_PARSE, "config.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        moeq_model_config c;
        char errstr[256] = "";
        moeq_err err = parse(cases[i].json, &c, errstr);
        if (err != cases[i].err || !strstr(errstr, cases[i].names))
            fail_msg("case %zu (%s): got %s '%s', want %s naming %s", i, cases[i].json, moeq_err_str(err), errstr,
                     moeq_err_str(cases[i].err), cases[i].names);
    }
}

/* ---- safetensors headers -------------------------------------------------- */

/* A file image: 8-byte length, header, then data_len bytes of data. */
static uint8_t *image(const char *header, size_t data_len, size_t *size) {
    size_t hlen = strlen(header);
    *size = 8 + hlen + data_len;
    uint8_t *buf = calloc(1, *size);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, header, hlen);
    return buf;
}

static moeq_err parse_image(const char *header, size_t data_len, char *errstr, moeq_tensor **t, int *n) {
    size_t size;
    uint8_t *buf = image(header, data_len, &size);
    char *meta = NULL;
    moeq_err err = moeq_safetensors_parse(buf, size, "x.safetensors", t, n, &meta, errstr, 256);
    free(meta);
    free(buf);
    return err;
}

static void a_valid_header_yields_tensors_and_keeps_metadata(void **state) {
    (void)state;
    const char *h = "{\"__metadata__\": {\"format\": \"pt\"}, \"a\": {\"dtype\": \"BF16\", \"shape\": [2, 3],"
                    " \"data_offsets\": [0, 12]}, \"b\": {\"dtype\": \"F8_E4M3\", \"shape\": [4],"
                    " \"data_offsets\": [12, 16]}}";
    size_t size;
    uint8_t *buf = image(h, 16, &size);
    moeq_tensor *t = NULL;
    int n = 0;
    char *meta = NULL, errstr[256] = "";
    assert_int_equal(moeq_safetensors_parse(buf, size, "x", &t, &n, &meta, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(n, 2);
    assert_string_equal(t[0].name, "a");
    assert_int_equal(t[0].dtype, MOEQ_DTYPE_BF16);
    assert_int_equal(t[0].shape[1], 3);
    assert_ptr_equal(t[0].data, buf + 8 + strlen(h));
    assert_ptr_equal(t[1].data, buf + 8 + strlen(h) + 12);
    assert_non_null(meta);
    assert_non_null(strstr(meta, "\"pt\""));
    moeq_safetensors_free_tensors(t, n);
    free(meta);
    free(buf);
}

typedef struct bad_header {
    const char *header;
    size_t data_len;
    moeq_err err;
    const char *names;
} bad_header;

static void bad_headers_are_rejected_naming_file_and_tensor(void **state) {
    (void)state;
    static const bad_header cases[] = {
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8, MOEQ_ERR_PARSE, "x.safetensors"},
        {"{\"a\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8, MOEQ_ERR_UNSUPPORTED, "I64"},
        {"{\"a\": {\"dtype\": \"F8_E5M2\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, MOEQ_ERR_UNSUPPORTED,
         "'a'"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, MOEQ_ERR_FORMAT, "truncated"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", 16, MOEQ_ERR_FORMAT, "'a'"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"b\": {\"dtype\": \"F32\","
         " \"shape\": [2], \"data_offsets\": [4, 12]}}",
         12, MOEQ_ERR_FORMAT, "overlap"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8, MOEQ_ERR_PARSE, "shape"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8, MOEQ_ERR_PARSE,
         "data_offsets"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4, MOEQ_ERR_UNSUPPORTED,
         "dimensions"},
        {"{\"a\": 5}", 0, MOEQ_ERR_PARSE, "'a'"},
        {"[]", 0, MOEQ_ERR_PARSE, "JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        moeq_tensor *t = NULL;
        int n = 0;
        char errstr[256] = "";
        moeq_err err = parse_image(cases[i].header, cases[i].data_len, errstr, &t, &n);
        if (err != cases[i].err || !strstr(errstr, cases[i].names) || !strstr(errstr, "x.safetensors"))
            fail_msg("case %zu: got %s '%s', want %s naming %s", i, moeq_err_str(err), errstr,
                     moeq_err_str(cases[i].err), cases[i].names);
        assert_null(t);
    }
}

static void a_header_length_past_the_end_of_the_file_is_rejected(void **state) {
    (void)state;
    uint8_t buf[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
    moeq_tensor *t = NULL;
    int n = 0;
    char *meta = NULL, errstr[256] = "";
    assert_int_equal(moeq_safetensors_parse(buf, sizeof buf, "x.safetensors", &t, &n, &meta, errstr, sizeof errstr),
                     MOEQ_ERR_PARSE);
    assert_non_null(strstr(errstr, "past the end"));
    assert_int_equal(moeq_safetensors_parse(buf, 5, "x.safetensors", &t, &n, &meta, errstr, sizeof errstr),
                     MOEQ_ERR_PARSE);
    assert_non_null(strstr(errstr, "too short"));
    buf[0] = 9, buf[1] = buf[2] = buf[3] = 0; /* one byte past */
    assert_int_equal(moeq_safetensors_parse(buf, sizeof buf, "x.safetensors", &t, &n, &meta, errstr, sizeof errstr),
                     MOEQ_ERR_PARSE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_widening_gives_known_values),
        cmocka_unit_test(bf16_narrowing_rounds_to_nearest_even),
        cmocka_unit_test(f16_conversions_give_known_values),
        cmocka_unit_test(f8_e4m3fn_widening_gives_known_values),
        cmocka_unit_test(f8_narrowing_rounds_to_nearest_even_and_saturates),
        cmocka_unit_test(f8_narrowing_equals_a_search_of_the_codes),
        cmocka_unit_test(f8_rows_apply_the_block_scale_of_their_block),
        cmocka_unit_test(dtype_names_and_sizes_follow_safetensors),
        cmocka_unit_test(deepseek_v3_config_parses_with_every_field),
        cmocka_unit_test(deepseek_v2_lite_config_parses_with_null_q_lora_rank),
        cmocka_unit_test(absent_keys_take_the_hf_defaults_of_their_model_type),
        cmocka_unit_test(an_unsupported_model_type_is_named),
        cmocka_unit_test(bad_config_values_are_rejected_naming_the_key),
        cmocka_unit_test(a_valid_header_yields_tensors_and_keeps_metadata),
        cmocka_unit_test(bad_headers_are_rejected_naming_file_and_tensor),
        cmocka_unit_test(a_header_length_past_the_end_of_the_file_is_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
