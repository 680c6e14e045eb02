/*
 * forward.h — internal: the engine object and the batched forward step
 * (engine.c creates it, forward.c runs it). Not installed.
 *
 * Memory by lifetime: the model's weights are borrowed (mmapped, stored
 * width); small vectors (norm weights, router biases) are widened once at
 * creation; the KV cache is one pool; per-step scratch is one arena sized for
 * max_step_tokens. A step allocates nothing.
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

typedef struct moeq_layer_vecs {
    float *in_norm, *post_norm, *q_a_norm, *kv_a_norm; /* widened norm weights        */
    float *bias;                                       /* e_score_correction_bias or NULL */
} moeq_layer_vecs;

/* Per-step scratch, (shape) in floats unless noted. */
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
    int64_t *offsets;/* (E+1)                                  */
    int64_t *order;  /* (T*k) slots by expert                  */
    int64_t *slot_row;/* (T*k) row of each slot in xg/down     */
    float *xg;       /* (T*k, D) gathered tokens               */
    float *g, *u;    /* gate/up outputs, max(T*I, T*k*MI + T*SI) */
    float *down;     /* (T*k + T, D) routed rows, then shared  */
    float *route_scratch;
    float *cos_v, *sin_v; /* (T, rope/2)                       */
    int32_t *tok_id, *tok_seq; /* (T)                          */
    int64_t *tok_pos;          /* (T)                          */
    int64_t *logit_tok;        /* (T) token index of each logits row */
    float *hid;      /* (T, D) main hidden after the final norm (MTP input); NULL without MTP */
    float *eh;       /* (T, 2D) MTP: [enorm(embed) ; hnorm(hidden)]; NULL without MTP     */
    moeq_mm_job *jobs;
    int max_jobs;
} moeq_scratch;

struct moeq_engine {
    const moeq_model *model;
    const moeq_model_config *cfg;
    moeq_engine_params params;
    moeq_backend *backend;
    moeq_kv_cache *cache;
    moeq_rope rope;
    moeq_moe_router router;
    moeq_layer_vecs *vecs;   /* [num_hidden_layers] */
    float *final_norm;       /* [hidden]            */
    moeq_scratch s;
    void *arena;
    int naive_attention;     /* tests: expanded K/V instead of absorption */
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

/* Main-model layer l as a block (cache = engine->cache, cache layer l). */
moeq_block moeq_forward_main_block(moeq_engine *engine, int layer);

/* cos/sin of s.tok_pos[0..n_tok) into s.cos_v/s.sin_v. */
void moeq_forward_rope(moeq_engine *engine, int64_t n_tok);

/* One block over the residual stream s.x (T, D): x += MLA(norm x); x += MLP/MoE(norm x). Needs rope set. */
void moeq_forward_block(moeq_engine *engine, const moeq_block *block, int64_t n_tok);

/* rmsnorm(s.x row s.logit_tok[r], norm) -> head, for r < n_rows, into logits (n_rows, vocab). Uses s.h. */
void moeq_forward_head(moeq_engine *engine, const float *norm, const moeq_tensor *head, int64_t n_rows, float *logits);

/* y (T, rows) = x (T, cols) W^T through the backend. */
void moeq_forward_linear(moeq_engine *engine, const moeq_tensor *w, const float *x, float *y, int64_t n_tok);

/* Run the layers over the step's tokens already placed in s.tok_* (forward.c). */
void moeq_forward_tokens(moeq_engine *engine, int64_t n_tok);

/* MoE block of layer over s.h (T, D) into s.tmp (T, D): route, gather, one GEMM per expert, combine, + shared. */
void moeq_forward_moe(moeq_engine *engine, int layer, int64_t n_tok);

/* Final norm + lm_head for s.logit_tok[0..n_rows) into logits (n_rows, vocab). */
void moeq_forward_logits(moeq_engine *engine, int64_t n_rows, float *logits);

/* Tests: 1 = run the naive (expanded K/V) attention instead of the absorbed one. */
void moeq_engine_set_naive_attention(moeq_engine *engine, int on);

#endif
