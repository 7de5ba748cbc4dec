"""Survive a memory-mapped input that shrinks under us (a download still finishing, a sync tool).

Reading a page of a mapping past the file's new end raises SIGBUS (``si_code`` BUS_ADRERR), which
kills a Python process without a word: Python's own signal handlers only set a flag, and the faulting
instruction would fault again forever. ``install()`` puts a small compiled handler in front: it maps
a page of zeros over the faulting page and returns, so the read completes (with zeros) and Python
runs on to its next ``GGUFModel.check_unchanged()``, which sees the new size and stops the run with
one line before anything made from that data is committed. Any other SIGBUS is left fatal: the
handler restores the default action and the fault repeats.

The handler is a numba ``cfunc`` (cached) calling libc's ``mmap`` and ``signal``. Loading it costs
~4 ms of CPU once numba has loaded any compiled kernel (the first cached load in a process pays
numba's one-time ~0.3 s set-up, whichever function it is); the long jobs over big inputs (quantize,
imatrix, perplexity, verify) install it. 64-bit little-endian Linux with glibc (the ``siginfo_t`` and
``struct sigaction`` layouts below).
"""

from __future__ import annotations

import ctypes
import mmap as _mmap
import signal
import sys

from numba import cfunc, types
from numba.core.typing import signature

_installed = False
_SA_SIGINFO = 4
_BUS_ADRERR = 2


class _SigAction(ctypes.Structure):        # glibc's struct sigaction
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


_i64, _i32 = types.int64, types.int32
_mmap_fn = types.ExternalFunction("mmap", signature(_i64, _i64, types.uint64, _i32, _i32, _i32, _i64))
_signal_fn = types.ExternalFunction("signal", signature(_i64, _i32, _i64))
_PAGE = _mmap.PAGESIZE


@cfunc(types.void(_i32, types.CPointer(_i64), types.voidptr), cache=True)
def _handler(sig, info, ctx):  # pragma: no cover - runs inside the signal
    # siginfo_t: int si_signo, si_errno, si_code; then (64-bit aligned) void *si_addr
    if (info[1] & 0xFFFFFFFF) != _BUS_ADRERR:
        _signal_fn(sig, 0)                              # SIG_DFL: the fault repeats and is fatal
        return
    start = info[2] & ~(_PAGE - 1)
    # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_FIXED|MAP_ANONYMOUS: zeros where the file ended
    _mmap_fn(start, _PAGE, 3, 0x32, -1, 0)


def install() -> None:
    """Install the handler once per process (a no-op off Linux, or when it cannot be built)."""
    global _installed
    if _installed or not sys.platform.startswith("linux"):
        return
    _installed = True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        sa = _SigAction()
        sa.handler = _handler.address
        sa.flags = _SA_SIGINFO
        libc.sigaction(int(signal.SIGBUS), ctypes.byref(sa), None)
    except Exception:  # no handler: a truncated input stays fatal, as before
        pass
