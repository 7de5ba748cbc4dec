#!/usr/bin/env python3
"""Write tests/data/golden/ggml_golden_lowbit.npz: ggml's bytes and floats for TQ1_0, TQ2_0, MXFP4, Q1_0,
IQ3_XXS and IQ3_S (the types of issue #15 this file covers), the same way tools/make_golden.py does it
for the first sixteen types (see docs/golden.md): ctypes on libggml-base.so, never quantkit.

    python tools/make_golden_lowbit.py [--lib <llama.cpp>/build/bin/libggml-base.so]

Keys are those of make_golden.py: ``x:<case>``, ``w:<case>``, ``q:<TYPE>:<case>:<ref|imatrix>`` (bytes
of ``ggml_quantize_chunk`` with ``quant_weights`` NULL or the case's weights), ``d:<TYPE>:<case>:<path>``
(ggml's ``to_float`` of those bytes) and a JSON ``meta`` with provenance and the dedup ``aliases``.
The cases are make_golden.py's eleven plus a few for these types' own edges: 1024-wide rows,
block maxima at and next to powers of two (MXFP4's shared exponent comes from ``floorf(log2f(amax))``),
values at exact halves of the block maximum (``lroundf`` ties in TQ1_0 / TQ2_0), signed zeros
(Q1_0 stores ``x >= 0``) and float32 subnormals.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402  (the shared ctypes binding, the base cases and the dedup)

# ggml's enum ggml_type values (include/ggml.h)
NEW_TYPES = {"TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39, "Q1_0": 41, "IQ3_XXS": 18, "IQ3_S": 21}
TYPES = list(NEW_TYPES)

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden" / "ggml_golden_lowbit.npz"


def _weights(seed: int, n: int, zero_block: bool) -> np.ndarray:
    """make_golden.py's recipe: squared uniform activations, ~10% zero columns, maybe a zero 32-block."""
    g = np.random.default_rng(seed)
    w = g.uniform(0.0, 4.0, n) ** 2
    w[g.random(n) < 0.1] = 0.0
    if zero_block:
        w[:32] = 0.0
    return np.ascontiguousarray(w, dtype=np.float32)


def extra_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out: dict[str, np.ndarray] = {}
    g = np.random.default_rng(21)
    out["student_t3_1024"] = g.standard_t(3, (4, 1024)) * 0.05

    # block maxima (per 32 values, so per MXFP4 block) at 2^k, just below and just above it
    x = np.random.default_rng(22).uniform(-1.0, 1.0, (4, 512))
    k = np.arange(-6, 10)
    below = np.nextafter(np.float32(1.0), np.float32(0.0))
    for r in range(4):
        for b in range(16):
            m = np.float32(2.0) ** np.float32(k[(b + 3 * r) % len(k)])
            m = m * (below if (b + r) % 3 == 1 else np.float32(1.0) + np.float32(2.0 ** -23) * ((b + r) % 3 == 2))
            blk = x[r, 32 * b:32 * b + 32] * m * 0.9
            blk[(5 * b + r) % 32] = -m if b % 2 else m
            x[r, 32 * b:32 * b + 32] = blk
    out["pow2_maxima"] = x

    # exact halves of the block maximum, and signed zeros
    h = np.random.default_rng(23).integers(-2, 3, (4, 512)) * 0.5
    h[:, ::64] = 1.0
    h[1] *= 3.0
    h[2] = np.where(h[2] == 0, -0.0, h[2])
    h[3, 128:256] = -0.0
    out["halves_signed_zero"] = h

    # float32 subnormals: block maxima below 2**-126 (and below 2**-128, where 1/amax is inf)
    s = np.random.default_rng(24).standard_normal((2, 512))
    s[0] *= 1e-39
    s[1] *= 1e-41
    out["subnormal"] = s

    cases = {}
    for i, (name, a) in enumerate(out.items()):
        a = np.ascontiguousarray(a, dtype=np.float32)
        cases[name] = (a, _weights(200 + i, a.shape[1], i % 2 == 0))
    return cases


def main(argv=None) -> int:
    args = mg.arg_parser(__doc__, DEFAULT_OUT).parse_args(argv)
    mg.GGML_TYPES.update(NEW_TYPES)
    lib_path = args.lib or mg.find_lib()
    g = mg.Ggml(lib_path)
    assert all(g.traits(t).to_float for t in TYPES)
    cases = {**mg.make_cases(), **extra_cases()}
    arrays, rejected, _ = mg.quantize_cases(g, TYPES, cases, lambda t: ("ref", "imatrix"))
    meta = {
        "what": "bytes from ggml_quantize_chunk and ggml's traits->to_float",
        "keys": "as ggml_golden.npz (tools/make_golden.py)",
        "types": TYPES,
        "cases": list(cases),
        "paths": {t: ["ref", "imatrix"] for t in TYPES},
        "rejected_by_ggml_validate_row_data": rejected,
        **mg.provenance(g, lib_path, "not installed (library loaded with --lib)",
                        ["python", "tools/make_golden_lowbit.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    arrays, aliases = mg.write_golden(args.out, arrays, meta)
    nq = sum(k.startswith("q:") for k in arrays) + sum(k.startswith("q:") for k in aliases)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): {len(cases)} cases, {nq} entries; "
          f"ggml {meta.get('ggml_version', '?')} ({meta.get('ggml_commit', '?')}); rejected: {rejected}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
