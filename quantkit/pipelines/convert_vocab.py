"""A Hugging Face tokenizer as GGUF keys, as llama.cpp's converter writes them (conversion/base.py).

Two kinds of tokenizer, as the reference picks them (``sentencepiece_first`` for the architectures whose
``set_vocab`` tries ``_set_vocab_sentencepiece`` before ``_set_vocab_gpt2``):

* a SentencePiece ``tokenizer.model`` (``add_vocab_sentencepiece``: Gemma, Llama 2, Mistral): model
  "llama", pre "default", every piece with its score and type (``_create_vocab_sentencepiece``, through
  the ``sentencepiece`` package), the special tokens of config.json / tokenizer_config.json;
* the GPT-2 style BPE tokenizer of a ``tokenizer.json`` (``add_vocab``: Llama 3, Qwen2, Qwen3 and the
  like). What is written, in order:

* ``tokenizer.ggml.model`` "gpt2", ``tokenizer.ggml.pre`` (``pre_tokenizer``: how the tokenizer splits
  ``bpe_pre.CHKTXT``, looked up by hash, as ``get_vocab_base_pre``), ``tokens`` and ``token_type``
  (``vocab_tokens``: ``get_vocab_base``, ids up to the config's ``vocab_size`` with ``[PADn]`` for the
  unused ones);
* the merges, special token ids, add-BOS/EOS flags and chat template: gguf-py's ``SpecialVocab`` (the
  ``gguf`` package's own reader of tokenizer.json / tokenizer_config.json / config.json), with the two
  rules the reference's newer copy adds (``_special_vocab``).

Encoding the check text and normalizing added tokens needs a real tokenizer: the ``tokenizers``
package (Rust wheels, no torch), the library transformers' fast tokenizers are built on; a
SentencePiece model is read by the ``sentencepiece`` package. Both are the ``convert`` extra:
``pip install 'quantkit[convert]'``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf

from quantkit.errors import FormatError
from quantkit.formats import bpe_pre
from quantkit.formats.safetensors import read_json

# gguf.TokenType (SentencePiece's piece types, the same numbers)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def _tokenizer_class(folder: Path):
    """``tokenizers.Tokenizer``, when ``folder`` has a tokenizer.json and the package is installed;
    else one line."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FormatError(f"{path}: missing (the converter reads the tokenizer from tokenizer.json)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise FormatError("convert needs the tokenizers package: pip install 'quantkit[convert]'") from None
    return Tokenizer


def load_tokenizer(folder: Path):
    """``tokenizers.Tokenizer`` of ``folder/tokenizer.json``; one line when it cannot be had."""
    Tokenizer = _tokenizer_class(folder)
    path = folder / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the library's own exception type for a bad file
        raise FormatError(f"{path}: cannot load the tokenizer ({e})") from None
    model = getattr(tok.model, "__class__", type(None)).__name__
    if model != "BPE" or getattr(tok.model, "byte_fallback", False):
        raise FormatError(f"{path}: a {model} tokenizer{' with byte fallback' if model == 'BPE' else ''} is "
                          f"not converted yet (only GPT-2 style byte-level BPE)")
    return tok


# -- SentencePiece ---------------------------------------------------------------------------------------

