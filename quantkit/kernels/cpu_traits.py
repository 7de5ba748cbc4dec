"""The kernels' columns of a type's record: ggml's ``type_traits_cpu`` row, and per CPU level what it runs.

A ggml type's record is one row in three layers, assembled without import cycles:

* its identity, layout, vec_dot type and the quantize policy's facts: ``formats/ggml_types.TYPES``;
* its codec (reference / weighted quantize, dequantize): ``quants/codecs.TRAITS``;
* its kernels: ``CPU_TRAITS`` below, one ``CpuTraits`` per type that has any, naming the functions each
  entry is built from. The block bytes, elements, field offsets and activation sums an entry needs come
  from the type's row, never from here.

A type's kernel entries:

* ``row``: the row dot of the GEMV and the decode step (``vecdot.rowdot_kernel``), a ``Row``;
* ``x8``: the 8-row interleaved layout and its GEMV (``ir_x8.X8``; the decode step's copy of a matrix);
* ``gemm``: the prefill's batch product: integer GEMM tiles (``gemm.Spec``) for a quantized type, the
  float GEMM's products (``FloatGemm``, kernels/gemm_float.py) for F32 / F16 / BF16.

A type without a row entry runs on the portable path (its codec's row decoder and a float32 dot), without
a GEMM entry its batches on dequantized tiles and BLAS, without an x8 entry its decode on row dots.

The entries are written once and built per CPU level (quantkit/isa.py): the IR emitters per level's
integer-dot variant (``isa.Level.variant``), the x8 and GEMM ones per ``ir.int8_flavour``. ``LEVELS`` says
at which levels each kind of entry is built; ``level_of(t, op)`` walks the levels down from the one in
force to the first that has the entry, so a missing one falls back visibly (``quantkit bench`` prints
``describe``'s line). A new level is a new column there and in ir.py's ``_dot`` (its instructions), never
a branch inside a kernel body; a new type is one row here plus its emitters.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as T

from quantkit import config, isa
from quantkit.formats.ggml_types import type_info
from quantkit.kernels import gemm as G
from quantkit.kernels import ir_rowdot as R
from quantkit.kernels import ir_x8 as X
from quantkit.kernels import lowbit as L
from quantkit.kernels import vecdot_iq as V
from quantkit.kernels.ir import HAS_BF16_DOT, ld_bf16, ld_f16, ld_f32


@dataclass(frozen=True)
class Row:
    """A type's row dot, by how ``vecdot.rowdot_kernel`` builds it:

    * ``float``: a numba loop over the weights loaded by ``fn(w, byte offset)`` (F32 / F16 / BF16) against
      float32 activations (rounded to the type's vec_dot type);
    * ``ir``: ``fn`` is a per-block LLVM-IR emitter run in ir_rowdot.py's whole-row loop (a 1-row and a
      shared-load 2-row form);
    * ``loop``: ``fn(variant)`` returns the type's own whole-row intrinsic (1-row form only)."""

    kind: str
    fn: object


@dataclass(frozen=True)
class FloatGemm:
    """A float type's batch product (kernels/gemm_float.py), by the products it can run, best first:
    ``bf16``, ``vdpbf16ps`` on the stored bf16 pairs (where the CPU has AVX512-BF16 and is not in
    ``BF16_DOT_SLOWER``); ``fma``, float32 FMAs on the weights widened by the row's load (``Row.fn``)."""

    products: tuple[str, ...] = ("fma",)
    kind = "float_gemm"


@dataclass(frozen=True)
class CpuTraits:
    row: Row | None = None
    x8: X.X8 | None = None
    gemm: G.Spec | FloatGemm | None = None


