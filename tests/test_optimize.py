"""``quantize --optimize`` (quants/gptq.py, pipelines/optimize.py): never worse than llama.cpp's rounding
on the error it minimizes, the same bytes for any thread count, and a file gguf-py reads and quantkit runs.

The reference error is float64 numpy over gguf-py's own decoding of the bytes; quantkit's plain
``quantize`` stands for llama.cpp's rounding (the golden tests check it byte for byte)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from conftest import run_cli
from quantkit.jit import get_threads, set_threads
from quantkit.quants import quantize, traits
from quantkit.quants.gptq import SUB_STEP, SUPPORTED, compensate, factor, sweep


def _problem(n: int, rows: int = 64, seed: int = 0):
    """Weights, a correlated input Gram matrix (mean of x x^T) and imatrix weights (its diagonal)."""
    rng = np.random.default_rng(seed)
    mix = np.eye(n) + 0.15 * rng.standard_normal((n, n))
    x = rng.standard_normal((4 * n, n)) @ mix
    x[:, :3] *= 8.0                         # a few loud input channels, as real activations have
    h = x.T @ x / x.shape[0]
    w = (0.02 * rng.standard_normal((rows, n))).astype(np.float32)
    w[3, 7] = 0.3                           # an outlier
    return w, h, np.diag(h).astype(np.float32)


def _errors(w, q_bytes, qtype, h):
    """Float64 e H e^T per row, e from gguf-py's decoding."""
    e = gguf_dequantize(q_bytes, qtype).astype(np.float64).reshape(w.shape) - w.astype(np.float64)
    return np.einsum("ri,ij,rj->r", e, h, e)


@pytest.mark.parametrize("qtype", sorted(SUPPORTED, key=int), ids=lambda t: t.name)
@pytest.mark.parametrize("weighted", [True, False], ids=["imatrix", "no-imatrix"])
def test_never_worse_than_llama_cpp_per_row(qtype, weighted):
    w, h, imat = _problem(512)
    wts = imat if weighted else None
    F = factor(h, traits(qtype).block_size, SUB_STEP[qtype])
    got, taken = compensate(w, qtype, F, wts)
    base = quantize(w, qtype, wts)
    e_opt, e_base = _errors(w, got, qtype, h), _errors(w, base, qtype, h)
    assert (e_opt <= e_base * (1 + 1e-9)).all()
    assert np.array_equal(got[~taken], base[~taken])        # rows not taken are llama.cpp's bytes
    assert e_opt.sum() < 0.9 * e_base.sum()                 # and the sweep does help on correlated inputs
    assert got.shape == base.shape                          # same type, same bytes per row


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_0, T.IQ4_XS], ids=lambda t: t.name)
def test_same_bytes_for_any_thread_count(qtype):
    w, h, imat = _problem(512, rows=96, seed=1)
    old = get_threads()
    try:
        set_threads(1)
        one = sweep(w, qtype, factor(h, traits(qtype).block_size, SUB_STEP[qtype]), imat)
        set_threads(2)
        three = sweep(w, qtype, factor(h, traits(qtype).block_size, SUB_STEP[qtype]), imat)
    finally:
        set_threads(old)
    assert np.array_equal(one[0], three[0]) and np.array_equal(one[1], three[1])


def test_blocked_cholesky_is_lapack_and_thread_independent():
    """The factorization's tiles (64 wide here, 5 x 5 of them and a ragged edge) against LAPACK's
    unblocked one, and the same bits on one thread and two."""
    from quantkit.quants.gptq import cholesky

    _, h, _ = _problem(300)
    h[np.diag_indices(300)] += 0.1 * np.mean(np.diag(h))
    old = get_threads()
    try:
        set_threads(1)
        one = cholesky(h.copy(), nb=64)
        set_threads(2)
        two = cholesky(h.copy(), nb=64)
    finally:
        set_threads(old)
    assert np.array_equal(one, two)
    ref = np.linalg.cholesky(h)
    assert np.allclose(one, ref, rtol=0, atol=1e-10 * np.abs(ref).max())


@pytest.mark.parametrize("qtype, weighted", [(T.Q4_K, True), (T.Q3_K, True), (T.IQ4_XS, True), (T.Q4_0, False),
                                             (T.Q5_1, False)], ids=str)
