/*
 * attention.h — internal: MLA attention over the paged cache.
 *
 * Absorbed form (what the engine runs): per query token t at position p, head h
 *   score_j  = (q_lat[t,h] . c_j + q_pe[t,h] . k_pe_j) * softmax_scale,  j = 0..p
 *   out_lat[t,h] = sum_j softmax(score)_j c_j
 * where q_lat = W_UK[h]^T q_nope (done by the caller with an NN matmul) and the
 * caller maps out_lat through W_UV[h] and o_proj. Each (t, h) is computed the
 * same way whether t came in a prefill chunk or alone as a decode token: that
 * is what makes prefill and decode bit-identical.
 *
 * Naive form (tests only): K and V expanded from the cached latents through
 * kv_b_proj, standard attention, output in v space.
 */
#ifndef MOEQ_ENGINE_ATTENTION_H
#define MOEQ_ENGINE_ATTENTION_H

#include <stdint.h>

#include "backend.h"
#include "kv_cache.h"
#include "model.h"
#include "ops_matmul.h"

/* The form tests build by hand: the cache object and a layer (the kernels take moeq_mla_params, plain data). */
typedef struct moeq_attn_args {
    const moeq_kv_cache *cache;
    int layer;
    int64_t n_tok;
    const int32_t *seq;      /* (T) sequence of each query token        */
    const int64_t *pos;      /* (T) its position; attends to 0..pos     */
    int n_heads, kv_lora, rope;
    const float *q_lat;      /* (T, H, kv_lora)                          */
    const float *q_pe;       /* (T, H, rope), roped                      */
    float *out_lat;          /* (T, H, kv_lora)                          */
    float scale;
} moeq_attn_args;

/* Heads computed together in one task (they share the cached rows). */
#define MOEQ_ATTN_HEAD_BLOCK 8

/* Query token t, heads [h0, h1); scores: (h1-h0) * (pos+1) floats of scratch. The kernel the backend runs. */
void moeq_mla_block(const moeq_mla_params *params, int64_t t, int h0, int h1, float *scores);
void moeq_mla_block_isa(moeq_mm_isa isa, const moeq_mla_params *params, int64_t t, int h0, int h1, float *scores);

/*
 * nt (<= MOEQ_ATTN_GROUP) consecutive query tokens t0.. of one sequence at consecutive positions, heads
 * [h0, h1), computed together (each cache row read once for all of them: prefill); the bits of nt
 * moeq_mla_block calls. scores: nt * (h1-h0) * (pos[t0+nt-1]+1) floats of scratch.
 */
#define MOEQ_ATTN_GROUP 4
void moeq_mla_group(const moeq_mla_params *params, int64_t t0, int nt, int h0, int h1, float *scores);
void moeq_mla_group_isa(moeq_mm_isa isa, const moeq_mla_params *params, int64_t t0, int nt, int h0, int h1,
                        float *scores);

/* The softmax of the absorbed form in place (every instruction set gives the same bits); n >= 1. */
void moeq_mla_softmax(float *x, int64_t n);

/* The same on the cache object's layer (tests). */
void moeq_attention_absorbed_block(const moeq_attn_args *args, int64_t t, int h0, int h1, float *scores);
/* The same on a given instruction set (which must be supported); every one gives the same bits. For tests. */
void moeq_attention_absorbed_block_isa(moeq_mm_isa isa, const moeq_attn_args *args, int64_t t, int h0, int h1,
                                       float *scores);
/* The softmax's exp (x <= 0; about 1 ulp; 0 below -87). For tests. */
float moeq_attention_exp(float x);

/*
 * Naive form for one query token: q_nope (H, nope) and q_pe (H, rope) → out_v
 * (H, v). kv_b is the layer's kv_b_proj; scratch holds
 * (pos+1) * (H*(nope+v) + 1) floats.
 */
void moeq_attention_naive_token(const moeq_kv_paged *kv, int seq, int64_t pos, const moeq_tensor *kv_b,
                                int n_heads, int nope, int v_dim, int kv_lora, int rope, float scale,
                                const float *q_nope, const float *q_pe, float *out_v, float *scratch);

#endif