#: the levels at which each kind of entry is built (isa.LEVELS' names, best first). The IR row dots are
#: built for every level's integer-dot variant (vnni on avx512vnni and avxvnni, avx2, neon's sdot,
#: generic); the float rows are one numba loop LLVM vectorizes for whatever target (``generic``); the x8
#: GEMV and the GEMM tiles where ``ir.int8_flavour`` gives them a flavour (one 512-bit vpdpbusd on
#: avx512vnni, two 256-bit halves on avxvnni and avx2, four 128-bit sdot on neon; the GEMM on i8mm's
#: smmla, ``ir.gemm_flavour``; every other kind at i8mm is neon's); the float GEMM at the x86 levels (AVX2
#: and up: its FMAs on 16 ymm or 32 zmm; NEON and generic multiply float batches with BLAS).
LEVELS: dict[str, tuple[str, ...]] = {
    "ir": ("avx512vnni", "avxvnni", "avx2", "neon", "generic"),
    "loop": ("avx512vnni", "avxvnni", "avx2", "neon", "generic"),
    "float": ("generic",),
    "x8": ("avx512vnni", "avxvnni", "avx2", "neon"),
    "gemm": ("avx512vnni", "avxvnni", "avx2", "i8mm", "neon"),
    "float_gemm": ("avx512vnni", "avxvnni", "avx2"),
}
OPS = ("row", "x8", "gemm")


def _ir(emit) -> Row:
    return Row("ir", emit)


def _legacy(name, chunk, offset) -> Row:
    return _ir(R.legacy_emitter(name, chunk, offset))


_LS, _LSM = G._legacy_scales(False), G._legacy_scales(True)

