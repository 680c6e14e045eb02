/*
 * test_model_load.c — load checkpoints written by gen-model into a temp dir:
 * every preset binds with the right shapes, sharded and single-file agree,
 * BF16/F16/F8 dequantise to the F32 checkpoint's values within each format's
 * rounding, and every deliberately broken checkpoint fails with its error
 * code and a message naming the culprit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "moeq/genmodel.h"
#include "moeq/util.h"

static char root_dir[256];

/* ---- helpers -------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Write preset (dtype, shards) into root_dir/name; returns the path (static buffer per call site). */
static void gen(const char *name, const char *preset, moeq_genmodel_dtype dtype, int n_shards, char *dir,
                size_t dir_size) {
    snprintf(dir, dir_size, "%s/%s", root_dir, name);
    moeq_model_config config;
    moeq_genmodel_params params = moeq_genmodel_default_params();
    char errstr[256] = "";
    assert_int_equal(moeq_genmodel_preset(preset, &config, &params.min_shards, errstr, sizeof errstr), MOEQ_OK);
    params.dtype = dtype;
    params.n_shards = n_shards;
    params.write_tokenizer = 0;
    moeq_err err = moeq_genmodel_write(dir, &config, &params, NULL, errstr, sizeof errstr);
    if (err) fail_msg("gen %s: %s", name, errstr);
}

static moeq_model *load_ok(const char *dir) {
    moeq_model *model = NULL;
    char errstr[512] = "";
    moeq_err err = moeq_model_load(dir, NULL, &model, errstr, sizeof errstr);
    if (err) fail_msg("load %s: %s (%s)", dir, errstr, moeq_err_str(err));
    return model;
}

