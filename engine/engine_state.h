/*
 * engine_state.h — internal: the engine object, its step scratch and the
 * decoder block as the forward runs it; shared by forward.c, moe_layer.c,
 * mtp.c and engine.c, so that the MoE layer and the forward step need not
 * include each other. Not installed.
 */
#ifndef MOEQ_ENGINE_ENGINE_STATE_H
#define MOEQ_ENGINE_ENGINE_STATE_H

#include <stdint.h>

#include "backend.h"
#include "kv_cache.h"
#include "model.h"
#include "moe.h"
#include "moeq/engine.h"
#include "rope.h"

/* Logits rows a device backend's lm_head computes at once before they are downloaded (33 MB for V3's vocab). */
#define MOEQ_LOGITS_CHUNK 64

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
    int32_t *rids;   /* host (T, k) routed experts (the dispatch's layout reads them) */
    uint8_t *finite; /* host (T) the router saw only finite logits */
    int64_t *slot_row;/* (T*k) row of each slot in xg/down     */
    int32_t *dids;   /* (T, k) routed experts in backend memory (the moe_experts op reads them) */
    int64_t *moe_plan; /* MOEQ_MOE_PLAN_LEN(E, T*k) the moe_experts op's plan */
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
    float *logits;   /* (logits_rows, vocab) lm_head output of a backend that is not host_visible; else NULL */
    int64_t logits_rows;
    double logits_temp[MOEQ_LOGITS_CHUNK]; /* host: each chunk row's temperature for logits_reduce */
    moeq_mm_job *jobs; /* host */
    int max_jobs;
} moeq_scratch;

struct moeq_engine {
    int64_t main_steps; /* main forward passes run, a group's empty steps included (moeq_engine_main_steps) */
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
    size_t arena_bytes;
    void *host_arena;        /* the step's metadata                    */
    int naive_attention;     /* tests: expanded K/V instead of absorption */
    struct moeq_moe_layer *moe; /* the MoE seam (moe_layer.c); NULL without routed experts */
    struct moeq_mtp_state *mtp; /* MTP layers' caches and per-sequence state (mtp.c); NULL without MTP */
    const moeq_layer *mtp_f8_layer; /* MTP layer 0's copy with F8 weights (mtp_draft = f8, mtp.c), or NULL */
    int *nonfinite_layer;    /* [max_seqs] first layer whose router saw a non-finite score, -1 none */
    int32_t graph_scratch;   /* cuda_graphs: the main cache's block past its capacity, padding rows' only one;
                                -1: steps are never padded (graphs off, or a backend without them) */
    int64_t prefix_lookups, prefix_hits, prefix_lookup_tokens, prefix_hit_tokens; /* moeq_engine_seq_new_prefix */
    struct moeq_screen_state *screen; /* head_screen = auto: the screen and its scratch (forward.c), made at the
                                         first screened step; NULL before or when it cannot be */
    char screen_why[192];             /* why it cannot be, in words ("": made, or not tried yet)              */
    int64_t screened_rows, screen_fallbacks, screen_candidates; /* rows decided by the screen; rows it could not
                                                                   decide (computed whole); candidates computed */
    int64_t screen_refined; /* rows whose first pass left more than SCREEN_CAP candidates (forward.c) */
};

/* One decoder block as the forward runs it: weights, widened vectors, and the cache layer it writes. */
typedef struct moeq_block {
    const moeq_layer *layer;
    const moeq_layer_vecs *vecs;
    moeq_kv_cache *cache;
    int cache_layer;
} moeq_block;

#endif
