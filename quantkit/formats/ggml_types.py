"""One row of facts per ggml type and per llama.cpp file type: the table everything else reads.

ggml keeps one ``type_traits`` row per type (``ggml/src/ggml.c``: name, block size, type size, whether
it is quantized) and one ``type_traits_cpu`` row (``ggml/src/ggml-cpu/ggml-cpu.c``: the ``vec_dot_type``
activations are converted to); the block structs are in ``ggml/src/ggml-common.h``. quantkit keeps the
same facts here, once, with no numba and no numpy, so every layer can import it (policy, the codecs, the
kernels, the pipelines, the command line):

* ``TYPES``: every ggml type id ggml knows (``enum ggml_type`` in ``ggml/include/ggml.h``), whether or
  not quantkit has a codec or a kernel for it: name, block size, type size, the block's fields in
  order with their byte sizes (so ``info.field("d")`` is a byte offset inside the block, and the
  sizes add up to the type size), which fields ``ggml_validate_row_data`` checks and how, the
  ``vec_dot_type`` and ggml's own spelling (``q4_K``).
* ``FILE_TYPES``: every ``llama_ftype`` (``include/llama.h``) with its name, id, default ggml type
  (``llama_ftype_get_default_type``, src/llama-quant.cpp), llama-quantize's help text
  (``QUANT_OPTIONS`` in tools/quantize/quantize.cpp, in its order) and ``llama_ftype_name``
  (src/llama-model-loader.cpp), plus ``FTYPE_ALIASES`` and ``guess_ftype`` (the loader's guess from
  the most frequent tensor type).

Q2_0 (ggml type 42, file type 41) is in llama.cpp but not in gguf-py 0.19.0 (the newest on PyPI):
its ``gguf_type`` is None, and GGUFWriter cannot write it.

tests/test_ggml_types.py checks the table against ggml's own ``type_traits`` / ``type_traits_cpu``
(tests/data/golden/type_traits.json, made by tools/make_type_golden.py from libggml).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from gguf import GGMLQuantizationType

#: ggml's QK_K: the super-block of the K-quants and the IQ types
QK_K = 256

#: the 16 reconstruction levels shared by IQ4_NL and IQ4_XS (ggml-common.h's ``kvalues_iq4nl``)
KVALUES_IQ4NL: tuple[int, ...] = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@dataclass(frozen=True)
class TypeInfo:
    """One ggml type: ``ggml_type_traits`` + ``ggml_type_traits_cpu`` + the block struct."""

    id: int                       # enum ggml_type
    name: str                     # GGMLQuantizationType's member name, e.g. "Q4_K"
    block_size: int               # elements per block (blck_size)
    type_size: int                # bytes per block (sizeof the block struct)
    #: the block's fields in struct order as (name, bytes); empty for the element types (F32, I8, ...)
    layout: tuple[tuple[str, int], ...] = ()
    #: what ``ggml_validate_row_data`` checks: "values" (every element is a float; F32/F16/BF16/F64),
    #: "f16" / "f32" (the ``checked`` fields of each block are fp16 / float32 scales), "e8m0" (the
    #: ``checked`` byte is an E8M0 exponent, 0xFF invalid), "iq1_m" (the fp16 scale spread over the
    #: top nibbles of ``scales``), "none" (nothing to check: integer types, NVFP4's UE4M3 bytes)
    check: str = "none"
    checked: tuple[str, ...] = ()
    vec_dot_type: str | None = None   # type_traits_cpu[...].vec_dot_type, by name; None if it has no vec_dot
    quantized: bool = True            # ggml_is_quantized
    # -- the quantize policy's facts about the type (quantkit/policy.py, pipelines/target_bpw.py) --
    #: the type ``tensor_type_fallback`` puts in its place when a row's length is not a multiple of its
    #: block (by name; a fallback that does not fit either gives F16); None: llama-quantize refuses
    fallback: str | None = None
    #: llama_model_quantize_impl refuses this target without an imatrix (except token_embd / output)
    needs_imatrix: bool = False
    #: whether ``quantize --target-bpw`` chooses it: "default" (among the candidates unless
    #: ``--target-types`` names others), "named" (only when ``--target-types`` names it), "never"
    target_bpw: str = "default"
    offsets: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        offs, o = {}, 0
        for fname, nbytes in self.layout:
            offs[fname] = o
            o += nbytes
        object.__setattr__(self, "offsets", offs)

    def field(self, name: str) -> int:
        """The byte offset of field ``name`` inside one block (``offsetof(block_X, name)``)."""
        return self.offsets[name]

    @property
    def ggml_name(self) -> str:
        """ggml's spelling (``type_traits[...].type_name``): ``q4_K``, ``iq4_nl``, ``f16``."""
        n = self.name.lower()
        return n[:-2] + "_K" if n.endswith("_k") else n

    @property
    def gguf_type(self) -> GGMLQuantizationType | None:
        """The gguf-py enum member, or None where gguf-py lacks the type (Q2_0 in gguf 0.19.0)."""
        try:
            return GGMLQuantizationType(self.id)
        except ValueError:
            return None

    @property
    def check_offsets(self) -> tuple[int, ...]:
        """Byte offsets of the ``checked`` fields inside a block."""
        return tuple(self.offsets[f] for f in self.checked)

    def row_bytes(self, n_per_row: int) -> int:
        return n_per_row // self.block_size * self.type_size