#: every type with a kernel entry, in the type table's order
CPU_TRAITS: dict[str, CpuTraits] = {
    "F32": CpuTraits(Row("float", ld_f32), gemm=FloatGemm()),
    "F16": CpuTraits(Row("float", ld_f16), gemm=FloatGemm()),
    "Q4_0": CpuTraits(_legacy("Q4_0", R._chunk_q4_0, 8), X.legacy_x8("Q4_0", 8),
                      G.Spec(T.Q4_0, 0, 8, None, R._chunk_q4_0, "qs", _LS)),
    "Q4_1": CpuTraits(_legacy("Q4_1", R._chunk_q4_0, 0), X.legacy_x8("Q4_1", 0),
                      G.Spec(T.Q4_1, 0, 0, "float", R._chunk_q4_0, "qs", _LSM)),
    "Q5_0": CpuTraits(_legacy("Q5_0", R._chunk_q5_0, 16), X.legacy_x8("Q5_0", 16),
                      G.Spec(T.Q5_0, 0, 16, None, R._chunk_q5_0, "qh", _LS)),
    "Q5_1": CpuTraits(_legacy("Q5_1", R._chunk_q5_0, 0), X.legacy_x8("Q5_1", 0),
                      G.Spec(T.Q5_1, 0, 0, "float", R._chunk_q5_0, "qh", _LSM)),
    "Q8_0": CpuTraits(_legacy("Q8_0", R._chunk_q8_0, 128), X.legacy_x8("Q8_0", 128),
                      G.Spec(T.Q8_0, 0, 128, None, R._chunk_q8_0, "qs", _LS)),
    "Q2_K": CpuTraits(_ir(R._emit_q2k), X.X8("Q2_K", {"scales": 1, "d": 2, "dmin": 2}, X._x8_q2_k),
                      G.Spec(T.Q2_K, 16, 0, "int", R._chunk_q2_k, "qs", G._q2k_scales)),
    "Q3_K": CpuTraits(_ir(R._emit_offset_k("Q3_K", R._q3k_scales, R._chunk_q3_k, 2)),
                      X.X8("Q3_K", {"scales": 4, "d": 2}, X._x8_q3_k),
                      G.Spec(T.Q3_K, 16, 4, None, R._chunk_q3_k, "hmask", G._q3k_scales)),
    "Q4_K": CpuTraits(_ir(R._emit_q4k_like(type_info("Q4_K").field("qs"), R._chunk_q4_k)),
                      X.X8("Q4_K", X.KS, X._x8_q4k_like(128)),
                      G.Spec(T.Q4_K, 32, 0, "int", R._chunk_q4_k, "qs", G._q4k_scales)),
    "Q5_K": CpuTraits(_ir(R._emit_q4k_like(type_info("Q5_K").field("qh"), R._chunk_q5_k)),
                      X.X8("Q5_K", X.KS, X._x8_q4k_like(384, 128)),
                      G.Spec(T.Q5_K, 32, 0, "int", R._chunk_q5_k, "qh", G._q4k_scales)),
    "Q6_K": CpuTraits(_ir(R._emit_offset_k("Q6_K", R._q6k_scales, R._chunk_q6_k, 5)),
                      X.X8("Q6_K", {"scales": 1, "d": 2}, X._x8_q6_k, order=X.Q6_K_ORDER, unroll=1),
                      G.Spec(T.Q6_K, 16, 32, None, R._chunk_q6_k, "ql", G._q6k_scales)),
    "IQ2_XXS": CpuTraits(_ir(V._emit_iq2_xxs), None,
                         G.Spec(T.IQ2_XXS, 32, 64, None, V._chunk_iq2_xxs, "d", V._iq2xxs_scales)),
    "IQ2_XS": CpuTraits(_ir(V._emit_iq2_xs), None,
                        G.Spec(T.IQ2_XS, 16, 64, None, V._chunk_iq2_xs, "d", V._iq2xs_scales)),
    "IQ3_XXS": CpuTraits(_ir(L._emit_iq3_xxs), None,
                         G.Spec(T.IQ3_XXS, 32, 64, None, L._chunk_iq3_xxs, "d", L._iq3xxs_scales)),
    "IQ1_S": CpuTraits(_ir(V._emit_iq1_s), None, G.Spec(T.IQ1_S, 32, 16, None, V._chunk_iq1_s, "d", V._iq1s_scales)),
    "IQ4_NL": CpuTraits(_legacy("IQ4_NL", R._chunk_iq4_nl, 128), X.legacy_x8("IQ4_NL", 128, R._IQ4_U),
                        G.Spec(T.IQ4_NL, 0, 128, None, R._chunk_iq4_nl, "qs", _LS)),
    "IQ3_S": CpuTraits(_ir(L._emit_iq3_s), None, G.Spec(T.IQ3_S, 32, 64, None, L._chunk_iq3_s, "d", L._iq3s_scales)),
    "IQ2_S": CpuTraits(_ir(V._emit_iq2_s), None, G.Spec(T.IQ2_S, 16, 64, None, V._chunk_iq2_s, "d", V._iq2s_scales)),
    "IQ4_XS": CpuTraits(_ir(R._emit_iq4xs), X.X8("IQ4_XS", {"d": 2, "scales_h": 2, "scales_l": 4}, X._x8_iq4_xs),
                        G.Spec(T.IQ4_XS, 32, 128, None, R._chunk_iq4_xs, "qs", G._iq4xs_scales)),
    "IQ1_M": CpuTraits(_ir(V._emit_iq1_m), None, G.Spec(T.IQ1_M, 16, 16, None, V._chunk_iq1_m, "qs", V._iq1m_scales)),
    "BF16": CpuTraits(Row("float", ld_bf16), gemm=FloatGemm(("bf16", "fma"))),
    "TQ1_0": CpuTraits(_ir(L._emit_tq1_0), X.X8("TQ1_0", {"qh": 4, "d": 2}, X._x8_tq1_0),
                       G.Spec(T.TQ1_0, 32, 1, None, L._chunk_tq1_0, "qs", L._tq1_scales)),
    "TQ2_0": CpuTraits(_ir(L._emit_tq2_0), X.X8("TQ2_0", {"d": 2}, X._x8_tq2_0),
                       G.Spec(T.TQ2_0, 32, 1, None, R._chunk_q2_k, "qs", L._tq2_scales)),
    "MXFP4": CpuTraits(_ir(L._emit_mxfp4), X.legacy_x8("MXFP4", 128, L._MXFP4_U),
                       G.Spec(T.MXFP4, 0, 128, None, L._chunk_mxfp4, "qs", L._mxfp4_scales)),
    "Q1_0": CpuTraits(Row("loop", L.row_q1_0), None, G.Spec(T.Q1_0, 0, 1, None, L._chunk_q1_0, "qs", L._q1_scales)),
}

