"""A pytest plugin: where a suite run's time goes, per test and per compiled kernel.

    PYTHONPATH=tools .venv/bin/python -m pytest -p suite_profile --suite-profile=out.json tests ...

For each test (setup, call and teardown together) it records the wall seconds, the process's CPU seconds
(every thread), and the numba compiles that ran inside it: each dispatcher's name with its *own*
compile seconds (a kernel compiled while compiling its caller is counted once, for itself), counted in
CPU seconds of the compiling thread so that a loaded machine gives about the same figures. Compiles are
seen through numba's event API (``numba.core.event``, the ``numba:compile`` event); a kernel loaded from
the cache raises no such event. Under pytest-xdist every worker writes ``out.json.<worker>``.

``python tools/suite_profile.py out.json*`` prints the summary: per test file, and the costliest kernels
by dispatcher name (how many builds, seconds), the numbers docs/DEVELOPING.md's "Test suite time" uses.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

import pytest


def pytest_addoption(parser):
    parser.addoption("--suite-profile", default=None, help="write per-test wall / CPU / compile seconds here")


class _Compiles:
    """numba:compile listener keeping a stack, so each compile's seconds exclude its nested compiles."""

    def __init__(self):
        self.stack: list[list] = []     # [name, start, child seconds]
        self.done: list[tuple[str, float]] = []

    def on_start(self, event):
        disp = event.data.get("dispatcher")
        name = getattr(getattr(disp, "py_func", None), "__qualname__", repr(disp))
        mod = getattr(getattr(disp, "py_func", None), "__module__", "")
        sig = ", ".join(map(str, event.data.get("args") or ()))
        self.stack.append([f"{mod}.{name}", time.thread_time(), 0.0, sig])

    def on_end(self, event):
        name, t0, child, sig = self.stack.pop()
        dt = time.thread_time() - t0
        self.done.append((name, dt - child, sig))
        if self.stack:
            self.stack[-1][2] += dt


class Profile:
    def __init__(self, path: str):
        self.path = path
        self.rows: list[dict] = []
        self.compiles = _Compiles()
        from numba.core import event

        class _L(event.Listener):
            def on_start(_, ev):
                self.compiles.on_start(ev)

            def on_end(_, ev):
                self.compiles.on_end(ev)

        event.register("numba:compile", _L())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.compiles.done = []
        w0, c0 = time.perf_counter(), time.process_time()
        yield
        self.rows.append({"test": item.nodeid, "start": time.time() - (time.perf_counter() - w0),
                          "wall": time.perf_counter() - w0,
                          "cpu": time.process_time() - c0, "compiles": self.compiles.done})

    def pytest_sessionfinish(self, session):
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        path = f"{self.path}.{worker}" if worker else self.path
        with open(path, "w") as f:
            json.dump(self.rows, f)


def pytest_configure(config):
    path = config.getoption("--suite-profile")
    if path:
        config.pluginmanager.register(Profile(path), "suite-profile")


def summarize(paths: list[str], top: int = 40) -> None:
    rows = [r for p in paths for r in json.load(open(p))]
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for r in rows:
        f = files[r["test"].split("::")[0]]
        f[0] += r["wall"]
        f[1] += r["cpu"]
        f[2] += sum(c[1] for c in r["compiles"])
        f[3] += len(r["compiles"])
        for name, s, *_ in r["compiles"]:
            kernels[name][0] += 1
            kernels[name][1] += s
    tw = sum(f[0] for f in files.values())
    tc = sum(f[2] for f in files.values())
    print(f"{len(rows)} tests: {tw:.0f} s wall in tests, {tc:.0f} s compiling "
          f"({sum(k[0] for k in kernels.values())} compiles)")
    print(f"{'file':40s} {'wall':>7s} {'cpu':>7s} {'compile':>8s} {'n':>5s}")
    for name, (w, c, comp, n) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:40s} {w:7.1f} {c:7.1f} {comp:8.1f} {n:5d}")
    print(f"\n{'kernel':70s} {'builds':>6s} {'seconds':>8s}")
    for name, (n, s) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{name[-70:]:70s} {n:6d} {s:8.1f}")
    slow = sorted(rows, key=lambda r: -r["wall"])[:top]
    print(f"\n{'slowest tests':90s} {'wall':>7s} {'compile':>8s}")
    for r in slow:
        print(f"{r['test'][-90:]:90s} {r['wall']:7.1f} {sum(c[1] for c in r['compiles']):8.1f}")


if __name__ == "__main__":
    summarize(sys.argv[1:])
