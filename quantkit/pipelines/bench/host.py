"""What bench asks of the host: the default thread count, CPU pinning (``-C/--cpu-mask``,
``--cpu-strict``), the peak resident memory, the CPU's name, and the time spent in numba's compiler.

Linux first (sched_setaffinity per thread, /proc/self/status, /proc/self/clear_refs, sysfs topology);
elsewhere each falls back as its docstring says."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from quantkit.errors import BenchError


# -- threads and pinning ----------------------------------------------------------------------------


def default_threads() -> int:
    """llama.cpp's ``common_cpu_get_num_math`` on Linux: one thread per physical core (distinct
    ``thread_siblings`` sets), else hardware threads (halved above 4)."""
    sib = set()
    cpu = 0
    while True:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings") as f:
                sib.add(f.read().strip())
        except OSError:
            break
        cpu += 1
    if sib:
        return len(sib)
    n = os.cpu_count() or 4
    return n if n <= 4 else n // 2


def parse_cpu_mask(s: str) -> set[int]:
    """ggml's ``parse_cpu_mask``: hex digits (optional ``0x``), bit i = CPU i; at most 128 digits."""
    body = s[2:] if s.startswith("0x") else s
    body = body[:128]
    if not body or any(c not in "0123456789abcdefABCDEF" for c in body):
        raise ValueError(f"invalid cpu mask {s!r} (expected hex digits, e.g. 0x3)")
    v = int(body, 16)
    return {i for i in range(v.bit_length()) if v >> i & 1}


_WORKER_TIDS = None


def _numba_worker_tids() -> list[int]:
    """The Linux thread ids of numba's workers 0..get_num_threads()-1 (worker 0 is the calling thread):
    a parallel loop in which every worker writes its ``gettid()`` at its ``numba.get_thread_id()``."""
    global _WORKER_TIDS
    import ctypes

    import numba

    from quantkit.jit import get_threads

    if _WORKER_TIDS is None:
        gettid = ctypes.CDLL(None).gettid
        gettid.restype, gettid.argtypes = ctypes.c_int, []

        @numba.njit(parallel=True, cache=False)     # a ctypes pointer cannot go into numba's cache
        def tids(out):
            for i in numba.prange(out.shape[0] * 256):
                out[numba.get_thread_id()] = gettid()

        _WORKER_TIDS = tids
    out = np.zeros(get_threads(), np.int64)
    _WORKER_TIDS(out)
    return [int(t) for t in out if t > 0]


class Affinity:
    """``-C/--cpu-mask`` and ``--cpu-strict`` for numba's OpenMP workers.

    Linux's ``sched_setaffinity`` acts on one thread, so every thread of the process (/proc/self/task) is
    set: with a mask and no strict, all get the mask; strict pins numba's worker k (the main thread is
    worker 0; ids from ``_numba_worker_tids``) to the k-th CPU of the mask, round-robin, like ggml's
    strict threadpool, and lets the other threads (OpenBLAS's) use the whole mask. Mask 0 restores the
    affinity the process started with. Applied before a test's priming pass and again before its warmup,
    so workers started by the first parallel call are covered too."""

    def __init__(self):
        self.supported = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")
        self.initial = set(os.sched_getaffinity(0)) if self.supported else set()
        self.current: tuple[str, bool] = ("0x0", False)

    @staticmethod
    def _tasks() -> list[int]:
        try:
            tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
        except OSError:
            return [0]
        pid = os.getpid()
        return [pid] + [t for t in tids if t != pid] if pid in tids else tids

    def apply(self, mask: str, strict: bool) -> None:
        cpus = parse_cpu_mask(mask)
        if not cpus and self.current == ("0x0", False):
            return
        if not self.supported:
            if cpus:
                raise BenchError(f"--cpu-mask {mask}: pinning threads is not supported on this OS "
                                 f"(Python has no os.sched_setaffinity here)")
            return
        if not cpus:
            usable = sorted(self.initial)
        else:
            usable = sorted(cpus & self.initial)
            if not usable:
                raise BenchError(f"--cpu-mask {mask}: none of CPUs {sorted(cpus)} is available to this process "
                                 f"(allowed: {sorted(self.initial)})")
        target = {tid: set(usable) for tid in self._tasks()}
        if cpus and strict:
            # numba's workers, identified by their thread ids, each on its own CPU (the caller is worker
            # 0); every other thread (OpenBLAS's pool, ...) may use the whole mask. Pinning by creation
            # order instead put OpenBLAS's thread on the second CPU and numba's second worker beside the
            # main thread: tg128 fell from ~175 to ~20 t/s on two cores.
            for k, tid in enumerate(_numba_worker_tids()):
                target[tid] = {usable[k % len(usable)]}
        for tid, cpu_set in target.items():
            try:
                os.sched_setaffinity(tid, cpu_set)
            except ProcessLookupError:  # the thread ended meanwhile
                continue
            except OSError as e:
                raise BenchError(f"--cpu-mask {mask}: sched_setaffinity refused ({e.strerror})") from None
        self.current = (mask, strict) if cpus else ("0x0", False)

    def restore(self) -> None:
        self.apply("0x0", False)


# -- the CPU's name ---------------------------------------------------------------------------------


def cpu_info() -> str:
    """The CPU's brand string, as ggml's CPU backend describes the device."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"


# -- memory -----------------------------------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) for this process; False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


# -- compile-time accounting -------------------------------------------------------------------------


class CompileClock:
    """Seconds spent inside numba's compiler lock (compiling, or loading cached machine code)."""

    def __init__(self):
        from numba.core import event

        self._event = event
        self.total = 0.0
        self._depth = 0
        self._t0 = 0.0
        self._listener = None

    def __enter__(self):
        ev, clock = self._event, self

        class _L(ev.Listener):
            def on_start(self, e):
                if clock._depth == 0:
                    clock._t0 = time.perf_counter()
                clock._depth += 1

            def on_end(self, e):
                clock._depth -= 1
                if clock._depth == 0:
                    clock.total += time.perf_counter() - clock._t0

        self._listener = _L()
        ev.register("numba:compiler_lock", self._listener)
        return self

    def __exit__(self, *exc):
        self._event.unregister("numba:compiler_lock", self._listener)
