/*
 * forward.c — the batched forward pass over a step's tokens (HF
 * modeling_deepseek.py semantics, float32 activations):
 *
 *   x = embed(tokens)
 *   per layer:  x += MLA(rmsnorm(x));  x += MLP_or_MoE(rmsnorm(x))
 *   logits = lm_head(rmsnorm(x)) for the requested rows
 *
 * Every token's arithmetic is independent of the other tokens in the step
 * (per-row ops, per-element fixed-order matmuls, per-(token, head) attention,
 * per-token MoE combine in slot order), which is the batch-invariance and
 * prefill == decode guarantee. The heavy ops go through engine->backend.
 */
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "ops.h"

/* HF builds q_a_layernorm and kv_a_layernorm without an eps argument: 1e-6 whatever rms_norm_eps says. */
#define MOEQ_LORA_NORM_EPS 1e-6f

static moeq_mm_job job(const moeq_tensor *w, int64_t row0, int64_t n_rows, const float *x, int64_t ldx, float *y,
                       int64_t ldy, int64_t n_tok) {
    return (moeq_mm_job){w, row0, n_rows, x, ldx, y, ldy, n_tok};
}

/* The whole weight as an NT job: y (T, rows) = x (T, cols) W^T. */
static moeq_mm_job linear(const moeq_tensor *w, const float *x, float *y, int64_t n_tok) {
    return job(w, 0, moeq_tensor_rows(w), x, moeq_tensor_cols(w), y, moeq_tensor_rows(w), n_tok);
}

static void rmsnorm_rows(float *out, const float *x, const float *w, int64_t n_tok, int64_t n, int64_t ld, float eps) {
    for (int64_t t = 0; t < n_tok; t++) moeq_ops_rmsnorm(out + t * ld, x + t * ld, w, n, eps);
}

/* q (T, H, nope+rope) and the layer's latents written to the cache. */
static void mla_project(moeq_engine *e, const moeq_block *b, int64_t T) {
    const moeq_layer *L = b->layer;
    const moeq_layer_vecs *v = b->vecs;
    const moeq_model_config *c = e->cfg;
    moeq_scratch *s = &e->s;
    int64_t Lr = c->kv_lora_rank, R = c->qk_rope_head_dim, H = c->num_attention_heads;
    int64_t QH = c->qk_nope_head_dim + R;
    moeq_mm_job jobs[2];
    if (c->q_lora_rank > 0) {
        jobs[0] = linear(L->q_a_proj, s->h, s->qa, T);
        jobs[1] = linear(L->kv_a_proj_with_mqa, s->h, s->kva, T);
        e->backend->matmul(e->backend, jobs, 2);
        rmsnorm_rows(s->qa, s->qa, v->q_a_norm, T, c->q_lora_rank, c->q_lora_rank, MOEQ_LORA_NORM_EPS);
        jobs[0] = linear(L->q_b_proj, s->qa, s->q, T);
        e->backend->matmul(e->backend, jobs, 1);
    } else {
        jobs[0] = linear(L->q_proj, s->h, s->q, T);
        jobs[1] = linear(L->kv_a_proj_with_mqa, s->h, s->kva, T);
        e->backend->matmul(e->backend, jobs, 2);
    }
    for (int64_t t = 0; t < T; t++) {
        const float *cs = s->cos_v + t * R / 2, *sn = s->sin_v + t * R / 2;
        float *entry = moeq_kv_cache_entry(b->cache, s->tok_seq[t], b->cache_layer, s->tok_pos[t]);
        const float *kva = s->kva + t * (Lr + R);
        moeq_ops_rmsnorm(entry, kva, v->kv_a_norm, Lr, MOEQ_LORA_NORM_EPS);
        moeq_rope_apply(&e->rope, kva + Lr, cs, sn, entry + Lr);
        for (int64_t h = 0; h < H; h++)
            moeq_rope_apply(&e->rope, s->q + (t * H + h) * QH + c->qk_nope_head_dim, cs, sn, s->qpe + (t * H + h) * R);
    }
}

