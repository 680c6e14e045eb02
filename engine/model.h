/*
 * model.h — internal: the loaded weights, shared by the loader (model.c,
 * safetensors.c) and the forward pass (forward.c and friends). Not installed.
 *
 * Tensors point into the mmapped safetensors files; nothing is copied at load.
 * Weight matrices keep their HF layout: [out_features, in_features], row-major.
 */
#ifndef MOEQ_ENGINE_MODEL_H
#define MOEQ_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/engine.h"

typedef enum moeq_dtype {
    MOEQ_DTYPE_F32 = 0,
    MOEQ_DTYPE_BF16,
    MOEQ_DTYPE_F16,
    MOEQ_DTYPE_F8_E4M3,   /* with a block-scale tensor (weight_scale_inv), 128x128 blocks */
} moeq_dtype;

/* Bytes per element (F8: 1). */
size_t moeq_dtype_size(moeq_dtype dtype);
const char *moeq_dtype_name(moeq_dtype dtype);

#define MOEQ_F8_BLOCK 128

typedef struct moeq_tensor {
    const char *name;        /* HF name, e.g. "model.layers.3.mlp.experts.7.up_proj.weight" */
    moeq_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;        /* into the mmapped file                        */
    size_t nbytes;
    /* F8_E4M3 only: float32 [ceil(rows/128), ceil(cols/128)], weight = q * scale_inv */
    const struct moeq_tensor *scale_inv;
} moeq_tensor;

typedef struct moeq_expert {
    const moeq_tensor *gate_proj; /* [moe_inter, hidden] */
    const moeq_tensor *up_proj;   /* [moe_inter, hidden] */
    const moeq_tensor *down_proj; /* [hidden, moe_inter] */
} moeq_expert;

typedef struct moeq_layer {
    int is_moe;
    const moeq_tensor *input_layernorm;          /* [hidden]                                  */
    const moeq_tensor *post_attention_layernorm; /* [hidden]                                  */
    /* MLA */
    const moeq_tensor *q_proj;             /* [heads*(nope+rope), hidden]   when q_lora_rank == 0 */
    const moeq_tensor *q_a_proj;           /* [q_lora_rank, hidden]         when q_lora_rank > 0  */
    const moeq_tensor *q_a_layernorm;      /* [q_lora_rank]                                       */
    const moeq_tensor *q_b_proj;           /* [heads*(nope+rope), q_lora_rank]                    */
    const moeq_tensor *kv_a_proj_with_mqa; /* [kv_lora_rank + rope, hidden]                       */
    const moeq_tensor *kv_a_layernorm;     /* [kv_lora_rank]                                      */
    const moeq_tensor *kv_b_proj;          /* [heads*(nope+v), kv_lora_rank]                      */
    const moeq_tensor *o_proj;             /* [hidden, heads*v]                                   */
    /* dense SwiGLU (is_moe == 0) */
    moeq_expert mlp;
    /* MoE (is_moe == 1) */
    const moeq_tensor *gate;                    /* router weight [n_routed, hidden]  */
    const moeq_tensor *e_score_correction_bias; /* [n_routed] or NULL (V2)           */
    moeq_expert *experts;                       /* [n_routed]                        */
    moeq_expert shared;                         /* [n_shared*moe_inter] fused; NULL tensors when none */
    /* MTP layer only (index >= num_hidden_layers) */
    const moeq_tensor *enorm, *hnorm;      /* [hidden]             */
    const moeq_tensor *eh_proj;            /* [hidden, 2*hidden]   */
    const moeq_tensor *shared_head_norm;   /* [hidden]             */
    const moeq_tensor *shared_head_head;   /* [vocab, hidden] or NULL (use lm_head) */
} moeq_layer;

typedef struct moeq_mapped_file moeq_mapped_file;

struct moeq_model {
    moeq_model_config config;
    char *dir;
    /* storage */
    moeq_mapped_file **files;
    int n_files;
    moeq_tensor *tensors;
    int n_tensors;
    /* weights */
    const moeq_tensor *embed_tokens; /* [vocab, hidden] */
    const moeq_tensor *norm;         /* [hidden]        */
    const moeq_tensor *lm_head;      /* [vocab, hidden] (== embed_tokens when tied) */
    moeq_layer *layers;              /* [num_hidden_layers]       */
    moeq_layer *mtp_layers;          /* [n_mtp] (may be 0)        */
    int n_mtp_layers;
};

