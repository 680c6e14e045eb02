#!/usr/bin/env python3
"""Overwrite values of one tensor of a safetensors checkpoint in place (tests only).

usage: poke_weights.py DIR TENSOR ROW VALUE [COUNT]

Writes VALUE (a float: nan, inf, 3.4e38, ...) into COUNT elements (default 1;
0 = the whole row) of row ROW of TENSOR, in whichever *.safetensors file of
DIR holds it, in the tensor's own dtype (F32, BF16, F16). The tests use it on
a copy of a generated checkpoint to poison one embedding row (issue 11: a NaN
in the embedding crashed the engine; BF16 3.4e38 gave `ok` garbage).
Standard library only.
"""
import glob
import json
import os
import struct
import sys


def encode(value, dtype):
    if dtype == "F32":
        return struct.pack("<f", value)
    if dtype == "F16":
        return struct.pack("<e", value)
    if dtype == "BF16":  # the top half of the float32, truncated: 3.4e38 stays finite (0x7F7F), NaN stays NaN
        if value != value:
            return struct.pack("<H", 0x7FC0)
        return struct.pack("<H", struct.unpack("<I", struct.pack("<f", value))[0] >> 16)
    raise SystemExit(f"poke_weights: dtype {dtype} is not supported")


def main():
    if len(sys.argv) not in (5, 6):
        raise SystemExit(__doc__)
    model_dir, tensor, row, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    count = int(sys.argv[5]) if len(sys.argv) == 6 else 1
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with open(path, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            if tensor not in header:
                continue
            t = header[tensor]
            cols = t["shape"][-1]
            width = {"F32": 4, "BF16": 2, "F16": 2}[t["dtype"]]
            if count == 0 or count > cols:
                count = cols
            f.seek(8 + n + t["data_offsets"][0] + row * cols * width)
            f.write(encode(value, t["dtype"]) * count)
            return
    raise SystemExit(f"poke_weights: no tensor {tensor} in {model_dir}")


if __name__ == "__main__":
    main()
