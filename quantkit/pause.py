"""Test-only pause points, so tests can act on a process provably in the middle of its work.

With ``QUANTKIT_PAUSE_AT=<point>:<n>`` and ``QUANTKIT_PAUSE_FILE=<path>`` in its environment, a
process that passes ``pause_point(<point>)`` for the n-th time creates ``<path>`` (holding its pid)
and waits until the file is removed (at most two minutes). A test then sends a signal (the sleep is
interrupted like any other work), or changes the world (fills the disk, truncates the input) and
removes the file to let the job go on. Every later pass of that point appends its number to
``<path>.after``: a test sees whether the job went past its next chunk or tensor after the pause (a job
stopped by a signal sent during the pause never does). Only this module uses them (read through
quantkit.config); without them a pause point costs one comparison.
"""

from __future__ import annotations

import os
import time

from quantkit import config

_POINT, _N = config.pause_at()
_FILE = config.pause_file()
_seen: dict[str, int] = {}


def pause_point(name: str) -> None:
    if not _FILE or name != _POINT:
        return
    n = _seen[name] = _seen.get(name, 0) + 1
    if n > _N:
        with open(_FILE + ".after", "a") as f:
            f.write(f"{n}\n")
    if n != _N:
        return
    with open(_FILE, "w") as f:
        f.write(str(os.getpid()))
    end = time.monotonic() + 120
    while os.path.exists(_FILE) and time.monotonic() < end:
        time.sleep(0.01)
