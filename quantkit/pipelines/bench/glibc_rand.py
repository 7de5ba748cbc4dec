"""The C library's ``rand()``, so bench feeds the very token ids llama-bench feeds on glibc."""

from __future__ import annotations


class GlibcRand:
    """glibc's ``rand()`` (the TYPE_3 additive generator, r[i] = r[i-3] + r[i-31]) from ``srand(seed)``;
    llama-bench never seeds, so its sequence starts from seed 1."""

    def __init__(self, seed: int = 1):
        r = [0] * 34
        r[0] = seed & 0xFFFFFFFF or 1
        for i in range(1, 31):
            hi, lo = divmod(r[i - 1] if r[i - 1] < 2**31 else r[i - 1] - 2**32, 127773)
            word = 16807 * lo - 2836 * hi
            r[i] = (word + 2147483647 if word < 0 else word) & 0xFFFFFFFF
        for i in range(31, 34):
            r[i] = r[i - 31]
        self._r = r[-34:]
        for _ in range(310):
            self._next()

    def _next(self) -> int:
        r = self._r
        v = (r[-31] + r[-3]) & 0xFFFFFFFF
        r.append(v)
        del r[0]
        return v

    def __call__(self) -> int:
        return self._next() >> 1
