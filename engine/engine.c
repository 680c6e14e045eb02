/*
 * engine.c — engine lifetime, sequences and the step entry point (public API
 * of moeq/engine.h). It validates, sizes memory at creation, and lays a
 * step's items out as tokens; the math is in forward.c, every op behind
 * backend.h (the backend chosen by name, params.backend).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward.h"
#include "kv_blocks.h"
#include "moe_layer.h"
#include "mtp.h"

moeq_engine_params moeq_engine_default_params(void) {
    return (moeq_engine_params){.max_seqs = 64,
                                .max_step_tokens = 2048,
                                .kv_block_tokens = 16,
                                .kv_cache_tokens = 65536,
                                .n_threads = 0,
                                .batch_invariant = 1,
                                .max_model_len = 0,
                                .backend = "cpu",
                                .device = 0,
                                .prefix_cache = 1,
                                .prefix_cache_share = 1.0,
                                .cpu_matrix = "auto",
                                .mtp_draft = "f8",
                                .cuda_graphs = "off",
                                .cuda_matrix = "lanes",
                                .head_screen = "auto",
                                .cpu_prefetch = "auto",
                                .cpu_f8_widen = "auto",
                                .cpu_k_blocked = "auto",
                                .expert_weights = "all"};
}

static moeq_err widen_layers(moeq_engine *e, char *errstr, size_t errstr_size) {
    const moeq_model_config *c = e->cfg;
    e->vecs = calloc((size_t)c->num_hidden_layers, sizeof(moeq_layer_vecs));
    e->final_norm = moeq_forward_widen(e, e->model->norm);
    if (!e->vecs || !e->final_norm) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "engine vectors");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const moeq_layer *L = &e->model->layers[l];
        moeq_layer_vecs *v = &e->vecs[l];
        v->in_norm = moeq_forward_widen(e, L->input_layernorm);
        v->post_norm = moeq_forward_widen(e, L->post_attention_layernorm);
        v->kv_a_norm = moeq_forward_widen(e, L->kv_a_layernorm);
        v->q_a_norm = moeq_forward_widen(e, L->q_a_layernorm);
        v->bias = moeq_forward_widen(e, L->is_moe ? L->e_score_correction_bias : NULL);
        if (!v->in_norm || !v->post_norm || !v->kv_a_norm || (c->q_lora_rank > 0 && !v->q_a_norm) ||
            (L->is_moe && L->e_score_correction_bias && !v->bias))
            return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "engine vectors of layer %d", l);
    }
    return MOEQ_OK;
}

static moeq_err check_dtypes(const moeq_engine *e, char *errstr, size_t errstr_size) {
    for (int i = 0; i < e->model->n_tensors; i++) {
        const moeq_tensor *t = &e->model->tensors[i];
        if (!e->backend->supports(e->backend, MOEQ_BACKEND_OP_MATMUL, t->dtype))
            return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "backend %s: dtype %s of %s", e->backend->name,
                             moeq_dtype_name(t->dtype), t->name);
    }
    return MOEQ_OK;
}

/* Bump allocation of the step arena; pass base NULL to size it. */
typedef struct arena {
    char *base;
    size_t off;
} arena;

static void *take(arena *a, size_t bytes) {
    void *p = a->base ? a->base + a->off : NULL;
    a->off += (bytes + 63) / 64 * 64;
    return p;
}

/* The step's metadata, on the host: what the engine lays out and the ops' host-side parameters. */
static void layout_host(moeq_engine *e, arena *a) {
    const moeq_model_config *c = e->cfg;
    size_t T = (size_t)e->params.max_step_tokens, H = c->num_attention_heads;
    size_t E = c->n_routed_experts > 0 ? c->n_routed_experts : 1;
    size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
    moeq_scratch *s = &e->s;
    s->finite = take(a, T);
    s->rids = take(a, T * K * sizeof(int32_t));
    s->tok_id = take(a, T * sizeof(int32_t));
    s->tok_seq = take(a, T * sizeof(int32_t));
    s->tok_pos = take(a, T * sizeof(int64_t));
    s->logit_tok = take(a, T * sizeof(int64_t));
    s->max_jobs = (int)(2 * H + 2 * E + 8);
    s->jobs = take(a, (size_t)s->max_jobs * sizeof(moeq_mm_job));
}

