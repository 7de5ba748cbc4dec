"""Make tests/data/perplexity/ from the real llama-perplexity (llama.cpp from llama-cpp-python 0.3.36's sdist).

    .venv/bin/python tools/make_perplexity_golden.py [LLAMA_BIN_DIR]

LLAMA_BIN_DIR defaults to $QUANTKIT_LLAMA_CPP/build/bin (tools/llamaref.py).
Development only: the test suite never runs llama.cpp. Models: the bundled SmolLM2 Q4_1 converted to
F16 with ``quantkit quantize --allow-requantize`` (byte-identical to llama-quantize's), then Q8_0 and
Q4_0 from that F16 with ``quantkit quantize`` (sha256 of each recorded). Writes:

* ``evaluation-sample.txt``: the first ~3000 characters of quantkit's evaluation text.
* ``golden.json``:
  * ``ppl``: ``llama-perplexity -m M -f evaluation-sample.txt -c 128 --chunks 4 -nr -t 2`` for M in F16,
    Q8_0, Q4_0: the final estimate and the running values;
  * ``kld``: the F16 base file written by llama-perplexity (``--kl-divergence-base``), then
    ``--kl-divergence`` with Q8_0 and Q4_0: the numbers of its three final sections;
  * ``llama_reads_quantkit``: llama-perplexity ``--kl-divergence`` with the F16 model on a base file
    *quantkit* wrote from the same F16 model and text (KLD near 0 and same-top-p near 100 % show that
    llama.cpp reads our layout);
* ``base-c4-f16.kld.gz``: a tiny base file written by llama-perplexity (F16, ``-c 4 --chunks 2``: two
  scored tokens), gzip-compressed, for the test that quantkit reads llama.cpp's files.

``-nr`` (``--no-repack``): on the development machine (AMX) llama.cpp's repacked weight buffers crash
in decode.
"""

from __future__ import annotations

import gzip
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
OUT = ROOT / "tests" / "data" / "perplexity"
N_CTX, N_CHUNKS = 128, 4
FLAGS = ["-nr", "-t", "2"]

sys.path.insert(0, str(ROOT))

import llamaref  # noqa: E402  (tools/, this script's folder)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run(cmd: list[str], cwd: Path) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return re.sub(r"(?m)^\d+\.\d+\.\d+\.\d+ [A-Z] ", "", r.stdout + "\n" + r.stderr)


def quantkit(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "quantkit", *args], check=True, capture_output=True)


NUM = r"(-?[\d.]+(?:e[-+]?\d+)?|nan|-?inf)"


def parse_kld(text: str) -> dict:
    pats = {
        "ppl": rf"Mean PPL\(Q\)\s*:\s*{NUM}", "ppl_base": rf"Mean PPL\(base\)\s*:\s*{NUM}",
        "ln_ratio": rf"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*{NUM}",
        "kld": rf"Mean    KLD:\s*{NUM}", "kld_max": rf"Maximum KLD:\s*{NUM}", "kld_99": rf"99\.0%   KLD:\s*{NUM}",
        "kld_median": rf"Median  KLD:\s*{NUM}", "kld_min": rf"Minimum KLD:\s*{NUM}",
        "p_diff": rf"Mean    Δp:\s*{NUM}", "rms_p_diff": rf"RMS Δp    :\s*{NUM}", "same_top": rf"Same top p:\s*{NUM}",
    }
    out = {}
    for k, p in pats.items():
        m = re.search(p, text)
        if not m:
            raise SystemExit(f"cannot find {k!r} in llama-perplexity's output:\n{text[-2000:]}")
        out[k] = float(m.group(1))
    return out


def main() -> None:
    from quantkit.formats.locate import bundled_model
    from quantkit.formats.texts import calibration_texts

    bindir = llamaref.need_bin_dir(sys.argv[1] if len(sys.argv) > 1 else None)
    exe = str(bindir / "llama-perplexity")
    version = [s for s in run([exe, "--version"], ROOT).strip().splitlines() if s.strip()]
    OUT.mkdir(parents=True, exist_ok=True)
    ev = calibration_texts()[1]
    text = OUT / "evaluation-sample.txt"
    text.write_text(ev[:ev.find("\n", 3000)] + "\n", encoding="utf-8")
    golden: dict = {"llama_cpp": version, "n_ctx": N_CTX, "n_chunks": N_CHUNKS, "flags": FLAGS}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        shutil.copy(text, tmp / text.name)
        f16 = tmp / "smol-f16.gguf"
        quantkit("quantize", "-q", "--allow-requantize", str(bundled_model()), str(f16), "F16")
        models = {"F16": f16}
        for t in ("Q8_0", "Q4_0"):
            models[t] = tmp / f"smol-{t}.gguf"
            quantkit("quantize", "-q", str(f16), str(models[t]), t)
        golden["models"] = {k: {"file": p.name, "sha256": sha256(p)} for k, p in models.items()}
        common = ["-c", str(N_CTX), "--chunks", str(N_CHUNKS), *FLAGS]
        golden["ppl"] = {}
        for k, p in models.items():
            cmd = [exe, "-m", p.name, "-f", text.name, *common]
            out = run(cmd, tmp)
            m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
            golden["ppl"][k] = {"command": ["llama-perplexity", *cmd[1:]], "ppl": [float(m.group(1)), float(m.group(2))],
                                "running": [float(v) for v in re.findall(r"\[\d+\]([\d.]+),", out)]}
        base_cmd = [exe, "-m", f16.name, "-f", text.name, *common, "--kl-divergence-base", "base.kld"]
        run(base_cmd, tmp)
        golden["kld"] = {"base_command": ["llama-perplexity", *base_cmd[1:]]}
        for k in ("Q8_0", "Q4_0"):
            cmd = [exe, "-m", models[k].name, "--kl-divergence-base", "base.kld", "--kl-divergence", *FLAGS]
            golden["kld"][k] = {"command": ["llama-perplexity", *cmd[1:]], **parse_kld(run(cmd, tmp))}
        # llama.cpp reads a base file quantkit wrote
        quantkit("perplexity", "-m", str(f16), "-f", str(tmp / text.name), *common[:4], "-t", "1",
                 "--kl-divergence-base", str(tmp / "ours.kld"))
        cmd = [exe, "-m", f16.name, "--kl-divergence-base", "ours.kld", "--kl-divergence", *FLAGS]
        golden["llama_reads_quantkit"] = {
            "quantkit_command": ["quantkit", "perplexity", "-m", f16.name, "-f", text.name, *common[:4],
                                 "--kl-divergence-base", "ours.kld"],
            "command": ["llama-perplexity", *cmd[1:]], **parse_kld(run(cmd, tmp))}
        # a tiny base file for the test suite
        tiny = [exe, "-m", f16.name, "-f", text.name, "-c", "4", "--chunks", "2", "-b", "4", *FLAGS,
                "--kl-divergence-base", "tiny.kld"]
        run(tiny, tmp)
        golden["tiny_base"] = {"file": "base-c4-f16.kld.gz", "command": ["llama-perplexity", *tiny[1:]],
                               "sha256_uncompressed": sha256(tmp / "tiny.kld")}
        with open(tmp / "tiny.kld", "rb") as src, gzip.GzipFile(OUT / "base-c4-f16.kld.gz", "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
