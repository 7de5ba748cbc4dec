"""Golden check of ``quantize --target-bpw``: llama-quantize, given the --tensor-type-file quantkit wrote,
writes the same file byte for byte.

    .venv/bin/python tools/make_target_bpw_golden.py \
        [--llama-quantize <llama.cpp>/build/bin/llama-quantize]    # default: $QUANTKIT_LLAMA_CPP's, else PATH

Steps: the bundled SmolLM2 is converted to F16 by quantkit (tests/test_quantize.py checks that this
F16 is llama.cpp's own conversion, byte for byte); ``quantkit quantize --target-bpw 5.0 --imatrix
synthetic.imatrix.gguf ... Q4_K_M`` writes its file and its ``--tensor-type-out``; the real
llama-quantize then runs with ``--imatrix synthetic.imatrix.gguf --tensor-type-file <that file>`` (from
tests/data/quantize, so both record the same imatrix path). Recorded: the type file
(tests/data/quantize/target_bpw_5.0.tensor-types.txt) and both outputs' sha256 and per-tensor types in
tests/data/quantize/target_bpw.json. The script fails if the two files differ.

tests/test_target_bpw.py replays quantkit's side without llama.cpp: the same options must choose the
recorded types and give the recorded sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

import llamaref  # tools/, this script's folder

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "quantize"
TARGET = "5.0"
FTYPE = "Q4_K_M"
TYPES_FILE = f"target_bpw_{TARGET}.tensor-types.txt"


def describe(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    return {
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "size": path.stat().st_size,
        "tensors": [[t.name, t.tensor_type.name,
                     hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()[:16]] for t in r.tensors],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-quantize", help="path of llama.cpp's llama-quantize binary (default: "
                    "$QUANTKIT_LLAMA_CPP/build/bin's, else PATH)")
    a = ap.parse_args()
    a.llama_quantize = llamaref.need("llama-quantize", a.llama_quantize)
    qk = [sys.executable, "-m", "quantkit"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        f16 = tmp / "f16.gguf"
        bundled = subprocess.run(qk + ["bundled-model"], check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(qk + ["quantize", "-q", "--allow-requantize", bundled, str(f16), "F16"], check=True)
        ours, ref = tmp / "ours.gguf", tmp / "ref.gguf"
        run = subprocess.run(qk + ["quantize", "-q", "--imatrix", "synthetic.imatrix.gguf", "--target-bpw", TARGET,
                                   "--tensor-type-out", TYPES_FILE, str(f16), str(ours), FTYPE],
                             check=True, cwd=DATA, capture_output=True, text=True)
        subprocess.run([a.llama_quantize, "--imatrix", "synthetic.imatrix.gguf", "--tensor-type-file", TYPES_FILE,
                        str(f16), str(ref), FTYPE, "2"], check=True, cwd=DATA,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d_ours, d_ref = describe(ours), describe(ref)
        doc = {
            "made_by": "tools/make_target_bpw_golden.py",
            "target_bpw": float(TARGET),
            "ftype": FTYPE,
            "imatrix": "synthetic.imatrix.gguf",
            "tensor_type_file": TYPES_FILE,
            "llama_quantize": d_ref,
            "quantkit_sha256": d_ours["sha256"],
            "quantkit_log": [line for line in run.stderr.splitlines() if line.startswith("target-bpw")],
        }
        (DATA / "target_bpw.json").write_text(json.dumps(doc, indent=1) + "\n")
        if d_ours != d_ref:
            print("MISMATCH: quantkit and llama-quantize wrote different files", file=sys.stderr)
            return 1
        print(f"identical: {d_ref['sha256']} ({d_ref['size']} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
