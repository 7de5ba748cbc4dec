"""Full-size vs cache-resident GEMV speed, one thread, SmolLM2-135M shapes.

A decode step reads ~100 MB of weights once each, so every GEMV streams its matrix from L3/DRAM;
a micro-benchmark that repeats one small GEMV keeps the matrix in L2 and measures something else.
This script reports, per type and shape, weight bytes per CPU-second of one thread (1-token GEMV,
activations quantized beforehand) in three settings:

* ``hot``: the same matrix again and again (cache-resident when it fits L2);
* ``ram``: a ring of copies of the matrix totalling ``--ring-mib`` MiB in one anonymous numpy array
  (numpy advises transparent huge pages for it, as the decode step's weight copy), one GEMV per copy
  in turn (each GEMV reads cold data, as in decode);
* ``mmap``: the same ring in a file opened with ``np.memmap`` (as the GGUF is), after one pass that
  touched every page (the first-touch pass is reported apart as ``first``, in GB/s).

CPU time (``time.process_time``) so that other processes on the machine count less; best and median
of ``--reps`` passes. ``--chunk`` rows per prange task (the decode step uses 16).

    .venv/bin/python benchmarks/bench_gemv_fullsize.py [--types Q4_1,Q8_0]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernels import random_weights  # noqa: E402

from quantkit import kernels as K  # noqa: E402
from quantkit.jit import set_threads  # noqa: E402

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
#: type -> shapes (n_out, n_in); K types need n_in % 256 == 0, so they get the 1536-wide matrix
CASES = {
    "Q4_1": SHAPES, "Q5_0": SHAPES, "Q8_0": SHAPES,
    "Q4_K": [(576, 1536)], "Q6_K": [(576, 1536)],
}


def activations(t, n_in, rng):
    kind = K.activation_kind(t)
    xq, xd, xs = K.empty_activations(kind, 1, n_in)
    x = rng.standard_normal((1, n_in), dtype=np.float32)
    {"Q8_0": K.quantize_q8_0_into, "Q8_1": K.quantize_q8_1_into, "Q8_K": K.quantize_q8_k_into}[kind](
        x, xq, xd, xs)
    return xq, xd, xs


def run_ring(mv, ring, act, out, chunk, reps):
    """Per pass: one GEMV per matrix of ``ring``; -> list of CPU seconds per pass."""
    xq, xd, xs = act
    times = []
    for _ in range(reps):
        c0 = time.process_time()
        for w in ring:
            mv(w, xq, xd, xs, out, chunk)
        times.append(time.process_time() - c0)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(CASES))
    ap.add_argument("--shapes", default="", help="e.g. 576x576,49152x576 (default: all for each type)")
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--modes", default="hot,ram,mmap")
    args = ap.parse_args()
    set_threads(1)
    modes = args.modes.split(",")
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f}; 1 thread; chunk {args.chunk}; ring {args.ring_mib} MiB; "
          f"GB/s of weights per CPU-second (best / median of {args.reps})")
    print(f"| type | shape | MiB | {' | '.join(modes)} | first touch |")
    print("| --- | --- | ---: |" + " ---: |" * (len(modes) + 1))
    tmpdir = tempfile.mkdtemp(prefix="gemv_ring_")
    for name in args.types.split(","):
        t = T[name]
        shapes = CASES[name]
        if args.shapes:
            want = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")}
            shapes = [s for s in shapes if s in want]
        mv = K.matvec_kernel(t)
        for n_out, n_in in shapes:
            w = np.ascontiguousarray(random_weights(t, n_out, n_in, rng))
            act = activations(t, n_in, rng)
            out = np.empty((1, n_out), np.float32)
            mv(w, *act, out, args.chunk)  # compile / load
            nbytes = w.nbytes
            copies = max(1, -(-(args.ring_mib << 20) // nbytes))
            cells, first = [], ""
            for mode in modes:
                if mode == "hot":
                    reps = max(3, int(2e8 // nbytes))
                    ts = run_ring(mv, [w] * reps, act, out, args.chunk, args.reps)
                    gb = nbytes * reps
                elif mode == "ram":
                    big = np.empty((copies,) + w.shape, np.uint8)
                    big[:] = w
                    ring = [big[i] for i in range(copies)]
                    ts = run_ring(mv, ring, act, out, args.chunk, args.reps)
                    gb = nbytes * copies
                    del ring, big
                elif mode == "mmap":
                    path = os.path.join(tmpdir, f"{name}_{n_out}x{n_in}.bin")
                    with open(path, "wb") as fh:
                        for _ in range(copies):
                            fh.write(w.tobytes())
                    mm = np.memmap(path, np.uint8, "r", shape=(copies, n_out, w.shape[1]))
                    ring = [mm[i] for i in range(copies)]
                    t0 = run_ring(mv, ring, act, out, args.chunk, 1)[0]
                    first = f"{nbytes * copies / t0 / 1e9:.1f}"
                    ts = run_ring(mv, ring, act, out, args.chunk, args.reps)
                    gb = nbytes * copies
                    del ring, mm
                    os.unlink(path)
                else:
                    raise SystemExit(f"unknown mode {mode}")
                ts = sorted(ts)
                cells.append(f"{gb / ts[0] / 1e9:.1f} / {gb / ts[len(ts) // 2] / 1e9:.1f}")
            print(f"| {name} | {n_out}x{n_in} | {nbytes / 2**20:.2f} | {' | '.join(cells)} | {first} |",
                  flush=True)
    os.rmdir(tmpdir)


if __name__ == "__main__":
    main()
