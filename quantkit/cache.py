"""Where numba's compiled kernels are kept, one place for every way quantkit runs.

numba caches a kernel's machine code in ``NUMBA_CACHE_DIR`` when that is set, and otherwise in a
``__pycache__`` beside the source file, which differs between a checkout, an editable install and a
wheel, and between ``make`` (which used to set the variable) and a command typed by hand. So quantkit
chooses the folder itself where the variable is unset: the user's cache directory (platformdirs:
``~/.cache/quantkit`` on Linux, ``~/Library/Caches/quantkit`` on macOS, ``%LOCALAPPDATA%`` on
Windows), one folder per quantkit version and CPU level, e.g. ``~/.cache/quantkit/0.1.0/avx2``.
A set ``NUMBA_CACHE_DIR`` still wins (the test suite's cold-cache test uses its own).

``configure()`` must run before numba is imported, since numba reads its environment then:
``quantkit.jit`` calls it first thing. It also holds LLVM to a forced CPU level
(``QUANTKIT_KERNELS``, quantkit/isa.py) through ``NUMBA_CPU_FEATURES``.

``quantkit cache`` shows the folder and its size, and ``--clear`` empties it.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from quantkit import __version__, isa


def user_root() -> Path:
    """The per-user folder that holds every version's kernels."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("quantkit", appauthor=False))


def default_dir() -> Path:
    """quantkit's own choice: the user's cache, this version, the CPU level in force."""
    return user_root() / __version__ / isa.selected()


def directory() -> Path:
    """The folder in force: ``NUMBA_CACHE_DIR`` when set, else ``default_dir()``."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    return Path(env) if env else default_dir()


def configure() -> None:
    """Point numba at ``directory()`` and, for a forced CPU level, at that level's features. Before
    numba is imported this sets its environment; after (a program that imported numba first), its
    config too, which numba reads when a kernel is first declared or compiled."""
    features = isa.numba_cpu_features()
    if features is not None:
        os.environ.setdefault("NUMBA_CPU_FEATURES", features)
    os.environ.setdefault("NUMBA_CACHE_DIR", str(default_dir()))
    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:
        numba_config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
        if features is not None:
            numba_config.CPU_FEATURES = os.environ["NUMBA_CPU_FEATURES"]


@dataclass(frozen=True)
class Usage:
    path: Path
    files: int
    bytes: int


def usage(path: Path | None = None) -> Usage:
    """How many files and bytes a cache folder holds (0 when it does not exist)."""
    path = path or directory()
    files = size = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                size += os.path.getsize(os.path.join(root, n))
                files += 1
            except OSError:
                pass
    return Usage(path, files, size)


def clear(path: Path | None = None) -> Usage:
    """Remove a cache folder and everything in it; returns what it held."""
    path = path or directory()
    held = usage(path)
    shutil.rmtree(path, ignore_errors=True)
    return held
