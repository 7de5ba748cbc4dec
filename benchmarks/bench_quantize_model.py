"""Whole-model quantization: quantkit beside llama-quantize, wall and CPU time, peak RSS, same bytes.

    python benchmarks/bench_quantize_model.py [--model F16.gguf] [--imatrix FILE] [--types Q4_K_M,Q8_0]
        [--threads 2] [--repeat 1] [--llama-quantize PATH]

Without --model the F16 source is made first from the bundled SmolLM2 Q4_1 (by quantkit; identical to
llama-quantize's). Both tools run as subprocesses, alternately (quantkit, then llama-quantize, per repeat),
so both pay their start-up and their peak RSS is their own; each child's user+sys CPU seconds and
ru_maxrss come from wait4. quantkit's numba cache is warmed by one untimed run first. llama-quantize is
found by --llama-quantize, else in $QUANTKIT_LLAMA_CPP/build/bin, else on PATH (tools/llamaref.py;
else skipped with a note). Outputs are compared byte for byte. On a busy machine compare the CPU columns:
wall time there measures the neighbours as much as the tools.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import llamaref  # noqa: E402  (where the reference llama.cpp is)


def sha(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """Run ``cmd``; return (wall s, user+sys CPU s, peak RSS MiB) of the child."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="F16/BF16/F32 GGUF to quantize (default: SmolLM2 made F16 from the bundled file)")
    ap.add_argument("--imatrix", help="importance matrix passed to both tools")
    ap.add_argument("--types", default="Q4_K_M,Q8_0", help="comma-separated llama-quantize type names")
    ap.add_argument("--threads", type=int, default=2, help="threads for both tools (default 2)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per tool and type (default 1)")
    ap.add_argument("--llama-quantize", default=None,
                    help="path of llama-quantize (default: $QUANTKIT_LLAMA_CPP/build/bin's, else PATH)")
    ap.add_argument("--no-warm", action="store_true", help="skip the untimed quantkit run per type (numba cache already warm)")
    ap.add_argument("--keep", help="directory for the outputs (default: a temporary one)")
    a = ap.parse_args()

    llama = llamaref.find("llama-quantize", a.llama_quantize)
    qk = [sys.executable, "-m", "quantkit", "quantize", "-q"]
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(a.keep or tmpd)
        tmp.mkdir(parents=True, exist_ok=True)
        if a.model:
            src = Path(a.model)
        else:
            from quantkit.formats.locate import bundled_model

            src = tmp / "f16.gguf"
            subprocess.run(qk + ["--allow-requantize", str(bundled_model()), str(src), "F16"], check=True)
        im = ["--imatrix", a.imatrix] if a.imatrix else []
        rows = []
        for ft in [x.strip() for x in a.types.split(",") if x.strip()]:
            ours, ref = tmp / f"qk-{ft}.gguf", tmp / f"ll-{ft}.gguf"
            if not a.no_warm:  # warm the numba cache
                subprocess.run(qk + im + [str(src), str(ours), ft, str(a.threads)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            runs: dict[str, list[tuple[float, float, float]]] = {"qk": [], "ll": []}
            for _ in range(a.repeat):
                runs["qk"].append(timed(qk + im + [str(src), str(ours), ft, str(a.threads)]))
                if llama:
                    runs["ll"].append(timed([llama] + im + [str(src), str(ref), ft, str(a.threads)]))
            same = ("yes" if sha(ref) == sha(ours) else "NO") if llama else "n/a"
            rows.append((ft, runs, same))
            print(f"{ft}: quantkit {runs['qk']}, llama-quantize {runs['ll']}, same bytes: {same}", file=sys.stderr,
                  flush=True)
    where = llama or f"{llamaref.missing('llama-quantize', a.llama_quantize)} (skipped)"
    print(f"\nsource {a.model or 'SmolLM2 F16'}{', imatrix ' + a.imatrix if a.imatrix else ''}; threads={a.threads}, "
          f"repeat={a.repeat} (median shown); llama-quantize: {where}")
    print("| type | quantkit wall s | quantkit CPU s | quantkit RSS MiB | llama wall s | llama CPU s | llama RSS MiB "
          "| wall ratio | CPU ratio | same bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for ft, runs, same in rows:
        q = [statistics.median(v) for v in zip(*runs["qk"])]
        if runs["ll"]:
            ll = [statistics.median(v) for v in zip(*runs["ll"])]
            tail = f"{ll[0]:.1f} | {ll[1]:.1f} | {ll[2]:.0f} | {q[0] / ll[0]:.2f} | {q[1] / ll[1]:.2f}"
        else:
            tail = "- | - | - | - | -"
        print(f"| {ft} | {q[0]:.1f} | {q[1]:.1f} | {q[2]:.0f} | {tail} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
