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

    def wait_output(self, text: str, stream: str = "stderr", timeout: float = 180) -> None:
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
        """Send ``sig``; return the seconds until the process ended (``self.cpu_after``: the CPU
        seconds it used after the signal, a measure the other jobs on a busy machine do not inflate)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu_before = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        _, status, usage = os.wait4(self.proc.pid, 0)
        seconds = time.monotonic() - t0
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_after = usage.ru_utime + usage.ru_stime - cpu_before
        self.finish()
        return seconds

    def finish(self, timeout: float = 300) -> int:
        self.proc.wait(timeout=timeout)
        self.out = self.stdout_path.read_text(errors="replace")
        self.err = self.stderr_path.read_text(errors="replace")
        return self.proc.returncode


def prompt(job: Job, seconds: float) -> bool:
    """Stopped 'at once': under a second of wall time, or (on a machine so loaded that wall time
    says little) under half a second of the job's own CPU time after the signal."""
    if seconds < 1.0:
        return True
    return os.getloadavg()[0] > 2 * (os.cpu_count() or 1) and job.cpu_after < 0.5


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
