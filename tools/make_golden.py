#!/usr/bin/env python3
"""Write tests/data/golden/ggml_golden.npz: bytes and dequantized floats produced by the real ggml.

Runs in a separate venv that has llama-cpp-python (it ships ggml's libggml-base.so), e.g.::

    $QUANTKIT_LLAMA_PY tools/make_golden.py          # or: make golden

It must not import quantkit: the point is an independent reference. ggml is loaded with ctypes.

For every case (a seeded float32 matrix plus a seeded importance matrix) and every type it stores

* ``q:<TYPE>:<case>:<path>``  uint8[nrow, row_bytes] -- ``ggml_quantize_chunk(type, x, dst, 0, nrow,
  n_per_row, imatrix)`` with ``imatrix`` NULL (path ``ref``) or the case's weights (path ``imatrix``);
  for Q8_K, which ggml_quantize_chunk does not handle, ``quantize_row_q8_K_ref`` (path ``ref`` only);
* ``d:<TYPE>:<case>:<path>``  float32[nrow, n_per_row] -- what ggml itself dequantizes from those
  bytes (``ggml_get_type_traits(type)->to_float``; for F32 and Q8_K, whose traits have no to_float,
  the bytes reinterpreted as float32 and the exported ``dequantize_row_q8_K``).
* ``x:<case>`` / ``w:<case>`` -- the inputs, stored once; ``meta`` -- JSON provenance.

An array equal (same dtype, shape and bytes) to one already stored is not stored again: ``meta``'s
``aliases`` maps its key to the stored one (e.g. ``d:F32:normal:ref -> x:normal``).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import numpy as np

import llamaref  # tools/, this script's folder (not quantkit)

# ggml's enum ggml_type values (include/ggml.h); block size and bytes per block are read from the lib.
GGML_TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15,
    "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30,
}
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS"]
# Types ggml_quantize_chunk cannot produce; their reference bytes come from quantize_row_X_ref.
ROW_REF_ONLY = {"Q8_K": "quantize_row_q8_K_ref"}
# Types whose traits have no to_float; how ggml itself reads them back.
DEQUANT_FALLBACK = {"Q8_K": "dequantize_row_q8_K"}

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden" / "ggml_golden.npz"


class TypeTraits(ctypes.Structure):
    # struct ggml_type_traits, include/ggml.h (unchanged from ggml 0.9 through 0.25.3)
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


ROW_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)  # (src, dst, k)


def find_lib() -> Path:
    """llama-cpp-python's libggml-base.so when this python has the package, else the reference build's
    (tools/llamaref.py)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    lib = Path(spec.origin).parent / "lib" / "libggml-base.so" if spec is not None and spec.origin else None
    if lib is not None and lib.exists():
        return lib
    found = llamaref.find("libggml-base.so")
    if found is None:
        sys.exit(f"{llamaref.missing('libggml-base.so')}, and this python has no llama_cpp package; "
                 "or pass --lib PATH/libggml-base.so")
    return Path(found)


class Ggml:
    def __init__(self, path: Path):
        self.path = path
        lib = self.lib = ctypes.CDLL(str(path))
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.ggml_validate_row_data.restype = ctypes.c_bool
        lib.ggml_validate_row_data.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        lib.ggml_quantize_init.argtypes = [ctypes.c_int]
        for fn in ("ggml_version", "ggml_commit"):
            if hasattr(lib, fn):
                getattr(lib, fn).restype = ctypes.c_char_p

    def version(self) -> dict:
        out = {}
        for fn in ("ggml_version", "ggml_commit"):
            if hasattr(self.lib, fn):
                out[fn] = getattr(self.lib, fn)().decode()
        return out

    def traits(self, name: str) -> TypeTraits:
        return self.lib.ggml_get_type_traits(GGML_TYPES[name]).contents

    def quantize(self, name: str, x: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        t = GGML_TYPES[name]
        nrow, n = x.shape
        row_bytes = self.lib.ggml_row_size(t, n)
        y = np.zeros((nrow, row_bytes), dtype=np.uint8)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if name in ROW_REF_ONLY:
            assert w is None
            getattr(self.lib, ROW_REF_ONLY[name])(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data),
                                                  ctypes.c_int64(x.size))
        else:
            self.lib.ggml_quantize_init(t)
            wp = None if w is None else np.ascontiguousarray(w, dtype=np.float32).ctypes.data
            got = self.lib.ggml_quantize_chunk(t, x.ctypes.data, y.ctypes.data, 0, nrow, n, wp)
            assert got == y.nbytes, (name, got, y.nbytes)
        return y

    def validate(self, name: str, y: np.ndarray) -> bool:
        """ggml_validate_row_data (it prints why on stderr when it says no)."""
        return bool(self.lib.ggml_validate_row_data(GGML_TYPES[name], y.ctypes.data, y.nbytes))

    def dequantize(self, name: str, y: np.ndarray, n_per_row: int) -> tuple[np.ndarray, str]:
        tr = self.traits(name)
        out = np.empty((y.shape[0], n_per_row), dtype=np.float32)
        if tr.to_float:
            how = "traits->to_float"
            ROW_FN(tr.to_float)(y.ctypes.data, out.ctypes.data, out.size)
        elif name in DEQUANT_FALLBACK:
            how = DEQUANT_FALLBACK[name]
            fn = getattr(self.lib, how)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn(y.ctypes.data, out.ctypes.data, out.size)
        elif name == "F32":
            how = "bytes as float32 (F32 traits have no to_float)"
            out[...] = np.ascontiguousarray(y).view(np.float32)
        else:
            raise RuntimeError(f"no way to dequantize {name} with ggml")
        return out, how


