/*
 * attention.c — MLA attention (see attention.h). Dot products go through
 * moeq_dot_f32 (fixed lanes and tree); the output accumulates j ascending.
 * The naive form widens kv_b_proj with moeq_tensor_rows_to_f32 and is slow on
 * purpose: it exists to check the absorbed form.
 */
#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_matmul.h"

void moeq_attention_absorbed_block(const moeq_attn_args *a, int64_t t, int h0, int h1, float *scores) {
    int64_t n_ctx = a->pos[t] + 1;
    int seq = a->seq[t], L = a->kv_lora, R = a->rope, H = a->n_heads;
    const float *ql = a->q_lat + t * H * L, *qp = a->q_pe + t * H * R;
    for (int64_t j = 0; j < n_ctx; j++) {
        const float *e = moeq_kv_cache_entry(a->cache, seq, a->layer, j);
        for (int h = h0; h < h1; h++) {
            float s = moeq_dot_f32(ql + (int64_t)h * L, e, L) + moeq_dot_f32(qp + (int64_t)h * R, e + L, R);
            scores[(h - h0) * n_ctx + j] = s * a->scale;
        }
    }
    for (int h = h0; h < h1; h++) {
        moeq_ops_softmax(scores + (h - h0) * n_ctx, n_ctx);
        memset(a->out_lat + (t * H + h) * L, 0, (size_t)L * sizeof(float));
    }
    for (int64_t j = 0; j < n_ctx; j++) {
        const float *c = moeq_kv_cache_entry(a->cache, seq, a->layer, j);
        for (int h = h0; h < h1; h++) {
            float p = scores[(h - h0) * n_ctx + j], *o = a->out_lat + (t * H + h) * L;
            for (int d = 0; d < L; d++) o[d] = fmaf(p, c[d], o[d]);
        }
    }
}

void moeq_attention_naive_token(const moeq_kv_cache *cache, int layer, int seq, int64_t pos, const moeq_tensor *kv_b,
                                int n_heads, int nope, int v_dim, int kv_lora, int rope, float scale,
                                const float *q_nope, const float *q_pe, float *out_v, float *scratch) {
    int64_t n_ctx = pos + 1, kvw = (int64_t)n_heads * (nope + v_dim);
    float *kv = scratch;                 /* (n_ctx, H*(nope+v)) expanded k_nope | v */
    float *s = scratch + n_ctx * kvw;    /* (n_ctx)                                  */
    float *w = malloc((size_t)kvw * kv_lora * sizeof(float));
    if (!w) return;
    moeq_tensor_rows_to_f32(kv_b, 0, kvw, w);
    for (int64_t j = 0; j < n_ctx; j++) {
        const float *c = moeq_kv_cache_entry(cache, seq, layer, j);
        for (int64_t r = 0; r < kvw; r++) {
            double acc = 0;
            for (int d = 0; d < kv_lora; d++) acc += (double)w[r * kv_lora + d] * c[d];
            kv[j * kvw + r] = (float)acc;
        }
    }
    for (int h = 0; h < n_heads; h++) {
        for (int64_t j = 0; j < n_ctx; j++) {
            const float *k = kv + j * kvw + (int64_t)h * (nope + v_dim);
            const float *kpe = moeq_kv_cache_entry(cache, seq, layer, j) + kv_lora;
            double acc = 0;
            for (int d = 0; d < nope; d++) acc += (double)q_nope[h * nope + d] * k[d];
            for (int d = 0; d < rope; d++) acc += (double)q_pe[h * rope + d] * kpe[d];
            s[j] = (float)(acc * scale);
        }
        moeq_ops_softmax(s, n_ctx);
        for (int d = 0; d < v_dim; d++) {
            double acc = 0;
            for (int64_t j = 0; j < n_ctx; j++) acc += (double)s[j] * kv[j * kvw + (int64_t)h * (nope + v_dim) + nope + d];
            out_v[h * v_dim + d] = (float)acc;
        }
    }
    free(w);
}
