"""The codec column of the type table: every ggml type quantkit can quantize and dequantize -> its codec.

ggml's ``type_traits`` row of a type names its ``from_float_ref`` and ``to_float`` (``ggml/src/ggml.c``);
here a type's row in ``quantkit.formats.ggml_types.TYPES`` holds its layout and facts, and ``TRAITS``
below names its codec class (quants/base.py says what a codec gives). One line per type, in the type
table's order; defining a codec class registers nothing, so what quantkit supports is this table, not
whichever modules happen to have been imported. ``tests/test_ggml_types.py`` checks every entry against
its row (same type, same sizes). The kernels' columns of the same record are in kernels/cpu_traits.py.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.errors import QuantError
from quantkit.quants import floats, iq1, iq2, iq3, iq4, kquants, legacy, mxfp4, q1, ternary
from quantkit.quants.base import QuantType

#: ggml type -> its codec, in the type table's order (type ids ascending)
TRAITS: dict[T, type[QuantType]] = {
    T.F32: floats.F32,
    T.F16: floats.F16,
    T.Q4_0: legacy.Q4_0,
    T.Q4_1: legacy.Q4_1,
    T.Q5_0: legacy.Q5_0,
    T.Q5_1: legacy.Q5_1,
    T.Q8_0: legacy.Q8_0,
    T.Q2_K: kquants.Q2_K,
    T.Q3_K: kquants.Q3_K,
    T.Q4_K: kquants.Q4_K,
    T.Q5_K: kquants.Q5_K,
    T.Q6_K: kquants.Q6_K,
    T.Q8_K: kquants.Q8_K,
    T.IQ2_XXS: iq2.IQ2_XXS,
    T.IQ2_XS: iq2.IQ2_XS,
    T.IQ3_XXS: iq3.IQ3_XXS,
    T.IQ1_S: iq1.IQ1_S,
    T.IQ4_NL: iq4.IQ4_NL,
    T.IQ3_S: iq3.IQ3_S,
    T.IQ2_S: iq2.IQ2_S,
    T.IQ4_XS: iq4.IQ4_XS,
    T.IQ1_M: iq1.IQ1_M,
    T.BF16: floats.BF16,
    T.TQ1_0: ternary.TQ1_0,
    T.TQ2_0: ternary.TQ2_0,
    T.MXFP4: mxfp4.MXFP4,
    T.Q1_0: q1.Q1_0,
}


def resolve_type(qtype: T | str | int) -> T:
    """Accept a GGMLQuantizationType, its name (any case, e.g. ``"q4_k"``) or its integer id."""
    if isinstance(qtype, T):
        return qtype
    if isinstance(qtype, str):
        key = qtype.strip().upper()
        try:
            return T[key]
        except KeyError:
            pass
        raise QuantError(f"unknown quantization type {qtype!r}; known: {', '.join(t.name for t in TRAITS)}")
    try:
        return T(int(qtype))
    except (ValueError, TypeError):
        raise QuantError(f"unknown quantization type id {qtype!r}") from None


def traits(qtype: T | str | int) -> type[QuantType]:
    t = resolve_type(qtype)
    try:
        return TRAITS[t]
    except KeyError:
        raise QuantError(
            f"type {t.name} is not supported by quantkit; supported: {', '.join(x.name for x in TRAITS)}"
        ) from None


def quantize(data: np.ndarray, qtype, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize float32 ``data`` of shape (..., n_per_row) to ``qtype``; returns uint8 (..., row_bytes).

    Bytes are identical to ggml's ``ggml_quantize_chunk`` with ``quant_weights`` NULL
    (``imatrix=None``) or set to ``imatrix``.
    """
    return traits(qtype).quantize(data, imatrix)


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """Dequantize bytes of shape (..., row_bytes) of ``qtype`` to float32 (..., n_per_row)."""
    return traits(qtype).dequantize(data)
