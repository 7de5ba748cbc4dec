"""Whole files against llama-quantize: a tiny qwen3 model (tests/archmodels.py) whose every layer matrix
takes one of the types of issue #15 (``--tensor-type 'blk\\..*=TYPE'``), with and without an importance
matrix, and each new file type (IQ2_XXS .. IQ3_M, TQ1_0, TQ2_0, Q1_0, MXFP4_MOE, Q2_K_S: llama.cpp's
per-tensor mixes) with one, must come out byte for byte as llama-quantize wrote it (sha256 in
tests/data/lowbit/files.json, made by tools/make_lowbit_file_golden.py); IQ3_XXS without an imatrix is
refused by both (as are the others that need one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from archmodels import write_model
from conftest import run_cli, sha256

DATA = Path(__file__).parent / "data" / "lowbit"
GOLD = json.loads((DATA / "files.json").read_text())


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    m = GOLD["model"]
    p = write_model(tmp_path_factory.mktemp("lowbit") / "model.gguf", m["arch"], m["variant"], seed=m["seed"])
    assert sha256(p) == m["sha256"], "tests/archmodels.py no longer writes the model the golden data was made from"
    return p


def test_imatrix_is_the_one_llama_quantize_used():
    assert sha256(DATA / "imatrix.gguf") == GOLD["imatrix"]["sha256"]


@pytest.mark.parametrize("case", sorted(GOLD["cases"]))
def test_file_equals_llama_quantize(case, model, tmp_path):
    want = GOLD["cases"][case]
    out = tmp_path / "out.gguf"
    # from the data directory, so the imatrix path recorded in the metadata is llama-quantize's
    r = run_cli(["quantize", *want["args"], model, out, want.get("file_type", GOLD["file_type"]), 1], cwd=DATA)
    if want["returncode"]:
        assert r.exit_code != 0 and not out.exists()
        assert "requires an importance matrix" in r.output, r.output
    else:
        assert r.exit_code == 0, r.output
        assert sha256(out) == want["sha256"]
