#!/usr/bin/env bash
# The quality table of docs/imatrix-perplexity.md: SmolLM2-135M quantized from our F16, with and
# without an imatrix collected on the calibration half, scored on the evaluation half.
#   tools/perplexity_table.sh OUTDIR [CHUNKS=20] [LLAMA_BIN_DIR]
# Run from the checkout; uses .venv/bin/quantkit with -t 1 (the cores were shared while measuring).
set -euo pipefail
OUT=${1:?OUTDIR}; CHUNKS=${2:-20}; BIN=${3:-/opt/llamaref/src/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
Q="$PWD/.venv/bin/quantkit"; export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}
BUNDLED=$(.venv/bin/python -c "from quantkit.formats.locate import bundled_model; print(bundled_model())")
mkdir -p "$OUT"; cd "$OUT"
t() { local s=$(date +%s.%N); "$@"; echo "TIME $(echo "$(date +%s.%N) - $s" | bc) $*" >&2; }
[ -f smol-F16.gguf ] || $Q quantize -q --allow-requantize "$BUNDLED" smol-F16.gguf F16 1
t $Q imatrix -q -m smol-F16.gguf -c 512 --chunks "$CHUNKS" -t 1 -o imatrix.gguf > imatrix.out 2> imatrix.err
for T in Q8_0 Q4_K_M Q4_0 Q2_K; do
  $Q quantize -q smol-F16.gguf smol-$T.gguf $T 1
  $Q quantize -q --imatrix imatrix.gguf smol-F16.gguf smol-$T-imat.gguf $T 1
done
t $Q perplexity -m smol-F16.gguf -c 512 --chunks "$CHUNKS" -t 1 --kl-divergence-base base.kld > F16.out 2> F16.err
for M in Q8_0 Q4_K_M Q4_0 Q2_K Q8_0-imat Q4_K_M-imat Q4_0-imat Q2_K-imat; do
  t $Q perplexity -m smol-$M.gguf --kl-divergence-base base.kld --kl-divergence -t 1 > $M.out 2> $M.err
done
# llama.cpp on the same files and text (the evaluation half, as a file), for PPL and time
.venv/bin/python -c "from quantkit.formats.texts import calibration_texts; open('evaluation.txt','w').write(calibration_texts()[1])" 2>/dev/null \
  || (cd - >/dev/null && .venv/bin/python -c "from quantkit.formats.texts import calibration_texts; open('$OUT/evaluation.txt','w').write(calibration_texts()[1])")
for M in F16 Q8_0 Q4_K_M Q4_0 Q2_K; do
  t "$BIN/llama-perplexity" -m smol-$M.gguf -f evaluation.txt -c 512 --chunks "$CHUNKS" -nr -t 2 > llama-$M.out 2> llama-$M.err
done
t "$BIN/llama-perplexity" -m smol-F16.gguf -f evaluation.txt -c 512 --chunks "$CHUNKS" -nr -t 1 > llama-F16-t1.out 2> llama-F16-t1.err
echo done >&2
