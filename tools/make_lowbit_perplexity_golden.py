#!/usr/bin/env python3
"""llama-perplexity on each new file type of issue #15: golden data for tests/test_lowbit_perplexity.py.

    .venv/bin/python tools/make_lowbit_perplexity_golden.py \\
        [--bin <llama.cpp>/build/bin]    # default: $QUANTKIT_LLAMA_CPP/build/bin

For every file type of tools/make_lowbit_file_golden.py's ``FILE_TYPES`` (IQ2_XXS .. IQ3_M, TQ1_0, TQ2_0,
Q1_0, MXFP4_MOE, Q2_K_S), llama-quantize makes the file from the same tiny qwen3 (tests/archmodels.py,
F16, seed 1) with the committed importance matrix (tests/data/lowbit/imatrix.gguf), exactly as that
script does (so the sha256 equals tests/data/lowbit/files.json's), and llama-perplexity scores it on
tests/data/perplexity/evaluation-sample.txt, ``-c 128 --chunks 16`` (1008 scored tokens), in several
configurations (``CONFIGS``: the default batch of 16 chunks, one chunk per batch, one token per
micro-batch, repacked weights). Writes tests/data/lowbit/:

* ``perplexity.json`` -- per file type: the file's sha256, each configuration's final PPL, and how far
  each configuration's next-token distributions are from the reference configuration's (``-nr -t 1``):
  the fraction of scored tokens with the same top token and the mean |difference| of the top token's
  log-probability. These are llama.cpp's own spread, the test's tolerances.
* ``perplexity-top.npz`` -- the reference configuration's top token (int16) and its log-probability
  (float32) at each scored token, per file type, read from llama-perplexity's ``--kl-divergence-base``
  file (quantized to 16 bits over [max-16, max], so within ~2.5e-4).

The model's weights are random and its logits peaked, so the perplexities are huge (~1e8): only the
agreement means anything, and a wrong kernel moves the top tokens, not only a flat average.
llama-perplexity now and then exits without its final estimate on this machine (0.3.36's build, loaded
machine); such a run is repeated (``--tries``). Needs quantkit (for the base-file reader) and gguf.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from archmodels import write_model  # noqa: E402
from make_lowbit_file_golden import ARCH, FILE_TYPES, SEED  # noqa: E402

import llamaref  # noqa: E402

from quantkit.formats.logits import open_logits  # noqa: E402

OUT = ROOT / "tests" / "data" / "lowbit"
TEXT = ROOT / "tests" / "data" / "perplexity" / "evaluation-sample.txt"
N_CTX, N_CHUNKS = 128, 16
#: llama-perplexity's configurations; the first is the reference the top tokens are kept from
CONFIGS = {
    "nr_t1": ["-nr", "-t", "1"],                          # 16 chunks per batch of 2048, micro-batches of 512
    "nr_b128": ["-nr", "-t", "1", "-b", "128"],           # one chunk per batch (as quantkit runs them)
    "nr_ub1": ["-nr", "-t", "1", "-b", "128", "-ub", "1"],  # one token per micro-batch: the vec_dot path
    "repack_t1": ["-t", "1"],                             # repacked weight buffers where ggml has them
}


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def top_tokens(kld: Path) -> tuple[np.ndarray, np.ndarray]:
    """(top token, its log-probability) at every scored token of a base logits file."""
    f = open_logits(kld)
    head = np.ascontiguousarray(f.log_probs[..., :4]).view(np.float32)     # scale, min_log_prob
    q = f.log_probs[..., 4:4 + f.n_vocab]
    top = q.argmax(axis=-1)
    lp = head[..., 0] * np.take_along_axis(q, top[..., None], -1)[..., 0].astype(np.float32) + head[..., 1]
    return top.reshape(-1).astype(np.int16), lp.reshape(-1).astype(np.float32)


def perplexity(exe: Path, model: Path, flags: list[str], kld: Path, tries: int) -> float:
    cmd = [str(exe), "-m", str(model), "-f", TEXT.name, "-c", str(N_CTX), "--chunks", str(N_CHUNKS), *flags,
           "--kl-divergence-base", str(kld)]
    for _ in range(tries):
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=model.parent)
        m = re.search(r"Final estimate: PPL = ([\d.]+)", r.stdout + r.stderr)
        if r.returncode == 0 and m:
            return float(m.group(1))
    raise SystemExit(f"{' '.join(cmd)}: no final estimate in {tries} tries:\n{(r.stdout + r.stderr)[-2000:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, help="llama.cpp's build/bin (llama-quantize, llama-perplexity; "
                    "default: $QUANTKIT_LLAMA_CPP/build/bin)")
    ap.add_argument("--tries", type=int, default=20, help="runs of llama-perplexity before giving up (default 20)")
    args = ap.parse_args(argv)
    args.bin = llamaref.need_bin_dir(args.bin)
    res: dict = {}
    tops, lps = {}, {}
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        model = write_model(td / "model.gguf", ARCH, "F16", seed=SEED)
        shutil.copy(OUT / "imatrix.gguf", td / "imatrix.gguf")
        shutil.copy(TEXT, td / TEXT.name)
        for ft in FILE_TYPES:
            out = td / f"{ft}.gguf"
            subprocess.run([str(args.bin / "llama-quantize"), "--imatrix", "imatrix.gguf", model.name, out.name, ft, "1"],
                           check=True, capture_output=True, cwd=td)
            entry = {"sha256": sha256(out), "ppl": {}, "same_top": {}, "mean_abs_top_lp": {}}
            ref = None
            for name, flags in CONFIGS.items():
                kld = td / f"{ft}-{name}.kld"
                entry["ppl"][name] = perplexity(args.bin / "llama-perplexity", out, flags, kld, args.tries)
                top, lp = top_tokens(kld)
                kld.unlink()
                if ref is None:
                    ref = top, lp
                entry["same_top"][name] = round(float((top == ref[0]).mean()), 4)
                entry["mean_abs_top_lp"][name] = round(float(np.abs(lp - ref[1]).mean()), 5)
            tops[ft], lps[ft] = ref
            res[ft] = entry
            print(ft, entry["ppl"], entry["same_top"], entry["mean_abs_top_lp"], flush=True)
    meta = {
        "model": {"arch": ARCH, "variant": "F16", "seed": SEED},
        "quantize": "llama-quantize --imatrix imatrix.gguf model.gguf OUT.gguf FILE_TYPE 1",
        "perplexity": f"llama-perplexity -m OUT.gguf -f evaluation-sample.txt -c {N_CTX} --chunks {N_CHUNKS} "
                      "CONFIG --kl-divergence-base OUT.kld",
        "configs": CONFIGS,
        "reference": next(iter(CONFIGS)),
        "llama_cpp": subprocess.run([str(args.bin / "llama-perplexity"), "--version"], capture_output=True,
                                    text=True).stderr.strip().splitlines()[:2],
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python tools/make_lowbit_perplexity_golden.py --bin <llama.cpp>/build/bin",
        "file_types": res,
    }
    np.savez_compressed(OUT / "perplexity-top.npz", **{f"top:{k}": v for k, v in tops.items()},
                        **{f"lp:{k}": v for k, v in lps.items()})
    (OUT / "perplexity.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
