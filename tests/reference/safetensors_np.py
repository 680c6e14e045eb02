"""
safetensors_np.py - read (and, for test fixtures, write) Hugging Face
safetensors checkpoints with nothing but numpy.

What it does: parses the safetensors header (8-byte little-endian length,
JSON, raw data), decodes F32 / F16 / BF16 / F8_E4M3 (e4m3fn) to float64, and
applies DeepSeek's block scales: a tensor `X` stored as F8_E4M3 has a float32
sibling `X_scale_inv` (for `foo.weight` that is `foo.weight_scale_inv`) of
shape [ceil(rows/128), ceil(cols/128)], and the weight is q * scale for every
128x128 block (DeepSeek's inference/fp8_cast_bf16.py and kernel.py
weight_dequant). A model directory holds `model.safetensors` or the shards
listed in `model.safetensors.index.json`.

What it deliberately does not do: anything clever. It shares no code or
tables with the C engine (engine/tensor.c, engine/safetensors.c); the decode
tables here are derived from the format definitions, so the engine can be
tested against them.
"""

import json
import math
import os
import struct

import numpy as np

F8_BLOCK = 128

# ---- dtype decoding -----------------------------------------------------------


def _e4m3fn_table():
    """float64[256]: e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa
    bits; no infinities; S.1111.111 is NaN; max finite 448)."""
    table = np.empty(256, dtype=np.float64)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exp = (byte >> 3) & 0xF
        man = byte & 0x7
        if exp == 0xF and man == 0x7:
            table[byte] = np.nan
        elif exp == 0:
            table[byte] = sign * math.ldexp(man / 8.0, -6)  # subnormal: 0.mmm * 2^(1-7)
        else:
            table[byte] = sign * math.ldexp(1.0 + man / 8.0, exp - 7)
    return table


E4M3FN_TABLE = _e4m3fn_table()


def bf16_to_f64(raw_u16):
    """uint16 array of bfloat16 bit patterns -> float64 (exact: bf16 is the top
    half of a float32)."""
    return (raw_u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f8_e4m3_to_f64(raw_u8):
    return E4M3FN_TABLE[raw_u8]


_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}


def decode(dtype, raw, shape):
    """Bytes (a memoryview/bytes of exactly the tensor) -> float64 ndarray."""
    if dtype == "F64":
        arr = np.frombuffer(raw, dtype="<f8").astype(np.float64)
    elif dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2").astype(np.float64)
    elif dtype == "BF16":
        arr = bf16_to_f64(np.frombuffer(raw, dtype="<u2"))
    elif dtype == "F8_E4M3":
        arr = f8_e4m3_to_f64(np.frombuffer(raw, dtype=np.uint8))
    elif dtype in ("I64", "I32", "I8", "U8"):
        arr = np.frombuffer(raw, dtype={"I64": "<i8", "I32": "<i4", "I8": "i1", "U8": "u1"}[dtype]).astype(np.float64)
    else:
        raise ValueError(f"unsupported safetensors dtype {dtype!r}")
    return arr.reshape(shape)


