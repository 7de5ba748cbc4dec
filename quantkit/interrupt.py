"""Ctrl-C and SIGTERM as an exception that unwinds the stack, delivered even where C code drops it.

The command line installs ``on_signal`` for SIGINT and SIGTERM: the first signal raises ``Interrupted``
(a ``KeyboardInterrupt``), whose unwinding runs every ``finally`` and removes every temporary file;
signals that arrive while it unwinds are ignored, so that cleanup is not itself cut short.

Python runs a signal handler between two bytecodes of the main thread, which can be inside Python code
that C code called and whose exception it then discards: a ctypes callback (reported as "Exception
ignored", and the C code goes on), or C APIs that clear any error. The signal would be lost, and the
job would run to its end with exit code 0. Two rules keep it:

* the callbacks known to be reached this way (``CALLBACKS``: llvmlite's object-cache hooks, which LLVM
  calls while numba compiles) are not interrupted at all: the signal is sent again a moment later,
  once the callback has returned, since numba fails on the object such a callback never delivered;
* any other ``Interrupted`` freed before something handled it sends its signal again the same way.

Code that catches it and stops on purpose (``generate`` returning what it has so far, the command
line's exit) calls ``handled`` first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []        # the first signal of the process, for the exit code and the note
_unwinding = False               # an Interrupted is on its way up the stack


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, unwinding the stack like Ctrl-C so every temporary file is removed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.handled = False

    def __del__(self):
        global _unwinding
        if not self.handled:         # dropped on the way up (see the module docstring): raise it again
            _unwinding = False
            _send_again(self.signum)


def handled(exc: BaseException) -> None:
    """Mark a caught interrupt as acted on, so dropping it does not deliver it again."""
    if isinstance(exc, Interrupted):
        exc.handled = True


def received() -> int | None:
    """The first signal this process got through ``on_signal``, or None."""
    return _received[0] if _received else None


#: Python functions that C calls back and whose exception it drops, leaving its own work undone:
#: llvmlite's object-cache hooks, which LLVM calls while numba compiles (an exception raised there is
#: reported as "Exception ignored", and numba then fails on the compiled object it never received).
#: A signal whose handler runs inside one of them is sent again a moment later.
CALLBACKS = {"_raw_object_cache_notify", "_raw_object_cache_getbuffer"}


def _send_again(signum: int) -> None:
    # from another thread, a moment later: sent from the main thread, the handler would run at its next
    # bytecode, still inside the code that drops the exception
    try:
        timer = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
    except RuntimeError:     # the interpreter is shutting down
        pass


def _inside_callback(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name in CALLBACKS:
            return True
        frame = frame.f_back
    return False


def on_signal(signum, frame):
    global _unwinding
    if _unwinding:
        return
    if _inside_callback(frame):
        _send_again(signum)
        return
    _unwinding = True
    if not _received:
        _received.append(signum)
    raise Interrupted(signum)


def _unraisable(hook):
    def quiet(unraisable):
        # an Interrupted dropped inside a callback is delivered again (Interrupted.__del__), so the
        # "Exception ignored" report with its traceback would only be noise
        if not isinstance(unraisable.exc_value, Interrupted):
            hook(unraisable)

    quiet.wraps = hook
    return quiet


def catch_signals() -> dict:
    """SIGTERM, and Ctrl-C unless the process started with it ignored (a background job), raise
    ``Interrupted``; returns the handlers replaced, for ``restore``."""
    global _unwinding
    _unwinding = False
    previous = {}
    try:
        for signum in SIGNALS:
            old = signal.getsignal(signum)
            if signum == signal.SIGINT and old is signal.SIG_IGN:
                continue
            signal.signal(signum, on_signal)
            previous[signum] = old
    except ValueError:  # not the main thread (e.g. under a test runner's thread)
        pass
    if previous and not hasattr(sys.unraisablehook, "wraps"):
        sys.unraisablehook = _unraisable(sys.unraisablehook)
    return previous


def restore(previous: dict) -> None:
    """Put back what ``catch_signals`` replaced (in-process callers, tests, get their handlers back)."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if previous and hasattr(sys.unraisablehook, "wraps"):
        sys.unraisablehook = sys.unraisablehook.wraps
