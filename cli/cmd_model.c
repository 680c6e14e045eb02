/*
 * cmd_model.c — `moeq gen-model` (write a synthetic checkpoint) and
 * `moeq model-info` (load one and report). Thin shells over tools/genmodel.c
 * and moeq_model_load; all decisions live there.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/model.h"
#include "args.h"
#include "moeq/engine.h"
#include "moeq/genmodel.h"
#include "moeq/util.h"

static void gen_model_usage(FILE *out) {
    fprintf(out,
            "usage: moeq gen-model --preset tiny|tiny-v2|small|bench|tiny-mtp|bench-mtp|bench-wide --out DIR\n"
            "                      [options]\n"
            "\n"
            "Writes config.json, safetensors (HF tensor names) and, when sharded,\n"
            "model.safetensors.index.json. Same seed, same bytes.\n"
            "\n"
            "  --seed N        value seed (default 1)\n"
            "  --dtype D       f32 | bf16 | f16 | f8 (default bf16; f8 = DeepSeek's FP8 layout:\n"
            "                  projections F8_E4M3 + 128x128 weight_scale_inv, the rest BF16)\n"
            "  --shard-mb N    split into shards of about N MiB (default 1024)\n"
            "  --shards N      exactly N shards; 1 = a single model.safetensors (default: auto,\n"
            "                  at least 2 for tiny, tiny-v2 and small)\n"
            "  --no-tokenizer  do not write tokenizer.json / tokenizer_config.json\n"
            "  --mtp-damp X    tiny-mtp, bench-mtp: scale of the damped main blocks' outputs (default\n"
            "                  0.02; larger = MTP drafts accepted less often; docs/MTP.md)\n"
            "  --max-position-embeddings N  the context written to config.json (default: the preset's;\n"
            "                  tiny: 256); the engine refuses sequences longer than it\n");
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    if (!s || !*s || *s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end) return -1;
    *out = v;
    return 0;
}

/* Returns 0 on success, 2 on a usage error (message printed). */
static int gen_model_args(int argc, char **argv, const char **preset, const char **out_dir,
                          moeq_genmodel_params *params, int *context) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = 0;
        if (!strcmp(a, "--no-tokenizer")) {
            params->write_tokenizer = 0;
            continue;
        }
        if (!v) {
            fprintf(stderr, "moeq gen-model: %s needs a value (or is unknown)\n\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--preset")) {
            *preset = v;
        } else if (!strcmp(a, "--out")) {
            *out_dir = v;
        } else if (!strcmp(a, "--seed") && !parse_u64(v, &n)) {
            params->seed = n;
        } else if (!strcmp(a, "--dtype") && !moeq_genmodel_dtype_parse(v, &params->dtype)) {
        } else if (!strcmp(a, "--shard-mb") && !parse_u64(v, &n) && n >= 1 && n <= (1u << 20)) {
            params->shard_bytes = (size_t)n << 20;
        } else if (!strcmp(a, "--mtp-damp") && strtod(v, NULL) >= 0) {
            params->mtp_agree_damp = strtod(v, NULL);
        } else if (!strcmp(a, "--shards") && !parse_u64(v, &n) && n >= 1 && n <= 9999) {
            params->n_shards = (int)n;
        } else if (!strcmp(a, "--max-position-embeddings") && !parse_u64(v, &n) && n >= 1 && n <= (1u << 30)) {
            *context = (int)n;
        } else {
            fprintf(stderr, "moeq gen-model: bad option %s %s\n\n", a, v);
            return 2;
        }
    }
    if (!*preset || !*out_dir) {
        fprintf(stderr, "moeq gen-model: --preset and --out are required\n\n");
        return 2;
    }
    return 0;
}

int moeq_cmd_gen_model(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            gen_model_usage(stdout);
            return 0;
        }
    const char *preset = NULL, *out_dir = NULL;
    moeq_genmodel_params params = moeq_genmodel_default_params();
    int context = 0;
    if (gen_model_args(argc, argv, &preset, &out_dir, &params, &context) != 0) {
        gen_model_usage(stderr);
        return 2;
    }
    char errstr[512];
    moeq_model_config config;
    moeq_err err = moeq_genmodel_preset(preset, &config, &params.min_shards, errstr, sizeof errstr);
    params.mtp_agree = moeq_genmodel_preset_mtp_agree(preset);
    if (context > 0) config.max_position_embeddings = context;
    moeq_genmodel_stats stats;
    int64_t t0 = moeq_mono_ns();
    if (!err) err = moeq_genmodel_write(out_dir, &config, &params, &stats, errstr, sizeof errstr);
    if (err) {
        fprintf(stderr, "moeq gen-model: %s (%s)\n", errstr, moeq_err_str(err));
        return 1;
    }
    if (!stats.tokenizer_written && params.write_tokenizer)
        fprintf(stderr, "moeq gen-model: warning: no tokenizer files: %s\n", stats.tokenizer_note);
    printf("{\"out\": \"%s\", \"preset\": \"%s\", \"params\": %zu, \"bytes\": %zu, \"tensors\": %d, \"shards\": %d, "
           "\"tokenizer\": %s, \"seconds\": %.3f}\n",
           out_dir, preset, stats.n_params, stats.n_bytes, stats.n_tensors, stats.n_shards,
           stats.tokenizer_written ? "true" : "false", (double)(moeq_mono_ns() - t0) / 1e9);
    return 0;
}

