/*
 * model.h — internal: the loaded weights, shared by the loader (model.c,
 * safetensors.c) and the forward pass (forward.c and friends). Not installed.
 *
 * Tensors (tensor.h) point into the mmapped safetensors files; nothing is
 * copied at load. Weight matrices keep their HF layout: [out_features,
 * in_features], row-major.
 */
#ifndef MOEQ_ENGINE_MODEL_H
#define MOEQ_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/engine.h"
#include "tensor.h"

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