static void expect_shape(const moeq_tensor *t, int64_t d0, int64_t d1) {
    assert_non_null(t);
    if (d1) {
        assert_int_equal(t->ndim, 2);
        assert_int_equal(t->shape[1], d1);
    } else {
        assert_int_equal(t->ndim, 1);
    }
    assert_int_equal(t->shape[0], d0);
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(root_dir, sizeof root_dir, "%s/moeq-model-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(root_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    rm_tree(root_dir);
    return 0;
}

/* ---- good checkpoints ----------------------------------------------------- */

static void the_tiny_preset_loads_with_every_tensor_bound_to_its_shape(void **state) {
    (void)state;
    char dir[512];
    gen("tiny", "tiny", MOEQ_GENMODEL_BF16, 0, dir, sizeof dir);
    moeq_model *model = load_ok(dir);
    const moeq_model_config *c = moeq_model_get_config(model);
    assert_string_equal(c->model_type, "deepseek_v3");
    assert_int_equal(model->n_files, 2);
    expect_shape(model->embed_tokens, 1024, 64);
    expect_shape(model->lm_head, 1024, 64);
    assert_ptr_not_equal(model->lm_head, model->embed_tokens);
    expect_shape(model->norm, 64, 0);
    assert_int_equal(model->layers[0].is_moe, 0);
    expect_shape(model->layers[0].mlp.gate_proj, 128, 64);
    expect_shape(model->layers[0].mlp.down_proj, 64, 128);
    for (int i = 1; i < 3; i++) {
        const moeq_layer *l = &model->layers[i];
        assert_int_equal(l->is_moe, 1);
        assert_null(l->q_proj);
        expect_shape(l->q_a_proj, 32, 64);
        expect_shape(l->q_a_layernorm, 32, 0);
        expect_shape(l->q_b_proj, 4 * 24, 32);
        expect_shape(l->kv_a_proj_with_mqa, 32 + 8, 64);
        expect_shape(l->kv_a_layernorm, 32, 0);
        expect_shape(l->kv_b_proj, 4 * (16 + 16), 32);
        expect_shape(l->o_proj, 64, 4 * 16);
        expect_shape(l->gate, 16, 64);
        expect_shape(l->e_score_correction_bias, 16, 0);
        assert_int_equal(l->e_score_correction_bias->dtype, MOEQ_DTYPE_F32);
        expect_shape(l->experts[15].up_proj, 32, 64);
        expect_shape(l->experts[15].down_proj, 64, 32);
        expect_shape(l->shared.gate_proj, 32, 64);
        assert_null(l->mlp.gate_proj);
    }
    assert_int_equal(model->n_mtp_layers, 1);
    const moeq_layer *mtp = &model->mtp_layers[0];
    assert_int_equal(mtp->is_moe, 1);
    expect_shape(mtp->eh_proj, 64, 128);
    expect_shape(mtp->enorm, 64, 0);
    expect_shape(mtp->shared_head_head, 1024, 64);
    expect_shape(mtp->experts[3].gate_proj, 32, 64);
    assert_ptr_equal(moeq_model_find_tensor(model, "model.layers.3.enorm.weight"), mtp->enorm);
    assert_null(moeq_model_find_tensor(model, "model.layers.4.enorm.weight"));
    assert_int_equal(moeq_model_total_params(model), 414880); /* 675888 stored, less the MTP module */
    assert_true(moeq_model_active_bytes_per_token(model) > 0);
    moeq_model_destroy(model);
}

static void the_tiny_v2_preset_binds_q_proj_and_no_correction_bias(void **state) {
    (void)state;
    char dir[512];
    gen("tiny-v2", "tiny-v2", MOEQ_GENMODEL_BF16, 0, dir, sizeof dir);
    moeq_model *model = load_ok(dir);
    const moeq_model_config *c = moeq_model_get_config(model);
    assert_string_equal(c->model_type, "deepseek_v2");
    assert_int_equal(c->q_lora_rank, 0);
    assert_string_equal(c->topk_method, "group_limited_greedy");
    const moeq_layer *l = &model->layers[2];
    expect_shape(l->q_proj, 4 * 24, 64);
    assert_null(l->q_a_proj);
    assert_null(l->e_score_correction_bias);
    expect_shape(l->shared.gate_proj, 2 * 32, 64); /* two shared experts, fused */
    assert_int_equal(model->n_mtp_layers, 0);
    moeq_model_destroy(model);
}

static void the_small_preset_loads_with_the_real_vocabulary(void **state) {
    (void)state;
    char dir[512];
    gen("small", "small", MOEQ_GENMODEL_BF16, 0, dir, sizeof dir);
    moeq_model *model = load_ok(dir);
    const moeq_model_config *c = moeq_model_get_config(model);
    assert_int_equal(c->vocab_size, 129280);
    assert_true(c->rope_factor == 40.0);
    expect_shape(model->lm_head, 129280, 256);
    expect_shape(model->layers[3].experts[31].down_proj, 256, 64);
    assert_int_equal(model->n_mtp_layers, 1);
    moeq_model_destroy(model);
    rm_tree(dir);
}

static void sharded_and_single_file_checkpoints_hold_the_same_bytes(void **state) {
    (void)state;
    char sharded[512], single[512];
    gen("shards3", "tiny", MOEQ_GENMODEL_BF16, 3, sharded, sizeof sharded);
    gen("single", "tiny", MOEQ_GENMODEL_BF16, 1, single, sizeof single);
    moeq_model *a = load_ok(sharded), *b = load_ok(single);
    assert_int_equal(a->n_files, 3);
    assert_int_equal(b->n_files, 1);
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        const moeq_tensor *ta = &a->tensors[i], *tb = moeq_model_find_tensor(b, ta->name);
        assert_non_null(tb);
        assert_int_equal(ta->nbytes, tb->nbytes);
        assert_memory_equal(ta->data, tb->data, ta->nbytes);
    }
    moeq_model_destroy(a);
    moeq_model_destroy(b);
}

