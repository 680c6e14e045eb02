/*
 * model.c — load a Hugging Face DeepSeek-V2/V3 model directory: config.json,
 * then every safetensors shard mmapped, then each tensor the config implies
 * bound to struct moeq_model by its HF name with shape and dtype checked.
 *
 * The tensor plan (moeq_model_plan) is the single list of expected names; the
 * loader binds by it and gen-model writes by it. Nothing is copied: tensors
 * point into the mappings. Deliberately not here: any arithmetic on weights.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "moeq/util.h"
#include "safetensors.h"

moeq_model_params moeq_model_default_params(void) {
    return (moeq_model_params){.load_mtp = 1, .verify_tensors = 1};
}

int moeq_model_layer_is_moe(const moeq_model_config *c, int i) {
    return c->n_routed_experts > 0 && i >= c->first_k_dense_replace && i % c->moe_layer_freq == 0;
}

/* ---- the plan ------------------------------------------------------------- */

typedef struct planner {
    const moeq_model_config *config;
    moeq_tensor_spec_fn fn;
    void *ud;
} planner;

static moeq_err emit(planner *p, const moeq_tensor **slot, moeq_tensor_role role, int64_t d0, int64_t d1,
                     const char *values_of, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static moeq_err emit(planner *p, const moeq_tensor **slot, moeq_tensor_role role, int64_t d0, int64_t d1,
                     const char *values_of, const char *fmt, ...) {
    moeq_tensor_spec spec = {.ndim = d1 ? 2 : 1, .shape = {d0, d1}, .role = role, .slot = slot,
                             .values_of = values_of};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(spec.name, sizeof spec.name, fmt, ap);
    va_end(ap);
    return p->fn(&spec, p->ud);
}

#define SLOT(layer, field) ((layer) ? &(layer)->field : NULL)
#define EMIT(...)                               \
    do {                                        \
        moeq_err err_ = emit(p, __VA_ARGS__);   \
        if (err_) return err_;                  \
    } while (0)

static moeq_err plan_mlp(planner *p, moeq_expert *e, int64_t inter, const char *prefix) {
    int64_t h = p->config->hidden_size;
    EMIT(SLOT(e, gate_proj), MOEQ_ROLE_LINEAR, inter, h, NULL, "%s.gate_proj.weight", prefix);
    EMIT(SLOT(e, up_proj), MOEQ_ROLE_LINEAR, inter, h, NULL, "%s.up_proj.weight", prefix);
    EMIT(SLOT(e, down_proj), MOEQ_ROLE_LINEAR, h, inter, NULL, "%s.down_proj.weight", prefix);
    return MOEQ_OK;
}

static moeq_err plan_attention(planner *p, moeq_layer *l, int i) {
    const moeq_model_config *c = p->config;
    int64_t h = c->hidden_size, heads = c->num_attention_heads;
    int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    if (c->q_lora_rank == 0) {
        EMIT(SLOT(l, q_proj), MOEQ_ROLE_LINEAR, heads * qk, h, NULL, "model.layers.%d.self_attn.q_proj.weight", i);
    } else {
        EMIT(SLOT(l, q_a_proj), MOEQ_ROLE_LINEAR, c->q_lora_rank, h, NULL, "model.layers.%d.self_attn.q_a_proj.weight",
             i);
        EMIT(SLOT(l, q_a_layernorm), MOEQ_ROLE_NORM, c->q_lora_rank, 0, NULL,
             "model.layers.%d.self_attn.q_a_layernorm.weight", i);
        EMIT(SLOT(l, q_b_proj), MOEQ_ROLE_LINEAR, heads * qk, c->q_lora_rank, NULL,
             "model.layers.%d.self_attn.q_b_proj.weight", i);
    }
    EMIT(SLOT(l, kv_a_proj_with_mqa), MOEQ_ROLE_LINEAR, c->kv_lora_rank + c->qk_rope_head_dim, h, NULL,
         "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", i);
    EMIT(SLOT(l, kv_a_layernorm), MOEQ_ROLE_NORM, c->kv_lora_rank, 0, NULL,
         "model.layers.%d.self_attn.kv_a_layernorm.weight", i);
    EMIT(SLOT(l, kv_b_proj), MOEQ_ROLE_LINEAR, heads * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, NULL,
         "model.layers.%d.self_attn.kv_b_proj.weight", i);
    EMIT(SLOT(l, o_proj), MOEQ_ROLE_LINEAR, h, heads * c->v_head_dim, NULL, "model.layers.%d.self_attn.o_proj.weight",
         i);
    return MOEQ_OK;
}

static moeq_err plan_moe(planner *p, moeq_layer *l, int i) {
    const moeq_model_config *c = p->config;
    char prefix[96];
    EMIT(SLOT(l, gate), MOEQ_ROLE_ROUTER, c->n_routed_experts, c->hidden_size, NULL, "model.layers.%d.mlp.gate.weight",
         i);
    if (!strcmp(c->topk_method, "noaux_tc"))
        EMIT(SLOT(l, e_score_correction_bias), MOEQ_ROLE_BIAS, c->n_routed_experts, 0, NULL,
             "model.layers.%d.mlp.gate.e_score_correction_bias", i);
    for (int j = 0; j < c->n_routed_experts; j++) {
        snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.experts.%d", i, j);
        moeq_err err = plan_mlp(p, l ? &l->experts[j] : NULL, c->moe_intermediate_size, prefix);
        if (err) return err;
    }
    if (c->n_shared_experts > 0) {
        snprintf(prefix, sizeof prefix, "model.layers.%d.mlp.shared_experts", i);
        return plan_mlp(p, SLOT(l, shared), (int64_t)c->moe_intermediate_size * c->n_shared_experts, prefix);
    }
    return MOEQ_OK;
}

/* One decoder block: norms, MLA, dense or MoE MLP. */
static moeq_err plan_block(planner *p, moeq_layer *l, int i) {
    const moeq_model_config *c = p->config;
    EMIT(SLOT(l, input_layernorm), MOEQ_ROLE_NORM, c->hidden_size, 0, NULL, "model.layers.%d.input_layernorm.weight",
         i);
    moeq_err err = plan_attention(p, l, i);
    if (err) return err;
    EMIT(SLOT(l, post_attention_layernorm), MOEQ_ROLE_NORM, c->hidden_size, 0, NULL,
         "model.layers.%d.post_attention_layernorm.weight", i);
    if (moeq_model_layer_is_moe(c, i)) return plan_moe(p, l, i);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "model.layers.%d.mlp", i);
    return plan_mlp(p, SLOT(l, mlp), c->intermediate_size, prefix);
}

