#!/usr/bin/env bash
# The real-size table of docs/performance.md (issue #13): quantkit beside llama.cpp on random-weight models
# of the Llama 3.2 1B, Llama 3.2 3B and Llama 3.1 8B shapes, one thread count (default 2).
#   benchmarks/real_size_table.sh MODELDIR OUTDIR [STEP ...]
# STEPs (default: all, in this order):
#   bench-1b bench-8b bench-3b  pp512 / tg beside llama-bench (its default and --repack 0, the faster per
#                               metric) and the memory bandwidth: benchmarks/bench_vs_llama.py; 1B -r 3
#                               -n 128, 3B -r 2 -n 64, 8B -r 1 -n 32 (an 8B pp512 pass takes ~half a minute)
#   ppl-1b ppl-3b ppl-8b        perplexity wall and CPU time, -c 512 --chunks 2 on the evaluation half:
#                               quantkit, then llama-perplexity with its defaults and with -nr (faster kept);
#                               every type on 1B, Q4_K_M on 3B and 8B. An untimed 1-chunk run at the same
#                               -c first warms numba's cache (a smaller -c leaves kernels uncompiled).
#   quant-1b                    F16 -> each type: benchmarks/bench_quantize_model.py (bytes compared)
# MODELDIR holds llama-3.2-1b-f16.gguf and {llama-3.2-1b,llama-3.2-3b,llama-3.1-8b}-{Q4_K_M,Q4_0,Q8_0,Q6_K,
# IQ4_XS}.gguf (benchmarks/make_model.py SHAPE F16, then `quantkit quantize F16 OUT TYPE`); missing files
# are skipped. QUANTKIT_LLAMA_CPP (the reference llama.cpp; its build/bin is used) and THREADS come from the
# environment. Run from the checkout on an idle machine; OUTDIR gets one .md/.log per step, times.tsv,
# load.log (uptime every 30 s).
set -euo pipefail
MD=${1:?MODELDIR}; OUT=${2:?OUTDIR}; shift 2
STEPS=${*:-bench-1b bench-8b ppl-1b quant-1b bench-3b ppl-8b ppl-3b}
NEED="set it to the reference llama.cpp source directory (docs/DEVELOPING.md, Environment)"
BIN=${QUANTKIT_LLAMA_CPP:?$NEED}/build/bin
T=${THREADS:-2}; TYPES="Q4_K_M Q4_0 Q8_0 Q6_K IQ4_XS"
PY="$PWD/.venv/bin/python"; Q="$PWD/.venv/bin/quantkit"
mkdir -p "$OUT"
{ echo "checkout $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- quantkit || echo ' +uncommitted')"
  date -u; uname -a; nproc; "$BIN/llama-bench" --version 2>&1 | sed -n 1p; } >> "$OUT/env.txt"
(while sleep 30; do echo "$(date -u +%T) $(cat /proc/loadavg)"; done) >> "$OUT/load.log" & LOADPID=$!
trap 'kill $LOADPID' EXIT
shape() { case $1 in 1b) echo llama-3.2-1b;; 3b) echo llama-3.2-3b;; 8b) echo llama-3.1-8b;; esac; }
files() { local t; for t in $2; do [ -f "$MD/$(shape "$1")-$t.gguf" ] && echo "$MD/$(shape "$1")-$t.gguf"; done; true; }
eval_text() {
  [ -f "$OUT/evaluation.txt" ] || "$PY" -c "from quantkit.formats.texts import calibration_texts as c
open('$OUT/evaluation.txt', 'w', encoding='utf-8').write(c()[1])"
}
# timed NAME CMD...: wall / user / sys / max RSS of CMD into times.tsv, its output into NAME.log
timed() {
  local name=$1; shift
  /usr/bin/time -f "$name	%e	%U	%S	%M" -a -o "$OUT/times.tsv" "$@" > "$OUT/$name.log" 2>&1 || echo "$name failed" >&2
}
for step in $STEPS; do
  echo "== $step $(date -u +%T)" >&2
  size=${step#*-}
  case $step in
    bench-*)
      case $size in 1b) R=3; N=128;; 3b) R=2; N=64;; *) R=1; N=32;; esac
      args=(); for f in $(files "$size" "$TYPES"); do args+=(-m "$f"); done
      [ ${#args[@]} -gt 0 ] || { echo "no $size models" >&2; continue; }
      "$PY" benchmarks/bench_vs_llama.py -t "$T" -r "$R" -n "$N" --no-bundled --llama-bench "$BIN/llama-bench" \
        "${args[@]}" > "$OUT/$step.md" 2> "$OUT/$step.err" || echo "$step failed" >&2 ;;
    ppl-*)
      eval_text
      types=$TYPES; [ "$size" = 1b ] || types=Q4_K_M
      for f in $(files "$size" "$types"); do
        n=$(basename "$f" .gguf)
        "$Q" perplexity -m "$f" -f "$OUT/evaluation.txt" -c 512 --chunks 1 -t "$T" > /dev/null 2>&1 || true
        timed "ppl-quantkit-$n" "$Q" perplexity -m "$f" -f "$OUT/evaluation.txt" -c 512 --chunks 2 -t "$T"
        timed "ppl-llama-$n" "$BIN/llama-perplexity" -m "$f" -f "$OUT/evaluation.txt" -c 512 --chunks 2 -t "$T"
        timed "ppl-llama-nr-$n" "$BIN/llama-perplexity" -m "$f" -f "$OUT/evaluation.txt" -c 512 --chunks 2 -t "$T" -nr
      done ;;
    quant-*)
      src="$MD/$(shape "$size")-f16.gguf"
      [ -f "$src" ] && [ "$(stat -c %s "$src")" -gt 1000000 ] || { echo "no $src" >&2; continue; }
      "$PY" benchmarks/bench_quantize_model.py --model "$src" --types "$(echo $TYPES | tr ' ' ,)" --threads "$T" \
        --llama-quantize "$BIN/llama-quantize" > "$OUT/$step.md" 2> "$OUT/$step.err" || echo "$step failed" >&2 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== done $(date -u +%T)" >&2
