"""`quantkit quantize --target-bpw` on the bundled SmolLM2: refusals, the measurements it is built on, and
the allocation judged by what a reference can check: the written file (read by gguf-py) within the target,
the expected loss no worse than a simple greedy allocator's on the same error table, and the recipe it
writes (--tensor-type-out) giving the same bytes through plain quantize. Plain quantize with such a
recipe gives llama-quantize's bytes (tests/data/quantize/tensor_type_file.json, from the real
llama-quantize by tools/make_tensor_type_file_golden.py)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from conftest import run_cli
from quantkit.formats.gguf_io import GGUFModel
from quantkit.pipelines import target_bpw as tb

DATA = Path(__file__).parent / "data" / "quantize"
#: llama-quantize's file for a fixed recipe of per-tensor types (a --tensor-type-file)
RECIPE_GOLDEN = json.loads((DATA / "tensor_type_file.json").read_text())
IMATRIX = DATA / "synthetic.imatrix.gguf"


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
    (["--target-size", "60MiB"], "Q4_K_M", "(62914560 bytes) is too small"),
])
def test_refusals_write_nothing(smollm2_f16, tmp_path, extra, ftype, msg):
    out = tmp_path / "o.gguf"
    args = ["--target-bpw", "5"] if not any(a.startswith("--target-") for a in extra) else []
    res = run_cli(["quantize", "--imatrix", IMATRIX, *args, *extra, smollm2_f16, out, ftype])
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
    """Plain quantize with a fixed recipe of per-tensor types (^name$=type lines in six types, as
    --tensor-type-out writes them): llama-quantize's file, byte for byte."""
    out = tmp_path / "o.gguf"
    res = run_cli(["quantize", "-q", "--imatrix", RECIPE_GOLDEN["imatrix"], "--tensor-type-file",
                   RECIPE_GOLDEN["tensor_type_file"], smollm2_f16, out, RECIPE_GOLDEN["ftype"]], cwd=DATA)
    assert res.exit_code == 0, res.output
    assert sha256(out) == RECIPE_GOLDEN["llama_quantize"]["sha256"]


# -- the allocation, judged by references ------------------------------------------------------------

#: once the fixed tensors are paid, 4.5 bits per weight for the others: under Q4_0's size, so the allocator
#: must trade between types (at 5.5 every tensor takes Q4_1, nearly lossless on this F16, which was
#: expanded from the Q4_1 model)
TARGET_BPW = 4.8
#: fixed choices the allocator works around: a --tensor-type pattern and --token-embedding-type
PATTERN, EMBD = "attn_v=q8_0", "q5_0"
FIXED = ["--tensor-type", PATTERN, "--token-embedding-type", EMBD]


@pytest.fixture(scope="module")
def mix(smollm2_f16, tmp_path_factory):
    """One --target-bpw run with fixed choices: its output, recipe, plan and log, and the output's
    tensors as gguf-py reads them: name -> (type, elements, row length, bytes)."""
    d = tmp_path_factory.mktemp("target-bpw")
    out, types, plan = d / "o.gguf", d / "types.txt", d / "plan.json"
    res = run_cli(["quantize", "-q", "--imatrix", IMATRIX, "--target-bpw", TARGET_BPW, *FIXED,
                   "--tensor-type-out", types, "--plan-out", plan, smollm2_f16, out, "Q4_K_M"])
    assert res.exit_code == 0, res.output
    tensors = {t.name: (Q(t.tensor_type), int(t.n_elements), int(t.shape[0]), int(t.n_bytes))
               for t in gguf.GGUFReader(out).tensors}
    return {"out": out, "types": types, "plan": json.loads(plan.read_text()), "log": res.output, "tensors": tensors}


def nbytes(q: Q, n_elements: int) -> int:
    block, type_size = gguf.GGML_QUANT_SIZES[q]
    return n_elements // block * type_size


