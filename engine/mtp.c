/*
 * mtp.c — the MTP module in the engine (see mtp.h): its cache, the hidden
 * rows it needs, its forward, and the public moeq_engine_mtp_* entry points.
 *
 * Forward (DeepSeek-V3 as vLLM and SGLang run it; tests/reference/deepseek_ref.py
 * mtp_forward is the float64 twin):
 *
 *   x = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)])     embedding half first
 *   x = block(x)                                           own cache, position i
 *   logits = shared_head.head(shared_head.norm(x))         only when drafting
 *
 * h_i is the main model's hidden after its final norm for the first draft of
 * a round, and the module's own output x (before shared_head.norm) for each
 * further draft. The block is forward.c's block code run on the MTP layer's
 * weights and cache; nothing here repeats the layer math.
 *
 * Not here: choosing or verifying drafts (mtp_spec.c).
 */
#include <stdlib.h>
#include <string.h>

#include "mtp.h"
#include "ops.h"

struct moeq_mtp_state {
    const moeq_layer *layer;   /* model->mtp_layers[0]                      */
    moeq_layer_vecs vecs;
    float *enorm, *hnorm, *head_norm; /* [D] widened                       */
    const moeq_tensor *head;   /* shared_head.head or lm_head               */
    moeq_kv_cache *cache;      /* one layer, same sequence ids as the main  */
    int ring;                  /* main hidden rows kept per sequence        */
    float *ring_h;             /* [max_seqs][ring][D]                       */
    int64_t *ring_pos0;        /* [max_seqs] position of ring row 0         */
    int *ring_n;               /* [max_seqs] valid rows                     */
    float *chain_h;            /* [max_seqs][D] the module's last output    */
    unsigned char *on;         /* [max_seqs] moeq_engine_seq_set_mtp        */
    int64_t *chain_pos;        /* [max_seqs] its position, -1 = none        */
};

static float *widen(const moeq_tensor *t) {
    if (!t) return NULL;
    float *v = malloc((size_t)(moeq_tensor_rows(t) * moeq_tensor_cols(t)) * sizeof(float));
    if (v) moeq_tensor_rows_to_f32(t, 0, moeq_tensor_rows(t), v);
    return v;
}

static moeq_err widen_all(moeq_engine *e, moeq_mtp_state *m) {
    const moeq_layer *L = m->layer;
    m->vecs.in_norm = widen(L->input_layernorm);
    m->vecs.post_norm = widen(L->post_attention_layernorm);
    m->vecs.kv_a_norm = widen(L->kv_a_layernorm);
    m->vecs.q_a_norm = widen(L->q_a_layernorm);
    m->vecs.bias = widen(L->is_moe ? L->e_score_correction_bias : NULL);
    m->enorm = widen(L->enorm);
    m->hnorm = widen(L->hnorm);
    m->head_norm = widen(L->shared_head_norm);
    if (!m->vecs.in_norm || !m->vecs.post_norm || !m->vecs.kv_a_norm || (e->cfg->q_lora_rank > 0 && !m->vecs.q_a_norm) ||
        (L->is_moe && L->e_score_correction_bias && !m->vecs.bias) || !m->enorm || !m->hnorm || !m->head_norm)
        return MOEQ_ERR_NOMEM;
    return MOEQ_OK;
}

static moeq_err alloc_seq_state(moeq_engine *e, moeq_mtp_state *m) {
    size_t S = (size_t)e->params.max_seqs, D = (size_t)e->cfg->hidden_size;
    m->ring = MOEQ_MTP_MAX_K + 1;
    m->ring_h = malloc(S * (size_t)m->ring * D * sizeof(float));
    m->ring_pos0 = calloc(S, sizeof(int64_t));
    m->ring_n = calloc(S, sizeof(int));
    m->chain_h = malloc(S * D * sizeof(float));
    m->chain_pos = malloc(S * sizeof(int64_t));
    m->on = calloc(S, 1);
    if (!m->on || !m->ring_h || !m->ring_pos0 || !m->ring_n || !m->chain_h || !m->chain_pos) return MOEQ_ERR_NOMEM;
    for (size_t i = 0; i < S; i++) m->chain_pos[i] = -1;
    return MOEQ_OK;
}