def _t(id_, name, bs, ts, layout=(), check="f16", checked=("d",), vdt=None, fb=None, imx=False,
       bpw="default") -> TypeInfo:
    return TypeInfo(id_, name, bs, ts, tuple(layout), check, tuple(checked), vdt, True, fb, imx, bpw)


def _plain(id_, name, ts, check="values", vdt=None) -> TypeInfo:
    return TypeInfo(id_, name, 1, ts, (), check, (), vdt, False)


D, DM, DMIN = ("d",), ("d", "m"), ("d", "dmin")

#: every ggml type, by id (ggml.h's enum ggml_type; 4, 5, 31-33 and 36-38 were removed from ggml).
#:
#: The policy's columns (``fb``, ``imx``, ``bpw``):
#:
#: * ``fb``: the 32-element block types fall back to F16 (their ncols cannot be a multiple of 32 there).
#:   This is measured, not what a first reading of ``tensor_type_fallback`` suggests (no fallback):
#:   llama.cpp as shipped in llama-cpp-python 0.3.36 turns q8_0/q4_0/... on a 100-column tensor into f16
#:   with the "must use F16 due to unusual shape" warning (tests/data/policy/odd100.json), while q1_0,
#:   nvfp4 and q8_K throw (no ``fb``).
#: * ``imx``: ``llama_model_quantize_impl``'s imatrix check (the 1- and 2-bit IQ types and IQ3_XXS).
#: * ``bpw="never"``: never a tensor's storage type (Q8_K, ggml's activation-only type), or the lattice
#:   types IQ2_* / IQ1_*, three of which cannot be made without importance weights, which a tensor missing
#:   from the imatrix does not have. ``bpw="named"``: IQ3_XXS, IQ3_S and MXFP4, which the loss model
#:   underrates -- SmolLM2's choice at Q4_K_M's size measured KLD 0.040 with them (IQ3 on blk.1-6
#:   ffn_down, MXFP4 on blk.0 attn_v/attn_output), 0.038 with MXFP4 alone, against the mix's 0.028 and
#:   0.024 without them (docs/quantize.md "Measured on SmolLM2-135M").
TYPES: tuple[TypeInfo, ...] = (
    _plain(0, "F32", 4, vdt="F32"),
    _plain(1, "F16", 2, vdt="F16"),
    _t(2, "Q4_0", 32, 18, (("d", 2), ("qs", 16)), vdt="Q8_0", fb="F16"),
    _t(3, "Q4_1", 32, 20, (("d", 2), ("m", 2), ("qs", 16)), checked=DM, vdt="Q8_1", fb="F16"),
    _t(6, "Q5_0", 32, 22, (("d", 2), ("qh", 4), ("qs", 16)), vdt="Q8_0", fb="F16"),
    _t(7, "Q5_1", 32, 24, (("d", 2), ("m", 2), ("qh", 4), ("qs", 16)), checked=DM, vdt="Q8_1", fb="F16"),
    _t(8, "Q8_0", 32, 34, (("d", 2), ("qs", 32)), vdt="Q8_0", fb="F16"),
    # gguf-py 0.19.0's GGML_QUANT_SIZES says 40 bytes (an old float d/s layout); ggml's block is 36
    _t(9, "Q8_1", 32, 36, (("d", 2), ("s", 2), ("qs", 32)), check="none", checked=(), fb="F16"),
    _t(10, "Q2_K", QK_K, 84, (("scales", 16), ("qs", 64), ("d", 2), ("dmin", 2)), checked=DMIN, vdt="Q8_K",
       fb="Q4_0"),
    _t(11, "Q3_K", QK_K, 110, (("hmask", 32), ("qs", 64), ("scales", 12), ("d", 2)), vdt="Q8_K", fb="Q4_0"),
    _t(12, "Q4_K", QK_K, 144, (("d", 2), ("dmin", 2), ("scales", 12), ("qs", 128)), checked=DMIN, vdt="Q8_K",
       fb="Q5_0"),
    _t(13, "Q5_K", QK_K, 176, (("d", 2), ("dmin", 2), ("scales", 12), ("qh", 32), ("qs", 128)), checked=DMIN,
       vdt="Q8_K", fb="Q5_1"),
    _t(14, "Q6_K", QK_K, 210, (("ql", 128), ("qh", 64), ("scales", 16), ("d", 2)), vdt="Q8_K", fb="Q8_0"),
    # Q8_1 and Q8_K are activation types (of Q4_1/Q5_1 and of the K-quants): no vec_dot of their own
    _t(15, "Q8_K", QK_K, 292, (("d", 4), ("qs", 256), ("bsums", 32)), check="f32", bpw="never"),
    _t(16, "IQ2_XXS", QK_K, 66, (("d", 2), ("qs", 64)), vdt="Q8_K", fb="IQ4_NL", imx=True, bpw="never"),
    _t(17, "IQ2_XS", QK_K, 74, (("d", 2), ("qs", 64), ("scales", 8)), vdt="Q8_K", fb="IQ4_NL", imx=True,
       bpw="never"),
    _t(18, "IQ3_XXS", QK_K, 98, (("d", 2), ("qs", 96)), vdt="Q8_K", fb="IQ4_NL", imx=True, bpw="named"),
    _t(19, "IQ1_S", QK_K, 50, (("d", 2), ("qs", 32), ("qh", 16)), vdt="Q8_K", fb="IQ4_NL", imx=True,
       bpw="never"),
    _t(20, "IQ4_NL", 32, 18, (("d", 2), ("qs", 16)), vdt="Q8_0", fb="F16"),
    _t(21, "IQ3_S", QK_K, 110, (("d", 2), ("qs", 64), ("qh", 8), ("signs", 32), ("scales", 4)), vdt="Q8_K",
       fb="IQ4_NL", bpw="named"),
    _t(22, "IQ2_S", QK_K, 82, (("d", 2), ("qs", 64), ("qh", 8), ("scales", 8)), vdt="Q8_K", fb="IQ4_NL", imx=True,
       bpw="never"),
    _t(23, "IQ4_XS", QK_K, 136, (("d", 2), ("scales_h", 2), ("scales_l", 4), ("qs", 128)), vdt="Q8_K", fb="IQ4_NL"),
    _plain(24, "I8", 1, check="none"),
    _plain(25, "I16", 2, check="none"),
    _plain(26, "I32", 4, check="none"),
    _plain(27, "I64", 8, check="none"),
    _plain(28, "F64", 8),
    _t(29, "IQ1_M", QK_K, 56, (("qs", 32), ("qh", 16), ("scales", 8)), check="iq1_m", checked=("scales",),
       vdt="Q8_K", fb="IQ4_NL", imx=True, bpw="never"),
    _plain(30, "BF16", 2, vdt="BF16"),
    _t(34, "TQ1_0", QK_K, 54, (("qs", 48), ("qh", 4), ("d", 2)), vdt="Q8_K", fb="Q4_0"),
    _t(35, "TQ2_0", QK_K, 66, (("qs", 64), ("d", 2)), vdt="Q8_K", fb="Q4_0"),
    _t(39, "MXFP4", 32, 17, (("e", 1), ("qs", 16)), check="e8m0", checked=("e",), vdt="Q8_0", fb="F16", bpw="named"),
    _t(40, "NVFP4", 64, 36, (("d", 4), ("qs", 32)), check="none", checked=(), vdt="Q8_0"),
    _t(41, "Q1_0", 128, 18, (("d", 2), ("qs", 16)), vdt="Q8_0"),
    _t(42, "Q2_0", 64, 18, (("d", 2), ("qs", 16)), vdt="Q8_0", fb="Q4_0"),  # not in gguf-py 0.19.0
)

