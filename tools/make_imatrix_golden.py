"""Make tests/data/imatrix/ from the real llama-imatrix (llama.cpp from llama-cpp-python 0.3.36's sdist).

    .venv/bin/python tools/make_imatrix_golden.py [LLAMA_BIN_DIR]

LLAMA_BIN_DIR defaults to $QUANTKIT_LLAMA_CPP/build/bin (tools/llamaref.py).
Development only: the test suite never runs llama.cpp. Writes:

* ``calibration-sample.txt``: the first ~3000 characters of quantkit's calibration text (cut at a
  newline), so the goldens do not depend on the CPython version's pydoc topics.
* ``llama-imatrix.c128x4.gguf``: ``llama-imatrix -m smol-f16.gguf -f calibration-sample.txt
  -c 128 --chunks 4 -o ... -nr -t 2``, where smol-f16.gguf is the bundled SmolLM2 Q4_1 converted with
  ``quantkit quantize --allow-requantize <bundled> smol-f16.gguf F16`` (byte-identical to
  llama-quantize's; its sha256 is recorded). F16, because there quantkit's forward pass and
  llama.cpp's agree to ~0.05 logits, so the comparison tests the collector rather than the
  arithmetic of quantized matrix products.
* ``golden.json``: the command lines, llama.cpp's PPL output of that run, the sha256 of what
  llama-imatrix writes when it converts that file to dat and back and when it merges it with its own
  dat (for byte-for-byte comparisons), and its ``--show-statistics`` table.

``-nr`` (``--no-repack``): on the development machine (AMX) llama.cpp's repacked weight buffers crash
in decode; without repacking ggml uses its plain vec_dot path.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "data" / "imatrix"
N_CTX, N_CHUNKS = 128, 4
FLAGS = ["-nr", "-t", "2"]

sys.path.insert(0, str(ROOT))

import llamaref  # noqa: E402  (tools/, this script's folder)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run(cmd: list[str], cwd: Path) -> tuple[str, str]:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout, r.stderr


def strip_log(text: str) -> list[str]:
    """llama.cpp's log lines without their timestamp/level prefix."""
    out = []
    for line in text.splitlines():
        out.append(re.sub(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ", "", line))
    return out


def sample_text(which: int, n_chars: int = 3000) -> str:
    from quantkit.formats.texts import calibration_texts

    t = calibration_texts()[which]
    cut = t.find("\n", n_chars)
    return t[:cut] + "\n"


def make_f16(dst: Path) -> Path:
    from quantkit.formats.locate import bundled_model

    subprocess.run([sys.executable, "-m", "quantkit", "quantize", "-q", "--allow-requantize", str(bundled_model()),
                    str(dst), "F16"], check=True, capture_output=True)
    return dst


def main() -> None:

    bindir = llamaref.need_bin_dir(sys.argv[1] if len(sys.argv) > 1 else None)
    exe = str(bindir / "llama-imatrix")
    version = run([exe, "--version"], ROOT)[1].strip().splitlines()
    OUT.mkdir(parents=True, exist_ok=True)
    text = OUT / "calibration-sample.txt"
    text.write_text(sample_text(0), encoding="utf-8")
    keep = tempfile.TemporaryDirectory()
    model = make_f16(Path(keep.name) / "smol-f16.gguf")
    golden = {"llama_cpp": version, "model": model.name, "model_sha256": sha256(model), "n_ctx": N_CTX, "n_chunks": N_CHUNKS, "flags": FLAGS}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        shutil.copy(text, tmp / text.name)
        ref = "llama-imatrix.c128x4.gguf"
        cmd = [exe, "-m", str(model), "-f", text.name, "-c", str(N_CTX), "--chunks", str(N_CHUNKS), "-o", ref, *FLAGS]
        out, err = run(cmd, tmp)
        golden["collect"] = {"command": ["llama-imatrix", "-m", model.name, *cmd[3:]], "stdout": strip_log(out)}
        m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
        golden["collect"]["ppl"] = [float(m.group(1)), float(m.group(2))]
        golden["collect"]["running"] = [float(v) for v in re.findall(r"\[\d+\]([\d.]+),", out)]
        shutil.copy(tmp / ref, OUT / ref)

        conv = {}
        for name, args in (
            ("to_dat", ["--in-file", ref, "--output-format", "dat", "-o", "conv.dat"]),
            ("dat_to_gguf", ["--in-file", "conv.dat", "-o", "back.gguf"]),
            ("merge_c128", ["--in-file", f"{ref},conv.dat", "-c", "128", "-o", "merged.gguf"]),
            ("merge_dat_c128", ["--in-file", ref, "--in-file", "conv.dat", "-c", "128", "--output-format", "dat",
                                "-o", "merged.dat"]),
        ):
            run([exe, "-m", str(model), *args, *FLAGS], tmp)   # -m is required but unused
            outp = tmp / args[args.index("-o") + 1]
            conv[name] = {"command": ["llama-imatrix", *args, *FLAGS], "sha256": sha256(outp),
                          "size": outp.stat().st_size}
        golden["convert"] = conv
        out, err = run([exe, "-m", str(model), "--in-file", ref, "--show-statistics"], tmp)
        lines = strip_log(err + out)
        start = next(i for i, s in enumerate(lines) if s.startswith("Computing statistics"))
        golden["statistics"] = {"command": ["llama-imatrix", "--in-file", ref, "--show-statistics"],
                                "lines": [s for s in lines[start:] if s.strip()]}
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