static void the_same_seed_writes_the_same_bytes_and_another_seed_does_not(void **state) {
    (void)state;
    char d1[512], d2[512], d3[512];
    gen("seed-a", "tiny", MOEQ_GENMODEL_F8, 1, d1, sizeof d1);
    gen("seed-b", "tiny", MOEQ_GENMODEL_F8, 1, d2, sizeof d2);
    snprintf(d3, sizeof d3, "%s/seed-c", root_dir);
    moeq_model_config config;
    moeq_genmodel_params params = moeq_genmodel_default_params();
    moeq_genmodel_preset("tiny", &config, NULL, NULL, 0);
    params.seed = 2, params.dtype = MOEQ_GENMODEL_F8, params.n_shards = 1, params.write_tokenizer = 0;
    assert_int_equal(moeq_genmodel_write(d3, &config, &params, NULL, NULL, 0), MOEQ_OK);
    char p1[600], p2[600], p3[600];
    snprintf(p1, sizeof p1, "%s/model.safetensors", d1);
    snprintf(p2, sizeof p2, "%s/model.safetensors", d2);
    snprintf(p3, sizeof p3, "%s/model.safetensors", d3);
    char *a = NULL, *b = NULL, *c = NULL;
    size_t na = 0, nb = 0, nc = 0;
    assert_int_equal(moeq_read_file(p1, 1 << 26, &a, &na, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_read_file(p2, 1 << 26, &b, &nb, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_read_file(p3, 1 << 26, &c, &nc, NULL, 0), MOEQ_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    assert_int_equal(na, nc);
    assert_true(memcmp(a, c, na) != 0);
    free(a), free(b), free(c);
}

static void mtp_layers_can_be_skipped_at_load(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny", root_dir);
    moeq_model_params params = moeq_model_default_params();
    params.load_mtp = 0;
    moeq_model *model = NULL;
    char errstr[512] = "";
    assert_int_equal(moeq_model_load(dir, &params, &model, errstr, sizeof errstr), MOEQ_OK);
    assert_int_equal(model->n_mtp_layers, 0);
    moeq_model_destroy(model);
}

/* ---- dequantisation ------------------------------------------------------- */

typedef struct tolerance {
    double rel;      /* of |value|                        */
    double abs_f8;   /* times the block scale (F8 only)    */
    double abs;      /* absolute floor (F16 subnormals)    */
} tolerance;

/* Every weight of `model` widened to f32 matches the generator's values within tol. */
static void compare_with_source(const moeq_model *model, const moeq_model *ref, tolerance tol) {
    const moeq_model_config *c = moeq_model_get_config(model);
    int checked = 0;
    for (int i = 0; i < ref->n_tensors; i++) {
        const moeq_tensor *r = &ref->tensors[i], *t = moeq_model_find_tensor(model, r->name);
        assert_non_null(t);
        int64_t rows = moeq_tensor_rows(r), cols = moeq_tensor_cols(r);
        float *want = malloc((size_t)(rows * cols) * 4), *got = malloc((size_t)(rows * cols) * 4);
        float *src = malloc((size_t)(rows * cols) * 4);
        moeq_tensor_rows_to_f32(r, 0, rows, want);
        moeq_tensor_rows_to_f32(t, 0, rows, got);
        assert_int_equal(moeq_genmodel_values(c, 1, r->name, 0, rows, src), MOEQ_OK);
        assert_memory_equal(want, src, (size_t)(rows * cols) * 4); /* the F32 checkpoint is the source, exactly */
        for (int64_t k = 0; k < rows * cols; k++) {
            double scale = 0;
            if (t->dtype == MOEQ_DTYPE_F8_E4M3) {
                int64_t sc = (cols + 127) / 128;
                scale = ((const float *)t->scale_inv->data)[(k / cols) / 128 * sc + (k % cols) / 128];
            }
            double bound = tol.rel * fabs(want[k]) + tol.abs_f8 * scale + tol.abs;
            if (t->dtype == MOEQ_DTYPE_BF16) bound = 0x1p-8 * fabs(want[k]); /* BF16 tensors of an F8 model */
            if (t->dtype == MOEQ_DTYPE_F32) bound = 0;
            if (fabs((double)got[k] - want[k]) > bound)
                fail_msg("%s[%lld]: %.9g vs %.9g (bound %.3g, %s)", r->name, (long long)k, got[k], want[k], bound,
                         moeq_dtype_name(t->dtype));
        }
        free(want), free(got), free(src);
        checked++;
    }
    assert_true(checked > 100);
}

static void bf16_f16_and_f8_checkpoints_dequantise_to_the_f32_values(void **state) {
    (void)state;
    char d32[512], d16[512], dh[512], d8[512];
    gen("deq-f32", "tiny", MOEQ_GENMODEL_F32, 0, d32, sizeof d32);
    gen("deq-bf16", "tiny", MOEQ_GENMODEL_BF16, 0, d16, sizeof d16);
    gen("deq-f16", "tiny", MOEQ_GENMODEL_F16, 0, dh, sizeof dh);
    gen("deq-f8", "tiny", MOEQ_GENMODEL_F8, 0, d8, sizeof d8);
    moeq_model *ref = load_ok(d32), *bf16 = load_ok(d16), *f16 = load_ok(dh), *f8 = load_ok(d8);
    compare_with_source(bf16, ref, (tolerance){0x1p-8, 0, 0});        /* half a BF16 ulp */
    compare_with_source(f16, ref, (tolerance){0x1p-11, 0, 0x1p-25});  /* half an F16 ulp */
    compare_with_source(f8, ref, (tolerance){0x1p-4, 0x1p-10, 1e-9}); /* half an E4M3 ulp, subnormals */
    assert_int_equal(f8->layers[1].experts[0].gate_proj->dtype, MOEQ_DTYPE_F8_E4M3);
    assert_int_equal(f8->layers[1].gate->dtype, MOEQ_DTYPE_BF16);
    assert_int_equal(f8->embed_tokens->dtype, MOEQ_DTYPE_BF16);
    assert_int_equal(f8->layers[1].input_layernorm->dtype, MOEQ_DTYPE_BF16);
    expect_shape(f8->layers[0].mlp.gate_proj->scale_inv, 1, 1);
    moeq_model_destroy(ref), moeq_model_destroy(bf16), moeq_model_destroy(f16), moeq_model_destroy(f8);
}

/* ---- broken checkpoints --------------------------------------------------- */

typedef void (*json_edit)(cJSON *root);

/* The JSON header's length: the file's first 8 bytes, little-endian. */
static uint64_t safetensors_header_len(const char *file_bytes) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (uint8_t)file_bytes[i];
    return hlen;
}

/* Rewrite dir/file's safetensors header through edit (data bytes kept; offsets are relative to them). */
static void edit_header(const char *dir, const char *file, json_edit edit) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(moeq_read_file(path, 1 << 26, &buf, &len, NULL, 0), MOEQ_OK);
    uint64_t hlen = safetensors_header_len(buf);
    cJSON *root = cJSON_ParseWithLength(buf + 8, (size_t)hlen);
    assert_non_null(root);
    edit(root);
    char *header = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t n = strlen(header);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)n >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(header, 1, n, f);
    fwrite(buf + 8 + hlen, 1, len - 8 - hlen, f);
    fclose(f);
    free(header);
    free(buf);
}

