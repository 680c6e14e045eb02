/*
 * genmodel.c — synthetic DeepSeek checkpoints in the HF layout (see
 * genmodel.h). The tensor list comes from moeq_model_plan, the same plan the
 * loader binds by, so a generated model always loads.
 *
 * Values: tensor t's k-th value is splitmix64(base_t + k * gamma) mapped to a
 * uniform with the role's mean and std (random access, so any row range can
 * be regenerated: F8 scales and tests use that). Scaled so activations stay
 * O(1) and logits are clearly peaked: linear std 1/sqrt(fan_in), norms near
 * 1, embedding std 1, head std 5/sqrt(hidden), correction bias in [0.01, 0.1].
 *
 * Deliberately not here: tokenizer files (moeq_tokenizer_export writes them).
 */
#include "moeq/genmodel.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h" /* the engine's tensor plan and number formats */
#include "moeq/tokenizer.h"
#include "moeq/util.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

moeq_genmodel_params moeq_genmodel_default_params(void) {
    return (moeq_genmodel_params){.seed = 1, .dtype = MOEQ_GENMODEL_BF16, .shard_bytes = (size_t)1 << 30,
                                  .n_shards = 0, .min_shards = 1, .write_tokenizer = 1, .mtp_agree = 0,
                                  .mtp_agree_damp = 0.02};
}

int moeq_genmodel_dtype_parse(const char *name, moeq_genmodel_dtype *dtype) {
    static const char *const names[] = {"bf16", "f32", "f16", "f8"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) {
            *dtype = (moeq_genmodel_dtype)i;
            return 0;
        }
    return -1;
}

/* ---- presets -------------------------------------------------------------- */

static void preset_tiny(moeq_model_config *c) {
    *c = (moeq_model_config){
        .model_type = "deepseek_v3", .vocab_size = 1024, .hidden_size = 64, .intermediate_size = 128,
        .moe_intermediate_size = 32, .num_hidden_layers = 3, .num_attention_heads = 4, .n_shared_experts = 1,
        .n_routed_experts = 16, .num_experts_per_tok = 4, .n_group = 4, .topk_group = 2,
        .first_k_dense_replace = 1, .moe_layer_freq = 1, .norm_topk_prob = 1, .routed_scaling_factor = 2.5,
        .scoring_func = "sigmoid", .topk_method = "noaux_tc", .q_lora_rank = 32, .kv_lora_rank = 32,
        .qk_nope_head_dim = 16, .qk_rope_head_dim = 8, .v_head_dim = 16, .rms_norm_eps = 1e-6,
        .rope_theta = 10000.0, .max_position_embeddings = 256, .rope_scaling_type = "yarn", .rope_factor = 4.0,
        .rope_original_max_position_embeddings = 64, .rope_beta_fast = 32, .rope_beta_slow = 1,
        .rope_mscale = 1.0, .rope_mscale_all_dim = 1.0, .num_nextn_predict_layers = 1,
        .tie_word_embeddings = 0, .bos_token_id = 0, .eos_token_id = 1};
}

static void preset_tiny_v2(moeq_model_config *c) {
    preset_tiny(c);
    snprintf(c->model_type, sizeof c->model_type, "deepseek_v2");
    snprintf(c->scoring_func, sizeof c->scoring_func, "softmax");
    snprintf(c->topk_method, sizeof c->topk_method, "group_limited_greedy");
    c->q_lora_rank = 0;
    c->norm_topk_prob = 0;
    c->routed_scaling_factor = 1.0;
    c->n_shared_experts = 2;
    c->num_nextn_predict_layers = 0;
    c->rope_scaling_type[0] = 0;
    c->rope_factor = 1.0;
    c->rope_original_max_position_embeddings = 0;
    c->rope_beta_fast = c->rope_beta_slow = c->rope_mscale = c->rope_mscale_all_dim = 0;
}

static void preset_small(moeq_model_config *c) {
    preset_tiny(c);
    c->vocab_size = 129280;
    c->hidden_size = 256;
    c->num_hidden_layers = 4;
    c->num_attention_heads = 8;
    c->q_lora_rank = 96;
    c->kv_lora_rank = 64;
    c->qk_nope_head_dim = 32;
    c->qk_rope_head_dim = 16;
    c->v_head_dim = 32;
    c->intermediate_size = 512;
    c->moe_intermediate_size = 64;
    c->n_routed_experts = 32;
    c->n_group = 8;
    c->topk_group = 4;
    c->num_experts_per_tok = 6;
    c->rope_factor = 40;
    c->rope_original_max_position_embeddings = 4096;
    c->max_position_embeddings = 163840;
}