# ------------------------------------------------------------------------------------------------
# Inputs. Every case: seeded, float32, (nrow, n_per_row); an imatrix per case: positive with zeros.
def make_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    n, nrow = 512, 4
    cases: dict[str, np.ndarray] = {}

    def rng(seed):
        return np.random.default_rng(seed)

    cases["normal"] = rng(1).standard_normal((nrow, n))
    cases["student_t2"] = rng(2).standard_t(2, (nrow, n))  # heavy-tailed
    cases["zeros"] = np.zeros((2, n))
    cases["constant"] = np.array([0.5, -1.25, 3.0, 1e-3])[:, None] * np.ones((nrow, n))
    z = np.zeros((nrow, n))
    g = rng(5)
    for r in range(nrow):
        z[r, g.integers(n)] = (-1) ** r * g.uniform(0.5, 10.0)
    cases["outlier_in_zeros"] = z
    cases["tiny_1e-30"] = rng(6).standard_normal((nrow, n)) * 1e-30
    big = rng(7).uniform(-6.0e4, 6.0e4, (nrow, n))
    big[0, 3], big[1, 100], big[2, 257] = 65504.0, -65504.0, 65000.0
    cases["near_fp16_max"] = big
    cases["all_positive"] = np.abs(rng(8).standard_normal((nrow, n))) + 0.01
    cases["all_negative"] = -np.abs(rng(9).standard_normal((nrow, n))) - 0.01
    cases["grid_1_8"] = rng(10).integers(-16, 17, (nrow, n)) / 8.0
    cases["normal_256"] = rng(11).standard_normal((2, 256)) * 0.02  # weight-like scale, short rows

    out = {}
    for i, (name, x) in enumerate(cases.items()):
        x = np.ascontiguousarray(x, dtype=np.float32)
        g = rng(100 + i)
        w = g.uniform(0.0, 4.0, x.shape[1]) ** 2  # squared activations: positive, skewed
        w[g.random(x.shape[1]) < 0.1] = 0.0  # ~10% zeros, as unused imatrix columns
        if i % 2:
            w[:32] = 0.0  # every other case: a whole 32-block of zero weights
        out[name] = (x, np.ascontiguousarray(w, dtype=np.float32))
    return out


