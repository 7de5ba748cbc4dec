"""Make tests/data/convert/<name>-<outtype>.json from llama.cpp's own converter, for tests/test_convert.py.

For each tiny checkpoint of quantkit/checkpoints.py (written by the same function the tests call) and each
outtype, runs the reference ``convert_hf_to_gguf.py`` and stores ``checkpoints.summarize`` of the GGUF it
wrote: every KV pair and every tensor's name, type, shape and sha256 (the GGUFs themselves are tens of
MB: the Qwen3 vocabulary's embeddings).

The converter needs torch and transformers, so it runs in a venv of its own, never quantkit's:

    python3 -m venv DIR
    DIR/bin/pip install torch==2.13.0 transformers safetensors sentencepiece numpy
    QUANTKIT_LLAMA_CPP=... QUANTKIT_CONVERT_PY=DIR/bin/python .venv/bin/python tools/make_convert_golden.py \\
        [--convert-python PYTHON] [--workdir DIR] [NAME ...]

(``torch==2.13.0`` is the CPU wheel; plain ``torch`` pulls the CUDA build.) It runs with
``PYTHONPATH=$QUANTKIT_LLAMA_CPP/gguf-py``, so the converter uses its own gguf-py, as in the checkout.
This script itself runs under quantkit's venv (numpy and gguf only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
import checkpoints  # noqa: E402
from quantkit.checkpoints import SEED, SPECS, make_checkpoint  # noqa: E402
import llamaref  # noqa: E402

OUT_DIR = HERE.parent / "tests" / "data" / "convert"
#: per checkpoint, the outtypes stored (auto picks the sources' type: bf16 or f16)
OUTTYPES = {"llama": ("auto", "f32", "f16", "q8_0"), "qwen2": ("auto", "bf16"), "qwen3": ("auto", "q8_0"),
            "mixtral": ("auto",), "llama3rope": ("auto",), "qwen3moe": ("auto",), "gemma3": ("auto",), "gemma3sp": ("auto",),
            "glm4moe": ("auto", "f16"), "smollm3": ("auto",), "olmo2": ("auto",), "gemma2": ("auto",),
            "lfm2": ("auto", "f16"), "lfm2moe": ("auto",), "qwen3next": ("auto", "f16"), "minimaxm2": ("f16", "bf16"),
            "llama4": ("f16", "bf16"), "granitemoe": ("auto", "f16"), "ernie4_5moe": ("auto", "f16"),
            "deepseek2": ("auto", "f16"), "deepseek2lite": ("auto",)}
#: per checkpoint, the converter's extra flags (Qwen3-Next: its checkpoints made by transformers have no MTP
#: block, which the converter otherwise requires)
EXTRA_ARGS = {"qwen3next": ["--no-mtp"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="checkpoints to do (default: all)")
    ap.add_argument("--convert-python", help="python of the venv with torch and transformers "
                    f"(default: ${llamaref.CONVERT_PY})")
    ap.add_argument("--workdir", help="where the checkpoints and GGUFs go (default: a temporary folder)")
    args = ap.parse_args()
    root = os.environ.get(llamaref.LLAMA_CPP)
    if not root:
        raise SystemExit(f"set {llamaref.LLAMA_CPP} to the reference llama.cpp's source directory")
    script = Path(root) / "convert_hf_to_gguf.py"
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "0c1e570 (llama-cpp-python 0.3.36's vendor/llama.cpp)"
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        for name in args.names or list(SPECS):
            ckpt = make_checkpoint(name, work / f"tiny-{name}")
            for outtype in OUTTYPES[name]:
                out = work / f"tiny-{name}-{outtype}.gguf"
                cmd = [llamaref.convert_python(args.convert_python), str(script), str(ckpt), "--outfile", str(out),
                       "--outtype", outtype, *EXTRA_ARGS.get(name, [])]
                t0 = time.time()
                res = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(Path(root) / "gguf-py")},
                                     capture_output=True, text=True)
                if res.returncode:
                    sys.stderr.write(res.stderr[-4000:])
                    raise SystemExit(f"{name} {outtype}: convert_hf_to_gguf.py failed ({res.returncode})")
                summary = checkpoints.summarize(out)
                summary["made_by"] = (f"tools/make_convert_golden.py: llama.cpp {commit} convert_hf_to_gguf.py "
                                      f"tiny-{name} --outtype {outtype}{''.join(' ' + a for a in EXTRA_ARGS.get(name, []))}"
                                      f" (quantkit/checkpoints.py, seed "
                                      f"{SEED})")
                dst = OUT_DIR / f"{name}-{outtype}.json"
                dst.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
                print(f"{dst.relative_to(HERE.parent)}: {len(summary['tensors'])} tensors, "
                      f"{len(summary['kv'])} keys, {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
