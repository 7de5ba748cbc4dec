"""`quantkit quantize --target-bpw` on the bundled SmolLM2: refusals, the measurements it is built on, and
byte identity with llama-quantize given the --tensor-type-file it writes (tests/data/quantize/
target_bpw.json, made by tools/make_target_bpw_golden.py with the real llama-quantize)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from conftest import run_cli
from quantkit.formats.gguf_io import GGUFModel
from quantkit.pipelines import target_bpw as tb

DATA = Path(__file__).parent / "data" / "quantize"
GOLDEN = json.loads((DATA / "target_bpw.json").read_text())


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def one_line_error(res) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize("args,code,msg", [
    (["--target-bpw", "5"], 2, "need --imatrix FILE"),
    (["--target-bpw", "5", "--target-size", "90MB", "--imatrix", "x"], 2, "not both"),
    (["--target-size", "4.2XB", "--imatrix", "x"], 2, "bad size"),
    (["--target-bpw", "-1", "--imatrix", "x"], 2, "between 0 and 64"),
    (["--target-types", "q4_0"], 2, "--target-types needs --target-bpw"),
])
def test_usage_errors_before_any_work(tmp_path, args, code, msg):
    # the input does not even exist: the refusal comes first
    res = run_cli(["quantize", *args, tmp_path / "missing.gguf", tmp_path / "o.gguf", "Q4_K_M"])
    assert res.exit_code == code
    assert msg in one_line_error(res)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra,ftype,msg", [
    (["--pure"], "Q4_K_M", "nothing is left"),
    ([], "F16", "need a quantized file type"),
    # 3.84: TQ1_0 on the 1536-wide rows (MXFP4, which fits the 576-wide ones, is a candidate only when named)
    (["--target-bpw", "1"], "Q4_K_M", "too small: the smallest types the tensors allow give 3.84"),
])
def test_refusals_write_nothing(smollm2_f16, tmp_path, extra, ftype, msg):
    out = tmp_path / "o.gguf"
    args = ["--target-bpw", "5"] if "--target-bpw" not in extra else []
    res = run_cli(["quantize", "--imatrix", DATA / "synthetic.imatrix.gguf", *args, *extra, smollm2_f16, out, ftype])
    assert res.exit_code == 1
    assert msg in one_line_error(res)
    assert list(tmp_path.iterdir()) == []


def _round_trip(x, q):
    """quantkit's bytes (ggml's, tests/test_golden.py) decoded by gguf-py's reference dequantizer."""
    from quantkit.quants import quantize

    return gguf.quants.dequantize(quantize(x, q), q)


def test_weighted_errors_match_a_float64_reference(smollm2_f16):
    """D(t, q) without weights is the plain squared error of the round trip, summed in float64."""
    with GGUFModel(smollm2_f16) as m:
        t = m.tensor("blk.3.attn_k.weight")
        errs = tb.weighted_errors(t, [Q.Q8_0, Q.Q4_0, Q.F16], None, sample_rows=192)   # every row
        x = np.asarray(t.data).view(np.float16).astype(np.float32).reshape(192, 576)
    for q in (Q.Q8_0, Q.Q4_0):
        y = _round_trip(x, q)
        want = float(((x.astype(np.float64) - y) ** 2).sum())
        assert errs[q] == pytest.approx(want, rel=1e-9)
    assert errs[Q.F16] == 0.0   # the source is F16


def test_weighted_errors_scale_a_row_sample_and_use_the_weights(smollm2_f16):
    with GGUFModel(smollm2_f16) as m:
        t = m.tensor("blk.3.ffn_up.weight")   # 1536 rows, 64 sampled
        w = np.full((1, 576), 2.0, np.float32)
        one = tb.weighted_errors(t, [Q.Q8_0], None)[Q.Q8_0]
        two = tb.weighted_errors(t, [Q.Q8_0], w)[Q.Q8_0]   # Q8_0 ignores the weights: twice the error
        rows = tb._sample_rows(1536, tb.SAMPLE_ROWS)
        x = np.asarray(t.data).view(np.float16).astype(np.float32).reshape(1536, 576)[rows]
    y = _round_trip(x, Q.Q8_0)
    assert one == pytest.approx(float(((x.astype(np.float64) - y) ** 2).sum()) * 1536 / len(rows), rel=1e-9)
    assert two == pytest.approx(2 * one, rel=1e-9)


