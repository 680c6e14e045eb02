/*
 * model_config.c — config.json (Hugging Face DeepSeek-V2/V3 keys) into a
 * moeq_model_config (moeq/model_config.h). The parser is pure: text in,
 * struct out; the one loader at the end reads dir/config.json.
 *
 * One property table names every key with its type, range and the default
 * that HF's configuration_deepseek.py uses when the key is absent (V3 and V2
 * differ); JSON null means the key's "off" value (q_lora_rank: null → 0,
 * n_routed_experts: null → dense). Cross-key checks follow the table.
 * Keys we do not model (initializer_range, quantization_config, auto_map...)
 * are ignored; keys that would change the math unseen (hidden_act,
 * attention_bias) are checked.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moeq/model_config.h"
#include "moeq/util.h"

typedef enum prop_type { PROP_INT, PROP_DOUBLE, PROP_BOOL } prop_type;

typedef struct prop {
    const char *key;
    prop_type type;
    size_t offset;
    double min, max;
    double def_v3, def_v2; /* when absent                     */
    double null_value;     /* when JSON null (NAN: an error)  */
} prop;

#define OFF(f) offsetof(moeq_model_config, f)
#define BIG 16777216.0 /* 2^24: bounds dims so products stay far from overflow */

static const prop props[] = {
    {"vocab_size", PROP_INT, OFF(vocab_size), 1, BIG, 129280, 102400, NAN},
    {"hidden_size", PROP_INT, OFF(hidden_size), 1, 1 << 20, 7168, 4096, NAN},
    {"intermediate_size", PROP_INT, OFF(intermediate_size), 1, 1 << 22, 18432, 11008, NAN},
    {"moe_intermediate_size", PROP_INT, OFF(moe_intermediate_size), 1, 1 << 22, 2048, 1407, NAN},
    {"num_hidden_layers", PROP_INT, OFF(num_hidden_layers), 1, 4096, 61, 30, NAN},
    {"num_attention_heads", PROP_INT, OFF(num_attention_heads), 1, 4096, 128, 32, NAN},
    {"n_shared_experts", PROP_INT, OFF(n_shared_experts), 0, 1024, 1, 0, 0},
    {"n_routed_experts", PROP_INT, OFF(n_routed_experts), 0, 65536, 256, 0, 0},
    {"num_experts_per_tok", PROP_INT, OFF(num_experts_per_tok), 0, 65536, 8, 0, 0},
    {"n_group", PROP_INT, OFF(n_group), 1, 65536, 8, 1, 1},
    {"topk_group", PROP_INT, OFF(topk_group), 1, 65536, 4, 1, 1},
    {"first_k_dense_replace", PROP_INT, OFF(first_k_dense_replace), 0, 4096, 3, 0, NAN},
    {"moe_layer_freq", PROP_INT, OFF(moe_layer_freq), 1, 4096, 1, 1, NAN},
    {"norm_topk_prob", PROP_BOOL, OFF(norm_topk_prob), 0, 1, 1, 0, NAN},
    {"routed_scaling_factor", PROP_DOUBLE, OFF(routed_scaling_factor), 1e-6, 1e6, 2.5, 1.0, NAN},
    {"q_lora_rank", PROP_INT, OFF(q_lora_rank), 0, 1 << 20, 1536, 1536, 0},
    {"kv_lora_rank", PROP_INT, OFF(kv_lora_rank), 1, 1 << 20, 512, 512, NAN},
    {"qk_nope_head_dim", PROP_INT, OFF(qk_nope_head_dim), 0, 1 << 16, 128, 128, NAN},
    {"qk_rope_head_dim", PROP_INT, OFF(qk_rope_head_dim), 2, 1 << 16, 64, 64, NAN},
    {"v_head_dim", PROP_INT, OFF(v_head_dim), 1, 1 << 16, 128, 128, NAN},
    {"rms_norm_eps", PROP_DOUBLE, OFF(rms_norm_eps), 1e-30, 1, 1e-6, 1e-6, NAN},
    {"rope_theta", PROP_DOUBLE, OFF(rope_theta), 1e-6, 1e12, 10000.0, 10000.0, NAN},
    {"max_position_embeddings", PROP_INT, OFF(max_position_embeddings), 1, 1 << 30, 4096, 2048, NAN},
    {"num_nextn_predict_layers", PROP_INT, OFF(num_nextn_predict_layers), 0, 64, 1, 0, 0},
    {"tie_word_embeddings", PROP_BOOL, OFF(tie_word_embeddings), 0, 1, 0, 0, NAN},
    {"bos_token_id", PROP_INT, OFF(bos_token_id), -1, BIG, 0, 100000, -1},
    {"eos_token_id", PROP_INT, OFF(eos_token_id), -1, BIG, 1, 100001, -1},
};

