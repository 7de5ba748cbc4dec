"""GEMV and prefill throughput of quantkit.kernels on this machine.

GEMV (1 token): GB/s of weight bytes read per second, per type, at 1 and 2 threads, on a matrix of
about --mib MiB of weights (compile time reported apart). Memory bandwidth: a prange sum over a
--bw-mib MiB array; the GEMV figures are also given as a fraction of it. Prefill: GFLOP/s of
matmul for --prefill-tokens tokens on a 2048 x 2048 matrix; with 512-bit VNNI, the integer GEMM's
rate is also given as a fraction of the ``vpdpbusd zmm`` peak measured in the same run (``vnni_peak``:
independent chains on registers, no loads), its compute yardstick.

``--shape llama-3.2-1b`` (a make_model.py shape of llama's layer) instead times the decode step's GEMVs on
that model's matrices: a ring of copies of one layer's seven matrices (q, k, v, o, gate, up, down; at
least --ring-mib MiB, so every GEMV reads its weights from DRAM as a decode step does), one 1-token
GEMV per matrix in ring order through ``matvec_kernel`` (the row dots the decode step uses), with the
activations quantized beforehand. GB/s = weight bytes / wall time of a whole ring pass (best and median
of --reps), at 1 and 2 threads, beside the bandwidth measured in the same run. ``--x8`` adds a row per
type that has an 8-row interleaved kernel (``kernels.pack_x8``, the layout the decode step prepares
at load), its passes interleaved with the plain layout's in each repetition (A/B in the same run).

    .venv/bin/python benchmarks/bench_kernels.py [--types Q4_K,Q8_0]
    .venv/bin/python benchmarks/bench_kernels.py --shape llama-3.1-8b
"""

from __future__ import annotations

import argparse
import functools
import os
import time

# OpenBLAS on this machine is slower with these set (docs/performance.md).
for _v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_v, None)

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from quantkit import kernels as K  # noqa: E402
from quantkit.formats.ggml_types import type_info  # noqa: E402
from quantkit.kernels.ir import HAS_VNNI512  # noqa: E402
from quantkit.kernels.mul_mat import integer_gemm  # noqa: E402
from quantkit.jit import njit_fast_parallel, prange, set_threads  # noqa: E402

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
    info = type_info(t)  # the scale fields, from the type table: fp16 0.01, or an E8M0 exponent 2**-1
    for pos in info.check_offsets:
        if info.check == "e8m0":
            raw[:, :, pos] = 127
        else:
            raw[:, :, pos:pos + 2] = np.full((n_out, nb), 0.01, np.float16).view(np.uint8).reshape(n_out, nb, 2)
    if info.check == "iq1_m":  # the fp16 scale spread over the scale words' top nibbles: keep it finite
        raw[:, :, info.field("scales") + 7] = (raw[:, :, info.field("scales") + 7] & 0x0F) | 0x10
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