static void print_info(const char *dir, const moeq_model *model, double load_ms) {
    const moeq_model_config *c = moeq_model_get_config(model);
    printf("{\"model\": \"%s\", \"model_type\": \"%s\", \"load_ms\": %.3f, \"total_params\": %zu, "
           "\"active_bytes_per_token\": %zu, \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d, "
           "\"n_routed_experts\": %d, \"num_experts_per_tok\": %d, \"num_nextn_predict_layers\": %d, "
           "\"cpu_kernels\": \"%s\"}\n",
           dir, c->model_type, load_ms, moeq_model_total_params(model), moeq_model_active_bytes_per_token(model),
           c->vocab_size, c->hidden_size, c->num_hidden_layers, c->n_routed_experts, c->num_experts_per_tok,
           c->num_nextn_predict_layers, moeq_engine_cpu_kernels());
}

/*
 * What fits on a device of mem_gib GiB: the weights as the CUDA backend holds them (every tensor in its
 * stored dtype, F8 with its scales), the step arena of an engine with these params (measured on a CPU
 * engine: the same layout), a reserve for the CUDA context and cuBLAS workspaces, and the latent cache
 * with what is left: tokens in all, and sequences of a few lengths (whole cache blocks each).
 */
static int print_device_fit(const moeq_model *model, const moeq_engine_params *ep, double mem_gib, double reserve_gib) {
    const moeq_model_config *c = moeq_model_get_config(model);
    moeq_engine_params p = *ep;
    p.kv_cache_tokens = p.kv_block_tokens * 4; /* the arena does not depend on the pool's size */
    p.n_threads = 1;
    char errstr[512] = "";
    moeq_engine *e = NULL;
    moeq_err err = moeq_engine_new(model, &p, &e, errstr, sizeof errstr);
    if (err) {
        fprintf(stderr, "moeq model-info: --device-memory-gib: %s (%s)\n", errstr, moeq_err_str(err));
        return 1;
    }
    size_t weights = 0;
    for (int i = 0; i < model->n_tensors; i++) weights += model->tensors[i].nbytes;
    size_t per_token = moeq_engine_kv_bytes_per_token(e), arena = moeq_engine_step_arena_bytes(e);
    size_t mtp_per_token = model->n_mtp_layers > 0 ? (size_t)model->n_mtp_layers * (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * 4 : 0;
    moeq_engine_destroy(e);
    double mem = mem_gib * 1073741824.0, reserve = reserve_gib * 1073741824.0;
    double left = mem - (double)weights - (double)arena - reserve;
    int64_t bt = p.kv_block_tokens, tokens = left > 0 ? (int64_t)(left / (double)(per_token + mtp_per_token)) / bt * bt : 0;
    printf("{\"device_fit\": {\"memory_bytes\": %.0f, \"weights_bytes\": %zu, \"step_arena_bytes\": %zu, "
           "\"max_step_tokens\": %d, \"reserve_bytes\": %.0f, \"kv_bytes_per_token\": %zu, "
           "\"mtp_kv_bytes_per_token\": %zu, \"fits\": %s, \"kv_cache_tokens\": %lld, \"sequences\": {",
           mem, weights, arena, p.max_step_tokens, reserve, per_token, mtp_per_token, tokens > 0 ? "true" : "false",
           (long long)tokens);
    static const int lens[] = {1024, 4096, 32768, 131072};
    for (int i = 0; i < 4; i++) {
        int64_t per_seq = (lens[i] + bt - 1) / bt * bt;
        printf("%s\"%d\": %lld", i ? ", " : "", lens[i], (long long)(tokens / per_seq));
    }
    printf("}}}\n");
    if (tokens <= 0)
        fprintf(stderr, "moeq model-info: %.1f GiB does not hold the weights (%.2f GiB), the step arena (%.2f GiB) "
                        "and the reserve (%.2f GiB) with room for one cache block\n",
                mem_gib, weights / 1073741824.0, arena / 1073741824.0, reserve_gib);
    return tokens > 0 ? 0 : 1;
}

#define MODEL_INFO_USAGE                                                                                   \
    "usage: moeq model-info --model DIR [--no-mtp] [--check-weights]\n"                                        \
    "                       [--device-memory-gib G [--reserve-gib R] [--max-step-tokens N] [--max-seqs N]]\n" \
    "\n"                                                                                                       \
    "  --device-memory-gib G  what fits on a device of G GiB (the CUDA backend): weights as stored, the\n"     \
    "                   step arena for --max-step-tokens (default 2048) and --max-seqs (default 64), a\n"   \
    "                   reserve for the CUDA context and cuBLAS (--reserve-gib, default 2), then the latent\n" \
    "                   cache: tokens in all and sequences of 1k-128k tokens; exit 1 when nothing fits\n"   \
    "  --check-weights  also read every tensor (dequantised as the engine does: FP8 value x scale) and\n"      \
    "                   report those holding NaN, inf or |x| >= 1e30; exit 1 when any does\n"

/* One bad tensor: a line on stderr, an entry of the "bad_tensors" array on stdout. */
static void report_issue(void *ctx, const moeq_weight_issue *issue) {
    int *n = ctx;
    fprintf(stderr, "moeq model-info: tensor %s: %lld non-finite and %lld huge value(s), the first at index %lld\n",
            issue->tensor, (long long)issue->nonfinite, (long long)issue->huge, (long long)issue->first);
    printf("%s{\"tensor\": \"%s\", \"nonfinite\": %lld, \"huge\": %lld, \"first\": %lld}", (*n)++ ? ", " : "",
           issue->tensor, (long long)issue->nonfinite, (long long)issue->huge, (long long)issue->first);
}

/* --check-weights: {"checked_tensors": N, "bad_tensors": [...]} on a line of its own; 1 when any is bad. */
static int check_weights(const moeq_model *model) {
    char errstr[256];
    int n_bad = 0, printed = 0;
    printf("{\"bad_tensors\": [");
    moeq_err err = moeq_model_check_weights(model, report_issue, &printed, &n_bad, errstr, sizeof errstr);
    printf("], \"checked_tensors\": %d}\n", model->n_tensors);
    if (err) fprintf(stderr, "moeq model-info: %s (%s)\n", errstr, moeq_err_str(err));
    else if (n_bad) fprintf(stderr, "moeq model-info: %d tensor(s) hold non-finite or huge values\n", n_bad);
    return err || n_bad ? 1 : 0;
}

static int is_value_flag(const char *flag) {
    return !strcmp(flag, "--device-memory-gib") || !strcmp(flag, "--reserve-gib") ||
           !strcmp(flag, "--max-step-tokens") || !strcmp(flag, "--max-seqs");
}

/* One of is_value_flag's flags and its value, checked whole and in range; 0, or -1 after saying why. */
static int value_flag(const char *flag, const char *v, double *device_gib, double *reserve_gib,
                      moeq_engine_params *ep) {
    if (!strcmp(flag, "--device-memory-gib") || !strcmp(flag, "--reserve-gib")) {
        int device = !strcmp(flag, "--device-memory-gib");
        double *out = device ? device_gib : reserve_gib;
        if (moeq_cli_double_arg(flag, v, out)) return -1;
        if (!isfinite(*out) || (device ? *out <= 0 : *out < 0)) {
            fprintf(stderr, "moeq model-info: %s %s: give a finite number %s\n", flag, v, device ? "> 0" : ">= 0");
            return -1;
        }
        return 0;
    }
    int *out = !strcmp(flag, "--max-seqs") ? &ep->max_seqs : &ep->max_step_tokens;
    if (moeq_cli_int_arg(flag, v, out)) return -1;
    if (*out < 1) {
        fprintf(stderr, "moeq model-info: %s %d: give 1 or more\n", flag, *out);
        return -1;
    }
    return 0;
}

int moeq_cmd_model_info(int argc, char **argv) {
    const char *dir = NULL;
    int check = 0;
    double device_gib = 0, reserve_gib = 2;
    moeq_engine_params ep = moeq_engine_default_params();
    moeq_model_params params = moeq_model_default_params();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--no-mtp")) {
            params.load_mtp = 0;
        } else if (!strcmp(argv[i], "--check-weights")) {
            check = 1;
        } else if (is_value_flag(argv[i]) && i + 1 < argc) {
            if (value_flag(argv[i], argv[i + 1], &device_gib, &reserve_gib, &ep)) return 2;
            i++;
        } else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr, MODEL_INFO_USAGE);
            return help ? 0 : 2;
        }
    }
    if (!dir) {
        fprintf(stderr, MODEL_INFO_USAGE);
        return 2;
    }
    char errstr[512];
    moeq_model *model = NULL;
    int64_t t0 = moeq_mono_ns();
    moeq_err err = moeq_model_load(dir, &params, &model, errstr, sizeof errstr);
    double load_ms = (double)(moeq_mono_ns() - t0) / 1e6;
    if (err) {
        fprintf(stderr, "moeq model-info: %s (%s)\n", errstr, moeq_err_str(err));
        return 1;
    }
    print_info(dir, model, load_ms);
    int rc = check ? check_weights(model) : 0;
    if (!rc && device_gib > 0) rc = print_device_fit(model, &ep, device_gib, reserve_gib);
    moeq_model_destroy(model);
    return rc;
}