def test_all_weighted_errors_on_threads_equal_one_by_one(smollm2_f16):
    """The tensors shared out among threads (one numba thread each) give each tensor's own result,
    exactly, and leave the caller's numba thread count as it was."""
    from quantkit.jit import get_threads, set_threads

    names = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.2.attn_v.weight", "blk.5.ffn_gate.weight"]
    rng = np.random.default_rng(3)
    with GGUFModel(smollm2_f16) as m:
        ne0 = {n: int(m.tensor(n).shape[0]) for n in names}
        w = {n: rng.random((1, ne0[n])).astype(np.float32) + 0.1 for n in names}
        cands = {n: [Q.Q4_0, Q.Q5_1, Q.IQ4_NL] + ([Q.Q4_K, Q.IQ3_S] if ne0[n] % 256 == 0 else []) for n in names}
        want = {n: tb.weighted_errors(m.tensor(n), cands[n], w[n]) for n in names}
        before = set_threads(2)
        try:
            got = tb.all_weighted_errors(m, names, cands, w.get)
            assert get_threads() == 2
        finally:
            set_threads(before)
    assert got == want


def test_candidates_follow_the_row_length_and_the_defaults():
    """A 576-wide row allows no 256-block type; IQ3_XXS/IQ3_S/MXFP4 are candidates only when named; the
    IQ2/IQ1 lattice types never are."""
    wide, narrow = tb.candidate_types(1536), tb.candidate_types(576)
    assert Q.Q4_K in wide and Q.Q4_K not in narrow and Q.Q4_0 in narrow and Q.F16 in narrow
    assert Q.IQ3_XXS not in wide and Q.IQ3_S not in wide and Q.MXFP4 not in narrow and Q.IQ2_XXS not in wide
    # a set: the list follows TRAITS' registration order, which other tests' imports can change
    assert set(tb.candidate_types(1536, (Q.IQ3_S, Q.Q4_K, Q.IQ2_XS))) == {Q.Q4_K, Q.IQ3_S}
    assert tb.candidate_types(576, (Q.IQ3_S,)) == []


def test_kld_against_a_float64_formula():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 50)) * 3, rng.standard_normal((3, 50)) * 3
    p = np.exp(a) / np.exp(a).sum(1, keepdims=True)
    q = np.exp(b) / np.exp(b).sum(1, keepdims=True)
    want = float(np.mean((p * np.log(p / q)).sum(1)))
    assert tb.kld(tb._log_softmax(a), b.astype(np.float32)) == pytest.approx(want, rel=1e-6)
    assert tb.kld(tb._log_softmax(a), a) == pytest.approx(0.0, abs=1e-12)


def test_sensitivity_pass_restores_the_weights(smollm2_f16):
    """A probe equal to the type the pass holds the weights in (float32, _hold_as_f32) changes nothing
    (KLD 0); a real probe moves the output, and the model comes back unchanged either way (the second
    class sees the first one's weights restored)."""
    groups = {"same": ["blk.0.attn_v.weight"], "probe": ["blk.0.attn_v.weight"], "again": ["blk.0.attn_v.weight"]}
    probe = {"blk.0.attn_v.weight": Q.F32}
    order = iter([Q.F32, Q.Q4_0, Q.F32])

    class Probe(dict):
        def __getitem__(self, k):
            return next(order)

    sens, kld = tb.measure_sensitivity(smollm2_f16, groups, Probe(probe), lambda n: None,
                                       {"blk.0.attn_v.weight": 1.0}, n_chunks=2)
    assert kld["same"] == 0.0 and kld["again"] == 0.0
    assert kld["probe"] > 1e-5
    assert sens["probe"] == kld["probe"]


