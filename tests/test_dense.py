"""The dense families with a quirk each: SmolLM3 (no RoPE on every fourth layer), OLMo 2 (no input norms,
Q/K norms over the whole projection, post-norms; OLMo 3's sliding layers) and Gemma 2 (attention and final
logit soft-capping, alternating sliding layers): config and layer records, every forward path against the
float64 reference, the refusals, and the commands that run a model.

The tiny models come from tests/archmodels.py (``SPECS``); tests/test_arch.py compares them with llama.cpp's
own logits (tests/data/arch, tools/make_arch_golden.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from archmodels import SPECS, write_model
from conftest import compare_to_reference as _compare
from quantkit.errors import ModelError
from quantkit.model.forward import Runner
from quantkit.model.llama import Llama, LlamaConfig
from quantkit.model.reference import reference_logits

ARCHS = ("smollm3", "olmo2", "gemma2")
CASES = [(a, v) for a in ARCHS for v in ("F16", "Q")]
IDS = np.random.default_rng(7).integers(0, 500, 40)


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{v}" for a, v in CASES])
def case(request, tmp_path_factory):
    arch, variant = request.param
    path = write_model(tmp_path_factory.mktemp("dense") / f"{arch}-{variant}.gguf", arch, variant)
    with Llama(path) as m:
        yield arch, variant, m, reference_logits(m, IDS)


def test_config_and_layers(case):
    """Each family's quirks as the layer records say them (llama.cpp's load_arch_hparams / graph)."""
    arch, _, m, _ = case
    c, s = m.config, SPECS[arch]
    attn = [d.attn for d in m.layers]
    norms = [[b.norm for b in d.blocks] for d in m.layers]
    posts = [[b.post_norm for b in d.blocks] for d in m.layers]
    assert c.n_layer == 4 and c.rope_freq_base == s["rope_base"]
    if arch == "smollm3":   # llama_model_smollm3: use_rope = (il + 1) % n_no_rope_layer_step (4) != 0
        assert [a.rope for a in attn] == [True, True, True, False] and not c.arch.rope_neox
        assert norms == [["attn_norm", "ffn_norm"]] * 4 and posts == [[None, None]] * 4
        assert m.output is m.token_embd and c.n_swa == 0 and c.kq_scale == pytest.approx(1 / 8)
    elif arch == "olmo2":   # no input norms; whole-projection Q/K norms; OLMo 3's SWA with the model's base
        assert norms == [[None, None]] * 4 and posts == [["post_attention_norm", "post_ffw_norm"]] * 4
        assert all(a.qk_norm and a.qk_norm_full and a.rope for a in attn)
        assert m.blk[0].attn_q_norm.shape == (256,) and m.blk[0].attn_k_norm.shape == (128,)
        assert [a.n_swa for a in attn] == [8, 8, 8, 0] and [a.rope_table for a in attn] == [1, 1, 1, 0]
        assert c.rope_freq_base_swa == c.rope_freq_base and c.rope_freq_scale_swa == 1.0 and not c.yarn_swa
    else:                   # gemma2: every other layer slides (load_swa_pattern(2)), logits soft-capped
        assert [a.n_swa for a in attn] == [8, 0, 8, 0] and all(a.softcap == 5.0 and not a.qk_norm for a in attn)
        assert posts == [["post_attention_norm", "post_ffw_norm"]] * 4 and c.arch.glu == "gelu"
        assert c.softcap == 30.0 and c.embd_scale == pytest.approx(16.0) and c.rope_freq_base_swa == 10000.0
        assert c.kq_scale == pytest.approx(1 / np.sqrt(128))


def test_batch_matches_reference(case):
    _, variant, m, ref = case
    _compare(Runner(m, 128).forward(IDS, logits="all"), ref, variant)


def test_small_batches_match_reference(case):
    """Pieces of 8 rows: below the BLAS attention (the per-(token, head) kernel) and the GEMM thresholds."""
    _, variant, m, ref = case
    _compare(Runner(m, 128, n_batch=8).forward(IDS, logits="all"), ref, variant)


@pytest.mark.parametrize("compiled", [True, False], ids=["step", "batch-row"])
def test_token_by_token_matches_reference(case, compiled):
    """One token at a time: the compiled decode step, and the batch path on one row."""
    _, variant, m, ref = case
    r = Runner(m, 128, compiled_step=compiled)
    assert (r.step is not None) == compiled
    _compare(np.concatenate([r.forward([t]) for t in IDS]), ref, variant)


# -- refusals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, tensor", [
    ("olmo2", "blk.2.attn_k_norm.weight"), ("olmo2", "blk.0.post_ffw_norm.weight"),
    ("gemma2", "blk.1.post_attention_norm.weight"), ("smollm3", "blk.3.ffn_norm.weight"),
])
def test_missing_tensor(tmp_path, arch, tensor):
    with pytest.raises(ModelError, match=f"tensor {tensor!r} is missing"):
        Llama(write_model(tmp_path / "bad.gguf", arch, drop=tensor))


def test_config_defaults():
    """llama.cpp's defaults where the file says nothing: Gemma 2's window 4096 and attention soft-cap 50,
    OLMo 2 without a window (OLMo 2 itself), and the 27B's 1/sqrt(n_embd / n_head) at 46 layers."""
    meta = {"general.architecture": "gemma2", "gemma2.block_count": 46, "gemma2.embedding_length": 512,
            "gemma2.feed_forward_length": 1024, "gemma2.attention.head_count": 4,
            "gemma2.attention.key_length": 64}
    c = LlamaConfig.from_metadata(meta, 10)
    assert c.n_swa == 4096 and c.swa_layers[:3] == (True, False, True) and c.attn_softcap == 50.0
    assert c.kq_scale == pytest.approx(1 / np.sqrt(128))
    meta["gemma2.block_count"] = 26
    assert LlamaConfig.from_metadata(meta, 10).kq_scale == pytest.approx(1 / 8)
    olmo = {k.replace("gemma2", "olmo2"): v for k, v in meta.items() if "key_length" not in k}
    olmo["general.architecture"] = "olmo2"
    c = LlamaConfig.from_metadata(olmo, 10)
    assert c.n_swa == 0 and not any(c.swa_layers) and c.attn_softcap == 0.0


