"""Every ``QUANTKIT_*`` environment switch: read here and nowhere else.

Each switch has one row in ``SWITCHES`` (its value when unset, when it is read, what it means: the rows
docs/DEVELOPING.md's table shows) and one function below that reads it, taking the unset value from the
row (tests/test_config.py checks that the table, this list and the names used anywhere in the package
agree, and that no other module reads one). A switch marked "import" is read when its module is first
imported (the kernels built from it are named after it), so set it before starting the process; the
others are read each time they are asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    name: str
    value: str      # what an unset variable means (the readers below take it from here)
    read: str       # "import" or "call": when the value is read
    meaning: str
    shown: str = ""  # the docs' default column where the value alone would mislead

    @property
    def default(self) -> str:
        """The docs' default column: ``shown``, else the value, else "(unset)"."""
        return self.shown or self.value or "(unset)"


SWITCHES = (
    Switch("QUANTKIT_KERNELS", "", "call",
           "force a CPU level the host can run: `avx512vnni`, `avxvnni`, `avx2`, `neon` or `generic` (set at "
           "process start, LLVM then emits nothing above it for any kernel), or `plain` (numba-only reference "
           "kernels); unset: the best level the CPU runs (quantkit/isa.py, docs/kernels.md)"),
    Switch("QUANTKIT_512", "0", "import",
           "1: 32-element blocks two at a time with a 512-bit vpdpbusd (slower on the machines measured)"),
    Switch("QUANTKIT_K512", "1", "import", "0: the K-quant super-block dots keep the 256-bit loop"),
    Switch("QUANTKIT_PREFETCH", "2048", "import",
           "software prefetch distance in bytes in the row dots; 0 turns it off"),
    Switch("QUANTKIT_GEMM", "1", "call",
           "0: batches run on dequantize + BLAS instead of the integer GEMM (quantized weights) and the float "
           "GEMM (F32 / F16 / BF16)"),
    Switch("QUANTKIT_X8_PREFETCH", "0", "import",
           "software prefetch distance in bytes in the 8-row interleaved (x8) decode dots; 0 turns it off"),
    Switch("QUANTKIT_X8", "1", "call",
           "0: the compiled decode step reads every matrix in the file's layout (no 8-row interleaved copy)"),
    Switch("QUANTKIT_COPY_WEIGHTS", "0", "call",
           "1: the compiled decode step gets its own huge-page copy of the weights when they fit in RAM"),
    Switch("QUANTKIT_COMPILE_NOTICE", "0", "call",
           "1: say on stderr when kernels are being compiled; 0 silences it", shown="0 (the command line sets 1)"),
    Switch("QUANTKIT_MODEL_DIR", "", "call",
           "where test models assembled from packages are kept (Gemma 3 270M)",
           shown="<python prefix>/share/quantkit"),
    Switch("QUANTKIT_PAUSE_AT", "", "import", "tests only: `<point>:<n>`, pause at the n-th pass of a "
           "pause point (quantkit/pause.py)"),
    Switch("QUANTKIT_PAUSE_FILE", "", "import", "tests only: the file a paused process creates and "
                                                       "waits on"),
)


_VALUE = {s.name: s.value for s in SWITCHES}


def _get(name: str) -> str:
    """The variable, or its row's value when unset (a name without a row is a KeyError: list it first)."""
    return os.environ.get(name, _VALUE[name])


def _on(name: str) -> bool:
    """Set to anything but empty or ``0``."""
    return _get(name) not in ("", "0")


# -- kernels -----------------------------------------------------------------------------------------

def kernels_level() -> str:
    """``QUANTKIT_KERNELS``, stripped and lower-cased ("" when unset)."""
    return _get("QUANTKIT_KERNELS").strip().lower()


def pairs_512() -> bool:
    return _on("QUANTKIT_512")


def k512() -> bool:
    return _on("QUANTKIT_K512")


def prefetch_distance() -> int:
    """Bytes ahead; an empty value means 0 (off)."""
    return int(_get("QUANTKIT_PREFETCH") or 0)


def x8_prefetch_distance() -> int:
    """Bytes ahead in the x8 loops (one stream carries 8 rows); an empty value means 0 (off)."""
    return int(_get("QUANTKIT_X8_PREFETCH") or 0)


def x8() -> bool:
    return _on("QUANTKIT_X8")


def integer_gemm() -> bool:
    return _on("QUANTKIT_GEMM")


def copy_weights() -> bool:
    return _on("QUANTKIT_COPY_WEIGHTS")


# -- the command line and the tests ------------------------------------------------------------------

def compile_notice() -> bool:
    """Off only when ``QUANTKIT_COMPILE_NOTICE`` is unset or ``0``."""
    return _get("QUANTKIT_COMPILE_NOTICE") != "0"


def default_compile_notice_on() -> None:
    """The command line's default: the notice on unless the environment says otherwise."""
    os.environ.setdefault("QUANTKIT_COMPILE_NOTICE", "1")


def model_dir() -> str:
    """``QUANTKIT_MODEL_DIR`` ("" when unset or empty)."""
    return _get("QUANTKIT_MODEL_DIR")


def pause_at() -> tuple[str, int]:
    """``QUANTKIT_PAUSE_AT=<point>:<n>`` as (point, n); ("", 1) when unset."""
    point, _, n = _get("QUANTKIT_PAUSE_AT").partition(":")
    return point, int(n or 1)


def pause_file() -> str:
    return _get("QUANTKIT_PAUSE_FILE")
