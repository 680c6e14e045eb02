#!/usr/bin/python3
"""
make_ckpt.py - write small random DeepSeek checkpoints in the Hugging Face
layout (config.json + safetensors with HF tensor names) with numpy, for the
reference's own self-checks (it does not use `moeq gen-model`, so the
reference can be tested before and independently of the engine).

Kinds: v3 (q_lora, sigmoid + bias, group-limited noaux_tc, YaRN, one MTP
layer), v2 (q_proj, softmax group_limited_greedy, YaRN with V2's mscale
0.707), v2-lite (greedy, no rope_scaling, moe_layer_freq 2).
Storage: f32, bf16, f8 (F8_E4M3 + weight_scale_inv for 2-D projection
weights, as DeepSeek-V3 stores them), optionally sharded.

Usage: make_ckpt.py --kind v3 --dtype bf16 --out DIR [--seed N] [--shards N]
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import (apply_block_scale, f8_e4m3_to_f64, f64_to_bf16_bits, quantize_f8_blocks,  # noqa: E402
                            save_file)

CONFIGS = {
    "v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": 300, "hidden_size": 160, "intermediate_size": 96, "moe_intermediate_size": 40,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
        "n_shared_experts": 1, "n_routed_experts": 16, "num_experts_per_tok": 4,
        "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1,
    },
    "v2": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "vocab_size": 280, "hidden_size": 96, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_hidden_layers": 3, "num_attention_heads": 3, "num_key_value_heads": 3,
        "n_shared_experts": 2, "n_routed_experts": 12, "num_experts_per_tok": 3,
        "n_group": 4, "topk_group": 2, "topk_method": "group_limited_greedy", "scoring_func": "softmax",
        "norm_topk_prob": False, "routed_scaling_factor": 1.5,
        "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "q_lora_rank": None, "kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256,
        "rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": 0, "eos_token_id": 1,
    },
    "v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "vocab_size": 250, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 24,
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
        "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_group": 1, "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax",
        "norm_topk_prob": True, "routed_scaling_factor": 3.0,
        "first_k_dense_replace": 1, "moe_layer_freq": 2,
        "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128, "rope_scaling": None,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": 0, "eos_token_id": 1,
    },
}


def _proj_names(cfg, p, moe):
    """(name, shape) of a decoder layer's weights."""
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    qd = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    out = [(p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,))]
    a = p + "self_attn."
    if cfg.get("q_lora_rank"):
        out += [(a + "q_a_proj.weight", (cfg["q_lora_rank"], D)), (a + "q_a_layernorm.weight", (cfg["q_lora_rank"],)),
                (a + "q_b_proj.weight", (H * qd, cfg["q_lora_rank"]))]
    else:
        out += [(a + "q_proj.weight", (H * qd, D))]
    r = cfg["kv_lora_rank"]
    out += [(a + "kv_a_proj_with_mqa.weight", (r + cfg["qk_rope_head_dim"], D)), (a + "kv_a_layernorm.weight", (r,)),
            (a + "kv_b_proj.weight", (H * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), r)),
            (a + "o_proj.weight", (D, H * cfg["v_head_dim"]))]

    def mlp(pre, inter):
        return [(pre + "gate_proj.weight", (inter, D)), (pre + "up_proj.weight", (inter, D)),
                (pre + "down_proj.weight", (D, inter))]

    if moe:
        E = cfg["n_routed_experts"]
        out += [(p + "mlp.gate.weight", (E, D))]
        if cfg["topk_method"] == "noaux_tc":
            out += [(p + "mlp.gate.e_score_correction_bias", (E,))]
        for e in range(E):
            out += mlp(f"{p}mlp.experts.{e}.", cfg["moe_intermediate_size"])
        if cfg.get("n_shared_experts"):
            out += mlp(p + "mlp.shared_experts.", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
    else:
        out += mlp(p + "mlp.", cfg["intermediate_size"])
    return out


def tensor_specs(cfg):
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    specs = [("model.embed_tokens.weight", (V, D)), ("model.norm.weight", (D,))]
    if not cfg.get("tie_word_embeddings"):
        specs.append(("lm_head.weight", (V, D)))
    L = cfg["num_hidden_layers"]

    def is_moe(i):
        return cfg["n_routed_experts"] and i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0

    for i in range(L):
        specs += _proj_names(cfg, f"model.layers.{i}.", is_moe(i))
    for k in range(cfg.get("num_nextn_predict_layers", 0) or 0):
        p = f"model.layers.{L + k}."
        specs += [(p + "enorm.weight", (D,)), (p + "hnorm.weight", (D,)), (p + "eh_proj.weight", (D, 2 * D)),
                  (p + "embed_tokens.weight", (V, D)), (p + "shared_head.norm.weight", (D,)),
                  (p + "shared_head.head.weight", (V, D))]
        specs += _proj_names(cfg, p, is_moe(L + k))
    return specs


def random_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in tensor_specs(cfg):
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            w[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("e_score_correction_bias"):
            w[name] = 0.05 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            w[name] = rng.standard_normal(shape)
        elif name.endswith("gate.weight"):
            w[name] = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
        else:
            # fan-in scaled, a little hot so logits are peaked
            w[name] = 1.5 * rng.standard_normal(shape) / np.sqrt(shape[1])
    if "model.layers.%d.embed_tokens.weight" % cfg["num_hidden_layers"] in w:
        w["model.layers.%d.embed_tokens.weight" % cfg["num_hidden_layers"]] = w["model.embed_tokens.weight"].copy()
    return w


def encode(weights, dtype):
    """-> (tensors for save_file, the float64 values the file now holds)."""
    out, held = {}, {}
    for name, arr in weights.items():
        is_proj = arr.ndim == 2 and "embed_tokens" not in name and not name.endswith("gate.weight") \
            and "lm_head" not in name and "shared_head.head" not in name
        if dtype == "f32" or name.endswith("e_score_correction_bias"):
            out[name] = ("F32", arr.astype(np.float32))
            held[name] = arr.astype(np.float32).astype(np.float64)
        elif dtype == "bf16" or (dtype == "f8" and not is_proj):
            bits = f64_to_bf16_bits(arr)
            out[name] = ("BF16", bits)
            held[name] = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif dtype == "f8":
            q, scale = quantize_f8_blocks(arr)
            out[name] = ("F8_E4M3", q)
            out[name + "_scale_inv"] = ("F32", scale)
            held[name] = apply_block_scale(f8_e4m3_to_f64(q), scale.astype(np.float64))
        else:
            raise ValueError(dtype)
    return out, held


def write(out_dir, kind="v3", dtype="bf16", seed=1, shards=1, config_overrides=None):
    """Write a checkpoint; returns (config dict, float64 weights as stored)."""
    cfg = json.loads(json.dumps(CONFIGS[kind]))
    cfg.update(config_overrides or {})
    os.makedirs(out_dir, exist_ok=True)
    tensors, held = encode(random_weights(cfg, seed), dtype)
    if dtype == "f8":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if shards <= 1:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"), {"format": "pt"})
    else:
        names = sorted(tensors)
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[s::shards]}
            # keep a weight and its scale in different shards sometimes: allowed by the format
            save_file(part, os.path.join(out_dir, fname), {"format": "pt"})
            weight_map.update({n: fname for n in part})
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    return cfg, held


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="v3", choices=sorted(CONFIGS))
    ap.add_argument("--dtype", default="bf16", choices=["f32", "bf16", "f8"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    write(a.out, a.kind, a.dtype, a.seed, a.shards)


if __name__ == "__main__":
    main()
