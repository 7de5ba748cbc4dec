"""Llama 4 (``llama4``, src/models/llama4.cpp) and MiniMax-M2 (``minimax-m2``, src/models/minimax-m2.cpp):
what they add beside test_moe.py's checks of their tiny files (config and layer records, the three paths
against the float64 reference and llama.cpp's 48-token logits and greedy tokens, llama-imatrix's file,
``quantkit run``; llama-quantize's Q4_K_M and IQ4_XS bytes in test_moe_quantize.py). Llama 4:

* chunked attention and the NoPE layers' query temperature against llama.cpp past its 8192-position chunk
  (tests/data/arch/llama4-long-F16.npz, tools/make_arch_golden.py's long golden);
* the same ops at a small chunk and temperature floor, where the float64 reference can run them: the
  batch path and the compiled step against it;
* the routing's choice on the logits (sigmoid scores that round to one value in float32 still choose);
* the temperature's values, the refusal of the all-global form;

MiniMax-M2: the refusal of a file without its gating; both: perplexity, bench and sweep finish.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from archmodels import write_model
from quantkit.errors import ModelError
from quantkit.model.forward import Runner
from quantkit.model.layer import Routing, describe
from quantkit.model.llama import Llama, LlamaConfig
from quantkit.model.ops import attn_temperature
from quantkit.model.reference import reference_logits
from quantkit.model.route import route, route_rows, routing_record

GOLDEN = Path(__file__).parent / "data" / "arch"


@pytest.fixture(scope="module")
def f16(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("llama4") / "llama4-F16.gguf", "llama4", "F16")
    with Llama(path) as m:
        yield path, m


def test_long_context_matches_llama_cpp(f16):
    """8256 ids in one llama.cpp batch; its logits at the last 128 positions, across the end of the first
    8192-position chunk (the chunked layers' keys there start again at 8192) and past position 8191 (the
    global NoPE layer's queries times 1 + 0.1 ln 2). quantkit: the batch path up to the last 16 ids, the
    compiled step for those. Without the chunks the logits past 8192 are ~6 apart (measured mean |d| 6.3),
    without the temperature 0.07; with both 0.007, as llama.cpp's own batch vs token noise on this file."""
    path, m = f16
    g = dict(np.load(GOLDEN / "llama4-long-F16.npz"))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(g["sha256"]), "not the file llama.cpp ran"
    ids, rows, want = g["ids"], g["rows"], g["logits"]
    assert rows[0] < 8191 < 8192 < rows[-1] == len(ids) - 1
    r = Runner(m, len(ids))
    assert r.step is not None
    got = np.concatenate([r.forward(ids[:-16], logits=rows[:-16]), *[r.forward([t]) for t in ids[-16:]]])
    d = np.abs(got - want)
    print(f"mean |d| {d.mean():.4f} max {d.max():.3f}; past the chunk {d[rows >= 8192].mean():.4f}")
    g48 = dict(np.load(GOLDEN / "llama4-F16.npz"))
    assert d.mean() <= 4 * float(g48["self_mean"])
    gap = np.diff(np.sort(want, 1)[:, -2:], axis=1)[:, 0]
    clear = gap >= float(g48["self_max"])
    assert (got.argmax(1)[clear] == want.argmax(1)[clear]).all()


def _small(m: Llama, chunk: int) -> Llama:
    """``m`` with chunks and a temperature floor of ``chunk`` positions (llama.cpp's are 8192)."""
    c = dataclasses.replace(m.config, n_swa=chunk, attn_temp=(chunk, 0.1, 1.0))
    m.config = c
    m.layers = tuple(describe(c, b, i) for i, b in enumerate(m.blk))
    return m


@pytest.mark.parametrize("variant", ["F16", "Q"])
def test_small_chunks_match_reference(tmp_path, variant):
    """Chunks of 16 over 48 positions: the batch path (in one pass and in pieces of 8 that start inside
    a chunk) and the compiled step against the float64 reference; the F16 file within 0.5 % of the logits'
    spread on average, the quantized one (8-bit activations) within 5 %."""
    with Llama(write_model(tmp_path / "m.gguf", "llama4", variant)) as m:
        m = _small(m, 16)
        assert [d.attn.window for d in m.layers] == [-16, -16, -16, 0]
        assert [d.attn.temp_floor for d in m.layers] == [0, 0, 0, 16]
        ids = np.random.default_rng(3).integers(0, 500, 48)
        routes: list = []
        ref = reference_logits(m, ids, routes)
        r = Runner(m, 64)
        outs = {"batch": r.forward(ids, logits="all"),
                "pieces": Runner(m, 64, n_batch=8).forward(ids, logits="all")}
        r.reset()
        outs["step"] = np.concatenate([r.forward([t]) for t in ids])
        keep = np.ones(len(ids), bool) if variant == "F16" else np.all([x[2] >= 0.3 for x in routes], axis=0)
        bar = (0.005 if variant == "F16" else 0.05) * float(ref.std(1).mean())
        for name, got in outs.items():
            d = np.abs(got - ref)[keep]
            print(f"{variant} {name}: {keep.sum()} positions, mean |d| {d.mean():.4f}")
            assert np.median(d.mean(1)) <= bar, name


def test_route_chooses_on_logits():
    """llama4's routing chooses on the router's logits (build_moe_ffn: selection_probs = logits), its
    weight the sigmoid: logits 20 and 30 both have sigmoid 1.0 in float32, and the larger logit still wins
    (chosen on the probabilities, the tie would go to the lower index)."""
    logits = np.array([[20.0, 30.0, -1.0, 0.5], [0.5, -2.0, 1.5, 1.0]])
    on_logits = Routing(4, 1, "sigmoid", norm_w=False, select_logits=True)
    on_probs = Routing(4, 1, "sigmoid", norm_w=False)
    top, w = route_rows(logits.astype(np.float32), routing_record(on_logits))
    assert top[:, 0].tolist() == [1, 2] and w[:, 0] == pytest.approx([1.0, 1 / (1 + np.exp(-1.5))], rel=1e-6)
    assert route_rows(logits.astype(np.float32), routing_record(on_probs))[0][:, 0].tolist() == [0, 2]
    t64, w64, margin = route(logits, on_logits)
    assert t64[:, 0].tolist() == [1, 2] and margin == pytest.approx([10.0, 0.5])    # in logit units


def test_attn_temperature():
    """llm_graph_input_attn_temp with llama4's constants (floor 8192, scale 0.1, offset 1): 1 up to
    position 8190, 1 + 0.1 ln 2 from 8191, 1 + 0.1 ln 3 from 16383."""
    t = [attn_temperature(p, 8192, np.float32(0.1), np.float32(1.0)) for p in (0, 8190, 8191, 16382, 16383)]
    want = [1.0, 1.0, 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(3)]
    assert t == pytest.approx(want, rel=1e-7)
    assert attn_temperature(5, 0, np.float32(0.0), np.float32(0.0)) == 1.0


def test_config_refusals(f16):
    _, m = f16
    meta = dict(m.metadata)
    assert m.config.n_swa == 8192 and m.config.qk_l2 and m.config.moe_layer_step == 2
    bad = {**meta, "llama4.attention.sliding_window": 0}
    with pytest.raises(ModelError, match="sliding_window 0 .* is not supported"):
        LlamaConfig.from_metadata(bad, 512)
    # a file's sliding_window other than 0 does not change llama.cpp's chunk
    assert LlamaConfig.from_metadata({**meta, "llama4.attention.sliding_window": 16}, 512).n_swa == 8192
    with pytest.raises(ModelError, match="'llama4.interleave_moe_layer_step' is missing"):
        LlamaConfig.from_metadata({k: v for k, v in meta.items() if "interleave" not in k}, 512)
    # Maverick's 128 experts: no L2 q/k norm (use_kq_norm)
    assert not LlamaConfig.from_metadata({**meta, "llama4.expert_count": 128}, 512).qk_l2


def test_minimax_m2_needs_its_gating(tmp_path):
    """llama.cpp's minimax-m2 graph passes the file's expert_gating_func to build_moe_ffn, which aborts on
    none: refused in one line; the weights normalized (norm_w = true) whatever expert_weights_norm says."""
    with Llama(write_model(tmp_path / "m.gguf", "minimax-m2")) as m:
        meta = dict(m.metadata)
        assert m.config.moe_gating == "sigmoid" and m.config.moe_norm_w and m.config.n_rot == 24
    with pytest.raises(ModelError, match="'minimax-m2.expert_gating_func' is missing"):
        LlamaConfig.from_metadata({k: v for k, v in meta.items() if "gating" not in k}, 512)
    with pytest.raises(ModelError, match="expert_gating_func = 4 is not supported"):
        LlamaConfig.from_metadata({**meta, "minimax-m2.expert_gating_func": 4}, 512)
    assert LlamaConfig.from_metadata({**meta, "minimax-m2.expert_weights_norm": False}, 512).moe_norm_w


@pytest.mark.parametrize("arch", ["llama4", "minimax-m2"])
def test_cli_perplexity_bench_sweep(arch, tmp_path):
    """perplexity, bench and a sweep (Q8_0 and Q4_K_M against the F16 file) finish on each file."""
    import csv
    import io

    from conftest import run_cli

    path = write_model(tmp_path / f"{arch}-F16.gguf", arch, "F16")
    shutil.copy(Path(__file__).parent / "data" / "imatrix" / "calibration-sample.txt", tmp_path / "t.txt")
    r = run_cli(["perplexity", "-m", path, "-f", "t.txt", "-c", 64, "--chunks", 2], cwd=tmp_path)
    assert r.exit_code == 0 and "Final estimate: PPL" in r.output, r.output
    r = run_cli(["bench", "-m", path, "-p", 16, "-n", 4, "-r", 1, "-o", "csv"], cwd=tmp_path)
    assert r.exit_code == 0 and r.output.count("\n") >= 3, r.output
    r = run_cli(["sweep", "-m", path, "--types", "Q8_0,Q4_K_M", "-c", 64, "--chunks", 2, "--format", "csv",
                 "-o", tmp_path / "sweep"])
    assert r.exit_code == 0, r.output
    rows = {row["label"]: row for row in csv.DictReader(io.StringIO(r.stdout))}
    assert set(rows) == {"Q8_0", "Q4_K_M"} and 0 < float(rows["Q8_0"]["kld"]) < float(rows["Q4_K_M"]["kld"])
