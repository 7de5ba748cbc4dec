"""The test matrix: llama-bench's parameters, the Cartesian product of its lists, and their checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import product

from quantkit.errors import BenchError
from quantkit.pipelines.bench.host import default_threads, parse_cpu_mask


@dataclass
class BenchParams:
    """Every list is a test dimension; defaults are llama-bench's."""

    models: list[str] = field(default_factory=list)
    n_prompt: list[int] = field(default_factory=lambda: [512])
    n_gen: list[int] = field(default_factory=lambda: [128])
    n_pg: list[tuple[int, int]] = field(default_factory=list)
    n_depth: list[int] = field(default_factory=lambda: [0])
    n_batch: list[int] = field(default_factory=lambda: [2048])
    n_ubatch: list[int] = field(default_factory=lambda: [512])
    n_threads: list[int] = field(default_factory=lambda: [default_threads()])
    cpu_mask: list[str] = field(default_factory=lambda: ["0x0"])
    cpu_strict: list[bool] = field(default_factory=lambda: [False])
    reps: int = 5
    no_warmup: bool = False
    progress: bool = False
    verbose: bool = False

    def non_default(self, name: str) -> bool:
        """llama-bench shows a md column when several values or a non-default value were given."""
        v = getattr(self, name)
        return len(v) > 1 or v != getattr(BenchParams(), name)


@dataclass(frozen=True)
class Instance:
    model: str
    n_prompt: int
    n_gen: int
    n_depth: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    cpu_mask: str
    cpu_strict: bool

    @property
    def n_ctx(self) -> int:
        return self.n_prompt + self.n_gen + self.n_depth

    @property
    def name(self) -> str:
        if self.n_prompt > 0 and self.n_gen == 0:
            s = f"pp{self.n_prompt}"
        elif self.n_gen > 0 and self.n_prompt == 0:
            s = f"tg{self.n_gen}"
        else:
            s = f"pp{self.n_prompt}+tg{self.n_gen}"
        return s + (f" @ d{self.n_depth}" if self.n_depth > 0 else "")


def instances(p: BenchParams) -> list[Instance]:
    """llama-bench's ``get_cmd_params_instances``: the loops nest model, n_batch, n_ubatch, threads,
    cpu_mask, cpu_strict, depth (the parameters quantkit varies), then pp, tg and pg tests."""
    out = []
    for m, nb, nub, nt, cm, cs, nd in product(p.models, p.n_batch, p.n_ubatch, p.n_threads, p.cpu_mask,
                                              p.cpu_strict, p.n_depth):
        base = dict(model=m, n_depth=nd, n_batch=nb, n_ubatch=nub, n_threads=nt, cpu_mask=cm, cpu_strict=cs)
        out += [Instance(n_prompt=n, n_gen=0, **base) for n in p.n_prompt if n != 0]
        out += [Instance(n_prompt=0, n_gen=n, **base) for n in p.n_gen if n != 0]
        out += [Instance(n_prompt=a, n_gen=b, **base) for a, b in p.n_pg if (a, b) != (0, 0)]
    return out


def validate(p: BenchParams) -> None:
    """Checks llama-bench leaves to crashes; raises BenchError with one line."""
    import numba

    top = numba.config.NUMBA_NUM_THREADS
    if p.reps < 1:
        raise BenchError(f"repetitions must be >= 1, got {p.reps}")
    for nt in p.n_threads:
        if nt < 1 or nt > top:
            raise BenchError(f"threads {nt} is outside 1..{top} (numba's NUMBA_NUM_THREADS; set that "
                             f"environment variable to allow more)")
    for name in ("n_batch", "n_ubatch"):
        for v in getattr(p, name):
            if v < 1:
                raise BenchError(f"{name} must be >= 1, got {v}")
    for cm in p.cpu_mask:
        try:
            parse_cpu_mask(cm)
        except ValueError as e:
            raise BenchError(str(e)) from None
    for m in p.models:
        if not os.path.isfile(m):
            raise BenchError(f"{m}: no such model file" if not os.path.exists(m) else f"{m}: not a file")
