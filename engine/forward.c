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
 * prefill == decode guarantee. Every op goes through engine->backend, on
 * the backend's buffers: this file composes ops and builds their plain-data
 * parameters; it reads only host metadata (positions, the router's finite
 * flags) and never an activation; the logits reach the caller's buffer
 * directly or, from a device, as per-row records (logits_reduce) plus the
 * rows the caller needs whole, through download (moeq_forward_head).
 */
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "moe_layer.h"

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

static void rmsnorm_eps(moeq_engine *e, float *out, int64_t ld_out, const float *x, int64_t ldx, const int64_t *rows,
                        int64_t n_rows, int64_t n, const float *w, float eps) {
    moeq_rmsnorm_params p = {out, ld_out, x, ldx, rows, n_rows, n, w, eps};
    e->backend->rmsnorm(e->backend, &p);
}

void moeq_forward_rmsnorm(moeq_engine *e, float *out, int64_t ld_out, const float *x, int64_t ldx, const int64_t *rows,
                          int64_t n_rows, int64_t n, const float *w) {
    rmsnorm_eps(e, out, ld_out, x, ldx, rows, n_rows, n, w, (float)e->cfg->rms_norm_eps);
}

float *moeq_forward_widen(moeq_engine *e, const moeq_tensor *t) {
    if (!t) return NULL;
    int64_t n = moeq_tensor_rows(t) * moeq_tensor_cols(t);
    float *host = malloc((size_t)n * sizeof(float));
    float *v = host ? e->backend->alloc(e->backend, MOEQ_BUFFER_WEIGHTS, (size_t)n * sizeof(float)) : NULL;
    if (v) {
        moeq_tensor_rows_to_f32(t, 0, moeq_tensor_rows(t), host);
        e->backend->upload(e->backend, v, host, (size_t)n * sizeof(float));
    }
    free(host);
    return v;
}

/* The cache layer a block writes and reads, as plain data. */
static moeq_kv_paged block_kv(const moeq_block *b) { return moeq_kv_cache_paged(b->cache, b->cache_layer); }

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
        rmsnorm_eps(e, s->qa, c->q_lora_rank, s->qa, c->q_lora_rank, NULL, T, c->q_lora_rank, v->q_a_norm,
                    MOEQ_LORA_NORM_EPS);
        jobs[0] = linear(L->q_b_proj, s->qa, s->q, T);
        e->backend->matmul(e->backend, jobs, 1);
    } else {
        jobs[0] = linear(L->q_proj, s->h, s->q, T);
        jobs[1] = linear(L->kv_a_proj_with_mqa, s->h, s->kva, T);
        e->backend->matmul(e->backend, jobs, 2);
    }
    moeq_mla_rope_params rp = {block_kv(b), T, s->tok_seq, s->tok_pos, s->kva, v->kv_a_norm, MOEQ_LORA_NORM_EPS,
                               s->q, s->qpe, (int)H, (int)(QH - R), (int)Lr, s->cos_v, s->sin_v, &e->rope};
    e->backend->mla_rope(e->backend, &rp);
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
    moeq_mla_params a = {block_kv(b), T, s->tok_seq, s->tok_pos, (int)H, (int)Lr, (int)R,
                         s->qlat, s->qpe, s->olat, (float)e->rope.softmax_scale};
    e->backend->attention(e->backend, &a);
    for (int64_t h = 0; h < H; h++)
        s->jobs[h] = job(L->kv_b_proj, h * (nope + V) + nope, V, s->olat + h * Lr, H * Lr, s->ov + h * V, H * V, T);
    e->backend->matmul(e->backend, s->jobs, (int)H);
}

/* Naive attention (tests): expanded K/V per token; slow, never on the serving path. */
static void mla_naive(moeq_engine *e, const moeq_block *b, int64_t T) {
    const moeq_model_config *c = e->cfg;
    moeq_scratch *s = &e->s;
    moeq_mla_naive_params p = {block_kv(b), T, s->tok_seq, s->tok_pos, b->layer->kv_b_proj, c->num_attention_heads,
                               c->qk_nope_head_dim, c->v_head_dim, c->kv_lora_rank, c->qk_rope_head_dim,
                               (float)e->rope.softmax_scale, s->q, s->qpe, s->ov};
    e->backend->attention_naive(e->backend, &p);
}

