"""Prompt (pp) and generation (tg) speed: ``quantkit bench`` beside llama.cpp, with a bandwidth yardstick.

    python benchmarks/bench_vs_llama.py [-m FILE ...] [-t 2] [-p 512] [-n 128] [-r 5]
        [--llama-bench PATH] [--llama-build native|avx2] [--llama-python PATH] [--no-llama] [--bw-mib 512]
        [--rounds 1]

For each model (the bundled SmolLM2-135M-Instruct Q4_1, plus every -m), at one thread count:

* quantkit: ``quantkit.pipelines.bench.run_bench`` in this process -- the procedure of ``quantkit bench``
  (warmup, repetitions, random tokens; numba compile time is reported apart, never in t/s).
* llama.cpp: the ``llama-bench`` binary when found (--llama-bench, else the reference build under
  $QUANTKIT_LLAMA_CPP -- ``build/bin``, or ``build-avx2/bin`` with ``--llama-build avx2`` --, else PATH;
  tools/llamaref.py), run as ``llama-bench -m FILE -p P -n N -t T -r R -o json`` with its
  defaults (the repacked path) and with ``--repack 0``; for pp and for tg the faster is reported and named (a configuration
  that crashes -- some builds segfault with repacked AMX buffers -- is skipped). Each model's llama.cpp
  runs follow quantkit's run of the same model, so the two are measured close together in time. Without the binary, llama-cpp-python's ``Llama`` in a subprocess
  of its venv's python (--llama-python, else $QUANTKIT_LLAMA_PY) times the same pp/tg loops through the
  low-level API (random tokens, no sampling, KV cleared per repetition; rerun with ``use_extra_bufts =
  false`` if it crashes). Without either, llama.cpp is skipped with a note.
* --rounds N repeats each model's pair of runs (quantkit, then llama.cpp) N times and ends with the
  median and range of the per-round ratios: on a host whose memory throughput drifts within minutes
  (docs/performance.md), a ratio of two runs made seconds apart is what compares the tools, and one round
  is an anecdote.
* memory bandwidth, measured in the same run: a numba ``prange`` sum over a --bw-mib array (256 MiB at
  least), best of 5, on 1 thread and on the benchmark's thread count. A decode step reads every weight
  once, so tg t/s <= bandwidth / weight bytes per token; the table prints the fraction of that limit
  reached (``tg x bytes/token / bandwidth``) for both tools.

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed from this process's environment (and the children's):
some environments here set them and they slow current OpenBLAS.
"""

from __future__ import annotations

import quantkit.jit  # noqa: F401  (first: it sets the OpenMP spin before numba loads its pool)
import os

for _k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_k, None)

import argparse  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import llamaref  # noqa: E402  (where the reference llama.cpp is)


# -- memory bandwidth -------------------------------------------------------------------------------