/* The step's activations, in the backend's arena. */
static void layout_scratch(moeq_engine *e, arena *a) {
    const moeq_model_config *c = e->cfg;
    size_t T = (size_t)e->params.max_step_tokens, D = c->hidden_size, H = c->num_attention_heads;
    size_t L = c->kv_lora_rank, R = c->qk_rope_head_dim, QH = c->qk_nope_head_dim + R, V = c->v_head_dim;
    size_t E = c->n_routed_experts > 0 ? c->n_routed_experts : 1, K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
    size_t MI = c->moe_intermediate_size, SI = (size_t)c->n_shared_experts * MI, I = c->intermediate_size;
    size_t gu = T * I > T * K * MI + T * SI ? T * I : T * K * MI + T * SI, f = sizeof(float);
    moeq_scratch *s = &e->s;
    s->x = take(a, T * D * f);
    s->h = take(a, T * D * f);
    s->tmp = take(a, T * D * f);
    s->qa = take(a, T * (c->q_lora_rank > 0 ? c->q_lora_rank : 1) * f);
    s->q = take(a, T * H * QH * f);
    s->kva = take(a, T * (L + R) * f);
    s->qpe = take(a, T * H * R * f);
    s->qlat = take(a, T * H * L * f);
    s->olat = take(a, T * H * L * f);
    s->ov = take(a, T * H * V * f);
    s->router = take(a, T * E * f);
    s->rw = take(a, T * K * f);
    s->slot_row = take(a, T * K * sizeof(int64_t));
    s->dids = take(a, T * K * sizeof(int32_t));
    s->moe_plan = take(a, (size_t)MOEQ_MOE_PLAN_LEN(E, T * K) * sizeof(int64_t));
    s->xg = take(a, T * K * D * f);
    s->g = take(a, gu * f);
    s->u = take(a, gu * f);
    s->down = take(a, (T * K + T) * D * f);
    s->route_scratch = take(a, (2 * E + (c->n_group > 0 ? c->n_group : 1)) * f);
    s->cos_v = take(a, T * R / 2 * f);
    s->sin_v = take(a, T * R / 2 * f);
    int mtp = e->model->n_mtp_layers > 0;
    s->hid = mtp ? take(a, T * D * f) : NULL;
    s->eh = mtp ? take(a, T * 2 * D * f) : NULL;
    /* a device backend's lm_head writes here; records and the rows needed come back (moeq_forward_head) */
    s->logits_rows = e->backend->host_visible ? 0 : (T < MOEQ_LOGITS_CHUNK ? (int64_t)T : MOEQ_LOGITS_CHUNK);
    s->logits = s->logits_rows ? take(a, (size_t)s->logits_rows * (size_t)c->vocab_size * f) : NULL;
}

static int64_t max_weight_cols(const moeq_model *model) {
    int64_t m = 1;
    for (int i = 0; i < model->n_tensors; i++)
        if (moeq_tensor_cols(&model->tensors[i]) > m) m = moeq_tensor_cols(&model->tensors[i]);
    return m;
}

/* The CPU kernels' choices (cpu/cpu_tuning.h): each key, its two values besides auto, and its field. */
static const struct {
    const char *key, *off, *on;
    size_t field;
} cpu_choices[3] = {{"cpu_prefetch", "l1", "l2", offsetof(moeq_engine_params, cpu_prefetch)},
                    {"cpu_f8_widen", "f16", "f32", offsetof(moeq_engine_params, cpu_f8_widen)},
                    {"cpu_k_blocked", "off", "on", offsetof(moeq_engine_params, cpu_k_blocked)}};

/* Choice i's value in p for the backend: 0 = auto (this CPU's rule), 1 = off, 2 = on; -1 for anything else. */
static int cpu_choice(const moeq_engine_params *p, int i) {
    const char *v = (const char *)p + cpu_choices[i].field;
    return !strcmp(v, "auto") ? 0 : !strcmp(v, cpu_choices[i].off) ? 1 : !strcmp(v, cpu_choices[i].on) ? 2 : -1;
}

