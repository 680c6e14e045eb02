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
 * Entries are computed lazily. A main step only keeps the hidden rows and
 * tokens of a marked sequence's new positions (a ring of `ring` rows); the
 * entries they feed are "pending" and are computed by the sequence's next
 * draft, in the same block pass as the draft entry itself (or by a later main
 * step when the ring would overflow). So a speculative round runs the MTP
 * block once per accepted token plus once per draft, never on rejected
 * positions, and the first draft entry of a round (true hidden, true next
 * token) is kept by the verify step when its token is confirmed instead of
 * being recomputed. Batch invariance makes an entry the same bits whichever
 * pass computes it.
 *
 * Activations and the per-sequence rows (ring, chain) are backend buffers,
 * moved only by backend ops (copy, embed, rmsnorm); the bookkeeping
 * (positions, counters, tokens) is host state.
 *
 * Not here: choosing or verifying drafts (mtp_spec.c).
 */
#include <stdlib.h>
#include <string.h>

#include "kv_blocks.h"
#include "moe_layer.h"
#include "mtp.h"

struct moeq_mtp_state {
    const moeq_layer *layer;   /* model->mtp_layers[0], or draft with F8 copies */
    moeq_layer draft;          /* mtp_draft = f8: the layer with its copies   */
    moeq_tensor *f8[16];       /* the draft copies (one allocation each)      */
    int n_f8;
    moeq_layer_vecs vecs;
    float *enorm, *hnorm, *head_norm; /* [D] widened                       */
    const moeq_tensor *head;   /* shared_head.head or lm_head               */
    moeq_kv_cache *cache;      /* one layer, same sequence ids as the main  */
    float *cache_pool;         /* its entries (backend buffer)              */
    int ring;                  /* rows kept per sequence: min(MAX_K + 1, max_step_tokens) */
    float *ring_h;             /* [max_seqs][ring][D] main hidden of pos at slot pos % ring (backend) */
    int32_t *ring_tok;         /* [max_seqs][ring] main token of pos at slot pos % ring     */
    int64_t *ring_lo;          /* [max_seqs] rows cover [ring_lo, seq_len)                  */
    int64_t *done;             /* [max_seqs] entries 0..done-1 computed from true inputs    */
    int64_t *guess_pos;        /* [max_seqs] first draft entry, its token unconfirmed; -1   */
    int32_t *guess_tok;        /* [max_seqs] the token it was drafted with                  */
    float *chain_h;            /* [max_seqs][D] the module's last output (backend) */
    int64_t *chain_pos;        /* [max_seqs] its position, -1 = none        */
    unsigned char *on;         /* [max_seqs] moeq_engine_seq_set_mtp        */
    int32_t *key_row;          /* [kv_block_tokens + 1] scratch: an MTP block's key row */
    int64_t rows_run;          /* MTP block rows computed (tests)           */
};

static float *widen(moeq_engine *e, const moeq_tensor *t) { return moeq_forward_widen(e, t); }

int moeq_mtp_draft_f8(const moeq_engine *e) {
    return (!strcmp(e->params.mtp_draft, "f8") || !strcmp(e->params.mtp_draft, "e4m3")) && e->backend->host_visible &&
           e->model->n_mtp_layers > 0;
}

/* 1 when t's draft copy is Q8R: mtp_draft = f8 where the CPU backend has the int8 draft kernels (cpu/ops_draft.h). */
static int draft_q8(const moeq_engine *e, const moeq_tensor *t) {
    return !strcmp(e->params.mtp_draft, "f8") && moeq_engine_cpu_draft() && moeq_tensor_cols(t) <= MOEQ_Q8R_MAX_COLS;
}

/*
 * *slot as a draft copy: Q8R where draft_q8 says so, of F8 weights too (the originals' pages are then never
 * read); else (or e4m3) F8 E4M3, F8 weights staying as they are.
 * NULL stays.
 */
static moeq_err draft_copy(const moeq_engine *e, moeq_mtp_state *m, const moeq_tensor **slot) {
    const moeq_tensor *t = *slot;
    if (!t || t->ndim != 2) return MOEQ_OK;
    const int q8 = draft_q8(e, t);
    if (!q8 && t->dtype == MOEQ_DTYPE_F8_E4M3) return MOEQ_OK;
    if (m->n_f8 == (int)(sizeof m->f8 / sizeof m->f8[0])) return MOEQ_ERR_INTERNAL;
    moeq_tensor *c = q8 ? moeq_tensor_q8r_copy(t) : moeq_tensor_f8_copy(t);
    if (!c) return MOEQ_ERR_NOMEM;
    m->f8[m->n_f8++] = c;
    *slot = c;
    return MOEQ_OK;
}

