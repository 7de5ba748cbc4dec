"""llama.cpp's pre-tokenizers: how a text is cut into words before BPE (``src/unicode.cpp``
``unicode_regex_split`` and the ``tokenizer_pre`` switch of ``src/llama-vocab.cpp``).

How the pre-tokenizer regexes are run: llama.cpp replaces every codepoint >= 128 by one byte standing
for its Unicode category (letter, number, punctuation, mark, symbol, whitespace, other) and runs
``std::regex`` on that "collapsed" text, with ``\\p{..}`` in the pattern rewritten to the same bytes
(``unicode_regex_split``). Its hand-written splitters for the GPT-2 and Llama-3 patterns behave like
those patterns. This module does the same collapse and runs Python's ``re`` on it, so the split is the
same as llama.cpp's wherever Python's ``unicodedata`` (Unicode 14 in CPython 3.11) and llama.cpp's
table (a newer Unicode) agree on a character's category; they differ only for characters assigned
after Unicode 14.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Sequence

from quantkit.errors import ModelError

# --------------------------------------------------------------------------------------------------
# pre-tokenizers (llm_tokenizer_bpe constructor and the tokenizer_pre switch in load)
# --------------------------------------------------------------------------------------------------

_CONTRACTIONS_CS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
RE_LLAMA3 = (_CONTRACTIONS_CS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN2 = (_CONTRACTIONS_CS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN35 = (_CONTRACTIONS_CS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_JAIS2 = (_CONTRACTIONS_CS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
            r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
RE_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
             r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
             r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS_CS + "?"
            r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS_CS + "?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_DEEPSEEK3 = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
RE_BAILINGMOE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
RE_SEED_CODER = (_CONTRACTIONS_CS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
RE_EXAONE_MOE = (_CONTRACTIONS_CS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
RE_MINICPM5 = (_CONTRACTIONS_CS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

_DEEPSEEK_LLM_LETTERS = (  # letters of many scripts, as in llama.cpp (escaped: NFC would alter some)
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-"
    "\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-"
    "\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-"
    "\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-"
    "\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
    "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)

_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", RE_GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (RE_LLAMA3,),
    "jais2": (RE_JAIS2,),
    "deepseek_llm": ("[\r\n]", _DEEPSEEK_LLM_LETTERS,
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+$",
                     "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}+"),
    "deepseek3_llm": (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", RE_DEEPSEEK3),
    "deepseek_coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", RE_GPT2, "[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", RE_GPT2),
    "gpt2": (RE_GPT2,),
    "qwen2": (RE_QWEN2,),
    "qwen35": (RE_QWEN35,),
    "poro": (RE_BLOOM,),
    "chatglm4": (RE_LLAMA3,),
    "viking": (RE_BLOOM, r"\p{N}"),
    "tekken": (RE_TEKKEN,),
    "chameleon": ("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
                  r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", RE_GPT2),
    "gpt4o": (RE_GPT4O,),
    "bailingmoe": (RE_BAILINGMOE,),
    "seed_coder": (RE_SEED_CODER,),
    "ufakzeka": (RE_UFAKZEKA,),
    "exaone_moe": (RE_EXAONE_MOE,),
    "minicpm5": (r"\p{N}{1,3}", RE_MINICPM5),
    "laguna": ("[^\\n]+|[\\n]+", RE_QWEN2),
}


@dataclass(frozen=True)
class _PreRule:
    kind: str  # key of _PRE_REGEXES
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False  # special_bos_id = LLAMA_TOKEN_NULL (chatglm)


def _rules() -> dict[str, _PreRule]:
    r: dict[str, _PreRule] = {}

    def add(names: Iterable[str], rule: _PreRule) -> None:
        for n in names:
            r[n] = rule

    add(["default"], _PreRule("default"))
    add(["minicpm5"], _PreRule("minicpm5", ignore_merges=True))
    add(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
         "jina-v5-nano"], _PreRule("llama3", ignore_merges=True, add_bos=True))
    add(["deepseek-llm"], _PreRule("deepseek_llm", clean_spaces=False))
    add(["deepseek-coder"], _PreRule("deepseek_coder", clean_spaces=False))
    add(["deepseek-v3"], _PreRule("deepseek3_llm", clean_spaces=False))
    add(["hunyuan-dense", "joyai-llm", "hy_v4"], _PreRule("deepseek3_llm", clean_spaces=False))
    add(["falcon"], _PreRule("falcon"))
    add(["mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
         "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "olmo", "jais", "exaone4"],
        _PreRule("gpt2"))
    add(["trillion", "granite-docling"], _PreRule("gpt2", clean_spaces=False))
    add(["jais-2"], _PreRule("jais2"))
    add(["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], _PreRule("starcoder"))
    add(["command-r", "smollm"], _PreRule("starcoder", clean_spaces=False))
    add(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"],
        _PreRule("qwen2", clean_spaces=False))
    add(["megrez", "stablelm2"], _PreRule("qwen2"))
    add(["qwen35"], _PreRule("qwen35", clean_spaces=False))
    add(["dbrx", "smaug-bpe"], _PreRule("llama3"))
    add(["poro-chat"], _PreRule("poro", clean_spaces=False))
    add(["bloom", "gpt3-finnish"], _PreRule("poro"))
    add(["glm4", "chatglm-bpe"], _PreRule("chatglm4", no_bos=True))
    add(["viking"], _PreRule("viking", clean_spaces=False))
    add(["tekken"], _PreRule("tekken", clean_spaces=False, ignore_merges=True, add_bos=True))
    add(["chameleon"], _PreRule("chameleon", clean_spaces=False, add_bos=True))
    add(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _PreRule("gpt4o", clean_spaces=False))
    add(["bailingmoe", "bailingmoe2", "llada-moe"], _PreRule("bailingmoe", clean_spaces=False))
    add(["seed-coder"], _PreRule("seed_coder", clean_spaces=False))
    add(["ufakzeka"], _PreRule("ufakzeka", clean_spaces=False))
    add(["grok-2"], _PreRule("qwen2", clean_spaces=False))
    add(["laguna"], _PreRule("laguna", clean_spaces=False))
    add(["exaone-moe"], _PreRule("exaone_moe"))
    return r


PRE_TOKENIZERS: dict[str, _PreRule] = _rules()

# --------------------------------------------------------------------------------------------------
# Unicode: categories, whitespace, the collapsed text, GPT-2 byte encoding (unicode.cpp)
# --------------------------------------------------------------------------------------------------

# llama.cpp's whitespace set (Unicode White_Space), not Python's str.isspace (which adds \x1c-\x1f).
WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                        0x2028, 0x2029, 0x202F, 0x205F, 0x3000])

_C_NUMBER, _C_LETTER, _C_PUNCT, _C_MARK, _C_SYMBOL, _C_OTHER = "\xd1", "\xd2", "\xd3", "\xd4", "\xd5", "\xd0"
_CATEGORY_CHAR = {"N": _C_NUMBER, "L": _C_LETTER, "P": _C_PUNCT, "M": _C_MARK, "S": _C_SYMBOL}


class _CollapseTable(dict):
    """``str.translate`` table: codepoint -> llama.cpp's one-byte category stand-in (filled lazily)."""

    def __missing__(self, cp: int) -> str:
        if cp < 128:
            v = chr(cp)
        elif cp in WHITESPACE:
            v = "\x0b"
        else:
            v = _CATEGORY_CHAR.get(unicodedata.category(chr(cp))[0], _C_OTHER)
        self[cp] = v
        return v