static void edit_json_file(const char *dir, const char *file, json_edit edit) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(moeq_read_file(path, 1 << 26, &buf, &len, NULL, 0), MOEQ_OK);
    cJSON *root = cJSON_ParseWithLength(buf, len);
    assert_non_null(root);
    edit(root);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
    free(text);
    free(buf);
}

static void expect_load_error(const char *dir, moeq_err want, const char *needle1, const char *needle2) {
    moeq_model *model = NULL;
    char errstr[512] = "";
    moeq_err err = moeq_model_load(dir, NULL, &model, errstr, sizeof errstr);
    assert_null(model);
    if (err != want || !strstr(errstr, needle1) || (needle2 && !strstr(errstr, needle2)))
        fail_msg("got %s '%s', want %s naming '%s' and '%s'", moeq_err_str(err), errstr, moeq_err_str(want), needle1,
                 needle2 ? needle2 : "");
}

#define O_PROJ "model.layers.1.self_attn.o_proj.weight"
#define UP_PROJ "model.layers.0.mlp.up_proj.weight"

static void drop_o_proj(cJSON *root) { cJSON_DeleteItemFromObjectCaseSensitive(root, O_PROJ); }

static void add_bogus_tensor(cJSON *root) {
    cJSON *e = cJSON_AddObjectToObject(root, "model.layers.1.mlp.bogus.weight");
    cJSON_AddStringToObject(e, "dtype", "F32");
    double shape[1] = {0}, offsets[2] = {0, 0};
    cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shape, 1));
    cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(offsets, 2));
}