static moeq_err check_params(const moeq_engine_params *p, const moeq_model_config *c, char *errstr,
                             size_t errstr_size) {
    if (p->max_seqs < 1 || p->max_step_tokens < 1 || p->kv_block_tokens < 1 || p->kv_cache_tokens < 1 ||
        p->n_threads < 0 || p->max_model_len < 0 || p->device < 0 ||
        !(p->prefix_cache_share >= 0 && p->prefix_cache_share <= 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "engine params: max_seqs, max_step_tokens, kv_block_tokens, kv_cache_tokens must be >= 1, "
                         "n_threads, max_model_len, device >= 0, prefix_cache_share in 0..1");
    if (strcmp(p->cpu_matrix, "auto") && strcmp(p->cpu_matrix, "lanes") && strcmp(p->cpu_matrix, "amx"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "cpu_matrix \"%.8s\": the choices are auto, lanes and amx", p->cpu_matrix);
    if (strcmp(p->cuda_graphs, "off") && strcmp(p->cuda_graphs, "auto") && strcmp(p->cuda_graphs, "on"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "cuda_graphs \"%.8s\": the choices are off, auto and on", p->cuda_graphs);
    if (!strcmp(p->cuda_graphs, "on") && strcmp(p->backend, "cuda"))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "cuda_graphs = on, but backend %.16s has no CUDA graphs (cuda has; auto runs eagerly "
                         "elsewhere)", p->backend);
    if (strcmp(p->cuda_matrix, "auto") && strcmp(p->cuda_matrix, "lanes"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "cuda_matrix \"%.8s\": the choices are auto and lanes", p->cuda_matrix);
    if (!strcmp(p->cpu_matrix, "amx") && !moeq_engine_cpu_amx())
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "cpu_matrix = amx, but this CPU cannot run AMX tiles: %s", moeq_engine_cpu_amx_describe());
    if (strcmp(p->head_screen, "auto") && strcmp(p->head_screen, "off"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "head_screen \"%.8s\": the choices are auto and off", p->head_screen);
    for (int i = 0; i < 3; i++)
        if (cpu_choice(p, i) < 0)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "%s \"%.8s\": the choices are auto, %s and %s",
                             cpu_choices[i].key, (const char *)p + cpu_choices[i].field, cpu_choices[i].off,
                             cpu_choices[i].on);
    if (strcmp(p->expert_weights, "all") && strcmp(p->expert_weights, "group"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "expert_weights \"%.8s\": the choices are all and group", p->expert_weights);
    if (strcmp(p->mtp_draft, "exact") && strcmp(p->mtp_draft, "f8") && strcmp(p->mtp_draft, "e4m3"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "mtp_draft \"%.8s\": the choices are exact, f8 and e4m3", p->mtp_draft);
    if (p->max_model_len > c->max_position_embeddings)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "max_model_len %d exceeds the model's max_position_embeddings %d", p->max_model_len,
                         c->max_position_embeddings);
    return MOEQ_OK;
}

int moeq_engine_max_model_len(const moeq_engine *engine) {
    if (!engine) return 0;
    return engine->params.max_model_len > 0 ? engine->params.max_model_len : engine->cfg->max_position_embeddings;
}

uint64_t moeq_forward_cache_salt(const moeq_engine *e, int kind) {
    const moeq_model_config *c = e->cfg;
    int64_t v[] = {kind, e->params.batch_invariant, strcmp(e->params.cpu_matrix, "lanes") && moeq_engine_cpu_amx(),
                   c->num_hidden_layers, c->hidden_size, c->vocab_size,
                   c->kv_lora_rank, c->qk_rope_head_dim, c->n_routed_experts, e->model->n_tensors,
                   (int64_t)(uintptr_t)e->model, e->params.kv_block_tokens,
                   kind == 1 && moeq_mtp_draft_f8(e)};
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < sizeof v; i++) h = (h ^ ((const unsigned char *)v)[i]) * 0x100000001b3ULL;
    return h;
}

int64_t moeq_forward_max_cached(const moeq_engine *e, int64_t capacity_tokens) {
    int64_t bt = e->params.kv_block_tokens, n = (capacity_tokens + bt - 1) / bt;
    int64_t max = (int64_t)(e->params.prefix_cache_share * (double)n);
    return max >= n ? 0 : max > 0 ? max : -1; /* kv_blocks: 0 = all, -1 = none */
}

static void copy_in_backend(void *ctx, float *dst, const float *src, size_t n_floats) {
    moeq_backend *b = ctx;
    b->copy(b, dst, src, n_floats * sizeof(float));
}

moeq_err moeq_forward_cache_new(moeq_engine *e, const moeq_kv_cache_params *params, int32_t *scratch, float **pool,
                                moeq_kv_cache **out, char *errstr, size_t errstr_size) {
    moeq_kv_cache_params kp = *params, one = *params;
    one.capacity_tokens = one.block_tokens; /* a block's floats: every layer's entries of block_tokens positions */
    size_t bytes = (moeq_kv_cache_pool_floats(&kp) + (scratch ? moeq_kv_cache_pool_floats(&one) : 0)) * sizeof(float);
    if (scratch) *scratch = (int32_t)((kp.capacity_tokens + kp.block_tokens - 1) / kp.block_tokens);
    if (params->n_layers >= 1 && params->entry_floats >= 1 && params->block_tokens >= 1 &&
        params->capacity_tokens >= 1 && !(*pool = e->backend->alloc(e->backend, MOEQ_BUFFER_CACHE, bytes)))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "kv cache pool of %zu bytes (backend %s)", bytes,
                         e->backend->name);
    kp.pool = *pool;
    kp.copy = copy_in_backend;
    kp.copy_ctx = e->backend;
    return moeq_kv_cache_new(&kp, out, errstr, errstr_size);
}

/* The backend by name, sized for the longest sequence and the most jobs a step issues. */
static moeq_err backend_create(moeq_engine *e, char *errstr, size_t errstr_size) {
    const moeq_model_config *c = e->cfg;
    int64_t bt = e->params.kv_block_tokens, max_ctx = (e->params.kv_cache_tokens + bt - 1) / bt * bt;
    int E = c->n_routed_experts > 0 ? c->n_routed_experts : 1;
    int n_threads = e->params.n_threads ? e->params.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    moeq_backend_config bc = {.n_threads = n_threads > 0 ? n_threads : 1,
                              .batch_invariant = e->params.batch_invariant,
                              .max_k = max_weight_cols(e->model),
                              .max_ctx = max_ctx,
                              .max_jobs = 2 * c->num_attention_heads + 2 * E + 8,
                              .max_tokens = e->params.max_step_tokens,
                              .device = e->params.device,
                              .amx = strcmp(e->params.cpu_matrix, "lanes") && moeq_engine_cpu_amx(),
                              .graphs = strcmp(e->params.cuda_graphs, "off") != 0,
                              .cuda_few_token = !strcmp(e->params.cuda_matrix, "auto"),
                              .cpu_prefetch = cpu_choice(&e->params, 0),
                              .cpu_f8_widen = cpu_choice(&e->params, 1),
                              .cpu_k_blocked = cpu_choice(&e->params, 2),
                              .experts_deferred = !strcmp(e->params.expert_weights, "group") &&
                                                  c->n_routed_experts > 0};
    moeq_err err = moeq_backend_new(e->params.backend, &bc, &e->backend, errstr, errstr_size);
    if (err) return err;
    if ((err = check_dtypes(e, errstr, errstr_size))) return err;
    return e->backend->map_weights(e->backend, e->model, errstr, errstr_size);
}

static moeq_err engine_build(moeq_engine *e, char *errstr, size_t errstr_size) {
    const moeq_model_config *c = e->cfg;
    moeq_err err = moeq_rope_init(&e->rope, c, errstr, errstr_size);
    if (err) return err;
    if (c->n_routed_experts > 0 && (err = moeq_moe_router_init(&e->router, c, errstr, errstr_size))) return err;
    if ((err = backend_create(e, errstr, errstr_size))) return err;
    if ((err = widen_layers(e, errstr, errstr_size))) return err;
    moeq_kv_cache_params kp = {c->num_hidden_layers, c->kv_lora_rank + c->qk_rope_head_dim, e->params.kv_block_tokens,
                               e->params.kv_cache_tokens, e->params.max_seqs, NULL, NULL, NULL,
                               e->params.prefix_cache, 0, moeq_forward_max_cached(e, e->params.kv_cache_tokens),
                               moeq_forward_cache_salt(e, 0)};
    /* cuda_graphs on a backend with graphs: steps are padded to their bucket, the padding on a block of its own */
    int pad = strcmp(e->params.cuda_graphs, "off") && e->backend->graph_rows && e->backend->graph_begin &&
              e->backend->graph_end && e->params.kv_cache_tokens / e->params.kv_block_tokens < INT32_MAX - 1;
    e->graph_scratch = -1;
    if ((err = moeq_forward_cache_new(e, &kp, pad ? &e->graph_scratch : NULL, &e->cache_pool, &e->cache, errstr,
                                      errstr_size)))
        return err;
    if ((err = moeq_mtp_state_new(e, &e->mtp, errstr, errstr_size))) return err;
    if ((err = moeq_moe_layer_new(e, &e->moe, errstr, errstr_size))) return err;
    if (!(e->nonfinite_layer = malloc((size_t)e->params.max_seqs * sizeof(int))))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "engine sequence flags");
    for (int i = 0; i < e->params.max_seqs; i++) e->nonfinite_layer[i] = -1;
    arena a = {0}, h = {0};
    layout_scratch(e, &a);
    layout_host(e, &h);
    e->arena_bytes = a.off;
    if (!(e->arena = e->backend->alloc(e->backend, MOEQ_BUFFER_ARENA, a.off)) ||
        !(e->host_arena = aligned_alloc(64, h.off)))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "step scratch of %zu bytes (max_step_tokens %d)",
                         a.off + h.off, e->params.max_step_tokens);
    a = (arena){e->arena, 0};
    h = (arena){e->host_arena, 0};
    layout_scratch(e, &a);
    layout_host(e, &h);
    return MOEQ_OK;
}

