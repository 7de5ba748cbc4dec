#!/usr/bin/env bash
# The Gemma 3 270M agreement table of docs/run.md ("Architectures"): llama.cpp's own micro-batch noise
# (-ub 16 against -ub 512) and quantkit against the same -ub 512 logits, KL divergence over the
# evaluation text (10 chunks of 512; the tokens are llama.cpp's, read from the base file).
#   tools/arch_agreement.sh MODEL.gguf OUTDIR [LLAMA_BIN_DIR]    (default: $QUANTKIT_LLAMA_CPP/build/bin)
# Run from the checkout (.venv/bin/quantkit). Results: OUTDIR/llama-ub16.log, OUTDIR/quantkit.out.
# LLAMA_ARGS: extra llama-perplexity flags, e.g. LLAMA_ARGS=-nr on a host where the repacked path fails.
set -euo pipefail
NEED="set it to the reference llama.cpp source directory (docs/DEVELOPING.md, Environment)"
M=$(realpath "${1:?MODEL.gguf}"); OUT=${2:?OUTDIR}; BIN=${3:-${QUANTKIT_LLAMA_CPP:?$NEED}/build/bin}
Q="$PWD/.venv/bin/quantkit"; PY="$PWD/.venv/bin/python"; XA=${LLAMA_ARGS:-}
mkdir -p "$OUT"; cd "$OUT"
$PY -c "from quantkit.formats.texts import calibration_texts as c; open('evaluation.txt', 'w', encoding='utf-8').write(c()[1])"
"$BIN/llama-perplexity" -m "$M" -f evaluation.txt -c 512 --chunks 10 -ub 512 -t 2 $XA \
  --kl-divergence-base base.kld > llama-base.out 2> llama-base.err
# (--log-file: its stdout sometimes ends before the last chunk and the summary, its logger's queue not
# drained at exit; the file gets every line)
"$BIN/llama-perplexity" -m "$M" -c 512 --chunks 10 -ub 16 -t 2 $XA --kl-divergence-base base.kld --kl-divergence \
  --log-file llama-ub16.log > llama-ub16.out 2> llama-ub16.err
$Q perplexity -m "$M" --kl-divergence-base base.kld --kl-divergence -t 2 > quantkit.out 2> quantkit.err
grep -H "Mean    KLD\|Median  KLD\|Same top p\|RMS Δp" llama-ub16.log quantkit.out