_NONE = CpuTraits()


def cpu_traits(qtype) -> CpuTraits:
    """The kernel entries of a type (given as GGMLQuantizationType, name or id); empty where it has none."""
    return CPU_TRAITS.get(type_info(qtype).name, _NONE)


def kind_of(qtype, op: str) -> str | None:
    """The kind of ``op``'s entry ('row' -> its ``Row.kind``; 'x8'; 'gemm' -> 'gemm' for the integer GEMM,
    'float_gemm' for a float type's), or None without one."""
    entry = getattr(cpu_traits(qtype), op)
    if entry is None:
        return None
    return entry.kind if op == "row" or isinstance(entry, FloatGemm) else op


def level_of(qtype, op: str, level: str | None = None) -> str | None:
    """The CPU level ``op`` ('row', 'x8', 'gemm') of a type runs at when ``level`` (default: the one in
    force, ``isa.selected()``) is: the first level from it down (same architecture or portable) at which
    its entry is built; None when it has no entry at any (the portable path), or under
    ``QUANTKIT_KERNELS=plain`` (numba-only kernels) when asked for the level in force."""
    if level is None:
        if isa.forced() == isa.PLAIN:
            return None
        level = isa.selected()
    kind = kind_of(qtype, op)
    if kind is None:
        return None
    names = [lv.name for lv in isa.LEVELS]
    arch = isa.BY_NAME[level].arch
    for name in names[names.index(level):]:
        if isa.BY_NAME[name].arch in ("", arch) and name in LEVELS[kind]:
            return name
    return None


#: CPU vendors whose AVX512-BF16 ``vdpbf16ps`` multiplies BF16 batches slower than float32 FMAs do: on
#: the Sapphire Rapids machine (2 threads, 1B-shape BF16 pp512) the FMA GEMM ran 104 t/s, vdpbf16ps
#: 86-89; on a Zen 4 (AuthenticAMD) vdpbf16ps 180-184, FMAs ~95 (docs/performance-history.md)
BF16_DOT_SLOWER = ("GenuineIntel",)


def float_gemm(qtype) -> str | None:
    """The product a float type's batches run on (its ``FloatGemm`` entry's first the CPU allows: ``bf16``
    where AVX512-BF16 is allowed and the vendor is not in ``BF16_DOT_SLOWER``, else ``fma``), where its
    GEMM has a level (``level_of``: the x86 levels); None elsewhere (the dequantize + BLAS prefill: NEON,
    generic), for a quantized type, and under ``QUANTKIT_KERNELS=plain`` and ``QUANTKIT_GEMM=0``, as for
    the integer GEMM."""
    if kind_of(qtype, "gemm") != "float_gemm" or not config.integer_gemm() or level_of(qtype, "gemm") is None:
        return None
    bf16 = HAS_BF16_DOT and isa.cpu_vendor() not in BF16_DOT_SLOWER
    return next(p for p in cpu_traits(qtype).gemm.products if p != "bf16" or bf16)


def describe(types, level: str | None = None) -> str:
    """One line for ``quantkit bench``: per type, the level its row dot, x8 decode layout and GEMM run at
    (``-`` for none: the portable path, the row dots, dequantized tiles + BLAS; ``off`` where a switch
    turned it off; the float types' batches on ``float_gemm``: ``avx512bf16`` for vdpbf16ps, the level
    in force for FMAs), e.g.
    ``Q4_K row avx512vnni x8 avx512vnni gemm avx512vnni``."""
    off = {"x8": not config.x8(), "gemm": not config.integer_gemm()}  # QUANTKIT_X8=0, QUANTKIT_GEMM=0
    parts = []
    for t in types:
        lv = ["off" if off.get(op) else level_of(t, op, level) for op in OPS]
        if level is None and float_gemm(t) == "bf16":
            lv[OPS.index("gemm")] = "avx512bf16"
        parts.append(f"{type_info(t).name} " + " ".join(f"{op} {v or '-'}" for op, v in zip(OPS, lv)))
    return "; ".join(parts)
