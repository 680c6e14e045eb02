/*
 * rope.h — internal: rotary position embedding of the rope part of q and k,
 * with YaRN scaling (DeepseekV3YarnRotaryEmbedding semantics).
 *
 * Pairs: HF de-interleaves x (view(d/2, 2).transpose) before rotate_half, so
 * input pairs are (x[2i], x[2i+1]) and the output is laid out
 *   out[i]       = x[2i]   cos_i - x[2i+1] sin_i
 *   out[i + d/2] = x[2i+1] cos_i + x[2i]   sin_i
 * with cos_i = cos(pos * inv_freq_i) * mscale. q and k get the same layout, so
 * dot products match HF exactly in value.
 *
 * cos/sin are computed per position in double (no position table), so a
 * token's rotation depends only on its position.
 */
#ifndef MOEQ_ENGINE_ROPE_H
#define MOEQ_ENGINE_ROPE_H

#include "moeq/engine.h"

#define MOEQ_ROPE_MAX_DIM 512

typedef struct moeq_rope {
    int dim;                               /* qk_rope_head_dim              */
    double inv_freq[MOEQ_ROPE_MAX_DIM / 2];
    double mscale;                         /* multiplies cos and sin        */
    double softmax_scale;                  /* (nope+rope)^-0.5 * mscale_all_dim^2 */
    int yarn;
} moeq_rope;

/* From the config: plain RoPE, or YaRN whenever rope_scaling is present. */
moeq_err moeq_rope_init(moeq_rope *rope, const moeq_model_config *config, char *errstr, size_t errstr_size);

/* yarn_get_mscale(scale, mscale): 1 when scale <= 1, else 0.1 * mscale * ln(scale) + 1. */
double moeq_rope_yarn_mscale(double scale, double mscale);

/* cos_out/sin_out: dim/2 floats for position pos. */
void moeq_rope_cos_sin(const moeq_rope *rope, int64_t pos, float *cos_out, float *sin_out);

/* Rotate x (dim floats, interleaved pairs) into out (dim floats, halves layout). out != x. */
void moeq_rope_apply(const moeq_rope *rope, const float *x, const float *cos_v, const float *sin_v, float *out);

#endif