moeq_err moeq_engine_new(const moeq_model *model, const moeq_engine_params *params, moeq_engine **out, char *errstr,
                         size_t errstr_size) {
    if (!model || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "model and out are required");
    *out = NULL;
    moeq_engine_params p = params ? *params : moeq_engine_default_params();
    moeq_err err = check_params(&p, &model->config, errstr, errstr_size);
    if (err) return err;
    moeq_engine *e = calloc(1, sizeof(*e));
    if (!e) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "engine");
    e->model = model;
    e->cfg = &model->config;
    e->params = p;
    if ((err = engine_build(e, errstr, errstr_size))) {
        moeq_engine_destroy(e);
        return err;
    }
    *out = e;
    return MOEQ_OK;
}

void moeq_engine_destroy(moeq_engine *engine) {
    if (!engine) return;
    moeq_backend *b = engine->backend; /* NULL when its creation failed: then nothing below was allocated */
    moeq_kv_cache_destroy(engine->cache);
    moeq_forward_screen_destroy(engine);
    moeq_mtp_state_destroy(engine, engine->mtp);
    moeq_moe_layer_destroy(engine->moe, b);
    if (b && engine->vecs)
        for (int l = 0; l < engine->cfg->num_hidden_layers; l++) {
            moeq_layer_vecs *v = &engine->vecs[l];
            b->release(b, v->in_norm);
            b->release(b, v->post_norm);
            b->release(b, v->q_a_norm);
            b->release(b, v->kv_a_norm);
            b->release(b, v->bias);
        }
    free(engine->vecs);
    if (b) {
        b->release(b, engine->final_norm);
        b->release(b, engine->cache_pool);
        b->release(b, engine->arena);
    }
    free(engine->host_arena);
    free(engine->nonfinite_layer);
    moeq_backend_destroy(b);
    free(engine);
}

const char *moeq_engine_backend_info(const moeq_engine *engine) {
    if (!engine || !engine->backend) return "(none)";
    const moeq_backend *b = engine->backend;
    return b->describe ? b->describe(b) : b->name;
}

size_t moeq_engine_kv_bytes_per_token(const moeq_engine *engine) { return moeq_kv_cache_bytes_per_token(engine->cache); }

size_t moeq_engine_step_arena_bytes(const moeq_engine *engine) { return engine->arena_bytes; }