/* Lookup by HF name; NULL when absent. */
const moeq_tensor *moeq_model_find_tensor(const moeq_model *model, const char *name);

/*
 * Widen rows [row0, row0+n_rows) of a 2-D weight to float32 into out
 * (n_rows * cols floats), applying F8 block scales. The one dequantisation
 * path every backend and test uses.
 */
void moeq_tensor_rows_to_f32(const moeq_tensor *t, int64_t row0, int64_t n_rows, float *out);

/* ---- loader additions (dtype.c, model.c) ---------------------------------- */

/* Rows and columns of a weight seen as a matrix (1-D: one row of shape[0]). */
static inline int64_t moeq_tensor_rows(const moeq_tensor *t) { return t->ndim >= 2 ? t->shape[0] : 1; }
static inline int64_t moeq_tensor_cols(const moeq_tensor *t) {
    return t->ndim >= 2 ? t->shape[t->ndim - 1] : (t->ndim == 1 ? t->shape[0] : 1);
}

/* Scalar conversions: exact widening; narrowing rounds to nearest even (F8: saturates at +-448). */
static inline float moeq_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
uint16_t moeq_f32_to_bf16(float f);
float moeq_f16_to_f32(uint16_t h);
uint16_t moeq_f32_to_f16(float f);
float moeq_f8_e4m3_to_f32(uint8_t b); /* E4M3FN: bias 7, no inf, 0x7f/0xff NaN */
uint8_t moeq_f32_to_f8_e4m3(float f);

/* Row helpers: widen n contiguous values to float32 (F8: times scale). */
void moeq_bf16_to_f32_row(const uint16_t *in, float *out, size_t n);
void moeq_f16_to_f32_row(const uint16_t *in, float *out, size_t n);
void moeq_f8_e4m3_to_f32_row(const uint8_t *in, float scale, float *out, size_t n);

/*
 * The tensor plan: every tensor a checkpoint of this config holds, in HF
 * naming, with its shape and role. The loader binds by it and gen-model
 * writes by it, so the two cannot drift apart. Scale tensors (F8) are not
 * listed; they follow their weight.
 */
typedef enum moeq_tensor_role {
    MOEQ_ROLE_NORM = 0,  /* RMSNorm weight [n]                       */
    MOEQ_ROLE_LINEAR,    /* projection [out, in] (F8-quantisable)    */
    MOEQ_ROLE_EMBED,     /* token embedding [vocab, hidden]          */
    MOEQ_ROLE_HEAD,      /* output head [vocab, hidden]              */
    MOEQ_ROLE_ROUTER,    /* MoE router weight [n_routed, hidden]     */
    MOEQ_ROLE_BIAS,      /* e_score_correction_bias [n_routed]       */
    MOEQ_ROLE_MTP_PROJ,  /* MTP eh_proj [hidden, 2*hidden] (kept BF16 like DeepSeek) */
} moeq_tensor_role;

typedef struct moeq_tensor_spec {
    char name[128];
    int ndim;
    int64_t shape[2];
    moeq_tensor_role role;
    int optional;               /* may be absent (MTP copy of embed_tokens)          */
    const char *values_of;      /* same values as this tensor (DeepSeek's MTP copies), or NULL */
    const moeq_tensor **slot;   /* where the loader binds it; NULL when planning only */
} moeq_tensor_spec;

typedef moeq_err (*moeq_tensor_spec_fn)(const moeq_tensor_spec *spec, void *ud);

/*
 * Call fn for every planned tensor (main layers, then n_mtp MTP layers).
 * model may be NULL (gen-model); when given, its layers/experts arrays must be
 * allocated and spec->slot points into them. Stops at fn's first error.
 */
moeq_err moeq_model_plan(const moeq_model_config *config, moeq_model *model, int n_mtp, moeq_tensor_spec_fn fn,
                         void *ud);

/* 1 when layer i (main or MTP index) is a MoE layer under the HF rule. */
int moeq_model_layer_is_moe(const moeq_model_config *config, int i);

#endif
