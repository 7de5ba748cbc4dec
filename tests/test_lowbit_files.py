"""Whole files against llama-quantize: a tiny qwen3 model (tests/archmodels.py) whose every layer matrix
takes one of the types of issue #15 (``--tensor-type 'blk\\..*=TYPE'``), with and without an importance
matrix, and each new file type (IQ2_XXS .. IQ3_M, TQ1_0, TQ2_0, Q1_0, MXFP4_MOE, Q2_K_S: llama.cpp's
per-tensor mixes) with one, must come out byte for byte as llama-quantize wrote it (sha256 in
tests/data/lowbit/files.json, made by tools/make_lowbit_file_golden.py); IQ3_XXS without an imatrix is
refused by both (as are the others that need one).

And each such file runs: ``quantkit perplexity`` on it lands within llama-perplexity's own spread
(tests/data/lowbit/perplexity.json and perplexity-top.npz, made by tools/make_lowbit_perplexity_golden.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from archmodels import write_model
from conftest import run_cli, sha256

DATA = Path(__file__).parent / "data" / "lowbit"
sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
from make_lowbit_perplexity_golden import N_CHUNKS, N_CTX, top_tokens  # noqa: E402  (how the golden was read)

GOLD = json.loads((DATA / "files.json").read_text())
PPL_GOLD = json.loads((DATA / "perplexity.json").read_text())
TEXT = Path(__file__).parent / "data" / "perplexity" / "evaluation-sample.txt"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    m = GOLD["model"]
    p = write_model(tmp_path_factory.mktemp("lowbit") / "model.gguf", m["arch"], m["variant"], seed=m["seed"])
    assert sha256(p) == m["sha256"], "tests/archmodels.py no longer writes the model the golden data was made from"
    return p


def test_imatrix_is_the_one_llama_quantize_used():
    assert sha256(DATA / "imatrix.gguf") == GOLD["imatrix"]["sha256"]


@pytest.fixture(scope="module")
def quantized(model, tmp_path_factory):
    """case -> (exit code, output, path): each case quantized once for the tests of this module."""
    d = tmp_path_factory.mktemp("lowbit-out")
    done: dict = {}

    def make(case: str):
        if case not in done:
            want = GOLD["cases"][case]
            out = d / f"{case}.gguf"
            # from the data directory, so the imatrix path recorded in the metadata is llama-quantize's
            r = run_cli(["quantize", *want["args"], model, out, want.get("file_type", GOLD["file_type"]), 1], cwd=DATA)
            done[case] = (r.exit_code, r.output, out)
        return done[case]
    return make


@pytest.mark.parametrize("case", sorted(GOLD["cases"]))
def test_file_equals_llama_quantize(case, quantized):
    want = GOLD["cases"][case]
    code, output, out = quantized(case)
    if want["returncode"]:
        assert code != 0 and not out.exists()
        assert "requires an importance matrix" in output, output
    else:
        assert code == 0, output
        assert sha256(out) == want["sha256"]


# -- the files run: quantkit perplexity against llama-perplexity -------------------------------------
# The PPL bound: 0.5 % (tests/test_perplexity.py's), or -- larger here -- llama-perplexity's own spread on
# these files, around the range of the PPLs it gave on the file in its four configurations (one batch of
# 16 chunks, one chunk per batch, one token per micro-batch, repacked). On 1008 scored tokens of a random
# model with peaked logits a float summed in another order flips the top token at ~5 % of the positions,
# and llama.cpp's PPLs of one file spread by up to 1.42 % (IQ1_M; perplexity.json, docs/golden.md);
# quantkit's own move as much between its batch sizes (IQ2_M: 0.43 % from -b 128 to -b 32; MXFP4: 0.28 %
# from one pass per chunk to passes of 8). That noise is the model's and the text's, not the type's, so the
# largest spread bounds every type. What catches a wrong kernel is the top-token checks below (a decoder
# that swaps two sub-block scales of IQ3_S keeps the same top token at 8 % of the positions, not 94 %).
PPL_BOUND = max(5e-3, max(max(g["ppl"].values()) / min(g["ppl"].values()) - 1
                          for g in PPL_GOLD["file_types"].values()))
#: our top tokens may agree with llama.cpp's reference run this much less than its other configurations do
SAME_TOP_MARGIN = 0.03
#: and our top log-probabilities may differ from the reference by up to this times theirs
TOP_LP_FACTOR = 1.5


def _ppl_within(ppl: float, gold: dict) -> bool:
    lo, hi = min(gold["ppl"].values()), max(gold["ppl"].values())
    return lo * (1 - PPL_BOUND) <= ppl <= hi * (1 + PPL_BOUND)


def _top_agreement(top, lp, ft) -> tuple[float, float]:
    with np.load(DATA / "perplexity-top.npz") as z:
        return float((top == z[f"top:{ft}"]).mean()), float(np.abs(lp - z[f"lp:{ft}"]).mean())


def _agrees(ppl, top, lp, ft) -> bool:
    g = PPL_GOLD["file_types"][ft]
    same, dlp = _top_agreement(top, lp, ft)
    return (_ppl_within(ppl, g) and same >= min(g["same_top"].values()) - SAME_TOP_MARGIN
            and dlp <= TOP_LP_FACTOR * max(g["mean_abs_top_lp"].values()))


#: quantkit's two matmul paths: a chunk's 128 tokens at once (integer GEMM, or dequantize + BLAS), and passes
#: of 8 tokens, below kernels/mul_mat.py's PREFILL_MIN_TOKENS, so every product runs on the types' row dots
#: (ggml's vec_dot) as decoding does
BATCHES = {"prefill": [], "rowdots": ["-b", 8]}


@pytest.mark.parametrize("path", list(BATCHES))
@pytest.mark.parametrize("ft", list(PPL_GOLD["file_types"]))
def test_perplexity_within_llama_perplexity_spread(ft, path, quantized, tmp_path):
    from quantkit.kernels.mul_mat import GEMM_MIN_TOKENS, PREFILL_MIN_TOKENS

    if path == "rowdots":
        assert BATCHES[path][1] < min(GEMM_MIN_TOKENS, PREFILL_MIN_TOKENS), "the passes no longer use the row dots"
    gold = PPL_GOLD["file_types"][ft]
    code, output, f = quantized(f"ftype-{ft.lower()}")
    assert code == 0, output
    assert sha256(f) == gold["sha256"], "not the file llama-perplexity ran"
    kld = tmp_path / "ours.kld"
    r = run_cli(["perplexity", "-m", f, "-f", TEXT, "-c", N_CTX, "--chunks", N_CHUNKS, *BATCHES[path],
                 "--kl-divergence-base", kld])
    assert r.exit_code == 0, r.output
    ppl = float(re.search(r"Final estimate: PPL = ([\d.]+)", r.output).group(1))
    top, lp = top_tokens(kld)
    same, dlp = _top_agreement(top, lp, ft)
    got = f"quantkit PPL {ppl:.6g}, same top {same:.4f}, mean |d top lp| {dlp:.5f}; llama-perplexity {gold}"
    assert _agrees(ppl, top, lp, ft), got
    # the check can fail: our numbers do not pass it against the golden of any other file type of the same
    # model whose numbers differ (TQ1_0 and TQ2_0 store the same ternary weights: their logits are equal)
    with np.load(DATA / "perplexity-top.npz") as z:
        others = [o for o in PPL_GOLD["file_types"] if not np.array_equal(z[f"top:{o}"], z[f"top:{ft}"])]
    assert len(others) >= len(PPL_GOLD["file_types"]) - 2
    assert not any(_agrees(ppl, top, lp, o) for o in others), got
