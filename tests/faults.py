"""Helpers for the fault tests: real `python -m quantkit` processes, paused at a named point.

A process started with ``pause=("quantize.tensor", 3)`` creates ``<ctl>/paused`` the third time it
passes that point (``quantkit.pause``) and waits until the file is removed: the test then acts on a
process provably in the middle of its work (signals it, fills its disk, truncates its input), with no
timing guess that a fast machine could beat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class Job:
    def __init__(self, args, ctl: Path, pause: tuple[str, int] | None = None, cwd=None, rlimit_fsize=None):
        ctl.mkdir(parents=True, exist_ok=True)
        self.marker = ctl / f"paused.{time.monotonic_ns()}"
        env = dict(os.environ)
        if pause:
            env["QUANTKIT_PAUSE_AT"] = f"{pause[0]}:{pause[1]}"
            env["QUANTKIT_PAUSE_FILE"] = str(self.marker)

        def preexec():
            # a job started in the background by a shell inherits SIGINT ignored; give the child the
            # default disposition so Python installs its Ctrl-C handler, as in a terminal
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if rlimit_fsize is not None:
                import resource

                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (rlimit_fsize, rlimit_fsize))

        self.proc = subprocess.Popen([sys.executable, "-m", "quantkit", *[str(a) for a in args]], cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=preexec)
        self.out = self.err = ""

    def wait_paused(self, timeout: float = 180) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.marker.exists():
                return
            if self.proc.poll() is not None:
                self.finish()
                raise AssertionError(f"the job ended (exit {self.proc.returncode}) before its pause point:\n{self.err}")
            time.sleep(0.01)
        raise AssertionError("the job never reached its pause point")

    def resume(self) -> None:
        self.marker.unlink()

    def signal(self, sig) -> float:
        """Send ``sig``; return the seconds until the process ended."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        self.finish()
        return time.monotonic() - t0

    def finish(self, timeout: float = 300) -> int:
        out, err = self.proc.communicate(timeout=timeout)
        self.out, self.err = out.decode(errors="replace"), err.decode(errors="replace")
        return self.proc.returncode


def one_line_error(job: Job, *needles: str) -> str:
    """Exit 1, no traceback, and the last stderr line is ``Error: ...`` holding every needle."""
    assert job.proc.returncode == 1, (job.proc.returncode, job.err)
    assert "Traceback" not in job.err, job.err
    last = job.err.strip().splitlines()[-1]
    assert last.startswith("Error: "), job.err
    for n in needles:
        assert n in last, (n, last)
    return last


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())
