#!/usr/bin/env python3
"""Quantization throughput: quantkit at 1 and 2 numba threads against ggml's ``ggml_quantize_chunk``
at 1 and 2 threads, per type and path (``ref``: no imatrix, ``imatrix``: with weights).

    .venv/bin/python benchmarks/bench_quantize.py [--rows 512]

* ``first call`` -- the first quantize of a 1-row matrix: numba compile, or loading the compiled
  kernel from NUMBA_CACHE_DIR when it is there (``--cold`` uses an empty cache dir, so it is compile).
  One kernel serves both paths and every thread count, so it is paid once per type.
* steady state -- best of ``--repeat`` runs on the whole matrix, as elements per second.
* ggml -- loaded with ctypes from the reference build's ``libggml-base.so`` (``--lib``, else
  $QUANTKIT_LLAMA_CPP/build/bin's: tools/llamaref.py); skipped with a note when it cannot be found.
  Q8_K, which ggml_quantize_chunk does not handle, uses ``quantize_row_q8_K_ref``. ``==ggml`` says
  whether the bytes were identical. At 2 threads ggml is called from two Python threads on the two
  halves of the rows (ctypes releases the GIL), as llama-quantize splits a tensor's rows over its threads.
* ``qk2/ggml1``, ``qk2/ggml2`` -- quantkit-2-threads throughput divided by ggml's at 1 and 2 threads.
* ``--dist student_t`` -- heavy-tailed weights (Student-t, 4 degrees of freedom) instead of normal ones.
* types that ggml quantizes only with an importance matrix (IQ2_XXS, IQ2_XS, IQ1_S) show only that path.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import llamaref  # noqa: E402  (where the reference llama.cpp is)

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "IQ3_XXS", "IQ3_S"]


class Ggml:
    """Just enough of libggml-base to quantize a matrix on one thread."""

    ROW_REF_ONLY = {"Q8_K": "quantize_row_q8_K_ref"}

    def __init__(self, path: str):
        self.lib = lib = ctypes.CDLL(path)
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.ggml_quantize_init.argtypes = [ctypes.c_int]
        lib.quantize_row_q8_K_ref.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        lib.ggml_version.restype = ctypes.c_char_p
        self.version = lib.ggml_version().decode() if hasattr(lib, "ggml_version") else "?"

    def quantize(self, name: str, type_id: int, x: np.ndarray, w: np.ndarray | None, out: np.ndarray) -> None:
        nrow, n = x.shape
        if name in self.ROW_REF_ONLY:
            getattr(self.lib, self.ROW_REF_ONLY[name])(x.ctypes.data, out.ctypes.data, x.size)
            return
        self.lib.ggml_quantize_chunk(type_id, x.ctypes.data, out.ctypes.data, 0, nrow, n,
                                     None if w is None else w.ctypes.data)

    def quantize_threads(self, name: str, type_id: int, x: np.ndarray, w, out: np.ndarray, pool) -> None:
        """The rows split in halves over the two threads of ``pool``."""
        h = x.shape[0] // 2
        jobs = [pool.submit(self.quantize, name, type_id, x[a:b], w, out[a:b]) for a, b in ((0, h), (h, x.shape[0]))]
        for j in jobs:
            j.result()

    def row_size(self, type_id: int, n: int) -> int:
        return self.lib.ggml_row_size(type_id, n)


def find_ggml(arg: str | None) -> tuple[Ggml | None, str]:
    lib = llamaref.find("libggml-base.so", arg)
    if lib is None:
        return None, f"ggml not benchmarked: {llamaref.missing('libggml-base.so', arg)} (or pass --lib PATH)"
    try:
        g = Ggml(lib)
    except (OSError, AttributeError) as e:
        return None, f"ggml not benchmarked: cannot load {lib}: {e}"
    return g, f"ggml {g.version} from {lib}"


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def best_of(repeat: int, fn, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096, help="rows of the matrix (default 4096)")
    ap.add_argument("--cols", type=int, default=4096, help="columns = n_per_row (default 4096, multiple of 256)")
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated type names (default: all)")
    ap.add_argument("--repeat", type=int, default=3, help="steady-state runs per measurement; best is kept")
    ap.add_argument("--lib", help="path to libggml-base.so (default: $QUANTKIT_LLAMA_CPP/build/bin's)")
    ap.add_argument("--no-ggml", action="store_true", help="do not benchmark ggml")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: elapsed time; cpu: the process's CPU time (user+sys of every thread), which "
                         "a busy machine disturbs less -- at 2 threads it is the work, not the speed-up")
    ap.add_argument("--dist", choices=("normal", "student_t"), default="normal",
                    help="weights: normal (default) or heavy-tailed Student-t (4 degrees of freedom), both * 0.02")
    ap.add_argument("--cold", action="store_true", help="compile into an empty NUMBA_CACHE_DIR (true compile time)")
    args = ap.parse_args(argv)
    if args.rows <= 0 or args.cols <= 0 or args.cols % 256:
        ap.error("--rows must be > 0 and --cols a positive multiple of 256")

    cold_dir = None
    if args.cold:
        cold_dir = tempfile.mkdtemp(prefix="quantkit-bench-cache-")
        os.environ["NUMBA_CACHE_DIR"] = cold_dir
    try:
        return run(args)
    finally:
        if cold_dir:
            shutil.rmtree(cold_dir, ignore_errors=True)


def run(args) -> int:
    # Heavy imports only now, after the cache dir is settled.
    import numba
    from gguf import GGMLQuantizationType

    import quantkit.quants as Q
    from quantkit.jit import set_threads

    max_threads = numba.config.NUMBA_NUM_THREADS
    thread_counts = [1, 2] if max_threads >= 2 else [1]
    ggml, ggml_note = (None, "ggml not benchmarked (--no-ggml)") if args.no_ggml else find_ggml(args.lib)

    clock = CLOCKS[args.clock]
    rng = np.random.default_rng(0)
    if args.dist == "student_t":
        x = (rng.standard_t(4, (args.rows, args.cols)) * 0.02).astype(np.float32)
    else:
        x = (rng.standard_normal((args.rows, args.cols)) * 0.02).astype(np.float32)
    w = (rng.uniform(0.0, 2.0, args.cols) ** 2).astype(np.float32)
    tiny = x[:1].copy()
    n_el = x.size

    print(f"matrix {args.rows}x{args.cols} float32 {args.dist} ({n_el / 1e6:.1f} M elements), best of {args.repeat}; "
          f"numba {numba.__version__}, threading layer {numba.config.THREADING_LAYER}, "
          f"NUMBA_CACHE_DIR={os.environ.get('NUMBA_CACHE_DIR', '(numba default)')}")
    print(ggml_note)
    hdr = (f"{'type':<7} {'path':<8} {'first call s':>12} {'qk 1t Mel/s':>12} {'qk 2t Mel/s':>12} "
           f"{'ggml 1t Mel/s':>13} {'ggml 2t Mel/s':>13} {'qk2/ggml1':>9} {'qk2/ggml2':>9} {'==ggml':>6}")
    print(hdr)
    print("-" * len(hdr))
    before = numba.get_num_threads()
    try:
        for name in [s.strip().upper() for s in args.types.split(",") if s.strip()]:
            t = GGMLQuantizationType[name]
            if t not in Q.TRAITS:
                print(f"{name:<7} {'-':<8} not registered in quantkit.quants.TRAITS")
                continue
            tr = Q.TRAITS[t]
            paths = ["imatrix"] if tr.requires_imatrix else ["ref", "imatrix"] if tr.uses_imatrix else ["ref"]
            set_threads(1)
            t0 = time.perf_counter()
            Q.quantize(tiny, name, imatrix=w if tr.requires_imatrix else None)
            first = time.perf_counter() - t0
            for p in paths:
                wp = w if p == "imatrix" else None
                rates = {}
                got = None
                for nt in thread_counts:
                    set_threads(nt)
                    got = Q.quantize(x, name, imatrix=wp)  # warm (allocations, thread pool)
                    rates[nt] = n_el / best_of(args.repeat, lambda: Q.quantize(x, name, imatrix=wp), clock)
                g_rate = g_rate2 = same = None
                if ggml is not None and not (p == "imatrix" and name in ggml.ROW_REF_ONLY):
                    ref = np.empty((args.rows, ggml.row_size(int(t), args.cols)), np.uint8)
                    ggml.quantize(name, int(t), x, wp, ref)
                    g_rate = n_el / best_of(args.repeat, lambda: ggml.quantize(name, int(t), x, wp, ref), clock)
                    same = bool(np.array_equal(got, ref))
                    if 2 in thread_counts and name not in ggml.ROW_REF_ONLY:
                        with ThreadPoolExecutor(2) as pool:
                            g_rate2 = n_el / best_of(
                                args.repeat, lambda: ggml.quantize_threads(name, int(t), x, wp, ref, pool), clock)
                r2 = rates.get(2)
                print(f"{name:<7} {p:<8} {(f'{first:.2f}' if p == paths[0] else '(same)'):>12} "
                      f"{rates[1] / 1e6:>12.1f} {(f'{r2 / 1e6:.1f}' if r2 else 'n/a'):>12} "
                      f"{(f'{g_rate / 1e6:.1f}' if g_rate else '-'):>13} "
                      f"{(f'{g_rate2 / 1e6:.1f}' if g_rate2 else '-'):>13} "
                      f"{(f'{r2 / g_rate:.2f}' if r2 and g_rate else '-'):>9} "
                      f"{(f'{r2 / g_rate2:.2f}' if r2 and g_rate2 else '-'):>9} "
                      f"{('-' if same is None else 'yes' if same else 'NO'):>6}", flush=True)
    finally:
        numba.set_num_threads(before)
    print("types whose bytes ignore the imatrix (uses_imatrix = False) show only the ref path.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