BY_ID: dict[int, TypeInfo] = {t.id: t for t in TYPES}
BY_NAME: dict[str, TypeInfo] = {t.name: t for t in TYPES}


def type_info(qtype: "GGMLQuantizationType | TypeInfo | str | int") -> TypeInfo:
    """The row of a type given as a GGMLQuantizationType, its name (any case: ``q4_k``, ``Q4_K``) or id.
    KeyError for a type ggml does not know (callers turn it into their own one-line error)."""
    if isinstance(qtype, TypeInfo):
        return qtype
    if isinstance(qtype, GGMLQuantizationType):
        return BY_ID[int(qtype)]
    if isinstance(qtype, str):
        return BY_NAME[qtype.strip().upper()]
    return BY_ID[int(qtype)]


def block_size(qtype) -> int:
    return type_info(qtype).block_size


def type_size(qtype) -> int:
    return type_info(qtype).type_size


def ggml_type_name(qtype) -> str:
    return type_info(qtype).ggml_name


def vec_dot_type(qtype) -> str | None:
    return type_info(qtype).vec_dot_type


def is_quantized(qtype) -> bool:
    return type_info(qtype).quantized


# ---------------------------------------------------------------------------------------------------
# File types
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileTypeInfo:
    name: str              # as llama-quantize spells it, e.g. "Q4_K_M"
    id: int                # llama_ftype (general.file_type); COPY shares 0 with F32
    default: str | None    # llama_ftype_get_default_type, by type name; None for COPY and NVFP4
    help: str              # llama-quantize's description ("" for a file type it does not list)
    label: str             # llama_ftype_name, e.g. "Q4_K - Medium"
    listed: bool = True    # in llama-quantize's QUANT_OPTIONS (NVFP4 is not)


