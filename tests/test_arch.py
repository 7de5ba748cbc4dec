"""The architectures beside llama (qwen2, qwen3, gemma3; smollm3, olmo2, gemma2; lfm2): config from GGUF metadata, refusals, and the
forward pass (batch, compiled decode step, float64 reference) against llama.cpp's own logits.

The tiny models come from tests/archmodels.py (random weights, gguf.GGUFWriter); tests/data/arch/*.npz
are llama.cpp's logits and greedy tokens on the very same files (tools/make_arch_golden.py, which stores
each file's sha256: checked first). The thresholds are in units of llama.cpp's own noise where it has
any (F16: its batch vs token-by-token logits) and of the logits' spread otherwise (docs/run.md,
"Architectures").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from archmodels import SPECS, VARIANTS, golden_model, write_model
from conftest import greedy_agreement
from quantkit.errors import ModelError
from quantkit.model.forward import Runner
from quantkit.model.llama import Llama, LlamaConfig
from quantkit.model.reference import reference_logits

GOLDEN = Path(__file__).parent / "data" / "arch"
CASES = [(a, v) for a in SPECS for v in VARIANTS]
#: a top-2 gap of llama.cpp's under this is a tie for a quantized tiny model: its logits spread ~6
#: (std), and activations rounded to 8 bits move them ~0.1 on average, up to ~1 (measured:
#: quantkit vs llama.cpp mean |d| 0.08-0.15 on the Q files, 0.004-0.012 on the F16 ones)
TIE_Q = 1.0


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{v}" for a, v in CASES])
def case(request, tmp_path_factory):
    arch, variant = request.param
    g, path = golden_model(tmp_path_factory.mktemp("arch"), arch, variant)
    with Llama(path) as m:
        yield arch, variant, m, g


def test_config_from_metadata(case):
    arch, _, m, _ = case
    c, s = m.config, SPECS[arch]
    assert c.arch.name == arch
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv) == (s["n_layer"], s["n_embd"], s["n_head"], s["n_head_kv"])
    assert c.head_dim == (s["head_dim"] or s["n_embd"] // s["n_head"]) and c.n_rot == c.head_dim
    assert c.arch.rope_neox == (arch != "smollm3") and c.rope_freq_base == s["rope_base"]
    assert c.rms_eps == pytest.approx(s["eps"])
    assert (m.output is m.token_embd) == s["tied"]
    if arch == "lfm2":      # layer 1 is a short convolution (tests/test_lfm2.py)
        return
    assert (m.blk[1].attn_q_bias is not None) == s["bias"]
    assert (m.blk[1].attn_k_norm is not None) == bool(s["qk_norm"])
    assert (m.blk[1].post_ffw_norm is not None) == s["post_norms"]
    if arch == "gemma3":
        # llama_hparams::set_swa_pattern(6): every 6th layer attends to everything
        assert c.n_swa == 8 and c.swa_layers == (True,) * 5 + (False,)
        assert c.rope_freq_base_swa == 10000.0 and c.embd_scale == pytest.approx(16.0) and c.softcap == 30.0
        assert c.arch.glu == "gelu" and c.kq_scale == pytest.approx(1 / np.sqrt(128))
    elif arch in ("qwen2", "qwen3"):
        assert c.n_swa == 0 and not any(c.swa_layers) and c.embd_scale == 1.0 and c.arch.glu == "silu"
    # (smollm3, olmo2, gemma2: tests/test_dense.py; lfm2: tests/test_lfm2.py)


def _mean_bar(variant: str, g: dict) -> float:
    """How far from llama.cpp's logits a file may be on average: F16, 4x llama.cpp's own batch vs
    token-by-token mean difference; quantized (where llama.cpp's two runs agree exactly), 2.5 % of the
    logits' standard deviation."""
    return 4 * float(g["self_mean"]) if variant == "F16" else 0.025 * float(g["logits"].std(1).mean())


def test_prefill_matches_llama_cpp(case):
    arch, variant, m, g = case
    ref = g["logits"]
    got = Runner(m, 128).forward(g["ids"], logits="all")
    d = np.abs(got - ref)
    gap = np.diff(np.sort(ref, 1)[:, -2:], axis=1)[:, 0]
    clear = gap >= (0 if variant == "F16" else TIE_Q)
    print(f"{arch} {variant}: mean |d| {d.mean():.4f} max {d.max():.3f} (llama.cpp with itself: "
          f"{float(g['self_mean']):.4f} / {float(g['self_max']):.3f}); top-1 {(got.argmax(1) == ref.argmax(1)).mean():.3f}")
    assert d.mean() <= _mean_bar(variant, g)
    assert (got.argmax(1)[clear] == ref.argmax(1)[clear]).all()


def test_decode_matches_llama_cpp(case):
    """Token by token (the compiled decode step), the whole sequence; then greedy generation: F16 equal
    to llama.cpp's all the way, a quantized file may part only at a llama.cpp tie."""
    arch, variant, m, g = case
    r = Runner(m, 128)
    assert r.step is not None
    got = np.concatenate([r.forward([t]) for t in g["ids"]])
    assert np.abs(got - g["logits"]).mean() <= _mean_bar(variant, g)
    r.reset()
    want = g["greedy"].tolist()
    n = greedy_agreement(r, g["ids"][:8], want)
    print(f"{arch} {variant}: {n} of {len(want)} greedy tokens as llama.cpp's")
    if n < len(want):
        assert variant != "F16" and g["greedy_gap"][n] < TIE_Q, (n, g["greedy_gap"][n])


@pytest.mark.parametrize("arch", list(SPECS))
def test_reference_matches_llama_cpp(arch, tmp_path):
    """The float64 reference (no rounding of activations) on the F16 files: llama.cpp's logits within
    4x its own noise -- the reference is then a fair judge of the fast path on every file."""
    g = dict(np.load(GOLDEN / f"{arch}-F16.npz"))
    with Llama(write_model(tmp_path / "m.gguf", arch)) as m:
        ref = reference_logits(m, g["ids"])
    assert np.abs(ref - g["logits"]).mean() <= _mean_bar("F16", g)
    assert (ref.argmax(1) == g["logits"].argmax(1)).all()


def test_batch_paths_agree(case):
    """The batch path above the BLAS threshold (48 rows in one go) and below it (pieces of 8, integer
    products on 8-bit activations for the quantized files): as close as either is to llama.cpp."""
    _, variant, m, g = case
    a = Runner(m, 128).forward(g["ids"], logits="all")
    b = Runner(m, 128, n_batch=8).forward(g["ids"], logits="all")
    assert np.abs(a - b).mean() <= _mean_bar(variant, g)
    gap = np.diff(np.sort(a, 1)[:, -2:], axis=1)[:, 0]
    clear = gap >= (0.1 if variant == "F16" else TIE_Q)
    assert (a.argmax(1)[clear] == b.argmax(1)[clear]).all()


# -- refusals: one line naming what is wrong, before any compute ----------------------------------------

def _meta(arch: str, **kw):
    base = {"general.architecture": arch, f"{arch}.block_count": 1, f"{arch}.embedding_length": 64,
            f"{arch}.feed_forward_length": 128, f"{arch}.attention.head_count": 4}
    base.update({f"{arch}.{k}": v for k, v in kw.items()})
    return base


def test_config_refusals():
    with pytest.raises(ModelError, match="architecture 'phi3' is not supported"):
        LlamaConfig.from_metadata(_meta("phi3"), 10)
    with pytest.raises(ModelError, match="'qwen3.attention.head_count' is missing"):
        meta = _meta("qwen3")
        del meta["qwen3.attention.head_count"]
        LlamaConfig.from_metadata(meta, 10)
    with pytest.raises(ModelError, match="key length 32 and value length 16 differ"):
        LlamaConfig.from_metadata(_meta("gemma3", **{"attention.key_length": 32, "attention.value_length": 16}), 10)
    c = LlamaConfig.from_metadata(_meta("gemma3", **{"attention.key_length": 32}), 10)
    assert c.n_embd_q == 128 and c.n_swa == 0 and c.swa_layers == ()   # no sliding_window key: no SWA


@pytest.mark.parametrize("arch, tensor", [
    ("qwen3", "blk.1.attn_k_norm.weight"), ("gemma3", "blk.0.post_ffw_norm.weight"),
    ("gemma3", "blk.3.post_attention_norm.weight"), ("qwen2", "output_norm.weight"),
])
def test_missing_tensor(tmp_path, arch, tensor):
    with pytest.raises(ModelError, match=f"tensor {tensor!r} is missing"):
        Llama(write_model(tmp_path / "bad.gguf", arch, drop=tensor))


@pytest.mark.parametrize("cmd", [["run", "-p", "hi"], ["perplexity"], ["imatrix", "-o", "out.gguf"], ["bench"]])
def test_cli_refuses_before_compute(tmp_path, cmd):
    """Every command that runs a model names the missing tensor on one line and exits 1."""
    from conftest import run_cli

    bad = write_model(tmp_path / "bad.gguf", "qwen3", drop="blk.1.attn_k_norm.weight")
    r = run_cli(cmd + ["-m", bad], cwd=tmp_path)
    assert r.exit_code == 1
    errors = [ln for ln in r.output.splitlines() if ln.startswith("Error:") or "Traceback" in ln]
    assert errors == [f"Error: {bad}: tensor 'blk.1.attn_k_norm.weight' is missing"]
    assert not (tmp_path / "out.gguf").exists()
