#!/usr/bin/python3
"""
fake_moeq.py - a stand-in for the two `moeq` subcommands compare_engine.py
drives (`gen-model`, `logits --top 0`), built from make_ckpt.py and the
reference with float32 rounding, so the comparison harness itself is tested
(test_reference_self.py) without the C engine. Not a model of the engine.

  fake_moeq.py gen-model --preset tiny|tiny-v2 --out DIR [--dtype bf16|f8|f32]
  fake_moeq.py logits --model DIR --tokens IDS --top 0
  fake_moeq.py generate --model DIR --tokens IDS --max-new-tokens N   (greedy)
Environment FAKE_MOEQ_BREAK=yarn|groups makes `logits` drop that feature.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref as dr  # noqa: E402
import make_ckpt  # noqa: E402

KINDS = {"tiny": "v3", "tiny-v2": "v2", "lite": "v2-lite"}


def main():
    cmd = sys.argv[1]
    ap = argparse.ArgumentParser()
    if cmd == "gen-model":
        ap.add_argument("--preset", required=True)
        ap.add_argument("--out", required=True)
        ap.add_argument("--dtype", default="bf16")
        a = ap.parse_args(sys.argv[2:])
        make_ckpt.write(a.out, KINDS[a.preset], a.dtype, seed=11)
        return 0
    if cmd in ("logits", "generate"):
        ap.add_argument("--model", required=True)
        ap.add_argument("--tokens", required=True)
        ap.add_argument("--top", type=int, default=0)
        ap.add_argument("--max-new-tokens", type=int, default=32)
        a = ap.parse_args(sys.argv[2:])
        ref = dr.DeepSeekRef(a.model)
        brk = os.environ.get("FAKE_MOEQ_BREAK")
        if brk == "yarn":
            ref.rope = dr.Rope(dr.Config(dict(ref.cfg.raw, rope_scaling=None)))
        elif brk == "groups":
            ref.cfg.n_group = ref.cfg.topk_group = 1
        tokens = [int(t) for t in a.tokens.split(",")]
        if cmd == "generate":
            cache, out = dr.Cache(ref.cfg.num_hidden_layers), []
            logits, _ = ref.forward(tokens, cache)
            for _ in range(a.max_new_tokens):
                out.append(int(np.argmax(logits[-1].astype(np.float32))))
                if out[-1] == ref.cfg.raw.get("eos_token_id"):
                    break
                logits, _ = ref.forward(out[-1:], cache)
            print(json.dumps({"prompt_tokens": tokens, "tokens": out}))
            return 0
        logits, _ = ref.forward(tokens)
        logits = logits.astype(np.float32)
        print(json.dumps({"positions": [{"pos": t, "logits": [float(v) for v in logits[t]]}
                                        for t in range(len(tokens))]}))
        return 0
    print(f"fake_moeq: unknown command {cmd}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
