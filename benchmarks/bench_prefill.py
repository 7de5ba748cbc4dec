"""Prompt processing (pp) of ``quantkit bench`` and ``llama-bench`` interleaved, with CPU time.

    python benchmarks/bench_prefill.py -m FILE [-m FILE ...] [-t 2] [-p 512] [-r 3] [--rounds 2]
        [--llama-bench PATH]

On a machine shared with other jobs a single run of each tool says little: this runs, per round and
per model, ``quantkit bench -p P -n 0`` then ``llama-bench -p P -n 0`` with its defaults (repacked
weights where the CPU takes them) then with ``--repack 0``, each as a subprocess, and records the t/s
(llama-bench's json ``avg_ts``) and the CPU seconds (user + sys) of the whole process (loading, warmup
and the repetitions, for every tool alike). The table gives per model the median over rounds, the ratio
quantkit / the faster llama.cpp configuration (which one is named), and the load average meanwhile.
llama-bench is found as in bench_vs_llama.py (--llama-bench, $LLAMA_BENCH, PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_llama import find_llama_bench  # noqa: E402


def run(cmd: list[str]) -> tuple[float | None, float]:
    """(t/s of the pp test or None on failure, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"failed ({proc.returncode}): {' '.join(cmd)}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None, cpu
    rows = [r for r in json.loads(proc.stdout) if r["n_prompt"]]
    return rows[0]["avg_ts"], cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads for both tools (default 2)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("-r", "--reps", type=int, default=3, help="repetitions per tool run (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--llama-bench", help="llama-bench binary (default: $LLAMA_BENCH, PATH)")
    a = ap.parse_args(argv)
    exe = find_llama_bench(a.llama_bench)
    common = ["-p", str(a.n_prompt), "-n", "0", "-t", str(a.threads), "-r", str(a.reps), "-o", "json"]
    tools = {"quantkit": [sys.executable, "-m", "quantkit", "bench"]}
    if exe:
        tools["llama.cpp"] = [exe]
        tools["llama.cpp -nr"] = [exe, "--repack", "0"]
    else:
        print("llama-bench not found: quantkit only", file=sys.stderr)
    res: dict = {}
    loads = []
    for rnd in range(a.rounds):
        for m in a.model:
            for name, cmd in tools.items():
                ts, cpu = run(cmd + ["-m", m] + common)
                res.setdefault((m, name), []).append((ts, cpu))
                loads.append(os.getloadavg()[0])
                print(f"round {rnd + 1} {Path(m).name} {name}: {ts} t/s, {cpu:.1f} CPU s", file=sys.stderr, flush=True)

    def med(m, name, i):
        v = [r[i] for r in res.get((m, name), []) if r[0] is not None]
        return statistics.median(v) if v else None

    print(f"pp{a.n_prompt}, {a.threads} threads, median of {a.rounds} interleaved rounds x {a.reps} repetitions; "
          f"load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| model | quantkit t/s | llama.cpp t/s (default) | llama.cpp t/s (--repack 0) | quantkit / best llama.cpp "
          "| CPU s quantkit | CPU s llama.cpp (default / -nr) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    f = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    for m in a.model:
        q = med(m, "quantkit", 0)
        ll = {n: med(m, n, 0) for n in ("llama.cpp", "llama.cpp -nr")}
        best = max(((v, n) for n, v in ll.items() if v), default=(None, None))
        ratio = f"{q / best[0]:.2f}x ({'default' if best[1] == 'llama.cpp' else '-nr'})" if q and best[0] else "–"
        print(f"| {Path(m).name} | {f(q)} | {f(ll['llama.cpp'])} | {f(ll['llama.cpp -nr'])} | {ratio} | "
              f"{f(med(m, 'quantkit', 1))} | {f(med(m, 'llama.cpp', 1))} / {f(med(m, 'llama.cpp -nr', 1))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
