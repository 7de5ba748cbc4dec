"""LFM2, the hybrid of gated short convolutions and attention: the layer records read from the file, the
recurrent state (quantkit.model.layer's "Recurrent ops") carried across batch boundaries, across calls and
through the compiled decode step token by token -- each against the float64 reference, which runs the
whole sequence with no state kept between calls --, where the state is reset, and the refusals.

The tiny model is tests/archmodels.py's ``lfm2`` (layers 0, 1 and 3 convolutions, layer 2 attention);
tests/test_arch.py compares it with llama.cpp's own logits (tests/data/arch, tools/make_arch_golden.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from archmodels import SPECS, write_model
from conftest import compare_to_reference
from quantkit.errors import ModelError
from quantkit.model.forward import Runner
from quantkit.model.layer import Attn, ShortConv
from quantkit.model.llama import Llama, LlamaConfig
from quantkit.model.reference import reference_logits

IDS = np.random.default_rng(11).integers(0, 500, 40)


@pytest.fixture(scope="module", params=["F16", "Q"])
def case(request, tmp_path_factory):
    variant = request.param
    path = write_model(tmp_path_factory.mktemp("lfm2") / f"lfm2-{variant}.gguf", "lfm2", variant)
    with Llama(path) as m:
        yield variant, m, reference_logits(m, IDS)


def test_config_and_layers(case):
    """head_count_kv 0 marks the convolution layers (llama_model_lfm2::load_arch_hparams' is_recr)."""
    _, m, _ = case
    c, s = m.config, SPECS["lfm2"]
    assert c.recurrent_layers == (True, True, False, True) and c.n_head_kv == 2 and c.l_cache == 3
    assert [type(d.blocks[0].op) for d in m.layers] == [ShortConv, ShortConv, Attn, ShortConv]
    assert m.layers[0].blocks[0].op == ShortConv(n_embd=256, l_cache=3) and m.layers[0].state_size == 512
    assert m.layers[2].state_size == 0 and m.layers[2].attn.qk_norm and m.layers[2].attn.rope_neox
    assert [[b.norm for b in d.blocks] for d in m.layers] == [["attn_norm", "ffn_norm"]] * 4
    assert m.blk[0].shortconv_conv.shape == (256, 3) and m.blk[0].attn_q is None and m.blk[2].shortconv_in_proj is None
    assert m.output is m.token_embd and c.rms_eps == pytest.approx(s["eps"])
    assert np.array_equal(m.output_norm, m.gguf.tensor("token_embd_norm.weight").data.view(np.float32).reshape(-1))
    r = Runner(m, 64, compiled_step=False)
    assert r.state.shape == (4, 512) and r.recurrent


def test_batch_matches_reference(case):
    variant, m, ref = case
    compare_to_reference(Runner(m, 128).forward(IDS, logits="all"), ref, variant)


@pytest.mark.parametrize("n_batch", [8, 13])
def test_state_across_batches(case, n_batch):
    """A prompt longer than the batch: each batch of rows continues the convolution from the state the
    previous one left (8: the attention's per-(token, head) kernel; 13: a window split 1 + 2 at a boundary)."""
    variant, m, ref = case
    compare_to_reference(Runner(m, 128, n_batch=n_batch).forward(IDS, logits="all"), ref, variant)


def test_state_across_calls(case):
    """The prompt in two calls, the second one a batch continuing from the first's state."""
    variant, m, ref = case
    r = Runner(m, 128)
    a = r.forward(IDS[:17], logits="all")
    b = r.forward(IDS[17:], logits="all")
    compare_to_reference(np.concatenate([a, b]), ref, variant)


@pytest.mark.parametrize("compiled", [True, False], ids=["step", "batch-row"])
def test_token_by_token_matches_reference(case, compiled):
    """One token at a time: the compiled decode step (its state row is the Runner's) and the batch path
    on one row; then a prefill followed by steps."""
    variant, m, ref = case
    r = Runner(m, 128, compiled_step=compiled)
    assert (r.step is not None) == compiled
    compare_to_reference(np.concatenate([r.forward([t]) for t in IDS]), ref, variant)
    r.reset()
    a = r.forward(IDS[:20], logits="all")
    compare_to_reference(np.concatenate([a] + [r.forward([t]) for t in IDS[20:]]), ref, variant)


def test_state_reset(case):
    """A sequence starts from zeros where llama.cpp clears its memory: ``reset`` (each perplexity chunk,
    each prompt) and any pass at position 0; going back to a later position is refused (a state is that
    of the last position; llama_memory_recurrent::seq_rm refuses too); a saved prefix carries it."""
    _, m, _ = case
    r = Runner(m, 128, compiled_step=False)
    first = r.forward(IDS[:12], logits="all")
    r.forward(IDS[12:20])
    assert np.abs(r.state).max() > 0
    np.testing.assert_array_equal(r.forward(IDS[:12], 0, logits="all"), first)    # pos 0: from zeros
    r.forward(IDS[12:16])
    with pytest.raises(ModelError, match="cannot go back to position 8"):
        r.forward(IDS[8:12], 8)
    with pytest.raises(ModelError, match="recurrent state is that of position 16"):
        r.save_prefix(10)
    saved = r.save_prefix(16)
    want = r.forward(IDS[16:20], logits="all")
    r.reset()
    assert r.n_past == 0 and not r.state.any()
    r.forward(IDS[20:30])
    r.restore_prefix(*saved)
    np.testing.assert_array_equal(r.forward(IDS[16:20], logits="all"), want)
    with pytest.raises(ModelError, match="recurrent state is missing"):
        r.restore_prefix(*saved[:2])


# -- refusals ---------------------------------------------------------------------------------------

def _meta(**kw):
    base = {"general.architecture": "lfm2", "lfm2.block_count": 3, "lfm2.embedding_length": 64,
            "lfm2.feed_forward_length": 128, "lfm2.attention.head_count": 4,
            "lfm2.attention.head_count_kv": [0, 2, 0], "lfm2.shortconv.l_cache": 3}
    base.update({f"lfm2.{k}": v for k, v in kw.items()})
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("kw, msg", [
    ({"shortconv.l_cache": None}, "'lfm2.shortconv.l_cache' is missing"),
    ({"shortconv.l_cache": 1}, "l_cache 1 must be at least 2"),
    ({"attention.head_count_kv": [0, 2, 4]}, r"different KV head counts \[2, 4\]"),
    ({"attention.head_count_kv": [0, 2]}, "has 2 entries for 3 layers"),
    ({"attention.sliding_window": 8}, "sliding-window attention layers is not supported"),
])
def test_config_refusals(kw, msg):
    with pytest.raises(ModelError, match=msg):
        LlamaConfig.from_metadata(_meta(**kw), 10)
    assert LlamaConfig.from_metadata(_meta(), 10).recurrent_layers == (True, False, True)


@pytest.mark.parametrize("tensor", ["blk.0.shortconv.conv.weight", "blk.3.shortconv.out_proj.weight",
                                    "blk.2.attn_q_norm.weight", "token_embd_norm.weight"])
def test_missing_tensor(tmp_path, tensor):
    with pytest.raises(ModelError, match=f"tensor {tensor!r} is missing"):
        Llama(write_model(tmp_path / "bad.gguf", "lfm2", drop=tensor))


# -- the commands, and llama.cpp's imatrix (tools/make_moe_imatrix_golden.py; llama-quantize's bytes:
# test_moe_quantize.py's arch jobs) ----------------------------------------------------------------------

def test_imatrix_matches_llama_imatrix(tmp_path):
    """``quantkit imatrix`` at llama-imatrix's settings on the F16 file (each 64-token chunk from a zero
    state): the same entries -- the convolution layers' in_proj and out_proj, not the taps, which
    ggml_ssm_conv reads -- and counts, the sums within 1e-3 on average."""
    import json
    import shutil
    from pathlib import Path

    from conftest import compare_imatrix, run_cli, sha256
    from quantkit.formats.imatrix import load_imatrix

    data = Path(__file__).parent / "data" / "imatrix"
    g = json.loads((data / "moe-golden.json").read_text(encoding="utf-8"))
    spec = g["models"]["lfm2"]
    path = write_model(tmp_path / "lfm2-F16.gguf", "lfm2", "F16")
    assert sha256(path) == spec["model_sha256"], "not the file llama.cpp ran"
    shutil.copy(data / "calibration-sample.txt", tmp_path / "calibration-sample.txt")
    r = run_cli(["imatrix", "-m", path.name, "-f", "calibration-sample.txt", "-c", g["n_ctx"], "--chunks",
                 g["n_chunks"], "-o", "ours.gguf", "-t", 1], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    names = set(load_imatrix(tmp_path / "ours.gguf").entries)
    assert {"blk.0.shortconv.in_proj.weight", "blk.3.shortconv.out_proj.weight", "blk.2.attn_q.weight"} <= names
    assert not any("shortconv.conv" in n for n in names)
    compare_imatrix(tmp_path / "ours.gguf", data / spec["file"])


@pytest.mark.parametrize("arch", ["lfm2", "qwen3next"])
def test_cli_run_perplexity_bench(tmp_path, arch):
    """``quantkit run`` prints the Runner's greedy tokens; perplexity and bench (with a depth prefix: the
    recurrent state saved and restored beside the KV cache) finish -- for both recurrent ops (qwen3next's
    DeltaNet: tests/test_qwen3next.py)."""
    import shutil
    from pathlib import Path

    from conftest import greedy_text, run_cli

    path = write_model(tmp_path / "m.gguf", arch, "Q")
    r = run_cli(["run", "-m", path, "-p", "the", "-n", "12", "--temp", "0"], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert greedy_text(path, "the", 12) in r.output
    shutil.copy(Path(__file__).parent / "data" / "imatrix" / "calibration-sample.txt", tmp_path / "t.txt")
    r = run_cli(["perplexity", "-m", path, "-f", "t.txt", "-c", 64, "--chunks", 2], cwd=tmp_path)
    assert r.exit_code == 0 and "Final estimate: PPL" in r.output, r.output
    r = run_cli(["bench", "-m", path, "-p", 16, "-n", 4, "-d", 8, "-r", 2, "-o", "csv"], cwd=tmp_path)
    assert r.exit_code == 0 and r.output.count("\n") >= 3, r.output
