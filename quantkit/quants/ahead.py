"""Compile a run's codec kernels ahead, in a second process, while this one starts on the first.

numba compiles one kernel at a time in a process (its compiler lock), and a first quantize to Q4_K_M
compiles four codecs in a row (Q4_K, Q6_K and, for rows that are not whole 256-blocks, the Q5_0 and
Q8_0 fallbacks): ~14 s of one core on a machine that has two. ``start(types)`` hands the codecs not yet
in the kernel cache to a helper process (``python -m quantkit.quants.ahead Q6_K Q4_K ...``) that
compiles them into the same cache, last needed first, while this process compiles from the first
needed on. Where both reach one kernel, ``jit``'s per-kernel lock makes the second wait and load what
the first saved, so nothing is compiled twice. The helper only fills the cache: its results are read
the way any cached kernel is, and it is stopped when the run ends (a kernel it had not finished is
then compiled by whoever needs it next, as without it).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import get_threads


def _rows_kernel(t: T):
    """The compiled row-range kernel behind ``traits(t).quantize_rows`` (None when it has none)."""
    from quantkit.quants import traits

    return getattr(traits(t).quantize_rows, "kernel", None)


def cached(t: T) -> bool:
    """Whether ``t``'s quantize kernel is in the kernel cache (numba's index file for it exists)."""
    kernel = _rows_kernel(t)
    cache_file = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
    path = getattr(cache_file, "_index_path", None)
    return path is not None and os.path.exists(path)


def start(types) -> subprocess.Popen | None:
    """A helper process compiling the quantize kernels of ``types`` (in the order this run first needs
    them) that the cache lacks, from the last; None when fewer than two are missing or there is one
    thread (nothing to gain). The caller ``stop``s it at the end."""
    missing = [t for t in dict.fromkeys(types) if not cached(t)]
    if len(missing) < 2 or get_threads() < 2:
        return None
    env = dict(os.environ, NUMBA_NUM_THREADS="1")  # compiling only
    try:
        return subprocess.Popen([sys.executable, "-m", "quantkit.quants.ahead", *(t.name for t in reversed(missing))],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)
    except OSError:
        return None


def stop(proc: subprocess.Popen | None) -> None:
    """End the helper if it is still compiling (what it saved stays in the cache)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def compile_quantize(t: T) -> None:
    """Build ``t``'s quantize kernel for the argument types the quantize pipeline passes (float32 rows,
    uint8 output rows, read-only float32 weights) by running it on one row."""
    from quantkit.jit import frozen
    from quantkit.quants import traits

    cls = traits(t)
    n = 256  # a whole block of every type (blocks are 32 or 256 values)
    x = np.zeros((1, n), np.float32)
    y = np.zeros((1, cls.row_bytes(n)), np.uint8)
    cls.quantize_rows(x, y, frozen(np.zeros(0, np.float32)))


def main(names: list[str]) -> int:
    for name in names:
        compile_quantize(T[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
