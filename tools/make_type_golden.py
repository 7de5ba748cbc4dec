"""ggml's own type traits, for checking quantkit's type table (quantkit/formats/ggml_types.py).

    python tools/make_type_golden.py [--lib DIR]    # DIR holds libggml-base.so and libggml-cpu.so;
                                                    # default: $QUANTKIT_LLAMA_CPP/build/bin

For every ggml type id below GGML_TYPE_COUNT that ggml still defines: ``ggml_get_type_traits`` (type
name, block size, type size, is_quantized) from libggml-base and, where the CPU backend has a vec_dot
for it, ``ggml_get_type_traits_cpu(t)->vec_dot_type`` from libggml-cpu. Writes
tests/data/golden/type_traits.json. It does not import quantkit.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import llamaref  # tools/, this script's folder

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden" / "type_traits.json"


class Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


class TraitsCPU(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", help="folder holding libggml-base.so and libggml-cpu.so (default: "
                    "$QUANTKIT_LLAMA_CPP/build/bin)")
    ap.add_argument("--count", type=int, default=43, help="GGML_TYPE_COUNT of that build (ggml.h)")
    a = ap.parse_args()
    libdir = llamaref.need_bin_dir(a.lib)
    base = ctypes.CDLL(str(libdir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(libdir / "libggml-cpu.so"))
    cpu.ggml_cpu_init()
    base.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TraitsCPU)
    types = {}
    for t in range(a.count):
        tr = base.ggml_get_type_traits(t).contents
        if not tr.type_name or tr.blck_size == 0:  # an id ggml removed (Q4_2, Q4_0_4_4, ...)
            continue
        tc = cpu.ggml_get_type_traits_cpu(t).contents
        name = tr.type_name.decode()
        types[str(t)] = {
            "type_name": name, "blck_size": tr.blck_size, "type_size": tr.type_size,
            "is_quantized": bool(tr.is_quantized),
            "vec_dot_type": tc.vec_dot_type if tc.vec_dot else None,
        }
    OUT.write_text(json.dumps({
        "meta": {"tool": "tools/make_type_golden.py (ggml_get_type_traits / ggml_get_type_traits_cpu via ctypes)",
                 "llama.cpp": "as vendored in llama-cpp-python 0.3.36 (commit 0c1e570)",
                 "date": time.strftime("%Y-%m-%d")},
        "types": types,
    }, indent=1) + "\n")
    print(f"wrote {OUT} ({len(types)} types)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
