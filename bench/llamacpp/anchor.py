#!/usr/bin/env python3
"""bench/llamacpp/anchor.py — moeq's bench-engine and llama.cpp on the same checkpoint, in one run.

Usage (scripts/bench-cpu-anchor.sh is the front door):
  anchor.py --build BUILD_DIR [--threads 2] [--min-seconds 3] [--work DIR] MODEL_DIR...

For each MODEL_DIR (a moeq / HF DeepSeek-V3 checkpoint): converts it to GGUF
(convert.py; BF16 -> BF16, FP8 -> Q8_0 of the same weights; cached in --work),
runs bench-engine (prefill 512 with decode at batch 1, 8, 32, 128; prefill 2048)
and bench.mjs (llama.cpp through node-llama-cpp: the same prompts, thread count
and batches), checks that both run the same model (greedy tokens and the
per-position top-5 of one prompt), and prints ONE JSON document: each side's
figures, the ratios moeq / llama.cpp, the agreement, and the raw outputs.

--rounds R (default 1) runs the two sides R times each, alternating (moeq, llama.cpp,
llama.cpp, moeq, ...): a shared VM's speed drifts over minutes, and a ratio of two
figures taken minutes apart carries the drift. Each round's figures make one paired
ratio; the ratios reported are the medians of those, with their range (the agreement
is checked on the first round of each side).

The ratios compare moeq's default mode (batch_invariant_1; batch_invariant_0 is in
the raw output). moeq decodes as a server does: a greedy row is decided by the
screened head (docs/ENGINE.md); decode_b*_head_whole are the same batches with
every logits row whole (head_screen = off), as llama.cpp computes them. Figures depend on the machine and on what else runs on it: quote
ratios from one run of this script, not absolute numbers across runs.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BATCHES = (1, 8, 32, 128)
PREFILLS = (512, 2048)
AGREE_PROMPT_LEN = 32
GREEDY_TOKENS = 8


def ids_for(n, salt, vocab):
    """bench/engine.c ids_for(): prompt ids that skip bos/eos."""
    return [(i * 7919 + salt * 104729 + 3) % (vocab - 2) + 2 for i in range(n)]


def run_json(cmd, what):
    """Run cmd, parse its stdout as one JSON document; a failure names the command and its stderr."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"anchor: {what} failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise SystemExit(f"anchor: {what}: output is not JSON ({e}): {p.stdout[:500]}")
    print(f"anchor: {what}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return out


def checkpoint_kind(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        hp = json.load(f)
    fp8 = (hp.get("quantization_config") or {}).get("quant_method") == "fp8"
    return hp, ("fp8", "q8_0") if fp8 else ("bf16", "bf16")


def gguf_for(model_dir, work, outtype):
    """The converted GGUF, converted again only when a checkpoint file is newer."""
    name = os.path.basename(os.path.normpath(model_dir))
    out = os.path.join(work, f"{name}.{outtype}.gguf")
    newest = max(os.path.getmtime(os.path.join(model_dir, f)) for f in os.listdir(model_dir))
    if os.path.exists(out) and os.path.getmtime(out) >= newest and os.path.getmtime(out) >= os.path.getmtime(
            os.path.join(HERE, "convert.py")):
        return out, {"out": out, "cached": True}
    os.makedirs(work, exist_ok=True)
    info = run_json([sys.executable, os.path.join(HERE, "convert.py"), model_dir, out + ".tmp", "--outtype", "auto"],
                    f"convert {name}")
    os.replace(out + ".tmp", out)
    info["out"] = out
    return out, info


def moeq_side(a, model_dir, prompt):
    bench = os.path.join(a.build, "bench", "bench-engine")
    moeq = os.path.join(a.build, "cli", "moeq")
    common = [bench, "--model", model_dir, "--threads", str(a.threads), "--contexts", "1"]
    if a.cpu_matrix:
        common += ["--cpu-matrix", a.cpu_matrix]
    # --head-screen both: decode as a server does (greedy rows decided by the screened head) and again with every
    # logits row whole, as llama.cpp computes them: both ratios in one run
    main = run_json(common + ["--prefill-tokens", str(PREFILLS[0]), "--batches", ",".join(map(str, BATCHES)),
                              "--min-seconds", str(a.min_seconds), "--head-screen", "both"],
                    "bench-engine (prefill 512, decode)")
    long = run_json(common + ["--prefill-tokens", str(PREFILLS[1]), "--batches", "1", "--min-seconds", "0.2"],
                    "bench-engine (prefill 2048)")
    toks = ",".join(map(str, prompt))
    greedy = run_json([moeq, "generate", "--model", model_dir, "--tokens", toks, "--max-new-tokens",
                       str(GREEDY_TOKENS), "--threads", str(a.threads)], "moeq generate")
    logits = run_json([moeq, "logits", "--model", model_dir, "--tokens", toks, "--top", "5", "--threads",
                       str(a.threads)], "moeq logits")
    mode = main["modes"]["batch_invariant_1"]
    return {
        "prefill": {"512": mode["prefill_tokens_per_s"],
                    "2048": long["modes"]["batch_invariant_1"]["prefill_tokens_per_s"]},
        "decode": {str(d["batch"]): d["tokens_per_s"] for d in mode["decode"]},
        "decode_head_whole": {str(d["batch"]): d["tokens_per_s"] for d in mode.get("decode_head_whole", [])},
        "head_screen": mode.get("head_screen"),
        "backend_info": mode.get("backend_info"),
        "greedy": greedy.get("tokens"),
        "raw": {"bench_engine": main, "bench_engine_prefill_2048": long, "logits": logits},
    }


def llama_side(a, gguf, prompt):
    cmd = ["node", os.path.join(HERE, "bench.mjs"), "--model", gguf, "--threads", str(a.threads),
           "--prefill", ",".join(map(str, PREFILLS)), "--batches", ",".join(map(str, BATCHES)),
           "--min-seconds", str(a.min_seconds), "--greedy-prompt", ",".join(map(str, prompt)),
           "--greedy-tokens", str(GREEDY_TOKENS), "--top", "5"]
    out = run_json(cmd, "llama.cpp (node-llama-cpp)")
    return {
        "prefill": {str(p["tokens"]): p["tokens_per_s"] for p in out["prefill"]},
        "decode": {str(d["batch"]): d["tokens_per_s"] for d in out["decode"]},
        "tokens_per_llama_decode": {str(d["batch"]): d.get("tokens_per_llama_decode") for d in out["decode"]},
        "greedy": out["greedy"]["tokens"],
        "build": {k: out[k] for k in ("runtime", "llama_cpp_release", "build_type", "cpu_backend", "system_info")},
        "raw": out,
    }


def agreement(moeq_logits, llama_positions, moeq_greedy, llama_greedy):
    """Loose on purpose: both sides compute in BF16 / 8-bit with other reduction orders, and a
    random-weight MoE's router has near-ties, so a rounding difference may pick another expert
    and move a position's logits (and, through its KV entries, later positions') a lot. On the
    bench preset moeq's own BF16 and FP8 checkpoints (the same model, rounded apart by FP8)
    agree on 25 % of top-1s; a wrong conversion (a transposed or misnamed tensor) agrees on
    none (1 in 129,280 by chance). The greedy continuations are reported, not required to
    match: one near-tie changes the rest."""
    m_pos = moeq_logits["positions"]
    n = min(len(m_pos), len(llama_positions))
    top1 = sum(m_pos[i]["ids"][0] == llama_positions[i]["ids"][0] for i in range(n))
    in5 = sum(m_pos[i]["ids"][0] in llama_positions[i]["ids"] and llama_positions[i]["ids"][0] in m_pos[i]["ids"]
              for i in range(n))
    prefix = 0
    while prefix < min(len(moeq_greedy), len(llama_greedy)) and moeq_greedy[prefix] == llama_greedy[prefix]:
        prefix += 1
    same = n > 0 and top1 / n >= 0.3 and in5 / n >= 0.5
    return {"positions": n, "top1_agree": round(top1 / n, 3) if n else 0,
            "top1_in_other_top5": round(in5 / n, 3) if n else 0,
            "greedy_common_prefix": prefix, "greedy_tokens": len(moeq_greedy), "same_model": same}


def ratios(moeq, llama):
    r = {}
    for p in map(str, PREFILLS):
        if llama["prefill"].get(p):
            r[f"prefill_{p}"] = round(moeq["prefill"][p] / llama["prefill"][p], 3)
    for b in map(str, BATCHES):
        if llama["decode"].get(b) and b in moeq["decode"]:
            r[f"decode_b{b}"] = round(moeq["decode"][b] / llama["decode"][b], 3)
    for b in map(str, BATCHES):  # every logits row whole on both sides (moeq's head_screen = off)
        if llama["decode"].get(b) and b in moeq.get("decode_head_whole", {}):
            r[f"decode_b{b}_head_whole"] = round(moeq["decode_head_whole"][b] / llama["decode"][b], 3)
    return r


def figures(side):
    """A side's figures without its raw outputs."""
    return {k: v for k, v in side.items() if k != "raw"}


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def one_model(a, model_dir):
    hp, (moeq_dtype, llama_type) = checkpoint_kind(model_dir)
    prompt = ids_for(AGREE_PROMPT_LEN, 3, hp["vocab_size"])
    gguf, conv = gguf_for(model_dir, a.work, llama_type)
    pair = f"moeq {moeq_dtype} vs llama.cpp {llama_type}"
    moeqs, llamas = [], []
    for r in range(a.rounds):
        # ABBA order: a drift in the machine's speed over the run weighs on both sides alike
        order = ("moeq", "llama") if r % 2 == 0 else ("llama", "moeq")
        for side in order:
            if a.rounds > 1:
                print(f"anchor: {model_dir}: round {r + 1}/{a.rounds}: {side}", file=sys.stderr)
            if side == "moeq":
                moeqs.append(moeq_side(a, model_dir, prompt))
                continue
            try:
                llamas.append(llama_side(a, gguf, prompt))
            except SystemExit as e:  # llama.cpp failed on this model: keep moeq's figures and say why
                print(str(e), file=sys.stderr)  # round 1 runs moeq first: moeqs[0] is there
                return {"model_dir": model_dir, "pair": pair, "conversion": conv,
                        "llama_cpp_error": str(e)[-600:], "agreement": {"same_model": None},
                        "moeq": figures(moeqs[0]), "raw": {"moeq": moeqs[0]["raw"]}}
    moeq, llama = moeqs[0], llamas[0]
    agree = agreement(moeq["raw"]["logits"], llama["raw"]["greedy"]["positions"], moeq["greedy"], llama["greedy"])
    if not agree["same_model"]:
        print(f"anchor: warning: {model_dir}: moeq and llama.cpp disagree ({agree}); check the conversion",
              file=sys.stderr)
    per_round = [ratios(m, l) for m, l in zip(moeqs, llamas)]
    out = {"model_dir": model_dir, "pair": pair, "conversion": conv,
           "ratio_moeq_over_llama_cpp": {k: round(median([r[k] for r in per_round]), 3) for k in per_round[0]},
           "agreement": agree}
    if a.rounds > 1:
        out["ratio_range"] = {k: [min(r[k] for r in per_round), max(r[k] for r in per_round)] for k in per_round[0]}
        out["ratio_rounds"] = per_round
    out.update({
        "moeq": figures(moeq),
        "llama_cpp": figures(llama),
        "raw": {"moeq": moeq["raw"], "llama_cpp": llama["raw"]},
    })
    if a.rounds > 1:
        out["rounds"] = [{"moeq": figures(m), "llama_cpp": figures(l)} for m, l in zip(moeqs, llamas)]
    return out


def host():
    flags, model = set(), None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                elif line.startswith("model name") and model is None:
                    model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    keep = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
    return {"cpu": model or platform.processor(), "cores_online": os.cpu_count(),
            "isa": [f for f in keep if f in flags]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", metavar="MODEL_DIR")
    ap.add_argument("--build", required=True, help="moeq build folder (bench/bench-engine, cli/moeq)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-matrix", default=None, choices=["auto", "lanes", "amx"],
                    help="moeq's CPU matrix path (engine key cpu_matrix; default: the engine's, auto)")
    ap.add_argument("--min-seconds", type=float, default=3.0, help="decode: time each batch at least this long")
    ap.add_argument("--work", default=None, help="where converted GGUFs are kept (default BUILD/llamacpp)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each side this many times, alternating; ratios are medians of the paired rounds")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    a.work = a.work or os.path.join(a.build, "llamacpp")
    doc = {"anchor": "cpu: moeq bench-engine vs llama.cpp, same checkpoint, one run", "threads": a.threads,
           "rounds": a.rounds,
           "min_seconds": a.min_seconds, "host": host(), "load_average_at_start": list(os.getloadavg()),
           "runs": [one_model(a, os.path.abspath(m)) for m in a.models]}
    doc["load_average_at_end"] = list(os.getloadavg())
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    if any("llama_cpp_error" in r for r in doc["runs"]):
        return 3
    return 0 if all(r["agreement"]["same_model"] for r in doc["runs"]) else 2


if __name__ == "__main__":
    sys.exit(main())
