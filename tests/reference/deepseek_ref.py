#!/usr/bin/python3
"""
deepseek_ref.py - an independent float64 NumPy reference of the DeepSeek-V3 /
DeepSeek-V2 architecture, for checking the C engine's logits.

Written from the published reference code, not from engine/:
  * deepseek-ai's Hugging Face `modeling_deepseek.py` for DeepSeek-V3 (and
    R1) and for DeepSeek-V2 / V2-Lite (semantics followed here), and
  * deepseek-ai/DeepSeek-V3 `inference/model.py` (used to cross-check MLA
    weight absorption and the gate).

Semantics, with the places where published implementations differ:
  * RMSNorm: x * rsqrt(mean(x^2) + eps) * w. input/post-attention/final norms
    use config.rms_norm_eps; q_a_layernorm and kv_a_layernorm are built in HF
    (and in inference/model.py) without an eps argument, i.e. eps = 1e-6
    whatever rms_norm_eps says (vLLM passes rms_norm_eps instead; the two agree
    for every published config, which all use 1e-6).
  * MLA, naive (expanded K/V) form as HF's DeepseekV3Attention; the absorbed
    form (cache = normed latent + roped k_pe) as inference/model.py's
    attn_impl="absorb", kept here only to cross-check the naive form.
  * RoPE on the rope part only, HF layout: the interleaved pairs
    (x[2i], x[2i+1]) are de-interleaved (view(d/2, 2).transpose) and then
    rotated with rotate_half, i.e. pair i is rotated by angle pos * inv_freq[i].
    YaRN (rope_scaling.type == "yarn") as DeepseekV3YarnRotaryEmbedding: floor /
    ceil correction range, linear ramp, inv_freq blend, cos/sin multiplied by
    yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim),
    softmax scale q_head_dim^-0.5 * yarn_get_mscale(factor, mscale_all_dim)^2
    when mscale_all_dim is set. HF applies YaRN at every position whenever
    rope_scaling is present (inference/model.py only when max_seq_len >
    original_seq_len, and rounds the correction range; we follow HF).
  * MoE layer i: n_routed_experts set, i >= first_k_dense_replace and
    i % moe_layer_freq == 0; else a dense SwiGLU MLP (silu(gate) * up -> down).
  * Gate, deepseek_v3 (sigmoid, noaux_tc): choice = sigmoid + e_score_correction
    _bias; group score = sum of the group's top-2 choice scores; topk_group
    groups kept; top-k over the kept experts (masked experts are excluded -
    HF fills them with 0.0, inference/model.py with -inf; they differ only when
    fewer than k kept experts have a positive biased score, which `routing`
    records); weights = unbiased sigmoid scores of the chosen experts,
    normalised (sum + 1e-20) when top_k > 1 and norm_topk_prob, then always
    multiplied by routed_scaling_factor.
  * Gate, deepseek_v2 (softmax): "greedy" (or the original file's "gready")
    or "group_limited_greedy" (group score = max); weights = softmax scores;
    normalised when top_k > 1 and norm_topk_prob, ELSE multiplied by
    routed_scaling_factor (V2's code applies the factor only in the
    un-normalised branch).
  * Shared experts: one fused MLP mlp.shared_experts.* added to the routed sum.
  * MTP (model.layers.{num_hidden_layers + k}): logits for token i+2 from
    [enorm(embed(t_{i+1})) ; hnorm(h_i)] -> eh_proj -> decoder block ->
    shared_head.norm -> shared_head.head, with h_i the main model's hidden
    after its final norm (what vLLM's and SGLang's DeepSeek MTP drafters are
    fed: the main model's output hidden states).

Everything is float64; weights are decoded from their stored dtype exactly
(see safetensors_np.py).

CLI: python3 deepseek_ref.py --model DIR --tokens 1,2,3 [--out logits.npy]
     [--attn naive|absorbed] [--incremental] [--top K]
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import Checkpoint  # noqa: E402

NORM_EPS_LORA = 1e-6  # q_a_layernorm / kv_a_layernorm: HF's DeepseekV3RMSNorm default


# ---- config ---------------------------------------------------------------


class Config:
    def __init__(self, d):
        self.raw = d
        mt = d.get("model_type")
        if mt not in ("deepseek_v3", "deepseek_v2"):
            raise ValueError(f"unsupported model_type {mt!r}")
        self.model_type = mt
        v3 = mt == "deepseek_v3"
        g = d.get
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.intermediate_size = d["intermediate_size"]
        self.moe_intermediate_size = g("moe_intermediate_size", 0)
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.n_shared_experts = g("n_shared_experts") or 0
        self.n_routed_experts = g("n_routed_experts") or 0
        self.num_experts_per_tok = g("num_experts_per_tok") or 0
        self.n_group = g("n_group") or 1
        self.topk_group = g("topk_group") or 1
        self.first_k_dense_replace = g("first_k_dense_replace", 0)
        self.moe_layer_freq = g("moe_layer_freq", 1)
        self.norm_topk_prob = bool(g("norm_topk_prob", v3))
        self.routed_scaling_factor = float(g("routed_scaling_factor", 2.5 if v3 else 1.0))
        self.scoring_func = g("scoring_func", "sigmoid" if v3 else "softmax")
        self.topk_method = g("topk_method", "noaux_tc" if v3 else "greedy")
        self.q_lora_rank = g("q_lora_rank") or 0
        self.kv_lora_rank = d["kv_lora_rank"]
        self.qk_nope_head_dim = d["qk_nope_head_dim"]
        self.qk_rope_head_dim = d["qk_rope_head_dim"]
        self.v_head_dim = d["v_head_dim"]
        self.q_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.rms_norm_eps = float(g("rms_norm_eps", 1e-6))
        self.rope_theta = float(g("rope_theta", 10000.0))
        self.max_position_embeddings = g("max_position_embeddings", 2048)
        self.rope_scaling = g("rope_scaling")
        self.tie_word_embeddings = bool(g("tie_word_embeddings", False))
        self.num_nextn_predict_layers = g("num_nextn_predict_layers", 0) or 0
        if g("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {g('hidden_act')!r} unsupported")
        if g("attention_bias", False):
            raise ValueError("attention_bias unsupported")

    def is_moe_layer(self, i):
        return self.n_routed_experts > 0 and i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0


# ---- RoPE / YaRN (HF DeepseekV3YarnRotaryEmbedding) ---------------------------


def yarn_find_correction_dim(num_rotations, dim, base, max_position_embeddings):
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings):
    low = math.floor(yarn_find_correction_dim(low_rot, dim, base, max_position_embeddings))
    high = math.ceil(yarn_find_correction_dim(high_rot, dim, base, max_position_embeddings))
    return max(low, 0), min(high, dim - 1)


def yarn_get_mscale(scale=1.0, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_linear_ramp_mask(lo, hi, dim):
    if lo == hi:
        hi += 0.001
    return np.clip((np.arange(dim, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)


class Rope:
    """inv_freq [rope_dim/2], cos/sin multiplier, and the softmax scale."""

    def __init__(self, cfg, correction="hf"):
        """correction "hf": floor/ceil correction range and HF's ramp (what we
        follow); "round": inference/model.py's rounded range and (x - lo) /
        (hi - lo + 1e-3) ramp, kept only so tests can show the two differ."""
        dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
        exps = np.arange(0, dim, 2, dtype=np.float64) / dim
        self.softmax_scale = cfg.q_head_dim ** -0.5
        self.mscale = 1.0
        self.yarn = False
        rs = cfg.rope_scaling
        if rs is None:
            self.inv_freq = 1.0 / base ** exps
            return
        kind = rs.get("type", rs.get("rope_type"))
        if kind != "yarn":
            raise ValueError(f"rope_scaling type {kind!r} unsupported (only yarn)")
        self.yarn = True
        factor = float(rs["factor"])
        orig = rs.get("original_max_position_embeddings", 4096)
        beta_fast = rs.get("beta_fast", 32)
        beta_slow = rs.get("beta_slow", 1)
        mscale = rs.get("mscale", 1)
        mscale_all_dim = rs.get("mscale_all_dim", 0)
        freq_extra = 1.0 / base ** exps
        freq_inter = 1.0 / (factor * base ** exps)
        if correction == "hf":
            low, high = yarn_find_correction_range(beta_fast, beta_slow, dim, base, orig)
            inv_freq_mask = 1.0 - yarn_linear_ramp_mask(low, high, dim // 2)
        else:
            low, high = (min(max(round(yarn_find_correction_dim(r, dim, base, orig)), 0), dim - 1)
                         for r in (beta_fast, beta_slow))
            ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low + 1e-3), 0.0, 1.0)
            inv_freq_mask = 1.0 - ramp
        self.inv_freq = freq_inter * (1 - inv_freq_mask) + freq_extra * inv_freq_mask
        self.low, self.high = low, high
        self.mscale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        if mscale_all_dim:
            m = yarn_get_mscale(factor, mscale_all_dim)
            self.softmax_scale = self.softmax_scale * m * m

    def apply(self, x, positions):
        """x (T, ..., d) with the stored interleaved layout; returns HF's
        rotated tensor (de-interleaved layout, which both q and k share)."""
        freqs = np.outer(positions.astype(np.float64), self.inv_freq)  # (T, d/2)
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos = np.cos(emb) * self.mscale
        sin = np.sin(emb) * self.mscale
        shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
        cos, sin = cos.reshape(shape), sin.reshape(shape)
        xd = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        half = x.shape[-1] // 2
        rot = np.concatenate([-xd[..., half:], xd[..., :half]], axis=-1)
        return xd * cos + rot * sin


# ---- building blocks ------------------------------------------------------------


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def topk_indices(scores, k):
    """Indices of the k largest per row (ties: lower index first)."""
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[..., :k]


class LayerCache:
    """Per-layer attention state of one sequence. naive: expanded K (S,H,qd)
    and V (S,H,v); absorbed: normed latent (S,r) and roped k_pe (S,rope)."""

    def __init__(self):
        self.a = None
        self.b = None

    def append(self, a, b):
        self.a = a if self.a is None else np.concatenate([self.a, a], axis=0)
        self.b = b if self.b is None else np.concatenate([self.b, b], axis=0)
        return self.a, self.b


class Cache:
    def __init__(self, n_layers):
        self.pos = 0
        self.layers = [LayerCache() for _ in range(n_layers)]


class Routing:
    """What the gates decided, for the tests: per (layer, token) the chosen
    experts, the experts an ungrouped top-k would choose, the decision margins
    (expert and group), and whether HF's 0.0 fill of masked experts would
    change the choice."""

    def __init__(self):
        self.rows = []  # dicts

    def min_margin(self):
        return min((r["margin"] for r in self.rows), default=float("inf"))


class _DictStore:
    def __init__(self, config, weights):
        self.config = config
        self.weights = weights

    def has(self, name):
        return name in self.weights

    def get(self, name):
        return self.weights[name]


# ---- the model ---------------------------------------------------------------------


class DeepSeekRef:
    def __init__(self, model_dir=None, config=None, weights=None):
        """From a model directory, or (tests) from a config dict and a dict of
        float64 weights by HF name."""
        self.ckpt = Checkpoint(model_dir) if model_dir else _DictStore(config, weights)
        self.cfg = Config(self.ckpt.config)
        self.rope = Rope(self.cfg)

    def w(self, name):
        return self.ckpt.get(name)

    # -- MLP / MoE
    def mlp(self, x, prefix):
        g = x @ self.w(prefix + "gate_proj.weight").T
        u = x @ self.w(prefix + "up_proj.weight").T
        return (silu(g) * u) @ self.w(prefix + "down_proj.weight").T

    def gate(self, x, prefix, layer, positions, routing):
        """Returns (idx (T,k), weights (T,k))."""
        cfg = self.cfg
        E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        logits = x @ self.w(prefix + "gate.weight").T  # (T, E)
        if cfg.scoring_func == "sigmoid":
            scores = sigmoid(logits)
        elif cfg.scoring_func == "softmax":
            scores = softmax(logits)
        else:
            raise ValueError(f"scoring_func {cfg.scoring_func!r} unsupported")
        method = cfg.topk_method
        if method == "noaux_tc":
            choice = scores + self.w(prefix + "gate.e_score_correction_bias")[None, :]
            grouped = True
            group_fn = "top2sum"
        elif method in ("greedy", "gready"):
            choice, grouped, group_fn = scores, False, None
        elif method == "group_limited_greedy":
            choice, grouped, group_fn = scores, True, "max"
        else:
            raise ValueError(f"topk_method {method!r} unsupported")
        T = x.shape[0]
        G = cfg.n_group if grouped else 1
        per = E // G
        cg = choice.reshape(T, G, per)
        if group_fn == "top2sum":
            gs = np.sort(cg, axis=-1)[..., ::-1][..., :2].sum(-1) if per >= 2 else cg[..., 0]
        else:
            gs = cg.max(-1)
        tg = cfg.topk_group if grouped else 1
        gidx = topk_indices(gs, tg)  # (T, tg)
        gmask = np.zeros((T, G), dtype=bool)
        np.put_along_axis(gmask, gidx, True, axis=1)
        emask = np.repeat(gmask, per, axis=1)  # (T, E)
        masked = np.where(emask, choice, -np.inf)
        idx = topk_indices(masked, k)
        weights = np.take_along_axis(scores, idx, axis=1)
        if k > 1 and cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
            if cfg.model_type == "deepseek_v3":
                weights = weights * cfg.routed_scaling_factor
        else:
            weights = weights * cfg.routed_scaling_factor
        if routing is not None:
            hf_fill = np.where(emask, choice, 0.0)
            hf_idx = topk_indices(hf_fill, k)
            ungrouped = topk_indices(choice, k)
            srt = np.sort(masked, axis=-1)[:, ::-1]
            gsrt = np.sort(gs, axis=-1)[:, ::-1]
            for t in range(T):
                em = srt[t, k - 1] - srt[t, k] if E > k and np.isfinite(srt[t, k]) else float("inf")
                gm = gsrt[t, tg - 1] - gsrt[t, tg] if G > tg else float("inf")
                routing.rows.append({
                    "layer": layer, "pos": int(positions[t]),
                    "experts": sorted(idx[t].tolist()),
                    "ungrouped": sorted(ungrouped[t].tolist()),
                    "hf_fill_differs": sorted(hf_idx[t].tolist()) != sorted(idx[t].tolist()),
                    "margin": float(min(em, gm)),
                })
        return idx, weights

    def moe(self, x, prefix, layer, positions, routing):
        idx, weights = self.gate(x, prefix, layer, positions, routing)
        y = np.zeros_like(x)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            out = self.mlp(x[rows], f"{prefix}experts.{e}.")
            y[rows] += weights[rows, slot][:, None] * out
        if self.cfg.n_shared_experts:
            y = y + self.mlp(x, prefix + "shared_experts.")
        return y

    # -- MLA
    def attention(self, x, prefix, positions, lc, attn):
        cfg = self.cfg
        T, H = x.shape[0], cfg.num_attention_heads
        nope, rope_d, vd, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        if cfg.q_lora_rank:
            qa = rmsnorm(x @ self.w(prefix + "q_a_proj.weight").T, self.w(prefix + "q_a_layernorm.weight"),
                         NORM_EPS_LORA)
            q = qa @ self.w(prefix + "q_b_proj.weight").T
        else:
            q = x @ self.w(prefix + "q_proj.weight").T
        q = q.reshape(T, H, cfg.q_head_dim)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        ckv = x @ self.w(prefix + "kv_a_proj_with_mqa.weight").T  # (T, r + rope)
        c, k_pe = ckv[:, :r], ckv[:, r:]
        c = rmsnorm(c, self.w(prefix + "kv_a_layernorm.weight"), NORM_EPS_LORA)
        q_pe = self.rope.apply(q_pe, positions)  # (T, H, rope)
        k_pe = self.rope.apply(k_pe, positions)  # (T, rope)
        wkv_b = self.w(prefix + "kv_b_proj.weight")  # (H*(nope+v), r)
        scale = self.rope.softmax_scale
        if attn == "naive":
            kv = (c @ wkv_b.T).reshape(T, H, nope + vd)
            k = np.concatenate([kv[..., :nope], np.broadcast_to(k_pe[:, None, :], (T, H, rope_d))], axis=-1)
            K, V = lc.append(k, kv[..., nope:])
            qs = np.concatenate([q_nope, q_pe], axis=-1)
            scores = np.einsum("thd,shd->hts", qs, K) * scale
        elif attn == "absorbed":
            wb = wkv_b.reshape(H, nope + vd, r)
            q_lat = np.einsum("thn,hnr->thr", q_nope, wb[:, :nope])
            C, KPE = lc.append(c, k_pe)
            scores = (np.einsum("thr,sr->hts", q_lat, C) + np.einsum("thp,sp->hts", q_pe, KPE)) * scale
        else:
            raise ValueError(attn)
        S = scores.shape[-1]
        key_pos = np.arange(S)
        mask = key_pos[None, :] > positions[:, None]  # (T, S) causal
        scores = np.where(mask[None], -np.inf, scores)
        p = softmax(scores, axis=-1)
        if attn == "naive":
            o = np.einsum("hts,shv->thv", p, V)
        else:
            o_lat = np.einsum("hts,sr->thr", p, C)
            o = np.einsum("thr,hvr->thv", o_lat, wb[:, nope:])
        return o.reshape(T, H * vd) @ self.w(prefix + "o_proj.weight").T

    def block(self, i, x, positions, lc, attn, routing):
        cfg = self.cfg
        p = f"model.layers.{i}."
        h = rmsnorm(x, self.w(p + "input_layernorm.weight"), cfg.rms_norm_eps)
        x = x + self.attention(h, p + "self_attn.", positions, lc, attn)
        h = rmsnorm(x, self.w(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
        if cfg.is_moe_layer(i):
            return x + self.moe(h, p + "mlp.", i, positions, routing)
        return x + self.mlp(h, p + "mlp.")

    def lm_head(self):
        if self.ckpt.has("lm_head.weight"):
            return self.w("lm_head.weight")
        return self.w("model.embed_tokens.weight")

    def forward(self, tokens, cache=None, attn="naive", routing=None):
        """tokens appended at cache.pos..; returns (logits (T, vocab), hidden
        after the final norm (T, hidden))."""
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        if cache is None:
            cache = Cache(cfg.num_hidden_layers)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        positions = np.arange(cache.pos, cache.pos + len(tokens))
        x = self.w("model.embed_tokens.weight")[tokens]
        for i in range(cfg.num_hidden_layers):
            x = self.block(i, x, positions, cache.layers[i], attn, routing)
        cache.pos += len(tokens)
        h = rmsnorm(x, self.w("model.norm.weight"), cfg.rms_norm_eps)
        return h @ self.lm_head().T, h

    def forward_incremental(self, tokens, attn="naive", chunks=None):
        """Token by token (or in the given chunk sizes) through one cache."""
        cache = Cache(self.cfg.num_hidden_layers)
        sizes = chunks or [1] * len(tokens)
        out, at = [], 0
        for n in sizes:
            logits, _ = self.forward(tokens[at : at + n], cache, attn)
            out.append(logits)
            at += n
        return np.concatenate(out, axis=0)

    # -- MTP (DeepSeek-V3 multi-token prediction layer k)
    def mtp_forward(self, tokens, hidden, k=0, attn="naive", routing=None):
        """tokens (T,), hidden: main model final-normed hidden (T, D).
        Returns logits (T-1, vocab): row i predicts token i+2 from h_i and
        the embedding of token i+1."""
        cfg = self.cfg
        li = cfg.num_hidden_layers + k
        p = f"model.layers.{li}."
        emb_name = p + "embed_tokens.weight" if self.ckpt.has(p + "embed_tokens.weight") else "model.embed_tokens.weight"
        tokens = np.asarray(tokens, dtype=np.int64)
        e = rmsnorm(self.w(emb_name)[tokens[1:]], self.w(p + "enorm.weight"), cfg.rms_norm_eps)
        hh = rmsnorm(hidden[:-1], self.w(p + "hnorm.weight"), cfg.rms_norm_eps)
        x = np.concatenate([e, hh], axis=-1) @ self.w(p + "eh_proj.weight").T
        positions = np.arange(len(tokens) - 1)
        x = self.block(li, x, positions, LayerCache(), attn, routing)
        x = rmsnorm(x, self.w(p + "shared_head.norm.weight"), cfg.rms_norm_eps)
        head = self.w(p + "shared_head.head.weight") if self.ckpt.has(p + "shared_head.head.weight") else self.lm_head()
        return x @ head.T


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated ids")
    ap.add_argument("--out", help="write float64 logits [T, vocab] as .npy")
    ap.add_argument("--attn", default="naive", choices=["naive", "absorbed"])
    ap.add_argument("--incremental", action="store_true", help="token by token through the cache")
    ap.add_argument("--top", type=int, default=5, help="print each position's top K as JSON (0: none)")
    args = ap.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    ref = DeepSeekRef(args.model)
    if args.incremental:
        logits = ref.forward_incremental(tokens, args.attn)
    else:
        logits, _ = ref.forward(tokens, attn=args.attn)
    if args.out:
        np.save(args.out, logits)
    if args.top:
        rows = []
        for t in range(logits.shape[0]):
            ids = topk_indices(logits[t], args.top)
            rows.append({"pos": t, "ids": ids.tolist(), "logits": [float(logits[t, i]) for i in ids]})
        print(json.dumps({"tokens": tokens, "positions": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