/*
 * mtp_draft = f8: the layer's dense projections (attention, dense MLP or shared experts, eh_proj) and the
 * head as 8-bit copies: Q8R (int8 rows, exact int32 sums) where the CPU backend has AVX512-VNNI, else F8
 * E4M3 (mtp_draft = e4m3: F8 E4M3 everywhere). A draft reads about half the bytes of a BF16 one, and its
 * bytes are what a k = 1 round pays on top of the verify step; the int8 kernels stream them at 1-2 rows
 * where F8 on AMX tiles cannot. kv_b_proj (the absorbed attention's NN products), the router and the routed
 * experts stay as they are. Made when the first sequence is marked (an engine that never drafts, as
 * bench-engine's or a worker's with mtp_k = 0, spends neither the time nor the memory), before any MTP entry
 * exists; every MTP pass after that (drafts, pending entries computed by a main step) uses the same copies, so
 * the MTP cache is consistent. The copies only move drafts, never an emitted token. All or nothing.
 */
static moeq_err make_draft_layer(moeq_engine *e, moeq_mtp_state *m) {
    moeq_layer d = *m->layer;
    const moeq_tensor *head = m->head;
    /* a head that is lm_head drafts through the screened head's int8 copy where there is one: draft_copy would
     * make the same bytes (moeq_tensor_q8r_copy) a second time, vocab x hidden of them (927 MB for V3) */
    const moeq_tensor *shared = head == e->model->lm_head && draft_q8(e, head) ? moeq_forward_head_codes(e) : NULL;
    if (shared) head = shared;
    const moeq_tensor **slots[] = {&d.q_proj,       &d.q_a_proj,       &d.q_b_proj,         &d.kv_a_proj_with_mqa,
                                   &d.o_proj,       &d.mlp.gate_proj,  &d.mlp.up_proj,      &d.mlp.down_proj,
                                   &d.shared.gate_proj, &d.shared.up_proj, &d.shared.down_proj, &d.eh_proj,
                                   shared ? NULL : &head};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0] && slots[i]; i++) {
        moeq_err err = draft_copy(e, m, slots[i]);
        if (err) {
            for (int j = 0; j < m->n_f8; j++) free(m->f8[j]);
            m->n_f8 = 0;
            return err;
        }
    }
    m->draft = d;
    m->head = head;
    m->layer = e->mtp_f8_layer = &m->draft;
    return MOEQ_OK;
}

size_t moeq_mtp_draft_f8_bytes(const moeq_engine *e) {
    size_t bytes = 0;
    for (int i = 0; e->mtp && i < e->mtp->n_f8; i++)
        bytes += e->mtp->f8[i]->nbytes + e->mtp->f8[i]->scale_inv->nbytes;
    return bytes;
}

static moeq_err widen_all(moeq_engine *e, moeq_mtp_state *m) {
    const moeq_layer *L = m->layer;
    m->vecs.in_norm = widen(e, L->input_layernorm);
    m->vecs.post_norm = widen(e, L->post_attention_layernorm);
    m->vecs.kv_a_norm = widen(e, L->kv_a_layernorm);
    m->vecs.q_a_norm = widen(e, L->q_a_layernorm);
    m->vecs.bias = widen(e, L->is_moe ? L->e_score_correction_bias : NULL);
    m->enorm = widen(e, L->enorm);
    m->hnorm = widen(e, L->hnorm);
    m->head_norm = widen(e, L->shared_head_norm);
    if (!m->vecs.in_norm || !m->vecs.post_norm || !m->vecs.kv_a_norm || (e->cfg->q_lora_rank > 0 && !m->vecs.q_a_norm) ||
        (L->is_moe && L->e_score_correction_bias && !m->vecs.bias) || !m->enorm || !m->hnorm || !m->head_norm)
        return MOEQ_ERR_NOMEM;
    return MOEQ_OK;
}

