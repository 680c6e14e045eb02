/*
 * forward.h — internal: the engine object and the batched forward step
 * (engine.c creates it, forward.c runs it). Not installed.
 *
 * Memory by lifetime: the model's weights are borrowed (mmapped, stored
 * width) and mapped into the backend once; small vectors (norm weights,
 * router biases) are widened once at creation into backend buffers; the KV
 * cache's entry pool is a backend buffer, its block tables host bookkeeping;
 * per-step scratch is one backend arena sized for max_step_tokens, beside a
 * small host arena for the step's metadata (token ids, positions, the
 * router's finite flags). A step allocates nothing.
 */
#ifndef MOEQ_ENGINE_FORWARD_H
#define MOEQ_ENGINE_FORWARD_H

#include <stdint.h>

#include "backend.h"
#include "kv_cache.h"
#include "model.h"
#include "moe.h"
#include "moeq/engine.h"
#include "rope.h"

/* Backend buffers (MOEQ_BUFFER_WEIGHTS). */
typedef struct moeq_layer_vecs {
    float *in_norm, *post_norm, *q_a_norm, *kv_a_norm; /* widened norm weights        */
    float *bias;                                       /* e_score_correction_bias or NULL */
} moeq_layer_vecs;

/* Per-step scratch, (shape) in floats unless noted. "host": the host arena (step metadata); the rest is the
 * backend's arena, touched only through backend ops. */
typedef struct moeq_scratch {
    float *x;        /* (T, D) residual stream                 */
    float *h;        /* (T, D) normed                          */
    float *tmp;      /* (T, D) sublayer output                 */
    float *qa;       /* (T, q_lora)                            */
    float *q;        /* (T, H, nope+rope)                      */
    float *kva;      /* (T, kv_lora+rope)                      */
    float *qpe;      /* (T, H, rope) roped                     */
    float *qlat;     /* (T, H, kv_lora)                        */
    float *olat;     /* (T, H, kv_lora)                        */
    float *ov;       /* (T, H, v)                              */
    float *router;   /* (T, E)                                 */
    float *rw;       /* (T, k) routing weights                 */
    int32_t *rids;   /* (T, k) routed experts                  */
    uint8_t *finite; /* host (T) the router saw only finite logits */
    int64_t *slot_row;/* (T*k) row of each slot in xg/down     */
    float *xg;       /* (T*k, D) gathered tokens               */
    float *g, *u;    /* gate/up outputs, max(T*I, T*k*MI + T*SI) */
    float *down;     /* (T*k + T, D) routed rows, then shared  */
    float *route_scratch;
    float *cos_v, *sin_v; /* (T, rope/2)                       */
    int32_t *tok_id, *tok_seq; /* host (T)                     */
    int64_t *tok_pos;          /* host (T)                     */
    int64_t *logit_tok;        /* host (T) token index of each logits row */
    float *hid;      /* (T, D) main hidden after the final norm (MTP input); NULL without MTP */
    float *eh;       /* (T, 2D) MTP: [enorm(embed) ; hnorm(hidden)]; NULL without MTP     */
    moeq_mm_job *jobs; /* host */
    int max_jobs;
} moeq_scratch;

struct moeq_engine {
    const moeq_model *model;
    const moeq_model_config *cfg;
    moeq_engine_params params;
    moeq_backend *backend;
    moeq_kv_cache *cache;
    float *cache_pool;       /* backend buffer: the cache's entries */
    moeq_rope rope;
    moeq_moe_router router;
    moeq_layer_vecs *vecs;   /* [num_hidden_layers] */
    float *final_norm;       /* [hidden] backend buffer */
    moeq_scratch s;
    void *arena;             /* backend buffer: the step's activations */
    void *host_arena;        /* the step's metadata                    */
    int naive_attention;     /* tests: expanded K/V instead of absorption */
    struct moeq_moe_layer *moe; /* the MoE seam (moe_layer.c); NULL without routed experts */
    struct moeq_mtp_state *mtp; /* MTP layers' caches and per-sequence state (mtp.c); NULL without MTP */
    int *nonfinite_layer;    /* [max_seqs] first layer whose router saw a non-finite score, -1 none */
};

/* One decoder block as the forward runs it: weights, widened vectors, and the cache layer it writes. */
typedef struct moeq_block {
    const moeq_layer *layer;
    const moeq_layer_vecs *vecs;
    moeq_kv_cache *cache;
    int cache_layer;
} moeq_block;

/* A paged cache whose entry pool is a backend buffer (*pool, the caller releases it after the cache). */
moeq_err moeq_forward_cache_new(moeq_engine *engine, const moeq_kv_cache_params *params, float **pool,
                                moeq_kv_cache **out, char *errstr, size_t errstr_size);

/* Main-model layer l as a block (cache = engine->cache, cache layer l). */
moeq_block moeq_forward_main_block(moeq_engine *engine, int layer);

/* cos/sin of s.tok_pos[0..n_tok) into s.cos_v/s.sin_v. */
void moeq_forward_rope(moeq_engine *engine, int64_t n_tok);

/* One block over the residual stream s.x (T, D): x += MLA(norm x); x += MLP/MoE(norm x). Needs rope set. */
void moeq_forward_block(moeq_engine *engine, const moeq_block *block, int64_t n_tok);

/* rmsnorm(s.x row s.logit_tok[r], norm) -> head, for r < n_rows, into logits (n_rows, vocab). Uses s.h. */
void moeq_forward_head(moeq_engine *engine, const float *norm, const moeq_tensor *head, int64_t n_rows, float *logits);

/* Widen a small tensor (norm weight, bias) into a backend weights buffer; NULL for NULL or on failure. */
float *moeq_forward_widen(moeq_engine *engine, const moeq_tensor *t);

/* rmsnorm of n_rows rows of x (stride ldx; rows[r] or r) into out (stride ld_out), n values each. */
void moeq_forward_rmsnorm(moeq_engine *engine, float *out, int64_t ld_out, const float *x, int64_t ldx,
                          const int64_t *rows, int64_t n_rows, int64_t n, const float *w);

/* y (T, rows) = x (T, cols) W^T through the backend. */
void moeq_forward_linear(moeq_engine *engine, const moeq_tensor *w, const float *x, float *y, int64_t n_tok);

/* Run the layers over the step's tokens already placed in s.tok_* (forward.c). */
void moeq_forward_tokens(moeq_engine *engine, int64_t n_tok);

/* MoE block of layer over s.h (T, D) into s.tmp (T, D) through the MoE layer (moe_layer.h). */
void moeq_forward_moe(moeq_engine *engine, int layer, int64_t n_tok);

/* Tokens [0, n_tok) whose router saw a non-finite logit (s.finite) flag their sequence at layer L. */
void moeq_forward_flag_nonfinite(moeq_engine *engine, const moeq_layer *L, int64_t n_tok);

/* Final norm + lm_head for s.logit_tok[0..n_rows) into logits (n_rows, vocab). */
void moeq_forward_logits(moeq_engine *engine, int64_t n_rows, float *logits);

/* Tests: 1 = run the naive (expanded K/V) attention instead of the absorbed one. */
void moeq_engine_set_naive_attention(moeq_engine *engine, int on);

#endif