static void attention_sublayer(moeq_engine *e, const moeq_block *b, int64_t T) {
    const moeq_model_config *c = e->cfg;
    moeq_scratch *s = &e->s;
    int64_t D = c->hidden_size;
    moeq_forward_rmsnorm(e, s->h, D, s->x, D, NULL, T, D, b->vecs->in_norm);
    mla_project(e, b, T);
    if (e->naive_attention) mla_naive(e, b, T);
    else mla_absorbed(e, b, T);
    moeq_mm_job o = linear(b->layer->o_proj, s->ov, s->tmp, T);
    e->backend->matmul(e->backend, &o, 1);
    e->backend->add(e->backend, s->x, s->tmp, T * D);
}

static void dense_mlp(moeq_engine *e, const moeq_layer *L, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t I = moeq_tensor_rows(L->mlp.gate_proj), D = e->cfg->hidden_size;
    moeq_mm_job jobs[2] = {linear(L->mlp.gate_proj, s->h, s->g, T), linear(L->mlp.up_proj, s->h, s->u, T)};
    e->backend->matmul(e->backend, jobs, 2);
    e->backend->silu_mul(e->backend, s->g, s->g, s->u, T * I);
    jobs[0] = linear(L->mlp.down_proj, s->g, s->tmp, T);
    e->backend->matmul(e->backend, jobs, 1);
    e->backend->add(e->backend, s->x, s->tmp, T * D);
}

/* The layer's number as HF counts it: main layers 0.., then the MTP layers. */
static void block_moe(moeq_engine *e, const moeq_block *b, int64_t T) { moeq_moe_layer_run(e, b->layer, b->vecs, T); }

moeq_block moeq_forward_main_block(moeq_engine *e, int layer) {
    return (moeq_block){&e->model->layers[layer], &e->vecs[layer], e->cache, layer};
}

void moeq_forward_moe(moeq_engine *e, int layer, int64_t T) {
    moeq_block b = moeq_forward_main_block(e, layer);
    block_moe(e, &b, T);
}

static void mlp_sublayer(moeq_engine *e, const moeq_block *b, int64_t T) {
    int64_t D = e->cfg->hidden_size;
    moeq_forward_rmsnorm(e, e->s.h, D, e->s.x, D, NULL, T, D, b->vecs->post_norm);
    if (!b->layer->is_moe) {
        dense_mlp(e, b->layer, T);
        return;
    }
    block_moe(e, b, T);
    e->backend->add(e->backend, e->s.x, e->s.tmp, T * D);
}

void moeq_forward_block(moeq_engine *e, const moeq_block *b, int64_t T) {
    attention_sublayer(e, b, T);
    mlp_sublayer(e, b, T);
}

void moeq_forward_rope(moeq_engine *e, int64_t T) {
    moeq_scratch *s = &e->s;
    e->backend->rope_cos_sin(e->backend, &e->rope, s->tok_pos, T, s->cos_v, s->sin_v);
}

static void forward_layers(moeq_engine *e, int64_t T) {
    moeq_scratch *s = &e->s;
    e->backend->embed(e->backend, e->model->embed_tokens, s->tok_id, T, s->x);
    moeq_forward_rope(e, T);
    for (int l = 0; l < e->cfg->num_hidden_layers; l++) {
        moeq_block b = moeq_forward_main_block(e, l);
        moeq_forward_block(e, &b, T);
    }
}

/*
 * cuda_graphs: a decode step (prefill chunks would pay for their padding with real work, and gain little from
 * fewer launches) the backend runs as a graph is padded to its bucket (rows [T, rows): token 0 at position 0;
 * the backend puts them on graph_scratch, a block no sequence holds, and keeps them out of the expert counts) and
 * bracketed; the router flags of the padding are never read. Rows are independent (batch invariance), so the
 * step's own rows are the eager path's. A bracket whose ops did not run is issued again, unpadded.
 */