# -- the commands that run a model -------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_cli_run(tmp_path, arch):
    """``quantkit run`` prints the Runner's greedy tokens."""
    from conftest import greedy_text, run_cli

    path = write_model(tmp_path / "m.gguf", arch, "Q")
    r = run_cli(["run", "-m", path, "-p", "the", "-n", "12", "--temp", "0"], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert greedy_text(path, "the", 12) in r.output


@pytest.mark.parametrize("arch", ARCHS)
def test_cli_imatrix_perplexity_bench(tmp_path, arch):
    """imatrix (every matrix of every layer collected), perplexity and bench finish on each family."""
    import shutil
    from pathlib import Path

    from conftest import run_cli
    from quantkit.formats.imatrix import load_imatrix

    path = write_model(tmp_path / "m.gguf", arch, "F16")
    shutil.copy(Path(__file__).parent / "data" / "imatrix" / "calibration-sample.txt", tmp_path / "t.txt")
    r = run_cli(["imatrix", "-m", path, "-f", "t.txt", "-c", 64, "--chunks", 2, "-o", "im.gguf"], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    names = {f"blk.{i}.{n}.weight" for i in range(4)
             for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    assert set(load_imatrix(tmp_path / "im.gguf").entries) == names
    r = run_cli(["perplexity", "-m", path, "-f", "t.txt", "-c", 64, "--chunks", 2], cwd=tmp_path)
    assert r.exit_code == 0 and "Final estimate: PPL" in r.output, r.output
    r = run_cli(["bench", "-m", path, "-p", 16, "-n", 4, "-r", 1, "-o", "csv"], cwd=tmp_path)
    assert r.exit_code == 0 and r.output.count("\n") >= 3, r.output


def test_cli_sweep(tmp_path):
    """A sweep of the Gemma 2 file (Q8_0, Q4_K_M and --target-bpw 5 with llama-imatrix's matrix): every
    point measured against the source, the target met."""
    import csv
    import io
    from pathlib import Path

    from conftest import run_cli

    path = write_model(tmp_path / "gemma2.gguf", "gemma2", "F16")
    im = Path(__file__).parent / "data" / "imatrix" / "gemma2-F16.c64x4.gguf"
    r = run_cli(["sweep", "-m", path, "--imatrix", im, "--types", "Q8_0,Q4_K_M", "--target-bpw", "5.0", "-c", 64,
                 "--chunks", 2, "--format", "csv", "-o", tmp_path / "sweep"])
    assert r.exit_code == 0, r.output
    rows = {row["label"]: row for row in csv.DictReader(io.StringIO(r.stdout))}
    assert set(rows) == {"Q8_0", "Q4_K_M", "bpw5"} and float(rows["Q8_0"]["bpw"]) > float(rows["Q4_K_M"]["bpw"])
    assert float(rows["bpw5"]["bpw"]) <= 5.0


# -- against llama-imatrix (tools/make_moe_imatrix_golden.py; llama-quantize's bytes: test_moe_quantize.py) --

@pytest.mark.parametrize("arch", ARCHS)
def test_imatrix_matches_llama_imatrix(tmp_path, arch):
    """``quantkit imatrix`` at llama-imatrix's settings on the F16 file: the same entries and counts, the
    sums within 1e-3 on average."""
    import json
    import shutil
    from pathlib import Path

    from conftest import compare_imatrix, run_cli, sha256

    data = Path(__file__).parent / "data" / "imatrix"
    g = json.loads((data / "moe-golden.json").read_text(encoding="utf-8"))
    spec = g["models"][arch]
    path = write_model(tmp_path / f"{arch}-F16.gguf", arch, "F16")
    assert sha256(path) == spec["model_sha256"], "not the file llama.cpp ran"
    shutil.copy(data / "calibration-sample.txt", tmp_path / "calibration-sample.txt")
    r = run_cli(["imatrix", "-m", path.name, "-f", "calibration-sample.txt", "-c", g["n_ctx"], "--chunks",
                 g["n_chunks"], "-o", "ours.gguf", "-t", 1], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    compare_imatrix(tmp_path / "ours.gguf", data / spec["file"])