/* An MTP module as DeepSeek-V3 stores it at model.layers.{num_hidden_layers + k}. */
static moeq_err plan_mtp(planner *p, moeq_layer *l, int i) {
    const moeq_model_config *c = p->config;
    int64_t h = c->hidden_size;
    moeq_tensor_spec embed = {.ndim = 2, .shape = {c->vocab_size, h}, .role = MOEQ_ROLE_EMBED, .optional = 1,
                              .values_of = "model.embed_tokens.weight"};
    snprintf(embed.name, sizeof embed.name, "model.layers.%d.embed_tokens.weight", i);
    moeq_err err = p->fn(&embed, p->ud);
    if (err) return err;
    EMIT(SLOT(l, enorm), MOEQ_ROLE_NORM, h, 0, NULL, "model.layers.%d.enorm.weight", i);
    EMIT(SLOT(l, hnorm), MOEQ_ROLE_NORM, h, 0, NULL, "model.layers.%d.hnorm.weight", i);
    EMIT(SLOT(l, eh_proj), MOEQ_ROLE_MTP_PROJ, h, 2 * h, NULL, "model.layers.%d.eh_proj.weight", i);
    err = plan_block(p, l, i);
    if (err) return err;
    EMIT(SLOT(l, shared_head_norm), MOEQ_ROLE_NORM, h, 0, NULL, "model.layers.%d.shared_head.norm.weight", i);
    const char *head = c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    EMIT(SLOT(l, shared_head_head), MOEQ_ROLE_HEAD, c->vocab_size, h, head, "model.layers.%d.shared_head.head.weight",
         i);
    return MOEQ_OK;
}