static void transpose_up_proj(cJSON *root) {
    double shape[2] = {64, 128};
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, UP_PROJ), "shape",
                                           cJSON_CreateDoubleArray(shape, 2));
}

static const char *retype_to;
static void retype_o_proj(cJSON *root) {
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, O_PROJ), "dtype",
                                           cJSON_CreateString(retype_to));
}

static void drop_a_scale(cJSON *root) { cJSON_DeleteItemFromObjectCaseSensitive(root, O_PROJ "_scale_inv"); }

static void norm_as_f8(cJSON *root) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "model.norm.weight");
    double shape[1] = {128};
    cJSON_ReplaceItemInObjectCaseSensitive(e, "dtype", cJSON_CreateString("F8_E4M3"));
    cJSON_ReplaceItemInObjectCaseSensitive(e, "shape", cJSON_CreateDoubleArray(shape, 1));
}

static void a_missing_tensor_is_named(void **state) {
    (void)state;
    char dir[512];
    gen("bad-missing", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
    edit_header(dir, "model.safetensors", drop_o_proj);
    expect_load_error(dir, MOEQ_ERR_NOT_FOUND, O_PROJ, "missing");
}

static void an_extra_tensor_is_named_unless_verification_is_off(void **state) {
    (void)state;
    char dir[512];
    gen("bad-extra", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
    edit_header(dir, "model.safetensors", add_bogus_tensor);
    expect_load_error(dir, MOEQ_ERR_FORMAT, "model.layers.1.mlp.bogus.weight", "model.safetensors");
    moeq_model_params params = moeq_model_default_params();
    params.verify_tensors = 0;
    moeq_model *model = NULL;
    assert_int_equal(moeq_model_load(dir, &params, &model, NULL, 0), MOEQ_OK);
    moeq_model_destroy(model);
}

static void a_wrong_shape_names_the_tensor_and_both_shapes(void **state) {
    (void)state;
    char dir[512];
    gen("bad-shape", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
    edit_header(dir, "model.safetensors", transpose_up_proj);
    expect_load_error(dir, MOEQ_ERR_FORMAT, UP_PROJ, "[64, 128], expected [128, 64]");
}

static void a_truncated_file_names_the_file_and_the_tensor_cut_off(void **state) {
    (void)state;
    char dir[512], path[600];
    gen("bad-truncated", "tiny", MOEQ_GENMODEL_BF16, 2, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size - 100), 0);
    expect_load_error(dir, MOEQ_ERR_FORMAT, "model-00002-of-00002.safetensors", "truncated");
    assert_int_equal(truncate(path, 4), 0);
    expect_load_error(dir, MOEQ_ERR_PARSE, "model-00002-of-00002.safetensors", "too short");
}

static void write_at(const char *path, long offset, const void *bytes, size_t n) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, offset, SEEK_SET);
    fwrite(bytes, 1, n, f);
    fclose(f);
}

