/*
 * moeq/genmodel.h — the checkpoint writer (tools/, library moeq_genmodel; a
 * checkpoint writer is not the engine, which only reads them): write
 * deterministic synthetic checkpoints in exactly the Hugging Face DeepSeek layout (config.json with HF keys, safetensors with
 * HF tensor names, sharded with model.safetensors.index.json), for tests,
 * the float64 reference and benchmarks. Backs `moeq gen-model`.
 *
 * Determinism: every tensor's values come from its own splitmix64 stream
 * seeded by (seed, tensor name), so the same seed gives the same bytes, and
 * the same preset written as F32, BF16, F16 or F8 holds the same underlying
 * values (the dequantisation tests compare them).
 */
#ifndef MOEQ_GENMODEL_H
#define MOEQ_GENMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/model_config.h"

/* What the weights are stored as. F8 is DeepSeek's mix: linear projections
 * F8_E4M3 + 128x128 weight_scale_inv, everything else BF16 (bias F32). */
typedef enum moeq_genmodel_dtype {
    MOEQ_GENMODEL_BF16 = 0,
    MOEQ_GENMODEL_F32,
    MOEQ_GENMODEL_F16,
    MOEQ_GENMODEL_F8,
} moeq_genmodel_dtype;

typedef struct moeq_genmodel_params {
    uint64_t seed;              /* default 1                                                    */
    moeq_genmodel_dtype dtype;  /* default BF16                                                 */
    size_t shard_bytes;         /* split when larger (default 1 GiB; 0 = default)               */
    int n_shards;               /* 0 = auto: ceil(bytes / shard_bytes), at least the preset's minimum;
                                   1 = a single model.safetensors                               */
    int min_shards;             /* auto mode's minimum (tiny: 2, so tests exercise sharding)    */
    int write_tokenizer;        /* also write tokenizer.json + tokenizer_config.json (default 1) */
    int mtp_agree;              /* MTP layer agrees with the main model by construction (presets
                                   tiny-mtp, bench-mtp; docs/MTP.md) (default 0)                */
    double mtp_agree_damp;      /* with mtp_agree: scale of the other main layers' output
                                   projections (default 0.02; larger = lower acceptance)         */
} moeq_genmodel_params;

/* 1 for presets written with mtp_agree (tiny-mtp, bench-mtp). */
int moeq_genmodel_preset_mtp_agree(const char *name);

moeq_genmodel_params moeq_genmodel_default_params(void);

/* Parse "f32" | "bf16" | "f16" | "f8". 0 on success, -1 when unknown. */
int moeq_genmodel_dtype_parse(const char *name, moeq_genmodel_dtype *dtype);

/*
 * The config of a named preset: tiny, tiny-v2, small, bench (docs/MODEL_FORMAT.md), tiny-mtp,
 * bench-mtp (docs/MTP.md).
 * *min_shards (may be NULL) receives the preset's minimum shard count.
 * NOT_FOUND for an unknown name.
 */
moeq_err moeq_genmodel_preset(const char *name, moeq_model_config *config, int *min_shards, char *errstr,
                              size_t errstr_size);

/* What a write produced. */
typedef struct moeq_genmodel_stats {
    size_t n_params;   /* weights, F8 scales excluded, MTP included */
    size_t n_bytes;    /* tensor bytes over all shards              */
    int n_tensors;     /* including scales                          */
    int n_shards;
    int tokenizer_written;     /* tokenizer.json + tokenizer_config.json written         */
    char tokenizer_note[256];  /* why not, when not                                      */
} moeq_genmodel_stats;

/*
 * Write config.json, the safetensors file(s) and (n_shards > 1) the index
 * into out_dir (created when missing; existing files are overwritten).
 * stats may be NULL. Errors: IO naming the path, INVALID_ARG for a config
 * moeq_model_config_parse would reject.
 */
moeq_err moeq_genmodel_write(const char *out_dir, const moeq_model_config *config,
                             const moeq_genmodel_params *params, moeq_genmodel_stats *stats, char *errstr,
                             size_t errstr_size);

/* config.json text (HF keys) for config; malloc'd, caller frees; NULL on OOM. */
char *moeq_genmodel_config_json(const moeq_model_config *config, moeq_genmodel_dtype dtype);

/*
 * The float32 values gen-model stores for rows [row0, row0+n_rows) of the
 * planned tensor `name` (before any narrowing): lets tests compare a loaded
 * tensor with its source. NOT_FOUND when the config plans no such tensor.
 */
moeq_err moeq_genmodel_values(const moeq_model_config *config, uint64_t seed, const char *name, int64_t row0,
                              int64_t n_rows, float *out);

#endif