def sentencepiece_vocab(folder: Path, vocab_size: int | None) -> tuple[list[str], list[float], list[int]]:
    """``_create_vocab_sentencepiece``: tokens, scores and types of ``folder/tokenizer.model``, padded to
    the config's ``vocab_size``, with added_tokens.json and tokenizer_config.json's added tokens over them."""
    import json

    path = folder / "tokenizer.model"
    try:
        from sentencepiece import SentencePieceProcessor
    except ImportError:
        raise FormatError("convert needs the sentencepiece package for tokenizer.model: "
                          "pip install 'quantkit[convert]'") from None
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(path))
    except (OSError, RuntimeError) as e:
        raise FormatError(f"{path}: cannot load the SentencePiece model ({e})") from None
    n = vocab_size or sp.vocab_size()
    tokens, scores, types = [f"[PAD{i}]" for i in range(n)], [-10000.0] * n, [UNUSED] * n
    for i in range(min(n, sp.vocab_size())):
        kind = NORMAL
        if sp.IsUnknown(i):
            kind = UNKNOWN
        elif sp.IsControl(i):
            kind = CONTROL
        elif sp.IsUnused(i):
            kind = UNUSED
        elif sp.IsByte(i):
            kind = BYTE
        tokens[i], scores[i], types[i] = sp.IdToPiece(i), sp.GetScore(i), kind
    added = folder / "added_tokens.json"
    if added.is_file():
        for text, i in json.loads(added.read_text(encoding="utf-8")).items():
            if i < n:
                tokens[i], scores[i], types[i] = text, -1000.0, USER_DEFINED
    cfg = folder / "tokenizer_config.json"
    decoder = json.loads(cfg.read_text(encoding="utf-8")).get("added_tokens_decoder", {}) if cfg.is_file() else {}
    for i, d in decoder.items():
        i, text = int(i), d["content"]
        if i >= n:
            continue
        if d.get("special") or _looks_special(text):
            types[i] = CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[i] = USER_DEFINED
        scores[i], tokens[i] = -1000.0, text
    return tokens, scores, types


def add_vocab_sentencepiece(w: gguf.GGUFWriter, folder: Path, vocab_size: int | None) -> int:
    """``_set_vocab_sentencepiece``: the tokenizer keys of a tokenizer.model; returns the token count."""
    tokens, scores, types = sentencepiece_vocab(folder, vocab_size)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    return len(tokens)


# -- BPE --------------------------------------------------------------------------------------------------

def pre_tokenizer(tok, path: Path) -> str:
    """``tokenizer.ggml.pre``: ``get_vocab_base_pre``'s hash of how ``tok`` encodes the check text."""
    ids = tok.encode(bpe_pre.CHKTXT).ids
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    try:
        return bpe_pre.PRE_BY_HASH[digest]
    except KeyError:
        raise FormatError(f"{path}: unknown BPE pre-tokenizer (check-text hash {digest[:16]}...): llama.cpp's "
                          f"converter refuses it too (convert_hf_to_gguf_update.py must learn it)") from None


def _looks_special(text: str) -> bool:
    """``does_token_look_special``: added tokens some models forget to mark special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def vocab_tokens(tok, vocab_size: int | None, path: Path) -> tuple[list[str], list[int]]:
    """``get_vocab_base``: the token texts and types for ids 0..vocab_size-1."""
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()              # id -> AddedToken
    added_text = {a.content for a in added.values()}
    n = vocab_size if vocab_size is not None else len(vocab)
    if vocab and max(vocab.values()) >= n:
        raise FormatError(f"{path}: token id {max(vocab.values())} is not below the config's vocab_size {n}")
    reverse = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        text = reverse[i]
        if text in added_text:
            if not added[i].normalized:      # llama.cpp wants added tokens pre-normalized
                text = tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
            if added[i].special or _looks_special(text):
                types.append(CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(text)
    return tokens, types


def _special_vocab(folder: Path, tokenizer_json: dict | None) -> gguf.SpecialVocab:
    """gguf-py's SpecialVocab, plus what llama.cpp 0c1e570's copy does that gguf 0.19.0 on PyPI does not:
    a ByteLevel post-processor means no BOS/EOS added (both flags False unless set), and the
    normalizer's lowercase / strip-accents flags."""
    sv = gguf.SpecialVocab(folder, load_merges=True)
    if tokenizer_json:
        post = tokenizer_json.get("post_processor") or {}
        if any(p.get("type") == "ByteLevel" for p in post.get("processors", [post])):
            flags = {"bos": sv.add_special_token.get("bos", False), "eos": sv.add_special_token.get("eos", False)}
            sv.add_special_token = {**flags, **sv.add_special_token}
    return sv