moeq_err moeq_model_plan(const moeq_model_config *config, moeq_model *model, int n_mtp, moeq_tensor_spec_fn fn,
                         void *ud) {
    planner plan = {config, fn, ud}, *p = &plan;
    int64_t h = config->hidden_size, v = config->vocab_size;
    EMIT(model ? &model->embed_tokens : NULL, MOEQ_ROLE_EMBED, v, h, NULL, "model.embed_tokens.weight");
    for (int i = 0; i < config->num_hidden_layers; i++) {
        moeq_err err = plan_block(p, model ? &model->layers[i] : NULL, i);
        if (err) return err;
    }
    EMIT(model ? &model->norm : NULL, MOEQ_ROLE_NORM, h, 0, NULL, "model.norm.weight");
    if (!config->tie_word_embeddings)
        EMIT(model ? &model->lm_head : NULL, MOEQ_ROLE_HEAD, v, h, NULL, "lm_head.weight");
    for (int k = 0; k < n_mtp; k++) {
        moeq_err err = plan_mtp(p, model ? &model->mtp_layers[k] : NULL, config->num_hidden_layers + k);
        if (err) return err;
    }
    return MOEQ_OK;
}

/* ---- binding -------------------------------------------------------------- */

typedef struct binder {
    moeq_model *model;
    uint8_t *used; /* per model->tensors entry */
    char *errstr;
    size_t errstr_size;
} binder;

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const moeq_tensor *)a)->name, ((const moeq_tensor *)b)->name);
}

const moeq_tensor *moeq_model_find_tensor(const moeq_model *model, const char *name) {
    if (!model || !name) return NULL;
    moeq_tensor key = {.name = name};
    return bsearch(&key, model->tensors, (size_t)model->n_tensors, sizeof key, tensor_cmp);
}

static const char *file_of(const moeq_model *model, const moeq_tensor *t) {
    for (int f = 0; f < model->n_files; f++) {
        const moeq_mapped_file *mf = model->files[f];
        if ((const uint8_t *)t->data >= (const uint8_t *)mf->map &&
            (const uint8_t *)t->data <= (const uint8_t *)mf->map + mf->size)
            return mf->path;
    }
    return "?";
}

static void shape_str(const int64_t *shape, int ndim, char *out, size_t out_size) {
    size_t n = (size_t)snprintf(out, out_size, "[");
    for (int d = 0; d < ndim && n < out_size; d++)
        n += (size_t)snprintf(out + n, out_size - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < out_size) snprintf(out + n, out_size - n, "]");
}

static moeq_err check_shape(binder *b, const moeq_tensor *t, int ndim, const int64_t *shape) {
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (same) return MOEQ_OK;
    char want[64], got[96];
    shape_str(shape, ndim, want, sizeof want);
    shape_str(t->shape, t->ndim, got, sizeof got);
    return moeq_errf(MOEQ_ERR_FORMAT, b->errstr, b->errstr_size, "%s: tensor '%s' has shape %s, expected %s",
                     file_of(b->model, t), t->name, got, want);
}

