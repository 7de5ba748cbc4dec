"""Codec round-trip over a model's weights: quantize every chosen tensor to each type and back.

The report says, per type, how many tensors fitted its block size, the bytes they take, bits per
weight, and the error against the source values (RMSE relative to the source RMS, and max |error|).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType

from quantkit.formats.gguf_io import GGUFModel
from quantkit.quants import TRAITS, dequantize, quantize, traits


@dataclass
class TypeReport:
    qtype: GGMLQuantizationType
    tensors: int = 0
    skipped: int = 0
    elements: int = 0
    nbytes: int = 0
    sq_err: float = 0.0
    sq_ref: float = 0.0
    max_err: float = 0.0
    names_skipped: list[str] = field(default_factory=list)

    @property
    def bpw(self) -> float:
        return 8.0 * self.nbytes / self.elements if self.elements else float("nan")

    @property
    def rel_rmse(self) -> float:
        return float(np.sqrt(self.sq_err / self.sq_ref)) if self.sq_ref else float("nan")


DEFAULT_TYPES = ("F16", "BF16", "Q8_0", "Q6_K", "Q5_1", "Q5_K", "Q5_0", "Q4_K", "Q4_1", "Q4_0",
                 "IQ4_NL", "IQ4_XS", "Q3_K", "Q2_K")


def _row_slices(rows: np.ndarray, values: int = 1 << 20):
    step = max(1, values // max(1, rows.shape[1]))
    return (rows[i:i + step] for i in range(0, rows.shape[0], step))


def roundtrip(path, types=DEFAULT_TYPES, pattern: str = r"^blk\.0\.", progress=None) -> list[TypeReport]:
    rx = re.compile(pattern)
    qtypes = [traits(t).qtype for t in types if t in {q.name for q in TRAITS} or isinstance(t, GGMLQuantizationType)]
    reports = {q: TypeReport(q) for q in qtypes}
    with GGUFModel(path) as model:
        chosen = [t for t in model.tensors if len(t.shape) >= 2 and rx.search(t.name)]
        jobs = [(t, q) for t in chosen for q in qtypes]
        bar = progress(total=len(jobs), unit="tensor") if progress else None
        for t in chosen:
            src = dequantize(t.data, t.type).reshape(-1, t.n_per_row)
            for q in qtypes:
                r = reports[q]
                tr = traits(q)
                if t.n_per_row % tr.block_size:
                    r.skipped += 1
                    r.names_skipped.append(t.name)
                else:
                    r.tensors += 1
                    # ~1M values per call: Ctrl-C is handled between calls (a whole big tensor is
                    # seconds of compiled code the signal would wait for)
                    for s in _row_slices(src):
                        b = quantize(s, q)
                        d = (dequantize(b, q).astype(np.float64) - s)
                        r.elements += s.size
                        r.nbytes += b.nbytes
                        r.sq_err += float(np.dot(d.ravel(), d.ravel()))
                        r.sq_ref += float(np.dot(s.ravel().astype(np.float64), s.ravel()))
                        r.max_err = max(r.max_err, float(np.abs(d).max()))
                if bar:
                    bar.update(1)
        if bar:
            bar.close()
    return [reports[q] for q in qtypes]
