"""Make tests/data/quantize/arch-golden.json: llama-quantize on the tiny models of the newer architectures.

    .venv/bin/python tools/make_arch_quantize_golden.py [LLAMA_BIN_DIR]

LLAMA_BIN_DIR defaults to $QUANTKIT_LLAMA_CPP/build/bin (tools/llamaref.py). Development only: the test
suite never runs llama.cpp. For each name of ``NAMES`` (tests/archmodels.py), in a scratch directory:

1. the F16 file, written by the function the tests call, and its sha256;
2. ``llama-quantize`` to Q4_K_M (no imatrix) and to IQ4_XS with llama-imatrix's matrix of the same file,
   tests/data/imatrix/<name>-F16.c64x4.gguf (tools/make_moe_imatrix_golden.py makes it): the outputs' sha256.

tests/test_moe_quantize.py quantizes the same file with quantkit and compares bytes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "data" / "quantize"
IMATRIX_DIR = ROOT / "tests" / "data" / "imatrix"
NAMES = ("glm4moe", "granitemoe", "ernie4_5-moe", "smollm3", "olmo2", "gemma2", "llama4", "minimax-m2", "lfm2", "lfm2moe",
         "qwen3next")
#: (ftype, with the imatrix)
JOBS = (("Q4_K_M", False), ("IQ4_XS", True))

sys.path.insert(0, str(ROOT / "tests"))
import archmodels  # noqa: E402
import llamaref  # noqa: E402  (tools/, this script's folder)
from llamaref import run, sha256  # noqa: E402


def main() -> None:
    bindir = llamaref.need_bin_dir(sys.argv[1] if len(sys.argv) > 1 else None)
    quantize_exe = str(bindir / "llama-quantize")
    version = subprocess.run([quantize_exe, "--version"], capture_output=True, text=True).stderr.strip().splitlines()
    golden: dict = {"llama_cpp": version, "models": {}}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for name in NAMES:
            model = archmodels.write_model(tmp / f"{name}-F16.gguf", name, "F16")
            imatrix = f"{name}-F16.c64x4.gguf"
            shutil.copy(IMATRIX_DIR / imatrix, tmp / imatrix)
            entry = {"model_sha256": sha256(model), "imatrix": imatrix, "outputs": {}}
            for ftype, use_im in JOBS:
                out = f"out-{ftype}.gguf"
                cmd = [quantize_exe, *(["--imatrix", imatrix] if use_im else []), model.name, out, ftype, "2"]
                run(cmd, tmp)
                entry["outputs"][ftype] = {"sha256": sha256(tmp / out), "imatrix": use_im,
                                           "command": ["llama-quantize", *cmd[1:]]}
                print(f"{name} {ftype}: {entry['outputs'][ftype]['sha256']}", file=sys.stderr)
            golden["models"][name] = entry
    (OUT / "arch-golden.json").write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
