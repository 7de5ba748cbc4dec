"""Run the real llama.cpp quantizer (libllama's llama_model_quantize) for side-by-side checks.

Development-time only: run it with the interpreter of a venv that has llama-cpp-python, e.g.

    $QUANTKIT_LLAMA_PY tools/llama_quantize_ref.py IN.gguf OUT.gguf Q4_K_M --allow-requantize

It accepts the llama-quantize options that the library's params struct exposes. The imatrix (GGUF form)
is turned into per-column weights as llama-quantize's loader does (sums / count, 1.0 where count is 0).
It does not import quantkit.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time

import numpy as np
import gguf
import llama_cpp

FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
          "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
          "Q5_K_M": 17, "Q6_K": 18, "Q2_K_S": 21, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32,
          "Q3_K": 12, "Q4_K": 15, "Q5_K": 17}


def ggml_type(name: str) -> int:
    return int(gguf.GGMLQuantizationType[name.upper()])


def imatrix_weights(path: str) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(path)
    sums, counts = {}, {}
    for t in r.tensors:
        base, _, kind = t.name.rpartition(".")
        (sums if kind == "in_sum2" else counts)[base] = np.array(t.data, dtype=np.float32)
    out = {}
    for name, s in sums.items():
        c = counts[name].reshape(-1)
        s = s.reshape(c.size, -1)
        w = np.empty_like(s)
        for e in range(c.size):
            w[e] = 1.0 if c[e] == 0 else s[e] / np.float32(c[e])
        out[name] = np.ascontiguousarray(w.reshape(-1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("ftype")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--allow-requantize", action="store_true")
    ap.add_argument("--leave-output-tensor", action="store_true")
    ap.add_argument("--pure", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--output-tensor-type")
    ap.add_argument("--token-embedding-type")
    ap.add_argument("--tensor-type", action="append", default=[])
    ap.add_argument("--imatrix")
    ap.add_argument("--prune-layers")
    ap.add_argument("--override-kv", action="append", default=[])
    ap.add_argument("--include-weights", action="append", default=[])
    ap.add_argument("--exclude-weights", action="append", default=[])
    a = ap.parse_args()

    p = llama_cpp.llama_model_quantize_default_params()
    p.nthread = a.threads
    if a.ftype.upper() == "COPY":  # llama-quantize: only_copy, ftype left at its default
        p.only_copy = True
    else:
        p.ftype = FTYPES[a.ftype.upper()]
    p.allow_requantize = a.allow_requantize
    p.quantize_output_tensor = not a.leave_output_tensor
    p.pure = a.pure
    p.dry_run = a.dry_run
    if a.output_tensor_type:
        p.output_tensor_type = ggml_type(a.output_tensor_type)
    if a.token_embedding_type:
        p.token_embedding_type = ggml_type(a.token_embedding_type)
    keep = []
    if a.tensor_type:
        arr = (llama_cpp.llama_model_tensor_override * (len(a.tensor_type) + 1))()
        for i, spec in enumerate(a.tensor_type):
            pat, _, ty = spec.partition("=")
            b = pat.lower().encode()
            keep.append(b)
            arr[i].pattern = b
            arr[i].type = ggml_type(ty)
        arr[len(a.tensor_type)].pattern = None
        p.tt_overrides = arr
        keep.append(arr)
    overrides = []  # (key, tag, value) in llama-quantize's order: --override-kv first, imatrix keys after
    for spec in a.override_kv:
        key, _, rest = spec.partition("=")
        kind, _, val = rest.partition(":")
        tag = {"int": 0, "float": 1, "bool": 2, "str": 3}[kind]
        overrides.append((key, tag, {"int": lambda v: int(v, 0), "float": float,
                                      "bool": lambda v: v == "true", "str": str}[kind](val)))
    if a.imatrix:
        w = imatrix_weights(a.imatrix)
        # llama-quantize's prepare_imatrix: keep names containing an --include-weights string, then
        # drop names containing an --exclude-weights string
        if a.include_weights:
            w = {k: v for k, v in w.items() if any(s in k for s in a.include_weights)}
        if a.exclude_weights:
            w = {k: v for k, v in w.items() if not any(s in k for s in a.exclude_weights)}
        r = gguf.GGUFReader(a.imatrix)
        ds = r.fields["imatrix.datasets"].contents()
        overrides.append(("quantize.imatrix.file", 3, a.imatrix[:127]))
        if ds:
            overrides.append(("quantize.imatrix.dataset", 3, ds[0]))
        overrides.append(("quantize.imatrix.entries_count", 0, len(w)))
        overrides.append(("quantize.imatrix.chunks_count", 0, int(r.fields["imatrix.chunk_count"].contents())))
        arr = (llama_cpp.llama_model_imatrix_data * (len(w) + 1))()
        for i, (name, vals) in enumerate(sorted(w.items())):
            b = name.encode()
            keep += [b, vals]
            arr[i].name = b
            arr[i].data = vals.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = vals.size
        arr[len(w)].name = None
        p.imatrix = arr
        keep.append(arr)
    if overrides:
        arr = (llama_cpp.llama_model_kv_override * (len(overrides) + 1))()
        for i, (key, tag, val) in enumerate(overrides):
            arr[i].key = key.encode()
            arr[i].tag = tag
            if tag == 0:
                arr[i].value.val_i64 = val
            elif tag == 1:
                arr[i].value.val_f64 = val
            elif tag == 2:
                arr[i].value.val_bool = val
            else:
                arr[i].value.val_str = val.encode()[:127]
        arr[len(overrides)].key = b""
        p.kv_overrides = arr
        keep.append(arr)
    if a.prune_layers:
        ids = [int(x) for x in a.prune_layers.split(",")] + [-1]
        arr = (ctypes.c_int32 * len(ids))(*ids)
        p.prune_layers = arr
        keep.append(arr)
    t = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(a.inp.encode(), a.out.encode(), ctypes.byref(p))
    print(f"llama_model_quantize rc={rc} in {time.perf_counter() - t:.2f} s", file=sys.stderr)
    return int(rc != 0)


if __name__ == "__main__":
    sys.exit(main())