static moeq_err alloc_seq_state(moeq_engine *e, moeq_mtp_state *m) {
    size_t S = (size_t)e->params.max_seqs, D = (size_t)e->cfg->hidden_size;
    m->ring = MOEQ_MTP_MAX_K + 1 < e->params.max_step_tokens ? MOEQ_MTP_MAX_K + 1 : e->params.max_step_tokens;
    moeq_backend *b = e->backend;
    m->ring_h = b->alloc(b, MOEQ_BUFFER_STATE, S * (size_t)m->ring * D * sizeof(float));
    m->ring_tok = malloc(S * (size_t)m->ring * sizeof(int32_t));
    m->ring_lo = calloc(S, sizeof(int64_t));
    m->done = calloc(S, sizeof(int64_t));
    m->guess_pos = malloc(S * sizeof(int64_t));
    m->guess_tok = calloc(S, sizeof(int32_t));
    m->chain_h = b->alloc(b, MOEQ_BUFFER_STATE, S * D * sizeof(float));
    m->chain_pos = malloc(S * sizeof(int64_t));
    m->on = calloc(S, 1);
    m->key_row = malloc(((size_t)e->params.kv_block_tokens + 1) * sizeof(int32_t));
    if (!m->on || !m->key_row || !m->ring_h || !m->ring_tok || !m->ring_lo || !m->done || !m->guess_pos || !m->guess_tok ||
        !m->chain_h || !m->chain_pos)
        return MOEQ_ERR_NOMEM;
    for (size_t i = 0; i < S; i++) m->chain_pos[i] = m->guess_pos[i] = -1;
    return MOEQ_OK;
}

/*
 * 1 when a and b hold the same bytes. DeepSeek-V3 stores the MTP layer's head as a copy of lm_head ("shared
 * head"); drafting through lm_head itself gives the same logits, and the copy's pages (1.85 GB in bf16 for
 * V3) are never touched again, so they never take memory. Read once at engine creation.
 */
static int same_values(const moeq_tensor *a, const moeq_tensor *b) {
    if (!a || !b || a->dtype != b->dtype || a->nbytes != b->nbytes || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    if ((a->scale_inv != NULL) != (b->scale_inv != NULL)) return 0;
    if (a->scale_inv && !same_values(a->scale_inv, b->scale_inv)) return 0;
    return a->data == b->data || memcmp(a->data, b->data, a->nbytes) == 0;
}

int moeq_mtp_head_is_lm_head(const moeq_engine *e) { return e->mtp && e->mtp->head == e->model->lm_head; }

const moeq_tensor *moeq_mtp_draft_head(const moeq_engine *e) { return e->mtp ? e->mtp->head : NULL; }

moeq_err moeq_mtp_state_new(moeq_engine *e, moeq_mtp_state **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    const moeq_model *model = e->model;
    if (model->n_mtp_layers < 1 || !model->mtp_layers[0].eh_proj) return MOEQ_OK;
    moeq_mtp_state *m = calloc(1, sizeof(*m));
    if (!m) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "mtp state");
    m->layer = &model->mtp_layers[0];
    m->head = same_values(m->layer->shared_head_head, model->lm_head) ? model->lm_head
              : m->layer->shared_head_head                                ? m->layer->shared_head_head
                                                                          : model->lm_head;
    moeq_err err = widen_all(e, m);
    if (!err) err = alloc_seq_state(e, m);
    if (err) {
        moeq_mtp_state_destroy(e, m);
        return moeq_errf(err, errstr, errstr_size, "mtp layer vectors and per-sequence state");
    }
    const moeq_model_config *c = e->cfg;
    moeq_kv_cache_params kp = {1, c->kv_lora_rank + c->qk_rope_head_dim, e->params.kv_block_tokens,
                               e->params.kv_cache_tokens + (int64_t)e->params.max_seqs * MOEQ_MTP_MAX_K,
                               e->params.max_seqs, NULL, NULL, NULL, e->params.prefix_cache, 1,
                               moeq_forward_max_cached(e, e->params.kv_cache_tokens + (int64_t)e->params.max_seqs * MOEQ_MTP_MAX_K),
                               moeq_forward_cache_salt(e, 1)};
    if ((err = moeq_forward_cache_new(e, &kp, NULL, &m->cache_pool, &m->cache, errstr, errstr_size))) {
        moeq_mtp_state_destroy(e, m);
        return err;
    }
    *out = m;
    return MOEQ_OK;
}

void moeq_mtp_state_destroy(moeq_engine *e, moeq_mtp_state *m) {
    if (!m) return;
    moeq_backend *b = e->backend;
    moeq_kv_cache_destroy(m->cache);
    b->release(b, m->cache_pool);
    b->release(b, m->vecs.in_norm);
    b->release(b, m->vecs.post_norm);
    b->release(b, m->vecs.q_a_norm);
    b->release(b, m->vecs.kv_a_norm);
    b->release(b, m->vecs.bias);
    b->release(b, m->enorm);
    b->release(b, m->hnorm);
    b->release(b, m->head_norm);
    b->release(b, m->ring_h);
    b->release(b, m->chain_h);
    free(m->ring_tok);
    free(m->ring_lo);
    free(m->done);
    free(m->guess_pos);
    free(m->guess_tok);
    free(m->chain_pos);
    free(m->on);
    free(m->key_row);
    for (int i = 0; i < m->n_f8; i++) free(m->f8[i]);
    if (e->mtp_f8_layer == &m->draft) e->mtp_f8_layer = NULL;
    free(m);
}

