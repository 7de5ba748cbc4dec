"""llama-imatrix's ``--show-statistics`` (tools/imatrix/imatrix.cpp's ``compute_statistics`` and
``show_statistics``): the per-tensor table and the per-layer weighted means of one imatrix file."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from quantkit.formats.imatrix import Imatrix
from quantkit.pipelines.imatrix import Accumulator, ImatrixError


def _split_name(name: str) -> tuple[str, str]:
    """llama.cpp's process_tensor_name: (layer, short tensor name)."""
    parts = name.split(".")
    layer = ""
    tensor = ""
    for i, p in enumerate(parts):
        if p == "blk" and i + 1 < len(parts):
            layer = parts[i + 1]
            break
    for i, p in enumerate(parts):
        if p == "weight" and i > 0:
            tensor = parts[i - 1]
            break
    return (layer or "-"), (tensor or name)


def _f32sum(a: np.ndarray) -> np.float32:
    """std::accumulate(..., 0.0f): a sequential float32 sum."""
    return np.cumsum(a, dtype=np.float32)[-1] if a.size else np.float32(0)


@dataclass
class TensorStats:
    name: str
    values: np.ndarray      # raw sums, flattened (for CosSim)
    total: float
    mean: float
    max: float
    min: float
    n: int
    std: float
    active: float
    entropy: float
    zd: float
    cossim: float = 0.0


def tensor_stats(name: str, sums: np.ndarray, counts: np.ndarray) -> TensorStats | None:
    """llama-imatrix's compute_statistics on one entry (None when every count is 0)."""
    sums = sums.reshape(counts.size, -1).astype(np.float32)
    acts = [sums[i] / np.float32(counts[i]) for i in range(counts.size) if counts[i] != 0]
    if not acts:
        return None
    a = np.concatenate(acts).astype(np.float32)
    total = _f32sum(a)
    mean = np.float32(total / np.float32(a.size))
    sq = _f32sum(a * a)
    var = np.float32(sq / np.float32(a.size)) - mean * mean
    dev = np.float32(math.sqrt(max(0.0, float(var))))
    active = 1.0 - float((np.abs(a) <= np.float32(1e-5)).sum()) / a.size
    entropy = 0.0
    if total > 0:
        p = a / total
        p = p[p > 0]
        entropy = float(-(p * np.log2(p)).sum())
    zd = float(((a - mean) / dev > 1).sum()) / a.size if dev > 0 else 0.0
    return TensorStats(name, sums.reshape(-1), float(total), float(mean), float(a.max()), float(a.min()), int(a.size),
                       float(dev), active, entropy, zd)


def statistics(im: Imatrix, chunk_size: int = 512) -> list[str]:
    """``--show-statistics``: the per-tensor table and the per-layer weighted means (tools/imatrix/imatrix.cpp's ``show_statistics``)."""
    acc = Accumulator(chunk_size)
    acc.add_file(im)
    ts = [t for t in (tensor_stats(n, acc.sums[n], acc.counts[n]) for n in acc.sums) if t is not None]
    if not ts:
        raise ImatrixError(f"{im.source}: cannot compute statistics (no entry has data)")
    by_name = {t.name: t for t in ts}
    pat = re.compile(r"blk\.(\d+)\.")
    for t in ts:
        m = pat.search(t.name)
        if not m:
            continue
        prev = by_name.get(t.name[:m.start(1)] + str(int(m.group(1)) - 1) + t.name[m.end(1):])
        if prev is not None and prev.values.size == t.values.size:
            a, b = t.values.astype(np.float64), prev.values.astype(np.float64)
            den = math.sqrt(float(a @ a)) * math.sqrt(float(b @ b))
            t.cossim = float(a @ b) / den if den > 0 else float("nan")
    ts.sort(key=lambda t: (_split_name(t.name)[1], -t.total))
    lines = [f"Computing statistics for {im.source} ({len(ts)} tensors)", "",
             "\t".join([" Layer", "       Tensor", "          Σ(Act²)", "  Min", "            Max", "           μ",
                        "   σ", " % Active", "N", "   Entropy", "E (norm)", "ZD", "  CosSim"]),
             "=" * 169]
    ws: dict[int, list[float]] = {}
    for t in ts:
        layer, short = _split_name(t.name)
        try:
            blk = int(layer)
        except ValueError:
            blk = -1
        enorm = 100.0 * (t.entropy / math.log2(t.n)) if t.n > 1 else 0.0
        lines.append("%5s\t%-20s\t%10.2f\t%8.4f\t%11.4f\t%6.2f\t%6.2f\t%8.2f%%\t%6d\t%10.4f\t%6.2f%%\t%10.2f%%\t%8.4f"
                     % (layer, short, t.total, t.min, t.max, t.mean, t.std, t.active * 100.0, t.n, t.entropy,
                        enorm, 100.0 * t.zd, t.cossim))
        w = ws.setdefault(blk, [0.0, 0.0, 0.0, 0])
        w[0] += t.n * t.total
        w[1] += t.n * t.zd
        w[2] += t.n * t.cossim
        w[3] += t.n
    layers = sorted(k for k in ws if k >= 0)
    lines += ["", f"Computing weighted average statistics per layer ({len(layers)} layers)", "",
              "\t".join(["  Layer", "     μΣ(Act²)", "      μZD", "μCosSim"]), "=" * 48]
    for k in layers:
        w = ws[k]
        if w[3]:
            lines.append("%5d\t%14.2f\t%10.4f%%\t%6.4f" % (k, w[0] / w[3], 100.0 * w[1] / w[3], w[2] / w[3]))
    return lines
