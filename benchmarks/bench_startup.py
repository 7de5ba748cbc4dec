"""Start-up to the first generated token: wall time of ``quantkit run -m MODEL -p Hi -n 1 --temp 0``
(a fresh process each time: imports, GGUF open, tokenizer, cached kernels, warmup step, one prompt
token, one sampled token), warm numba cache.

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
    cmd = exe + ["run", "-p", "Hi", "-n", "1", "--temp", "0", "-t", str(a.threads)]
    if a.model:
        cmd += ["-m", a.model]
    subprocess.run(cmd, env=env, capture_output=True, check=True)   # warm the cache (and the page cache)
    walls = []
    for i in range(a.runs):
        t0 = time.perf_counter()
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - t0)
        print(f"run {i + 1}: {walls[-1]:.3f} s", flush=True)
    load = [ln.strip() for ln in res.stderr.splitlines() if "load time" in ln]
    print(f"median start-up to the first generated token: {statistics.median(walls):.3f} s "
          f"(min {min(walls):.3f}, max {max(walls):.3f}, {a.runs} runs, -t {a.threads})")
    if load:
        print(f"last run: {load[0]}")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
