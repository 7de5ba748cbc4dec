#!/usr/bin/env bash
# The quality table of docs/imatrix-perplexity.md: SmolLM2-135M quantized from our F16, with and
# without an imatrix collected on the calibration half, scored on the evaluation half by quantkit and
# by llama.cpp on the same files.
#   tools/perplexity_table.sh OUTDIR [CHUNKS=20] [LLAMA_BIN_DIR]    (default: $QUANTKIT_LLAMA_CPP/build/bin)
# Run from the checkout (.venv/bin/quantkit). Both tools: -c 512 --chunks CHUNKS -t 2; llama.cpp always
# with -nr (its repacked CPU paths crash on this AMX machine, so not its best speed). Each step runs
# quantkit then llama.cpp back to back, so both see the same machine load:
#   imatrix    quantkit imatrix  |  llama-imatrix -f calibration.txt       (same text: the calibration half)
#   F16        quantkit perplexity writing base.kld  |  llama-perplexity -f evaluation.txt writing
#              llama-base.kld, then llama.cpp's F16 against quantkit's base.kld (llama-F16-kld)
#   each quantized file (8: Q8_0 Q4_K_M Q4_0 Q2_K, without and with the imatrix): --kl-divergence
#              against quantkit's base.kld, by both tools (the tokens come from base.kld)
# In OUTDIR: NAME.out/.err per step (llama.cpp's are llama-NAME.*), quantize-*.out (sizes, BPW),
# times.log ("TIME <wall seconds> NAME" per timed step), load.log (uptime every 30 s), env.txt.
# Untimed first: the quantizations and a tiny run of every file and mode (-c 128, 2 chunks) so numba's
# compiled kernels are in its cache. A rerun skips the steps already in times.log.
set -euo pipefail
NEED="set it to the reference llama.cpp source directory (docs/DEVELOPING.md, Environment)"
OUT=${1:?OUTDIR}; CHUNKS=${2:-20}; BIN=${3:-${QUANTKIT_LLAMA_CPP:?$NEED}/build/bin}
Q="$PWD/.venv/bin/quantkit"; PY="$PWD/.venv/bin/python"; export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}
BUNDLED=$($PY -c "from quantkit.formats.locate import bundled_model; print(bundled_model())")
REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- quantkit || echo "+uncommitted quantkit changes")
mkdir -p "$OUT"; cd "$OUT"
MODELS="Q8_0 Q4_K_M Q4_0 Q2_K Q8_0-imat Q4_K_M-imat Q4_0-imat Q2_K-imat"
{ echo "checkout $REV; quantkit from $($PY -c 'import quantkit; print(quantkit.__file__)')"; uname -a
  "$BIN/llama-perplexity" --version 2>&1 | sed -n 1p; } > env.txt
(while sleep 30; do uptime; done) >> load.log & LOAD=$!; trap 'kill $LOAD' EXIT

# t NAME CMD...: CMD > NAME.out 2> NAME.err, then "TIME <seconds> NAME" appended to times.log;
# skipped when times.log already has NAME (a rerun only does what is missing or failed)
t() {
  local name=$1 s; shift
  grep -q " $name\$" times.log 2>/dev/null && return 0
  s=$(date +%s.%N); "$@" > "$name.out" 2> "$name.err"
  echo "TIME $(echo "$(date +%s.%N) - $s" | bc) $name" | tee -a times.log >&2
}
P() { t "$1" $Q perplexity -t 2 "${@:2}"; }                        # quantkit perplexity
L() { t "llama-$1" "$BIN/llama-perplexity" -nr -t 2 "${@:2}"; }    # llama-perplexity

[ -f smol-F16.gguf ] || $Q quantize -q --allow-requantize "$BUNDLED" smol-F16.gguf F16 2
$PY -c "from quantkit.formats.texts import calibration_texts as c
for n, x in zip(('calibration', 'evaluation'), c()): open(n + '.txt', 'w', encoding='utf-8').write(x)"

# imatrix collection (the quantkit one is what the -imat files below use)
$Q imatrix -q -m smol-F16.gguf -c 128 --chunks 2 -t 2 -o warm-imatrix.gguf > /dev/null 2>&1
t imatrix $Q imatrix -q -m smol-F16.gguf -c 512 --chunks "$CHUNKS" -t 2 -o imatrix.gguf
t llama-imatrix "$BIN/llama-imatrix" -m smol-F16.gguf -f calibration.txt -c 512 --chunks "$CHUNKS" -nr -t 2 \
  -o llama-imatrix.gguf
for T in Q8_0 Q4_K_M Q4_0 Q2_K; do
  [ -f smol-$T.gguf ] || $Q quantize -q smol-F16.gguf smol-$T.gguf $T 2 > quantize-$T.out 2>&1
  [ -f smol-$T-imat.gguf ] || $Q quantize -q --imatrix imatrix.gguf smol-F16.gguf smol-$T-imat.gguf $T 2 \
    > quantize-$T-imat.out 2>&1
done

# warm numba's cache for every file and both modes (untimed)
$Q perplexity -m smol-F16.gguf -c 128 --chunks 2 -t 2 --kl-divergence-base warm.kld > /dev/null 2>&1
for M in $MODELS; do
  $Q perplexity -m smol-$M.gguf --kl-divergence-base warm.kld --kl-divergence -t 2 > /dev/null 2>&1
done

P F16 -m smol-F16.gguf -c 512 --chunks "$CHUNKS" --kl-divergence-base base.kld
L F16 -m smol-F16.gguf -f evaluation.txt -c 512 --chunks "$CHUNKS" --kl-divergence-base llama-base.kld
L F16-kld -m smol-F16.gguf -c 512 --kl-divergence-base base.kld --kl-divergence
for M in $MODELS; do
  P "$M" -m smol-$M.gguf --kl-divergence-base base.kld --kl-divergence
  L "$M" -m smol-$M.gguf -c 512 --kl-divergence-base base.kld --kl-divergence
done
echo done >&2