def _normalizer_flags(norm: dict | None, out: dict) -> dict:
    """``SpecialVocab._parse_normalizer`` (llama.cpp 0c1e570): lowercase / strip_accents."""
    if not norm:
        return out
    kind = norm.get("type")
    if kind == "Lowercase":
        out["lowercase"] = True
    elif kind == "StripAccents":
        out["strip_accents"] = True
    elif kind == "BertNormalizer":
        for k in ("lowercase", "strip_accents"):
            if k in norm:
                out[k] = norm[k]
    elif kind == "Sequence":
        for n in norm.get("normalizers", []):
            _normalizer_flags(n, out)
    return out


#: the weights and indexes of a checkpoint folder: what the tokenizer keys never depend on
_NOT_TOKENIZER = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".safetensors.index.json")
#: the tokenizer keys of the last folders converted (``add_vocab``), by what they were made from
_VOCAB_KV: dict = {}
_VOCAB_KEEP = 2


def _tokenizer_digest(folder: Path) -> str:
    """sha256 over the name and bytes of every file under ``folder`` but the weights: what ``add_vocab``
    and gguf-py's SpecialVocab may read (tokenizer.json, tokenizer_config.json, config.json,
    special_tokens_map.json, chat templates, merges.txt, ...)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(_NOT_TOKENIZER)):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def add_vocab(w: gguf.GGUFWriter, folder: Path, vocab_size: int | None,
              special_tokens: tuple[tuple[str, str], ...] = ()) -> None:
    """``_set_vocab_gpt2``: every tokenizer key, in the reference's order, onto the writer ``w``;
    ``special_tokens``: (type, added token) set where the tokenizer files set none (``_set_vocab_glm``:
    SpecialVocab keeps a type it already has). The keys of a folder whose tokenizer files were converted
    last are added again from memory (``_VOCAB_KV``, keyed by those files' digest): reading a
    151,936-token tokenizer three times over (the tokenizers package, gguf-py, the merges) took ~3 s of
    a ~4 s conversion of a tiny checkpoint, and a test suite converts dozens."""
    _tokenizer_class(folder)             # the same refusals with or without the keys in memory
    key = (_tokenizer_digest(folder), vocab_size, special_tokens)
    if key not in _VOCAB_KV:
        kv = gguf.GGUFWriter(None, w.arch)
        first = set(kv.kv_data[0])
        _add_vocab(kv, folder, vocab_size, special_tokens)
        while len(_VOCAB_KV) >= _VOCAB_KEEP:
            del _VOCAB_KV[next(iter(_VOCAB_KV))]
        _VOCAB_KV[key] = [(k, v) for k, v in kv.kv_data[0].items() if k not in first]
    for k, v in _VOCAB_KV[key]:
        w.add_key_value(k, v.value, v.type, v.sub_type)


def _add_vocab(w: gguf.GGUFWriter, folder: Path, vocab_size: int | None,
               special_tokens: tuple[tuple[str, str], ...]) -> None:
    path = folder / "tokenizer.json"
    tok = load_tokenizer(folder)
    tokenizer_json = read_json(path, "tokenizer.json")
    tokens, types = vocab_tokens(tok, vocab_size, path)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_tokenizer(tok, path))
    w.add_token_list(tokens)
    w.add_token_types(types)
    sv = _special_vocab(folder, tokenizer_json)
    for typ, text in special_tokens:
        tid = tok.token_to_id(text)
        if tid is None:
            raise FormatError(f"{path}: the added token {text!r} ({typ}) is missing")
        sv._set_special_token(typ, tid)
    sv.add_to_gguf(w, quiet=True)
    flags = _normalizer_flags((tokenizer_json or {}).get("normalizer"), {})
    if "lowercase" in flags:
        w.add_key_value("tokenizer.ggml.normalizer.lowercase", flags["lowercase"], gguf.GGUFValueType.BOOL)
    if "strip_accents" in flags:
        w.add_key_value("tokenizer.ggml.normalizer.strip_accents", flags["strip_accents"], gguf.GGUFValueType.BOOL)
