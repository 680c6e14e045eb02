#!/usr/bin/python3
"""
test_reference_self.py - self-checks of the float64 reference, needing no
engine: dtype decode tables, F8 block scales, sharded loading, YaRN and the
RoPE layout, MLA naive vs absorbed, prefill vs incremental decode, routing
edge cases, the MTP layer. Checkpoints come from make_ckpt.py (numpy only).

Run: /usr/bin/python3 tests/reference/test_reference_self.py [-v]
"""

import math
import os
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deepseek_ref as dr  # noqa: E402
import make_ckpt  # noqa: E402
import safetensors_np as st  # noqa: E402

TOKENS = [3, 17, 42, 5, 99, 120, 7, 7, 64, 200, 11, 150, 2, 31, 77, 101, 18, 9, 44, 240, 8, 13]


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(1.0, np.max(np.abs(b))))


class DtypeTables(unittest.TestCase):
    def test_e4m3fn_decodes_known_values(self):
        known = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x38: 1.0, 0x3C: 1.5,
                 0x40: 2.0, 0x7E: 448.0, 0x77: 240.0, 0x30: 0.5, 0x80: -0.0, 0xB8: -1.0, 0xFE: -448.0,
                 0x81: -(2.0 ** -9), 0x0F: 2.0 ** -6 * 1.875}
        for byte, val in known.items():
            self.assertEqual(st.E4M3FN_TABLE[byte], val, hex(byte))
        self.assertTrue(math.copysign(1.0, st.E4M3FN_TABLE[0x80]) < 0)
        self.assertTrue(np.isnan(st.E4M3FN_TABLE[0x7F]) and np.isnan(st.E4M3FN_TABLE[0xFF]))
        self.assertEqual(int(np.isnan(st.E4M3FN_TABLE).sum()), 2)
        # 0x78..0x7e are finite (no infinities in the fn variant)
        self.assertTrue(np.all(np.isfinite(st.E4M3FN_TABLE[0x78:0x7F])))
        pos = st.E4M3FN_TABLE[:0x7F]
        self.assertTrue(np.all(np.diff(pos) > 0), "non-negative codes ascend")

    def test_e4m3_encoder_round_trips_and_rounds_to_nearest(self):
        codes = np.arange(256, dtype=np.uint8)
        finite = ~np.isnan(st.E4M3FN_TABLE)
        back = st.f64_to_e4m3_bits(st.E4M3FN_TABLE[finite])
        self.assertTrue(np.array_equal(st.E4M3FN_TABLE[back], st.E4M3FN_TABLE[codes[finite]]))
        self.assertEqual(st.E4M3FN_TABLE[st.f64_to_e4m3_bits(np.array([1.0624]))[0]], 1.0)   # 1 + 1/16 - eps
        self.assertEqual(st.E4M3FN_TABLE[st.f64_to_e4m3_bits(np.array([1000.0]))[0]], 448.0)  # saturates

    def test_bf16_decodes_known_values(self):
        bits = np.array([0x3F80, 0xC000, 0x4049, 0x0001, 0x7F80, 0xFF80, 0x8000, 0x3E80], dtype=np.uint16)
        vals = st.bf16_to_f64(bits)
        want = [1.0, -2.0, 3.140625, 2.0 ** -133, np.inf, -np.inf, -0.0, 0.25]
        for v, w in zip(vals, want):
            self.assertEqual(v, w)
        self.assertTrue(np.isnan(st.bf16_to_f64(np.array([0x7FC0], dtype=np.uint16)))[0])
        # round to nearest even on encode
        self.assertEqual(st.f64_to_bf16_bits(np.array([1.0 + 2.0 ** -8]))[0], 0x3F80)       # tie -> even
        self.assertEqual(st.f64_to_bf16_bits(np.array([1.0 + 3 * 2.0 ** -8]))[0], 0x3F82)   # tie -> even (up)

    def test_f16_decodes(self):
        raw = np.array([1.0, -2.5, 65504.0, 2.0 ** -24], dtype="<f2").tobytes()
        self.assertEqual(st.decode("F16", raw, (4,)).tolist(), [1.0, -2.5, 65504.0, 2.0 ** -24])

    def test_block_scale_applies_per_128x128_block_with_partial_edges(self):
        rng = np.random.default_rng(0)
        w = rng.standard_normal((200, 300)) * np.linspace(0.1, 10, 300)[None, :]
        q, scale = st.quantize_f8_blocks(w)
        self.assertEqual(scale.shape, (2, 3))
        deq = st.apply_block_scale(st.f8_e4m3_to_f64(q), scale.astype(np.float64))
        for (i, j) in [(0, 0), (127, 128), (128, 127), (199, 299), (150, 260)]:
            self.assertEqual(deq[i, j], st.E4M3FN_TABLE[q[i, j]] * float(scale[i // 128, j // 128]))
        self.assertLess(np.max(np.abs(deq - w) / (np.abs(w) + 1e-3 * np.max(np.abs(w)))), 0.07)
        with self.assertRaises(ValueError):
            st.apply_block_scale(st.f8_e4m3_to_f64(q), np.ones((1, 3)))


class Loading(unittest.TestCase):
    def test_f32_bf16_f8_sharded_checkpoints_load_what_was_written(self):
        with tempfile.TemporaryDirectory() as d:
            for dtype, shards in [("f32", 1), ("bf16", 3), ("f8", 2)]:
                out = os.path.join(d, f"{dtype}{shards}")
                cfg, held = make_ckpt.write(out, "v3", dtype, seed=3, shards=shards)
                ck = st.Checkpoint(out)
                self.assertEqual(sorted(ck.names()), sorted(held))
                for name, arr in held.items():
                    self.assertTrue(np.array_equal(ck.get(name), arr), f"{dtype}: {name}")
                if dtype == "f8":
                    self.assertEqual(ck.dtype("model.layers.0.self_attn.q_a_proj.weight"), "F8_E4M3")

    def test_dequantised_bf16_and_f8_stay_close_to_f32_logits(self):
        with tempfile.TemporaryDirectory() as d:
            logits = {}
            for dtype in ["f32", "bf16", "f8"]:
                make_ckpt.write(os.path.join(d, dtype), "v3", dtype, seed=5)
                logits[dtype], _ = dr.DeepSeekRef(os.path.join(d, dtype)).forward(TOKENS[:8])
            self.assertLess(rel_err(logits["bf16"], logits["f32"]), 0.1)
            self.assertEqual(int(np.mean(np.argmax(logits["bf16"], -1) == np.argmax(logits["f32"], -1)) * 8) >= 6,
                             True)


class Rope(unittest.TestCase):
    def test_yarn_blend_and_mscales_follow_the_formulas(self):
        cfg = dr.Config(make_ckpt.CONFIGS["v3"])
        r = dr.Rope(cfg)
        dim, base = 8, 10000.0
        extra = 1.0 / base ** (np.arange(0, dim, 2) / dim)
        inter = extra / 4.0
        lo, hi = dr.yarn_find_correction_range(32, 1, dim, base, 16)
        self.assertEqual((r.low, r.high), (lo, hi))
        for i in range(dim // 2):
            ramp = min(max((i - lo) / (hi - lo if hi != lo else 0.001), 0.0), 1.0)
            self.assertAlmostEqual(r.inv_freq[i], inter[i] * ramp + extra[i] * (1 - ramp), places=15)
        # V3-style mscale == mscale_all_dim: cos/sin unscaled, softmax scale * m^2
        self.assertEqual(r.mscale, 1.0)
        m = 0.1 * math.log(4.0) + 1.0
        self.assertAlmostEqual(r.softmax_scale, 24 ** -0.5 * m * m, places=15)
        r2 = dr.Rope(dr.Config(dict(make_ckpt.CONFIGS["v3"], rope_scaling={"type": "yarn", "factor": 40.0,
                                                                            "original_max_position_embeddings": 4096,
                                                                            "mscale": 1.0, "mscale_all_dim": 0})))
        self.assertAlmostEqual(r2.mscale, 0.1 * math.log(40.0) + 1.0, places=15)
        self.assertAlmostEqual(r2.softmax_scale, 24 ** -0.5, places=15)
        r3 = dr.Rope(dr.Config(make_ckpt.CONFIGS["v2-lite"]))
        self.assertFalse(r3.yarn)

    def test_hf_and_inference_correction_ranges_differ_where_expected(self):
        # dim 8, base 1e4, original 64 (gen-model's tiny): correction dims -0.497 and 1.008
        cfg = dr.Config(dict(make_ckpt.CONFIGS["v3"], rope_scaling={
            "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0}))
        hf, rd = dr.Rope(cfg), dr.Rope(cfg, correction="round")
        self.assertEqual((hf.low, hf.high), (0, 2))   # floor / ceil
        self.assertEqual((rd.low, rd.high), (0, 1))   # round
        self.assertAlmostEqual(hf.inv_freq[1], 0.5 * (0.1 + 0.1 / 4), places=15)  # ramp 0.5 at dim 1

    def test_hf_layout_gives_the_same_scores_as_complex_pair_rotation(self):
        """inference/model.py rotates (x[2i], x[2i+1]) as a complex number;
        HF de-interleaves then rotate_half. q.k must agree."""
        cfg = dr.Config(make_ckpt.CONFIGS["v3"])
        r = dr.Rope(cfg)
        rng = np.random.default_rng(1)
        q, k = rng.standard_normal((5, 8)), rng.standard_normal((5, 8))
        pos = np.array([0, 3, 17, 40, 100])
        hq, hk = r.apply(q, pos), r.apply(k, pos)
        cis = np.exp(1j * np.outer(pos, r.inv_freq)) * r.mscale
        cq = (q[:, 0::2] + 1j * q[:, 1::2]) * cis
        ck = (k[:, 0::2] + 1j * k[:, 1::2]) * cis
        cqr = np.stack([cq.real, cq.imag], -1).reshape(5, 8)
        ckr = np.stack([ck.real, ck.imag], -1).reshape(5, 8)
        self.assertLess(np.max(np.abs(hq @ hk.T - cqr @ ckr.T)), 1e-12)
        # and the HF output is the complex result, de-interleaved
        self.assertLess(np.max(np.abs(hq - np.concatenate([cqr[:, 0::2], cqr[:, 1::2]], -1))), 1e-12)


class Forward(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.refs = {}
        for kind in ["v3", "v2", "v2-lite"]:
            out = os.path.join(cls.tmp.name, kind)
            make_ckpt.write(out, kind, "bf16", seed=7)
            cls.refs[kind] = dr.DeepSeekRef(out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_naive_and_absorbed_mla_agree(self):
        for kind, ref in self.refs.items():
            a, _ = ref.forward(TOKENS, attn="naive")
            b, _ = ref.forward(TOKENS, attn="absorbed")
            self.assertLess(rel_err(b, a), 1e-12, kind)

    def test_prefill_equals_token_by_token_and_chunked_decode(self):
        for kind, ref in self.refs.items():
            full, _ = ref.forward(TOKENS)
            for attn in ["naive", "absorbed"]:
                inc = ref.forward_incremental(TOKENS, attn)
                self.assertLess(rel_err(inc, full), 1e-12, f"{kind} {attn}")
            chunked = ref.forward_incremental(TOKENS, "absorbed", chunks=[5, 1, 7, 9])
            self.assertLess(rel_err(chunked, full), 1e-12, kind)

    def test_logits_are_peaked_and_differ_by_model(self):
        for kind, ref in self.refs.items():
            logits, _ = ref.forward(TOKENS)
            self.assertEqual(logits.shape, (len(TOKENS), ref.cfg.vocab_size))
            self.assertTrue(np.all(np.isfinite(logits)))
            self.assertGreater(float(np.mean(np.max(logits, -1) - np.median(logits, -1))), 1.0, kind)

    def test_group_limited_routing_is_active_on_the_grouped_kinds(self):
        for kind in ["v3", "v2"]:
            routing = dr.Routing()
            self.refs[kind].forward(TOKENS, routing=routing)
            differ = sum(r["experts"] != r["ungrouped"] for r in routing.rows)
            self.assertGreater(differ, 0, kind)
            self.assertFalse(any(r["hf_fill_differs"] for r in routing.rows), kind)
        routing = dr.Routing()
        self.refs["v2-lite"].forward(TOKENS, routing=routing)
        self.assertTrue(all(r["experts"] == r["ungrouped"] for r in routing.rows))
        self.assertEqual(sorted({r["layer"] for r in routing.rows}), [2])  # moe_layer_freq 2, first dense 1

    def test_yarn_changes_logits(self):
        ref = self.refs["v3"]
        base, _ = ref.forward(TOKENS)
        saved = ref.rope
        try:
            ref.rope = dr.Rope(dr.Config(dict(ref.cfg.raw, rope_scaling=None)))
            plain, _ = ref.forward(TOKENS)
        finally:
            ref.rope = saved
        self.assertGreater(rel_err(plain, base), 1e-3)

    def test_mtp_layer_runs_and_uses_its_own_head(self):
        ref = self.refs["v3"]
        logits, h = ref.forward(TOKENS)
        m = ref.mtp_forward(TOKENS, h)
        self.assertEqual(m.shape, (len(TOKENS) - 1, ref.cfg.vocab_size))
        m2 = ref.mtp_forward(TOKENS, h, attn="absorbed")
        self.assertLess(rel_err(m2, m), 1e-12)
        # causal: the MTP row i depends only on tokens <= i+1
        m_short = ref.mtp_forward(TOKENS[:6], h[:6])
        self.assertLess(rel_err(m_short, m[:5]), 1e-12)


def _gate_model(cfg_over, gate_w, bias=None):
    cfg = dict(make_ckpt.CONFIGS["v3"])
    cfg.update(cfg_over)
    w = {"model.layers.1.mlp.gate.weight": gate_w}
    if bias is not None:
        w["model.layers.1.mlp.gate.e_score_correction_bias"] = bias
    return dr.DeepSeekRef(config=cfg, weights=w)


def _logit_for(p):
    return np.log(p / (1 - p))


class Routing(unittest.TestCase):
    """The gate on crafted scores: x = e_0 and gate rows chosen so that the
    pre-activation logits are exactly the values we want."""

    def gate(self, cfg_over, logits, bias=None):
        E = len(logits)
        D = 4
        gw = np.zeros((E, D))
        gw[:, 0] = logits
        ref = _gate_model(dict(cfg_over, n_routed_experts=E, hidden_size=D), gw, bias)
        x = np.zeros((1, D))
        x[0, 0] = 1.0
        routing = dr.Routing()
        idx, w = ref.gate(x, "model.layers.1.mlp.", 1, np.array([0]), routing)
        order = np.argsort(idx[0])
        return idx[0][order].tolist(), w[0][order], routing.rows[0]

    def test_v3_group_score_is_sum_of_top2_not_max(self):
        # 4 groups of 2; group 0 has the single best expert but a weak partner.
        s = np.array([0.95, 0.05, 0.6, 0.6, 0.55, 0.55, 0.1, 0.1])
        idx, w, row = self.gate({"n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "norm_topk_prob": True,
                                 "routed_scaling_factor": 2.5}, _logit_for(s), np.zeros(8))
        self.assertEqual(idx, [2, 3])              # groups 1 (1.2) and 2 (1.1) beat group 0 (1.0)
        self.assertEqual(row["ungrouped"], [0, 2])
        self.assertTrue(np.allclose(w, [1.25, 1.25], rtol=0, atol=1e-12))

    def test_v3_bias_chooses_but_weights_come_from_unbiased_scores(self):
        s = np.array([0.9, 0.8, 0.3, 0.2])
        bias = np.array([0.0, 0.0, 0.7, 0.0])  # expert 2 chosen (1.0) over 1 (0.8)
        idx, w, _ = self.gate({"n_group": 1, "topk_group": 1, "num_experts_per_tok": 2, "norm_topk_prob": True,
                               "routed_scaling_factor": 2.0}, _logit_for(s), bias)
        self.assertEqual(idx, [0, 2])
        self.assertTrue(np.allclose(w, 2.0 * np.array([0.9, 0.3]) / 1.2, rtol=0, atol=1e-12))

    def test_v3_without_norm_scales_raw_scores(self):
        s = np.array([0.9, 0.8, 0.3, 0.2])
        idx, w, _ = self.gate({"n_group": 1, "topk_group": 1, "num_experts_per_tok": 2, "norm_topk_prob": False,
                               "routed_scaling_factor": 2.0}, _logit_for(s), np.zeros(4))
        self.assertEqual(idx, [0, 1])
        self.assertTrue(np.allclose(w, [1.8, 1.6], rtol=0, atol=1e-12))

    def test_v3_masked_experts_are_excluded_even_when_biased_scores_are_negative(self):
        # groups {0,1,2},{3,4,5}; biased scores all negative. Group 0 (top-2 sum
        # -0.2) beats group 1 (-1.0), so only experts 0..2 may be chosen. HF's
        # masked_fill(0.0) would pick masked experts here (0.0 > -0.1);
        # inference/model.py's -inf does not. We exclude, and record it.
        s = np.array([0.5, 0.5, 0.4, 0.1, 0.1, 0.1])
        bias = np.full(6, -0.6)
        idx, w, row = self.gate({"n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
                                 "routed_scaling_factor": 1.0}, _logit_for(s), bias)
        self.assertEqual(idx, [0, 1])
        self.assertTrue(np.allclose(w, [0.5, 0.5], rtol=0, atol=1e-12))
        self.assertTrue(row["hf_fill_differs"])
        # positive biased scores: both fills agree
        idx, _, row = self.gate({"n_group": 2, "topk_group": 1, "num_experts_per_tok": 2}, _logit_for(s),
                                np.zeros(6))
        self.assertEqual(idx, [0, 1])
        self.assertFalse(row["hf_fill_differs"])

    def test_v2_group_limited_greedy_uses_group_max_and_applies_factor_only_unnormalised(self):
        logits = np.log(np.array([0.30, 0.01, 0.20, 0.19, 0.15, 0.15]))  # softmax of log p = p
        over = {"model_type": "deepseek_v2", "scoring_func": "softmax", "topk_method": "group_limited_greedy",
                "n_group": 3, "topk_group": 2, "num_experts_per_tok": 2, "routed_scaling_factor": 16.0}
        idx, w, row = self.gate(dict(over, norm_topk_prob=False), logits)
        self.assertEqual(idx, [0, 2])           # group max: g0 .30, g1 .20, g2 .15
        self.assertTrue(np.allclose(w, 16.0 * np.array([0.30, 0.20]), rtol=0, atol=1e-12))
        idx, w, _ = self.gate(dict(over, norm_topk_prob=True), logits)
        self.assertTrue(np.allclose(w, np.array([0.30, 0.20]) / 0.5, rtol=0, atol=1e-12))  # no factor
        idx, w, _ = self.gate(dict(over, topk_method="greedy"), logits)
        self.assertEqual(idx, [0, 2])
        idx, w, _ = self.gate(dict(over, topk_method="gready", num_experts_per_tok=3), logits)
        self.assertEqual(idx, [0, 2, 3])

    def test_top1_with_norm_is_not_normalised(self):
        s = np.array([0.9, 0.8, 0.3, 0.2])
        idx, w, _ = self.gate({"n_group": 1, "topk_group": 1, "num_experts_per_tok": 1, "norm_topk_prob": True,
                               "routed_scaling_factor": 2.0}, _logit_for(s), np.zeros(4))
        self.assertEqual(idx, [0])
        self.assertAlmostEqual(float(w[0]), 1.8, places=12)


class Harness(unittest.TestCase):
    """compare_engine.py against fake_moeq.py (the reference in float32):
    passes when faithful, fails when a feature is dropped."""

    def run_compare(self, cases, brk=None):
        import subprocess
        env = dict(os.environ)
        env.pop("FAKE_MOEQ_BREAK", None)
        if brk:
            env["FAKE_MOEQ_BREAK"] = brk
        p = subprocess.run([sys.executable, os.path.join(HERE, "compare_engine.py"), "--moeq",
                            os.path.join(HERE, "fake_moeq.py"), "--cases", cases],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=300)
        return p.returncode, p.stdout.decode()

    def test_harness_passes_a_faithful_float32_implementation(self):
        rc, out = self.run_compare("tiny:bf16,tiny:f8,tiny-v2:bf16")
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("PASS "), 3, out)

    def test_harness_catches_missing_yarn_and_missing_groups(self):
        for brk, case in [("yarn", "tiny:bf16"), ("groups", "tiny-v2:bf16")]:
            rc, out = self.run_compare(case, brk)
            self.assertEqual(rc, 1, out)
            self.assertIn("FAIL ", out)


if __name__ == "__main__":
    unittest.main()