/* Absorbed attention: q_nope through W_UK, scores on latents, out latent through W_UV. ov (T, H, v). */
static void mla_absorbed(moeq_engine *e, const moeq_block *b, int64_t T) {
    const moeq_layer *L = b->layer;
    const moeq_model_config *c = e->cfg;
    moeq_scratch *s = &e->s;
    int64_t Lr = c->kv_lora_rank, R = c->qk_rope_head_dim, H = c->num_attention_heads, nope = c->qk_nope_head_dim;
    int64_t V = c->v_head_dim, QH = nope + R;
    for (int64_t h = 0; h < H; h++)
        s->jobs[h] = job(L->kv_b_proj, h * (nope + V), nope, s->q + h * QH, H * QH, s->qlat + h * Lr, H * Lr, T);
    e->backend->matmul_nn(e->backend, s->jobs, (int)H);
    moeq_attn_args a = {b->cache, b->cache_layer, T, s->tok_seq, s->tok_pos, (int)H, (int)Lr, (int)R,
                        s->qlat, s->qpe, s->olat, (float)e->rope.softmax_scale};
    e->backend->attention(e->backend, &a);
    for (int64_t h = 0; h < H; h++)
        s->jobs[h] = job(L->kv_b_proj, h * (nope + V) + nope, V, s->olat + h * Lr, H * Lr, s->ov + h * V, H * V, T);
    e->backend->matmul(e->backend, s->jobs, (int)H);
}

/* Naive attention (tests): expanded K/V per token; allocates, slow, never on the serving path. */
static void mla_naive(moeq_engine *e, const moeq_block *b, int64_t T) {
    const moeq_layer *L = b->layer;
    const moeq_model_config *c = e->cfg;
    moeq_scratch *s = &e->s;
    int64_t H = c->num_attention_heads, nope = c->qk_nope_head_dim, R = c->qk_rope_head_dim, V = c->v_head_dim;
    float *qn = malloc((size_t)(H * nope) * sizeof(float));
    for (int64_t t = 0; t < T && qn; t++) {
        float *scratch = malloc((size_t)((s->tok_pos[t] + 1) * (H * (nope + V) + 1)) * sizeof(float));
        if (!scratch) break;
        for (int64_t h = 0; h < H; h++) memcpy(qn + h * nope, s->q + (t * H + h) * (nope + R), (size_t)nope * sizeof(float));
        moeq_attention_naive_token(b->cache, b->cache_layer, s->tok_seq[t], s->tok_pos[t], L->kv_b_proj, (int)H, (int)nope,
                                   (int)V, c->kv_lora_rank, (int)R, (float)e->rope.softmax_scale, qn,
                                   s->qpe + t * H * R, s->ov + t * H * V, scratch);
        free(scratch);
    }
    free(qn);
}

static void attention_sublayer(moeq_engine *e, const moeq_block *b, int64_t T) {
    const moeq_model_config *c = e->cfg;
    moeq_scratch *s = &e->s;
    int64_t D = c->hidden_size;
    rmsnorm_rows(s->h, s->x, b->vecs->in_norm, T, D, D, (float)c->rms_norm_eps);
    mla_project(e, b, T);
    if (e->naive_attention) mla_naive(e, b, T);
    else mla_absorbed(e, b, T);
    moeq_mm_job o = linear(b->layer->o_proj, s->ov, s->tmp, T);
    e->backend->matmul(e->backend, &o, 1);
    for (int64_t i = 0; i < T * D; i++) s->x[i] += s->tmp[i];
}

