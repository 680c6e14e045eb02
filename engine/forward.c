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
#include "head_screen.h"
#include "moe_layer.h"
#include "sampler.h"

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

/* ---- the screened head (head_screen.h) ------------------------------------------------------------------ */

#define SCREEN_ROWS 32 /* rows screened at once: the approximate logits' scratch is SCREEN_ROWS x vocab floats */
#define SCREEN_CAP 64  /* candidates computed exactly for one row (a trained head leaves a few); more: the row whole */
#define REFINE_CAP 1024 /* first-pass candidates a row may have (refined with the split codes); more: the row whole */

typedef struct moeq_screen_state {
    moeq_head_screen *screen;
    float *approx;  /* [SCREEN_ROWS][vocab] the int8 copy's logits (hi codes alone)        */
    int32_t *first; /* [SCREEN_ROWS][REFINE_CAP] each row's first-pass candidates, ascending */
    int64_t n_first[SCREEN_ROWS];
    float *refined; /* [SCREEN_ROWS][REFINE_CAP] their products with the split codes         */
    int32_t *cand;  /* [SCREEN_ROWS][SCREEN_CAP] each row's candidates, ascending           */
    int64_t n_cand[SCREEN_ROWS];
    int32_t *uni;   /* [SCREEN_ROWS * SCREEN_CAP] the chunk's candidates, ascending, distinct */
    float *exact;   /* [SCREEN_ROWS][SCREEN_ROWS * SCREEN_CAP] their values on the exact path */
    moeq_mm_job *jobs; /* [SCREEN_ROWS * REFINE_CAP]: at least SCREEN_ROWS * SCREEN_CAP + SCREEN_ROWS        */
} moeq_screen_state;

void moeq_forward_screen_destroy(moeq_engine *e) {
    moeq_screen_state *st = e->screen;
    if (!st) return;
    moeq_head_screen_destroy(st->screen);
    free(st->approx);
    free(st->first);
    free(st->refined);
    free(st->cand);
    free(st->uni);
    free(st->exact);
    free(st->jobs);
    free(st);
    e->screen = NULL;
}

/* Why the screen does not apply to this engine at all, or NULL. */
static const char *screen_static_why(const moeq_engine *e) {
    return strcmp(e->params.head_screen, "auto") ? "off (head_screen = off)"
           : !e->backend->host_visible           ? "not used: a device backend (records come from logits_reduce)"
           : !e->params.batch_invariant          ? "not used: batch_invariant = false"
           : !moeq_engine_cpu_draft()            ? "not used: no int8 kernels on this CPU"
                                                 : NULL;
}

/* The screen of the main head, made at its first use; NULL where it does not apply (head_screen = off, a device,
 * batch_invariant = 0: the exact values of a few rows would not be the whole product's there, no VNNI: the int8
 * emulation is slower than the head itself) or could not be made (then never again; the rows come whole). */
static moeq_screen_state *screen_of(moeq_engine *e, const moeq_tensor *head) {
    if (head != e->model->lm_head) return NULL;
    if (e->screen || e->screen_why[0]) return e->screen; /* made, or why not already said */
    const char *why = screen_static_why(e);
    if (why) {
        snprintf(e->screen_why, sizeof e->screen_why, "%s", why);
        return NULL;
    }
    moeq_screen_state *st = calloc(1, sizeof *st);
    char err[160] = "out of memory";
    int64_t V = moeq_tensor_rows(head);
    if (st && !moeq_head_screen_new(head, &st->screen, err, sizeof err)) {
        st->approx = malloc((size_t)(SCREEN_ROWS * V) * sizeof(float));
        st->first = malloc((size_t)(SCREEN_ROWS * REFINE_CAP) * sizeof(int32_t));
        st->refined = malloc((size_t)(SCREEN_ROWS * REFINE_CAP) * sizeof(float));
        st->cand = malloc((size_t)(SCREEN_ROWS * SCREEN_CAP) * sizeof(int32_t));
        st->uni = malloc((size_t)(SCREEN_ROWS * SCREEN_CAP) * sizeof(int32_t));
        st->exact = malloc((size_t)(SCREEN_ROWS * SCREEN_ROWS * SCREEN_CAP) * sizeof(float));
        st->jobs = malloc((size_t)(SCREEN_ROWS * REFINE_CAP) * sizeof(moeq_mm_job));
    }
    e->screen = st;
    if (!st || !st->screen || !st->approx || !st->first || !st->refined || !st->cand || !st->uni || !st->exact ||
        !st->jobs) {
        snprintf(e->screen_why, sizeof e->screen_why, "not made: %s", st && st->screen ? "out of memory" : err);
        moeq_forward_screen_destroy(e); /* every row whole, as with head_screen = off; the stats say why */
        return NULL;
    }
    return st;
}