static void preset_bench(moeq_model_config *c) {
    preset_small(c);
    c->hidden_size = 1024;
    c->num_hidden_layers = 8;
    c->num_attention_heads = 16;
    c->q_lora_rank = 384;
    c->kv_lora_rank = 256;
    c->qk_nope_head_dim = 64;
    c->qk_rope_head_dim = 32;
    c->v_head_dim = 64;
    c->intermediate_size = 4096;
    c->moe_intermediate_size = 512;
    c->n_routed_experts = 64;
    c->n_group = 8;
    c->topk_group = 4;
    c->num_experts_per_tok = 8;
}

/* tiny with an MTP layer that agrees with the main model (values: agree_rows). */
static void preset_tiny_mtp(moeq_model_config *c) { preset_tiny(c); }

/*
 * bench-shaped but dense and deep, with a small vocabulary: the share of a
 * step spent in one extra block and the head is near DeepSeek-V3's (about
 * 1/25 each), and a multi-token verify step reads the same weights as one
 * token (no expert union), so the speedup measured is the machinery's.
 */
static void preset_bench_mtp(moeq_model_config *c) {
    preset_bench(c);
    c->vocab_size = 16384;
    c->num_hidden_layers = 24;
    c->first_k_dense_replace = 1000; /* every layer dense, the MTP layer too */
}

/*
 * DeepSeek-V3's widths (hidden 7,168, 128 heads, q_lora 1,536, kv_lora 512, the dense and expert MLPs' 18,432
 * and 2,048) in two layers, one dense and one MoE of 16 experts, and a small vocabulary: every projection's K
 * is the real model's, as the CPU kernels' per-CPU choices need (bench's hidden 1,024 leaves only its dense
 * down projection with K past one 1,024-column step), in 3.5 GB of BF16.
 */
static void preset_bench_wide(moeq_model_config *c) {
    preset_bench(c);
    c->vocab_size = 16384;
    c->hidden_size = 7168;
    c->num_hidden_layers = 2;
    c->num_attention_heads = 128;
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->intermediate_size = 18432;
    c->moe_intermediate_size = 2048;
    c->n_routed_experts = 16;
    c->num_nextn_predict_layers = 0;
}

int moeq_genmodel_preset_mtp_agree(const char *name) {
    return name && (!strcmp(name, "tiny-mtp") || !strcmp(name, "bench-mtp"));
}

moeq_err moeq_genmodel_preset(const char *name, moeq_model_config *config, int *min_shards, char *errstr,
                              size_t errstr_size) {
    static const struct {
        const char *name;
        void (*fill)(moeq_model_config *);
        int min_shards;
    } presets[] = {{"tiny", preset_tiny, 2}, {"tiny-v2", preset_tiny_v2, 2}, {"small", preset_small, 2},
                   {"bench", preset_bench, 1}, {"tiny-mtp", preset_tiny_mtp, 2},
                   {"bench-mtp", preset_bench_mtp, 1}, {"bench-wide", preset_bench_wide, 1}};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name)) {
            presets[i].fill(config);
            if (min_shards) *min_shards = presets[i].min_shards;
            return MOEQ_OK;
        }
    return moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size,
                     "unknown preset '%s' (tiny, tiny-v2, small, bench, tiny-mtp, bench-mtp, bench-wide)", name);
}

/* ---- values --------------------------------------------------------------- */

static uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return splitmix64_mix(seed ^ splitmix64_mix(h));
}

typedef struct value_gen {
    uint64_t base;
    float mean, half_width; /* uniform on [mean - hw, mean + hw] */
    int64_t cols;
} value_gen;

