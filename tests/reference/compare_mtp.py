#!/usr/bin/env python3
"""compare_mtp.py - the engine's MTP-layer logits against the float64 reference.

For each case, writes a checkpoint with `moeq gen-model`, runs `moeq logits
--top 0 --mtp 1` (the engine's MTP logits at every position i < T-1: from
the main model's hidden at i, after its final norm, and token i+1) and
compares them with DeepSeekRef.mtp_forward(tokens, hidden) at every row:

    max_v |engine - ref| <= tol * max(1, max_v |ref|)     (tol 1e-4, as compare_engine.py)

Cases: tiny (random MTP layer, MoE) and tiny-mtp (the agreeing construction:
copied block, eh_proj = [I | 0]), bf16. --engine-args "--backend cuda" runs
`moeq logits` on that backend, with the same tolerance; --skip-without-device
as in compare_engine.py. Exit 0 when all pass, 1 otherwise, 77 (skipped)
without numpy or (--skip-without-device) without a device.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("skipped: no numpy")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepseek_ref import DeepSeekRef  # noqa: E402
from compare_engine import no_device_reason  # noqa: E402

TOL = float(os.environ.get("MOEQ_REF_TOL", "1e-4"))


def rows(entries, vocab):
    return np.array([e["logits"] for e in entries], dtype=np.float64).reshape(len(entries), vocab)


def run_case(moeq, work, preset, engine_args=(), n_tokens=40):
    d = os.path.join(work, preset)
    subprocess.run([moeq, "gen-model", "--preset", preset, "--out", d], check=True, capture_output=True)
    ref = DeepSeekRef(d)
    vocab = ref.cfg.vocab_size
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(2, vocab, n_tokens)]
    out = subprocess.run([moeq, "logits", "--model", d, "--tokens", ",".join(map(str, tokens)), "--top", "0",
                          "--mtp", "1"] + list(engine_args), check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    eng_main, eng_mtp = rows(doc["positions"], vocab), rows(doc["mtp_positions"], vocab)
    ref_main, hidden = ref.forward(tokens)
    ref_mtp = ref.mtp_forward(tokens, hidden)
    ok = True
    for name, e, r in (("main", eng_main, ref_main), ("mtp", eng_mtp, ref_mtp)):
        worst = 0.0
        for i in range(r.shape[0]):
            bound = TOL * max(1.0, float(np.abs(r[i]).max()))
            diff = float(np.abs(e[i] - r[i]).max())
            worst = max(worst, diff / bound * TOL)
            if diff > bound:
                print(f"{preset} {name} row {i}: max |diff| {diff:.3g} > {bound:.3g}")
                ok = False
        agree = float((e.argmax(-1) == r.argmax(-1)).mean())
        print(f"{preset} {name}: {r.shape[0]} rows, max rel diff {worst:.3g} (tol {TOL:g}), argmax agreement {agree:.3f}")
    mtp_vs_main = float((ref_mtp.argmax(-1) == ref_main[1:].argmax(-1)).mean())
    print(f"{preset}: reference MTP argmax == main argmax of the next position: {mtp_vs_main:.3f}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moeq", required=True)
    ap.add_argument("--work")
    ap.add_argument("--cases", default="tiny,tiny-mtp")
    ap.add_argument("--engine-args", default="", help='extra arguments for moeq logits, e.g. "--backend cuda"')
    ap.add_argument("--skip-without-device", action="store_true")
    args = ap.parse_args()
    engine_args = shlex.split(args.engine_args)
    work = args.work or tempfile.mkdtemp(prefix="moeq-mtp-ref-")
    os.makedirs(work, exist_ok=True)
    if args.skip_without_device:
        why = no_device_reason(args.moeq, work, engine_args)
        if why:
            print(f"SKIP: {why}")
            return 77
    if engine_args:
        print("engine: " + " ".join(engine_args))
    ok = all([run_case(args.moeq, work, c, engine_args) for c in args.cases.split(",")])
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