void moeq_forward_tokens(moeq_engine *e, int64_t T, int decode) {
    moeq_backend *b = e->backend;
    moeq_scratch *s = &e->s;
    int64_t rows = decode && e->graph_scratch >= 0 && !moeq_moe_layer_in_group(e) ? b->graph_rows(b, T) : 0;
    if (rows >= T && rows <= e->params.max_step_tokens) {
        for (int64_t t = T; t < rows; t++) s->tok_id[t] = 0, s->tok_seq[t] = s->tok_seq[0], s->tok_pos[t] = 0;
        moeq_kv_paged kv = moeq_kv_cache_paged(e->cache, 0);
        moeq_graph_step g = {rows, T, kv.block_tokens, e->graph_scratch, kv.block_table, kv.table_stride, s->tok_seq,
                             s->tok_pos};
        b->graph_begin(b, &g);
        forward_layers(e, rows);
        int again = b->graph_end(b);
        moeq_moe_layer_set_valid(e, T);
        if (!again) return;
    }
    forward_layers(e, T);
}

void moeq_forward_logits(moeq_engine *e, int64_t n_rows, const moeq_step_out *out) {
    moeq_forward_head(e, e->final_norm, e->model->lm_head, n_rows, out, 0);
}

/* Whether row r (of out) must come back whole: asked for, or its draw is not decided by its record. */
static int row_needed(const moeq_step_out *out, int64_t r, const moeq_logits_record *rec) {
    if (!out->use) return 0;
    const moeq_row_use *u = &out->use[r];
    return u->full || (u->sampler && !moeq_sampler_record_decides(u->sampler, rec, u->draw));
}

/* A device's chunk of n rows (out's rows r0..): records for all, the rows whole where needed. */
static void chunk_out(moeq_engine *e, const moeq_step_out *out, int64_t r0, int64_t n, int64_t V) {
    moeq_scratch *s = &e->s;
    if (!out->records) {
        e->backend->download(e->backend, out->logits + r0 * V, s->logits, (size_t)(n * V) * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const moeq_row_use *u = out->use ? &out->use[r0 + i] : NULL;
        s->logits_temp[i] = u && u->sampler ? moeq_sampler_temperature(u->sampler) : 0.0;
    }
    e->backend->logits_reduce(e->backend, s->logits, V, n, V, s->logits_temp, out->records + r0);
    for (int64_t i = 0; i < n; i++) {
        out->have_row[r0 + i] = (uint8_t)row_needed(out, r0 + i, &out->records[r0 + i]);
        if (out->have_row[r0 + i])
            e->backend->download(e->backend, out->logits + (r0 + i) * V, s->logits + i * V, (size_t)V * sizeof(float));
    }
}

/* A backend whose memory is the host's writes the caller's buffer (every row whole); a device computes chunks
 * of rows into s.logits and brings back each chunk whole, or (records asked for) each row's record and the
 * rows whole only where needed (the same per-row arithmetic: rows are independent). */
void moeq_forward_head(moeq_engine *e, const float *norm, const moeq_tensor *head, int64_t n_rows,
                       const moeq_step_out *out, int64_t row0) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size, V = moeq_tensor_rows(head);
    moeq_forward_rmsnorm(e, s->h, D, s->x, D, s->logit_tok, n_rows, D, norm);
    if (n_rows == 0) return;
    if (e->backend->host_visible) {
        moeq_mm_job j = linear(head, s->h, out->logits + row0 * V, n_rows);
        e->backend->matmul(e->backend, &j, 1);
        if (out->records) memset(out->have_row + row0, 1, (size_t)n_rows);
        return;
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += s->logits_rows) {
        int64_t n = n_rows - r0 < s->logits_rows ? n_rows - r0 : s->logits_rows;
        moeq_mm_job j = linear(head, s->h + r0 * D, s->logits, n);
        e->backend->matmul(e->backend, &j, 1);
        chunk_out(e, out, row0 + r0, n, V);
    }
}

void moeq_forward_linear(moeq_engine *e, const moeq_tensor *w, const float *x, float *y, int64_t n_tok) {
    moeq_mm_job j = linear(w, x, y, n_tok);
    e->backend->matmul(e->backend, &j, 1);
}
