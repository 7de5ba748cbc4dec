"""The lattice grids of the IQ1 / IQ2 / IQ3 types, read from gguf-py's data (not pasted from ggml).

gguf-py's ``gguf.quants`` carries every grid as ``grid_hex`` (the ggml table's integers, little-endian,
as hex text), ``grid_map`` (the value each packed index stands for) and ``grid_shape`` (points,
values per point): IQ2_XXS / IQ2_XS / IQ2_S hold 2-bit indices into (0x08, 0x19, 0x2b), IQ1_S / IQ1_M
2-bit indices into (-1, 0, 1), IQ3_XXS / IQ3_S 3-bit indices (stored 4 bits apart) into 8 levels.

* ``grid_levels(t)`` -- uint8 [points, k]: each point's level indices. For the IQ2 and IQ1 types this is
  the ``l`` of ggml's ``iq2xs_init_impl`` (``kgrid_2bit_*`` / ``kgrid_1bit_2048`` hold it packed 2 bits
  per value), from which ggml's quantizers build their search grid ``2*l + 1``;
* ``grid_values(t)`` -- int16 [points, k]: ``grid_map[level]``, the grid the dequantizers read
  (ggml's ``iq2xxs_grid``, ``iq1s_grid`` ... as signed integers).

Both are built once per type, cached, and read-only.
"""

from __future__ import annotations

import functools
from math import ceil, log2

import numpy as np
from gguf import GGMLQuantizationType

from quantkit.errors import QuantError


def _gguf_class(qtype: GGMLQuantizationType | str):
    import gguf.quants

    t = qtype if isinstance(qtype, GGMLQuantizationType) else GGMLQuantizationType[str(qtype).upper()]
    cls = gguf.quants._type_traits.get(t)  # gguf-py's registry of its per-type classes
    if cls is None or getattr(cls, "grid_hex", None) is None:
        raise QuantError(f"{t.name} has no lattice grid")
    return t, cls


@functools.cache
def _levels(t: GGMLQuantizationType) -> np.ndarray:
    _, cls = _gguf_class(t)
    bits = ceil(log2(len(cls.grid_map)))  # bits per value, as gguf-py's init_grid
    per_byte = 8 // bits                  # values per byte; each takes 8 // per_byte bits
    raw = np.frombuffer(bytes.fromhex(cls.grid_hex.decode("ascii")), dtype=np.uint8)
    shifts = np.arange(0, 8, 8 // per_byte, dtype=np.uint8)
    lv = (raw[:, None] >> shifts[None, :]) & np.uint8((1 << bits) - 1)
    lv = np.ascontiguousarray(lv.reshape(cls.grid_shape), dtype=np.uint8)
    lv.flags.writeable = False
    return lv


@functools.cache
def _values(t: GGMLQuantizationType) -> np.ndarray:
    _, cls = _gguf_class(t)
    vmap = np.array(cls.grid_map, dtype=np.int16)
    v = np.ascontiguousarray(vmap[_levels(t)])
    v.flags.writeable = False
    return v


def grid_levels(qtype: GGMLQuantizationType | str) -> np.ndarray:
    """uint8 [points, values per point]: the level index of every value of every grid point."""
    return _levels(_gguf_class(qtype)[0])


def grid_values(qtype: GGMLQuantizationType | str) -> np.ndarray:
    """int16 [points, values per point]: the grid as the dequantizers read it (``grid_map[level]``)."""
    return _values(_gguf_class(qtype)[0])
