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