void moeq_engine_device_memory(const moeq_engine *engine, size_t *used, size_t *total) {
    *used = *total = 0;
    const moeq_backend *b = engine ? engine->backend : NULL;
    if (b && b->memory) b->memory(b, used, total);
}

moeq_err moeq_engine_seq_new(moeq_engine *engine, int *seq_id) {
    if (!engine || !seq_id) return MOEQ_ERR_INVALID_ARG;
    moeq_err err = moeq_kv_cache_seq_new(engine->cache, seq_id);
    if (!err) moeq_mtp_seq_opened(engine, *seq_id);
    if (!err) engine->nonfinite_layer[*seq_id] = -1;
    return err;
}

int moeq_engine_seq_nonfinite_layer(const moeq_engine *engine, int seq_id) {
    if (!engine || !moeq_kv_cache_seq_alive(engine->cache, seq_id)) return -1;
    return engine->nonfinite_layer[seq_id];
}

void moeq_engine_seq_free(moeq_engine *engine, int seq_id) {
    if (!engine) return;
    moeq_kv_cache_seq_free(engine->cache, seq_id);
    moeq_mtp_seq_freed(engine, seq_id);
}

int moeq_engine_seq_len(const moeq_engine *engine, int seq_id) {
    return engine ? (int)moeq_kv_cache_seq_len(engine->cache, seq_id) : -1;
}

void moeq_engine_kv_blocks(const moeq_engine *engine, int mtp, int64_t *takeable, int64_t *total) {
    const moeq_kv_cache *c = !engine ? NULL : mtp ? moeq_mtp_cache(engine) : engine->cache;
    *takeable = c ? moeq_kv_cache_free_blocks(c) : 0;
    *total = c ? moeq_kv_cache_total_blocks(c) : 0;
}

int64_t moeq_engine_seq_blocks_to_grow(const moeq_engine *engine, int seq_id, int mtp, int64_t n_tokens) {
    if (!engine || !moeq_kv_cache_seq_alive(engine->cache, seq_id)) return -1;
    if (!mtp) return moeq_kv_cache_blocks_needed(engine->cache, seq_id, n_tokens);
    if (!moeq_mtp_seq_on(engine, seq_id)) return -1;
    return moeq_kv_cache_blocks_needed(moeq_mtp_cache(engine), seq_id, n_tokens);
}

moeq_err moeq_engine_seq_truncate(moeq_engine *engine, int seq_id, int n_tokens) {
    if (!engine) return MOEQ_ERR_INVALID_ARG;
    moeq_err err = moeq_kv_cache_truncate(engine->cache, seq_id, n_tokens);
    if (!err) moeq_mtp_seq_truncated(engine, seq_id, n_tokens);
    return err;
}

/* What a fork can refuse before anything changes; the slot and the blocks are checked as they are taken. */
static moeq_err check_fork(const moeq_engine *e, int src, int n, int mtp, int32_t next_token, char *errstr,
                           size_t errstr_size) {
    int64_t len = moeq_kv_cache_seq_len(e->cache, src);
    if (len < 0) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "fork: seq %d not alive", src);
    if (mtp != 0 && mtp != 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "fork: mtp is %d, must be 0 or 1", mtp);
    if (mtp && !moeq_mtp_seq_on(e, src))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "fork: mtp = 1 but seq %d is not marked (moeq_engine_seq_set_mtp)", src);
    int64_t max = mtp ? len - 1 : len; /* mtp = 1: entry n - 1 reads src's token at n */
    if (n < 1 || n > max)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "fork: n_tokens %d outside 1..%lld (seq %d holds %lld tokens%s)", n, (long long)max, src,
                         (long long)len, mtp ? "; mtp = 1 needs the token at n_tokens" : "");
    if (mtp && (next_token < 0 || next_token >= e->cfg->vocab_size))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "fork: next_token %d outside vocab %d",
                         next_token, e->cfg->vocab_size);
    return MOEQ_OK;
}

moeq_err moeq_engine_seq_fork(moeq_engine *engine, int src_seq, int n_tokens, int mtp, int32_t next_token,
                              int *dst_seq, char *errstr, size_t errstr_size) {
    if (!engine || !dst_seq)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "fork: engine and dst_seq are required");
    moeq_err err = check_fork(engine, src_seq, n_tokens, mtp, next_token, errstr, errstr_size);
    if (err) return err;
    int dst;
    if (moeq_engine_seq_new(engine, &dst))
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "fork: no free sequence slot (max_seqs %d)",
                         engine->params.max_seqs);
    if ((err = moeq_kv_cache_seq_fork(engine->cache, src_seq, n_tokens, dst))) {
        moeq_engine_seq_free(engine, dst);
        return moeq_errf(err, errstr, errstr_size, "fork: kv cache %s of seq %d at %d tokens",
                         err == MOEQ_ERR_LIMIT ? "full, no block to copy the partial block into" : "refused the fork",
                         src_seq, n_tokens);
    }
    if (mtp && (err = moeq_mtp_seq_forked(engine, src_seq, n_tokens, next_token, dst, errstr, errstr_size))) {
        moeq_engine_seq_free(engine, dst); /* drops the shared references again: src's blocks as before */
        return err;
    }
    engine->nonfinite_layer[dst] = engine->nonfinite_layer[src_seq]; /* the shared prefix's record */
    *dst_seq = dst;
    return MOEQ_OK;
}

