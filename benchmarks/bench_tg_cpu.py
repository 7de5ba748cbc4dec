"""tg beside llama-bench on a shared machine, A/B interleaved: wall t/s (each tool's own report) and
CPU ms per token (user+sys of the child process; the per-token figure is the difference of an
``-n LONG`` and an ``-n 8`` run over their 3 x (LONG - 8) timed tokens, which cancels loading,
compiling, packing and the 1-token warm-up). Configurations: quantkit, llama-bench's defaults
(repacked on this CPU) and ``--repack 0``; per round every thread count in turn.

    .venv/bin/python benchmarks/bench_tg_cpu.py MODEL 1,2 ROUNDS [LONG]

llama-bench is the reference build's ($QUANTKIT_LLAMA_CPP/build/bin), else the one on PATH (tools/llamaref.py).
"""
import json, os, resource, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import llamaref
LB = llamaref.need("llama-bench")
QK = os.path.abspath(".venv/bin/quantkit")
model, thread_list, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
SHORT, LONG = 8, int(sys.argv[4]) if len(sys.argv) > 4 else 64
def run(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode: print(out.stderr[-2000:]); raise SystemExit(1)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    ts = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return cpu, ts[-1]["avg_ts"]
def tools_for(threads): return {
    "quantkit": lambda n: [QK, "bench", "-m", model, "-p", "0", "-n", str(n), "-t", threads, "-r", "3", "-o", "jsonl"],
    "llama default": lambda n: [LB, "-m", model, "-p", "0", "-n", str(n), "-t", threads, "-r", "3", "-o", "jsonl"],
    "llama --repack 0": lambda n: [LB, "-m", model, "-p", "0", "-n", str(n), "-t", threads, "-r", "3", "-o", "jsonl", "--repack", "0"],
}
res = {}
run(tools_for("1")["quantkit"](1))  # compile / cache the kernels first
for rd in range(rounds):
  for threads in thread_list:
    for k, f in tools_for(threads).items():
        k = f"-t {threads} {k}"
        res.setdefault(k, [])
        c_s, _ = run(f(SHORT)); c_l, ts = run(f(LONG))
        # -r 3 timed runs of n tokens (both tools warm up with 1 token)
        res[k].append(((c_l - c_s) / (3 * (LONG - SHORT)) * 1e3, ts))
        print(f"round {rd} {k:18s} cpu/token {res[k][-1][0]:6.1f} ms  tg{LONG} {ts:6.2f} t/s  load {os.getloadavg()[0]:.1f}", flush=True)
print(f"{os.path.basename(model)}: best of {rounds}")
for k, v in res.items():
    print(f"{k:18s} cpu ms/token best {min(a for a,_ in v):6.1f}  tg t/s best {max(b for _,b in v):6.2f}")