def apply_block_scale(q, scale_inv, block=F8_BLOCK):
    """q [rows, cols] float64 (decoded F8), scale_inv [ceil(rows/b), ceil(cols/b)]
    -> q * scale per b x b block."""
    rows, cols = q.shape
    want = (-(-rows // block), -(-cols // block))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"scale_inv shape {tuple(scale_inv.shape)} != {want} for weight {q.shape}")
    full = np.repeat(np.repeat(scale_inv, block, axis=0), block, axis=1)[:rows, :cols]
    return q * full


# ---- reading ------------------------------------------------------------------


class SafetensorsFile:
    """One .safetensors file: header parsed, data read lazily per tensor."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self.metadata = header.pop("__metadata__", {})
        self.entries = header  # name -> {dtype, shape, data_offsets}
        self.data_start = 8 + n
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")

    def names(self):
        return list(self.entries)

    def info(self, name):
        e = self.entries[name]
        return e["dtype"], tuple(e["shape"])

    def raw(self, name):
        e = self.entries[name]
        b, end = e["data_offsets"]
        nbytes = int(np.prod(e["shape"], dtype=np.int64)) * _ITEMSIZE[e["dtype"]]
        if end - b != nbytes:
            raise ValueError(f"{self.path}: tensor {name} has {end - b} bytes, shape needs {nbytes}")
        return self._mm[self.data_start + b : self.data_start + end].tobytes()

    def get(self, name):
        dtype, shape = self.info(name)
        return decode(dtype, self.raw(name), shape)


class Checkpoint:
    """A HF model directory: config.json + model.safetensors (or shards).

    get(name) returns float64 with F8 block scales applied; `_scale_inv`
    tensors are consumed by their weight and not listed by names()."""

    def __init__(self, model_dir):
        self.dir = model_dir
        with open(os.path.join(model_dir, "config.json")) as f:
            self.config = json.load(f)
        index = os.path.join(model_dir, "model.safetensors.index.json")
        files = {}
        self.where = {}
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            for name, fname in weight_map.items():
                if fname not in files:
                    files[fname] = SafetensorsFile(os.path.join(model_dir, fname))
                if name not in files[fname].entries:
                    raise KeyError(f"index lists {name} in {fname}, which lacks it")
                self.where[name] = files[fname]
        else:
            st = SafetensorsFile(os.path.join(model_dir, "model.safetensors"))
            for name in st.names():
                self.where[name] = st
        self.files = files
        self._cache = {}

    def names(self):
        return [n for n in self.where if not n.endswith("_scale_inv")]

    def has(self, name):
        return name in self.where

    def dtype(self, name):
        return self.where[name].info(name)[0]

    def get(self, name):
        if name in self._cache:
            return self._cache[name]
        st = self.where[name]
        dtype, _ = st.info(name)
        arr = st.get(name)
        if dtype == "F8_E4M3":
            sname = name + "_scale_inv"
            if sname not in self.where:
                raise KeyError(f"F8 tensor {name} has no {sname}")
            arr = apply_block_scale(arr, self.where[sname].get(sname))
        self._cache[name] = arr
        return arr


# ---- writing (test fixtures only) --------------------------------------------


def f64_to_bf16_bits(x):
    """float -> bfloat16 bits, round to nearest even (NaN kept quiet)."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    out[nan] = 0x7FC0
    return out


def f64_to_e4m3_bits(x):
    """float -> nearest e4m3fn byte (ties to even mantissa, saturating at 448)."""
    x = np.asarray(x, dtype=np.float64)
    finite = E4M3FN_TABLE.copy()
    finite[np.isnan(finite)] = np.inf
    pos_codes = np.arange(0, 0x7F)  # 0..0x7e: non-negative finite, ascending
    pos_vals = finite[pos_codes]
    a = np.minimum(np.abs(x), 448.0)
    idx = np.searchsorted(pos_vals, a)  # first value >= a
    idx = np.clip(idx, 1, len(pos_vals) - 1)
    lo, hi = pos_vals[idx - 1], pos_vals[idx]
    choose_hi = (hi - a < a - lo) | ((hi - a == a - lo) & (idx % 2 == 0))
    code = np.where(choose_hi, idx, idx - 1).astype(np.uint8)
    code = np.where(a == 0, 0, code).astype(np.uint8)
    sign = (np.signbit(x) & (code != 0)).astype(np.uint8) << 7
    return code | sign


def quantize_f8_blocks(w, block=F8_BLOCK):
    """w [rows, cols] -> (e4m3 bytes, scale_inv float32 [ceil(r/b), ceil(c/b)])
    with each block's amax mapped to 448 (DeepSeek's fp8 recipe)."""
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    scale = np.ones((br, bc), dtype=np.float32)
    q = np.zeros((rows, cols), dtype=np.uint8)
    for i in range(br):
        for j in range(bc):
            blk = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
            amax = float(np.max(np.abs(blk))) if blk.size else 0.0
            s = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
            scale[i, j] = s
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = f64_to_e4m3_bits(blk / float(s))
    return q, scale


def save_file(tensors, path, metadata=None):
    """tensors: name -> (dtype string, ndarray already in that storage type:
    float32/float16/uint16 bf16 bits/uint8 e4m3 bits)."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        np_dtype = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F8_E4M3": "u1", "F64": "<f8"}[dtype]
        b = np.ascontiguousarray(arr, dtype=np_dtype).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
