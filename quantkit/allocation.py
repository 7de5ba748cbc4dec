"""Choosing a type per tensor under a size budget: the ``--target-bpw`` allocator as a pure function.

No I/O and no numba here (like ``quantkit.policy``): the inputs are, per tensor, its candidate types
with their exact byte size and an expected loss, and a byte budget; the output is one type per tensor.
The losses come from ``quantkit.pipelines.target_bpw`` (importance-weighted squared error of each
candidate, scaled by a measured sensitivity, see docs/quantize.md "Choosing the mix"); this module only
assumes that losses add up over tensors.

The problem is a multiple-choice knapsack: minimize ``sum(loss[t][choice[t]])`` subject to
``sum(bytes[t][choice[t]]) <= budget``. The solver:

1. per tensor, drops dominated candidates (no smaller loss for more bytes) and keeps the lower convex
   hull of (bytes, loss): those are the choices a Lagrangian ``loss + lambda * bytes`` can pick;
2. starts every tensor at its smallest candidate and takes hull upgrades in order of loss saved per
   byte, globally (the marginal-gain-per-bit rule; along a convex hull the steps of one tensor come in
   order, so this walks the Lagrangian path lambda = inf -> 0) until the next one no longer fits;
3. spends what is left on the single best remaining change of any tensor (any candidate, hull or
   not) that still fits, repeatedly.

Ties break on the tensor's position, then on the type's name, so the result is deterministic.

Vocabulary: ``BPW`` is ``8 * bytes / elements`` over every tensor of the file, quantized or not, as
llama-quantize's summary line computes it; ``parse_size`` reads ``4.2GiB``-style sizes.
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from quantkit.errors import QuantkitError


class AllocationError(QuantkitError, ValueError):
    """The budget cannot be met, or the request is malformed."""


@dataclass(frozen=True)
class Candidate:
    qtype: GGMLQuantizationType
    nbytes: int
    loss: float


@dataclass(frozen=True)
class Item:
    """One tensor to allocate. A fixed tensor has exactly one candidate."""

    name: str
    n_elements: int
    candidates: tuple[Candidate, ...]


@dataclass
class Allocation:
    choice: dict[str, Candidate]
    budget: int
    n_elements: int
    #: the Lagrange multiplier of the last hull upgrade taken (loss saved per byte)
    slope: float = math.inf
    steps: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.choice.values())

    @property
    def loss(self) -> float:
        return sum(c.loss for c in self.choice.values())

    @property
    def bpw(self) -> float:
        return 8.0 * self.nbytes / max(1, self.n_elements)

    def types(self) -> dict[str, GGMLQuantizationType]:
        return {name: c.qtype for name, c in self.choice.items()}


# -- sizes ---------------------------------------------------------------------------------------

def allowed_types(ne0: int, types: Iterable[GGMLQuantizationType]) -> list[GGMLQuantizationType]:
    """The types among ``types`` whose block divides a row of ``ne0`` values."""
    return [t for t in types if ne0 % GGML_QUANT_SIZES[t][0] == 0]


_SIZE_RX = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}


def parse_size(text: str) -> int:
    """``4.2GiB`` -> bytes (binary units with ``i``, decimal without; ``B`` optional; bare = bytes)."""
    m = _SIZE_RX.match(str(text))
    if not m:
        raise AllocationError(f"bad size {text!r}: expected a number with an optional unit, e.g. 4.2GiB or 800MB")
    unit = (m.group(2) or "").upper()
    if unit.endswith("B"):
        unit = unit[:-1]
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise AllocationError(f"bad size {text!r}: must be positive")
    return int(value)


def budget_for_bpw(target_bpw: float, n_elements: int) -> int:
    """The largest byte count whose BPW (8 * bytes / elements) is at most ``target_bpw``."""
    if not (target_bpw > 0 and math.isfinite(target_bpw)):
        raise AllocationError(f"target BPW must be a positive number, got {target_bpw}")
    return int(math.floor(target_bpw * n_elements / 8.0 + 1e-9))


# -- the solver ----------------------------------------------------------------------------------

def _frontier(cands: Sequence[Candidate]) -> list[Candidate]:
    """Candidates sorted by bytes with the dominated ones dropped (loss strictly falls with bytes)."""
    best: dict[int, Candidate] = {}
    for c in sorted(cands, key=lambda c: (c.nbytes, c.loss, c.qtype.name)):
        if c.nbytes not in best:
            best[c.nbytes] = c
    out: list[Candidate] = []
    for c in (best[b] for b in sorted(best)):
        if not out or c.loss < out[-1].loss:
            out.append(c)
    return out


def _hull(front: list[Candidate]) -> list[Candidate]:
    """The lower convex hull of a frontier (bytes increasing, loss decreasing)."""
    hull: list[Candidate] = []
    for c in front:
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or above the segment a-c: drop it
            if (b.loss - a.loss) * (c.nbytes - a.nbytes) >= (c.loss - a.loss) * (b.nbytes - a.nbytes):
                hull.pop()
            else:
                break
        hull.append(c)
    return hull


def allocate(items: Sequence[Item], budget: int, n_elements: int | None = None) -> Allocation:
    """The choice of one candidate per item minimizing the summed loss within ``budget`` bytes.

    ``n_elements`` (for the BPW figure) defaults to the items' own element count; pass the file's
    total when tensors outside ``items`` (copied ones) count too, and include their bytes as fixed
    items or subtract them from ``budget``.
    """
    names = [it.name for it in items]
    if len(set(names)) != len(names):
        raise AllocationError("duplicate tensor name in the allocation")
    for it in items:
        if not it.candidates:
            raise AllocationError(f"tensor {it.name}: no candidate type")
        for c in it.candidates:
            if c.nbytes < 0 or not math.isfinite(c.loss) or c.loss < 0:
                raise AllocationError(f"tensor {it.name}: bad candidate {c.qtype.name} "
                                      f"({c.nbytes} bytes, loss {c.loss})")
    total = sum(it.n_elements for it in items) if n_elements is None else n_elements
    fronts = [_frontier(it.candidates) for it in items]
    hulls = [_hull(f) for f in fronts]
    state = [0] * len(items)  # index into hulls[i]
    used = sum(h[0].nbytes for h in hulls)
    if used > budget:
        raise AllocationError(
            f"the target is too small: the smallest types allowed give {used} bytes "
            f"({8.0 * used / max(1, total):.4f} BPW), over the budget of {budget} bytes "
            f"({8.0 * budget / max(1, total):.4f} BPW)")

    def step(i: int):
        h, k = hulls[i], state[i]
        if k + 1 >= len(h):
            return None
        db = h[k + 1].nbytes - h[k].nbytes
        dl = h[k].loss - h[k + 1].loss
        return (-(dl / db), i, db)

    heap = [s for i in range(len(items)) if (s := step(i)) is not None]
    heapq.heapify(heap)
    slope = math.inf
    while heap:
        neg, i, db = heapq.heappop(heap)
        if used + db > budget:
            continue  # this tensor's hull stops here; the fill pass below may still move it
        used += db
        state[i] += 1
        slope = -neg
        s = step(i)
        if s is not None:
            heapq.heappush(heap, s)
    choice = [hulls[i][state[i]] for i in range(len(items))]

    # fill: the best single change per byte that still fits, until none helps
    order = {t: n for n, t in enumerate(sorted({c.qtype.name for f in fronts for c in f}))}
    while True:
        best = None
        for i, front in enumerate(fronts):
            cur = choice[i]
            for c in front:
                db = c.nbytes - cur.nbytes
                dl = cur.loss - c.loss
                if dl <= 0 or used + db > budget:
                    continue
                key = (dl / db if db > 0 else math.inf, dl, -i, -order[c.qtype.name])
                if best is None or key > best[0]:
                    best = (key, i, c, db)
        if best is None:
            break
        _, i, c, db = best
        choice[i] = c
        used += db
    return Allocation({items[i].name: choice[i] for i in range(len(items))}, budget, total, slope)