static void dense_mlp(moeq_engine *e, const moeq_layer *L, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t I = moeq_tensor_rows(L->mlp.gate_proj), D = e->cfg->hidden_size;
    moeq_mm_job jobs[2] = {linear(L->mlp.gate_proj, s->h, s->g, T), linear(L->mlp.up_proj, s->h, s->u, T)};
    e->backend->matmul(e->backend, jobs, 2);
    moeq_ops_silu_mul(s->g, s->g, s->u, T * I);
    jobs[0] = linear(L->mlp.down_proj, s->g, s->tmp, T);
    e->backend->matmul(e->backend, jobs, 1);
    for (int64_t i = 0; i < T * D; i++) s->x[i] += s->tmp[i];
}

/* The layer's number as HF counts it: main layers 0.., then the MTP layers. */
static int layer_number(const moeq_engine *e, const moeq_layer *L) {
    const moeq_model *m = e->model;
    int n_main = e->cfg->num_hidden_layers;
    for (int i = 0; i < m->n_mtp_layers; i++)
        if (L == &m->mtp_layers[i]) return n_main + i;
    return (int)(L - m->layers);
}

/* A token whose router saw a non-finite score: remember the first such layer of its sequence. */
static void flag_nonfinite(moeq_engine *e, const moeq_layer *L, int64_t t) {
    int *first = &e->nonfinite_layer[e->s.tok_seq[t]];
    if (*first < 0) *first = layer_number(e, L);
}

/* Route every token, then gather each expert's tokens into contiguous rows. */
static void moe_route_and_gather(moeq_engine *e, const moeq_layer *L, const moeq_layer_vecs *v, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t E = e->router.n_experts, K = e->router.top_k, D = e->cfg->hidden_size;
    moeq_mm_job r = linear(L->gate, s->h, s->router, T);
    e->backend->matmul(e->backend, &r, 1);
    for (int64_t t = 0; t < T; t++)
        if (!moeq_moe_route(&e->router, s->router + t * E, v->bias, s->rids + t * K, s->rw + t * K,
                            s->route_scratch))
            flag_nonfinite(e, L, t);
    moeq_moe_plan(s->rids, T, (int)K, (int)E, s->offsets, s->order);
    for (int64_t i = 0; i < T * K; i++) {
        int64_t slot = s->order[i];
        s->slot_row[slot] = i;
        memcpy(s->xg + i * D, s->h + (slot / K) * D, (size_t)D * sizeof(float));
    }
}

/* One GEMM per active expert (gate+up, then down), the shared expert over all tokens, all in two dispatches. */
static void moe_experts(moeq_engine *e, const moeq_layer *L, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t E = e->router.n_experts, K = e->router.top_k, D = e->cfg->hidden_size;
    int64_t MI = e->cfg->moe_intermediate_size, SI = L->shared.gate_proj ? moeq_tensor_rows(L->shared.gate_proj) : 0;
    int n = 0;
    for (int64_t x = 0; x < E; x++) {
        int64_t o = s->offsets[x], cnt = s->offsets[x + 1] - o;
        if (!cnt) continue;
        s->jobs[n++] = job(L->experts[x].gate_proj, 0, MI, s->xg + o * D, D, s->g + o * MI, MI, cnt);
        s->jobs[n++] = job(L->experts[x].up_proj, 0, MI, s->xg + o * D, D, s->u + o * MI, MI, cnt);
    }
    float *sg = s->g + T * K * MI, *su = s->u + T * K * MI;
    if (SI) {
        s->jobs[n++] = job(L->shared.gate_proj, 0, SI, s->h, D, sg, SI, T);
        s->jobs[n++] = job(L->shared.up_proj, 0, SI, s->h, D, su, SI, T);
    }
    e->backend->matmul(e->backend, s->jobs, n);
    moeq_ops_silu_mul(s->g, s->g, s->u, T * K * MI + T * SI);
    n = 0;
    for (int64_t x = 0; x < E; x++) {
        int64_t o = s->offsets[x], cnt = s->offsets[x + 1] - o;
        if (cnt) s->jobs[n++] = job(L->experts[x].down_proj, 0, D, s->g + o * MI, MI, s->down + o * D, D, cnt);
    }
    if (SI) s->jobs[n++] = job(L->shared.down_proj, 0, D, sg, SI, s->down + T * K * D, D, T);
    e->backend->matmul(e->backend, s->jobs, n);
}