/* ---- prefix cache -------------------------------------------------------------- */

/* Whole blocks of prompt the caches hold, at most max_blocks, leaving the last prompt token to be stepped. */
static int64_t prefix_blocks(const moeq_engine *e, const int32_t *prompt, int n_prompt, int mtp, int64_t max_blocks) {
    int64_t bt = e->params.kv_block_tokens, lim = (n_prompt - 1) / bt;
    if (max_blocks < lim) lim = max_blocks;
    if (!e->params.prefix_cache || lim <= 0) return 0;
    int64_t n = moeq_kv_cache_lookup(e->cache, prompt, n_prompt - 1, lim);
    if (mtp && n > 0) n = moeq_mtp_prefix_blocks(e, prompt, n_prompt, n);
    return n;
}

int64_t moeq_engine_prefix_held_blocks(const moeq_engine *e, const int32_t *prompt, int n_prompt, int mtp) {
    if (!e || !prompt || n_prompt < 2 || !e->params.prefix_cache || (mtp && !e->mtp)) return 0;
    int64_t lim = (n_prompt - 1) / e->params.kv_block_tokens;
    if (!mtp) return moeq_kv_cache_lookup_held(e->cache, prompt, n_prompt - 1, lim);
    return moeq_kv_cache_lookup_held(moeq_mtp_cache(e), prompt, n_prompt, lim);
}

int moeq_engine_prefix_lookup(const moeq_engine *engine, const int32_t *prompt, int n_prompt, int mtp) {
    if (!engine || !prompt || n_prompt < 1 || (mtp && !engine->mtp)) return 0;
    return (int)(prefix_blocks(engine, prompt, n_prompt, mtp, INT64_MAX) * engine->params.kv_block_tokens);
}

moeq_err moeq_engine_seq_new_prefix(moeq_engine *e, const int32_t *prompt, int n_prompt, int max_cached, int mtp,
                                    int *seq_id, int *n_cached, char *errstr, size_t errstr_size) {
    if (!e || !prompt || n_prompt < 1 || !seq_id || !n_cached || (mtp != 0 && mtp != 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "seq_new_prefix: engine, prompt (n_prompt >= 1), seq_id, n_cached required, mtp 0 or 1");
    if (mtp && !e->mtp) return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "seq_new_prefix: no MTP layer");
    int seq;
    if (moeq_engine_seq_new(e, &seq))
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "no free sequence slot (max_seqs %d)", e->params.max_seqs);
    if (mtp) moeq_engine_seq_set_mtp(e, seq, 1); /* an empty sequence with an MTP layer: cannot fail */
    int64_t bt = e->params.kv_block_tokens, max = max_cached >= 0 ? max_cached / bt : INT64_MAX;
    int64_t n = prefix_blocks(e, prompt, n_prompt, mtp, max);
    if (n > 0) n = moeq_kv_cache_take_prefix(e->cache, seq, prompt, n * bt, n);
    if (mtp && n > 0) {
        int64_t m = moeq_mtp_seq_take_prefix(e, seq, prompt, n_prompt, n);
        if (m < n) moeq_kv_cache_truncate(e->cache, seq, m * bt); /* (the lookup said n: cannot happen) */
        n = m;
    }
    e->prefix_lookups++;
    e->prefix_hits += n > 0;
    e->prefix_lookup_tokens += n_prompt - 1;
    e->prefix_hit_tokens += n * bt;
    *seq_id = seq;
    *n_cached = (int)(n * bt);
    return MOEQ_OK;
}

void moeq_engine_get_prefix_stats(const moeq_engine *e, moeq_engine_prefix_stats *stats) {
    moeq_kv_blocks_stats main = {0}, mtp = {0};
    moeq_kv_cache_prefix_stats(e->cache, &main);
    if (e->mtp) moeq_mtp_prefix_stats(e, &mtp);
    *stats = (moeq_engine_prefix_stats){.lookups = e->prefix_lookups,
                                        .hits = e->prefix_hits,
                                        .lookup_tokens = e->prefix_lookup_tokens,
                                        .hit_tokens = e->prefix_hit_tokens,
                                        .cached_blocks = main.cached,
                                        .registered_blocks = main.registered,
                                        .evictions = main.evictions + mtp.evictions,
                                        .collisions = main.collisions + mtp.collisions};
}

void moeq_engine_set_naive_attention(moeq_engine *engine, int on) { engine->naive_attention = on; }