moeq_err moeq_mtp_state_new(moeq_engine *e, moeq_mtp_state **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    const moeq_model *model = e->model;
    if (model->n_mtp_layers < 1 || !model->mtp_layers[0].eh_proj) return MOEQ_OK;
    moeq_mtp_state *m = calloc(1, sizeof(*m));
    if (!m) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp state");
    m->layer = &model->mtp_layers[0];
    m->head = m->layer->shared_head_head ? m->layer->shared_head_head : model->lm_head;
    moeq_err err = widen_all(e, m);
    if (!err) err = alloc_seq_state(e, m);
    if (err) {
        moeq_mtp_state_destroy(m);
        return moeq_errf(err, errstr, errstr_size, "mtp layer vectors and per-sequence state");
    }
    const moeq_model_config *c = e->cfg;
    moeq_kv_cache_params kp = {1, c->kv_lora_rank + c->qk_rope_head_dim, e->params.kv_block_tokens,
                               e->params.kv_cache_tokens + (int64_t)e->params.max_seqs * MOEQ_MTP_MAX_K,
                               e->params.max_seqs};
    if ((err = moeq_kv_cache_new(&kp, &m->cache, errstr, errstr_size))) {
        moeq_mtp_state_destroy(m);
        return err;
    }
    *out = m;
    return MOEQ_OK;
}

void moeq_mtp_state_destroy(moeq_mtp_state *m) {
    if (!m) return;
    moeq_kv_cache_destroy(m->cache);
    free(m->vecs.in_norm);
    free(m->vecs.post_norm);
    free(m->vecs.q_a_norm);
    free(m->vecs.kv_a_norm);
    free(m->vecs.bias);
    free(m->enorm);
    free(m->hnorm);
    free(m->head_norm);
    free(m->ring_h);
    free(m->ring_pos0);
    free(m->ring_n);
    free(m->chain_h);
    free(m->chain_pos);
    free(m->on);
    free(m);
}

/* ---- per-sequence state --------------------------------------------------- */

void moeq_mtp_seq_opened(moeq_engine *e, int seq) {
    moeq_mtp_state *m = e->mtp;
    if (!m) return;
    moeq_kv_cache_seq_free(m->cache, seq); /* stale slot (cannot happen: ids move in step) */
    moeq_kv_cache_seq_open(m->cache, seq);
    m->ring_n[seq] = 0;
    m->chain_pos[seq] = -1;
    m->on[seq] = 0;
}

void moeq_mtp_seq_freed(moeq_engine *e, int seq) {
    if (!e->mtp || seq < 0 || seq >= e->params.max_seqs) return;
    moeq_kv_cache_seq_free(e->mtp->cache, seq);
    e->mtp->on[seq] = 0;
}

int moeq_mtp_seq_on(const moeq_engine *e, int seq) {
    return e->mtp && seq >= 0 && seq < e->params.max_seqs && e->mtp->on[seq];
}

void moeq_mtp_seq_truncated(moeq_engine *e, int seq, int64_t n) {
    moeq_mtp_state *m = e->mtp;
    if (!m || !moeq_kv_cache_seq_alive(m->cache, seq)) return;
    moeq_kv_cache_truncate(m->cache, seq, n > 0 ? n - 1 : 0);
    int64_t keep = n - m->ring_pos0[seq];
    m->ring_n[seq] = keep <= 0 ? 0 : (keep < m->ring_n[seq] ? (int)keep : m->ring_n[seq]);
    m->chain_pos[seq] = -1;
}

/* The retained main hidden row of position pos, or NULL. */
static const float *ring_row(const moeq_mtp_state *m, int seq, int64_t pos, int64_t D) {
    int64_t j = pos - m->ring_pos0[seq];
    if (j < 0 || j >= m->ring_n[seq]) return NULL;
    return m->ring_h + ((size_t)seq * m->ring + (size_t)j) * D;
}

/* ---- the module's forward ------------------------------------------------- */

/*
 * s.tok_id holds t_{i+1}, s.tok_seq / s.tok_pos the entries, s.eh[:, D:2D]
 * the raw hidden inputs; the cache already covers the positions. Leaves the
 * module's output (before shared_head.norm) in s.x.
 */
static void mtp_forward(moeq_engine *e, int64_t T) {
    moeq_mtp_state *m = e->mtp;
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size;
    float eps = (float)e->cfg->rms_norm_eps;
    for (int64_t t = 0; t < T; t++) {
        float *eh = s->eh + t * 2 * D;
        moeq_tensor_rows_to_f32(e->model->embed_tokens, s->tok_id[t], 1, s->tmp + t * D);
        moeq_ops_rmsnorm(eh, s->tmp + t * D, m->enorm, D, eps);
        moeq_ops_rmsnorm(eh + D, eh + D, m->hnorm, D, eps);
    }
    moeq_forward_rope(e, T);
    moeq_forward_linear(e, m->layer->eh_proj, s->eh, s->x, T);
    moeq_block b = {m->layer, &m->vecs, m->cache, 0};
    moeq_forward_block(e, &b, T);
}

/* ---- inside a main step --------------------------------------------------- */

