/*
 * rope.c — RoPE/YaRN (see rope.h). The frequency blend follows HF's
 * yarn_find_correction_range + yarn_linear_ramp_mask; everything is double
 * until the final float cast.
 */
#include "rope.h"

#include <math.h>
#include <string.h>

double moeq_rope_yarn_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static double correction_dim(double n_rot, int dim, double base, double max_pos) {
    return ((double)dim * log(max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

moeq_err moeq_rope_init(moeq_rope *rope, const moeq_model_config *config, char *errstr, size_t errstr_size) {
    memset(rope, 0, sizeof(*rope));
    int dim = config->qk_rope_head_dim;
    if (dim <= 0 || dim % 2 || dim > MOEQ_ROPE_MAX_DIM)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "qk_rope_head_dim %d: must be even, 2..%d", dim,
                         MOEQ_ROPE_MAX_DIM);
    rope->dim = dim;
    double base = config->rope_theta > 0 ? config->rope_theta : 10000.0;
    rope->mscale = 1.0;
    rope->softmax_scale = 1.0 / sqrt((double)(config->qk_nope_head_dim + dim));
    rope->yarn = config->rope_scaling_type[0] != 0;
    double factor = config->rope_factor;
    double low = 0, high = 0;
    if (rope->yarn) {
        low = floor(correction_dim(config->rope_beta_fast, dim, base, config->rope_original_max_position_embeddings));
        high = ceil(correction_dim(config->rope_beta_slow, dim, base, config->rope_original_max_position_embeddings));
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        rope->mscale = moeq_rope_yarn_mscale(factor, config->rope_mscale) /
                       moeq_rope_yarn_mscale(factor, config->rope_mscale_all_dim);
        double m = moeq_rope_yarn_mscale(factor, config->rope_mscale_all_dim);
        rope->softmax_scale *= m * m;
    }
    for (int i = 0; i < dim / 2; i++) {
        double extra = 1.0 / pow(base, (double)(2 * i) / dim);
        if (!rope->yarn) {
            rope->inv_freq[i] = extra;
            continue;
        }
        double inter = extra / factor;
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
        double mask = 1.0 - ramp; /* 1: keep the original (extrapolated) frequency */
        rope->inv_freq[i] = inter * (1.0 - mask) + extra * mask;
    }
    return MOEQ_OK;
}

void moeq_rope_cos_sin(const moeq_rope *rope, int64_t pos, float *cos_out, float *sin_out) {
    for (int i = 0; i < rope->dim / 2; i++) {
        double f = (double)pos * rope->inv_freq[i];
        cos_out[i] = (float)(cos(f) * rope->mscale);
        sin_out[i] = (float)(sin(f) * rope->mscale);
    }
}

void moeq_rope_apply(const moeq_rope *rope, const float *x, const float *cos_v, const float *sin_v, float *out) {
    int half = rope->dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[2 * i], b = x[2 * i + 1];
        out[i] = a * cos_v[i] - b * sin_v[i];
        out[i + half] = b * cos_v[i] + a * sin_v[i];
    }
}