/* tmp[t] = (sum over slots, best first, of w * expert_out) + shared_out. */
static void moe_combine(moeq_engine *e, int has_shared, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t K = e->router.top_k, D = e->cfg->hidden_size;
    for (int64_t t = 0; t < T; t++) {
        float *acc = s->tmp + t * D;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float w = s->rw[t * K + k];
            const float *y = s->down + s->slot_row[t * K + k] * D;
            for (int64_t d = 0; d < D; d++) acc[d] += w * y[d];
        }
        if (has_shared) {
            const float *y = s->down + (T * K + t) * D;
            for (int64_t d = 0; d < D; d++) acc[d] += y[d];
        }
    }
}

static void block_moe(moeq_engine *e, const moeq_block *b, int64_t T) {
    moe_route_and_gather(e, b->layer, b->vecs, T);
    moe_experts(e, b->layer, T);
    moe_combine(e, b->layer->shared.gate_proj != NULL, T);
}

moeq_block moeq_forward_main_block(moeq_engine *e, int layer) {
    return (moeq_block){&e->model->layers[layer], &e->vecs[layer], e->cache, layer};
}

void moeq_forward_moe(moeq_engine *e, int layer, int64_t T) {
    moeq_block b = moeq_forward_main_block(e, layer);
    block_moe(e, &b, T);
}

static void mlp_sublayer(moeq_engine *e, const moeq_block *b, int64_t T) {
    int64_t D = e->cfg->hidden_size;
    rmsnorm_rows(e->s.h, e->s.x, b->vecs->post_norm, T, D, D, (float)e->cfg->rms_norm_eps);
    if (!b->layer->is_moe) {
        dense_mlp(e, b->layer, T);
        return;
    }
    block_moe(e, b, T);
    for (int64_t i = 0; i < T * D; i++) e->s.x[i] += e->s.tmp[i];
}

void moeq_forward_block(moeq_engine *e, const moeq_block *b, int64_t T) {
    attention_sublayer(e, b, T);
    mlp_sublayer(e, b, T);
}

void moeq_forward_rope(moeq_engine *e, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t half = e->cfg->qk_rope_head_dim / 2;
    for (int64_t t = 0; t < T; t++)
        moeq_rope_cos_sin(&e->rope, s->tok_pos[t], s->cos_v + t * half, s->sin_v + t * half);
}

void moeq_forward_tokens(moeq_engine *e, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size;
    for (int64_t t = 0; t < T; t++) moeq_tensor_rows_to_f32(e->model->embed_tokens, s->tok_id[t], 1, s->x + t * D);
    moeq_forward_rope(e, T);
    for (int l = 0; l < e->cfg->num_hidden_layers; l++) {
        moeq_block b = moeq_forward_main_block(e, l);
        moeq_forward_block(e, &b, T);
    }
}

void moeq_forward_logits(moeq_engine *e, int64_t n_rows, float *logits) {
    moeq_forward_head(e, e->final_norm, e->model->lm_head, n_rows, logits);
}

void moeq_forward_head(moeq_engine *e, const float *norm, const moeq_tensor *head, int64_t n_rows, float *logits) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size;
    for (int64_t r = 0; r < n_rows; r++)
        moeq_ops_rmsnorm(s->h + r * D, s->x + s->logit_tok[r] * D, norm, D, (float)e->cfg->rms_norm_eps);
    if (n_rows == 0) return;
    moeq_mm_job j = linear(head, s->h, logits, n_rows);
    e->backend->matmul(e->backend, &j, 1);
}

void moeq_forward_linear(moeq_engine *e, const moeq_tensor *w, const float *x, float *y, int64_t n_tok) {
    moeq_mm_job j = linear(w, x, y, n_tok);
    e->backend->matmul(e->backend, &j, 1);
}