const moeq_tensor *moeq_forward_head_codes(moeq_engine *e) {
    moeq_screen_state *st = screen_of(e, e->model->lm_head);
    return st ? moeq_head_screen_codes(st->screen, 0) : NULL;
}

moeq_head_screen_stats moeq_engine_head_screen_stats(const moeq_engine *e) {
    moeq_head_screen_stats st = {0, 0, 0, 0, 0, 0, NULL};
    if (!e) return st;
    const moeq_tensor *head = e->model->lm_head;
    st.rows = e->screened_rows, st.candidates = e->screen_candidates, st.fallbacks = e->screen_fallbacks;
    st.refined = e->screen_refined;
    st.bytes = e->screen ? moeq_head_screen_bytes(e->screen->screen) : 0;
    st.head_bytes = head->nbytes + (head->scale_inv ? head->scale_inv->nbytes : 0);
    const char *why = screen_static_why(e);
    st.state = e->screen ? "on" : e->screen_why[0] ? e->screen_why : why ? why : "not yet used";
    return st;
}

/* Whether row r of out is read only for its argmax (and whether it is finite). */
static int argmax_only(const moeq_step_out *out, int64_t r) {
    if (!out->use) return 1;
    const moeq_row_use *u = &out->use[r];
    return !u->full && (!u->sampler || moeq_sampler_argmax_only(u->sampler));
}

/* The jobs, at most s.max_jobs to a call. */
static void run_jobs(moeq_engine *e, const moeq_mm_job *jobs, int64_t n) {
    for (int64_t i = 0; i < n; i += e->s.max_jobs)
        e->backend->matmul(e->backend, jobs + i, (int)(n - i < e->s.max_jobs ? n - i : e->s.max_jobs));
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/*
 * The candidates of the chunk's argmax-only rows (whole[i] == 0) into st->cand / n_cand (0: undecided), from the
 * first pass's products in st->approx: a row with at most SCREEN_CAP first-pass candidates keeps them; one with
 * more (up to REFINE_CAP) has those rows' products with the split codes computed (one job per run of
 * consecutive rows, every row of the chunk in one call) and keeps what that tighter bound leaves.
 */
static void screen_candidates(moeq_engine *e, moeq_screen_state *st, const float *x, const uint8_t *whole,
                              int64_t n) {
    const moeq_tensor *split = moeq_head_screen_codes(st->screen, 0);
    const int64_t D = e->cfg->hidden_size, V = moeq_tensor_rows(split);
    int64_t nj = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t *first = st->first + i * REFINE_CAP;
        st->n_first[i] = whole[i] ? 0
                                  : moeq_head_screen_candidates(st->screen, x + i * D, st->approx + i * V, first,
                                                                REFINE_CAP, 1);
        st->n_cand[i] = 0;
        if (st->n_first[i] <= SCREEN_CAP) {
            memcpy(st->cand + i * SCREEN_CAP, first, (size_t)st->n_first[i] * sizeof(int32_t));
            st->n_cand[i] = st->n_first[i];
            continue;
        }
        for (int64_t c = 0, d; c < st->n_first[i]; c = d) {
            for (d = c + 1; d < st->n_first[i] && first[d] == first[d - 1] + 1;) d++;
            st->jobs[nj++] = job(split, first[c], d - c, x + i * D, D, st->refined + i * REFINE_CAP + c, V, 1);
        }
    }
    if (!nj) return;
    run_jobs(e, st->jobs, nj);
    for (int64_t i = 0; i < n; i++)
        if (st->n_first[i] > SCREEN_CAP) {
            st->n_cand[i] = moeq_head_screen_refine(st->screen, x + i * D, st->first + i * REFINE_CAP,
                                                    st->refined + i * REFINE_CAP, st->n_first[i],
                                                    st->cand + i * SCREEN_CAP, SCREEN_CAP);
            e->screen_refined++;
        }
}

