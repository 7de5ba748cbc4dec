#!/usr/bin/env python3
"""Golden whole files for the types of issue #15: what llama-quantize writes when every block matrix of a
tiny model takes one of TQ1_0, TQ2_0, MXFP4, Q1_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M
(``--tensor-type``), with and without an importance matrix, and what it writes for each of the new file
types (``FILE_TYPES``: llama.cpp's own per-tensor mix, ``llama_tensor_get_type``) with the imatrix.

    python tools/make_lowbit_file_golden.py [--bin <llama.cpp>/build/bin]    # default: $QUANTKIT_LLAMA_CPP's

Writes tests/data/lowbit/:

* ``imatrix.gguf`` -- llama-imatrix's importance matrix of the model (4 chunks of 64 tokens of a seeded
  word sequence), kept so the test needs no llama.cpp;
* ``files.json``   -- the model's sha256 and, per case, llama-quantize's options, exit status and the
  output's sha256 (or its refusal line: IQ3_XXS without an imatrix). llama-quantize runs in that
  directory with the imatrix's bare name, which it records in the output's metadata; the test does too.

The model is tests/archmodels.py's qwen3 (256 wide, 2 layers, F16 matrices; seed 1): every matrix row is a
multiple of 256, so ``--tensor-type 'blk\\..*=TYPE'`` gives every layer matrix the type; token_embd and
output take Q8_0's (the file type). Needs only numpy and gguf (no quantkit).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from archmodels import write_model  # noqa: E402

import llamaref  # noqa: E402  (tools/, this script's folder)

OUT = HERE.parent / "tests" / "data" / "lowbit"
TYPES = ["tq1_0", "tq2_0", "mxfp4", "q1_0", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"]
#: llama-quantize's file types added with these codecs, each run with the imatrix and no overrides
FILE_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M",
              "TQ1_0", "TQ2_0", "Q1_0", "MXFP4_MOE", "Q2_K_S"]
ARCH, SEED = "qwen3", 1


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def cases() -> list[tuple[str, str | None, bool, str]]:
    """(case name, tensor type or None, with imatrix, file type)."""
    return ([(f"{t}-{'imatrix' if im else 'ref'}", t, im, "Q8_0") for t in TYPES for im in (False, True)]
            + [(f"ftype-{f.lower()}", None, True, f) for f in FILE_TYPES])


def quantize_args(t: str | None, imatrix: Path | None) -> list[str]:
    """The options both llama-quantize and quantkit quantize get (before INPUT OUTPUT TYPE NTHREADS)."""
    return (["--imatrix", str(imatrix)] if imatrix else []) + (["--tensor-type", f"blk\\..*={t}"] if t else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, help="llama.cpp's build/bin (llama-quantize, llama-imatrix; "
                    "default: $QUANTKIT_LLAMA_CPP/build/bin)")
    ap.add_argument("--keep-imatrix", action="store_true", help="quantize with the committed imatrix.gguf "
                    "instead of making it again (its sums depend on the CPU llama-imatrix ran on)")
    args = ap.parse_args(argv)
    args.bin = llamaref.need_bin_dir(args.bin)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        model = write_model(td / "model.gguf", ARCH, "F16", seed=SEED)
        words = np.random.default_rng(0).choice(["the", "a", "model", "weight", "block", "scale", "grid", "of",
                                                 "and", "to", "quant", "row", "bit", "sign"], 4000)
        text = td / "text.txt"
        text.write_text(" ".join(words))
        imat = OUT / "imatrix.gguf"
        # run in td with the text's bare name: llama-imatrix records that path in the file it writes
        if not args.keep_imatrix:
            subprocess.run([str(args.bin / "llama-imatrix"), "-m", str(model), "-f", text.name, "-o", str(imat),
                            "-c", "64", "--chunks", "4", "-t", "1"], check=True, capture_output=True, cwd=td)
        res = {}
        for name, t, im, ftype in cases():
            out = td / f"{name}.gguf"
            # run in OUT with the imatrix's bare name: llama-quantize records that path in the file's metadata
            cmd = [str(args.bin / "llama-quantize"), *quantize_args(t, Path(imat.name) if im else None), str(model),
                   str(out), ftype, "1"]
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=OUT)
            entry = {"args": quantize_args(t, Path(imat.name) if im else None), "file_type": ftype,
                     "returncode": r.returncode}
            if r.returncode == 0:
                entry["sha256"] = sha256(out)
            else:
                lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "failed to quantize:" in ln]
                entry["error"] = (lines or (r.stdout + r.stderr).splitlines() or [""])[-1].strip()
            res[name] = entry
            print(name, entry.get("sha256", entry.get("error")))
        meta = {
            "model": {"arch": ARCH, "variant": "F16", "seed": SEED, "sha256": sha256(model)},
            "imatrix": {"sha256": sha256(imat), "command": "llama-imatrix -m model.gguf -f text.txt -o imatrix.gguf "
                                                           "-c 64 --chunks 4 -t 1"},
            "file_type": "Q8_0",
            "llama_cpp": subprocess.run([str(args.bin / "llama-quantize"), "--version"], capture_output=True,
                                        text=True).stderr.strip().splitlines()[:2],
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "python tools/make_lowbit_file_golden.py --bin <llama.cpp>/build/bin",
            "cases": res,
        }
    (OUT / "files.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
