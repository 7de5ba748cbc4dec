"""The record of a ggml type, one column at a time: the type table's row (formats/ggml_types.py), its codec
(quants/codecs.py's ``TRAITS``) and its kernels per CPU level (kernels/cpu_traits.py) name the same type
and agree on its facts."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as T

import quantkit.quants as Q
from quantkit.formats.ggml_types import BY_NAME, TYPES, type_info


def test_codec_column_names_each_rows_type():
    for t, codec in Q.TRAITS.items():
        assert codec.qtype is t and codec.info is type_info(t)
        assert (codec.block_size, codec.type_size) == (type_info(t).block_size, type_info(t).type_size)
    # in the type table's order, so listings and candidate lists do not depend on import order
    assert [int(t) for t in Q.TRAITS] == sorted(int(t) for t in Q.TRAITS)


@pytest.mark.parametrize("row", [t for t in TYPES if t.fallback], ids=lambda t: t.name)
def test_policy_fallback_is_a_smaller_block_with_a_codec(row):
    new = BY_NAME[row.fallback]
    assert new.block_size < row.block_size or new.name == "F16"
    assert T[new.name] in Q.TRAITS and new.fallback != row.name


def test_policy_columns_only_where_a_codec_can_act_on_them():
    for row in TYPES:
        assert row.target_bpw in ("default", "named", "never")
        if row.needs_imatrix:  # llama-quantize asks for an imatrix: the codec must be able to use one
            assert Q.traits(row.name).uses_imatrix


# -- the kernels' columns (kernels/cpu_traits.py) --------------------------------------------------

from quantkit import config, isa  # noqa: E402
from quantkit.kernels import cpu_traits as C  # noqa: E402


def test_kernel_columns_name_rows_with_codecs():
    assert list(C.CPU_TRAITS) == [t.name for t in TYPES if t.name in C.CPU_TRAITS]  # the table's order
    for name, c in C.CPU_TRAITS.items():
        info = BY_NAME[name]
        assert T[name] in Q.TRAITS  # a kernel without a codec could not be tested against one
        if c.row is not None:
            assert c.row.kind in C.LEVELS and (c.row.kind == "float") == (not info.quantized)
        if c.x8 is not None:  # sizes from the row, never restated
            assert (c.x8.ts, c.x8.qk, c.x8.name) == (info.type_size, info.block_size, name)
        if C.kind_of(name, "gemm") == "gemm":
            assert (c.gemm.qk * c.gemm.per, c.gemm.act) == (info.block_size, info.vec_dot_type)
        elif c.gemm is not None:  # a float product: only for the float types, bf16 only for BF16
            assert not info.quantized and "fma" in c.gemm.products
            assert ("bf16" in c.gemm.products) == (name == "BF16")


@pytest.mark.parametrize("level", [lv.name for lv in isa.LEVELS])
def test_a_missing_entry_falls_to_the_next_level_down(level):
    names = [lv.name for lv in isa.LEVELS]
    for name in C.CPU_TRAITS:
        for op in C.OPS:
            got = C.level_of(name, op, level)
            if got is None:
                assert C.kind_of(name, op) is None or not any(
                    lv in C.LEVELS[C.kind_of(name, op)] for lv in names[names.index(level):]
                    if isa.BY_NAME[lv].arch in ("", isa.BY_NAME[level].arch))
                continue
            assert names.index(got) >= names.index(level) and got in C.LEVELS[C.kind_of(name, op)]
            assert isa.BY_NAME[got].arch in ("", isa.BY_NAME[level].arch)
    # neon has row dots, the x8 layout and the GEMM of its own (sdot); its float rows are generic's; a float
    # type's GEMM is at the x86 levels only, an IQ2 type has no x8 layout
    assert C.level_of("Q4_K", "row", "neon") == "neon" and C.level_of("Q4_K", "gemm", "neon") == "neon"
    assert C.level_of("Q4_K", "x8", "neon") == "neon" and C.level_of("F16", "row", "neon") == "generic"
    assert C.level_of("F16", "gemm", "neon") is None and C.level_of("Q1_0", "row", "neon") == "neon"
    assert C.level_of("IQ2_XS", "x8", "neon") is None and C.level_of("IQ2_XS", "gemm", "neon") == "neon"
    # i8mm fills the GEMM column only: its row dots and x8 layout are neon's
    assert C.level_of("Q4_K", "gemm", "i8mm") == "i8mm" and C.level_of("Q4_K", "row", "i8mm") == "neon"
    assert C.level_of("Q4_K", "x8", "i8mm") == "neon" and C.level_of("F16", "gemm", "i8mm") is None
    assert C.level_of("Q4_K", "x8", "avxvnni") == "avxvnni" and C.level_of("F16", "row", "avx2") == "generic"
    assert C.level_of("F16", "gemm", "avx2") == "avx2" and C.level_of("BF16", "gemm", "avx512vnni") == "avx512vnni"
    assert C.level_of("F32", "gemm", "generic") is None
    assert C.level_of("Q8_K", "row", level) is None  # no entry: the portable path


@pytest.mark.skipif(isa.forced() == isa.PLAIN, reason="QUANTKIT_KERNELS=plain: no level's kernels run")
def test_kernel_columns_agree_with_what_the_kernels_dispatch():
    """The level ``level_of`` reports for the level in force is what ``matmul`` and the decode step pick."""
    import quantkit.kernels as K
    from quantkit.kernels.cpu_traits import float_gemm
    from quantkit.kernels.mul_mat import integer_gemm

    x8 = set(K.x8_types())
    for t in Q.TRAITS:
        assert (C.level_of(t, "row") is not None) == (t in K.WEIGHT_TYPES), t
        assert (C.level_of(t, "x8") is not None) == (t in x8), t
        if config.integer_gemm():
            assert (C.level_of(t, "gemm") is not None) == (integer_gemm(t) or float_gemm(t) is not None), t
    if config.x8() and config.integer_gemm():  # neither switched off: every column as level_of says
        want = " ".join(f"{op} {C.level_of('Q4_K', op) or '-'}" for op in C.OPS)
        assert C.describe([T.Q4_K, T.Q8_K]) == f"Q4_K {want}; Q8_K row - x8 - gemm -"