def greedy(losses: dict[str, dict[Q, float]], sizes: dict[str, dict[Q, int]], budget: int) -> dict[str, Q]:
    """The reference allocator: every tensor at its smallest candidate, then, while anything fits, the one
    change of one tensor to any candidate that saves the most loss per byte added."""
    choice = {n: min(c, key=lambda q: (sizes[n][q], c[q])) for n, c in losses.items()}
    used = sum(sizes[n][q] for n, q in choice.items())
    while True:
        best = None
        for n, cands in losses.items():
            for q, loss in cands.items():
                saved, added = cands[choice[n]] - loss, sizes[n][q] - sizes[n][choice[n]]
                if saved > 0 and used + added <= budget:
                    gain = saved / added if added > 0 else math.inf
                    if best is None or gain > best[0]:
                        best = (gain, n, q, added)
        if best is None:
            return choice
        _, n, q, added = best
        choice[n] = q
        used += added


def test_target_bpw_file_meets_the_target(mix):
    """The written file, read by gguf-py: at or under the target BPW (8 x tensor bytes / elements, as
    llama-quantize's summary counts it), and exactly the bytes the allocator predicted and the log
    reports as achieved."""
    tensors = mix["tensors"]
    size = sum(t[3] for t in tensors.values())
    elements = sum(t[1] for t in tensors.values())
    assert 8 * size / elements <= TARGET_BPW
    assert mix["plan"]["target"]["predicted_bytes"] == size
    line = next(ln for ln in mix["log"].splitlines() if ln.startswith("target-bpw: target"))
    assert re.search(rf"predicted [\d.]+ BPW \({size} bytes\), achieved [\d.]+ BPW \({size} bytes\)", line), line


def test_target_bpw_loss_no_worse_than_a_simple_greedy(mix):
    """On the allocator's own error table (the plan's per-tensor candidate losses), the types in the
    file cost no more expected loss than the simple greedy's choice within the same byte budget: the
    target's bytes minus the fixed tensors' (sizes from gguf-py's block table and the file's shapes)."""
    tensors = mix["tensors"]
    table = mix["plan"]["target"]["tensors"]
    losses = {n: {Q[q]: loss for q, loss in t["candidates"].items()} for n, t in table.items()}
    sizes = {n: {q: nbytes(q, tensors[n][1]) for q in c} for n, c in losses.items()}
    fixed = sum(t[3] for n, t in tensors.items() if n not in table)
    budget = math.floor(TARGET_BPW * sum(t[1] for t in tensors.values()) / 8) - fixed
    ours = sum(losses[n][tensors[n][0]] for n in losses)
    ref = greedy(losses, sizes, budget)
    assert sum(sizes[n][q] for n, q in ref.items()) <= budget
    assert ours <= sum(losses[n][q] for n, q in ref.items()) * (1 + 1e-12)


def test_target_bpw_choices_are_allowed_and_fixed_ones_kept(mix):
    """Every chosen type's block divides its rows, at least three types are used, nothing fell back; the
    fixed choices keep their types, stay out of the allocator's table and lead the recipe."""
    tensors = mix["tensors"]
    table = mix["plan"]["target"]["tensors"]
    for n in table:
        q, _, ne0, _ = tensors[n]
        assert ne0 % gguf.GGML_QUANT_SIZES[q][0] == 0 and Q[table[n]["type"]] == q, n
    assert len({tensors[n][0] for n in table}) >= 3
    assert all(t["fallback_from"] is None for t in mix["plan"]["tensors"])
    assert tensors["token_embd.weight"][0] == Q[EMBD.upper()]
    assert all(t[0] == Q.Q8_0 for n, t in tensors.items() if "attn_v" in n)
    assert not any("attn_v" in n or n == "token_embd.weight" for n in table)
    lines = mix["types"].read_text().splitlines()
    assert lines[0] == PATTERN and len(lines) == 1 + len(table)


def test_target_bpw_recipe_gives_the_same_bytes(mix, smollm2_f16, tmp_path):
    """The recipe (--tensor-type-out) fed to plain quantize with the same other options: the same file."""
    out = tmp_path / "o.gguf"
    res = run_cli(["quantize", "-q", "--imatrix", IMATRIX, "--token-embedding-type", EMBD,
                   "--tensor-type-file", mix["types"], smollm2_f16, out, "Q4_K_M"])
    assert res.exit_code == 0, res.output
    assert sha256(out) == sha256(mix["out"])