static value_gen value_gen_for(const moeq_model_config *c, const moeq_tensor_spec *spec, uint64_t seed) {
    const char *src = spec->values_of ? spec->values_of : spec->name;
    moeq_tensor_role role = spec->role;
    if (spec->values_of && (!strcmp(spec->values_of, "lm_head.weight") || !strcmp(spec->values_of, "model.embed_tokens.weight")))
        role = strcmp(spec->values_of, "lm_head.weight") ? MOEQ_ROLE_EMBED : MOEQ_ROLE_HEAD;
    int64_t cols = spec->ndim == 2 ? spec->shape[1] : spec->shape[0];
    float mean = 0, std = 1;
    switch (role) {
    case MOEQ_ROLE_NORM: mean = 1.0f, std = 0.05f; break;
    case MOEQ_ROLE_EMBED: std = 1.0f; break;
    case MOEQ_ROLE_HEAD: std = 5.0f / sqrtf((float)c->hidden_size); break;
    case MOEQ_ROLE_BIAS: mean = 0.055f, std = 0.045f / sqrtf(3.0f); break;
    case MOEQ_ROLE_LINEAR:
    case MOEQ_ROLE_ROUTER:
    case MOEQ_ROLE_MTP_PROJ: std = 1.0f / sqrtf((float)cols); break;
    }
    return (value_gen){name_seed(seed, src), mean, std * sqrtf(3.0f), cols};
}

/* Rows [row0, row0+n_rows) as float32. */
static void gen_rows(const value_gen *g, int64_t row0, int64_t n_rows, float *out) {
    uint64_t k0 = (uint64_t)(row0 * g->cols), n = (uint64_t)(n_rows * g->cols);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = splitmix64_mix(g->base + (k0 + i + 1) * GOLDEN);
        float u = (float)(r >> 40) * 0x1p-24f; /* [0, 1) */
        out[i] = g->mean + g->half_width * (2.0f * u - 1.0f);
    }
}

typedef struct find_ctx {
    const char *name;
    moeq_tensor_spec spec;
    int found;
} find_ctx;

static moeq_err find_spec(const moeq_tensor_spec *spec, void *ud) {
    find_ctx *f = ud;
    if (strcmp(spec->name, f->name) != 0) return MOEQ_OK;
    f->spec = *spec;
    f->found = 1;
    return MOEQ_ERR_CANCELLED; /* stop the walk */
}

moeq_err moeq_genmodel_values(const moeq_model_config *config, uint64_t seed, const char *name, int64_t row0,
                              int64_t n_rows, float *out) {
    find_ctx f = {.name = name};
    moeq_model_plan(config, NULL, config->num_nextn_predict_layers, find_spec, &f);
    if (!f.found) return MOEQ_ERR_NOT_FOUND;
    value_gen g = value_gen_for(config, &f.spec, seed);
    gen_rows(&g, row0, n_rows, out);
    return MOEQ_OK;
}

/* ---- the tensor list ------------------------------------------------------ */

typedef struct gen_tensor {
    moeq_tensor_spec spec; /* for a scale: name "<weight>_scale_inv", shape in blocks */
    moeq_dtype dtype;
    int scale_of;          /* index of the F8 weight this scales, or -1 */
    size_t nbytes;
    int shard;
    uint64_t offset;       /* within the shard's data region */
} gen_tensor;

typedef struct gen_list {
    gen_tensor *items;
    int n, cap;
    moeq_genmodel_dtype mode;
} gen_list;

static moeq_dtype dtype_for(moeq_genmodel_dtype mode, moeq_tensor_role role) {
    if (mode == MOEQ_GENMODEL_F32 || role == MOEQ_ROLE_BIAS) return MOEQ_DTYPE_F32;
    if (mode == MOEQ_GENMODEL_F16) return MOEQ_DTYPE_F16;
    if (mode == MOEQ_GENMODEL_F8 && role == MOEQ_ROLE_LINEAR) return MOEQ_DTYPE_F8_E4M3;
    return MOEQ_DTYPE_BF16;
}

static size_t spec_numel(const moeq_tensor_spec *s) {
    return (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
}

static gen_tensor *list_push(gen_list *l) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        gen_tensor *items = realloc(l->items, (size_t)cap * sizeof *items);
        if (!items) return NULL;
        l->items = items;
        l->cap = cap;
    }
    gen_tensor *t = &l->items[l->n++];
    memset(t, 0, sizeof *t);
    t->scale_of = -1;
    return t;
}

