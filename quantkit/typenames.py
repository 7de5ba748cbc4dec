"""The names the quantize command takes: llama-quantize's file types and ggml's tensor types.

* ``FileType``, ``FILE_TYPES`` (every file type llama-quantize offers, in its ``QUANT_OPTIONS`` order;
  their ids, names, default types and help texts are the type table's, formats/ggml_types.py),
  ``REFUSED_FTYPES`` and ``parse_ftype``: the ``ftype`` argument (tools/quantize/quantize.cpp);
* ``parse_ggml_type``, ``ggml_type_name``: a tensor type by ggml's name (``--output-tensor-type``,
  ``--token-embedding-type``, ``--tensor-type``);
* ``parse_tensor_type_arg``: one ``--tensor-type PATTERN=TYPE``.

Pure: no I/O, no numba. The per-tensor rules that use these names are ``quantkit.policy``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gguf import GGMLQuantizationType

from quantkit.errors import PolicyError
from quantkit.formats import ggml_types as G

Q = GGMLQuantizationType


# ---------------------------------------------------------------------------------------------
# File types (``include/llama.h``'s ``llama_ftype``, names from tools/quantize/quantize.cpp)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileType:
    name: str  # as llama-quantize spells it, e.g. "Q4_K_M"
    ftype_id: int  # llama.cpp's llama_ftype id (general.file_type); COPY shares 0 with F32
    default: GGMLQuantizationType | None  # the file type's default ggml type; None for COPY (every tensor keeps its type)
    description: str  # llama-quantize's own help string

    @property
    def only_copy(self) -> bool:
        return self.default is None

    @property
    def is_quantized(self) -> bool:
        return self.default is not None and is_quantized_type(self.default)


#: llama.cpp file types quantkit refuses, and why (every other one is planned like llama-quantize does)
REFUSED_FTYPES: dict[str, str] = {
    "Q2_0": "gguf-py 0.19.0 (the newest on PyPI) has no GGML type Q2_0 (ggml type 42), so its GGUFWriter "
            "cannot write it",
    "NVFP4": "llama-quantize does not offer it (llama_ftype_get_default_type has no type for it)",
}

#: every file type llama-quantize offers, in its QUANT_OPTIONS order (ids, names, default types and help
#: text are the type table's, formats/ggml_types.py), but the refused ones
FILE_TYPES: tuple[FileType, ...] = tuple(
    FileType(f.name, f.id, None if f.default is None else Q[f.default], f.help)
    for f in G.FILE_TYPES if f.listed and f.name not in REFUSED_FTYPES)

FTYPE_ALIASES: dict[str, str] = G.FTYPE_ALIASES

_BY_NAME: dict[str, FileType] = {ft.name: ft for ft in FILE_TYPES}
_BY_ID: dict[int, FileType] = {ft.ftype_id: ft for ft in FILE_TYPES if not ft.only_copy}


def parse_ftype(value: str | int | FileType) -> FileType:
    """A file type from its name (any case, aliases Q3_K/Q4_K/Q5_K) or its llama.cpp integer id."""
    if isinstance(value, FileType):
        return value
    known = ", ".join(ft.name for ft in FILE_TYPES)
    text = str(value).strip()
    if isinstance(value, int) or re.fullmatch(r"[+-]?\d+", text):
        ftype_id = int(text)
        if ftype_id in _BY_ID:
            return _BY_ID[ftype_id]
        refused = G.FILE_TYPE_BY_ID.get(ftype_id)
        if refused is not None and refused.name in REFUSED_FTYPES:
            raise PolicyError(f"ftype id {ftype_id} ({refused.name}) is not supported by quantkit: "
                              f"{REFUSED_FTYPES[refused.name]}")
        raise PolicyError(f"unknown ftype id {ftype_id}; supported: {known}")
    key = text.upper()
    key = FTYPE_ALIASES.get(key, key)
    if key in _BY_NAME:
        return _BY_NAME[key]
    if key in REFUSED_FTYPES:
        raise PolicyError(f"ftype {key} is not supported by quantkit: {REFUSED_FTYPES[key]}")
    raise PolicyError(f"unknown ftype {value!r}; supported: {known}")


# ---------------------------------------------------------------------------------------------
# ggml types
# ---------------------------------------------------------------------------------------------

def is_quantized_type(qtype: GGMLQuantizationType) -> bool:
    """ggml_is_quantized: every block type; not F32/F16/BF16/F64 or the integer types."""
    return G.is_quantized(qtype)


def block_size(qtype: GGMLQuantizationType) -> int:
    return G.block_size(qtype)


def ggml_type_name(qtype: GGMLQuantizationType) -> str:
    """ggml's own spelling: ``q4_K``, ``iq4_nl``, ``f16``."""
    return G.ggml_type_name(qtype)


def parse_ggml_type(value: str | int | GGMLQuantizationType) -> GGMLQuantizationType:
    """A ggml tensor type from its name, case-insensitive (``q8_0``, ``Q6_K``, ``f16``), as
    ``--output-tensor-type`` / ``--token-embedding-type`` / ``--tensor-type`` take it."""
    if isinstance(value, GGMLQuantizationType):
        return value
    if isinstance(value, int):
        try:
            return Q(value)
        except ValueError:
            raise PolicyError(f"unknown ggml type id {value}") from None
    key = str(value).strip().upper()
    try:
        return Q[key]
    except KeyError:
        known = ", ".join(ggml_type_name(t) for t in Q)
        raise PolicyError(f"unknown ggml type {value!r}; known: {known}") from None


def parse_tensor_type_arg(arg: str) -> tuple[str, GGMLQuantizationType]:
    """One ``--tensor-type PATTERN=TYPE`` argument. As llama-quantize does, the pattern is
    lower-cased; it must compile as a regular expression."""
    pattern, sep, type_name = arg.rpartition("=")
    if not sep or not pattern or not type_name:
        raise PolicyError(f"malformed --tensor-type {arg!r}: expected PATTERN=TYPE, e.g. 'attn_v=q8_0'")
    pattern = pattern.lower()
    compile_pattern(pattern)
    return pattern, parse_ggml_type(type_name)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A ``--tensor-type`` pattern as a regular expression (a bad one is a PolicyError)."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise PolicyError(f"bad --tensor-type regex {pattern!r}: {e}") from None
