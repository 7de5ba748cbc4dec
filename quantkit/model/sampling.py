"""llama.cpp's default sampler chain (common/sampling.cpp), with its defaults.

Order, as llama.cpp's ``common_params_sampling.samplers`` with the stages quantkit does not have left
out (DRY, top-n-sigma, typical-p and XTC, all off by default):

    penalties -> top_k -> top_p -> min_p -> temperature -> dist (draw with the seeded RNG)

* penalties: each distinct token of the last ``repeat_last_n`` has its logit divided by
  ``repeat_penalty`` when positive, multiplied when negative (1.0 = off, the default).
* top_k: keep the k highest (k <= 0: keep all).
* top_p: softmax over what is left, keep the smallest top set whose probability reaches p
  (at least one token; p >= 1: off).
* min_p: keep tokens with probability >= min_p x the top probability, i.e. logit >= max + ln(min_p)
  (min_p <= 0: off).
* temperature: logits / temp. ``temp == 0`` is greedy: the argmax, no randomness (llama.cpp keeps only
  the top token and its dist then has one choice).

Note that the cut-offs see the logits *before* temperature, as in llama.cpp. The draw uses numpy's
PCG64 instead of llama.cpp's mt19937, so the same seed does not give llama.cpp's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantkit.errors import ModelError


@dataclass(frozen=True)
class SamplerParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None        # None: a random seed (llama.cpp's LLAMA_DEFAULT_SEED)

    def validate(self) -> "SamplerParams":
        if not np.isfinite(self.temp) or self.temp < 0:
            raise ModelError(f"temperature must be >= 0 (0 = greedy), got {self.temp}")
        if not (0.0 < self.top_p <= 1.0):
            raise ModelError(f"top-p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ModelError(f"min-p must be in [0, 1], got {self.min_p}")
        if self.top_k < 0:
            raise ModelError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not np.isfinite(self.repeat_penalty) or self.repeat_penalty <= 0:
            raise ModelError(f"repeat penalty must be > 0 (1 = off), got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ModelError(f"repeat-last-n must be >= -1 (-1 = whole context, 0 = off), got {self.repeat_last_n}")
        if self.seed is not None and not (0 <= self.seed < 2**64):
            raise ModelError(f"seed must be in [0, 2^64), got {self.seed}")
        return self


class Sampler:
    """Picks the next token from a row of logits; remembers what it picked for the penalties."""

    def __init__(self, params: SamplerParams | None = None, n_ctx: int = 0):
        self.params = (params or SamplerParams()).validate()
        self.seed = self.params.seed if self.params.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
        self.rng = np.random.default_rng(self.seed)
        last_n = self.params.repeat_last_n
        self.last_n = n_ctx if last_n == -1 else last_n
        self.history: list[int] = []

    @property
    def greedy(self) -> bool:
        return self.params.temp == 0

    def accept(self, token: int) -> None:
        """Record a token (prompt or generated) for the repetition penalty."""
        self.history.append(int(token))

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if p.repeat_penalty != 1.0 and self.last_n > 0 and self.history:
            logits = logits.copy()
            recent = np.unique(np.asarray(self.history[-self.last_n:], dtype=np.int64))
            v = logits[recent]
            logits[recent] = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
        if self.greedy:
            return int(np.argmax(logits))
        ids, vals = self._filter(logits)
        z = vals.astype(np.float64) / p.temp
        prob = np.exp(z - z.max())
        prob /= prob.sum()
        return int(ids[self.rng.choice(ids.size, p=prob)])

    def _filter(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """top_k, top_p, min_p: the surviving ids and logits, sorted by logit, highest first."""
        p = self.params
        n = logits.size
        k = n if p.top_k <= 0 else min(p.top_k, n)
        if k < n:
            ids = np.argpartition(-logits, k - 1)[:k]
        else:
            ids = np.arange(n)
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        vals = logits[ids]
        if p.top_p < 1.0:
            prob = np.exp(vals.astype(np.float64) - vals[0])
            prob /= prob.sum()
            cum = np.cumsum(prob)
            keep = int(np.searchsorted(cum, p.top_p) + 1)      # first index with cum >= p, inclusive
            ids, vals = ids[:keep], vals[:keep]
        if p.min_p > 0.0:
            keep = max(1, int(np.count_nonzero(vals >= vals[0] + np.log(p.min_p))))
            ids, vals = ids[:keep], vals[:keep]
        return ids, vals
