#!/usr/bin/env python3
"""Where a CUDA engine step's time goes, from an Nsight Compute CSV (ncu --csv --page raw).

scripts/gpu-check.sh writes one (MOEQ_GPU_PROFILE=1: ncu over a short bench-engine run). Each engine step starts
with embed_kernel, whose grid's y is the step's token count, so the launches split into steps; steps of the same
token count are averaged, and each kernel's share of the step is printed with the bandwidth it reached
(dram__bytes_read.sum over its time).

  gpu-profile-summary.py ncu.csv [--top N] [--json out.json]
"""
import argparse
import collections
import csv
import json
import sys


def read_launches(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    head, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(head)}
    out = []
    for r in body:
        if len(r) != len(head) or not r[col["Kernel Name"]] or r[col.get("ID", 0)] in ("", "ID"):
            continue  # the units row
        get = lambda k: r[col[k]] if k in col else ""
        num = lambda k: float(get(k).replace(",", "") or 0)
        name = get("Kernel Name").split("(")[0].split("<")[0].replace("void ", "").strip()
        grid = get("Grid Size") or get("launch__grid_size")
        out.append({"name": name, "ns": num("gpu__time_duration.sum"), "bytes": num("dram__bytes_read.sum"),
                    "grid": grid, "block": get("Block Size") or get("launch__block_size")})
    return out


def tokens_of(grid):
    # "(x, y, z)" as ncu prints launch dimensions
    parts = grid.strip("()").replace(" ", "").split(",")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json")
    a = ap.parse_args()
    launches = read_launches(a.csv)
    if not launches:
        print("gpu-profile-summary: no kernel launches in %s" % a.csv)
        return 1
    steps, cur = [], None
    for l in launches:
        if l["name"] == "embed_kernel":
            cur = {"tokens": tokens_of(l["grid"]), "launches": []}
            steps.append(cur)
        if cur is not None:
            cur["launches"].append(l)
    by_tokens = collections.OrderedDict()
    for s in steps:
        by_tokens.setdefault(s["tokens"], []).append(s)
    report = []
    for T, group in by_tokens.items():
        n = len(group)
        total = sum(l["ns"] for s in group for l in s["launches"]) / n
        per = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for s in group:
            for l in s["launches"]:
                p = per[l["name"]]
                p[0] += l["ns"] / n
                p[1] += l["bytes"] / n
                p[2] += 1
        kernels = sorted(per.items(), key=lambda kv: -kv[1][0])
        print("step of %d tokens (%d steps): %.3f ms of kernels, %d launches a step" %
              (T, n, total * 1e-6, sum(p[2] for _, p in kernels) // n))
        for name, (ns, b, c) in kernels[: a.top]:
            print("  %-28s %6.1f %%  %8.1f us  %4d launches  %7.0f GB/s" %
                  (name, 100 * ns / total, ns * 1e-3, c // n, b / ns if ns else 0))
        report.append({"tokens": T, "steps": n, "kernel_ms": total * 1e-6,
                       "kernels": [{"name": k, "us": p[0] * 1e-3, "launches": p[2] // n,
                                    "dram_gb_s": p[1] / p[0] if p[0] else 0} for k, p in kernels]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
