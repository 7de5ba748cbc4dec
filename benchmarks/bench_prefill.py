"""Prompt processing (pp) of ``quantkit bench`` and ``llama-bench`` interleaved, with CPU time.

    python benchmarks/bench_prefill.py -m FILE [-m FILE ...] [-t 2] [-p 512] [-r 3] [--rounds 2]
        [--llama-bench PATH] [--ppl-text FILE --ppl-chunks 4]

On a machine shared with other jobs a single run of each tool says little: this runs, per round and
per model, ``quantkit bench -p P -n 0`` then ``llama-bench -p P -n 0`` with its defaults (repacked
weights where the CPU takes them) then with ``--repack 0``, each as a subprocess, and records the t/s
(llama-bench's json ``avg_ts``) and the CPU seconds (user + sys) of the whole process (loading, warmup
and the repetitions, for every tool alike). The table gives per model the median over rounds, the ratio
quantkit / the faster llama.cpp configuration (which one is named), and the load average meanwhile.
With ``--cpu-diff R2`` each tool also runs with ``-r R2``: (CPU(R2) - CPU(R)) / (R2 - R) is the CPU
time of one pp repetition without start-up, loading and warmup -- the figure that other jobs on the
machine disturb least (at ``-t 1`` it is the work one pass takes).
llama-bench is found as in bench_vs_llama.py (--llama-bench, $QUANTKIT_LLAMA_CPP/build/bin, PATH).

quantkit runs with its defaults (the integer GEMM on AVX512-VNNI CPUs; ``--ab-blas`` adds its
dequantize + BLAS prefill, ``QUANTKIT_GEMM=0``; ``--ab-src DIR`` adds the quantkit package in DIR, another
version of the code, run with ``python -P`` and ``PYTHONPATH=DIR``, its numba cache in DIR/.numba_cache). With ``--ppl-text``, each round also times ``quantkit perplexity -f TEXT -c 512 --chunks N`` beside
``llama-perplexity`` (next to llama-bench; defaults, then ``-nr``): wall seconds of the whole process
(start-up and load included for both), CPU seconds, and the final PPL each printed.

``--profile`` instead times the parts of quantkit's own P-token pass in this process (no llama.cpp):
per pass, CPU seconds (user + sys of the whole process, all threads) and wall seconds spent in the
integer GEMM per matrix kind and weight type (attn_q, ..., ffn_down, output), the activation
quantization before it, attention, RMS norms, RoPE + KV
store, the GLU, the embedding lookup, and the rest (Python between the calls). Passes alternate
between the models and the thread counts given (``--profile-threads 1,2``), after one warm-up pass
each; the table gives the median per part.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import llamaref  # noqa: E402  (where the reference llama.cpp is)


def _env_cmd(cmd: list[str]) -> tuple[dict, list[str]]:
    """Leading ``VAR=value`` items of ``cmd`` -> (the child's environment, the command)."""
    env = os.environ.copy()
    while cmd and "=" in cmd[0] and not cmd[0].startswith("-"):
        k, v = cmd[0].split("=", 1)
        env[k], cmd = v, cmd[1:]
    return env, cmd


def run(cmd: list[str]) -> tuple[float | None, float]:
    """(t/s of the pp test or None on failure, CPU seconds of the child). A leading ``VAR=value``
    item is set in the child's environment."""
    env, cmd = _env_cmd(cmd)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"failed ({proc.returncode}): {' '.join(cmd)}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None, cpu
    rows = [r for r in json.loads(proc.stdout) if r["n_prompt"]]
    return rows[0]["avg_ts"], cpu


def run_ppl(cmd: list[str]) -> tuple[float | None, float, float]:
    """(final PPL or None on failure, wall seconds, CPU seconds) of one perplexity process."""
    env, cmd = _env_cmd(cmd)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = re.findall(r"Final estimate: PPL = ([0-9.]+)", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not found:
        print(f"failed ({proc.returncode}): {' '.join(cmd)}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None, wall, cpu
    return float(found[-1]), wall, cpu


def ppl_table(a, exe) -> None:
    common = ["-f", a.ppl_text, "-c", "512", "--chunks", str(a.ppl_chunks), "-t", str(a.threads)]
    tools = {"quantkit": [sys.executable, "-m", "quantkit", "perplexity"]}
    lp = Path(exe).with_name("llama-perplexity") if exe else None
    if lp and lp.is_file():
        tools["llama.cpp"] = [str(lp)]
        tools["llama.cpp -nr"] = [str(lp), "-nr"]
    res: dict = {}
    for rnd in range(a.rounds):
        for m in a.model:
            for name, cmd in tools.items():
                r = run_ppl(cmd + ["-m", m] + common)
                res.setdefault((m, name), []).append(r)
                print(f"round {rnd + 1} {Path(m).name} perplexity {name}: PPL {r[0]}, {r[1]:.1f} s wall, "
                      f"{r[2]:.1f} CPU s", file=sys.stderr, flush=True)
    print(f"\nperplexity -c 512 --chunks {a.ppl_chunks}, {a.threads} threads, median of {a.rounds} rounds "
          f"(load average now {os.getloadavg()[0]:.1f})\n")
    print("| model | PPL quantkit | PPL llama.cpp | wall s quantkit | wall s llama.cpp (default / -nr) "
          "| quantkit / best llama.cpp | CPU s quantkit | CPU s llama.cpp (default / -nr) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    f = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731

    def med(m, name, i):
        v = [r[i] for r in res.get((m, name), []) if r[0] is not None]
        return statistics.median(v) if v else None

    for m in a.model:
        q = med(m, "quantkit", 1)
        ll = {n: med(m, n, 1) for n in ("llama.cpp", "llama.cpp -nr")}
        best = min(((v, n) for n, v in ll.items() if v), default=(None, None))
        ratio = f"{q / best[0]:.2f}x ({'default' if best[1] == 'llama.cpp' else '-nr'})" if q and best[0] else "–"
        pq, pl = med(m, "quantkit", 0), med(m, "llama.cpp", 0) or med(m, "llama.cpp -nr", 0)
        print(f"| {Path(m).name} | {pq if pq else '–'} | {pl if pl else '–'} | {f(q)} | {f(ll['llama.cpp'])} / "
              f"{f(ll['llama.cpp -nr'])} | {ratio} | {f(med(m, 'quantkit', 2))} | {f(med(m, 'llama.cpp', 2))} / "
              f"{f(med(m, 'llama.cpp -nr', 2))} |")


class _Clock:
    """Exclusive CPU and wall seconds per part: a part's time excludes the parts timed inside it."""

    def __init__(self):
        self.cpu: dict = {}
        self.wall: dict = {}
        self.stack: list = []

    def wrap(self, part, fn):
        def timed(*args, **kw):
            now = (time.process_time(), time.perf_counter())
            if self.stack:
                self._add(self.stack[-1], now)
            self.stack.append([part, now])
            try:
                return fn(*args, **kw)
            finally:
                end = (time.process_time(), time.perf_counter())
                top = self.stack.pop()
                self._add(top, end)
                if self.stack:
                    self.stack[-1][1] = end
        return timed

    def _add(self, top, now):
        part, (c0, w0) = top
        self.cpu[part] = self.cpu.get(part, 0.0) + now[0] - c0
        self.wall[part] = self.wall.get(part, 0.0) + now[1] - w0
        top[1] = now


def _products_by_kind(clock: _Clock, mm):
    """``Runner._mm`` timed per matrix kind and type: "products ffn_up Q4_K" (blk.N.ffn_up.weight; the
    output matrix, one row per pass as llama-bench's pp test asks only the last token's logits)."""
    def timed(w, x, out, rounded=None):
        kind = w.name.split(".")[-2] if w.name.startswith("blk.") else w.name.split(".")[0]
        return clock.wrap(f"products {kind} {getattr(w.type, 'name', w.type)}", mm)(w, x, out, rounded)
    return timed


def profile(a) -> int:
    """In-process parts of a P-token pass (see the module docstring)."""
    import numpy as np

    from quantkit.jit import set_threads
    from quantkit.kernels import gemm as G
    from quantkit.model import forward as F
    from quantkit.pipelines.loading import open_model

    clock = _Clock()
    for name, part in (("rmsnorm", "norms"), ("glu_rows", "GLU"), ("get_rows", "embedding")):
        setattr(F, name, clock.wrap(part, getattr(F, name)))
    G.gemm_operands = clock.wrap("activation quantization", G.gemm_operands)
    threads = [int(t) for t in a.profile_threads.split(",")]
    runners = []
    for m in a.model:
        r = open_model(m, tokenizer=False).runner(a.n_prompt, a.n_prompt, compiled_step=False)
        r._attend_blas = clock.wrap("attention", r._attend_blas)
        r._mm = _products_by_kind(clock, r._mm)
        r._prepare_store = clock.wrap("RoPE + KV store", r._prepare_store)
        runners.append((Path(m).name, r))
    toks = np.random.default_rng(0).integers(0, runners[0][1].config.n_vocab, a.n_prompt)
    res: dict = {}
    for rnd in range(a.reps + 1):
        for name, r in runners:
            for t in threads:
                set_threads(t)
                clock.cpu.clear()
                clock.wall.clear()
                c0, w0 = time.process_time(), time.perf_counter()
                clock.wrap("other (Python, adds)", r.forward)(toks, 0, "last")
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                if rnd:  # the first round warms up (compilation, page faults)
                    res.setdefault((name, t), []).append((cpu, wall, dict(clock.cpu), dict(clock.wall)))
                print(f"round {rnd} {name} {t} threads: {cpu:.2f} CPU s, {wall:.2f} s", file=sys.stderr, flush=True)
    print(f"one {a.n_prompt}-token pass, median of {a.reps}, load average now {os.getloadavg()[0]:.1f}\n")
    print("| model | threads | pass CPU s / wall s | part: CPU s / wall s ... |")
    print("|---|---:|---:|---|")
    for (name, t), runs in res.items():
        parts = sorted({p for run in runs for p in run[2]}, key=lambda p: -runs[0][2].get(p, 0))
        med = lambda f: statistics.median(f(run) for run in runs)  # noqa: E731
        cells = "; ".join(f"{p} {med(lambda run: run[2].get(p, 0)):.3f} / {med(lambda run: run[3].get(p, 0)):.3f}"
                          for p in parts)
        print(f"| {name} | {t} | {med(lambda run: run[0]):.2f} / {med(lambda run: run[1]):.2f} | {cells} |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads for both tools (default 2)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("-r", "--reps", type=int, default=3, help="repetitions per tool run (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--llama-bench", help="llama-bench binary (default: $QUANTKIT_LLAMA_CPP/build/bin's, PATH)")
    ap.add_argument("--ppl-text", help="also time perplexity on this text file (-c 512)")
    ap.add_argument("--ppl-chunks", type=int, default=4, help="perplexity chunks (default 4)")
    ap.add_argument("--no-pp", action="store_true", help="skip the pp runs (perplexity only)")
    ap.add_argument("--ab-blas", action="store_true",
                    help="also run quantkit with its dequantize + BLAS prefill (QUANTKIT_GEMM=0)")
    ap.add_argument("--ab-src", metavar="DIR",
                    help="also run the quantkit package found in DIR (e.g. an export of main: git archive main "
                         "quantkit | tar -x -C DIR), interleaved with this one, for an A/B of code versions")
    ap.add_argument("--cpu-diff", type=int, default=0, metavar="R2",
                    help="also run with -r R2 and report CPU seconds per repetition")
    ap.add_argument("--profile", action="store_true",
                    help="time the parts of quantkit's pass in this process instead (no llama.cpp)")
    ap.add_argument("--profile-threads", default="1,2", help="thread counts to alternate with --profile (default 1,2)")
    a = ap.parse_args(argv)
    if a.profile:
        return profile(a)
    exe = llamaref.find("llama-bench", a.llama_bench)
    common = ["-p", str(a.n_prompt), "-n", "0", "-t", str(a.threads), "-r", str(a.reps), "-o", "json"]
    qk = [sys.executable, "-m", "quantkit", "bench"]
    tools = {"quantkit": qk}
    if a.ab_blas:
        tools["quantkit BLAS"] = ["QUANTKIT_GEMM=0"] + qk
    if a.ab_src:
        src = str(Path(a.ab_src).resolve())
        tools["quantkit A/B"] = [f"PYTHONPATH={src}", f"NUMBA_CACHE_DIR={src}/.numba_cache", sys.executable, "-P", "-m",
                                 "quantkit", "bench"]
    if exe:
        tools["llama.cpp"] = [exe]
        tools["llama.cpp -nr"] = [exe, "--repack", "0"]
    else:
        print(f"{llamaref.missing('llama-bench', a.llama_bench)}: quantkit only", file=sys.stderr)
    if a.ppl_text:
        ppl_table(a, exe)
    if a.no_pp:
        return 0
    res: dict = {}
    loads = []
    for rnd in range(a.rounds):
        for m in a.model:
            for name, cmd in tools.items():
                ts, cpu = run(cmd + ["-m", m] + common)
                per = None
                if a.cpu_diff > a.reps:
                    ts2, cpu2 = run(cmd + ["-m", m] + common[:-4] + ["-r", str(a.cpu_diff), "-o", "json"])
                    per = (cpu2 - cpu) / (a.cpu_diff - a.reps) if ts2 else None
                res.setdefault((m, name), []).append((ts, cpu, per))
                loads.append(os.getloadavg()[0])
                print(f"round {rnd + 1} {Path(m).name} {name}: {ts} t/s, {cpu:.1f} CPU s, CPU s per repetition "
                      f"{per}", file=sys.stderr, flush=True)

    def med(m, name, i):
        v = [r[i] for r in res.get((m, name), []) if r[0] is not None and r[i] is not None]
        return statistics.median(v) if v else None

    g = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    print(f"pp{a.n_prompt}, {a.threads} threads, median of {a.rounds} interleaved rounds x {a.reps} repetitions; "
          f"load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| model | quantkit t/s | llama.cpp t/s (default) | llama.cpp t/s (--repack 0) | quantkit / best llama.cpp "
          "| CPU s quantkit | CPU s llama.cpp (default / -nr) | CPU s per pp quantkit | CPU s per pp llama.cpp "
          "(default / -nr) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    f = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    for m in a.model:
        q = med(m, "quantkit", 0)
        ll = {n: med(m, n, 0) for n in ("llama.cpp", "llama.cpp -nr")}
        best = max(((v, n) for n, v in ll.items() if v), default=(None, None))
        ratio = f"{q / best[0]:.2f}x ({'default' if best[1] == 'llama.cpp' else '-nr'})" if q and best[0] else "–"
        print(f"| {Path(m).name} | {f(q)} | {f(ll['llama.cpp'])} | {f(ll['llama.cpp -nr'])} | {ratio} | "
              f"{f(med(m, 'quantkit', 1))} | {f(med(m, 'llama.cpp', 1))} / {f(med(m, 'llama.cpp -nr', 1))} | "
              f"{g(med(m, 'quantkit', 2))} | {g(med(m, 'llama.cpp', 2))} / {g(med(m, 'llama.cpp -nr', 2))} |")
        if a.ab_src:
            print(f"| {Path(m).name}, quantkit from {a.ab_src} | {f(med(m, 'quantkit A/B', 0))} | | | | "
                  f"{f(med(m, 'quantkit A/B', 1))} | | {g(med(m, 'quantkit A/B', 2))} | |")
        if a.ab_blas:
            print(f"| {Path(m).name}, quantkit's dequantize + BLAS prefill | {f(med(m, 'quantkit BLAS', 0))} | | | | "
                  f"{f(med(m, 'quantkit BLAS', 1))} | | {g(med(m, 'quantkit BLAS', 2))} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
