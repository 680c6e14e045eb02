/*
 * moeq/model_config.h — a model's architecture as its config.json states it
 * (Hugging Face DeepSeek-V2/V3 keys), parsed and validated.
 *
 * Its own small library because two kinds of process need it: the engine
 * (which builds the model from it) and processes that never run the model
 * but must agree with it, e.g. the coordinator, which checks prompts
 * against the context (max_position_embeddings). One parser keeps them in
 * agreement: the same defaults when a key is absent (V3 and V2 differ), the
 * same rejections. Depends on moeq_common and cJSON only.
 *
 * What it does not do: weights, tensors (the engine).
 */
#ifndef MOEQ_MODEL_CONFIG_H
#define MOEQ_MODEL_CONFIG_H

#include <stddef.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The architecture as read from config.json (plain data; see docs/ENGINE.md). */
typedef struct moeq_model_config {
    char model_type[32];          /* "deepseek_v3" | "deepseek_v2"                     */
    int vocab_size;
    int hidden_size;
    int intermediate_size;        /* dense SwiGLU layers                               */
    int moe_intermediate_size;    /* each routed/shared expert                         */
    int num_hidden_layers;
    int num_attention_heads;
    int n_shared_experts;         /* 0 = none                                          */
    int n_routed_experts;         /* 0 = dense model                                   */
    int num_experts_per_tok;
    int n_group, topk_group;      /* group-limited routing (1,1 = off)                 */
    int first_k_dense_replace;
    int moe_layer_freq;
    int norm_topk_prob;
    double routed_scaling_factor;
    char scoring_func[16];        /* "sigmoid" (V3) | "softmax" (V2)                   */
    char topk_method[24];         /* "noaux_tc" (V3) | "greedy" | "group_limited_greedy" */
    int q_lora_rank;              /* 0 = no q compression (q_proj)                     */
    int kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    double rms_norm_eps;
    double rope_theta;
    int max_position_embeddings;
    /* rope_scaling (YaRN); rope_scaling_type[0] == 0 when absent */
    char rope_scaling_type[16];   /* "yarn"                                            */
    double rope_factor;
    int rope_original_max_position_embeddings;
    double rope_beta_fast, rope_beta_slow, rope_mscale, rope_mscale_all_dim;
    int num_nextn_predict_layers; /* MTP layers stored after the main layers           */
    int tie_word_embeddings;
    int bos_token_id, eos_token_id;
} moeq_model_config;

/* Parse config.json text into a config; errors name the key. Pure: no I/O. */
moeq_err moeq_model_config_parse(const char *json, size_t len, moeq_model_config *config, char *errstr,
                                 size_t errstr_size);

/*
 * Read dir/config.json only (no weights): what a process that does not run
 * the model (the coordinator) needs to know about it, e.g. its context.
 * Errors as moeq_model_load's (MOEQ_ERR_IO/NOT_FOUND when absent).
 */
moeq_err moeq_model_config_load(const char *dir, moeq_model_config *config, char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif

#endif