/* Everything that can fail is checked before anything is appended. */
static moeq_err check_step(moeq_engine *e, const moeq_step_item *items, int n_items, size_t logits_rows,
                           int64_t *n_tok, int64_t *n_rows, char *errstr, size_t errstr_size) {
    int64_t toks = 0, rows = 0, blocks = 0, mtp_blocks = 0;
    for (int i = 0; i < n_items; i++) {
        const moeq_step_item *it = &items[i];
        if (!moeq_kv_cache_seq_alive(e->cache, it->seq_id) || it->n_tokens < 1 || !it->tokens)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "item %d: seq %d not alive or no tokens", i,
                             it->seq_id);
        for (int j = 0; j < i; j++)
            if (items[j].seq_id == it->seq_id)
                return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "item %d: seq %d appears twice", i,
                                 it->seq_id);
        for (int k = 0; k < it->n_tokens; k++)
            if (it->tokens[k] < 0 || it->tokens[k] >= e->cfg->vocab_size)
                return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "item %d: token %d outside vocab %d", i,
                                 it->tokens[k], e->cfg->vocab_size);
        int64_t len = moeq_kv_cache_seq_len(e->cache, it->seq_id) + it->n_tokens;
        if (len > moeq_engine_max_model_len(e))
            return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size,
                             "item %d: sequence of %lld tokens exceeds the model's context of %d tokens "
                             "(max_position_embeddings / max_model_len)",
                             i, (long long)len, moeq_engine_max_model_len(e));
        if (len > moeq_kv_cache_max_seq_tokens(e->cache))
            return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "item %d: sequence of %lld tokens exceeds the cache",
                             i, (long long)len);
        blocks += moeq_kv_cache_blocks_needed(e->cache, it->seq_id, len);
        moeq_err err = moeq_mtp_seq_on(e, it->seq_id) ? moeq_mtp_check_item(e, it, i, &mtp_blocks, errstr, errstr_size) : MOEQ_OK;
        if (err) return err;
        toks += it->n_tokens;
        rows += it->all_logits ? it->n_tokens : 1;
    }
    if (toks > e->params.max_step_tokens)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "step of %lld tokens exceeds max_step_tokens %d",
                         (long long)toks, e->params.max_step_tokens);
    if (blocks > moeq_kv_cache_free_blocks(e->cache))
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "kv cache full: %lld blocks needed, %lld free",
                         (long long)blocks, (long long)moeq_kv_cache_free_blocks(e->cache));
    if (mtp_blocks > 0) {
        moeq_err err = moeq_mtp_check_blocks(e, mtp_blocks, errstr, errstr_size);
        if (err) return err;
    }
    if ((size_t)rows > logits_rows)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "logits buffer of %zu rows, step needs %lld",
                         logits_rows, (long long)rows);
    *n_tok = toks;
    *n_rows = rows;
    return MOEQ_OK;
}

/*
 * A group rank's step with no tokens (or one its checks refused): its part in every layer's exchange, so the
 * others' rows are served and the group stays in lockstep. err: the refusal, returned after the exchanges.
 */
static moeq_err empty_step(moeq_engine *e, moeq_err err, char *errstr, size_t errstr_size) {
    e->main_steps++;
    moeq_moe_layer_run_empty(e);
    e->backend->sync(e->backend);
    char why[256];
    moeq_err ex = moeq_moe_layer_status(e, why, sizeof why);
    if (ex) return moeq_errf(ex, errstr, errstr_size, "%s", why); /* the group failed: that is what matters now */
    return err;
}

moeq_err moeq_engine_ep_params(const moeq_engine *e, const moeq_ep_params *base, moeq_ep_params *out, char *errstr,
                               size_t errstr_size) {
    if (!e || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "engine and out are required");
    if (e->cfg->n_routed_experts <= 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "the model has no routed experts to spread");
    *out = base ? *base : moeq_ep_default_params();
    out->n_experts = e->cfg->n_routed_experts;
    out->hidden = e->cfg->hidden_size;
    out->top_k = e->cfg->num_experts_per_tok;
    out->max_tokens = e->params.max_step_tokens;
    return MOEQ_OK;
}

moeq_err moeq_engine_join_group(moeq_engine *e, moeq_ep *ep, const moeq_ep_params *p, char *errstr,
                                size_t errstr_size) {
    if (!e || !ep || !p)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "engine, ep and params are required");
    moeq_ep_params want;
    moeq_err err = moeq_engine_ep_params(e, p, &want, errstr, errstr_size);
    if (err) return err;
    if (p->n_experts != want.n_experts || p->hidden != want.hidden || p->top_k != want.top_k ||
        p->max_tokens != want.max_tokens)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "ep shape experts=%d hidden=%d top_k=%d max_tokens=%d; the engine needs %d, %d, %d, %d "
                         "(moeq_engine_ep_params)", p->n_experts, p->hidden, p->top_k, p->max_tokens, want.n_experts,
                         want.hidden, want.top_k, want.max_tokens);
    for (int i = 0; i < e->params.max_seqs; i++)
        if (moeq_kv_cache_seq_alive(e->cache, i))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "join the group before any sequence");
    /* MTP stays: its layers run whole on every rank (moe_layer.c), so a draft is no collective and a round's
     * verify step is the tick's one main step */
    return moeq_moe_layer_join(e, ep, p->rank, p->n_ranks, errstr, errstr_size);
}

int moeq_engine_in_group(const moeq_engine *e) { return e && moeq_moe_layer_in_group(e); }

void moeq_engine_expert_residency(const moeq_engine *e, int64_t *held, int64_t *total, size_t *bytes) {
    int64_t h = 0, t = 0;
    size_t b = 0;
    if (e) moeq_moe_layer_residency(e, &h, &t, &b);
    if (held) *held = h;
    if (total) *total = t;
    if (bytes) *bytes = b;
}

int64_t moeq_engine_main_steps(const moeq_engine *e) { return e ? e->main_steps : 0; }

