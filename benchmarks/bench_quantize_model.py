"""Wall time of whole-model quantization on the bundled SmolLM2: quantkit beside llama-quantize.

    python benchmarks/bench_quantize_model.py [--types Q4_K_M,Q8_0] [--threads 2] [--repeat 3]
        [--llama-quantize PATH]

The F16 source is made first from the bundled Q4_1 file (by quantkit; identical to llama-quantize's).
quantkit runs in this process (numba's compile/cache-load time is reported apart, from a first
untimed run); llama-quantize runs as a subprocess when a binary is found (--llama-quantize, $LLAMA_QUANTIZE,
or llama.cpp's build tree under /opt/llamaref) and otherwise is skipped with a note. Outputs are
compared byte for byte. Reported: best and median wall seconds of --repeat runs, and the ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_LLAMA = "/opt/llamaref/src/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-quantize"


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def find_llama(arg: str | None) -> str | None:
    for cand in (arg, os.environ.get("LLAMA_QUANTIZE"), shutil.which("llama-quantize"), DEFAULT_LLAMA):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K_M,Q8_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-quantize", default=None)
    a = ap.parse_args()

    from quantkit.formats.locate import bundled_model
    from quantkit.pipelines.quantize import QuantizeOptions, quantize_file

    llama = find_llama(a.llama_quantize)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        f16 = tmp / "f16.gguf"
        t = time.perf_counter()
        quantize_file(bundled_model(), f16, QuantizeOptions("F16", threads=a.threads, allow_requantize=True))
        print(f"made F16 source in {time.perf_counter() - t:.2f} s (includes numba compile/cache load)")
        rows = []
        for ft in [x.strip() for x in a.types.split(",") if x.strip()]:
            ours = tmp / f"qk-{ft}.gguf"
            t = time.perf_counter()
            quantize_file(f16, ours, QuantizeOptions(ft, threads=a.threads))
            first = time.perf_counter() - t
            qk = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                quantize_file(f16, ours, QuantizeOptions(ft, threads=a.threads))
                qk.append(time.perf_counter() - t)
            ll = []
            same = "n/a"
            if llama:
                ref = tmp / f"ll-{ft}.gguf"
                for _ in range(a.repeat):
                    t = time.perf_counter()
                    subprocess.run([llama, str(f16), str(ref), ft, str(a.threads)], check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    ll.append(time.perf_counter() - t)
                same = "yes" if sha(ref) == sha(ours) else "NO"
            rows.append((ft, first, qk, ll, same))
    print(f"\nthreads={a.threads}, repeat={a.repeat}; llama-quantize: {llama or 'not found (skipped)'}")
    print(f"| type | quantkit first run s | quantkit best s | quantkit median s | llama-quantize best s "
          f"| llama median s | quantkit/llama (best) | same bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|:---:|")
    for ft, first, qk, ll, same in rows:
        lb = f"{min(ll):.2f}" if ll else "-"
        lm = f"{statistics.median(ll):.2f}" if ll else "-"
        ratio = f"{min(qk) / min(ll):.2f}" if ll else "-"
        print(f"| {ft} | {first:.2f} | {min(qk):.2f} | {statistics.median(qk):.2f} | {lb} | {lm} | {ratio} | {same} |")
    print("\nquantkit's time includes opening the GGUF (gguf-py parses the 49k-token vocabulary) and writing it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
