#!/usr/bin/env python3
"""Regenerate the ggml digests of tests/test_symmetric.py and tests/test_iq4.py (their ``GGML_SHA256``).

Each digest is the sha256 of the real ggml's bytes for one key ``(type, n, with_imatrix)``:
``ggml_quantize_chunk(type, golden_input(GOLDEN_ROWS, n), dst, 0, GOLDEN_ROWS, n, NULL or
golden_imatrix(n))`` (Q8_K, which ggml_quantize_chunk does not handle: ``quantize_row_q8_K_ref`` into a
zeroed buffer), called through tools/make_golden.py's ctypes binding. The inputs and the keys come from
the test module (its numpy input builders and its table); the bytes only from ggml, never from quantkit.

    .venv/bin/python tools/make_digest_golden.py [--lib <llama.cpp>/build/bin/libggml-base.so] [--write]

Runs under .venv's python (it imports the test modules, which import quantkit), so libggml-base.so
comes from ``--lib`` or ``$QUANTKIT_LLAMA_CPP/build/bin`` (tools/llamaref.py; when neither has it the
script says in one line what to set). It prints every digest that differs from the recorded one and
exits 1 if any does; ``--write`` then puts ggml's digests into the test file.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TESTS))
import make_golden as mg  # noqa: E402

#: the test modules whose GGML_SHA256 this script makes (their types are all in make_golden.GGML_TYPES)
MODULES = ("test_symmetric", "test_iq4")


def ggml_digests(g: mg.Ggml, module) -> dict[tuple[str, int, bool], str]:
    """ggml's digest for every key of ``module.GGML_SHA256``, in the table's order."""
    out = {}
    for name, n, with_imatrix in module.GGML_SHA256:
        x = module.golden_input(module.GOLDEN_ROWS, n)
        y = g.quantize(name, x, module.golden_imatrix(n) if with_imatrix else None)
        out[(name, n, with_imatrix)] = hashlib.sha256(y.tobytes()).hexdigest()
    return out


def write_table(path: Path, digests: dict[tuple[str, int, bool], str]) -> None:
    """Replace the body of ``GGML_SHA256 = {...}`` in ``path`` with ``digests``, one key a line."""
    body = "".join(f'    ("{name}", {n}, {imat}): "{h}",\n' for (name, n, imat), h in digests.items())
    text = path.read_text(encoding="utf-8")
    new, count = re.subn(r"(?ms)^(GGML_SHA256 = \{\n).*?^(\}\n)", lambda m: m.group(1) + body + m.group(2), text)
    assert count == 1, f"{path}: no single GGML_SHA256 table"
    path.write_text(new, encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, help="path to libggml-base.so (default: $QUANTKIT_LLAMA_CPP/build/bin's)")
    ap.add_argument("--write", action="store_true", help="write ggml's digests into the test files")
    args = ap.parse_args(argv)
    g = mg.Ggml(args.lib or mg.find_lib())
    print(f"ggml {g.version()} from {g.path.name}")
    differ = 0
    for name in MODULES:
        module = __import__(name)
        digests = ggml_digests(g, module)
        changed = {k: h for k, h in digests.items() if module.GGML_SHA256[k] != h}
        for k, h in changed.items():
            print(f"{name}: {k}: recorded {module.GGML_SHA256[k]}, ggml {h}")
        print(f"{name}: {len(digests) - len(changed)} of {len(digests)} digests as recorded")
        if changed and args.write:
            write_table(TESTS / f"{name}.py", digests)
            print(f"{name}: wrote {len(changed)} new digests")
        differ += len(changed)
    return 1 if differ and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