/* ---- per-sequence state --------------------------------------------------- */

static void reset_seq(moeq_mtp_state *m, int seq) {
    m->ring_lo[seq] = 0;
    m->done[seq] = 0;
    m->guess_pos[seq] = -1;
    m->chain_pos[seq] = -1;
}

void moeq_mtp_seq_opened(moeq_engine *e, int seq) {
    moeq_mtp_state *m = e->mtp;
    if (!m) return;
    moeq_kv_cache_seq_free(m->cache, seq); /* stale slot (cannot happen: ids move in step) */
    moeq_kv_cache_seq_open(m->cache, seq);
    reset_seq(m, seq);
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

/* Truncation to n keeps the true entries below n - 1 and drops every draft entry. */
void moeq_mtp_seq_truncated(moeq_engine *e, int seq, int64_t n) {
    moeq_mtp_state *m = e->mtp;
    if (!m || !moeq_kv_cache_seq_alive(m->cache, seq)) return;
    int64_t keep = n > 0 ? n - 1 : 0;
    if (m->done[seq] > keep) m->done[seq] = keep;
    moeq_kv_cache_truncate(m->cache, seq, m->done[seq]);
    if (m->ring_lo[seq] > n) m->ring_lo[seq] = n; /* rows cover [ring_lo, n): maybe none */
    m->guess_pos[seq] = -1;
    m->chain_pos[seq] = -1;
}

static float *ring_row(const moeq_mtp_state *m, int seq, int64_t pos, int64_t D) {
    return m->ring_h + ((size_t)seq * m->ring + (size_t)(pos % m->ring)) * D;
}

static int32_t *ring_tok(const moeq_mtp_state *m, int seq, int64_t pos) {
    return m->ring_tok + (size_t)seq * m->ring + (size_t)(pos % m->ring);
}

/* A marked sequence of len tokens has what its pending entries and its next draft read: rows done .. len - 1. */
static int state_ok(const moeq_engine *e, int seq, int64_t len) {
    const moeq_mtp_state *m = e->mtp;
    return len == 0 || (m->ring_lo[seq] <= m->done[seq] && m->done[seq] <= len - 1);
}

/* Key the sequence's MTP blocks whose entries are all true now (done moved), from the main cache's tokens. */
static void key_blocks(moeq_engine *e, int seq) {
    moeq_mtp_state *m = e->mtp;
    int64_t bt = e->params.kv_block_tokens;
    for (int64_t b = moeq_kv_cache_seq_keyed(m->cache, seq); (b + 1) * bt <= m->done[seq]; b++)
        if (!moeq_kv_cache_seq_tokens(e->cache, seq, b * bt, bt + 1, m->key_row) ||
            !moeq_kv_cache_key_next(m->cache, seq, m->key_row))
            return;
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
    e->backend->embed(e->backend, e->model->embed_tokens, s->tok_id, T, s->tmp);
    moeq_forward_rmsnorm(e, s->eh, 2 * D, s->tmp, D, NULL, T, D, m->enorm);
    moeq_forward_rmsnorm(e, s->eh + D, 2 * D, s->eh + D, 2 * D, NULL, T, D, m->hnorm);
    moeq_forward_rope(e, T);
    moeq_forward_linear(e, m->layer->eh_proj, s->eh, s->x, T);
    moeq_block b = {m->layer, &m->vecs, m->cache, 0};
    moeq_forward_block(e, &b, T);
    moeq_moe_layer_flush(e);
    m->rows_run += T;
}

/* Entry row t of the next MTP pass: hidden input h, next token tok, at (seq, pos). */
static void lay_entry(moeq_engine *e, int64_t t, const float *h, int32_t tok, int seq, int64_t pos) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size;
    e->backend->copy(e->backend, s->eh + t * 2 * D + D, h, (size_t)D * sizeof(float));
    s->tok_id[t] = tok;
    s->tok_seq[t] = seq;
    s->tok_pos[t] = pos;
}

/* ---- inside a main step --------------------------------------------------- */

/*
 * What a main step of item (at position p) does to its sequence's MTP state:
 * the first draft entry (p - 1) is confirmed when the step's first token is
 * the one it was drafted with; entries done .. target - 1 are computed in the
 * step, only as many as keep the pending rows within the ring.
 */