static moeq_err collect(const moeq_tensor_spec *spec, void *ud) {
    gen_list *l = ud;
    gen_tensor *t = list_push(l);
    if (!t) return MOEQ_ERR_NOMEM;
    t->spec = *spec;
    t->spec.slot = NULL;
    t->dtype = dtype_for(l->mode, spec->role);
    t->nbytes = spec_numel(spec) * moeq_dtype_size(t->dtype);
    if (t->dtype != MOEQ_DTYPE_F8_E4M3) return MOEQ_OK;
    int weight = l->n - 1;
    gen_tensor *s = list_push(l);
    if (!s) return MOEQ_ERR_NOMEM;
    const moeq_tensor_spec *w = &l->items[weight].spec;
    size_t n = strlen(w->name);
    if (n + sizeof "_scale_inv" > sizeof s->spec.name) return MOEQ_ERR_LIMIT;
    memcpy(s->spec.name, w->name, n);
    memcpy(s->spec.name + n, "_scale_inv", sizeof "_scale_inv");
    s->spec.ndim = 2;
    s->spec.shape[0] = (w->shape[0] + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    s->spec.shape[1] = (w->shape[1] + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    s->dtype = MOEQ_DTYPE_F32;
    s->scale_of = weight;
    s->nbytes = spec_numel(&s->spec) * 4;
    return MOEQ_OK;
}

/* Consecutive runs of about total/n_shards bytes; a weight and its scale stay together. */
static int assign_shards(gen_list *l, int n_shards) {
    size_t total = 0;
    for (int i = 0; i < l->n; i++) total += l->items[i].nbytes;
    if (n_shards > l->n) n_shards = l->n;
    size_t target = (total + (size_t)n_shards - 1) / (size_t)n_shards, filled = 0;
    int shard = 0;
    uint64_t offset = 0;
    for (int i = 0; i < l->n; i++) {
        gen_tensor *t = &l->items[i];
        int tensors_left = l->n - i, shards_left = n_shards - shard - 1;
        if (t->scale_of < 0 && offset > 0 && shards_left > 0 &&
            (filled >= target * (size_t)(shard + 1) || tensors_left <= shards_left)) {
            shard++;
            offset = 0;
        }
        t->shard = shard;
        t->offset = offset;
        offset += t->nbytes;
        filled += t->nbytes;
    }
    return shard + 1;
}

/* ---- writing -------------------------------------------------------------- */

static void narrow(const float *vals, size_t n, moeq_dtype dtype, void *out) {
    if (dtype == MOEQ_DTYPE_F32) {
        memcpy(out, vals, n * 4);
    } else if (dtype == MOEQ_DTYPE_BF16) {
        for (size_t i = 0; i < n; i++) ((uint16_t *)out)[i] = moeq_f32_to_bf16(vals[i]);
    } else {
        for (size_t i = 0; i < n; i++) ((uint16_t *)out)[i] = moeq_f32_to_f16(vals[i]);
    }
}

/*
 * mtp_agree: an MTP layer that approximately recomputes the main model.
 * The main model is made "embedding -> last block's MLP -> norm -> head":
 * every other block's o_proj and down_proj, and every o_proj (the MTP
 * block's too), are scaled by damp, so they add little to the residual
 * stream. The MTP block is a copy of the last main block, eh_proj = [I | 0] passes enorm(embed(t_{i+1})) and ignores the
 * hidden half, enorm = 1 and embedding rows have RMS 1 (so enorm(e) = e), and
 * shared_head.norm copies model.norm. MTP entry i then sees token t_{i+1} at
 * position i where the main block sees it at i+1: RoPE scores depend on
 * relative positions only, so the draft is the main model's next-token
 * choice up to the damped terms (attention everywhere, the other blocks'
 * MLPs) — high but not perfect agreement; larger damp, lower acceptance.
 */
static void regen_as(const moeq_model_config *c, const moeq_tensor_spec *spec, const char *src, uint64_t seed,
                     int64_t r0, int64_t n, float *vals) {
    moeq_tensor_spec s = *spec;
    snprintf(s.name, sizeof s.name, "%s", src);
    s.values_of = NULL;
    value_gen g = value_gen_for(c, &s, seed);
    gen_rows(&g, r0, n, vals);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static void agree_rows(const moeq_model_config *c, const moeq_tensor_spec *spec, uint64_t seed, double damp,
                       int64_t r0, int64_t n, float *vals) {
    int L = c->num_hidden_layers, li = -1, off = 0;
    int64_t cols = spec->ndim == 2 ? spec->shape[1] : spec->shape[0], D = c->hidden_size;
    const char *rest = "";
    if (sscanf(spec->name, "model.layers.%d.%n", &li, &off) == 1 && off > 0) rest = spec->name + off;
    if (!strcmp(spec->name, "model.embed_tokens.weight") || (li == L && !strcmp(rest, "embed_tokens.weight"))) {
        for (int64_t r = 0; r < n; r++) {
            double ss = 0;
            for (int64_t k = 0; k < cols; k++) ss += (double)vals[r * cols + k] * vals[r * cols + k];
            float inv = (float)(1.0 / sqrt(ss / (double)cols));
            for (int64_t k = 0; k < cols; k++) vals[r * cols + k] *= inv;
        }
    } else if (li == L && !strcmp(rest, "eh_proj.weight")) {
        memset(vals, 0, (size_t)(n * cols) * sizeof(float));
        for (int64_t r = 0; r < n; r++)
            if (r0 + r < D) vals[r * cols + r0 + r] = 1.0f;
    } else if (li == L && !strcmp(rest, "enorm.weight")) {
        for (int64_t k = 0; k < n * cols; k++) vals[k] = 1.0f;
    } else if (li == L && !strcmp(rest, "shared_head.norm.weight")) {
        regen_as(c, spec, "model.norm.weight", seed, r0, n, vals);
    } else if (li == L && strcmp(rest, "hnorm.weight") && strncmp(rest, "shared_head.", 12)) {
        char src[128];
        snprintf(src, sizeof src, "model.layers.%d.%s", L - 1, rest);
        regen_as(c, spec, src, seed, r0, n, vals);
        if (ends_with(rest, "o_proj.weight"))
            for (int64_t k = 0; k < n * cols; k++) vals[k] *= (float)damp;
    } else if (li >= 0 && (ends_with(rest, "o_proj.weight") || (li < L - 1 && ends_with(rest, "down_proj.weight")))) {
        for (int64_t k = 0; k < n * cols; k++) vals[k] *= (float)damp;
    }
}

typedef struct writer {
    const moeq_model_config *config;
    const gen_list *list;
    uint64_t seed;
    int mtp_agree;
    double damp;
    FILE *f;
    const char *path;
    char *errstr;
    size_t errstr_size;
} writer;

/* Stream one tensor in 128-row chunks (an F8 block row); a scale tensor regenerates its weight's chunks. */
static moeq_err write_tensor(writer *w, const gen_tensor *t) {
    const gen_tensor *src = t->scale_of >= 0 ? &w->list->items[t->scale_of] : t;
    value_gen g = value_gen_for(w->config, &src->spec, w->seed);
    int64_t rows = src->spec.ndim == 2 ? src->spec.shape[0] : 1, cols = g.cols;
    int64_t n_blocks = (cols + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    float *vals = malloc((size_t)(MOEQ_F8_BLOCK * cols) * 4), *scales = malloc((size_t)n_blocks * 4);
    void *out = malloc((size_t)(MOEQ_F8_BLOCK * cols) * 4);
    moeq_err err = MOEQ_OK;
    if (!vals || !scales || !out) err = moeq_errf(MOEQ_ERR_NOMEM, w->errstr, w->errstr_size, "out of memory");
    for (int64_t r0 = 0; !err && r0 < rows; r0 += MOEQ_F8_BLOCK) {
        int64_t n = rows - r0 < MOEQ_F8_BLOCK ? rows - r0 : MOEQ_F8_BLOCK;
        gen_rows(&g, r0, n, vals);
        if (w->mtp_agree) agree_rows(w->config, &src->spec, w->seed, w->damp, r0, n, vals);
        const void *bytes = out;
        size_t len;
        if (t->scale_of >= 0 || t->dtype == MOEQ_DTYPE_F8_E4M3) moeq_f8_block_scales(vals, n, cols, scales);
        if (t->scale_of >= 0) {
            bytes = scales, len = (size_t)n_blocks * 4;
        } else if (t->dtype == MOEQ_DTYPE_F8_E4M3) {
            moeq_f8_quantize_rows(vals, n, cols, scales, out);
            len = (size_t)(n * cols);
        } else {
            narrow(vals, (size_t)(n * cols), t->dtype, out);
            len = (size_t)(n * cols) * moeq_dtype_size(t->dtype);
        }
        if (fwrite(bytes, 1, len, w->f) != len)
            err = moeq_errf(MOEQ_ERR_IO, w->errstr, w->errstr_size, "%s: write: %s", w->path, strerror(errno));
    }
    free(vals);
    free(scales);
    free(out);
    return err;
}

/* The safetensors header of one shard, padded with spaces to a multiple of 8. */
static char *shard_header(const gen_list *l, int shard, size_t *len) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (int i = 0; i < l->n; i++) {
        const gen_tensor *t = &l->items[i];
        if (t->shard != shard) continue;
        cJSON *e = cJSON_AddObjectToObject(root, t->spec.name);
        cJSON_AddStringToObject(e, "dtype", moeq_dtype_name(t->dtype));
        double shape[2] = {(double)t->spec.shape[0], (double)t->spec.shape[1]};
        double offsets[2] = {(double)t->offset, (double)(t->offset + t->nbytes)};
        cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shape, t->spec.ndim));
        cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(offsets, 2));
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return NULL;
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    char *out = realloc(json, padded + 1);
    if (!out) {
        free(json);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    *len = padded;
    return out;
}

static moeq_err write_shard(writer *w, int shard) {
    size_t hlen = 0;
    char *header = shard_header(w->list, shard, &hlen);
    if (!header) return moeq_errf(MOEQ_ERR_NOMEM, w->errstr, w->errstr_size, "out of memory");
    w->f = fopen(w->path, "wb");
    moeq_err err = MOEQ_OK;
    if (!w->f) {
        err = moeq_errf(MOEQ_ERR_IO, w->errstr, w->errstr_size, "%s: %s", w->path, strerror(errno));
        goto free_header;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if (fwrite(len8, 1, 8, w->f) != 8 || fwrite(header, 1, hlen, w->f) != hlen)
        err = moeq_errf(MOEQ_ERR_IO, w->errstr, w->errstr_size, "%s: write: %s", w->path, strerror(errno));
    for (int i = 0; !err && i < w->list->n; i++)
        if (w->list->items[i].shard == shard) err = write_tensor(w, &w->list->items[i]);
    if (fclose(w->f) != 0 && !err)
        err = moeq_errf(MOEQ_ERR_IO, w->errstr, w->errstr_size, "%s: close: %s", w->path, strerror(errno));
    w->f = NULL;
free_header:
    free(header);
    return err;
}

static moeq_err write_text(const char *dir, const char *name, const char *text, char *errstr, size_t errstr_size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: %s", path, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF;
    bad |= fclose(f) != 0;
    return bad ? moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: write failed", path) : MOEQ_OK;
}

static void shard_name(int shard, int n_shards, char *out, size_t out_size) {
    if (n_shards == 1)
        snprintf(out, out_size, "model.safetensors");
    else
        snprintf(out, out_size, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

static char *index_json(const gen_list *l, int n_shards) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    size_t total = 0;
    char name[64];
    for (int i = 0; i < l->n; i++) {
        total += l->items[i].nbytes;
        shard_name(l->items[i].shard, n_shards, name, sizeof name);
        cJSON_AddStringToObject(map, l->items[i].spec.name, name);
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    return json;
}

/* ---- config.json ---------------------------------------------------------- */

static void add_rope_scaling(cJSON *root, const moeq_model_config *c) {
    if (!c->rope_scaling_type[0]) {
        cJSON_AddNullToObject(root, "rope_scaling");
        return;
    }
    cJSON *rs = cJSON_AddObjectToObject(root, "rope_scaling");
    cJSON_AddNumberToObject(rs, "beta_fast", c->rope_beta_fast);
    cJSON_AddNumberToObject(rs, "beta_slow", c->rope_beta_slow);
    cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
    cJSON_AddNumberToObject(rs, "mscale", c->rope_mscale);
    cJSON_AddNumberToObject(rs, "mscale_all_dim", c->rope_mscale_all_dim);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max_position_embeddings);
    cJSON_AddStringToObject(rs, "type", c->rope_scaling_type);
}

static void add_quantization(cJSON *root) {
    cJSON *q = cJSON_AddObjectToObject(root, "quantization_config");
    cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
    cJSON_AddStringToObject(q, "fmt", "e4m3");
    cJSON_AddStringToObject(q, "quant_method", "fp8");
    int block[2] = {MOEQ_F8_BLOCK, MOEQ_F8_BLOCK};
    cJSON_AddItemToObject(q, "weight_block_size", cJSON_CreateIntArray(block, 2));
}

static void add_ints(cJSON *root, const moeq_model_config *c) {
    const struct {
        const char *key;
        int value;
    } ints[] = {
        {"bos_token_id", c->bos_token_id}, {"eos_token_id", c->eos_token_id}, {"ep_size", 1},
        {"first_k_dense_replace", c->first_k_dense_replace}, {"hidden_size", c->hidden_size},
        {"intermediate_size", c->intermediate_size}, {"kv_lora_rank", c->kv_lora_rank},
        {"max_position_embeddings", c->max_position_embeddings}, {"moe_intermediate_size", c->moe_intermediate_size},
        {"moe_layer_freq", c->moe_layer_freq}, {"n_group", c->n_group}, {"n_routed_experts", c->n_routed_experts},
        {"n_shared_experts", c->n_shared_experts}, {"num_attention_heads", c->num_attention_heads},
        {"num_experts_per_tok", c->num_experts_per_tok}, {"num_hidden_layers", c->num_hidden_layers},
        {"num_key_value_heads", c->num_attention_heads}, {"num_nextn_predict_layers", c->num_nextn_predict_layers},
        {"qk_nope_head_dim", c->qk_nope_head_dim}, {"qk_rope_head_dim", c->qk_rope_head_dim},
        {"topk_group", c->topk_group}, {"v_head_dim", c->v_head_dim}, {"vocab_size", c->vocab_size},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) cJSON_AddNumberToObject(root, ints[i].key, ints[i].value);
}

char *moeq_genmodel_config_json(const moeq_model_config *c, moeq_genmodel_dtype dtype) {
    static const char *const torch_dtypes[] = {"bfloat16", "float32", "float16", "bfloat16"};
    int v2 = !strcmp(c->model_type, "deepseek_v2");
    cJSON *root = cJSON_CreateObject();
    const char *arch = v2 ? "DeepseekV2ForCausalLM" : "DeepseekV3ForCausalLM";
    cJSON_AddItemToObject(root, "architectures", cJSON_CreateStringArray(&arch, 1));
    cJSON_AddStringToObject(root, "model_type", c->model_type);
    cJSON_AddBoolToObject(root, "attention_bias", 0);
    cJSON_AddNumberToObject(root, "attention_dropout", 0.0);
    cJSON_AddStringToObject(root, "hidden_act", "silu");
    cJSON_AddNumberToObject(root, "initializer_range", 0.02);
    add_ints(root, c);
    cJSON_AddBoolToObject(root, "norm_topk_prob", c->norm_topk_prob);
    if (c->q_lora_rank > 0)
        cJSON_AddNumberToObject(root, "q_lora_rank", c->q_lora_rank);
    else
        cJSON_AddNullToObject(root, "q_lora_rank");
    cJSON_AddNumberToObject(root, "rms_norm_eps", c->rms_norm_eps);
    add_rope_scaling(root, c);
    cJSON_AddNumberToObject(root, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(root, "routed_scaling_factor", c->routed_scaling_factor);
    cJSON_AddStringToObject(root, "scoring_func", c->scoring_func);
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(root, "topk_method", c->topk_method);
    cJSON_AddStringToObject(root, "torch_dtype", torch_dtypes[dtype]);
    cJSON_AddStringToObject(root, "transformers_version", "4.46.3");
    cJSON_AddBoolToObject(root, "use_cache", 1);
    if (dtype == MOEQ_GENMODEL_F8) add_quantization(root);
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    return json;
}

/* ---- the whole checkpoint ------------------------------------------------- */

static moeq_err make_dir(const char *dir, char *errstr, size_t errstr_size) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "%s: path too long", dir);
    for (char *p = path + 1;; p++) {
        int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: mkdir: %s", path, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    return MOEQ_OK;
}

/* The config must be one the loader accepts: round-trip it through the parser. */
static moeq_err check_config(const moeq_model_config *config, char *errstr, size_t errstr_size) {
    char *json = moeq_genmodel_config_json(config, MOEQ_GENMODEL_BF16);
    if (!json) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    moeq_model_config parsed;
    moeq_err err = moeq_model_config_parse(json, strlen(json), &parsed, errstr, errstr_size);
    free(json);
    return err ? MOEQ_ERR_INVALID_ARG : MOEQ_OK;
}

static moeq_err write_shards(const char *dir, writer *w, int n_shards) {
    char name[64], path[4096];
    moeq_err err = MOEQ_OK;
    snprintf(path, sizeof path, "%s/%s", dir, n_shards == 1 ? "model.safetensors.index.json" : "model.safetensors");
    unlink(path); /* a stale file of the other layout would shadow or confuse this one */
    w->path = path;
    for (int s = 0; !err && s < n_shards; s++) {
        shard_name(s, n_shards, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        err = write_shard(w, s);
    }
    if (err || n_shards == 1) return err;
    char *json = index_json(w->list, n_shards);
    if (!json) return moeq_errf(MOEQ_ERR_NOMEM, w->errstr, w->errstr_size, "out of memory");
    err = write_text(dir, "model.safetensors.index.json", json, w->errstr, w->errstr_size);
    free(json);
    return err;
}

static void fill_stats(const gen_list *l, int n_shards, moeq_genmodel_stats *stats) {
    if (!stats) return;
    memset(stats, 0, sizeof *stats);
    for (int i = 0; i < l->n; i++) {
        stats->n_bytes += l->items[i].nbytes;
        if (l->items[i].scale_of < 0) stats->n_params += spec_numel(&l->items[i].spec);
    }
    stats->n_tensors = l->n;
    stats->n_shards = n_shards;
}

/* Tokenizer files are a convenience: their absence is noted in stats, not an error. */
static void export_tokenizer(const char *out_dir, int vocab_size, moeq_genmodel_stats *stats) {
    char msg[256] = "";
    moeq_err err = moeq_tokenizer_export(out_dir, vocab_size, msg, sizeof msg);
    if (stats) {
        stats->tokenizer_written = err == MOEQ_OK;
        snprintf(stats->tokenizer_note, sizeof stats->tokenizer_note, "%s", msg);
    }
}

static int shard_count(const gen_list *l, const moeq_genmodel_params *params) {
    if (params->n_shards > 0) return params->n_shards;
    size_t total = 0, shard_bytes = params->shard_bytes ? params->shard_bytes : (size_t)1 << 30;
    for (int i = 0; i < l->n; i++) total += l->items[i].nbytes;
    int n = (int)((total + shard_bytes - 1) / shard_bytes);
    return n < params->min_shards ? params->min_shards : n < 1 ? 1 : n;
}

moeq_err moeq_genmodel_write(const char *out_dir, const moeq_model_config *config,
                             const moeq_genmodel_params *params, moeq_genmodel_stats *stats, char *errstr,
                             size_t errstr_size) {
    moeq_genmodel_params defaults = moeq_genmodel_default_params();
    if (!params) params = &defaults;
    if (!out_dir || !config) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "NULL argument");
    moeq_err err = check_config(config, errstr, errstr_size);
    if (!err) err = make_dir(out_dir, errstr, errstr_size);
    if (err) return err;
    gen_list list = {.mode = params->dtype};
    err = moeq_model_plan(config, NULL, config->num_nextn_predict_layers, collect, &list);
    if (err) {
        free(list.items);
        return moeq_errf(err, errstr, errstr_size, "out of memory");
    }
    int n_shards = assign_shards(&list, shard_count(&list, params));
    writer w = {config, &list, params->seed, params->mtp_agree, params->mtp_agree_damp, NULL, NULL, errstr,
                errstr_size};
    err = write_shards(out_dir, &w, n_shards);
    char *json = err ? NULL : moeq_genmodel_config_json(config, params->dtype);
    if (!err && !json) err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    if (!err) err = write_text(out_dir, "config.json", json, errstr, errstr_size);
    free(json);
    if (!err) fill_stats(&list, n_shards, stats);
    if (!err && params->write_tokenizer) export_tokenizer(out_dir, config->vocab_size, stats);
    free(list.items);
    return err;
}
