"""Make tests/data/imatrix/<name>-F16.c64x4.gguf: llama-imatrix on the tiny mixture-of-experts models.

    .venv/bin/python tools/make_moe_imatrix_golden.py [LLAMA_BIN_DIR [NAME ...]]

LLAMA_BIN_DIR defaults to $QUANTKIT_LLAMA_CPP/build/bin (tools/llamaref.py; "-" for that default with
NAMEs). Development only: the test suite never runs llama.cpp. For each MoE model of tests/archmodels.py
(``MOE_SPECS``: qwen3moe, mixtral, qwen2moe, gpt-oss, glm4moe, granitemoe, ernie4_5-moe, lfm2moe; ``MLA_SPECS``:
deepseek2, deepseek2-lite), or only each NAME given (also a dense or hybrid one of ``SPECS``: smollm3, olmo2, gemma2, lfm2;
the others' entries of moe-golden.json kept), variant F16, written by the function the tests call, in a
scratch directory that also holds tests/data/imatrix/calibration-sample.txt:

    llama-imatrix -m <name>-F16.gguf -f calibration-sample.txt -c 64 --chunks 4 -o <out> -nr -t 2

and ``moe-golden.json``: per model the file's sha256 (the tests write the file again and check it), the
command and llama.cpp's version. The experts' entries hold llama-imatrix's per-expert sums and counts
(its mul_mat_id branch in tools/imatrix/imatrix.cpp); MLA's attn_k_b / attn_v_b per-head sums and one
count (its 3D mul_mat branch).
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
N_CTX, N_CHUNKS = 64, 4
FLAGS = ["-nr", "-t", "2"]

sys.path.insert(0, str(ROOT / "tests"))
import archmodels  # noqa: E402
import llamaref  # noqa: E402  (tools/, this script's folder)
from llamaref import run  # noqa: E402


def main() -> None:
    bindir = llamaref.need_bin_dir(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None)
    names = sys.argv[2:] or list({**archmodels.MOE_SPECS, **archmodels.MLA_SPECS})
    exe = str(bindir / "llama-imatrix")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stderr.strip().splitlines()
    golden = {"llama_cpp": version, "n_ctx": N_CTX, "n_chunks": N_CHUNKS, "flags": FLAGS, "models": {}}
    if sys.argv[2:]:
        old = json.loads((OUT / "moe-golden.json").read_text(encoding="utf-8"))
        if old["llama_cpp"] != version:
            raise SystemExit(f"moe-golden.json was made by {old['llama_cpp']}, this llama-imatrix is {version}: "
                             f"make them all again")
        golden["models"] = old["models"]
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        text = OUT / "calibration-sample.txt"
        shutil.copy(text, tmp / text.name)
        for name in names:
            model = archmodels.write_model(tmp / f"{name}-F16.gguf", name, "F16")
            ref = f"{name}-F16.c{N_CTX}x{N_CHUNKS}.gguf"
            cmd = [exe, "-m", model.name, "-f", text.name, "-c", str(N_CTX), "--chunks", str(N_CHUNKS), "-o", ref,
                   *FLAGS]
            run(cmd, tmp)
            shutil.copy(tmp / ref, OUT / ref)
            golden["models"][name] = {"file": ref, "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                                      "command": ["llama-imatrix", *cmd[1:]]}
            print(f"{ref}: written", file=sys.stderr)
    (OUT / "moe-golden.json").write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