typedef struct catch_up {
    int64_t done, target;
} catch_up;

static catch_up plan_item(const moeq_engine *e, const moeq_step_item *it, int64_t p) {
    const moeq_mtp_state *m = e->mtp;
    int seq = it->seq_id;
    int64_t done = m->done[seq], first = p + it->n_tokens - m->ring;
    if (p > 0 && m->guess_pos[seq] == p - 1 && m->guess_tok[seq] == it->tokens[0]) done = p;
    return (catch_up){done, first > done ? first : done};
}

/*
 * The ring rows a step at p needs: the entries c.done .. p - 1 stay pending
 * or are computed in the step, and either way read rows from c.done on. A
 * step that confirms the first draft entry (c.done == p) reads none: that
 * is how a sequence forked with mtp = 1 (no rows, entry p - 1 a guess)
 * steps. Sequences truncated below their last step, or forked ones whose
 * first token is not the guess, have no rows to compute from.
 */
static int rows_ok(const moeq_mtp_state *m, int seq, catch_up c, int64_t p) {
    return c.done == p || (c.done < p && m->ring_lo[seq] <= c.done);
}

moeq_err moeq_mtp_check_item(moeq_engine *e, const moeq_step_item *it, int i, int64_t *blocks, char *errstr,
                             size_t errstr_size) {
    moeq_mtp_state *m = e->mtp;
    int64_t p = moeq_kv_cache_seq_len(e->cache, it->seq_id);
    catch_up c = plan_item(e, it, p);
    if (!rows_ok(m, it->seq_id, c, p))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "item %d: seq %d has no MTP state at position %lld (truncated below its last step, or "
                         "forked with another next_token than its first token %d)",
                         i, it->seq_id, (long long)(p - 1), it->tokens[0]);
    /* truncated to plan.done, then grown to plan.target (a shared last block is copied first) */
    *blocks += moeq_kv_cache_blocks_needed_after(m->cache, it->seq_id, c.done, c.target);
    return MOEQ_OK;
}

moeq_err moeq_mtp_check_blocks(moeq_engine *e, int64_t blocks, char *errstr, size_t errstr_size) {
    if (blocks > moeq_kv_cache_free_blocks(e->mtp->cache))
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "mtp cache full: %lld blocks needed, %lld free",
                         (long long)blocks, (long long)moeq_kv_cache_free_blocks(e->mtp->cache));
    return MOEQ_OK;
}

/*
 * One marked item of a main step whose hidden rows are in s.hid from row t0:
 * lay out its forced catch-up entries from row n_mtp on (hidden from the ring
 * below p, else from s.hid; tokens likewise from the ring or the item), then
 * keep its last rows and tokens. Returns the entries laid out (<= n_tokens:
 * before the step at most `ring` rows were pending, so the MTP rows never
 * outnumber the step's).
 */
static int64_t catch_up_item(moeq_engine *e, const moeq_step_item *it, int64_t t0, int64_t n_mtp) {
    moeq_mtp_state *m = e->mtp;
    const float *hid = e->s.hid;
    int seq = it->seq_id;
    int64_t D = e->cfg->hidden_size, n = it->n_tokens, L = moeq_kv_cache_seq_len(e->cache, seq), p = L - n;
    catch_up c = plan_item(e, it, p);
    moeq_kv_cache_truncate(m->cache, seq, c.done);
    m->guess_pos[seq] = m->chain_pos[seq] = -1;
    for (int64_t pos = c.done; pos < c.target; pos++) {
        const float *h = pos < p ? ring_row(m, seq, pos, D) : hid + (t0 + pos - p) * D;
        int32_t tok = pos + 1 < p ? *ring_tok(m, seq, pos + 1) : it->tokens[pos + 1 - p];
        lay_entry(e, n_mtp + pos - c.done, h, tok, seq, pos);
    }
    moeq_kv_cache_grow(m->cache, seq, c.target); /* checked by moeq_mtp_check_item */
    int64_t keep = L - m->ring > p ? L - m->ring : p;
    for (int64_t pos = keep; pos < L; pos++) {
        e->backend->copy(e->backend, ring_row(m, seq, pos, D), hid + (t0 + pos - p) * D, (size_t)D * sizeof(float));
        *ring_tok(m, seq, pos) = it->tokens[pos - p];
    }
    if (m->ring_lo[seq] < L - m->ring) m->ring_lo[seq] = L - m->ring;
    m->done[seq] = c.target;
    return c.target - c.done;
}

