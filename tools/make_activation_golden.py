"""Golden bytes of ggml's CPU activation quantizers (the vec_dot types' ``from_float``).

    $QUANTKIT_LLAMA_PY tools/make_activation_golden.py [--lib DIR]

llama.cpp quantizes every matmul's activations on the fly with the CPU backend's ``from_float`` of the
weight type's vec_dot type (Q8_0, Q8_1, Q8_K). On x86 these are SIMD routines whose rounding differs from
the reference ``quantize_row_*_ref`` (for Q8_0/Q8_1: multiplier 127/amax and round-half-even; Q8_1's
``s`` stored as fp16 of the unrounded scale times the sum). To agree with llama.cpp's logits, quantkit's
activation quantizers reproduce them; these files pin that. Writes tests/data/golden/activations.npz.
It does not import quantkit.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import sys
import time
from pathlib import Path

import numpy as np

import llamaref  # tools/, this script's folder

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden" / "activations.npz"
TYPES = {"Q8_0": (8, 32, 34), "Q8_1": (9, 32, 36), "Q8_K": (15, 256, 292)}


class TraitsCPU(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None, help="folder holding libggml-cpu.so (default: llama_cpp's)")
    a = ap.parse_args()
    if a.lib:
        libdir = Path(a.lib)
    else:
        import llama_cpp

        libdir = Path(llama_cpp.__file__).parent / "lib"
    ctypes.CDLL(str(libdir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(libdir / "libggml-cpu.so"))
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TraitsCPU)
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    rng = np.random.default_rng(20261130)
    x = np.concatenate([
        rng.standard_normal((6, 1536)).astype(np.float32),
        (rng.standard_t(2, (2, 1536)) * 3).astype(np.float32),
        np.round(rng.standard_normal((2, 1536)) * 4).astype(np.float32) / 2,  # many exact .5 ties
    ])
    x[1, :256] = 0.0
    x[2, 40:72] = 1e-30
    store = {"x": x}
    for name, (tid, block, size) in TYPES.items():
        fn = proto(cpu.ggml_get_type_traits_cpu(tid).contents.from_float)
        out = np.zeros((x.shape[0], x.shape[1] // block * size), np.uint8)
        for r in range(x.shape[0]):
            fn(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
        store[name] = out
    store["meta"] = np.array(json.dumps({
        "tool": "tools/make_activation_golden.py (ggml_get_type_traits_cpu(t)->from_float via ctypes)",
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "lib": llamaref.portable(str(libdir)), "date": time.strftime("%Y-%m-%d"),
    }))
    np.savez_compressed(OUT, **store)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
