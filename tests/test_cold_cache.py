"""A run whose kernels were just compiled and a run that loads them from numba's cache give the same
bytes.

numba caches object code: a caller compiled in the same process as a fresh fastmath callee can inline
it and vectorize a float sum that a caller compiled against the cached callee only calls, so the last
bits of a result depended on which kernels happened to be cached (found with imatrix: byte 4405 of a
tiny model's file). Each run here gets an empty cache of its own first, then a warm one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from archmodels import write_model  # noqa: E402


def _imatrix(model: Path, out: Path, cache: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    res = subprocess.run([sys.executable, "-m", "quantkit", "imatrix", "-m", str(model), "-c", "64", "--chunks", "6",
                          "-ofreq", "4", "-q", "-o", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_imatrix_cold_and_cached_kernels_write_the_same_file(tmp_path):
    model = write_model(tmp_path / "tiny-qwen3-f16.gguf", "qwen3", "F16")
    cache = tmp_path / "numba-cache"
    _imatrix(model, tmp_path / "cold.gguf", cache)   # compiles everything, fills the cache
    _imatrix(model, tmp_path / "warm.gguf", cache)   # loads everything
    assert (tmp_path / "cold.gguf").read_bytes() == (tmp_path / "warm.gguf").read_bytes()
