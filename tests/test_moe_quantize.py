"""Quantizing and measuring a mixture-of-experts model: an importance matrix some experts have no data in,
--target-bpw's expert classes, a sweep.

llama-imatrix keeps such entries with count 0 for the experts no token chose (tools/imatrix/imatrix.cpp
warns "partial data"), and llama-quantize weighs every column of those experts by 1
(``load_imatrix`` in tools/quantize/quantize.cpp). The imatrix and the outputs' hashes come from llama.cpp
(tools/make_moe_quantize_golden.py): the same tiny qwen3moe quantized by quantkit with the same file must
be the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archmodels import write_model
from conftest import run_cli, sha256
from quantkit.formats.imatrix import load_imatrix

DATA = Path(__file__).parent / "data" / "imatrix"
GOLDEN = json.loads((DATA / "moe-partial-golden.json").read_text())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("moeq") / "qwen3moe-F16.gguf", "qwen3moe", "F16")
    assert sha256(path) == GOLDEN["model_sha256"], "the test model is not the one the golden data was made from"
    return path


def test_the_imatrix_has_experts_without_data():
    im = load_imatrix(DATA / GOLDEN["imatrix"])
    exps = {k: e for k, e in im.entries.items() if "_exps" in k}
    assert exps and all((e.counts == 0).any() and (e.counts > 0).any() for e in exps.values())
    # the experts without tokens are weighed by 1, as llama-quantize does
    w = im.weights("blk.0.ffn_up_exps.weight")
    assert (w[2:] == 1).all() and not (w[:2] == 1).all()


@pytest.mark.parametrize("ftype", sorted(GOLDEN["outputs"]))
def test_quantize_with_partial_expert_data_matches_llama_quantize(ftype, model, tmp_path):
    out = tmp_path / f"{ftype}.gguf"
    # run beside the imatrix and name it as llama-quantize was given it: the file keeps the name it was
    # given (quantize.imatrix.file)
    r = run_cli(["quantize", "--imatrix", GOLDEN["imatrix"], model, out, ftype, "2"], cwd=DATA)
    assert r.exit_code == 0, r.output
    assert sha256(out) == GOLDEN["outputs"][ftype]["sha256"]


def test_target_bpw_on_moe_tunes_the_experts_as_classes(model, tmp_path):
    """--target-bpw on the qwen3moe with llama-imatrix's matrix: the sensitivity pass runs the MoE model
    and measures the routed experts as classes of their own; the file meets the target, and plain
    quantize with the written --tensor-type-file gives the same bytes (the file llama-quantize reads)."""
    out, types, plan = tmp_path / "o.gguf", tmp_path / "types.txt", tmp_path / "plan.json"
    im = DATA / "qwen3moe-F16.c64x4.gguf"
    r = run_cli(["quantize", "--imatrix", im, "--target-bpw", "5.0", "--tensor-type-out", types,
                 "--plan-out", plan, model, out, "Q4_K_M"])
    assert r.exit_code == 0, r.output
    doc = json.loads(plan.read_text())
    assert doc["bpw_out"] <= 5.0
    sens, probe = doc["target"]["sensitivity"], doc["target"]["probe_kld"]
    assert {"ffn_up_exps", "ffn_gate_exps", "ffn_down_exps", "attn_q"} <= set(sens)
    assert all(probe[c] > 0 for c in ("ffn_up_exps", "ffn_down_exps")), probe
    assert "blk.0.ffn_down_exps.weight" in doc["target"]["tensors"]
    again = tmp_path / "again.gguf"
    r = run_cli(["quantize", "--imatrix", im, "--tensor-type-file", types, model, again, "Q4_K_M"])
    assert r.exit_code == 0, r.output
    assert sha256(again) == sha256(out)


def test_sweep_and_bench_on_moe(model, tmp_path):
    """A sweep of the qwen3moe (a file type and a target BPW, with llama-bench's pp test): every point is
    measured against the source, Q8_0 lies closer to it than the ~4.5-bit mix, and each KLD is the one
    `quantkit perplexity --kl-divergence` reports for that file."""
    import csv
    import io
    import re

    out = tmp_path / "sweep"
    r = run_cli(["sweep", "-m", model, "--imatrix", DATA / "qwen3moe-F16.c64x4.gguf", "--types", "Q8_0",
                 "--target-bpw", "4.5", "-c", 128, "--chunks", 2, "--format", "csv", "--bench", "--bench-pp", 16,
                 "--bench-tg", 0, "--bench-reps", 1, "-o", out])
    assert r.exit_code == 0, r.output
    rows = {row["label"]: row for row in csv.DictReader(io.StringIO(r.stdout))}
    assert set(rows) == {"Q8_0", "bpw4.5"}
    assert 0 < float(rows["Q8_0"]["kld"]) < float(rows["bpw4.5"]["kld"])
    assert float(rows["bpw4.5"]["bpw"]) <= 4.5 and all(float(x["pp_ts"]) > 0 for x in rows.values())
    kl = run_cli(["perplexity", "-m", out / "bpw4.5.gguf", "--kl-divergence", "--kl-divergence-base",
                  out / "base.kld"])
    assert kl.exit_code == 0, kl.output
    assert float(rows["bpw4.5"]["kld"]) == pytest.approx(
        float(re.search(r"Mean\s+KLD:\s+([0-9.]+)", kl.stdout).group(1)), abs=5e-7)


# -- the newer architectures' files, quantized as llama-quantize quantizes them -----------------------

ARCH_DATA = Path(__file__).parent / "data" / "quantize"
ARCH_GOLDEN = json.loads((ARCH_DATA / "arch-golden.json").read_text())
ARCH_JOBS = [(name, ftype) for name, g in ARCH_GOLDEN["models"].items() for ftype in sorted(g["outputs"])]


@pytest.mark.parametrize("name,ftype", ARCH_JOBS, ids=[f"{n}-{f}" for n, f in ARCH_JOBS])
def test_arch_quantize_matches_llama_quantize(name, ftype, tmp_path):
    """tools/make_arch_quantize_golden.py: llama-quantize's bytes for the tiny file of each newer
    architecture (glm4moe: its leading dense layer, routed and shared experts, exp_probs_b, the
    multi-token-prediction block), Q4_K_M without an imatrix, IQ4_XS with llama-imatrix's
    (tests/data/imatrix/<name>-F16.c64x4.gguf, the one test_moe.py checks quantkit's imatrix against)."""
    g = ARCH_GOLDEN["models"][name]
    model = write_model(tmp_path / f"{name}-F16.gguf", name, "F16")
    assert sha256(model) == g["model_sha256"], "the test model is not the one the golden data was made from"
    job = g["outputs"][ftype]
    out = tmp_path / f"{ftype}.gguf"
    # run beside the imatrix and name it as llama-quantize was given it (quantize.imatrix.file)
    r = run_cli(["quantize", *(["--imatrix", g["imatrix"]] if job["imatrix"] else []), model, out, ftype, "2"],
                cwd=DATA)
    assert r.exit_code == 0, r.output
    assert sha256(out) == job["sha256"]