def dedupe(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Store each distinct array once; a repeat (F32 bytes == input, a type that ignores the imatrix,
    ...) becomes an alias ``key -> first key with the same rows of bytes``. A reader views the stored
    array as the dtype its own key implies (``q:`` uint8, ``x:``/``w:``/``d:`` float32)."""
    seen: dict[tuple, str] = {}
    kept: dict[str, np.ndarray] = {}
    aliases: dict[str, str] = {}
    for k, a in arrays.items():
        sig = (a.shape[:-1], a.nbytes, a.tobytes())
        if sig in seen:
            aliases[k] = seen[sig]
        else:
            seen[sig] = k
            kept[k] = a
    return kept, aliases


def arg_parser(doc: str, default_out: Path) -> argparse.ArgumentParser:
    """The options every golden-data script takes: --lib and --out."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, help="path to libggml-base.so (default: the llama_cpp package's, "
                    "else $QUANTKIT_LLAMA_CPP/build/bin's)")
    ap.add_argument("--out", type=Path, default=default_out, help=f"output .npz (default {default_out})")
    return ap


def quantize_cases(g: Ggml, types: list[str], cases: dict[str, tuple[np.ndarray, np.ndarray]],
                   paths) -> tuple[dict[str, np.ndarray], list[str], dict[str, str]]:
    """Every case's inputs (``x:``, ``w:``), then for every type x case (whose rows hold whole blocks) x
    ``paths(type)``: ggml's bytes (``q:``) and its dequantization of them (``d:``). Returns the arrays,
    the entries ``ggml_validate_row_data`` rejects and how each type was dequantized."""
    arrays: dict[str, np.ndarray] = {}
    dequant_how = {}
    rejected = []
    for cname, (x, w) in cases.items():
        arrays[f"x:{cname}"] = x
        arrays[f"w:{cname}"] = w
    for t in types:
        tr = g.traits(t)
        for cname, (x, w) in cases.items():
            if x.shape[1] % tr.blck_size:
                continue
            for p in paths(t):
                y = g.quantize(t, x, w if p == "imatrix" else None)
                d, how = g.dequantize(t, y, x.shape[1])
                arrays[f"q:{t}:{cname}:{p}"] = y
                if not g.validate(t, y):  # ggml's own check of its output; kept as a fact, not an error
                    rejected.append(f"{t}:{cname}:{p}")
                arrays[f"d:{t}:{cname}:{p}"] = d
                dequant_how[t] = how
    return arrays, rejected, dequant_how


def provenance(g: Ggml, lib_path: Path, not_installed: str, command: list[str]) -> dict:
    """Where the data came from: llama-cpp-python's version (or ``not_installed``), ggml's version and
    commit, the library, numpy, Python, the machine, the date and the command line."""
    try:
        llama_ver = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        llama_ver = not_installed
    return {
        "llama_cpp_python": llama_ver,
        **g.version(),
        "lib": lib_path.name,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": llamaref.portable(shlex.join(command)),
    }


def write_golden(out: Path, arrays: dict[str, np.ndarray], meta: dict) -> tuple[dict, dict]:
    """Deduplicate, add ``meta`` (with its aliases) and write ``out`` atomically; returns the arrays kept
    and the aliases."""
    arrays, aliases = dedupe(arrays)
    meta["aliases"] = aliases
    arrays["meta"] = np.array(json.dumps(meta, indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, out)
    return arrays, aliases


def main(argv=None) -> int:
    args = arg_parser(__doc__, DEFAULT_OUT).parse_args(argv)
    lib_path = args.lib or find_lib()
    g = Ggml(lib_path)
    cases = make_cases()
    arrays, rejected, dequant_how = quantize_cases(
        g, TYPES, cases, lambda t: ("ref",) if t in ROW_REF_ONLY else ("ref", "imatrix"))
    meta = {
        "what": "bytes from ggml_quantize_chunk (Q8_K: quantize_row_q8_K_ref) and ggml's own dequantization",
        "keys": "x:<case> input float32[nrow,n]; w:<case> imatrix float32[n]; q:<TYPE>:<case>:<ref|imatrix> "
                "uint8[nrow,row_bytes]; d:<TYPE>:<case>:<path> float32[nrow,n]",
        "types": TYPES,
        "cases": list(cases),
        "paths": {t: (["ref"] if t in ROW_REF_ONLY else ["ref", "imatrix"]) for t in TYPES},
        "quantized_with": {t: ROW_REF_ONLY.get(t, "ggml_quantize_chunk") for t in TYPES},
        "dequantized_with": dequant_how,
        "rejected_by_ggml_validate_row_data": rejected,
        **provenance(g, lib_path, "unknown",
                     [sys.executable, "tools/make_golden.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    arrays, _ = write_golden(args.out, arrays, meta)
    nq = sum(k.startswith("q:") for k in arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): {len(cases)} cases, {nq} (type, case, path) "
          f"entries; ggml {meta.get('ggml_version', '?')} ({meta.get('ggml_commit', '?')}), "
          f"llama-cpp-python {meta['llama_cpp_python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