/* yarn's keys inside rope_scaling; HF's yarn defaults when absent. */
static const prop yarn_props[] = {
    {"factor", PROP_DOUBLE, OFF(rope_factor), 1.0, 1e6, 1.0, 1.0, NAN},
    {"original_max_position_embeddings", PROP_INT, OFF(rope_original_max_position_embeddings), 1, 1 << 30, 4096,
     4096, NAN},
    {"beta_fast", PROP_DOUBLE, OFF(rope_beta_fast), 1e-6, 1e6, 32, 32, NAN},
    {"beta_slow", PROP_DOUBLE, OFF(rope_beta_slow), 1e-6, 1e6, 1, 1, NAN},
    {"mscale", PROP_DOUBLE, OFF(rope_mscale), 0, 1e6, 1, 1, NAN},
    {"mscale_all_dim", PROP_DOUBLE, OFF(rope_mscale_all_dim), 0, 1e6, 0, 0, NAN},
};

static void prop_store(const prop *p, moeq_model_config *config, double v) {
    char *field = (char *)config + p->offset;
    if (p->type == PROP_DOUBLE)
        *(double *)(void *)field = v;
    else
        *(int *)(void *)field = (int)v;
}

/* Read one key from obj (absent → default, null → null_value) with type and range checks. */
static moeq_err prop_read(const prop *p, const cJSON *obj, const char *where, int v2, moeq_model_config *config,
                          char *errstr, size_t errstr_size) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, p->key);
    double v;
    if (!item) {
        v = v2 ? p->def_v2 : p->def_v3;
    } else if (cJSON_IsNull(item)) {
        if (isnan(p->null_value))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "config.json: %s%s may not be null", where, p->key);
        v = p->null_value;
    } else if (p->type == PROP_BOOL) {
        if (!cJSON_IsBool(item))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "config.json: %s%s must be true or false", where,
                             p->key);
        v = cJSON_IsTrue(item);
    } else {
        if (!cJSON_IsNumber(item))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "config.json: %s%s must be a number", where,
                             p->key);
        v = item->valuedouble;
        if (p->type == PROP_INT && v != floor(v))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "config.json: %s%s must be an integer (got %g)",
                             where, p->key, v);
    }
    if (!(v >= p->min && v <= p->max))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "config.json: %s%s = %g is outside [%g, %g]", where,
                         p->key, v, p->min, p->max);
    prop_store(p, config, v);
    return MOEQ_OK;
}

/* Copy a string key into dst (absent → def); alias maps a historical spelling. */
static moeq_err read_string(const cJSON *obj, const char *key, const char *def, char *dst, size_t dst_size,
                            char *errstr, size_t errstr_size) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    const char *v = def;
    if (item && !cJSON_IsNull(item)) {
        if (!cJSON_IsString(item))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "config.json: %s must be a string", key);
        v = item->valuestring;
    }
    if (strlen(v) >= dst_size)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "config.json: %s = \"%s\" is not supported", key,
                         v);
    snprintf(dst, dst_size, "%s", v);
    return MOEQ_OK;
}

static int one_of(const char *v, const char *const *allowed) {
    for (; *allowed; allowed++)
        if (!strcmp(v, *allowed)) return 1;
    return 0;
}

static moeq_err read_strings(const cJSON *root, int v2, moeq_model_config *c, char *errstr, size_t errstr_size) {
    static const char *const scorings[] = {"sigmoid", "softmax", NULL};
    static const char *const methods[] = {"noaux_tc", "greedy", "group_limited_greedy", NULL};
    moeq_err err = read_string(root, "scoring_func", v2 ? "softmax" : "sigmoid", c->scoring_func,
                               sizeof c->scoring_func, errstr, errstr_size);
    if (err) return err;
    if (!one_of(c->scoring_func, scorings))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "config.json: scoring_func = \"%s\" (supported: sigmoid, softmax)", c->scoring_func);
    err = read_string(root, "topk_method", v2 ? "greedy" : "noaux_tc", c->topk_method, sizeof c->topk_method, errstr,
                      errstr_size);
    if (err) return err;
    if (!strcmp(c->topk_method, "gready")) /* HF's V2 default, misspelt */
        snprintf(c->topk_method, sizeof c->topk_method, "greedy");
    if (!one_of(c->topk_method, methods))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "config.json: topk_method = \"%s\" (supported: noaux_tc, greedy, group_limited_greedy)",
                         c->topk_method);
    char act[32];
    err = read_string(root, "hidden_act", "silu", act, sizeof act, errstr, errstr_size);
    if (err) return err;
    if (strcmp(act, "silu") != 0)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "config.json: hidden_act = \"%s\" (supported: silu)", act);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "attention_bias")))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "config.json: attention_bias = true is not supported");
    return MOEQ_OK;
}