static void bad_header_json_and_a_header_past_eof_are_parse_errors(void **state) {
    (void)state;
    char dir[512], path[600];
    gen("bad-json", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_at(path, 9, "#", 1);
    expect_load_error(dir, MOEQ_ERR_PARSE, "model.safetensors", "JSON");
    gen("bad-hlen", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint8_t huge[8] = {0, 0, 0, 0x10, 0, 0, 0, 0}; /* 256 MiB */
    write_at(path, 0, huge, 8);
    expect_load_error(dir, MOEQ_ERR_PARSE, "model.safetensors", "past the end");
}

static void an_unknown_dtype_names_tensor_and_dtype(void **state) {
    (void)state;
    static const char *const dtypes[] = {"I64", "F8_E5M2", "F64", "BOOL"};
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        char dir[512];
        gen("bad-dtype", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
        retype_to = dtypes[i];
        edit_header(dir, "model.safetensors", retype_o_proj);
        expect_load_error(dir, MOEQ_ERR_UNSUPPORTED, O_PROJ, dtypes[i]);
    }
}

static void an_f8_weight_without_its_scale_and_an_f8_norm_are_rejected(void **state) {
    (void)state;
    char dir[512];
    gen("bad-scale", "tiny", MOEQ_GENMODEL_F8, 1, dir, sizeof dir);
    edit_header(dir, "model.safetensors", drop_a_scale);
    expect_load_error(dir, MOEQ_ERR_NOT_FOUND, O_PROJ "_scale_inv", NULL);
    gen("bad-f8norm", "tiny", MOEQ_GENMODEL_F8, 1, dir, sizeof dir);
    edit_header(dir, "model.safetensors", norm_as_f8);
    expect_load_error(dir, MOEQ_ERR_FORMAT, "model.norm.weight", NULL);
}

static void llama_model_type(cJSON *root) {
    cJSON_ReplaceItemInObjectCaseSensitive(root, "model_type", cJSON_CreateString("llama"));
}
static void topk_group_over_n_group(cJSON *root) {
    cJSON_ReplaceItemInObjectCaseSensitive(root, "topk_group", cJSON_CreateNumber(8));
}
static void more_layers_than_stored(cJSON *root) {
    cJSON_ReplaceItemInObjectCaseSensitive(root, "num_hidden_layers", cJSON_CreateNumber(5));
}
static void index_lists_a_ghost(cJSON *root) {
    cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(root, "weight_map"), "model.ghost.weight",
                            "model-00001-of-00002.safetensors");
}

/* dir/file must exist; it is removed. */
static void remove_file(const char *dir, const char *file) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    assert_int_equal(unlink(path), 0);
}

/* A tiny BF16 checkpoint whose config.json is edited, and the error its load must give. */
typedef struct config_case {
    const char *name; /* its directory under root_dir */
    json_edit edit;
    moeq_err want;
    const char *needle1, *needle2;
} config_case;

