#!/usr/bin/env python3
"""bench/llamacpp/convert.py — a moeq checkpoint (HF DeepSeek-V3 layout) to GGUF for llama.cpp.

Usage: convert.py MODEL_DIR OUT.gguf [--outtype auto|bf16|q8_0]

Writes llama.cpp's `deepseek2` architecture as the llama.cpp release that
node-llama-cpp 3.21.1 bundles expects it (the same keys and tensor layout as its
convert_hf_to_gguf.py DeepseekV2Model, re-implemented over numpy + gguf-py
because that script needs torch and transformers, which this project does not
install):
  - MLA: kv_b_proj is split into attn_k_b (transposed, per head) and attn_v_b;
    num_key_value_heads is written as 1 (MQA over the compressed latent) and the
    MLA head sizes go in key_length_mla / value_length_mla;
  - routed experts are stacked per layer into ffn_{gate,up,down}_exps;
    e_score_correction_bias becomes exp_probs_b.bias; the router stays F32;
  - leading_dense_block_count, expert_gating_func (sigmoid / softmax), expert
    weights scale / norm, and YaRN rope scaling (with the 0.1 * mscale_all_dim
    log-multiplier the llama.cpp loader divides back out);
  - the tokenizer as gpt2 BPE (pre-tokenizer `deepseek-v3`) from tokenizer.json,
    ids past the tokenizer up to vocab_size as unused [PADn] tokens;
  - MTP layers (index >= num_hidden_layers) are left out, as llama.cpp's own
    converter does for DeepSeek.

Tensor types. --outtype auto (default): a BF16 checkpoint stays BF16; in an FP8
checkpoint the F8_E4M3 projections are dequantised with their 128x128
weight_scale_inv blocks and written as Q8_0 (llama.cpp's nearest format), the
BF16 rest (embeddings, lm_head) stays BF16: the same weights moeq runs from the
same directory. --outtype bf16 / q8_0 force every 2-D projection to that type.
Norms, 1-D tensors and the router are F32, and a tensor whose rows are not a
multiple of 32 falls back from Q8_0 to F16 — both as llama.cpp's converter does.

What this does not do: quantise to other llama.cpp types, read checkpoints that
are not DeepSeek-V3-shaped, or keep MTP layers. Tensors are written one at a
time, so memory stays at about one layer's stacked experts.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:  # scripts/setup.d/50-llamacpp-anchor.sh installs gguf-py (pip --target) beside this file
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pylib"))
    import gguf

Q = gguf.GGMLQuantizationType

# ---- safetensors -------------------------------------------------------------------------------


class Checkpoint:
    """Every tensor of a directory's *.safetensors, memory-mapped, by HF name."""

    def __init__(self, model_dir):
        self.tensors = {}
        for fname in sorted(os.listdir(model_dir)):
            if fname.endswith(".safetensors"):
                self._index(os.path.join(model_dir, fname))
        if not self.tensors:
            raise SystemExit(f"convert: no *.safetensors in {model_dir}")

    def _index(self, path):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        for name, info in header.items():
            if name != "__metadata__":
                start, end = info["data_offsets"]
                self.tensors[name] = (info["dtype"], info["shape"], mm[8 + n + start:8 + n + end])

    def has(self, name):
        return name in self.tensors

    def dtype(self, name):
        return self.tensors[name][0]

    def shape(self, name):
        return list(self.tensors[name][1])

    def raw_bf16(self, name):
        """The BF16 bits as uint16, no conversion (BF16 -> GGUF BF16 is lossless)."""
        dtype, shape, buf = self.tensors[name]
        assert dtype == "BF16", name
        return buf.view(np.uint16).reshape(shape)

    def f32(self, name):
        """The tensor as float32; an F8_E4M3 weight times its weight_scale_inv blocks."""
        dtype, shape, buf = self.tensors[name]
        if dtype == "F32":
            return np.array(buf.view(np.float32).reshape(shape))
        if dtype == "BF16":
            return (buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if dtype == "F16":
            return buf.view(np.float16).astype(np.float32).reshape(shape)
        if dtype == "F8_E4M3":
            return dequant_fp8(E4M3_TABLE[buf].reshape(shape), self.f32(name + "_scale_inv"))
        raise SystemExit(f"convert: tensor {name}: dtype {dtype} not supported")


def e4m3_table():
    """float32 value of each E4M3FN byte (bias 7, no infinities, 0x7f/0xff NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    val = np.where((b & 0x7F) == 0x7F, np.nan, val)
    return (sign * val).astype(np.float32)


E4M3_TABLE = e4m3_table()


def dequant_fp8(w, scale_inv, block=128):
    """(R, C) weights times their (ceil(R/128), ceil(C/128)) block scales."""
    r, c = w.shape
    s = np.repeat(np.repeat(scale_inv, block, axis=0), block, axis=1)[:r, :c]
    return w * s


# ---- tensor plan -------------------------------------------------------------------------------


class Plan:
    """The GGUF tensors in write order: name, numpy shape, GGML type and how to produce the data.

    Shapes are known before any data is computed, so the tensor info can be written
    first and each tensor's data streamed after it.
    """

    def __init__(self, ckpt, hp, outtype):
        self.ckpt, self.hp, self.outtype = ckpt, hp, outtype
        self.items = []
        self.fp8 = (hp.get("quantization_config") or {}).get("quant_method") == "fp8"
        self.names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, hp["num_hidden_layers"])

    def gguf_name(self, hf_name):
        if hf_name.endswith("e_score_correction_bias"):
            hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        name = self.names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise SystemExit(f"convert: no GGUF name for tensor {hf_name}")
        return name

    def qtype(self, gname, shape, src_dtypes):
        """llama.cpp's converter's choice (prepare_tensors) for this tensor."""
        if len(shape) <= 1 or gname.endswith("_norm.weight") or ".ffn_gate_inp." in gname \
                or not gname.endswith(".weight"):
            return Q.F32
        want = self.outtype
        if want == "auto":
            want = "q8_0" if "F8_E4M3" in src_dtypes else "bf16"
        if want == "q8_0":
            return Q.Q8_0 if shape[-1] % 32 == 0 else Q.F16
        return Q.BF16

    def add(self, hf_name, shape, src_dtypes, produce):
        gname = self.gguf_name(hf_name)
        self.items.append((gname, list(shape), self.qtype(gname, shape, src_dtypes), produce))

    def build(self):
        ck, hp = self.ckpt, self.hp
        for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            if ck.has(name):
                self.add_plain(name)
        for bid in range(hp["num_hidden_layers"]):
            self.build_layer(bid)
        return self.items

    def add_plain(self, name):
        self.add(name, self.ckpt.shape(name), {self.ckpt.dtype(name)}, lambda: self.source_array(name))

    def build_layer(self, bid):
        ck, pre = self.ckpt, f"model.layers.{bid}."
        for name in sorted(n for n in ck.tensors if n.startswith(pre)):
            if name.endswith("_scale_inv") or ".mlp.experts." in name:
                continue
            if name.endswith("kv_b_proj.weight"):
                self.add_kv_b(name)
            else:
                self.add_plain(name)
        self.add_experts(bid)

    def add_kv_b(self, name):
        """kv_b (H*(nope+v), kv_lora) -> k_b (H, kv_lora, nope) and v_b (H, v, kv_lora)."""
        hp, ck = self.hp, self.ckpt
        h, nope, v = hp["num_attention_heads"], hp["qk_nope_head_dim"], hp["v_head_dim"]
        rank = ck.shape(name)[1]
        assert ck.shape(name)[0] == h * (nope + v), name

        def split(part):
            def produce():
                kv = self.source_array(name).reshape(h, nope + v, rank)
                return np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1) if part == "k" else kv[:, nope:, :])
            return produce
        src = {ck.dtype(name)}
        self.add(name.replace("kv_b_proj", "k_b_proj"), (h, rank, nope), src, split("k"))
        self.add(name.replace("kv_b_proj", "v_b_proj"), (h, v, rank), src, split("v"))

    def add_experts(self, bid):
        ck, n = self.ckpt, self.hp.get("n_routed_experts") or 0
        first = f"model.layers.{bid}.mlp.experts.0.gate_proj.weight"
        if n == 0 or not ck.has(first):
            return
        for w in ("down_proj", "gate_proj", "up_proj"):
            names = [f"model.layers.{bid}.mlp.experts.{e}.{w}.weight" for e in range(n)]
            missing = [x for x in names if not ck.has(x)]
            if missing:
                raise SystemExit(f"convert: layer {bid}: missing {missing[0]}")
            shape = [n] + ck.shape(names[0])
            self.add(f"model.layers.{bid}.mlp.experts.{w}.weight", shape, {ck.dtype(x) for x in names},
                     lambda names=names: np.stack([self.source_array(x) for x in names]))

    def source_array(self, name):
        """The HF tensor as BF16 bits when it is BF16 (kept exact), else float32."""
        return self.ckpt.raw_bf16(name) if self.ckpt.dtype(name) == "BF16" else self.ckpt.f32(name)


def materialise(item):
    """The final bytes of one planned tensor, in its GGML type."""
    _, shape, qtype, produce = item
    return convert_array(produce(), qtype).reshape(byte_shape(shape, qtype))


def convert_array(data, qtype):
    if data.dtype == np.uint16:  # BF16 bits
        if qtype == Q.BF16:
            return np.ascontiguousarray(data)
        data = (data.astype(np.uint32) << 16).view(np.float32)
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype == Q.F32:
        return data
    if qtype == Q.F16:
        return data.astype(np.float16)
    return gguf.quants.quantize(data, qtype)


def byte_shape(shape, qtype):
    if qtype in (Q.F32, Q.F16, Q.BF16):
        return shape
    return list(gguf.quant_shape_to_byte_shape(shape, qtype))


def nbytes(shape, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


# ---- metadata ----------------------------------------------------------------------------------


def write_hparams(w, hp):
    """The deepseek2 keys llama.cpp reads (DeepseekV2Model.set_gguf_parameters + TextModel's)."""
    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(1)  # MLA runs as MQA over the compressed latent
    w.add_rope_freq_base(hp.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
    w.add_expert_count(hp["n_routed_experts"])
    w.add_expert_used_count(hp["num_experts_per_tok"])
    if hp.get("n_group") is not None:
        w.add_expert_group_count(hp["n_group"])
    if hp.get("topk_group") is not None:
        w.add_expert_group_used_count(hp["topk_group"])
    gating = {"sigmoid": gguf.ExpertGatingFuncType.SIGMOID, "softmax": gguf.ExpertGatingFuncType.SOFTMAX}
    w.add_expert_gating_func(gating[hp.get("scoring_func", "softmax")])
    w.add_leading_dense_block_count(hp.get("first_k_dense_replace", 0))
    w.add_vocab_size(hp["vocab_size"])
    if hp.get("q_lora_rank"):
        w.add_q_lora_rank(hp["q_lora_rank"])
    rank, rope = hp["kv_lora_rank"], hp["qk_rope_head_dim"]
    w.add_kv_lora_rank(rank)
    w.add_key_length(rank + rope)
    w.add_value_length(rank)
    w.add_key_length_mla(hp["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(hp["v_head_dim"])
    w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    w.add_expert_shared_count(hp.get("n_shared_experts", 0))
    if hp.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(hp["routed_scaling_factor"])
    if hp.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    write_rope_scaling(w, hp.get("rope_scaling") or {})


def write_rope_scaling(w, rs):
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "yarn" and rs.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        if rs.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
        if rs.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
        if rs.get("mscale_all_dim") is not None:
            # llama.cpp's loader divides this by 0.1 again ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX])
            w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
    elif kind == "linear" and rs.get("factor") is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs["factor"])


def write_tokenizer(w, model_dir, vocab_size):
    """gpt2 BPE from tokenizer.json, as llama.cpp's get_vocab_base would without transformers."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    if tok["model"]["type"] != "BPE":
        raise SystemExit(f"convert: tokenizer.json: model type {tok['model']['type']}, expected BPE")
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = by_id[i]
        tokens.append(t)
        if i in added:
            looks = (t.startswith("<|") and t.endswith("|>")) or (t.startswith("<｜") and t.endswith("｜>"))
            types.append(gguf.TokenType.CONTROL if added[i].get("special") or looks else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("deepseek-v3")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    gguf.SpecialVocab(model_dir, load_merges=False).add_to_gguf(w, quiet=True)


FILE_TYPES = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def convert(model_dir, out, outtype):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        hp = json.load(f)
    if hp.get("model_type") not in ("deepseek_v3", "deepseek_v2"):
        raise SystemExit(f"convert: {model_dir}: model_type {hp.get('model_type')}, expected deepseek_v3")
    ckpt = Checkpoint(model_dir)
    plan = Plan(ckpt, hp, outtype)
    items = plan.build()
    w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.DEEPSEEK2], use_temp_file=False)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(os.path.basename(os.path.normpath(model_dir)))
    kind = outtype if outtype != "auto" else ("q8_0" if plan.fp8 else "bf16")
    w.add_file_type(FILE_TYPES[kind])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_hparams(w, hp)
    write_tokenizer(w, model_dir, hp["vocab_size"])
    for gname, shape, qtype, _ in items:
        w.add_tensor_info(gname, shape, np.float32, nbytes(shape, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    counts = {}
    for item in items:
        w.write_tensor_data(materialise(item))
        counts[item[2].name] = counts.get(item[2].name, 0) + 1
    w.close()
    return {"out": out, "tensors": len(items), "types": counts, "bytes": os.path.getsize(out)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=("auto", "bf16", "q8_0"), default="auto")
    a = ap.parse_args()
    print(json.dumps(convert(a.model_dir, a.out, a.outtype)))


if __name__ == "__main__":
    main()