void moeq_mtp_after_step(moeq_engine *e, const moeq_step_item *items, int n_items, int64_t n_tok) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size, t0 = 0, n_mtp = 0;
    (void)n_tok;
    for (int i = 0; i < n_items; t0 += items[i++].n_tokens) {
        if (!moeq_mtp_seq_on(e, items[i].seq_id)) continue;
        moeq_forward_rmsnorm(e, s->hid + t0 * D, D, s->x + t0 * D, D, NULL, items[i].n_tokens, D, e->final_norm);
    }
    t0 = 0;
    for (int i = 0; i < n_items; t0 += items[i++].n_tokens)
        if (moeq_mtp_seq_on(e, items[i].seq_id)) n_mtp += catch_up_item(e, &items[i], t0, n_mtp);
    if (n_mtp > 0) mtp_forward(e, n_mtp);
    for (int i = 0; i < n_items; i++) /* after the pass: the entries it computed are true now */
        if (moeq_mtp_seq_on(e, items[i].seq_id)) key_blocks(e, items[i].seq_id);
}

/* ---- public --------------------------------------------------------------- */

int moeq_engine_mtp_available(const moeq_engine *engine) { return engine && engine->mtp ? 1 : 0; }

moeq_err moeq_engine_seq_set_mtp(moeq_engine *engine, int seq_id, int on) {
    if (!engine) return MOEQ_ERR_INVALID_ARG;
    if (!engine->mtp) return on ? MOEQ_ERR_UNSUPPORTED : MOEQ_OK;
    if (moeq_kv_cache_seq_len(engine->cache, seq_id) != 0) return MOEQ_ERR_INVALID_ARG;
    if (on && moeq_mtp_draft_f8(engine) && !engine->mtp_f8_layer) {
        moeq_err err = make_draft_layer(engine, engine->mtp);
        if (err) return err; /* NOMEM: the sequence stays unmarked */
    }
    reset_seq(engine->mtp, seq_id);
    engine->mtp->on[seq_id] = on ? 1 : 0;
    return MOEQ_OK;
}

int moeq_engine_mtp_seq_len(const moeq_engine *engine, int seq_id) {
    if (!engine || !engine->mtp) return -1;
    int64_t q = moeq_kv_cache_seq_len(engine->mtp->cache, seq_id), len = moeq_kv_cache_seq_len(engine->cache, seq_id);
    return (int)(moeq_mtp_seq_on(engine, seq_id) && len - 1 > q ? len - 1 : q); /* pending entries count */
}

enum { DRAFT_NONE, DRAFT_FIRST, DRAFT_CHAINED };

/*
 * The entries the next draft of seq computes: [*start, *end). DRAFT_FIRST
 * (the first after a main step or truncation): the pending entries
 * done .. len - 2 and the draft entry len - 1, from the ring; DRAFT_CHAINED:
 * one entry from the module's last output; DRAFT_NONE: seq cannot draft.
 */
static int draft_span(const moeq_engine *e, int seq, int64_t *start, int64_t *end) {
    const moeq_mtp_state *m = e->mtp;
    if (!moeq_mtp_seq_on(e, seq)) return DRAFT_NONE;
    int64_t q = moeq_kv_cache_seq_len(m->cache, seq), len = moeq_kv_cache_seq_len(e->cache, seq);
    if (len >= 1 && m->chain_pos[seq] >= 0 && m->chain_pos[seq] == q - 1) {
        *start = q, *end = q + 1;
        return DRAFT_CHAINED;
    }
    if (len < 1 || q != m->done[seq] || !state_ok(e, seq, len)) return DRAFT_NONE;
    *start = q, *end = len;
    return DRAFT_FIRST;
}

static moeq_err check_draft(moeq_engine *e, const moeq_mtp_item *items, int n, size_t logits_rows, char *errstr,
                            size_t errstr_size) {
    int64_t blocks = 0, start, end;
    if ((size_t)n > logits_rows)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "mtp step of %d items: logits rows %zu", n,
                         logits_rows);
    for (int i = 0; i < n; i++) {
        int seq = items[i].seq_id;
        if (!moeq_kv_cache_seq_alive(e->cache, seq) || !draft_span(e, seq, &start, &end))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "mtp item %d: seq %d not alive or without MTP state (moeq_engine_seq_set_mtp)", i, seq);
        if (items[i].token < 0 || items[i].token >= e->cfg->vocab_size)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp item %d: token %d outside vocab", i,
                             items[i].token);
        for (int j = 0; j < i; j++)
            if (items[j].seq_id == seq)
                return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "mtp item %d: seq %d twice", i, seq);
        if (end > moeq_kv_cache_max_seq_tokens(e->cache) || end > moeq_engine_max_model_len(e) ||
            end - start > e->params.max_step_tokens)
            return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size,
                             "mtp item %d: entries %lld..%lld past the cache, the context or max_step_tokens", i,
                             (long long)start, (long long)end);
        blocks += moeq_kv_cache_blocks_needed(e->mtp->cache, seq, end); /* grown from start = its length */
    }
    return moeq_mtp_check_blocks(e, blocks, errstr, errstr_size);
}