const uint64_t *moeq_engine_expert_counts(const moeq_engine *e, int *n_layers, int *n_experts) {
    *n_layers = 0, *n_experts = 0;
    if (!e || !e->moe) return NULL;
    *n_experts = e->cfg->n_routed_experts;
    return moeq_moe_layer_counts(e, n_layers);
}

moeq_err moeq_engine_group_status(const moeq_engine *e, char *errstr, size_t errstr_size) {
    return e && e->moe ? moeq_moe_layer_status(e, errstr, errstr_size) : MOEQ_OK;
}

moeq_err moeq_engine_step(moeq_engine *engine, const moeq_step_item *items, int n_items, float *logits,
                          size_t logits_rows, char *errstr, size_t errstr_size) {
    return moeq_engine_step_hidden(engine, items, n_items, logits, logits_rows, NULL, 0, errstr, errstr_size);
}

static moeq_err step_out(moeq_engine *engine, const moeq_step_item *items, int n_items, const moeq_step_out *out,
                         float *hidden, size_t hidden_rows, char *errstr, size_t errstr_size);

moeq_err moeq_engine_step_hidden(moeq_engine *engine, const moeq_step_item *items, int n_items, float *logits,
                                 size_t logits_rows, float *hidden, size_t hidden_rows, char *errstr,
                                 size_t errstr_size) {
    moeq_step_out out = {.logits = logits, .logits_rows = logits_rows};
    return step_out(engine, items, n_items, &out, hidden, hidden_rows, errstr, errstr_size);
}

moeq_err moeq_engine_step_out(moeq_engine *engine, const moeq_step_item *items, int n_items,
                              const moeq_step_out *out, char *errstr, size_t errstr_size) {
    if (!out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "step out is NULL");
    return step_out(engine, items, n_items, out, NULL, 0, errstr, errstr_size);
}

int moeq_engine_logits_on_device(const moeq_engine *engine) { return engine && !engine->backend->host_visible; }

static moeq_err step_out(moeq_engine *engine, const moeq_step_item *items, int n_items, const moeq_step_out *out,
                         float *hidden, size_t hidden_rows, char *errstr, size_t errstr_size) {
    if (!engine || (n_items > 0 && !items) || n_items < 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "engine and items are required");
    int64_t n_tok = 0, n_rows = 0;
    moeq_err err = check_step(engine, items, n_items, out->logits_rows, &n_tok, &n_rows, errstr, errstr_size);
    if ((err || n_tok == 0) && moeq_moe_layer_in_group(engine)) return empty_step(engine, err, errstr, errstr_size);
    if (err || n_tok == 0) return err;
    if (n_rows > 0 && (!out->logits || (out->records && !out->have_row)))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "logits (or have_row with records) is NULL");
    if (hidden && (size_t)n_rows > hidden_rows)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "hidden buffer of %zu rows, step needs %lld",
                         hidden_rows, (long long)n_rows);
    /* expert_weights = group and no group joined: a lone engine still runs, with every expert */
    if (!moeq_moe_layer_mapped(engine) && (err = moeq_moe_layer_map(engine, NULL, 0, errstr, errstr_size)))
        return err;
    moeq_scratch *s = &engine->s;
    int64_t t = 0, r = 0;
    for (int i = 0; i < n_items; i++) {
        const moeq_step_item *it = &items[i];
        int64_t len0 = moeq_kv_cache_seq_len(engine->cache, it->seq_id);
        if ((err = moeq_kv_cache_grow(engine->cache, it->seq_id, len0 + it->n_tokens)))
            return moeq_errf(err, errstr, errstr_size, "kv cache grow"); /* checked above: a bug */
        for (int k = 0; k < it->n_tokens; k++, t++) {
            s->tok_id[t] = it->tokens[k];
            s->tok_seq[t] = it->seq_id;
            s->tok_pos[t] = len0 + k;
            if (it->all_logits || k == it->n_tokens - 1) s->logit_tok[r++] = t;
        }
    }
    engine->main_steps++;
    moeq_forward_tokens(engine, n_tok, n_tok == n_items);
    for (int i = 0; i < n_items; i++) { /* their entries are computed: full blocks get keys (prefix cache) */
        int64_t len = moeq_kv_cache_seq_len(engine->cache, items[i].seq_id);
        moeq_kv_cache_set_tokens(engine->cache, items[i].seq_id, len - items[i].n_tokens, items[i].tokens,
                                 items[i].n_tokens);
    }
    moeq_forward_logits(engine, n_rows, out); /* leaves the normed rows in s.h */
    moeq_moe_layer_flush(engine); /* the pass's router flags, once the logits are out: no wait before the head */
    if (hidden)
        engine->backend->download(engine->backend, hidden, s->h,
                                  (size_t)(n_rows * engine->cfg->hidden_size) * sizeof(float));
    engine->backend->sync(engine->backend);
    if ((err = moeq_backend_status(engine->backend, errstr, errstr_size))) return err;
    if ((err = moeq_moe_layer_status(engine, errstr, errstr_size))) return err;
    int any_mtp = 0;
    for (int i = 0; i < n_items; i++) any_mtp |= moeq_mtp_seq_on(engine, items[i].seq_id);
    if (any_mtp) moeq_mtp_after_step(engine, items, n_items, n_tok);
    return MOEQ_OK;
}