moeq_err moeq_mtp_check_item(moeq_engine *e, const moeq_step_item *it, int i, int64_t *blocks, char *errstr,
                             size_t errstr_size) {
    moeq_mtp_state *m = e->mtp;
    int64_t p = moeq_kv_cache_seq_len(e->cache, it->seq_id);
    if (p > 0 && (moeq_kv_cache_seq_len(m->cache, it->seq_id) < p - 1 ||
                  !ring_row(m, it->seq_id, p - 1, e->cfg->hidden_size)))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "item %d: seq %d has no MTP state at position %lld (truncated below its last step)",
                         i, it->seq_id, (long long)(p - 1));
    /* entries [p - 1, p + n - 1) after truncating to p - 1: net blocks = blocks(end) - blocks(now) */
    int64_t end = p + it->n_tokens - 1, have = moeq_kv_cache_seq_len(m->cache, it->seq_id);
    int64_t bt = e->params.kv_block_tokens, used = (have + bt - 1) / bt, want = (end + bt - 1) / bt;
    *blocks += want > used ? want - used : 0;
    return MOEQ_OK;
}

moeq_err moeq_mtp_check_blocks(moeq_engine *e, int64_t blocks, char *errstr, size_t errstr_size) {
    if (blocks > moeq_kv_cache_free_blocks(e->mtp->cache))
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "mtp cache full: %lld blocks needed, %lld free",
                         (long long)blocks, (long long)moeq_kv_cache_free_blocks(e->mtp->cache));
    return MOEQ_OK;
}

/*
 * Lay the MTP entries of the mtp items over s.tok_* in place: entry m never
 * comes after the main token it reads (an item of n tokens adds at most n
 * entries), so reading index >= writing index is safe in ascending order.
 */
static int64_t lay_out_catch_up(moeq_engine *e, const moeq_step_item *items, int n_items) {
    moeq_mtp_state *m = e->mtp;
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size, t0 = 0, n_mtp = 0;
    for (int i = 0; i < n_items; t0 += items[i++].n_tokens) {
        const moeq_step_item *it = &items[i];
        if (!moeq_mtp_seq_on(e, it->seq_id)) continue;
        int seq = it->seq_id;
        int64_t n = it->n_tokens, p = moeq_kv_cache_seq_len(e->cache, seq) - n, start = p > 0 ? p - 1 : 0;
        moeq_kv_cache_truncate(m->cache, seq, start);
        m->chain_pos[seq] = -1;
        for (int64_t pos = start; pos <= p + n - 2; pos++, n_mtp++) {
            int64_t j = pos - p; /* -1: the row retained from the previous step */
            const float *h = j < 0 ? ring_row(m, seq, pos, D) : s->hid + (t0 + j) * D;
            memcpy(s->eh + n_mtp * 2 * D + D, h, (size_t)D * sizeof(float));
            s->tok_id[n_mtp] = s->tok_id[t0 + j + 1];
            s->tok_seq[n_mtp] = seq;
            s->tok_pos[n_mtp] = pos;
        }
        moeq_kv_cache_grow(m->cache, seq, p + n - 1); /* checked by moeq_mtp_check_item */
    }
    return n_mtp;
}

/* Keep the last rows of each mtp item: a later truncation to any of them still finds h_{len-1}. */
static void retain_rows(moeq_engine *e, const moeq_step_item *items, int n_items) {
    moeq_mtp_state *m = e->mtp;
    int64_t D = e->cfg->hidden_size, t0 = 0;
    for (int i = 0; i < n_items; t0 += items[i++].n_tokens) {
        const moeq_step_item *it = &items[i];
        if (!moeq_mtp_seq_on(e, it->seq_id)) continue;
        int64_t n = it->n_tokens, r = n < m->ring ? n : m->ring;
        int64_t len = moeq_kv_cache_seq_len(e->cache, it->seq_id);
        memcpy(m->ring_h + (size_t)it->seq_id * m->ring * D, e->s.hid + (t0 + n - r) * D,
               (size_t)(r * D) * sizeof(float));
        m->ring_pos0[it->seq_id] = len - r;
        m->ring_n[it->seq_id] = (int)r;
    }
}

void moeq_mtp_after_step(moeq_engine *e, const moeq_step_item *items, int n_items, int64_t n_tok) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size;
    for (int64_t t = 0; t < n_tok; t++)
        moeq_ops_rmsnorm(s->hid + t * D, s->x + t * D, e->final_norm, D, (float)e->cfg->rms_norm_eps);
    int64_t n_mtp = lay_out_catch_up(e, items, n_items);
    retain_rows(e, items, n_items);
    if (n_mtp > 0) mtp_forward(e, n_mtp);
}

/* ---- public --------------------------------------------------------------- */

int moeq_engine_mtp_available(const moeq_engine *engine) { return engine && engine->mtp ? 1 : 0; }