/* Lay out item's draft entries from row t on; returns how many. */
static int64_t lay_draft(moeq_engine *e, const moeq_mtp_item *item, int64_t t) {
    moeq_mtp_state *m = e->mtp;
    int seq = item->seq_id;
    int64_t D = e->cfg->hidden_size, start, end, len = moeq_kv_cache_seq_len(e->cache, seq);
    if (draft_span(e, seq, &start, &end) == DRAFT_CHAINED) { /* checked: not DRAFT_NONE */
        lay_entry(e, t, m->chain_h + (size_t)seq * D, item->token, seq, start);
    } else {
        for (int64_t pos = start; pos < end; pos++)
            lay_entry(e, t + pos - start, ring_row(m, seq, pos, D),
                      pos + 1 < len ? *ring_tok(m, seq, pos + 1) : item->token, seq, pos);
        m->done[seq] = len - 1;
        m->guess_pos[seq] = len - 1;
        m->guess_tok[seq] = item->token;
    }
    moeq_kv_cache_grow(m->cache, seq, end); /* checked */
    return end - start;
}

/*
 * Items [i0, i1) laid out in one pass of T rows, s.logit_tok[r] the last row
 * of item i0 + r (its draft entry): run the block, keep the chain rows, and
 * only those rows go through the head.
 */
static void draft_pass(moeq_engine *e, const moeq_mtp_item *items, int i0, int i1, int64_t T,
                       const moeq_step_out *out) {
    moeq_mtp_state *m = e->mtp;
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size;
    mtp_forward(e, T);
    for (int i = i0, r = 0; i < i1; i++, r++) {
        int seq = items[i].seq_id;
        int64_t last = s->logit_tok[r];
        e->backend->copy(e->backend, m->chain_h + (size_t)seq * D, s->x + last * D, (size_t)D * sizeof(float));
        m->chain_pos[seq] = s->tok_pos[last];
    }
    moeq_forward_head(e, m->head_norm, m->head, i1 - i0, out, i0);
}

moeq_err moeq_engine_mtp_step(moeq_engine *engine, const moeq_mtp_item *items, int n_items, float *logits,
                              size_t logits_rows, char *errstr, size_t errstr_size) {
    moeq_step_out out = {.logits = logits, .logits_rows = logits_rows};
    return moeq_engine_mtp_step_out(engine, items, n_items, &out, errstr, errstr_size);
}

moeq_err moeq_engine_mtp_step_out(moeq_engine *engine, const moeq_mtp_item *items, int n_items,
                                  const moeq_step_out *out, char *errstr, size_t errstr_size) {
    if (!engine || !out || n_items < 0 || (n_items > 0 && (!items || !out->logits || (out->records && !out->have_row))))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "engine, items and logits are required");
    if (!engine->mtp) return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "the model has no MTP layer");
    moeq_err err = check_draft(engine, items, n_items, out->logits_rows, errstr, errstr_size);
    if (err || n_items == 0) return err;
    int64_t T_max = engine->params.max_step_tokens, start, end;
    for (int i0 = 0, i1; i0 < n_items; i0 = i1) { /* passes of at most max_step_tokens rows, whole items */
        int64_t T = 0;
        for (i1 = i0; i1 < n_items; i1++) {
            draft_span(engine, items[i1].seq_id, &start, &end);
            if (T + end - start > T_max) break;
            T += lay_draft(engine, &items[i1], T);
            engine->s.logit_tok[i1 - i0] = T - 1;
        }
        draft_pass(engine, items, i0, i1, T, out);
    }
    return MOEQ_OK;
}

/*
 * Compute seq's pending entries done .. upto - 1 now, in one pass (upto <=
 * seq_len - 1: entry i reads the token at i + 1, which the ring keeps for
 * pending entries). At most `ring` - 1 entries are pending, so the pass fits
 * the step scratch (free outside a step). INVALID_ARG when the ring no longer
 * holds their rows (truncated below its last step), LIMIT when the MTP cache
 * is full; nothing changes then.
 */
