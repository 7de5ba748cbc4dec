"""Re-read a GGUF and check it: tensor sizes and bounds, finite block scales, metadata vs tensors.

This is what ``quantkit verify FILE`` and ``quantkit quantize --verify`` run. The scale check is ggml's
``ggml_validate_row_data`` in spirit: a block whose scale is NaN/Inf decodes to non-finite values, so
each tensor is decoded (one at a time) and must be finite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES

from quantkit.formats.gguf_io import GGUFModel
from quantkit.pause import pause_point

_LAYER_RX = re.compile(r"^blk\.(\d+)\.")


@dataclass
class TensorCheck:
    name: str
    type: str
    shape: tuple[int, ...]
    nbytes: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class VerifyReport:
    path: str
    tensors: list[TensorCheck]
    metadata_problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.metadata_problems and all(t.ok for t in self.tensors)

    @property
    def n_bad(self) -> int:
        return sum(not t.ok for t in self.tensors)


def verify_file(path, progress: Callable | None = None) -> VerifyReport:
    from quantkit.quants import TRAITS, dequantize

    with GGUFModel(path) as m:
        checks: list[TensorCheck] = []
        spans = []
        bar = progress(total=len(m.tensors), unit="tensor", desc="verify") if progress else None
        for t in m.tensors:
            block, size = GGML_QUANT_SIZES[t.type]
            c = TensorCheck(t.name, t.type.name, t.shape, int(t.data.nbytes))
            if t.shape[0] % block:
                c.problems.append(f"row length {t.shape[0]} is not a multiple of the {t.type.name} block {block}")
            elif t.data.nbytes != t.nbytes:
                c.problems.append(f"has {t.data.nbytes} bytes, its shape and type need {t.nbytes}")
            off = int(t.data.__array_interface__["data"][0]) if t.data.size else 0
            spans.append((off, off + int(t.data.nbytes), t.name))
            if not c.problems and t.type in TRAITS:
                vals = dequantize(t.data, t.type)
                bad = vals.size - int(np.count_nonzero(np.isfinite(vals)))
                if bad:
                    c.problems.append(f"{bad} value(s) decode to NaN/Inf (a block scale or value is not finite)")
                del vals
            elif not c.problems:
                c.problems.append(f"type {t.type.name} cannot be checked by quantkit")
            checks.append(c)
            if bar:
                bar.update(1)
            pause_point("verify.tensor")
        if bar:
            bar.close()
        m.check_unchanged()     # a file changed under the map: the report would describe neither version
        spans.sort()
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1 and a1 > a0 and b1 > b0:
                for c in checks:
                    if c.name == bn:
                        c.problems.append(f"data overlaps tensor {an}")
        meta = metadata_problems(m)
    return VerifyReport(str(path), checks, meta)


def metadata_problems(m: GGUFModel) -> list[str]:
    out = []
    arch = m.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return ["general.architecture is missing"]
    layers = {int(mm.group(1)) for t in m.tensors if (mm := _LAYER_RX.match(t.name))}
    n_block = m.metadata.get(f"{arch}.block_count")
    if layers:
        if not isinstance(n_block, int):
            out.append(f"{arch}.block_count is missing or not an integer")
        elif n_block != max(layers) + 1:
            out.append(f"{arch}.block_count is {n_block}, but tensors exist for layers 0..{max(layers)}")
    n_embd = m.metadata.get(f"{arch}.embedding_length")
    if m.has_tensor("token_embd.weight") and isinstance(n_embd, int):
        ne0 = m.tensor("token_embd.weight").shape[0]
        if ne0 != n_embd:
            out.append(f"{arch}.embedding_length is {n_embd}, token_embd.weight rows have {ne0}")
    qv = m.metadata.get("general.quantization_version")
    if any(t.type.name not in ("F32", "F16", "BF16") for t in m.tensors) and qv is None:
        out.append("quantized tensors but no general.quantization_version")
    return out
