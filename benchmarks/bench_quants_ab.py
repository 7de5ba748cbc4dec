#!/usr/bin/env python3
"""Two quantkit trees side by side, every type: the same bytes, and the CPU time of each codec path.

    .venv/bin/python benchmarks/bench_quants_ab.py \\
        --base /path/to/other/checkout [--rounds 5] [--rows 128] [--cols 2048] [--types Q4_0,Q8_0]

For a change to quants/ that must not change a byte or lose speed. The script starts one worker process
per tree (this interpreter, ``PYTHONPATH`` = the tree, ``NUMBA_NUM_THREADS=1``, the tree's own
``.numba_cache`` unless ``--base-cache`` says otherwise) and drives both over a pipe:

* bytes -- every type's quantize without and (where the bytes depend on it) with an importance matrix on
  random rows and on edge rows (zeros, constants, one spike, subnormals, values near fp16's limit, ties
  at .5, one-block rows), the dequantization of those bytes and of random bytes; every array must be
  equal bit for bit (floats compared as bits, so NaN from random fp16 scales compare too). Exit 1 if not.
* time -- per type and path (``ref``: no imatrix, ``imatrix``, ``deq``: dequantize), the CPU time
  (user+sys of the worker, ``time.process_time``) per call on a rows x cols matrix, each call repeated
  until 0.1 s of CPU. The two workers alternate per measurement (A B, then B A), so a loaded machine
  disturbs both alike; the table shows the median over ``--rounds`` of base/new per call (>1: new is
  faster), and the smallest and largest round's ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------------
# worker: runs inside one tree
# ---------------------------------------------------------------------------------------------
def _edge_rows(n: int, rng) -> np.ndarray:
    r = [np.zeros(n), np.full(n, 0.75), np.full(n, -3.0), np.zeros(n), np.full(n, 1e-40),
         rng.standard_normal(n) * 1e-38, rng.standard_normal(n) * 6e4, (np.arange(n) % 7 - 3) * 0.5,
         np.where(np.arange(n) % 2, 1.0, -1.0), rng.standard_t(4, n), np.linspace(-1, 1, n)]
    r[3][n // 3] = -5.0
    return np.array(r, dtype=np.float32)


def _cases(q, rows: int, cols: int):
    """(name, x, imatrix or None) of one type; the same for both trees (fixed seeds)."""
    bs = q.block_size
    rng = np.random.default_rng(1234)
    out = [("rand", rng.standard_normal((rows, cols)).astype(np.float32))]
    for n in (bs, max(bs, 512)):
        out.append((f"edge{n}", _edge_rows(n, np.random.default_rng(n))))
    for name, x in out:
        w = np.random.default_rng(7).chisquare(2, x.shape[1]).astype(np.float32)
        if not q.requires_imatrix:
            yield f"{name}/ref", x, None
        if q.uses_imatrix:
            yield f"{name}/imatrix", x, w


def _dump(types, rows, cols, path):
    import quantkit.quants as Q

    arrays = {}
    for t in types:
        q = Q.traits(t)
        for name, x, w in _cases(q, rows, cols):
            b = q.quantize(x, w)
            arrays[f"{t}/{name}/bytes"] = b
            arrays[f"{t}/{name}/deq"] = q.dequantize(b).view(np.uint32)
        rb = np.random.default_rng(99).integers(0, 256, (16, 4 * q.type_size), dtype=np.uint8)
        arrays[f"{t}/randbytes/deq"] = q.dequantize(rb).view(np.uint32)
    np.savez(path, **arrays)
    return len(arrays)


def _cpu_per_call(fn, budget=0.1):
    fn()
    n = 0
    t0 = time.process_time()
    while True:
        fn()
        n += 1
        dt = time.process_time() - t0
        if dt >= budget:
            return dt / n


def _worker():
    import quantkit.quants as Q

    data = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "types":
            res = {t.name: (["ref"] if not q.requires_imatrix else []) + (["imatrix"] if q.uses_imatrix else [])
                   + ["deq"] for t, q in Q.TRAITS.items()}
        elif cmd["op"] == "dump":
            res = _dump(cmd["types"], cmd["rows"], cmd["cols"], cmd["path"])
        else:  # time
            q = Q.traits(cmd["type"])
            key = (cmd["type"], cmd["rows"], cmd["cols"])
            if key not in data:
                rng = np.random.default_rng(5)
                x = rng.standard_normal((cmd["rows"], cmd["cols"])).astype(np.float32)
                w = rng.chisquare(2, cmd["cols"]).astype(np.float32)
                data[key] = (x, w, q.quantize(x, w if q.requires_imatrix else None))
            x, w, b = data[key]
            out = np.empty_like(b)
            deq = np.empty(x.shape, np.float32)
            fn = {"ref": lambda: q.quantize_into(x, out, None),
                  "imatrix": lambda: q.quantize_into(x, out, w),
                  "deq": lambda: q.dequantize_into(b, deq)}[cmd["path"]]
            res = _cpu_per_call(fn)
        print(json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------
class Tree:
    def __init__(self, root: str, cache: str):
        env = dict(os.environ, PYTHONPATH=root, NUMBA_NUM_THREADS="1", NUMBA_CACHE_DIR=cache)
        self.root = root
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], cwd=root, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"the worker in {self.root} died")
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main() -> int:
    if sys.argv[1:] == ["--worker"]:
        _worker()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the other checkout (its root, holding quantkit/)")
    ap.add_argument("--base-cache", help="NUMBA_CACHE_DIR for the base tree (default: BASE/.numba_cache)")
    ap.add_argument("--new", default=os.path.dirname(HERE), help="the changed checkout (default: this one)")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5)")
    ap.add_argument("--rows", type=int, default=128, help="rows of the timed matrix (default 128)")
    ap.add_argument("--cols", type=int, default=2048, help="columns of the timed matrix (default 2048)")
    ap.add_argument("--types", help="comma-separated type names (default: every type both trees have)")
    ap.add_argument("--no-bytes", action="store_true", help="skip the bytes comparison")
    ap.add_argument("--no-time", action="store_true", help="skip the timing")
    ap.add_argument("--scratch", default=os.path.join(os.path.dirname(HERE), "scratch"),
                    help="where the two dumps go (default: the checkout's scratch/)")
    a = ap.parse_args()
    a.base, a.new, a.scratch = (os.path.abspath(p) for p in (a.base, a.new, a.scratch))
    base = Tree(a.base, a.base_cache or os.path.join(a.base, ".numba_cache"))
    new = Tree(a.new, os.path.join(a.new, ".numba_cache"))
    paths = new.ask(op="types")
    bpaths = base.ask(op="types")
    types = [t for t in paths if t in bpaths]
    differ = [t for t in types if paths[t] != bpaths[t]]
    if differ:
        print(f"the trees disagree on which paths use an imatrix: {differ}")
    if a.types:
        types = [t for t in a.types.split(",") if t in types]
    rc = 1 if differ else 0
    if not a.no_bytes:
        os.makedirs(a.scratch, exist_ok=True)
        fa, fb = os.path.join(a.scratch, "ab_base.npz"), os.path.join(a.scratch, "ab_new.npz")
        n = base.ask(op="dump", types=types, rows=8, cols=1024, path=fa)
        new.ask(op="dump", types=types, rows=8, cols=1024, path=fb)
        za, zb = np.load(fa), np.load(fb)
        bad = [k for k in za.files if k not in zb.files or za[k].shape != zb[k].shape
               or not np.array_equal(za[k], zb[k])]
        bad += [k for k in zb.files if k not in za.files]
        print(f"bytes: {n} arrays over {len(types)} types, {len(bad)} different" + (f": {bad}" if bad else ""))
        rc = 1 if bad or differ else 0
    if not a.no_time:
        ratios: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for rnd in range(a.rounds):
            for t in types:
                for p in paths[t]:
                    cmd = dict(op="time", type=t, path=p, rows=a.rows, cols=a.cols)
                    if rnd % 2 == 0:
                        tb, tn = base.ask(**cmd), new.ask(**cmd)
                    else:
                        tn, tb = new.ask(**cmd), base.ask(**cmd)
                    ratios.setdefault((t, p), []).append(tb / tn)
                    cpu.setdefault((t, p), []).append((tb, tn))
            print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr, flush=True)
        print(f"\nCPU time per call, {a.rows} x {a.cols} float32, 1 numba thread, {a.rounds} rounds A/B "
              f"interleaved; base/new (>1: new faster)\n")
        print("| type | path | base ms | new ms | base/new median | min | max |")
        print("|---|---|---|---|---|---|---|")
        for (t, p), r in ratios.items():
            b = np.median([c[0] for c in cpu[(t, p)]]) * 1e3
            nn = np.median([c[1] for c in cpu[(t, p)]]) * 1e3
            print(f"| {t} | {p} | {b:.3f} | {nn:.3f} | {np.median(r):.2f} | {min(r):.2f} | {max(r):.2f} |")
    base.close()
    new.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