static void config_errors_name_the_key_or_model_type(void **state) {
    (void)state;
    static const config_case cases[] = {
        {"bad-type", llama_model_type, MOEQ_ERR_UNSUPPORTED, "llama", "config.json"},
        {"bad-topk", topk_group_over_n_group, MOEQ_ERR_INVALID_ARG, "topk_group", "config.json"},
        {"bad-layers", more_layers_than_stored, MOEQ_ERR_NOT_FOUND, "model.layers.4.input_layernorm.weight",
         "missing"},
    };
    char dir[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gen(cases[i].name, "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
        edit_json_file(dir, "config.json", cases[i].edit);
        expect_load_error(dir, cases[i].want, cases[i].needle1, cases[i].needle2);
    }
    gen("bad-noconfig", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
    remove_file(dir, "config.json");
    expect_load_error(dir, MOEQ_ERR_NOT_FOUND, "config.json", NULL);
}

static void missing_weights_and_index_ghosts_are_not_found(void **state) {
    (void)state;
    char dir[512];
    gen("bad-noweights", "tiny", MOEQ_GENMODEL_BF16, 1, dir, sizeof dir);
    remove_file(dir, "model.safetensors");
    expect_load_error(dir, MOEQ_ERR_NOT_FOUND, "model.safetensors", NULL);
    gen("bad-ghost", "tiny", MOEQ_GENMODEL_BF16, 2, dir, sizeof dir);
    edit_json_file(dir, "model.safetensors.index.json", index_lists_a_ghost);
    expect_load_error(dir, MOEQ_ERR_NOT_FOUND, "model.ghost.weight", "model-00001-of-00002.safetensors");
    gen("bad-shard", "tiny", MOEQ_GENMODEL_BF16, 2, dir, sizeof dir);
    remove_file(dir, "model-00002-of-00002.safetensors");
    expect_load_error(dir, MOEQ_ERR_NOT_FOUND, "model-00002-of-00002.safetensors", NULL);
}

static void tied_embeddings_share_the_embedding_as_head(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tied", root_dir);
    moeq_model_config config;
    moeq_genmodel_params params = moeq_genmodel_default_params();
    moeq_genmodel_preset("tiny", &config, NULL, NULL, 0);
    config.tie_word_embeddings = 1;
    params.write_tokenizer = 0;
    assert_int_equal(moeq_genmodel_write(dir, &config, &params, NULL, NULL, 0), MOEQ_OK);
    moeq_model *model = load_ok(dir);
    assert_null(moeq_model_find_tensor(model, "lm_head.weight"));
    assert_ptr_equal(model->lm_head, model->embed_tokens);
    assert_memory_equal(model->mtp_layers[0].shared_head_head->data, model->embed_tokens->data,
                        model->embed_tokens->nbytes);
    moeq_model_destroy(model);
}

/* Random byte damage anywhere in the header region: an error or a load, never a crash (run under ASan too). */
static void random_header_damage_never_crashes_the_loader(void **state) {
    (void)state;
    char dir[512], path[600];
    gen("fuzz", "tiny", MOEQ_GENMODEL_F8, 1, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char *orig = NULL;
    size_t len = 0;
    assert_int_equal(moeq_read_file(path, 1 << 26, &orig, &len, NULL, 0), MOEQ_OK);
    uint64_t hlen = safetensors_header_len(orig);
    uint64_t rng = 0x1234567;
    int failures = 0;
    for (int iter = 0; iter < 300; iter++) {
        char *buf = malloc(len);
        memcpy(buf, orig, len);
        for (int k = 0; k < 1 + iter % 4; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((rng >> 33) % (8 + hlen));
            buf[at] = (char)(rng >> 20);
        }
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        free(buf);
        moeq_model *model = NULL;
        char errstr[512] = "";
        moeq_err err = moeq_model_load(dir, NULL, &model, errstr, sizeof errstr);
        if (err) {
            assert_true(errstr[0] != 0);
            failures++;
        }
        moeq_model_destroy(model);
    }
    assert_true(failures > 200);
    free(orig);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_tiny_preset_loads_with_every_tensor_bound_to_its_shape),
        cmocka_unit_test(the_tiny_v2_preset_binds_q_proj_and_no_correction_bias),
        cmocka_unit_test(the_small_preset_loads_with_the_real_vocabulary),
        cmocka_unit_test(sharded_and_single_file_checkpoints_hold_the_same_bytes),
        cmocka_unit_test(the_same_seed_writes_the_same_bytes_and_another_seed_does_not),
        cmocka_unit_test(mtp_layers_can_be_skipped_at_load),
        cmocka_unit_test(bf16_f16_and_f8_checkpoints_dequantise_to_the_f32_values),
        cmocka_unit_test(a_missing_tensor_is_named),
        cmocka_unit_test(an_extra_tensor_is_named_unless_verification_is_off),
        cmocka_unit_test(a_wrong_shape_names_the_tensor_and_both_shapes),
        cmocka_unit_test(a_truncated_file_names_the_file_and_the_tensor_cut_off),
        cmocka_unit_test(bad_header_json_and_a_header_past_eof_are_parse_errors),
        cmocka_unit_test(an_unknown_dtype_names_tensor_and_dtype),
        cmocka_unit_test(an_f8_weight_without_its_scale_and_an_f8_norm_are_rejected),
        cmocka_unit_test(config_errors_name_the_key_or_model_type),
        cmocka_unit_test(missing_weights_and_index_ghosts_are_not_found),
        cmocka_unit_test(tied_embeddings_share_the_embedding_as_head),
        cmocka_unit_test(random_header_damage_never_crashes_the_loader),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