#: every llama_ftype, in llama-quantize's QUANT_OPTIONS order (the aliases are FTYPE_ALIASES; NVFP4,
#: which llama-quantize does not offer, last)
FILE_TYPES: tuple[FileTypeInfo, ...] = (
    FileTypeInfo("Q1_0", 40, "Q1_0", "1.125 bpw quantization", "Q1_0"),
    FileTypeInfo("Q2_0", 41, "Q2_0", "2.25 bpw quantization (group 64)", "Q2_0"),
    FileTypeInfo("Q4_0", 2, "Q4_0", "4.34G, +0.4685 ppl @ Llama-3-8B", "Q4_0"),
    FileTypeInfo("Q4_1", 3, "Q4_1", "4.78G, +0.4511 ppl @ Llama-3-8B", "Q4_1"),
    FileTypeInfo("MXFP4_MOE", 38, "MXFP4", "MXFP4 MoE", "MXFP4 MoE"),
    FileTypeInfo("Q5_0", 8, "Q5_0", "5.21G, +0.1316 ppl @ Llama-3-8B", "Q5_0"),
    FileTypeInfo("Q5_1", 9, "Q5_1", "5.65G, +0.1062 ppl @ Llama-3-8B", "Q5_1"),
    FileTypeInfo("IQ2_XXS", 19, "IQ2_XXS", "2.06 bpw quantization", "IQ2_XXS - 2.0625 bpw"),
    FileTypeInfo("IQ2_XS", 20, "IQ2_XS", "2.31 bpw quantization", "IQ2_XS - 2.3125 bpw"),
    FileTypeInfo("IQ2_S", 28, "IQ2_XS", "2.5  bpw quantization", "IQ2_S - 2.5 bpw"),
    FileTypeInfo("IQ2_M", 29, "IQ2_S", "2.7  bpw quantization", "IQ2_M - 2.7 bpw"),
    FileTypeInfo("IQ1_S", 24, "IQ1_S", "1.56 bpw quantization", "IQ1_S - 1.5625 bpw"),
    FileTypeInfo("IQ1_M", 31, "IQ1_M", "1.75 bpw quantization", "IQ1_M - 1.75 bpw"),
    FileTypeInfo("TQ1_0", 36, "TQ1_0", "1.69 bpw ternarization", "TQ1_0 - 1.69 bpw ternary"),
    FileTypeInfo("TQ2_0", 37, "TQ2_0", "2.06 bpw ternarization", "TQ2_0 - 2.06 bpw ternary"),
    FileTypeInfo("Q2_K", 10, "Q2_K", "2.96G, +3.5199 ppl @ Llama-3-8B", "Q2_K - Medium"),
    FileTypeInfo("Q2_K_S", 21, "Q2_K", "2.96G, +3.1836 ppl @ Llama-3-8B", "Q2_K - Small"),
    FileTypeInfo("IQ3_XXS", 23, "IQ3_XXS", "3.06 bpw quantization", "IQ3_XXS - 3.0625 bpw"),
    FileTypeInfo("IQ3_S", 26, "IQ3_S", "3.44 bpw quantization", "IQ3_S - 3.4375 bpw"),
    FileTypeInfo("IQ3_M", 27, "IQ3_S", "3.66 bpw quantization mix", "IQ3_S mix - 3.66 bpw"),
    FileTypeInfo("IQ3_XS", 22, "IQ3_S", "3.3 bpw quantization", "IQ3_XS - 3.3 bpw"),
    FileTypeInfo("Q3_K_S", 11, "Q3_K", "3.41G, +1.6321 ppl @ Llama-3-8B", "Q3_K - Small"),
    FileTypeInfo("Q3_K_M", 12, "Q3_K", "3.74G, +0.6569 ppl @ Llama-3-8B", "Q3_K - Medium"),
    FileTypeInfo("Q3_K_L", 13, "Q3_K", "4.03G, +0.5562 ppl @ Llama-3-8B", "Q3_K - Large"),
    FileTypeInfo("IQ4_NL", 25, "IQ4_NL", "4.50 bpw non-linear quantization", "IQ4_NL - 4.5 bpw"),
    FileTypeInfo("IQ4_XS", 30, "IQ4_XS", "4.25 bpw non-linear quantization", "IQ4_XS - 4.25 bpw"),
    FileTypeInfo("Q4_K_S", 14, "Q4_K", "4.37G, +0.2689 ppl @ Llama-3-8B", "Q4_K - Small"),
    FileTypeInfo("Q4_K_M", 15, "Q4_K", "4.58G, +0.1754 ppl @ Llama-3-8B", "Q4_K - Medium"),
    FileTypeInfo("Q5_K_S", 16, "Q5_K", "5.21G, +0.1049 ppl @ Llama-3-8B", "Q5_K - Small"),
    FileTypeInfo("Q5_K_M", 17, "Q5_K", "5.33G, +0.0569 ppl @ Llama-3-8B", "Q5_K - Medium"),
    FileTypeInfo("Q6_K", 18, "Q6_K", "6.14G, +0.0217 ppl @ Llama-3-8B", "Q6_K"),
    FileTypeInfo("Q8_0", 7, "Q8_0", "7.96G, +0.0026 ppl @ Llama-3-8B", "Q8_0"),
    FileTypeInfo("F16", 1, "F16", "14.00G, +0.0020 ppl @ Mistral-7B", "F16"),
    FileTypeInfo("BF16", 32, "BF16", "14.00G, -0.0050 ppl @ Mistral-7B", "BF16"),
    FileTypeInfo("F32", 0, "F32", "26.00G              @ 7B", "all F32"),
    FileTypeInfo("COPY", 0, None, "only copy tensors, no quantizing", "all F32"),
    FileTypeInfo("NVFP4", 39, None, "", "NVFP4", listed=False),
)

