"""Start-up to the first generated token: from launching ``quantkit run -m MODEL -p Hi -n 4 --temp 0
--no-display-prompt`` (a fresh process each time: interpreter, imports, GGUF open, tokenizer, cached
kernels, warmup step, the prompt) to the first byte of generated text on its stdout, warm numba cache;
the whole process's wall time (with the remaining tokens and the exit) is printed beside it.

    .venv/bin/python benchmarks/bench_startup.py [MODEL.gguf] [-r RUNS] [-t THREADS]

Prints each run and the median, with the phases of the last run from quantkit's own timings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="GGUF file (default: the bundled SmolLM2 Q4_1)")
    ap.add_argument("-r", "--runs", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=1)
    a = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    exe = [sys.executable, "-m", "quantkit"]
    cmd = exe + ["run", "-p", "Hi", "-n", "4", "--temp", "0", "--no-display-prompt", "-t", str(a.threads)]
    if a.model:
        cmd += ["-m", a.model]
    subprocess.run(cmd, env=env, capture_output=True, check=True)   # warm the cache (and the page cache)
    firsts, walls = [], []
    for i in range(a.runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = proc.stdout.read(1)
        firsts.append(time.perf_counter() - t0)
        proc.stdout.read()
        err = proc.stderr.read().decode(errors="replace")
        if proc.wait() != 0 or not first:
            raise SystemExit(f"quantkit run failed:\n{err}")
        walls.append(time.perf_counter() - t0)
        print(f"run {i + 1}: first token at {firsts[-1]:.3f} s, process {walls[-1]:.3f} s", flush=True)
    res = subprocess.CompletedProcess(cmd, 0, "", err)
    load = [ln.strip() for ln in res.stderr.splitlines() if "load time" in ln]
    print(f"median start-up to the first generated token: {statistics.median(firsts):.3f} s "
          f"(min {min(firsts):.3f}, max {max(firsts):.3f}; whole process median "
          f"{statistics.median(walls):.3f} s; {a.runs} runs, -t {a.threads})")
    if load:
        print(f"last run: {load[0]}")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
