#!/usr/bin/env python3
"""Golden whole files for TQ1_0, TQ2_0, MXFP4, Q1_0, IQ3_XXS, IQ3_S: what llama-quantize writes when every
block matrix of a tiny model takes one of these types, with and without an importance matrix.

    python tools/make_lowbit_file_golden.py --bin <llama.cpp>/build/bin

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

OUT = HERE.parent / "tests" / "data" / "lowbit"
TYPES = ["tq1_0", "tq2_0", "mxfp4", "q1_0", "iq3_xxs", "iq3_s"]
ARCH, SEED = "qwen3", 1


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def cases() -> list[tuple[str, str, bool]]:
    """(case name, type, with imatrix)."""
    return [(f"{t}-{'imatrix' if im else 'ref'}", t, im) for t in TYPES for im in (False, True)]


def quantize_args(t: str, imatrix: Path | None) -> list[str]:
    """The options both llama-quantize and quantkit quantize get (before INPUT OUTPUT TYPE NTHREADS)."""
    return (["--imatrix", str(imatrix)] if imatrix else []) + ["--tensor-type", f"blk\\..*={t}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp's build/bin (llama-quantize, llama-imatrix)")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        model = write_model(td / "model.gguf", ARCH, "F16", seed=SEED)
        words = np.random.default_rng(0).choice(["the", "a", "model", "weight", "block", "scale", "grid", "of",
                                                 "and", "to", "quant", "row", "bit", "sign"], 4000)
        text = td / "text.txt"
        text.write_text(" ".join(words))
        imat = OUT / "imatrix.gguf"
        subprocess.run([str(args.bin / "llama-imatrix"), "-m", str(model), "-f", str(text), "-o", str(imat),
                        "-c", "64", "--chunks", "4", "-t", "1"], check=True, capture_output=True)
        res = {}
        for name, t, im in cases():
            out = td / f"{name}.gguf"
            # run in OUT with the imatrix's bare name: llama-quantize records that path in the file's metadata
            cmd = [str(args.bin / "llama-quantize"), *quantize_args(t, Path(imat.name) if im else None), str(model),
                   str(out), "Q8_0", "1"]
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=OUT)
            entry = {"args": quantize_args(t, Path(imat.name) if im else None), "returncode": r.returncode}
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