/*
 * Rows [r0, r0 + n) of the step's head (x: s.h rows r0..), n <= SCREEN_ROWS, into out's rows row0 + r0 + i: the
 * argmax-only rows as records from the screen (have_row 0), the others whole (have_row 1). Each group of
 * consecutive rows of a kind is one job, so a batch of one kind reads the head (or its copy) once.
 */
static void screened_chunk(moeq_engine *e, moeq_screen_state *st, const moeq_tensor *head, const moeq_step_out *out,
                           int64_t row0, int64_t r0, int64_t n) {
    moeq_scratch *s = &e->s;
    const int64_t D = e->cfg->hidden_size, V = moeq_tensor_rows(head);
    const float *x = s->h + r0 * D;
    const moeq_tensor *codes = moeq_head_screen_codes(st->screen, 1);
    uint8_t whole[SCREEN_ROWS];
    moeq_mm_job *jobs = st->jobs;
    int64_t nj = 0;
    for (int64_t i = 0; i < n; i++) whole[i] = (uint8_t)!argmax_only(out, row0 + r0 + i);
    for (int64_t i = 0, j; i < n; i = j) { /* runs of one kind: whole rows exact, the others on the copy */
        for (j = i + 1; j < n && whole[j] == whole[i];) j++;
        jobs[nj++] = whole[i] ? job(head, 0, V, x + i * D, D, out->logits + (row0 + r0 + i) * V, V, j - i)
                              : job(codes, 0, V, x + i * D, D, st->approx + i * V, V, j - i);
    }
    run_jobs(e, jobs, nj);
    screen_candidates(e, st, x, whole, n);
    int64_t n_uni = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < st->n_cand[i]; c++) st->uni[n_uni++] = st->cand[i * SCREEN_CAP + c];
    qsort(st->uni, (size_t)n_uni, sizeof(int32_t), cmp_id);
    int64_t u = 0;
    for (int64_t c = 0; c < n_uni; c++)
        if (u == 0 || st->uni[c] != st->uni[u - 1]) st->uni[u++] = st->uni[c];
    /* the candidates' exact values: one job per run of consecutive rows, every token of the chunk */
    nj = 0;
    for (int64_t c = 0, d; c < u; c = d) {
        for (d = c + 1; d < u && st->uni[d] == st->uni[d - 1] + 1;) d++;
        jobs[nj++] = job(head, st->uni[c], d - c, x, D, st->exact + c, u, n);
    }
    run_jobs(e, jobs, nj);
    nj = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = row0 + r0 + i;
        if (whole[i]) {
            out->have_row[r] = 1;
            continue;
        }
        int32_t best = -1;
        float max = 0.0f;
        int finite = st->n_cand[i] > 0;
        for (int64_t c = 0; c < st->n_cand[i] && finite; c++) {
            int32_t id = st->cand[i * SCREEN_CAP + c];
            /* always found: uni holds every row's candidates */
            const int32_t *at = bsearch(&id, st->uni, (size_t)u, sizeof(int32_t), cmp_id);
            float v = st->exact[i * u + (at - st->uni)];
            finite = v - v == 0.0f;
            if (best < 0 || v > max) best = id, max = v; /* ascending ids: the lowest id of the highest value */
        }
        if (!finite) { /* undecided, or a candidate's exact value is not finite: the row whole decides */
            jobs[nj++] = job(head, 0, V, x + i * D, D, out->logits + r * V, V, 1);
            out->have_row[r] = 1;
            e->screen_fallbacks++;
            continue;
        }
        moeq_logits_record *rec = &out->records[r];
        memset(rec, 0, sizeof *rec);
        rec->argmax = best, rec->finite = 1, rec->max = max, rec->n_top = 0; /* n_top 0: argmax, finite, max only */
        out->have_row[r] = 0;
        e->screened_rows++;
        e->screen_candidates += st->n_cand[i];
    }
    run_jobs(e, jobs, nj);
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
    moeq_screen_state *st = out->records ? screen_of(e, head) : NULL;
    if (st) {
        for (int64_t r0 = 0; r0 < n_rows; r0 += SCREEN_ROWS)
            screened_chunk(e, st, head, out, row0, r0, n_rows - r0 < SCREEN_ROWS ? n_rows - r0 : SCREEN_ROWS);
        return;
    }
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