def ggml_vec_dot_rate(t, nbytes, rng, reps, lib=None):
    """GB/s (CPU time, one thread) of ggml's own vec_dot for type t over ~nbytes of weights, through
    the libggml-cpu.so in directory ``lib`` (llama.cpp's build/bin), else in the reference build's
    ($QUANTKIT_LLAMA_CPP/build/bin), else llama-cpp-python's bundled one (a yardstick; None when none is
    there)."""
    import ctypes
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    import llamaref

    if not lib:
        lib = os.path.dirname(llamaref.find("libggml-cpu.so") or "")
    if not lib:
        try:
            import llama_cpp
        except ImportError:
            return None
        lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()

    class Traits(ctypes.Structure):
        _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                    ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]

    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
    tr = cpu.ggml_get_type_traits_cpu(int(t)).contents
    # the activations in the vec_dot type, by that type's from_float (IQ2_XXS ... have none of their own)
    act = cpu.ggml_get_type_traits_cpu(int(tr.vec_dot_type)).contents
    from_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(act.from_float or tr.from_float)
    vec_dot = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(tr.vec_dot)
    bs, ts = GGML_QUANT_SIZES[t]
    n = nbytes // ts * bs
    n -= n % 256
    w = random_weights(t, 1, n, rng)
    x = rng.standard_normal(n, dtype=np.float32)
    vbs, vts = GGML_QUANT_SIZES[T(tr.vec_dot_type)]
    y = np.zeros(n // vbs * vts + 64, np.uint8)
    from_float(x.ctypes.data, y.ctypes.data, n)
    s = np.zeros(1, np.float32)
    args = (n, s.ctypes.data, 0, w.ctypes.data, 0, y.ctypes.data, 0, 1)
    vec_dot(*args)
    best = 1e9
    for _ in range(reps):
        c0 = time.process_time()
        for _ in range(20):
            vec_dot(*args)
        best = min(best, (time.process_time() - c0) / 20)
    return w.nbytes / best / 1e9


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


#: independent vpdpbusd chains in the peak loop (more than latency x throughput on Zen 4 / Zen 5)
_PEAK_CHAINS = 12


def _vnni_loop_intrinsic():
    """``loop(n, seed) -> int64``: n iterations of _PEAK_CHAINS independent ``vpdpbusd zmm`` on registers
    (no loads): the machine's integer-dot ceiling, which the prefill GEMM (kernels/gemm.py) is bound by."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from quantkit.kernels.ir import I32, I64, _decl

    v16 = ir.VectorType(I32, 16)

    @intrinsic
    def loop(typingctx, n, seed):
        def codegen(context, b, signature, args):
            dp = _decl(b.module, "llvm.x86.avx512.vpdpbusd.512", v16, [v16] * 3)
            s = b.insert_element(ir.Constant(v16, None), b.trunc(args[1], I32), ir.Constant(I32, 0))
            s = b.shuffle_vector(s, s, ir.Constant(v16, [0] * 16))
            u, x = b.add(s, ir.Constant(v16, list(range(16)))), b.add(s, ir.Constant(v16, [3 * i + 1 for i in range(16)]))
            accs = [cgutils.alloca_once_value(b, b.add(s, ir.Constant(v16, [k] * 16))) for k in range(_PEAK_CHAINS)]
            with cgutils.for_range(b, args[0]):
                for a in accs:
                    b.store(b.call(dp, [b.load(a), u, x]), a)
            tot = b.load(accs[0])
            for a in accs[1:]:
                tot = b.add(tot, b.load(a))
            return b.sext(b.extract_element(tot, ir.Constant(I32, 0)), I64)

        return types.int64(types.int64, types.int64), codegen

    return loop


@functools.lru_cache(maxsize=None)
def _vnni_runner():
    """``run(n, threads)``: ``threads`` prange iterations, each one register-only loop of n steps."""
    loop = _vnni_loop_intrinsic()

    @njit_fast_parallel
    def run(n, th):
        s = 0
        for t in prange(th):
            s += loop(n, t + 1)
        return s

    return run


def vnni_peak(threads, n=20_000_000):
    """GOP/s (2 x int8 multiply-adds) of ``vpdpbusd zmm`` on ``threads`` threads, each running the
    register-only loop: the compute yardstick of the integer GEMM, as ``bandwidth`` is the GEMV's.
    None without 512-bit VNNI."""
    if not HAS_VNNI512:
        return None
    run = _vnni_runner()
    set_threads(threads)
    run(1000, threads)
    return n * _PEAK_CHAINS * threads * 128 / best_of(lambda: run(n, threads), 5) / 1e9


def wall_and_cpu(fn, reps):
    """[(wall s, CPU s of the process)] of ``reps`` calls of fn."""
    out = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    return out


def rates(nbytes, samples, threads):
    """(best wall GB/s, median wall GB/s, best CPU-time GB/s): the last is bytes per CPU-second times
    the thread count -- the rate if the threads had their cores to themselves, which a shared machine's
    wall clock does not show (time slices lost to other processes are not CPU time of this one)."""
    walls = sorted(w for w, _ in samples)
    cpu = min(c for _, c in samples) / threads
    return nbytes / walls[0] / 1e9, nbytes / walls[len(walls) // 2] / 1e9, nbytes / cpu / 1e9


def bandwidth_both(mib, threads, reps=5):
    """``bandwidth`` as ``rates``."""
    set_threads(threads)
    a = np.ones(mib * 2**20 // 4, np.float32)
    _psum(a)
    return rates(a.nbytes, wall_and_cpu(lambda: _psum(a), reps), threads)


def layer_matrices(shape_name):
    """(n_out, n_in) of one layer's seven matrices of a make_model.py shape, in decode order."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_model import SHAPES

    s = SHAPES[shape_name]
    if s.mla or s.delta or s.l_cache:   # not seven llama matrices per layer
        raise SystemExit(f"--shape {shape_name}: only shapes of llama's layer (attention + FFN) are timed here")
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    e, f = s.n_embd, s.n_ff
    return [(q, e), (kv, e), (kv, e), (e, q), (f, e), (f, e), (e, f)]


def gemv_shape(args, types, rng):
    """The --shape table (module docstring)."""
    mats = layer_matrices(args.shape)
    bw = {n: bandwidth_both(args.bw_mib, n) for n in (1, 2)}
    print(f"{args.shape}: one layer's matrices {', '.join(f'{o}x{i}' for o, i in mats)}; variant "
          f"{K.default_variant()}; load average {os.getloadavg()[0]:.2f}")
    print(f"memory bandwidth (prange sum over {args.bw_mib} MiB, best of 5), wall / CPU-time: 1 thread "
          f"{bw[1][0]:.1f} / {bw[1][2]:.1f} GB/s, 2 threads {bw[2][0]:.1f} / {bw[2][2]:.1f} GB/s")
    print("GB/s of weights: wall best / median, then per CPU-second x threads; 'of bw' = CPU-time GEMV rate /")
    print("CPU-time bandwidth (robust to other processes taking time slices), then the same of the wall rates")
    print()
    print("| type | layer MiB | ring copies | 1 thr wall | 1 thr CPU | of bw (CPU / wall) "
          "| 2 thr wall | 2 thr CPU | of bw (CPU / wall) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in types:
        bs, ts = GGML_QUANT_SIZES[t]
        layer = [random_weights(t, o, i, rng) for o, i in mats]
        nbytes = sum(w.nbytes for w in layer)
        copies = max(2, -(-(args.ring_mib << 20) // nbytes))
        kind = K.activation_kind(t)
        acts = {}
        for w in layer:
            n_in = w.shape[1] // ts * bs
            if n_in not in acts:
                acts[n_in] = K.quantize_activations(rng.standard_normal((1, n_in), dtype=np.float32), kind)
        outs = {w.shape[0]: np.empty((1, w.shape[0]), np.float32) for w in layer}
        # layouts timed A/B in turn within each repetition: the rows as in the file, and (where this CPU
        # has the kernel and --x8) the 8-row interleaved copy the decode step makes (kernels.pack_x8)
        layouts = {"rows": (K.matvec_kernel(t), lambda w: w)}
        if args.x8 and t in K.x8_types():
            layouts["x8"] = (K.matvec_x8_kernel(t), lambda w: K.pack_x8(w, t))
        passes = {}
        for name, (mv, prep) in layouts.items():
            big = np.empty(nbytes * copies, np.uint8)  # one allocation: numpy advises huge pages for it
            calls, off = [], 0
            for _ in range(copies):
                for w in layer:
                    p = prep(w)
                    v = big[off:off + p.nbytes].reshape(p.shape)
                    v[:] = p
                    calls.append((v, acts[w.shape[1] // ts * bs], outs[w.shape[0]]))
                    off += p.nbytes

            def one_pass(mv=mv, calls=calls):
                for w, a, o in calls:
                    mv(w, a[0], a[1], a[2], o, 16)

            passes[name] = (one_pass, big)
        del layer
        cells = {name: [] for name in passes}
        for n in (1, 2):
            set_threads(n)
            samples = {name: [] for name in passes}
            for name, (fn, _) in passes.items():
                fn()
            for _ in range(args.reps):
                for name, (fn, _) in passes.items():
                    samples[name] += wall_and_cpu(fn, 1)
            for name, (fn, big) in passes.items():
                best, med, cpu = rates(big.nbytes, samples[name], n)
                cells[name].append(f"{best:.1f} / {med:.1f} | {cpu:.1f} | {cpu / bw[n][2]:.0%} / {best / bw[n][0]:.0%}")
        for name in passes:
            label = t.name if name == "rows" else f"{t.name} {name}"
            print(f"| {label} | {nbytes / 2**20:.1f} | {copies} | {' | '.join(cells[name])} |", flush=True)
        del passes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(t.name for t in K.WEIGHT_TYPES))
    ap.add_argument("--mib", type=int, default=48, help="weight bytes per GEMV matrix (MiB)")
    ap.add_argument("--bw-mib", type=int, default=1024, help="array size for the bandwidth sum (MiB)")
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--shape", default="", help="a make_model.py shape name (e.g. llama-3.2-1b): time the "
                    "decode GEMVs on its layer's matrices read from DRAM (module docstring)")
    ap.add_argument("--ring-mib", type=int, default=512, help="--shape: total weight bytes of the ring (MiB)")
    ap.add_argument("--x8", action="store_true", help="--shape: also time the 8-row interleaved layout "
                    "(kernels.pack_x8) of the types that have it, A/B with the rows in file order")
    ap.add_argument("--ggml", action="store_true",
                    help="also time ggml's own vec_dot per core (needs --ggml-lib, $QUANTKIT_LLAMA_CPP's build "
                    "or llama-cpp-python)")
    ap.add_argument("--ggml-lib", default="", help="directory holding libggml-base.so and libggml-cpu.so "
                    "(default: $QUANTKIT_LLAMA_CPP/build/bin) for --ggml")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    types = [T[n.strip().upper()] for n in args.types.split(",") if n.strip()]
    if args.shape:
        gemv_shape(args, types, rng)
        return

    bw = {n: bandwidth(args.bw_mib, n) for n in (1, 2)}
    print(f"variant {K.default_variant()}  (vnni={K.HAS_VNNI})")
    print(f"memory bandwidth (prange sum over {args.bw_mib} MiB): 1 thread {bw[1]:.1f} GB/s, "
          f"2 threads {bw[2]:.1f} GB/s")
    print()
    print("GB/s = weight bytes / wall time; 'per core' = weight bytes / CPU time of one thread on a 1 MiB")
    print("matrix (less sensitive to other processes); ggml = its vec_dot the same way.")
    print()
    print("| type | n_in x n_out | MiB | compile s | GB/s 1 thr | GB/s 2 thr | of bandwidth (2 thr) "
          "| per core | ggml per core |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in types:
        bs, ts = GGML_QUANT_SIZES[t]
        n_in = 4096
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
        # per-core compute rate: CPU time of the serial build on a cache-resident 1 MiB matrix
        small = w[: max(1, 2**20 // w.shape[1])]
        so = np.empty((1, small.shape[0]), np.float32)
        kind = K.activation_kind(t)
        xq = K.quantize_activations(x, kind)
        mv = K.matvec_kernel(t, parallel=False)
        mv(small, *xq, so, 16)
        cpu = 1e9
        for _ in range(args.reps):
            c0 = time.process_time()
            for _ in range(20):
                mv(small, *xq, so, 16)
            cpu = min(cpu, (time.process_time() - c0) / 20)
        core = small.nbytes / cpu / 1e9
        g = ggml_vec_dot_rate(t, 2**20, rng, args.reps, args.ggml_lib) if args.ggml else None
        gs = f"{g:.1f}" if g is not None else "-"
        print(f"| {t.name} | {n_in} x {n_out} | {w.nbytes / 2**20:.0f} | {comp:.2f} | {res[1]:.1f} | "
              f"{res[2]:.1f} | {res[2] / bw[2]:.0%} | {core:.1f} | {gs} |", flush=True)

    if args.no_prefill:
        return
    print()
    m = args.prefill_tokens
    peak = {n: vnni_peak(n) for n in (1, 2)}
    print(f"prefill: {m} tokens x 2048 x 2048, GFLOP/s (integer GEMM: GOP/s)")
    if peak[1]:
        print(f"vpdpbusd zmm peak (register-only loop, {_PEAK_CHAINS} chains per thread): "
              f"1 thread {peak[1]:.0f} GOP/s, 2 threads {peak[2]:.0f} GOP/s")
    print("| type | 1 thr | 2 thr | of the vpdpbusd peak, 1 / 2 thr |")
    print("| --- | ---: | ---: | ---: |")
    for t in types:
        w = random_weights(t, 2048, 2048, rng)
        x = rng.standard_normal((m, 2048), dtype=np.float32)
        out = np.empty((m, 2048), np.float32)
        K.matmul(w, t, x, out=out)
        res = {}
        for n in (1, 2):
            set_threads(n)
            res[n] = 2.0 * m * 2048 * 2048 / best_of(lambda: K.matmul(w, t, x, out=out), 3) / 1e9
        frac = f"{res[1] / peak[1]:.0%} / {res[2] / peak[2]:.0%}" if peak[1] and integer_gemm(t) else "-"
        print(f"| {t.name} | {res[1]:.1f} | {res[2]:.1f} | {frac} |", flush=True)


if __name__ == "__main__":
    main()
