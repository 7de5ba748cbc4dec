"""Helpers for the fault tests: real `python -m quantkit` processes, paused at a named point.

A process started with ``pause=("quantize.tensor", 3)`` creates ``<ctl>/paused`` the third time it
passes that point (``quantkit.pause``) and waits until the file is removed: the test then acts on a
process provably in the middle of its work (signals it, fills its disk, truncates its input), with no
timing guess that a fast machine could beat. Nothing here measures time: a wait fails only after
``HANG`` seconds, a guard against a hang that no working job comes near on a loaded machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: seconds after which a wait fails: only a hung job gets there
HANG = 300


def default_sigint() -> None:
    """For a child's ``preexec_fn``: a suite started in the background by a shell inherits SIGINT ignored
    (POSIX, for asynchronous commands without job control); give the child the default disposition so
    Python installs its Ctrl-C handler, as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Job:
    def __init__(self, args, ctl: Path, pause: tuple[str, int] | None = None, cwd=None, rlimit_fsize=None):
        ctl.mkdir(parents=True, exist_ok=True)
        key = f"{os.getpid()}-{time.monotonic_ns()}"
        self.marker = ctl / f"paused-{key}"
        self.after = ctl / f"paused-{key}.after"       # the pause point's later passes (quantkit.pause)
        env = dict(os.environ)
        if pause:
            env["QUANTKIT_PAUSE_AT"] = f"{pause[0]}:{pause[1]}"
            env["QUANTKIT_PAUSE_FILE"] = str(self.marker)

        def preexec():
            default_sigint()
            if rlimit_fsize is not None:
                import resource

                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (rlimit_fsize, rlimit_fsize))

        # output goes to files, so a test can watch it while the job runs
        self.stdout_path, self.stderr_path = ctl / f"job-{key}.out", ctl / f"job-{key}.err"
        with open(self.stdout_path, "wb") as o, open(self.stderr_path, "wb") as e:
            self.proc = subprocess.Popen([sys.executable, "-m", "quantkit", *[str(a) for a in args]], cwd=cwd,
                                         stdout=o, stderr=e, env=env, preexec_fn=preexec)
        self.out = self.err = ""

    def wait_output(self, text: str, stream: str = "stderr", timeout: float = HANG) -> None:
        """Wait until the job has written ``text`` (it is then provably past its start-up)."""
        path = self.stderr_path if stream == "stderr" else self.stdout_path
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in path.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                self.finish()
                raise AssertionError(f"the job ended (exit {self.proc.returncode}) before writing {text!r}:\n{self.err}")
            time.sleep(0.01)
        raise AssertionError(f"the job never wrote {text!r}")

    def wait_paused(self, timeout: float = HANG) -> None:
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

    def signal(self, sig) -> int:
        """Send ``sig`` and wait for the end; return the exit code. A job waiting at its pause point is let
        go on right after the signal: the signal's handler runs first (at the job's next bytecode), so a
        job that honours it never passes the point again, and one that ignores it runs on and does
        (``passes_after_pause``)."""
        self.proc.send_signal(sig)
        if self.marker.exists():
            self.resume()
        return self.finish()

    def passes_after_pause(self) -> list[int]:
        """The numbers of the pause point's passes after the pause (``quantkit.pause``)."""
        return [int(n) for n in self.after.read_text().split()] if self.after.exists() else []

    def finish(self, timeout: float = HANG) -> int:
        self.proc.wait(timeout=timeout)
        self.out = self.stdout_path.read_text(errors="replace")
        self.err = self.stderr_path.read_text(errors="replace")
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