moeq_err moeq_engine_seq_set_mtp(moeq_engine *engine, int seq_id, int on) {
    if (!engine) return MOEQ_ERR_INVALID_ARG;
    if (!engine->mtp) return on ? MOEQ_ERR_UNSUPPORTED : MOEQ_OK;
    if (moeq_kv_cache_seq_len(engine->cache, seq_id) != 0) return MOEQ_ERR_INVALID_ARG;
    engine->mtp->on[seq_id] = on ? 1 : 0;
    return MOEQ_OK;
}

int moeq_engine_mtp_seq_len(const moeq_engine *engine, int seq_id) {
    if (!engine || !engine->mtp) return -1;
    return (int)moeq_kv_cache_seq_len(engine->mtp->cache, seq_id);
}

const float *moeq_mtp_cache_entry(const moeq_engine *engine, int seq_id, int64_t pos) {
    return moeq_kv_cache_entry(engine->mtp->cache, seq_id, 0, pos);
}

/* The hidden input of the next draft of seq, or NULL when it has none. */
static const float *draft_input(const moeq_engine *e, int seq) {
    const moeq_mtp_state *m = e->mtp;
    int64_t q = moeq_kv_cache_seq_len(m->cache, seq), len = moeq_kv_cache_seq_len(e->cache, seq);
    if (len < 1 || q < len - 1) return NULL;
    if (q == len - 1) return ring_row(m, seq, q, e->cfg->hidden_size);
    return m->chain_pos[seq] == q - 1 ? m->chain_h + (size_t)seq * e->cfg->hidden_size : NULL;
}

static moeq_err check_draft(moeq_engine *e, const moeq_mtp_item *items, int n, size_t logits_rows, char *errstr,
                            size_t errstr_size) {
    moeq_mtp_state *m = e->mtp;
    int64_t blocks = 0, bt = e->params.kv_block_tokens;
    if (n > e->params.max_step_tokens || (size_t)n > logits_rows)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "mtp step of %d items: max_step_tokens %d, logits rows %zu",
                         n, e->params.max_step_tokens, logits_rows);
    for (int i = 0; i < n; i++) {
        int seq = items[i].seq_id;
        if (!moeq_kv_cache_seq_alive(e->cache, seq) || !draft_input(e, seq))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "mtp item %d: seq %d not alive or without MTP state (moeq_engine_seq_set_mtp)", i, seq);
        if (items[i].token < 0 || items[i].token >= e->cfg->vocab_size)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp item %d: token %d outside vocab", i,
                             items[i].token);
        for (int j = 0; j < i; j++)
            if (items[j].seq_id == seq)
                return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp item %d: seq %d twice", i, seq);
        int64_t q = moeq_kv_cache_seq_len(m->cache, seq);
        if (q + 1 > moeq_kv_cache_max_seq_tokens(e->cache))
            return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "mtp item %d: position %lld past the cache", i,
                             (long long)q);
        blocks += (q + bt) / bt - (q + bt - 1) / bt;
    }
    return moeq_mtp_check_blocks(e, blocks, errstr, errstr_size);
}

moeq_err moeq_engine_mtp_step(moeq_engine *engine, const moeq_mtp_item *items, int n_items, float *logits,
                              size_t logits_rows, char *errstr, size_t errstr_size) {
    if (!engine || n_items < 0 || (n_items > 0 && (!items || !logits)))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "engine, items and logits are required");
    if (!engine->mtp) return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "the model has no MTP layer");
    moeq_err err = check_draft(engine, items, n_items, logits_rows, errstr, errstr_size);
    if (err || n_items == 0) return err;
    moeq_mtp_state *m = engine->mtp;
    moeq_scratch *s = &engine->s;
    int64_t D = engine->cfg->hidden_size;
    for (int i = 0; i < n_items; i++) {
        int seq = items[i].seq_id;
        int64_t q = moeq_kv_cache_seq_len(m->cache, seq);
        memcpy(s->eh + (size_t)i * 2 * D + D, draft_input(engine, seq), (size_t)D * sizeof(float));
        s->tok_id[i] = items[i].token;
        s->tok_seq[i] = seq;
        s->tok_pos[i] = q;
        s->logit_tok[i] = i;
        moeq_kv_cache_grow(m->cache, seq, q + 1); /* checked */
    }
    mtp_forward(engine, n_items);
    for (int i = 0; i < n_items; i++) {
        memcpy(m->chain_h + (size_t)items[i].seq_id * D, s->x + (size_t)i * D, (size_t)D * sizeof(float));
        m->chain_pos[items[i].seq_id] = s->tok_pos[i];
    }
    moeq_forward_head(engine, m->head_norm, m->head, n_items, logits);
    return MOEQ_OK;
}