/* rope_scaling: null/absent, or {"type"|"rope_type": "yarn", ...}. */
static moeq_err read_rope_scaling(const cJSON *root, moeq_model_config *c, char *errstr, size_t errstr_size) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    c->rope_scaling_type[0] = 0;
    c->rope_factor = 1.0;
    if (!rs || cJSON_IsNull(rs)) return MOEQ_OK;
    if (!cJSON_IsObject(rs))
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "config.json: rope_scaling must be an object or null");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "yarn") != 0)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "config.json: rope_scaling.type = %s%s%s (supported: yarn)",
                         cJSON_IsString(type) ? "\"" : "", cJSON_IsString(type) ? type->valuestring : "(missing)",
                         cJSON_IsString(type) ? "\"" : "");
    snprintf(c->rope_scaling_type, sizeof c->rope_scaling_type, "yarn");
    for (size_t i = 0; i < sizeof yarn_props / sizeof yarn_props[0]; i++) {
        moeq_err err = prop_read(&yarn_props[i], rs, "rope_scaling.", 0, c, errstr, errstr_size);
        if (err) return err;
    }
    return MOEQ_OK;
}

static moeq_err check_moe(const moeq_model_config *c, char *errstr, size_t errstr_size) {
    if (c->n_routed_experts == 0) return MOEQ_OK;
    if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->n_routed_experts)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "config.json: num_experts_per_tok = %d must be in [1, n_routed_experts = %d]",
                         c->num_experts_per_tok, c->n_routed_experts);
    if (c->topk_group > c->n_group)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "config.json: topk_group = %d exceeds n_group = %d",
                         c->topk_group, c->n_group);
    if (c->n_routed_experts % c->n_group != 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "config.json: n_routed_experts = %d is not divisible by n_group = %d", c->n_routed_experts,
                         c->n_group);
    if (c->num_experts_per_tok > c->topk_group * (c->n_routed_experts / c->n_group))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "config.json: num_experts_per_tok = %d exceeds the %d experts of topk_group groups",
                         c->num_experts_per_tok, c->topk_group * (c->n_routed_experts / c->n_group));
    if (!strcmp(c->topk_method, "noaux_tc") && c->n_routed_experts / c->n_group < 2)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "config.json: topk_method noaux_tc scores groups by their top 2 experts; n_routed_experts / "
                         "n_group = %d",
                         c->n_routed_experts / c->n_group);
    return MOEQ_OK;
}

static moeq_err check_config(const moeq_model_config *c, char *errstr, size_t errstr_size) {
    if (c->qk_rope_head_dim % 2 != 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "config.json: qk_rope_head_dim = %d must be even",
                         c->qk_rope_head_dim);
    if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "config.json: %s = %d is not below vocab_size = %d",
                         c->bos_token_id >= c->vocab_size ? "bos_token_id" : "eos_token_id",
                         c->bos_token_id >= c->vocab_size ? c->bos_token_id : c->eos_token_id, c->vocab_size);
    return check_moe(c, errstr, errstr_size);
}

static moeq_err read_model_type(const cJSON *root, moeq_model_config *c, int *v2, char *errstr, size_t errstr_size) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt))
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "config.json: model_type is missing or not a string");
    if (strcmp(mt->valuestring, "deepseek_v3") != 0 && strcmp(mt->valuestring, "deepseek_v2") != 0)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "config.json: model_type \"%.64s\" is not supported (deepseek_v3, deepseek_v2)",
                         mt->valuestring);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt->valuestring);
    *v2 = !strcmp(mt->valuestring, "deepseek_v2");
    return MOEQ_OK;
}

moeq_err moeq_model_config_parse(const char *json, size_t len, moeq_model_config *config, char *errstr,
                                 size_t errstr_size) {
    memset(config, 0, sizeof *config);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "config.json: not a JSON object");
    }
    int v2 = 0;
    moeq_err err = read_model_type(root, config, &v2, errstr, errstr_size);
    for (size_t i = 0; !err && i < sizeof props / sizeof props[0]; i++)
        err = prop_read(&props[i], root, "", v2, config, errstr, errstr_size);
    if (!err) err = read_strings(root, v2, config, errstr, errstr_size);
    if (!err) err = read_rope_scaling(root, config, errstr, errstr_size);
    if (!err) err = check_config(config, errstr, errstr_size);
    cJSON_Delete(root);
    return err;
}

/* ---- the file -------------------------------------------------------------- */

static moeq_err read_config(const char *dir, moeq_model_config *config, char *errstr, size_t errstr_size) {
    size_t n = strlen(dir) + 16;
    char *path = malloc(n), *text = NULL;
    size_t len = 0;
    if (!path) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    snprintf(path, n, "%s/config.json", dir);
    struct stat st;
    moeq_err err;
    if (stat(path, &st) != 0)
        err = moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size, "%s: no such file", path);
    else
        err = moeq_read_file(path, (size_t)16 << 20, &text, &len, errstr, errstr_size);
    if (!err) {
        char msg[256];
        err = moeq_model_config_parse(text, len, config, msg, sizeof msg);
        if (err) moeq_errf(err, errstr, errstr_size, "%s/%s", dir, msg);
    }
    free(text);
    free(path);
    return err;
}

moeq_err moeq_model_config_load(const char *dir, moeq_model_config *config, char *errstr, size_t errstr_size) {
    if (!dir || !config) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "dir and config are required");
    return read_config(dir, config, errstr, errstr_size);
}