class _WideTable(dict):
    """``str.translate`` table for the ``std::wregex`` path: non-ASCII whitespace -> ``\\x0b``."""

    def __missing__(self, cp: int) -> int:
        v = 0x0B if cp > 0x7F and cp in WHITESPACE else cp
        self[cp] = v
        return v


_COLLAPSE = _CollapseTable()
_WIDE = _WideTable()

# The ASCII members llama.cpp adds next to each category byte (k_ucat_map), already regex-escaped.
_UCAT_CLASS = {
    "N": _C_NUMBER + "0-9",
    "L": _C_LETTER + "A-Za-z",
    "P": _C_PUNCT + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": _C_MARK,
    "S": _C_SYMBOL + r"\$\+<->\^`\|",
}
_UCAT_NAMES = {"N": "N", "L": "L", "P": "P", "M": "M", "S": "S", "Lu": "L", "Ll": "L", "Lt": "L",
               "Lm": "L", "Lo": "L"}


def _collapse_regex(expr: str) -> str:
    """Rewrite ``\\p{..}`` the way unicode_regex_split does before handing the pattern to std::regex."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if expr.startswith("\\p{", i):
            close = expr.find("}", i + 3)
            name = expr[i + 3 : close] if close >= 0 else ""
            if name in _UCAT_NAMES:
                cls = _UCAT_CLASS[_UCAT_NAMES[name]]
                out.append(cls if inside else "[" + cls + "]")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _uses_categories(expr: str) -> bool:
    return any("\\p{" + n + "}" in expr for n in _UCAT_NAMES)


#: one token of an ECMAScript pattern: an escape, a whole character class (to its first unescaped ``]``,
#: or to the end), or a ``$``
_ECMA_TOKEN = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]?|\$", re.DOTALL)


def _ecmascript_to_python(expr: str) -> str:
    """The few ECMAScript-vs-Python differences that matter here: ``$`` is end of input only."""
    return _ECMA_TOKEN.sub(lambda m: r"\Z" if m.group() == "$" else m.group(), expr)


@dataclass(frozen=True)
class SplitRegex:
    pattern: re.Pattern[str]
    collapsed: bool  # run on the collapsed text (True) or on the wide text (False)


def _compile_split_regex(expr: str) -> SplitRegex:
    if expr == RE_GPT2:
        # llama.cpp's hand-written splitter for this pattern also takes a lone whitespace (\s+).
        expr = expr + r"|\s+"
    if _uses_categories(expr):
        if any(ord(ch) >= 128 for ch in expr):
            raise ModelError("pre-tokenizer regex mixes Unicode categories and non-ASCII characters")
        return SplitRegex(re.compile(_ecmascript_to_python(_collapse_regex(expr)), re.ASCII), True)
    return SplitRegex(re.compile(_ecmascript_to_python(expr), re.ASCII), False)


def split_words(text: str, regexes: Sequence[SplitRegex]) -> list[str]:
    """unicode_regex_split without the byte encoding: each regex refines the previous chunks; the text
    between matches is kept as chunks of its own."""
    collapsed = wide = None
    spans = [(0, len(text))] if text else []
    for rx in regexes:
        if rx.collapsed:
            if collapsed is None:
                collapsed = text.translate(_COLLAPSE)
            subject = collapsed
        else:
            if wide is None:
                wide = text.translate(_WIDE)
            subject = wide
        finditer = rx.pattern.finditer
        new: list[tuple[int, int]] = []
        for start, end in spans:
            chunk = subject[start:end]
            prev = 0
            for m in finditer(chunk):
                s, e = m.span()
                if s > prev:
                    new.append((start + prev, start + s))
                new.append((start + s, start + e))
                prev = e
            if prev < end - start:
                new.append((start + prev, end))
        spans = new
    return [text[s:e] for s, e in spans if e > s]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable-character table (unicode_byte_to_utf8_map)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE: list[str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {ch: b for b, ch in enumerate(BYTE_TO_UNICODE)}
BYTE_ENCODE_TABLE = {b: ch for b, ch in enumerate(BYTE_TO_UNICODE)}  # for latin-1 str.translate


def split_regexes(kind: str) -> tuple[SplitRegex, ...]:
    """The compiled regexes of a pre-tokenizer kind (a ``_PRE_REGEXES`` key, ``PRE_TOKENIZERS[name].kind``)."""
    return tuple(_compile_split_regex(e) for e in _PRE_REGEXES[kind])