#: llama-quantize's aliases
FTYPE_ALIASES: dict[str, str] = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
#: llama-quantize's QUANT_OPTIONS: the names its --help lists, aliases included, in its order
QUANT_OPTIONS: tuple[str, ...] = tuple(
    n for f in FILE_TYPES if f.listed
    for n in ({"IQ3_XS": ("Q3_K",), "Q4_K_S": ("Q4_K",), "Q5_K_S": ("Q5_K",)}.get(f.name, ()) + (f.name,)))

FILE_TYPE_BY_NAME: dict[str, FileTypeInfo] = {f.name: f for f in FILE_TYPES}
#: by llama_ftype id (F32, not COPY, for 0)
FILE_TYPE_BY_ID: dict[int, FileTypeInfo] = {f.id: f for f in reversed(FILE_TYPES) if f.name != "COPY"}

#: llama_model_loader's guess when a file has no general.file_type: its most frequent tensor type ->
#: the file type (src/llama-model-loader.cpp); a type not here gives "all F32" with a warning
_GUESS: dict[str, str] = {
    "F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0",
    "Q5_1": "Q5_1", "Q8_0": "Q8_0", "Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M",
    "Q6_K": "Q6_K", "TQ1_0": "TQ1_0", "TQ2_0": "TQ2_0", "IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_S", "IQ3_XXS": "IQ3_XXS", "IQ1_S": "IQ1_S", "IQ1_M": "IQ1_M", "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS", "IQ3_S": "IQ3_S", "NVFP4": "NVFP4", "Q1_0": "Q1_0", "Q2_0": "Q2_0",
}


def guess_ftype(type_names: Iterable[str]) -> FileTypeInfo:
    """The loader's guess from the tensor types in its order: the first type to reach the highest count."""
    counts: dict[str, int] = {}
    best, best_n = "F32", 0
    for t in type_names:
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > best_n:
            best, best_n = t, counts[t]
    return FILE_TYPE_BY_NAME[_GUESS.get(best, "F32")]


def ftype_label(ftype_id: int) -> str:
    """llama_ftype_name: ``Q4_K - Medium``; "unknown, may not work" for an id llama.cpp does not know."""
    f = FILE_TYPE_BY_ID.get(int(ftype_id))
    return f.label if f is not None else "unknown, may not work"