/* F8 weights carry <name minus ".weight">.weight_scale_inv, F32 [ceil(rows/128), ceil(cols/128)]. */
static moeq_err bind_scale(binder *b, moeq_tensor *t) {
    char name[160];
    size_t n = strlen(t->name);
    if (n < 7 || strcmp(t->name + n - 7, ".weight") != 0 || t->ndim != 2)
        return moeq_errf(MOEQ_ERR_FORMAT, b->errstr, b->errstr_size,
                         "tensor '%s': F8_E4M3 only for 2-D .weight tensors", t->name);
    snprintf(name, sizeof name, "%s_scale_inv", t->name);
    const moeq_tensor *s = moeq_model_find_tensor(b->model, name);
    if (!s)
        return moeq_errf(MOEQ_ERR_NOT_FOUND, b->errstr, b->errstr_size, "F8_E4M3 tensor '%s' has no '%s'", t->name,
                         name);
    int64_t want[2] = {(t->shape[0] + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK,
                       (t->shape[1] + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK};
    moeq_err err = check_shape(b, s, 2, want);
    if (err) return err;
    if (s->dtype != MOEQ_DTYPE_F32)
        return moeq_errf(MOEQ_ERR_FORMAT, b->errstr, b->errstr_size, "tensor '%s' has dtype %s, expected F32", s->name,
                         moeq_dtype_name(s->dtype));
    t->scale_inv = s;
    b->used[s - b->model->tensors] = 1;
    return MOEQ_OK;
}

static moeq_err bind_one(const moeq_tensor_spec *spec, void *ud) {
    binder *b = ud;
    moeq_tensor *t = (moeq_tensor *)moeq_model_find_tensor(b->model, spec->name);
    if (!t) {
        if (spec->optional) return MOEQ_OK;
        return moeq_errf(MOEQ_ERR_NOT_FOUND, b->errstr, b->errstr_size, "%s: missing tensor '%s'", b->model->dir,
                         spec->name);
    }
    moeq_err err = check_shape(b, t, spec->ndim, spec->shape);
    if (err) return err;
    int is_matrix = spec->role != MOEQ_ROLE_NORM && spec->role != MOEQ_ROLE_BIAS;
    if (t->dtype == MOEQ_DTYPE_F8_E4M3 && !is_matrix)
        return moeq_errf(MOEQ_ERR_FORMAT, b->errstr, b->errstr_size,
                         "%s: tensor '%s' is F8_E4M3; norms and biases must be F32, BF16 or F16", file_of(b->model, t),
                         t->name);
    if (t->dtype == MOEQ_DTYPE_F8_E4M3 && (err = bind_scale(b, t))) return err;
    b->used[t - b->model->tensors] = 1;
    if (spec->slot) *spec->slot = t;
    return MOEQ_OK;
}

/* With verify_tensors, every tensor in the files must have been bound (MTP ones skipped when not loaded). */
static moeq_err check_unused(binder *b, int verify, int skip_from_layer) {
    for (int i = 0; i < b->model->n_tensors; i++) {
        const moeq_tensor *t = &b->model->tensors[i];
        if (b->used[i]) continue;
        int layer = -1;
        if (sscanf(t->name, "model.layers.%d.", &layer) == 1 && layer >= skip_from_layer) continue;
        if (verify)
            return moeq_errf(MOEQ_ERR_FORMAT, b->errstr, b->errstr_size,
                             "%s: unexpected tensor '%s' (not part of a %s model with this config)",
                             file_of(b->model, t), t->name, b->model->config.model_type);
    }
    return MOEQ_OK;
}

/* ---- load ----------------------------------------------------------------- */

/* All files' tensors in one array sorted by name; a name in two files is an error. */
static moeq_err gather_tensors(moeq_model *model, char *errstr, size_t errstr_size) {
    int n = 0;
    for (int f = 0; f < model->n_files; f++) n += model->files[f]->n_tensors;
    model->tensors = calloc((size_t)n + 1, sizeof *model->tensors);
    if (!model->tensors) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    for (int f = 0, k = 0; f < model->n_files; f++)
        for (int i = 0; i < model->files[f]->n_tensors; i++) model->tensors[k++] = model->files[f]->tensors[i];
    model->n_tensors = n;
    qsort(model->tensors, (size_t)n, sizeof *model->tensors, tensor_cmp);
    for (int i = 1; i < n; i++)
        if (!strcmp(model->tensors[i - 1].name, model->tensors[i].name))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "tensor '%s' appears twice (%s and %s)",
                             model->tensors[i].name, file_of(model, &model->tensors[i - 1]),
                             file_of(model, &model->tensors[i]));
    return MOEQ_OK;
}

static moeq_err alloc_layers(moeq_model *model, int n_mtp) {
    const moeq_model_config *c = &model->config;
    model->layers = calloc((size_t)c->num_hidden_layers, sizeof *model->layers);
    model->mtp_layers = calloc((size_t)n_mtp + 1, sizeof *model->mtp_layers);
    if (!model->layers || !model->mtp_layers) return MOEQ_ERR_NOMEM;
    model->n_mtp_layers = n_mtp;
    for (int i = 0; i < c->num_hidden_layers + n_mtp; i++) {
        moeq_layer *l = i < c->num_hidden_layers ? &model->layers[i] : &model->mtp_layers[i - c->num_hidden_layers];
        l->is_moe = moeq_model_layer_is_moe(c, i);
        if (!l->is_moe) continue;
        l->experts = calloc((size_t)c->n_routed_experts, sizeof *l->experts);
        if (!l->experts) return MOEQ_ERR_NOMEM;
    }
    return MOEQ_OK;
}

/* MTP modules actually stored: checkpoints with the MTP layer stripped keep num_nextn_predict_layers. */
static int stored_mtp_layers(const moeq_model *model) {
    int n = 0;
    char name[64];
    for (; n < model->config.num_nextn_predict_layers; n++) {
        snprintf(name, sizeof name, "model.layers.%d.enorm.weight", model->config.num_hidden_layers + n);
        if (!moeq_model_find_tensor(model, name)) break;
    }
    return n;
}

static moeq_err bind_all(moeq_model *model, const moeq_model_params *params, char *errstr, size_t errstr_size) {
    int n_mtp = params->load_mtp ? stored_mtp_layers(model) : 0;
    if (alloc_layers(model, n_mtp)) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    binder b = {model, calloc((size_t)model->n_tensors + 1, 1), errstr, errstr_size};
    if (!b.used) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    moeq_err err = moeq_model_plan(&model->config, model, n_mtp, bind_one, &b);
    if (!err) {
        int skip_from = params->load_mtp ? model->config.num_hidden_layers + n_mtp : model->config.num_hidden_layers;
        err = check_unused(&b, params->verify_tensors, skip_from);
    }
    if (!err && model->config.tie_word_embeddings) model->lm_head = model->embed_tokens;
    free(b.used);
    return err;
}

moeq_err moeq_model_load(const char *dir, const moeq_model_params *params, moeq_model **out, char *errstr,
                         size_t errstr_size) {
    if (!dir || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "moeq_model_load: NULL argument");
    *out = NULL;
    moeq_model_params defaults = moeq_model_default_params();
    if (!params) params = &defaults;
    moeq_model *model = calloc(1, sizeof *model);
    if (!model || !(model->dir = strdup(dir))) {
        free(model);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    }
    moeq_err err = moeq_model_config_load(dir, &model->config, errstr, errstr_size);
    if (!err) err = moeq_safetensors_open_dir(dir, &model->files, &model->n_files, errstr, errstr_size);
    if (!err) err = gather_tensors(model, errstr, errstr_size);
    if (!err) err = bind_all(model, params, errstr, errstr_size);
    if (err) {
        moeq_model_destroy(model);
        return err;
    }
    *out = model;
    return MOEQ_OK;
}

static void free_layer(moeq_layer *l) { free(l->experts); }

void moeq_model_destroy(moeq_model *model) {
    if (!model) return;
    if (model->layers)
        for (int i = 0; i < model->config.num_hidden_layers; i++) free_layer(&model->layers[i]);
    if (model->mtp_layers)
        for (int i = 0; i < model->n_mtp_layers; i++) free_layer(&model->mtp_layers[i]);
    free(model->layers);
    free(model->mtp_layers);
    free(model->tensors); /* names belong to the files */
    for (int f = 0; f < model->n_files; f++) moeq_mapped_file_close(model->files[f]);
    free(model->files);
    free(model->dir);
    free(model);
}

const moeq_model_config *moeq_model_get_config(const moeq_model *model) { return model ? &model->config : NULL; }

/* ---- sizes ---------------------------------------------------------------- */

static size_t numel(const moeq_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* Stored bytes including the F8 scales. */
static size_t tensor_bytes(const moeq_tensor *t) {
    if (!t) return 0;
    return t->nbytes + (t->scale_inv ? t->scale_inv->nbytes : 0);
}

static size_t mlp_bytes(const moeq_expert *e) {
    return tensor_bytes(e->gate_proj) + tensor_bytes(e->up_proj) + tensor_bytes(e->down_proj);
}

static size_t layer_active_bytes(const moeq_model_config *c, const moeq_layer *l) {
    const moeq_tensor *const fixed[] = {l->input_layernorm, l->post_attention_layernorm, l->q_proj, l->q_a_proj,
                                        l->q_a_layernorm, l->q_b_proj, l->kv_a_proj_with_mqa, l->kv_a_layernorm,
                                        l->kv_b_proj, l->o_proj, l->gate, l->e_score_correction_bias};
    size_t bytes = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) bytes += tensor_bytes(fixed[i]);
    if (!l->is_moe) return bytes + mlp_bytes(&l->mlp);
    /* every routed expert of a layer has the same size */
    return bytes + mlp_bytes(&l->shared) + (size_t)c->num_experts_per_tok * mlp_bytes(&l->experts[0]);
}

size_t moeq_model_active_bytes_per_token(const moeq_model *model) {
    if (!model) return 0;
    const moeq_model_config *c = &model->config;
    size_t bytes = tensor_bytes(model->norm) + tensor_bytes(model->lm_head);
    bytes += model->embed_tokens ? model->embed_tokens->nbytes / (size_t)c->vocab_size : 0; /* one row */
    for (int i = 0; i < c->num_hidden_layers; i++) bytes += layer_active_bytes(c, &model->layers[i]);
    return bytes;
}

size_t moeq_model_mtp_active_bytes_per_token(const moeq_model *model) {
    if (!model || model->n_mtp_layers < 1) return 0;
    const moeq_layer *l = &model->mtp_layers[0];
    const moeq_tensor *head = l->shared_head_head ? l->shared_head_head : model->lm_head;
    size_t bytes = layer_active_bytes(&model->config, l) + tensor_bytes(l->enorm) + tensor_bytes(l->hnorm) +
                   tensor_bytes(l->eh_proj) + tensor_bytes(l->shared_head_norm) + tensor_bytes(head);
    return bytes + (model->embed_tokens ? model->embed_tokens->nbytes / (size_t)model->config.vocab_size : 0);
}

/* Weights of the main model as stored (F8 scales and MTP layers excluded, as DeepSeek counts 671B). */
size_t moeq_model_total_params(const moeq_model *model) {
    if (!model) return 0;
    size_t n = 0;
    for (int i = 0; i < model->n_tensors; i++) {
        const char *name = model->tensors[i].name;
        size_t len = strlen(name);
        int layer = -1;
        if (len >= 10 && !strcmp(name + len - 10, "_scale_inv")) continue;
        if (sscanf(name, "model.layers.%d.", &layer) == 1 && layer >= model->config.num_hidden_layers) continue;
        n += numel(&model->tensors[i]);
    }
    return n;
}
