"""Make tests/data/imatrix/dense-golden.json (and <name>-F16.c64x4.gguf): llama-imatrix and llama-quantize on
the tiny smollm3, olmo2 and gemma2 models, for tests/test_dense.py.

    .venv/bin/python tools/make_dense_golden.py [LLAMA_BIN_DIR]

LLAMA_BIN_DIR defaults to $QUANTKIT_LLAMA_CPP/build/bin (tools/llamaref.py). Development only: the test
suite never runs llama.cpp. For each model (``NAMES``, variant F16 of tests/archmodels.py, written by the
function the tests call), in a scratch directory that also holds tests/data/imatrix/calibration-sample.txt:

    llama-imatrix -m <name>-F16.gguf -f calibration-sample.txt -c 64 --chunks 4 -o <name>-F16.c64x4.gguf -nr -t 2
    llama-quantize --imatrix <name>-F16.c64x4.gguf <name>-F16.gguf out.gguf <FTYPE> 2

The imatrix files are kept; the JSON holds per model the file's sha256 (the tests write the file again and
check it), the commands, the quantized outputs' sha256 and llama.cpp's version.
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
OUT = ROOT / "tests" / "data" / "imatrix"
NAMES = ("smollm3", "olmo2", "gemma2")
N_CTX, N_CHUNKS = 64, 4
FLAGS = ["-nr", "-t", "2"]
FTYPES = ("Q4_K_M",)

sys.path.insert(0, str(ROOT / "tests"))
import archmodels  # noqa: E402
import llamaref  # noqa: E402  (tools/, this script's folder)
from llamaref import run, sha256 as sha  # noqa: E402


def main() -> None:
    bindir = llamaref.need_bin_dir(sys.argv[1] if len(sys.argv) > 1 else None)
    imatrix_exe, quantize_exe = str(bindir / "llama-imatrix"), str(bindir / "llama-quantize")
    version = subprocess.run([imatrix_exe, "--version"], capture_output=True, text=True).stderr.strip().splitlines()
    golden = {"llama_cpp": version, "n_ctx": N_CTX, "n_chunks": N_CHUNKS, "flags": FLAGS, "models": {}}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        text = OUT / "calibration-sample.txt"
        shutil.copy(text, tmp / text.name)
        for name in NAMES:
            model = archmodels.write_model(tmp / f"{name}-F16.gguf", name, "F16")
            im = f"{name}-F16.c{N_CTX}x{N_CHUNKS}.gguf"
            im_cmd = [imatrix_exe, "-m", model.name, "-f", text.name, "-c", str(N_CTX), "--chunks", str(N_CHUNKS),
                      "-o", im, *FLAGS]
            run(im_cmd, tmp)
            shutil.copy(tmp / im, OUT / im)
            entry = {"file": im, "model_sha256": sha(model), "command": ["llama-imatrix", *im_cmd[1:]], "outputs": {}}
            for ftype in FTYPES:
                out = f"out-{name}-{ftype}.gguf"
                cmd = [quantize_exe, "--imatrix", im, model.name, out, ftype, "2"]
                run(cmd, tmp)
                entry["outputs"][ftype] = {"sha256": sha(tmp / out), "command": ["llama-quantize", *cmd[1:]]}
            golden["models"][name] = entry
            print(f"{name}: {im}, {entry['outputs']}", file=sys.stderr)
    (OUT / "dense-golden.json").write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