def test_sweep_without_compensation_is_llama_cpp(qtype, weighted):
    """With a diagonal Gram matrix nothing is pushed between columns: the sweep is the plain codec. (The
    legacy types' weighted search takes its sigma2 over the whole row, the sweep gives it one block, so
    they are compared without weights.)"""
    w, _, imat = _problem(256, rows=32)
    h = np.diag(imat.astype(np.float64))
    wts = imat if weighted else None
    F = factor(h, traits(qtype).block_size, SUB_STEP[qtype])
    assert np.array_equal(sweep(w, qtype, F, wts)[0], quantize(w, qtype, wts))


def test_optimize_end_to_end(smollm2_f16, tmp_path):
    """Two layers of SmolLM2 (the rest pruned), Gram matrices from one short calibration chunk: the same
    tensor types and sizes as without --optimize, different bytes where swept, read by gguf-py, and run."""
    common = ["quantize", "--prune-layers", ",".join(str(i) for i in range(2, 30)), smollm2_f16]
    plain, opt = tmp_path / "plain.gguf", tmp_path / "opt.gguf"
    assert run_cli(common + [plain, "Q4_K_M", "2"]).exit_code == 0
    stats = tmp_path / "stats"
    calib = ["--optimize", "--optimize-chunks", "1", "--optimize-ctx", "64", "--optimize-stats", stats]
    res = run_cli(common + calib + [opt, "Q4_K_M", "2"])
    assert res.exit_code == 0, res.output
    assert "blk.1.ffn_down.weight" in res.output and "% of rows compensated" in res.output
    assert sorted(p.name for p in stats.iterdir()) == ["identity.json", "layer-0.npz", "layer-1.npz", "streams.npz"]
    again = tmp_path / "again.gguf"   # the saved statistics give the same file, on one thread
    res = run_cli(common + calib + [again, "Q4_K_M", "1"])
    assert res.exit_code == 0 and f"layer 1 statistics from {stats}" in res.output, res.output
    assert again.read_bytes() == opt.read_bytes()
    (stats / "layer-1.npz").unlink()  # as a run stopped before layer 1 leaves them: it is measured again
    res = run_cli(common + calib + [again, "Q4_K_M", "2"])
    assert res.exit_code == 0 and f"layer 0 statistics from {stats}" in res.output, res.output
    assert "layer 1 statistics in" in res.output and (stats / "layer-1.npz").exists()
    assert again.read_bytes() == opt.read_bytes()
    res = run_cli(common + calib[:2] + ["2"] + calib[3:] + [tmp_path / "x.gguf", "Q4_K_M"])
    assert res.exit_code == 1 and "made otherwise (chunks 1 there, 2 here)" in res.output, res.output
    a, b = GGUFReader(plain), GGUFReader(opt)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert list(ta) == list(tb)
    changed = 0
    for name, t in ta.items():
        assert (t.tensor_type, t.n_bytes) == (tb[name].tensor_type, tb[name].n_bytes), name
        same = np.array_equal(np.asarray(t.data), np.asarray(tb[name].data))
        assert same or name.startswith("blk."), name       # only blk.* matrices are swept
        changed += not same
    assert changed >= 10
    ppl = {}
    for f in (plain, opt):  # a two-layer model predicts badly; both must run and finish
        res = run_cli(["perplexity", "-m", f, "-c", "64", "--chunks", "2", "-t", "2"])
        assert res.exit_code == 0, res.output
        ppl[f] = float(res.output.split("Final estimate: PPL = ")[1].split()[0])
    assert np.isfinite(ppl[opt]) and ppl[opt] < 10 * ppl[plain]


@pytest.mark.parametrize("args, msg", [
    (["--optimize-chunks", "2"], "need --optimize"),
    (["--optimize-text", "x.txt"], "need --optimize"),
    (["--optimize-stats", "g.npz"], "need --optimize"),
])
def test_optimize_options_need_optimize(smollm2_f16, tmp_path, args, msg):
    res = run_cli(["quantize"] + args + [smollm2_f16, tmp_path / "o.gguf", "Q4_0"])
    assert res.exit_code == 2 and msg in res.output
    assert not (tmp_path / "o.gguf").exists()
