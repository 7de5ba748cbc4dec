"""``quantkit convert`` beside llama.cpp's ``convert_hf_to_gguf.py`` on a 1B-shaped checkpoint: wall time,
peak RSS, and whether the two GGUFs are the same bytes.

    QUANTKIT_LLAMA_CPP=... .venv/bin/python benchmarks/convert_vs_llama.py WORKDIR \\
        [--outtype auto] [--convert-python PYTHON]     (default: $QUANTKIT_CONVERT_PY)

The checkpoint (written once into WORKDIR/llama-1b-shaped, ~2.6 GB of BF16) is Llama 3.2 1B's shape
(hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied embeddings) with Qwen3's tokenizer and
its 151936-token vocabulary, random weights (quantkit/checkpoints.py writes it, one tensor at a time).
Each converter runs under ``/usr/bin/time -v`` (its "Maximum resident set size" is the peak RSS).
The reference converter runs in its own venv (tools/make_convert_golden.py says how to make it).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
import llamaref  # noqa: E402

from quantkit import checkpoints  # noqa: E402

SPEC = ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
         "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 64, "vocab_size": checkpoints.VOCAB, "max_position_embeddings": 131072,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
         "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu"}, "BF16", 2, None)


def timed(cmd: list[str], env: dict) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of ``cmd``."""
    t0 = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode:
        sys.stderr.write(res.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr).group(1))
    return wall, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--outtype", default="auto")
    ap.add_argument("--convert-python", help=f"python of the venv with torch and transformers "
                    f"(default: ${llamaref.CONVERT_PY})")
    ap.add_argument("--skip-reference", action="store_true", help="only quantkit (no llama.cpp run)")
    args = ap.parse_args()
    ckpt = args.workdir / "llama-1b-shaped"
    if not (ckpt / "config.json").is_file():
        t0 = time.perf_counter()
        checkpoints.make_checkpoint("llama-1b-shaped", ckpt, spec=SPEC)
        print(f"checkpoint written in {time.perf_counter() - t0:.0f} s")
    ours = args.workdir / f"quantkit-{args.outtype}.gguf"
    wall, rss = timed([sys.executable, "-m", "quantkit", "convert", str(ckpt), "-o", str(ours), "--outtype",
                       args.outtype, "-q"], dict(os.environ))
    print(f"quantkit convert:      {wall:6.1f} s wall, peak RSS {rss / 1024:7.0f} MiB")
    if args.skip_reference:
        return
    root = os.environ.get(llamaref.LLAMA_CPP)
    if not root:
        raise SystemExit(f"set {llamaref.LLAMA_CPP} to the reference llama.cpp's source directory")
    ref = args.workdir / f"llama-{args.outtype}.gguf"
    converter = [llamaref.convert_python(args.convert_python), str(Path(root) / "convert_hf_to_gguf.py")]
    wall, rss = timed([*converter, str(ckpt), "--outfile", str(ref), "--outtype", args.outtype],
                      {**os.environ, "PYTHONPATH": str(Path(root) / "gguf-py")})
    print(f"convert_hf_to_gguf.py: {wall:6.1f} s wall, peak RSS {rss / 1024:7.0f} MiB")
    print("same bytes" if llamaref.sha256(ours) == llamaref.sha256(ref) else "FILES DIFFER")


if __name__ == "__main__":
    main()
