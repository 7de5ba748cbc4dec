#!/usr/bin/env python3
"""Write tests/data/golden/ggml_golden_iq2.npz: IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M from the real ggml.

The same method and key layout as tools/make_golden.py (whose ctypes wrapper, cases and deduplication
it reuses; see docs/golden.md), for the lattice types built on ggml's ``iq2xs_init_impl`` tables, plus
a few cases of their own: longer rows (768, 2048), weight-like Student-t rows and small values.

Paths: ``imatrix`` for every type; ``ref`` (``quant_weights`` NULL) only for IQ2_S and IQ1_M --
``ggml_quantize_chunk`` asserts ``imatrix != NULL`` for the types ``ggml_quantize_requires_imatrix``
names (IQ2_XXS, IQ2_XS, IQ1_S), which would abort the process, so there is nothing to record for them.

Needs only numpy and ctypes (never quantkit)::

    python tools/make_golden_iq2.py [--lib <llama.cpp>/build/bin/libggml-base.so]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402

# ggml's enum ggml_type values (include/ggml.h)
IQ2_TYPES = {"IQ2_XXS": 16, "IQ2_XS": 17, "IQ1_S": 19, "IQ2_S": 22, "IQ1_M": 29}
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
# ggml_quantize_requires_imatrix (ggml/src/ggml.c): ggml_quantize_chunk aborts on a NULL imatrix
REQUIRES_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
mg.GGML_TYPES.update(IQ2_TYPES)  # the wrapper looks type ids up there

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden" / "ggml_golden_iq2.npz"


def make_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """make_golden's eleven cases, then rows of other lengths and scales."""
    out = mg.make_cases()
    extra = {
        "student_t5_2048": np.random.default_rng(21).standard_t(5, (2, 2048)) * 0.02,
        "normal_768": np.random.default_rng(22).standard_normal((3, 768)),
        "small_1e-6": np.random.default_rng(23).standard_normal((2, 512)) * 1e-6,
        "sparse_512": np.random.default_rng(24).standard_normal((3, 512))
        * (np.random.default_rng(25).random((3, 512)) < 0.15),
    }
    for i, (name, x) in enumerate(extra.items()):
        g = np.random.default_rng(200 + i)
        w = g.uniform(0.0, 4.0, x.shape[1]) ** 2
        w[g.random(x.shape[1]) < 0.1] = 0.0
        if i % 2 == 0:
            w[64:96] = 0.0
        out[name] = (np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(w, dtype=np.float32))
    return out


def paths(t: str) -> list[str]:
    return ["imatrix"] if t in REQUIRES_IMATRIX else ["ref", "imatrix"]


def main(argv=None) -> int:
    args = mg.arg_parser(__doc__, DEFAULT_OUT).parse_args(argv)
    lib_path = args.lib or mg.find_lib()
    g = mg.Ggml(lib_path)
    cases = make_cases()
    arrays, rejected, dequant_how = mg.quantize_cases(g, TYPES, cases, paths)
    meta = {
        "what": "bytes from ggml_quantize_chunk and ggml's own dequantization (traits->to_float), IQ2/IQ1 types",
        "keys": "as ggml_golden.npz: x:<case>, w:<case>, q:<TYPE>:<case>:<ref|imatrix>, d:<TYPE>:<case>:<path>",
        "types": TYPES,
        "cases": list(cases),
        "paths": {t: paths(t) for t in TYPES},
        "requires_imatrix": sorted(REQUIRES_IMATRIX),
        "quantized_with": {t: "ggml_quantize_chunk" for t in TYPES},
        "dequantized_with": dequant_how,
        "rejected_by_ggml_validate_row_data": rejected,
        **mg.provenance(g, lib_path, "not installed (library given with --lib)",
                        ["python", "tools/make_golden_iq2.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    arrays, aliases = mg.write_golden(args.out, arrays, meta)
    nq = sum(k.startswith("q:") for k in arrays) + sum(k.startswith("q:") for k in aliases)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): {len(cases)} cases, {nq} (type, case, path) "
          f"entries; ggml {meta.get('ggml_version', '?')} ({meta.get('ggml_commit', '?')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
