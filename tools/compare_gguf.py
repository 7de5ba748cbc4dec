"""Compare two GGUF files: metadata (order, types, values), tensor order, types, shapes and bytes.

    python tools/compare_gguf.py A.gguf B.gguf [--ignore-key general.name ...]

Exit 0 when identical (apart from ignored keys), 1 otherwise. Uses gguf-py only.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import numpy as np
import gguf


def describe(path: str):
    r = gguf.GGUFReader(path)
    kv = []
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        kv.append((k, [t.name for t in f.types], f.contents()))
    tensors = [(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.data_offset - r.data_offset),
                np.asarray(t.data).reshape(-1).view(np.uint8)) for t in r.tensors]
    return r, kv, tensors


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--ignore-key", action="append", default=[])
    ap.add_argument("--max-report", type=int, default=10)
    args = ap.parse_args()
    ra, kva, ta = describe(args.a)
    rb, kvb, tb = describe(args.b)
    problems = []
    ka = [k for k in kva if k[0] not in args.ignore_key]
    kb = [k for k in kvb if k[0] not in args.ignore_key]
    if [k[0] for k in ka] != [k[0] for k in kb]:
        problems.append(f"metadata keys differ in order/content:\n  A: {[k[0] for k in ka]}\n  B: {[k[0] for k in kb]}")
    for x, y in zip(ka, kb):
        if x[0] == y[0] and (x[1] != y[1] or x[2] != y[2]):
            vx = x[2] if not isinstance(x[2], list) or len(x[2]) < 8 else f"[{len(x[2])} items]"
            vy = y[2] if not isinstance(y[2], list) or len(y[2]) < 8 else f"[{len(y[2])} items]"
            problems.append(f"key {x[0]}: A {x[1]} {vx!r} vs B {y[1]} {vy!r}")
    if [t[0] for t in ta] != [t[0] for t in tb]:
        problems.append("tensor order differs")
    db = {t[0]: t for t in tb}
    n_bad = 0
    for t in ta:
        u = db.get(t[0])
        if u is None:
            problems.append(f"tensor {t[0]} missing in B")
            continue
        if t[1:4] != u[1:4] or not np.array_equal(t[4], u[4]):
            n_bad += 1
            if n_bad <= args.max_report:
                extra = ""
                if t[4].size == u[4].size:
                    extra = f", {int(np.count_nonzero(t[4] != u[4]))} bytes differ"
                problems.append(f"tensor {t[0]}: A {t[1]} {t[2]} off {t[3]} vs B {u[1]} {u[2]} off {u[3]}{extra}")
    if ra.data_offset != rb.data_offset:
        problems.append(f"data offset A {ra.data_offset} vs B {rb.data_offset}")
    ha = hashlib.sha256(open(args.a, "rb").read()).hexdigest()
    hb = hashlib.sha256(open(args.b, "rb").read()).hexdigest()
    print(f"A sha256 {ha}\nB sha256 {hb}")
    print(f"{len(ta)} tensors; {n_bad} differ")
    for p in problems:
        print(p)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
