"""Make tests/data/imatrix/moe-partial-golden.json: llama-quantize with an imatrix whose experts saw no token.

    .venv/bin/python tools/make_moe_quantize_golden.py [LLAMA_BIN_DIR]

LLAMA_BIN_DIR defaults to $QUANTKIT_LLAMA_CPP/build/bin (tools/llamaref.py). Development only: the test
suite never runs llama.cpp. In a scratch directory:

1. the tiny qwen3moe of tests/archmodels.py with an all-zero router (``router="zero"``: every token goes to
   experts 0 and 1), F16; ``llama-imatrix -c 64 --chunks 2`` on tests/data/imatrix/calibration-sample.txt
   gives an imatrix whose expert entries have partial data (counts 0 for experts 2..7). It is kept as
   tests/data/imatrix/qwen3moe-zero-router.c64x2.gguf;
2. the same model with its usual random router, F16, quantized by llama-quantize with that imatrix to each
   of ``FTYPES``: the outputs' sha256 go to the JSON with the commands and llama.cpp's version.

llama-quantize gives an expert whose count is 0 the weight 1 for every column (``load_imatrix`` in
tools/quantize/quantize.cpp); the test quantizes the same model with the same file and compares bytes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "data" / "imatrix"
IMATRIX = "qwen3moe-zero-router.c64x2.gguf"
FTYPES = ("Q4_K_M", "IQ4_XS", "Q4_0")
FLAGS = ["-nr", "-t", "2"]

sys.path.insert(0, str(ROOT / "tests"))
import archmodels  # noqa: E402
import llamaref  # noqa: E402  (tools/, this script's folder)
from llamaref import run  # noqa: E402


def main() -> None:
    bindir = llamaref.need_bin_dir(sys.argv[1] if len(sys.argv) > 1 else None)
    imatrix_exe, quantize_exe = str(bindir / "llama-imatrix"), str(bindir / "llama-quantize")
    version = subprocess.run([imatrix_exe, "--version"], capture_output=True, text=True).stderr.strip().splitlines()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        text = OUT / "calibration-sample.txt"
        shutil.copy(text, tmp / text.name)
        zero = archmodels.write_model(tmp / "zero.gguf", "qwen3moe", "F16", router="zero")
        im_cmd = [imatrix_exe, "-m", zero.name, "-f", text.name, "-c", "64", "--chunks", "2", "-o", IMATRIX, *FLAGS]
        run(im_cmd, tmp)
        shutil.copy(tmp / IMATRIX, OUT / IMATRIX)
        model = archmodels.write_model(tmp / "qwen3moe-F16.gguf", "qwen3moe", "F16")
        golden = {"llama_cpp": version, "imatrix": IMATRIX, "imatrix_command": ["llama-imatrix", *im_cmd[1:]],
                  "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "outputs": {}}
        for ftype in FTYPES:
            out = f"out-{ftype}.gguf"
            cmd = [quantize_exe, "--imatrix", IMATRIX, model.name, out, ftype, "2"]
            run(cmd, tmp)
            golden["outputs"][ftype] = {"sha256": hashlib.sha256((tmp / out).read_bytes()).hexdigest(),
                                        "command": ["llama-quantize", *cmd[1:]]}
            print(f"{ftype}: {golden['outputs'][ftype]['sha256']}", file=sys.stderr)
    (OUT / "moe-partial-golden.json").write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
