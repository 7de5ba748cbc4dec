"""GEMV and prefill throughput of quantkit.kernels on this machine.

GEMV (1 token): GB/s of weight bytes read per second, per type, at 1 and 2 threads, on a matrix of
about --mib MiB of weights (compile time reported apart). Memory bandwidth: a prange sum over a
--bw-mib MiB array; the GEMV figures are also given as a fraction of it. Prefill: GFLOP/s of
matmul for --prefill-tokens tokens on a 2048 x 2048 matrix.

    NUMBA_CACHE_DIR=$PWD/.numba_cache .venv/bin/python benchmarks/bench_kernels.py [--types Q4_K,Q8_0]
"""

from __future__ import annotations

import argparse
import os
import time

# OpenBLAS on this machine is slower with these set (../shared/reference/numba-kernels.md).
for _v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_v, None)

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from quantkit import kernels as K  # noqa: E402
from quantkit.jit import njit_fast_parallel, prange, set_threads  # noqa: E402

F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.IQ4_NL: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_XS: (0,),
}


def random_weights(t, n_out, n_in, rng):
    """Valid random bytes of type t (speed does not depend on the values)."""
    if t in (T.F32, T.F16, T.BF16):
        x = rng.standard_normal((n_out, n_in), dtype=np.float32)
        if t == T.F32:
            return x.view(np.uint8)
        if t == T.F16:
            return x.astype(np.float16).view(np.uint8)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    bs, ts = GGML_QUANT_SIZES[t]
    nb = n_in // bs
    raw = rng.integers(0, 256, size=(n_out, nb, ts), dtype=np.uint8)
    for pos in F16_FIELDS[t]:
        raw[:, :, pos:pos + 2] = np.full((n_out, nb), 0.01, np.float16).view(np.uint8).reshape(n_out, nb, 2)
    return raw.reshape(n_out, nb * ts)


@njit_fast_parallel
def _psum(a):
    n = a.shape[0]
    nch = 64
    step = (n + nch - 1) // nch
    part = np.zeros(nch, np.float64)
    for c in prange(nch):
        s = a[c * step:min(n, (c + 1) * step)]
        acc = np.float32(0)
        for i in range(s.shape[0]):
            acc += s[i]
        part[c] = acc
    return part.sum()


def best_of(fn, reps, inner=1):
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def bandwidth(mib, threads):
    set_threads(threads)
    a = np.ones(mib * 2**20 // 4, np.float32)
    _psum(a)
    return a.nbytes / best_of(lambda: _psum(a), 5) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(t.name for t in K.WEIGHT_TYPES))
    ap.add_argument("--mib", type=int, default=48, help="weight bytes per GEMV matrix (MiB)")
    ap.add_argument("--bw-mib", type=int, default=1024, help="array size for the bandwidth sum (MiB)")
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-prefill", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    types = [T[n.strip().upper()] for n in args.types.split(",") if n.strip()]

    bw = {n: bandwidth(args.bw_mib, n) for n in (1, 2)}
    print(f"variant {K.default_variant()}  (vnni={K.HAS_VNNI})")
    print(f"memory bandwidth (prange sum over {args.bw_mib} MiB): 1 thread {bw[1]:.1f} GB/s, "
          f"2 threads {bw[2]:.1f} GB/s")
    print()
    print("| type | n_in x n_out | MiB | compile s | GB/s 1 thr | GB/s 2 thr | of bandwidth (2 thr) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for t in types:
        bs, ts = GGML_QUANT_SIZES[t]
        n_in = 4096 if bs == 256 or t in (T.F32, T.F16, T.BF16) else 4096
        n_out = max(256, args.mib * 2**20 // (n_in // bs * ts))
        w = random_weights(t, n_out, n_in, rng)
        x = rng.standard_normal((1, n_in), dtype=np.float32)
        out = np.empty((1, n_out), np.float32)
        t0 = time.perf_counter()
        K.matmul(w, t, x, out=out)
        comp = time.perf_counter() - t0
        res = {}
        for n in (1, 2):
            set_threads(n)
            K.matmul(w, t, x, out=out)
            res[n] = w.nbytes / best_of(lambda: K.matmul(w, t, x, out=out), args.reps) / 1e9
        print(f"| {t.name} | {n_in} x {n_out} | {w.nbytes / 2**20:.0f} | {comp:.2f} | {res[1]:.1f} | "
              f"{res[2]:.1f} | {res[2] / bw[2]:.0%} |", flush=True)

    if args.no_prefill:
        return
    print()
    m = args.prefill_tokens
    print(f"prefill: {m} tokens x 2048 x 2048, GFLOP/s")
    print("| type | 1 thr | 2 thr |")
    print("| --- | ---: | ---: |")
    for t in types:
        w = random_weights(t, 2048, 2048, rng)
        x = rng.standard_normal((m, 2048), dtype=np.float32)
        out = np.empty((m, 2048), np.float32)
        K.matmul(w, t, x, out=out)
        res = {}
        for n in (1, 2):
            set_threads(n)
            res[n] = 2.0 * m * 2048 * 2048 / best_of(lambda: K.matmul(w, t, x, out=out), 3) / 1e9
        print(f"| {t.name} | {res[1]:.1f} | {res[2]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