static moeq_err compute_pending(moeq_engine *e, int seq, int64_t upto) {
    moeq_mtp_state *m = e->mtp;
    int64_t D = e->cfg->hidden_size, done = m->done[seq];
    if (done >= upto) return MOEQ_OK;
    /* pending entries exist only right after a step or truncation: no draft entries past done then */
    if (moeq_kv_cache_seq_len(m->cache, seq) != done || m->ring_lo[seq] > done) return MOEQ_ERR_INVALID_ARG;
    if (upto - done > e->params.max_step_tokens || moeq_kv_cache_grow(m->cache, seq, upto)) return MOEQ_ERR_LIMIT;
    for (int64_t pos = done; pos < upto; pos++)
        lay_entry(e, pos - done, ring_row(m, seq, pos, D), *ring_tok(m, seq, pos + 1), seq, pos);
    mtp_forward(e, upto - done);
    m->done[seq] = upto;
    key_blocks(e, seq);
    return MOEQ_OK;
}

/* Compute seq's pending entries now (tests compare caches entry by entry). */
static void flush(moeq_engine *e, int seq) {
    int64_t len = moeq_kv_cache_seq_len(e->cache, seq);
    if (moeq_mtp_seq_on(e, seq) && len >= 1) (void)compute_pending(e, seq, len - 1);
}

moeq_err moeq_mtp_seq_forked(moeq_engine *e, int src, int64_t n, int32_t next_token, int dst, char *errstr,
                             size_t errstr_size) {
    moeq_mtp_state *m = e->mtp;
    moeq_err err = compute_pending(e, src, n);
    if (err == MOEQ_ERR_LIMIT)
        return moeq_errf(err, errstr, errstr_size, "fork: mtp cache full computing seq %d's pending entries below %lld",
                         src, (long long)n);
    if (err)
        return moeq_errf(err, errstr, errstr_size, "fork: seq %d has no MTP state below position %lld (truncated "
                         "below its last step)", src, (long long)n);
    if ((err = moeq_kv_cache_seq_fork(m->cache, src, n, dst)))
        return moeq_errf(err, errstr, errstr_size, "fork: mtp cache %s for entries 0..%lld of seq %d",
                         err == MOEQ_ERR_LIMIT ? "full, no block to copy the partial block into" : "refused the fork",
                         (long long)n - 1, src);
    reset_seq(m, dst);
    /* entry n - 1 was built with src's token at n: a guess until dst's first step appends next_token */
    m->done[dst] = n - 1;
    m->guess_pos[dst] = n - 1;
    m->guess_tok[dst] = next_token;
    m->ring_lo[dst] = n; /* no rows: dst's first step must confirm the guess */
    m->on[dst] = 1;
    return MOEQ_OK;
}

const float *moeq_mtp_cache_entry(moeq_engine *engine, int seq_id, int64_t pos) {
    flush(engine, seq_id);
    return moeq_kv_cache_entry(engine->mtp->cache, seq_id, 0, pos);
}

int64_t moeq_mtp_rows_run(const moeq_engine *engine) { return engine->mtp ? engine->mtp->rows_run : 0; }

/* ---- prefix cache ------------------------------------------------------------- */

int64_t moeq_mtp_prefix_blocks(const moeq_engine *e, const int32_t *prompt, int n_prompt, int64_t max_blocks) {
    return moeq_kv_cache_lookup(e->mtp->cache, prompt, n_prompt, max_blocks);
}

int64_t moeq_mtp_seq_take_prefix(moeq_engine *e, int seq, const int32_t *prompt, int n_prompt, int64_t n_blocks) {
    moeq_mtp_state *m = e->mtp;
    int64_t bt = e->params.kv_block_tokens, got = moeq_kv_cache_take_prefix(m->cache, seq, prompt, n_prompt, n_blocks);
    if (got == 0) return 0;
    int64_t n = got * bt;
    reset_seq(m, seq);
    m->done[seq] = n - 1; /* as moeq_mtp_seq_forked: entry n - 1 read prompt[n], which the first step appends */
    m->guess_pos[seq] = n - 1;
    m->guess_tok[seq] = prompt[n];
    m->ring_lo[seq] = n;
    return got;
}

void moeq_mtp_prefix_stats(const moeq_engine *e, moeq_kv_blocks_stats *stats) {
    moeq_kv_cache_prefix_stats(e->mtp->cache, stats);
}

moeq_kv_cache *moeq_mtp_cache(const moeq_engine *e) { return e->mtp ? e->mtp->cache : NULL; }