def test_f32_hold_keeps_the_model(smollm2_f16):
    """The sensitivity pass's float32 copies: a tied embedding stays one object, the logits equal the
    source's up to the F16 rounding of activations the stored weights' path does; over the byte limit
    nothing is replaced."""
    from quantkit.pipelines.loading import open_model

    om = open_model(smollm2_f16)
    try:
        r = om.runner(40, 40, compiled_step=False)
        x = np.arange(1, 41) * 37
        want = r.forward(x, 0, logits="all")
        assert not tb._hold_as_f32([r], max_bytes=1000) and r.blk[0].attn_q.type == Q.F16
        r.reset()
        assert tb._hold_as_f32([r])
        assert r.output is r.token_embd and r.blk[3].ffn_down.type == Q.F32
        got = r.forward(x, 0, logits="all")
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
        assert tb.kld(tb._log_softmax(want), got) < 1e-4
    finally:
        om.model.close()


def test_tensor_type_file_gives_llama_quantize_bytes(smollm2_f16, tmp_path):
    """Plain quantize with the recorded --tensor-type-file: llama-quantize's file, byte for byte."""
    out = tmp_path / "o.gguf"
    res = run_cli(["quantize", "-q", "--imatrix", GOLDEN["imatrix"], "--tensor-type-file", GOLDEN["tensor_type_file"],
                   smollm2_f16, out, GOLDEN["ftype"]], cwd=DATA)
    assert res.exit_code == 0, res.output
    assert sha256(out) == GOLDEN["llama_quantize"]["sha256"]


def test_target_bpw_end_to_end(smollm2_f16, tmp_path):
    """--target-bpw chooses the recorded types, meets the target, and writes llama-quantize's bytes."""
    out, types, plan = tmp_path / "o.gguf", tmp_path / "types.txt", tmp_path / "plan.json"
    res = run_cli(["quantize", "-q", "--imatrix", GOLDEN["imatrix"], "--target-bpw", GOLDEN["target_bpw"],
                   "--tensor-type-out", types, "--plan-out", plan, smollm2_f16, out, GOLDEN["ftype"]], cwd=DATA)
    assert res.exit_code == 0, res.output
    assert types.read_text() == (DATA / GOLDEN["tensor_type_file"]).read_text()
    assert sha256(out) == GOLDEN["llama_quantize"]["sha256"]
    doc = json.loads(plan.read_text())
    assert doc["bpw_out"] <= GOLDEN["target_bpw"]
    assert doc["target"]["predicted_bpw"] == pytest.approx(doc["bpw_out"], abs=1e-12)
    assert doc["target"]["predicted_kld"] > 0
    line = [ln for ln in res.output.splitlines() if ln.startswith("target-bpw: target")][0]
    assert f"predicted {doc['bpw_out']:.4f} BPW" in line and f"achieved {doc['bpw_out']:.4f} BPW" in line
    # the chosen types are all allowed by the row length, and at least three kinds are used
    chosen = {t["name"]: t["type"] for t in doc["tensors"] if t["quantize"]}
    assert len(set(chosen.values())) >= 3
    for t in doc["tensors"]:
        block = gguf.GGML_QUANT_SIZES[Q[t["type"]]][0]
        assert t["shape"][0] % block == 0
        assert t["fallback_from"] is None


def test_fixed_choices_are_kept_and_counted(smollm2_f16, tmp_path):
    """--tensor-type and --token-embedding-type are not the allocator's: they keep their types, their
    bytes count toward the target, and the type file starts with the user's pattern."""
    plan, types = tmp_path / "plan.json", tmp_path / "types.txt"
    res = run_cli(["quantize", "--dry-run", "--imatrix", DATA / "synthetic.imatrix.gguf", "--target-size", "90MiB",
                   "--tensor-type", "attn_v=q8_0", "--token-embedding-type", "q8_0", "--plan-out", plan,
                   "--tensor-type-out", types, smollm2_f16, "Q4_K_M"])
    assert res.exit_code == 0, res.output
    doc = json.loads(plan.read_text())
    by = {t["name"]: t for t in doc["tensors"]}
    assert by["token_embd.weight"]["type"] == "Q8_0"
    assert all(t["type"] == "Q8_0" for n, t in by.items() if "attn_v" in n)
    assert sum(t["bytes_out"] for t in doc["tensors"]) <= 90 * 1024 * 1024
    assert not any("attn_v" in n or n == "token_embd.weight" for n in doc["target"]["tensors"])
    lines = types.read_text().splitlines()
    assert lines[0] == "attn_v=q8_0" and len(lines) == 1 + len(doc["target"]["tensors"])