def bandwidth_gbs(mib: int, threads: int, reps: int = 5) -> float:
    """Best-of-``reps`` read bandwidth (GB/s) of a parallel float32 sum over ``mib`` MiB."""
    import numpy as np

    from quantkit.jit import njit_fast_parallel, prange, set_threads

    @njit_fast_parallel(cache=False)
    def chunk_sums(a, chunk, out):
        for c in prange(out.size):
            s = a[c * chunk:(c + 1) * chunk]   # slice first: indices from 0, no wraparound checks
            acc = np.float32(0.0)
            for i in range(s.size):
                acc += s[i]
            out[c] = acc

    n = max(256, mib) * 2**20 // 4
    a = np.ones(n, np.float32)
    chunk = 1 << 16
    out = np.empty(n // chunk, np.float32)
    set_threads(threads)
    chunk_sums(a, chunk, out)                  # compile, and fault every page in
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        chunk_sums(a, chunk, out)
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


def weight_bytes_per_token(path: str) -> int:
    """Bytes a decode step reads: every tensor, except the token embedding's unread rows (one row is
    gathered) -- unless the output projection is the embedding itself (tied), which reads it whole --
    and of a mixture of experts' 3D ``*_exps`` tensors only the chosen experts' share (expert_used_count
    of expert_count)."""
    from quantkit.formats.gguf_io import GGUFModel

    with GGUFModel(path) as g:
        n_expert = g.get(f"{g.arch}.expert_count", 0) or 0
        n_used = g.get(f"{g.arch}.expert_used_count", 0) or 0

        def read(t) -> float:
            if n_expert and t.name.endswith("_exps.weight"):
                return t.nbytes * n_used / n_expert
            return t.nbytes

        total = sum(read(t) for t in g.tensors)
        if g.has_tensor("output.weight") and g.has_tensor("token_embd.weight"):
            total -= g.tensor("token_embd.weight").nbytes
    return int(total)


# -- quantkit --------------------------------------------------------------------------------------

def run_quantkit(models: list[str], a) -> dict[tuple[str, str], dict]:
    from quantkit.pipelines.bench import BenchParams, MarkdownPrinter, run_bench

    p = BenchParams(models=models, n_prompt=[a.n_prompt], n_gen=[a.n_gen], n_threads=[a.threads], reps=a.reps)
    md = io.StringIO()
    res = run_bench(p, [MarkdownPrinter(md)], log=(lambda s: print(s, file=sys.stderr)) if a.verbose else None)
    print("quantkit bench:\n" + md.getvalue())
    out = {}
    for r in res:
        kind = "pp" if r.inst.n_prompt else "tg"
        out[(r.inst.model, kind)] = {"ts": r.avg_ts, "sd": r.stdev_ts, "compile_s": r.compile_s,
                                     "peak_rss_mib": r.peak_rss_mib, "rss_bound_mib": r.rss_bound_mib}
    return out


# -- llama.cpp ---------------------------------------------------------------------------------------

def run_llama_bench(exe: str, model: str, a) -> tuple[dict[str, float], str]:
    """llama-bench with its defaults (the repacked CPU path where the CPU has it) and with ``--repack 0``
    (``--llama-modes``); -> {pp, tg}, each from the configuration that was faster at it, and a note naming
    them with every configuration's figures."""
    cmd = [exe, "-m", model, "-p", str(a.n_prompt), "-n", str(a.n_gen), "-t", str(a.threads), "-r", str(a.reps),
           "-o", "json"]
    runs = {}
    for mode in a.llama_modes.split(","):
        extra = {"default": [], "repack0": ["--repack", "0"]}[mode]
        proc = subprocess.run(cmd + extra, capture_output=True, text=True, env=os.environ.copy())
        if proc.returncode == 0:
            got = {}
            for row in json.loads(proc.stdout):
                got["pp" if row["n_prompt"] else "tg"] = row["avg_ts"]
            runs[mode] = got
        else:
            print(f"llama-bench {' '.join(extra) or '(defaults)'} failed with code {proc.returncode}: "
                  f"{proc.stderr.strip().splitlines()[-1:] or ''}", file=sys.stderr)
    if not runs:
        return {}, "llama-bench failed"
    names = {"default": "defaults", "repack0": "--repack 0"}
    best, notes = {}, []
    for metric in ("pp", "tg"):          # llama.cpp's best configuration for each metric, named
        have = [k for k in runs if runs[k].get(metric)]
        if have:
            k = max(have, key=lambda k: runs[k][metric])
            best[metric] = runs[k][metric]
            notes.append(f"{metric}: {names[k]}")
    others = "; ".join(f"{names[k]}: " + ", ".join(f"{t} {v:.2f}" for t, v in sorted(r.items()))
                       for k, r in runs.items())
    return best, f"llama-bench best ({', '.join(notes)}; {others})"


LLAMA_CPP_PYTHON_SCRIPT = textwrap.dedent("""
    # llama-bench's loops through llama-cpp-python's low-level API: clear the KV cache, decode n_prompt
    # random tokens in batches of 2048 (logits of the last only), then n_gen single tokens.
    import json, random, sys, time
    import llama_cpp as L
    path, threads, n_prompt, n_gen, reps, extra = sys.argv[1:7]
    threads, n_prompt, n_gen, reps = int(threads), int(n_prompt), int(n_gen), int(reps)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = extra == "1"
    model = L.llama_model_load_from_file(path.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_prompt + n_gen, 2048, 512
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    rng = random.Random(1)

    def decode(ids, pos):
        b = L.llama_batch_init(len(ids), 0, 1)
        for i, t in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos + i, 1, i == len(ids) - 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(ids)
        assert L.llama_decode(ctx, b) == 0
        L.llama_synchronize(ctx)
        L.llama_batch_free(b)

    def run(n_p, n_g):
        L.llama_memory_clear(L.llama_get_memory(ctx), False)
        t, pos = time.perf_counter_ns(), 0
        while pos < n_p:
            k = min(2048, n_p - pos)
            decode([rng.randrange(n_vocab) for _ in range(k)], pos)
            pos += k
        for _ in range(n_g):
            decode([rng.randrange(n_vocab)], pos)
            pos += 1
        return time.perf_counter_ns() - t

    out = {}
    for kind, n_p, n_g in (("pp", n_prompt, 0), ("tg", 0, n_gen)):
        run(n_p, min(n_g, 1))  # warmup
        ts = [(n_p + n_g) * 1e9 / run(n_p, n_g) for _ in range(reps)]
        out[kind] = sum(ts) / len(ts)
    print(json.dumps(out))
""")


def run_llama_cpp_python(py: str, model: str, a) -> tuple[dict[str, float], str]:
    for extra in ("1", "0"):
        proc = subprocess.run([py, "-c", LLAMA_CPP_PYTHON_SCRIPT, model, str(a.threads), str(a.n_prompt),
                               str(a.n_gen), str(a.reps), extra], capture_output=True, text=True,
                              env=os.environ.copy())
        if proc.returncode == 0:
            note = "llama-cpp-python" + (" (use_extra_bufts=false)" if extra == "0" else "")
            return json.loads(proc.stdout.strip().splitlines()[-1]), note
        print(f"llama-cpp-python (use_extra_bufts={extra == '1'}) failed with code {proc.returncode}: "
              f"{proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return {}, "llama-cpp-python failed"


def llama_cpp_python_usable(py: str) -> bool:
    if not (py and Path(py).is_file()):
        return False
    return subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0


# -- main ------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", default=[], help="extra GGUF file (repeatable)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--llama-bench", default=None,
                    help="llama-bench binary (default: the --llama-build under $QUANTKIT_LLAMA_CPP, else PATH)")
    ap.add_argument("--llama-build", choices=sorted(llamaref.BUILDS), default="native",
                    help="which build of $QUANTKIT_LLAMA_CPP: native (build/bin) or avx2 (build-avx2/bin)")
    ap.add_argument("--llama-python", default=None,
                    help="python with llama_cpp installed, used when no llama-bench binary is found "
                         "(default: $QUANTKIT_LLAMA_PY)")
    ap.add_argument("--no-llama", action="store_true", help="quantkit and the bandwidth only")
    ap.add_argument("--bw-mib", type=int, default=512, help="array size of the bandwidth probe (>= 256)")
    ap.add_argument("--llama-modes", default="default,repack0",
                    help="llama-bench configurations to run, the faster reported: default and/or repack0")
    ap.add_argument("--no-bundled", action="store_true", help="only the -m files, not the bundled SmolLM2")
    ap.add_argument("--rounds", type=int, default=1,
                    help="pairs of runs per model, interleaved; the summary gives the ratios' median and range")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")

    from quantkit.formats.locate import bundled_model
    from quantkit.pipelines.bench import RSS_OVERHEAD_MIB, default_threads

    a.threads = a.threads or default_threads()
    models = ([] if a.no_bundled else [str(bundled_model())]) + [m for m in a.model if m]
    for m in models:
        if not Path(m).is_file():
            print(f"error: {m}: no such file", file=sys.stderr)
            return 1

    bw = {1: bandwidth_gbs(a.bw_mib, 1)}
    bw[a.threads] = bandwidth_gbs(a.bw_mib, a.threads) if a.threads != 1 else bw[1]
    print("memory bandwidth (numba prange float32 sum, best of 5): "
          + ", ".join(f"{bw[t]:.1f} GB/s on {t} thread{'s' if t > 1 else ''}" for t in sorted(bw)))

    exe = None if a.no_llama else llamaref.find("llama-bench", a.llama_bench, a.llama_build)
    a.llama_python = llamaref.python(a.llama_python)
    use_py = not a.no_llama and exe is None and llama_cpp_python_usable(a.llama_python)
    if a.no_llama:
        print("llama.cpp: skipped (--no-llama)")
    elif exe is None and not use_py:
        print(f"llama.cpp: skipped ({llamaref.missing('llama-bench', a.llama_bench, a.llama_build)}; "
              f"no llama-cpp-python either: --llama-python or ${llamaref.LLAMA_PY})")

    pp, tg = f"pp{a.n_prompt}", f"tg{a.n_gen}"
    head = (f"| model | threads | tool | {pp} t/s | {tg} t/s | {pp} ratio | {tg} ratio | "
            f"tg x bytes/token / bandwidth |")
    rows = [head, "|" + " --- |" * 8]
    notes = []
    per_round = {}  # (model, metric) -> [ratio of each round]
    for m in [m for m in models for _ in range(a.rounds)]:
        wb = weight_bytes_per_token(m)
        qk = run_quantkit([m], a)  # each model right before llama.cpp's run of it: side by side
        ours = {"pp": qk.get((m, "pp"), {}).get("ts"), "tg": qk.get((m, "tg"), {}).get("ts")}
        ref, note = ({}, "")
        if exe is not None:
            ref, note = run_llama_bench(exe, m, a)
        elif use_py:
            ref, note = run_llama_cpp_python(a.llama_python, m, a)
        name = Path(m).name

        def f(x):
            return f"{x:.2f}" if x else "-"

        def frac(ts):
            return f"{ts * wb / (bw[a.threads] * 1e9):.1%}" if ts else "-"

        def ratio(k):
            return f"{ours[k] / ref[k]:.2f}" if ours.get(k) and ref.get(k) else "-"

        rows.append(f"| {name} | {a.threads} | quantkit | {f(ours['pp'])} | {f(ours['tg'])} | {ratio('pp')} | "
                    f"{ratio('tg')} | {frac(ours['tg'])} |")
        for k in ("pp", "tg"):
            if ours.get(k) and ref.get(k):
                per_round.setdefault((name, k), []).append(ours[k] / ref[k])
        if ref:
            rows.append(f"| {name} | {a.threads} | {note} | {f(ref.get('pp'))} | {f(ref.get('tg'))} | 1.00 | 1.00 | "
                        f"{frac(ref.get('tg'))} |")
        print("\n".join(rows[-(2 if ref else 1):]), flush=True)
        q = qk.get((m, "tg")) or qk.get((m, "pp")) or {}
        comp = sum(qk.get((m, k), {}).get("compile_s", 0.0) for k in ("pp", "tg"))
        notes.append(f"{name}: weight bytes/token {wb / 2**20:.1f} MiB; quantkit compile/cache-load {comp:.2f} s "
                     f"(untimed); peak RSS {q.get('peak_rss_mib', 0):.0f} MiB vs bound "
                     f"{q.get('rss_bound_mib', 0):.0f} MiB (file + KV cache + {RSS_OVERHEAD_MIB} MiB)")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}\n")
    print("\n".join(rows + [""] + notes))
    if a.rounds > 1 and per_round:
        print(f"\n| model | metric | rounds | median ratio | range |\n| --- | --- | ---: | ---: | --- |")
        for (name, k), v in per_round.items():
            v = sorted(v)
            med = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
            print(f"| {name} | {pp if k == 'pp' else tg} | {len(v)} | {med:.2f} | {v[0]:.2f}-{v[-1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
