"""Golden file of ``quantize --tensor-type-file`` with a recipe of per-tensor types: what the real
llama-quantize writes for it.

    .venv/bin/python tools/make_tensor_type_file_golden.py \
        [--llama-quantize <llama.cpp>/build/bin/llama-quantize]    # default: $QUANTKIT_LLAMA_CPP's, else PATH

The recipe, tests/data/quantize/mixed.tensor-types.txt, is a fixed input: 211 ``^name$=type`` lines in
six types, as ``quantize --target-bpw --tensor-type-out`` writes them (it was written once that way;
nothing here regenerates it from quantkit). Steps: the bundled SmolLM2 is converted to F16 by quantkit
(tests/test_quantize.py checks that this F16 is llama.cpp's own conversion, byte for byte); llama-quantize
then runs with ``--imatrix synthetic.imatrix.gguf --tensor-type-file mixed.tensor-types.txt ... Q4_K_M``
from tests/data/quantize. Recorded in tests/data/quantize/tensor_type_file.json: its output's sha256,
size and per-tensor types (``llama_quantize``). tests/test_target_bpw.py checks that plain ``quantkit
quantize`` with the same options writes that file.
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
GOLDEN = DATA / "tensor_type_file.json"


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
    doc = json.loads(GOLDEN.read_text())
    qk = [sys.executable, "-m", "quantkit"]
    with tempfile.TemporaryDirectory() as tmp:
        f16, ref = Path(tmp) / "f16.gguf", Path(tmp) / "ref.gguf"
        bundled = subprocess.run(qk + ["bundled-model"], check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(qk + ["quantize", "-q", "--allow-requantize", bundled, str(f16), "F16"], check=True)
        subprocess.run([a.llama_quantize, "--imatrix", doc["imatrix"], "--tensor-type-file", doc["tensor_type_file"],
                        str(f16), str(ref), doc["ftype"], "2"], check=True, cwd=DATA,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        doc["llama_quantize"] = describe(ref)
    GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {GOLDEN.name}: {doc['llama_quantize']['sha256']} ({doc['llama_quantize']['size']} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
